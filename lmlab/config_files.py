"""Config files and overrides: YAML (1.2-style numbers, no duplicate keys, bounded integers) and JSON
mappings read with a one-line error naming the file and the line, and ``--set key=value`` overrides
checked against a config dataclass's fields (:func:`lmlab.config.check_keys`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from lmlab.config import ConfigError, check_keys


def yaml_error_line(exc: Exception) -> str:
    """A YAML or JSON parse error on one line: what is wrong and where (line and column, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    return " ".join(str(exc).split())


MAX_INT_DIGITS = 4000  # Python refuses to convert past 4,300 (with advice that names no field)


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading scientific notation as YAML 1.2 does, refusing duplicate keys and
    over-long integers.

    PyYAML follows YAML 1.1, whose float pattern needs a dot and a signed exponent: ``4e-3``,
    ``1e5`` and ``1.5e3`` come back as strings (and a config then refuses "4e-3" as not a number).
    YAML 1.2's core schema reads them as floats; so does this loader. A key given twice in one mapping
    (PyYAML keeps the last silently) and an integer of more than MAX_INT_DIGITS digits raise a
    ``yaml.constructor.ConstructorError`` naming its line (:func:`load_mapping` turns it into a
    ConfigError).
    """

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = key_node.value
                    if key in seen and key != "<<":
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"duplicate key {key!r} (first given at line {seen[key] + 1})",
                            key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark.line
                    items = (
                        list(enumerate(value_node.value))
                        if isinstance(value_node, yaml.SequenceNode)
                        else [(None, value_node)]
                    )
                    for i, v in items:  # name the field of an over-long integer, not only its line
                        if isinstance(v, yaml.ScalarNode) and self._long_int(v):
                            raise yaml.constructor.ConstructorError(
                                None,
                                None,
                                f"{key}{'' if i is None else f'[{i}]'}: an integer of "
                                f"{self._long_int(v)} digits (at most {MAX_INT_DIGITS})",
                                v.start_mark,
                            )
        return super().construct_mapping(node, deep=deep)

    def _long_int(self, node) -> int:
        """The digit count of an integer scalar longer than MAX_INT_DIGITS, else 0."""
        if (
            self.resolve(yaml.ScalarNode, node.value, (True, False)) != "tag:yaml.org,2002:int"
            and node.tag != "tag:yaml.org,2002:int"
        ):
            return 0
        digits = sum(c.isdigit() for c in str(node.value))
        return digits if digits > MAX_INT_DIGITS else 0

    def construct_yaml_int(self, node):
        if self._long_int(node):
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {self._long_int(node)} digits (at most {MAX_INT_DIGITS})", node.start_mark
            )
        return super().construct_yaml_int(node)


ConfigLoader.add_constructor("tag:yaml.org,2002:int", ConfigLoader.construct_yaml_int)


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def parse_value(text: str) -> Any:
    """Parse a command-line override value with YAML rules (``ConfigLoader``: 384 -> int, 1e-3 and
    4e-3 -> float, true -> bool, null -> None), anything else a string."""
    return yaml.load(text, Loader=ConfigLoader)


def apply_overrides(data: dict, overrides: list[str], cls, source: str = "--set") -> dict:
    """Apply ``key=value`` overrides to a config mapping (returns a new dict).

    Raises ConfigError for a malformed override, an empty value (``key=``: write ``key=null``) or an
    unknown key (with the nearest valid key).
    """
    out = dict(data)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"{source} {item!r}: expected key=value, e.g. d_model=384")
        key, _, raw = item.partition("=")
        key = key.strip()
        check_keys(cls, {key: None}, f"{source} {item!r}")
        if not raw.strip():  # YAML would read it as null: an empty shell variable would unset the field
            raise ConfigError(f"{source} {item!r}: no value after '='; give one, or {key}=null to unset the field")
        try:
            out[key] = parse_value(raw)
        except yaml.YAMLError as exc:  # malformed YAML, or an integer of more than MAX_INT_DIGITS digits
            shown = item if len(item) <= 80 else item[:60] + "..."
            raise ConfigError(f"{source} {shown!r}: {yaml_error_line(exc)}") from None
    return out


def _unique_pairs(pairs: list) -> dict:
    """json.loads' object_pairs_hook: a key given twice in one object is refused (ValueError)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r} in one object")
        out[k] = v
    return out


def load_mapping(path: str | Path) -> dict:
    """Read a YAML or JSON mapping from ``path``; raises ConfigError naming the file when unreadable,
    unparsable (with the line: duplicate keys and integers of more than MAX_INT_DIGITS digits included)
    or not a mapping."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a folder; give a YAML or JSON file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"config file {str(path)!r} is not a regular file; give a YAML or JSON file")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (a binary file?)") from None
    try:
        data = (
            json.loads(text, object_pairs_hook=_unique_pairs)
            if path.suffix == ".json"
            else yaml.load(text, Loader=ConfigLoader)
        )
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} could not be parsed: {yaml_error_line(exc)}") from None
    except (ValueError, RecursionError) as exc:  # JSON: a duplicate key, an over-long integer, deep nesting
        raise ConfigError(
            f"config file {str(path)!r} could not be parsed: "
            f"{'nesting too deep' if isinstance(exc, RecursionError) else exc}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data
