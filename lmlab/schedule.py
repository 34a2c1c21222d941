"""Learning-rate schedules and time budgets of a run (:class:`lmlab.train_config.TrainConfig`'s ``schedule``,
``warmup_steps``, ``decay_fraction``, ``min_lr_ratio`` and ``budget_seconds``).

:func:`lr_at` is the rate of every step: linear warmup, then cosine, warmup-stable-decay (wsd) or constant.
A run with ``budget_seconds`` times its first steps and plans ``max_steps`` to end within the budget
(:func:`budget_steps`), at the end of warmup for cosine and halfway through the stable phase for wsd and
constant rates (:func:`budget_plan_after`: their rate does not depend on ``max_steps`` until the decay
starts, :func:`decay_start`), and checks the plan once more before the decay (:func:`budget_replan_step`);
the plan is recorded in run.yaml so a resumed run keeps it (:func:`planned_config`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from lmlab.train import TrainConfig


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based). Linear warmup from lr/warmup_steps to lr, then
    - cosine: cosine decay to lr * min_lr_ratio at max_steps (Loshchilov & Hutter 2017);
    - wsd: constant lr, then linear decay to lr * min_lr_ratio over the last ``decay_fraction`` of
      the steps (warmup-stable-decay; Hu et al. 2024 "MiniCPM", Hägele et al. 2024);
    - constant: lr."""
    if tc.warmup_steps and step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    if tc.schedule == "constant":
        return tc.lr
    lo = tc.lr * tc.min_lr_ratio
    if tc.schedule == "wsd":
        start = decay_start(tc)
        if step < start:
            return tc.lr
        progress = min(1.0, (step - start) / max(1, tc.max_steps - start))
        return tc.lr - (tc.lr - lo) * progress
    span = max(1, tc.max_steps - tc.warmup_steps)
    progress = min(1.0, (step - tc.warmup_steps) / span)
    return lo + (tc.lr - lo) * 0.5 * (1 + math.cos(math.pi * progress))


BUDGET_SKIP_STEPS = 5  # steps of a process not timed for the budget plan (compile, allocator warm-up)
BUDGET_TIMED_STEPS = 20  # steps timed before the plan is made


def budget_plan_after(tc: TrainConfig) -> float:
    """Seconds into a budgeted run after which its steps are planned (at the end of warmup at the
    earliest). A cosine schedule's learning rate after warmup depends on max_steps, so its plan comes
    at the end of warmup; wsd and constant rates do not until the decay starts, so their plan waits
    for half of the stable phase, (1 - decay_fraction) / 2 of the budget, and times more steps."""
    if tc.schedule == "cosine":
        return 0.0
    stable = 1.0 - tc.decay_fraction if tc.schedule == "wsd" else 1.0
    return tc.budget_seconds * stable / 2


BUDGET_REPLAN_AT = 0.9  # fraction of the planned stable phase after which a budget plan is checked again


def decay_start(tc: TrainConfig, max_steps: Optional[int] = None) -> Optional[int]:
    """The first step whose learning rate depends on ``max_steps`` (default ``tc.max_steps``) after
    warmup: wsd's decay start, ``max_steps`` for a constant rate, None for cosine (every step after
    warmup depends on it)."""
    n = tc.max_steps if max_steps is None else max_steps
    if tc.schedule == "wsd":
        return n - int(round(tc.decay_fraction * n))
    return n if tc.schedule == "constant" else None


def budget_replan_step(tc: TrainConfig, planned_at: int) -> Optional[int]:
    """The step at which a budgeted run checks its plan again (``tc``: the planned config): after
    ``BUDGET_REPLAN_AT`` of the steps before :func:`decay_start`, when at least BUDGET_TIMED_STEPS
    steps have passed since the plan at ``planned_at``; None for cosine or a plan too short for it.
    Steps slow down or speed up on a shared machine: the first plan's timings (a few dozen steps)
    can miss by 5% over a run (two `make demo` runs ended 18 and 26 s past a 470 s budget)."""
    start = decay_start(tc)
    if start is None:
        return None
    at = int(BUDGET_REPLAN_AT * start)
    return at if at >= planned_at + BUDGET_TIMED_STEPS else None


def shortest_plan(step: int, tc: TrainConfig) -> int:
    """The smallest ``max_steps`` whose :func:`decay_start` is not before ``step``: a re-plan at
    ``step`` may shorten the run down to it and the run stays the run of that length from the start."""
    n = step
    while decay_start(tc, n) < step:
        n += 1
    return n


def budget_steps(step: int, elapsed_s: float, step_s: float, eval_s: float, save_s: float, tc: TrainConfig) -> int:
    """The ``max_steps`` that makes a run end within ``tc.budget_seconds`` of wall time: the largest N in
    [step, tc.max_steps] with ``elapsed_s + (N - step) * step_s + evals * eval_s + saves * save_s <=
    budget``, where evals counts the periodic evaluations in (step, N] plus the final one at N, and saves
    the periodic checkpoints in (step, N) plus the final one. Units: seconds. ``step`` when even one more
    step does not fit (the budget is spent: the run ends there)."""

    def cost(n: int) -> float:
        if n == step:
            return elapsed_s
        evals = n // tc.eval_interval - step // tc.eval_interval + (n % tc.eval_interval != 0)
        saves = 1
        if tc.checkpoint_interval:
            saves += (n - 1) // tc.checkpoint_interval - step // tc.checkpoint_interval
        return elapsed_s + (n - step) * step_s + evals * eval_s + saves * save_s

    lo, hi = step, tc.max_steps  # cost grows with n: the largest n that fits, by bisection
    if cost(hi) <= tc.budget_seconds:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= tc.budget_seconds else (lo, mid)
    return lo


def planned_config(run: dict, tc: TrainConfig) -> tuple[TrainConfig, bool]:
    """``tc`` with the ``max_steps`` a budgeted run planned (run.yaml's ``budget`` record, written by
    :meth:`Trainer.fit`), and whether that plan holds: it does while ``tc`` asks the same
    ``budget_seconds`` and either the same cap or the planned steps themselves."""
    plan = run.get("budget")
    if (
        isinstance(plan, dict)
        and tc.budget_seconds is not None
        and tc.budget_seconds == plan.get("seconds")
        and tc.max_steps in (plan.get("cap"), plan.get("steps"))
        and isinstance(plan.get("steps"), int)
    ):
        return dataclasses.replace(tc, max_steps=plan["steps"]), True
    return tc, False
