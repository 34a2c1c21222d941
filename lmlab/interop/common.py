"""Helpers shared by the Hugging Face family converters (``lmlab/interop/families/``).

- strict reading of ``config.json``: :func:`check_fields` refuses any field a converter does not handle
  (other than the metadata listed in :data:`META_FIELDS`, which never changes the forward pass);
- RoPE parameters in both of HF's spellings (v5 ``rope_parameters``; v4 ``rope_theta`` + ``rope_scaling``),
  to and from ``ModelConfig.rope_theta`` / ``rope_scaling`` (:func:`read_rope`, :func:`rope_to_hf`);
- per-layer attention types (``layer_types``) to and from ``ModelConfig.layer_pattern``;
- weight layouts: HF's separate q/k/v and gate/up matrices are concatenated along rows into lmlab's fused
  ``attn.qkv`` ([q heads | k heads | v heads]) and ``mlp.w_in`` ([gate | up]) and split back
  (:func:`convert_state`, driven by a list of :class:`TensorMap` records);
- (:mod:`lmlab.interop.roundtrip` checks each export by reading it back.)

Everything that cannot be represented raises :class:`~lmlab.interop.registry.UnsupportedError` naming the
field, its value and what is supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from lmlab.config import ConfigError, ModelConfig
from lmlab.interop.registry import StateDict, UnsupportedError
from lmlab.model import TransformerLM

# config.json fields that describe the checkpoint, the tokenizer's special ids, initialisation, caching or
# generation defaults: none of them changes the logits of a forward pass.
META_FIELDS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "use_return_dict",
        "torchscript",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "cross_attention_hidden_size",
        "tie_encoder_decoder",
        "pruned_heads",
        "tf_legacy_loss",
        "use_bfloat16",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "initializer_range",
        "use_cache",
        "cache_implementation",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "finetuning_task",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "attn_implementation",
        "use_flash_attn",
        "pretraining_tp",
    }
)

ROPE_FIELDS = frozenset({"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor"})
# HF rope_type -> lmlab rope_scaling type; keys besides rope_type/type/rope_theta carried over unchanged
_ROPE_TYPES = {"linear": "linear", "yarn": "yarn", "llama3": "llama3"}
_ROPE_KEYS = {
    "linear": {"factor"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}
SUPPORTED_ROPE = "default, linear, yarn, llama3"


def unsupported(family: str, field: str, value: Any, supported: str) -> UnsupportedError:
    return UnsupportedError(
        f"{family}: {field}={value!r} cannot be represented exactly by lmlab; supported: {supported}"
    )


# ModelConfig field <- (config.json key, cast): the sizes every Llama-era config.json names alike
_SIZES = (
    ("vocab_size", "vocab_size", None), ("context_length", "max_position_embeddings", None),
    ("d_model", "hidden_size", None), ("n_layers", "num_hidden_layers", None),
    ("n_heads", "num_attention_heads", None), ("n_kv_heads", "num_key_value_heads", None),
    ("head_dim", "head_dim", None), ("d_ff", "intermediate_size", None),
    ("tie_embeddings", "tie_word_embeddings", bool), ("attn_dropout", "attention_dropout", lambda x: float(x or 0.0)),
)  # fmt: skip


def read_sizes(g: Callable[[str], Any], **given: Any) -> dict:
    """The ModelConfig sizes of a Llama-era config.json, each read through ``g`` (config.json key -> value,
    the family's defaults filled in; :func:`get`) under its usual name (``hidden_size``, ``num_hidden_layers``,
    ``max_position_embeddings``, ...; ``tie_word_embeddings`` as a bool, a null ``attention_dropout`` as 0);
    ``given``: fields the family derives or names otherwise (not read), and further fields."""
    out = {lm: (cast or (lambda x: x))(g(key)) for lm, key, cast in _SIZES if lm not in given}
    return {**out, **given}


def hf_sizes(model_type: str, hf_class: str, cfg: ModelConfig, **override: Any) -> dict:
    """The start of a Llama-era config.json for ``cfg``: class, type, fp32, and the sizes of
    :func:`read_sizes` under their usual names (``head_dim`` aside: not every family writes it);
    ``override``: keys the family writes otherwise, and further keys."""
    out = {
        "architectures": [hf_class], "model_type": model_type, "dtype": "float32", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "max_position_embeddings": cfg.context_length, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": float(cfg.attn_dropout),
    }  # fmt: skip
    out.update(override)
    return out


def mapped_states(
    family: str,
    tensor_maps: Callable,
    before_import: Optional[Callable] = None,
    after_export: Optional[Callable] = None,
) -> tuple:
    """``(state_to_lmlab, state_to_hf)`` of a family whose tensors map through ``tensor_maps(cfg)``
    (:func:`state_to_lmlab`, :func:`state_to_hf`), with ``before_import(state, cfg)`` regrouping the HF
    state dict first and ``after_export(state, cfg)`` regrouping the written one last (e.g. stacked experts)."""

    def to_lmlab(state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
        return state_to_lmlab(before_import(state, cfg) if before_import else state, cfg, tensor_maps(cfg), family)

    def to_hf(state: StateDict, cfg: ModelConfig) -> StateDict:
        out = state_to_hf(state, cfg, tensor_maps(cfg))
        return after_export(out, cfg) if after_export else out

    return to_lmlab, to_hf


def refuse_router_noise(family: str, g: Callable[[str], Any]) -> None:
    """UnsupportedError when config.json (read through ``g``) sets ``router_jitter_noise``: lmlab's router
    adds no training-time noise."""
    if g("router_jitter_noise"):
        raise unsupported(family, "router_jitter_noise", g("router_jitter_noise"), "0.0 (lmlab's router adds no noise)")


def lmlab_config(family: str, fields: dict) -> ModelConfig:
    """``ModelConfig(**fields)`` of a config.json read by ``family``'s converter; a value lmlab refuses
    raises UnsupportedError naming the family and ModelConfig's reason."""
    try:
        return ModelConfig(**fields)
    except ConfigError as exc:
        raise UnsupportedError(f"{family}: the config maps to an invalid lmlab config: {exc}") from None


def check_fields(hf: dict, family: str, handled: set | frozenset) -> None:
    """Refuse config.json fields that are neither handled by the ``family`` converter nor metadata."""
    if hf.get("quantization_config"):
        raise unsupported(family, "quantization_config", hf["quantization_config"], "unquantized checkpoints only")
    unknown = sorted(k for k in hf if k not in handled and k not in META_FIELDS and k not in ROPE_FIELDS)
    if unknown:
        raise UnsupportedError(
            f"{family}: config.json field(s) {', '.join(f'{k}={hf[k]!r}' for k in unknown)} are not handled by lmlab's "
            f"{family} converter (it refuses rather than guess whether they change the model); handled fields: "
            f"{', '.join(sorted(handled))} plus RoPE and metadata fields"
        )


@dataclass(frozen=True)
class Unread:
    """A config.json field that the family's transformers code never reads (a key of the original code
    base, left in published configs). Accepted when its value says what the HF model computes anyway:
    one of ``accepted`` (None: any value), or equal to the (resolved) field ``same_as``; refused otherwise,
    since such a checkpoint would mean another model. ``meaning``: what the field describes, for the note
    ``lmlab import`` prints and for the error."""

    key: str
    meaning: str
    accepted: Optional[tuple] = None
    same_as: Optional[str] = None


def _same_value(a: Any, b: Any) -> bool:
    """Equal and of the same kind (True is not 1, 1.0 is 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def check_unread(hf: dict, family: str, unread: Sequence[Unread], defaults: Optional[dict] = None) -> list[str]:
    """Validate the fields of ``unread`` present in ``hf``; UnsupportedError for a value that would describe
    another model. Returns one note per field present and not null: 'key=value: meaning'."""
    notes = []
    for u in unread:
        if u.key not in hf:
            continue
        value = hf[u.key]
        why = f"{u.meaning}; transformers never reads {u.key}, so another value would describe another model"
        if u.same_as is not None:
            want = get(hf, u.same_as, defaults or {})
            if not _same_value(value, want):
                raise unsupported(family, u.key, value, f"{want!r}, the value of {u.same_as} ({why})")
        elif u.accepted is not None and not any(_same_value(value, a) for a in u.accepted):
            raise unsupported(family, u.key, value, f"{' or '.join(map(repr, u.accepted))} ({why})")
        if value is not None:  # null: nothing to note
            notes.append(f"{u.key}={value!r}: {u.meaning}")
    return notes


def get(hf: dict, key: str, defaults: dict) -> Any:
    """``hf[key]`` if the key is present (even None), else the family's default from ``defaults`` (the
    transformers config class defaults, as HF itself fills an absent key)."""
    return hf[key] if key in hf else defaults.get(key)


def require(hf: dict, family: str, key: str, expected: Any, supported: str, defaults: dict) -> None:
    """Refuse when field ``key`` (default from ``defaults``) is not ``expected``."""
    value = get(hf, key, defaults)
    if value != expected and not (expected is False and value is None):
        raise unsupported(family, key, value, supported)


# ------------------------------------------------------------------------------------------------
# RoPE
# ------------------------------------------------------------------------------------------------


def _rope_dict(params: dict, family: str, field: str, max_pos: Optional[int]) -> Optional[dict]:
    """An HF RoPE parameter mapping (rope_type + params) -> lmlab rope_scaling (None for 'default')."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        extra = sorted(k for k in params if k not in ("rope_type", "type", "rope_theta", "partial_rotary_factor"))
        if extra:
            raise unsupported(
                family,
                f"{field}.{extra[0]}",
                params[extra[0]],
                "no parameters besides rope_theta for rope_type 'default'",
            )
        return None
    if kind not in _ROPE_TYPES:
        raise unsupported(family, f"{field}.rope_type", kind, SUPPORTED_ROPE)
    keys = _ROPE_KEYS[kind]
    out: dict = {"type": _ROPE_TYPES[kind]}
    for key, value in params.items():
        if key in ("rope_type", "type", "rope_theta", "partial_rotary_factor"):
            continue
        if key not in keys:
            raise unsupported(family, f"{field}.{key}", value, f"keys {', '.join(sorted(keys))} for rope_type {kind!r}")
        if key in ("mscale", "mscale_all_dim") and value == 0:
            continue  # transformers reads 0 as "off", the same as leaving the key out
        if value is not None:
            out[key] = value
    if "original_max_position_embeddings" in keys and "original_max_position_embeddings" not in out:
        out["original_max_position_embeddings"] = max_pos  # HF's standardize_rope_params default
    if out.get("factor") is None:
        raise unsupported(family, f"{field}.factor", None, "an explicit factor")
    return out


def read_rope(
    hf: dict,
    family: str,
    layer_type: Optional[str] = None,
    default_theta: float = 10000.0,
    legacy_theta_key: str = "rope_theta",
) -> tuple[float, Optional[dict], float]:
    """(rope_theta, lmlab rope_scaling or None, partial_rotary_factor) from either HF spelling: v5
    ``rope_parameters`` (nested by layer type for Gemma 3: pass ``layer_type``) or v4 ``rope_theta`` +
    ``rope_scaling`` (``legacy_theta_key`` names the v4 theta field of that layer type, e.g. Gemma 3's
    ``rope_local_base_freq``; v4 ``rope_scaling`` applies to full-attention layers only)."""
    params = hf.get("rope_parameters")
    field = "rope_parameters"
    nested = isinstance(params, dict) and any(isinstance(v, dict) for v in params.values())
    if isinstance(params, dict) and nested and layer_type in params:
        params, field = dict(params[layer_type] or {}), f"rope_parameters.{layer_type}"
    elif isinstance(params, dict) and params and not nested:
        params = dict(params)
    else:  # v4 spelling
        legacy = hf.get("rope_scaling") if layer_type in (None, "full_attention") else None
        params, field = dict(legacy or {}), "rope_scaling"
    if params.get("rope_theta") is None:
        legacy_theta = hf.get(legacy_theta_key)
        params["rope_theta"] = default_theta if legacy_theta is None else legacy_theta
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    scaling = _rope_dict(params, family, field, hf.get("max_position_embeddings"))
    return float(params["rope_theta"]), scaling, 1.0 if partial is None else float(partial)


def rope_to_hf(theta: float, scaling: Optional[dict], rot_dim: int) -> dict:
    """lmlab (rope_theta, rope_scaling) -> an HF v5 ``rope_parameters`` mapping. 'ntk' becomes the
    default RoPE at its enlarged base theta * factor^(rot/(rot-2)), which is what it computes."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": float(theta)}
    kind = scaling["type"]
    if kind == "ntk":
        return {
            "rope_type": "default",
            "rope_theta": float(theta) * float(scaling["factor"]) ** (rot_dim / (rot_dim - 2)),
        }
    out = {"rope_type": kind, "rope_theta": float(theta)}
    out.update({k: v for k, v in scaling.items() if k != "type"})
    return out


# ------------------------------------------------------------------------------------------------
# Layer types <-> layer_pattern
# ------------------------------------------------------------------------------------------------


def pattern_from_types(types: Sequence[str], family: str) -> Optional[str]:
    """HF ``layer_types`` ('sliding_attention' / 'full_attention' per layer) -> the shortest lmlab
    ``layer_pattern`` whose repetition (cut at the depth) gives them, or None when every layer is full.
    Gemma 3 1B's 26 layers (5 sliding : 1 full) give 'LLLLLG'."""
    letters = []
    for i, t in enumerate(types):
        if t == "sliding_attention":
            letters.append("L")
        elif t == "full_attention":
            letters.append("G")
        else:
            raise unsupported(family, f"layer_types[{i}]", t, "'sliding_attention', 'full_attention'")
    if "L" not in letters:
        return None
    return shortest_period("".join(letters))


def shortest_period(letters: str) -> str:
    """The shortest prefix p of ``letters`` whose repetition, cut at len(letters), gives ``letters``
    ('LLGLL' -> 'LLG')."""
    n = len(letters)
    for period in range(1, n + 1):
        if all(letters[i] == letters[i % period] for i in range(period, n)):
            return letters[:period]
    return letters


def types_from_cfg(cfg: ModelConfig) -> list[str]:
    """lmlab per-layer windows -> HF ``layer_types``."""
    return ["sliding_attention" if cfg.layer_is_local(i) else "full_attention" for i in range(cfg.n_layers)]


# ------------------------------------------------------------------------------------------------
# Activations and biases
# ------------------------------------------------------------------------------------------------

GATED_ACT = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu_pytorch_tanh": "geglu",
    "gelu_tanh": "geglu",
    "gelu_new": "geglu",
    "relu": "reglu",
}
GATED_ACT_TO_HF = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh", "reglu": "relu"}


def gated_activation(family: str, field: str, value: str) -> str:
    """HF gated-MLP activation name -> lmlab activation (swiglu / geglu / reglu)."""
    if value not in GATED_ACT:
        raise unsupported(
            family,
            field,
            value,
            ", ".join(sorted(GATED_ACT)) + " (exact GELU 'gelu' in a gated MLP has no lmlab activation)",
        )
    return GATED_ACT[value]


# ------------------------------------------------------------------------------------------------
# Tensors
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMap:
    """One lmlab tensor made of HF tensors concatenated along dim 0 (in order); ``sizes`` are their row
    counts (used to split on export)."""

    lmlab: str
    hf: tuple[str, ...]
    sizes: tuple[int, ...]


def llama_layer_maps(
    cfg: ModelConfig,
    norms: dict[str, str],
    prefix: str = "model.layers",
    attn: str = "self_attn",
    qk_norm_names: tuple[str, str] = ("q_norm", "k_norm"),
) -> list[TensorMap]:
    """TensorMaps of a Llama-layout checkpoint (q_proj/k_proj/v_proj/o_proj, gate_proj/up_proj/down_proj,
    per-layer norms named by ``norms``: lmlab block norm name -> HF module name), weights and biases."""
    H, K, D, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    maps = []
    for i in range(cfg.n_layers):
        p, b = f"{prefix}.{i}", f"blocks.{i}"
        for s in ("weight", "bias"):
            maps.append(
                TensorMap(
                    f"{b}.attn.qkv.{s}",
                    (f"{p}.{attn}.q_proj.{s}", f"{p}.{attn}.k_proj.{s}", f"{p}.{attn}.v_proj.{s}"),
                    (H * D, K * D, K * D),
                )
            )
            maps.append(TensorMap(f"{b}.attn.out.{s}", (f"{p}.{attn}.o_proj.{s}",), (cfg.d_model,)))
            maps.append(TensorMap(f"{b}.mlp.w_in.{s}", (f"{p}.mlp.gate_proj.{s}", f"{p}.mlp.up_proj.{s}"), (F, F)))
            maps.append(TensorMap(f"{b}.mlp.w_out.{s}", (f"{p}.mlp.down_proj.{s}",), (cfg.d_model,)))
            for ours, theirs in norms.items():
                maps.append(TensorMap(f"{b}.{ours}.{s}", (f"{p}.{theirs}.{s}",), (cfg.d_model,)))
        for ours, theirs in zip(("q_norm", "k_norm"), qk_norm_names):
            maps.append(TensorMap(f"{b}.attn.{ours}.weight", (f"{p}.{attn}.{theirs}.weight",), (-1,)))
    return maps


def model_maps(
    cfg: ModelConfig,
    layer_maps: list[TensorMap],
    embed: str = "model.embed_tokens.weight",
    final_norm: str = "model.norm",
    lm_head: str = "lm_head",
) -> list[TensorMap]:
    maps = [TensorMap("embed.weight", (embed,), (cfg.vocab_size,))]
    maps += layer_maps
    for s in ("weight", "bias"):
        maps.append(TensorMap(f"final_norm.{s}", (f"{final_norm}.{s}",), (-1,)))
        maps.append(TensorMap(f"lm_head.{s}", (f"{lm_head}.{s}",), (-1,)))
    return maps


def expected_state(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Names and shapes of the tensors an lmlab checkpoint of ``cfg`` holds (tied LM head left out)."""

    with torch.device("meta"):
        model = TransformerLM(cfg)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


IGNORED_HF_SUFFIXES = (".rotary_emb.inv_freq", "rotary_emb.inv_freq", ".masked_bias", ".attn.bias")


def state_to_lmlab(hf_state: StateDict, cfg: ModelConfig, maps: list[TensorMap], family: str) -> StateDict:
    """Gather lmlab tensors from an HF state dict; UnsupportedError for a missing tensor, a tensor of
    the checkpoint that has no place in lmlab's model, or a tied LM head that differs from the embedding."""
    expected = expected_state(cfg)
    out: StateDict = {}
    used: set = set()
    for m in maps:
        if m.lmlab not in expected:
            continue
        missing = [k for k in m.hf if k not in hf_state]
        if missing:
            raise UnsupportedError(f"{family}: the checkpoint lacks {missing[0]!r}, needed for lmlab's {m.lmlab!r}")
        parts = [hf_state[k] for k in m.hf]
        out[m.lmlab] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        used.update(m.hf)
    lost = sorted(set(expected) - set(out))
    if lost:
        raise UnsupportedError(f"{family}: no checkpoint tensor maps to lmlab's {lost[:3]}")
    head = next((m.hf[0] for m in maps if m.lmlab == "lm_head.weight"), "lm_head.weight")
    if cfg.tie_embeddings and head in hf_state:
        if not torch.equal(hf_state[head].to(out["embed.weight"].dtype), out["embed.weight"]):
            raise unsupported(
                family,
                "tie_word_embeddings",
                True,
                "a tied checkpoint whose lm_head.weight equals "
                "the token embedding (this one stores a different LM head)",
            )
        used.add(head)
    extra = sorted(k for k in hf_state if k not in used and not k.endswith(IGNORED_HF_SUFFIXES))
    if extra:
        raise UnsupportedError(
            f"{family}: checkpoint tensor(s) {extra[:4]}{' ...' if len(extra) > 4 else ''} have no "
            f"place in lmlab's model of this config (refusing to drop them)"
        )
    wrong = [(k, tuple(out[k].shape), tuple(expected[k])) for k in out if out[k].shape != expected[k]]
    if wrong:
        raise UnsupportedError(f"{family}: tensor shapes do not fit the config: {wrong[:3]}")
    return out


def pop_stacked_experts(state: StateDict, cfg: ModelConfig, prefix: str, family: str):
    """Yield (prefix, gate_up, down) for each layer whose checkpoint stores its experts stacked as
    ``{prefix}.gate_up_proj`` and ``{prefix}.down_proj`` (``prefix`` formatted with the layer index ``i``),
    removing both from ``state`` (changed in place); UnsupportedError when their expert count is not
    the config's. The layouts differ by family (Llama 4 stores them transposed against nn.Linear)."""
    for i in range(cfg.n_layers):
        p = prefix.format(i=i)
        if f"{p}.gate_up_proj" not in state:
            continue
        gate_up, down = state.pop(f"{p}.gate_up_proj"), state.pop(f"{p}.down_proj")
        if gate_up.shape[0] != cfg.n_experts or down.shape[0] != cfg.n_experts:
            raise UnsupportedError(
                f"{family}: {p}.gate_up_proj / down_proj hold {gate_up.shape[0]} / "
                f"{down.shape[0]} experts, the config {cfg.n_experts}"
            )
        yield p, gate_up, down


def state_to_hf(state: StateDict, cfg: ModelConfig, maps: list[TensorMap]) -> StateDict:
    """Split lmlab tensors into HF ones (the inverse of :func:`state_to_lmlab`); the tied LM head is left out."""
    out: StateDict = {}
    for m in maps:
        if m.lmlab not in state or (cfg.tie_embeddings and m.lmlab == "lm_head.weight"):
            continue
        t = state[m.lmlab]
        if len(m.hf) == 1:
            out[m.hf[0]] = t.contiguous()
        else:
            for name, part in zip(m.hf, t.split(list(m.sizes), dim=0)):
                out[name] = part.contiguous()
    return out
