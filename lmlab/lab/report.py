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
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

from lmlab.config import ConfigError
from lmlab.config_files import load_mapping
from lmlab.json_checks import read_json_object
from lmlab.lab import plots, validate
from lmlab.lab.page import _label, page_markdown, sweep_wall
from lmlab.lab.results import INIT_GRADS_FILE, PROVENANCE_FILE, RESULTS_FILE, TIMING_FILE, run_metrics
from lmlab.lab.spec import parse_spec
from lmlab.lab.stats import finite as _ok
from lmlab.lab.verdicts import analyze, split_stages, tune_key
from lmlab.run_folder import RUN_FILE

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


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


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


def page_figures(
    rows: list[dict],
    chosen: list[dict],
    tune_rows: list[dict],
    res: dict,
    spec,
    grads: Optional[dict],
    order: list[dict],
    sweep_dir: Path,
    out_dir: Path,
    prefix: str,
) -> list[tuple[str, Optional[Path], str]]:
    """The figures of a sweep's page (:mod:`lmlab.lab.plots`), written into ``out_dir`` as
    ``{prefix}NAME.png``: (title, path or None when there was nothing to draw, note) in page order.
    ``chosen``: the rows at each variant's chosen tuned values; ``order``: their aggregates, sorted."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    colors = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    conf = res["confidence"]
    figs: list[tuple[str, Optional[Path], str]] = []
    if spec and spec.tune:
        figs.append(
            (
                "Learning-rate (tuning) sensitivity",
                plots.lr_sensitivity(
                    tune_rows, res["selected"], spec.tune, out_dir / f"{prefix}sensitivity.png", colors
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
                plots.basin(pts, fld, out_dir / f"{prefix}basin-{file_stem}.png", conf, colors),
                "",
            )
        )
    sizes = {c["scale"]: c.get("non_embedding_params") for c in res["controls"] if c["variant"] == res["baseline"]}
    if spec and spec.scales:
        figs.append(
            (
                "Ladder: the effect against model size",
                plots.ladder(res["claims"], sizes, out_dir / f"{prefix}ladder.png"),
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
            plots.bpb_by_variant(groups, out_dir / f"{prefix}bpb.png", colors, conf),
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
            plots.loss_curves(curves, out_dir / f"{prefix}loss.png", colors),
            "Validation bits/byte here are the periodic sampled estimates converted with the full split's "
            "bytes per token; the headline figures are the full split.",
        )
    )
    if diag:
        figs.append(
            (
                "Diagnostics",
                plots.diagnostics(diag, out_dir / f"{prefix}diagnostics.png", colors),
                "One seed per variant (the first), at the chosen tuned values.",
            )
        )
    by_pos = by_position(chosen)
    if by_pos:
        figs.append(
            (
                "Held-out loss by context position",
                plots.loss_by_position(by_pos, out_dir / f"{prefix}loss-by-position.png", colors),
                "Every full validation window of the training context, at the chosen tuned values; "
                "the table 'Loss by position' gives the same numbers in ranges.",
            )
        )
    if grads and grads.get("variants"):
        figs.append(
            (
                "Gradient norm per layer at initialisation",
                plots.init_grads(grads["variants"], out_dir / f"{prefix}init-grads.png", colors),
                "Xiong et al. 2020, Fig. 3: one forward/backward pass of each untrained model on a real "
                "training batch; post-norm's gradients grow towards the output, pre-norm's stay flat.",
            )
        )
    if diag_high:
        where = ", ".join(f"{k}={v:g}" for k, v in high.items())
        figs.append(
            (
                f"Diagnostics at {where} (the largest tuned value)",
                plots.diagnostics(diag_high, out_dir / f"{prefix}diagnostics-high.png", colors),
                "One seed per variant (the first recorded), where instabilities show first; a run that "
                "stopped on non-finite losses ends early.",
            )
        )
    figs.append(
        (
            "Training throughput (information only)",
            plots.throughput(order, out_dir / f"{prefix}throughput.png", colors),
            "",
        )
    )

    return figs


def by_position(chosen: list[dict]) -> dict:
    """Held-out loss by context position of the chosen rows, per variant label: {label: [per-run lists]}."""
    by_pos: dict = {}
    for r in chosen:
        if r.get("val_loss_by_position"):
            by_pos.setdefault(_label(r.get("scale"), r["variant"]), []).append(r["val_loss_by_position"])
    return by_pos


def write_report(sweep_dir: str | Path, out: Optional[str | Path] = None) -> list[Path]:
    """Write the report of ``sweep_dir`` (default ``SWEEP_DIR/report.md``), its PNGs, CSV and
    ``verdicts.json``; returns the files written. Raises ValueError when the sweep has no results yet or
    ``out`` is not a markdown path or an existing non-report file, and ConfigError naming the file, line
    and field when ``results.jsonl`` or ``provenance.jsonl`` is damaged (:mod:`lmlab.lab.validate`;
    nothing is written then)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ConfigError(
            f"{str(sweep_dir)!r} is {'a file' if sweep_dir.exists() else 'not there'}, not a sweep "
            f"folder; give the folder `lmlab sweep --out` wrote (it holds results.jsonl)"
        )
    out = _check_out(Path(out) if out else sweep_dir / "report.md")
    # report.md, or a report beside its sweep: plain names (loss.png, ...); NAME.md elsewhere: NAME-loss.png, ...
    prefix = "" if (out.parent.resolve() == sweep_dir.resolve() or out.stem == "report") else f"{out.stem}-"
    spec_raw: dict = {}
    spec = None
    spec_note = f"{sweep_dir} has no spec.yaml"
    if (sweep_dir / "spec.yaml").exists():
        spec_raw = read_spec_file(sweep_dir / "spec.yaml")
        try:
            spec = parse_spec(spec_raw)
        except Exception as exc:  # noqa: BLE001 -- a page from the results alone still works, said so
            spec_note = f"{sweep_dir / 'spec.yaml'} is not a valid spec ({exc})"
    timing = read_timing_file(sweep_dir / TIMING_FILE, spec) if (sweep_dir / TIMING_FILE).exists() else None
    grads = read_json_file(sweep_dir / INIT_GRADS_FILE) if (sweep_dir / INIT_GRADS_FILE).exists() else None
    # every row validated (lmlab.lab.validate) before anything is judged; a cut last line is refused
    rows = validate.read_results_jsonl(sweep_dir / RESULTS_FILE, spec_raw.get("name"), spec)
    if not rows:
        run = " (it is a training run's folder: `lmlab eval` scores it)" if (sweep_dir / RUN_FILE).is_file() else ""
        raise ValueError(
            f"{str(sweep_dir)!r} has no {RESULTS_FILE} rows{run}; `lmlab report` reads a sweep's folder, "
            f"which `lmlab sweep SPEC --out DIR` writes"
        )
    validate.read_provenance(sweep_dir / PROVENANCE_FILE)  # a damaged record refused before anything is written
    if spec is None:
        print(f"warning: {spec_note}; the page has no baseline, tuning or verdicts", file=sys.stderr)
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
        if (r.get("scale"), r["variant"]) in selected and tune_key(r) == selected[(r.get("scale"), r["variant"])]["key"]
    ]
    labelled = [{**r, "variant": _label(r.get("scale"), r["variant"])} for r in chosen]
    aggs = aggregate(labelled)
    order = sorted(aggs, key=sort_key)
    ctxs = extra_contexts(rows)
    written: list[Path] = []
    kept = []  # beside a report elsewhere: the spec it ran with and its timing block (`lmlab report --index`
    if out.parent.resolve() != sweep_dir.resolve():  # re-judges the folder from them)
        for src, fname, mark in (
            (sweep_dir / "spec.yaml", "spec.yaml", SPEC_MARK.encode()),
            (sweep_dir / TIMING_FILE, TIMING_FILE, b'{\n "key"'),
        ):
            dst = out.parent / f"{prefix}{fname}"
            if src.is_file():
                if dst.exists() and not dst.read_bytes().startswith(mark):
                    raise ValueError(
                        f"--out {str(dst.parent)!r} already holds {dst.name}, which lmlab report "
                        f"did not write; choose another folder (nothing was written)"
                    )
                kept.append((src, dst, mark))
    _check_own_data([out.parent / f"{prefix}results.csv", out.parent / f"{prefix}{VERDICTS_FILE}"])
    out.parent.mkdir(parents=True, exist_ok=True)  # every input checked: the first write
    for src, dst, mark in kept:
        data = src.read_bytes()
        dst.write_bytes((SPEC_MARK + f" ({src})\n").encode() + data if dst.suffix == ".yaml" else data)
        written.append(dst)
    csv_path = write_csv(rows, out.parent / f"{prefix}results.csv")
    by_pos = by_position(chosen)
    figs = page_figures(rows, chosen, tune_rows, res, spec, grads, order, sweep_dir, out.parent, prefix)
    written += [path for _, path, _ in figs if path is not None]
    text = page_markdown(
        name,
        res,
        spec,
        spec_raw,
        rows,
        planned,
        selected,
        order,
        ctxs,
        aggs,
        timing,
        grads,
        by_pos,
        figs,
        csv_path,
        sweep_dir,
    )
    res["sweep_wall"] = sweep_wall(sweep_dir)
    verdict_path = out.parent / f"{prefix}{VERDICTS_FILE}"
    verdict_path.write_text(json.dumps(_json_safe(res), indent=1))
    out.write_text(text)
    return [out, csv_path, verdict_path, *written]


def read_spec_file(path: Path) -> dict:
    """A sweep's ``spec.yaml`` as a mapping; ValueError naming the file when it is damaged (not YAML,
    not a mapping, not UTF-8)."""

    try:
        return load_mapping(path)
    except ConfigError as exc:
        raise ValueError(
            f"{exc}; the sweep's spec.yaml is damaged: rerun `lmlab sweep SPEC --out {path.parent}` to rewrite it"
        ) from None


def read_timing_file(path: Path, spec=None) -> dict:
    """A sweep's timing.json, checked (:func:`lmlab.lab.validate.read_timing`, against ``spec``'s timing
    settings when given); ValueError naming the file, what is wrong and that a rerun measures it again."""
    try:
        return validate.read_timing(path, spec)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{str(path)!r} could not be read ({exc}); delete it (a rerun of the sweep measures it again)"
        ) from None


def read_json_file(path: Path) -> dict:
    """A JSON object written by the lab (timing.json, init_grads.json: :func:`lmlab.json_checks.read_json_object`);
    ValueError naming the file, what is wrong and that a rerun writes it again."""
    try:
        return read_json_object(path)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{str(path)!r} could not be read ({exc}); delete it (a rerun of the sweep or report writes it again)"
        ) from None


def _check_out(out: Path, mark: str = REPORT_MARKS[0]) -> Path:
    if out.is_dir() or out.suffix.lower() != ".md":
        raise ValueError(
            f"--out {str(out)!r} must be a markdown file path ending in .md (its plots and CSV go beside it)"
        )
    if out.exists() and not out.read_text(errors="replace").startswith(mark):
        what = "an lmlab index page" if mark == REPORT_MARKS[1] else "an lmlab sweep report"
        raise ValueError(f"--out {str(out)!r} exists and is not {what}; choose another file (nothing was written)")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise ValueError(f"--out {str(out)!r} lies under a file; choose a folder path (nothing was written)")
    return out  # its folder is made by the first write, once every input is checked


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


def _largest_tuned(spec) -> Optional[dict]:
    """The tuned values of the grid's largest point when the spec tunes one numeric field (the highest
    learning rate), else None."""
    if not spec or len(spec.tune) != 1:
        return None
    ((fld, values),) = spec.tune.items()
    nums = [v for v in values if _ok(v)]
    return {fld: max(nums)} if len(nums) == len(values) else None
