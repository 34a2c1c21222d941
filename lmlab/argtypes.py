"""Argument types for argparse, shared by the CLI and the scripts in bench/: a bad number is refused by
argparse itself, which names the flag and the value (exit 2)."""

from __future__ import annotations

import argparse
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
