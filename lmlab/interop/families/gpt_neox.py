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
from lmlab.interop.families._tools import (
    put_output,
    check_expressible,
    check_fields,
    deinterleave_heads,
    expect,
    hf_act_name,
    hf_activation,
    hf_get,
    interleave_heads,
    lm_key,
    put,
    read_rope,
    reject,
    rope_parameters,
    StateReader,
)
from lmlab.interop.registry import Family, StateDict, register

NAME = "gpt_neox"

HANDLED = frozenset({  # config.json fields this converter reads (besides RoPE and metadata)
    "vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "attention_dropout", "hidden_dropout", "layer_norm_eps",
    "tie_word_embeddings", "use_parallel_residual", "attention_bias", "rotary_pct", "rotary_emb_base",
})


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    expect(NAME, hf, "attention_bias", (True,), True)
    d_model = hf_get(hf, "hidden_size", default=6144)
    n_heads = hf_get(hf, "num_attention_heads", default=64)
    parallel = expect(NAME, hf, "use_parallel_residual", (True, False), True)
    head_dim = d_model // n_heads
    rope = read_rope(NAME, hf, head_dim, default_fraction=0.25, theta_key="rotary_emb_base", fraction_key="rotary_pct")
    # HF's GPT-NeoX config ignores the top-level names other families use: refuse them when they disagree
    for key, used in (("rope_theta", rope["rope_theta"]), ("partial_rotary_factor", rope["rope_fraction"])):
        if hf.get(key) is not None and float(hf[key]) != used:
            reject(NAME, key, hf[key], f"RoPE given as rope_parameters or rotary_emb_base / rotary_pct (HF's GPT-NeoX "
                                       f"ignores a top-level {key}; it would use {used})")
    return ModelConfig(
        vocab_size=hf_get(hf, "vocab_size", default=50432),
        context_length=hf_get(hf, "max_position_embeddings", default=2048),
        d_model=d_model,
        n_layers=hf_get(hf, "num_hidden_layers", default=44),
        n_heads=n_heads,
        d_ff=hf_get(hf, "intermediate_size", default=24576),
        norm_type="layernorm", norm_position="pre", norm_bias=True, final_norm=True,
        norm_eps=float(hf_get(hf, "layer_norm_eps", default=1e-5)),
        bias="all", lm_head_bias=False,
        activation=hf_activation(NAME, "hidden_act", hf_get(hf, "hidden_act", default="gelu")),
        parallel_block=parallel, parallel_shared_norm=False,
        position="rope", rope_style="half", **rope,
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", default=False)),
        attn_dropout=float(hf_get(hf, "attention_dropout", default=0.0)),
        resid_dropout=float(hf_get(hf, "hidden_dropout", default=0.0)),
        init_std=float(hf_get(hf, "initializer_range", default=0.02)),
    )


def state_to_lmlab(hf_state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    r = StateReader(NAME, hf_state, prefixes=("gpt_neox.",),
                    ignore=(r"\.attention\.(masked_)?bias$", r"\.attention\.rotary_emb\.inv_freq$"))
    out: StateDict = {"embed.weight": r.take("embed_in.weight")}
    H, D = cfg.n_heads, cfg.head_dim
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        for hf_norm, lm_norm in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")):
            put(out, b + lm_norm + ".weight", r.take(h + hf_norm + ".weight"))
            put(out, b + lm_norm + ".bias", r.take(h + hf_norm + ".bias"))
        put(out, b + "attn.qkv.weight", deinterleave_heads(r.take(h + "attention.query_key_value.weight"), H, D))
        put(out, b + "attn.qkv.bias", deinterleave_heads(r.take(h + "attention.query_key_value.bias"), H, D))
        for hf_lin, lm_lin in (("attention.dense", "attn.out"), ("mlp.dense_h_to_4h", "mlp.w_in"),
                               ("mlp.dense_4h_to_h", "mlp.w_out")):
            put(out, b + lm_lin + ".weight", r.take(h + hf_lin + ".weight"))
            put(out, b + lm_lin + ".bias", r.take(h + hf_lin + ".bias"))
    put(out, "final_norm.weight", r.take("final_layer_norm.weight"))
    put(out, "final_norm.bias", r.take("final_layer_norm.bias"))
    head = "lm_head.weight" if r.has("lm_head.weight") else "embed_out.weight"
    if cfg.tie_embeddings:
        r.tied_head(head, out["embed.weight"])
    else:
        put(out, "lm_head.weight", r.take(head))
    return r.finish(out, cfg)


def config_to_hf(cfg: ModelConfig) -> dict:
    hf = {
        "model_type": NAME, "architectures": ["GPTNeoXForCausalLM"],
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "hidden_act": hf_act_name(NAME, cfg.activation, gated=False, tanh_name="gelu_fast"),
        "layer_norm_eps": cfg.norm_eps, "use_parallel_residual": cfg.parallel_block, "attention_bias": True,
        "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": cfg.attn_dropout, "hidden_dropout": cfg.resid_dropout,
        "initializer_range": cfg.init_std,
    }
    check_expressible(NAME, cfg, hf, config_to_lmlab)
    return hf


def state_to_hf(state: StateDict, cfg: ModelConfig) -> StateDict:
    out: StateDict = {"gpt_neox.embed_in.weight": lm_key(state, "embed.weight")}
    H, D = cfg.n_heads, cfg.head_dim
    for i in range(cfg.n_layers):
        h, b = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        for hf_norm, lm_norm in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")):
            put(out, h + hf_norm + ".weight", lm_key(state, b + lm_norm + ".weight"))
            put(out, h + hf_norm + ".bias", lm_key(state, b + lm_norm + ".bias"))
        put(out, h + "attention.query_key_value.weight", interleave_heads(lm_key(state, b + "attn.qkv.weight"), H, D))
        put(out, h + "attention.query_key_value.bias", interleave_heads(lm_key(state, b + "attn.qkv.bias"), H, D))
        for hf_lin, lm_lin in (("attention.dense", "attn.out"), ("mlp.dense_h_to_4h", "mlp.w_in"),
                               ("mlp.dense_4h_to_h", "mlp.w_out")):
            put(out, h + hf_lin + ".weight", lm_key(state, b + lm_lin + ".weight"))
            put(out, h + hf_lin + ".bias", lm_key(state, b + lm_lin + ".bias"))
    put_output(out, state, cfg, "gpt_neox.final_layer_norm", head="embed_out")
    return out


FAMILY = register(Family(
    model_type=NAME, hf_class="GPTNeoXForCausalLM", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    notes="exact: parallel residual with two LayerNorms (or sequential), per-head interleaved fused qkv, "
          "partial rotate-half RoPE. Unsupported: attention_bias=False (MLP biases without attention ones).",
))
