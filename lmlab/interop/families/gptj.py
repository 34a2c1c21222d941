"""GPT-J (Wang & Komatsuzaki 2021; HF ``GPTJForCausalLM``, transformers/models/gptj/modeling_gptj.py).

Parallel block off one LayerNorm (x + attn(ln(x)) + mlp(ln(x))), attention without biases, a plain GELU MLP
with biases, an LM head with a bias, RoPE on the first ``rotary_dim`` channels of each head with
interleaved pairs (2i, 2i+1; ``rotate_every_two``) and the fixed base 10000.
``rotary_dim=None`` rotates the whole hidden width in HF, which only fits a single head; other heads
counts raise. GPT-J-6B's published ``rotary: true`` (a mesh-transformer-jax key transformers never reads)
is accepted with a note; ``rotary: false`` is refused (it would describe a model without RoPE).
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop.common import Unread, check_unread
from lmlab.interop.families._config_table import GPT2_NAMES, ConfigTable
from lmlab.interop.families._table import Row, converters, layer_norm, linear, register_family, separate_qkv
from lmlab.interop.families._tools import check_fields, reject, rotated_dims
from lmlab.interop.registry import UnsupportedError

NAME = "gptj"

# fmt: off
CONFIG = ConfigTable(NAME, hf_class="GPTJForCausalLM", defaults=dict(  # GPTJConfig's defaults
    vocab_size=50400, context_length=2048, d_model=4096, n_layers=28, n_heads=16, d_ff=lambda v: 4 * v["d_model"],
    norm_eps=1e-5, activation="gelu_new", tie_embeddings=False, embd_dropout=0.0, attn_dropout=0.0,
    resid_dropout=0.0, init_std=0.02), names=GPT2_NAMES,
    fixed=dict(norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True, bias="mlp",
               lm_head_bias=True, parallel_block=True, parallel_shared_norm=True, position="rope",
               rope_style="interleaved", rope_theta=10000.0),
)
# fmt: on
HANDLED = CONFIG.keys() | {"rotary_dim", "scale_attn_weights"}  # the latter: old GPT-J configs; HF always scales
# GPT-J-6B's published config.json: a key of mesh-transformer-jax that transformers' GPT-J never reads
UNREAD = (Unread("rotary", "RoPE on, as HF's GPT-J always rotates rotary_dim channels", accepted=(True,)),)


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED | {u.key for u in UNREAD})
    check_unread(hf, NAME, UNREAD)
    fields = CONFIG.read(hf)
    head_dim = fields["d_model"] // fields["n_heads"]
    rotary_dim = hf.get("rotary_dim", 64)
    if rotary_dim is None:
        if fields["n_heads"] != 1:
            reject(
                NAME,
                "rotary_dim",
                None,
                "an explicit rotary_dim (HF's None rotates hidden_size channels, which only fits n_head=1)",
            )
        rotary_dim = head_dim
    if not (2 <= rotary_dim <= head_dim) or rotary_dim % 2:
        reject(NAME, "rotary_dim", rotary_dim, f"an even rotary_dim in [2, head_dim={head_dim}]")
    return ModelConfig(**fields, rope_fraction=rotary_dim / head_dim)


# fmt: off
ROWS = [  # HF name (under transformer.) <-> lmlab name; {i}: every layer
    Row("wte.weight", "embed.weight"),
    *layer_norm("h.{i}.ln_1", "blocks.{i}.attn_norm"),
    *separate_qkv("h.{i}.attn.{p}_proj", "blocks.{i}.attn.qkv"),
    *linear("h.{i}.attn.out_proj", "blocks.{i}.attn.out"),
    *linear("h.{i}.mlp.fc_in", "blocks.{i}.mlp.w_in", bias=True),
    *linear("h.{i}.mlp.fc_out", "blocks.{i}.mlp.w_out", bias=True),
    *layer_norm("ln_f", "final_norm"),
    Row("lm_head.bias", "lm_head.bias", prefixed=False),
]
# fmt: on


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.position == "rope" and cfg.rope_theta != 10000.0:
        raise UnsupportedError(
            f"{NAME}: rope_theta={cfg.rope_theta!r} cannot be exported; GPT-J's RoPE base is fixed at 10000"
        )
    return {
        **CONFIG.write(cfg),
        "rotary_dim": rotated_dims(cfg),
    }


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf,
    converters(NAME, ROWS, "transformer.", ignore=(r"\.attn\.(masked_)?bias$",)),
    unread_notes=lambda hf: check_unread(hf, NAME, UNREAD),
    notes="exact: parallel block off one LayerNorm, partial interleaved RoPE (rotary_dim, base 10000), "
          "LM-head bias. Unsupported: rotary_dim=None with more than one head (HF itself fails there).",
)
# fmt: on
