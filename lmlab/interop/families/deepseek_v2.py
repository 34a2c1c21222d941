"""DeepSeek-V2 (transformers ``DeepseekV2ForCausalLM``, model_type 'deepseek_v2'; DeepSeek-AI 2024,
"DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model", arXiv 2405.04434).

Read off ``DeepseekV2Config`` / ``modeling_deepseek_v2.py`` (transformers 5):

- attention is multi-head latent attention (lmlab ``attention='mla'``): ``q_proj`` or the query
  bottleneck ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj`` (``q_lora_rank``); ``kv_a_proj_with_mqa``
  -> [latent (``kv_lora_rank``) | RoPE key (``qk_rope_head_dim``)], ``kv_a_layernorm``, ``kv_b_proj``
  -> per head [key without positions (``qk_nope_head_dim``) | value (``v_head_dim``)]; RoPE rotates
  adjacent pairs (complex multiplication: ``rope_style='interleaved'``); the softmax scale is
  (nope + rope)^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN. Its two latent RMSNorms use
  eps 1e-6 whatever ``rms_norm_eps`` says, so another ``rms_norm_eps`` is refused (lmlab's norms share one);
- the FFN of layer i >= ``first_k_dense_replace`` is a mixture of ``n_routed_experts`` SwiGLU experts of
  width ``moe_intermediate_size``: softmax over the experts, top ``num_experts_per_tok`` (``topk_method``
  'greedy', or 'group_limited_greedy' among the ``topk_group`` best of ``n_group`` groups), the weights
  not renormalised (transformers never reads ``norm_topk_prob``: only false is accepted) and multiplied
  by ``routed_scaling_factor``; plus ``n_shared_experts`` shared experts fused into one FFN; the first
  layers a dense SwiGLU of ``intermediate_size``. Checkpoints name the experts ``mlp.experts.E.{gate,up,
  down}_proj`` (as DeepSeek publishes them and transformers saves them); the stacked in-memory form
  ``mlp.experts.gate_up_proj`` / ``down_proj`` is read too.

Refused: ``attention_bias`` or ``mlp_bias`` true, ``num_key_value_heads`` other than the heads, and
any ``pretraining_tp`` but 1. DeepSeek's load-balancing losses are training terms transformers' forward
does not add; ``output_router_logits`` is accepted and not mapped.
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop import common as C
from lmlab.interop.registry import Family, StateDict, register
from lmlab.interop.roundtrip import verify_roundtrip

FAM, HF_CLASS = "deepseek_v2", "DeepseekV2ForCausalLM"
FAM_V3, HF_CLASS_V3 = "deepseek_v3", "DeepseekV3ForCausalLM"
# fmt: off
DEFAULTS = dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                rms_norm_eps=1e-6, pretraining_tp=1, tie_word_embeddings=False, attention_bias=False,
                attention_dropout=0.0, mlp_bias=False, head_dim=None, first_k_dense_replace=0, kv_lora_rank=512,
                q_lora_rank=1536, n_group=None, n_routed_experts=64, output_router_logits=False,
                n_shared_experts=2, qk_nope_head_dim=128, qk_rope_head_dim=64, routed_scaling_factor=1.0,
                topk_group=None, topk_method="greedy", norm_topk_prob=False, v_head_dim=128,
                num_experts_per_tok=None, moe_intermediate_size=1407, qk_head_dim=None)
# fmt: on
HANDLED = set(DEFAULTS)
# DeepSeek-V3 (lmlab.interop.families.deepseek_v3): the same layout with sigmoid routing and its bias
# fmt: off
DEFAULTS_V3 = {**{k: v for k, v in DEFAULTS.items() if k != "topk_method"}, "vocab_size": 129280, "hidden_size": 7168,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "num_attention_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
               "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
               "norm_topk_prob": True, "max_position_embeddings": 4096, "rope_interleave": True,
               "num_nextn_predict_layers": 1}
# fmt: on
HANDLED_V3 = set(DEFAULTS_V3) | {"num_mtp_layers"}
LATENT_EPS = 1e-6  # DeepseekV2RMSNorm's default, used for q_a_layernorm and kv_a_layernorm


def config_to_lmlab(hf: dict, v3: bool = False) -> ModelConfig:
    fam, defaults = (FAM_V3, DEFAULTS_V3) if v3 else (FAM, DEFAULTS)
    C.check_fields(hf, fam, HANDLED_V3 if v3 else HANDLED)
    g = lambda k: C.get(hf, k, defaults)  # noqa: E731
    heads = g("num_attention_heads")
    for key, ok, want in (
        ("attention_bias", not g("attention_bias"), "false"),
        ("mlp_bias", not g("mlp_bias"), "false"),
        (
            "num_key_value_heads",
            g("num_key_value_heads") in (None, heads),
            f"{heads} (MLA expands the latent to every head)",
        ),
        ("pretraining_tp", g("pretraining_tp") in (None, 1), "1"),
        ("norm_topk_prob", v3 or not g("norm_topk_prob"), "false (transformers never renormalises)"),
        (
            "rms_norm_eps",
            float(g("rms_norm_eps")) == LATENT_EPS,
            f"{LATENT_EPS} (the latent norms' fixed eps; lmlab's norms share one)",
        ),
        (
            "head_dim",
            g("head_dim") in (None, g("qk_rope_head_dim")),
            f"{g('qk_rope_head_dim')} (qk_rope_head_dim, as DeepseekV2Config sets it)",
        ),
        (
            "qk_head_dim",
            g("qk_head_dim") in (None, g("qk_nope_head_dim") + g("qk_rope_head_dim")),
            "qk_nope_head_dim + qk_rope_head_dim",
        ),
    ):
        if not ok:
            raise C.unsupported(fam, key, g(key), want)
    kw: dict = dict(
        **C.read_sizes(g, head_dim=None, n_heads=heads, n_kv_heads=heads),
        activation=C.gated_activation(fam, "hidden_act", g("hidden_act")),
        norm_type="rmsnorm",
        norm_eps=LATENT_EPS,
        norm_position="pre",
        bias="none",
        position="rope",
        rope_style="interleaved" if (not v3 or g("rope_interleave")) else "half",
        attention="mla",
        kv_lora_rank=g("kv_lora_rank"),
        q_lora_rank=g("q_lora_rank"),
        qk_rope_head_dim=g("qk_rope_head_dim"),
        qk_nope_head_dim=g("qk_nope_head_dim"),
        v_head_dim=g("v_head_dim"),
    )
    theta, scaling, partial = C.read_rope(hf, fam)
    if partial != 1.0:
        raise C.unsupported(fam, "partial_rotary_factor", partial, "1.0 (the RoPE key is rotated whole)")
    kw.update(rope_theta=theta, rope_scaling=scaling)
    experts = g("n_routed_experts")
    moe = dict(n_experts=experts, experts_per_token=g("num_experts_per_tok"),
               n_shared_experts=g("n_shared_experts") or 0, expert_d_ff=g("moe_intermediate_size"),
               moe_first_dense=g("first_k_dense_replace"),
               routed_scaling_factor=float(g("routed_scaling_factor"))) if experts else {}  # fmt: skip
    if v3 and experts and g("first_k_dense_replace") < kw["n_layers"]:  # DeepseekV3TopkRouter
        kw.update(
            **moe,
            router_score="sigmoid",
            router_renormalize=bool(g("norm_topk_prob")),
            router_groups=int(g("n_group") or 1),
            router_topk_groups=int(g("topk_group") or 1),
            router_group_score="top2_sum",
            moe_balance="aux_free",
        )
    elif experts and g("first_k_dense_replace") < kw["n_layers"]:
        method = g("topk_method")
        if method not in ("greedy", "group_limited_greedy"):
            raise C.unsupported(FAM, "topk_method", method, "'greedy' or 'group_limited_greedy'")
        groups = (g("n_group"), g("topk_group")) if method == "group_limited_greedy" else (1, 1)
        if None in groups:
            raise C.unsupported(FAM, "n_group", groups[0], "a number with topk_method='group_limited_greedy'")
        kw.update(
            **moe,
            router_score="softmax",
            router_renormalize=False,
            router_groups=int(groups[0]),
            router_topk_groups=int(groups[1]),
        )
    return C.lmlab_config(fam, kw)


def config_to_hf(cfg: ModelConfig, v3: bool = False) -> dict:
    """DeepseekV2Config (DeepseekV3Config with ``v3``) for ``cfg``; UnsupportedError naming what the family
    cannot represent."""
    fam = FAM_V3 if v3 else FAM
    grouped = cfg.router_groups > 1
    hf: dict = {
        **C.hf_sizes(fam, HF_CLASS_V3 if v3 else HF_CLASS, cfg, num_key_value_heads=cfg.n_heads),
        "rms_norm_eps": float(cfg.norm_eps),
        "hidden_act": C.GATED_ACT_TO_HF.get(cfg.activation, cfg.activation),
        "attention_bias": False,
        "mlp_bias": False,
        "kv_lora_rank": cfg.kv_lora_rank,
        "q_lora_rank": cfg.q_lora_rank,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "head_dim": cfg.qk_rope_head_dim,
        "rope_parameters": C.rope_to_hf(cfg.rope_theta, cfg.rope_scaling, cfg.qk_rope_head_dim),
        "n_routed_experts": cfg.n_experts or None,
        "num_experts_per_tok": cfg.experts_per_token,
        "n_shared_experts": cfg.n_shared_experts or None,
        "moe_intermediate_size": cfg.expert_d_ff or cfg.d_ff,
        "first_k_dense_replace": cfg.moe_first_dense if cfg.n_experts else cfg.n_layers,
        "topk_method": "group_limited_greedy" if grouped else "greedy",
        "n_group": cfg.router_groups if grouped else None,
        "topk_group": cfg.router_topk_groups if grouped else None,
        "routed_scaling_factor": float(cfg.routed_scaling_factor),
        "norm_topk_prob": False,
    }
    if v3:
        del hf["topk_method"]
        hf.update(
            n_group=cfg.router_groups,
            topk_group=cfg.router_topk_groups,
            norm_topk_prob=cfg.router_renormalize,
            rope_interleave=cfg.rope_style == "interleaved",
            num_nextn_predict_layers=0,
        )
    if cfg.n_experts and cfg.moe_pattern != "M":
        raise C.unsupported(fam, "moe_pattern", cfg.moe_pattern, "'M' (every layer after the first dense ones)")
    return verify_roundtrip(fam, cfg, hf, lambda h: config_to_lmlab(h, v3))


def tensor_maps(cfg: ModelConfig) -> list[C.TensorMap]:
    r, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim  # kv_up / q_up rows: per head [nope | v], [nope | rope]
    F, W, d = cfg.d_ff, cfg.expert_d_ff or cfg.d_ff, cfg.d_model
    maps = []
    for i in range(cfg.n_layers):
        p, b = f"model.layers.{i}", f"blocks.{i}"
        a = f"{p}.self_attn"
        maps += [
            C.TensorMap(f"{b}.attn_norm.weight", (f"{p}.input_layernorm.weight",), (d,)),
            C.TensorMap(f"{b}.mlp_norm.weight", (f"{p}.post_attention_layernorm.weight",), (d,)),
            C.TensorMap(f"{b}.attn.kv_down.weight", (f"{a}.kv_a_proj_with_mqa.weight",), (r + rope,)),
            C.TensorMap(f"{b}.attn.kv_norm.weight", (f"{a}.kv_a_layernorm.weight",), (r,)),
            C.TensorMap(f"{b}.attn.kv_up.weight", (f"{a}.kv_b_proj.weight",), (-1,)),
            C.TensorMap(f"{b}.attn.out.weight", (f"{a}.o_proj.weight",), (d,)),
        ]
        if cfg.q_lora_rank:
            maps += [
                C.TensorMap(f"{b}.attn.q_down.weight", (f"{a}.q_a_proj.weight",), (cfg.q_lora_rank,)),
                C.TensorMap(f"{b}.attn.q_norm.weight", (f"{a}.q_a_layernorm.weight",), (cfg.q_lora_rank,)),
                C.TensorMap(f"{b}.attn.q_up.weight", (f"{a}.q_b_proj.weight",), (-1,)),
            ]
        else:
            maps.append(C.TensorMap(f"{b}.attn.q_up.weight", (f"{a}.q_proj.weight",), (-1,)))
        m = f"{p}.mlp"
        if not cfg.layer_is_moe(i):
            maps += [
                C.TensorMap(f"{b}.mlp.w_in.weight", (f"{m}.gate_proj.weight", f"{m}.up_proj.weight"), (F, F)),
                C.TensorMap(f"{b}.mlp.w_out.weight", (f"{m}.down_proj.weight",), (d,)),
            ]
            continue
        maps.append(C.TensorMap(f"{b}.mlp.router.weight", (f"{m}.gate.weight",), (cfg.n_experts,)))
        if cfg.moe_balance != "aux_loss":  # DeepSeek-V3's routing bias (auxiliary-loss-free balancing)
            maps.append(C.TensorMap(f"{b}.mlp.expert_bias", (f"{m}.gate.e_score_correction_bias",), (cfg.n_experts,)))
        for e in range(cfg.n_experts):  # as transformers saves them and DeepSeek publishes them
            x = f"{m}.experts.{e}"
            maps += [
                C.TensorMap(
                    f"{b}.mlp.experts.{e}.w_in.weight", (f"{x}.gate_proj.weight", f"{x}.up_proj.weight"), (W, W)
                ),
                C.TensorMap(f"{b}.mlp.experts.{e}.w_out.weight", (f"{x}.down_proj.weight",), (d,)),
            ]
        if cfg.n_shared_experts:
            S, s = W * cfg.n_shared_experts, f"{m}.shared_experts"
            maps += [
                C.TensorMap(f"{b}.mlp.shared.w_in.weight", (f"{s}.gate_proj.weight", f"{s}.up_proj.weight"), (S, S)),
                C.TensorMap(f"{b}.mlp.shared.w_out.weight", (f"{s}.down_proj.weight",), (d,)),
            ]
    return C.model_maps(cfg, maps)


def _split_experts(state: StateDict, cfg: ModelConfig, fam: str = FAM) -> StateDict:
    """Stacked expert tensors (transformers' in-memory layout, (out, in) per expert), if a checkpoint
    holds them, -> the per-expert names of the published checkpoints."""
    out = dict(state)
    W = cfg.expert_d_ff or cfg.d_ff
    for p, gate_up, down in C.pop_stacked_experts(out, cfg, "model.layers.{i}.mlp.experts", fam):
        for e in range(cfg.n_experts):
            out[f"{p}.{e}.gate_proj.weight"], out[f"{p}.{e}.up_proj.weight"] = gate_up[e][:W], gate_up[e][W:]
            out[f"{p}.{e}.down_proj.weight"] = down[e]
    return out


def to_lmlab_state(state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    return C.state_to_lmlab(_split_experts(state, cfg), cfg, tensor_maps(cfg), FAM)


def to_hf_state(state: StateDict, cfg: ModelConfig) -> StateDict:
    return {k: v.contiguous() for k, v in C.state_to_hf(state, cfg, tensor_maps(cfg)).items()}


# fmt: off
FAMILY = register(Family(model_type=FAM, hf_class=HF_CLASS, config_to_lmlab=config_to_lmlab,
                         state_to_lmlab=to_lmlab_state, config_to_hf=config_to_hf, state_to_hf=to_hf_state,
                         notes="DeepSeek-V2: multi-head latent attention, softmax-routed experts (greedy or "
                               "group-limited, scaled) plus shared experts, the first layers dense",
                         unread_notes=lambda hf: []))
# fmt: on
