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
from lmlab.interop.families._table import converters, Row, layer_norm, linear, separate_qkv
from lmlab.interop.families._tools import (
    check_expressible,
    check_fields,
    hf_act_name,
    hf_activation,
    hf_get,
    reject,
    rotated_dims,
)
from lmlab.interop.common import Unread, check_unread
from lmlab.interop.registry import Family, UnsupportedError, register

NAME = "gptj"

HANDLED = frozenset({  # config.json fields this converter reads (besides RoPE and metadata)
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "rotary_dim", "n_inner", "activation_function",
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "tie_word_embeddings", "hidden_size",
    "max_position_embeddings", "num_hidden_layers", "num_attention_heads",
    "scale_attn_weights",  # old GPT-J configs; HF GPT-J always scales
})
# GPT-J-6B's published config.json: a key of mesh-transformer-jax that transformers' GPT-J never reads
UNREAD = (Unread("rotary", "RoPE on, as HF's GPT-J always rotates rotary_dim channels", accepted=(True,)),)


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED | {u.key for u in UNREAD})
    check_unread(hf, NAME, UNREAD)
    d_model = hf_get(hf, "n_embd", "hidden_size", default=4096)
    n_heads = hf_get(hf, "n_head", "num_attention_heads", default=16)
    head_dim = d_model // n_heads
    rotary_dim = hf.get("rotary_dim", 64)
    if rotary_dim is None:
        if n_heads != 1:
            reject(NAME, "rotary_dim", None, "an explicit rotary_dim (HF's None rotates hidden_size channels, "
                                             "which only fits n_head=1)")
        rotary_dim = head_dim
    if not (2 <= rotary_dim <= head_dim) or rotary_dim % 2:
        reject(NAME, "rotary_dim", rotary_dim, f"an even rotary_dim in [2, head_dim={head_dim}]")
    return ModelConfig(
        vocab_size=hf_get(hf, "vocab_size", default=50400),
        context_length=hf_get(hf, "n_positions", "max_position_embeddings", default=2048),
        d_model=d_model,
        n_layers=hf_get(hf, "n_layer", "num_hidden_layers", default=28),
        n_heads=n_heads,
        d_ff=hf_get(hf, "n_inner", default=4 * d_model),
        norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True,
        norm_eps=float(hf_get(hf, "layer_norm_epsilon", default=1e-5)),
        bias="mlp", lm_head_bias=True,
        activation=hf_activation(NAME, "activation_function", hf_get(hf, "activation_function", default="gelu_new")),
        parallel_block=True, parallel_shared_norm=True,
        position="rope", rope_style="interleaved", rope_theta=10000.0, rope_fraction=rotary_dim / head_dim,
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", default=False)),
        embd_dropout=float(hf_get(hf, "embd_pdrop", default=0.0)),
        attn_dropout=float(hf_get(hf, "attn_pdrop", default=0.0)),
        resid_dropout=float(hf_get(hf, "resid_pdrop", default=0.0)),
        init_std=float(hf_get(hf, "initializer_range", default=0.02)),
    )


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


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.position == "rope" and cfg.rope_theta != 10000.0:
        raise UnsupportedError(f"{NAME}: rope_theta={cfg.rope_theta!r} cannot be exported; GPT-J's RoPE base is "
                               f"fixed at 10000")
    hf = {
        "model_type": NAME, "architectures": ["GPTJForCausalLM"],
        "vocab_size": cfg.vocab_size, "n_positions": cfg.context_length, "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ff,
        "rotary_dim": rotated_dims(cfg),
        "activation_function": hf_act_name(NAME, cfg.activation, gated=False),
        "layer_norm_epsilon": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "embd_pdrop": cfg.embd_dropout, "attn_pdrop": cfg.attn_dropout, "resid_pdrop": cfg.resid_dropout,
        "initializer_range": cfg.init_std,
    }
    check_expressible(NAME, cfg, hf, config_to_lmlab)
    return hf


state_to_lmlab, state_to_hf = converters(NAME, ROWS, "transformer.", ignore=(r"\.attn\.(masked_)?bias$",))

FAMILY = register(Family(
    model_type=NAME, hf_class="GPTJForCausalLM", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    unread_notes=lambda hf: check_unread(hf, NAME, UNREAD),
    notes="exact: parallel block off one LayerNorm, partial interleaved RoPE (rotary_dim, base 10000), "
          "LM-head bias. Unsupported: rotary_dim=None with more than one head (HF itself fails there).",
))
