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
from lmlab.interop.families._config_table import STANDARD, ConfigTable
from lmlab.interop.families._table import Row, converters, layer_norm, linear, register_family, separate_qkv
from lmlab.interop.families._tools import check_fields, expect, read_rope, rope_parameters
from lmlab.interop.registry import UnsupportedError

NAME = "nemotron"
_BIAS = {(False, False): "none", (True, True): "all", (False, True): "mlp", (True, False): "attention"}

# fmt: off
CONFIG = ConfigTable(NAME, hf_class="NemotronForCausalLM", defaults=dict(  # NemotronConfig's defaults
    vocab_size=256000, context_length=4096, d_model=6144, n_layers=32, n_heads=48, n_kv_heads=lambda v: v["n_heads"],
    head_dim=lambda v: v["d_model"] // v["n_heads"], d_ff=24576, norm_eps=1e-5, activation="relu2",
    tie_embeddings=False, attn_dropout=0.0, init_std=0.0134),
    names={**STANDARD, "norm_eps": "norm_eps"}, tanh_name="gelu_pytorch_tanh",
    fixed=dict(norm_type="layernorm1p", norm_position="pre", norm_bias=True, final_norm=True, lm_head_bias=False,
               position="rope", rope_style="half"),
)
# fmt: on
HANDLED = CONFIG.keys() | {"attention_bias", "mlp_bias"}


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    fields = CONFIG.read(hf)
    attn_bias = expect(NAME, hf, "attention_bias", (True, False), False)
    mlp_bias = expect(NAME, hf, "mlp_bias", (True, False), False)
    return ModelConfig(
        **fields, bias=_BIAS[(attn_bias, mlp_bias)], **read_rope(NAME, hf, fields["head_dim"], default_fraction=0.5)
    )


def _attn_bias(cfg: ModelConfig) -> bool:
    return cfg.bias in ("all", "attention")


def _mlp_bias(cfg: ModelConfig) -> bool:
    return cfg.bias in ("all", "mlp")


# fmt: off
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
# fmt: on


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.bias not in _BIAS.values():
        raise UnsupportedError(
            f"{NAME}: bias={cfg.bias!r} cannot be exported; Nemotron has attention biases "
            f"(q, k, v and o) and MLP biases: bias 'none', 'all' or 'mlp'"
        )
    return {
        **CONFIG.write(cfg),
        "attention_bias": cfg.bias in ("all", "attention"),
        "mlp_bias": cfg.bias in ("all", "mlp"),
        "rope_parameters": rope_parameters(cfg),
    }


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf, converters(NAME, ROWS, "model."),
    notes="exact: LayerNorm1P as norm_type='layernorm1p' (weights unchanged), relu2 MLP, GQA with free "
          "head_dim, partial rotate-half RoPE. Unsupported: attention_bias=True with mlp_bias=False.",
)
# fmt: on
