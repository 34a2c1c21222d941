"""The rules a :class:`lmlab.config.ModelConfig` is checked against when it is built: the valid values of
each enumerated switch (with the paper or model card that made each known), the rules between fields, and
the defaults derived from other fields (``n_kv_heads``, ``head_dim``, ``d_ff``, the ``linear_*`` widths).

:func:`check_model_config` is ``ModelConfig.__post_init__``'s body: an invalid value or combination raises
:class:`ConfigError` naming the field, the value and what would be valid. The fields themselves, with their
meaning, are in ``lmlab/config.py``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from lmlab.config import ModelConfig


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field, the value and what is valid."""


# Allowed values of the enumerated switches. Each name follows the paper / model card that made it known.
NORM_TYPES = ("rmsnorm", "layernorm", "gemma_rmsnorm", "layernorm1p")  # Zhang & Sennrich 2019; Ba 2016; Gemma (1+w)
# layernorm1p: LayerNorm whose weight is stored as an offset from one, (1 + w) (Megatron "layernorm1p"; Nemotron-4)
NORM_POSITIONS = ("pre", "post", "sandwich", "reordered")  # Xiong 2020; Vaswani 2017; Gemma 2; OLMo 2
# Shazeer 2020 (GLU variants, incl. the sigmoid GLU of Dauphin et al. 2017 and the "bilinear" one with no
# nonlinearity); So et al. 2021 (squared ReLU); Clevert et al. 2016 (ELU); Klambauer et al. 2017 (SELU)
ACTIVATIONS = (
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "relu2",
    "elu",
    "selu",
    "reglu",
    "geglu",
    "swiglu",
    "glu",
    "bilinear",
    "swiglu_clamped",
)
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
BOOL_FIELDS = (
    "norm_bias",
    "norm_affine",
    "final_norm",
    "lm_head_bias",
    "parallel_block",
    "parallel_shared_norm",
    "nope_global_layers",
    "tie_embeddings",
    "scale_embeddings",
    "norm_weight_fp32",
    "router_renormalize",
    "attn_temperature_tuning",
    "global_k_eq_v",
    "v_norm",
    "layer_scalar",
    "kv_shared_wide_ffn",
    "moe_beside_dense",
    "router_input_norm",
    "router_expert_scale",
    "attn_sinks",
    "router_bias",
    "shared_expert_gate",
)
PARAMETRIZATIONS = ("sp", "mup", "completep")  # standard; Yang et al. 2022 (muP); Dey et al. 2025 (CompleteP)
ROUTER_SCORES = ("softmax", "sigmoid")  # Mixtral / Qwen-MoE / DeepSeek-V2: softmax; DeepSeek-V3: sigmoid
ROPE_SCALINGS = ("linear", "ntk", "yarn", "llama3")  # Chen 2023; bloc97 2023; Peng 2023; Llama 3.1
# rope_scaling keys per type: (required, optional), besides "type"; the names of Hugging Face's rope_parameters
ROPE_SCALING_KEYS = {
    "linear": (("factor",), ()),
    "ntk": (("factor",), ()),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    ),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
}


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, allowed))}")


# the largest size a model field may have: 2**31 - 1 (int32 indexing, and far past any model; a larger
# value would make analysis figures overflow or torch fail)
MAX_SIZE = 2**31 - 1


def _positive_int(name: str, value: Any, minimum: int = 1, maximum: int = MAX_SIZE) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        # 1e12 is a float in YAML: say how to write it as an integer
        how = " (written in digits: 1e12 and 5.0 are floats)" if isinstance(value, float) and value >= minimum else ""
        raise ConfigError(f"{name}={value!r:.60} must be an integer >= {minimum}{how}")
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


def check_model_config(cfg: "ModelConfig") -> None:
    """Check every field of ``cfg`` and fill the defaults derived from others, in place (called by
    ``ModelConfig.__post_init__``). Raises ConfigError naming the field, the value and what is valid."""
    for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "ffn_multiple_of"):
        _positive_int(name, getattr(cfg, name))
    if cfg.n_kv_heads is None:
        cfg.n_kv_heads = cfg.n_heads
    _positive_int("n_kv_heads", cfg.n_kv_heads)
    if cfg.n_kv_heads > cfg.n_heads or cfg.n_heads % cfg.n_kv_heads:
        raise ConfigError(
            f"n_heads={cfg.n_heads} is not a multiple of n_kv_heads={cfg.n_kv_heads}; "
            f"n_kv_heads must divide n_heads (valid: "
            f"{', '.join(str(d) for d in range(1, cfg.n_heads + 1) if cfg.n_heads % d == 0)})"
        )
    if cfg.head_dim is None:
        if cfg.d_model % cfg.n_heads:
            raise ConfigError(
                f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}; "
                f"set head_dim explicitly or pick n_heads dividing d_model"
            )
        cfg.head_dim = cfg.d_model // cfg.n_heads
    _positive_int("head_dim", cfg.head_dim)

    _choice("activation", cfg.activation, ACTIVATIONS)
    for name in ("ffn_ratio", "ffn_dim_multiplier"):  # checked even where an explicit d_ff makes them unused
        if getattr(cfg, name) is not None:
            _positive(name, getattr(cfg, name))
    if cfg.d_ff is None:
        if cfg.ffn_ratio is not None:
            _positive("ffn_ratio", cfg.ffn_ratio)
            cfg.d_ff = max(1, int(round(cfg.ffn_ratio * cfg.d_model)))
        elif cfg.activation in GATED_ACTIVATIONS:
            if cfg.ffn_dim_multiplier is not None:
                _positive("ffn_dim_multiplier", cfg.ffn_dim_multiplier)
            cfg.d_ff = glu_hidden_dim(cfg.d_model, cfg.ffn_multiple_of, cfg.ffn_dim_multiplier)
        else:
            cfg.d_ff = 4 * cfg.d_model
    _positive_int("d_ff", cfg.d_ff)

    _choice("norm_type", cfg.norm_type, NORM_TYPES)
    _choice("norm_position", cfg.norm_position, NORM_POSITIONS)
    _positive("norm_eps", cfg.norm_eps)
    if cfg.norm_bias and cfg.norm_type not in ("layernorm", "layernorm1p"):
        raise ConfigError(
            f"norm_bias=True needs norm_type='layernorm' (or 'layernorm1p'), got norm_type={cfg.norm_type!r}"
        )
    if cfg.norm_type == "layernorm1p" and cfg.norm_affine is False:
        raise ConfigError("norm_type='layernorm1p' stores its weight as an offset from one and needs norm_affine=True")
    if cfg.norm_affine is False and (cfg.norm_bias or cfg.norm_type == "gemma_rmsnorm"):
        raise ConfigError(
            f"norm_affine=False (no learnable norm parameters) needs norm_bias=False and norm_type "
            f"'layernorm' or 'rmsnorm', got norm_bias={cfg.norm_bias!r}, norm_type={cfg.norm_type!r}"
        )
    _choice("bias", cfg.bias, BIASES)
    _choice("position", cfg.position, POSITIONS)
    _choice("rope_style", cfg.rope_style, ROPE_STYLES)
    _positive("rope_theta", cfg.rope_theta)
    if cfg.rope_local_theta is not None:
        _positive("rope_local_theta", cfg.rope_local_theta)
    _number_in("rope_fraction", cfg.rope_fraction, 0, 1, lo_open=True)
    rotated = int(round(cfg.head_dim * cfg.rope_fraction))
    if cfg.position == "rope" and (rotated < 2 or rotated % 2):
        raise ConfigError(
            f"rope_fraction={cfg.rope_fraction} of head_dim={cfg.head_dim} rotates {rotated} dims; "
            f"the rotated width must be even and >= 2"
        )
    if cfg.rope_scaling is not None:
        _check_rope_scaling(cfg, rotated)
    _positive_int("t5_num_buckets", cfg.t5_num_buckets, 2)
    _positive_int("t5_max_distance", cfg.t5_max_distance, 1)
    if cfg.embed_dim is not None:
        _positive_int("embed_dim", cfg.embed_dim)
        if cfg.embed_dim == cfg.d_model:  # no projection: one spelling of "embeddings as wide as the model"
            cfg.embed_dim = None
    _positive_int("learned_pos_offset", cfg.learned_pos_offset, 0)
    if cfg.learned_pos_offset and cfg.position != "learned":
        raise ConfigError(
            f"learned_pos_offset={cfg.learned_pos_offset} needs position='learned', got position={cfg.position!r}"
        )
    if cfg.position == "t5" and cfg.t5_max_distance <= cfg.t5_num_buckets // 2:
        raise ConfigError(
            f"t5_max_distance={cfg.t5_max_distance} must exceed t5_num_buckets // 2 = {cfg.t5_num_buckets // 2} "
            f"(the exact-offset buckets); T5 uses 128 with 32 buckets"
        )

    _choice("qk_norm", cfg.qk_norm, QK_NORMS)
    _choice("attn_output_gate", cfg.attn_output_gate, ATTN_OUTPUT_GATES)
    if cfg.attention == "mla" and (cfg.attn_output_gate != "none" or cfg.attn_sinks):
        raise ConfigError(
            f"attn_output_gate={cfg.attn_output_gate!r} / attn_sinks={cfg.attn_sinks!r}: "
            f"lmlab's multi-head latent attention (attention='mla') has neither; use "
            f"attention='mha' (GQA/MQA by n_kv_heads) or leave them off"
        )
    _choice("qk_norm_scope", cfg.qk_norm_scope, QK_NORM_SCOPES)
    if cfg.qk_norm_scope != "head" and cfg.qk_norm == "none":
        raise ConfigError(f"qk_norm_scope={cfg.qk_norm_scope!r} needs a qk_norm, got qk_norm='none'")
    if cfg.qk_norm == "l2" and cfg.qk_norm_scope != "head":
        raise ConfigError(
            f"qk_norm='l2' normalises each head (it has no weight); qk_norm_scope must be 'head', "
            f"got {cfg.qk_norm_scope!r}"
        )
    _choice("qk_norm_layers", cfg.qk_norm_layers, QK_NORM_LAYERS)
    if cfg.qk_norm_layers != "all" and cfg.qk_norm != "l2":
        raise ConfigError(
            f"qk_norm_layers={cfg.qk_norm_layers!r} is Llama 4's rule for its weightless QK-norm: "
            f"it needs qk_norm='l2', got {cfg.qk_norm!r}"
        )
    _positive_int("attn_temperature_floor", cfg.attn_temperature_floor)
    _non_negative("attn_temperature_scale", cfg.attn_temperature_scale)
    _choice("router_weights", cfg.router_weights, ROUTER_WEIGHTS)
    _positive("logit_scale", cfg.logit_scale)
    for name in ("attn_logit_softcap", "query_pre_attn_scalar", "final_logit_softcap", "clip_qkv"):
        if getattr(cfg, name) is not None:
            _positive(name, getattr(cfg, name))
    if cfg.sliding_window is not None:
        _positive_int("sliding_window", cfg.sliding_window)
    _choice("local_attention", cfg.local_attention, ("window", "chunk"))
    _choice("attention", cfg.attention, ("mha", "mla"))
    for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        _positive_int(name, getattr(cfg, name))
    if cfg.q_lora_rank is not None:
        _positive_int("q_lora_rank", cfg.q_lora_rank)
    if cfg.attention == "mla":
        if cfg.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim={cfg.qk_rope_head_dim} must be even (RoPE rotates pairs)")
        for name, ok, what in (
            ("position", cfg.position == "rope", "'rope'"),
            ("sliding_window", cfg.sliding_window is None, "None"),
            ("qk_norm", cfg.qk_norm == "none", "'none'"),
            ("attn_logit_softcap", cfg.attn_logit_softcap is None, "None"),
            ("clip_qkv", cfg.clip_qkv is None, "None"),
            ("attn_temperature_tuning", not cfg.attn_temperature_tuning, "False"),
            ("rope_fraction", cfg.rope_fraction == 1.0, "1.0 (qk_rope_head_dim sets it)"),
            ("query_pre_attn_scalar", cfg.query_pre_attn_scalar is None, "None"),
            ("bias", cfg.bias in ("none", "mlp"), "'none' or 'mlp'"),
        ):
            if not ok:
                raise ConfigError(f"attention='mla' needs {name}={what}, got {name}={getattr(cfg, name)!r}")
    if cfg.layer_pattern is not None:
        if not isinstance(cfg.layer_pattern, str) or not cfg.layer_pattern or set(cfg.layer_pattern) - {"L", "G", "D"}:
            raise ConfigError(
                f"layer_pattern={cfg.layer_pattern!r} must be a non-empty string of 'L' (local), 'G' (global) "
                f"and 'D' (linear attention)"
            )
        if "L" in cfg.layer_pattern and cfg.sliding_window is None:
            raise ConfigError(f"layer_pattern={cfg.layer_pattern!r} has local layers but sliding_window is not set")
    _check_global_layers(cfg)
    _check_linear_layers(cfg)
    if cfg.nope_layers is not None:
        if not isinstance(cfg.nope_layers, str) or not cfg.nope_layers or set(cfg.nope_layers) - {"R", "N"}:
            raise ConfigError(
                f"nope_layers={cfg.nope_layers!r} must be a non-empty string of 'R' (RoPE) and 'N' (NoPE)"
            )
        if cfg.position != "rope":
            raise ConfigError(
                f"nope_layers={cfg.nope_layers!r} needs position='rope' on its 'R' layers, "
                f"got position={cfg.position!r}"
            )
    if cfg.nope_global_layers and cfg.position != "rope":
        raise ConfigError(
            f"nope_global_layers=True needs position='rope' on the local layers, got position={cfg.position!r}"
        )
    if cfg.nope_global_layers and (cfg.layer_pattern is None or "L" not in cfg.layer_pattern):
        raise ConfigError(
            f"nope_global_layers=True needs a layer_pattern with local 'L' layers (e.g. 'LLLG'), "
            f"got layer_pattern={cfg.layer_pattern!r}"
        )
    # mixture of experts: every field checked, the relations only when n_experts > 0
    _positive_int("n_experts", cfg.n_experts, minimum=0)
    _positive_int("experts_per_token", cfg.experts_per_token)
    _positive_int("n_shared_experts", cfg.n_shared_experts, minimum=0)
    if cfg.shared_expert_gate and not (cfg.n_experts and cfg.n_shared_experts):
        raise ConfigError(
            f"shared_expert_gate=True gates the shared experts, but n_experts={cfg.n_experts}, "
            f"n_shared_experts={cfg.n_shared_experts}: set both > 0"
        )
    if cfg.expert_d_ff is not None:
        _positive_int("expert_d_ff", cfg.expert_d_ff)
    _choice("router_score", cfg.router_score, ROUTER_SCORES)
    _non_negative("moe_aux_loss", cfg.moe_aux_loss)
    _non_negative("moe_router_z_loss", cfg.moe_router_z_loss)
    _positive_int("mtp_depth", cfg.mtp_depth, minimum=0)
    _non_negative("mtp_weight", cfg.mtp_weight)
    if cfg.mtp_depth:
        why = (
            "position='learned'/'sinusoidal'/'alibi'/'t5' (the modules rotate at the tokens' positions: rope or nope)"
            if cfg.position not in ("rope", "nope")
            else f"ple_dim={cfg.ple_dim}"
            if cfg.ple_dim
            else f"kv_shared_layers={cfg.kv_shared_layers}"
            if cfg.kv_shared_layers
            else None
        )
        if why:
            raise ConfigError(f"mtp_depth={cfg.mtp_depth} does not go with {why}")
    _choice("moe_balance", cfg.moe_balance, MOE_BALANCES)
    _non_negative("moe_bias_update_rate", cfg.moe_bias_update_rate)
    _non_negative("moe_seq_aux_loss", cfg.moe_seq_aux_loss)
    if cfg.n_experts and cfg.moe_balance == "aux_free" and cfg.moe_aux_loss:
        raise ConfigError(
            f"moe_balance='aux_free' trains without the auxiliary balance loss, but moe_aux_loss="
            f"{cfg.moe_aux_loss}; set moe_aux_loss=0, or moe_balance='both' for the bias and the loss"
        )
    if cfg.n_experts and cfg.moe_balance == "both" and not cfg.moe_aux_loss:
        raise ConfigError(
            "moe_balance='both' adds the auxiliary balance loss to the bias, but moe_aux_loss=0; "
            "give moe_aux_loss a weight (e.g. 0.01), or use moe_balance='aux_free'"
        )
    _positive_int("moe_first_dense", cfg.moe_first_dense, minimum=0)
    if not isinstance(cfg.moe_pattern, str) or not cfg.moe_pattern or set(cfg.moe_pattern) - {"M", "D"}:
        raise ConfigError(f"moe_pattern={cfg.moe_pattern!r} must be a non-empty string of 'M' (MoE) and 'D' (dense)")
    _positive_int("router_groups", cfg.router_groups)
    _positive_int("router_topk_groups", cfg.router_topk_groups)
    _choice("router_group_score", cfg.router_group_score, ("max", "top2_sum"))
    _positive("swiglu_alpha", cfg.swiglu_alpha)
    _positive("swiglu_limit", cfg.swiglu_limit)
    if (
        cfg.n_experts
        and cfg.router_group_score == "top2_sum"
        and cfg.router_groups > 1
        and cfg.n_experts // cfg.router_groups < 2
    ):
        raise ConfigError(
            f"router_group_score='top2_sum' needs at least 2 experts per group; n_experts="
            f"{cfg.n_experts} in router_groups={cfg.router_groups}"
        )
    _positive("routed_scaling_factor", cfg.routed_scaling_factor)
    if cfg.router_topk_groups > cfg.router_groups:
        raise ConfigError(f"router_topk_groups={cfg.router_topk_groups} exceeds router_groups={cfg.router_groups}")
    if cfg.n_experts:
        if cfg.n_experts % cfg.router_groups:
            raise ConfigError(f"n_experts={cfg.n_experts} is not a multiple of router_groups={cfg.router_groups}")
        if cfg.router_groups > 1 and cfg.experts_per_token > cfg.router_topk_groups * (
            cfg.n_experts // cfg.router_groups
        ):
            raise ConfigError(
                f"experts_per_token={cfg.experts_per_token} exceeds the experts of the "
                f"router_topk_groups={cfg.router_topk_groups} groups kept"
            )
        if cfg.experts_per_token > cfg.n_experts:
            raise ConfigError(
                f"experts_per_token={cfg.experts_per_token} exceeds n_experts={cfg.n_experts}; "
                f"valid: 1 to {cfg.n_experts}"
            )
        if not any(cfg.layer_is_moe(i) for i in range(min(cfg.n_layers, cfg.moe_first_dense + len(cfg.moe_pattern)))):
            raise ConfigError(
                f"n_experts={cfg.n_experts} but no layer is MoE (n_layers={cfg.n_layers}, "
                f"moe_first_dense={cfg.moe_first_dense}, moe_pattern={cfg.moe_pattern!r})"
            )
    if cfg.moe_beside_dense and (not cfg.n_experts or cfg.norm_position != "sandwich"):
        raise ConfigError(
            f"moe_beside_dense=True (Gemma 4's MoE block beside the dense FFN) needs n_experts > 0 "
            f"and norm_position='sandwich', got n_experts={cfg.n_experts}, "
            f"norm_position={cfg.norm_position!r}"
        )
    for name in ("router_input_norm", "router_expert_scale"):
        if getattr(cfg, name) is True and not cfg.n_experts:
            raise ConfigError(f"{name}=True needs n_experts > 0")
    if cfg.parallel_block and cfg.norm_position != "pre":
        raise ConfigError(f"parallel_block=True needs norm_position='pre', got {cfg.norm_position!r}")
    _non_negative("z_loss", cfg.z_loss)
    for name in ("embd_dropout", "attn_dropout", "resid_dropout"):
        _number_in(name, getattr(cfg, name), 0, 1, hi_open=True)
    _positive("init_std", cfg.init_std)
    if cfg.embed_init_std is not None:
        _positive("embed_init_std", cfg.embed_init_std)
    _check_parametrization(cfg)
    for name in BOOL_FIELDS:  # a YAML/JSON "no" or 0 would otherwise pass as a truthy or falsy switch
        if not isinstance(getattr(cfg, name), bool):
            raise ConfigError(f"{name}={getattr(cfg, name)!r} must be true or false")


def _check_parametrization(cfg: "ModelConfig") -> None:
    """Validate ``parametrization``, ``base_d_model`` and ``base_n_layers``: the bases only where they
    apply, and mup / completep only on the parts whose rules lmlab implements (dense multi-head
    attention, embeddings as wide as the model; lmlab/model/parametrization.py)."""
    _choice("parametrization", cfg.parametrization, PARAMETRIZATIONS)
    for name, needs in (("base_d_model", ("mup", "completep")), ("base_n_layers", ("completep",))):
        value = getattr(cfg, name)
        if value is None:
            continue
        _positive_int(name, value)
        if cfg.parametrization not in needs:
            raise ConfigError(
                f"{name}={value!r} applies to parametrization={' or '.join(map(repr, needs))}, "
                f"got parametrization={cfg.parametrization!r}; drop {name} or set parametrization"
            )
    if cfg.parametrization == "sp":
        return
    unsupported = (
        ("attention", cfg.attention != "mha", "'mha'"),
        ("n_experts", cfg.n_experts != 0, "0"),
        ("embed_dim", cfg.embed_dim is not None, "None (embeddings as wide as the model)"),
        ("ple_dim", cfg.ple_dim != 0, "0"),
        ("scale_embeddings", cfg.scale_embeddings is True, "False"),
        ("query_pre_attn_scalar", cfg.query_pre_attn_scalar is not None, "None"),
        (
            "norm_position",
            cfg.parametrization == "completep" and cfg.norm_position == "post",
            "'pre', 'sandwich' or 'reordered' (completep scales residual branches)",
        ),
    )
    for name, bad, want in unsupported:
        if bad:
            raise ConfigError(
                f"parametrization={cfg.parametrization!r} needs {name}={want}, got "
                f"{name}={getattr(cfg, name)!r} (lmlab has no {cfg.parametrization} rules for it)"
            )


def _check_linear_layers(cfg: "ModelConfig") -> None:
    """The linear_* fields (always checked, defaults filled) and what 'D' layers do not go with."""
    _choice("linear_attention", cfg.linear_attention, LINEAR_ATTENTIONS)
    for name, default in (
        ("linear_n_k_heads", "n_heads"),
        ("linear_n_v_heads", "linear_n_k_heads"),
        ("linear_k_head_dim", "head_dim"),
        ("linear_v_head_dim", "linear_k_head_dim"),
    ):
        if getattr(cfg, name) is None:  # in this order: a default may be the field filled just before
            setattr(cfg, name, getattr(cfg, default))
        _positive_int(name, getattr(cfg, name))
    if cfg.linear_n_v_heads % cfg.linear_n_k_heads:
        raise ConfigError(
            f"linear_n_v_heads={cfg.linear_n_v_heads} must be a multiple of "
            f"linear_n_k_heads={cfg.linear_n_k_heads} (value heads share key heads in groups)"
        )
    _positive_int("linear_conv_kernel", cfg.linear_conv_kernel)
    _positive_int("linear_chunk", cfg.linear_chunk)
    if not (cfg.layer_pattern and "D" in cfg.layer_pattern):
        return
    for name, bad, why in (
        ("attention", cfg.attention == "mla", "'D' layers beside multi-head latent attention"),
        ("kv_shared_layers", cfg.kv_shared_layers != 0, "KV sharing (a 'D' layer has no keys to share)"),
    ):
        if bad:
            raise ConfigError(
                f"layer_pattern={cfg.layer_pattern!r} has linear-attention 'D' layers, which lmlab "
                f"does not combine with {name}={getattr(cfg, name)!r} ({why})"
            )


def _check_global_layers(cfg: "ModelConfig") -> None:
    """Validate Gemma 4's switches for the global layers (global_head_dim, global_n_kv_heads,
    global_k_eq_v, global_rope_proportion): each needs local layers to differ from (sliding_window) and
    multi-head attention; raises ConfigError naming the field."""
    if cfg.global_head_dim is not None:
        _positive_int("global_head_dim", cfg.global_head_dim)
    if cfg.global_n_kv_heads is not None:
        _positive_int("global_n_kv_heads", cfg.global_n_kv_heads)
        if cfg.n_heads % cfg.global_n_kv_heads:
            raise ConfigError(f"global_n_kv_heads={cfg.global_n_kv_heads} must divide n_heads={cfg.n_heads}")
    if cfg.global_rope_proportion is not None:
        _number_in("global_rope_proportion", cfg.global_rope_proportion, 0, 1, lo_open=True)
        if cfg.position != "rope" or cfg.rope_fraction != 1.0:
            raise ConfigError(
                f"global_rope_proportion={cfg.global_rope_proportion} needs position='rope' with "
                f"rope_fraction=1.0, got position={cfg.position!r}, "
                f"rope_fraction={cfg.rope_fraction}"
            )
        if int(cfg.global_rope_proportion * cfg.layer_head_dim_of(True) // 2) < 1:
            raise ConfigError(
                f"global_rope_proportion={cfg.global_rope_proportion} rotates no pair of the "
                f"global layers' {cfg.layer_head_dim_of(True)} channels"
            )
    used = [
        name
        for name, on in (
            ("global_head_dim", cfg.global_head_dim is not None),
            ("global_n_kv_heads", cfg.global_n_kv_heads is not None),
            ("global_k_eq_v", cfg.global_k_eq_v),
            ("global_rope_proportion", cfg.global_rope_proportion is not None),
        )
        if on
    ]
    if used and cfg.sliding_window is None:
        raise ConfigError(
            f"{used[0]}={getattr(cfg, used[0])!r} sets the global layers apart from the local "
            f"ones, but sliding_window is not set (no local layers); set sliding_window and a "
            f"layer_pattern such as 'LLLLLG'"
        )
    if used and cfg.sliding_window is not None:
        period = len(cfg.layer_pattern) if cfg.layer_pattern else 1
        if not any(cfg.layer_window(i) is None for i in range(min(cfg.n_layers, period))):
            raise ConfigError(
                f"{used[0]}={getattr(cfg, used[0])!r} sets the global layers apart, but every "
                f"layer is local (layer_pattern={cfg.layer_pattern!r}); give a layer_pattern with "
                f"'G' layers, e.g. 'LLLLLG'"
            )
    if cfg.global_rope_proportion is not None and cfg.nope_global_layers is True:
        raise ConfigError(
            f"global_rope_proportion={cfg.global_rope_proportion} rotates the global layers, "
            f"but nope_global_layers=True gives them no positions; set one of them"
        )
    g_head = cfg.layer_head_dim_of(True)
    if cfg.position == "rope" and cfg.nope_global_layers is not True and g_head % 2:
        raise ConfigError(
            f"global_head_dim={g_head} is odd; RoPE on the global layers rotates pairs of "
            f"channels: give an even global_head_dim (or nope_global_layers=True)"
        )
    if used and cfg.local_attention != "window":
        raise ConfigError(
            f"{used[0]} is Gemma 4's, whose local layers are sliding windows; got "
            f"local_attention={cfg.local_attention!r}"
        )
    if (used or cfg.v_norm) and cfg.attention != "mha":
        raise ConfigError(f"{(used or ['v_norm'])[0]} needs attention='mha', got attention={cfg.attention!r}")
    _positive_int("kv_shared_layers", cfg.kv_shared_layers, minimum=0, maximum=cfg.n_layers - 1)
    if cfg.kv_shared_layers:
        if cfg.attention != "mha":
            raise ConfigError(
                f"kv_shared_layers={cfg.kv_shared_layers} needs attention='mha', got attention={cfg.attention!r}"
            )
        for layer in range(cfg.n_layers - cfg.kv_shared_layers, cfg.n_layers):
            if cfg.layer_kv_source(layer) is None:
                kind = "local" if cfg.layer_is_local(layer) else "global"
                raise ConfigError(
                    f"kv_shared_layers={cfg.kv_shared_layers}: layer {layer} is {kind} but no "
                    f"earlier layer of that kind computes keys and values to share (layers 0-"
                    f"{cfg.n_layers - cfg.kv_shared_layers - 1})"
                )
    if cfg.kv_shared_wide_ffn and (not cfg.kv_shared_layers or (cfg.n_experts and not cfg.moe_beside_dense)):
        raise ConfigError(
            f"kv_shared_wide_ffn=True widens the dense FFN of the KV-shared layers: it needs "
            f"kv_shared_layers > 0 and a dense FFN (n_experts=0 or moe_beside_dense), got "
            f"kv_shared_layers={cfg.kv_shared_layers}, n_experts={cfg.n_experts}"
        )
    _positive_int("ple_dim", cfg.ple_dim, minimum=0)
    if cfg.ple_vocab_size is not None:
        _positive_int("ple_vocab_size", cfg.ple_vocab_size)
        if not cfg.ple_dim:
            raise ConfigError(f"ple_vocab_size={cfg.ple_vocab_size} needs ple_dim > 0")
        if cfg.ple_vocab_size < cfg.vocab_size:
            raise ConfigError(
                f"ple_vocab_size={cfg.ple_vocab_size} must be >= vocab_size={cfg.vocab_size} "
                f"(every token id looks up a row)"
            )


def _check_rope_scaling(cfg: "ModelConfig", rot_dim: int) -> None:
    """Validate ``rope_scaling``: a mapping with ``type`` and exactly that type's keys
    (ROPE_SCALING_KEYS), each in range. Raises ConfigError naming ``rope_scaling.<key>``."""
    rs = cfg.rope_scaling
    if not isinstance(rs, dict) or "type" not in rs:
        raise ConfigError(
            f"rope_scaling={rs!r} must be a mapping with a 'type' key "
            f"(one of {', '.join(map(repr, ROPE_SCALINGS))}) and its parameters"
        )
    if cfg.position != "rope":
        raise ConfigError(f"rope_scaling={rs!r} needs position='rope', got position={cfg.position!r}")
    kind = rs["type"]
    _choice("rope_scaling.type", kind, ROPE_SCALINGS)
    required, optional = ROPE_SCALING_KEYS[kind]
    for key in required:
        if key not in rs:
            raise ConfigError(
                f"rope_scaling.{key} is required for rope_scaling.type={kind!r} (required keys: {', '.join(required)})"
            )
    for key in rs:
        if key != "type" and key not in required + optional:
            raise ConfigError(
                f"rope_scaling.{key}={rs[key]!r} is not a key of rope_scaling.type={kind!r}; "
                f"valid keys: {', '.join(('type',) + required + optional)}"
            )
    factor = rs["factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
        raise ConfigError(f"rope_scaling.factor={factor!r} must be a finite number >= 1 (the context extension ratio)")
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
        raise ConfigError(
            f"rope_scaling.high_freq_factor={rs['high_freq_factor']!r} must be at least "
            f"rope_scaling.low_freq_factor={rs['low_freq_factor']!r}"
        )
    if kind == "yarn" and (rs.get("beta_fast") or 32) <= (rs.get("beta_slow") or 1):
        raise ConfigError(
            f"rope_scaling.beta_fast={rs.get('beta_fast')!r} must be greater than "
            f"rope_scaling.beta_slow={rs.get('beta_slow')!r} (defaults 32 and 1)"
        )
    if kind == "ntk" and rot_dim <= 2:
        raise ConfigError(
            f"rope_scaling.type='ntk' needs a rotated width > 2 (theta * factor^(d/(d-2))), "
            f"got {rot_dim} from head_dim={cfg.head_dim}, rope_fraction={cfg.rope_fraction}"
        )
