"""Shared by the A/B benchmarks: run variants alternated in one process, the median of paired ratios with
its interquartile range, the load average as they print it."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable


def alternate(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each variant's call per round, ``rounds`` rounds, the order rotated each round (so no
    variant always runs first)."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - t)
    return times


def paired_ratio(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Median, first and third quartile of the per-round ratios num[i] / den[i]."""
    ratios = [a / b for a, b in zip(num, den)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return statistics.median(ratios), q[0], q[2]


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, as the benchmarks print them ("0.52 0.61 0.70")."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())
