"""OPT (Zhang et al. 2022; HF ``OPTForCausalLM``, transformers/models/opt/modeling_opt.py).

LayerNorm blocks, pre-norm (``do_layer_norm_before=True``) or post-norm with no final norm (OPT-350M);
a plain ReLU MLP; biases on every linear layer (``enable_bias``); learned positions whose table has
``max_position_embeddings + 2`` rows, position p reading row p + 2 (``learned_pos_offset=2``); the LM head
tied to the token embedding. OPT-350M embeds in ``word_embed_proj_dim`` (512) channels, projected in to
and out of the 1024-wide stack without bias (``project_in`` / ``project_out``; ``embed_dim``).
``layer_norm_elementwise_affine=False`` is ``norm_affine=False``; ``_remove_final_layer_norm`` drops the final
norm. HF's OPT LayerNorms use nn.LayerNorm's eps 1e-5 (no config field). ``layerdrop`` is training-only and
not carried.
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop.families._config_table import STANDARD, ConfigTable
from lmlab.interop.families._table import Row, converters, layer_norm, linear, register_family, separate_qkv
from lmlab.interop.families._tools import check_fields, expect, hf_get
from lmlab.interop.registry import UnsupportedError

NAME = "opt"
OFFSET = 2  # OPTLearnedPositionalEmbedding.offset

# fmt: off
CONFIG = ConfigTable(NAME, hf_class="OPTForCausalLM", defaults=dict(  # OPTConfig's defaults
    vocab_size=50272, context_length=2048, d_model=768, n_layers=12, n_heads=12, d_ff=3072, activation="relu",
    tie_embeddings=True, attn_dropout=0.0, resid_dropout=0.1, init_std=0.02),
    names={**STANDARD, "d_ff": "ffn_dim", "activation": "activation_function", "resid_dropout": "dropout",
           "init_std": "init_std"},
    fixed=dict(norm_type="layernorm", norm_eps=1e-5, lm_head_bias=False, position="learned",
               learned_pos_offset=OFFSET),
)
HANDLED = CONFIG.keys() | {"do_layer_norm_before", "_remove_final_layer_norm", "word_embed_proj_dim", "layerdrop",
                           "enable_bias", "layer_norm_elementwise_affine"}
# fmt: on


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    fields = CONFIG.read(hf)
    d_model = fields["d_model"]
    pre = expect(NAME, hf, "do_layer_norm_before", (True, False), True)
    remove_final = expect(NAME, hf, "_remove_final_layer_norm", (True, False), False)
    affine = expect(NAME, hf, "layer_norm_elementwise_affine", (True, False), True)
    biased = expect(NAME, hf, "enable_bias", (True, False), True)
    embed_dim = hf_get(hf, "word_embed_proj_dim", default=d_model)
    return ModelConfig(
        **fields,
        embed_dim=None if embed_dim == d_model else embed_dim,
        norm_position="pre" if pre else "post",
        norm_bias=affine,
        norm_affine=affine,
        final_norm=pre and not remove_final,
        bias="all" if biased else "none",
    )


def _biased(cfg: ModelConfig) -> bool:
    return cfg.bias == "all"


def _projected(cfg: ModelConfig) -> bool:
    return cfg.embed_dim not in (None, cfg.d_model)


# fmt: off
ROWS = [  # HF name (under model.decoder.) <-> lmlab name; {i}: every layer
    Row("embed_tokens.weight", "embed.weight"),
    Row("embed_positions.weight", "abs_pos.weight"),
    Row("project_in.weight", "proj_in.weight", when=_projected),
    Row("project_out.weight", "proj_out.weight", when=_projected),
    *layer_norm("layers.{i}.self_attn_layer_norm", "blocks.{i}.attn_norm", when=lambda cfg: cfg.norm_affine),
    *separate_qkv("layers.{i}.self_attn.{p}_proj", "blocks.{i}.attn.qkv", bias=_biased),
    *linear("layers.{i}.self_attn.out_proj", "blocks.{i}.attn.out", bias=_biased),
    *layer_norm("layers.{i}.final_layer_norm", "blocks.{i}.mlp_norm", when=lambda cfg: cfg.norm_affine),
    *linear("layers.{i}.fc1", "blocks.{i}.mlp.w_in", bias=_biased),
    *linear("layers.{i}.fc2", "blocks.{i}.mlp.w_out", bias=_biased),
    *layer_norm("final_layer_norm", "final_norm", when=lambda cfg: cfg.final_norm and cfg.norm_affine),
]
# fmt: on


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.norm_eps != 1e-5:
        raise UnsupportedError(
            f"{NAME}: norm_eps={cfg.norm_eps!r} cannot be exported; HF OPT's LayerNorms always use eps 1e-5"
        )
    if cfg.norm_position not in ("pre", "post"):
        raise UnsupportedError(
            f"{NAME}: norm_position={cfg.norm_position!r} cannot be exported; OPT has 'pre' "
            f"(do_layer_norm_before) or 'post'"
        )
    return {
        **CONFIG.write(cfg),
        "word_embed_proj_dim": cfg.embed_dim or cfg.d_model,
        "do_layer_norm_before": cfg.norm_position == "pre",
        "_remove_final_layer_norm": cfg.norm_position == "pre" and not cfg.final_norm,
        "layer_norm_elementwise_affine": cfg.norm_affine,
        "enable_bias": cfg.bias == "all",
        "layerdrop": 0.0,
    }


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf,
    converters(NAME, ROWS, "model.decoder.", read_prefixes=("model.", "decoder.")),
    notes="exact, pre-norm and post-norm (OPT-350M): learned positions with OPT's offset of 2 "
          "(learned_pos_offset), word_embed_proj_dim as embed_dim (project_in / project_out), "
          "layer_norm_elementwise_affine=False as norm_affine=False. HF fixes LayerNorm eps at 1e-5.",
)
# fmt: on
