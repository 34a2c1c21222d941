"""StableLM 2 / StableLM-3B-4E1T (Stability AI 2023-24; HF ``StableLmForCausalLM``, transformers/models/stablelm).

LayerNorm (with bias) pre-norm blocks, sequential or, with ``use_parallel_residual``, parallel off one
LayerNorm; GQA with q/k/v biases when ``use_qkv_bias`` (bias='qkv'; the output projection and the MLP have
none); a gated MLP act(gate) * up (SwiGLU with ``hidden_act='silu'``); partial RoPE with rotate-half pairs
(``partial_rotary_factor``, default 0.25); an untied LM head. ``qk_layernorm`` normalises q and k with a
separate bias-free LayerNorm per head (``qk_norm='layernorm'``, ``qk_norm_scope='head_untied'``); the
per-head weights are stacked into (n_heads, head_dim) / (n_kv_heads, head_dim).
"""

from __future__ import annotations


from lmlab.config import ModelConfig
from lmlab.interop.families._table import converters, Row, layer_norm, linear, separate_qkv
from lmlab.interop.families._tools import (check_expressible, check_fields, expect, hf_act_name,
                                           hf_activation, hf_get, read_rope, rope_parameters)
from lmlab.interop.registry import Family, UnsupportedError, register

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


def _qk_norm(cfg: ModelConfig) -> bool:
    return cfg.qk_norm != "none"


ROWS = [  # HF name (under model.) <-> lmlab name; {i}: every layer, {j}: every head
    Row("embed_tokens.weight", "embed.weight"),
    *layer_norm("layers.{i}.input_layernorm", "blocks.{i}.attn_norm"),
    *separate_qkv("layers.{i}.self_attn.{p}_proj", "blocks.{i}.attn.qkv", bias=lambda cfg: cfg.bias == "qkv"),
    Row("layers.{i}.self_attn.q_layernorm.norms.{j}.weight", "blocks.{i}.attn.q_norm.weight", when=_qk_norm,
        stack=lambda cfg: cfg.n_heads),
    Row("layers.{i}.self_attn.k_layernorm.norms.{j}.weight", "blocks.{i}.attn.k_norm.weight", when=_qk_norm,
        stack=lambda cfg: cfg.n_kv_heads),
    *linear("layers.{i}.self_attn.o_proj", "blocks.{i}.attn.out"),
    # one LayerNorm before the MLP unless the block is parallel (then attention's feeds both)
    *layer_norm("layers.{i}.post_attention_layernorm", "blocks.{i}.mlp_norm", when=lambda cfg: not cfg.parallel_block),
    Row(("layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.up_proj.weight"), "blocks.{i}.mlp.w_in.weight",
        sizes=lambda cfg: [cfg.d_ff, cfg.d_ff]),
    *linear("layers.{i}.mlp.down_proj", "blocks.{i}.mlp.w_out"),
    *layer_norm("norm", "final_norm"),
]


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


state_to_lmlab, state_to_hf = converters(NAME, ROWS, "model.")

FAMILY = register(Family(
    model_type=NAME, hf_class="StableLmForCausalLM", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    notes="exact: sequential or parallel (one LayerNorm) blocks, q/k/v biases, per-head untied QK LayerNorm "
          "(qk_norm_scope='head_untied'), SwiGLU, partial rotate-half RoPE, GQA.",
))
