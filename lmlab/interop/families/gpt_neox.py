"""GPT-NeoX / Pythia (Black et al. 2022; HF ``GPTNeoXForCausalLM``, transformers/models/gpt_neox).

Parallel residual with two LayerNorms (x + attn(ln1(x)) + mlp(ln2(x))) or, with
``use_parallel_residual=False``, the sequential pre-norm block; biases on every linear layer
(``attention_bias`` toggles the attention ones, the MLP always has them); partial RoPE (``rotary_pct`` /
``partial_rotary_factor``, default 0.25) with rotate-half pairs; an untied LM head by default.
The fused ``query_key_value`` is laid out per head, [q_h, k_h, v_h] for each head h in turn: it is
de-interleaved into lmlab's [q heads | k heads | v heads]. Old checkpoints name the LM head
``embed_out``; both names are read.
Unsupported: ``attention_bias=False`` (the MLP keeps its biases, a split lmlab's ``bias`` lacks).
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop.families._config_table import ConfigTable
from lmlab.interop.families._table import PER_HEAD_QKV, Row, converters, layer_norm, linear, register_family
from lmlab.interop.families._tools import (
    check_fields,
    expect,
    read_rope,
    reject,
    rope_parameters,
)

NAME = "gpt_neox"

# fmt: off
CONFIG = ConfigTable(NAME, hf_class="GPTNeoXForCausalLM", defaults=dict(  # GPTNeoXConfig's defaults
    vocab_size=50432, context_length=2048, d_model=6144, n_layers=44, n_heads=64, d_ff=24576, norm_eps=1e-5,
    activation="gelu", tie_embeddings=False, attn_dropout=0.0, resid_dropout=0.0, init_std=0.02), tanh_name="gelu_fast",
    fixed=dict(norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True, bias="all",
               lm_head_bias=False, parallel_shared_norm=False, position="rope", rope_style="half"),
)
# fmt: on
HANDLED = CONFIG.keys() | {"use_parallel_residual", "attention_bias", "rotary_pct", "rotary_emb_base"}


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    expect(NAME, hf, "attention_bias", (True,), True)
    fields = CONFIG.read(hf)
    parallel = expect(NAME, hf, "use_parallel_residual", (True, False), True)
    head_dim = fields["d_model"] // fields["n_heads"]
    rope = read_rope(NAME, hf, head_dim, default_fraction=0.25, theta_key="rotary_emb_base", fraction_key="rotary_pct")
    # HF's GPT-NeoX config ignores the top-level names other families use: refuse them when they disagree
    for key, used in (("rope_theta", rope["rope_theta"]), ("partial_rotary_factor", rope["rope_fraction"])):
        if hf.get(key) is not None and float(hf[key]) != used:
            reject(
                NAME,
                key,
                hf[key],
                f"RoPE given as rope_parameters or rotary_emb_base / rotary_pct (HF's GPT-NeoX "
                f"ignores a top-level {key}; it would use {used})",
            )
    return ModelConfig(**fields, parallel_block=parallel, **rope)


# fmt: off
ROWS = [  # HF name (under gpt_neox.) <-> lmlab name; {i}: every layer
    Row("embed_in.weight", "embed.weight"),
    *layer_norm("layers.{i}.input_layernorm", "blocks.{i}.attn_norm"),
    *layer_norm("layers.{i}.post_attention_layernorm", "blocks.{i}.mlp_norm"),
    *linear("layers.{i}.attention.query_key_value", "blocks.{i}.attn.qkv", bias=True, transform=PER_HEAD_QKV),
    *linear("layers.{i}.attention.dense", "blocks.{i}.attn.out", bias=True),
    *linear("layers.{i}.mlp.dense_h_to_4h", "blocks.{i}.mlp.w_in", bias=True),
    *linear("layers.{i}.mlp.dense_4h_to_h", "blocks.{i}.mlp.w_out", bias=True),
    *layer_norm("final_layer_norm", "final_norm"),
]
# fmt: on


def config_to_hf(cfg: ModelConfig) -> dict:
    return {
        **CONFIG.write(cfg),
        "use_parallel_residual": cfg.parallel_block,
        "attention_bias": True,
        "rope_parameters": rope_parameters(cfg),
    }


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf, converters(
    NAME, ROWS, "gpt_neox.", ignore=(r"\.attention\.(masked_)?bias$", r"\.attention\.rotary_emb\.inv_freq$"),
    head="embed_out.weight", head_aliases=("lm_head.weight",)),
    notes="exact: parallel residual with two LayerNorms (or sequential), per-head interleaved fused qkv, "
          "partial rotate-half RoPE. Unsupported: attention_bias=False (MLP biases without attention ones).",
)
# fmt: on
