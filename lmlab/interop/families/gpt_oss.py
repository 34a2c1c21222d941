"""gpt-oss (transformers ``GptOssForCausalLM``, model_type 'gpt_oss'; OpenAI 2025, "gpt-oss-120b &
gpt-oss-20b Model Card", arXiv 2508.10925).

Read off ``GptOssConfig`` / ``modeling_gpt_oss.py`` (transformers 5): pre-norm RMSNorm blocks; GQA with
biases on q, k, v and o, head_dim given, a learned sink logit per head (``self_attn.sinks``: lmlab
``attn_sinks``), sliding-window (``sliding_window``) and full layers as ``layer_types`` says (alternating in
the releases); YaRN RoPE (factor 32 from 4,096 positions, ``truncate`` false) on the two halves of each head;
every FFN a mixture of ``num_local_experts`` experts: the router (``mlp.router``, with a bias: lmlab
``router_bias``) keeps the top ``num_experts_per_tok`` logits and takes their softmax (= the softmax over all
experts, renormalised over the kept ones: lmlab ``router_score='softmax'``, ``router_renormalize``); each
expert (with biases) computes gpt-oss's clamped SwiGLU (lmlab ``activation='swiglu_clamped'`` with
``swiglu_alpha``, ``swiglu_limit``). Checkpoints (as transformers saves the bf16 weights) stack the experts:
``mlp.experts.gate_up_proj`` (experts, d_model, 2 x width) with gate and up columns interleaved (gate the even
ones), ``gate_up_proj_bias``, ``down_proj`` (experts, width, d_model) and ``down_proj_bias``. The released
checkpoints store the experts in MXFP4 (``_blocks`` / ``_scales``), which this converter does not read:
dequantise with transformers first (``Mxfp4Config(dequantize=True)``) and save.
"""

from __future__ import annotations

import torch

from lmlab.config import ModelConfig
from lmlab.interop import common as C
from lmlab.interop.registry import Family, StateDict, UnsupportedError, register
from lmlab.interop.roundtrip import verify_roundtrip

FAM, HF_CLASS = "gpt_oss", "GptOssForCausalLM"
# fmt: off
DEFAULTS = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
                num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128,
                num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
                tie_word_embeddings=False, hidden_act="silu", attention_bias=True, attention_dropout=0.0,
                router_aux_loss_coef=0.9, output_router_logits=False, swiglu_alpha=1.702, swiglu_limit=7.0,
                layer_types=None)
# fmt: on
HANDLED = set(DEFAULTS) | {"rope_parameters", "rope_scaling", "rope_theta"}


def config_to_lmlab(hf: dict) -> ModelConfig:
    C.check_fields(hf, FAM, HANDLED)
    g = lambda k: C.get(hf, k, DEFAULTS)  # noqa: E731
    if g("hidden_act") != "silu":
        raise C.unsupported(
            FAM, "hidden_act", g("hidden_act"), "'silu' (GptOssExperts ignores it: its SwiGLU is fixed)"
        )
    if not g("attention_bias"):
        raise C.unsupported(FAM, "attention_bias", False, "true (the releases' layout; lmlab's bias='all')")
    n = g("num_hidden_layers")
    types = g("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if len(types) != n:
        raise C.unsupported(FAM, "layer_types", types, f"one entry per layer ({n})")
    pattern = C.pattern_from_types(types, FAM)
    theta, scaling, partial = C.read_rope(hf, FAM, default_theta=150000.0)
    if partial != 1.0:
        raise C.unsupported(FAM, "partial_rotary_factor", partial, "1.0")
    width = g("intermediate_size")
    kw = dict(
        **C.read_sizes(g, n_layers=n, d_ff=width),
        expert_d_ff=width,
        norm_type="rmsnorm",
        norm_eps=float(g("rms_norm_eps")),
        norm_position="pre",
        bias="all",
        activation="swiglu_clamped",
        swiglu_alpha=float(g("swiglu_alpha")),
        swiglu_limit=float(g("swiglu_limit")),
        position="rope",
        rope_style="half",
        rope_theta=theta,
        rope_scaling=scaling,
        attn_sinks=True,
        n_experts=g("num_local_experts"),
        experts_per_token=g("num_experts_per_tok"),
        router_score="softmax",
        router_renormalize=True,
        router_bias=True,
        moe_aux_loss=float(g("router_aux_loss_coef")) if g("output_router_logits") else 0.0,
    )
    if pattern is not None:
        kw.update(sliding_window=int(g("sliding_window")), layer_pattern=None if pattern == "L" else pattern)
    return C.lmlab_config(FAM, kw)


def config_to_hf(cfg: ModelConfig) -> dict:
    """GptOssConfig for ``cfg``; UnsupportedError naming what gpt-oss cannot represent."""
    types = C.types_from_cfg(cfg)
    hf = {
        **C.hf_sizes(FAM, HF_CLASS, cfg, intermediate_size=cfg.expert_d_ff or cfg.d_ff),
        "head_dim": cfg.head_dim,
        "num_local_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.experts_per_token,
        "sliding_window": cfg.sliding_window,
        "layer_types": types,
        "rms_norm_eps": float(cfg.norm_eps),
        "hidden_act": "silu",
        "attention_bias": True,
        "output_router_logits": cfg.moe_aux_loss > 0,
        "router_aux_loss_coef": cfg.moe_aux_loss or DEFAULTS["router_aux_loss_coef"],
        "swiglu_alpha": float(cfg.swiglu_alpha),
        "swiglu_limit": float(cfg.swiglu_limit),
        "rope_parameters": C.rope_to_hf(cfg.rope_theta, cfg.rope_scaling, cfg.head_dim),
    }
    if cfg.d_ff != (cfg.expert_d_ff or cfg.d_ff):
        raise C.unsupported(FAM, "d_ff", cfg.d_ff, f"the experts' width {cfg.expert_d_ff} (no dense FFN)")
    return verify_roundtrip(FAM, cfg, hf, config_to_lmlab)


def tensor_maps(cfg: ModelConfig) -> list[C.TensorMap]:
    layers = [
        m
        for m in C.llama_layer_maps(cfg, {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"})
        if ".mlp." not in m.lmlab
    ]
    F = cfg.expert_d_ff or cfg.d_ff
    for i in range(cfg.n_layers):
        p, b = f"model.layers.{i}", f"blocks.{i}"
        layers.append(C.TensorMap(f"{b}.attn.sinks", (f"{p}.self_attn.sinks",), (cfg.n_heads,)))
        for s in ("weight", "bias"):
            layers.append(C.TensorMap(f"{b}.mlp.router.{s}", (f"{p}.mlp.router.{s}",), (cfg.n_experts,)))
            for e in range(cfg.n_experts):  # per-expert names of the unstacked tensors (see _unstack)
                q, x = f"{p}.mlp.experts.{e}", f"{b}.mlp.experts.{e}"
                layers.append(C.TensorMap(f"{x}.w_in.{s}", (f"{q}.gate.{s}", f"{q}.up.{s}"), (F, F)))
                layers.append(C.TensorMap(f"{x}.w_out.{s}", (f"{q}.down.{s}",), (cfg.d_model,)))
    return C.model_maps(cfg, layers)


def _unstack(state: StateDict, cfg: ModelConfig) -> StateDict:
    """The stacked, interleaved expert tensors -> one (out, in) matrix and bias per expert and projection."""
    out = dict(state)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}.mlp.experts"
        if f"{p}.gate_up_proj" not in out:
            if f"{p}.gate_up_proj_blocks" in out:
                raise UnsupportedError(
                    f"{FAM}: {p}.gate_up_proj is stored in MXFP4 (_blocks/_scales); load it with "
                    f"transformers (Mxfp4Config(dequantize=True)), save it, and import that"
                )
            continue
        gu, gub = out.pop(f"{p}.gate_up_proj"), out.pop(f"{p}.gate_up_proj_bias")
        down, downb = out.pop(f"{p}.down_proj"), out.pop(f"{p}.down_proj_bias")
        if gu.shape[0] != cfg.n_experts:
            raise UnsupportedError(f"{FAM}: {p}.gate_up_proj holds {gu.shape[0]} experts, the config {cfg.n_experts}")
        for e in range(cfg.n_experts):
            q = f"{p}.{e}"
            out[f"{q}.gate.weight"], out[f"{q}.up.weight"] = gu[e][:, ::2].t(), gu[e][:, 1::2].t()
            out[f"{q}.gate.bias"], out[f"{q}.up.bias"] = gub[e][::2], gub[e][1::2]
            out[f"{q}.down.weight"], out[f"{q}.down.bias"] = down[e].t(), downb[e]
    return out


def _stack(state: StateDict, cfg: ModelConfig) -> StateDict:
    """The inverse of :func:`_unstack`: transformers' stacked, interleaved layout."""
    out = dict(state)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}.mlp.experts"
        take = lambda e, n: out.pop(f"{p}.{e}.{n}")  # noqa: E731
        gu, gub, down, downb = [], [], [], []
        for e in range(cfg.n_experts):
            gate, up = take(e, "gate.weight").t(), take(e, "up.weight").t()
            gu.append(torch.stack([gate, up], dim=-1).reshape(gate.shape[0], -1))  # columns g0 u0 g1 u1 ...
            gub.append(torch.stack([take(e, "gate.bias"), take(e, "up.bias")], dim=-1).reshape(-1))
            down.append(take(e, "down.weight").t())
            downb.append(take(e, "down.bias"))
        out[f"{p}.gate_up_proj"], out[f"{p}.gate_up_proj_bias"] = torch.stack(gu), torch.stack(gub)
        out[f"{p}.down_proj"], out[f"{p}.down_proj_bias"] = torch.stack(down), torch.stack(downb)
    return {k: v.contiguous() for k, v in out.items()}


to_lmlab_state, to_hf_state = C.mapped_states(FAM, tensor_maps, _unstack, _stack)


# fmt: off
FAMILY = register(Family(model_type=FAM, hf_class=HF_CLASS, config_to_lmlab=config_to_lmlab,
                         state_to_lmlab=to_lmlab_state, config_to_hf=config_to_hf, state_to_hf=to_hf_state,
                         notes="gpt-oss: GQA with biases and sinks, sliding/full layers, YaRN, every FFN a "
                               "mixture of clamped-SwiGLU experts with biases (router with a bias, softmax "
                               "over the top-k)",
                         unread_notes=lambda hf: []))
# fmt: on
