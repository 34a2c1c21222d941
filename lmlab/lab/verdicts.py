"""From a sweep's results to its answers: tuned values chosen, differences with the baseline, the
verdict of every expectation, the controls and the timing ratios (used by ``lmlab report``).

:func:`analyze` takes the rows of ``results.jsonl``, the parsed spec and the timing block and returns
one JSON-serialisable mapping (written beside the report as ``verdicts.json``; ``lmlab report --index``
reads it). The statistics themselves are in :mod:`lmlab.lab.stats`.

Tuning: each variant's tuned value (the learning rate) is chosen by the protocol of
:mod:`lmlab.lab.tuning` (mean over >= 3 seeds on >= 5 log-spaced values, never an unstable cell, the
best bracketed by tried values on both sides). With ``tune_seeds`` (two-stage tuning) the choice is made
on the tune seeds' runs alone, and the comparisons, the pooled noise and every verdict use only the other
seeds, trained at the chosen value (LR sensitivity, which needs the grid, comes from the tune seeds);
without, the same seeds choose and are compared, which favours each variant by a best-of-grid choice.

Verdicts: a claim is judged (:func:`lmlab.lab.stats.verdict`) only when its design supports a verdict
(:func:`gate`, in this order): its preconditions hold (:mod:`lmlab.lab.preconditions`) and its runs
reach the spec's tokens per non-embedding parameter (else **not testable at this scale**, with the
measured value), both variants' rates are bracketed (else **rate not bracketed**), and it has the
spec's minimum of paired seeds (else **too few seeds**). The measured effect and its interval are shown
whatever the verdict. Every claim also carries the smallest effect its design detects at 80% power from
its measured paired noise (:func:`lmlab.lab.stats.detectable`), flagged when it exceeds the claim's
margin (underpowered), and an effect far outside the range the literature reports (``published``) is
flagged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from typing import Optional

from lmlab.lab import stats
from lmlab.lab.claims import TIMING_METRICS, Expectation
from lmlab.lab.plan import control_flags
from lmlab.lab.preconditions import device_of
from lmlab.lab.spec import QUANTITIES, Spec
from lmlab.lab.stats import finite as _ok

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
    """(scale, variant) -> the choice of its tuned values by the protocol of :mod:`lmlab.lab.tuning`
    (:func:`lmlab.lab.tuning.select`: "tune", "key", "edge", "grid", "bracketed", "why", "fit", ...)."""
    from lmlab.lab.tuning import select

    return select(rows, spec)


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
    return {(scale, seed): statistics.median(v) * per_byte[scale] / math.log(2) for (scale, seed), v in first.items()}


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


def judge(e, a: dict, b: dict, confidence: float, pooled, power: float = 0.8) -> dict:
    """The statistical verdict of expectation ``e`` (:class:`lmlab.lab.claims.Expectation`) from per-seed
    values of its two variants (``a`` = better / first, ``b`` = than / second; seed -> value or None),
    with the smallest effect the design detects at ``power`` ("detectable") and, when inconclusive, the
    direction it leans and the paired seeds that would decide it ("settle": [n, lean]). :func:`gate`
    then decides whether the design supports this verdict."""
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
    sd = d.get("sd") / scale if d.get("sd") is not None and d["method"] == "paired t" else None
    out["detectable"] = stats.detectable(sd, d["n"], confidence, power)
    margin = (
        abs(e.by)
        if (e.kind == "equal" or e.by < 0)
        else (e.published[0] - e.by if e.published and e.published[0] > e.by else None)
    )
    out["margin"] = margin
    if out["detectable"] is not None and margin is not None and out["detectable"] > margin:
        notes.append(
            f"underpowered: detects {out['detectable']:.4g} at {100 * power:g}% power, above the margin {margin:.4g}"
        )
    if e.published and out["effect"] is not None:
        lo_p, hi_p = e.published
        far = (
            abs(out["effect"]) > 2 * max(abs(lo_p), abs(hi_p))
            or (out["hi"] is not None and lo_p > 0 and out["hi"] < 0)
            or (out["lo"] is not None and hi_p < 0 and out["lo"] > 0)
        )
        out["published"] = [lo_p, hi_p]
        if far:
            notes.append(f"far outside the published range [{lo_p:g}, {hi_p:g}]: check the mechanism before citing it")
    if out["verdict"] == stats.INCONCLUSIVE and sd is not None:
        need = stats.seeds_to_settle(e.kind, out["effect"], sd, e.by, confidence, power=power, n=d["n"])
        out["settle"] = list(need) if need else None
        notes.append(
            f"leans {need[1]}: about {need[0]} paired seeds would decide it ({100 * power:g}% power "
            f"at the measured effect and noise)"
            if need
            else "leans nowhere: the interval is centred on its boundary (more seeds will not settle "
            "a null; more steps or a larger model might)"
        )
    out["note"] = "; ".join(notes)
    return out


def judge_timing(e, times: dict, confidence: float) -> dict:
    """The verdict of a step_time / decode_time expectation from the per-round times of the timing
    block (label -> seconds). better: effect = 1 - median(t_a / t_b) (the fraction of time saved);
    equal: effect = median(t_a / t_b) - 1. Thresholds are fractions (0.05 or '5%')."""
    from lmlab.lab.timing import summarize_ratio

    out = {**claim_record(e), "relative": True, "note": "median of per-round ratios, sign-test interval"}
    if e.a not in times or e.b not in times:
        out.update(verdict=stats.INCONCLUSIVE, effect=None, lo=None, hi=None, n=0, method="none", note="not timed")
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


def short_machine(machine: str) -> str:
    """The processor of a machine line (:func:`lmlab.bench.describe_machine`), e.g. 'Intel Xeon Processor
    (family 6, model 167)' or 'NVIDIA H200': what a speed verdict was measured on."""
    m = re.match(r"^(.*?\(family \d+, model \d+\))", machine)
    return (m[1] if m else machine.split(",")[0]).replace("(R)", "").replace("(TM)", "").strip()


def kv_bound_check(e, block: dict) -> Optional[dict]:
    """The mechanism of a decode_time claim that ``e.a`` decodes faster than ``e.b`` by more than ``e.by``
    (a smaller KV cache, so fewer bytes read per step): ``e.b``'s step must spend more than ``e.by`` of its
    time on what grows with the cache (:func:`lmlab.lab.timing.kv_share`), since a smaller cache can save
    at most that. A precondition record ({text, holds, value, why}) or None where the block has no
    short-cache timing (timing blocks written before 2026-12-04) or the claim is not a ``better`` one."""
    from lmlab.lab.timing import kv_share

    share = kv_share(block, e.b)
    if share is None or e.kind != "better":
        return None
    n = len(next(iter(block.get("decode_short_s", {}).values()), []))
    return {
        "text": f"{e.b}'s decode step is bound by its KV cache (more than {e.by:.0%} of a step grows with the cache)",
        "holds": share > e.by,
        "value": f"{share:.1%} of a step grows with the cache (median of {n} rounds: full cache vs a cache of "
        f"at most {block.get('decode_short_steps') or 64} tokens)",
        "why": "a smaller cache can only save the time spent reading the cache",
    }


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


def claim_tokens_per_param(rows: list[dict], selected: dict, scale, variants) -> Optional[float]:
    """The fewest training tokens per non-embedding parameter among ``variants``' runs at their chosen
    tuned values at ``scale`` (Kaplan et al. 2020's N: non-embedding parameters); None without a count."""
    best = None
    for r in rows:
        sel = selected.get((r.get("scale"), r["variant"]))
        if r.get("scale") != scale or r["variant"] not in variants or sel is None or tune_key(r) != sel["key"]:
            continue
        if _ok(r.get("tokens")) and _ok(r.get("non_embedding_params")) and r["non_embedding_params"] > 0:
            tpp = r["tokens"] / r["non_embedding_params"]
            best = tpp if best is None else min(best, tpp)
    return best


def gate(c: dict, e, scale, spec: Optional[Spec], ctx: dict) -> dict:
    """Decide whether claim ``c`` (from :func:`judge` or :func:`judge_timing`) keeps its statistical
    verdict (module docstring): sets "tokens_per_param", "preconditions" ([{text, holds, value, why}]),
    "measured" (the verdict the interval alone gives) and, when the design does not support a verdict,
    "verdict" (not testable / rate not bracketed / too few seeds) with the reason in "gate". Without a
    spec nothing is gated."""
    from lmlab.lab.preconditions import check

    c["measured"] = c["verdict"]
    c["gate"] = ""
    timed = e.metric in TIMING_METRICS
    c["tokens_per_param"] = None if timed else claim_tokens_per_param(ctx["rows"], ctx["selected"], scale, (e.a, e.b))
    if spec is None:
        c["preconditions"] = []
        return c
    checks = [check(req, {**ctx, "scale": scale}) for req in e.requires]
    if c.get("mechanism"):  # decode_time: is the step bound by reading the cache at all?
        checks.append(c.pop("mechanism"))
    c["preconditions"] = checks
    reasons: list[tuple[str, str]] = []
    failed = [x for x in checks if not x["holds"]]
    static = [x for x, req in zip(checks, e.requires) if req.kind == "device" and not x["holds"]]
    for x in static:
        reasons.append((stats.NOT_TESTABLE, f"needs {x['text']}; {x['value']}"))
    floor = e.floor if e.floor is not None else spec.judging.tokens_per_param
    if not timed and floor > 0:
        tpp = c["tokens_per_param"]
        if tpp is None or tpp < floor:
            reasons.append(
                (
                    stats.NOT_TESTABLE,
                    (f"{tpp:.2g}" if tpp is not None else "unknown")
                    + f" tokens per non-embedding parameter, below the floor of {floor:g}",
                )
            )
    if not timed and spec.tune:
        for v in (e.a, e.b):
            sel = ctx["selected"].get((scale, v))
            if sel is not None and not sel.get("bracketed", True):
                reasons.append((stats.NOT_BRACKETED, f"{v}: {sel['why']}"))
        if e.metric == "lr_sensitivity":
            for v in (e.a, e.b):
                why = (ctx["sensitivity"].get((scale, v)) or {}).get("why")
                if why:
                    reasons.append((stats.NOT_BRACKETED, f"{v}: {why}"))
    for x in failed:
        if x not in static:
            reasons.append((stats.NOT_TESTABLE, f"precondition failed: {x['text']}: {x['value']}"))
    if not timed and c.get("n", 0) < spec.judging.min_seeds and not reasons:
        reasons.append(
            (
                stats.TOO_FEW_SEEDS,
                f"{c.get('n', 0)} paired seed(s), fewer than the {spec.judging.min_seeds} a verdict needs",
            )
        )
    if reasons:
        c["verdict"] = reasons[0][0]
        c["gate"] = "; ".join(r for _, r in reasons)
        c.pop("settle", None)
    return c


def analyze(
    rows: list[dict], spec: Optional[Spec], timing: Optional[dict] = None, timed_claims: Optional[list] = None
) -> dict:
    """Everything the report states about the results (see the module docstring): "selected",
    "comparisons" (each variant - baseline in val_bpb, per scale), "claims" (one per expectation and
    scale, with "verdict"), "controls", "timing" (step-time ratios variant / baseline), "contention",
    "pooled" (sd, df) and "confidence". ``timed_claims``: step/decode-time claims judged earlier (a
    report folder's ``verdicts.json``), used with their numbers where ``timing`` lacks the per-round
    times (a folder written before reports kept ``timing.json``); they are gated like any claim."""
    confidence = spec.confidence if spec else 0.95
    baseline = spec.baseline if spec else (rows[0]["variant"] if rows else "")
    tune_rows, eval_rows = split_stages(rows, spec)
    selected = select_tuned(tune_rows, spec)
    within = spec.tolerated_within if spec else 0.05
    from lmlab.lab.tuning import sensitivity as around_optimum

    window = spec.tuning.window if spec else 2
    sens_full = around_optimum(tune_rows, selected, window, untrained_bpb(tune_rows))
    sensitivity = {k: v["per_seed"] for k, v in sens_full.items()}
    for k, sel in selected.items():
        sel["tolerated"] = tolerated(sel["grid"], within) if len(sel["grid"]) > 1 else []
        per = [v for v in sensitivity.get(k, {}).values() if v is not None]
        sel["lr_sensitivity"] = statistics.fmean(per) if per and len(sel["grid"]) > 1 else None
        sel["lr_sensitivity_why"] = (sens_full.get(k) or {}).get("why", "")
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
    power = spec.judging.power if spec else 0.8
    timing_machine = (timing or {}).get("machine")
    ctx = {
        "rows": eval_rows,
        "tune_rows": tune_rows,
        "selected": selected,
        "confidence": confidence,
        "sensitivity": sens_full,
        "timing_device": device_of(timing_machine, timing.get("device")) if timing else None,
    }

    def judge_sub(req, scale):

        sub = Expectation("better", req.a, req.b, req.bound, False, req.metric)
        mv = chosen_values(eval_rows, selected, req.metric)
        noise = pooled_noise(eval_rows, req.metric)
        return judge(sub, mv.get((scale, req.a), {}), mv.get((scale, req.b), {}), confidence, noise, power)

    for e in spec.expect if spec else []:
        for scale in scales:
            if e.metric in TIMING_METRICS:
                block = ((timing or {}).get("scales") or {}).get(scale or "")
                times = (block or {}).get(TIMING_METRICS[e.metric], {})
                c = judge_timing(e, times, confidence)
                if times and timing_machine:  # a speed verdict holds for the machine it was timed on
                    c["method"] = f"interleaved timing on {short_machine(timing_machine)}"
                if e.metric == "decode_time" and block:
                    c["mechanism"] = kv_bound_check(e, block)
                old = next(
                    (
                        x
                        for x in timed_claims or []
                        if x.get("text") == e.text and x.get("scale") == scale and x.get("metric") == e.metric
                    ),
                    None,
                )
                if not times and old is not None:
                    c.update({k: old.get(k) for k in ("effect", "lo", "hi", "n", "method", "verdict")})
                    c["note"] = (
                        f"{old.get('note') or ''}; numbers from the earlier verdicts.json (this folder "
                        f"has no timing.json with the rounds)"
                    ).lstrip("; ")
            else:
                if e.metric not in metric_values:
                    metric_values[e.metric] = (
                        sensitivity if e.metric == "lr_sensitivity" else chosen_values(eval_rows, selected, e.metric)
                    )
                mv = metric_values[e.metric]
                if e.metric == "val_bpb":
                    noise = pooled
                elif e.metric == "lr_sensitivity":  # one value per seed: no per-cell noise to pool
                    noise = None
                else:
                    noise = pooled_noise(eval_rows, e.metric)
                c = judge(e, mv.get((scale, e.a), {}), mv.get((scale, e.b), {}), confidence, noise, power)
            c["scale"] = scale
            ctx["judge_sub"] = lambda req, _s=scale: judge_sub(req, _s)
            claims.append(gate(c, e, scale, spec, ctx))
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
        "tuning": dataclasses.asdict(spec.tuning) if spec else None,
        "judging": dataclasses.asdict(spec.judging) if spec else None,
    }
