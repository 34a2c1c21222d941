"""Parameter counts of a Transformer LM from its config, by formula (``lmlab analyze``, ``lmlab survey``,
the presets' published counts): every weight the model holds, counted from the ModelConfig fields; equal to
``TransformerLM(cfg).num_params()`` (tests check it on many configs, real scale on the meta device:
:func:`instantiated_params`). Non-embedding = total - token embedding - learned position table (Kaplan et
al. 2020's N; an untied LM head stays in). A mixture of experts' active count is what one token uses at
inference (its k routed experts and the shared ones). FLOPs, KV cache and arithmetic intensity are
:mod:`lmlab.analysis`'s.
"""

from __future__ import annotations

from typing import Optional

from lmlab.config import ModelConfig
from lmlab.config_checks import GATED_ACTIVATIONS


def _norm_params(cfg: ModelConfig, width: int) -> int:
    """A block or final norm: weight (and LayerNorm bias with norm_bias); none when norm_affine is off."""
    if not cfg.norm_affine:
        return 0
    return width * (2 if cfg.norm_bias else 1)


def _ffn_params(cfg: ModelConfig, width: int) -> tuple[int, int]:
    """(parameters, matmul weights) of one FeedForward of hidden ``width``."""
    gate = 2 if cfg.activation in GATED_ACTIVATIONS else 1
    mm = gate * cfg.d_model * width + width * cfg.d_model
    return mm + ((gate * width + cfg.d_model) if cfg.bias in ("all", "mlp") else 0), mm


def moe_layer_count(cfg: ModelConfig) -> int:
    """Layers with a mixture-of-experts FFN (:meth:`ModelConfig.layer_is_moe`), in O(pattern length)."""
    if not cfg.n_experts:
        return 0
    p = cfg.moe_pattern
    full, rest = divmod(max(0, cfg.n_layers - cfg.moe_first_dense), len(p))
    return full * p.count("M") + p[:rest].count("M")


def global_layers_differ(cfg: ModelConfig) -> bool:
    """Whether the global (full-attention) layers have other attention sizes than the local ones (Gemma 4:
    ``global_head_dim``, ``global_n_kv_heads``, ``global_k_eq_v``)."""
    return (cfg.layer_head_dim_of(True), cfg.layer_n_kv_heads_of(True), cfg.global_k_eq_v) != (
        cfg.head_dim,
        cfg.n_kv_heads,
        False,
    )


def _pattern_count(cfg: ModelConfig, letter: str, start: int = 0, end: Optional[int] = None) -> int:
    """Layers start .. end - 1 (default all) whose ``layer_pattern`` letter is ``letter``, in O(pattern length)."""
    end = cfg.n_layers if end is None else end
    p = cfg.layer_pattern

    def upto(n: int) -> int:  # among layers 0 .. n - 1
        full, rest = divmod(n, len(p))
        return full * p.count(letter) + p[:rest].count(letter)

    return max(0, upto(end) - upto(start))


def global_layer_count(cfg: ModelConfig, start: int = 0, end: Optional[int] = None) -> int:
    """Layers with full attention (no window; not linear attention) among layers start .. end - 1 (default
    all), in O(pattern length)."""
    end = cfg.n_layers if end is None else end
    if cfg.layer_pattern is None:
        return max(0, end - start) if cfg.sliding_window is None else 0
    return _pattern_count(cfg, "G", start, end)


def linear_layer_count(cfg: ModelConfig) -> int:
    """Linear-attention layers ('D' in ``layer_pattern``)."""
    return _pattern_count(cfg, "D") if cfg.layer_pattern else 0


def linear_layer_params(cfg: ModelConfig) -> dict:
    """A Gated DeltaNet layer's mixer (:class:`lmlab.model.deltanet.GatedDeltaNet`, in attention's place):
    ``attention`` (every parameter: the input projection to q, k, v, the output gate z, beta and the decay
    input; the depthwise convolution; A_log and dt_bias per value head; the gated norm's weight; the output
    projection), ``attention_matmul`` (the projections and the convolution: what a token is multiplied by),
    ``state_values`` (the decoding state: convolution history values, S values)."""
    d, Hk, Hv = cfg.d_model, cfg.linear_n_k_heads, cfg.linear_n_v_heads
    dk, dv, K = cfg.linear_k_head_dim, cfg.linear_v_head_dim, cfg.linear_conv_kernel
    channels = 2 * Hk * dk + Hv * dv
    mm = d * (channels + Hv * dv + 2 * Hv) + Hv * dv * d + channels * K
    return {
        "attention": mm + 2 * Hv + dv,
        "attention_matmul": mm,
        "channels": channels,
        "conv_values": channels * (K - 1),
        "state_values": Hv * dk * dv,
        "recurrence_flops": 7 * Hv * dk * dv,
    }


def kv_shared_counts(cfg: ModelConfig) -> dict:
    """{is_global: number of KV-shared layers of that kind} (the last ``kv_shared_layers`` layers)."""
    if not cfg.kv_shared_layers:
        return {}
    n = global_layer_count(cfg, cfg.n_layers - cfg.kv_shared_layers)
    return {k: v for k, v in ((True, n), (False, cfg.kv_shared_layers - n)) if v}


def layer_params(cfg: ModelConfig, moe: bool = False, global_layer: bool = False, kv_shared: bool = False) -> dict:
    """Parameters of one block (a mixture-of-experts one with ``moe``; a full-attention one with
    ``global_layer``, which differs only where Gemma 4's global_* fields are set; a KV-shared one with
    ``kv_shared``: queries only, and the doubled FFN of ``kv_shared_wide_ffn``): attention (projections
    and QK-norm), MLP (a MoE's: router + every expert + the shared experts), norms, ``ple`` (the per-layer
    input gate, projection and norm); ``matmul`` = the weight matrices a token is multiplied by (no biases
    or norm weights; a MoE's router, its k experts and the shared ones); ``active`` = the parameters a
    token uses (``total`` for a dense block)."""
    d, H = cfg.d_model, cfg.n_heads
    F = 2 * cfg.d_ff if (kv_shared and cfg.kv_shared_wide_ffn) else cfg.d_ff
    K, D = cfg.layer_n_kv_heads_of(global_layer), cfg.layer_head_dim_of(global_layer)
    kv_rows = 0 if kv_shared else (1 if (global_layer and cfg.global_k_eq_v) else 2) * K  # keys as values: no v
    gate_out = {"none": 0, "headwise": H, "elementwise": H * D}[cfg.attn_output_gate]  # W_g x, as biased as q
    qkv_out = (H + kv_rows) * D
    attn_mm = d * (qkv_out + gate_out) + H * D * d
    attn_bias = (
        ((qkv_out + gate_out) if cfg.bias in ("all", "qkv", "attention") else 0)
        + (d if cfg.bias in ("all", "attention") else 0)
        + (H if cfg.attn_sinks else 0)
    )  # a sink logit per head
    if cfg.attention == "mla":  # lmlab.model.mla: q (direct or low-rank), kv down / up, out; two RMSNorms
        qk, r = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.kv_lora_rank
        q_mm = (d * cfg.q_lora_rank + cfg.q_lora_rank * H * qk) if cfg.q_lora_rank else d * H * qk
        attn_mm = (
            q_mm
            + d * (r + cfg.qk_rope_head_dim)
            + r * H * (cfg.qk_nope_head_dim + cfg.v_head_dim)
            + H * cfg.v_head_dim * d
        )
        attn_bias = r + (cfg.q_lora_rank or 0)  # the latent norms' weights (no linear biases)
    if cfg.qk_norm in ("none", "l2"):  # l2: no weight
        qk_norm = 0
    elif cfg.qk_norm_scope == "head":  # one head_dim weight for q, one for k (q only on a KV-shared layer)
        qk_norm = D if kv_shared else 2 * D
    else:  # 'all' (across heads) or 'head_untied' (per head): n_heads*D + n_kv_heads*D
        qk_norm = (H + (0 if kv_shared else K)) * D
    mlp, mlp_mm = _ffn_params(cfg, F)
    mlp_active = mlp
    if moe:
        width = cfg.expert_d_ff or F
        expert, expert_mm = _ffn_params(cfg, width)
        shared, shared_mm = _ffn_params(cfg, width * cfg.n_shared_experts) if cfg.n_shared_experts else (0, 0)
        router = d * cfg.n_experts
        extra = cfg.n_experts if cfg.router_bias else 0  # gpt-oss; then Gemma 4's router norm and scales
        shared += d if cfg.shared_expert_gate else 0  # Qwen3-Next: a d_model -> 1 gate on the shared experts
        shared_mm += d if cfg.shared_expert_gate else 0
        extra += (d if cfg.router_input_norm else 0) + (cfg.n_experts if cfg.router_expert_scale else 0)
        dense, dense_mm = (mlp, mlp_mm) if cfg.moe_beside_dense else (0, 0)  # Gemma 4: the dense FFN stays
        dense += 3 * _norm_params(cfg, d) if cfg.moe_beside_dense else 0  # and three more norms
        mlp = dense + router + extra + cfg.n_experts * expert + shared
        mlp_active = dense + router + extra + cfg.experts_per_token * expert + shared
        mlp_mm = dense_mm + router + cfg.experts_per_token * expert_mm + shared_mm
    n_norms = 1 + (0 if (cfg.parallel_block and cfg.parallel_shared_norm) else 1)
    if cfg.norm_position == "sandwich":
        n_norms += 2
    norms = n_norms * _norm_params(cfg, d)
    attention = attn_mm + attn_bias + qk_norm
    ple_mm = 2 * d * cfg.ple_dim  # per-layer input: gate d -> P, projection P -> d, then a norm
    ple = ple_mm + (_norm_params(cfg, d) if cfg.ple_dim else 0)
    return {
        "attention": attention,
        "mlp": mlp,
        "norms": norms,
        "ple": ple,
        "total": attention + mlp + norms + ple,
        "matmul": attn_mm + mlp_mm + ple_mm,
        "attention_matmul": attn_mm,
        "mlp_matmul": mlp_mm,
        "active": attention + mlp_active + norms + ple,
    }


def param_counts(cfg: ModelConfig) -> dict:
    """Parameter counts by formula (tied weights once): total, non_embedding, embedding (token
    embedding), positions (learned table / T5 buckets), per_layer (:func:`layer_params`), layers, head
    (an untied LM head's weight, and its bias), projections (embed_dim != d_model), final_norm, and
    ``matmul``: the weights each token is multiplied by (layers + projections + LM head). With
    mixture-of-experts layers also ``moe_layers`` (their number), ``per_moe_layer`` and ``active`` /
    ``active_non_embedding``: the parameters one token uses (its k experts of each MoE layer)."""
    d, V = cfg.d_model, cfg.vocab_size
    E = cfg.embed_dim or d
    per_layer = layer_params(cfg)
    n_moe = moe_layer_count(cfg)
    moe = layer_params(cfg, moe=True) if n_moe else None
    embedding = V * E
    projections = 2 * E * d if E != d else 0
    learned = (cfg.context_length + cfg.learned_pos_offset) * d if cfg.position == "learned" else 0
    t5 = cfg.t5_num_buckets * cfg.n_heads if cfg.position == "t5" else 0
    final_norm = _norm_params(cfg, d) if cfg.final_norm else 0
    head = (0 if cfg.tie_embeddings else V * E) + (V if cfg.lm_head_bias else 0)
    n_dense = cfg.n_layers - n_moe
    layers = n_dense * per_layer["total"] + (n_moe * moe["total"] if moe else 0)
    matmul = n_dense * per_layer["matmul"] + (n_moe * moe["matmul"] if moe else 0) + projections + V * E
    glob = None
    if global_layers_differ(cfg):  # Gemma 4: the full layers' attention differs (the rest of a block does not)
        glob = layer_params(cfg, global_layer=True)
        n_global = global_layer_count(cfg)
        layers += n_global * (glob["attention"] - per_layer["attention"])
        matmul += n_global * (glob["attention_matmul"] - per_layer["attention_matmul"])
    for is_global, n_kind in kv_shared_counts(cfg).items():  # KV sharing: queries only (+ a wider FFN)
        own, shared = (
            layer_params(cfg, global_layer=is_global),
            layer_params(cfg, global_layer=is_global, kv_shared=True),
        )
        layers += n_kind * (shared["total"] - own["total"])
        matmul += n_kind * (shared["matmul"] - own["matmul"])
    n_linear = linear_layer_count(cfg)
    if n_linear:  # Gated DeltaNet in attention's place (the rest of the block as any other)
        lin = linear_layer_params(cfg)
        layers += n_linear * (lin["attention"] - per_layer["attention"])
        matmul += n_linear * (lin["attention_matmul"] - per_layer["attention_matmul"])
    ple_embedding = (cfg.ple_vocab_size or V) * cfg.n_layers * cfg.ple_dim  # a lookup table: embedding
    ple_model = d * cfg.n_layers * cfg.ple_dim + (_norm_params(cfg, cfg.ple_dim) if cfg.ple_dim else 0)
    layers += ple_model
    matmul += d * cfg.n_layers * cfg.ple_dim
    mtp = 0  # multi-token prediction modules (training only): 3 norms, the 2d -> d projection, a last-layer block
    if cfg.mtp_depth:  # each module's block is built as the last layer: MoE, linear attention or windowed like it
        i = cfg.n_layers - 1
        last = layer_params(cfg, moe=cfg.layer_is_moe(i), global_layer=not cfg.layer_is_local(i))
        block = last["total"]
        if cfg.layer_is_linear(i):
            block += linear_layer_params(cfg)["attention"] - last["attention"]
        mtp = cfg.mtp_depth * (3 * _norm_params(cfg, d) + 2 * d * d + block)
    total = embedding + ple_embedding + projections + learned + t5 + layers + final_norm + head + mtp
    out = {
        "total": total,
        "non_embedding": total - embedding - ple_embedding - learned,
        "embedding": embedding,
        "ple_embedding": ple_embedding,
        "positions": learned + t5,
        "per_layer": per_layer,
        "layers": layers,
        "head": head,
        "projections": projections,
        "final_norm": final_norm,
        "matmul": matmul,
        "mtp": mtp,
    }
    if glob is not None:
        out.update(per_global_layer=glob, global_layers=global_layer_count(cfg))
    if n_linear:
        out.update(linear_layers=n_linear, per_linear_layer=lin)
    if moe:  # active: what one token uses at inference (the main model's k experts; no MTP module)
        inactive = n_moe * (moe["total"] - moe["active"]) + mtp
        out.update(
            moe_layers=n_moe,
            per_moe_layer=moe,
            active=total - inactive,
            active_non_embedding=total - embedding - ple_embedding - learned - inactive,
        )
    return out


def instantiated_params(cfg: ModelConfig) -> tuple[int, int]:
    """(total, non-embedding) of ``TransformerLM(cfg)`` built on the meta device (no memory)."""
    import torch

    from lmlab.model import TransformerLM

    with torch.device("meta"):
        model = TransformerLM(cfg)
    return model.num_params(), model.num_params(non_embedding=True)
