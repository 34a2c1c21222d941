"""Model-family presets: the published architecture of each model the CS336 lecture 3 names, as
``ModelConfig`` fields, at its real size and at a CPU-sized "tiny" size of the same shape.

In the style of litgpt's ``config.py`` (one record per model, each citing its source), but every value
here is a field of :class:`lmlab.config.ModelConfig`, and the records are data: ``lmlab/presets.yaml``
(one record per model; its header names the keys), read once here. A :class:`Preset` carries

- ``real``: the published dimensions (layers, widths, heads, KV heads, head_dim, d_ff, vocabulary,
  context, RoPE theta, windows, norm epsilon, tying), taken from the paper or the model's Hugging Face
  ``config.json`` named in ``source``;
- ``tiny``: overrides giving d_model 128-224, 2-6 layers (6 where the layer pattern is 6 long), context
  256, vocabulary 4096 (override it with the data's) and the same norm, activation,
  positions, GQA ratio, layer pattern, soft-caps and biases. Widths keep their real ratios to d_model
  (d_ff / d_model, n_heads * head_dim / d_model, query_pre_attn_scalar / head_dim); sliding windows
  shrink to 64 tokens so they matter at context 256; RoPE context-extension scaling is dropped (it only
  changes frequencies meant for contexts far beyond 256);
- ``published_params``: the published parameter count, where one exists for exactly the architecture
  written here, and ``params_source`` saying where it is published (``tests/test_presets.py`` checks
  the real config's count on the meta device against it, to 1%);
- ``notes``: what the published model has that ``ModelConfig`` cannot express (a missing switch); the
  preset then approximates it, and says how.

Usage::

    from lmlab.presets import preset_config
    cfg = preset_config("gemma-2-9b")                    # tiny, trains on a CPU
    cfg = preset_config("gemma-2-9b", scale="real")      # the published shape
    with torch.device("meta"):                           # count parameters without memory
        n = TransformerLM(cfg).num_params()
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import yaml

from lmlab.config import ConfigError, ModelConfig, build_checked, check_keys
from lmlab.param_counts import param_counts

SCALES = ("tiny", "real")
TINY_CONTEXT = 256
TINY_VOCAB = 4096
TINY_WINDOW = 64


@dataclass(frozen=True)
class Preset:
    """One published model. ``real`` and ``tiny`` are ModelConfig field mappings (``tiny`` overrides
    ``real``); ``published_params`` is a parameter count (not a label), e.g. 124_439_808."""

    name: str  # lowercase-hyphen, e.g. "llama-2-7b"
    family: str  # e.g. "Llama 2"
    source: str  # paper / model card / config.json citations with URLs
    summary: str  # one line: what is characteristic of the architecture
    real: dict
    tiny: dict
    published_params: Optional[float] = None
    notes: str = ""  # what ModelConfig cannot express, and how the preset approximates it
    params_source: str = ""  # where published_params comes from
    extra: dict = field(default_factory=dict)  # free-form facts (e.g. total MoE parameters)

    def config(self, scale: str = "tiny", **overrides: Any) -> ModelConfig:
        return preset_config(self.name, scale, **overrides)

    @property
    def params_label(self) -> str:
        """Published parameter count as a short label ("124M", "6.74B"); our count of the real config,
        marked "~", where nothing comparable is published: lmlab.analysis's closed form, equal to the
        meta-device build for every preset (tests/test_analysis.py) and without building the big MoEs."""
        if self.published_params is not None:
            return human_count(self.published_params)

        return "~" + human_count(param_counts(preset_config(self.name, "real"))["total"])


def human_count(n: float) -> str:
    """124439808 -> '124M', 6.74e9 -> '6.74B', 540.35e9 -> '540B'."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            digits = 0 if value >= 100 else (1 if value >= 10 else 2)
            return f"{value:.{digits}f}{unit}"
    return str(int(n))


# ------------------------------------------------------------------------------------------------
# Tiny-scale derivation
# ------------------------------------------------------------------------------------------------


def _round_to(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def _tiny(real: dict, d_model: int = 128, n_heads: int = 4, n_layers: int = 2, **extra: Any) -> dict:
    """Overrides shrinking ``real`` to a CPU-sized model of the same shape (see the module docstring)."""
    full = ModelConfig(**real)
    kv_ratio = full.n_heads // full.n_kv_heads
    if n_heads % kv_ratio and full.n_kv_heads > 1:
        raise ValueError(f"tiny n_heads={n_heads} does not keep the GQA ratio {kv_ratio}")
    out: dict = dict(
        vocab_size=TINY_VOCAB,
        context_length=TINY_CONTEXT,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=1 if full.n_kv_heads == 1 else n_heads // kv_ratio,
    )
    head_dim = d_model // n_heads
    if "head_dim" in real:  # keep n_heads * head_dim / d_model
        head_dim = _round_to(full.head_dim * full.n_heads / full.d_model * d_model / n_heads, 8)
        out["head_dim"] = head_dim
    out["d_ff"] = _round_to(full.d_ff / full.d_model * d_model, 8)
    if full.expert_d_ff is not None:  # a MoE's experts keep their width ratio too
        out["expert_d_ff"] = _round_to(full.expert_d_ff / full.d_model * d_model, 8)
    if full.sliding_window is not None:
        out["sliding_window"] = TINY_WINDOW
    if full.query_pre_attn_scalar is not None:
        out["query_pre_attn_scalar"] = full.query_pre_attn_scalar / full.head_dim * head_dim
    if full.rope_scaling is not None:
        out["rope_scaling"] = None
    out.update(extra)
    return out


# ------------------------------------------------------------------------------------------------
# The table: lmlab/presets.yaml
# ------------------------------------------------------------------------------------------------

TABLE = Path(__file__).with_name("presets.yaml")
_REQUIRED = ("name", "family", "source", "summary", "real", "tiny")
_KEYS = _REQUIRED + ("published_params", "params_source", "notes", "extra")


def load_presets(path: Path = TABLE) -> dict[str, Preset]:
    """The presets of the YAML table at ``path`` (its header names the keys), by name, in the file's order.

    Raises ConfigError naming the file (and the record) for text that is not YAML, a file without a
    ``presets`` list, a record that is not a mapping, an unknown or missing key, a name that is not a
    lowercase-hyphen string or is given twice, ``published_params`` without its ``params_source`` (or the
    reverse), a ``real`` or ``tiny`` key that is not a ModelConfig field (naming the nearest), a ``tiny``
    size that is not a positive integer or cannot keep the GQA ratio, or a value ModelConfig refuses at
    either scale."""
    try:
        with open(path, encoding="utf-8") as f:
            table = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    records = table.get("presets") if isinstance(table, dict) else None
    if not isinstance(records, list):
        raise ConfigError(f"{path}: expected a mapping with a 'presets' list of records, got {type(table).__name__}")
    out: dict[str, Preset] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ConfigError(f"{path}: presets[{i}] is a {type(rec).__name__}, not a mapping of keys")
        where = f"{path}: presets[{i}] ({rec.get('name', '?')!r})"
        if not isinstance(rec.get("name"), str) or not re.fullmatch(r"[a-z0-9]+(-[a-z0-9.]+)*", rec["name"]):
            raise ConfigError(f"{where}: name must be a lowercase-hyphen string such as 'llama-2-7b'")
        unknown, missing = sorted(set(rec) - set(_KEYS)), [k for k in _REQUIRED if k not in rec]
        if unknown or missing:
            raise ConfigError(
                f"{where}: unknown keys {unknown}, missing keys {missing}; valid keys: {', '.join(_KEYS)}"
            )
        if rec["name"] in out:
            raise ConfigError(f"{where}: the name {rec['name']!r} appears twice")
        if (rec.get("published_params") is None) != (not rec.get("params_source")):
            raise ConfigError(f"{where}: published_params and params_source go together")
        check_keys(ModelConfig, rec["real"], f"{where} real")
        check_keys(ModelConfig, rec["tiny"], f"{where} tiny")
        for key in ("d_model", "n_heads", "n_layers"):  # _tiny's sizes (the other tiny fields are set as given)
            value = rec["tiny"].get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where} tiny: {key}={value!r} must be an integer >= 1")
        try:
            tiny = _tiny(rec["real"], **rec["tiny"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        build_checked(ModelConfig, {**rec["real"], **tiny}, f"{where} tiny")  # each scale builds
        out[rec["name"]] = Preset(
            rec["name"],
            rec["family"],
            rec["source"],
            rec["summary"],
            rec["real"],
            tiny,
            rec.get("published_params"),
            rec.get("notes", ""),
            rec.get("params_source", ""),
            rec.get("extra", {}),
        )
    return out


PRESETS: dict[str, Preset] = load_presets()


# ------------------------------------------------------------------------------------------------
# Access
# ------------------------------------------------------------------------------------------------


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ConfigError listing the valid names and the nearest one otherwise."""
    if name in PRESETS:
        return PRESETS[name]
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    if key in PRESETS:
        return PRESETS[key]
    near = difflib.get_close_matches(key, list(PRESETS), n=1, cutoff=0.3)
    hint = f"; did you mean {near[0]!r}?" if near else "."
    raise ConfigError(f"unknown preset {name!r}{hint} Valid presets: {', '.join(PRESETS)}.")


def preset_config(name: str, scale: str = "tiny", **overrides: Any) -> ModelConfig:
    """ModelConfig of preset ``name`` at ``scale`` ('tiny' or 'real'), then ``overrides`` (field=value).

    Unknown override keys raise ConfigError naming the nearest field."""
    preset = get_preset(name)
    if scale not in SCALES:
        raise ConfigError(f"scale={scale!r} is not valid; choose one of {', '.join(map(repr, SCALES))}")
    data = dict(preset.real)
    if scale == "tiny":
        data.update(preset.tiny)
    data.update(overrides)
    return ModelConfig.from_dict(data, f"preset {preset.name!r} ({scale})")


@lru_cache(maxsize=None)
def real_param_count(name: str) -> int:
    """Parameter count of the real-scale config, built on the meta device (no memory; tied weights once)."""
    import torch

    from lmlab.model import TransformerLM

    with torch.device("meta"):
        return TransformerLM(preset_config(name, "real")).num_params()


def format_presets() -> str:
    """One line per preset: name, family, parameter label (published, or ~ours), summary."""
    rows = [(p.name, p.family, p.params_label, p.summary) for p in PRESETS.values()]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c:>{w2}}  {d}" for a, b, c, d in rows)
