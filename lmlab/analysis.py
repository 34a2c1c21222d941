"""Sizing a Transformer LM from its config, by formula (``lmlab analyze``, ``lmlab survey``).

- **Parameters** (:mod:`lmlab.param_counts`): every weight the model holds, counted from the ModelConfig
  fields; equal to ``TransformerLM(cfg).num_params()`` (tests check it on many configs, real scale on the meta device).
  Non-embedding = total - token embedding - learned position table (Kaplan et al. 2020's N; an untied LM
  head stays in).
- **FLOPs per token** (a multiply-add = 2 FLOPs): forward = 2 N_mm + attention, where N_mm are the weights
  every token is multiplied by (all linear layers including the LM head, tied or not; embedding
  lookups, norms, biases and the softmax are left out, < 1%). Attention per layer and token:
  QK^T and AV each cost 2 * n_heads * head_dim * (keys seen): the width is n_heads * head_dim whatever
  n_kv_heads (GQA shares K and V, not the dot products) and head_dim need not be d_model / n_heads. With
  causal masking the token at position p (1-based) sees p keys, min(p, W) on a window-W layer, so a
  context of n gives on average (1/n) sum_p min(p, W) keys: (n + 1) / 2 without a window. Training =
  3 x forward (the backward pass costs twice the forward): 6 N_mm + 3 x attention, which for full
  attention is Kaplan et al. 2020's C ~ 6N + 6 n_layer n_ctx d_attn (eq. 2.2 with its 2 n_layer n_ctx
  d_attn forward term, i.e. causal averaging of QK^T + AV) and Hoffmann et al. 2022 (Chinchilla,
  appendix F) with its non-causal 4 n_ctx d_attn halved.
- **KV cache**: 2 (K and V) x n_kv_heads x head_dim values per token and layer; a window-W layer holds at
  most W tokens (lmlab's rolling buffer). Compared against plain MHA (n_heads KV heads, no window).
- **Linear-attention layers** ('D' in ``layer_pattern``: Gated DeltaNet, :mod:`lmlab.model.deltanet`) hold a
  state per sequence instead of keys per token: the convolution's last (kernel - 1) inputs of its
  2 n_k d_k + n_v d_v channels (in the cache's dtype) and a d_k x d_v matrix per value head (fp32, as
  lmlab keeps it). Their FLOPs per token: 2 x their weights (projections and the depthwise convolution)
  + 7 d_k d_v per value head for the recurrence counted in its recurrent form (decay d_k d_v, recall,
  write and read 2 d_k d_v each), whatever the context; the chunked form that trains them does somewhat
  more (its within-chunk products), which the count leaves out.
- **Arithmetic intensity** (FLOPs per byte moved to and from memory) of one layer of each kind (global,
  windowed), in prefill (batch x context tokens at once) and decode (one new token per sequence with
  ``context`` tokens cached): bytes = weights (read once per pass, shared by the batch) + KV cache
  (written in prefill; read and one entry written in decode) + the layer's input and output activations.
  Attention scores are assumed to stay on chip (flash attention). Against a device's ridge point
  (peak FLOP/s / memory bandwidth): below it memory-bound, above it compute-bound. Decode intensity grows
  with the batch as B f / (W + B c) (f FLOPs and c KV/activation bytes per sequence, W weight bytes), so
  decode turns compute-bound from B = ridge W / (f - ridge c), and never when f / c (the KV-bound limit)
  is below the ridge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from lmlab.config import ModelConfig
from lmlab.param_counts import (
    global_layers_differ,
    instantiated_params,
    kv_shared_counts,
    layer_params,
    linear_layer_count,
    linear_layer_params,
    moe_layer_count,
    param_counts,
)

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense FLOP/s in ``dtype``
    bandwidth: float  # bytes/s of main (HBM / DRAM) memory
    dtype: str
    source: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which the roofline bends: peak / bandwidth."""
        return self.peak_flops / self.bandwidth


DEVICES = {
    "h100": Device(
        "NVIDIA H100 SXM5 80GB",
        989.4e12,
        3.35e12,
        "bf16",
        "NVIDIA H100 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity (989.4 dense), "
        "HBM3 3.35 TB/s; https://www.nvidia.com/en-us/data-center/h100/",
    ),
    "h200": Device(
        "NVIDIA H200 SXM 141GB",
        989.4e12,
        4.8e12,
        "bf16",
        "NVIDIA H200 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity (989.4 dense), "
        "HBM3e 4.8 TB/s; https://www.nvidia.com/en-us/data-center/h200/",
    ),
    "a100": Device(
        "NVIDIA A100 SXM4 80GB",
        312e12,
        2.039e12,
        "bf16",
        "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense (624 with sparsity), "
        "HBM2e 2,039 GB/s (80GB SXM); https://www.nvidia.com/en-us/data-center/a100/",
    ),
    "cpu": Device(
        "2 CPU cores (nominal)",
        384e9,
        40e9,
        "fp32",
        "nominal, not a datasheet: 2 cores x 2 AVX-512 FMA units x 16 fp32 lanes x 2 FLOPs x 3 GHz "
        "= 384 GFLOP/s; 40 GB/s, a 2-core share of a server socket's DRAM bandwidth",
    ),
}


INSTANTIATE_MAX_LAYERS = 512  # analyze builds the model on the meta device only up to this depth (time ~ layers)


def layer_windows(cfg: ModelConfig) -> list[tuple[Optional[int], int]]:
    """(window or None for full attention, number of layers) per kind of attention layer (linear-attention
    layers left out), from one period of ``layer_pattern`` (repeated over n_layers, the last repeat possibly
    cut short): O(pattern length), not O(n_layers)."""
    period = len(cfg.layer_pattern) if cfg.layer_pattern else 1
    full, rest = divmod(cfg.n_layers, period)
    counts: dict = {}
    for i in range(min(period, cfg.n_layers)):
        if cfg.layer_is_linear(i):
            continue
        w = cfg.layer_window(i)
        counts[w] = counts.get(w, 0) + full + (i < rest)
    return list(counts.items())


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------


def mean_keys(context: int, window: Optional[int], chunk: bool = False) -> float:
    """Keys a query sees on average over positions 1..context with causal masking: (1/n) sum min(p, W);
    with ``chunk`` (chunked attention) position p sees ((p - 1) mod W) + 1 keys."""
    n = context
    if window is None or window >= n:
        return (n + 1) / 2
    W = window
    if chunk:
        full, rest = divmod(n, W)
        return (full * W * (W + 1) / 2 + rest * (rest + 1) / 2) / n
    return (W * (W + 1) / 2 + (n - W) * W) / n


def attention_flops_per_token(cfg: ModelConfig, context: int) -> float:
    """Forward FLOPs of QK^T and AV per token, summed over layers, averaged over positions 1..context; plus
    the linear-attention layers' recurrence (7 d_k d_v per value head and token, any context)."""
    chunk = cfg.local_attention == "chunk"
    n_linear = linear_layer_count(cfg)
    recurrence = n_linear * linear_layer_params(cfg)["recurrence_flops"] if n_linear else 0
    return recurrence + sum(
        layers * 2 * _attended_width(cfg, w is None) * mean_keys(context, w, chunk) for w, layers in layer_windows(cfg)
    )


def _attended_width(cfg: ModelConfig, global_layer: bool = False) -> int:
    """Per key a query attends to, the multiply-adds / 1 of QK^T plus AV over all heads: 2 x n_heads x
    head_dim (a global layer's own head_dim: Gemma 4), or n_heads x (qk_nope + qk_rope + v_head_dim) for MLA."""
    if cfg.attention == "mla":
        return cfg.n_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
    return 2 * cfg.n_heads * cfg.layer_head_dim_of(global_layer)


def flops_per_token(cfg: ModelConfig, context: Optional[int] = None, training: bool = True) -> float:
    """FLOPs per token of a forward pass (``training=False``) or of a training step (forward + backward,
    3x the forward) at sequence length ``context`` (default ``cfg.context_length``): 2 N_mm + attention
    per forward (see the module docstring). For MFU: tokens/s x flops_per_token / peak FLOP/s."""
    n = cfg.context_length if context is None else context
    if n < 1:
        raise ValueError(f"context={n} must be >= 1")
    forward = 2 * param_counts(cfg)["matmul"] + attention_flops_per_token(cfg, n)
    return 3 * forward if training else forward


# ------------------------------------------------------------------------------------------------
# KV cache
# ------------------------------------------------------------------------------------------------


def kv_values_per_token(cfg: ModelConfig, global_layer: bool = False) -> int:
    """Values the KV cache holds per token and layer: K and V of every KV head (2 x n_kv_heads x
    head_dim; a global layer's own sizes with Gemma 4's global_* fields, K and V stored apart even when
    the values come from the key projection: they differ after k-norm, RoPE and v-norm), or for
    multi-head latent attention the latent and the shared RoPE key (kv_lora_rank + qk_rope_head_dim;
    DeepSeek-V2: 576)."""
    if cfg.attention == "mla":
        return cfg.kv_lora_rank + cfg.qk_rope_head_dim
    return 2 * cfg.layer_n_kv_heads_of(global_layer) * cfg.layer_head_dim_of(global_layer)


def kv_cache_bytes(cfg: ModelConfig, context: int, batch: int = 1, dtype: str = "bf16") -> dict:
    """KV-cache memory: ``per_token`` (bytes added per token while every layer still grows: all layers up
    to their window), ``total`` for ``context`` tokens x ``batch`` (windowed layers hold min(context, W)),
    and the same for plain MHA (``mha_total``: n_heads KV heads, no window) and for this model without its
    windows (``no_window_total``), with the savings as factors: saving = GQA x KV sharing x windows. KV-shared
    layers (``kv_shared_layers``) cache nothing: they read their source layer's entries. Linear-attention
    layers hold a fixed state instead (``state_per_sequence`` bytes: the convolution history in ``dtype``, S
    in fp32; ``state_total`` for the batch), which ``total``, ``no_window_total`` and ``mha_total`` include
    (the comparisons are about the attention layers)."""
    b = DTYPE_BYTES[dtype]
    per_layer_token = kv_values_per_token(cfg) * b  # a local layer's (every layer's unless Gemma 4's differ)
    all_kinds = layer_windows(cfg)
    shared = kv_shared_counts(cfg)
    kinds = [(w, layers - shared.get(w is None, 0)) for w, layers in all_kinds]  # the layers that cache
    entry = {w: kv_values_per_token(cfg, w is None) * b for w, _ in kinds}  # bytes per token, by layer kind
    per_token = sum(layers * entry[w] for w, layers in kinds)
    held = sum(layers * entry[w] * (min(context, w) if w is not None else context) for w, layers in kinds)
    total = batch * held
    no_window = batch * per_token * context
    unshared = batch * context * sum(layers * entry[w] for w, layers in all_kinds)  # every layer caching
    # plain MHA: K and V of every head; for MLA its heads' width (DeepSeek-V2 Sec. 2.1.4 compares with 2 n_h d_h)
    mha_heads = sum(
        layers * (cfg.v_head_dim if cfg.attention == "mla" else cfg.layer_head_dim_of(w is None))
        for w, layers in all_kinds
    )
    mha = batch * 2 * cfg.n_heads * b * context * mha_heads
    n_linear = linear_layer_count(cfg)
    state = 0
    if n_linear:
        lin = linear_layer_params(cfg)
        state = n_linear * (lin["conv_values"] * b + lin["state_values"] * 4)
    total, no_window, unshared, mha = (x + batch * state for x in (total, no_window, unshared, mha))
    out = {
        "dtype": dtype,
        "bytes_per_value": b,
        "per_token": per_token,
        "state_per_sequence": state,
        "state_total": batch * state,
        "linear_layers": n_linear,
        "per_token_per_layer": per_layer_token,
        "total": total,
        "no_window_total": no_window,
        "mha_total": mha,
        "gqa_saving": mha / unshared,
        "window_saving": no_window / total,
        "kv_sharing_saving": unshared / no_window,
        "saving": mha / total,
        "context": context,
        "batch": batch,
    }
    if global_layers_differ(cfg):
        out["per_token_per_global_layer"] = kv_values_per_token(cfg, True) * b
    return out


# ------------------------------------------------------------------------------------------------
# Arithmetic intensity
# ------------------------------------------------------------------------------------------------


def _layer_costs(cfg: ModelConfig, window: Optional[int], context: int, b: int) -> dict:
    """One layer: weight bytes, and per sequence the decode FLOPs / bytes and the prefill FLOPs / bytes."""
    global_layer = window is None
    lp = dict(layer_params(cfg, global_layer=global_layer))
    n_moe = moe_layer_count(cfg)
    if n_moe:  # MoE layers by the weights a token uses (exact at batch 1; more experts load at larger batches)
        moe = layer_params(cfg, moe=True, global_layer=global_layer)
        for key, dense_key in (("total", "active"), ("matmul", "matmul")):
            lp[key] = ((cfg.n_layers - n_moe) * lp[dense_key] + n_moe * moe[dense_key]) / cfg.n_layers
    width, d = _attended_width(cfg, global_layer) / 2, cfg.d_model
    kv_entry = kv_values_per_token(cfg, global_layer) * b  # K and V (or MLA's latent and RoPE key) of one token
    chunk = cfg.local_attention == "chunk" and window is not None
    held = min(context, window) if window is not None else context
    if chunk:  # decoding the next token after ``context``: the keys of its own chunk so far
        held = context % window + 1 if context >= window else context + 1
    keys_sum = mean_keys(context, window, chunk) * context  # sum over positions of keys seen
    return {
        "weight_bytes": lp["total"] * b,
        "decode_flops": 2 * lp["matmul"] + 4 * width * held,
        "decode_bytes": kv_entry * held + kv_entry + 2 * d * b,  # read the cache, write one entry, in/out
        "prefill_flops": context * 2 * lp["matmul"] + 4 * width * keys_sum,
        "prefill_bytes": context * (kv_entry + 2 * d * b),
    }


def _linear_layer_costs(cfg: ModelConfig, context: int, b: int) -> dict:
    """:func:`_layer_costs` for a linear-attention layer: its weights, and a state read and written per
    decoded token (S in fp32, the convolution history in the dtype) instead of the keys."""
    base = _layer_costs(cfg, None, context, b)  # for the block's weights other than the mixer
    lin, lp = linear_layer_params(cfg), layer_params(cfg, global_layer=True)
    weight = base["weight_bytes"] + (lin["attention"] - lp["attention"]) * b
    # the block's matmul FLOPs as _layer_costs counts them (MoE layers averaged in), attention's swapped for the mixer's
    matmul = (
        base["decode_flops"]
        - 2 * _attended_width(cfg, True) * context
        + 2 * (lin["attention_matmul"] - lp["attention_matmul"])
    )
    state = lin["conv_values"] * b + lin["state_values"] * 4
    per_token = matmul + lin["recurrence_flops"]
    return {
        "weight_bytes": weight,
        "decode_flops": per_token,
        "decode_bytes": 2 * state + 2 * cfg.d_model * b,
        "prefill_flops": context * per_token,
        "prefill_bytes": context * 2 * cfg.d_model * b + state,
    }


def _intensity(flops_per_seq: float, bytes_per_seq: float, weight_bytes: float, batch: int, ridge: float) -> dict:
    flops = batch * flops_per_seq
    moved = weight_bytes + batch * bytes_per_seq
    ai = flops / moved
    limit = flops_per_seq / bytes_per_seq if bytes_per_seq else math.inf
    if flops_per_seq > ridge * bytes_per_seq:
        b_star: Optional[int] = max(1, math.ceil(ridge * weight_bytes / (flops_per_seq - ridge * bytes_per_seq)))
    else:
        b_star = None  # the per-sequence traffic alone keeps it below the ridge
    return {
        "flops": flops,
        "bytes": moved,
        "intensity": ai,
        "compute_bound": ai >= ridge,
        "limit": limit,
        "compute_bound_from_batch": b_star,
    }


def intensity(
    cfg: ModelConfig, context: int, batch: int = 1, device: Device | str = "h100", dtype: str = "bf16"
) -> dict:
    """Arithmetic intensity of prefill and decode per layer kind ('global', 'local') and for the whole
    model (all layers + LM head), with verdicts against ``device``'s ridge point (see the module
    docstring). Weights, KV cache and activations all in ``dtype``."""
    dev = DEVICES[device] if isinstance(device, str) else device
    b = DTYPE_BYTES[dtype]
    kinds: dict = {}
    for w, layers in layer_windows(cfg):
        kind = "global" if w is None else "local"
        kinds.setdefault(kind, {"window": w, "layers": 0})["layers"] += layers
    out: dict = {
        "device": dev.name,
        "ridge": dev.ridge,
        "dtype": dtype,
        "context": context,
        "batch": batch,
        "kinds": {},
    }
    tot = {"weight_bytes": 0.0, "decode_flops": 0.0, "decode_bytes": 0.0, "prefill_flops": 0.0, "prefill_bytes": 0.0}
    if linear_layer_count(cfg):
        kinds["linear"] = {"window": None, "layers": linear_layer_count(cfg)}
    for kind, info in kinds.items():
        c = _linear_layer_costs(cfg, context, b) if kind == "linear" else _layer_costs(cfg, info["window"], context, b)
        out["kinds"][kind] = {
            "layers": info["layers"],
            "window": info["window"],
            "prefill": _intensity(c["prefill_flops"], c["prefill_bytes"], c["weight_bytes"], batch, dev.ridge),
            "decode": _intensity(c["decode_flops"], c["decode_bytes"], c["weight_bytes"], batch, dev.ridge),
        }
        for key in tot:
            tot[key] += info["layers"] * c[key]
    E, V = cfg.embed_dim or cfg.d_model, cfg.vocab_size
    head_w = (V * E + (2 * E * cfg.d_model if E != cfg.d_model else 0)) * b
    tot["weight_bytes"] += head_w
    tot["decode_flops"] += 2 * V * E
    tot["decode_bytes"] += V * b  # the logits
    tot["prefill_flops"] += 2 * V * E  # the LM head on the last position only, as in generation
    tot["prefill_bytes"] += V * b
    out["model"] = {
        "prefill": _intensity(tot["prefill_flops"], tot["prefill_bytes"], tot["weight_bytes"], batch, dev.ridge),
        "decode": _intensity(tot["decode_flops"], tot["decode_bytes"], tot["weight_bytes"], batch, dev.ridge),
    }
    return out


# ------------------------------------------------------------------------------------------------
# The whole analysis and its text
# ------------------------------------------------------------------------------------------------


def analyze(
    cfg: ModelConfig,
    context: Optional[int] = None,
    batch: int = 1,
    device: Device | str = "h100",
    published_params: Optional[float] = None,
    check_instantiated: bool = True,
) -> dict:
    """Everything ``lmlab analyze`` prints, as a dict (``--json``). Bounded time for any valid config:
    the figures are formulas over the kinds of layers; the meta-device cross-check of the parameter
    count (``instantiated``) runs only up to :data:`INSTANTIATE_MAX_LAYERS` layers (else ``skipped``)."""
    n = cfg.context_length if context is None else context
    dev = DEVICES[device] if isinstance(device, str) else device
    counts = param_counts(cfg)
    res: dict = {"config": cfg.to_dict(), "context": n, "batch": batch, "params": counts}
    if published_params is not None:
        res["published_params"] = published_params
    if check_instantiated and cfg.n_layers > INSTANTIATE_MAX_LAYERS:
        res["instantiated"] = {
            "skipped": f"n_layers={cfg.n_layers:,} > {INSTANTIATE_MAX_LAYERS}: not built on "
            f"the meta device (its time grows with the layers)"
        }
    elif check_instantiated:
        total, non_emb = instantiated_params(cfg)
        res["instantiated"] = {
            "total": total,
            "non_embedding": non_emb,
            "equal": total == counts["total"] and non_emb == counts["non_embedding"],
        }
    attn = attention_flops_per_token(cfg, n)
    res["flops"] = {
        "matmul_params": counts["matmul"],
        "forward_2n": 2 * counts["matmul"],
        "forward_attention": attn,
        "forward": flops_per_token(cfg, n, training=False),
        "training": flops_per_token(cfg, n),
        "kaplan_6n_nonembedding": 6 * counts.get("active_non_embedding", counts["non_embedding"]),
        "attention_share": attn / (2 * counts["matmul"] + attn),
    }
    res["kv_cache"] = {dt: kv_cache_bytes(cfg, n, batch, dt) for dt in DTYPE_BYTES}
    res["device"] = {
        "name": dev.name,
        "peak_flops": dev.peak_flops,
        "bandwidth": dev.bandwidth,
        "dtype": dev.dtype,
        "ridge": dev.ridge,
        "source": dev.source,
    }
    res["intensity"] = intensity(cfg, n, batch, dev, dtype=dev.dtype)
    return res


def _bytes(n: float) -> str:
    if n >= 2**70:  # beyond EiB: no unit helps a reader any more
        return f"{n:.2e} B"
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _flops(n: float) -> str:
    if n >= 1e21:
        return f"{n:.2e} FLOP"
    for unit, scale in (
        ("EFLOP", 1e18),
        ("PFLOP", 1e15),
        ("TFLOP", 1e12),
        ("GFLOP", 1e9),
        ("MFLOP", 1e6),
        ("KFLOP", 1e3),
    ):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} FLOP"


def format_analysis(res: dict, title: str) -> str:
    """The human-readable report of :func:`analyze`."""
    cfg = ModelConfig.from_dict(res["config"])
    p, f, n, B = res["params"], res["flops"], res["context"], res["batch"]
    dev = res["device"]
    L = []
    L.append(
        f"{title}: context {n:,}, batch {B:,}, device {dev['name']} "
        f"({dev['peak_flops'] / 1e12:,.4g} TFLOP/s {dev['dtype']} dense, {dev['bandwidth'] / 1e12:.3g} TB/s)"
    )
    heads = (
        f"{cfg.n_heads} MLA heads (q/k {cfg.qk_nope_head_dim} + RoPE {cfg.qk_rope_head_dim}, v {cfg.v_head_dim}; "
        f"KV latent {cfg.kv_lora_rank})"
        if cfg.attention == "mla"
        else f"{cfg.n_heads} heads x head_dim {cfg.head_dim} ({cfg.n_kv_heads} KV heads)"
    )
    if "per_global_layer" in p:  # Gemma 4: the full-attention layers' own sizes
        g_kv = cfg.layer_n_kv_heads_of(True)
        heads += (
            f"; global layers head_dim {cfg.layer_head_dim_of(True)}, {g_kv} KV "
            f"head{'s' if g_kv != 1 else ''}{', keys as values' if cfg.global_k_eq_v else ''}"
        )
    L.append(
        f"  d_model {cfg.d_model}, {cfg.n_layers} layers, {heads}, d_ff {cfg.d_ff} ({cfg.activation}), "
        f"vocab {cfg.vocab_size:,}, {'tied' if cfg.tie_embeddings else 'untied'} embeddings"
    )
    L.append("")
    L.append("Parameters (by formula)")
    pub = res.get("published_params")
    pub_txt = f"   published {pub:,.0f} ({(p['total'] / pub - 1) * 100:+.2f}%)" if pub else ""
    L.append(f"  total            {p['total']:>18,}{pub_txt}")
    L.append(f"  non-embedding    {p['non_embedding']:>18,}")
    L.append(f"  token embedding  {p['embedding']:>18,}")
    if p.get("mtp"):
        L.append(
            f"  MTP modules      {p['mtp']:>18,}   ({cfg.mtp_depth} multi-token prediction module(s), training "
            f"only, in the totals; FLOPs below are the main model's)"
        )
    pl = p["per_layer"]
    if p.get("moe_layers", 0) < cfg.n_layers:
        label = "per dense layer " if p.get("moe_layers") else "per layer       "
        label = "per local layer " if "per_global_layer" in p else label
        L.append(
            f"  {label} {pl['total']:>18,}   (attention {pl['attention']:,}, MLP {pl['mlp']:,}, norms {pl['norms']:,})"
        )
    if "per_global_layer" in p:
        pg = p["per_global_layer"]
        L.append(
            f"  global attention {pg['attention']:>18,}   (per global layer, {p['global_layers']} of the "
            f"{cfg.n_layers}; the local layers' attention: {pl['attention']:,})"
        )
    if p.get("linear_layers"):
        pn = p["per_linear_layer"]
        L.append(
            f"  Gated DeltaNet   {pn['attention']:>18,}   (per linear-attention layer, {p['linear_layers']} of the "
            f"{cfg.n_layers}, in attention's place: {cfg.linear_n_k_heads} q/k heads x {cfg.linear_k_head_dim}, "
            f"{cfg.linear_n_v_heads} value heads x {cfg.linear_v_head_dim}, convolution {cfg.linear_conv_kernel})"
        )
    if p.get("moe_layers"):
        pm = p["per_moe_layer"]
        L.append(
            f"  per MoE layer    {pm['total']:>18,}   ({p['moe_layers']} of the {cfg.n_layers} layers: "
            f"attention {pm['attention']:,}, {cfg.n_experts} experts of d_ff {cfg.expert_d_ff or cfg.d_ff}, "
            f"top-{cfg.experts_per_token}{f', {cfg.n_shared_experts} shared' if cfg.n_shared_experts else ''})"
        )
        L.append(
            f"  active per token {p['active']:>18,}   (non-embedding {p['active_non_embedding']:,}; "
            f"FLOPs below use these)"
        )
    if p.get("ple_embedding"):
        L.append(
            f"  per-layer inputs {p['ple_embedding']:>18,}   (embedding table: {cfg.ple_vocab_size or cfg.vocab_size:,}"
            f" x {cfg.n_layers} layers x {cfg.ple_dim}; not in non-embedding)"
        )
    if cfg.kv_shared_layers:
        L.append(
            f"  KV-shared layers {cfg.kv_shared_layers:>18,}   (the last ones: queries only, keys and values "
            f"of an earlier layer{'; FFN 2 x d_ff' if cfg.kv_shared_wide_ffn else ''})"
        )
    if p["positions"]:
        L.append(f"  positions        {p['positions']:>18,}")
    if p["head"]:
        L.append(f"  LM head          {p['head']:>18,}")
    inst = res.get("instantiated")
    if inst and "skipped" in inst:
        L.append(f"  instantiated on the meta device: skipped ({inst['skipped']})")
    elif inst:
        L.append(
            f"  instantiated on the meta device: {inst['total']:,} total, {inst['non_embedding']:,} "
            f"non-embedding ({'equal' if inst['equal'] else 'DIFFERENT'})"
        )
    L.append("")
    L.append(f"FLOPs per token (context {n:,}, causal average)")
    L.append(f"  matmul weights N  {f['matmul_params']:>16,}   (linear layers + LM head)")
    L.append(
        f"  forward           {_flops(f['forward']):>16}   = 2N {_flops(f['forward_2n'])} + attention "
        f"{_flops(f['forward_attention'])} ({f['attention_share']:.1%})"
    )
    active = "active " if p.get("moe_layers") else ""
    L.append(
        f"  training          {_flops(f['training']):>16}   = 3 x forward (Kaplan's 6N on {active}non-embedding "
        f"params alone: {_flops(f['kaplan_6n_nonembedding'])})"
    )
    L.append("")
    kv = res["kv_cache"]
    what = (
        f"MLA: latent {cfg.kv_lora_rank} + RoPE key {cfg.qk_rope_head_dim}"
        if cfg.attention == "mla"
        else f"2 x {cfg.n_kv_heads} KV heads x head_dim {cfg.head_dim}"
    )
    if "per_global_layer" in p:
        what += f"; global layers 2 x {cfg.layer_n_kv_heads_of(True)} x {cfg.layer_head_dim_of(True)}"
    L.append(
        f"KV cache ({what} per token and layer"
        + (f"; windowed layers hold at most {cfg.sliding_window} tokens)" if cfg.sliding_window else ")")
    )
    L.append(f"  {'':28}{'fp32':>12}{'bf16':>12}{'fp8':>12}")
    L.append(f"  {'per token (all layers)':28}" + "".join(f"{_bytes(kv[d]['per_token']):>12}" for d in DTYPE_BYTES))
    L.append(f"  {f'{n:,} tokens x batch {B:,}':28}" + "".join(f"{_bytes(kv[d]['total']):>12}" for d in DTYPE_BYTES))
    L.append(f"  {'plain MHA, no window':28}" + "".join(f"{_bytes(kv[d]['mha_total']):>12}" for d in DTYPE_BYTES))
    if kv["bf16"]["linear_layers"]:  # included in the totals above
        L.append(
            f"  {'linear-layer state / seq.':28}"
            + "".join(f"{_bytes(kv[d]['state_per_sequence']):>12}" for d in DTYPE_BYTES)
            + f"   ({kv['bf16']['linear_layers']} Gated DeltaNet layers: fixed, any context; in the totals)"
        )
    k0 = kv["bf16"]
    heads = f"MLA {cfg.n_heads} heads" if cfg.attention == "mla" else f"GQA/MQA {cfg.n_heads}:{cfg.n_kv_heads}"
    if "per_global_layer" in p:  # Gemma 4: two ratios, one blended saving
        heads = f"GQA/MQA {cfg.n_heads}:{cfg.n_kv_heads} local, {cfg.n_heads}:{cfg.layer_n_kv_heads_of(True)} global"
    sharing = f", KV sharing {k0['kv_sharing_saving']:.2f}x" if cfg.kv_shared_layers else ""
    L.append(
        f"  saving vs plain MHA: {k0['saving']:.2f}x  ({heads} {k0['gqa_saving']:.2f}x{sharing}, "
        f"windows {k0['window_saving']:.2f}x)"
    )
    L.append("")
    it = res["intensity"]
    L.append(
        f"Arithmetic intensity ({it['dtype']} weights, KV cache, activations; ridge point {it['ridge']:.1f} FLOP/byte)"
    )
    L.append(f"  {'layer kind':22}{'phase':9}{'FLOPs':>12}{'bytes':>12}{'FLOP/byte':>11}  verdict")

    def row(label: str, phase: str, r: dict) -> str:
        verdict = "compute-bound" if r["compute_bound"] else "memory-bound"
        if phase == "decode":
            if r["compute_bound_from_batch"] is None:
                verdict += f"; never compute-bound at this context (KV limit {r['limit']:.1f} FLOP/byte)"
            elif not r["compute_bound"]:
                verdict += f"; compute-bound from batch {r['compute_bound_from_batch']:,}"
        ai = r["intensity"]
        return (
            f"  {label:22}{phase:9}{_flops(r['flops']):>12}{_bytes(r['bytes']):>12}"
            f"{f'{ai:.1f}' if ai < 1e7 else f'{ai:.2e}':>11}  {verdict}"
        )

    for kind, k in it["kinds"].items():
        label = f"{kind} x{k['layers']}" + (f" (W {k['window']})" if k["window"] else "")
        L.append(row(label, "prefill", k["prefill"]))
        L.append(row("", "decode", k["decode"]))
    L.append(row("whole model + head", "prefill", it["model"]["prefill"]))
    L.append(row("", "decode", it["model"]["decode"]))
    L.append(
        f"  (per layer: prefill of {B:,} x {n:,} tokens; decode of {B:,} token(s) at context {n:,}. "
        f"Device figures: {dev['source']})"
    )
    return "\n".join(L)
