"""Gemma 4, dense text model (transformers ``Gemma4ForCausalLM``, model_type 'gemma4_text'; Gemma Team
2026, model cards google/gemma-4-*; HF ``modeling_gemma4.py``, ``configuration_gemma4.py``).

Gemma 3's sandwich block (input, post-attention, pre- and post-feedforward RMSNorms; embeddings x
sqrt(d_model); GeGLU with the tanh GELU; 5 sliding-window layers : 1 full by default, the last layer
always full) with, read off ``Gemma4TextAttention`` / ``Gemma4TextDecoderLayer``:

- plain RMSNorms, weight applied in fp32 (x / sqrt(mean(x^2) + eps) * w, not Gemma 3's (1 + w)): lmlab
  ``norm_type='rmsnorm'``, ``norm_weight_fp32``; QK-norm the same over each head (``qk_norm='rmsnorm'``);
- a weightless RMSNorm on each value head (``v_norm``) and query scale 1 (HF ``scaling = 1.0``: lmlab
  ``query_pre_attn_scalar=1``);
- full-attention layers with their own head width and KV heads (``global_head_dim`` and
  ``num_global_key_value_heads``, which transformers resolves into ``per_layer_config``; the latter only
  with ``attention_k_eq_v``) and, with ``attention_k_eq_v``, no v_proj: the values are the raw key
  projection (lmlab ``global_head_dim``, ``global_n_kv_heads``, ``global_k_eq_v``);
- RoPE per layer type: 'default' on sliding layers, 'default' or 'proportional' on full layers
  (``partial_rotary_factor`` of the pairs of the whole head rotate, frequencies over the whole head:
  lmlab ``global_rope_proportion``; a proportional ``factor`` divides the frequencies: linear scaling);
- ``layer_scalar``: a stored scalar multiplying each block's output (lmlab ``layer_scalar``);
- the final-logit soft-cap (``final_logit_softcapping``);
- E2B / E4B: per-layer input embeddings (``hidden_size_per_layer_input``, ``vocab_size_per_layer_input``:
  lmlab ``ple_dim``, ``ple_vocab_size``) and KV sharing (``num_kv_shared_layers``: the last layers read
  the keys and values of the last earlier layer of their type, lmlab ``kv_shared_layers``), whose MLPs are
  twice as wide with ``use_double_wide_mlp`` (lmlab ``kv_shared_wide_ffn``). HF builds no k/v projections
  or norms on the KV-shared layers and ignores such tensors in a checkpoint; so does the import.

- 26B-A4B: ``enable_moe_block``, on every layer a mixture of ``num_experts`` GeGLU experts of width
  ``moe_intermediate_size`` (top ``top_k_experts``, softmax renormalised, x a learned per-expert scale)
  beside the dense MLP, its router reading the raw residual (weightless RMSNorm x a learned vector /
  sqrt(d)), the experts their own pre-norm, each branch post-normed, the sum normed again (lmlab
  ``moe_beside_dense``, ``router_input_norm``, ``router_expert_scale``). Experts are stored stacked:
  ``experts.gate_up_proj`` (experts, 2 x width, d) and ``experts.down_proj`` (experts, d, width). HF adds
  no load-balancing loss to Gemma 4's loss, and neither does the import.

Refused, naming the field (lmlab has no exact equivalent): bidirectional attention, RoPE types other than
those above, and layer overrides that differ between full layers or touch sliding ones. The
multimodal ``Gemma4ForConditionalGeneration`` (model_type 'gemma4') is not read: import a folder holding
its text model.
"""

from __future__ import annotations

import torch

from lmlab.config import ModelConfig
from lmlab.interop import common as C
from lmlab.interop.registry import Family, StateDict, register
from lmlab.interop.roundtrip import verify_roundtrip

FAM, HF_CLASS = "gemma4_text", "Gemma4ForCausalLM"
# fmt: off
DEFAULTS = dict(vocab_size=262144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30,
                num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters=None,
                attention_bias=False, attention_dropout=0.0, sliding_window=512, layer_types=None,
                final_logit_softcapping=None, use_bidirectional_attention=None, vocab_size_per_layer_input=262144,
                hidden_size_per_layer_input=256, attention_k_eq_v=False, num_kv_shared_layers=0,
                enable_moe_block=False, use_double_wide_mlp=False, num_experts=None, top_k_experts=None,
                moe_intermediate_size=None, global_head_dim=512, num_global_key_value_heads=None,
                per_layer_config=None)
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
# fmt: on
HANDLED = set(DEFAULTS)
# fmt: off
NORMS = {"attn_norm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
         "mlp_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}
# fmt: on


def _number(field: str, value, minimum: float = 0.0, integer: bool = False):
    """``value`` checked to be a number (a whole one with ``integer``) >= ``minimum``; UnsupportedError
    naming ``field`` otherwise (a string, null, true/false or NaN is not read as a number)."""
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or not value >= minimum:
        what = "a whole number" if integer else "a number"
        raise C.unsupported(FAM, field, value, f"{what} >= {minimum:g}")
    return value


def _flag(hf: dict, field: str) -> bool:
    """A true/false field (null: the default); UnsupportedError for anything else ('yes', 1)."""
    value = C.get(hf, field, DEFAULTS)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise C.unsupported(FAM, field, value, "true or false")
    return value


def _layer_types(hf: dict, n_layers: int) -> list[str]:
    """``layer_types`` as Gemma4TextConfig resolves them: 5 sliding : 1 full by default, the last layer
    forced to full attention."""
    types = C.get(hf, "layer_types", DEFAULTS)
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layers)]
    types = list(types)
    if len(types) != n_layers:
        raise C.unsupported(FAM, "layer_types", types, f"one entry per layer ({n_layers})")
    types[-1] = "full_attention"  # Gemma4TextConfig.__post_init__ forces it (with a warning; see notes)
    return types


def notes(hf: dict) -> list[str]:
    """What the import reads differently from config.json, as transformers does (printed by lmlab import)."""
    types = hf.get("layer_types")
    if isinstance(types, list) and types and types[-1] != "full_attention":
        return [f"layer_types[-1]={types[-1]!r}: the last layer is full attention, as Gemma4TextConfig forces it"]
    return []


def _global_sizes(hf: dict, types: list[str], head_dim: int, kv: int) -> tuple[int, int]:
    """(head_dim, KV heads) of the full-attention layers: from ``per_layer_config`` when the config.json
    carries it (transformers 5 saves it), else from ``global_head_dim`` / ``num_global_key_value_heads`` as
    Gemma4TextConfig derives it (the KV override only with ``attention_k_eq_v``)."""
    per_layer = C.get(hf, "per_layer_config", DEFAULTS)
    if per_layer is None:
        g_head = C.get(hf, "global_head_dim", DEFAULTS)
        g_head = 512 if g_head is None else _number("global_head_dim", g_head, 1, integer=True)
        g_kv = C.get(hf, "num_global_key_value_heads", DEFAULTS)
        if g_kv is None or not _flag(hf, "attention_k_eq_v"):  # the override needs attention_k_eq_v
            return g_head, kv
        return g_head, _number("num_global_key_value_heads", g_kv, 1, integer=True)
    try:  # transformers 5 saves the indices as zero-padded strings ('05')
        per_layer = {int(k): v for k, v in per_layer.items()}
    except (AttributeError, TypeError, ValueError):
        raise C.unsupported(FAM, "per_layer_config", per_layer, "a mapping of layer index to overrides") from None
    outside = sorted(i for i in per_layer if not 0 <= i < len(types))
    if outside:
        raise C.unsupported(
            FAM, f"per_layer_config.{outside[0]}", per_layer[outside[0]], f"layer indices 0 to {len(types) - 1}"
        )
    sizes = set()
    for i, t in enumerate(types):
        over = per_layer.get(i) or {}
        if not isinstance(over, dict) or set(over) - {"head_dim", "num_key_value_heads"}:
            raise C.unsupported(FAM, f"per_layer_config.{i}", over, "overrides of head_dim and num_key_value_heads")
        if t == "sliding_attention" and over:
            raise C.unsupported(FAM, f"per_layer_config.{i}", over, "no overrides on sliding layers")
        if t == "full_attention":
            sizes.add(
                (
                    _number(f"per_layer_config.{i}.head_dim", over.get("head_dim", head_dim), 1, integer=True),
                    _number(
                        f"per_layer_config.{i}.num_key_value_heads",
                        over.get("num_key_value_heads", kv),
                        1,
                        integer=True,
                    ),
                )
            )
    if len(sizes) > 1:
        raise C.unsupported(FAM, "per_layer_config", per_layer, "the same head_dim and KV heads on every full layer")
    return sizes.pop() if sizes else (head_dim, kv)


def _rope(hf: dict, types: list[str], head_dim: int) -> dict:
    """ModelConfig RoPE fields from the per-layer-type ``rope_parameters``."""
    params = C.get(hf, "rope_parameters", DEFAULTS) or DEFAULT_ROPE
    kw: dict = {}
    for t in sorted(set(types)):
        p = params.get(t) if isinstance(params, dict) else None
        field = f"rope_parameters.{t}"
        if not isinstance(p, dict) or p.get("rope_theta") is None:
            raise C.unsupported(FAM, field, p, "a mapping with rope_type and rope_theta for each layer type")
        kind = p.get("rope_type", "default")
        theta = float(_number(f"{field}.rope_theta", p["rope_theta"], 1e-12))
        extra = sorted(set(p) - {"rope_type", "rope_theta", "partial_rotary_factor", "factor"})
        if extra:
            raise C.unsupported(
                FAM,
                f"{field}.{extra[0]}",
                p[extra[0]],
                "rope_type, rope_theta, partial_rotary_factor and (proportional) factor",
            )
        if t == "sliding_attention":
            if kind != "default":
                raise C.unsupported(FAM, f"{field}.rope_type", kind, "'default' on sliding layers")
            kw["rope_local_theta"] = theta
            continue
        if kind not in ("default", "proportional"):
            raise C.unsupported(FAM, f"{field}.rope_type", kind, "'default' or 'proportional' on full layers")
        kw["rope_theta"] = theta
        if kind == "proportional":  # HF: int(fraction * head_dim // 2) pairs turn; inv_freq / factor
            fraction = p.get("partial_rotary_factor")
            fraction = 1.0 if fraction is None else float(_number(f"{field}.partial_rotary_factor", fraction))
            if fraction > 1:
                raise C.unsupported(FAM, f"{field}.partial_rotary_factor", fraction, "a fraction in [0, 1]")
            factor = p.get("factor")
            factor = 1.0 if factor is None else float(_number(f"{field}.factor", factor, 1.0))
            if int(fraction * head_dim // 2) == 0:  # no pair turns: the full layers carry no positions
                kw["global_nope"] = True
            elif fraction != 1.0:
                kw["global_rope_proportion"] = fraction
            if factor != 1.0:
                kw["rope_scaling"] = {"type": "linear", "factor": factor}
        elif p.get("factor") is not None:
            raise C.unsupported(FAM, f"{field}.factor", p["factor"], "no factor with rope_type 'default'")
    return kw


def config_to_lmlab(hf: dict) -> ModelConfig:
    C.check_fields(hf, FAM, HANDLED)
    g = lambda k: C.get(hf, k, DEFAULTS)  # noqa: E731
    if g("use_bidirectional_attention") not in (None, False):
        raise C.unsupported(
            FAM, "use_bidirectional_attention", g("use_bidirectional_attention"), "null (lmlab models are causal)"
        )
    n_layers, heads, hidden = g("num_hidden_layers"), g("num_attention_heads"), g("hidden_size")
    kv, head_dim = g("num_key_value_heads") or heads, g("head_dim") or hidden // heads
    types = _layer_types(hf, n_layers)
    g_head, g_kv = _global_sizes(hf, types, head_dim, kv)
    kw: dict = dict(
        **C.read_sizes(g, d_model=hidden, n_layers=n_layers, n_heads=heads, n_kv_heads=kv, head_dim=head_dim),
        activation=C.gated_activation(FAM, "hidden_activation", g("hidden_activation")),
        norm_type="rmsnorm",
        norm_weight_fp32=True,
        norm_eps=float(g("rms_norm_eps")),
        norm_position="sandwich",
        bias="attention" if g("attention_bias") else "none",
        position="rope",
        rope_style="half",
        qk_norm="rmsnorm",
        v_norm=True,
        query_pre_attn_scalar=1.0,
        scale_embeddings=True,
        layer_scalar=True,
        final_logit_softcap=g("final_logit_softcapping"),
    )
    shared = g("num_kv_shared_layers") or 0
    if not isinstance(shared, int) or not 0 <= shared < n_layers:
        raise C.unsupported(FAM, "num_kv_shared_layers", shared, f"a whole number from 0 to {n_layers - 1}")
    kw.update(kv_shared_layers=shared, kv_shared_wide_ffn=bool(shared and _flag(hf, "use_double_wide_mlp")))
    for field in ("tie_word_embeddings", "attention_bias"):
        if not isinstance(g(field), bool):
            raise C.unsupported(FAM, field, g(field), "true or false")
    if _flag(hf, "enable_moe_block"):  # Gemma4TextRouter: softmax, top-k, renormalised, x per_expert_scale
        for field in ("num_experts", "top_k_experts", "moe_intermediate_size"):
            if not isinstance(g(field), int) or g(field) < 1:
                raise C.unsupported(FAM, field, g(field), "a whole number >= 1 with enable_moe_block")
        kw.update(
            n_experts=g("num_experts"),
            experts_per_token=g("top_k_experts"),
            expert_d_ff=g("moe_intermediate_size"),
            router_score="softmax",
            router_renormalize=True,
            moe_beside_dense=True,
            router_input_norm=True,
            router_expert_scale=True,
        )
    if g("hidden_size_per_layer_input"):
        _number("hidden_size_per_layer_input", g("hidden_size_per_layer_input"), 1, integer=True)
        vocab = g("vocab_size_per_layer_input")
        kw.update(ple_dim=g("hidden_size_per_layer_input"), ple_vocab_size=None if vocab == kw["vocab_size"] else vocab)
    pattern = C.pattern_from_types(types, FAM)
    rope = _rope(hf, types, g_head)
    if rope.pop("global_nope", False):  # proportional RoPE turning no pair (partial_rotary_factor 0)
        rope.pop("rope_scaling", None)
        kw["nope_global_layers"] = True
    if pattern is None:  # every layer full: no local layers to set the global ones apart from
        if (
            (g_head, g_kv) != (head_dim, kv)
            or _flag(hf, "attention_k_eq_v")
            or rope.get("global_rope_proportion")
            or kw.get("nope_global_layers")
        ):
            raise C.unsupported(
                FAM,
                "layer_types",
                types,
                "some sliding layers when the full layers have their "
                "own head_dim, KV heads, attention_k_eq_v or proportional RoPE",
            )
        rope.pop("rope_local_theta", None)
    else:
        kw.update(
            sliding_window=_number("sliding_window", g("sliding_window"), 1, integer=True),
            layer_pattern=None if pattern == "L" else pattern,
            global_head_dim=g_head if g_head != head_dim else None,
            global_n_kv_heads=g_kv if g_kv != kv else None,
            global_k_eq_v=_flag(hf, "attention_k_eq_v"),
        )
        if "G" not in pattern:  # no full layer: its RoPE and sizes are moot
            for key in ("global_head_dim", "global_n_kv_heads"):
                kw[key] = None
            kw["global_k_eq_v"] = kw["nope_global_layers"] = False
            rope = {"rope_theta": rope.pop("rope_local_theta")}
    kw.update(rope)
    return C.lmlab_config(FAM, kw)


def config_to_hf(cfg: ModelConfig) -> dict:
    """Gemma4TextConfig for ``cfg``; UnsupportedError naming what Gemma 4 cannot represent."""
    types = C.types_from_cfg(cfg)
    g_head, g_kv = cfg.layer_head_dim_of(True), cfg.layer_n_kv_heads_of(True)
    full: dict = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    if cfg.global_rope_proportion is not None or cfg.rope_scaling is not None or cfg.nope_global_layers:
        scaling = cfg.rope_scaling or {"type": "linear", "factor": 1.0}
        if scaling["type"] != "linear":
            raise C.unsupported(FAM, "rope_scaling", scaling, "None or linear (proportional RoPE's factor)")
        fraction = 0.0 if cfg.nope_global_layers else float(cfg.global_rope_proportion or 1.0)
        full = {"rope_type": "proportional", "rope_theta": float(cfg.rope_theta), "partial_rotary_factor": fraction}
        if scaling["factor"] != 1.0:  # transformers warns of a factor key it does not list (but applies it)
            full["factor"] = float(scaling["factor"])
    local_theta = cfg.rope_local_theta or cfg.rope_theta
    rope = {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": float(local_theta)}}
    hf: dict = {
        **C.hf_sizes(FAM, HF_CLASS, cfg),
        "head_dim": cfg.head_dim,
        "rms_norm_eps": float(cfg.norm_eps),
        "hidden_activation": C.GATED_ACT_TO_HF.get(cfg.activation, cfg.activation),
        "attention_bias": cfg.bias == "attention",
        "rope_parameters": rope,
        "layer_types": types,
        "sliding_window": cfg.sliding_window or cfg.context_length,
        "final_logit_softcapping": None if cfg.final_logit_softcap is None else float(cfg.final_logit_softcap),
        "use_bidirectional_attention": None,
        "hidden_size_per_layer_input": cfg.ple_dim,
        "vocab_size_per_layer_input": cfg.ple_vocab_size or cfg.vocab_size,
        "num_kv_shared_layers": cfg.kv_shared_layers,
        "use_double_wide_mlp": cfg.kv_shared_wide_ffn,
        "enable_moe_block": bool(cfg.n_experts),
        "attention_k_eq_v": cfg.global_k_eq_v,
        # the published spelling, and the resolved one transformers 5 saves (it wins when both are read)
        "global_head_dim": g_head,
        "per_layer_config": {
            str(i): {"head_dim": g_head, "num_key_value_heads": g_kv}
            for i, t in enumerate(types)
            if t == "full_attention"
        },
    }
    if cfg.global_k_eq_v:
        hf["num_global_key_value_heads"] = g_kv
    if cfg.n_experts:
        hf.update(
            num_experts=cfg.n_experts,
            top_k_experts=cfg.experts_per_token,
            moe_intermediate_size=cfg.expert_d_ff or cfg.d_ff,
        )
    return verify_roundtrip(FAM, cfg, hf, config_to_lmlab)


def tensor_maps(cfg: ModelConfig) -> list[C.TensorMap]:
    """Per layer (each with its own head_dim and KV heads): q/k[/v]_proj -> attn.qkv (q_proj alone on a
    KV-shared layer), o_proj, the QK-norm weights, gate/up/down_proj, the four sandwich norms, the
    per-layer-input gate, projection and norm, and ``layer_scalar``; the per-layer embedding table, its
    model projection and norm."""
    H, d = cfg.n_heads, cfg.d_model
    maps = []
    if cfg.ple_dim:
        maps += [
            C.TensorMap("ple_embed.weight", ("model.embed_tokens_per_layer.weight",), (-1,)),
            C.TensorMap("ple_proj.weight", ("model.per_layer_model_projection.weight",), (-1,)),
            C.TensorMap("ple_norm.weight", ("model.per_layer_projection_norm.weight",), (-1,)),
        ]
    for i in range(cfg.n_layers):
        p, b = f"model.layers.{i}", f"blocks.{i}"
        K, D, F = cfg.layer_n_kv_heads(i), cfg.layer_head_dim(i), cfg.layer_d_ff(i)
        names, sizes = ["q_proj"], [H * D]
        if cfg.layer_kv_source(i) is None:
            names.append("k_proj")
            sizes.append(K * D)
        if cfg.layer_kv_source(i) is None and not cfg.layer_k_eq_v(i):
            names.append("v_proj")
            sizes.append(K * D)
        for s in ("weight", "bias"):
            maps.append(C.TensorMap(f"{b}.attn.qkv.{s}", tuple(f"{p}.self_attn.{n}.{s}" for n in names), tuple(sizes)))
            maps.append(C.TensorMap(f"{b}.attn.out.{s}", (f"{p}.self_attn.o_proj.{s}",), (d,)))
        for ours in ("q_norm", "k_norm"):
            maps.append(C.TensorMap(f"{b}.attn.{ours}.weight", (f"{p}.self_attn.{ours}.weight",), (-1,)))
        maps.append(
            C.TensorMap(f"{b}.mlp.w_in.weight", (f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"), (F, F))
        )
        maps.append(C.TensorMap(f"{b}.mlp.w_out.weight", (f"{p}.mlp.down_proj.weight",), (d,)))
        for ours, theirs in NORMS.items():
            maps.append(C.TensorMap(f"{b}.{ours}.weight", (f"{p}.{theirs}.weight",), (d,)))
        maps.append(C.TensorMap(f"{b}.layer_scalar", (f"{p}.layer_scalar",), (1,)))
        for ours, theirs in (
            ("gate", "per_layer_input_gate"),
            ("out", "per_layer_projection"),
            ("norm", "post_per_layer_input_norm"),
        ):
            maps.append(C.TensorMap(f"{b}.ple.{ours}.weight", (f"{p}.{theirs}.weight",), (-1,)))
        if cfg.layer_is_moe(i):  # the MoE block beside the MLP; experts split per expert by _split_experts
            for ours, theirs in (
                ("moe.router.weight", "router.proj.weight"),
                ("moe.router_scale", "router.scale"),
                ("moe.expert_scale", "router.per_expert_scale"),
                ("dense_out_norm.weight", "post_feedforward_layernorm_1.weight"),
                ("moe_norm.weight", "pre_feedforward_layernorm_2.weight"),
                ("moe_out_norm.weight", "post_feedforward_layernorm_2.weight"),
            ):
                maps.append(C.TensorMap(f"{b}.{ours}", (f"{p}.{theirs}",), (-1,)))
            for e in range(cfg.n_experts):
                maps.append(C.TensorMap(f"{b}.moe.experts.{e}.w_in.weight", (f"{p}.experts.{e}.gate_up",), (-1,)))
                maps.append(C.TensorMap(f"{b}.moe.experts.{e}.w_out.weight", (f"{p}.experts.{e}.down",), (-1,)))
    return C.model_maps(cfg, maps)


def to_lmlab_state(state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    # KV-shared layers: HF builds no k/v projections or norms there and ignores them in a checkpoint
    # (Gemma4TextModel._keys_to_ignore_on_load_unexpected): unused by the forward pass, so dropped here too
    unused = {
        f"model.layers.{i}.self_attn.{n}.{s}"
        for i in range(cfg.n_layers)
        if cfg.layer_kv_source(i) is not None
        for n in ("k_proj", "v_proj", "k_norm", "v_norm")
        for s in ("weight", "bias")
    }
    state = {k: v for k, v in state.items() if k not in unused}
    for p, gate_up, down in C.pop_stacked_experts(state, cfg, "model.layers.{i}.experts", FAM):
        for e in range(cfg.n_experts):  # stored as nn.Linear weights: (2 x width, d) [gate | up], (d, width)
            state[f"{p}.{e}.gate_up"], state[f"{p}.{e}.down"] = gate_up[e], down[e]
    return C.state_to_lmlab(state, cfg, tensor_maps(cfg), FAM)


def to_hf_state(state: StateDict, cfg: ModelConfig) -> StateDict:

    out = C.state_to_hf(state, cfg, tensor_maps(cfg))
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}.experts"
        if f"{p}.0.gate_up" in out:
            out[f"{p}.gate_up_proj"] = torch.stack([out.pop(f"{p}.{e}.gate_up") for e in range(cfg.n_experts)])
            out[f"{p}.down_proj"] = torch.stack([out.pop(f"{p}.{e}.down") for e in range(cfg.n_experts)])
    return {k: v.contiguous() for k, v in out.items()}


# fmt: off
FAMILY = register(Family(model_type=FAM, hf_class=HF_CLASS, config_to_lmlab=config_to_lmlab,
                         state_to_lmlab=to_lmlab_state, config_to_hf=config_to_hf, state_to_hf=to_hf_state,
                         notes="Gemma 4 dense text: sandwich RMSNorms, QK- and V-norm, query scale 1, full layers "
                               "with their own head_dim / KV heads, keys as values and proportional RoPE, "
                               "layer scalars, 5:1 local/global",
                         unread_notes=notes))
# fmt: on
