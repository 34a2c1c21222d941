"""Phi-1 / Phi-1.5 / Phi-2 (Microsoft 2023; HF ``PhiForCausalLM``, transformers/models/phi/modeling_phi.py).

GPT-J-style parallel block off one LayerNorm, separate q/k/v projections with biases (GQA allowed), a
dense output and a plain GELU MLP with biases, partial RoPE with rotate-half pairs (``partial_rotary_factor``,
default 0.5), a final LayerNorm and an LM head with a bias.
Unsupported: ``qk_layernorm=True`` (HF's QK LayerNorm has a bias and is shared across heads; lmlab's QK
LayerNorm has no bias).
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop.families._config_table import STANDARD, ConfigTable
from lmlab.interop.families._table import Row, converters, layer_norm, linear, register_family, separate_qkv
from lmlab.interop.families._tools import check_fields, expect, read_rope, rope_parameters

NAME = "phi"

# fmt: off
CONFIG = ConfigTable(NAME, hf_class="PhiForCausalLM", defaults=dict(  # PhiConfig's defaults
    vocab_size=51200, context_length=2048, d_model=2048, n_layers=24, n_heads=32,
    n_kv_heads=lambda v: v["n_heads"], head_dim=lambda v: v["d_model"] // v["n_heads"], d_ff=8192, norm_eps=1e-5,
    activation="gelu_new", tie_embeddings=False, embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0,
    init_std=0.02), names={**STANDARD, "resid_dropout": "resid_pdrop"},
    optional=("head_dim",),  # head_dim: read by PhiAttention through getattr(config, "head_dim", ...)
    fixed=dict(norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True, bias="all",
               lm_head_bias=True, parallel_block=True, parallel_shared_norm=True, position="rope", rope_style="half"),
)
# fmt: on
HANDLED = CONFIG.keys() | {"qk_layernorm"}


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    expect(NAME, hf, "qk_layernorm", (False,), False)
    fields = CONFIG.read(hf)
    return ModelConfig(**fields, **read_rope(NAME, hf, fields["head_dim"], default_fraction=0.5))


# fmt: off
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
# fmt: on


def config_to_hf(cfg: ModelConfig) -> dict:
    return {
        **CONFIG.write(cfg),
        "qk_layernorm": False,
        "rope_parameters": rope_parameters(cfg),
    }


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf, converters(NAME, ROWS, "model."),
    notes="exact: parallel block off one LayerNorm, q/k/v with biases (GQA), partial rotate-half RoPE, "
          "LM-head bias. Unsupported: qk_layernorm=True (a biased QK LayerNorm shared across heads).",
)
# fmt: on
