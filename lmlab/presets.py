"""Model-family presets: the published architecture of each model the CS336 lecture 3 names, as
``ModelConfig`` fields, at its real size and at a CPU-sized "tiny" size of the same shape.

In the style of litgpt's ``config.py`` (one record per model, each citing its source), but every value
here is a field of :class:`lmlab.config.ModelConfig`. A :class:`Preset` carries

- ``real``: the published dimensions (layers, widths, heads, KV heads, head_dim, d_ff, vocabulary,
  context, RoPE theta, windows, norm epsilon, tying), taken from the paper or the model's Hugging Face
  ``config.json`` named in ``source``;
- ``tiny``: overrides giving d_model 128-224, 2-6 layers (6 where the layer pattern is 6 long), context
  256, vocabulary 4096 (override it with the data's) and the same norm, activation,
  positions, GQA ratio, layer pattern, soft-caps and biases. Widths keep their real ratios to d_model
  (d_ff / d_model, n_heads * head_dim / d_model, query_pre_attn_scalar / head_dim); sliding windows
  shrink to 64 tokens so they matter at context 256; RoPE context-extension scaling is dropped (it only
  changes frequencies meant for contexts far beyond 256);
- ``published_params``: the published parameter count, where one exists for exactly the architecture
  written here, and ``params_source`` saying where it is published (``tests/test_presets.py`` checks
  the real config's count on the meta device against it, to 1%);
- ``notes``: what the published model has that ``ModelConfig`` cannot express (a missing switch); the
  preset then approximates it, and says how.

Usage::

    from lmlab.presets import preset_config
    cfg = preset_config("gemma-2-9b")                    # tiny, trains on a CPU
    cfg = preset_config("gemma-2-9b", scale="real")      # the published shape
    with torch.device("meta"):                           # count parameters without memory
        n = TransformerLM(cfg).num_params()
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

from lmlab.config import ConfigError, ModelConfig

SCALES = ("tiny", "real")
TINY_CONTEXT = 256
TINY_VOCAB = 4096
TINY_WINDOW = 64


@dataclass(frozen=True)
class Preset:
    """One published model. ``real`` and ``tiny`` are ModelConfig field mappings (``tiny`` overrides
    ``real``); ``published_params`` is a parameter count (not a label), e.g. 124_439_808."""

    name: str  # lowercase-hyphen, e.g. "llama-2-7b"
    family: str  # e.g. "Llama 2"
    source: str  # paper / model card / config.json citations with URLs
    summary: str  # one line: what is characteristic of the architecture
    real: dict
    tiny: dict
    published_params: Optional[float] = None
    notes: str = ""  # what ModelConfig cannot express, and how the preset approximates it
    params_source: str = ""  # where published_params comes from
    extra: dict = field(default_factory=dict)  # free-form facts (e.g. total MoE parameters)

    def config(self, scale: str = "tiny", **overrides: Any) -> ModelConfig:
        return preset_config(self.name, scale, **overrides)

    @property
    def params_label(self) -> str:
        """Published parameter count as a short label ("124M", "6.74B"); our count of the real config,
        marked "~", where nothing comparable is published: lmlab.analysis's closed form, equal to the
        meta-device build for every preset (tests/test_analysis.py) and without building the big MoEs."""
        if self.published_params is not None:
            return human_count(self.published_params)
        from lmlab.analysis import param_counts

        return "~" + human_count(param_counts(preset_config(self.name, "real"))["total"])


def human_count(n: float) -> str:
    """124439808 -> '124M', 6.74e9 -> '6.74B', 540.35e9 -> '540B'."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            digits = 0 if value >= 100 else (1 if value >= 10 else 2)
            return f"{value:.{digits}f}{unit}"
    return str(int(n))


# ------------------------------------------------------------------------------------------------
# Tiny-scale derivation
# ------------------------------------------------------------------------------------------------


def _round_to(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def _tiny(real: dict, d_model: int = 128, n_heads: int = 4, n_layers: int = 2, **extra: Any) -> dict:
    """Overrides shrinking ``real`` to a CPU-sized model of the same shape (see the module docstring)."""
    full = ModelConfig(**real)
    kv_ratio = full.n_heads // full.n_kv_heads
    if n_heads % kv_ratio and full.n_kv_heads > 1:
        raise ValueError(f"tiny n_heads={n_heads} does not keep the GQA ratio {kv_ratio}")
    out: dict = dict(vocab_size=TINY_VOCAB, context_length=TINY_CONTEXT, d_model=d_model, n_layers=n_layers,
                     n_heads=n_heads, n_kv_heads=1 if full.n_kv_heads == 1 else n_heads // kv_ratio)
    head_dim = d_model // n_heads
    if "head_dim" in real:  # keep n_heads * head_dim / d_model
        head_dim = _round_to(full.head_dim * full.n_heads / full.d_model * d_model / n_heads, 8)
        out["head_dim"] = head_dim
    out["d_ff"] = _round_to(full.d_ff / full.d_model * d_model, 8)
    if full.expert_d_ff is not None:  # a MoE's experts keep their width ratio too
        out["expert_d_ff"] = _round_to(full.expert_d_ff / full.d_model * d_model, 8)
    if full.sliding_window is not None:
        out["sliding_window"] = TINY_WINDOW
    if full.query_pre_attn_scalar is not None:
        out["query_pre_attn_scalar"] = full.query_pre_attn_scalar / full.head_dim * head_dim
    if full.rope_scaling is not None:
        out["rope_scaling"] = None
    out.update(extra)
    return out


# ------------------------------------------------------------------------------------------------
# The presets
# ------------------------------------------------------------------------------------------------

# Shared field groups (spelled out per family so every preset states its choices).
_GPT2_STYLE = dict(norm_type="layernorm", norm_position="pre", norm_bias=True, bias="all", activation="gelu_tanh",
                   position="learned", tie_embeddings=True)
_LLAMA_STYLE = dict(norm_type="rmsnorm", norm_position="pre", norm_bias=False, bias="none", activation="swiglu",
                    position="rope", rope_style="half", tie_embeddings=False)
_GEMMA_STYLE = dict(norm_type="gemma_rmsnorm", norm_bias=False, bias="none", activation="geglu", position="rope",
                    rope_style="half", tie_embeddings=True, scale_embeddings=True, norm_eps=1e-6)

_P: list[Preset] = []


def _add(name: str, family: str, source: str, summary: str, real: dict, tiny: dict,
         published_params: Optional[float] = None, notes: str = "", params_source: str = "",
         **extra: Any) -> None:
    """One row of the table: ``real`` the published fields, ``tiny`` the arguments of :func:`_tiny`
    (its size; the rest follows from ``real``)."""
    if (published_params is None) != (not params_source):
        raise ValueError(f"preset {name!r}: published_params and params_source go together")
    _P.append(Preset(name, family, source, summary, real, _tiny(real, **tiny), published_params, notes,
                     params_source, extra))


def _real_of(name: str) -> dict:
    """The ``real`` fields of the preset ``name`` added above: a later size of the same family starts from
    them and names what changes."""
    return next(p.real for p in _P if p.name == name)


# --- original Transformer (decoder-only) ---------------------------------------------------------
_add("transformer-base", "Original Transformer",
     "Vaswani et al. 2017, 'Attention Is All You Need', Table 3 (base), sections 3.4-3.5 and 5.4, "
     "https://arxiv.org/abs/1706.03762",
     "post-norm LayerNorm, ReLU FFN 4x, sinusoidal positions, biases, tied embeddings x sqrt(d_model)",
     dict(vocab_size=37000, context_length=512, d_model=512, n_layers=6, n_heads=8, d_ff=2048,
          norm_type="layernorm", norm_position="post", norm_bias=True, norm_eps=1e-6, final_norm=False,
          bias="all", activation="relu", position="sinusoidal", tie_embeddings=True, scale_embeddings=True,
          embd_dropout=0.1, resid_dropout=0.1), {},
     notes="Decoder-only stand-in for the base encoder-decoder (65M params with encoder and cross-attention; "
           "not comparable). The paper fixes no context length (512 here) and no LayerNorm epsilon "
           "(1e-6 as in tensor2tensor). No final norm: post-norm already normalises the last block's output.")

# --- GPT-2 ---------------------------------------------------------------------------------------
_add("gpt2-124m", "GPT-2",
     "Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', "
     "https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf; "
     "https://huggingface.co/openai-community/gpt2/blob/main/config.json",
     "pre-norm LayerNorm, GELU (tanh), learned positions, biases everywhere, tied embeddings",
     dict(_GPT2_STYLE, vocab_size=50257, context_length=1024, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
          norm_eps=1e-5, embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1), {}, published_params=124_439_808,
     params_source="the Hugging Face checkpoint, tied embeddings counted once (the paper's '117M' "
                   "counted differently)")

# --- GPT-3 ---------------------------------------------------------------------------------------
_add("gpt3-175b", "GPT-3",
     "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 and section 2.1, "
     "https://arxiv.org/abs/2005.14165",
     "GPT-2 block with alternating dense and locally banded attention layers (Sparse Transformer style)",
     dict(_GPT2_STYLE, vocab_size=50257, context_length=2048, d_model=12288, n_layers=96, n_heads=96,
          d_ff=49152, norm_eps=1e-5, sliding_window=256, layer_pattern="GL"),
     {}, published_params=175.0e9, params_source="Brown et al. 2020, Table 2.1 (175.0B)",
     notes="The paper does not give the band width of its 'locally banded sparse attention'; 256 tokens "
           "is assumed (GPT-Neo's reimplementation uses 256). The banded layers are modelled as sliding "
           "windows.")

# --- GPT-J ---------------------------------------------------------------------------------------
_add("gpt-j-6b", "GPT-J",
     "Wang & Komatsuzaki 2021, Mesh Transformer JAX, https://github.com/kingoflolz/mesh-transformer-jax; "
     "model card and config.json, https://huggingface.co/EleutherAI/gpt-j-6b",
     "parallel attention + MLP off one LayerNorm, partial RoPE (64 of 256 dims, interleaved pairs)",
     dict(vocab_size=50400, context_length=2048, d_model=4096, n_layers=28, n_heads=16, d_ff=16384,
          norm_type="layernorm", norm_position="pre", norm_bias=True, norm_eps=1e-5, bias="mlp",
          lm_head_bias=True, activation="gelu_tanh", parallel_block=True, parallel_shared_norm=True,
          position="rope", rope_style="interleaved", rope_fraction=0.25, rope_theta=10000.0,
          tie_embeddings=False), {}, published_params=6_053_381_344, params_source="model card, n_parameters",
     notes="Attention projections carry no bias, the MLP and the LM head do (bias='mlp', lm_head_bias).")

# --- GPT-NeoX / Pythia ---------------------------------------------------------------------------
_NEOX = dict(norm_type="layernorm", norm_position="pre", norm_bias=True, norm_eps=1e-5, bias="all",
             parallel_block=True, parallel_shared_norm=False, position="rope", rope_style="half",
             rope_fraction=0.25, rope_theta=10000.0, tie_embeddings=False, context_length=2048)
_add("gpt-neox-20b", "GPT-NeoX / Pythia",
     "Black et al. 2022, 'GPT-NeoX-20B', https://arxiv.org/abs/2204.06745; "
     "https://huggingface.co/EleutherAI/gpt-neox-20b/blob/main/config.json",
     "parallel block with two LayerNorms, partial RoPE on 25% of each head (half-split pairs), untied",
     dict(_NEOX, vocab_size=50432, d_model=6144, n_layers=44, n_heads=64, d_ff=24576, activation="gelu_tanh"),
     {}, published_params=20_554_567_680, params_source="Black et al. 2022, Table 1",
     notes="hidden_act 'gelu_fast' is the tanh approximation of GELU (gelu_tanh).")
_add("pythia-160m", "GPT-NeoX / Pythia",
     "Biderman et al. 2023, 'Pythia', Table 1, https://arxiv.org/abs/2304.01373; "
     "https://huggingface.co/EleutherAI/pythia-160m/blob/main/config.json",
     "the GPT-NeoX block at 160M: parallel two-norm block, partial RoPE 0.25, exact GELU",
     dict(_NEOX, vocab_size=50304, d_model=768, n_layers=12, n_heads=12, d_ff=3072, activation="gelu"),
     {}, published_params=162_322_944, params_source="Biderman et al. 2023, Table 1 (total)")

# --- OPT -----------------------------------------------------------------------------------------
_add("opt-350m", "OPT",
     "Zhang et al. 2022, 'OPT: Open Pre-trained Transformer Language Models', https://arxiv.org/abs/2205.01068; "
     "https://huggingface.co/facebook/opt-350m/blob/main/config.json (do_layer_norm_before=false, "
     "word_embed_proj_dim=512)",
     "the one post-norm OPT: LayerNorm after each residual add, ReLU, learned positions, biases, 512-wide "
     "embeddings projected in and out of the 1024-wide stack",
     dict(vocab_size=50272, context_length=2048, d_model=1024, n_layers=24, n_heads=16, d_ff=4096,
          norm_type="layernorm", norm_position="post", norm_bias=True, norm_eps=1e-5, final_norm=False,
          bias="all", activation="relu", position="learned", learned_pos_offset=2, tie_embeddings=True,
          resid_dropout=0.1, embed_dim=512), dict(embed_dim=64), published_params=331_196_416,
     params_source="the Hugging Face checkpoint (OPTForCausalLM of that config.json, tied embeddings counted "
                   "once; the paper's '350M' is nominal)",
     notes="Learned positions are offset by 2 as in fairseq/HF OPT (learned_pos_offset=2: a table of "
           "context_length + 2 rows, position p reading row p + 2).")

# --- T5-style relative position bias -------------------------------------------------------------
_add("t5-base-decoder", "T5 (relative position bias)",
     "Raffel et al. 2020, 'Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer', "
     "section 2.1, https://arxiv.org/abs/1910.10683; https://huggingface.co/google-t5/t5-base/blob/main/config.json",
     "decoder-only T5-base: bucketed learned relative position bias (32 buckets, 128 max distance), "
     "RMS LayerNorm, ReLU, no biases",
     dict(vocab_size=32128, context_length=512, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
          norm_type="rmsnorm", norm_position="pre", norm_eps=1e-6, bias="none", activation="relu",
          position="t5", t5_num_buckets=32, t5_max_distance=128, tie_embeddings=True, resid_dropout=0.1,
          query_pre_attn_scalar=1.0), dict(query_pre_attn_scalar=1.0),
     notes="Decoder stack only (t5-base's 220M include the encoder and cross-attention). T5 does not scale "
           "q.k by 1/sqrt(head_dim) (folded into its init): query_pre_attn_scalar=1 at both scales. Not "
           "modelled: the tied LM head's input rescaled by d_model**-0.5.")

# --- PaLM ----------------------------------------------------------------------------------------
_add("palm-540b", "PaLM",
     "Chowdhery et al. 2022, 'PaLM: Scaling Language Modeling with Pathways', section 2 and Table 1, "
     "section 5 (z-loss 1e-4), https://arxiv.org/abs/2204.02311",
     "parallel block, SwiGLU (d_ff = 4 d_model), multi-query attention, no biases, shared in/out "
     "embeddings, z-loss",
     dict(vocab_size=256000, context_length=2048, d_model=18432, n_layers=118, n_heads=48, n_kv_heads=1,
          head_dim=256, d_ff=73728, norm_type="layernorm", norm_position="pre", norm_bias=False,
          norm_eps=1e-6, bias="none", activation="swiglu", parallel_block=True, parallel_shared_norm=True,
          position="rope", rope_style="half", rope_theta=10000.0, tie_embeddings=True, z_loss=1e-4),
     {}, published_params=540.35e9, params_source="Chowdhery et al. 2022, Table 1",
     notes="LayerNorm without bias ('no biases ... in layer norms'); its epsilon is unpublished (1e-6 "
           "assumed). Not modelled: the pre-softmax logits scaled by 1/sqrt(d_model) for the shared "
           "embedding (section 5), N(0, 1) embedding init.")

# --- LLaMA family --------------------------------------------------------------------------------
_add("llama-7b", "LLaMA",
     "Touvron et al. 2023, 'LLaMA: Open and Efficient Foundation Language Models', Table 2 and section 2.2, "
     "https://arxiv.org/abs/2302.13971; https://huggingface.co/huggyllama/llama-7b/blob/main/config.json",
     "pre-norm RMSNorm, SwiGLU with d_ff = 8/3 d_model rounded to 256, RoPE, no biases, untied",
     dict(_LLAMA_STYLE, vocab_size=32000, context_length=2048, d_model=4096, n_layers=32, n_heads=32,
          d_ff=11008, norm_eps=1e-6, rope_theta=10000.0), {}, published_params=6_738_415_616,
     params_source="the Hugging Face checkpoint (the paper's '6.7B')",
     notes="Meta's code pairs RoPE dims interleaved; the Hugging Face weights are permuted for the half "
           "split used here (same function).")

_add("llama-2-7b", "Llama 2",
     "Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models', https://arxiv.org/abs/2307.09288; "
     "https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json",
     "LLaMA with a 4k context (GQA only at 34B/70B)",
     dict(_LLAMA_STYLE, vocab_size=32000, context_length=4096, d_model=4096, n_layers=32, n_heads=32,
          d_ff=11008, norm_eps=1e-5, rope_theta=10000.0),
     {}, published_params=6.74e9, params_source="the Hugging Face model card (6.74B)")

_add("llama-2-70b", "Llama 2",
     "Touvron et al. 2023, 'Llama 2', Table 1 (GQA at 70B), https://arxiv.org/abs/2307.09288; "
     "https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json",
     "Llama 2 at 70B: GQA 64:8, d_ff 28672 (ffn_dim_multiplier 1.3, multiple of 4096)",
     dict(_LLAMA_STYLE, vocab_size=32000, context_length=4096, d_model=8192, n_layers=80, n_heads=64,
          n_kv_heads=8, d_ff=28672, norm_eps=1e-5, rope_theta=10000.0),
     dict(n_heads=8), published_params=68_976_648_192,
     params_source="the Hugging Face checkpoint (the paper's '70B')")

_add("llama-3-8b", "Llama 3",
     "Grattafiori et al. 2024, 'The Llama 3 Herd of Models', Table 3, https://arxiv.org/abs/2407.21783; "
     "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json",
     "GQA 32:8, 128k vocabulary, RoPE theta 500k, d_ff 14336 (multiplier 1.3, multiple of 1024)",
     dict(_LLAMA_STYLE, vocab_size=128256, context_length=8192, d_model=4096, n_layers=32, n_heads=32,
          n_kv_heads=8, d_ff=14336, norm_eps=1e-5, rope_theta=500000.0),
     dict(n_heads=8), published_params=8_030_261_248,
     params_source="the Hugging Face checkpoint (the paper's '8B')")

_add("llama-3-70b", "Llama 3",
     "Llama Team 2024, 'The Llama 3 Herd of Models', Table 3, https://arxiv.org/abs/2407.21783; "
     "https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json",
     "Llama 3 at 70B: 80 layers, d_model 8192, GQA 64:8, 128k vocabulary, RoPE theta 500k",
     dict(_LLAMA_STYLE, vocab_size=128256, context_length=8192, d_model=8192, n_layers=80, n_heads=64,
          n_kv_heads=8, d_ff=28672, norm_eps=1e-5, rope_theta=500000.0),
     dict(n_heads=8), published_params=70_553_706_496,
     params_source="the Hugging Face checkpoint (the paper's '70B')")

_add("llama-4-scout", "Llama 4",
     "Meta 2025, 'The Llama 4 herd', https://ai.meta.com/blog/llama-4-multimodal-intelligence/; "
     "https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json (text_config)",
     "iRoPE: 3 RoPE layers with chunked local attention (blocks of 8192) : 1 global NoPE layer; GQA 40:8; "
     "every FFN a mixture of 16 experts (top-1) plus a shared one",
     dict(_LLAMA_STYLE, vocab_size=202048, context_length=10485760, d_model=5120, n_layers=48, n_heads=40,
          n_kv_heads=8, head_dim=128, d_ff=16384, norm_eps=1e-5, rope_theta=500000.0, rope_style="interleaved",
          sliding_window=8192, local_attention="chunk", layer_pattern="LLLG", nope_global_layers=True, n_experts=16,
          experts_per_token=1, n_shared_experts=1, expert_d_ff=8192, router_score="sigmoid",
          router_renormalize=False, router_weights="input", qk_norm="l2", qk_norm_layers="rope",
          attn_temperature_tuning=True, attn_temperature_floor=8192, attn_temperature_scale=0.1,
          rope_scaling={"type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192}), dict(d_model=160, n_heads=10, n_layers=4),
     notes="Every FFN is a mixture of 16 routed experts of width 8192, top-1, plus one shared expert, as "
           "published (lmlab analyze: total and active parameters); each expert is fed the token times the "
           "sigmoid of its router logit (router_weights='input'). The RoPE layers use chunked attention "
           "(local_attention='chunk': a token sees the earlier tokens of its block of 8192) and a weightless "
           "L2 QK-norm; the NoPE layers attention temperature tuning (floor 8192, scale 0.1). The text model "
           "is the llama4_text family (HF parity tested); the card's 109B counts the multimodal checkpoint: "
           "with the published vision_config's tower (871,932,416 parameters in HF "
           "Llama4ForConditionalGeneration) it is 108,641,793,536, -0.33% (tests/test_hf_parity.py).",
     total_params=109e9, active_params=17e9)  # the model card (multimodal checkpoint); the text model: 107.8B

# --- Mistral -------------------------------------------------------------------------------------
_add("mistral-7b", "Mistral",
     "Jiang et al. 2023, 'Mistral 7B', Table 1, https://arxiv.org/abs/2310.06825; "
     "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json",
     "Llama block with sliding-window attention (4096) on every layer and GQA 32:8",
     dict(_LLAMA_STYLE, vocab_size=32000, context_length=8192, d_model=4096, n_layers=32, n_heads=32,
          n_kv_heads=8, d_ff=14336, norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096),
     dict(n_heads=8), published_params=7_241_732_096,
     params_source="the Hugging Face checkpoint (the paper's '7.3B')",
     notes="context_length 8192 is the paper's; the config.json allows 32768 positions.")

_add("mixtral-8x7b", "Mixtral",
     "Jiang et al. 2024, 'Mixtral of Experts', Table 1, https://arxiv.org/abs/2401.04088; "
     "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
     "Mistral's attention with every FFN a mixture of 8 SwiGLU experts (d_ff 14336), top-2 softmax "
     "renormalised: 46.7B parameters, 12.9B active per token",
     dict(_LLAMA_STYLE, vocab_size=32000, context_length=32768, d_model=4096, n_layers=32, n_heads=32,
          n_kv_heads=8, d_ff=14336, norm_eps=1e-5, rope_theta=1000000.0, n_experts=8, experts_per_token=2,
          router_score="softmax", router_renormalize=True, moe_aux_loss=0.02),
     dict(n_heads=8), published_params=46_702_792_704,
     params_source="the Hugging Face checkpoint (the paper's '47B total, 13B active')",
     notes="moe_aux_loss 0.02 is the config.json's router_aux_loss_coef; no sliding window (the paper's "
           "32k context, config.json sliding_window null).")

# --- DeepSeek-V2 (MLA + MoE) ---------------------------------------------------------------------
_DEEPSEEK_V2 = dict(_LLAMA_STYLE, vocab_size=102400, context_length=163840, norm_eps=1e-6, rope_theta=10000.0,
                    rope_style="interleaved", rope_scaling={"type": "yarn", "factor": 40.0,
                                                            "original_max_position_embeddings": 4096,
                                                            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707,
                                                            "mscale_all_dim": 0.707},
                    attention="mla", kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                    n_shared_experts=2, experts_per_token=6, router_score="softmax", router_renormalize=False,
                    moe_first_dense=1)
_MLA_TINY = dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
_DEEPSEEK_NOTES = ("YaRN RoPE scaling (factor 40 from 4,096 positions; mscale 0.707 on the rotary factors and "
                   "mscale_all_dim 0.707 squared on the softmax scale) as config.json; the deepseek_v2 family "
                   "is HF-parity tested. Decoding re-expands the cached latents each step (no weight "
                   "absorption).")
_add("deepseek-v2", "DeepSeek-V2",
     "DeepSeek-AI 2024, 'DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model', "
     "Sec. 2 and 3.1.2, https://arxiv.org/abs/2405.04434; "
     "https://huggingface.co/deepseek-ai/DeepSeek-V2/blob/main/config.json",
     "multi-head latent attention (KV latent 512 + RoPE key 64 per token: 576 cached values against "
     "32,768 for MHA), queries through a 1536 bottleneck; DeepSeekMoE: 160 routed experts (top-6) + 2 "
     "shared, the first layer dense",
     dict(_DEEPSEEK_V2, d_model=5120, n_layers=60, n_heads=128, q_lora_rank=1536, d_ff=12288, n_experts=160,
          expert_d_ff=1536, router_groups=8, router_topk_groups=3, routed_scaling_factor=16.0),
     dict(q_lora_rank=48, **_MLA_TINY), total_params=236e9, active_params=21e9,
     notes="The paper's 236B total / 21B active; lmlab counts 235.7B / 21.4B. The router is DeepSeek-V2's: "
           "group-limited (8 groups of 20 experts, the top-6 taken within the 3 groups whose best expert "
           "scores highest) and the routed weights x 16 (routed_scaling_factor). " + _DEEPSEEK_NOTES)
_add("deepseek-v2-lite", "DeepSeek-V2",
     "DeepSeek-AI 2024, 'DeepSeek-V2', Appendix B (DeepSeek-V2-Lite), https://arxiv.org/abs/2405.04434; "
     "https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json",
     "MLA without the query bottleneck (KV latent 512 + RoPE key 64), 64 routed experts (top-6, greedy, "
     "softmax without renormalisation) + 2 shared, the first layer dense",
     dict(_DEEPSEEK_V2, d_model=2048, n_layers=27, n_heads=16, q_lora_rank=None, d_ff=10944, n_experts=64,
          expert_d_ff=1408), dict(**_MLA_TINY), total_params=15.7e9, active_params=2.4e9,
     notes="The paper's 15.7B total / 2.4B active; lmlab counts 15.71B total and 2.66B active with both "
           "the embedding and the untied LM head (2.45B counting one of them, 2.24B without either). "
           "The router is DeepSeek-V2-Lite's (greedy top-6, routed_scaling_factor 1). " + _DEEPSEEK_NOTES)

# --- DeepSeek-V3 (MLA + sigmoid-routed MoE with the auxiliary-loss-free bias, MTP) --------------------------
_add(
    "deepseek-v3",
    "DeepSeek-V3",
    "DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', Sec. 2 and 4.2, https://arxiv.org/abs/2412.19437; "
    "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
    "MLA (KV latent 512 + RoPE key 64, query bottleneck 1536), 256 sigmoid-scored routed experts (top-8 among "
    "the best 4 of 8 groups, renormalised x 2.5) + 1 shared, balanced by a routing bias instead of a loss, the "
    "first 3 layers dense: 671B parameters, 37B active per token",
    dict(_DEEPSEEK_V2, vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, q_lora_rank=1536, d_ff=18432,
         n_experts=256, expert_d_ff=2048, n_shared_experts=1, experts_per_token=8, router_score="sigmoid",
         router_renormalize=True, router_groups=8, router_topk_groups=4, router_group_score="top2_sum",
         routed_scaling_factor=2.5, moe_first_dense=3, moe_balance="aux_free", moe_bias_update_rate=0.001,
         moe_seq_aux_loss=0.0001,
         rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                       "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    dict(**_MLA_TINY, n_layers=3, n_experts=16, experts_per_token=2, router_groups=4, router_topk_groups=2,
         moe_first_dense=1),
    published_params=671e9,
    params_source="the model card (671B main model; its 14B multi-token prediction module counted apart)",
    notes="Balancing as the report trains it: moe_balance aux_free with bias update rate 0.001 and the "
    "sequence-wise loss at 0.0001 (Sec. 4.2); the multi-token prediction module (depth 1, an MoE layer like "
    "the last) is not in this preset's count: `--set mtp_depth=1` adds it (11.61B by lmlab's count; the "
    "checkpoint's 685B also stores the module's own copies of the embedding and the output head, 2 x 0.93B, "
    "and FP8 scales). YaRN x40 from 4,096 positions as config.json. The deepseek_v3 family is HF-parity tested. "
    "Decoding re-expands the cached latents each step (no weight absorption).",
)

# --- gpt-oss (sinks, local/global, clamped-SwiGLU MoE with biases) ---------------------------------------
_GPT_OSS = dict(
    _LLAMA_STYLE,
    vocab_size=201088,
    context_length=131072,
    d_model=2880,
    n_heads=64,
    n_kv_heads=8,
    head_dim=64,
    d_ff=2880,
    expert_d_ff=2880,
    norm_eps=1e-5,
    bias="all",
    activation="swiglu_clamped",
    swiglu_alpha=1.702,
    swiglu_limit=7.0,
    rope_theta=150000.0,
    attn_sinks=True,
    sliding_window=128,
    layer_pattern="LG",
    experts_per_token=4,
    router_score="softmax",
    router_renormalize=True,
    router_bias=True,
    rope_scaling={
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    },
)
_GPT_OSS_NOTES = ("Alternating 128-token sliding-window and full layers, a learned sink logit per head, YaRN x32 "
                  "from 4,096 positions (untruncated), biases on q/k/v/o, the router and the experts; the release "
                  "stores the experts in MXFP4 (4.25 bits per parameter), which lmlab does not read (dequantise "
                  "with transformers first). The gpt_oss family is HF-parity tested.")
_add("gpt-oss-20b", "gpt-oss",
     "OpenAI 2025, 'gpt-oss-120b & gpt-oss-20b Model Card', Table 1, https://arxiv.org/abs/2508.10925; "
     "https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json",
     "GQA 64:8 with attention sinks, alternating banded (128) and full layers, every FFN 32 clamped-SwiGLU "
     "experts (top-4): 20.9B parameters, 3.6B active per token",
     dict(_GPT_OSS, n_layers=24, n_experts=32),
     dict(n_heads=8, n_experts=4, experts_per_token=2), published_params=20.91e9,
     params_source="the model card, Table 1 (20.91B total, 3.61B active)", notes=_GPT_OSS_NOTES)

_add("gpt-oss-120b", "gpt-oss",
     "OpenAI 2025, 'gpt-oss-120b & gpt-oss-20b Model Card', Table 1, https://arxiv.org/abs/2508.10925; "
     "https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json",
     "gpt-oss-20b's block at 36 layers with 128 experts (top-4): 116.8B parameters, 5.1B active per token",
     dict(_GPT_OSS, n_layers=36, n_experts=128),
     dict(n_heads=8, n_experts=4, experts_per_token=2), published_params=116.83e9,
     params_source="the model card, Table 1 (116.83B total, 5.13B active)", notes=_GPT_OSS_NOTES)

# --- Qwen ----------------------------------------------------------------------------------------
_add("qwen2-7b", "Qwen2",
     "Yang et al. 2024, 'Qwen2 Technical Report', https://arxiv.org/abs/2407.10671; "
     "https://huggingface.co/Qwen/Qwen2-7B/blob/main/config.json",
     "Llama block with biases on the q/k/v projections only, GQA 28:4, RoPE theta 1e6",
     dict(_LLAMA_STYLE, vocab_size=152064, context_length=32768, d_model=3584, n_layers=28, n_heads=28,
          n_kv_heads=4, d_ff=18944, norm_eps=1e-6, rope_theta=1000000.0, bias="qkv"),
     dict(d_model=224, n_heads=7), published_params=7_615_616_512,
     params_source="the Hugging Face checkpoint (the report's '7B')",
     notes="context_length 32768 is the pre-training length (YaRN extends it to 128k).")

_add("qwen3-8b", "Qwen3",
     "Yang et al. 2025, 'Qwen3 Technical Report', https://arxiv.org/abs/2505.09388; "
     "https://huggingface.co/Qwen/Qwen3-8B (model card: 8.2B parameters), config.json",
     "Qwen2 without the qkv bias, with per-head RMSNorm on q and k (QK-norm), GQA 32:8",
     dict(_LLAMA_STYLE, vocab_size=151936, context_length=40960, d_model=4096, n_layers=36, n_heads=32,
          n_kv_heads=8, head_dim=128, d_ff=12288, norm_eps=1e-6, rope_theta=1000000.0, qk_norm="rmsnorm"),
     dict(n_heads=8), published_params=8.2e9, params_source="the model card (8.2B)")

_QWEN3_MOE = dict(_LLAMA_STYLE, vocab_size=151936, context_length=40960, n_kv_heads=4, head_dim=128, norm_eps=1e-6,
                  rope_theta=1000000.0, qk_norm="rmsnorm", n_experts=128, experts_per_token=8, router_score="softmax",
                  router_renormalize=True)
_QWEN3_MOE_NOTES = ("Every layer's FFN is the mixture (decoder_sparse_step 1, no mlp_only_layers, so d_ff is never "
                    "used); no shared expert; norm_topk_prob true in config.json (router_renormalize); the config's "
                    "router_aux_loss_coef 0.001 is left out (moe_aux_loss 0: set it to train with the balance loss). "
                    "The qwen3_moe family is HF-parity tested.")
_add("qwen3-30b-a3b", "Qwen3-MoE",
     "Yang et al. 2025, 'Qwen3 Technical Report', Table 2, https://arxiv.org/abs/2505.09388; "
     "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
     "Qwen3's attention (per-head QK RMSNorm, GQA 32:4, head_dim 128) with every FFN a mixture of 128 SwiGLU "
     "experts (width 768), top-8 softmax renormalised: 30.5B parameters, 3.3B active per token",
     dict(_QWEN3_MOE, d_model=2048, n_layers=48, n_heads=32, d_ff=6144, expert_d_ff=768),
     dict(n_heads=8, n_experts=8, experts_per_token=2), published_params=30_532_122_624,
     params_source="the Hugging Face checkpoint (the model card's '30.5B in total and 3.3B activated')",
     notes=_QWEN3_MOE_NOTES)

_add("qwen3-235b-a22b", "Qwen3-MoE",
     "Yang et al. 2025, 'Qwen3 Technical Report', Table 2, https://arxiv.org/abs/2505.09388; "
     "https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json",
     "Qwen3-30B-A3B's design at 94 layers of width 4096 (GQA 64:4), experts of width 1536: 235B parameters, "
     "22B active per token",
     dict(_QWEN3_MOE, d_model=4096, n_layers=94, n_heads=64, d_ff=12288, expert_d_ff=1536),
     dict(n_heads=16, n_experts=8, experts_per_token=2), published_params=235_093_634_560,
     params_source="the Hugging Face checkpoint (the model card's '235B in total and 22B activated')",
     notes=_QWEN3_MOE_NOTES)

_add(
    "qwen3-next-80b-a3b",
    "Qwen3-Next",
    "Qwen Team 2025, 'Qwen3-Next: Towards Ultimate Training & Inference Efficiency', "
    "https://qwen.ai/blog?id=4074cca80393150c248e508aa62983f9cb7d27cd; "
    "https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json",
    "A 3:1 hybrid: three Gated DeltaNet layers (16 q/k heads, 32 value heads of 128) to one gated full-attention "
    "layer (GQA 16:2, head_dim 256, (1 + w) QK-norm, RoPE on a quarter of each head), zero-centred RMSNorms, "
    "every FFN 512 experts of width 512 (top-10) plus a gated shared expert: 80B parameters, 3.9B active",
    dict(_LLAMA_STYLE, norm_type="gemma_rmsnorm", vocab_size=151936, context_length=262144, d_model=2048,
         n_layers=48, n_heads=16, n_kv_heads=2, head_dim=256, d_ff=5120, norm_eps=1e-6, rope_theta=10_000_000.0,
         rope_fraction=0.25, qk_norm="gemma_rmsnorm", attn_output_gate="elementwise", layer_pattern="DDDG",
         linear_n_k_heads=16, linear_n_v_heads=32, linear_k_head_dim=128, linear_v_head_dim=128,
         linear_conv_kernel=4, n_experts=512, experts_per_token=10, expert_d_ff=512, n_shared_experts=1,
         shared_expert_gate=True, router_score="softmax", router_renormalize=True),
    dict(n_heads=8, n_layers=4, n_experts=8, experts_per_token=2, linear_n_k_heads=2, linear_n_v_heads=4,
         linear_k_head_dim=32, linear_v_head_dim=32),
    published_params=80e9,
    params_source="the model card ('80B in total and 3B activated', rounded; lmlab counts 79.67B and 3.87B "
    "active, NVIDIA's card 3.9B active)",
    notes="The Hugging Face checkpoint also stores the multi-token-prediction module (mtp.*: one gated "
    "full-attention layer with the 512-expert MoE, a 2d -> d projection and norms, about 1.65B by lmlab's "
    "formulas), which transformers' model does not load and lmlab's import refuses rather than drop; "
    "lmlab's mtp_depth does not yet take MoE blocks. The config's router_aux_loss_coef 0.001 is left out "
    "(moe_aux_loss 0). Decoding holds each DeltaNet layer's 32 x 128 x 128 state (2 MiB per sequence in "
    "fp32) instead of keys: `lmlab analyze --preset qwen3-next-80b-a3b --scale real`. The qwen3_next "
    "family is HF-parity tested.",
)

# --- Gemma family --------------------------------------------------------------------------------
_add("gemma-7b", "Gemma",
     "Gemma Team 2024, 'Gemma: Open Models Based on Gemini Research and Technology', Tables 1-2, "
     "https://arxiv.org/abs/2403.08295; https://huggingface.co/google/gemma-7b/blob/main/config.json",
     "RMSNorm (1 + w), GeGLU with d_ff = 8 d_model, head_dim 256 > d_model / n_heads, embeddings x sqrt(d_model), "
     "tied",
     dict(_GEMMA_STYLE, vocab_size=256000, context_length=8192, d_model=3072, n_layers=28, n_heads=16,
          head_dim=256, d_ff=24576, norm_position="pre", rope_theta=10000.0), {}, published_params=8_537_680_896,
     params_source="Gemma Team 2024, Table 2 (786,432,000 embedding + 7,751,248,896 non-embedding)")

_add("gemma-2b", "Gemma",
     "Gemma Team 2024, Tables 1-2, https://arxiv.org/abs/2403.08295; "
     "https://huggingface.co/google/gemma-2b/blob/main/config.json",
     "the Gemma block at 2B with multi-query attention (8 query heads, 1 KV head)",
     dict(_GEMMA_STYLE, vocab_size=256000, context_length=8192, d_model=2048, n_layers=18, n_heads=8,
          n_kv_heads=1, head_dim=256, d_ff=16384, norm_position="pre", rope_theta=10000.0),
     dict(n_heads=8), published_params=2_506_172_416,
     params_source="Gemma Team 2024, Table 2 (524,288,000 embedding + 1,981,884,416 non-embedding)")

_add("gemma-2-9b", "Gemma 2",
     "Gemma Team 2024, 'Gemma 2: Improving Open Language Models at a Practical Size', Tables 1-2, "
     "https://arxiv.org/abs/2408.00118; https://huggingface.co/google/gemma-2-9b/blob/main/config.json",
     "sandwich norms, logit soft-caps (attention 50, final 30), local 4096 / global attention alternating, "
     "GQA 16:8",
     dict(_GEMMA_STYLE, vocab_size=256000, context_length=8192, d_model=3584, n_layers=42, n_heads=16,
          n_kv_heads=8, head_dim=256, d_ff=14336, norm_position="sandwich", rope_theta=10000.0,
          attn_logit_softcap=50.0, final_logit_softcap=30.0, query_pre_attn_scalar=256.0,
          sliding_window=4096, layer_pattern="LG"), {}, published_params=9_241_705_984,
     params_source="Gemma Team 2024 (Gemma 2), Table 2 (917,504,000 embedding + 8,324,201,984 non-embedding)")

_add("gemma-3-12b", "Gemma 3",
     "Gemma Team 2025, 'Gemma 3 Technical Report', Table 1, https://arxiv.org/abs/2503.19786; "
     "https://huggingface.co/google/gemma-3-12b-pt/blob/main/config.json",
     "5 local (window 1024, RoPE 10k) : 1 global (RoPE 1M, linear x8) layers, QK-norm replaces soft-caps, "
     "sandwich norms",
     dict(_GEMMA_STYLE, vocab_size=262208, context_length=131072, d_model=3840, n_layers=48, n_heads=16,
          n_kv_heads=8, head_dim=256, d_ff=15360, norm_position="sandwich", rope_theta=1000000.0,
          rope_local_theta=10000.0, rope_scaling={"type": "linear", "factor": 8.0}, qk_norm="gemma_rmsnorm",
          query_pre_attn_scalar=256.0, sliding_window=1024, layer_pattern="LLLLLG"),
     dict(n_layers=6), published_params=11.771e9,
     params_source="Gemma Team 2025 (Gemma 3), Table 1 (1,012M embedding + 10,759M non-embedding)",
     notes="Text model only (the 417M SigLIP encoder is not counted).")

# Gemma 3 at 1B, 4B and 27B: 26, 34 and 62 layers, so the 6-layer pattern ends mid-pattern (HF's
# layer_types: layer i is full when (i + 1) % 6 == 0). The tiny scale has one period (6 layers, as
# gemma-3-12b's); tests/test_hf_parity.py checks a depth that ends mid-pattern against HF.
_GEMMA3_SRC = ("Gemma Team 2025, 'Gemma 3 Technical Report', Table 1, https://arxiv.org/abs/2503.19786; "
               "https://huggingface.co/google/gemma-3-{size}-pt/blob/main/config.json")
_GEMMA3_COUNT = ("keras-hub gemma3 presets, text-only checkpoint parameter count{rows}; the report's "
                 "Table 1 rounds to {report}")
_ROWS = " (262,144 embedding rows; the HF config's 262,208 add 64 x d_model, which lmlab counts)"
_add("gemma-3-1b", "Gemma 3", _GEMMA3_SRC.format(size="1b"),
     "5 local (window 512) : 1 global layers over 26 layers (ends mid-pattern: ...LL), MQA, no RoPE "
     "scaling at 32k context",
     dict(_GEMMA_STYLE, vocab_size=262144, context_length=32768, d_model=1152, n_layers=26, n_heads=4,
          n_kv_heads=1, head_dim=256, d_ff=6912, norm_position="sandwich", rope_theta=1000000.0,
          rope_local_theta=10000.0, qk_norm="gemma_rmsnorm", query_pre_attn_scalar=256.0,
          sliding_window=512, layer_pattern="LLLLLG"), dict(n_layers=6), published_params=999_885_952,
     params_source=_GEMMA3_COUNT.format(rows="", report="302M embedding + 698M non-embedding"),
     notes="Text only, as released.")
_add("gemma-3-4b", "Gemma 3", _GEMMA3_SRC.format(size="4b"),
     "5 local (window 1024) : 1 global layers over 34 layers (ends mid-pattern: ...LLLL), GQA 8:4, "
     "global RoPE 1M linear x8",
     dict(_real_of("gemma-3-1b"), vocab_size=262208, context_length=131072, d_model=2560, n_layers=34, n_heads=8,
          n_kv_heads=4, head_dim=256, d_ff=10240, sliding_window=1024,
          rope_scaling={"type": "linear", "factor": 8.0}), dict(n_layers=6), published_params=3_880_099_328,
     params_source=_GEMMA3_COUNT.format(rows=_ROWS, report="675M embedding + 3,209M non-embedding"),
     notes="Text model only (the 417M SigLIP encoder is not counted).")
_add("gemma-3-27b", "Gemma 3", _GEMMA3_SRC.format(size="27b"),
     "5 local (window 1024) : 1 global layers over 62 layers (ends mid-pattern: ...LL), GQA 32:16, "
     "head_dim 128 with queries scaled by 168^-0.5 (= (d_model / n_heads)^-0.5; tiny: head_dim 32, 42)",
     dict(_real_of("gemma-3-4b"), d_model=5376, n_layers=62, n_heads=32, n_kv_heads=16, head_dim=128, d_ff=21504,
          query_pre_attn_scalar=168.0),
     dict(n_layers=6, head_dim=32, query_pre_attn_scalar=42.0), published_params=27_009_002_240,
     params_source=_GEMMA3_COUNT.format(rows=_ROWS, report="1,416M embedding + 25,600M non-embedding"),
     notes="Text model only (the 417M SigLIP encoder is not counted).")

# Gemma 4 31B, the dense text model (model_type gemma4_text). Dimensions from its config.json's text_config as
# republished in public test fixtures (hidden 5376, 60 layers, 32 heads, 16 KV heads x 256 on sliding layers,
# 4 KV heads x 512 with keys as values on full layers, window 1024, proportional RoPE 1/4 at 1M, 262,144
# tokens, final soft-cap 30); transformers 5.24's Gemma4TextConfig / modeling_gemma4.py for the rest.
_add("gemma-4-31b", "Gemma 4",
     "Gemma Team 2026, Gemma 4 model card, https://huggingface.co/google/gemma-4-31B ('dense, 30.7B "
     "parameters'); its config.json text_config; transformers 5.24 configuration_gemma4.py / "
     "modeling_gemma4.py (Gemma4TextConfig)",
     "5 local (window 1024, 16 KV heads x 256) : 1 global (4 KV heads x 512, keys as values, proportional "
     "RoPE on 1/4 of the pairs) layers; QK- and V-norm with query scale 1; layer scalars",
     dict(_GEMMA_STYLE, norm_type="rmsnorm", norm_weight_fp32=True, vocab_size=262144, context_length=262144,
          d_model=5376, n_layers=60, n_heads=32, n_kv_heads=16, head_dim=256, d_ff=21504,
          norm_position="sandwich", rope_theta=1000000.0, rope_local_theta=10000.0, qk_norm="rmsnorm",
          v_norm=True, query_pre_attn_scalar=1.0, sliding_window=1024, layer_pattern="LLLLLG",
          global_head_dim=512, global_n_kv_heads=4, global_k_eq_v=True, global_rope_proportion=0.25,
          final_logit_softcap=30.0, layer_scalar=True),
     dict(n_layers=6, n_heads=8, head_dim=24, global_head_dim=48, global_n_kv_heads=1, query_pre_attn_scalar=1.0),
     published_params=30.7e9, params_source="the Gemma 4 model card (31B dense: 30.7B; the ~550M vision "
                                            "encoder of the multimodal checkpoint is not in the text model)",
     notes="Text model only; count equal to HF Gemma4ForCausalLM's on the same config (30,697,345,280). "
           "E2B/E4B (per-layer input embeddings, KV sharing) and 26B-A4B (an MoE block beside the MLP) have "
           "no lmlab switches yet and are refused on import.")

# Gemma 4 26B-A4B: the 31B's attention design at d_model 2816 (16 heads, 8 KV x 256 local, 2 KV x 512 with keys as
# values global) and, on every layer, a mixture of 128 GeGLU experts of width 704 (top 8) beside a dense FFN of
# 2112. Config from its config.json text_config as republished in public test fixtures (several agree).
_add("gemma-4-26b-a4b", "Gemma 4",
     "Gemma Team 2026, Gemma 4 model card, https://huggingface.co/google/gemma-4-26B-A4B ('26B total, 3.8B "
     "active'); its config.json text_config; transformers 5.24 modeling_gemma4.py (Gemma4TextRouter, "
     "Gemma4TextExperts)",
     "the 31B's local/global attention at d_model 2816; on every layer 128 experts (top 8, width 704) beside a "
     "dense FFN (2112), the router reading the normalised residual, a learned scale per expert",
     dict(_real_of("gemma-4-31b"), d_model=2816, n_layers=30, n_heads=16, n_kv_heads=8, d_ff=2112, global_n_kv_heads=2,
          n_experts=128, experts_per_token=8, expert_d_ff=704, router_score="softmax", router_renormalize=True,
          moe_beside_dense=True, router_input_norm=True, router_expert_scale=True),
     dict(n_layers=6, n_heads=8, head_dim=24, global_head_dim=48, global_n_kv_heads=1, query_pre_attn_scalar=1.0,
          n_experts=8, experts_per_token=2),
     notes="Text model only; count equal to HF Gemma4ForCausalLM's on the same config (25,233,141,760; "
           "3,822,530,560 active per token: lmlab analyze); the card's 26B total counts the multimodal "
           "checkpoint (with its vision encoder), its 3.8B active agrees (+0.6%). HF adds no load-balancing "
           "loss to Gemma 4's loss, nor does the preset (moe_aux_loss 0).",
     total_params=26e9, active_params=3.8e9)  # the model card (multimodal checkpoint)

# Gemma 4 E2B and E4B ("effective" 2B / 4B), the on-device dense text models: 1 KV head x 256 (E4B: 2) on local
# layers, 512 wide on global ones (no keys-as-values), per-layer input embeddings of 256 per layer (a second
# 262,144-row table), and KV sharing: the last 20 (E4B: 18) layers reuse the keys and values of the last earlier
# layer of their kind; E2B's shared layers have double-wide MLPs. Configs from their config.json text_config as
# republished in public test fixtures (several agree).
_GEMMA4_E_SRC = ("Gemma Team 2026, Gemma 4 model card, https://huggingface.co/google/gemma-4-{size} ('{eff}B "
                 "effective parameters'); its config.json text_config; transformers 5.24 modeling_gemma4.py")
_GEMMA4_E_NOTE = ("Text model only. The count equals HF Gemma4ForCausalLM's on the same config ({count}); the "
                  "card's 'effective' parameters exclude the per-layer embedding table: here {eff} (card: {card}B).")
_add("gemma-4-e2b", "Gemma 4", _GEMMA4_E_SRC.format(size="E2B", eff="2.3"),
     "4 local (window 512) : 1 global layers, MQA; per-layer input embeddings (256 per layer); the last 20 layers "
     "share earlier layers' keys and values and have double-wide MLPs",
     dict(_GEMMA_STYLE, norm_type="rmsnorm", norm_weight_fp32=True, vocab_size=262144, context_length=131072,
          d_model=1536, n_layers=35, n_heads=8, n_kv_heads=1, head_dim=256, d_ff=6144, norm_position="sandwich",
          rope_theta=1000000.0, rope_local_theta=10000.0, qk_norm="rmsnorm", v_norm=True,
          query_pre_attn_scalar=1.0, sliding_window=512, layer_pattern="LLLLG", global_head_dim=512,
          global_rope_proportion=0.25, final_logit_softcap=30.0, layer_scalar=True, kv_shared_layers=20,
          kv_shared_wide_ffn=True, ple_dim=256),
     dict(n_layers=10, head_dim=32, global_head_dim=64, query_pre_attn_scalar=1.0, kv_shared_layers=5, ple_dim=16),
     notes=_GEMMA4_E_NOTE.format(count="4,628,569,344", eff="2,279,759,104", card="2.3"))
_add("gemma-4-e4b", "Gemma 4", _GEMMA4_E_SRC.format(size="E4B", eff="4.5"),
     "5 local (window 512) : 1 global layers, GQA 8:2; per-layer input embeddings (256 per layer); the last 18 "
     "layers share earlier layers' keys and values",
     dict(_real_of("gemma-4-e2b"), d_model=2560, n_layers=42, n_kv_heads=2, d_ff=10240, layer_pattern="LLLLLG",
          kv_shared_layers=18,
          kv_shared_wide_ffn=False),
     dict(n_layers=12, n_heads=8, head_dim=32, global_head_dim=64, query_pre_attn_scalar=1.0, kv_shared_layers=5,
          ple_dim=16),
     notes=_GEMMA4_E_NOTE.format(count="7,463,013,376", eff="4,644,441,088", card="4.5"))

# --- OLMo ----------------------------------------------------------------------------------------
_add("olmo-7b", "OLMo",
     "Groeneveld et al. 2024, 'OLMo: Accelerating the Science of Language Models', section 2.1 and Table 1, "
     "https://arxiv.org/abs/2402.00838; https://huggingface.co/allenai/OLMo-7B-hf/blob/main/config.json",
     "non-parametric LayerNorm (no weight, no bias), SwiGLU, RoPE, no biases, untied",
     dict(_LLAMA_STYLE, vocab_size=50304, context_length=2048, d_model=4096, n_layers=32, n_heads=32,
          d_ff=11008, norm_type="layernorm", norm_bias=False, norm_affine=False, norm_eps=1e-5, rope_theta=10000.0),
     {}, published_params=6.89e9, params_source="the Hugging Face model card (6.89B)",
     notes="OLMo 1.7 (OLMo-7B-0424) adds clip_qkv=8.0.")

_add("olmo-2-7b", "OLMo 2",
     "OLMo Team 2024, '2 OLMo 2 Furious', section 3, https://arxiv.org/abs/2501.00656; "
     "https://huggingface.co/allenai/OLMo-2-1124-7B/blob/main/config.json",
     "reordered norm (RMSNorm on each sublayer's output, none on its input), QK-norm, RoPE theta 500k",
     dict(_LLAMA_STYLE, vocab_size=100352, context_length=4096, d_model=4096, n_layers=32, n_heads=32,
          d_ff=11008, norm_position="reordered", norm_eps=1e-6, rope_theta=500000.0, qk_norm="rmsnorm",
          qk_norm_scope="all", norm_weight_fp32=True),
     {}, published_params=7.30e9, params_source="the Hugging Face model card (7.3B)")

_add("olmo-3-7b", "OLMo 3",
     "OLMo Team 2025, 'OLMo 3' (allenai/Olmo-3-1025-7B); its config.json as republished in "
     "https://huggingface.co/mlx-community/Olmo-3-7B-RLZero-Code-4bit/blob/main/config.json (d_model 4096, "
     "32 layers, 32 heads, d_ff 11008, layer_types 3 sliding : 1 full, 65,536 positions) and "
     "https://huggingface.co/tiny-random/olmo-3/blob/main/config.json (its shrunk copy: vocabulary 100,278, "
     "sliding_window 4096, YaRN factor 8 from 8,192 positions, beta 32/1, theta 500k); fairseq2's olmo3_7b "
     "(YaRN from 8K to 65K)",
     "OLMo 2's block (reordered RMSNorm, QK-norm) with 3 sliding-window (4096) : 1 full layers, YaRN on the "
     "full layers",
     dict(_real_of("olmo-2-7b"), vocab_size=100278, context_length=65536, sliding_window=4096, layer_pattern="LLLG",
          rope_local_theta=500000.0,
          rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                        "beta_fast": 32.0, "beta_slow": 1.0}), {},
     notes="No parameter count is published beside the '7B' name (the public config gives 7,298,011,136, "
           "as HF Olmo3ForCausalLM and lmlab analyze count it); the config was read from two public copies, "
           "not from allenai's repository, which is not reachable offline.")

# --- SmolLM3 -------------------------------------------------------------------------------------
_add("smollm3-3b", "SmolLM3",
     "Hugging Face 2025, 'SmolLM3: smol, multilingual, long-context reasoner', https://huggingface.co/blog/smollm3; "
     "https://huggingface.co/HuggingFaceTB/SmolLM3-3B/blob/main/config.json (transformers' SmolLM3Config "
     "defaults are this checkpoint's)",
     "Llama block, GQA 16:4, tied embeddings, NoPE on every 4th layer (layers 3, 7, ..., 35), RoPE theta 5M",
     dict(_LLAMA_STYLE, vocab_size=128256, context_length=65536, d_model=2048, n_layers=36, n_heads=16,
          n_kv_heads=4, d_ff=11008, norm_eps=1e-6, rope_theta=5_000_000.0, tie_embeddings=True,
          nope_layers="RRRN"), dict(n_layers=4), published_params=3.08e9,
     params_source="the Hugging Face model page (3.08B)",
     notes="The 128k context of the card is reached with YaRN at inference; the trained context (65,536) is used.")

# --- InternLM2 -----------------------------------------------------------------------------------
_add("internlm2-7b", "InternLM2",
     "Cai et al. 2024, 'InternLM2 Technical Report', section 2.2 and Table 1, https://arxiv.org/abs/2403.17297; "
     "https://huggingface.co/internlm/internlm2-7b/blob/main/config.json",
     "the Llama block with GQA 32:8, a 92,544-token vocabulary, RoPE theta 1M, untied",
     dict(_LLAMA_STYLE, vocab_size=92544, context_length=32768, d_model=4096, n_layers=32, n_heads=32,
          n_kv_heads=8, d_ff=14336, norm_eps=1e-5, rope_theta=1_000_000.0), dict(n_heads=8),
     notes="No exact parameter count is published beside the '7B' label (lmlab analyze: 7.74B). Its "
           "checkpoints fuse q, k and v into one 'wqkv' interleaved per KV group; transformers 5.x ships no "
           "InternLM2 class, so `lmlab import` has no Hugging Face layout to read it from.")

# --- Marin ---------------------------------------------------------------------------------------
_add("marin-8b", "Marin",
     "Marin Community 2025, Marin 8B (trained with Levanter), https://huggingface.co/marin-community/marin-8b-base "
     "(config.json: LlamaForCausalLM)",
     "the Llama 3 8B architecture (GQA 32:8, d_ff 14336, Llama 3 tokenizer, RoPE theta 500k) trained openly; "
     "context 4096",
     dict(_LLAMA_STYLE, vocab_size=128256, context_length=4096, d_model=4096, n_layers=32, n_heads=32,
          n_kv_heads=8, d_ff=14336, norm_eps=1e-5, rope_theta=500000.0), dict(n_heads=8),
     notes="Its configuration is public and is Llama 3 8B's shape, so its parameter count is that checkpoint's "
           "(8,030,261,248; lmlab analyze gives the same); no separate figure is published for Marin.")

# --- T5 v1.1 -------------------------------------------------------------------------------------
_add("t5-v1.1-base-decoder", "T5 v1.1",
     "Shazeer 2020, 'GLU Variants Improve Transformer', https://arxiv.org/abs/2002.05202; "
     "https://github.com/google-research/text-to-text-transfer-transformer/blob/main/released_checkpoints.md"
     "#t511; https://huggingface.co/google/t5-v1_1-base/blob/main/config.json",
     "decoder-only T5 v1.1-base: GeGLU FFN (d_ff 2048), untied embeddings, no dropout in pre-training, "
     "relative position bias, RMS LayerNorm, no biases",
     dict(vocab_size=32128, context_length=512, d_model=768, n_layers=12, n_heads=12, d_ff=2048,
          norm_type="rmsnorm", norm_position="pre", norm_eps=1e-6, bias="none", activation="geglu",
          position="t5", t5_num_buckets=32, t5_max_distance=128, tie_embeddings=False,
          query_pre_attn_scalar=1.0), dict(query_pre_attn_scalar=1.0),
     notes="Decoder stack only (t5-v1_1-base's 248M include the encoder and cross-attention); q.k unscaled "
           "as in T5 (query_pre_attn_scalar=1).")

# --- Nemotron-4 ----------------------------------------------------------------------------------
_add("nemotron-4-15b", "Nemotron-4",
     "Parmar et al. 2024, 'Nemotron-4 15B Technical Report', section 2 (3.2B embedding + 12.5B "
     "non-embedding params), https://arxiv.org/abs/2402.16819",
     "squared-ReLU FFN (not gated), partial RoPE on half of each head, LayerNorm (1 + w), GQA 48:8, no biases, "
     "untied",
     dict(vocab_size=256000, context_length=4096, d_model=6144, n_layers=32, n_heads=48, n_kv_heads=8,
          d_ff=24576, norm_type="layernorm1p", norm_position="pre", norm_bias=True, norm_eps=1e-5, bias="none",
          activation="relu2", position="rope", rope_style="half", rope_fraction=0.5, rope_theta=10000.0,
          tie_embeddings=False), dict(d_model=192, n_heads=6), published_params=15.7e9,
     params_source="Parmar et al. 2024, section 2 (3.2B embedding + 12.5B non-embedding)",
     notes="d_ff = 4 d_model (24576) and partial RoPE 0.5 follow NVIDIA's Nemotron-4 configs (the paper "
           "gives neither). Its 'layernorm1p' (norm_type) stores the LayerNorm weight as an offset from one.")

_add("nemotron-4-340b", "Nemotron-4",
     "NVIDIA 2024, 'Nemotron-4 340B Technical Report', section 2.1 (96 layers, hidden 18432, 96 heads, 8 KV "
     "heads, vocabulary 256,000; 9.4B embedding + 331.6B non-embedding params), https://arxiv.org/abs/2406.11704; "
     "https://huggingface.co/nvidia/Nemotron-4-340B-Base",
     "Nemotron-4 at 340B: the 15B's block (squared ReLU, partial RoPE, LayerNorm (1 + w), no biases, untied) "
     "with 96 layers, d_model 18432, GQA 96:8",
     dict(vocab_size=256000, context_length=4096, d_model=18432, n_layers=96, n_heads=96, n_kv_heads=8,
          d_ff=73728, norm_type="layernorm1p", norm_position="pre", norm_bias=True, norm_eps=1e-5, bias="none",
          activation="relu2", position="rope", rope_style="half", rope_fraction=0.5, rope_theta=10000.0,
          tie_embeddings=False), dict(d_model=192, n_heads=12), published_params=341.0e9,
     params_source="NVIDIA 2024, section 2.1 (9.4B embedding + 331.6B non-embedding)",
     notes="d_ff = 4 d_model (73728) and partial RoPE 0.5 as in the 15B's configs; the report states the "
           "dimensions above and the two parameter counts, which these reproduce.")

# --- Cohere --------------------------------------------------------------------------------------
_add("command-r7b", "Cohere Command R7B",
     "Cohere 2024, model card and config.json, https://huggingface.co/CohereForAI/c4ai-command-r7b-12-2024",
     "parallel block off one bias-free LayerNorm, 3 sliding-window (4096) RoPE layers : 1 global NoPE layer",
     dict(vocab_size=256000, context_length=8192, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
          d_ff=14336, norm_type="layernorm", norm_position="pre", norm_bias=False, norm_eps=1e-5, bias="none",
          activation="swiglu", parallel_block=True, parallel_shared_norm=True, position="rope",
          rope_style="interleaved", rope_theta=50000.0, tie_embeddings=True, sliding_window=4096,
          layer_pattern="LLLG", nope_global_layers=True, logit_scale=0.25), dict(n_heads=8, n_layers=4),
     notes="The card states a 128k context; config.json's max_position_embeddings (8192) is used.")

# --- Phi-2 ---------------------------------------------------------------------------------------
_add("phi-2", "Phi-2",
     "Javaheripi et al. 2023, 'Phi-2: The surprising power of small language models', "
     "https://www.microsoft.com/en-us/research/blog/phi-2-the-surprising-power-of-small-language-models/; "
     "https://huggingface.co/microsoft/phi-2/blob/main/config.json",
     "GPT-J-style parallel block (one LayerNorm), partial RoPE on 40% of each head, GELU (tanh), biases, "
     "LM-head bias",
     dict(vocab_size=51200, context_length=2048, d_model=2560, n_layers=32, n_heads=32, d_ff=10240,
          norm_type="layernorm", norm_position="pre", norm_bias=True, norm_eps=1e-5, bias="all",
          lm_head_bias=True, activation="gelu_tanh", parallel_block=True, parallel_shared_norm=True,
          position="rope", rope_style="half", rope_fraction=0.4, rope_theta=10000.0, tie_embeddings=False),
     dict(d_model=160), published_params=2_779_683_840,
     params_source="the Hugging Face checkpoint (the blog's '2.7B')")


PRESETS: dict[str, Preset] = {p.name: p for p in _P}


# ------------------------------------------------------------------------------------------------
# Access
# ------------------------------------------------------------------------------------------------


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ConfigError listing the valid names and the nearest one otherwise."""
    if name in PRESETS:
        return PRESETS[name]
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    if key in PRESETS:
        return PRESETS[key]
    near = difflib.get_close_matches(key, list(PRESETS), n=1, cutoff=0.3)
    hint = f"; did you mean {near[0]!r}?" if near else "."
    raise ConfigError(f"unknown preset {name!r}{hint} Valid presets: {', '.join(PRESETS)}.")


def preset_config(name: str, scale: str = "tiny", **overrides: Any) -> ModelConfig:
    """ModelConfig of preset ``name`` at ``scale`` ('tiny' or 'real'), then ``overrides`` (field=value).

    Unknown override keys raise ConfigError naming the nearest field."""
    preset = get_preset(name)
    if scale not in SCALES:
        raise ConfigError(f"scale={scale!r} is not valid; choose one of {', '.join(map(repr, SCALES))}")
    data = dict(preset.real)
    if scale == "tiny":
        data.update(preset.tiny)
    data.update(overrides)
    return ModelConfig.from_dict(data, f"preset {preset.name!r} ({scale})")


@lru_cache(maxsize=None)
def real_param_count(name: str) -> int:
    """Parameter count of the real-scale config, built on the meta device (no memory; tied weights once)."""
    import torch

    from lmlab.model import TransformerLM

    with torch.device("meta"):
        return TransformerLM(preset_config(name, "real")).num_params()


def format_presets() -> str:
    """One line per preset: name, family, parameter label (published, or ~ours), summary."""
    rows = [(p.name, p.family, p.params_label, p.summary) for p in PRESETS.values()]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c:>{w2}}  {d}" for a, b, c, d in rows)
