"""The smaller blocks of a spec (:mod:`lmlab.lab.spec`): ``match:`` (the control: what is held fixed
across variants, :class:`Match`), ``tune:`` and ``tune_seeds:`` (the grid and two-stage tuning),
``timing:`` (the interleaved step-time micro-benchmark, :mod:`lmlab.lab.timing`) and ``init_grads:``
(gradient norms at initialisation, :mod:`lmlab.lab.init_grads`). Each parser raises ConfigError naming
the spec, the key, the value and what is valid."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional

from lmlab.config import ConfigError
from lmlab.lab.axes import _check_field

TIMING_DEFAULTS = {
    "batch": 8,
    "context": None,
    "pairs": 15,
    "steps": 3,
    "threads": None,
    "decode": False,
    "decode_batch": 8,
    "decode_context": None,
}
# optional timing keys, absent unless set (a stored timing block's key stays what it was without them):
# decode_steps: time this many decode steps at the end of a decode_context-long cache (default: decode
# the second half of the context, which on a GPU's eager per-token loop takes minutes at 4k-8k)
TIMING_OPTIONAL = ("decode_steps",)
HOLDS = ("non_embedding_params", "params", "flops_per_token", "tokens", "flops")
SOLVABLE = ("d_ff", "d_model", "n_layers")


def _number(value: Any, where: str) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 2.5e12 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}={value!r} must be a finite number > 0")
    return value


@dataclass
class Match:
    """The control: ``hold`` a quantity fixed across variants by solving ``solve`` (a size field) in
    steps of ``multiple`` so every variant is within ``tolerance`` of ``target`` (the baseline's value or
    a number). ``hold: tokens | flops`` needs no solving: the budget holds them (checked)."""

    hold: str
    solve: Optional[str] = None
    multiple: int = 8
    target: Any = "baseline"
    tolerance: float = 0.02


def parse_match(raw: Any, source: str) -> Optional[Match]:
    """``match: HOLD`` or a mapping (see the module docstring)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"hold": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: match must be a quantity ({', '.join(HOLDS)}) or a mapping with 'hold'")
    unknown = set(raw) - {"hold", "solve", "multiple", "target", "tolerance"}
    if unknown:
        raise ConfigError(
            f"{source}.match: unknown key(s) {sorted(unknown)}; use hold, solve, multiple, target, tolerance"
        )
    hold = raw.get("hold")
    if hold not in HOLDS:
        raise ConfigError(f"{source}.match.hold={hold!r} must be one of {', '.join(HOLDS)}")
    solve = raw.get("solve", "d_ff" if hold in ("non_embedding_params", "params", "flops_per_token") else None)
    if hold in ("tokens", "flops"):
        if "solve" in raw:
            raise ConfigError(f"{source}.match: hold={hold} is held by the budget, not by solving a size; drop 'solve'")
    elif solve not in SOLVABLE:
        raise ConfigError(f"{source}.match.solve={solve!r} must be one of {', '.join(SOLVABLE)}")
    multiple = raw.get("multiple", 1 if solve == "n_layers" else 8)
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ConfigError(f"{source}.match.multiple={multiple!r} must be an integer >= 1")
    target = raw.get("target", "baseline")
    if target != "baseline":
        target = _number(target, f"{source}.match.target")
    tol = raw.get("tolerance", 0.02)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        raise ConfigError(f"{source}.match.tolerance={tol!r} must be a fraction in (0, 1), e.g. 0.02")
    return Match(hold, solve, multiple, target, float(tol))


def parse_tune_seeds(raw: Any, seeds: list, tune: dict, source: str) -> list:
    """``tune_seeds: [1]``: the seeds that train every value of the ``tune`` grid (stage 1); each other
    seed of ``seeds`` trains only at the value stage 1 chose for its cell's variant (stage 2), and only
    those seeds enter the comparisons, so the choice (the best of a grid of noisy means) does not bias
    the figures compared. [] when absent: every seed trains the whole grid. Raises ConfigError for a
    value that is not a non-empty proper subset of ``seeds`` or is given without a grid to tune."""
    if raw is None:
        return []
    if not tune:
        raise ConfigError(f"{source}: tune_seeds={raw!r} needs a 'tune:' grid to choose from")
    if (
        not isinstance(raw, list)
        or not raw
        or any(isinstance(s, bool) or not isinstance(s, int) for s in raw)
        or len(set(raw)) != len(raw)
    ):
        raise ConfigError(f"{source}: tune_seeds={raw!r} must be a non-empty list of distinct seeds, e.g. [1]")
    missing = [s for s in raw if s not in seeds]
    if missing:
        raise ConfigError(f"{source}: tune_seeds {missing} are not among seeds={seeds!r}")
    if len(raw) == len(seeds):
        raise ConfigError(
            f"{source}: tune_seeds={raw!r} lists every seed, which leaves none to compare at the chosen "
            f"value; list fewer (e.g. [{seeds[0]}]) or drop tune_seeds to tune on every seed"
        )
    return list(raw)


def parse_tune(raw: Any, source: str) -> dict:
    """``tune: {field: [values...]}``: every variant is trained at every combination."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{source}: tune must map a field to a list of values, e.g. {{lr: [1.0e-3, 3.0e-3]}}")
    out = {}
    for k, v in raw.items():
        _check_field(str(k), f"{source}.tune")
        if not isinstance(v, list) or len(v) < 2:
            raise ConfigError(f"{source}.tune.{k}={v!r} must be a list of at least two values to choose from")
        if len({json.dumps(x, sort_keys=True) for x in v}) != len(v):
            raise ConfigError(f"{source}.tune.{k}={v!r} repeats a value")
        out[str(k)] = [float(x) if isinstance(x, str) and _is_float(x) else x for x in v]
    return out


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def parse_timing(raw: Any, source: str) -> Optional[dict]:
    """``timing:`` true or a mapping over TIMING_DEFAULTS (batch, context, pairs >= 15, steps, threads,
    decode, decode_batch, decode_context) and TIMING_OPTIONAL (decode_steps)."""
    if raw is None or raw is False:
        return None
    raw = {} if raw is True else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: timing must be true or a mapping with keys {', '.join(TIMING_DEFAULTS)}")
    unknown = set(raw) - set(TIMING_DEFAULTS) - set(TIMING_OPTIONAL)
    if unknown:
        raise ConfigError(
            f"{source}.timing: unknown key(s) {sorted(unknown)}; valid: "
            f"{', '.join((*TIMING_DEFAULTS, *TIMING_OPTIONAL))}"
        )
    out = {**TIMING_DEFAULTS, **raw}
    for k, v in out.items():
        if k == "decode":
            if not isinstance(v, bool):
                raise ConfigError(f"{source}.timing.decode={v!r} must be true or false")
        elif v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{source}.timing.{k}={v!r} must be an integer >= 1")
    if out["pairs"] < 15:
        raise ConfigError(
            f"{source}.timing.pairs={out['pairs']} must be >= 15 (a median of per-pair ratios "
            f"needs that many pairs to carry a useful interval)"
        )
    return out


def parse_init_grads(raw: Any, seeds: list, source: str) -> Optional[dict]:
    """``init_grads: {depths: [4, 16], seeds: [1, 2], batch: 16}`` (seeds default: the spec's; batch
    default 16): per-layer gradient norms of every untrained variant at each depth
    (:mod:`lmlab.lab.init_grads`)."""
    if raw is None:
        return None
    keys = ("depths", "seeds", "batch")
    if not isinstance(raw, dict) or "depths" not in raw or set(raw) - set(keys):
        raise ConfigError(
            f"{source}: init_grads={raw!r} must be a mapping with 'depths' (a list of n_layers) and "
            f"optional 'seeds' and 'batch', e.g. {{depths: [4, 16], batch: 16}}"
        )
    out = {"depths": raw["depths"], "seeds": raw.get("seeds", seeds), "batch": raw.get("batch", 16)}
    for k in ("depths", "seeds"):
        v = out[k]
        if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
            raise ConfigError(f"{source}.init_grads.{k}={v!r} must be a non-empty list of integers")
    if any(d < 1 for d in out["depths"]):
        raise ConfigError(f"{source}.init_grads.depths={out['depths']!r}: every depth must be >= 1")
    b = out["batch"]
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise ConfigError(f"{source}.init_grads.batch={b!r} must be an integer >= 1")
    return out
