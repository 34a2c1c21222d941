"""Model configuration: one dataclass, every architecture choice a named, validated field.

The defaults are today's shared recipe (LLaMA; Touvron et al. 2023): pre-norm RMSNorm, no biases,
SwiGLU FFN with d_ff = 8/3 d_model rounded up, RoPE, grouped-query attention (Ainslie et al. 2023).
Every other choice the CS336 lecture 3 surveys is a switch on this class; see the field comments.

A config is validated when built (``__post_init__``): an invalid value or combination raises
:class:`ConfigError` naming the field, the value and what would be valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, fields
from typing import Any, Optional



class ConfigError(ValueError):
    """An invalid configuration value; the message names the field, the value and what is valid."""


# Allowed values of the enumerated switches. Each name follows the paper / model card that made it known.
NORM_TYPES = ("rmsnorm", "layernorm", "gemma_rmsnorm", "layernorm1p")  # Zhang & Sennrich 2019; Ba 2016; Gemma (1+w)
# layernorm1p: LayerNorm whose weight is stored as an offset from one, (1 + w) (Megatron "layernorm1p"; Nemotron-4)
NORM_POSITIONS = ("pre", "post", "sandwich", "reordered")  # Xiong 2020; Vaswani 2017; Gemma 2; OLMo 2
# Shazeer 2020 (GLU variants, incl. the sigmoid GLU of Dauphin et al. 2017 and the "bilinear" one with no
# nonlinearity); So et al. 2021 (squared ReLU); Clevert et al. 2016 (ELU); Klambauer et al. 2017 (SELU)
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "relu2", "elu", "selu",
               "reglu", "geglu", "swiglu", "glu", "bilinear", "swiglu_clamped")
# swiglu_clamped: gpt-oss's SwiGLU, (clamp(up, -limit, limit) + 1) * g sigmoid(alpha g) with g = min(gate, limit)
GATED_ACTIVATIONS = ("reglu", "geglu", "swiglu", "glu", "bilinear", "swiglu_clamped")
POSITIONS = ("rope", "nope", "learned", "sinusoidal", "alibi", "t5")
ROPE_STYLES = ("half", "interleaved")  # GPT-NeoX / HF "rotate_half" pairing; GPT-J / Meta interleaved pairing
BIASES = ("none", "all", "qkv", "mlp", "attention")
MOE_BALANCES = ("aux_loss", "aux_free", "both")  # moe_balance: the loss, DeepSeek-V3's bias, or both
ATTN_OUTPUT_GATES = ("none", "headwise", "elementwise")  # attn_output_gate: one gate per head or per value
LINEAR_ATTENTIONS = ("gated_deltanet",)  # the kind of layer_pattern's 'D' layers (Yang et al. 2024; Qwen3-Next)
QK_NORMS = ("none", "rmsnorm", "layernorm", "gemma_rmsnorm", "l2")  # gemma_rmsnorm: Gemma 3's (1 + w) QK-norm;
# l2: Llama 4's "L2Norm", x / sqrt(mean(x^2) + eps) over each head with no weight (an RMSNorm without one)
QK_NORM_LAYERS = ("all", "rope")  # rope: only layers that carry RoPE (Llama 4)
ROUTER_WEIGHTS = ("output", "input")  # where the router weight multiplies: an expert's output or its input
# what one QK-norm normalises: each head with one weight shared by the heads (Qwen3, Gemma 3), the whole
# projection across heads (OLMo 2), or each head with its own weights (Cohere use_qk_norm)
QK_NORM_SCOPES = ("head", "all", "head_untied")
BOOL_FIELDS = ("norm_bias", "norm_affine", "final_norm", "lm_head_bias", "parallel_block", "parallel_shared_norm",
               "nope_global_layers", "tie_embeddings", "scale_embeddings", "norm_weight_fp32", "router_renormalize",
               "attn_temperature_tuning", "global_k_eq_v", "v_norm", "layer_scalar", "kv_shared_wide_ffn",
               "moe_beside_dense", "router_input_norm", "router_expert_scale", "attn_sinks", "router_bias",
               "shared_expert_gate")
PARAMETRIZATIONS = ("sp", "mup", "completep")  # standard; Yang et al. 2022 (muP); Dey et al. 2025 (CompleteP)
ROUTER_SCORES = ("softmax", "sigmoid")  # Mixtral / Qwen-MoE / DeepSeek-V2: softmax; DeepSeek-V3: sigmoid
ROPE_SCALINGS = ("linear", "ntk", "yarn", "llama3")  # Chen 2023; bloc97 2023; Peng 2023; Llama 3.1
# rope_scaling keys per type: (required, optional), besides "type"; the names of Hugging Face's rope_parameters
ROPE_SCALING_KEYS = {
    "linear": (("factor",), ()),
    "ntk": (("factor",), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
}


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, allowed))}")


# the largest size a model field may have: 2**31 - 1 (int32 indexing, and far past any model; a larger
# value would make analysis figures overflow or torch fail)
MAX_SIZE = 2 ** 31 - 1


def _positive_int(name: str, value: Any, minimum: int = 1, maximum: int = MAX_SIZE) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r:.60} must be an integer >= {minimum}")
    if value > maximum:
        raise ConfigError(f"{name}={value!r:.60} is too large; it must be an integer <= {maximum:,}")


def _number_in(name: str, value: Any, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
    """``value`` a finite real number (not a bool) in the interval lo..hi (open ends as given)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ConfigError(f"{name}={value!r:.60} must be in {interval} (a finite number, not true/false)")


def _non_negative(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={value!r} must be a finite number >= 0")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a finite number > 0")


def glu_hidden_dim(d_model: int, multiple_of: int = 256, ffn_dim_multiplier: Optional[float] = None) -> int:
    """LLaMA's rule for the hidden width of a gated FFN: 2/3 of 4*d_model, times an optional
    multiplier, rounded up to a multiple of ``multiple_of`` (Touvron et al. 2023, Meta's ``model.py``).

    d_model 4096 with multiple_of 256 gives 11008 (LLaMA 7B); d_model 4096, multiplier 1.3 and
    multiple_of 1024 give 14336 (Llama 3 8B).
    """
    hidden = int(2 * (4 * d_model) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass
class ModelConfig:
    """Architecture of a decoder-only Transformer LM. Units: widths in channels, lengths in tokens."""

    # --- sizes -------------------------------------------------------------------------------
    vocab_size: int = 4096  # tokens; set from the data's tokenizer when training (lmlab train)
    context_length: int = 256  # tokens per training window; the KV cache's and positions' limit
    d_model: int = 256  # residual-stream width
    n_layers: int = 4  # Transformer blocks
    n_heads: int = 8  # query heads
    n_kv_heads: Optional[int] = None  # None = n_heads (MHA); 1 = MQA (Shazeer 2019); between = GQA
    head_dim: Optional[int] = None  # None = d_model // n_heads; may differ (Gemma: 256 at d_model 3072)
    d_ff: Optional[int] = None  # None = from ffn_ratio, else the gated 8/3 rule (glu_hidden_dim) or 4x
    ffn_ratio: Optional[float] = None  # d_ff = round(ffn_ratio * d_model) when d_ff is not given
    ffn_multiple_of: int = 64  # rounding of the 8/3 rule (LLaMA: 256)
    ffn_dim_multiplier: Optional[float] = None  # Llama 3 8B: 1.3 with multiple_of 1024
    # token-embedding width when it differs from d_model: embeddings are projected in to d_model and the
    # final hidden state out to embed_dim before the LM head, both without bias (OPT-350M: 512 of 1024)
    embed_dim: Optional[int] = None

    # --- normalisation -----------------------------------------------------------------------
    # RMSNorm (Zhang & Sennrich 2019), LayerNorm (Ba et al. 2016), Gemma's (1 + w) RMSNorm, LayerNorm (1 + w)
    norm_type: str = "rmsnorm"
    norm_position: str = (
        "pre"  # pre (Xiong et al. 2020), post (Vaswani et al. 2017), sandwich (Gemma 2), reordered (OLMo 2)
    )
    norm_bias: bool = False  # LayerNorm only: learnable shift
    norm_affine: bool = True  # False: block/final norms without weight or bias (OLMo 1; Groeneveld et al. 2024, 2.1)
    norm_eps: float = 1e-5  # added to the variance in every norm
    # RMSNorm (block, final and QK norms) on inputs below fp32: False casts the fp32-normalised value to the
    # input dtype, then multiplies by the weight (Llama, Qwen, Mistral: HF LlamaRMSNorm, Meta's reference);
    # True multiplies by the weight in fp32, then casts (OLMo 2: HF Olmo2RMSNorm). Equal in fp32.
    norm_weight_fp32: bool = False
    final_norm: bool = True  # a norm after the last block (every modern LM; OPT-350M's post-norm has none)
    # --- linear layers -----------------------------------------------------------------------
    # which linear layers carry a bias: none | all | qkv (Qwen2) | mlp | attention (q, k, v and o: Llama's
    # attention_bias=True without mlp_bias)
    bias: str = "none"
    lm_head_bias: bool = False  # a bias on the LM head's logits
    activation: str = "swiglu"  # the FFN's nonlinearity; the gated ones (Shazeer 2020) use two input projections
    parallel_block: bool = False  # GPT-J / PaLM: x + attn(norm(x)) + mlp(norm(x))
    parallel_shared_norm: bool = True  # one norm feeding both branches (GPT-J) or two (NeoX)

    # --- mixture of experts (lmlab/model/moe.py) ------------------------------------------------
    n_experts: int = 0  # routed experts per MoE layer; 0: every FFN dense (Shazeer et al. 2017; Fedus et al. 2021)
    experts_per_token: int = 2  # top-k (Mixtral 2, Switch 1, DeepSeek-V2 6)
    n_shared_experts: int = 0  # experts every token goes through (DeepSeek-V2: 2)
    # the shared experts' output x sigmoid(w . x), w a learned d_model vector (Qwen2-MoE, Qwen3-Next: HF
    # shared_expert_gate)
    shared_expert_gate: bool = False
    expert_d_ff: Optional[int] = None  # hidden width of each expert (default d_ff)
    router_score: str = "softmax"  # softmax over all experts, or sigmoid per expert
    router_renormalize: bool = True  # top-k weights divided by their sum (Mixtral yes, DeepSeek-V2 no)
    moe_aux_loss: float = 0.0  # weight of the load-balancing loss (Switch Transformer; Mixtral 0.02)
    moe_router_z_loss: float = 0.0  # weight of the router z-loss (ST-MoE, Zoph et al. 2022: 0.001)
    # load balancing: the auxiliary loss above (aux_loss), or DeepSeek-V3's auxiliary-loss-free bias (aux_free: a
    # per-expert bias added to the scores for the top-k choice only, moved by moe_bias_update_rate x sign(mean load -
    # load) after every optimizer step; Wang et al. 2024, arXiv 2408.15664), or both
    moe_balance: str = "aux_loss"
    moe_bias_update_rate: float = 0.001  # DeepSeek-V3's gamma (0.001 for most of its training)
    moe_seq_aux_loss: float = 0.0  # weight of DeepSeek-V3's sequence-wise balance loss (its alpha: 0.0001)
    # multi-token prediction (DeepSeek-V3, lmlab/model/mtp.py): mtp_depth sequential modules, each predicting one
    # token further, sharing the embedding and the LM head; training adds mtp_weight / mtp_depth x their losses
    mtp_depth: int = 0
    mtp_weight: float = 0.3  # DeepSeek-V3's lambda (0.3 for its first 10T tokens, then 0.1)
    moe_first_dense: int = 0  # the first layers keep a dense FFN (DeepSeek first_k_dense_replace)
    moe_pattern: str = "M"  # after them, 'M' (MoE) / 'D' (dense) per layer, repeated ('DM': every 2nd)
    # 'output': sum_e w_e FFN_e(x) (Mixtral, DeepSeek); 'input': sum_e FFN_e(w_e x) (Llama 4, HF Llama4TextMoe)
    router_weights: str = "output"
    # DeepSeek-V2's group-limited routing (HF topk_method='group_limited_greedy'): the experts fall into
    # router_groups equal groups, each scored by its best expert; only the router_topk_groups best groups'
    # experts compete for the top-k (1 group: plain top-k). Then every weight x routed_scaling_factor.
    router_groups: int = 1
    router_topk_groups: int = 1
    router_bias: bool = False  # a bias on the router's logits (gpt-oss)
    router_group_score: str = "max"  # a group's score: its best expert's (DeepSeek-V2) or its best two summed (V3)
    routed_scaling_factor: float = 1.0
    # Gemma 4 26B-A4B (HF enable_moe_block): on MoE layers the MoE sits beside a dense FFN of d_ff, not in
    # its place; the two outputs are normalised apart and summed (needs norm_position='sandwich'). The router
    # reads the raw residual through a weightless RMSNorm times a learned vector / sqrt(d_model)
    # (router_input_norm), and each routed weight is multiplied by a learned per-expert scale (router_expert_scale).
    moe_beside_dense: bool = False
    swiglu_alpha: float = 1.702  # activation='swiglu_clamped' (gpt-oss): the sigmoid's slope
    swiglu_limit: float = 7.0  # and the clamp on the gate (above) and the up projection (both sides)
    router_input_norm: bool = False
    router_expert_scale: bool = False

    # --- positions ---------------------------------------------------------------------------
    position: str = (
        "rope"  # RoPE (Su et al. 2021), none (NoPE), learned, sinusoidal (Vaswani et al. 2017), ALiBi, T5 buckets
    )
    rope_theta: float = 10000.0  # RoPE's base: frequencies theta^(-2i/d)
    rope_style: str = "half"  # which channels pair up: half (GPT-NeoX, HF rotate_half) or interleaved (GPT-J, Meta)
    rope_fraction: float = 1.0  # partial RoPE: fraction of head_dim rotated (GPT-NeoX 0.25, Phi-2 0.4)
    rope_local_theta: Optional[float] = None  # another theta on sliding-window layers (Gemma 3: 10k)
    rope_scaling: Optional[dict] = None  # {"type": linear|ntk|yarn|llama3, "factor": ..., ...}
    nope_global_layers: bool = False  # no positions on global layers (Llama 4 iRoPE, Command A)
    # per-layer 'R' (RoPE) / 'N' (NoPE), repeated over the depth (SmolLM3: 'RRRN', every 4th layer NoPE)
    nope_layers: Optional[str] = None
    learned_pos_offset: int = 0  # learned positions: position p reads table row p + offset (OPT: 2)
    t5_num_buckets: int = 32
    t5_max_distance: int = 128

    # --- attention ---------------------------------------------------------------------------
    # 'mha': n_heads query heads over n_kv_heads K/V heads (MHA, GQA, MQA); 'mla': multi-head latent
    # attention (DeepSeek-V2; lmlab/model/mla.py) with the sizes below (DeepSeek-V2's defaults)
    attention: str = "mha"
    kv_lora_rank: int = 512  # MLA: the joint K/V latent per token
    q_lora_rank: Optional[int] = None  # MLA: the query bottleneck (None: queries straight from x)
    qk_rope_head_dim: int = 64  # MLA: the decoupled RoPE key/query part per head (one key shared by all heads)
    qk_nope_head_dim: int = 128  # MLA: the per-head key/query part without positions
    v_head_dim: int = 128  # MLA: values per head
    qk_norm: str = "none"  # normalise q and k before RoPE (Dehghani 2023; OLMo 2; Qwen3; Gemma 3)
    # head: each head, one weight shared by the heads (Qwen3, Gemma 3) | all: the whole projection, n_heads*head_dim
    # wide (OLMo 2, OLMo Team 2024) | head_untied: each head with its own weights (Cohere use_qk_norm, HF
    # modeling_cohere)
    qk_norm_scope: str = "head"
    qk_norm_layers: str = "all"  # 'rope': QK-norm only on the layers with RoPE (Llama 4's use_qk_norm)
    # Llama 4's attention temperature on layers without RoPE: q x (1 + scale * log(1 + floor((p + 1) / floor)))
    # at position p (HF Llama4TextAttention: attn_temperature_tuning, floor_scale, attn_scale)
    attn_temperature_tuning: bool = False
    attn_temperature_floor: int = 8192
    attn_temperature_scale: float = 0.1
    clip_qkv: Optional[float] = None  # clamp q, k, v projections to [-c, c] (OLMo 1.7: allenai/OLMo-7B-0424-hf, 8.0)
    attn_logit_softcap: Optional[float] = None  # cap * tanh(s / cap) on attention logits (Gemma 2)
    # a sigmoid gate on each head's output from the layer input, before the output projection (Qiu et al. 2025,
    # "Gated Attention for LLMs", arXiv 2505.06708; Qwen3-Next: elementwise): none | headwise | elementwise
    attn_output_gate: str = "none"
    attn_sinks: bool = False  # a learned logit per head in every softmax, taking mass without a value (gpt-oss)
    query_pre_attn_scalar: Optional[float] = None  # scale = query_pre_attn_scalar**-0.5 (Gemma 2)
    sliding_window: Optional[int] = None  # tokens visible, counting the current one (Mistral / HF)
    # Gemma 4's global (full-attention) layers differ from its local ones: their own head width and number of
    # KV heads (HF global_head_dim 512, num_global_key_value_heads), values that are the keys' projection
    # (attention_k_eq_v: no v projection; the values are the raw k projection, then v_norm), and
    # "proportional" RoPE: frequencies theta^(-2i/head_dim) over the whole head, only the first fraction of
    # the pairs rotated (HF rope_type 'proportional', partial_rotary_factor). Each needs local layers.
    global_head_dim: Optional[int] = None  # None: head_dim
    global_n_kv_heads: Optional[int] = None  # None: n_kv_heads
    global_k_eq_v: bool = False
    global_rope_proportion: Optional[float] = None  # None: ordinary RoPE on the global layers
    v_norm: bool = False  # RMSNorm without weight on each value head (Gemma 4, every layer)
    # KV sharing (Gemma 4 E2B/E4B, HF num_kv_shared_layers): the last kv_shared_layers layers compute no keys or
    # values; each attends to those of the last earlier layer of its own kind (local or global), and caches
    # nothing. kv_shared_wide_ffn: their FFN is 2 d_ff wide (HF use_double_wide_mlp).
    kv_shared_layers: int = 0
    kv_shared_wide_ffn: bool = False
    # per-layer input embeddings (PLE; Gemma 4 E2B/E4B, Gemma 3n; HF hidden_size_per_layer_input): a second
    # embedding table of n_layers x ple_dim per token (ple_vocab_size rows, default vocab_size), mixed with a
    # projection of the token embedding; after its FFN, layer i adds norm(W_out(act(W_gate x) * e_i)).
    ple_dim: int = 0
    ple_vocab_size: Optional[int] = None
    # what a local layer sees: 'window' (the last sliding_window tokens) or 'chunk' (the earlier tokens of
    # its own block of sliding_window tokens: Llama 4's chunked attention, attention_chunk_size)
    local_attention: str = "window"
    layer_pattern: Optional[str] = None  # per-layer 'L' (local, windowed) / 'G' (global), repeated over
    # the depth and free to end mid-pattern (Gemma 3 1B: 'LLLLLG' over 26 layers ends 'LL'); a string of
    # n_layers letters spells every layer out. 'D': a linear-attention layer of kind linear_attention instead
    # of attention (Qwen3-Next: 'DDDG', three Gated DeltaNet layers to one full-attention layer)
    # --- linear attention ('D' layers; lmlab/model/deltanet.py; HF Qwen3NextConfig linear_*) ----------
    linear_attention: str = "gated_deltanet"
    linear_n_k_heads: Optional[int] = None  # query/key heads; None = n_heads (HF linear_num_key_heads)
    linear_n_v_heads: Optional[int] = None  # value heads, a multiple of the key heads; None = linear_n_k_heads
    linear_k_head_dim: Optional[int] = None  # None = head_dim (HF linear_key_head_dim)
    linear_v_head_dim: Optional[int] = None  # None = linear_k_head_dim (HF linear_value_head_dim)
    linear_conv_kernel: int = 4  # the causal depthwise convolution over q, k, v (HF linear_conv_kernel_dim)
    linear_chunk: int = 64  # tokens per chunk of the chunked (training) form; the result does not depend on it

    # --- output ------------------------------------------------------------------------------
    tie_embeddings: bool = True  # the LM head shares the token embedding's matrix (Press & Wolf 2017)
    scale_embeddings: bool = False  # multiply embeddings by sqrt(d_model) (Gemma)
    final_logit_softcap: Optional[float] = None  # Gemma 2
    # a stored scalar per layer multiplying the block's output, residual stream included (Gemma 4's
    # layer_scalar: a persistent buffer, 1 at initialisation, not trained, read from checkpoints)
    layer_scalar: bool = False
    logit_scale: float = (
        1.0  # logits = lm_head(h) * logit_scale, before any soft-cap (Cohere Command R 0.0625, R7B 0.25)
    )
    z_loss: float = 0.0  # coefficient on (log Z)^2 added to the loss (PaLM; Baichuan 2; OLMo)

    # --- regularisation ----------------------------------------------------------------------
    embd_dropout: float = 0.0  # dropout on the embeddings (GPT-2: 0.1; off in modern pretraining)
    attn_dropout: float = 0.0  # dropout on the attention probabilities
    resid_dropout: float = 0.0  # dropout on each residual branch's output
    # --- initialisation ----------------------------------------------------------------------
    init_std: float = 0.02  # N(0, 0.02) (GPT-2); residual projections / sqrt(2 n_layers)
    # std of the token embedding's N(0, std) init when it differs from init_std (None: init_std). Vaswani et
    # al. 2017 (section 3.4) multiply the embeddings by sqrt(d_model) (scale_embeddings), and tensor2tensor,
    # their reference code, draws them N(0, d_model^-0.5): the scaled embedding then has RMS 1, against 0.71
    # for the sinusoidal positions added to it. With tie_embeddings the LM head is the same matrix, so it
    # starts at this std too; an untied LM head keeps init_std. Other embedding tables (ple_dim, T5 buckets,
    # learned positions) keep init_std.
    embed_init_std: Optional[float] = None
    # how init, learning rates, the attention scale and the output scale follow the model's size
    # (lmlab/model/parametrization.py): 'sp' (standard: as above), 'mup' (Yang et al. 2022: the optimal
    # learning rate and init carry over across widths) or 'completep' (mup + Dey et al. 2025's depth rules,
    # alpha = 1: across depths too)
    parametrization: str = "sp"
    base_d_model: Optional[int] = None  # mup / completep: the width at which they equal sp (None: d_model)
    base_n_layers: Optional[int] = None  # completep: the depth at which it equals mup (None: n_layers)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "ffn_multiple_of"):
            _positive_int(name, getattr(self, name))
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        _positive_int("n_kv_heads", self.n_kv_heads)
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}; "
                f"n_kv_heads must divide n_heads (valid: "
                f"{', '.join(str(d) for d in range(1, self.n_heads + 1) if self.n_heads % d == 0)})"
            )
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ConfigError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    f"set head_dim explicitly or pick n_heads dividing d_model"
                )
            self.head_dim = self.d_model // self.n_heads
        _positive_int("head_dim", self.head_dim)

        _choice("activation", self.activation, ACTIVATIONS)
        for name in ("ffn_ratio", "ffn_dim_multiplier"):  # checked even where an explicit d_ff makes them unused
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.d_ff is None:
            if self.ffn_ratio is not None:
                _positive("ffn_ratio", self.ffn_ratio)
                self.d_ff = max(1, int(round(self.ffn_ratio * self.d_model)))
            elif self.activation in GATED_ACTIVATIONS:
                if self.ffn_dim_multiplier is not None:
                    _positive("ffn_dim_multiplier", self.ffn_dim_multiplier)
                self.d_ff = glu_hidden_dim(self.d_model, self.ffn_multiple_of, self.ffn_dim_multiplier)
            else:
                self.d_ff = 4 * self.d_model
        _positive_int("d_ff", self.d_ff)

        _choice("norm_type", self.norm_type, NORM_TYPES)
        _choice("norm_position", self.norm_position, NORM_POSITIONS)
        _positive("norm_eps", self.norm_eps)
        if self.norm_bias and self.norm_type not in ("layernorm", "layernorm1p"):
            raise ConfigError(
                f"norm_bias=True needs norm_type='layernorm' (or 'layernorm1p'), got norm_type={self.norm_type!r}"
            )
        if self.norm_type == "layernorm1p" and self.norm_affine is False:
            raise ConfigError(
                "norm_type='layernorm1p' stores its weight as an offset from one and needs norm_affine=True"
            )
        if self.norm_affine is False and (self.norm_bias or self.norm_type == "gemma_rmsnorm"):
            raise ConfigError(
                f"norm_affine=False (no learnable norm parameters) needs norm_bias=False and norm_type "
                f"'layernorm' or 'rmsnorm', got norm_bias={self.norm_bias!r}, norm_type={self.norm_type!r}"
            )
        _choice("bias", self.bias, BIASES)
        _choice("position", self.position, POSITIONS)
        _choice("rope_style", self.rope_style, ROPE_STYLES)
        _positive("rope_theta", self.rope_theta)
        if self.rope_local_theta is not None:
            _positive("rope_local_theta", self.rope_local_theta)
        _number_in("rope_fraction", self.rope_fraction, 0, 1, lo_open=True)
        rotated = int(round(self.head_dim * self.rope_fraction))
        if self.position == "rope" and (rotated < 2 or rotated % 2):
            raise ConfigError(
                f"rope_fraction={self.rope_fraction} of head_dim={self.head_dim} rotates {rotated} dims; "
                f"the rotated width must be even and >= 2"
            )
        if self.rope_scaling is not None:
            self._check_rope_scaling(rotated)
        _positive_int("t5_num_buckets", self.t5_num_buckets, 2)
        _positive_int("t5_max_distance", self.t5_max_distance, 1)
        if self.embed_dim is not None:
            _positive_int("embed_dim", self.embed_dim)
            if self.embed_dim == self.d_model:  # no projection: one spelling of "embeddings as wide as the model"
                self.embed_dim = None
        _positive_int("learned_pos_offset", self.learned_pos_offset, 0)
        if self.learned_pos_offset and self.position != "learned":
            raise ConfigError(f"learned_pos_offset={self.learned_pos_offset} needs position='learned', "
                              f"got position={self.position!r}")
        if self.position == "t5" and self.t5_max_distance <= self.t5_num_buckets // 2:
            raise ConfigError(
                f"t5_max_distance={self.t5_max_distance} must exceed t5_num_buckets // 2 = {self.t5_num_buckets // 2} "
                f"(the exact-offset buckets); T5 uses 128 with 32 buckets"
            )

        _choice("qk_norm", self.qk_norm, QK_NORMS)
        _choice("attn_output_gate", self.attn_output_gate, ATTN_OUTPUT_GATES)
        if self.attention == "mla" and (self.attn_output_gate != "none" or self.attn_sinks):
            raise ConfigError(f"attn_output_gate={self.attn_output_gate!r} / attn_sinks={self.attn_sinks!r}: "
                              f"lmlab's multi-head latent attention (attention='mla') has neither; use "
                              f"attention='mha' (GQA/MQA by n_kv_heads) or leave them off")
        _choice("qk_norm_scope", self.qk_norm_scope, QK_NORM_SCOPES)
        if self.qk_norm_scope != "head" and self.qk_norm == "none":
            raise ConfigError(f"qk_norm_scope={self.qk_norm_scope!r} needs a qk_norm, got qk_norm='none'")
        if self.qk_norm == "l2" and self.qk_norm_scope != "head":
            raise ConfigError(f"qk_norm='l2' normalises each head (it has no weight); qk_norm_scope must be 'head', "
                              f"got {self.qk_norm_scope!r}")
        _choice("qk_norm_layers", self.qk_norm_layers, QK_NORM_LAYERS)
        if self.qk_norm_layers != "all" and self.qk_norm != "l2":
            raise ConfigError(f"qk_norm_layers={self.qk_norm_layers!r} is Llama 4's rule for its weightless QK-norm: "
                              f"it needs qk_norm='l2', got {self.qk_norm!r}")
        _positive_int("attn_temperature_floor", self.attn_temperature_floor)
        _non_negative("attn_temperature_scale", self.attn_temperature_scale)
        _choice("router_weights", self.router_weights, ROUTER_WEIGHTS)
        _positive("logit_scale", self.logit_scale)
        for name in ("attn_logit_softcap", "query_pre_attn_scalar", "final_logit_softcap", "clip_qkv"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.sliding_window is not None:
            _positive_int("sliding_window", self.sliding_window)
        _choice("local_attention", self.local_attention, ("window", "chunk"))
        _choice("attention", self.attention, ("mha", "mla"))
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            _positive_int(name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive_int("q_lora_rank", self.q_lora_rank)
        if self.attention == "mla":
            if self.qk_rope_head_dim % 2:
                raise ConfigError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even (RoPE rotates pairs)")
            for name, ok, what in (("position", self.position == "rope", "'rope'"),
                                   ("sliding_window", self.sliding_window is None, "None"),
                                   ("qk_norm", self.qk_norm == "none", "'none'"),
                                   ("attn_logit_softcap", self.attn_logit_softcap is None, "None"),
                                   ("clip_qkv", self.clip_qkv is None, "None"),
                                   ("attn_temperature_tuning", not self.attn_temperature_tuning, "False"),
                                   ("rope_fraction", self.rope_fraction == 1.0, "1.0 (qk_rope_head_dim sets it)"),
                                   ("query_pre_attn_scalar", self.query_pre_attn_scalar is None, "None"),
                                   ("bias", self.bias in ("none", "mlp"), "'none' or 'mlp'")):
                if not ok:
                    raise ConfigError(f"attention='mla' needs {name}={what}, got {name}={getattr(self, name)!r}")
        if self.layer_pattern is not None:
            if (
                not isinstance(self.layer_pattern, str)
                or not self.layer_pattern
                or set(self.layer_pattern) - {"L", "G", "D"}
            ):
                raise ConfigError(
                    f"layer_pattern={self.layer_pattern!r} must be a non-empty string of 'L' (local), 'G' (global) "
                    f"and 'D' (linear attention)"
                )
            if "L" in self.layer_pattern and self.sliding_window is None:
                raise ConfigError(
                    f"layer_pattern={self.layer_pattern!r} has local layers but sliding_window is not set"
                )
        self._check_global_layers()
        self._check_linear_layers()
        if self.nope_layers is not None:
            if not isinstance(self.nope_layers, str) or not self.nope_layers or set(self.nope_layers) - {"R", "N"}:
                raise ConfigError(f"nope_layers={self.nope_layers!r} must be a non-empty string of 'R' (RoPE) and "
                                  f"'N' (NoPE)")
            if self.position != "rope":
                raise ConfigError(f"nope_layers={self.nope_layers!r} needs position='rope' on its 'R' layers, "
                                  f"got position={self.position!r}")
        if self.nope_global_layers and self.position != "rope":
            raise ConfigError(
                f"nope_global_layers=True needs position='rope' on the local layers, got position={self.position!r}"
            )
        if self.nope_global_layers and (self.layer_pattern is None or "L" not in self.layer_pattern):
            raise ConfigError(
                f"nope_global_layers=True needs a layer_pattern with local 'L' layers (e.g. 'LLLG'), "
                f"got layer_pattern={self.layer_pattern!r}"
            )
        # mixture of experts: every field checked, the relations only when n_experts > 0
        _positive_int("n_experts", self.n_experts, minimum=0)
        _positive_int("experts_per_token", self.experts_per_token)
        _positive_int("n_shared_experts", self.n_shared_experts, minimum=0)
        if self.shared_expert_gate and not (self.n_experts and self.n_shared_experts):
            raise ConfigError(f"shared_expert_gate=True gates the shared experts, but n_experts={self.n_experts}, "
                              f"n_shared_experts={self.n_shared_experts}: set both > 0")
        if self.expert_d_ff is not None:
            _positive_int("expert_d_ff", self.expert_d_ff)
        _choice("router_score", self.router_score, ROUTER_SCORES)
        _non_negative("moe_aux_loss", self.moe_aux_loss)
        _non_negative("moe_router_z_loss", self.moe_router_z_loss)
        _positive_int("mtp_depth", self.mtp_depth, minimum=0)
        _non_negative("mtp_weight", self.mtp_weight)
        if self.mtp_depth:
            why = (
                "position='learned'/'sinusoidal'/'alibi'/'t5' (the modules rotate at the tokens' positions: "
                "rope or nope)"
                if self.position not in ("rope", "nope")
                else f"ple_dim={self.ple_dim}"
                if self.ple_dim
                else f"kv_shared_layers={self.kv_shared_layers}"
                if self.kv_shared_layers
                else None
            )
            if why:
                raise ConfigError(f"mtp_depth={self.mtp_depth} does not go with {why}")
        _choice("moe_balance", self.moe_balance, MOE_BALANCES)
        _non_negative("moe_bias_update_rate", self.moe_bias_update_rate)
        _non_negative("moe_seq_aux_loss", self.moe_seq_aux_loss)
        if self.n_experts and self.moe_balance == "aux_free" and self.moe_aux_loss:
            raise ConfigError(
                f"moe_balance='aux_free' trains without the auxiliary balance loss, but moe_aux_loss="
                f"{self.moe_aux_loss}; set moe_aux_loss=0, or moe_balance='both' for the bias and the loss"
            )
        if self.n_experts and self.moe_balance == "both" and not self.moe_aux_loss:
            raise ConfigError("moe_balance='both' adds the auxiliary balance loss to the bias, but moe_aux_loss=0; "
                              "give moe_aux_loss a weight (e.g. 0.01), or use moe_balance='aux_free'")
        _positive_int("moe_first_dense", self.moe_first_dense, minimum=0)
        if not isinstance(self.moe_pattern, str) or not self.moe_pattern or set(self.moe_pattern) - {"M", "D"}:
            raise ConfigError(f"moe_pattern={self.moe_pattern!r} must be a non-empty string of 'M' (MoE) and "
                              f"'D' (dense)")
        _positive_int("router_groups", self.router_groups)
        _positive_int("router_topk_groups", self.router_topk_groups)
        _choice("router_group_score", self.router_group_score, ("max", "top2_sum"))
        _positive("swiglu_alpha", self.swiglu_alpha)
        _positive("swiglu_limit", self.swiglu_limit)
        if self.n_experts and self.router_group_score == "top2_sum" and self.router_groups > 1 \
                and self.n_experts // self.router_groups < 2:
            raise ConfigError(f"router_group_score='top2_sum' needs at least 2 experts per group; n_experts="
                              f"{self.n_experts} in router_groups={self.router_groups}")
        _positive("routed_scaling_factor", self.routed_scaling_factor)
        if self.router_topk_groups > self.router_groups:
            raise ConfigError(
                f"router_topk_groups={self.router_topk_groups} exceeds router_groups={self.router_groups}"
            )
        if self.n_experts:
            if self.n_experts % self.router_groups:
                raise ConfigError(f"n_experts={self.n_experts} is not a multiple of router_groups={self.router_groups}")
            if self.router_groups > 1 and self.experts_per_token > self.router_topk_groups * (
                self.n_experts // self.router_groups
            ):
                raise ConfigError(f"experts_per_token={self.experts_per_token} exceeds the experts of the "
                                  f"router_topk_groups={self.router_topk_groups} groups kept")
            if self.experts_per_token > self.n_experts:
                raise ConfigError(f"experts_per_token={self.experts_per_token} exceeds n_experts={self.n_experts}; "
                                  f"valid: 1 to {self.n_experts}")
            if not any(
                self.layer_is_moe(i) for i in range(min(self.n_layers, self.moe_first_dense + len(self.moe_pattern)))
            ):
                raise ConfigError(f"n_experts={self.n_experts} but no layer is MoE (n_layers={self.n_layers}, "
                                  f"moe_first_dense={self.moe_first_dense}, moe_pattern={self.moe_pattern!r})")
        if self.moe_beside_dense and (not self.n_experts or self.norm_position != "sandwich"):
            raise ConfigError(f"moe_beside_dense=True (Gemma 4's MoE block beside the dense FFN) needs n_experts > 0 "
                              f"and norm_position='sandwich', got n_experts={self.n_experts}, "
                              f"norm_position={self.norm_position!r}")
        for name in ("router_input_norm", "router_expert_scale"):
            if getattr(self, name) is True and not self.n_experts:
                raise ConfigError(f"{name}=True needs n_experts > 0")
        if self.parallel_block and self.norm_position != "pre":
            raise ConfigError(f"parallel_block=True needs norm_position='pre', got {self.norm_position!r}")
        _non_negative("z_loss", self.z_loss)
        for name in ("embd_dropout", "attn_dropout", "resid_dropout"):
            _number_in(name, getattr(self, name), 0, 1, hi_open=True)
        _positive("init_std", self.init_std)
        if self.embed_init_std is not None:
            _positive("embed_init_std", self.embed_init_std)
        self._check_parametrization()
        for name in BOOL_FIELDS:  # a YAML/JSON "no" or 0 would otherwise pass as a truthy or falsy switch
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false")

    def _check_parametrization(self) -> None:
        """Validate ``parametrization``, ``base_d_model`` and ``base_n_layers``: the bases only where they
        apply, and mup / completep only on the parts whose rules lmlab implements (dense multi-head
        attention, embeddings as wide as the model; lmlab/model/parametrization.py)."""
        _choice("parametrization", self.parametrization, PARAMETRIZATIONS)
        for name, needs in (("base_d_model", ("mup", "completep")), ("base_n_layers", ("completep",))):
            value = getattr(self, name)
            if value is None:
                continue
            _positive_int(name, value)
            if self.parametrization not in needs:
                raise ConfigError(f"{name}={value!r} applies to parametrization={' or '.join(map(repr, needs))}, "
                                  f"got parametrization={self.parametrization!r}; drop {name} or set parametrization")
        if self.parametrization == "sp":
            return
        unsupported = (("attention", self.attention != "mha", "'mha'"),
                       ("n_experts", self.n_experts != 0, "0"),
                       ("embed_dim", self.embed_dim is not None, "None (embeddings as wide as the model)"),
                       ("ple_dim", self.ple_dim != 0, "0"),
                       ("scale_embeddings", self.scale_embeddings is True, "False"),
                       ("query_pre_attn_scalar", self.query_pre_attn_scalar is not None, "None"),
                       ("norm_position", self.parametrization == "completep" and self.norm_position == "post",
                        "'pre', 'sandwich' or 'reordered' (completep scales residual branches)"))
        for name, bad, want in unsupported:
            if bad:
                raise ConfigError(f"parametrization={self.parametrization!r} needs {name}={want}, got "
                                  f"{name}={getattr(self, name)!r} (lmlab has no {self.parametrization} rules for it)")

    def _check_linear_layers(self) -> None:
        """The linear_* fields (always checked, defaults filled) and what 'D' layers do not go with."""
        _choice("linear_attention", self.linear_attention, LINEAR_ATTENTIONS)
        for name, default in (("linear_n_k_heads", "n_heads"), ("linear_n_v_heads", "linear_n_k_heads"),
                              ("linear_k_head_dim", "head_dim"), ("linear_v_head_dim", "linear_k_head_dim")):
            if getattr(self, name) is None:  # in this order: a default may be the field filled just before
                setattr(self, name, getattr(self, default))
            _positive_int(name, getattr(self, name))
        if self.linear_n_v_heads % self.linear_n_k_heads:
            raise ConfigError(f"linear_n_v_heads={self.linear_n_v_heads} must be a multiple of "
                              f"linear_n_k_heads={self.linear_n_k_heads} (value heads share key heads in groups)")
        _positive_int("linear_conv_kernel", self.linear_conv_kernel)
        _positive_int("linear_chunk", self.linear_chunk)
        if not (self.layer_pattern and "D" in self.layer_pattern):
            return
        for name, bad, why in (
                ("attention", self.attention == "mla", "'D' layers beside multi-head latent attention"),
                ("kv_shared_layers", self.kv_shared_layers != 0, "KV sharing (a 'D' layer has no keys to share)")):
            if bad:
                raise ConfigError(f"layer_pattern={self.layer_pattern!r} has linear-attention 'D' layers, which lmlab "
                                  f"does not combine with {name}={getattr(self, name)!r} ({why})")

    def _check_global_layers(self) -> None:
        """Validate Gemma 4's switches for the global layers (global_head_dim, global_n_kv_heads,
        global_k_eq_v, global_rope_proportion): each needs local layers to differ from (sliding_window) and
        multi-head attention; raises ConfigError naming the field."""
        if self.global_head_dim is not None:
            _positive_int("global_head_dim", self.global_head_dim)
        if self.global_n_kv_heads is not None:
            _positive_int("global_n_kv_heads", self.global_n_kv_heads)
            if self.n_heads % self.global_n_kv_heads:
                raise ConfigError(f"global_n_kv_heads={self.global_n_kv_heads} must divide n_heads={self.n_heads}")
        if self.global_rope_proportion is not None:
            _number_in("global_rope_proportion", self.global_rope_proportion, 0, 1, lo_open=True)
            if self.position != "rope" or self.rope_fraction != 1.0:
                raise ConfigError(f"global_rope_proportion={self.global_rope_proportion} needs position='rope' with "
                                  f"rope_fraction=1.0, got position={self.position!r}, "
                                  f"rope_fraction={self.rope_fraction}")
            if int(self.global_rope_proportion * self.layer_head_dim_of(True) // 2) < 1:
                raise ConfigError(f"global_rope_proportion={self.global_rope_proportion} rotates no pair of the "
                                  f"global layers' {self.layer_head_dim_of(True)} channels")
        used = [name for name, on in (("global_head_dim", self.global_head_dim is not None),
                                      ("global_n_kv_heads", self.global_n_kv_heads is not None),
                                      ("global_k_eq_v", self.global_k_eq_v),
                                      ("global_rope_proportion", self.global_rope_proportion is not None)) if on]
        if used and self.sliding_window is None:
            raise ConfigError(f"{used[0]}={getattr(self, used[0])!r} sets the global layers apart from the local "
                              f"ones, but sliding_window is not set (no local layers); set sliding_window and a "
                              f"layer_pattern such as 'LLLLLG'")
        if used and self.sliding_window is not None:
            period = len(self.layer_pattern) if self.layer_pattern else 1
            if not any(self.layer_window(i) is None for i in range(min(self.n_layers, period))):
                raise ConfigError(f"{used[0]}={getattr(self, used[0])!r} sets the global layers apart, but every "
                                  f"layer is local (layer_pattern={self.layer_pattern!r}); give a layer_pattern with "
                                  f"'G' layers, e.g. 'LLLLLG'")
        if self.global_rope_proportion is not None and self.nope_global_layers is True:
            raise ConfigError(f"global_rope_proportion={self.global_rope_proportion} rotates the global layers, "
                              f"but nope_global_layers=True gives them no positions; set one of them")
        g_head = self.layer_head_dim_of(True)
        if self.position == "rope" and self.nope_global_layers is not True and g_head % 2:
            raise ConfigError(f"global_head_dim={g_head} is odd; RoPE on the global layers rotates pairs of "
                              f"channels: give an even global_head_dim (or nope_global_layers=True)")
        if used and self.local_attention != "window":
            raise ConfigError(f"{used[0]} is Gemma 4's, whose local layers are sliding windows; got "
                              f"local_attention={self.local_attention!r}")
        if (used or self.v_norm) and self.attention != "mha":
            raise ConfigError(f"{(used or ['v_norm'])[0]} needs attention='mha', got attention={self.attention!r}")
        _positive_int("kv_shared_layers", self.kv_shared_layers, minimum=0, maximum=self.n_layers - 1)
        if self.kv_shared_layers:
            if self.attention != "mha":
                raise ConfigError(f"kv_shared_layers={self.kv_shared_layers} needs attention='mha', "
                                  f"got attention={self.attention!r}")
            for layer in range(self.n_layers - self.kv_shared_layers, self.n_layers):
                if self.layer_kv_source(layer) is None:
                    kind = "local" if self.layer_is_local(layer) else "global"
                    raise ConfigError(f"kv_shared_layers={self.kv_shared_layers}: layer {layer} is {kind} but no "
                                      f"earlier layer of that kind computes keys and values to share (layers 0-"
                                      f"{self.n_layers - self.kv_shared_layers - 1})")
        if self.kv_shared_wide_ffn and (not self.kv_shared_layers or (self.n_experts and not self.moe_beside_dense)):
            raise ConfigError(f"kv_shared_wide_ffn=True widens the dense FFN of the KV-shared layers: it needs "
                              f"kv_shared_layers > 0 and a dense FFN (n_experts=0 or moe_beside_dense), got "
                              f"kv_shared_layers={self.kv_shared_layers}, n_experts={self.n_experts}")
        _positive_int("ple_dim", self.ple_dim, minimum=0)
        if self.ple_vocab_size is not None:
            _positive_int("ple_vocab_size", self.ple_vocab_size)
            if not self.ple_dim:
                raise ConfigError(f"ple_vocab_size={self.ple_vocab_size} needs ple_dim > 0")
            if self.ple_vocab_size < self.vocab_size:
                raise ConfigError(f"ple_vocab_size={self.ple_vocab_size} must be >= vocab_size={self.vocab_size} "
                                  f"(every token id looks up a row)")

    def _check_rope_scaling(self, rot_dim: int) -> None:
        """Validate ``rope_scaling``: a mapping with ``type`` and exactly that type's keys
        (ROPE_SCALING_KEYS), each in range. Raises ConfigError naming ``rope_scaling.<key>``."""
        rs = self.rope_scaling
        if not isinstance(rs, dict) or "type" not in rs:
            raise ConfigError(f"rope_scaling={rs!r} must be a mapping with a 'type' key "
                              f"(one of {', '.join(map(repr, ROPE_SCALINGS))}) and its parameters")
        if self.position != "rope":
            raise ConfigError(f"rope_scaling={rs!r} needs position='rope', got position={self.position!r}")
        kind = rs["type"]
        _choice("rope_scaling.type", kind, ROPE_SCALINGS)
        required, optional = ROPE_SCALING_KEYS[kind]
        for key in required:
            if key not in rs:
                raise ConfigError(f"rope_scaling.{key} is required for rope_scaling.type={kind!r} "
                                  f"(required keys: {', '.join(required)})")
        for key in rs:
            if key != "type" and key not in required + optional:
                raise ConfigError(f"rope_scaling.{key}={rs[key]!r} is not a key of rope_scaling.type={kind!r}; "
                                  f"valid keys: {', '.join(('type',) + required + optional)}")
        factor = rs["factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
            raise ConfigError(f"rope_scaling.factor={factor!r} must be a finite number >= 1 "
                              f"(the context extension ratio)")
        if "original_max_position_embeddings" in rs:
            _positive_int("rope_scaling.original_max_position_embeddings", rs["original_max_position_embeddings"])
        for key in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if rs.get(key) is not None:
                _positive(f"rope_scaling.{key}", rs[key])
        if rs.get("attention_factor") is not None:
            _positive("rope_scaling.attention_factor", rs["attention_factor"])
        if "truncate" in rs and not isinstance(rs["truncate"], bool):
            raise ConfigError(f"rope_scaling.truncate={rs['truncate']!r} must be true or false")
        if kind == "llama3" and rs["high_freq_factor"] < rs["low_freq_factor"]:
            raise ConfigError(f"rope_scaling.high_freq_factor={rs['high_freq_factor']!r} must be at least "
                              f"rope_scaling.low_freq_factor={rs['low_freq_factor']!r}")
        if kind == "yarn" and (rs.get("beta_fast") or 32) <= (rs.get("beta_slow") or 1):
            raise ConfigError(f"rope_scaling.beta_fast={rs.get('beta_fast')!r} must be greater than "
                              f"rope_scaling.beta_slow={rs.get('beta_slow')!r} (defaults 32 and 1)")
        if kind == "ntk" and rot_dim <= 2:
            raise ConfigError(f"rope_scaling.type='ntk' needs a rotated width > 2 (theta * factor^(d/(d-2))), "
                              f"got {rot_dim} from head_dim={self.head_dim}, rope_fraction={self.rope_fraction}")

    # --- per-layer views ---------------------------------------------------------------------
    def layer_is_linear(self, layer: int) -> bool:
        """True when layer ``layer`` (0-based) is a linear-attention layer ('D' in ``layer_pattern``)."""
        return self.layer_pattern is not None and self.layer_pattern[layer % len(self.layer_pattern)] == "D"

    def layer_is_local(self, layer: int) -> bool:
        """True when layer ``layer`` (0-based) uses sliding-window attention."""
        if self.sliding_window is None:
            return False
        if self.layer_pattern is None:
            return True
        return self.layer_pattern[layer % len(self.layer_pattern)] == "L"

    def layer_has_rope(self, layer: int) -> bool:
        """True when layer ``layer`` (0-based) rotates q and k: RoPE models, except the global layers
        with ``nope_global_layers`` and the 'N' layers of ``nope_layers``."""
        if self.position != "rope":
            return False
        if self.nope_global_layers and self.layer_window(layer) is None:
            return False
        return self.nope_layers is None or self.nope_layers[layer % len(self.nope_layers)] == "R"

    def layer_is_moe(self, layer: int) -> bool:
        """True when layer ``layer`` (0-based) has a mixture-of-experts FFN: ``n_experts`` > 0, past the
        first ``moe_first_dense`` layers, where ``moe_pattern`` (repeated from there) says 'M'."""
        if not self.n_experts or layer < self.moe_first_dense:
            return False
        return self.moe_pattern[(layer - self.moe_first_dense) % len(self.moe_pattern)] == "M"

    def layer_head_dim_of(self, global_layer: bool) -> int:
        """head_dim of a global (full-attention) layer (``global_head_dim`` when set) or of a local one."""
        return self.global_head_dim if (global_layer and self.global_head_dim is not None) else self.head_dim

    def layer_n_kv_heads_of(self, global_layer: bool) -> int:
        """K/V heads of a global layer (``global_n_kv_heads`` when set) or of a local one."""
        return self.global_n_kv_heads if (global_layer and self.global_n_kv_heads is not None) else self.n_kv_heads

    def layer_head_dim(self, layer: int) -> int:
        """head_dim of layer ``layer`` (0-based): Gemma 4's global layers may be wider."""
        return self.layer_head_dim_of(self.layer_window(layer) is None)

    def layer_n_kv_heads(self, layer: int) -> int:
        """K/V heads of layer ``layer`` (0-based)."""
        return self.layer_n_kv_heads_of(self.layer_window(layer) is None)

    def layer_k_eq_v(self, layer: int) -> bool:
        """Whether layer ``layer`` takes its values from the key projection (Gemma 4's global layers)."""
        return self.global_k_eq_v and self.layer_window(layer) is None

    def layer_kv_source(self, layer: int) -> Optional[int]:
        """For a KV-shared layer (one of the last ``kv_shared_layers``), the layer whose keys and values it
        uses: the last earlier non-shared layer of the same kind (local / global), as HF's
        ``Gemma4TextConfig.kv_sharing_modes``; None for a layer that computes its own (or when none exists)."""
        first = self.n_layers - self.kv_shared_layers
        if layer < first:
            return None
        local = self.layer_is_local(layer)
        period = len(self.layer_pattern) if self.layer_pattern else 1
        for j in range(first - 1, max(-1, first - 1 - period), -1):  # one period back finds every kind
            if self.layer_is_local(j) == local:
                return j
        return None

    def layer_d_ff(self, layer: int) -> int:
        """d_ff of layer ``layer``'s dense FFN: doubled on KV-shared layers with ``kv_shared_wide_ffn``."""
        shared = self.kv_shared_wide_ffn and layer >= self.n_layers - self.kv_shared_layers
        return 2 * self.d_ff if shared else self.d_ff

    def layer_window(self, layer: int) -> Optional[int]:
        """The sliding window of layer ``layer`` in tokens (counting the current one), or None for full."""
        return self.sliding_window if self.layer_is_local(layer) else None

    # --- (de)serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, source: Optional[str] = None) -> "ModelConfig":
        """Build from a mapping; unknown keys raise ConfigError suggesting the nearest valid key, and an
        invalid value ConfigError naming the field; both start with ``source`` (e.g. the file) when given."""
        return build_checked(cls, data, source)


def build_checked(cls, data: dict, source: Optional[str] = None):
    """``cls(**data)`` for a config dataclass, with :func:`check_keys` first; a ConfigError from the
    dataclass's own validation is prefixed with ``source`` (when given), so it names where the value came from."""
    check_keys(cls, data, source or "config")
    try:
        return cls(**data)
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{source}: {exc}") from None


def check_keys(cls, data: dict, source: str) -> None:
    """Raise ConfigError for keys of ``data`` that are not fields of dataclass ``cls``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of field names to values, got {type(data).__name__}")
    names = [f.name for f in fields(cls)]
    for key in data:
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"{source}: unknown {cls.__name__} key {key!r}{hint}")
