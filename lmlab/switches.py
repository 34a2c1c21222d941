"""The reference of every switch: each field of :class:`lmlab.config.ModelConfig` and
:class:`lmlab.train_config.TrainConfig`, with its type, default, the values ``__post_init__`` accepts (where a tuple
of choices names them) and what its source comment says, read from the two dataclasses' source so the page
cannot drift from the code (``docs/switches.md``; ``tests/test_switches.py`` regenerates and compares).

    python -m lmlab.switches > docs/switches.md
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
from typing import Any

from lmlab import config_checks
from lmlab.config import ModelConfig

# field -> the tuple of accepted values in lmlab.config_checks (the names _choice validates against)
CHOICES = {
    "norm_type": "NORM_TYPES",
    "norm_position": "NORM_POSITIONS",
    "activation": "ACTIVATIONS",
    "position": "POSITIONS",
    "rope_style": "ROPE_STYLES",
    "bias": "BIASES",
    "moe_balance": "MOE_BALANCES",
    "attn_output_gate": "ATTN_OUTPUT_GATES",
    "linear_attention": "LINEAR_ATTENTIONS",
    "qk_norm": "QK_NORMS",
    "qk_norm_layers": "QK_NORM_LAYERS",
    "router_weights": "ROUTER_WEIGHTS",
    "qk_norm_scope": "QK_NORM_SCOPES",
    "parametrization": "PARAMETRIZATIONS",
    "router_score": "ROUTER_SCORES",
}


def _comments(cls: type) -> dict[str, str]:
    """field -> its comment in the class body: its own line's comment, plus a comment block (consecutive
    comment lines; ``# ---`` section rules belong to none) next to it. A block right above a field is that
    field's, unless it also sits right below a field whose own comment ends with ',' (a two-line comment,
    continued); a block right below a field and not right above one continues the field above."""
    src = inspect.getsource(cls)
    body = ast.parse(src).body[0].body
    lines = src.splitlines()
    comment: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comment[tok.start[0]] = tok.string.lstrip("#").strip()
    fields = [
        (n.lineno, n.end_lineno or n.lineno, n.target.id)
        for n in body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]
    starts = {a: name for a, _, name in fields}
    ends = {b: name for _, b, name in fields}
    own = {name: [comment[r] for r in range(a, b + 1) if r in comment] for a, b, name in fields}
    before: dict[str, list] = {name: [] for _, _, name in fields}
    is_block = lambda r: (
        1 <= r <= len(lines) and lines[r - 1].strip().startswith("#") and not lines[r - 1].strip().startswith("# ---")
    )  # noqa: E731
    r = 1
    while r <= len(lines):
        if not is_block(r):
            r += 1
            continue
        first = r
        while is_block(r):
            r += 1
        block = [comment[x] for x in range(first, r)]
        above, below = ends.get(first - 1), starts.get(r)  # the field just above / just below the block
        if above and (below is None or (own[above] and own[above][-1].endswith(","))):
            own[above] = own[above] + block
        elif below:
            before[below] = before[below] + block
    return {name: " ".join(before[name] + own[name]) for name in own}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _type(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return t.replace("Optional[", "").rstrip("]") + (" or None" if "Optional" in str(f.type) else "")


def rows(cls: type) -> list[dict]:
    """One dict per field of dataclass ``cls``: name, type, default, values (the accepted choices, '' where
    any value of the type is checked by its own rule), doc (the source comment)."""
    notes = _comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        choices = getattr(config_checks, CHOICES[f.name]) if f.name in CHOICES else None
        out.append(
            {
                "name": f.name,
                "type": _type(f),
                "default": _default(f),
                "values": ", ".join(f"`{c}`" for c in choices) if choices else "",
                "doc": notes.get(f.name, ""),
            }
        )
    return out


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """docs/switches.md: a table per dataclass."""
    from lmlab.train import TrainConfig

    L = [
        "# Every switch",
        "",
        "Generated from `lmlab/config.py` (`ModelConfig`: the model) and `lmlab/train_config.py` (`TrainConfig`: "
        "training) by `python -m lmlab.switches > docs/switches.md`; `tests/test_switches.py` checks the page "
        "is current. Any field is set with `--set name=value` on `lmlab train` (or in a config / spec YAML); "
        "every value is validated, and a bad one is refused naming the field and what is valid.",
        "",
    ]
    for title, cls in (("Model (`ModelConfig`)", ModelConfig), ("Training (`TrainConfig`)", TrainConfig)):
        rs = rows(cls)
        L += [
            f"## {title}",
            "",
            f"{len(rs)} fields.",
            "",
            "| field | type | default | values | what it does (source) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in rs:
            L.append(
                f"| `{r['name']}` | {_cell(r['type'])} | `{_cell(r['default'])}` | {_cell(r['values'])} | "
                f"{_cell(r['doc'])} |"
            )
        L.append("")
    return "\n".join(L)


if __name__ == "__main__":
    print(markdown(), end="")
