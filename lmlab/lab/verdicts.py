"""From a sweep's results to its answers: tuned values chosen, differences with the baseline, the
verdict of every expectation, the controls and the timing ratios (used by ``lmlab report``).

:func:`analyze` takes the rows of ``results.jsonl``, the parsed spec and the timing block and returns
one JSON-serialisable mapping (written beside the report as ``verdicts.json``; ``lmlab report --index``
reads it). The statistics themselves are in :mod:`lmlab.lab.stats`.

Tuning: for each (scale, variant) the tuned value (e.g. the learning rate) with the lowest mean
``val_bpb`` over seeds is chosen, a diverged or failed seed counting as infinitely bad; its runs enter
the comparisons. The choice uses the same seeds as the comparison, which biases each variant's figure
slightly downward (the best of a grid of noisy means); with the usual 3-5 grid points and 2-3 seeds the
bias is within the seed noise the intervals already carry. A spec with ``tune_seeds`` removes that
bias (two-stage tuning): the choice is made on the tune seeds' runs alone, and the comparisons, the
pooled noise and every verdict use only the other seeds, trained at the chosen value (LR sensitivity,
which needs the whole grid, comes from the tune seeds). A choice at either end of a numeric grid is
flagged: the true optimum may lie outside the grid.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any, Optional

from lmlab.lab import stats
from lmlab.lab.stats import finite as _ok
from lmlab.lab.spec import QUANTITIES, TIMING_METRICS, Spec, control_flags

CONTENTION_LIMIT = 1.2  # a run whose wall time exceeds tokens / median rate by 20% shared the machine


def tune_key(row: dict) -> str:
    return json.dumps(row.get("tune") or {}, sort_keys=True)


def cells(rows: list[dict], metric: str = "val_bpb") -> dict:
    """(scale, variant, tune key) -> {seed: value, or None for a diverged/failed run or a missing value}."""
    out: dict = {}
    for r in rows:
        v = r.get(metric)
        out.setdefault((r.get("scale"), r["variant"], tune_key(r)), {})[r["seed"]] = v if _ok(v) else None
    return out


def _finite(d: dict) -> dict:
    return {s: v for s, v in d.items() if v is not None}


def select_tuned(rows: list[dict], spec: Optional[Spec], metric: str = "val_bpb") -> dict:
    """(scale, variant) -> {"tune": the chosen values, "key", "edge": tuned fields whose choice is an end
    of their numeric grid, "grid": [{"tune", "mean", "n", "failed"}]} (see the module docstring)."""
    grid_values = spec.tune if spec else {}
    by_var: dict = {}
    for (scale, variant, key), vals in cells(rows, metric).items():
        by_var.setdefault((scale, variant), []).append((key, vals))
    out = {}
    for k, options in by_var.items():
        grid = []
        for key, vals in options:
            fin = list(_finite(vals).values())
            failed = len(vals) - len(fin)
            mean = statistics.fmean(fin) if fin and not failed else math.inf
            grid.append({"tune": json.loads(key), "key": key, "mean": mean, "n": len(vals), "failed": failed})
        best = min(grid, key=lambda g: (g["mean"], g["key"]))
        edge = []
        for fld, values in grid_values.items():
            nums = [x for x in values if _ok(x)]
            if (
                len(nums) == len(values)
                and len(nums) >= 2
                and best["tune"].get(fld) in (min(nums), max(nums))
            ):
                edge.append(fld)
        out[k] = {
            "tune": best["tune"],
            "key": best["key"],
            "edge": edge if len(options) > 1 else [],
            "grid": sorted(grid, key=lambda g: g["key"]),
            "all_failed": best["mean"] == math.inf,
        }
    return out


def tolerated(grid: list[dict], within: float) -> list[dict]:
    """The tuned values (``grid`` entries of :func:`select_tuned`) whose mean bits/byte is within
    ``within`` of the best finite mean (every seed finite); [] when none finished."""
    best = min((g["mean"] for g in grid), default=math.inf)
    if not math.isfinite(best):
        return []
    return [g["tune"] for g in grid if g["mean"] <= best + within]


def untrained_bpb(rows: list[dict]) -> dict:
    """(scale, seed) -> the untrained model's bits/byte, estimated as the median first logged training
    loss (nats/token) of that seed's runs times tokens/byte of the validation split over ln 2."""
    per_byte = {}
    for r in rows:
        if r.get("val_tokens") and r.get("val_bytes"):
            per_byte.setdefault(r.get("scale"), r["val_tokens"] / r["val_bytes"])
    first: dict = {}
    for r in rows:
        if _ok(r.get("first_train_loss")) and r.get("scale") in per_byte:
            first.setdefault((r.get("scale"), r["seed"]), []).append(r["first_train_loss"])
    return {
        (scale, seed): statistics.median(v) * per_byte[scale] / math.log(2)
        for (scale, seed), v in first.items()
    }


def lr_sensitivity(rows: list[dict]) -> dict:
    """(scale, variant) -> {seed: LR sensitivity in bits/byte, or None when a grid value is missing}.

    Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities",
    eq. 1): E over the learning-rate grid of [min(loss(lr), loss_0) - loss*], with loss_0 the untrained
    model's loss (:func:`untrained_bpb`) and loss* the best over the grid; here per seed, over every
    tuned value (a diverged or failed run counts as loss_0). 0 = every learning rate of the grid is as
    good as the best; a larger value = a narrower basin. On a geometric grid the mean over grid points
    is the expectation over log learning rate."""
    init = untrained_bpb(rows)
    table = cells(rows, "val_bpb")
    keys_of: dict = {}
    for scale, variant, key in table:
        keys_of.setdefault((scale, variant), []).append(key)
    out: dict = {}
    for (scale, variant), keys in keys_of.items():
        seeds = sorted({s for k in keys for s in table[(scale, variant, k)]})
        per = {}
        for seed in seeds:
            l0 = init.get((scale, seed))
            vals = [table[(scale, variant, k)].get(seed, "missing") for k in keys]
            if l0 is None or "missing" in vals or len(vals) < 2:
                per[seed] = None
                continue
            capped = [l0 if v is None else min(v, l0) for v in vals]
            per[seed] = statistics.fmean(capped) - min(capped)
        out[(scale, variant)] = per
    return out


def chosen_values(rows: list[dict], selected: dict, metric: str) -> dict:
    """(scale, variant) -> {seed: value or None} at the chosen tuned values."""
    table = cells(rows, metric)
    return {k: table.get((k[0], k[1], sel["key"]), {}) for k, sel in selected.items()}


def pooled_noise(rows: list[dict], metric: str = "val_bpb") -> Optional[tuple[float, int]]:
    """The sweep's per-run noise of ``metric``: :func:`stats.pooled_sd` over every cell with >= 2
    finite seeds, as (sd, degrees of freedom); None when no cell has two."""
    return stats.pooled_sd([list(_finite(v).values()) for v in cells(rows, metric).values()])


def _divergence_verdict(kind: str, a: dict, b: dict) -> Optional[tuple[str, str]]:
    """A verdict decided by divergence alone: one side has no finite seed, the other has all."""
    fa, fb = _finite(a), _finite(b)
    if not a or not b or (fa and fb):
        return None
    if not fa and not fb:
        return stats.INCONCLUSIVE, "both diverged or failed"
    if kind == "equal":
        return stats.DISAGREES, "one side diverged or failed, the other did not"
    if fa and len(fa) == len(a):
        return stats.AGREES, "the variant expected to be worse diverged or failed"
    if fb and len(fb) == len(b):
        return stats.DISAGREES, "the variant expected to be better diverged or failed"
    return stats.INCONCLUSIVE, "partly diverged"


def claim_record(e) -> dict:
    """The fields every judged claim carries, before its numbers: the expectation ``e`` as stated."""
    return {
        "text": e.text,
        "kind": e.kind,
        "a": e.a,
        "b": e.b,
        "metric": e.metric,
        "by": e.by,
        "relative": e.relative,
        "n": 0,
        "effect": None,
        "lo": None,
        "hi": None,
        "method": "none",
        "note": "",
    }


def judge(e, a: dict, b: dict, confidence: float, pooled) -> dict:
    """The verdict of expectation ``e`` (:class:`lmlab.lab.spec.Expectation`) from per-seed values of
    its two variants (``a`` = better / first, ``b`` = than / second; seed -> value or None)."""
    out = claim_record(e)
    decided = _divergence_verdict(e.kind, a, b)
    if decided:
        out["verdict"], out["note"] = decided
        return out
    fa, fb = _finite(a), _finite(b)
    # effect: better -> b - a (an improvement is positive); equal -> a - b
    d = (
        stats.difference(fa, fb, confidence, pooled)
        if e.kind == "better"
        else stats.difference(fb, fa, confidence, pooled)
    )
    scale = 1.0
    if e.relative and fb:
        scale = statistics.fmean(fb.values())
    out.update(
        n=d["n"],
        method=d["method"],
        effect=None if d["mean"] is None else d["mean"] / scale,
        lo=None if d["lo"] is None else d["lo"] / scale,
        hi=None if d["hi"] is None else d["hi"] / scale,
    )
    dropped = (len(a) - len(fa)) + (len(b) - len(fb))
    notes = []
    if d["method"] == "pooled":
        notes.append("one seed: interval from the sweep's pooled per-run noise (unpaired)")
    if d["method"] == "none":
        notes.append(
            "no interval: one seed and no cell with two seeds to estimate the noise"
            if d["n"]
            else "no seed shared by both variants"
        )
    if dropped:
        notes.append(f"{dropped} diverged/failed run(s) left out")
    out["verdict"] = stats.verdict(e.kind, out["lo"], out["hi"], e.by)
    if out["verdict"] == stats.INCONCLUSIVE and d.get("sd") is not None:
        need = stats.seeds_to_settle(e.kind, out["effect"], d["sd"] / scale, e.by, confidence)
        out["settle_seeds"] = need
        notes.append(f"about {need} paired seeds would settle it at the measured effect and noise" if need
                     else "no feasible number of seeds settles it at the measured effect (it sits on the "
                          "threshold): more steps or a larger model")
    out["note"] = "; ".join(notes)
    return out


def judge_timing(e, times: dict, confidence: float) -> dict:
    """The verdict of a step_time / decode_time expectation from the per-round times of the timing
    block (label -> seconds). better: effect = 1 - median(t_a / t_b) (the fraction of time saved);
    equal: effect = median(t_a / t_b) - 1. Thresholds are fractions (0.05 or '5%')."""
    from lmlab.lab.timing import summarize_ratio

    out = {**claim_record(e), "relative": True, "note": "median of per-round ratios, sign-test interval"}
    if e.a not in times or e.b not in times:
        out.update(
            verdict=stats.INCONCLUSIVE, effect=None, lo=None, hi=None, n=0, method="none", note="not timed"
        )
        return out
    r = summarize_ratio(times, e.b, e.a, confidence)  # t_a / t_b per round
    lo, hi = r["lo"], r["hi"]
    if e.kind == "better":
        eff, lo2, hi2 = 1 - r["median"], None if hi is None else 1 - hi, None if lo is None else 1 - lo
    else:
        eff, lo2, hi2 = r["median"] - 1, None if lo is None else lo - 1, None if hi is None else hi - 1
    out.update(effect=eff, lo=lo2, hi=hi2, n=r["n"], method="interleaved timing")
    out["verdict"] = stats.verdict(e.kind, lo2, hi2, e.by)
    return out


def contention(rows: list[dict]) -> list[dict]:
    """Runs whose training wall time exceeds tokens / their median tokens/s by more than 20%: their
    throughput was measured on a contended machine (or time went to evaluation and checkpoints)."""
    out = []
    for r in rows:
        if _ok(r.get("wall_s")) and _ok(r.get("tokens_per_s")) and r.get("tokens"):
            expected = r["tokens"] / r["tokens_per_s"]
            if expected > 0 and r["wall_s"] > CONTENTION_LIMIT * expected:
                out.append(
                    {
                        "run": r["run"],
                        "wall_s": r["wall_s"],
                        "expected_s": expected,
                        "ratio": r["wall_s"] / expected,
                    }
                )
    return out


def quantities(rows: list[dict], selected: dict) -> dict:
    """(scale, variant) -> {quantity: value} of the chosen runs (QUANTITIES; flops_per_token included)."""
    out: dict = {}
    for r in rows:
        k = (r.get("scale"), r["variant"])
        if k in selected and tune_key(r) == selected[k]["key"] and k not in out:
            out[k] = {q: r.get(q) for q in QUANTITIES}
            out[k]["solved"] = r.get("solved") or {}
    return out


def split_stages(rows: list[dict], spec: Optional[Spec]) -> tuple[list[dict], list[dict]]:
    """(rows that choose the tuned values, rows that are compared): with ``spec.tune_seeds`` the tune
    seeds' rows and the other seeds' rows; otherwise every row, twice."""
    chosen_by = set(spec.tune_seeds) if spec is not None and spec.tune_seeds else None
    if chosen_by is None:
        return rows, rows
    return [r for r in rows if r["seed"] in chosen_by], [r for r in rows if r["seed"] not in chosen_by]


def analyze(rows: list[dict], spec: Optional[Spec], timing: Optional[dict] = None) -> dict:
    """Everything the report states about the results (see the module docstring): "selected",
    "comparisons" (each variant - baseline in val_bpb, per scale), "claims" (one per expectation and
    scale, with "verdict"), "controls", "timing" (step-time ratios variant / baseline), "contention",
    "pooled" (sd, df) and "confidence"."""
    confidence = spec.confidence if spec else 0.95
    baseline = spec.baseline if spec else (rows[0]["variant"] if rows else "")
    tune_rows, eval_rows = split_stages(rows, spec)
    selected = select_tuned(tune_rows, spec)
    within = spec.tolerated_within if spec else 0.05
    sensitivity = lr_sensitivity(tune_rows)
    for k, sel in selected.items():
        sel["tolerated"] = tolerated(sel["grid"], within) if len(sel["grid"]) > 1 else []
        per = [v for v in sensitivity.get(k, {}).values() if v is not None]
        sel["lr_sensitivity"] = statistics.fmean(per) if per and len(sel["grid"]) > 1 else None
    pooled = pooled_noise(eval_rows)
    values = chosen_values(eval_rows, selected, "val_bpb")
    scales = list(dict.fromkeys(k[0] for k in selected))
    comparisons = []
    for (scale, variant), vals in values.items():
        if variant == baseline or (scale, baseline) not in values:
            continue
        base = values[(scale, baseline)]
        d = stats.difference(_finite(base), _finite(vals), confidence, pooled)
        comparisons.append(
            {
                "scale": scale,
                "variant": variant,
                "baseline": baseline,
                "mean": d["mean"],
                "lo": d["lo"],
                "hi": d["hi"],
                "n": d["n"],
                "method": d["method"],
                "variant_mean": statistics.fmean(_finite(vals).values()) if _finite(vals) else None,
                "baseline_mean": statistics.fmean(_finite(base).values()) if _finite(base) else None,
                "failed": sum(v is None for v in vals.values()),
            }
        )
    claims = []
    metric_values: dict = {"val_bpb": values}
    for e in (spec.expect if spec else []):
        for scale in scales:
            if e.metric in TIMING_METRICS:
                block = ((timing or {}).get("scales") or {}).get(scale or "")
                times = (block or {}).get(TIMING_METRICS[e.metric], {})
                c = judge_timing(e, times, confidence)
            else:
                if e.metric not in metric_values:
                    metric_values[e.metric] = (
                        sensitivity
                        if e.metric == "lr_sensitivity"
                        else chosen_values(eval_rows, selected, e.metric)
                    )
                mv = metric_values[e.metric]
                if e.metric == "val_bpb":
                    noise = pooled
                elif e.metric == "lr_sensitivity":  # one value per seed: no per-cell noise to pool
                    noise = None
                else:
                    noise = pooled_noise(eval_rows, e.metric)
                c = judge(e, mv.get((scale, e.a), {}), mv.get((scale, e.b), {}), confidence, noise)
            c["scale"] = scale
            claims.append(c)
    q = quantities(rows, selected)
    hold = spec.match.hold if spec and spec.match else None
    flags = control_flags(q, baseline, hold, spec.varies if spec else [])
    controls = [
        {"scale": s, "variant": v, **vals, "flags": [[n, r] for n, r in flags.get((s, v), [])]}
        for (s, v), vals in q.items()
    ]
    timing_rows = []
    for scale, block in ((timing or {}).get("scales") or {}).items():
        from lmlab.lab.timing import summarize_ratio

        for kind, times in ((k, block.get(k)) for k in ("step_s", "decode_s")):
            if not times or baseline not in times:
                continue
            for variant in times:
                r = summarize_ratio(times, baseline, variant, confidence)
                timing_rows.append(
                    {
                        "scale": scale or None,
                        "variant": variant,
                        "kind": kind,
                        "seconds": statistics.median(times[variant]),
                        **r,
                    }
                )
    return {
        "confidence": confidence,
        "baseline": baseline,
        "pooled": list(pooled) if pooled else None,
        "selected": [{"scale": s, "variant": v, **sel} for (s, v), sel in selected.items()],
        "comparisons": comparisons,
        "claims": claims,
        "controls": controls,
        "timing": timing_rows,
        "contention": contention(rows),
        "hold": hold,
        "tolerance": spec.match.tolerance if spec and spec.match else None,
        "tolerated_within": within,
        "tune_seeds": list(spec.tune_seeds) if spec else [],
    }
