"""``lmlab report SWEEP_DIR``: the answer page of a sweep (``lmlab sweep``), with its plots and CSV;
``lmlab report --index DIR... --out FILE.md``: one page of every claim of several sweeps.

The page (``report.md``) opens with the **verdict table**: per expectation of the spec (and per scale of
a ladder) the measured effect with its interval and a verdict computed by :mod:`lmlab.lab.verdicts`
(``agrees`` / ``disagrees`` / ``inconclusive``); nothing about the result is written by hand. Then:
every variant against the baseline (paired per-seed differences), the provenance (lmlab version, git
commit, spec SHA-256, commands, machine, dates, load average), the controls (parameters, FLOPs/token,
tokens and steps per variant, with the quantities that drift from the baseline flagged), the tuned
values chosen (edges of the grid flagged), the timing block's ratios, the figures (:mod:`lmlab.lab.plots`:
LR sensitivity, basins of numeric axes, the ladder, bits/byte by variant, loss curves, diagnostics,
training throughput for information) and the run table (contended runs marked). ``verdicts.json`` beside
it holds the numbers of the page; ``results.csv`` every row of ``results.jsonl`` (the ``fields`` a
variant sets as ``set.<field>`` columns).

A report named ``report.md`` (in the sweep folder or elsewhere) has its files under plain names beside
it; one written as ``--out DIR/NAME.md`` names them ``NAME-loss.png``, ..., ``NAME-results.csv``. An
existing ``--out`` file is replaced only when it is an lmlab report (it starts with ``# Ablation:`` or
``# Ablation index``).
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Optional


from lmlab.lab import plots
from lmlab.lab.stats import finite as _ok
from lmlab.lab.runner import (
    INIT_GRADS_FILE,
    LOAD_FILE,
    PROVENANCE_FILE,
    RESULTS_FILE,
    TIMING_FILE,
    run_metrics,
)
from lmlab.lab.spec import builtin_specs, parse_spec
from lmlab.lab import validate
from lmlab.config import ConfigError
from lmlab.lab.verdicts import analyze, split_stages, tune_key

VERDICTS_FILE = "verdicts.json"
REPORT_MARKS = ("# Ablation:", "# Ablation index")
SPEC_MARK = "# lmlab report: the spec this sweep ran with"  # the first line of a report folder's spec.yaml

COLUMNS = (
    "sweep",
    "run",
    "variant",
    "seed",
    "status",
    "diverged",
    "val_bpb",
    "val_loss",
    "final_train_loss",
    "first_train_loss",
    "params",
    "non_embedding_params",
    "steps",
    "max_steps",
    "tokens",
    "flops",
    "flops_per_token",
    "wall_s",
    "tokens_per_s",
    "step_ms",
    "spikes",
    "skipped_steps",
    "stopped_early",
    "kv_bytes_per_token",
    "kv_bytes_context",
    "decode_tokens_per_s",
    "prefill_tokens_per_s",
    "val_tokens",
    "val_bytes",
    "error",
)


def _mean(xs: list) -> Optional[float]:
    xs = [x for x in xs if _ok(x)]
    return sum(xs) / len(xs) if xs else None


def extra_contexts(rows: list[dict]) -> list[str]:
    """The longer-context suffixes present (``2x``, ...), in increasing order."""
    found = {m.group(1) for r in rows for k in r for m in [re.fullmatch(r"val_bpb_(.+)x", k)] if m}
    return [f"{s}x" for s in sorted(found, key=float)]


def aggregate(rows: list[dict]) -> list[dict]:
    """One record per variant (in first-seen order): mean/min/max/std over seeds of the numeric results."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["variant"], []).append(r)
    ctxs = extra_contexts(rows)
    out = []
    for variant, g in groups.items():
        a: dict = {
            "variant": variant,
            "runs": len(g),
            "seeds": [r["seed"] for r in g],
            "diverged": sum(1 for r in g if r.get("diverged")),
            "failed": sum(1 for r in g if r.get("status") == "failed"),
        }
        for key in ("val_bpb", "val_loss", *(f"val_bpb_{c}" for c in ctxs)):
            vals = [r.get(key) for r in g if _ok(r.get(key))]
            a[key] = sum(vals) / len(vals) if vals else None
            a[f"{key}_min"] = min(vals) if vals else None
            a[f"{key}_max"] = max(vals) if vals else None
            a[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None)
            a[f"{key}_all"] = vals
        for key in (
            "final_train_loss",
            "tokens_per_s",
            "step_ms",
            "steps",
            "tokens",
            "flops",
            "wall_s",
            "spikes",
            "decode_tokens_per_s",
            "params",
            "non_embedding_params",
            "kv_bytes_per_token",
            "kv_bytes_context",
            "max_attn_logit",
            "log_z_max",
            "attn_sink",
        ):
            vals = [r.get(key) for r in g if _ok(r.get(key))]
            a[key] = sum(vals) / len(vals) if vals else None
            a[f"{key}_min"] = min(vals) if vals else None
            a[f"{key}_max"] = max(vals) if vals else None
        a["notes"] = sorted({r[k] for r in g for k in r if k.startswith("eval_note") and r[k]})
        out.append(a)
    return out


def sort_key(a: dict) -> tuple:
    """Mean bits-per-byte ascending; variants without one (diverged, failed) last."""
    bpb = a.get("val_bpb")
    return (bpb is None, bpb if bpb is not None else math.inf, a.get("final_train_loss") or math.inf)


# --- formatting ----------------------------------------------------------------------------
def _num(x: Any, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if _ok(x) else "n/a"


def _count(x: Any) -> str:
    if not _ok(x):
        return "n/a"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def flat_row(r: dict) -> dict:
    """A results row with its ``fields`` as ``set.<field>`` columns."""
    out = {k: v for k, v in r.items() if k != "fields"}
    for k, v in (r.get("fields") or {}).items():
        out[f"set.{k}"] = v
    return out


def csv_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def read_results_csv(path: Path, sweep: Optional[str] = None, spec=None) -> list[dict]:
    """The rows of a ``results.csv`` written by :func:`write_csv` back as results rows (empty cells
    None, ``true``/``false`` booleans, numbers as numbers, ``set.<field>`` columns as ``fields``),
    validated by :func:`lmlab.lab.validate.read_results_csv` (``sweep``: the sweep's name every row
    must carry; ``spec``: the spec whose variants, scales, seeds and tuned fields they must be).
    Raises ConfigError naming the file, row and column of a damaged cell."""
    return validate.read_results_csv(path, sweep, spec)


def write_csv(rows: list[dict], path: Path) -> Path:
    flat = [flat_row(r) for r in rows]
    cols = [c for c in COLUMNS if any(c in r for r in flat)]
    for r in flat:
        cols += [k for k in r if k not in cols and not k.startswith("set.")]
    for r in flat:
        cols += [k for k in r if k not in cols]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(cols)
        for r in flat:
            w.writerow([csv_cell(r.get(c)) for c in cols])
    return path


def _setup_lines(spec_raw: dict, rows: list[dict], sweep_dir: Path) -> list[str]:
    from lmlab.run_folder import read_run

    lines = []
    run = first = None
    for r in rows:
        try:
            run, first = read_run(sweep_dir / "runs" / r["run"]), r["run"]
            break
        except Exception:  # noqa: BLE001 -- a report from results alone still works
            continue
    if run:
        m, t = run["model"], run["train"]
        lines.append(
            f"- **Model** (run `{first}`; the other variants change the fields their labels name): "
            f"d_model {m['d_model']}, {m['n_layers']} layer{'s' if m['n_layers'] != 1 else ''}, "
            f"{m['n_heads']} heads ({m['n_kv_heads']} KV), d_ff {m['d_ff']} ({m['activation']}), "
            f"{m['norm_type']} {m['norm_position']}-norm, {m['position']} positions, context "
            f"{m['context_length']}, vocabulary {m['vocab_size']}."
        )
        lines.append(
            f"- **Training**: batch {t['batch_size']} x {m['context_length']} tokens, AdamW lr {t['lr']:g} "
            f"({t['schedule']}, {t['warmup_steps']} warmup steps), weight decay {t['weight_decay']:g}, "
            f"grad clip {t['grad_clip']:g}, dtype {t['dtype']}."
        )
        data = str(run.get("data"))
        try:  # a path inside the working directory is shown relative to it
            data = str(Path(data).relative_to(Path.cwd()))
        except ValueError:
            pass
        lines.append(f"- **Data**: `{data}`; bits-per-byte over the whole validation split.")
    budget = spec_raw.get("budget")
    if budget:
        lines.append(f"- **Budget per run**: {', '.join(f'{k} {v}' for k, v in budget.items())}.")
    if spec_raw.get("seeds"):
        lines.append(f"- **Seeds**: {', '.join(map(str, spec_raw['seeds']))}.")
    if spec_raw.get("notes"):
        lines.append(f"- **Notes**: {str(spec_raw['notes']).strip()}")
    return lines


def _ci(lo: Any, hi: Any, digits: int = 4, k: float = 1.0) -> str:
    return f"[{lo * k:+.{digits}f}, {hi * k:+.{digits}f}]" if _ok(lo) and _ok(hi) else "n/a"


def _effect(c: dict) -> str:
    """A claim's measured effect and interval in its unit (bits/byte, nats, or %)."""
    if c.get("effect") is None:
        return "n/a"
    if c.get("relative"):
        lo, hi = c.get("lo"), c.get("hi")
        ci = f"[{100 * lo:+.2f}%, {100 * hi:+.2f}%]" if _ok(lo) and _ok(hi) else "n/a"
        return f"{100 * c['effect']:+.2f}% {ci}"
    return f"{c['effect']:+.4f} {_ci(c.get('lo'), c.get('hi'))}"


def _expected(c: dict) -> str:
    amount = f"{100 * c['by']:g}%" if c.get("relative") else f"{c['by']:g}"
    if c["kind"] == "equal":
        return f"\\|{_md_escape(c['a'])} - {_md_escape(c['b'])}\\| < {amount}"
    if c["by"] < 0:  # non-inferiority
        return f"{_md_escape(c['a'])} at most {amount.lstrip('-')} worse than {_md_escape(c['b'])}"
    return (
        f"{_md_escape(c['a'])} lower than {_md_escape(c['b'])} by > {amount}"
        if c["by"]
        else f"{_md_escape(c['a'])} lower than {_md_escape(c['b'])}"
    )


def _unit(metric: str) -> str:
    return {
        "val_bpb": "bits/byte",
        "final_train_loss": "nats/token",
        "step_time": "step time",
        "decode_time": "decode step time",
        "lr_sensitivity": "LR sensitivity (bits/byte)",
        "attn_sink": "first-key attention share",
    }.get(metric, "bits/byte" if metric.startswith("val_bpb") else metric)


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _label(scale: Optional[str], variant: str) -> str:
    return variant + (f" @{scale}" if scale else "")


def _tpp(c: dict) -> str:
    x = c.get("tokens_per_param")
    return "n/a" if not _ok(x) else f"{x:.3g}"


def _detectable(c: dict) -> str:
    x = c.get("detectable")
    if not _ok(x):
        return "n/a"
    return f"{100 * x:.2f}%" if c.get("relative") else f"{x:.4f}"


def claim_cells(c: dict, show_scale: bool) -> list[str]:
    """A judged claim's table cells: claim, (scale), metric, expected, tokens per parameter, detectable
    (80% power), effect [interval], seeds, method, verdict."""
    return (
        [_md_escape(c["text"])]
        + ([str(c.get("scale") or "")] if show_scale else [])
        + [
            _unit(c["metric"]),
            _expected(c),
            _tpp(c),
            _detectable(c),
            _effect(c),
            str(c.get("n", "")),
            c.get("method", ""),
            f"**{c['verdict']}**",
        ]
    )


CLAIM_HEAD = ["metric", "expected", "tokens/param", "detectable (80%)", "measured effect [interval]", "seeds",
              "method", "verdict"]


def claim_note(c: dict) -> str:
    """Why a claim has no verdict (its gate), its preconditions with their measured values, then the
    judging notes."""
    parts = []
    if c.get("gate"):
        parts.append(f"{c['gate']} (the interval alone: {c.get('measured')})")
    for x in c.get("preconditions") or []:
        if x.get("holds"):
            parts.append(f"precondition holds: {x['text']}: {x['value']}")
    if c.get("note"):
        parts.append(c["note"])
    return "; ".join(parts)


def verdict_lines(claims: list[dict], show_scale: bool) -> list[str]:
    head = ["claim"] + (["scale"] if show_scale else []) + CLAIM_HEAD + ["note"]
    L = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for c in claims:
        cells = claim_cells(c, show_scale) + [_md_escape(claim_note(c))]
        L.append("| " + " | ".join(cells) + " |")
    return L


HOW_TO_READ = (
    "The effect is measured in the direction the claim states (positive = as claimed; for 'equal' the "
    "signed difference), with a {conf:g}% interval (Student t over paired seeds; the pooled per-run noise "
    "when a variant has one seed). A claim **agrees** when the whole interval clears the smallest effect that "
    "counts, **disagrees** when it lies wholly on the other side, and is **inconclusive** when it contains "
    "it. A claim gets no verdict when its design cannot support one: **not testable at this scale** (a "
    "precondition of its mechanism, measured on its own runs, fails, or its runs are below the floor of "
    "tokens per non-embedding parameter), **rate not bracketed** (a variant's learning rate was chosen at "
    "an edge of the rates tried, on too few seeds or values, or in no stable cell) or **too few seeds** "
    "(fewer paired seeds than the spec's judging.min_seeds); the interval is shown either way. "
    "*Detectable (80%)*: the smallest true effect this design (its paired seeds and their measured noise) "
    "would detect with 80% probability; a margin below it was underpowered before any verdict."
)


def sweep_wall(sweep_dir: Path) -> Optional[dict]:
    """{"wall_s": the summed wall time of the sweep's invocations, "invocations": how many ended,
    "finished": whether the last one finished every run} from ``provenance.jsonl``'s end records
    (:func:`lmlab.lab.runner.end_record`); None when no invocation recorded its end (sweeps run
    before lmlab recorded it)."""
    ends = [r for r in validate.read_provenance(sweep_dir / PROVENANCE_FILE) if "ended_at" in r]
    if not ends:
        return None
    return {"wall_s": sum(r["wall_s"] for r in ends), "invocations": len(ends),
            "finished": bool(ends[-1].get("finished"))}


def _run_files_lines(sweep_dir: Path, rows: list[dict]) -> list[str]:
    """Where each run's log and folder are, and every failed run (not a diverged one: that is a result)
    with its error and the command that reproduces it (``lmlab sweep-worker``)."""
    from lmlab.lab.runner import _repo_relative

    where = _repo_relative(Path(sweep_dir))
    out = [f"Each run's training log is `{where}/logs/RUN.log` and its run folder `{where}/runs/RUN/` "
           "(`lmlab eval`, `generate` and `plot` work on it).", ""]
    failed = [r for r in rows if r.get("status") == "failed"]
    if failed:
        out += [f"Failed runs ({len(failed)}; no result, unlike a diverged run; rerunning `lmlab sweep` retries "
                f"them):", ""]
        for r in failed:
            err = " ".join(str(r.get("error") or "no error recorded").split())
            out.append(f"- `{r['run']}`: {err[:300]}{'...' if len(err) > 300 else ''}; log `{where}/logs/"
                       f"{r['run']}.log`; reproduce with `lmlab sweep-worker {where} {r['run']}`")
        out.append("")
    return out


def _provenance_lines(sweep_dir: Path, rows: list[dict]) -> list[str]:
    L = []
    recs = [r for r in validate.read_provenance(sweep_dir / PROVENANCE_FILE) if "ended_at" not in r]
    if recs:
        versions = sorted(
            {
                f"lmlab {r.get('lmlab_version')}"
                + (
                    f" (git {r['git_commit'][:12]}"
                    f"{'+dirty' if r['git_commit'].endswith('+dirty') else ''})"
                    if r.get("git_commit")
                    else ""
                )
                for r in recs
            }
        )
        L.append(f"- **Code**: {'; '.join(versions)}.")
        hashes = sorted({r.get("spec_sha256", "")[:16] for r in recs})
        L.append(
            f"- **Spec**: `{recs[-1].get('spec') or 'given inline'}`, SHA-256 {', '.join(hashes)}"
            + (" (the spec changed between invocations)" if len(hashes) > 1 else "")
            + "."
        )
        cmds = list(dict.fromkeys(r.get("command", "") for r in recs))
        L.append(
            "- **Commands**: " + "; ".join(f"`{c}`" for c in cmds) + f" ({len(recs)} invocation"
            f"{'s' if len(recs) != 1 else ''}, from {recs[0].get('started_at')})."
        )
    stamps = sorted(r["finished_at"] for r in rows if r.get("finished_at"))
    machines = sorted({r["machine"] for r in rows if r.get("machine")})
    if stamps:
        L.append(
            f"- **Executed** {stamps[0]}"
            + (f" to {stamps[-1]}" if stamps[-1] != stamps[0] else "")
            + (f" on {'; '.join(machines)}" if machines else "")
            + "."
        )
    else:  # results written before lmlab recorded the time and machine of each run
        when = datetime.datetime.fromtimestamp(
            (sweep_dir / RESULTS_FILE).stat().st_mtime, datetime.timezone.utc
        )
        L.append(
            f"- Results file last written {when:%Y-%m-%d %H:%M} UTC (its rows carry no time or machine)."
        )
    wall = sweep_wall(sweep_dir)
    if wall:
        L.append(
            f"- **Wall time** of `lmlab sweep`: {_duration(wall['wall_s'])} over {wall['invocations']} "
            f"invocation{'s' if wall['invocations'] != 1 else ''} (timing block, training and evaluation"
            + ("" if wall["finished"] else "; the last one did not finish every run")
            + ")."
        )
    load = [r["load_1m"] for r in validate.read_load(sweep_dir / LOAD_FILE)]
    if load:
        L.append(
            f"- **Load average** (1 min, sampled every 15 s while the sweep ran): median "
            f"{statistics.median(load):.2f}, max {max(load):.2f}, over {len(load)} samples."
        )
    return L


def _numeric_axes(chosen: list[dict], baseline: str) -> dict:
    """field -> scale -> [(x, per-seed bpb, variant)] for fields taking >= 2 numeric values across the
    variants (incl. solved sizes), and the aspect ratio d_model/n_layers and the feed-forward ratio
    d_ff/d_model where both of their fields are set."""
    by_cell: dict = {}
    for r in chosen:
        f = dict(r.get("fields") or {})
        if _ok(f.get("d_model")) and _ok(f.get("n_layers")) and f["n_layers"]:
            f["d_model/n_layers"] = f["d_model"] / f["n_layers"]  # the aspect ratio (Kaplan et al. 2020)
        if _ok(f.get("d_model")) and _ok(f.get("d_ff")) and f["d_model"]:
            f["d_ff/d_model"] = f["d_ff"] / f["d_model"]  # the feed-forward ratio (Kaplan et al. 2020)
        by_cell.setdefault((r.get("scale"), r["variant"]), {"fields": f, "vals": []})
        if _ok(r.get("val_bpb")):
            by_cell[(r.get("scale"), r["variant"])]["vals"].append(r["val_bpb"])
    out: dict = {}
    for fld in sorted({k for c in by_cell.values() for k in c["fields"]}):
        xs = [c["fields"].get(fld) for c in by_cell.values()]
        if all(_ok(x) for x in xs) and len(set(xs)) >= 2:  # numeric values only (a variant's data: is a mapping)
            for (scale, variant), c in by_cell.items():
                out.setdefault(fld, {}).setdefault(scale, []).append((c["fields"][fld], c["vals"], variant))
    return out


def write_report(sweep_dir: str | Path, out: Optional[str | Path] = None) -> list[Path]:
    """Write the report of ``sweep_dir`` (default ``SWEEP_DIR/report.md``), its PNGs, CSV and
    ``verdicts.json``; returns the files written. Raises ValueError when the sweep has no results yet or
    ``out`` is not a markdown path or an existing non-report file, and ConfigError naming the file, line
    and field when ``results.jsonl`` or ``provenance.jsonl`` is damaged (:mod:`lmlab.lab.validate`;
    nothing is written then)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ConfigError(f"{str(sweep_dir)!r} is {'a file' if sweep_dir.exists() else 'not there'}, not a sweep "
                          f"folder; give the folder `lmlab sweep --out` wrote (it holds results.jsonl)")
    out = _check_out(Path(out) if out else sweep_dir / "report.md")
    # report.md, or a report beside its sweep: plain names (loss.png, ...); NAME.md elsewhere: NAME-loss.png, ...
    prefix = "" if (out.parent.resolve() == sweep_dir.resolve() or out.stem == "report") else f"{out.stem}-"
    spec_raw: dict = {}
    if (sweep_dir / "spec.yaml").exists():
        spec_raw = read_spec_file(sweep_dir / "spec.yaml")
    spec = None
    try:
        spec = parse_spec(spec_raw)
    except Exception as exc:  # noqa: BLE001 -- a page from the results alone still works, said so
        print(
            f"warning: {sweep_dir / 'spec.yaml'} is not a valid spec ({exc}); the page has no baseline, tuning "
            f"or verdicts",
            file=sys.stderr,
        )
    timing = read_json_file(sweep_dir / TIMING_FILE) if (sweep_dir / TIMING_FILE).exists() else None
    grads = (
        read_json_file(sweep_dir / INIT_GRADS_FILE) if (sweep_dir / INIT_GRADS_FILE).exists() else None
    )
    # every row validated (lmlab.lab.validate) before anything is judged; a cut last line is refused
    rows = validate.read_results_jsonl(sweep_dir / RESULTS_FILE, spec_raw.get("name"), spec)
    if not rows:
        raise ValueError(
            f"{str(sweep_dir)!r} has no {RESULTS_FILE} rows; run `lmlab sweep SPEC --out {sweep_dir}` first"
        )
    validate.read_provenance(sweep_dir / PROVENANCE_FILE)  # a damaged record refused before anything is written
    res = analyze(rows, spec, timing)
    name = spec_raw.get("name") or rows[0].get("sweep") or sweep_dir.name
    res["spec"] = name
    res["claim"] = str(spec_raw.get("claim") or "").strip()
    planned = None
    if spec:
        grid = math.prod(len(v) for v in spec.tune.values())
        n_tune = len(spec.tune_seeds) if spec.tune_seeds else len(spec.seeds)
        per_cell = n_tune * grid + (len(spec.seeds) - n_tune)  # stage 2: one value per other seed
        planned = len(spec.variants) * max(1, len(spec.scales)) * per_cell
    tune_rows, eval_rows = split_stages(rows, spec)
    selected = {(s["scale"], s["variant"]): s for s in res["selected"]}
    chosen = [
        r
        for r in eval_rows
        if (r.get("scale"), r["variant"]) in selected
        and tune_key(r) == selected[(r.get("scale"), r["variant"])]["key"]
    ]
    labelled = [{**r, "variant": _label(r.get("scale"), r["variant"])} for r in chosen]
    aggs = aggregate(labelled)
    order = sorted(aggs, key=sort_key)
    ctxs = extra_contexts(rows)
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    colors = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    conf = res["confidence"]
    written: list[Path] = []
    kept = []  # beside a report elsewhere: the spec it ran with and its timing block (`lmlab report --index`
    if out.parent.resolve() != sweep_dir.resolve():  # re-judges the folder from them)
        for src, fname, mark in ((sweep_dir / "spec.yaml", "spec.yaml", SPEC_MARK.encode()),
                                 (sweep_dir / TIMING_FILE, TIMING_FILE, b'{\n "key"')):
            dst = out.parent / f"{prefix}{fname}"
            if src.is_file():
                if dst.exists() and not dst.read_bytes().startswith(mark):
                    raise ValueError(f"--out {str(dst.parent)!r} already holds {dst.name}, which lmlab report "
                                     f"did not write; choose another folder (nothing was written)")
                kept.append((src, dst, mark))
    _check_own_data([out.parent / f"{prefix}results.csv", out.parent / f"{prefix}{VERDICTS_FILE}"])
    for src, dst, mark in kept:
        data = src.read_bytes()
        dst.write_bytes((SPEC_MARK + f" ({src})\n").encode() + data if dst.suffix == ".yaml" else data)
        written.append(dst)
    csv_path = write_csv(rows, out.parent / f"{prefix}results.csv")
    figs: list[tuple[str, Optional[Path], str]] = []
    if spec and spec.tune:
        figs.append(
            (
                "Learning-rate (tuning) sensitivity",
                plots.lr_sensitivity(
                    tune_rows, res["selected"], spec.tune, out.parent / f"{prefix}sensitivity.png", colors
                ),
                "Final held-out bits/byte at each tuned value: a variant whose best value sits at the end of the "
                "grid may do better outside it; a narrow basin means a fragile variant (Wortsman et al. 2023).",
            )
        )
    for fld, pts in _numeric_axes(chosen, res["baseline"]).items():
        file_stem = fld.replace("/", "-per-")
        figs.append(
            (
                f"Basin: {fld}",
                plots.basin(pts, fld, out.parent / f"{prefix}basin-{file_stem}.png", conf, colors),
                "",
            )
        )
    sizes = {
        c["scale"]: c.get("non_embedding_params") for c in res["controls"] if c["variant"] == res["baseline"]
    }
    if spec and spec.scales:
        figs.append(
            (
                "Ladder: the effect against model size",
                plots.ladder(res["claims"], sizes, out.parent / f"{prefix}ladder.png"),
                "",
            )
        )
    groups = []
    for a in order:
        vals = a["val_bpb_all"]
        lo = hi = None
        if len(vals) >= 2:
            from lmlab.lab.stats import t_interval

            ti = t_interval(vals, conf)
            lo, hi = ti["lo"], ti["hi"]
        groups.append((a["variant"], vals, lo, hi))
    figs.append(
        (
            "Held-out bits-per-byte",
            plots.bpb_by_variant(groups, out.parent / f"{prefix}bpb.png", colors, conf),
            "",
        )
    )
    curves, diag, diag_high = {}, {}, {}
    high = _largest_tuned(spec)
    if high:
        for r in rows:
            lab = _label(r.get("scale"), r["variant"])
            if (r.get("tune") or {}) == high and lab not in diag_high:
                recs = run_metrics(sweep_dir / "runs" / r["run"])
                if any("max_attn_logit" in x or "grad_norm_layers" in x for x in recs):
                    diag_high[lab] = [x for x in recs if "step" in x]
    for r in chosen:
        lab = _label(r.get("scale"), r["variant"])
        recs = run_metrics(sweep_dir / "runs" / r["run"])
        bpt = (
            (r["val_tokens"] / r["val_bytes"] / math.log(2))
            if _ok(r.get("val_tokens")) and r.get("val_bytes")
            else None
        )
        c = curves.setdefault(lab, {"train": [], "val_bpb": []})
        c["train"].append(
            {x["step"]: x["loss"] for x in recs if "loss" in x and "tokens" in x and not x.get("skipped")}
        )
        if bpt:
            c["val_bpb"].append({x["step"]: x["val_loss"] * bpt for x in recs if _ok(x.get("val_loss"))})
        if any("max_attn_logit" in x or "grad_norm_layers" in x for x in recs) and lab not in diag:
            diag[lab] = [x for x in recs if "step" in x]
    figs.append(
        (
            "Loss curves",
            plots.loss_curves(curves, out.parent / f"{prefix}loss.png", colors),
            "Validation bits/byte here are the periodic sampled estimates converted with the full split's "
            "bytes per token; the headline figures are the full split.",
        )
    )
    if diag:
        figs.append(
            (
                "Diagnostics",
                plots.diagnostics(diag, out.parent / f"{prefix}diagnostics.png", colors),
                "One seed per variant (the first), at the chosen tuned values.",
            )
        )
    by_pos: dict = {}
    for r in chosen:
        if r.get("val_loss_by_position"):
            by_pos.setdefault(_label(r.get("scale"), r["variant"]), []).append(r["val_loss_by_position"])
    if by_pos:
        figs.append(
            (
                "Held-out loss by context position",
                plots.loss_by_position(by_pos, out.parent / f"{prefix}loss-by-position.png", colors),
                "Every full validation window of the training context, at the chosen tuned values; "
                "the table 'Loss by position' gives the same numbers in ranges.",
            )
        )
    if grads and grads.get("variants"):
        figs.append(
            (
                "Gradient norm per layer at initialisation",
                plots.init_grads(grads["variants"], out.parent / f"{prefix}init-grads.png", colors),
                "Xiong et al. 2020, Fig. 3: one forward/backward pass of each untrained model on a real "
                "training batch; post-norm's gradients grow towards the output, pre-norm's stay flat.",
            )
        )
    if diag_high:
        where = ", ".join(f"{k}={v:g}" for k, v in high.items())
        figs.append(
            (
                f"Diagnostics at {where} (the largest tuned value)",
                plots.diagnostics(diag_high, out.parent / f"{prefix}diagnostics-high.png", colors),
                "One seed per variant (the first recorded), where instabilities show first; a run that "
                "stopped on non-finite losses ends early.",
            )
        )
    figs.append(
        (
            "Training throughput (information only)",
            plots.throughput(order, out.parent / f"{prefix}throughput.png", colors),
            "",
        )
    )

    L = [f"# Ablation: {name}", ""]
    if res["claim"]:
        L += [f"> **Claim.** {res['claim']}", ""]
    L += _design_lines(res, spec)
    L.append("## Verdicts")
    L.append("")
    if res["claims"]:
        L += verdict_lines(res["claims"], bool(spec and spec.scales))
        L.append("")
        L.append("How to read: " + HOW_TO_READ.format(conf=100 * conf))
    else:
        L.append(
            "The spec states no expectations (`expect:`), so this page gives differences and intervals "
            "but no verdict."
        )
    pooled = res["pooled"]
    L.append("")
    L.append(
        f"Per-run noise of held-out bits/byte in this sweep (pooled over {pooled[1]} degree(s) of freedom): "
        f"{pooled[0]:.4f}."
        if pooled
        else "No cell ran two seeds, so this sweep has no noise estimate."
    )
    L.append("")
    L.append(f"## Against the baseline ({_md_escape(res['baseline'])})")
    L.append("")
    L.append(
        "Held-out bits/byte, variant minus baseline (negative = the variant is better), paired by seed "
        f"(same seed = same batches), {100 * conf:g}% interval."
    )
    L.append("")
    head = ["variant", "tuned", "val bpb", "baseline bpb", "difference [interval]", "seeds", "method"]
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for c in res["comparisons"]:
        tuned = selected[(c["scale"], c["variant"])]["tune"]
        L.append(
            "| "
            + " | ".join(
                [
                    _md_escape(_label(c["scale"], c["variant"])),
                    ", ".join(f"{k}={v:g}" if _ok(v) else f"{k}={v}" for k, v in tuned.items()),
                    _num(c["variant_mean"]),
                    _num(c["baseline_mean"]),
                    (f"{c['mean']:+.4f} {_ci(c['lo'], c['hi'])}" if _ok(c["mean"]) else "n/a"),
                    str(c["n"]),
                    c["method"] + (f"; {c['failed']} diverged/failed" if c["failed"] else ""),
                ]
            )
            + " |"
        )
    L.append("")
    L.append("## Setup and provenance")
    L.append("")
    recorded = len(rows)
    diverged = sum(1 for r in rows if r.get("diverged"))
    failed = sum(1 for r in rows if r.get("status") == "failed")
    wall = sum(r.get("wall_s") or 0 for r in rows)
    run_wall = sum(r.get("run_wall_s") or 0 for r in rows)
    L.append(
        f"{recorded} run(s) recorded"
        + (f" of {planned} planned" if planned else "")
        + f" ({len(selected)} variant(s) x scale); {diverged} diverged, {failed} failed; "
        + f"{_duration(wall)} in the training loops"
        + (
            f", {_duration(run_wall)} end to end summed over the runs "
            "(process start, training, evaluation)"
            if run_wall
            else ""
        )
        + " in all."
    )
    L.append("")
    L += _run_files_lines(sweep_dir, rows)
    L += _provenance_lines(sweep_dir, rows)
    L += _setup_lines(spec_raw, rows, sweep_dir)
    L.append("")
    L += _controls_lines(res, spec)
    L += _tuning_lines(res, spec)
    L += _timing_lines(res, timing)
    L += _init_grads_lines(grads)
    L += _by_position_lines(by_pos)
    L.append("## Figures")
    L.append("")
    for title, path, note in figs:
        if path is None:
            continue
        written.append(path)
        L += [f"### {title}", "", f"![{title}]({path.name})", ""] + ([note, ""] if note else [])
    L += _results_lines(order, ctxs, aggs)
    L += _runs_lines(rows, ctxs, res, csv_path, sweep_dir)
    res["sweep_wall"] = sweep_wall(sweep_dir)
    verdict_path = out.parent / f"{prefix}{VERDICTS_FILE}"
    verdict_path.write_text(json.dumps(_json_safe(res), indent=1))
    out.write_text("\n".join(L))
    return [out, csv_path, verdict_path, *written]


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def read_spec_file(path: Path) -> dict:
    """A sweep's ``spec.yaml`` as a mapping; ValueError naming the file when it is damaged (not YAML,
    not a mapping, not UTF-8)."""
    from lmlab.config import ConfigError, load_mapping

    try:
        return load_mapping(path)
    except ConfigError as exc:
        raise ValueError(
            f"{exc}; the sweep's spec.yaml is damaged: rerun `lmlab sweep SPEC --out "
            f"{path.parent}` to rewrite it"
        ) from None


def read_json_file(path: Path) -> dict:
    """A JSON object written by the lab (timing.json, init_grads.json); ValueError naming the file
    (nesting deeper than :data:`lmlab.lab.validate.MAX_DEPTH` refused before parsing)."""
    try:
        data = json.loads(validate.check_nesting(path.read_text(), "its text", error=ValueError))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(
            f"{str(path)!r} could not be read ({exc}); the file is damaged: delete it (a rerun of "
            f"the sweep or report writes it again)"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{str(path)!r} holds a JSON {type(data).__name__}, not an object; the file is damaged"
        )
    return data


def _check_out(out: Path, mark: str = REPORT_MARKS[0]) -> Path:
    if out.is_dir() or out.suffix.lower() != ".md":
        raise ValueError(
            f"--out {str(out)!r} must be a markdown file path ending in .md (its plots and CSV go "
            f"beside it)"
        )
    if out.exists() and not out.read_text(errors="replace").startswith(mark):
        what = "an lmlab index page" if mark == REPORT_MARKS[1] else "an lmlab sweep report"
        raise ValueError(
            f"--out {str(out)!r} exists and is not {what}; choose another file (nothing was written)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def _check_own_data(paths: list[Path]) -> None:
    """Refuse (ValueError) to replace a results.csv / verdicts.json that lmlab report did not write."""
    for path in paths:
        if not path.exists():
            continue
        head = path.read_bytes()[:64] if path.is_file() else b""
        ours = (
            head.startswith(b"sweep,run,") or head.startswith(b"run,")
            if path.suffix == ".csv"
            else head.startswith(b'{\n "confidence"')
        )
        if not ours:
            raise ValueError(
                f"--out {str(path.parent)!r} already holds {path.name}, which lmlab report did not "
                f"write; choose another folder (nothing was written)"
            )


def _controls_lines(res: dict, spec) -> list[str]:
    L = ["## Controls", ""]
    hold = res.get("hold")
    if hold:
        solve = f" by solving `{spec.match.solve}`" if spec and spec.match and spec.match.solve else ""
        L.append(
            f"Held fixed: **{hold}**{solve} (every variant within {100 * (res.get('tolerance') or 0.02):g}% "
            f"of the target). Other quantities more than 5% off the baseline and not declared in `varies:` "
            f"are flagged."
        )
    else:
        L.append(
            "The spec holds nothing fixed by construction (`match:`); quantities more than 5% off the baseline "
            "and not declared in `varies:` are flagged."
        )
    L.append("")
    head = ["variant", "params", "non-emb", "FLOPs/token", "tokens", "steps", "solved", "flags"]
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for c in res["controls"]:
        flags = ", ".join(f"{q} {100 * r:+.0f}%" for q, r in c["flags"])
        L.append(
            "| "
            + " | ".join(
                [
                    _md_escape(_label(c["scale"], c["variant"])),
                    _count(c.get("params")),
                    _count(c.get("non_embedding_params")),
                    _count(c.get("flops_per_token")),
                    _count(c.get("tokens")),
                    _num(c.get("steps"), 0),
                    ", ".join(f"{k}={v}" for k, v in (c.get("solved") or {}).items()),
                    f"**{flags}**" if flags else "",
                ]
            )
            + " |"
        )
    L.append("")
    return L


def _design_lines(res: dict, spec) -> list[str]:
    """What the sweep's design can show, before any verdict: the seeds compared and those that tuned,
    the rates tried, the tokens per parameter and, per claim, the smallest effect it detects."""
    if not spec or not res["claims"]:
        return []
    t, j = spec.tuning, spec.judging
    compared = sorted(set(spec.seeds) - set(spec.tune_seeds)) if spec.tune_seeds else list(spec.seeds)
    tpp = [c["tokens_per_param"] for c in res["claims"] if _ok(c.get("tokens_per_param"))]
    L = ["## Design", ""]
    L.append(
        f"{len(compared)} paired seed(s) compared"
        + (f", the rate chosen on {len(spec.tune_seeds)} other seed(s)" if spec.tune_seeds else
           (", the rate chosen on the same seeds" if spec.tune else ""))
        + (f"; {max((len(s['grid']) for s in res['selected']), default=0)} tuned value(s) at most per variant "
           f"(the spec's {math.prod(len(v) for v in spec.tune.values())}, extended past an edge up to "
           f"{t.extend} per side)" if spec.tune else "")
        + (f"; {min(tpp):.3g} to {max(tpp):.3g} tokens per non-embedding parameter" if tpp else "")
        + f". A verdict needs {j.min_seeds} paired seeds, {j.tokens_per_param:g} tokens per parameter (claims "
        f"about trained quality, unless a claim sets its floor) and rates chosen on >= {t.min_seeds} seeds over "
        f">= {t.min_points} values and bracketed."
    )
    L.append("")
    rows = [c for c in res["claims"] if _ok(c.get("detectable"))]
    if rows:
        L.append("Smallest effect each claim's design detects at "
                 f"{100 * j.power:g}% power (from its measured paired noise), against its margin:")
        L.append("")
        for c in rows:
            margin = c.get("margin")
            m = ("" if not _ok(margin) else (f"{100 * margin:.2f}%" if c.get("relative") else f"{margin:.4f}"))
            under = _ok(margin) and c["detectable"] > margin
            at = f" @{c['scale']}" if c.get("scale") else ""
            L.append(f"- {_md_escape(c['text'])}{at}: {_detectable(c)}" + (f" against a margin of {m}" if m else "")
                     + (" (**underpowered**)" if under else ""))
        L.append("")
    return L


def _tuning_lines(res: dict, spec) -> list[str]:
    if not spec or not spec.tune:
        return []
    t = spec.tuning
    L = [
        "## Tuned values",
        "",
        (
            f"Two-stage tuning: seed(s) {', '.join(map(str, spec.tune_seeds))} trained every value of "
            "the grid and chose each variant's value; the other seeds trained only at the chosen value, and "
            "only they enter the comparisons, so the choice does not bias the figures compared. "
            if spec.tune_seeds
            else "Every seed trained every value; each variant's runs at its chosen value enter the "
            "comparisons (the same seeds chose it, which favours each variant by a best-of-grid choice). "
        )
        + f"The chosen value is the grid point with the lowest mean held-out bits/byte over the seeds that "
        f"tuned, among stable cells (no diverged seed, seed SD at most {t.unstable_ratio:g}x the sweep's median "
        f"cell SD; unstable cells are marked *u*); a best value at an edge made the sweep add values past it "
        f"(up to {t.extend} per side). *Bracketed*: a tried value on each side, chosen on >= {t.min_seeds} seeds "
        f"over >= {t.min_points} values; otherwise the variant's claims get no verdict. *Fit*: the vertex of a "
        "parabola in log10(value) through the chosen point and its neighbours (information; nothing ran "
        "there). *Tolerated*: the values "
        f"whose mean is within {res.get('tolerated_within', 0.05):g} bits/byte of the variant's best. "
        f"*LR sensitivity* (Wortsman et al. 2023, eq. 1, around each variant's own optimum): per seed, the "
        f"mean over the {t.window} value(s) each side of the chosen one of min(bits/byte, the untrained "
        "model's) minus the bits/byte at the chosen value, averaged over seeds (0 = a flat basin).",
        "",
    ]
    head = ["variant", "chosen", "bracketed", "fit", "mean bpb at each value", "tolerated", "LR sensitivity"]
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for s in res["selected"]:
        grid = "; ".join(
            ", ".join(f"{k}={v:g}" if _ok(v) else f"{k}={v}" for k, v in g["tune"].items())
            + ": "
            + ("diverged" if g["failed"] else _num(g["mean"]))
            + (" *u*" if g.get("unstable") and not g["failed"] else "")
            for g in s["grid"]
        )
        bracket = "yes" if s.get("bracketed", not s["edge"]) else f"**no**: {s.get('why') or 'at the edge'}"
        sens = _num(s.get("lr_sensitivity")) if s.get("lr_sensitivity") is not None else (
            f"n/a ({s['lr_sensitivity_why']})" if s.get("lr_sensitivity_why") else "n/a")
        L.append(
            "| "
            + " | ".join(
                [
                    _md_escape(_label(s["scale"], s["variant"])),
                    ", ".join(f"{k}={v:g}" if _ok(v) else f"{k}={v}" for k, v in s["tune"].items()),
                    _md_escape(bracket),
                    f"{s['fit']:.3g}" if _ok(s.get("fit")) else "",
                    grid,
                    _tolerated(s.get("tolerated") or [], len(s["grid"])),
                    _md_escape(sens),
                ]
            )
            + " |"
        )
    L.append("")
    return L


def _largest_tuned(spec) -> Optional[dict]:
    """The tuned values of the grid's largest point when the spec tunes one numeric field (the highest
    learning rate), else None."""
    if not spec or len(spec.tune) != 1:
        return None
    ((fld, values),) = spec.tune.items()
    nums = [v for v in values if _ok(v)]
    return {fld: max(nums)} if len(nums) == len(values) else None


def _by_position_lines(by_pos: dict) -> list[str]:
    """Mean held-out loss (nats/token, mean over seeds) per range of context tokens seen: 1-16,
    17-32, 33-64, ... up to the training context."""
    if not by_pos:
        return []
    T = max(len(v[0]) for v in by_pos.values())
    edges = [0, 16]
    while edges[-1] < T:
        edges.append(min(2 * edges[-1], T))
    head = ["variant"] + [f"{a + 1}-{b} tokens" for a, b in zip(edges, edges[1:])]
    L = [
        "## Loss by position",
        "",
        "Held-out loss (nats/token) of the targets predicted from each range of context tokens, mean "
        "over the chosen runs' seeds (every full validation window; the loss falls with context "
        "while the model can use it).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(" --- " for _ in head) + "|",
    ]
    for label, per_seed in by_pos.items():
        mean = [statistics.fmean(col) for col in zip(*per_seed)]
        cells = [_num(statistics.fmean(mean[a:b]), 3) if mean[a:b] else "n/a" for a, b in zip(edges, edges[1:])]
        L.append("| " + " | ".join([_md_escape(label)] + cells) + " |")
    L.append("")
    return L


def _init_grads_lines(grads: Optional[dict]) -> list[str]:
    """The init_grads block as a table: per variant and depth, the last block's gradient norm over the
    first block's (median over seeds)."""
    if not grads or not grads.get("variants"):
        return []
    from lmlab.lab.init_grads import top_to_bottom

    ratios = {label: top_to_bottom(v) for label, v in grads["variants"].items()}
    depths = sorted({d for r in ratios.values() for d in r}, key=int)
    settings = (grads.get("key") or {}).get("settings") or {}
    L = [
        "## Gradients at initialisation",
        "",
        "Gradient L2 norm of the last block over the first block's, median over seeds "
        f"{settings.get('seeds', '')} (batch {settings.get('batch', '?')} of real training windows, "
        "untrained models; Xiong et al. 2020 find post-norm's ratio grows with depth, pre-norm's near "
        "or below 1). Measured with lmlab.lab.init_grads"
        + (f", {grads['finished_at']}" if grads.get("finished_at") else "")
        + ".",
        "",
    ]
    head = ["variant"] + [f"{d} layers" for d in depths]
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for label, r in ratios.items():
        L.append("| " + " | ".join([_md_escape(label)] + [_num(r.get(d), 3) for d in depths]) + " |")
    L.append("")
    return L


def _tolerated(values: list[dict], n_grid: int) -> str:
    """'lr 0.001-0.01 (3 of 5)' for one tuned field; each combination listed for several."""
    if not values:
        return "none"
    fields = sorted({k for v in values for k in v})
    if len(fields) == 1 and all(_ok(v[fields[0]]) for v in values):
        xs = sorted(v[fields[0]] for v in values)
        span = f"{xs[0]:g}" if len(xs) == 1 else f"{xs[0]:g}-{xs[-1]:g}"
        return f"{fields[0]} {span} ({len(xs)} of {n_grid})"
    return "; ".join(", ".join(f"{k}={v[k]}" for k in fields) for v in values)


def _timing_lines(res: dict, timing: Optional[dict]) -> list[str]:
    if not res["timing"]:
        return []
    scales = (timing or {}).get("scales") or {}
    any_block = next(iter(scales.values()), {})
    L = [
        "## Timing block",
        "",
        f"Untrained models, {any_block.get('rounds')} interleaved rounds (order rotated each round) of "
        f"{any_block.get('steps')} training steps (forward + backward + AdamW) at batch {any_block.get('batch')}, "
        f"{any_block.get('threads')} thread(s), {any_block.get('dtype')}, on {(timing or {}).get('machine')}; "
        f"1-min load average {' -> '.join(_num(x, 2) for x in any_block.get('load_avg') or [])} "
        "(before -> after). Ratio = variant / baseline in the same "
        f"round; median, {100 * res['confidence']:g}% sign-test interval, interquartile range.",
        "",
    ]
    head = ["variant", "kind", "ms", "ratio to baseline", "interval", "IQR", "rounds"]
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for t in res["timing"]:
        L.append(
            "| "
            + " | ".join(
                [
                    _md_escape(_label(t["scale"], t["variant"])),
                    "train step" if t["kind"] == "step_s" else "decode step",
                    f"{1e3 * t['seconds']:.2f}",
                    f"{t['median']:.3f}",
                    f"[{t['lo']:.3f}, {t['hi']:.3f}]" if _ok(t.get("lo")) else "n/a",
                    f"{t['q1']:.3f}-{t['q3']:.3f}",
                    str(t["n"]),
                ]
            )
            + " |"
        )
    L.append("")
    return L


def _results_lines(order: list[dict], ctxs: list[str], aggs: list[dict]) -> list[str]:
    L = [
        "## Results by variant",
        "",
        "At each variant's chosen tuned values; sorted by mean held-out bits/byte (lower is better); diverged "
        "and failed runs have none (n/a) and sort last. Training tokens/s is for information only.",
        "",
    ]
    head = (
        ["#", "variant", "val bpb", "sd"]
        + [f"bpb @{c} ctx" for c in ctxs]
        + ["train loss", "tokens/s", "params", "non-emb", "steps", "train FLOPs", "spikes", "diverged"]
    )
    diag = any(a.get("max_attn_logit") is not None for a in aggs)
    if diag:
        head += ["max attn logit", "max log Z"]
    decode = any(a.get("decode_tokens_per_s") is not None for a in aggs)
    if decode:
        head += ["KV B/token", "KV KiB @ctx", "decode tok/s"]
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for i, a in enumerate(order, 1):
        sd = _num(a.get("val_bpb_std")) if len(a["val_bpb_all"]) > 1 else ""
        cells = [str(i), _md_escape(a["variant"]), _num(a.get("val_bpb")), sd]
        cells += [_num(a.get(f"val_bpb_{c}")) for c in ctxs]
        cells += [
            _num(a.get("final_train_loss")),
            _count(a.get("tokens_per_s")),
            _count(a.get("params")),
            _count(a.get("non_embedding_params")),
            _num(a.get("steps"), 0),
            f"{a['flops']:.3g}" if _ok(a.get("flops")) else "n/a",
            _num(a.get("spikes"), 1),
            f"{a['diverged']}/{a['runs']}",
        ]
        if diag:
            cells += [_num(a.get("max_attn_logit_max"), 1), _num(a.get("log_z_max_max"), 1)]
        if decode:
            kv_ctx = a.get("kv_bytes_context")
            cells += [
                _num(a.get("kv_bytes_per_token"), 0),
                _num(kv_ctx / 1024 if _ok(kv_ctx) else None, 0),
                _count(a.get("decode_tokens_per_s")),
            ]
        L.append("| " + " | ".join(cells) + " |")
    notes = sorted({n for a in aggs for n in a["notes"]})
    if notes:
        L.append("")
        L += [f"n/a at a longer context: {n}." for n in notes]
    L.append("")
    return L


def _runs_lines(rows: list[dict], ctxs: list[str], res: dict, csv_path: Path, sweep_dir: Path) -> list[str]:
    contended = {c["run"]: c for c in res["contention"]}
    L = [
        "## Runs",
        "",
        f"One row per run (all columns in [{csv_path.name}]({csv_path.name}), the same data as `{RESULTS_FILE}`; "
        f"run folders under `{sweep_dir / 'runs'}/`). Marked *contended*: wall time over 1.2 x tokens / median "
        f"tokens/s (the machine was shared, or time went to evaluation and checkpoints)."
        + (f" {len(contended)} of {len(rows)} runs are marked." if contended else ""),
        "",
    ]
    head = (
        ["run", "seed", "status", "val bpb"]
        + [f"@{c}" for c in ctxs]
        + ["train loss", "steps", "wall s", "tokens/s", "load"]
    )
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for r in sorted(rows, key=lambda r: (r.get("val_bpb") is None, r.get("val_bpb") or 0)):
        wall = _num(r.get("wall_s"), 0 if (r.get("wall_s") or 0) >= 10 else 1) + (
            f" *contended ({contended[r['run']]['ratio']:.2f}x)*" if r["run"] in contended else ""
        )
        cells = [_md_escape(r["run"]), str(r["seed"]), r.get("status", ""), _num(r.get("val_bpb"))]
        cells += [_num(r.get(f"val_bpb_{c}")) for c in ctxs]
        cells += [
            _num(r.get("final_train_loss")),
            str(r.get("steps", "")),
            wall,
            _count(r.get("tokens_per_s")),
            _num(r.get("load_avg_1m"), 2),
        ]
        L.append("| " + " | ".join(cells) + " |")
    errors = [r for r in rows if r.get("error")]
    if errors:
        L.append("")
        L += [f"- `{r['run']}`: {r['error']}" for r in errors]
    L.append("")
    return L


# --- the index -----------------------------------------------------------------------------
def collect_claims(dirs: list[Path]) -> tuple[list[dict], list[tuple], dict]:
    """Every judged claim of the sweeps (or report folders) ``dirs``: (claims, each with its "spec";
    per folder (name, claim, report link, number of claims, pooled noise, :func:`sweep_wall`);
    {"first", "last": the earliest and latest run finish times, "machines": the machines the runs
    name}). A sweep folder is
    analysed from its results; a report folder from its results.csv and spec, or read from its
    ``verdicts.json``; every file validated first (:mod:`lmlab.lab.validate`). Raises ValueError for a
    folder that is neither, ConfigError naming the file, line and field of a damaged one."""
    claims, specs = [], []
    when, machines = [], []
    for d in dirs:
        d = Path(d)
        rows: list[dict] = []
        if (d / RESULTS_FILE).is_file():
            spec_raw = read_spec_file(d / "spec.yaml") if (d / "spec.yaml").exists() else {}
            spec = parse_spec(spec_raw or {"axes": None}, d / "spec.yaml")
            rows = validate.read_results_jsonl(d / RESULTS_FILE, spec_raw.get("name"), spec if spec_raw else None)
            timing = read_json_file(d / TIMING_FILE) if (d / TIMING_FILE).exists() else None
            res = analyze(rows, spec, timing)
            res["spec"], res["claim"] = (
                spec_raw.get("name") or d.name,
                str(spec_raw.get("claim") or "").strip(),
            )
            res["sweep_wall"] = sweep_wall(d)
            link = None
        elif (d / "results.csv").is_file() and ((d / "spec.yaml").is_file() or d.name in builtin_specs()):
            # a report folder: its results.csv judged anew by the protocol of this lmlab, with the spec it
            # ran with (its spec.yaml, else the shipped spec of its name) and its timing block when kept
            spec_path = d / "spec.yaml" if (d / "spec.yaml").is_file() else builtin_specs()[d.name]
            spec = parse_spec(read_spec_file(spec_path), spec_path)
            # a spec.yaml in the folder is the spec it ran with; its name is the folder's unless it says one
            raw_name = read_spec_file(spec_path).get("name") if (d / "spec.yaml").is_file() else None
            # validated against the spec it ran with (a shipped spec of the folder's name may have changed since)
            own = (d / "spec.yaml").is_file()
            rows = read_results_csv(d / "results.csv", raw_name if own else None, spec if own else None)
            timing = read_json_file(d / TIMING_FILE) if (d / TIMING_FILE).is_file() else None
            stored = validate.read_verdicts(d / VERDICTS_FILE) if (d / VERDICTS_FILE).is_file() else None
            res = analyze(rows, spec, timing, stored["claims"] if stored else None)
            if stored:
                res["sweep_wall"] = stored.get("sweep_wall")
            res["spec"], res["claim"] = raw_name or d.name, spec.claim
            link = d / "report.md" if (d / "report.md").is_file() else None
        elif (d / VERDICTS_FILE).is_file():
            res = validate.read_verdicts(d / VERDICTS_FILE)
            link = d / "report.md"
        else:
            raise ValueError(
                f"{str(d)!r} is neither a sweep folder ({RESULTS_FILE}) nor a report folder "
                f"(results.csv with spec.yaml or a shipped spec's name, or {VERDICTS_FILE}); give the "
                f"folders `lmlab sweep --out` or `lmlab report --out` wrote"
            )
        specs.append(
            (res.get("spec") or d.name, res.get("claim", ""), link, len(res["claims"]), res.get("pooled"),
             res.get("sweep_wall"))
        )
        for c in res["claims"]:
            claims.append({**c, "spec": res.get("spec") or d.name})
        when += [str(r["finished_at"]) for r in rows if r.get("finished_at")]
        machines += [re.sub(r" \(\d+ threads?\)$", "", str(r["machine"])) for r in rows if r.get("machine")]
    executed = {
        "first": min(when) if when else None,
        "last": max(when) if when else None,
        "machines": sorted(set(machines)),
    }
    return claims, specs, executed


def _verdict_counts(claims: list[dict]) -> dict:
    """{verdict: n} over ``claims``, for every verdict of :data:`lmlab.lab.stats.VERDICTS`."""
    from lmlab.lab.stats import VERDICTS

    return {v: sum(1 for c in claims if c["verdict"] == v) for v in VERDICTS}


def _counts_text(counts: dict) -> str:
    """'3 agree, 1 disagrees, ...': every verdict with a count, in the order of VERDICTS."""
    words = {"agrees": "agree", "disagrees": "disagree", "inconclusive": "inconclusive"}
    return ", ".join(f"{n} {words.get(v, v)}" for v, n in counts.items() if n or v in words)


def _leans(c: dict) -> str:
    """An inconclusive claim's lean: 'agrees, ~N seeds', 'nowhere' (a null), '' otherwise."""
    if c.get("verdict") != "inconclusive" or "settle" not in c:
        return ""
    return f"{c['settle'][1]}, ~{c['settle'][0]} seeds" if c["settle"] else "nowhere"


def write_index(dirs: list[Path], out: Path, readme=None) -> list[Path]:
    """One page of every claim of the sweeps (or report folders holding ``verdicts.json``) ``dirs``: a
    row per claim (spec, claim, scale, expected, measured effect and interval, verdict) and a forest
    plot (``NAME-forest.png`` beside ``out``); with ``readme`` (a markdown file, or a list of them) also
    the summary table and/or the counts line between each file's markers (:func:`update_readme`). A
    folder is read by :func:`collect_claims`. Raises ValueError for a folder that is neither a sweep nor a
    report, a bad ``out``, or a file without either pair of markers."""
    out = _check_out(Path(out), REPORT_MARKS[1])
    seen: dict = {}
    for d in dirs:  # one folder named twice would count its claims twice
        key = Path(d).resolve()
        if key in seen:
            raise ConfigError(f"--index: {str(d)!r} is given twice (as {str(seen[key])!r} too); name each sweep once")
        seen[key] = d
    claims, specs, executed = collect_claims(dirs)
    readmes = [] if readme is None else [Path(r) for r in (readme if isinstance(readme, (list, tuple)) else [readme])]
    for r in readmes:
        link = Path(os.path.relpath(out.resolve(), r.resolve().parent))
        update_readme(r, summary_block(claims, executed, link), counts_line(claims, link))
    forest = plots.forest(claims, out.parent / f"{out.stem}-forest.png")
    counts = _verdict_counts(claims)
    L = [
        "# Ablation index",
        "",
        f"{len(claims)} claim(s) from {len(specs)} sweep(s): {_counts_text(counts)}. Generated by `lmlab report "
        f"--index` from the sweeps' numbers (each sweep's results judged by the protocol of the lmlab that "
        f"wrote this page); nothing here is written by hand.",
        "",
        HOW_TO_READ.format(conf=95) + " *Leans*: for an inconclusive claim, the verdict its interval leans towards "
        "and about how many paired seeds would decide it at 80% power if the measured effect and noise held "
        "(a planning figure); 'nowhere': the interval is centred on its boundary (a null), which more seeds "
        "will not settle.",
        "",
    ]
    scaled = any(c.get("scale") for c in claims)
    head = (
        ["spec", "claim"]
        + (["scale"] if scaled else [])
        + CLAIM_HEAD + ["leans", "why no verdict"]
    )
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for c in claims:
        L.append("| " + " | ".join([_md_escape(c["spec"])] + claim_cells(c, scaled)
                                   + [_leans(c), _md_escape(c.get("gate") or "")]) + " |")
    L.append("")
    if forest:
        L += [f"![every claim]({forest.name})", ""]
    L += ["## Sweeps", ""]
    for name, claim, link, n, pooled, wall in specs:
        where = (
            f"[{name}]({Path(link).resolve().relative_to(out.parent.resolve())})" if link and _under(link, out.parent)
            else name
        )
        noise = f"; per-run noise {pooled[0]:.4f} bits/byte" if pooled else "; no noise estimate (one seed)"
        took = f"; `lmlab sweep` took {_duration(wall['wall_s'])}" if wall else "; wall time not recorded"
        L.append(f"- {where}: {n} claim(s){noise}{took}. {_md_escape(claim)}")
    L.append("")
    walls = [w for *_, w in specs if w]
    if walls:
        L += [
            f"Wall time recorded for {len(walls)} of {len(specs)} sweep(s): "
            f"{_duration(sum(w['wall_s'] for w in walls))} in all (each sweep's invocations summed; "
            f"`make ablations` runs the sweeps one after another)"
            + ("" if len(walls) == len(specs) else "; the others ran before lmlab recorded it")
            + ".",
            "",
        ]
    out.write_text("\n".join(L))
    return [out] + ([forest] if forest else []) + readmes


README_START = "<!-- lmlab:ablation-summary (generated by `lmlab report --index ... --readme`; do not edit) -->"
README_END = "<!-- /lmlab:ablation-summary -->"
COUNTS_START = "<!-- lmlab:ablation-counts (generated by `lmlab report --index ... --readme`; do not edit) -->"
COUNTS_END = "<!-- /lmlab:ablation-counts -->"


def counts_line(claims: list[dict], index: Path) -> str:
    """The one-line count of the verdicts, linking the index page ``index`` (relative to the file)."""
    return (f"The shipped specs' executions so far: {len(claims)} claims, **{_counts_text(_verdict_counts(claims))}** "
            f"([every claim, interval and note]({index.as_posix()})).")


def summary_block(claims: list[dict], executed: dict, index: Path) -> str:
    """The lab page's summary (docs/lab.md): one row per claim (spec, claim, verdict, effect [interval]), the
    counts, the execution dates and machines, and a link to the index page ``index`` (relative to the
    README)."""
    counts = _verdict_counts(claims)
    dates = sorted({str(executed.get(k) or "")[:10] for k in ("first", "last")} - {""})
    machines = "; ".join(executed.get("machines") or []) or "machine not recorded"
    L = [
        f"{len(claims)} claims: **{_counts_text(counts)}**; executed {' to '.join(dates) or 'on unrecorded dates'} on "
        f"{machines}. The verdict column of [the index]({index.as_posix()}), where every interval and "
        f"note is.",
        "",
        "| spec | claim | verdict | measured effect [interval] |",
        "| --- | --- | --- | --- |",
    ]
    for c in claims:
        scale = f" (@{c['scale']})" if c.get("scale") else ""
        L.append(
            f"| {_md_escape(c['spec'])} | {_md_escape(c['text'])}{scale} | **{c['verdict']}** | {_effect(c)} |"
        )
    return "\n".join(L)


def update_readme(readme: Path, block: str, counts: Optional[str] = None) -> None:
    """Replace what lies between :data:`README_START` and :data:`README_END` in ``readme`` with ``block``,
    and between :data:`COUNTS_START` and :data:`COUNTS_END` with ``counts`` (each where its markers are;
    atomically). Raises ValueError when the file has neither pair in order."""
    from lmlab.fsutil import atomic_write_text

    text = readme.read_text()
    done = 0
    for start, end, body in ((README_START, README_END, block), (COUNTS_START, COUNTS_END, counts)):
        a, b = text.find(start), text.find(end)
        if body is None or a < 0 or b < a:
            continue
        text = text[: a + len(start)] + "\n" + body + "\n" + text[b:]
        done += 1
    if not done:
        raise ValueError(
            f"{str(readme)!r} has no summary markers; put the lines {README_START!r} and {README_END!r} "
            f"where the table should go (or {COUNTS_START!r} and {COUNTS_END!r} for the counts alone)"
        )
    atomic_write_text(readme, text)


def readme_block(readme: Path, start: str = README_START, end: str = README_END) -> str:
    """The block now in ``readme`` between ``start`` and ``end`` (default: the summary's markers), ''
    without them."""
    text = readme.read_text()
    a, b = text.find(start), text.find(end)
    return text[a + len(start):b].strip("\n") if 0 <= a < b else ""


def _under(path: Path, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False
