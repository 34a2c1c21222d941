"""Llama 4, text (transformers ``Llama4ForCausalLM``, model_type 'llama4_text'; Meta 2025, "The Llama 4
herd", https://ai.meta.com/blog/llama-4-multimodal-intelligence/; HF ``modeling_llama4.py``).

The Llama block with, per layer (read off ``Llama4TextConfig`` / ``Llama4TextAttention``):

- RoPE on the layers where ``no_rope_layers`` is 1 (by default all but every ``no_rope_layer_interval``-th),
  rotating adjacent pairs (complex multiplication: lmlab ``rope_style='interleaved'``); with
  ``attention_chunk_size`` those layers attend within chunks of that many tokens (lmlab
  ``local_attention='chunk'``, ``layer_pattern`` 'L' there, 'G' on the NoPE layers, ``nope_global_layers``);
  without it, ``nope_layers``;
- ``use_qk_norm``: "L2Norm" of q and k on the RoPE layers, x / sqrt(mean(x^2) + rms_norm_eps) per head
  with no weight (lmlab ``qk_norm='l2'``, ``qk_norm_layers='rope'``; HF applies it after RoPE, a
  rotation, so before is the same);
- ``attn_temperature_tuning`` on the NoPE layers: q x (1 + attn_scale log(1 + floor((p + 1) / floor_scale)))
  (lmlab ``attn_temperature_tuning``, ``attn_temperature_floor``, ``attn_temperature_scale``). HF takes p
  from the cache index, lmlab from each token's position: equal without left padding (and for every
  position below ``floor_scale`` - 1, where the factor is 1);
- the FFN: on the layers of ``moe_layers`` (default every ``interleave_moe_layer_step``-th) a mixture of
  ``num_local_experts`` SwiGLU experts of width ``intermediate_size``, top ``num_experts_per_tok`` by
  router logit, each scored by the sigmoid of its logit and fed the token times that score (lmlab
  ``router_score='sigmoid'``, ``router_renormalize=False``, ``router_weights='input'``), plus one shared
  expert of the same width; elsewhere a dense SwiGLU of width ``intermediate_size_mlp``.

Checkpoint tensors: ``feed_forward.router`` (the router), ``feed_forward.experts.gate_up_proj``
(experts, d_model, 2 x width: [gate | up]) and ``.down_proj`` (experts, width, d_model), stored transposed
against ``nn.Linear``; ``feed_forward.shared_expert.{gate,up,down}_proj``; dense layers
``feed_forward.{gate,up,down}_proj``. HF's Llama 4 adds no load-balancing loss in its forward, so
``output_router_logits`` / ``router_aux_loss_coef`` are accepted and not mapped; ``router_jitter_noise``
other than 0 is refused. The multimodal ``Llama4ForConditionalGeneration`` (model_type 'llama4') is
not read: import its text model's folder.
"""

from __future__ import annotations

import torch

from lmlab.config import ModelConfig
from lmlab.interop import common as C
from lmlab.interop.registry import Family, StateDict, register
from lmlab.interop.roundtrip import verify_roundtrip

FAM, HF_CLASS = "llama4_text", "Llama4ForCausalLM"
# fmt: off
DEFAULTS = dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
                num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, tie_word_embeddings=False,
                attention_dropout=0.0, num_experts_per_tok=1, num_local_experts=16, moe_layers=None,
                interleave_moe_layer_step=1, use_qk_norm=True, output_router_logits=False,
                router_aux_loss_coef=0.001, router_jitter_noise=0.0, no_rope_layers=None, no_rope_layer_interval=4,
                attention_chunk_size=8192, layer_types=None, attn_temperature_tuning=True, floor_scale=8192,
                attn_scale=0.1, attention_bias=False)
# fmt: on
DEFAULT_THETA = 500000.0
HANDLED = set(DEFAULTS)


def _flags(hf: dict, n_layers: int) -> list[int]:
    g = lambda k: C.get(hf, k, DEFAULTS)  # noqa: E731
    flags = g("no_rope_layers") or [int((i + 1) % g("no_rope_layer_interval") != 0) for i in range(n_layers)]
    if len(flags) < n_layers or any(f not in (0, 1) for f in flags[:n_layers]):
        raise C.unsupported(FAM, "no_rope_layers", flags, f"a 0 or 1 for each of the {n_layers} layers")
    return [int(f) for f in flags[:n_layers]]


def _moe_layers(hf: dict, n_layers: int) -> list[int]:
    g = lambda k: C.get(hf, k, DEFAULTS)  # noqa: E731
    layers = g("moe_layers")
    if layers is None:
        step = g("interleave_moe_layer_step")
        layers = list(range(step - 1, n_layers, step))
    if any(not isinstance(i, int) or not 0 <= i < n_layers for i in layers):
        raise C.unsupported(FAM, "moe_layers", layers, f"layer indices in 0..{n_layers - 1}")
    return sorted(set(layers))


def config_to_lmlab(hf: dict) -> ModelConfig:
    C.check_fields(hf, FAM, HANDLED)
    g = lambda k: C.get(hf, k, DEFAULTS)  # noqa: E731
    n_layers, heads = g("num_hidden_layers"), g("num_attention_heads")
    hidden = g("hidden_size")
    kw: dict = dict(
        **C.read_sizes(
            g,
            d_model=hidden,
            n_layers=n_layers,
            n_heads=heads,
            n_kv_heads=g("num_key_value_heads") or heads,
            head_dim=g("head_dim") or hidden // heads,
            d_ff=g("intermediate_size_mlp"),
        ),
        activation=C.gated_activation(FAM, "hidden_act", g("hidden_act")),
        norm_type="rmsnorm",
        norm_eps=float(g("rms_norm_eps")),
        norm_position="pre",
        bias="attention" if g("attention_bias") else "none",
        position="rope",
        rope_style="interleaved",
    )
    theta, scaling, partial = C.read_rope(hf, FAM, default_theta=DEFAULT_THETA)
    if partial != 1.0:
        raise C.unsupported(FAM, "partial_rotary_factor", partial, "1.0 (Llama 4 rotates the whole head)")
    kw.update(rope_theta=theta, rope_scaling=scaling)

    flags, chunk = _flags(hf, n_layers), g("attention_chunk_size")
    want = ["chunked_attention" if f and chunk is not None else "full_attention" for f in flags]
    if hf.get("layer_types") is not None and list(hf["layer_types"]) != want:
        raise C.unsupported(
            FAM,
            "layer_types",
            hf["layer_types"],
            f"{want}: chunked exactly on the RoPE layers of no_rope_layers={flags} when "
            f"attention_chunk_size={chunk!r} is set, as Llama4TextConfig derives them",
        )
    letters = "".join("R" if f else "N" for f in flags)
    if chunk is not None and "R" in letters:
        pattern = C.shortest_period(letters.replace("R", "L").replace("N", "G"))
        kw.update(
            sliding_window=int(chunk),
            local_attention="chunk",
            layer_pattern=None if pattern == "L" else pattern,
            nope_global_layers="G" in pattern,
        )
    elif "N" in letters:
        kw["nope_layers"] = C.shortest_period(letters)
    if "R" not in letters:
        kw.update(position="nope", rope_scaling=None, nope_layers=None)
    if g("use_qk_norm") and "R" in letters:
        kw.update(qk_norm="l2", qk_norm_layers="rope")
    if g("attn_temperature_tuning") and "N" in letters:
        kw.update(
            attn_temperature_tuning=True,
            attn_temperature_floor=int(g("floor_scale")),
            attn_temperature_scale=float(g("attn_scale")),
        )

    moe = _moe_layers(hf, n_layers)
    if moe:
        C.refuse_router_noise(FAM, g)
        kw.update(
            n_experts=g("num_local_experts"),
            experts_per_token=g("num_experts_per_tok"),
            n_shared_experts=1,
            expert_d_ff=g("intermediate_size"),
            router_score="sigmoid",
            router_renormalize=False,
            router_weights="input",
            moe_pattern=C.shortest_period("".join("M" if i in moe else "D" for i in range(n_layers))),
        )
    return C.lmlab_config(FAM, kw)


def config_to_hf(cfg: ModelConfig) -> dict:
    """Llama4TextConfig for ``cfg``; UnsupportedError naming what Llama 4 cannot represent."""
    rot = int(round(cfg.head_dim * cfg.rope_fraction))
    flags = [int(cfg.layer_has_rope(i)) for i in range(cfg.n_layers)]
    chunked = cfg.local_attention == "chunk" and any(cfg.layer_is_local(i) for i in range(cfg.n_layers))
    moe = [i for i in range(cfg.n_layers) if cfg.layer_is_moe(i)]
    width = cfg.expert_d_ff or cfg.d_ff
    hf: dict = {
        **C.hf_sizes(FAM, HF_CLASS, cfg, intermediate_size=width),
        "intermediate_size_mlp": cfg.d_ff,
        "head_dim": cfg.head_dim,
        "hidden_act": C.GATED_ACT_TO_HF.get(cfg.activation, cfg.activation),
        "rms_norm_eps": float(cfg.norm_eps),
        "attention_bias": cfg.bias == "attention",
        "rope_parameters": C.rope_to_hf(cfg.rope_theta, cfg.rope_scaling, rot),
        "no_rope_layers": flags,
        "attention_chunk_size": cfg.sliding_window if chunked else None,
        "use_qk_norm": cfg.qk_norm == "l2",
        "attn_temperature_tuning": cfg.attn_temperature_tuning,
        "floor_scale": cfg.attn_temperature_floor,
        "attn_scale": cfg.attn_temperature_scale,
        "moe_layers": moe,
        "num_local_experts": cfg.n_experts or 1,
        "num_experts_per_tok": cfg.experts_per_token if cfg.n_experts else 1,
        "output_router_logits": False,
        "router_jitter_noise": 0.0,
    }
    return verify_roundtrip(FAM, cfg, hf, config_to_lmlab)


def tensor_maps(cfg: ModelConfig) -> list[C.TensorMap]:
    layers = [
        m
        for m in C.llama_layer_maps(cfg, {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"})
        if ".mlp." not in m.lmlab
    ]
    F, W, d = cfg.d_ff, cfg.expert_d_ff or cfg.d_ff, cfg.d_model
    for i in range(cfg.n_layers):
        p, b = f"model.layers.{i}.feed_forward", f"blocks.{i}.mlp"
        if not cfg.layer_is_moe(i):
            layers.append(C.TensorMap(f"{b}.w_in.weight", (f"{p}.gate_proj.weight", f"{p}.up_proj.weight"), (F, F)))
            layers.append(C.TensorMap(f"{b}.w_out.weight", (f"{p}.down_proj.weight",), (d,)))
            continue
        layers.append(C.TensorMap(f"{b}.router.weight", (f"{p}.router.weight",), (cfg.n_experts,)))
        for e in range(cfg.n_experts):  # per-expert views made by _split_experts
            layers.append(C.TensorMap(f"{b}.experts.{e}.w_in.weight", (f"{p}.experts.{e}.gate_up",), (2 * W,)))
            layers.append(C.TensorMap(f"{b}.experts.{e}.w_out.weight", (f"{p}.experts.{e}.down",), (d,)))
        s = f"{p}.shared_expert"
        layers.append(C.TensorMap(f"{b}.shared.w_in.weight", (f"{s}.gate_proj.weight", f"{s}.up_proj.weight"), (W, W)))
        layers.append(C.TensorMap(f"{b}.shared.w_out.weight", (f"{s}.down_proj.weight",), (d,)))
    return C.model_maps(cfg, layers)


def _split_experts(state: StateDict, cfg: ModelConfig) -> StateDict:
    """HF's stacked expert tensors -> one (out, in) matrix per expert, named as tensor_maps reads them."""
    out = dict(state)
    for p, gate_up, down in C.pop_stacked_experts(out, cfg, "model.layers.{i}.feed_forward.experts", FAM):
        for e in range(cfg.n_experts):
            out[f"{p}.{e}.gate_up"] = gate_up[e].t()
            out[f"{p}.{e}.down"] = down[e].t()
    return out


def to_lmlab_state(state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    return C.state_to_lmlab(_split_experts(state, cfg), cfg, tensor_maps(cfg), FAM)


def to_hf_state(state: StateDict, cfg: ModelConfig) -> StateDict:

    out = C.state_to_hf(state, cfg, tensor_maps(cfg))
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}.feed_forward.experts"
        if f"{p}.0.gate_up" not in out:
            continue
        out[f"{p}.gate_up_proj"] = torch.stack([out.pop(f"{p}.{e}.gate_up").t() for e in range(cfg.n_experts)])
        out[f"{p}.down_proj"] = torch.stack([out.pop(f"{p}.{e}.down").t() for e in range(cfg.n_experts)])
    return {k: v.contiguous() for k, v in out.items()}


# fmt: off
FAMILY = register(Family(model_type=FAM, hf_class=HF_CLASS, config_to_lmlab=config_to_lmlab,
                         state_to_lmlab=to_lmlab_state, config_to_hf=config_to_hf, state_to_hf=to_hf_state,
                         notes="Llama 4 text: chunked RoPE layers, NoPE layers with temperature tuning, L2 QK-norm, "
                               "MoE of sigmoid-scored experts fed the scaled token plus a shared expert",
                         unread_notes=lambda hf: []))
# fmt: on
