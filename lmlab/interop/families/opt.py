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
from lmlab.interop.families._tools import (cat_qkv, check_expressible, check_fields, expect, hf_act_name,
                                           hf_activation, hf_get, lm_key, put, split_qkv, StateReader)
from lmlab.interop.registry import Family, StateDict, UnsupportedError, register

NAME = "opt"
OFFSET = 2  # OPTLearnedPositionalEmbedding.offset

HANDLED = frozenset({  # config.json fields this converter reads (besides RoPE and metadata)
    "vocab_size", "hidden_size", "num_hidden_layers", "ffn_dim", "max_position_embeddings", "do_layer_norm_before",
    "_remove_final_layer_norm", "word_embed_proj_dim", "dropout", "attention_dropout", "num_attention_heads",
    "activation_function", "layerdrop", "init_std", "enable_bias", "layer_norm_elementwise_affine",
    "tie_word_embeddings",
})


def config_to_lmlab(hf: dict) -> ModelConfig:
    check_fields(hf, NAME, HANDLED)
    d_model = hf_get(hf, "hidden_size", default=768)
    pre = expect(NAME, hf, "do_layer_norm_before", (True, False), True)
    remove_final = expect(NAME, hf, "_remove_final_layer_norm", (True, False), False)
    affine = expect(NAME, hf, "layer_norm_elementwise_affine", (True, False), True)
    biased = expect(NAME, hf, "enable_bias", (True, False), True)
    embed_dim = hf_get(hf, "word_embed_proj_dim", default=d_model)
    return ModelConfig(
        vocab_size=hf_get(hf, "vocab_size", default=50272),
        context_length=hf_get(hf, "max_position_embeddings", default=2048),
        d_model=d_model,
        n_layers=hf_get(hf, "num_hidden_layers", default=12),
        n_heads=hf_get(hf, "num_attention_heads", default=12),
        d_ff=hf_get(hf, "ffn_dim", default=3072),
        embed_dim=None if embed_dim == d_model else embed_dim,
        norm_type="layernorm", norm_position="pre" if pre else "post", norm_bias=affine, norm_affine=affine,
        norm_eps=1e-5, final_norm=pre and not remove_final,
        bias="all" if biased else "none", lm_head_bias=False,
        activation=hf_activation(NAME, "activation_function", hf_get(hf, "activation_function", default="relu")),
        position="learned", learned_pos_offset=OFFSET,
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", default=True)),
        attn_dropout=float(hf_get(hf, "attention_dropout", default=0.0)),
        resid_dropout=float(hf_get(hf, "dropout", default=0.1)),
        init_std=float(hf_get(hf, "init_std", default=0.02)),
    )


def state_to_lmlab(hf_state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    r = StateReader(NAME, hf_state, prefixes=("model.", "decoder."))
    norm_bias = cfg.norm_affine
    out: StateDict = {"embed.weight": r.take("embed_tokens.weight"), "abs_pos.weight": r.take("embed_positions.weight")}
    if cfg.embed_dim not in (None, cfg.d_model):
        put(out, "proj_in.weight", r.take("project_in.weight"))
        put(out, "proj_out.weight", r.take("project_out.weight"))
    biased = cfg.bias == "all"
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        for hf_norm, lm_norm in (("self_attn_layer_norm", "attn_norm"), ("final_layer_norm", "mlp_norm")):
            put(out, b + lm_norm + ".weight", r.take_if(h + hf_norm + ".weight", cfg.norm_affine))
            put(out, b + lm_norm + ".bias", r.take_if(h + hf_norm + ".bias", norm_bias))
        put(out, b + "attn.qkv.weight", cat_qkv(*(r.take(h + f"self_attn.{p}_proj.weight") for p in "qkv")))
        if biased:
            put(out, b + "attn.qkv.bias", cat_qkv(*(r.take(h + f"self_attn.{p}_proj.bias") for p in "qkv")))
        for hf_lin, lm_lin in (("self_attn.out_proj", "attn.out"), ("fc1", "mlp.w_in"), ("fc2", "mlp.w_out")):
            put(out, b + lm_lin + ".weight", r.take(h + hf_lin + ".weight"))
            put(out, b + lm_lin + ".bias", r.take_if(h + hf_lin + ".bias", biased))
    if cfg.final_norm:
        put(out, "final_norm.weight", r.take_if("final_layer_norm.weight", cfg.norm_affine))
        put(out, "final_norm.bias", r.take_if("final_layer_norm.bias", norm_bias))
    if cfg.tie_embeddings:
        r.tied_head("lm_head.weight", out["embed.weight"])
    else:
        put(out, "lm_head.weight", r.take("lm_head.weight"))
    return r.finish(out, cfg)


def config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.norm_eps != 1e-5:
        raise UnsupportedError(f"{NAME}: norm_eps={cfg.norm_eps!r} cannot be exported; HF OPT's LayerNorms "
                               f"always use eps 1e-5")
    if cfg.norm_position not in ("pre", "post"):
        raise UnsupportedError(f"{NAME}: norm_position={cfg.norm_position!r} cannot be exported; OPT has 'pre' "
                               f"(do_layer_norm_before) or 'post'")
    hf = {
        "model_type": NAME, "architectures": ["OPTForCausalLM"],
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "ffn_dim": cfg.d_ff,
        "word_embed_proj_dim": cfg.embed_dim or cfg.d_model,
        "do_layer_norm_before": cfg.norm_position == "pre",
        "_remove_final_layer_norm": cfg.norm_position == "pre" and not cfg.final_norm,
        "layer_norm_elementwise_affine": cfg.norm_affine, "enable_bias": cfg.bias == "all",
        "activation_function": hf_act_name(NAME, cfg.activation, gated=False),
        "tie_word_embeddings": cfg.tie_embeddings,
        "dropout": cfg.resid_dropout, "attention_dropout": cfg.attn_dropout, "layerdrop": 0.0,
        "init_std": cfg.init_std,
    }
    check_expressible(NAME, cfg, hf, config_to_lmlab)
    return hf


def state_to_hf(state: StateDict, cfg: ModelConfig) -> StateDict:
    p = "model.decoder."
    out: StateDict = {p + "embed_tokens.weight": lm_key(state, "embed.weight"),
                      p + "embed_positions.weight": lm_key(state, "abs_pos.weight")}
    if cfg.embed_dim not in (None, cfg.d_model):
        put(out, p + "project_in.weight", lm_key(state, "proj_in.weight"))
        put(out, p + "project_out.weight", lm_key(state, "proj_out.weight"))
    biased = cfg.bias == "all"
    for i in range(cfg.n_layers):
        h, b = f"{p}layers.{i}.", f"blocks.{i}."
        for hf_norm, lm_norm in (("self_attn_layer_norm", "attn_norm"), ("final_layer_norm", "mlp_norm")):
            put(out, h + hf_norm + ".weight", lm_key(state, b + lm_norm + ".weight", cfg.norm_affine))
            put(out, h + hf_norm + ".bias", lm_key(state, b + lm_norm + ".bias", cfg.norm_affine))
        for name, w in zip("qkv", split_qkv(lm_key(state, b + "attn.qkv.weight"), cfg)):
            put(out, h + f"self_attn.{name}_proj.weight", w)
        if biased:
            for name, w in zip("qkv", split_qkv(lm_key(state, b + "attn.qkv.bias"), cfg)):
                put(out, h + f"self_attn.{name}_proj.bias", w)
        for hf_lin, lm_lin in (("self_attn.out_proj", "attn.out"), ("fc1", "mlp.w_in"), ("fc2", "mlp.w_out")):
            put(out, h + hf_lin + ".weight", lm_key(state, b + lm_lin + ".weight"))
            put(out, h + hf_lin + ".bias", lm_key(state, b + lm_lin + ".bias", biased))
    if cfg.final_norm:
        put(out, p + "final_layer_norm.weight", lm_key(state, "final_norm.weight", cfg.norm_affine))
        put(out, p + "final_layer_norm.bias", lm_key(state, "final_norm.bias", cfg.norm_affine))
    if not cfg.tie_embeddings:
        put(out, "lm_head.weight", lm_key(state, "lm_head.weight"))
    return out


FAMILY = register(Family(
    model_type=NAME, hf_class="OPTForCausalLM", config_to_lmlab=config_to_lmlab, state_to_lmlab=state_to_lmlab,
    config_to_hf=config_to_hf, state_to_hf=state_to_hf,
    notes="exact, pre-norm and post-norm (OPT-350M): learned positions with OPT's offset of 2 "
          "(learned_pos_offset), word_embed_proj_dim as embed_dim (project_in / project_out), "
          "layer_norm_elementwise_affine=False as norm_affine=False. HF fixes LayerNorm eps at 1e-5.",
))
