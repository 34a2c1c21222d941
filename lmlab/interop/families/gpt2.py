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
from lmlab.interop.families._config_table import GPT2_NAMES, ConfigTable
from lmlab.interop.families._table import CONV1D, Row, converters, layer_norm, linear, register_family
from lmlab.interop.families._tools import check_fields, expect
from lmlab.interop.registry import UnsupportedError

NAME = "gpt2"

# fmt: off
CONFIG = ConfigTable(NAME, hf_class="GPT2LMHeadModel", defaults=dict(  # GPT2Config's defaults
    vocab_size=50257, context_length=1024, d_model=768, n_layers=12, n_heads=12, d_ff=lambda v: 4 * v["d_model"],
    norm_eps=1e-5, activation="gelu_new", tie_embeddings=True, embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1,
    init_std=0.02), names=GPT2_NAMES,
    fixed=dict(norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True, bias="all",
               lm_head_bias=False, position="learned"),
)
# fmt: on
HANDLED = CONFIG.keys() | {"scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    expect(NAME, hf, "scale_attn_by_inverse_layer_idx", (False,), False)
    expect(NAME, hf, "add_cross_attention", (False,), False)
    scaled = expect(NAME, hf, "scale_attn_weights", (True, False), True)
    return ModelConfig(**CONFIG.read(hf), query_pre_attn_scalar=None if scaled else 1.0)


# fmt: off
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
# fmt: on


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.query_pre_attn_scalar is not None and cfg.query_pre_attn_scalar not in (1.0, float(cfg.head_dim)):
        raise UnsupportedError(
            f"{NAME}: query_pre_attn_scalar={cfg.query_pre_attn_scalar!r} cannot be exported; "
            f"GPT-2 scales attention logits by 1/sqrt(head_dim) or not at all (1.0)"
        )
    return {
        **CONFIG.write(cfg),
        "scale_attn_weights": cfg.query_pre_attn_scalar != 1.0,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
    }


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf,
    converters(NAME, ROWS, "transformer.", ignore=(r"\.attn\.(masked_)?bias$",)),
    notes="exact: pre-norm LayerNorm, plain GELU MLP, learned positions, Conv1D weights transposed; "
          "scale_attn_weights=False as query_pre_attn_scalar=1. Unsupported: scale_attn_by_inverse_layer_idx, "
          "add_cross_attention.",
)
# fmt: on
