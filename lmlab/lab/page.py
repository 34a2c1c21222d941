"""The markdown of one sweep's page (``lmlab report SWEEP_DIR``): the verdict table, the comparisons
with the baseline, provenance, controls, tuning, timing, figures and run tables, rendered from the
analysis :mod:`lmlab.lab.report` made (:func:`lmlab.lab.verdicts.analyze`) and the figures it wrote.
Nothing here computes a statistic or draws a figure."""

from __future__ import annotations

import datetime
import math
import statistics
from pathlib import Path
from typing import Optional

from lmlab.lab import validate
from lmlab.lab.provenance import _repo_relative
from lmlab.lab.results import LOAD_FILE, PROVENANCE_FILE, RESULTS_FILE
from lmlab.lab.stats import finite as _ok
from lmlab.lab.verdict_table import HOW_TO_READ, _ci, _count, _detectable, _md_escape, _num, verdict_lines
from lmlab.run_folder import read_run


def _setup_lines(spec_raw: dict, rows: list[dict], sweep_dir: Path) -> list[str]:

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
            f"grad clip {t['grad_clip']:g}, dtype {_precision(run)}{_compiled(t)}."
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


def _precision(run: dict) -> str:
    """The run's training precision: its ``dtype``, with what ``auto`` resolved to on the run's machine
    (run.yaml's ``precision``), and bf16/fp16 named as autocast."""
    dtype, chosen = run["train"].get("dtype"), run.get("precision")
    shown = f"auto ({chosen})" if dtype == "auto" and chosen else str(dtype)
    return shown + (" autocast" if (chosen or dtype) in ("bf16", "fp16") else "")


def _compiled(train: dict) -> str:
    """What a page's training line adds for a run's ``compile`` setting: ', compiled (torch.compile)',
    ', compile auto' or nothing (compile off)."""
    c = train.get("compile")
    return ", compiled (torch.compile)" if c is True else ", compile auto" if c == "auto" else ""


def _label(scale: Optional[str], variant: str) -> str:
    return variant + (f" @{scale}" if scale else "")


def _run_files_lines(sweep_dir: Path, rows: list[dict]) -> list[str]:
    """Where each run's log and folder are, and every failed run (not a diverged one: that is a result)
    with its error and the command that reproduces it (``lmlab sweep-worker``)."""

    where = _repo_relative(Path(sweep_dir))
    out = [
        f"Each run's training log is `{where}/logs/RUN.log` and its run folder `{where}/runs/RUN/` "
        "(`lmlab eval`, `generate` and `plot` work on it).",
        "",
    ]
    failed = [r for r in rows if r.get("status") == "failed"]
    if failed:
        out += [
            f"Failed runs ({len(failed)}; no result, unlike a diverged run; rerunning `lmlab sweep` retries them):",
            "",
        ]
        for r in failed:
            err = " ".join(str(r.get("error") or "no error recorded").split())
            out.append(
                f"- `{r['run']}`: {err[:300]}{'...' if len(err) > 300 else ''}; log `{where}/logs/"
                f"{r['run']}.log`; reproduce with `lmlab sweep-worker {where} {r['run']}`"
            )
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
                    f" (git {r['git_commit'][:12]}{'+dirty' if r['git_commit'].endswith('+dirty') else ''})"
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
        precisions = list(dict.fromkeys(r["precision"] for r in recs if r.get("precision")))
        if precisions:  # recorded since 2026-12-06
            L.append(
                "- **Precision**: "
                + "; ".join(precisions)
                + (" (it changed between invocations)" if len(precisions) > 1 else "")
                + "."
            )
        kernels = list(dict.fromkeys(r["kernels"] for r in recs if r.get("kernels")))
        if kernels:  # recorded since 2026-12-05
            L.append("- **CPU kernels**: " + "; ".join(kernels) + ".")
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
        when = datetime.datetime.fromtimestamp((sweep_dir / RESULTS_FILE).stat().st_mtime, datetime.timezone.utc)
        L.append(f"- Results file last written {when:%Y-%m-%d %H:%M} UTC (its rows carry no time or machine).")
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


def page_markdown(
    name: str,
    res: dict,
    spec,
    spec_raw: dict,
    rows: list[dict],
    planned: Optional[int],
    selected: dict,
    order: list[dict],
    ctxs: list,
    aggs: list[dict],
    timing: Optional[dict],
    grads: Optional[dict],
    by_pos: dict,
    figs: list,
    csv_path: Path,
    sweep_dir: Path,
) -> str:
    """The markdown of a sweep's page (see the module docstring) from its analysis ``res``
    (:func:`lmlab.lab.verdicts.analyze`) and the figures :func:`page_figures` wrote."""
    conf = res["confidence"]
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
            "The spec states no expectations (`expect:`), so this page gives differences and intervals but no verdict."
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
            f", {_duration(run_wall)} end to end summed over the runs (process start, training, evaluation)"
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
        L += [f"### {title}", "", f"![{title}]({path.name})", ""] + ([note, ""] if note else [])
    L += _results_lines(order, ctxs, aggs)
    L += _runs_lines(rows, ctxs, res, csv_path, sweep_dir)
    return "\n".join(L)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


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
        + (
            f", the rate chosen on {len(spec.tune_seeds)} other seed(s)"
            if spec.tune_seeds
            else (", the rate chosen on the same seeds" if spec.tune else "")
        )
        + (
            f"; {max((len(s['grid']) for s in res['selected']), default=0)} tuned value(s) at most per variant "
            f"(the spec's {math.prod(len(v) for v in spec.tune.values())}, extended past an edge up to "
            f"{t.extend} per side)"
            if spec.tune
            else ""
        )
        + (
            f"; {' to '.join(dict.fromkeys(f'{v:.3g}' for v in (min(tpp), max(tpp))))} tokens per "
            f"non-embedding parameter"
            if tpp
            else ""
        )
        + f". A verdict needs {j.min_seeds} paired seeds, {j.tokens_per_param:g} tokens per parameter (claims "
        f"about trained quality, unless a claim sets its floor) and rates chosen on >= {t.min_seeds} seeds over "
        f">= {t.min_points} values and bracketed."
    )
    L.append("")
    rows = [c for c in res["claims"] if _ok(c.get("detectable"))]
    if rows:
        L.append(
            "Smallest effect each claim's design detects at "
            f"{100 * j.power:g}% power (from its measured paired noise), against its margin:"
        )
        L.append("")
        for c in rows:
            margin = c.get("margin")
            m = "" if not _ok(margin) else (f"{100 * margin:.2f}%" if c.get("relative") else f"{margin:.4f}")
            under = _ok(margin) and c["detectable"] > margin
            at = f" @{c['scale']}" if c.get("scale") else ""
            L.append(
                f"- {_md_escape(c['text'])}{at}: {_detectable(c)}"
                + (f" against a margin of {m}" if m else "")
                + (" (**underpowered**)" if under else "")
            )
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
        sens = (
            _num(s.get("lr_sensitivity"))
            if s.get("lr_sensitivity") is not None
            else (f"n/a ({s['lr_sensitivity_why']})" if s.get("lr_sensitivity_why") else "n/a")
        )
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


def sweep_wall(sweep_dir: Path) -> Optional[dict]:
    """{"wall_s": the summed wall time of the sweep's invocations, "invocations": how many ended,
    "finished": whether the last one finished every run} from ``provenance.jsonl``'s end records
    (:func:`lmlab.lab.provenance.end_record`); None when no invocation recorded its end (sweeps run
    before lmlab recorded it)."""
    ends = [r for r in validate.read_provenance(sweep_dir / PROVENANCE_FILE) if "ended_at" in r]
    if not ends:
        return None
    return {
        "wall_s": sum(r["wall_s"] for r in ends),
        "invocations": len(ends),
        "finished": bool(ends[-1].get("finished")),
    }
