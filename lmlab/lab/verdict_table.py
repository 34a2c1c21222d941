"""The verdict table's cells, shared by a sweep's page (:mod:`lmlab.lab.page`) and the index of all
claims (:mod:`lmlab.lab.index`): a claim's metric, expectation, tokens per parameter, detectable effect,
measured effect with its interval, verdict and note, and the number formats of both pages."""

from __future__ import annotations

from typing import Any

from lmlab.lab.stats import finite as _ok


# --- formatting ----------------------------------------------------------------------------
def _num(x: Any, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if _ok(x) else "n/a"


def _count(x: Any) -> str:
    if not _ok(x):
        return "n/a"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def _ci(lo: Any, hi: Any, digits: int = 4, k: float = 1.0) -> str:
    return f"[{lo * k:+.{digits}f}, {hi * k:+.{digits}f}]" if _ok(lo) and _ok(hi) else "n/a"


def _effect(c: dict) -> str:
    """A claim's measured effect and interval in its unit (bits/byte, nats, or %)."""
    if c.get("effect") is None:
        return "n/a"
    if c.get("relative"):
        lo, hi = c.get("lo"), c.get("hi")
        ci = f"[{100 * lo:+.2f}%, {100 * hi:+.2f}%]" if _ok(lo) and _ok(hi) else "n/a"
        return f"{100 * c['effect']:+.2f}% {ci}"
    return f"{c['effect']:+.4f} {_ci(c.get('lo'), c.get('hi'))}"


def _expected(c: dict) -> str:
    amount = f"{100 * c['by']:g}%" if c.get("relative") else f"{c['by']:g}"
    if c["kind"] == "equal":
        return f"\\|{_md_escape(c['a'])} - {_md_escape(c['b'])}\\| < {amount}"
    if c["by"] < 0:  # non-inferiority
        return f"{_md_escape(c['a'])} at most {amount.lstrip('-')} worse than {_md_escape(c['b'])}"
    return (
        f"{_md_escape(c['a'])} lower than {_md_escape(c['b'])} by > {amount}"
        if c["by"]
        else f"{_md_escape(c['a'])} lower than {_md_escape(c['b'])}"
    )


def _unit(metric: str) -> str:
    return {
        "val_bpb": "bits/byte",
        "final_train_loss": "nats/token",
        "step_time": "step time",
        "decode_time": "decode step time",
        "lr_sensitivity": "LR sensitivity (bits/byte)",
        "attn_sink": "first-key attention share",
    }.get(metric, "bits/byte" if metric.startswith("val_bpb") else metric)


def _tpp(c: dict) -> str:
    x = c.get("tokens_per_param")
    return "n/a" if not _ok(x) else f"{x:.3g}"


def _detectable(c: dict) -> str:
    x = c.get("detectable")
    if not _ok(x):
        return "n/a"
    return f"{100 * x:.2f}%" if c.get("relative") else f"{x:.4f}"


def claim_cells(c: dict, show_scale: bool) -> list[str]:
    """A judged claim's table cells: claim, (scale), metric, expected, tokens per parameter, detectable
    (80% power), effect [interval], seeds, method, verdict."""
    return (
        [_md_escape(c["text"])]
        + ([str(c.get("scale") or "")] if show_scale else [])
        + [
            _unit(c["metric"]),
            _expected(c),
            _tpp(c),
            _detectable(c),
            _effect(c),
            str(c.get("n", "")),
            c.get("method", ""),
            f"**{c['verdict']}**",
        ]
    )


CLAIM_HEAD = [
    "metric",
    "expected",
    "tokens/param",
    "detectable (80%)",
    "measured effect [interval]",
    "seeds",
    "method",
    "verdict",
]


def claim_note(c: dict) -> str:
    """Why a claim has no verdict (its gate), its preconditions with their measured values, then the
    judging notes."""
    parts = []
    if c.get("gate"):
        parts.append(f"{c['gate']} (the interval alone: {c.get('measured')})")
    for x in c.get("preconditions") or []:
        if x.get("holds"):
            parts.append(f"precondition holds: {x['text']}: {x['value']}")
    if c.get("note"):
        parts.append(c["note"])
    return "; ".join(parts)


def verdict_lines(claims: list[dict], show_scale: bool) -> list[str]:
    head = ["claim"] + (["scale"] if show_scale else []) + CLAIM_HEAD + ["note"]
    L = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for c in claims:
        cells = claim_cells(c, show_scale) + [_md_escape(claim_note(c))]
        L.append("| " + " | ".join(cells) + " |")
    return L


HOW_TO_READ = (
    "The effect is measured in the direction the claim states (positive = as claimed; for 'equal' the "
    "signed difference), with a {conf:g}% interval (Student t over paired seeds; the pooled per-run noise "
    "when a variant has one seed). A claim **agrees** when the whole interval clears the smallest effect that "
    "counts, **disagrees** when it lies wholly on the other side, and is **inconclusive** when it contains "
    "it. A claim gets no verdict when its design cannot support one: **not testable at this scale** (a "
    "precondition of its mechanism, measured on its own runs, fails, or its runs are below the floor of "
    "tokens per non-embedding parameter), **rate not bracketed** (a variant's learning rate was chosen at "
    "an edge of the rates tried, on too few seeds or values, or in no stable cell) or **too few seeds** "
    "(fewer paired seeds than the spec's judging.min_seeds); the interval is shown either way. "
    "*Detectable (80%)*: the smallest true effect this design (its paired seeds and their measured noise) "
    "would detect with 80% probability; a margin below it was underpowered before any verdict."
)
