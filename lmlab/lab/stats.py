"""The lab's statistics: paired differences, intervals, pooled noise and the verdict of a claim.

Runs of two variants trained with the same seed see the same batches in the same order, so the
comparison of variant B with A uses the per-seed differences d_s = B_s - A_s (a paired design: the
batch-order noise common to both cancels). With n >= 2 paired seeds the interval is Student's t:
mean(d) +- t_{n-1, (1+c)/2} * sd(d) / sqrt(n). With one seed no spread of d is observable; the
interval then uses the sweep's pooled per-run noise (the within-cell standard deviation of every cell
trained with >= 2 seeds, pooled over cells with their degrees of freedom) as an unpaired difference,
d +- t_{df} * sigma * sqrt(2), and says so. Speed ratios from the timing block (per-round ratios of
interleaved measurements) get a distribution-free interval for their median from binomial order
statistics. Distributions come from scipy.stats.

Verdicts (Schuirmann's two one-sided tests logic for equivalence; the interval against the smallest
effect that counts for superiority):

- ``better`` by delta (effect = value(than) - value(better), positive when the claim holds): agrees
  when the whole interval lies above delta, disagrees when it lies below delta, inconclusive when it
  contains delta; a negative delta is a non-inferiority margin ("at most |delta| worse");
- ``equal`` within eps (effect = value(a) - value(b)): agrees when the interval lies inside (-eps, eps),
  disagrees when it lies wholly outside [-eps, eps], inconclusive otherwise.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

AGREES, DISAGREES, INCONCLUSIVE = "agrees", "disagrees", "inconclusive"
# no verdict: the claim's design cannot support one (lmlab.lab.verdicts says which and why)
NOT_BRACKETED, NOT_TESTABLE, TOO_FEW_SEEDS = "rate not bracketed", "not testable at this scale", "too few seeds"
VERDICTS = (AGREES, DISAGREES, INCONCLUSIVE, NOT_BRACKETED, NOT_TESTABLE, TOO_FEW_SEEDS)


def finite(x) -> bool:
    """A real, finite number (not a bool, None, NaN or inf): a value the statistics may use."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (scipy.stats.t.ppf)."""
    from scipy import stats

    return float(stats.t.ppf(p, df))


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean and two-sided Student-t interval of ``values`` (n >= 2): {mean, lo, hi, sd, n, df, half}.
    Raises ValueError for fewer than two values."""
    n = len(values)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {n}")
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "sd": sd, "n": n, "df": n - 1, "half": half}


def pooled_sd(groups: Sequence[Sequence[float]]) -> Optional[tuple[float, int]]:
    """Pooled within-group standard deviation and its degrees of freedom, over the groups with >= 2
    values: sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)). None when no group has two values."""
    num, df = 0.0, 0
    for g in groups:
        if len(g) >= 2:
            num += (len(g) - 1) * statistics.variance(g)
            df += len(g) - 1
    return (math.sqrt(num / df), df) if df else None


def paired(a: dict, b: dict) -> list[tuple[int, float]]:
    """Per-seed differences b - a over the seeds both have (``a``/``b``: seed -> value), by seed."""
    return [(s, b[s] - a[s]) for s in sorted(set(a) & set(b))]


def difference(a: dict, b: dict, confidence: float = 0.95, pooled: Optional[tuple[float, int]] = None) -> dict:
    """The difference b - a (``a``/``b``: seed -> value of one metric) with its interval.

    Returns {mean, lo, hi, n, method, diffs}: ``method`` is ``paired t`` (>= 2 shared seeds),
    ``pooled`` (one shared seed: unpaired interval from the sweep's pooled per-run noise ``pooled`` =
    (sd, df)), or ``none`` (no shared seed, or one without a noise estimate: lo = hi = None)."""
    diffs = paired(a, b)
    values = [d for _, d in diffs]
    out = {
        "n": len(values),
        "diffs": diffs,
        "mean": statistics.fmean(values) if values else None,
        "lo": None,
        "hi": None,
    }
    if len(values) >= 2:
        ti = t_interval(values, confidence)
        out.update(lo=ti["lo"], hi=ti["hi"], sd=ti["sd"], method="paired t")
    elif len(values) == 1 and pooled is not None:
        sd, df = pooled
        half = t_quantile((1 + confidence) / 2, df) * sd * math.sqrt(2)
        out.update(lo=values[0] - half, hi=values[0] + half, sd=sd * math.sqrt(2), method="pooled")
    else:
        out["method"] = "none"
    return out


def verdict(kind: str, lo: Optional[float], hi: Optional[float], threshold: float) -> str:
    """``agrees`` / ``disagrees`` / ``inconclusive`` for an interval [lo, hi] of the effect.

    ``kind`` ``better``: the effect is the improvement (positive = as claimed) and ``threshold`` the
    smallest that counts; ``equal``: the effect is the signed difference and ``threshold`` the margin of
    equivalence (> 0). No interval (lo or hi None) is inconclusive. Raises ValueError for another kind."""
    if lo is None or hi is None:
        return INCONCLUSIVE
    if kind == "better":
        if lo > threshold:
            return AGREES
        if hi < threshold:
            return DISAGREES
        return INCONCLUSIVE
    if kind == "equal":
        if -threshold < lo and hi < threshold:
            return AGREES
        if lo > threshold or hi < -threshold:
            return DISAGREES
        return INCONCLUSIVE
    raise ValueError(f"unknown claim kind {kind!r}; use 'better' or 'equal'")


def seeds_to_settle(
    kind: str,
    mean: Optional[float],
    sd: Optional[float],
    threshold: float,
    confidence: float = 0.95,
    n_max: int = 1000,
    power: float = 0.8,
    n: Optional[int] = None,
) -> Optional[tuple[int, str]]:
    """Where an *inconclusive* claim leans and how many paired seeds would decide it, if the effect and
    the per-seed noise were what was measured: (n, ``agrees`` or ``disagrees``), n the smallest number
    of paired seeds whose interval would clear the nearest boundary of the undecided region with
    probability ``power`` (the usual sample-size rule, (t_{(1+c)/2, n-1} + t_{power, n-1}) * sd / sqrt(n)
    <= the distance from ``mean`` to that boundary; ``better``: the threshold; ``equal``: the margin
    nearest |mean|). ``n`` (the seeds measured) gives the direction only when the boundary lies outside
    the measured effect's central 50% interval (|distance| > t_{0.75, n-1} * sd / sqrt(n)): an interval
    centred on its boundary (a null effect against 0) leans nowhere, and None is returned. None also
    without an estimate or beyond ``n_max`` seeds. A planning figure, not a promise."""
    if mean is None or sd is None or not finite(mean) or not finite(sd) or sd <= 0:
        return None
    if kind == "better":
        gap, lean = mean - threshold, ("agrees" if mean > threshold else "disagrees")
    else:
        gap, lean = threshold - abs(mean), ("agrees" if abs(mean) < threshold else "disagrees")
    gap = abs(gap)
    if gap <= 0:
        return None
    if n is not None and n >= 2 and gap <= t_quantile(0.75, n - 1) * sd / math.sqrt(n):
        return None
    q = (1 + confidence) / 2
    for k in range(2, n_max + 1):
        if (t_quantile(q, k - 1) + t_quantile(power, k - 1)) * sd / math.sqrt(k) <= gap:
            return k, lean
    return None


def detectable(sd: Optional[float], n: int, confidence: float = 0.95, power: float = 0.8) -> Optional[float]:
    """The smallest true effect a paired design of ``n`` seeds with per-seed noise ``sd`` detects with
    probability ``power`` at two-sided ``confidence``: (t_{(1+c)/2, n-1} + t_{power, n-1}) * sd / sqrt(n)
    (the usual normal-approximation rule with t quantiles). None without an estimate (n < 2)."""
    if sd is None or not finite(sd) or n < 2:
        return None
    return (t_quantile((1 + confidence) / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def median_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Median of ``values`` with a distribution-free interval: the order statistics x_(k), x_(n-k+1)
    with k the largest index such that P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (the sign-test
    interval; its coverage is at least ``confidence``). {median, lo, hi, n, coverage}; lo/hi are None
    when n is too small for the level (n < 6 at 95%)."""
    from scipy import stats

    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval of no values")
    alpha = (1 - confidence) / 2
    k = 0
    while k + 1 <= n // 2 and stats.binom.cdf(k, n, 0.5) <= alpha:  # P(X <= k) = P(X < k + 1)
        k += 1
    out = {"median": statistics.median(xs), "n": n, "lo": None, "hi": None, "coverage": None}
    if k >= 1:
        out.update(lo=xs[k - 1], hi=xs[n - k], coverage=1 - 2 * float(stats.binom.cdf(k - 1, n, 0.5)))
    return out
