"""``lmlab report SWEEP_DIR``: a markdown page of a sweep (``lmlab sweep``) with PNG plots and a CSV.

- ``loss.png``: training loss per variant (mean over seeds) against step and against training FLOPs
  (tokens x :func:`lmlab.analysis.flops_per_token`), validation estimates as markers;
- ``bpb.png``: held-out bits-per-byte per variant (full validation split): each seed as a dot, the mean
  with a min-max bar; at longer evaluation contexts (``eval_contexts``) as open markers;
- ``throughput.png``: training tokens/s per variant (median over logged steps, mean and min-max over
  seeds) and, when measured, KV-cache decode tokens/s;
- ``params.png``: total and non-embedding parameters per variant;
- ``tradeoff.png`` (with decode measurements): bits-per-byte against decode tokens/s, with KV-cache bytes;
- the report (``report.md``): the claim, the setup, a table of variants sorted by mean bits-per-byte
  (diverged and failed runs last), one row per run, and ``results.csv``: every row of ``results.jsonl``
  (the ``fields`` a variant sets as ``set.<field>`` columns).

A report named ``report.md`` (in the sweep folder or elsewhere) has its files under these names beside it;
one written as ``--out DIR/NAME.md`` names them ``NAME-loss.png``, ..., ``NAME-results.csv``. An existing
``--out`` file is replaced only when it is an lmlab report (it starts with ``# Ablation:``).
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any, Optional

import yaml

from lmlab.sweep import RESULTS_FILE, parse_spec, read_jsonl, read_results

COLUMNS = ("sweep", "run", "variant", "seed", "status", "diverged", "val_bpb", "val_loss", "final_train_loss",
           "first_train_loss", "params", "non_embedding_params", "steps", "max_steps", "tokens", "flops",
           "flops_per_token", "wall_s", "tokens_per_s", "step_ms", "spikes", "skipped_steps", "stopped_early",
           "kv_bytes_per_token", "kv_bytes_context", "decode_tokens_per_s", "prefill_tokens_per_s",
           "val_tokens", "val_bytes", "error")


def _ok(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
        a: dict = {"variant": variant, "runs": len(g), "seeds": [r["seed"] for r in g],
                   "diverged": sum(1 for r in g if r.get("diverged")),
                   "failed": sum(1 for r in g if r.get("status") == "failed")}
        for key in ("val_bpb", "val_loss", *(f"val_bpb_{c}" for c in ctxs)):
            vals = [r.get(key) for r in g if _ok(r.get(key))]
            a[key] = sum(vals) / len(vals) if vals else None
            a[f"{key}_min"] = min(vals) if vals else None
            a[f"{key}_max"] = max(vals) if vals else None
            a[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None)
            a[f"{key}_all"] = vals
        for key in ("final_train_loss", "tokens_per_s", "step_ms", "steps", "tokens", "flops", "wall_s", "spikes",
                    "decode_tokens_per_s", "params", "non_embedding_params", "kv_bytes_per_token", "kv_bytes_context",
                    "max_attn_logit", "log_z_max"):
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


# --- plots ---------------------------------------------------------------------------------
def _curves(sweep_dir: Path, runs: list[dict]) -> tuple[dict, dict]:
    """Mean over the runs of training loss by step and validation loss by step (steps any run logged)."""
    train: dict[int, list] = {}
    val: dict[int, list] = {}
    for r in runs:
        for rec in read_jsonl(sweep_dir / "runs" / r["run"] / "metrics.jsonl"):
            if "loss" in rec and "tokens" in rec and not rec.get("skipped") and _ok(rec["loss"]):
                train.setdefault(rec["step"], []).append(rec["loss"])
            elif _ok(rec.get("val_loss")):
                val.setdefault(rec["step"], []).append(rec["val_loss"])
    mean = lambda d: {s: sum(v) / len(v) for s, v in sorted(d.items())}  # noqa: E731
    return mean(train), mean(val)


def make_plots(sweep_dir: Path, rows: list[dict], aggs: list[dict], out_dir: Path, prefix: str = "") -> dict:
    """Write the PNGs; returns {kind: path}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    order = sorted(aggs, key=sort_key)
    names = [a["variant"] for a in order]
    colors = {a["variant"]: f"C{i % 10}" for i, a in enumerate(aggs)}
    height = max(2.6, 0.45 * len(order) + 1.4)

    # loss curves
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    tails, lows = [], []
    for a in aggs:
        runs = [r for r in rows if r["variant"] == a["variant"]]
        train, val = _curves(sweep_dir, runs)
        if not train:
            continue
        fpt = _mean([r.get("flops_per_token") for r in runs]) or 0.0
        tps = _mean([r["tokens"] / r["steps"] for r in runs if _ok(r.get("tokens")) and r.get("steps")]) or 0.0
        steps, losses = list(train), list(train.values())
        label = a["variant"] + (f" ({len(runs)} seeds)" if len(runs) > 1 else "")
        for ax, xs in ((axes[0], steps), (axes[1], [s * tps * fpt for s in steps])):
            ax.plot(xs, losses, color=colors[a["variant"]], lw=1.3, label=label)
        if val:
            axes[0].plot(list(val), list(val.values()), "o", color=colors[a["variant"]], ms=4)
            axes[1].plot([s * tps * fpt for s in val], list(val.values()), "o", color=colors[a["variant"]], ms=4)
        tails.append(losses[min(len(losses) - 1, max(1, len(losses) // 5))])
        lows.append(min(losses + list(val.values())))
    if tails:  # cut off the first fifth of training so the end is readable
        lo, hi = min(lows), max(tails)
        if hi > lo:
            axes[0].set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("training FLOPs")
    axes[0].set_ylabel("train loss (nats/token), mean over seeds")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title("training loss (dots: validation estimates)", fontsize=10)
    fig.tight_layout()
    paths["loss"] = out_dir / f"{prefix}loss.png"
    fig.savefig(paths["loss"], dpi=100)
    plt.close(fig)

    # held-out bits-per-byte
    ctxs = extra_contexts(rows)
    fig, ax = plt.subplots(figsize=(8, height))
    for i, a in enumerate(order):
        y = len(order) - 1 - i
        series = [("val_bpb", "o", colors[a["variant"]], 0.0)] + \
                 [(f"val_bpb_{c}", "s", "none", 0.18 * (k + 1)) for k, c in enumerate(ctxs)]
        if a.get("val_bpb") is None:
            ax.text(0.01, y, "  n/a (" + ("diverged" if a["diverged"] else "failed" if a["failed"] else "no result") + ")",
                    transform=ax.get_yaxis_transform(), va="center", fontsize=8, color="C3")
        for key, marker, face, dy in series:
            if a.get(key) is None:
                continue
            m, lo, hi = a[key], a[f"{key}_min"], a[f"{key}_max"]
            ax.errorbar([m], [y - dy], xerr=[[m - lo], [hi - m]], fmt=marker, color=colors[a["variant"]],
                        mfc=face if face != "none" else "none", ms=7, capsize=3)
            ax.plot(a[f"{key}_all"], [y - dy] * len(a[f"{key}_all"]), ".", color="k", ms=3, alpha=0.6)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(list(reversed(names)), fontsize=8)
    ax.set_xlabel("held-out bits-per-byte (full validation split; lower is better)")
    title = "mean over seeds, bar: min-max, dots: seeds"
    if ctxs:
        title += "; open squares: at " + ", ".join(ctxs) + " the training context"
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    paths["bpb"] = out_dir / f"{prefix}bpb.png"
    fig.savefig(paths["bpb"], dpi=100)
    plt.close(fig)

    # throughput
    has_decode = any(a.get("decode_tokens_per_s") is not None for a in aggs)
    fig, axes = plt.subplots(1, 2 if has_decode else 1, figsize=(13 if has_decode else 7.5, height), squeeze=False)
    panels = [("tokens_per_s", "training tokens/s (median over logged steps)")]
    if has_decode:
        panels.append(("decode_tokens_per_s", "KV-cache decode tokens/s"))
    for ax, (key, xlabel) in zip(axes[0], panels):
        ys = list(range(len(order)))[::-1]
        vals = [a.get(key) or 0.0 for a in order]
        err = [[(a.get(key) or 0) - (a.get(f"{key}_min") or a.get(key) or 0) for a in order],
               [(a.get(f"{key}_max") or a.get(key) or 0) - (a.get(key) or 0) for a in order]]
        ax.barh(ys, vals, xerr=err, color=[colors[n] for n in names], capsize=3)
        ax.set_yticks(ys)
        ax.set_yticklabels(names, fontsize=8)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    paths["throughput"] = out_dir / f"{prefix}throughput.png"
    fig.savefig(paths["throughput"], dpi=100)
    plt.close(fig)

    # parameters
    fig, ax = plt.subplots(figsize=(7.5, height))
    ys = list(range(len(order)))[::-1]
    ax.barh([y + 0.2 for y in ys], [a.get("params") or 0 for a in order], height=0.4, color="C0", label="total")
    ax.barh([y - 0.2 for y in ys], [a.get("non_embedding_params") or 0 for a in order], height=0.4, color="C1",
            label="non-embedding")
    ax.set_yticks(ys)
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("parameters")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    paths["params"] = out_dir / f"{prefix}params.png"
    fig.savefig(paths["params"], dpi=100)
    plt.close(fig)

    if has_decode:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for a in aggs:
            if a.get("decode_tokens_per_s") is None or a.get("val_bpb") is None:
                continue
            ax.plot([a["decode_tokens_per_s"]], [a["val_bpb"]], "o", color=colors[a["variant"]], ms=8)
            kv = f", KV {a['kv_bytes_per_token']:.0f} B/token" if a.get("kv_bytes_per_token") else ""
            ax.annotate(f"{a['variant']}{kv}", (a["decode_tokens_per_s"], a["val_bpb"]), fontsize=8,
                        xytext=(5, 5), textcoords="offset points")
        ax.set_xlabel("KV-cache decode tokens/s (higher is better)")
        ax.set_ylabel("held-out bits-per-byte (lower is better)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        paths["tradeoff"] = out_dir / f"{prefix}tradeoff.png"
        fig.savefig(paths["tradeoff"], dpi=100)
        plt.close(fig)
    return paths


# --- the page ------------------------------------------------------------------------------
def _setup_lines(spec_raw: dict, rows: list[dict], sweep_dir: Path) -> list[str]:
    from lmlab.checkpoint import read_run

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
        lines.append(f"- **Model** (run `{first}`; the other variants change the fields their labels name): d_model {m['d_model']}, {m['n_layers']} layer{'s' if m['n_layers'] != 1 else ''}, "
                     f"{m['n_heads']} heads ({m['n_kv_heads']} KV), d_ff {m['d_ff']} ({m['activation']}), "
                     f"{m['norm_type']} {m['norm_position']}-norm, {m['position']} positions, context "
                     f"{m['context_length']}, vocabulary {m['vocab_size']}.")
        lines.append(f"- **Training**: batch {t['batch_size']} x {m['context_length']} tokens, AdamW lr {t['lr']:g} "
                     f"({t['schedule']}, {t['warmup_steps']} warmup steps), weight decay {t['weight_decay']:g}, "
                     f"grad clip {t['grad_clip']:g}, dtype {t['dtype']}.")
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


def write_report(sweep_dir: str | Path, out: Optional[str | Path] = None) -> list[Path]:
    """Write the report of ``sweep_dir`` (default ``SWEEP_DIR/report.md``), its PNGs and CSV; returns the
    files written. Raises ValueError when the sweep has no results yet."""
    sweep_dir = Path(sweep_dir)
    rows = read_results(sweep_dir)
    if not rows:
        raise ValueError(f"{str(sweep_dir)!r} has no {RESULTS_FILE} rows; run `lmlab sweep SPEC --out {sweep_dir}` first")
    out = Path(out) if out else sweep_dir / "report.md"
    if out.is_dir() or out.suffix.lower() != ".md":
        raise ValueError(f"--out {str(out)!r} must be a markdown file path ending in .md (its plots and CSV go "
                         f"beside it)")
    if out.exists() and not out.read_text(errors="replace").startswith("# Ablation:"):
        raise ValueError(f"--out {str(out)!r} exists and is not an lmlab report; choose another file (nothing was "
                         f"written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    # report.md, or a report beside its sweep: plain names (loss.png, ...); NAME.md elsewhere: NAME-loss.png, ...
    prefix = "" if (out.parent.resolve() == sweep_dir.resolve() or out.stem == "report") else f"{out.stem}-"
    spec_raw: dict = {}
    if (sweep_dir / "spec.yaml").is_file():
        spec_raw = yaml.safe_load((sweep_dir / "spec.yaml").read_text()) or {}
    planned = None
    try:
        spec = parse_spec(spec_raw)
        planned = len(spec.variants) * len(spec.seeds)
    except Exception:  # noqa: BLE001 -- the report does not need a valid spec
        spec = None
    aggs = aggregate(rows)
    order = sorted(aggs, key=sort_key)
    ctxs = extra_contexts(rows)
    csv_path = write_csv(rows, out.parent / f"{prefix}results.csv")
    plots = make_plots(sweep_dir, rows, aggs, out.parent, prefix)

    name = spec_raw.get("name") or rows[0].get("sweep") or sweep_dir.name
    L = [f"# Ablation: {name}", ""]
    claim = str(spec_raw.get("claim") or "").strip()
    if claim:
        L += [f"> **Claim.** {claim}", ""]
    diverged = sum(1 for r in rows if r.get("diverged"))
    failed = sum(1 for r in rows if r.get("status") == "failed")
    wall = sum(r.get("wall_s") or 0 for r in rows)
    L.append(f"{len(rows)} run(s) recorded" + (f" of {planned} planned" if planned else "")
             + f" ({len(aggs)} variant(s)); {diverged} diverged, {failed} failed; "
             f"{wall / 60:.1f} min of training wall time in all.")
    stamps = sorted(r["finished_at"] for r in rows if r.get("finished_at"))
    machines = sorted({r["machine"] for r in rows if r.get("machine")})
    if stamps:
        L.append(f"Executed {stamps[0]}" + (f" to {stamps[-1]}" if stamps[-1] != stamps[0] else "")
                 + (f" on {'; '.join(machines)}" if machines else "") + ".")
    else:  # results written before lmlab recorded the time and machine of each run
        when = datetime.datetime.fromtimestamp((sweep_dir / RESULTS_FILE).stat().st_mtime, datetime.timezone.utc)
        L.append(f"Results file last written {when:%Y-%m-%d %H:%M} UTC (its rows carry no time or machine).")
    L.append("")
    L += _setup_lines(spec_raw, rows, sweep_dir)
    L.append("")
    L.append("## Results")
    L.append("")
    L.append("Variants sorted by held-out bits-per-byte (mean over seeds; lower is better; spread = min-max over "
             "seeds). Diverged and failed runs have no bits-per-byte (n/a) and sort last.")
    L.append("")
    head = ["#", "variant", "val bpb", "spread"] + [f"bpb @{c} ctx" for c in ctxs] + \
           ["train loss", "tokens/s", "step ms", "params", "non-emb", "steps", "train FLOPs", "spikes", "diverged"]
    diag = any(a.get("max_attn_logit") is not None for a in aggs)
    if diag:
        head += ["max attn logit", "max log Z"]
    decode = any(a.get("decode_tokens_per_s") is not None for a in aggs)
    if decode:
        head += ["KV B/token", "KV KiB @ctx", "decode tok/s"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join(" --- " for _ in head) + "|")
    for i, a in enumerate(order, 1):
        spread = (f"{a['val_bpb_min']:.4f}-{a['val_bpb_max']:.4f}" if a["runs"] > 1 and a.get("val_bpb") is not None
                  else "")
        cells = [str(i), _md_escape(a["variant"]), _num(a.get("val_bpb")), spread]
        cells += [_num(a.get(f"val_bpb_{c}")) for c in ctxs]
        cells += [_num(a.get("final_train_loss")), _count(a.get("tokens_per_s")), _num(a.get("step_ms"), 0),
                  _count(a.get("params")), _count(a.get("non_embedding_params")), _num(a.get("steps"), 0),
                  f"{a['flops']:.3g}" if _ok(a.get("flops")) else "n/a", _num(a.get("spikes"), 1),
                  f"{a['diverged']}/{a['runs']}"]
        if diag:
            cells += [_num(a.get("max_attn_logit_max"), 1), _num(a.get("log_z_max_max"), 1)]
        if decode:
            kv_ctx = a.get("kv_bytes_context")
            cells += [_num(a.get("kv_bytes_per_token"), 0), _num(kv_ctx / 1024 if _ok(kv_ctx) else None, 0),
                      _count(a.get("decode_tokens_per_s"))]
        L.append("| " + " | ".join(cells) + " |")
    notes = sorted({n for a in aggs for n in a["notes"]})
    if notes:
        L.append("")
        L += [f"n/a at a longer context: {n}." for n in notes]
    L.append("")
    titles = {"loss": "Training loss", "bpb": "Held-out bits-per-byte", "throughput": "Throughput",
              "params": "Parameters", "tradeoff": "Quality against decode speed"}
    for kind, path in plots.items():
        L += [f"### {titles[kind]}", "", f"![{titles[kind]}]({path.name})", ""]
    L.append("## Runs")
    L.append("")
    L.append(f"One row per run (all columns in [{csv_path.name}]({csv_path.name}), the same data as "
             f"`{RESULTS_FILE}`; run folders under `{sweep_dir / 'runs'}/`).")
    L.append("")
    head = ["run", "seed", "status", "val bpb"] + [f"@{c}" for c in ctxs] + ["train loss", "steps", "wall s", "tokens/s"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join(" --- " for _ in head) + "|")
    for r in sorted(rows, key=lambda r: (r.get("val_bpb") is None, r.get("val_bpb") or 0)):
        cells = [_md_escape(r["run"]), str(r["seed"]), r.get("status", ""), _num(r.get("val_bpb"))]
        cells += [_num(r.get(f"val_bpb_{c}")) for c in ctxs]
        cells += [_num(r.get("final_train_loss")), str(r.get("steps", "")), _num(r.get("wall_s"), 0),
                  _count(r.get("tokens_per_s"))]
        L.append("| " + " | ".join(cells) + " |")
    errors = [r for r in rows if r.get("error")]
    if errors:
        L.append("")
        L += [f"- `{r['run']}`: {r['error']}" for r in errors]
    L.append("")
    out.write_text("\n".join(L))
    return [out, csv_path, *plots.values()]
