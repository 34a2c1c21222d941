"""A spec's variants (``axes:``) and sizes (``scales:``): each a :class:`Variant`, a label and the
ModelConfig / TrainConfig fields it sets, checked by name against both configs (a misspelt field names
the nearest one) and expanded from the grid (cartesian product) and zip (lists varied together) blocks;
a variant's own ``data:`` (a prepared folder, or the default corpus with another tokenizer). Every
problem raises ConfigError naming the spec, the block and the value."""

from __future__ import annotations

import difflib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lmlab.config import ConfigError, ModelConfig
from lmlab.data.shards import TokenData
from lmlab.runs import default_data_dir, ensure_default_data


@dataclass
class Variant:
    label: str
    fields: dict  # field name -> value, model and train fields together


def _fmt(value: Any) -> str:
    """A value in a label: YAML spelling for booleans and null, else str."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value)


def _field_names() -> tuple[set, set]:
    from lmlab.train import TrainConfig

    return set(ModelConfig.__dataclass_fields__), set(TrainConfig.__dataclass_fields__)


def _check_field(name: str, source: str) -> None:
    model_keys, train_keys = _field_names()
    if name not in model_keys | train_keys:
        near = difflib.get_close_matches(name, sorted(model_keys | train_keys), n=1)
        raise ConfigError(
            f"{source}: {name!r} is not a ModelConfig or TrainConfig field"
            + (f"; did you mean {near[0]!r}?" if near else "")
        )


def _bundle(value: dict, source: str) -> tuple[Optional[str], dict]:
    value = dict(value)
    label = value.pop("label", None)
    _check_label(label, f"{source}.label")
    if not value:
        raise ConfigError(f"{source}: a variant needs at least one field besides 'label'")
    for k in value:
        if k == "data":
            _check_variant_data(value[k], f"{source}.data")
        else:
            _check_field(str(k), source)
    return (None if label is None else str(label)), value


def _check_label(label: Any, where: str) -> None:
    """A variant's label: None (built from its fields) or a non-empty string (not a number or a list,
    which YAML would otherwise turn into a label silently)."""
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise ConfigError(f'{where}={label!r} must be a non-empty string (quote it: label: "{label}")')


def _check_variant_data(value: Any, where: str) -> None:
    """A variant's own data: a prepared folder (a path) or the default corpus with another tokenizer,
    ``{tokenizer: bytes}`` or ``{tokenizer: bpe, vocab_size: 1024}`` (prepared on first use)."""
    if isinstance(value, str) and value:
        return
    ok = isinstance(value, dict) and set(value) <= {"tokenizer", "vocab_size"}
    tok = value.get("tokenizer") if ok else None
    if ok and tok == "bytes" and "vocab_size" not in value:
        return
    size = value.get("vocab_size") if ok else None
    if ok and tok == "bpe" and isinstance(size, int) and not isinstance(size, bool) and size >= 258:
        return
    raise ConfigError(
        f"{where}={value!r} must be a prepared data folder (a path) or the default corpus with a "
        f"tokenizer: {{tokenizer: bytes}} or {{tokenizer: bpe, vocab_size: N}} with N >= 258"
    )


def variant_data(value: Any, default: Optional[Path], prepare: bool) -> tuple[Optional[Path], Optional[int]]:
    """(data folder, vocab_size) of a variant's ``data:`` value (:func:`_check_variant_data`), or of
    ``default`` when the variant has none. With ``prepare`` the default corpus is prepared with the
    variant's tokenizer on first use; without, a folder that does not exist yet gives (None, the
    vocabulary the tokenizer will have: 257 for bytes)."""

    if value is None:
        return default, (TokenData(default).vocab_size if default is not None else None)
    if isinstance(value, str):
        return Path(value).resolve(), TokenData(value).vocab_size
    tok, size = value["tokenizer"], value.get("vocab_size", 0)
    folder = default_data_dir(tok, size)
    if prepare:
        folder = ensure_default_data(None, tok, size)
    elif not (folder / "manifest.json").is_file():
        return None, 257 if tok == "bytes" else size
    return Path(folder).resolve(), TokenData(folder).vocab_size


def expand_axes(axes: Any, source: str = "axes") -> list[Variant]:
    """The variants of ``axes``: the cartesian product of the ``grid`` axes, crossed with the ``zip``
    lists taken together. Without axes, one variant ``base``. Labels: the given ``label``, else
    ``field=value`` joined by ``, ``."""
    if axes is None or axes == {}:
        return [Variant("base", {})]
    if not isinstance(axes, dict):
        raise ConfigError(f"{source}: expected a mapping with 'grid' and/or 'zip', got {type(axes).__name__}")
    unknown = set(axes) - {"grid", "zip"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {sorted(unknown)}; use 'grid:' (cartesian product) and "
            f"'zip:' (lists varied together)"
        )
    groups: list[list[tuple[str, dict]]] = []
    grid = axes.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{source}.grid: expected a mapping of axis name -> list of values")
    for axis, values in grid.items():
        where = f"{source}.grid.{axis}"
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: expected a non-empty list of values")
        options = []
        for i, v in enumerate(values):
            if isinstance(v, dict):
                label, fields_ = _bundle(v, f"{where}[{i}]")
                options.append((label or ", ".join(f"{k}={_fmt(x)}" for k, x in fields_.items()), fields_))
            else:
                _check_field(str(axis), where)
                options.append((f"{axis}={_fmt(v)}", {axis: v}))
        groups.append(options)
    if "grid" in axes and not axes["grid"]:
        raise ConfigError(f"{source}.grid is empty: give at least one axis (field: [values]) or drop 'grid'")
    if "zip" in axes and not axes["zip"]:
        raise ConfigError(f"{source}.zip is empty: give the varied fields (a list of variants) or drop 'zip'")
    zipped = axes.get("zip")
    if zipped:
        where = f"{source}.zip"
        options = []
        if isinstance(zipped, list):  # a list of variants, each a mapping of fields (and a label)
            for i, v in enumerate(zipped):
                if not isinstance(v, dict):
                    raise ConfigError(f"{where}[{i}]: expected a mapping of fields")
                label, fields_ = _bundle(v, f"{where}[{i}]")
                options.append((label or ", ".join(f"{k}={_fmt(x)}" for k, x in fields_.items()), fields_))
        elif isinstance(zipped, dict):
            lists = dict(zipped)
            labels = lists.pop("label", None)
            if not lists:
                raise ConfigError(f"{where}: needs at least one field besides 'label'")
            lengths = {k: len(v) if isinstance(v, list) else -1 for k, v in lists.items()}
            if labels is not None:
                lengths["label"] = len(labels) if isinstance(labels, list) else -1
                for i, lab in enumerate(labels if isinstance(labels, list) else []):
                    _check_label(lab, f"{where}.label[{i}]")
            if min(lengths.values()) < 1 or len(set(lengths.values())) != 1:
                raise ConfigError(
                    f"{where}: every entry must be a non-empty list, all of one length; got lengths "
                    + ", ".join(f"{k}={n if n >= 0 else 'not a list'}" for k, n in lengths.items())
                )
            for k in lists:
                _check_field(str(k), where)
            for i in range(len(next(iter(lists.values())))):
                fields_ = {k: v[i] for k, v in lists.items()}
                label = (
                    str(labels[i]) if labels is not None else ", ".join(f"{k}={_fmt(x)}" for k, x in fields_.items())
                )
                options.append((label, fields_))
        else:
            raise ConfigError(f"{where}: expected a mapping of field -> list, or a list of variants")
        groups.append(options)
    variants = []
    for combo in itertools.product(*groups):
        merged: dict = {}
        for _, fields_ in combo:
            for k, v in fields_.items():
                if k in merged and merged[k] != v:
                    raise ConfigError(f"{source}: field {k!r} is set twice in one variant ({merged[k]!r} and {v!r})")
                merged[k] = v
        variants.append(Variant(", ".join(label for label, _ in combo), merged))
    labels = [v.label for v in variants]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"{source}: variant label(s) {dupes} occur more than once; give distinct labels")
    return variants


def parse_scales(raw: Any, source: str) -> list[Variant]:
    """``scales:`` a list of field bundles (each with an optional label) or ``{field: [values]}``."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        if len(raw) != 1 or not isinstance(next(iter(raw.values())), list):
            raise ConfigError(f"{source}: scales must be a list of field bundles or {{field: [values]}}")
        k, values = next(iter(raw.items()))
        raw = [{k: v} for v in values]
    if not isinstance(raw, list) or len(raw) < 2:
        raise ConfigError(f"{source}: scales must list at least two sizes, e.g. [{{d_model: 64}}, {{d_model: 128}}]")
    out = []
    for i, v in enumerate(raw):
        if not isinstance(v, dict):
            raise ConfigError(f"{source}.scales[{i}]: expected a mapping of fields, got {v!r}")
        label, fields_ = _bundle(v, f"{source}.scales[{i}]")
        out.append(Variant(label or ", ".join(f"{k}={_fmt(x)}" for k, x in fields_.items()), fields_))
    labels = [v.label for v in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{source}: scale labels {labels} repeat; give distinct labels")
    return out
