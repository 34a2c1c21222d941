"""The claims of a spec (its ``expect:`` list, see :mod:`lmlab.lab.spec`): each parsed into an
:class:`Expectation` that :mod:`lmlab.lab.verdicts` judges; thresholds absolute (in the metric's unit) or
relative (``"2%"``), a claim's preconditions (:mod:`lmlab.lab.preconditions`), its tokens-per-parameter
floor and the effect the literature reports. Every problem raises ConfigError naming the claim
(``FILE: expect[i].FIELD``), its value and what is valid."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from lmlab.config import ConfigError
from lmlab.lab.preconditions import parse_requires

# + val_bpb_{m}x; attn_sink: the first key's attention share at the last diagnostics (train.diag_interval)
METRICS = ("val_bpb", "final_train_loss", "step_time", "decode_time", "lr_sensitivity", "attn_sink")
TIMING_METRICS = {"step_time": "step_s", "decode_time": "decode_s"}


@dataclass
class Expectation:
    """One claim: ``better`` has a lower ``metric`` than ``than`` by at least ``by`` (absolute, or a
    fraction of ``than``'s value when ``relative``), or (``kind == 'equal'``) the two are within ``by``.
    ``requires``: the preconditions its mechanism needs (:mod:`lmlab.lab.preconditions`); ``floor``:
    tokens per non-embedding parameter below which it is not judged (None: the spec's ``judging``);
    ``published``: (lo, hi), the effect the literature reports, in the claim's unit."""

    kind: str  # "better" | "equal"
    a: str  # better (or the first of the pair)
    b: str  # than (or the second of the pair)
    by: float
    relative: bool
    metric: str = "val_bpb"
    text: str = ""
    requires: list = field(default_factory=list)  # lmlab.lab.preconditions.Requirement
    floor: Optional[float] = None
    published: Optional[tuple] = None


def _threshold(value: Any, where: str, negative: bool = False) -> tuple[float, bool]:
    """``0.01`` (absolute, in the metric's unit) or ``"1%"`` (relative) -> (value, relative); with
    ``negative`` a margin below 0 is allowed (a non-inferiority claim: ``by: -0.02``)."""
    if value is None:
        return 0.0, False
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            x = float(value.strip()[:-1]) / 100
        except ValueError:
            raise ConfigError(f"{where}={value!r} must be a number or a percentage such as '2%'") from None
        relative = True
    else:
        x, relative = value, False
        if isinstance(x, str):
            try:
                x = float(x)
            except ValueError:
                raise ConfigError(f"{where}={value!r} must be a number or a percentage such as '2%'") from None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or (x < 0 and not negative):
        raise ConfigError(f"{where}={value!r} must be a finite number >= 0 (or a percentage such as '2%')")
    return float(x), relative


def parse_expect(raw: Any, labels: list[str], baseline: str, contexts: list, source: str) -> list[Expectation]:
    """The ``expect:`` list (see the module docstring); every variant named must exist."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: expect must be a list of claims such as {{better: A, than: B, by: 0.01}}")
    metrics = set(METRICS) | {f"val_bpb_{m}x" for m in contexts if m != 1}
    out = []
    for i, e in enumerate(raw):
        where = f"{source}: expect[{i}]"
        if not isinstance(e, dict):
            raise ConfigError(f"{where}: expected a mapping such as {{better: A, than: B, by: 0.01}}, got {e!r}")
        unknown = set(e) - {
            "better",
            "than",
            "by",
            "equal",
            "within",
            "metric",
            "claim",
            "requires",
            "floor",
            "published",
        }
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {sorted(unknown)}; use better/than/by, or equal/within, "
                f"metric, claim, requires, floor, published"
            )
        metric = str(e.get("metric", "val_bpb"))
        if metric not in metrics:
            m = re.fullmatch(r"val_bpb_(.+)x", metric)
            if m:
                raise ConfigError(
                    f"{where}: metric={metric!r} needs the spec to score at {m.group(1)}x the "
                    f"training context: add eval_contexts: [1, {m.group(1)}]"
                )
            raise ConfigError(f"{where}: metric={metric!r} is not one of {', '.join(sorted(metrics))}")
        if ("better" in e) == ("equal" in e):
            raise ConfigError(
                f"{where}: give either 'better: A' (with 'than: B', default the baseline) or 'equal: [A, B]'"
            )
        if "better" in e:
            if "within" in e:
                raise ConfigError(f"{where}: 'within' goes with 'equal'; a 'better' claim takes 'by'")
            a, b = str(e["better"]), str(e.get("than", baseline))
            by, rel = _threshold(e.get("by"), f"{where}.by", negative=True)  # < 0: non-inferiority
            if rel and abs(by) >= 1:  # bits/byte, loss and time are positive: none can drop by 100%
                raise ConfigError(
                    f"{where}.by={e['by']!r}: an improvement of 100% or more is impossible; give a "
                    f"percentage below 100%"
                )
            kind = "better"
        else:
            pair = e["equal"]
            if not isinstance(pair, list) or len(pair) != 2:
                raise ConfigError(f"{where}: equal={pair!r} must name two variants, e.g. [RMSNorm, LayerNorm]")
            if "by" in e:
                raise ConfigError(f"{where}: 'by' goes with 'better'; an 'equal' claim takes 'within'")
            a, b = str(pair[0]), str(pair[1])
            by, rel = _threshold(e.get("within"), f"{where}.within")
            if by <= 0:
                raise ConfigError(
                    f"{where}: an 'equal' claim needs within > 0 (the largest difference that still counts as equal)"
                )
            kind = "equal"
        for name in (a, b):
            if name not in labels:
                near = difflib.get_close_matches(name, labels, n=1)
                raise ConfigError(
                    f"{where}: no variant {name!r}"
                    + (f"; did you mean {near[0]!r}?" if near else f"; variants: {', '.join(labels)}")
                )
        if a == b:
            raise ConfigError(f"{where}: compares {a!r} with itself")
        if metric in TIMING_METRICS:
            rel = True  # a time claim's threshold is a fraction of the time: 0.05 and "5%" mean the same
        unit = " bits/byte" if "bpb" in metric else " nats"
        amount = f"{100 * by:g}%" if rel else f"{by:g}{unit}"
        what = {"step_time": " in step time", "decode_time": " in decode step time"}.get(metric, "")
        text = str(
            e.get("claim")
            or (
                (
                    f"{a} better than {b}{what}" + (f" by >= {amount}" if by else "")
                    if by >= 0
                    else f"{a} no worse than {b}{what} by more than {amount.lstrip('-')}"
                )
                if kind == "better"
                else f"{a} equal to {b}{what} within {amount}"
            )
        )
        requires = parse_requires(e.get("requires"), labels, metrics, f"{where}.requires")
        floor = e.get("floor")
        if floor is not None and (
            isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor) or floor < 0
        ):
            raise ConfigError(f"{where}.floor={floor!r} must be a number of tokens per parameter >= 0")
        published = e.get("published")
        if published is not None:
            if not isinstance(published, list) or len(published) != 2:
                raise ConfigError(
                    f"{where}.published={published!r} must be [lo, hi], the effect the "
                    f"literature reports in the claim's unit (or percentages)"
                )
            pub = [_threshold(x, f"{where}.published", negative=True) for x in published]
            if pub[0][1] != rel and metric not in TIMING_METRICS or pub[0][0] > pub[1][0]:
                raise ConfigError(
                    f"{where}.published={published!r} must be [lo, hi] with lo <= hi, in the "
                    f"claim's unit ({'percent' if rel else 'absolute'})"
                )
            published = (pub[0][0], pub[1][0])
        out.append(
            Expectation(kind, a, b, by, rel, metric, text, requires, None if floor is None else float(floor), published)
        )
    return out
