"""Preconditions: the mechanism a claim is about, measured on the claim's own runs before it is judged.

A claim about weight decay's benefit from the learning rate's decay cannot be tested where the decay
phase itself does not help; "a sliding window costs little" cannot be tested where the full-attention
model uses no context beyond the window; a claim about z-loss cannot be tested where log Z never grows;
a claim about GPU memory traffic cannot be tested by timing a CPU. A claim lists such conditions under
``requires:``; when one fails the verdict is **not testable at this scale**, with the measured value.

Each requirement is a mapping, one of:

- ``{better: A, than: B, by: x, metric: m}``: a claim of its own (default metric val_bpb, by 0), judged
  on the same paired seeds as the claim (:func:`lmlab.lab.verdicts.judge`); it holds when it *agrees*,
  i.e. the whole interval of the effect clears ``by``. E.g. the annealing phase helps the baseline:
  ``{better: "wd 0, WSD", than: "wd 0, constant", by: 0.005}``.
- ``{value: FIELD, of: A, above: x}`` (or ``below: x``), optional ``over: chosen | grid``: a per-run
  column of the results (``log_z_max``, ``max_attn_logit``, ``final_train_loss``, ...) for variant A,
  per seed at its chosen tuned value (``chosen``) or the largest over every tuned value it trained
  (``grid``); holds when the Student-t interval of the per-seed values lies wholly above (below) x, or,
  with one seed, when that value does. Where x > 0 and every seed's value is > 0 the interval is taken
  on the log scale (of the geometric mean): such quantities (the largest attention logit: 564, 632 and
  1,552 over three seeds of one spec) spread by factors, and the arithmetic interval of three such
  values reached below zero ([-455, 2,287]) though each seed passed x = 20 by 28x; the page names the
  geometric mean. Otherwise (a value <= 0, or x <= 0) the arithmetic interval, as before 2026-12-06.
- ``{context_gain: A, past: W, by: x}``: variant A still uses context past W tokens: per seed, its
  held-out loss (nats/token) averaged over positions W+1..2W minus the average over the second half of
  the context (``loss_by_position: true`` records it); holds when the interval lies wholly above x.
- ``{device: cuda}`` (or ``cpu``): the runs (and the timing block) ran on that kind of device, for a
  claim about a kernel or memory traffic only that device has.

Any requirement may carry ``why: "..."``, the mechanism in words (printed with the verdict).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from lmlab.config import ConfigError

KINDS = ("better", "value", "context_gain", "device")
DEVICES = ("cpu", "cuda")


@dataclass
class Requirement:
    """One precondition (see the module docstring): ``kind`` and its settings."""

    kind: str
    a: str = ""  # the variant measured
    b: str = ""  # better: the variant compared with
    metric: str = "val_bpb"
    bound: float = 0.0  # by / above / below / the context-gain margin
    above: bool = True  # value: above (True) or below (False) the bound
    over: str = "chosen"  # value: at the chosen tuned value or the largest over the grid
    past: int = 0  # context_gain: W
    device: str = ""
    why: str = ""
    spec: dict = field(default_factory=dict)  # as written, for the page

    @property
    def text(self) -> str:
        if self.kind == "better":
            return f"{self.a} better than {self.b} by > {self.bound:g} ({self.metric})"
        if self.kind == "value":
            return (
                f"{self.metric} of {self.a}{' (max over the grid)' if self.over == 'grid' else ''} "
                f"{'>' if self.above else '<'} {self.bound:g}"
            )
        if self.kind == "context_gain":
            return (
                f"{self.a}'s loss at positions {self.past + 1}-{2 * self.past} exceeds its loss over the "
                f"second half of the context by > {self.bound:g} nats/token"
            )
        return f"measured on {self.device}"


def _variant(name: Any, labels: list, where: str) -> str:
    if str(name) not in labels:
        import difflib

        near = difflib.get_close_matches(str(name), labels, n=1)
        raise ConfigError(
            f"{where}: no variant {name!r}"
            + (f"; did you mean {near[0]!r}?" if near else f"; variants: {', '.join(labels)}")
        )
    return str(name)


def _number(value: Any, where: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}={value!r} must be a finite number")
    return float(value)


def parse_requires(raw: Any, labels: list, metrics: set, where: str) -> list[Requirement]:
    """The ``requires:`` list of one claim (see the module docstring); raises ConfigError naming the
    entry, the key and what is valid."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise ConfigError(f"{where} must be a list of preconditions, e.g. [{{device: cuda}}]")
    out = []
    for i, r in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(r, dict):
            raise ConfigError(f"{w}: expected a mapping such as {{device: cuda}}, got {r!r}")
        kinds = [k for k in KINDS if k in r]
        if len(kinds) != 1:
            raise ConfigError(f"{w}: give exactly one of {', '.join(KINDS)} (got {sorted(r)})")
        kind, why = kinds[0], str(r.get("why") or "")
        allowed = {
            "better": {"better", "than", "by", "metric"},
            "value": {"value", "of", "above", "below", "over"},
            "context_gain": {"context_gain", "past", "by"},
            "device": {"device"},
        }[kind] | {"why"}
        unknown = sorted(set(r) - allowed)
        if unknown:
            raise ConfigError(
                f"{w}: unknown key(s) {unknown} for a {kind!r} precondition; valid: {', '.join(sorted(allowed))}"
            )
        if kind == "better":
            if "than" not in r:
                raise ConfigError(f"{w}: a 'better' precondition needs 'than: VARIANT'")
            metric = str(r.get("metric", "val_bpb"))
            if metric not in metrics:
                raise ConfigError(f"{w}.metric={metric!r} is not one of {', '.join(sorted(metrics))}")
            a, b = _variant(r["better"], labels, f"{w}.better"), _variant(r["than"], labels, f"{w}.than")
            if a == b:
                raise ConfigError(f"{w}: compares {a!r} with itself")
            out.append(Requirement("better", a, b, metric, _number(r.get("by", 0), f"{w}.by"), why=why, spec=r))
        elif kind == "value":
            if ("above" in r) == ("below" in r):
                raise ConfigError(f"{w}: a 'value' precondition needs exactly one of 'above: X' or 'below: X'")
            over = str(r.get("over", "chosen"))
            if over not in ("chosen", "grid"):
                raise ConfigError(f"{w}.over={over!r} must be 'chosen' or 'grid'")
            if "of" not in r:
                raise ConfigError(f"{w}: a 'value' precondition needs 'of: VARIANT'")
            col = r["value"]
            if not isinstance(col, str) or not re.fullmatch(r"[A-Za-z0-9_]+", col):
                raise ConfigError(f"{w}.value={col!r} must name a results column, e.g. log_z_max")
            side = "above" if "above" in r else "below"
            out.append(
                Requirement(
                    "value",
                    _variant(r["of"], labels, f"{w}.of"),
                    metric=col,
                    bound=_number(r[side], f"{w}.{side}"),
                    above=side == "above",
                    over=over,
                    why=why,
                    spec=r,
                )
            )
        elif kind == "context_gain":
            past = r.get("past")
            if isinstance(past, bool) or not isinstance(past, int) or past < 1:
                raise ConfigError(f"{w}.past={past!r} must be a number of tokens >= 1")
            out.append(
                Requirement(
                    "context_gain",
                    _variant(r["context_gain"], labels, f"{w}.context_gain"),
                    bound=_number(r.get("by", 0), f"{w}.by"),
                    past=past,
                    why=why,
                    spec=r,
                )
            )
        else:
            if r["device"] not in DEVICES:
                raise ConfigError(f"{w}.device={r['device']!r} must be one of {', '.join(DEVICES)}")
            out.append(Requirement("device", device=r["device"], why=why, spec=r))
    return out


# --- measured -------------------------------------------------------------------------------------
def device_of(machine: Optional[str], recorded: Optional[str] = None) -> str:
    """``cuda`` or ``cpu``: the device a row (or the timing block) was measured on; ``recorded`` is the
    row's ``device`` column when it has one, else the machine line (:func:`lmlab.bench.describe_machine`
    names a GPU only for CUDA runs)."""
    if recorded:
        return "cuda" if str(recorded).startswith("cuda") else "cpu"
    return (
        "cuda"
        if re.search(r"NVIDIA|Tesla|GeForce|\bH100\b|\bH200\b|\bA100\b|Radeon|Instinct", str(machine or ""))
        else "cpu"
    )


def interval_above(values: list[float], bound: float, confidence: float) -> tuple[bool, dict]:
    """Whether ``values`` (per seed) lie above ``bound``: the Student-t interval's lower end (one value:
    the value) > bound. Returns (holds, {mean, lo, hi, n})."""
    from lmlab.lab.stats import t_interval

    if not values:
        return False, {"mean": None, "lo": None, "hi": None, "n": 0}
    if len(values) == 1:
        return values[0] > bound, {"mean": values[0], "lo": None, "hi": None, "n": 1}
    ti = t_interval(values, confidence)
    return ti["lo"] > bound, {"mean": ti["mean"], "lo": ti["lo"], "hi": ti["hi"], "n": ti["n"]}


def context_gain(by_position: list[float], past: int) -> Optional[float]:
    """Mean loss over positions past+1..2*past minus the mean over the second half of the context
    (``by_position``: nats/token at each position 1..T); None when 2*past > T/2 (the two ranges meet)."""
    T = len(by_position)
    if 2 * past > T // 2:
        return None
    return statistics.fmean(by_position[past : 2 * past]) - statistics.fmean(by_position[T // 2 :])


def check(req: Requirement, ctx: dict) -> dict:
    """Evaluate ``req`` against a sweep's analysis context ``ctx`` (built by
    :func:`lmlab.lab.verdicts.analyze`: ``rows`` compared, ``tune_rows``, ``selected``, ``judge_sub``
    (a callable judging a sub-claim), ``confidence``, ``scale``, ``timing_device``). Returns {"text",
    "holds" (True / False), "value" (the measured figure, as text), "why"}."""
    from lmlab.lab.verdicts import tune_key

    out = {"text": req.text, "why": req.why, "holds": False, "value": "not measured"}
    conf, scale, sel = ctx["confidence"], ctx["scale"], ctx["selected"]
    if req.kind == "device":
        devices = {device_of(r.get("machine"), r.get("device")) for r in ctx["rows"] if r.get("scale") == scale}
        if ctx.get("timing_device"):
            devices.add(ctx["timing_device"])
        out["holds"] = devices == {req.device}
        out["value"] = "measured on " + (", ".join(sorted(devices)) or "no recorded device")
        return out
    if req.kind == "better":
        c = ctx["judge_sub"](req)
        out["holds"] = c["verdict"] == "agrees"
        eff = c.get("effect")
        out["value"] = (
            "no measurement"
            if eff is None
            else f"{eff:+.4f}"
            + (f" [{c['lo']:+.4f}, {c['hi']:+.4f}]" if c.get("lo") is not None else "")
            + f", {c['verdict']}"
        )
        return out
    chosen = sel.get((scale, req.a))
    if chosen is None:
        return out
    if req.kind == "value":
        rows = ctx["tune_rows"] if req.over == "grid" else ctx["rows"]
        per: dict = {}
        for r in rows:
            if r.get("scale") != scale or r["variant"] != req.a:
                continue
            if req.over == "chosen" and tune_key(r) != chosen["key"]:
                continue
            v = r.get(req.metric)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                per[r["seed"]] = max(per.get(r["seed"], -math.inf), v)
        vals = list(per.values())
        if not vals:
            out["value"] = f"no {req.metric} recorded (a diagnostics setting such as diag_interval records it)"
            return out
        log = req.bound > 0 and all(v > 0 for v in vals)  # positive quantities: the geometric mean's interval
        f, inv = (math.log, math.exp) if log else (float, float)
        sign = 1.0 if req.above else -1.0
        holds, ti = interval_above([sign * f(v) for v in vals], sign * f(req.bound), conf)
        lo, hi = (ti["lo"], ti["hi"]) if req.above else (_neg(ti["hi"]), _neg(ti["lo"]))
        ti = {
            "mean": inv(sign * ti["mean"]),
            "lo": None if lo is None else inv(lo),
            "hi": None if hi is None else inv(hi),
        }
        label = f"{req.metric} geometric mean" if log and len(vals) > 1 else req.metric
        out["holds"], out["value"] = holds, _interval_text(label, ti, len(vals), ".4g")
        return out
    # context_gain
    gains = []
    for r in ctx["rows"]:
        if (
            r.get("scale") == scale
            and r["variant"] == req.a
            and tune_key(r) == chosen["key"]
            and r.get("val_loss_by_position")
        ):
            g = context_gain(r["val_loss_by_position"], req.past)
            if g is not None:
                gains.append(g)
    if not gains:
        out["value"] = (
            "no loss by position recorded (loss_by_position: true), or the context is shorter "
            f"than 4 x {req.past} tokens"
        )
        return out
    holds, ti = interval_above(gains, req.bound, conf)
    out["holds"], out["value"] = holds, _interval_text("gain", ti, len(gains), "+.4f", " nats/token")
    return out


def _neg(x: Optional[float]) -> Optional[float]:
    return None if x is None else -x


def _interval_text(label: str, ti: dict, n: int, fmt: str, unit: str = "") -> str:
    """'label mean[unit] [lo, hi] over n seed(s)' of an interval ``ti`` (``mean``, ``lo``, ``hi``; the bracket
    left out when ``lo`` is None), numbers in format ``fmt``."""
    bracket = f" [{ti['lo']:{fmt}}, {ti['hi']:{fmt}}]" if ti["lo"] is not None else ""
    return f"{label} {ti['mean']:{fmt}}{unit}{bracket} over {n} seed(s)"
