"""Reading JSON that lmlab wrote (run folders, checkpoints' manifests, data folders, the lab's sweep
files) without trusting it: UTF-8 (an invalid byte is named with its line), nesting at most
:data:`MAX_DEPTH` deep (checked before any parser recurses: no RecursionError), and, where lmlab writes
only finite numbers, no NaN or Infinity. Every problem raises :class:`lmlab.config_checks.ConfigError`
(or the error class a caller passes) naming the file and line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Optional

from lmlab.config_checks import ConfigError

MAX_DEPTH = 64  # the files lmlab writes nest 5 deep at most


def _show(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


_JSON_TYPES = {type(None): "null", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def json_type(value: Any) -> str:
    """JSON's name for the type of the parsed ``value`` (``null``, ``array``...), not Python's."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def decode_utf8(data: bytes, path: Path) -> str:
    """``data`` (the bytes of ``path``) as UTF-8 text; ConfigError naming the line and byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: line {line}: byte {data[exc.start]:#04x} is not UTF-8 ({exc.reason}); the file is damaged"
        ) from None


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path`` (:func:`decode_utf8`); OSError propagates (the CLI names the path)."""
    return decode_utf8(Path(path).read_bytes(), path)


def nesting(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in ``text`` (strings skipped), without parsing it."""
    depth = most = 0
    for ch in re.findall(r"[\[\]{}]", re.sub(r'"(?:[^"\\]|\\.)*"', "", text)):
        if ch in "[{":
            depth += 1
            most = max(most, depth)
        elif ch in "]}":
            depth -= 1
    return most


def check_nesting(text: str, where: str, error: type = ConfigError, why: str = "") -> str:
    """``text`` unchanged when its JSON arrays and objects nest at most :data:`MAX_DEPTH` deep
    (:func:`nesting`, before any parser recurses); else raises ``error`` naming ``where``, the depth and
    the limit (``why``: what it says about the file)."""
    depth = nesting(text)
    if depth > MAX_DEPTH:
        raise error(f"{where}: JSON nested more than {MAX_DEPTH} deep ({depth:,} levels){why}")
    return text


def nonfinite_path(value: Any) -> Optional[str]:
    """The path (``claims[2].effect``) of the first NaN or infinite number inside ``value``, else None.
    Iterative: any depth."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return where or "(the value)"
        if isinstance(x, dict):
            stack += [(f"{where}.{k}" if where else str(k), v) for k, v in reversed(list(x.items()))]
        elif isinstance(x, list):
            stack += [(f"{where}[{i}]", v) for i, v in reversed(list(enumerate(x)))]
    return None


def parse_json(text: str, where: str, finite: bool = True) -> Any:
    """``text`` as JSON; ``where`` (``FILE: line N``) starts every error. Refuses (ConfigError) text
    that is not JSON, nests deeper than :data:`MAX_DEPTH` (checked before parsing) and, with
    ``finite``, holds NaN or Infinity."""
    check_nesting(text, where, why="; the lab never writes that: the file is damaged")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = exc.msg.removesuffix(" at")  # json's "Invalid control character at"
        raise ConfigError(f"{where}: not JSON ({msg} at column {exc.colno}); the file is damaged") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        what = "an integer of thousands of digits" if "digits" in str(exc) else str(exc)
        raise ConfigError(f"{where}: not valid JSON ({what}); the file is damaged") from None
    bad = nonfinite_path(value) if finite else None
    if bad:
        raise ConfigError(f"{where}: field {bad!r} is NaN or infinite; give a finite number (the file is damaged)")
    return value


def read_json_object(path: Path, finite: bool = False) -> dict:
    """A JSON object written by the lab (``timing.json``, ``init_grads.json``): UTF-8, bounded nesting,
    an object (with ``finite`` no NaN or Infinity); ConfigError naming the file otherwise."""
    data = parse_json(read_text(path), str(path), finite)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: holds a JSON {type(data).__name__}, not an object; the file is damaged")
    return data


def jsonl_objects(path: Path) -> list[tuple[str, Any]]:
    """(``FILE: line N``, parsed JSON or the ConfigError of that line) for each non-empty line."""
    data = path.read_bytes()
    out: list[tuple[str, Any]] = []
    for i, raw in enumerate(data.split(b"\n")):
        if not raw.strip():
            continue
        where = f"{path}: line {i + 1}"
        try:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{where}: byte {raw[exc.start]:#04x} is not UTF-8 ({exc.reason}); the file is damaged"
                ) from None
            value = parse_json(text, where)
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{where}: a record must be a JSON object, got {type(value).__name__} "
                    f"{_show(value)}; the file is damaged"
                )
            out.append((where, value))
        except ConfigError as exc:
            out.append((where, exc))
    return out
