"""Shared helpers of the family converters in this package (no family registers here).

- :func:`hf_get` / :func:`reject` read an HF ``config.json`` mapping and raise :class:`UnsupportedError`
  naming the field, its value and what lmlab supports;
- :func:`hf_activation` / :func:`hf_act_name` map HF ``ACT2FN`` names to ``ModelConfig.activation`` and back;
- :func:`read_rope` / :func:`rope_parameters` read and write HF's RoPE fields (``rope_parameters``, the
  older ``rope_scaling`` / ``rope_theta`` / ``partial_rotary_factor``) with each family's defaults, on top of
  :mod:`lmlab.interop.common`'s RoPE helpers;
- :func:`check_fields` refuses config.json fields a converter does not handle (common.check_fields);
- :class:`StateReader` takes tensors out of an HF state dict and fails on any tensor left over;
- :func:`check_expressible` checks that an HF config written by ``config_to_hf`` reads back as a model
  computing the same function (roundtrip.verify_roundtrip), so an lmlab switch a family cannot express
  raises instead of being dropped.

The lmlab state dicts produced here leave out ``lm_head.weight`` when embeddings are tied (as lmlab
checkpoints store them); the HF state dicts leave out the tied ``lm_head.weight`` as ``save_pretrained`` does.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Optional

import torch

from lmlab.config import ModelConfig
from lmlab.interop import common
from lmlab.interop.registry import StateDict, UnsupportedError
from lmlab.interop.roundtrip import verify_roundtrip

_MISSING = object()


def hf_get(hf: dict, *keys: str, default: Any = _MISSING) -> Any:
    """The value of the first of ``keys`` present (and not null) in ``hf``; ``default`` otherwise, or
    UnsupportedError naming the keys when no default is given."""
    for key in keys:
        if hf.get(key) is not None:
            return hf[key]
    if default is _MISSING:
        raise UnsupportedError(f"{hf.get('model_type', 'config')}: config.json lacks {' / '.join(keys)}")
    return default


def reject(family: str, field: str, value: Any, supported: str) -> None:
    """Raise UnsupportedError for HF config field ``field`` = ``value``; ``supported`` says what works."""
    raise UnsupportedError(f"{family}: config field {field}={value!r} is not supported; lmlab supports {supported}")


def expect(family: str, hf: dict, field: str, allowed: Iterable, default: Any) -> Any:
    """``hf[field]`` (``default`` when absent or null), checked to be one of ``allowed``."""
    value = hf.get(field)
    value = default if value is None else value
    allowed = tuple(allowed)
    if value not in allowed:
        reject(family, field, value, " or ".join(repr(a) for a in allowed))
    return value


# --- activations ------------------------------------------------------------------------------------
# HF ACT2FN names -> non-gated ModelConfig.activation. The tanh approximations (gelu_new, gelu_fast,
# gelu_pytorch_tanh, gelu_accurate) are one function; they differ only in how the constant is written.
# fmt: off
_PLAIN = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
          "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh", "gelu_accurate": "gelu_tanh",
          "relu": "relu", "silu": "silu", "swish": "silu", "relu2": "relu2"}
# fmt: on
# HF act of a gated MLP (act(gate) * up) -> gated ModelConfig.activation. lmlab's GeGLU is the tanh GELU.
# fmt: off
_GATED = {"silu": "swiglu", "swish": "swiglu", "relu": "reglu", "gelu_new": "geglu", "gelu_fast": "geglu",
          "gelu_pytorch_tanh": "geglu", "gelu_python_tanh": "geglu", "gelu_accurate": "geglu"}
# fmt: on


def hf_activation(family: str, field: str, name: Any, gated: bool = False) -> str:
    """ModelConfig.activation for HF activation ``name`` of a plain (``gated=False``) or gated MLP."""
    table = _GATED if gated else _PLAIN
    if name not in table:
        reject(family, field, name, f"{', '.join(map(repr, sorted(table)))} in a {'gated' if gated else 'plain'} MLP")
    return table[name]


def hf_act_name(family: str, activation: str, gated: bool, tanh_name: str = "gelu_new") -> str:
    """The HF activation name for ``ModelConfig.activation`` (``tanh_name`` spells the tanh GELU)."""
    plain = {"gelu": "gelu", "gelu_tanh": tanh_name, "relu": "relu", "silu": "silu", "relu2": "relu2"}
    glu = {"swiglu": "silu", "reglu": "relu", "geglu": tanh_name}
    table = glu if gated else plain
    if activation not in table:
        kinds = "gated (act(gate) * up)" if gated else "plain (non-gated)"
        raise UnsupportedError(
            f"{family}: activation={activation!r} cannot be exported; {family} has a {kinds} MLP: "
            f"{', '.join(map(repr, table))}"
        )
    return table[activation]


# --- RoPE ------------------------------------------------------------------------------------------
def read_rope(
    family: str,
    hf: dict,
    head_dim: int,
    default_fraction: float = 1.0,
    theta_key: str = "rope_theta",
    fraction_key: str = "partial_rotary_factor",
    fixed_fraction: Optional[float] = None,
) -> dict:
    """ModelConfig RoPE fields (rope_theta, rope_fraction, rope_scaling) from HF's RoPE fields, as
    transformers resolves them: ``rope_parameters`` (v5) or ``rope_scaling`` (v4) first, then the
    top-level ``theta_key`` / ``fraction_key`` (GPT-NeoX: ``rotary_emb_base`` / ``rotary_pct``), then the
    family defaults (theta 10000, ``default_fraction``). ``fixed_fraction``: the family's model ignores
    partial_rotary_factor (Falcon rotates whole heads); a different value given raises.
    The rotated width is int(head_dim * fraction), as HF truncates. Scaling types: common.read_rope's."""
    theta, scaling, _ = common.read_rope(hf, family, legacy_theta_key=theta_key)
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    fraction = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    if fraction is None:
        fraction = hf_get(hf, fraction_key, default=default_fraction)
    if fixed_fraction is not None:
        if fraction not in (fixed_fraction, default_fraction):
            reject(
                family,
                "partial_rotary_factor",
                fraction,
                f"{fixed_fraction} ({family} rotates whole heads; HF's model ignores the field)",
            )
        fraction = fixed_fraction
    rotated = int(head_dim * float(fraction))
    if rotated < 2 or rotated % 2:
        reject(
            family,
            "partial_rotary_factor",
            fraction,
            f"a rotated width int(head_dim * factor) that is even and >= 2 (head_dim={head_dim} gives {rotated})",
        )
    return dict(rope_theta=theta, rope_fraction=rotated / head_dim, rope_scaling=scaling)


def rotated_dims(cfg: ModelConfig) -> int:
    """The number of channels of each head lmlab rotates."""
    return int(round(cfg.head_dim * cfg.rope_fraction))


def hf_fraction(cfg: ModelConfig) -> float:
    """partial_rotary_factor f with int(head_dim * f) equal to lmlab's rotated width (HF truncates)."""
    rot = rotated_dims(cfg)
    f = rot / cfg.head_dim
    while int(cfg.head_dim * f) < rot:  # guard against head_dim * f landing just below rot
        f = math.nextafter(f, 2.0)
    return f


def rope_parameters(cfg: ModelConfig, partial: bool = True) -> Optional[dict]:
    """HF ``rope_parameters`` for ``cfg`` (None without RoPE); ``partial`` adds partial_rotary_factor."""
    if cfg.position != "rope":
        return None
    out = common.rope_to_hf(cfg.rope_theta, cfg.rope_scaling, rotated_dims(cfg))
    if partial:
        out["partial_rotary_factor"] = hf_fraction(cfg)
    return out


# --- state dicts ------------------------------------------------------------------------------------
class StateReader:
    """Takes tensors out of an HF state dict by name; :meth:`finish` raises on anything left over.

    ``prefixes``: module prefixes the checkpoint may or may not carry (``transformer.``, ``model.``);
    each is stripped from the names that start with it. ``ignore``: regexes of non-parameter entries
    that old checkpoints carry (causal-mask buffers), dropped silently."""

    def __init__(self, family: str, state: StateDict, prefixes: tuple = (), ignore: tuple = ()):
        self.family = family
        self.state: dict = {}
        for key, value in state.items():
            for prefix in prefixes:
                if key.startswith(prefix):
                    key = key[len(prefix) :]
            if any(re.search(pattern, key) for pattern in ignore):
                continue
            self.state[key] = value
        self.used: set = set()

    def has(self, key: str) -> bool:
        return key in self.state

    def take(self, key: str) -> torch.Tensor:
        if key not in self.state:
            raise UnsupportedError(
                f"{self.family}: checkpoint lacks tensor {key!r} that its config implies "
                f"(has e.g. {sorted(self.state)[:5]})"
            )
        self.used.add(key)
        return self.state[key]

    def take_if(self, key: str, wanted: bool) -> Optional[torch.Tensor]:
        """``take(key)`` when ``wanted``; None otherwise (a tensor present anyway is left over)."""
        return self.take(key) if wanted else None

    def tied_head(self, key: str, embed: torch.Tensor) -> None:
        """A tied checkpoint's ``key`` (lm_head.weight), when stored, must equal the embedding ``embed``."""
        if key in self.state:
            if not torch.equal(self.state[key].to(embed.dtype), embed):
                raise UnsupportedError(
                    f"{self.family}: tie_word_embeddings=True but the checkpoint's {key!r} differs "
                    f"from the token embedding; lmlab ties them exactly"
                )
            self.used.add(key)

    def finish(self, out: StateDict, cfg: ModelConfig) -> StateDict:
        """Check that every HF tensor was used and that ``out`` holds exactly the tensors (and shapes) of
        lmlab's model of ``cfg`` (tied LM head left out); returns ``out``."""
        left = sorted(set(self.state) - self.used)
        if left:
            raise UnsupportedError(
                f"{self.family}: checkpoint tensors {left[:6]}{' ...' if len(left) > 6 else ''} "
                f"have no place in lmlab's model of this config (refusing to drop them)"
            )
        expected = common.expected_state(cfg)
        missing, extra = sorted(set(expected) - set(out)), sorted(set(out) - set(expected))
        wrong = [
            (k, tuple(out[k].shape), tuple(expected[k])) for k in out if k in expected and out[k].shape != expected[k]
        ]
        if missing or extra or wrong:
            raise UnsupportedError(
                f"{self.family}: the converted tensors do not fit the config: missing {missing[:3]}, "
                f"unexpected {extra[:3]}, shape mismatches {wrong[:3]}"
            )
        return out


def put(out: StateDict, key: str, tensor: Optional[torch.Tensor]) -> None:
    """``out[key] = tensor`` (contiguous) unless tensor is None."""
    if tensor is not None:
        out[key] = tensor.contiguous()


def lm_key(state: StateDict, key: str, wanted: bool = True) -> Optional[torch.Tensor]:
    """lmlab tensor ``key`` of ``state`` when ``wanted``; UnsupportedError when it is missing."""
    if not wanted:
        return None
    if key not in state:
        raise UnsupportedError(f"lmlab state lacks {key!r}, which its config implies")
    return state[key]


def put_output(out: StateDict, state: StateDict, cfg: ModelConfig, final_norm: str, head: str = "lm_head") -> None:
    """The HF tensors of the final LayerNorm (weight and bias) at ``final_norm`` and, when untied, the LM
    head weight at ``head`` + '.weight'."""
    put(out, final_norm + ".weight", lm_key(state, "final_norm.weight"))
    put(out, final_norm + ".bias", lm_key(state, "final_norm.bias"))
    if not cfg.tie_embeddings:
        put(out, head + ".weight", lm_key(state, "lm_head.weight"))


def split_qkv(w: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lmlab's fused qkv rows [q heads | k heads | v heads] -> (q, k, v)."""
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    return tuple(t.contiguous() for t in w.split([H * D, K * D, K * D], dim=0))


def cat_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([q, k, v], dim=0).contiguous()


def deinterleave_heads(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Rows [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (GPT-NeoX, Falcon MHA: per head q, k, v) -> lmlab's
    [q heads | k heads | v heads]. Works for weights (rows, in) and biases (rows,)."""
    rest = w.shape[1:]
    return w.reshape(n_heads, 3, head_dim, *rest).transpose(0, 1).reshape(3 * n_heads * head_dim, *rest).contiguous()


def interleave_heads(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`deinterleave_heads`."""
    rest = w.shape[1:]
    return w.reshape(3, n_heads, head_dim, *rest).transpose(0, 1).reshape(3 * n_heads * head_dim, *rest).contiguous()


# --- config checks ----------------------------------------------------------------------------------
# config.json fields that never change the forward pass, besides common.META_FIELDS: remote-code class maps,
# training-only switches (dropouts, layer drop, gradient checkpointing).
# fmt: off
EXTRA_META = frozenset({"auto_map", "gradient_checkpointing", "classifier_dropout", "layerdrop", "activation_dropout",
                        "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                        "summary_first_dropout", "n_ctx"})
# fmt: on


def check_fields(hf: dict, family: str, handled: Iterable[str]) -> None:
    """Refuse any config.json field that is neither ``handled`` by the family converter, nor metadata, nor
    training-only (common.check_fields)."""
    common.check_fields(hf, family, frozenset(handled) | EXTRA_META)


def check_expressible(family: str, cfg: ModelConfig, hf: dict, to_lmlab) -> dict:
    """UnsupportedError when the HF config ``hf`` written for ``cfg`` does not read back (through the
    family's ``to_lmlab``) as a model computing the same function (roundtrip.verify_roundtrip)."""
    return verify_roundtrip(family, cfg, hf, to_lmlab)
