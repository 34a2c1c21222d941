"""Qwen3-Next (transformers ``Qwen3NextForCausalLM``, model_type 'qwen3_next'; Qwen Team 2025, "Qwen3-Next:
Towards Ultimate Training & Inference Efficiency", https://qwen.ai/blog?id=qwen3-next; Qwen3-Next-80B-A3B).

Read off ``Qwen3NextConfig`` / ``modeling_qwen3_next.py`` (transformers 5). Pre-norm blocks with zero-centred
RMSNorms ((1 + w), lmlab ``gemma_rmsnorm``); ``layer_types`` gives each layer's token mixer:

- 'full_attention': GQA with per-head (1 + w) QK-norm, RoPE on the first ``partial_rotary_factor`` of each
  head (default 0.25, also when config.json omits it), and an elementwise sigmoid output gate from the query
  projection (lmlab ``attn_output_gate='elementwise'``): ``q_proj`` holds each head's query rows, then its
  gate rows (H x [q; gate] x head_dim), split here into lmlab's ``qkv`` and ``gate``;
- 'linear_attention': Gated DeltaNet (lmlab ``layer_pattern`` 'D', :mod:`lmlab.model.deltanet`), whose
  ``in_proj_qkvz`` holds, per key head, [q; k; v and z of its value heads] and ``in_proj_ba`` [b; a] of them:
  regrouped here into lmlab's [q | k | v | z | b | a] rows of ``in_proj``. Default: every 4th layer full
  (``full_attention_interval``).

The FFN of layer i is a mixture of ``num_experts`` SwiGLU experts (width ``moe_intermediate_size``; softmax
router, top ``num_experts_per_tok``, renormalised when ``norm_topk_prob``) plus a shared SwiGLU expert of
``shared_expert_intermediate_size`` whose output is multiplied by sigmoid(``shared_expert_gate`` x) (lmlab
``n_shared_experts`` = that width / the experts', ``shared_expert_gate``) when i is not in ``mlp_only_layers``
and (i + 1) % ``decoder_sparse_step`` == 0 (Qwen3-MoE's rule); else a dense SwiGLU of ``intermediate_size``.
Checkpoints name the experts ``mlp.experts.E.{gate,up,down}_proj`` (as transformers saves them; its in-memory
``gate_up_proj`` stack is read too). The released checkpoints' multi-token-prediction weights (``mtp.*``)
are not part of HF's model: the import refuses them, as any tensor it would drop.
"""

from __future__ import annotations

import torch

from lmlab.config import ModelConfig
from lmlab.interop import common as C
from lmlab.interop.llama_like import _qwen3_moe_fields, _qwen3_moe_hf
from lmlab.interop.registry import Family, StateDict, UnsupportedError, register
from lmlab.interop.roundtrip import verify_roundtrip

FAM, HF_CLASS = "qwen3_next", "Qwen3NextForCausalLM"
# fmt: off
DEFAULTS = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
                num_attention_heads=16, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
                rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
                head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_num_key_heads=16, linear_num_value_heads=32, decoder_sparse_step=1, moe_intermediate_size=512,
                shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512, norm_topk_prob=True,
                output_router_logits=False, router_aux_loss_coef=0.001, mlp_only_layers=None, layer_types=None,
                full_attention_interval=4)
# fmt: on
HANDLED = set(DEFAULTS) | C.ROPE_FIELDS
LETTERS = {"linear_attention": "D", "full_attention": "G"}


def config_to_lmlab(hf: dict) -> ModelConfig:
    C.check_fields(hf, FAM, HANDLED)
    g = lambda k: C.get(hf, k, DEFAULTS)  # noqa: E731
    if g("hidden_act") != "silu":
        raise C.unsupported(FAM, "hidden_act", g("hidden_act"), "'silu' (SwiGLU)")
    if g("attention_bias"):
        raise C.unsupported(FAM, "attention_bias", True, "false (the releases' layout)")
    n = g("num_hidden_layers")
    every = g("full_attention_interval")
    types = g("layer_types") or ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in LETTERS for t in types):
        raise C.unsupported(FAM, "layer_types", types, f"one of {sorted(LETTERS)} per layer ({n})")
    theta, scaling, _ = C.read_rope(hf, FAM)
    params = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    partial = 0.25 if partial is None else float(partial)  # Qwen3NextConfig's default
    moe = _qwen3_moe_fields(hf, g, FAM, n)
    if moe:
        width, shared = g("moe_intermediate_size"), g("shared_expert_intermediate_size")
        if shared <= 0 or shared % width:
            raise C.unsupported(
                FAM,
                "shared_expert_intermediate_size",
                shared,
                f"a positive multiple of moe_intermediate_size={width} (lmlab's shared experts are "
                f"n_shared_experts x the experts' width)",
            )
        moe.update(n_shared_experts=shared // width, shared_expert_gate=True)
    kw = dict(
        **C.read_sizes(g, n_layers=n),
        activation="swiglu",
        norm_type="gemma_rmsnorm",
        norm_eps=float(g("rms_norm_eps")),
        norm_position="pre",
        bias="none",
        position="rope",
        rope_style="half",
        rope_theta=theta,
        rope_scaling=scaling,
        rope_fraction=partial,
        qk_norm="gemma_rmsnorm",
        qk_norm_scope="head",
        attn_output_gate="elementwise",
        layer_pattern=C.shortest_period("".join(LETTERS[t] for t in types)),
        linear_n_k_heads=g("linear_num_key_heads"),
        linear_n_v_heads=g("linear_num_value_heads"),
        linear_k_head_dim=g("linear_key_head_dim"),
        linear_v_head_dim=g("linear_value_head_dim"),
        linear_conv_kernel=g("linear_conv_kernel_dim"),
        **moe,
    )
    if kw["layer_pattern"] == "G":
        kw["layer_pattern"] = None
    return C.lmlab_config(FAM, kw)


def config_to_hf(cfg: ModelConfig) -> dict:
    """Qwen3NextConfig for ``cfg``; UnsupportedError naming what Qwen3-Next cannot represent."""
    width = cfg.expert_d_ff or cfg.d_ff
    hf = {
        **C.hf_sizes(FAM, HF_CLASS, cfg),
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(cfg.norm_eps),
        "attention_bias": False,
        "layer_types": [
            "linear_attention" if cfg.layer_is_linear(i) else "full_attention" for i in range(cfg.n_layers)
        ],
        "linear_num_key_heads": cfg.linear_n_k_heads,
        "linear_num_value_heads": cfg.linear_n_v_heads,
        "linear_key_head_dim": cfg.linear_k_head_dim,
        "linear_value_head_dim": cfg.linear_v_head_dim,
        "linear_conv_kernel_dim": cfg.linear_conv_kernel,
        "shared_expert_intermediate_size": width * cfg.n_shared_experts,
        "rope_parameters": dict(
            C.rope_to_hf(cfg.rope_theta, cfg.rope_scaling, int(round(cfg.head_dim * cfg.rope_fraction))),
            partial_rotary_factor=float(cfg.rope_fraction),
        ),
    }
    hf.update(_qwen3_moe_hf(cfg, DEFAULTS))
    return verify_roundtrip(FAM, cfg, hf, config_to_lmlab)


def tensor_maps(cfg: ModelConfig) -> list[C.TensorMap]:
    """HF names -> lmlab's, over the regrouped tensors of :func:`_regroup` (``q_only``, ``q_gate``,
    ``in_proj_{q,k,v,z,b,a}``, per-expert and shared-expert projections)."""
    H, K, D, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    Hk, Hv, dk, dv = cfg.linear_n_k_heads, cfg.linear_n_v_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim
    F, E = cfg.expert_d_ff or cfg.d_ff, cfg.n_experts
    maps = []
    for i in range(cfg.n_layers):
        p, b = f"model.layers.{i}", f"blocks.{i}"
        maps += [
            C.TensorMap(f"{b}.attn_norm.weight", (f"{p}.input_layernorm.weight",), (d,)),
            C.TensorMap(f"{b}.mlp_norm.weight", (f"{p}.post_attention_layernorm.weight",), (d,)),
        ]
        if cfg.layer_is_linear(i):
            a = f"{p}.linear_attn"
            maps += [
                C.TensorMap(
                    f"{b}.attn.in_proj.weight",
                    tuple(f"{a}.in_proj_{x}.weight" for x in "qkvzba"),
                    (Hk * dk, Hk * dk, Hv * dv, Hv * dv, Hv, Hv),
                ),
                C.TensorMap(f"{b}.attn.conv_weight", (f"{a}.conv1d.weight",), (-1,)),
                C.TensorMap(f"{b}.attn.A_log", (f"{a}.A_log",), (-1,)),
                C.TensorMap(f"{b}.attn.dt_bias", (f"{a}.dt_bias",), (-1,)),
                C.TensorMap(f"{b}.attn.norm.weight", (f"{a}.norm.weight",), (-1,)),
                C.TensorMap(f"{b}.attn.out.weight", (f"{a}.out_proj.weight",), (d,)),
            ]
        else:
            a = f"{p}.self_attn"
            maps += [
                C.TensorMap(
                    f"{b}.attn.qkv.weight",
                    (f"{a}.q_only.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight"),
                    (H * D, K * D, K * D),
                ),
                C.TensorMap(f"{b}.attn.gate.weight", (f"{a}.q_gate.weight",), (-1,)),
                C.TensorMap(f"{b}.attn.out.weight", (f"{a}.o_proj.weight",), (d,)),
                C.TensorMap(f"{b}.attn.q_norm.weight", (f"{a}.q_norm.weight",), (-1,)),
                C.TensorMap(f"{b}.attn.k_norm.weight", (f"{a}.k_norm.weight",), (-1,)),
            ]
        m, x = f"{p}.mlp", f"{b}.mlp"
        if not cfg.layer_is_moe(i):
            maps += [
                C.TensorMap(f"{x}.w_in.weight", (f"{m}.gate_proj.weight", f"{m}.up_proj.weight"), (cfg.d_ff,) * 2),
                C.TensorMap(f"{x}.w_out.weight", (f"{m}.down_proj.weight",), (d,)),
            ]
            continue
        S = F * cfg.n_shared_experts
        maps += [
            C.TensorMap(f"{x}.router.weight", (f"{m}.gate.weight",), (E,)),
            C.TensorMap(
                f"{x}.shared.w_in.weight",
                (f"{m}.shared_expert.gate_proj.weight", f"{m}.shared_expert.up_proj.weight"),
                (S, S),
            ),
            C.TensorMap(f"{x}.shared.w_out.weight", (f"{m}.shared_expert.down_proj.weight",), (d,)),
            C.TensorMap(f"{x}.shared_gate.weight", (f"{m}.shared_expert_gate.weight",), (1,)),
        ]
        for e in range(E):
            q = f"{m}.experts.{e}"
            maps += [
                C.TensorMap(f"{x}.experts.{e}.w_in.weight", (f"{q}.gate_proj.weight", f"{q}.up_proj.weight"), (F, F)),
                C.TensorMap(f"{x}.experts.{e}.w_out.weight", (f"{q}.down_proj.weight",), (d,)),
            ]
    return C.model_maps(cfg, maps)


def _regroup(state: StateDict, cfg: ModelConfig) -> StateDict:
    """HF's interleaved tensors -> one tensor per part: each full-attention ``q_proj`` into ``q_only`` and
    ``q_gate``; each linear layer's ``in_proj_qkvz`` / ``in_proj_ba`` into ``in_proj_{q,k,v,z,b,a}`` (heads in
    order); stacked experts (``experts.gate_up_proj`` / ``down_proj``) into per-expert projections."""
    out = dict(state)
    H, D, d = cfg.n_heads, cfg.head_dim, cfg.d_model
    Hk, dk, dv = cfg.linear_n_k_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim
    r = cfg.linear_n_v_heads // Hk
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}"
        if f"{p}.self_attn.q_proj.weight" in out:
            w = out.pop(f"{p}.self_attn.q_proj.weight")
            if w.shape != (2 * H * D, d):
                raise UnsupportedError(
                    f"{FAM}: {p}.self_attn.q_proj.weight has shape {tuple(w.shape)}, the config "
                    f"{(2 * H * D, d)} (query and gate rows per head)"
                )
            w = w.view(H, 2, D, d)
            out[f"{p}.self_attn.q_only.weight"] = w[:, 0].reshape(H * D, d)
            out[f"{p}.self_attn.q_gate.weight"] = w[:, 1].reshape(H * D, d)
        a = f"{p}.linear_attn"
        if f"{a}.in_proj_qkvz.weight" in out and f"{a}.in_proj_ba.weight" in out:
            qkvz, ba = out.pop(f"{a}.in_proj_qkvz.weight"), out.pop(f"{a}.in_proj_ba.weight")
            if qkvz.shape != (Hk * (2 * dk + 2 * r * dv), d) or ba.shape != (Hk * 2 * r, d):
                raise UnsupportedError(
                    f"{FAM}: {a}.in_proj_qkvz / in_proj_ba have shapes {tuple(qkvz.shape)} / "
                    f"{tuple(ba.shape)}, which the config's linear_* sizes do not give"
                )
            qkvz, ba = qkvz.view(Hk, 2 * dk + 2 * r * dv, d), ba.view(Hk, 2 * r, d)
            cuts = [0, dk, 2 * dk, 2 * dk + r * dv, 2 * dk + 2 * r * dv]
            for name, lo, hi in zip("qkvz", cuts, cuts[1:]):
                out[f"{a}.in_proj_{name}.weight"] = qkvz[:, lo:hi].reshape(-1, d)
            out[f"{a}.in_proj_b.weight"], out[f"{a}.in_proj_a.weight"] = (
                ba[:, :r].reshape(-1, d),
                ba[:, r:].reshape(-1, d),
            )
        e = f"{p}.mlp.experts"
        if f"{e}.gate_up_proj" in out:  # transformers' in-memory stack: (experts, 2 x width, d), (experts, d, width)
            gate_up, down = out.pop(f"{e}.gate_up_proj"), out.pop(f"{e}.down_proj")
            if gate_up.shape[0] != cfg.n_experts or down.shape[0] != cfg.n_experts:
                raise UnsupportedError(
                    f"{FAM}: {e}.gate_up_proj / down_proj hold {gate_up.shape[0]} / "
                    f"{down.shape[0]} experts, the config {cfg.n_experts}"
                )
            for j in range(cfg.n_experts):
                gate, up = gate_up[j].chunk(2, dim=0)
                out[f"{e}.{j}.gate_proj.weight"], out[f"{e}.{j}.up_proj.weight"] = gate, up
                out[f"{e}.{j}.down_proj.weight"] = down[j]
    return out


def _interleave(state: StateDict, cfg: ModelConfig) -> StateDict:
    """The inverse of :func:`_regroup` (experts stay per-expert, as transformers saves them)."""
    out = dict(state)
    H, D, d = cfg.n_heads, cfg.head_dim, cfg.d_model
    Hk = cfg.linear_n_k_heads
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}"
        if f"{p}.self_attn.q_only.weight" in out:
            q, gate = out.pop(f"{p}.self_attn.q_only.weight"), out.pop(f"{p}.self_attn.q_gate.weight")
            out[f"{p}.self_attn.q_proj.weight"] = torch.stack([q.view(H, D, d), gate.view(H, D, d)], 1).reshape(-1, d)
        a = f"{p}.linear_attn"
        if f"{a}.in_proj_q.weight" in out:
            parts = {x: out.pop(f"{a}.in_proj_{x}.weight").view(Hk, -1, d) for x in "qkvzba"}
            out[f"{a}.in_proj_qkvz.weight"] = torch.cat([parts[x] for x in "qkvz"], 1).reshape(-1, d)
            out[f"{a}.in_proj_ba.weight"] = torch.cat([parts["b"], parts["a"]], 1).reshape(-1, d)
    return {k: v.contiguous() for k, v in out.items()}


to_lmlab_state, to_hf_state = C.mapped_states(FAM, tensor_maps, _regroup, _interleave)


# fmt: off
FAMILY = register(Family(model_type=FAM, hf_class=HF_CLASS, config_to_lmlab=config_to_lmlab,
                         state_to_lmlab=to_lmlab_state, config_to_hf=config_to_hf, state_to_hf=to_hf_state,
                         notes="Qwen3-Next: Gated DeltaNet and gated full-attention layers ((1 + w) QK-norm, partial "
                               "RoPE), (1 + w) RMSNorms, MoE with a gated shared expert",
                         unread_notes=lambda hf: []))
# fmt: on
