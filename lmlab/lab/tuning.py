"""The learning-rate protocol: which tuned value each variant is judged at, and whether it was found.

A comparison of two variants at their best learning rates is only as good as the search for those rates.
The rules (the spec's ``tuning:`` block, :class:`lmlab.lab.spec.Tuning`):

- **Mean over seeds.** Each cell (scale, variant, tuned value) is scored by the mean held-out bits/byte
  of the seeds that chose it (``tune_seeds``, else every seed); a choice needs >= ``min_seeds`` seeds
  and >= ``min_points`` values (log-spaced: the grid's step is a ratio).
- **Never an unstable cell.** A cell with a diverged or failed seed, or whose seed standard deviation
  exceeds ``unstable_ratio`` x the sweep's median cell SD (a bimodal cell: at the edge of stability some
  seeds train and some stall), cannot be chosen: at a comfortable rate seeds agree within about 0.01
  bits/byte, and a choice made where they do not is a choice of noise.
- **Bracketed.** The chosen value must have a tried value on each side. When the best lies at an end
  of the grid the sweep adds the next value past it (the same log step), up to ``extend`` per side
  (:func:`extensions`); a variant still at an edge, chosen on too few seeds or values, or with no stable
  cell is **not bracketed**, and its claims get no verdict ("rate not bracketed").
- **The chosen value is the grid point** with the lowest mean. A parabola in log10(value) through it and
  its two neighbours gives a fitted optimum, reported (not used: between grid points nothing was run).
- **LR sensitivity around each variant's own optimum** (:func:`sensitivity`): Wortsman et al. 2023
  (eq. 1) average min(loss, loss_0) - loss* over a learning-rate range; over a fixed range a variant with
  a worse optimum looks less sensitive (its losses have less room below the untrained loss_0). Here the
  range is the ``window`` grid steps each side of the variant's own chosen value (the same width in
  log-rate for every variant), per seed: mean over those 2 x window values of min(loss, loss_0) minus
  the loss at the chosen value. A window that leaves the grid gives no figure.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Optional

from lmlab.lab.stats import finite
from lmlab.lab.verdicts import cells as _cells


def numeric_field(tune: dict) -> Optional[str]:
    """The tuned field when exactly one is tuned and all its values are numbers > 0, else None."""
    if len(tune) != 1:
        return None
    ((fld, values),) = tune.items()
    return fld if all(finite(v) and v > 0 for v in values) else None


def select(rows: list[dict], spec) -> dict:
    """(scale, variant) -> the choice of its tuned values (see the module docstring): {"tune", "key",
    "grid": [{"tune", "key", "mean", "sd", "n", "failed", "unstable"}], "edge": fields whose choice is
    an end of the values tried, "bracketed", "why" (why not bracketed, '' when it is), "seeds" (that
    chose it), "fit" (the fitted optimum, or None), "all_failed", "noise" (the median cell SD)}."""
    rules = spec.tuning if spec is not None else None
    table = _cells(rows)
    sds = []
    for vals in table.values():
        fin = [v for v in vals.values() if v is not None]
        if len(fin) >= 2 and len(fin) == len(vals):
            sds.append(statistics.stdev(fin))
    noise = statistics.median(sds) if sds else None
    by_var: dict = {}
    for (scale, variant, key), vals in table.items():
        by_var.setdefault((scale, variant), []).append((key, vals))
    out = {}
    for k, options in by_var.items():
        grid = []
        for key, vals in options:
            fin = [v for v in vals.values() if v is not None]
            failed = len(vals) - len(fin)
            sd = statistics.stdev(fin) if len(fin) >= 2 else None
            spread = rules is not None and noise and sd is not None and sd > rules.unstable_ratio * noise
            grid.append(
                {
                    "tune": json.loads(key),
                    "key": key,
                    "n": len(vals),
                    "failed": failed,
                    "sd": sd,
                    "mean": statistics.fmean(fin) if fin and not failed else math.inf,
                    "unstable": bool(failed or spread),
                }
            )
        grid.sort(key=lambda g: g["key"])
        stable = [g for g in grid if not g["unstable"]] or ([] if rules is not None else grid)
        best = (
            min(stable, key=lambda g: (g["mean"], g["key"]))
            if stable
            else min(grid, key=lambda g: (g["mean"], g["key"]))
        )
        edge = []
        for fld in best["tune"]:
            xs = sorted({g["tune"].get(fld) for g in grid if finite(g["tune"].get(fld))})
            if len(xs) >= 2 and best["tune"].get(fld) in (xs[0], xs[-1]):
                edge.append(fld)
        sel = {
            "tune": best["tune"],
            "key": best["key"],
            "grid": grid,
            "edge": edge if len(grid) > 1 else [],
            "all_failed": best["mean"] == math.inf,
            "seeds": best["n"],
            "noise": noise,
            "fit": _fit(grid, best),
        }
        sel["why"] = _why_not(sel, stable, rules, len(grid)) if rules is not None and len(grid) > 1 else ""
        if rules is not None and len(grid) <= 1 and spec is not None and spec.tune:
            sel["why"] = "one tuned value trained"
        sel["bracketed"] = not sel["why"]
        out[k] = sel
    return out


def _why_not(sel: dict, stable: list, rules, points: int) -> str:
    best = next(g for g in sel["grid"] if g["key"] == sel["key"])
    at = ", ".join(f"{k}={v:g}" if finite(v) else f"{k}={v}" for k, v in sel["tune"].items())
    if not stable or best["mean"] == math.inf:
        return "every tuned value diverged, failed or was unstable"
    if sel["edge"]:
        return f"best at {at}, an edge of the {points} values tried"
    if points < rules.min_points:
        return f"{points} tuned values tried, fewer than {rules.min_points}"
    if best["n"] < rules.min_seeds:
        return f"chosen on {best['n']} seed(s), fewer than {rules.min_seeds}"
    return ""


def _fit(grid: list[dict], best: dict) -> Optional[float]:
    """The vertex of the parabola in log10(value) through the best point and its two neighbours (one
    numeric tuned field, all three means finite and the parabola convex), else None."""
    if len(best["tune"]) != 1:
        return None
    ((fld, x0),) = best["tune"].items()
    pts = sorted((g["tune"][fld], g["mean"]) for g in grid if finite(g["tune"].get(fld)) and g["tune"][fld] > 0)
    xs = [x for x, _ in pts]
    if not finite(x0) or x0 not in xs:
        return None
    i = xs.index(x0)
    if i == 0 or i == len(xs) - 1:
        return None
    (xa, ya), (xb, yb), (xc, yc) = pts[i - 1], pts[i], pts[i + 1]
    if not all(map(math.isfinite, (ya, yb, yc))):
        return None
    u = [math.log10(x) for x in (xa, xb, xc)]
    denom = (u[0] - u[1]) * (u[0] - u[2]) * (u[1] - u[2])
    a = (u[2] * (yb - ya) + u[1] * (ya - yc) + u[0] * (yc - yb)) / denom
    b = (u[2] ** 2 * (ya - yb) + u[1] ** 2 * (yc - ya) + u[0] ** 2 * (yb - yc)) / denom
    if a <= 0:
        return None
    return 10 ** (-b / (2 * a))


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def extensions(rows: list[dict], spec) -> list[tuple]:
    """The tuned values the sweep should add now: (scale, variant, {field: value}) for each variant whose
    best stable cell is at an edge of the values it trained (or that has no stable cell: then below its
    lowest value), one log step (the ratio of the two outermost values on that side, rounded to 3
    significant figures) past it, while fewer than ``spec.tuning.extend`` values lie beyond the spec's
    grid on that side. Only for one numeric tuned field; [] otherwise."""
    fld = numeric_field(spec.tune) if spec is not None else None
    if fld is None or spec.tuning.extend < 1:
        return []
    lo0, hi0 = min(spec.tune[fld]), max(spec.tune[fld])
    out = []
    for (scale, variant), sel in select(rows, spec).items():
        xs = sorted({g["tune"][fld] for g in sel["grid"] if finite(g["tune"].get(fld))})
        if len(xs) < 2:
            continue
        if sel["all_failed"]:
            side = "low"
        elif sel["tune"].get(fld) == xs[0]:
            side = "low"
        elif sel["tune"].get(fld) == xs[-1]:
            side = "high"
        else:
            continue
        if side == "low":
            if sum(x < lo0 for x in xs) >= spec.tuning.extend:
                continue
            new = _round(xs[0] / (xs[1] / xs[0]))
        else:
            if sum(x > hi0 for x in xs) >= spec.tuning.extend:
                continue
            new = _round(xs[-1] * (xs[-1] / xs[-2]))
        if new not in xs and new > 0:
            out.append((scale, variant, {fld: new}))
    return out


def sensitivity(rows: list[dict], selected: dict, window: int, untrained: dict) -> dict:
    """(scale, variant) -> {"per_seed": {seed: LR sensitivity in bits/byte or None}, "why": '' or why
    there is none} around each variant's own chosen value (the module docstring); ``untrained``:
    (scale, seed) -> the untrained model's bits/byte (:func:`lmlab.lab.verdicts.untrained_bpb`)."""
    table = _cells(rows)
    out: dict = {}
    for (scale, variant), sel in selected.items():
        fld = numeric_field({k: [g["tune"].get(k) for g in sel["grid"]] for k in sel["tune"]})
        if fld is None:
            out[(scale, variant)] = {"per_seed": {}, "why": "needs one numeric tuned field"}
            continue
        xs = sorted({g["tune"][fld] for g in sel["grid"]})
        i = xs.index(sel["tune"][fld])
        if i - window < 0 or i + window >= len(xs):
            out[(scale, variant)] = {
                "per_seed": {},
                "why": f"the window of {window} value(s) each side of the "
                f"optimum {fld}={xs[i]:g} leaves the grid tried ({xs[0]:g}-{xs[-1]:g})",
            }
            continue
        key = {x: json.dumps({fld: x}, sort_keys=True) for x in xs}
        centre = table.get((scale, variant, key[xs[i]]), {})
        per = {}
        for seed, c in centre.items():
            l0 = untrained.get((scale, seed))
            around = [
                table.get((scale, variant, key[xs[j]]), {}).get(seed, "missing")
                for j in range(i - window, i + window + 1)
                if j != i
            ]
            if c is None or l0 is None or "missing" in around:
                per[seed] = None
                continue
            per[seed] = statistics.fmean(l0 if v is None else min(v, l0) for v in around) - min(c, l0)
        out[(scale, variant)] = {"per_seed": per, "why": ""}
    return out
