"""Argument types for argparse, shared by the CLI and the scripts in bench/: a bad number is refused by
argparse itself, which names the flag and the value (exit 2)."""

from __future__ import annotations

import argparse
import os
from typing import Callable


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: the text as an integer >= ``low``; ArgumentTypeError (which argparse reports
    as ``argument --FLAG: ...``) for text that is not an integer or is below ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def threads_count(text: str) -> int:
    """An argparse ``type`` for ``--threads``: an integer from 1 to the CPUs this process may run on
    (its affinity mask, SMT siblings counted); more would only make the threads wait on each other, so it
    is refused (ArgumentTypeError naming the value and the range) instead of running for minutes."""
    value = int_at_least(1)(text)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if value > cpus:
        raise argparse.ArgumentTypeError(
            f"{value} is more than the {cpus} CPUs this process may run on (give 1-{cpus})"
        )
    return value
