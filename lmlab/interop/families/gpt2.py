"""GPT-2 (Radford et al. 2019; HF ``GPT2LMHeadModel``, transformers/models/gpt2/modeling_gpt2.py).

Pre-norm LayerNorm blocks with biases everywhere, a plain GELU MLP, learned absolute positions, the LM
head tied to the token embedding by default. HF stores the linear layers as ``Conv1D`` whose weight is
(in, out), the transpose of ``nn.Linear``; ``c_attn`` fuses [q | k | v], each with its heads contiguous.
``scale_attn_weights=False`` (no 1/sqrt(head_dim)) is ``query_pre_attn_scalar=1``.
Unsupported: ``scale_attn_by_inverse_layer_idx`` (a per-layer scale), ``add_cross_attention``.
``reorder_and_upcast_attn`` only changes the precision of the eager path (fp32 logits): same function.
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop.families._table import converters, CONV1D, Row, layer_norm, linear
from lmlab.interop.families._tools import (
    check_expressible,
    check_fields,
    expect,
    hf_act_name,
    hf_activation,
    hf_get,
)
from lmlab.interop.registry import Family, UnsupportedError, register

NAME = "gpt2"

HANDLED = frozenset({  # config.json fields this converter reads (besides RoPE and metadata)
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "resid_pdrop",
    "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "tie_word_embeddings", "hidden_size", "max_position_embeddings",
    "num_hidden_layers", "num_attention_heads",
})


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    expect(NAME, hf, "scale_attn_by_inverse_layer_idx", (False,), False)
    expect(NAME, hf, "add_cross_attention", (False,), False)
    d_model = hf_get(hf, "n_embd", "hidden_size", default=768)
    scaled = expect(NAME, hf, "scale_attn_weights", (True, False), True)
    return ModelConfig(
        vocab_size=hf_get(hf, "vocab_size", default=50257),
        context_length=hf_get(hf, "n_positions", "max_position_embeddings", default=1024),
        d_model=d_model,
        n_layers=hf_get(hf, "n_layer", "num_hidden_layers", default=12),
        n_heads=hf_get(hf, "n_head", "num_attention_heads", default=12),
        d_ff=hf_get(hf, "n_inner", default=4 * d_model),
        norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True,
        norm_eps=float(hf_get(hf, "layer_norm_epsilon", default=1e-5)),
        bias="all", lm_head_bias=False,
        activation=hf_activation(NAME, "activation_function", hf_get(hf, "activation_function", default="gelu_new")),
        position="learned",
        query_pre_attn_scalar=None if scaled else 1.0,
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", default=True)),
        embd_dropout=float(hf_get(hf, "embd_pdrop", default=0.1)),
        attn_dropout=float(hf_get(hf, "attn_pdrop", default=0.1)),
        resid_dropout=float(hf_get(hf, "resid_pdrop", default=0.1)),
        init_std=float(hf_get(hf, "initializer_range", default=0.02)),
    )


ROWS = [  # HF name (under transformer.) <-> lmlab name; {i}: every layer
    Row("wte.weight", "embed.weight"),
    Row("wpe.weight", "abs_pos.weight"),
    *layer_norm("h.{i}.ln_1", "blocks.{i}.attn_norm"),
    *layer_norm("h.{i}.ln_2", "blocks.{i}.mlp_norm"),
    *linear("h.{i}.attn.c_attn", "blocks.{i}.attn.qkv", bias=True, transform=CONV1D),
    *linear("h.{i}.attn.c_proj", "blocks.{i}.attn.out", bias=True, transform=CONV1D),
    *linear("h.{i}.mlp.c_fc", "blocks.{i}.mlp.w_in", bias=True, transform=CONV1D),
    *linear("h.{i}.mlp.c_proj", "blocks.{i}.mlp.w_out", bias=True, transform=CONV1D),
    *layer_norm("ln_f", "final_norm"),
]


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.query_pre_attn_scalar is not None and cfg.query_pre_attn_scalar not in (1.0, float(cfg.head_dim)):
        raise UnsupportedError(f"{NAME}: query_pre_attn_scalar={cfg.query_pre_attn_scalar!r} cannot be exported; "
                               f"GPT-2 scales attention logits by 1/sqrt(head_dim) or not at all (1.0)")
    hf = {
        "model_type": NAME, "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size, "n_positions": cfg.context_length, "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ff,
        "activation_function": hf_act_name(NAME, cfg.activation, gated=False),
        "layer_norm_epsilon": cfg.norm_eps, "scale_attn_weights": cfg.query_pre_attn_scalar != 1.0,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "embd_pdrop": cfg.embd_dropout, "attn_pdrop": cfg.attn_dropout, "resid_pdrop": cfg.resid_dropout,
        "initializer_range": cfg.init_std,
    }
    check_expressible(NAME, cfg, hf, config_to_lmlab)
    return hf


state_to_lmlab, state_to_hf = converters(NAME, ROWS, "transformer.", ignore=(r"\.attn\.(masked_)?bias$",))

FAMILY = register(Family(
    model_type=NAME, hf_class="GPT2LMHeadModel", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    notes="exact: pre-norm LayerNorm, plain GELU MLP, learned positions, Conv1D weights transposed; "
          "scale_attn_weights=False as query_pre_attn_scalar=1. Unsupported: scale_attn_by_inverse_layer_idx, "
          "add_cross_attention.",
))
