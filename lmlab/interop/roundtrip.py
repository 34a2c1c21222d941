"""Round-trip verification of an export: a family's ``config_to_hf`` proves it represents a ModelConfig
exactly by converting the HF mapping back (:func:`verify_roundtrip`) and comparing every property that
changes the forward pass (:func:`layer_signature`); UnsupportedError names what differs.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from lmlab.config import ConfigError, ModelConfig
from lmlab.interop.registry import UnsupportedError
from lmlab.model.parametrization import depth_multiplier, width_multiplier


def layer_signature(cfg: ModelConfig) -> dict:
    """Every property of ``cfg`` that changes the forward pass, canonicalised so that two configs with the
    same signature compute the same function with the same parameter layout (training-only fields, the
    FFN sizing rules that produced d_ff, and switches made moot by others are left out)."""
    qk_scope = cfg.qk_norm_scope if cfg.qk_norm != "none" else None
    sig: dict = {
        k: getattr(cfg, k)
        for k in (
            "vocab_size",
            "context_length",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_ff",
            "norm_type",
            "norm_position",
            "norm_eps",
            "final_norm",
            "bias",
            "lm_head_bias",
            "activation",
            "parallel_block",
            "position",
            "qk_norm",
            "attn_logit_softcap",
            "final_logit_softcap",
            "tie_embeddings",
            "scale_embeddings",
            "clip_qkv",
            "logit_scale",
            "attn_output_gate",
            "attn_sinks",
        )
    }
    for extra in ("embed_dim", "learned_pos_offset"):  # switches other families add (OPT)
        if hasattr(cfg, extra):
            sig[extra] = getattr(cfg, extra)
    sig["norm_affine"] = cfg.norm_affine
    sig["v_norm"], sig["layer_scalar"] = cfg.v_norm, cfg.layer_scalar
    sig["ple"] = (cfg.ple_dim, cfg.ple_vocab_size or cfg.vocab_size) if cfg.ple_dim else None
    rms_weight = (cfg.norm_type == "rmsnorm" and cfg.norm_affine) or cfg.qk_norm == "rmsnorm"
    sig["norm_weight_fp32"] = cfg.norm_weight_fp32 if rms_weight else None  # bf16 rounding order of RMSNorm
    sig["norm_bias"] = cfg.norm_bias if cfg.norm_affine else False
    sig["parallel_shared_norm"] = cfg.parallel_shared_norm if cfg.parallel_block else None
    sig["qk_norm_scope"] = qk_scope
    sig["qk_norm_layers"] = cfg.qk_norm_layers if cfg.qk_norm != "none" else None
    no_rope = any(not cfg.layer_has_rope(i) for i in range(cfg.n_layers))
    sig["temperature"] = (
        (cfg.attn_temperature_floor, cfg.attn_temperature_scale) if cfg.attn_temperature_tuning and no_rope else None
    )
    sig["query_scale"] = cfg.query_pre_attn_scalar if cfg.query_pre_attn_scalar else cfg.head_dim
    # mup / completep (lmlab.model.parametrization): logits / m, attention scale / sqrt(m), branches x
    # base_n_layers / n_layers, which no family has; at the base (multipliers 1) they compute sp's function

    m, d = width_multiplier(cfg), depth_multiplier(cfg)
    sig["parametrization"] = "sp" if m == d == 1.0 else f"{cfg.parametrization} (width x{m:g}, depth x{d:g})"
    sig["t5"] = (cfg.t5_num_buckets, cfg.t5_max_distance) if cfg.position == "t5" else None
    sig["attention"] = (
        cfg.attention
        if cfg.attention == "mha"
        else (
            cfg.attention,
            cfg.kv_lora_rank,
            cfg.q_lora_rank,
            cfg.qk_rope_head_dim,
            cfg.qk_nope_head_dim,
            cfg.v_head_dim,
        )
    )
    sig["moe"] = (
        None
        if not cfg.n_experts
        else (
            cfg.n_experts,
            cfg.experts_per_token,
            cfg.n_shared_experts,
            cfg.expert_d_ff or cfg.d_ff,
            cfg.router_score,
            cfg.router_renormalize,
            cfg.router_weights,
            cfg.router_groups,
            (cfg.router_topk_groups, cfg.router_group_score) if cfg.router_groups > 1 else None,
            cfg.routed_scaling_factor,
            tuple(cfg.layer_is_moe(i) for i in range(cfg.n_layers)),
            cfg.moe_beside_dense,
            cfg.router_input_norm,
            cfg.router_expert_scale,
            cfg.moe_balance != "aux_loss",
            cfg.router_bias,
            cfg.shared_expert_gate,
        )
    )
    sig["swiglu_clamp"] = (
        (cfg.swiglu_alpha, cfg.swiglu_limit) if cfg.activation == "swiglu_clamped" else None
    )  # a routing bias (DeepSeek-V3's e_score_correction_bias)
    layers = []
    for i in range(cfg.n_layers):
        if cfg.layer_is_linear(i):  # a linear-attention layer: its kind and sizes (the chunk does not matter)
            layers.append(
                (
                    cfg.linear_attention,
                    cfg.linear_n_k_heads,
                    cfg.linear_n_v_heads,
                    cfg.linear_k_head_dim,
                    cfg.linear_v_head_dim,
                    cfg.linear_conv_kernel,
                )
            )
            continue
        window = cfg.layer_window(i)
        if window is not None and cfg.local_attention == "chunk":
            window = ("chunk", window)  # no exported family has chunked attention: export refuses it
        rope = None
        if cfg.layer_has_rope(i):
            local = window is not None and cfg.rope_local_theta
            theta = cfg.rope_local_theta if local else cfg.rope_theta
            scaling = None if local else cfg.rope_scaling
            rot = int(round(cfg.layer_head_dim(i) * cfg.rope_fraction))
            if scaling is not None and scaling["type"] == "ntk":
                theta, scaling = theta * float(scaling["factor"]) ** (rot / (rot - 2)), None
            proportion = cfg.global_rope_proportion if window is None else None
            rope = (
                cfg.rope_style,
                rot,
                float(theta),
                None if scaling is None else tuple(sorted(scaling.items())),
                proportion,
            )
        # Gemma 4: a layer's own KV heads and head_dim, whether its values are its keys' projection, the
        # layer whose keys and values it reads (KV sharing) and its FFN width
        sizes = (
            cfg.layer_n_kv_heads(i),
            cfg.layer_head_dim(i),
            cfg.layer_k_eq_v(i),
            cfg.layer_kv_source(i),
            cfg.layer_d_ff(i),
        )
        layers.append((window, rope, sizes))
    sig["layers"] = layers
    return sig


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def verify_roundtrip(family: str, cfg: ModelConfig, hf: dict, to_lmlab: Callable[[dict], ModelConfig]) -> dict:
    """Check that ``hf`` (a config.json mapping written by a family's ``config_to_hf``) converts back to a
    config computing the same function as ``cfg``; UnsupportedError naming every differing property.
    Returns ``hf``."""
    try:
        back = to_lmlab(dict(hf))
    except (ConfigError, UnsupportedError) as exc:
        why = str(exc).removeprefix(f"{family}: ")  # the inner error may already name the family
        raise UnsupportedError(f"{family} cannot represent this config: {why}") from None
    a, b = layer_signature(cfg), layer_signature(back)
    diffs = []
    for key in a:
        if key == "layers":
            for i, (la, lb) in enumerate(zip(a["layers"], b["layers"])):
                if la != lb:
                    what = []
                    if len(la) != 3 or len(lb) != 3:  # a linear-attention layer on one side (see layer_signature)
                        kind = lambda t: "attention" if len(t) == 3 else f"{t[0]} (heads, dims, kernel {t[1:]})"  # noqa: E731
                        diffs.append(f"layer {i}: {kind(la)} (the family gives {kind(lb)})")
                        break
                    if la[0] != lb[0]:
                        what.append(f"window {la[0]} (the family gives {lb[0]})")
                    if la[1] != lb[1]:
                        what.append(f"RoPE {la[1]} (the family gives {lb[1]})")
                    if la[2] != lb[2]:
                        what.append(
                            f"(KV heads, head_dim, keys as values, KV source, d_ff) {la[2]} (the family gives {lb[2]})"
                        )
                    diffs.append(f"layer {i}: {', '.join(what)}")
                    break
        elif not _close(a[key], b.get(key)):
            diffs.append(f"{key}={a[key]!r} (the family gives {b.get(key)!r})")
    if diffs:
        raise UnsupportedError(f"{family} cannot represent this config exactly: {'; '.join(diffs)}")
    return hf
