"""Validation of every file the ablation lab reads back (``lmlab report``, ``lmlab report --index``,
and ``lmlab sweep`` when it resumes): one place that decides what a sweep's numbers may be.

- ``results.jsonl`` (:func:`read_results_jsonl`) and a report folder's ``results.csv``
  (:func:`read_results_csv`): every row a JSON object (a CSV row with the header's cells) whose fields
  have the types and ranges of :data:`FIELDS` (``run`` a non-empty string, ``seed`` an integer,
  ``status`` one of :data:`STATUSES`, ``val_bpb`` a finite number in (0, 100], counts integers >= 0,
  ...), no unknown field, ``run`` the name the lab gives its variant, scale, tuned values and seed,
  ``sweep`` the sweep's own name, a status that agrees with ``diverged`` and ``val_bpb``, no two rows
  for one run with different values (a later identical copy is dropped), and the finished rows of one
  status holding the same fields (a field removed from one row would change what is judged);
  with the spec, every variant, scale, seed and tuned field one the spec names.
- ``verdicts.json`` (:func:`read_verdicts`): an object with a ``claims`` list of claims whose verdicts
  are :data:`lmlab.lab.stats.VERDICTS` and whose numbers are finite.
- ``provenance.jsonl`` (:func:`read_provenance`): start and end records of typed fields.
- ``load.jsonl`` (:func:`read_load`): informational, so a damaged line is skipped with one warning
  naming the file and line.
- any JSON (:func:`lmlab.json_checks.parse_json`): UTF-8 (an invalid byte is named with its line),
  nesting at most :data:`lmlab.json_checks.MAX_DEPTH` deep (checked before parsing: no RecursionError),
  and, where the lab writes only finite numbers, no NaN or Infinity.

Every problem raises :class:`lmlab.config.ConfigError` with one line naming the file, the line (or
CSV row) and the field, the value and what is valid; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from lmlab.config import ConfigError
from lmlab.json_checks import decode_utf8, jsonl_objects, nonfinite_path, parse_json, read_json_object, read_text
from lmlab.lab import stats
from lmlab.lab.plan import run_stem
from lmlab.lab.stats import VERDICTS

STATUSES = ("ok", "diverged", "failed")  # the statuses lmlab.lab.runner writes
MAX_BPB = 100.0  # bits per byte: a uniform guess over bytes is 8; past 100 a value is not a measurement

_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_INT = re.compile(r"-?\d{1,30}")  # longer integers are no count the lab writes
_CONTEXT_KEY = re.compile(r"(val_bpb|val_loss|eval_note)_(\d+(?:\.\d+)?)x")


def _show(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# --- field kinds: (check(value) -> bool, what is valid) ----------------------------------------
def _json_scalar(x: Any) -> bool:
    return x is None or isinstance(x, (str, bool)) or _is_num(x)


KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (lambda x: isinstance(x, str) and x.strip() != "", "a non-empty string"),
    "text": (lambda x: x is None or isinstance(x, str), "a string or null"),
    "int": (_is_int, "an integer"),
    "status": (lambda x: x in STATUSES, f"one of {', '.join(STATUSES)}"),
    "bool": (lambda x: x is None or isinstance(x, bool), "true, false or null"),
    "count": (lambda x: x is None or (_is_int(x) and x >= 0), "an integer >= 0 or null"),
    "amount": (lambda x: x is None or (_is_num(x) and x >= 0), "a finite number >= 0 or null"),
    "signed": (lambda x: x is None or _is_num(x), "a finite number or null"),
    "bpb": (
        lambda x: x is None or (_is_num(x) and 0 < x <= MAX_BPB),
        f"a finite number of bits per byte in (0, {MAX_BPB:g}] or null",
    ),
    "numbers": (
        lambda x: x is None or (isinstance(x, list) and all(_is_num(v) for v in x)),
        "a list of finite numbers or null",
    ),
    "tune": (
        lambda x: x is None or (isinstance(x, dict) and all(_json_scalar(v) for v in x.values())),
        "an object of field -> number, string or boolean, or null",
    ),
    "solved": (
        lambda x: x is None or (isinstance(x, dict) and all(_is_num(v) for v in x.values())),
        "an object of field -> finite number, or null",
    ),
    "fields": (lambda x: x is None or isinstance(x, dict), "an object of field -> value, or null"),
}

# every field a results row may hold (lmlab.lab.results.collect_result writes them), with its kind
FIELDS: dict[str, str] = {
    "sweep": "name",
    "run": "name",
    "variant": "name",
    "seed": "int",
    "status": "status",
    "diverged": "bool",
    "stopped_early": "bool",
    "scale": "text",
    "tune": "tune",
    "solved": "solved",
    "fields": "fields",
    **dict.fromkeys(
        (
            "max_steps",
            "steps",
            "tokens",
            "spikes",
            "skipped_steps",
            "params",
            "non_embedding_params",
            "kv_bytes_per_token",
            "kv_bytes_context",
            "val_tokens",
            "val_bytes",
        ),
        "count",
    ),
    **dict.fromkeys(
        (
            "flops",
            "flops_per_token",
            "wall_s",
            "run_wall_s",
            "tokens_per_s",
            "step_ms",
            "decode_tokens_per_s",
            "prefill_tokens_per_s",
            "load_avg_1m",
            "first_train_loss",
            "final_train_loss",
            "val_loss",
        ),
        "amount",
    ),
    "max_attn_logit": "signed",
    "log_z_max": "signed",
    "attn_sink": "amount",
    "val_bpb": "bpb",
    "val_loss_by_position": "numbers",
    "error": "text",
    "finished_at": "text",
    "machine": "text",
    "eval_note": "text",
}
REQUIRED = ("run", "variant", "seed", "status")
# fields that every row of one status holds when one does (non-null): a value removed from one row would
# change the verdicts (a missing val_bpb counts as a failed run, missing tokens as an unknown size, ...)
_RUN_FIELDS = ("sweep", "scale", "tune", "diverged", "steps", "max_steps", "tokens", "params", "non_embedding_params",
               "flops_per_token")  # fmt: skip
CONSISTENT = {
    "ok": _RUN_FIELDS + ("first_train_loss", "final_train_loss", "val_loss", "val_bpb", "val_tokens", "val_bytes",
                         "wall_s", "finished_at", "machine"),
    "diverged": _RUN_FIELDS,
}  # fmt: skip


def field_kind(key: str) -> Optional[str]:
    """The kind of a results field (:data:`FIELDS`; ``val_bpb_2x``-style fields at longer contexts take
    their base field's), or None for a field the lab never writes."""
    if key in FIELDS:
        return FIELDS[key]
    m = _CONTEXT_KEY.fullmatch(key)
    return FIELDS[m.group(1)] if m else None


# --- results rows ----------------------------------------------------------------------------
def check_row(row: Any, where: str) -> dict:
    """One results row (from ``where``: ``FILE: line N``): an object whose fields are all known
    (:data:`FIELDS`) and valid for their kind, with :data:`REQUIRED` present, a status that agrees with
    ``diverged`` and ``val_bpb``, and ``run`` the name of its variant, scale, tuned values and seed.
    Returns the row; raises ConfigError naming the field."""

    if not isinstance(row, dict):
        raise ConfigError(
            f"{where}: a results row must be a JSON object, got {type(row).__name__} {_show(row)}; the file is damaged"
        )
    for key in REQUIRED:
        if key not in row:
            raise ConfigError(
                f"{where}: field {key!r} is missing; every results row holds "
                f"{', '.join(REQUIRED)} (the file is damaged)"
            )
    for key, value in row.items():
        kind = field_kind(key)
        if kind is None:
            raise ConfigError(
                f"{where}: unknown field {key!r}; lmlab writes no such field (the file is damaged "
                f"or not a sweep's results)"
            )
        ok, valid = KINDS[kind]
        if not ok(value):
            raise ConfigError(f"{where}: field {key!r} is {_show(value)}; give {valid}")
        if kind == "fields" and value and nonfinite_path(value):
            raise ConfigError(f"{where}: field 'fields.{nonfinite_path(value)}' is NaN or infinite")
    status = row["status"]
    if row.get("diverged") is not None and row["diverged"] != (status == "diverged"):
        raise ConfigError(
            f"{where}: field 'diverged' is {_show(row['diverged'])} but 'status' is {status!r} "
            f"(a diverged run has status 'diverged' and diverged true); the file is damaged"
        )
    values = {k: v for k, v in row.items() if k == "val_bpb" or k.startswith("val_bpb_")}
    if status == "ok" and row.get("val_bpb") is None:
        raise ConfigError(
            f"{where}: field 'val_bpb' is {_show(row.get('val_bpb'))} but 'status' is 'ok'; a "
            f"finished run has its held-out bits per byte (the file is damaged)"
        )
    if status != "ok":
        for k, v in values.items():
            if v is not None:
                raise ConfigError(
                    f"{where}: field {k!r} is {_show(v)} but 'status' is {status!r}; a {status} run "
                    f"has no held-out value (null; the file is damaged)"
                )
    want = f"{run_stem(row['variant'], row.get('scale'), row.get('tune') or {})}-s{row['seed']}"
    if row["run"] != want:
        raise ConfigError(
            f"{where}: field 'run' is {_show(row['run'])}, but its variant, scale, tuned values and "
            f"seed name it {want!r}; the file is damaged"
        )
    return row


def check_rows(rows: list[tuple[str, dict]], path: Path, sweep: Optional[str] = None, spec=None) -> list[dict]:
    """The rows (each with its ``where``) of one results file, checked together: one ``sweep`` name
    (``sweep`` when given: the spec's), no two rows for one run with different values (a later
    identical copy is dropped), the fields of :data:`CONSISTENT` held by every finished row of a status
    when one holds them, and with ``spec`` (:class:`lmlab.lab.spec.Spec`) only its variants, scales,
    seeds and tuned fields. Returns the rows kept, in order; ConfigError naming the row otherwise."""
    seen: dict[str, tuple[str, dict]] = {}
    out = []
    for where, row in rows:
        name = row["run"]
        if name in seen:
            if seen[name][1] != row:
                diff = sorted(k for k in set(row) | set(seen[name][1]) if row.get(k) != seen[name][1].get(k))
                first = seen[name][0][len(str(path)) + 2 :]  # "line N" / "row N (line M)"
                raise ConfigError(
                    f"{where}: a second row for run {name!r} (first at {first}) with other "
                    f"values ({', '.join(diff[:4])}); keep one of them (the file is damaged)"
                )
            continue
        seen[name] = (where, row)
        out.append((where, row))
    named = [(w, r) for w, r in out if r.get("sweep") is not None]
    if named:
        sweep = sweep or named[0][1]["sweep"]
        for where, row in named:
            if row["sweep"] != sweep:
                raise ConfigError(
                    f"{where}: field 'sweep' is {_show(row['sweep'])}, not this sweep's name {sweep!r}; "
                    f"a row of another sweep (the file is damaged or mixed)"
                )
    for status, keys in CONSISTENT.items():
        group = [(w, r) for w, r in out if r["status"] == status]
        for key in keys:
            holding = [w for w, r in group if r.get(key) is not None]
            if holding and len(holding) < len(group):
                where = next(w for w, r in group if r.get(key) is None)
                raise ConfigError(
                    f"{where}: field {key!r} is missing or null, though the other {status!r} rows hold "
                    f"it (e.g. {holding[0][len(str(path)) + 2 :]}); the file is damaged"
                )
    if spec is not None:
        _check_against_spec(out, spec)
    return [r for _, r in out]


def _check_against_spec(rows: list[tuple[str, dict]], spec) -> None:
    variants = [v.label for v in spec.variants]
    scales = [s.label for s in spec.scales]
    seeds = set(spec.seeds) | set(spec.tune_seeds)
    tuned = sorted(spec.tune)
    for where, row in rows:
        if row["variant"] not in variants:
            raise ConfigError(
                f"{where}: field 'variant' is {_show(row['variant'])}, not a variant of the spec "
                f"({', '.join(map(repr, variants[:6]))}{', ...' if len(variants) > 6 else ''})"
            )
        if row["seed"] not in seeds:
            raise ConfigError(
                f"{where}: field 'seed' is {row['seed']}, not a seed of the spec ({', '.join(map(str, sorted(seeds)))})"
            )
        scale = row.get("scale")
        if (scale is None and scales) or (scale is not None and scale not in scales):
            raise ConfigError(
                f"{where}: field 'scale' is {_show(scale)}; the spec's scales are "
                + (", ".join(map(repr, scales)) if scales else "none (null)")
            )
        if sorted(row.get("tune") or {}) != tuned:
            raise ConfigError(
                f"{where}: field 'tune' is {_show(row.get('tune'))}; the spec tunes "
                + (", ".join(tuned) if tuned else "nothing ({} or null)")
            )


def read_results_jsonl(path: Path, sweep: Optional[str] = None, spec=None, cut_last: str = "refuse") -> list[dict]:
    """The rows of a ``results.jsonl``, each checked (:func:`check_row`) and checked together
    (:func:`check_rows`); [] when the file is absent. A last line that is not JSON (a write cut by a
    kill) is refused with ``cut_last="refuse"`` (a report judges no run it could not read) and skipped
    with a warning on stderr with ``"skip"`` (the sweep counts its run as unfinished and scores it again).
    Raises ConfigError naming the file, line and field."""
    path = Path(path)
    if not path.is_file():
        return []
    text = read_text(path)
    lines = text.split("\n")
    rows = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}: line {i + 1}"
        if i == last:
            try:
                json.loads(line)
            except json.JSONDecodeError:
                if cut_last == "skip":
                    print(
                        f"warning: {where} is not JSON (a write cut by an interrupted sweep?); skipped: its run "
                        f"counts as unfinished",
                        file=sys.stderr,
                    )
                    continue
                raise ConfigError(
                    f"{where}: not JSON (a write cut by an interrupted sweep?); rerun `lmlab sweep` on "
                    f"{path.parent} to score that run again"
                ) from None
            except RecursionError:
                pass  # refused by parse_json below
        rows.append((where, check_row(parse_json(line, where), where)))
    return check_rows(rows, path, sweep, spec)


def _csv_value(key: str, cell: str, where: str) -> Any:
    """A results.csv cell back as the value :func:`lmlab.lab.report.write_csv` wrote: '' null, then by
    the column's kind."""
    if cell == "":
        return None
    kind = "set" if key.startswith("set.") else field_kind(key)
    if kind in ("name", "text", "status"):
        return cell
    if kind == "bool" or (kind == "set" and cell in ("true", "false")):
        if cell not in ("true", "false"):
            raise ConfigError(f"{where}: column {key!r} is {_show(cell)}; give true or false")
        return cell == "true"
    if kind in ("tune", "solved", "fields", "numbers") or (kind == "set" and cell[:1] in "[{"):
        return parse_json(cell, f"{where}: column {key!r}")
    if kind in ("int", "count") and _INT.fullmatch(cell):
        return int(cell)
    if kind in ("amount", "signed", "bpb") or kind == "set":
        if _INT.fullmatch(cell):
            return int(cell)
        if _NUMBER.fullmatch(cell):
            return float(cell)
        if kind == "set":
            return cell
    raise ConfigError(
        f"{where}: column {key!r} is {_show(cell)}; give {KINDS[kind][1].replace(' or null', '')} (or an empty cell)"
    )


def read_results_csv(path: Path, sweep: Optional[str] = None, spec=None) -> list[dict]:
    """The rows of a report folder's ``results.csv`` (written by :func:`lmlab.lab.report.write_csv`)
    back as results rows, validated as ``results.jsonl``'s are (:func:`check_row`, :func:`check_rows`):
    UTF-8 without NUL bytes, a header of known columns (``set.<field>`` for a variant's fields)
    starting with ``sweep`` or ``run``, every row with the header's number of cells, numbers finite.
    Empty cells are null, ``set.<field>`` columns the row's ``fields``. Raises ConfigError naming the
    file, row, line and column."""
    path = Path(path)
    data = path.read_bytes()
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise ConfigError(f"{path}: line {line}: a NUL byte; a results.csv holds text (the file is damaged)")
    text = decode_utf8(data, path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header or header[0] not in ("sweep", "run"):
            raise ConfigError(
                f"{path}: line 1: the header {_show(','.join(header or []))} is not that of an lmlab "
                f"results.csv (it starts with 'sweep' or 'run')"
            )
        unknown = [c for c in header if not c.startswith("set.") and field_kind(c) is None or c in ("fields",)]
        if unknown:
            raise ConfigError(
                f"{path}: line 1: unknown column {unknown[0]!r}; lmlab writes no such column (a foreign "
                f"or damaged header)"
            )
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:
            raise ConfigError(f"{path}: line 1: column {twice[0]!r} appears twice in the header (the file is damaged)")
        rows = []
        for i, cells in enumerate(reader, 1):
            where = f"{path}: row {i} (line {reader.line_num})"
            if not cells:
                continue
            if len(cells) != len(header):
                raise ConfigError(
                    f"{where}: {len(cells)} cell(s), the header has {len(header)} (the file is damaged or cut)"
                )
            row: dict = {"fields": {}}
            for key, cell in zip(header, cells):
                value = _csv_value(key, cell, where)
                if key.startswith("set."):
                    if value is not None:
                        row["fields"][key[4:]] = value
                else:
                    row[key] = value
            rows.append((where, check_row(row, where)))
    except csv.Error as exc:
        raise ConfigError(f"{path}: line {reader.line_num}: not CSV ({exc}); the file is damaged") from None
    return check_rows(rows, path, sweep, spec)


# --- verdicts.json ---------------------------------------------------------------------------
_CLAIM_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "text": KINDS["name"],
    "a": KINDS["name"],
    "b": KINDS["name"],
    "metric": KINDS["name"],
    "kind": (lambda x: x in ("better", "equal"), "better or equal"),
    "by": (_is_num, "a finite number"),
    "relative": (lambda x: x is None or isinstance(x, bool), "true or false"),
    "scale": KINDS["text"],
    "method": KINDS["text"],
    "note": KINDS["text"],
    "gate": KINDS["text"],
    "n": (lambda x: x is None or (_is_int(x) and x >= 0), "an integer >= 0"),
    **dict.fromkeys(("effect", "lo", "hi", "tokens_per_param", "detectable", "margin"), KINDS["signed"]),
    "settle": (
        lambda x: x is None or (isinstance(x, list) and len(x) == 2 and _is_int(x[0]) and isinstance(x[1], str)),
        "null or [seeds, verdict]",
    ),
    "preconditions": (
        lambda x: x is None or (isinstance(x, list) and all(isinstance(p, dict) for p in x)),
        "a list of objects",
    ),
    "published": (
        lambda x: x is None or (isinstance(x, list) and len(x) == 2 and all(_is_num(v) for v in x)),
        "null or [low, high]",
    ),
}


def check_claim(c: Any, where: str) -> dict:
    """One judged claim of a ``verdicts.json`` (``where``: ``FILE: claims[i]``): an object with text,
    kind, the two variants, the metric, the margin and a verdict of :data:`lmlab.lab.stats.VERDICTS`,
    its numbers finite or null. Returns it; ConfigError naming the field otherwise."""

    if not isinstance(c, dict):
        raise ConfigError(f"{where}: a claim must be a JSON object, got {type(c).__name__} {_show(c)}")
    for key in ("text", "kind", "a", "b", "metric", "by", "verdict"):
        if key not in c:
            raise ConfigError(
                f"{where}: field {key!r} is missing; a claim holds text, kind, a, b, metric, by and "
                f"verdict (the file is damaged)"
            )
    for key in ("verdict", "measured"):
        if key in c and c[key] not in VERDICTS:
            raise ConfigError(f"{where}: field {key!r} is {_show(c[key])}; give one of {', '.join(VERDICTS)}")
    for key, (ok, valid) in _CLAIM_FIELDS.items():
        if key in c and not ok(c[key]):
            raise ConfigError(f"{where}: field {key!r} is {_show(c[key])}; give {valid}")
    _check_claim_numbers(c, where)
    return c


def _check_claim_numbers(c: dict, where: str) -> None:
    """A stored claim's numbers agree with each other: lo <= effect <= hi, and the verdict its interval
    gives (:func:`lmlab.lab.stats.verdict` with its kind and margin) is the one stored ("measured" where a
    gate replaced it; the verdict itself otherwise). A hand-edited verdict is refused, never published."""

    lo, hi, effect = c.get("lo"), c.get("hi"), c.get("effect")
    if not (_is_num(lo) and _is_num(hi)):
        return
    if lo > hi:
        raise ConfigError(f"{where}: its interval has lo={lo!r} above hi={hi!r} (the file is damaged)")
    tol = 1e-9 * max(1.0, abs(lo), abs(hi))
    if _is_num(effect) and not lo - tol <= effect <= hi + tol:
        raise ConfigError(
            f"{where}: field 'effect' is {effect!r}, outside its interval [{lo!r}, {hi!r}] (the file is damaged)"
        )
    interval = (stats.AGREES, stats.DISAGREES, stats.INCONCLUSIVE)
    stored = c.get("measured") if c.get("measured") is not None else c.get("verdict")
    if (
        stored not in interval
        or c.get("kind") not in ("better", "equal")
        or not (c.get("by") is None or _is_num(c["by"]))
    ):
        return
    want = stats.verdict(c["kind"], lo, hi, c["by"] if c["by"] is not None else 0.0)
    if stored != want or (c.get("verdict") in interval and c["verdict"] != want):
        raise ConfigError(
            f"{where}: field 'verdict' is {c.get('verdict')!r} (measured {stored!r}) but its interval "
            f"[{lo:.6g}, {hi:.6g}] against the margin {c['by']!r} gives {want!r} (a hand-edited verdict?)"
        )


def read_verdicts(path: Path) -> dict:
    """A report's ``verdicts.json``: an object, UTF-8, no NaN or Infinity anywhere, with a ``claims``
    list of valid claims (:func:`check_claim`), ``sweep_wall`` null or {wall_s, invocations, finished}
    and ``pooled`` null or [sd, df]. Raises ConfigError naming the file and field."""
    path = Path(path)
    data = parse_json(read_text(path), str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: holds a JSON {type(data).__name__}, not an object; not an lmlab report's verdicts")
    claims = data.get("claims")
    if not isinstance(claims, list):
        raise ConfigError(
            f"{path}: field 'claims' is {_show(claims)}; an lmlab report's verdicts hold a list of "
            f"claims (the file is damaged)"
        )
    for i, c in enumerate(claims):
        check_claim(c, f"{path}: claims[{i}]")
    wall = data.get("sweep_wall")
    if wall is not None and not (
        isinstance(wall, dict)
        and _is_num(wall.get("wall_s"))
        and wall["wall_s"] >= 0
        and _is_int(wall.get("invocations"))
        and wall["invocations"] >= 0
        and isinstance(wall.get("finished"), bool)
    ):
        raise ConfigError(
            f"{path}: field 'sweep_wall' is {_show(wall)}; give null or {{wall_s: seconds >= 0, "
            f"invocations: integer >= 0, finished: true/false}}"
        )
    pooled = data.get("pooled")
    if pooled is not None and not (
        isinstance(pooled, list) and len(pooled) == 2 and _is_num(pooled[0]) and pooled[0] >= 0 and _is_int(pooled[1])
    ):
        raise ConfigError(f"{path}: field 'pooled' is {_show(pooled)}; give null or [sd >= 0, degrees of freedom]")
    for key in ("spec", "claim"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{path}: field {key!r} is {_show(data[key])}; give a string")
    return data


# --- provenance.jsonl and load.jsonl ---------------------------------------------------------
_START_FIELDS = {
    "command": "name",
    "sweep": "name",
    "cwd": "text",
    "lmlab_version": "text",
    "git_commit": "text",
    "spec": "text",
    "spec_sha256": "name",
    "tier": "text",
    "precision": "text",
    "machine": "text",
    "kernels": "text",
    "python": "text",
    "started_at": "text",
}


def read_provenance(path: Path) -> list[dict]:
    """The records of a sweep's ``provenance.jsonl`` (:func:`lmlab.lab.provenance.provenance_record` and
    :func:`lmlab.lab.provenance.end_record`); [] when absent. Raises ConfigError naming the file, line and
    field of a damaged record."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for where, rec in jsonl_objects(path):
        if isinstance(rec, ConfigError):
            raise rec
        if "ended_at" in rec:
            checks = {
                "ended_at": KINDS["name"],
                "wall_s": (lambda x: _is_num(x) and x >= 0, "a finite number >= 0"),
                "finished": (lambda x: isinstance(x, bool), "true or false"),
            }
        else:
            checks = {k: KINDS[v] for k, v in _START_FIELDS.items()}
            checks["load_avg"] = KINDS["numbers"]
        for key, (ok, valid) in checks.items():
            if (key in rec or key in ("ended_at", "wall_s", "command")) and not ok(rec.get(key)):
                raise ConfigError(
                    f"{where}: field {key!r} is {_show(rec.get(key))}; give {valid} (the file is damaged)"
                )
        out.append(rec)
    return out


TIMING_TIMES = ("step_s", "decode_s", "decode_short_s")  # a timing block's per-round seconds, by variant


def read_timing(path: Path, spec=None) -> dict:
    """A sweep's ``timing.json`` (:func:`lmlab.lab.runner.run_timing`): an object with ``key.settings`` (with
    ``spec``, equal to the spec's own ``timing`` settings: a block measured for other settings is not this
    sweep's) and ``scales``, each scale's block mapping every variant, under ``step_s`` (and ``decode_s``,
    ``decode_short_s`` when timed), to its per-round seconds: finite numbers > 0, as many for every variant
    of the block. Raises ConfigError naming the file and the field otherwise."""
    data = read_json_object(path, finite=True)
    key = data.get("key")
    if not isinstance(key, dict) or not isinstance(key.get("settings"), dict):
        raise ConfigError(f"{path}: field 'key.settings' must be an object (the timing block's settings)")
    if spec is not None and getattr(spec, "timing", None) and json.loads(json.dumps(spec.timing)) != key["settings"]:
        raise ConfigError(
            f"{path}: field 'key.settings' {_show(key['settings'], 120)} is not the spec's timing settings "
            f"{_show(spec.timing, 120)}: the block was measured for another spec"
        )
    scales = data.get("scales")
    if not isinstance(scales, dict) or not scales or not all(isinstance(b, dict) for b in scales.values()):
        raise ConfigError(f"{path}: field 'scales' must map each scale to its timing block (an object)")
    for scale, block in scales.items():
        if "step_s" not in block:
            raise ConfigError(f"{path}: field 'scales.{scale}.step_s' is missing (the training steps' seconds)")
        for field in TIMING_TIMES:
            times = block.get(field)
            if times is None:
                continue
            where = f"{path}: field 'scales.{scale}.{field}'"
            if not isinstance(times, dict) or not times:
                raise ConfigError(f"{where} must map each variant to its per-round seconds")
            counts = set()
            for variant, values in times.items():
                if not isinstance(values, list) or not values or not all(_is_num(v) and v > 0 for v in values):
                    raise ConfigError(
                        f"{where}.{variant} = {_show(values)} must be a non-empty list of seconds, each a finite "
                        f"number > 0"
                    )
                counts.add(len(values))
            if len(counts) > 1:
                raise ConfigError(f"{where}: the variants have {sorted(counts)} rounds; interleaved rounds pair them")
    return data


def read_load(path: Path) -> list[dict]:
    """The samples of a sweep's ``load.jsonl`` ({time, load_1m, load_5m}); [] when absent. The file is
    informational: a damaged line (not UTF-8, not a JSON object, a load that is not a finite number
    >= 0) is skipped, and one warning on stderr names the file, the first such line and how many."""
    path = Path(path)
    if not path.is_file():
        return []
    out, bad = [], []
    for where, rec in jsonl_objects(path):
        if isinstance(rec, ConfigError):
            bad.append(str(rec))
            continue
        wrong = next(
            (k for k in ("time", "load_1m", "load_5m") if k in rec and not (_is_num(rec[k]) and rec[k] >= 0)), None
        )
        if wrong or "load_1m" not in rec:
            key = wrong or "load_1m"
            bad.append(f"{where}: field {key!r} is {_show(rec.get(key))}; give a finite number >= 0")
            continue
        out.append(rec)
    if bad:
        print(
            f"warning: {bad[0]}; {len(bad)} damaged line(s) of {path.name} skipped (informational: the load "
            f"average is reported from the others)",
            file=sys.stderr,
        )
    return out
