"""Falcon (TII 2023; HF ``FalconForCausalLM``, transformers/models/falcon/modeling_falcon.py).

LayerNorm (with bias) blocks, parallel attention + MLP off one LayerNorm (``parallel_attn``; Falcon-7B) or
sequential pre-norm; with ``new_decoder_architecture`` (Falcon-40B/180B) always parallel, off two LayerNorms
(``ln_attn``, ``ln_mlp``) or one (``num_ln_in_parallel_attn=1``). A plain MLP of exact GELU by default,
biases on all linear layers or none (``bias``), full-width RoPE with rotate-half pairs, the LM head tied.
The fused ``query_key_value`` comes in three layouts, all mapped to lmlab's [q heads | k heads | v heads]:
- multi-query (``multi_query``; Falcon-7B): [q heads | k | v], one KV head;
- multi-head (neither flag): per head [q_h, k_h, v_h] in turn (as GPT-NeoX);
- new architecture: per KV group g, [q heads of g ..., k_g, v_g] (``num_kv_heads`` groups, GQA).
Unsupported: ``alibi=True`` (HF Falcon adds bf16(bf16(slope) * key index) / sqrt(head_dim): the bias is
rounded to bfloat16 and measured from the key's absolute index, which lmlab's fp32 ALiBi, -slope * (i - j),
cannot reproduce to 1e-4); ``new_decoder_architecture`` with ``parallel_attn=False`` (HF builds norms
its forward does not use).
"""

from __future__ import annotations

import torch

from lmlab.config import ModelConfig
from lmlab.interop.families._config_table import STANDARD, ConfigTable
from lmlab.interop.families._table import (
    PER_HEAD_QKV,
    Row,
    Transform,
    layer_norm,
    linear,
    register_family,
    to_hf,
    to_lmlab,
)
from lmlab.interop.families._tools import (
    StateReader,
    check_fields,
    expect,
    hf_get,
    read_rope,
    reject,
    rope_parameters,
    split_qkv,
)
from lmlab.interop.registry import StateDict, UnsupportedError

NAME = "falcon"


def _layout(hf: dict) -> str:
    """'new' | 'mqa' | 'mha': the fused qkv layout of an HF Falcon config."""
    if hf.get("new_decoder_architecture"):
        return "new"
    return "mqa" if hf.get("multi_query", True) else "mha"


# fmt: off
CONFIG = ConfigTable(NAME, hf_class="FalconForCausalLM", defaults=dict(  # FalconConfig's defaults
    vocab_size=65024, context_length=2048, d_model=4544, n_layers=32, n_heads=71, d_ff=lambda v: 4 * v["d_model"],
    norm_eps=1e-5, activation="gelu", tie_embeddings=True, attn_dropout=0.0, resid_dropout=0.0, init_std=0.02),
    names={**STANDARD, "d_model": ("n_embed", "hidden_size"), "d_ff": "ffn_hidden_size", "activation": "activation",
           "norm_eps": "layer_norm_epsilon"},  # HF lets the old n_embed win
    write_as={"d_model": "hidden_size"}, tanh_name="gelu_pytorch_tanh",
    fixed=dict(norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True, lm_head_bias=False,
               position="rope", rope_style="half"),
)
HANDLED = CONFIG.keys() | {
    "num_ln_in_parallel_attn", "num_kv_heads", "alibi", "new_decoder_architecture", "multi_query", "parallel_attn",
    "bias", "apply_residual_connection_post_layernorm",
    "num_key_value_heads",  # written by transformers >= 5.25: the KV heads the layout gives, checked
}
# fmt: on


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    if hf.get("alibi"):
        reject(
            NAME,
            "alibi",
            True,
            "RoPE Falcons only: HF Falcon's ALiBi bias is bf16(bf16(slope) * key_index) "
            "/ sqrt(head_dim), bfloat16-rounded, which lmlab's fp32 ALiBi cannot reproduce",
        )
    expect(NAME, hf, "apply_residual_connection_post_layernorm", (False,), False)
    fields = CONFIG.read(hf)
    n_heads = fields["n_heads"]
    head_dim = fields["d_model"] // n_heads
    layout = _layout(hf)
    parallel = expect(NAME, hf, "parallel_attn", (True, False), True)
    shared_norm = True
    if layout == "new":
        if not parallel:
            reject(
                NAME,
                "parallel_attn",
                False,
                "parallel_attn=True with new_decoder_architecture (HF's own "
                "forward needs ln_attn/ln_mlp it does not build otherwise)",
            )
        shared_norm = expect(NAME, hf, "num_ln_in_parallel_attn", (1, 2), 2) == 1
        n_kv = hf_get(hf, "num_kv_heads", default=n_heads)
    elif layout == "mqa":
        n_kv = 1
    else:
        n_kv = hf_get(hf, "num_kv_heads", default=n_heads)
        if n_kv != n_heads:
            reject(
                NAME,
                "num_kv_heads",
                n_kv,
                f"num_kv_heads = num_attention_heads ({n_heads}) without "
                f"multi_query or new_decoder_architecture (HF's fused layout)",
            )
    kv_written = hf.get("num_key_value_heads")
    if kv_written is not None and kv_written != n_kv:
        reject(
            NAME,
            "num_key_value_heads",
            kv_written,
            f"{n_kv}, the KV heads of this {layout} layout "
            f"(transformers derives the field from num_kv_heads "
            f"and multi_query / new_decoder_architecture)",
        )
    biased = expect(NAME, hf, "bias", (True, False), False)
    return ModelConfig(
        **fields,
        n_kv_heads=n_kv,
        bias="all" if biased else "none",
        parallel_block=parallel,
        parallel_shared_norm=shared_norm,
        **read_rope(NAME, hf, head_dim, fixed_fraction=1.0),
    )


def _grouped_to_lmlab(w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """new_decoder_architecture's fused qkv, [q heads of group g | k_g | v_g for each KV group g], as lmlab's
    [q heads | k heads | v heads]."""
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    rest = w.shape[1:]
    g = w.reshape(K, H // K + 2, D, *rest)  # per group: H/K query heads, then k, then v
    return torch.cat(
        [g[:, :-2].reshape(H * D, *rest), g[:, -2].reshape(K * D, *rest), g[:, -1].reshape(K * D, *rest)]
    ).contiguous()


def _grouped_to_hf(w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """The inverse of :func:`_grouped_to_lmlab`."""
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = split_qkv(w, cfg)
    rest = w.shape[1:]
    g = torch.cat([q.reshape(K, H // K, D, *rest), k.reshape(K, 1, D, *rest), v.reshape(K, 1, D, *rest)], dim=1)
    return g.reshape((H + 2 * K) * D, *rest).contiguous()


def _qkv(layout: str) -> Transform:
    """The fused query_key_value of ``layout`` ('mha' | 'mqa' | 'new') <-> lmlab's qkv."""
    if layout == "mha":
        return PER_HEAD_QKV
    if layout == "mqa":  # [q heads | k | v] already
        return Transform(lambda w, cfg: w.contiguous(), lambda w, cfg: w.contiguous())
    return Transform(_grouped_to_lmlab, _grouped_to_hf)


def _biased(cfg: ModelConfig) -> bool:
    return cfg.bias == "all"


def _rows(layout: str) -> list:
    """HF name (under transformer.) <-> lmlab name for the qkv ``layout``; {i}: every layer. LayerNorms:
    sequential blocks have two (before attention, before the MLP), parallel ones one shared
    (input_layernorm) or two (ln_attn, ln_mlp)."""
    sequential = lambda cfg: not cfg.parallel_block
    two = lambda cfg: cfg.parallel_block and not cfg.parallel_shared_norm
    return [
        Row("word_embeddings.weight", "embed.weight"),
        *layer_norm("h.{i}.input_layernorm", "blocks.{i}.attn_norm", when=lambda cfg: not two(cfg)),
        *layer_norm("h.{i}.post_attention_layernorm", "blocks.{i}.mlp_norm", when=sequential),
        *layer_norm("h.{i}.ln_attn", "blocks.{i}.attn_norm", when=two),
        *layer_norm("h.{i}.ln_mlp", "blocks.{i}.mlp_norm", when=two),
        *linear("h.{i}.self_attention.query_key_value", "blocks.{i}.attn.qkv", bias=_biased, transform=_qkv(layout)),
        *linear("h.{i}.self_attention.dense", "blocks.{i}.attn.out", bias=_biased),
        *linear("h.{i}.mlp.dense_h_to_4h", "blocks.{i}.mlp.w_in", bias=_biased),
        *linear("h.{i}.mlp.dense_4h_to_h", "blocks.{i}.mlp.w_out", bias=_biased),
        *layer_norm("ln_f", "final_norm"),
    ]


def state_to_lmlab(hf_state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    return to_lmlab(StateReader(NAME, hf_state, prefixes=("transformer.",)), _rows(_layout(hf)), cfg)


def _hf_layout(cfg: ModelConfig) -> dict:
    """The HF layout flags for ``cfg``: MQA -> multi_query; MHA sequential or shared-norm -> plain;
    GQA or two norms -> new_decoder_architecture."""
    two_norms = cfg.parallel_block and not cfg.parallel_shared_norm
    if cfg.n_kv_heads == cfg.n_heads and not two_norms:
        return {"new_decoder_architecture": False, "multi_query": False}
    if cfg.n_kv_heads == 1 and not two_norms:
        return {"new_decoder_architecture": False, "multi_query": True}
    if not cfg.parallel_block:
        raise UnsupportedError(
            f"{NAME}: n_kv_heads={cfg.n_kv_heads} of n_heads={cfg.n_heads} cannot be exported "
            f"with a sequential block; Falcon has GQA only in its parallel new_decoder_architecture"
        )
    return {
        "new_decoder_architecture": True,
        "multi_query": False,
        "num_ln_in_parallel_attn": 1 if cfg.parallel_shared_norm else 2,
    }


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.bias not in ("all", "none"):
        raise UnsupportedError(
            f"{NAME}: bias={cfg.bias!r} cannot be exported; Falcon's bias flag covers every "
            f"linear layer: bias 'all' or 'none'"
        )
    return {
        **CONFIG.write(cfg),
        "num_kv_heads": cfg.n_kv_heads,
        "bias": cfg.bias == "all",
        "alibi": False,
        "parallel_attn": cfg.parallel_block,
        **_hf_layout(cfg),
        "rope_parameters": rope_parameters(cfg, partial=False),
    }


def state_to_hf(state: StateDict, cfg: ModelConfig) -> StateDict:
    return to_hf(state, _rows(_layout(_hf_layout(cfg))), cfg, prefix="transformer.")


# fmt: off
FAMILY = register_family(
    NAME, CONFIG.hf_class, config_to_lmlab, config_to_hf, (state_to_lmlab, state_to_hf),
    notes="exact for RoPE Falcons: MQA (7B), MHA, new_decoder_architecture GQA with one or two LayerNorms (40B/180B), "
          "parallel or sequential blocks. Unsupported: alibi=True (HF rounds the ALiBi bias to bfloat16 and scales "
          "it by 1/sqrt(head_dim); lmlab's fp32 ALiBi cannot match it to 1e-4).",
)
# fmt: on
