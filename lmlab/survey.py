"""The lecture's cross-model table (``lmlab survey``): every preset at its real size, one row each with
its parameters, shape (d_model, layers, heads, d_ff ratio, aspect d/L), norm, activation, positions,
attention (GQA/MQA, windows, linear-attention patterns), vocabulary and stability tricks, counted by
:mod:`lmlab.analysis` from the preset's config."""

from __future__ import annotations

import csv
import dataclasses
import io

from lmlab.config import ModelConfig
from lmlab.config_checks import GATED_ACTIVATIONS
from lmlab.param_counts import param_counts
from lmlab.presets import PRESETS, human_count

_NORM_NAMES = {
    "rmsnorm": "RMSNorm",
    "layernorm": "LayerNorm",
    "gemma_rmsnorm": "RMSNorm(1+w)",
    "layernorm1p": "LayerNorm(1+w)",
}


def _positions(cfg: ModelConfig) -> str:
    if cfg.position != "rope":
        return {
            "nope": "NoPE",
            "learned": "learned",
            "sinusoidal": "sinusoidal",
            "alibi": "ALiBi",
            "t5": f"T5 bias ({cfg.t5_num_buckets} buckets)",
        }[cfg.position]
    theta = f"{cfg.rope_theta:,.0f}".replace(",000,000", "M").replace(",000", "k")
    out = f"RoPE {theta}"
    if cfg.rope_fraction < 1:
        out += f" x{cfg.rope_fraction:g}"
    if cfg.rope_style == "interleaved":
        out += " interl."
    if cfg.rope_local_theta:
        out += f", local {cfg.rope_local_theta:,.0f}".replace(",000", "k")
    if cfg.rope_scaling:
        out += f", {cfg.rope_scaling['type']} x{cfg.rope_scaling['factor']:g}"
    if cfg.nope_global_layers:
        out += ", NoPE global"
    if cfg.nope_layers:
        out += f", RoPE/NoPE {cfg.nope_layers}"
    return out


def _windows(cfg: ModelConfig) -> str:
    if cfg.sliding_window is None and cfg.layer_pattern and "D" in cfg.layer_pattern:  # linear-attention layers
        return f"{cfg.layer_pattern} (D: Gated DeltaNet)"
    if cfg.sliding_window is None:
        return "-"
    if cfg.local_attention == "chunk":
        return _windows(dataclasses.replace(cfg, local_attention="window")).replace(
            f" {cfg.sliding_window}", f" chunk {cfg.sliding_window}", 1
        )
    if cfg.layer_pattern is None or "G" not in cfg.layer_pattern:
        return f"all {cfg.sliding_window}"
    p = cfg.layer_pattern
    full, rest = divmod(cfg.n_layers, len(p))
    if not rest:
        return f"{p} {cfg.sliding_window}"
    return f"{p} {cfg.sliding_window} ({cfg.n_layers} layers: {full} x {p} + {p[:rest]})"


def _stability(cfg: ModelConfig) -> str:
    tricks = []
    if cfg.qk_norm != "none":
        tricks.append(
            "QK-norm"
            + ("" if cfg.qk_norm_scope == "head" else f" ({cfg.qk_norm_scope})")
            + (" (L2, RoPE layers)" if cfg.qk_norm_layers == "rope" else "")
        )
    if cfg.attn_temperature_tuning:
        tricks.append("attn temperature")
    if cfg.attn_logit_softcap:
        tricks.append(f"attn cap {cfg.attn_logit_softcap:g}")
    if cfg.final_logit_softcap:
        tricks.append(f"final cap {cfg.final_logit_softcap:g}")
    if cfg.z_loss:
        tricks.append(f"z-loss {cfg.z_loss:g}")
    if cfg.clip_qkv:
        tricks.append(f"clip qkv {cfg.clip_qkv:g}")
    return ", ".join(tricks) or "-"


SURVEY_COLUMNS = (
    "model",
    "vocab",
    "norm",
    "activation",
    "d_ff/d",
    "H*hd/d",
    "d/L",
    "positions",
    "heads/kv",
    "windows",
    "stability",
    "params",
)


def survey_rows(scale: str = "real") -> list[dict]:
    """One row per preset (real scale) with the columns the lecture compares across models."""

    rows = []
    for name, p in PRESETS.items():
        cfg = p.config(scale)
        norm = f"{_NORM_NAMES.get(cfg.norm_type, cfg.norm_type)} {cfg.norm_position}"
        if not cfg.norm_affine:
            norm += " (no weight)"
        if cfg.parallel_block:
            norm += ", parallel" + ("" if cfg.parallel_shared_norm else " (2 norms)")
        act = cfg.activation + (" (gated)" if cfg.activation in GATED_ACTIVATIONS else "")
        counts = param_counts(cfg)
        n = counts["total"]
        params = human_count(p.published_params) if p.published_params else f"~{human_count(n)}"
        if cfg.n_experts:  # mixture of experts: routed x top-k (+ shared), and the active parameters
            act += f", MoE {cfg.n_experts} top-{cfg.experts_per_token}" + (
                f" +{cfg.n_shared_experts} shared" if cfg.n_shared_experts else ""
            )
            params += f" ({human_count(counts['active'])} active)"
        mla = cfg.attention == "mla"  # heads: value width per head; KV: the cached latent
        rows.append(
            {
                "model": name,
                "vocab": cfg.vocab_size,
                "norm": norm,
                "activation": act,
                "d_ff/d": round((cfg.expert_d_ff or cfg.d_ff) / cfg.d_model, 2),
                "H*hd/d": round(cfg.n_heads * (cfg.v_head_dim if mla else cfg.head_dim) / cfg.d_model, 2),
                "d/L": round(cfg.d_model / cfg.n_layers, 1),
                "positions": _positions(cfg),
                "heads/kv": f"{cfg.n_heads} MLA r{cfg.kv_lora_rank}" if mla else f"{cfg.n_heads}/{cfg.n_kv_heads}",
                "windows": _windows(cfg),
                "stability": _stability(cfg),
                "params": params,
            }
        )
    return rows


def format_survey(rows: list[dict], fmt: str = "table") -> str:
    """``table`` (aligned text), ``markdown`` or ``csv``."""
    cols = list(SURVEY_COLUMNS)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue().rstrip("\n")
    cells = [[str(r[c]) for c in cols] for r in rows]
    if fmt == "markdown":
        out = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(out)
    if fmt != "table":
        raise ValueError(f"format={fmt!r} is not one of 'table', 'markdown', 'csv'")
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = {"vocab", "d_ff/d", "H*hd/d", "d/L", "params"}
    line = lambda vals: "  ".join(
        v.rjust(w) if c in numeric else v.ljust(w)  # noqa: E731
        for v, w, c in zip(vals, widths, cols)
    ).rstrip()
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])
