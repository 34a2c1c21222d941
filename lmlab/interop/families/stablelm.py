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
from lmlab.interop.families._config_table import ConfigTable
from lmlab.interop.families._table import Row, converters, layer_norm, linear, register_family, separate_qkv
from lmlab.interop.families._tools import check_fields, expect, read_rope, rope_parameters
from lmlab.interop.registry import UnsupportedError

NAME = "stablelm"

# fmt: off
CONFIG = ConfigTable(NAME, hf_class="StableLmForCausalLM", defaults=dict(  # StableLmConfig's defaults
    vocab_size=50304, context_length=4096, d_model=2560, n_layers=32, n_heads=32, n_kv_heads=32, d_ff=6912,
    norm_eps=1e-5, activation="silu", tie_embeddings=False, attn_dropout=0.0, resid_dropout=0.0, init_std=0.02),
    gated=True, tanh_name="gelu_pytorch_tanh",
    fixed=dict(norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True, lm_head_bias=False,
               parallel_shared_norm=True, position="rope", rope_style="half"),
)
# fmt: on
HANDLED = CONFIG.keys() | {"use_qkv_bias", "qk_layernorm", "use_parallel_residual"}


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    fields = CONFIG.read(hf)
    head_dim = fields["d_model"] // fields["n_heads"]
    qkv_bias = expect(NAME, hf, "use_qkv_bias", (True, False), False)
    qk_norm = expect(NAME, hf, "qk_layernorm", (True, False), False)
    parallel = expect(NAME, hf, "use_parallel_residual", (True, False), False)
    return ModelConfig(
        **fields,
        bias="qkv" if qkv_bias else "none",
        parallel_block=parallel,
        qk_norm="layernorm" if qk_norm else "none",
        qk_norm_scope="head_untied" if qk_norm else "head",
        **read_rope(NAME, hf, head_dim, default_fraction=0.25),
    )


def _qk_norm(cfg: ModelConfig) -> bool:
    return cfg.qk_norm != "none"


# fmt: off
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
# fmt: on


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.qk_norm != "none" and (cfg.qk_norm, cfg.qk_norm_scope) != ("layernorm", "head_untied"):
        raise UnsupportedError(
            f"{NAME}: qk_norm={cfg.qk_norm!r} with qk_norm_scope={cfg.qk_norm_scope!r} cannot be "
            f"exported; StableLM's qk_layernorm is a bias-free LayerNorm per head "
            f"(qk_norm='layernorm', qk_norm_scope='head_untied')"
        )
    return {
        **CONFIG.write(cfg),
        "use_qkv_bias": cfg.bias == "qkv",
        "qk_layernorm": cfg.qk_norm != "none",
        "use_parallel_residual": cfg.parallel_block,
        "rope_parameters": rope_parameters(cfg),
    }


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf, converters(NAME, ROWS, "model."),
    notes="exact: sequential or parallel (one LayerNorm) blocks, q/k/v biases, per-head untied QK LayerNorm "
          "(qk_norm_scope='head_untied'), SwiGLU, partial rotate-half RoPE, GQA.",
)
# fmt: on
