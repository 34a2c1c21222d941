"""Phi-1 / Phi-1.5 / Phi-2 (Microsoft 2023; HF ``PhiForCausalLM``, transformers/models/phi/modeling_phi.py).

GPT-J-style parallel block off one LayerNorm, separate q/k/v projections with biases (GQA allowed), a
dense output and a plain GELU MLP with biases, partial RoPE with rotate-half pairs (``partial_rotary_factor``,
default 0.5), a final LayerNorm and an LM head with a bias.
Unsupported: ``qk_layernorm=True`` (HF's QK LayerNorm has a bias and is shared across heads; lmlab's QK
LayerNorm has no bias).
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop.families._table import converters, Row, layer_norm, linear, separate_qkv
from lmlab.interop.families._tools import (check_expressible, check_fields, expect, hf_act_name,
                                           hf_activation, hf_get, read_rope, rope_parameters)
from lmlab.interop.registry import Family, register

NAME = "phi"

HANDLED = frozenset({  # config.json fields this converter reads (besides RoPE and metadata)
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "resid_pdrop", "embd_pdrop", "attention_dropout", "hidden_act",
    "max_position_embeddings", "layer_norm_eps", "tie_word_embeddings", "qk_layernorm", "head_dim",
})


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    expect(NAME, hf, "qk_layernorm", (False,), False)
    d_model = hf_get(hf, "hidden_size", default=2048)
    n_heads = hf_get(hf, "num_attention_heads", default=32)
    head_dim = hf_get(hf, "head_dim", default=d_model // n_heads)
    return ModelConfig(
        vocab_size=hf_get(hf, "vocab_size", default=51200),
        context_length=hf_get(hf, "max_position_embeddings", default=2048),
        d_model=d_model,
        n_layers=hf_get(hf, "num_hidden_layers", default=24),
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        head_dim=head_dim,
        d_ff=hf_get(hf, "intermediate_size", default=8192),
        norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True,
        norm_eps=float(hf_get(hf, "layer_norm_eps", default=1e-5)),
        bias="all", lm_head_bias=True,
        activation=hf_activation(NAME, "hidden_act", hf_get(hf, "hidden_act", default="gelu_new")),
        parallel_block=True, parallel_shared_norm=True,
        position="rope", rope_style="half", **read_rope(NAME, hf, head_dim, default_fraction=0.5),
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", default=False)),
        embd_dropout=float(hf_get(hf, "embd_pdrop", default=0.0)),
        attn_dropout=float(hf_get(hf, "attention_dropout", default=0.0)),
        resid_dropout=float(hf_get(hf, "resid_pdrop", default=0.0)),
        init_std=float(hf_get(hf, "initializer_range", default=0.02)),
    )


ROWS = [  # HF name (under model.) <-> lmlab name; {i}: every layer
    Row("embed_tokens.weight", "embed.weight"),
    *layer_norm("layers.{i}.input_layernorm", "blocks.{i}.attn_norm"),
    *separate_qkv("layers.{i}.self_attn.{p}_proj", "blocks.{i}.attn.qkv", bias=True),
    *linear("layers.{i}.self_attn.dense", "blocks.{i}.attn.out", bias=True),
    *linear("layers.{i}.mlp.fc1", "blocks.{i}.mlp.w_in", bias=True),
    *linear("layers.{i}.mlp.fc2", "blocks.{i}.mlp.w_out", bias=True),
    *layer_norm("final_layernorm", "final_norm"),
    Row("lm_head.bias", "lm_head.bias", prefixed=False),
]


def config_to_hf(cfg: ModelConfig) -> dict:
    hf = {
        "model_type": NAME, "architectures": ["PhiForCausalLM"],
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.d_ff,
        "hidden_act": hf_act_name(NAME, cfg.activation, gated=False),
        "layer_norm_eps": cfg.norm_eps, "qk_layernorm": False,
        "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tie_embeddings,
        "embd_pdrop": cfg.embd_dropout, "attention_dropout": cfg.attn_dropout, "resid_pdrop": cfg.resid_dropout,
        "initializer_range": cfg.init_std,
    }
    if cfg.head_dim != cfg.d_model // cfg.n_heads:
        hf["head_dim"] = cfg.head_dim  # read by PhiAttention through getattr(config, "head_dim", ...)
    check_expressible(NAME, cfg, hf, config_to_lmlab)
    return hf


state_to_lmlab, state_to_hf = converters(NAME, ROWS, "model.")

FAMILY = register(Family(
    model_type=NAME, hf_class="PhiForCausalLM", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    notes="exact: parallel block off one LayerNorm, q/k/v with biases (GQA), partial rotate-half RoPE, "
          "LM-head bias. Unsupported: qk_layernorm=True (a biased QK LayerNorm shared across heads).",
))
