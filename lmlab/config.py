"""Model configuration: one dataclass, every architecture choice a named, validated field.

The defaults are today's shared recipe (LLaMA; Touvron et al. 2023): pre-norm RMSNorm, no biases,
SwiGLU FFN with d_ff = 8/3 d_model rounded up, RoPE, grouped-query attention (Ainslie et al. 2023).
Every other choice the CS336 lecture 3 surveys is a switch on this class; see the field comments.

A config is validated when built (``__post_init__``, by the rules in ``lmlab/config_checks.py``, which
also holds each enumerated switch's valid values): an invalid value or combination raises
:class:`ConfigError` naming the field, the value and what would be valid.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, fields
from typing import Optional

from lmlab.config_checks import ConfigError, check_model_config


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
        check_model_config(self)  # every field checked, derived defaults filled (lmlab/config_checks.py)

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
