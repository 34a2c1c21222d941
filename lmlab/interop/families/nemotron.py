"""Nemotron-4 / Minitron (NVIDIA 2024; HF ``NemotronForCausalLM``, transformers/models/nemotron).

Sequential pre-norm blocks with ``NemotronLayerNorm1P``: LayerNorm (with bias) whose weight is stored as an
offset from one, (1 + w) (``norm_type='layernorm1p'``, the weights copied unchanged); a plain MLP of
squared ReLU (``relu2``) by default; GQA with a free ``head_dim``; partial RoPE with rotate-half pairs
(``partial_rotary_factor``, default 0.5); no biases by default; an untied LM head.
Biases: ``attention_bias`` covers q, k, v and o; ``mlp_bias`` the MLP. Every combination maps to
lmlab's ``bias`` (attention biases alone: ``bias="attention"``).
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop.families._table import converters, Row, layer_norm, linear, separate_qkv
from lmlab.interop.families._tools import (check_expressible, check_fields, expect, hf_act_name,
                                           hf_activation, hf_get, read_rope, rope_parameters)
from lmlab.interop.registry import Family, UnsupportedError, register

NAME = "nemotron"
_BIAS = {(False, False): "none", (True, True): "all", (False, True): "mlp", (True, False): "attention"}

HANDLED = frozenset({  # config.json fields this converter reads (besides RoPE and metadata)
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "norm_eps", "tie_word_embeddings",
    "attention_bias", "attention_dropout", "mlp_bias",
})


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    d_model = hf_get(hf, "hidden_size", default=6144)
    n_heads = hf_get(hf, "num_attention_heads", default=48)
    head_dim = hf_get(hf, "head_dim", default=d_model // n_heads)
    attn_bias = expect(NAME, hf, "attention_bias", (True, False), False)
    mlp_bias = expect(NAME, hf, "mlp_bias", (True, False), False)
    return ModelConfig(
        vocab_size=hf_get(hf, "vocab_size", default=256000),
        context_length=hf_get(hf, "max_position_embeddings", default=4096),
        d_model=d_model,
        n_layers=hf_get(hf, "num_hidden_layers", default=32),
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        head_dim=head_dim,
        d_ff=hf_get(hf, "intermediate_size", default=24576),
        norm_type="layernorm1p", norm_position="pre", norm_bias=True, final_norm=True,
        norm_eps=float(hf_get(hf, "norm_eps", default=1e-5)),
        bias=_BIAS[(attn_bias, mlp_bias)], lm_head_bias=False,
        activation=hf_activation(NAME, "hidden_act", hf_get(hf, "hidden_act", default="relu2")),
        position="rope", rope_style="half", **read_rope(NAME, hf, head_dim, default_fraction=0.5),
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", default=False)),
        attn_dropout=float(hf_get(hf, "attention_dropout", default=0.0)),
        init_std=float(hf_get(hf, "initializer_range", default=0.0134)),
    )


def _attn_bias(cfg: ModelConfig) -> bool:
    return cfg.bias in ("all", "attention")


def _mlp_bias(cfg: ModelConfig) -> bool:
    return cfg.bias in ("all", "mlp")


ROWS = [  # HF name (under model.) <-> lmlab name; {i}: every layer
    Row("embed_tokens.weight", "embed.weight"),
    *layer_norm("layers.{i}.input_layernorm", "blocks.{i}.attn_norm"),
    *separate_qkv("layers.{i}.self_attn.{p}_proj", "blocks.{i}.attn.qkv", bias=_attn_bias),
    *linear("layers.{i}.self_attn.o_proj", "blocks.{i}.attn.out", bias=_attn_bias),
    *layer_norm("layers.{i}.post_attention_layernorm", "blocks.{i}.mlp_norm"),
    *linear("layers.{i}.mlp.up_proj", "blocks.{i}.mlp.w_in", bias=_mlp_bias),
    *linear("layers.{i}.mlp.down_proj", "blocks.{i}.mlp.w_out", bias=_mlp_bias),
    *layer_norm("norm", "final_norm"),
]


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.bias not in _BIAS.values():
        raise UnsupportedError(f"{NAME}: bias={cfg.bias!r} cannot be exported; Nemotron has attention biases "
                               f"(q, k, v and o) and MLP biases: bias 'none', 'all' or 'mlp'")
    hf = {
        "model_type": NAME,
        "architectures": ["NemotronForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.context_length,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.d_ff,
        "hidden_act": hf_act_name(NAME, cfg.activation, gated=False, tanh_name="gelu_pytorch_tanh"),
        "norm_eps": cfg.norm_eps,
        "attention_bias": cfg.bias in ("all", "attention"),
        "mlp_bias": cfg.bias in ("all", "mlp"),
        "rope_parameters": rope_parameters(cfg),
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": cfg.attn_dropout,
        "initializer_range": cfg.init_std,
    }
    check_expressible(NAME, cfg, hf, config_to_lmlab)
    return hf


state_to_lmlab, state_to_hf = converters(NAME, ROWS, "model.")

FAMILY = register(Family(
    model_type=NAME, hf_class="NemotronForCausalLM", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    notes="exact: LayerNorm1P as norm_type='layernorm1p' (weights unchanged), relu2 MLP, GQA with free "
          "head_dim, partial rotate-half RoPE. Unsupported: attention_bias=True with mlp_bias=False.",
))
