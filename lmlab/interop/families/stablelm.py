"""StableLM 2 / StableLM-3B-4E1T (Stability AI 2023-24; HF ``StableLmForCausalLM``, transformers/models/stablelm).

LayerNorm (with bias) pre-norm blocks, sequential or, with ``use_parallel_residual``, parallel off one
LayerNorm; GQA with q/k/v biases when ``use_qkv_bias`` (bias='qkv'; the output projection and the MLP have
none); a gated MLP act(gate) * up (SwiGLU with ``hidden_act='silu'``); partial RoPE with rotate-half pairs
(``partial_rotary_factor``, default 0.25); an untied LM head. ``qk_layernorm`` normalises q and k with a
separate bias-free LayerNorm per head (``qk_norm='layernorm'``, ``qk_norm_scope='head_untied'``); the
per-head weights are stacked into (n_heads, head_dim) / (n_kv_heads, head_dim).
"""

from __future__ import annotations

import torch

from lmlab.config import ModelConfig
from lmlab.interop.families._tools import (put_output, cat_qkv, check_expressible, check_fields, expect, hf_act_name,
                                           hf_activation, hf_get, lm_key, put, read_rope, rope_parameters, split_qkv,
                                           StateReader)
from lmlab.interop.registry import Family, StateDict, UnsupportedError, register

NAME = "stablelm"

HANDLED = frozenset({  # config.json fields this converter reads (besides RoPE and metadata)
    "vocab_size", "intermediate_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "layer_norm_eps", "tie_word_embeddings",
    "use_qkv_bias", "qk_layernorm", "use_parallel_residual", "hidden_dropout", "attention_dropout",
})


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    d_model = hf_get(hf, "hidden_size", default=2560)
    n_heads = hf_get(hf, "num_attention_heads", default=32)
    head_dim = d_model // n_heads
    qkv_bias = expect(NAME, hf, "use_qkv_bias", (True, False), False)
    qk_norm = expect(NAME, hf, "qk_layernorm", (True, False), False)
    parallel = expect(NAME, hf, "use_parallel_residual", (True, False), False)
    return ModelConfig(
        vocab_size=hf_get(hf, "vocab_size", default=50304),
        context_length=hf_get(hf, "max_position_embeddings", default=4096),
        d_model=d_model,
        n_layers=hf_get(hf, "num_hidden_layers", default=32),
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=32),
        d_ff=hf_get(hf, "intermediate_size", default=6912),
        norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True,
        norm_eps=float(hf_get(hf, "layer_norm_eps", default=1e-5)),
        bias="qkv" if qkv_bias else "none", lm_head_bias=False,
        activation=hf_activation(NAME, "hidden_act", hf_get(hf, "hidden_act", default="silu"), gated=True),
        parallel_block=parallel, parallel_shared_norm=True,
        qk_norm="layernorm" if qk_norm else "none", qk_norm_scope="head_untied" if qk_norm else "head",
        position="rope", rope_style="half", **read_rope(NAME, hf, head_dim, default_fraction=0.25),
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", default=False)),
        attn_dropout=float(hf_get(hf, "attention_dropout", default=0.0)),
        resid_dropout=float(hf_get(hf, "hidden_dropout", default=0.0)),
        init_std=float(hf_get(hf, "initializer_range", default=0.02)),
    )


def state_to_lmlab(hf_state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    r = StateReader(NAME, hf_state, prefixes=("model.",))
    out: StateDict = {"embed.weight": r.take("embed_tokens.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        norms = _norms(cfg)
        for hf_norm, lm_norm in norms:
            put(out, b + lm_norm + ".weight", r.take(h + hf_norm + ".weight"))
            put(out, b + lm_norm + ".bias", r.take(h + hf_norm + ".bias"))
        put(out, b + "attn.qkv.weight", cat_qkv(*(r.take(h + f"self_attn.{p}_proj.weight") for p in "qkv")))
        if cfg.bias == "qkv":
            put(out, b + "attn.qkv.bias", cat_qkv(*(r.take(h + f"self_attn.{p}_proj.bias") for p in "qkv")))
        if cfg.qk_norm != "none":
            for p, heads in (("q", cfg.n_heads), ("k", cfg.n_kv_heads)):
                stacked = torch.stack([r.take(h + f"self_attn.{p}_layernorm.norms.{j}.weight") for j in range(heads)])
                put(out, b + f"attn.{p}_norm.weight", stacked)
        put(out, b + "attn.out.weight", r.take(h + "self_attn.o_proj.weight"))
        put(
            out,
            b + "mlp.w_in.weight",
            torch.cat([r.take(h + "mlp.gate_proj.weight"), r.take(h + "mlp.up_proj.weight")]),
        )
        put(out, b + "mlp.w_out.weight", r.take(h + "mlp.down_proj.weight"))
    put(out, "final_norm.weight", r.take("norm.weight"))
    put(out, "final_norm.bias", r.take("norm.bias"))
    if cfg.tie_embeddings:
        r.tied_head("lm_head.weight", out["embed.weight"])
    else:
        put(out, "lm_head.weight", r.take("lm_head.weight"))
    return r.finish(out, cfg)


def _norms(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(HF, lmlab) names of a layer's LayerNorms: one before attention, one before the MLP unless parallel."""
    return [("input_layernorm", "attn_norm")] + (
        [] if cfg.parallel_block else [("post_attention_layernorm", "mlp_norm")]
    )


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.qk_norm != "none" and (cfg.qk_norm, cfg.qk_norm_scope) != ("layernorm", "head_untied"):
        raise UnsupportedError(f"{NAME}: qk_norm={cfg.qk_norm!r} with qk_norm_scope={cfg.qk_norm_scope!r} cannot be "
                               f"exported; StableLM's qk_layernorm is a bias-free LayerNorm per head "
                               f"(qk_norm='layernorm', qk_norm_scope='head_untied')")
    hf = {
        "model_type": NAME, "architectures": ["StableLmForCausalLM"],
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.d_ff,
        "hidden_act": hf_act_name(NAME, cfg.activation, gated=True, tanh_name="gelu_pytorch_tanh"),
        "layer_norm_eps": cfg.norm_eps, "use_qkv_bias": cfg.bias == "qkv", "qk_layernorm": cfg.qk_norm != "none",
        "use_parallel_residual": cfg.parallel_block,
        "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": cfg.attn_dropout, "hidden_dropout": cfg.resid_dropout,
        "initializer_range": cfg.init_std,
    }
    check_expressible(NAME, cfg, hf, config_to_lmlab)
    return hf


def state_to_hf(state: StateDict, cfg: ModelConfig) -> StateDict:
    out: StateDict = {"model.embed_tokens.weight": lm_key(state, "embed.weight")}
    for i in range(cfg.n_layers):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        norms = _norms(cfg)
        for hf_norm, lm_norm in norms:
            put(out, h + hf_norm + ".weight", lm_key(state, b + lm_norm + ".weight"))
            put(out, h + hf_norm + ".bias", lm_key(state, b + lm_norm + ".bias"))
        for p, w in zip("qkv", split_qkv(lm_key(state, b + "attn.qkv.weight"), cfg)):
            put(out, h + f"self_attn.{p}_proj.weight", w)
        if cfg.bias == "qkv":
            for p, w in zip("qkv", split_qkv(lm_key(state, b + "attn.qkv.bias"), cfg)):
                put(out, h + f"self_attn.{p}_proj.bias", w)
        if cfg.qk_norm != "none":
            for p in "qk":
                for j, w in enumerate(lm_key(state, b + f"attn.{p}_norm.weight")):
                    put(out, h + f"self_attn.{p}_layernorm.norms.{j}.weight", w)
        put(out, h + "self_attn.o_proj.weight", lm_key(state, b + "attn.out.weight"))
        gate, up = lm_key(state, b + "mlp.w_in.weight").split(cfg.d_ff, dim=0)
        put(out, h + "mlp.gate_proj.weight", gate)
        put(out, h + "mlp.up_proj.weight", up)
        put(out, h + "mlp.down_proj.weight", lm_key(state, b + "mlp.w_out.weight"))
    put_output(out, state, cfg, "model.norm")
    return out


FAMILY = register(Family(
    model_type=NAME, hf_class="StableLmForCausalLM", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    notes="exact: sequential or parallel (one LayerNorm) blocks, q/k/v biases, per-head untied QK LayerNorm "
          "(qk_norm_scope='head_untied'), SwiGLU, partial rotate-half RoPE, GQA.",
))
