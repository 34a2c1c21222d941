"""``lmlab report --index DIR... --out FILE.md``: one page of every claim of several sweeps' pages, and
the generated blocks (claim counts, verdict summary) it writes into README.md and docs pages
(``--readme``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from lmlab.config import ConfigError
from lmlab.fsutil import atomic_write_text
from lmlab.lab import plots, validate
from lmlab.lab.page import _duration, sweep_wall
from lmlab.lab.report import (
    REPORT_MARKS,
    VERDICTS_FILE,
    _check_out,
    read_results_csv,
    read_spec_file,
    read_timing_file,
)
from lmlab.lab.results import RESULTS_FILE, TIMING_FILE
from lmlab.lab.spec import builtin_specs, parse_spec
from lmlab.lab.stats import VERDICTS
from lmlab.lab.verdict_table import CLAIM_HEAD, HOW_TO_READ, _effect, _md_escape, claim_cells
from lmlab.lab.verdicts import analyze


# --- the index -----------------------------------------------------------------------------
def collect_claims(dirs: list[Path]) -> tuple[list[dict], list[tuple], dict]:
    """Every judged claim of the sweeps (or report folders) ``dirs``: (claims, each with its "spec";
    per folder (name, claim, report link, number of claims, pooled noise, :func:`sweep_wall`);
    {"first", "last": the earliest and latest run finish times, "machines": the machines the runs
    name}). A sweep folder is
    analysed from its results; a report folder from its results.csv and spec, or read from its
    ``verdicts.json``; every file validated first (:mod:`lmlab.lab.validate`). Raises ValueError for a
    folder that is neither, ConfigError naming the file, line and field of a damaged one."""
    claims, specs = [], []
    when, machines = [], []
    for d in dirs:
        d = Path(d)
        rows: list[dict] = []
        if (d / RESULTS_FILE).is_file():
            spec_raw = read_spec_file(d / "spec.yaml") if (d / "spec.yaml").exists() else {}
            spec = parse_spec(spec_raw or {"axes": None}, d / "spec.yaml")
            rows = validate.read_results_jsonl(d / RESULTS_FILE, spec_raw.get("name"), spec if spec_raw else None)
            timing = read_timing_file(d / TIMING_FILE, spec) if (d / TIMING_FILE).exists() else None
            res = analyze(rows, spec, timing)
            res["spec"], res["claim"] = (
                spec_raw.get("name") or d.name,
                str(spec_raw.get("claim") or "").strip(),
            )
            res["sweep_wall"] = sweep_wall(d)
            link = None
        elif (d / "results.csv").is_file() and ((d / "spec.yaml").is_file() or d.name in builtin_specs()):
            # a report folder: its results.csv judged anew by the protocol of this lmlab, with the spec it
            # ran with (its spec.yaml, else the shipped spec of its name) and its timing block when kept
            spec_path = d / "spec.yaml" if (d / "spec.yaml").is_file() else builtin_specs()[d.name]
            spec = parse_spec(read_spec_file(spec_path), spec_path)
            # a spec.yaml in the folder is the spec it ran with; its name is the folder's unless it says one
            raw_name = read_spec_file(spec_path).get("name") if (d / "spec.yaml").is_file() else None
            # validated against the spec it ran with (a shipped spec of the folder's name may have changed since)
            own = (d / "spec.yaml").is_file()
            rows = read_results_csv(d / "results.csv", raw_name if own else None, spec if own else None)
            timing = read_timing_file(d / TIMING_FILE, spec if own else None) if (d / TIMING_FILE).is_file() else None
            stored = validate.read_verdicts(d / VERDICTS_FILE) if (d / VERDICTS_FILE).is_file() else None
            res = analyze(rows, spec, timing, stored["claims"] if stored else None)
            if stored:
                res["sweep_wall"] = stored.get("sweep_wall")
            res["spec"], res["claim"] = raw_name or d.name, spec.claim
            link = d / "report.md" if (d / "report.md").is_file() else None
        elif (d / VERDICTS_FILE).is_file():
            res = validate.read_verdicts(d / VERDICTS_FILE)
            link = d / "report.md"
        else:
            raise ValueError(
                f"{str(d)!r} is neither a sweep folder ({RESULTS_FILE}) nor a report folder "
                f"(results.csv with spec.yaml or a shipped spec's name, or {VERDICTS_FILE}); give the "
                f"folders `lmlab sweep --out` or `lmlab report --out` wrote"
            )
        specs.append(
            (
                res.get("spec") or d.name,
                res.get("claim", ""),
                link,
                len(res["claims"]),
                res.get("pooled"),
                res.get("sweep_wall"),
            )
        )
        for c in res["claims"]:
            claims.append({**c, "spec": res.get("spec") or d.name})
        when += [str(r["finished_at"]) for r in rows if r.get("finished_at")]
        machines += [re.sub(r" \(\d+ threads?\)$", "", str(r["machine"])) for r in rows if r.get("machine")]
    executed = {
        "first": min(when) if when else None,
        "last": max(when) if when else None,
        "machines": sorted(set(machines)),
    }
    return claims, specs, executed


def _verdict_counts(claims: list[dict]) -> dict:
    """{verdict: n} over ``claims``, for every verdict of :data:`lmlab.lab.stats.VERDICTS`."""

    return {v: sum(1 for c in claims if c["verdict"] == v) for v in VERDICTS}


def _counts_text(counts: dict) -> str:
    """'3 agree, 1 disagrees, ...': every verdict with a count, in the order of VERDICTS."""
    words = {"agrees": "agree", "disagrees": "disagree", "inconclusive": "inconclusive"}
    return ", ".join(f"{n} {words.get(v, v)}" for v, n in counts.items() if n or v in words)


def _leans(c: dict) -> str:
    """An inconclusive claim's lean: 'agrees, ~N seeds', 'nowhere' (a null), '' otherwise."""
    if c.get("verdict") != "inconclusive" or "settle" not in c:
        return ""
    return f"{c['settle'][1]}, ~{c['settle'][0]} seeds" if c["settle"] else "nowhere"


def write_index(dirs: list[Path], out: Path, readme=None) -> list[Path]:
    """One page of every claim of the sweeps (or report folders holding ``verdicts.json``) ``dirs``: a
    row per claim (spec, claim, scale, expected, measured effect and interval, verdict) and a forest
    plot (``NAME-forest.png`` beside ``out``); with ``readme`` (a markdown file, or a list of them) also
    the summary table and/or the counts line between each file's markers (:func:`update_readme`). A
    folder is read by :func:`collect_claims`. Raises ValueError for a folder that is neither a sweep nor a
    report, a bad ``out``, or a file without either pair of markers."""
    out = _check_out(Path(out), REPORT_MARKS[1])
    seen: dict = {}
    for d in dirs:  # one folder named twice would count its claims twice
        key = Path(d).resolve()
        if key in seen:
            raise ConfigError(f"--index: {str(d)!r} is given twice (as {str(seen[key])!r} too); name each sweep once")
        seen[key] = d
    claims, specs, executed = collect_claims(dirs)
    readmes = [] if readme is None else [Path(r) for r in (readme if isinstance(readme, (list, tuple)) else [readme])]
    for r in readmes:
        link = Path(os.path.relpath(out.resolve(), r.resolve().parent))
        update_readme(r, summary_block(claims, executed, link), counts_line(claims, link))
    out.parent.mkdir(parents=True, exist_ok=True)  # every folder read: the first write
    forest = plots.forest(claims, out.parent / f"{out.stem}-forest.png")
    counts = _verdict_counts(claims)
    L = [
        "# Ablation index",
        "",
        f"{len(claims)} claim(s) from {len(specs)} sweep(s): {_counts_text(counts)}. Generated by `lmlab report "
        f"--index` from the sweeps' numbers (each sweep's results judged by the protocol of the lmlab that "
        f"wrote this page); nothing here is written by hand.",
        "",
        HOW_TO_READ.format(conf=95) + " *Leans*: for an inconclusive claim, the verdict its interval leans towards "
        "and about how many paired seeds would decide it at 80% power if the measured effect and noise held "
        "(a planning figure); 'nowhere': the interval is centred on its boundary (a null), which more seeds "
        "will not settle.",
        "",
    ]
    scaled = any(c.get("scale") for c in claims)
    head = ["spec", "claim"] + (["scale"] if scaled else []) + CLAIM_HEAD + ["leans", "why no verdict"]
    L += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for c in claims:
        L.append(
            "| "
            + " | ".join(
                [_md_escape(c["spec"])] + claim_cells(c, scaled) + [_leans(c), _md_escape(c.get("gate") or "")]
            )
            + " |"
        )
    L.append("")
    if forest:
        L += [f"![every claim]({forest.name})", ""]
    L += ["## Sweeps", ""]
    for name, claim, link, n, pooled, wall in specs:
        where = (
            f"[{name}]({Path(link).resolve().relative_to(out.parent.resolve())})"
            if link and _under(link, out.parent)
            else name
        )
        noise = f"; per-run noise {pooled[0]:.4f} bits/byte" if pooled else "; no noise estimate (one seed)"
        took = f"; `lmlab sweep` took {_duration(wall['wall_s'])}" if wall else "; wall time not recorded"
        L.append(f"- {where}: {n} claim(s){noise}{took}. {_md_escape(claim)}")
    L.append("")
    walls = [w for *_, w in specs if w]
    if walls:
        L += [
            f"Wall time recorded for {len(walls)} of {len(specs)} sweep(s): "
            f"{_duration(sum(w['wall_s'] for w in walls))} in all (each sweep's invocations summed; "
            f"`make ablations` runs the sweeps one after another)"
            + ("" if len(walls) == len(specs) else "; the others ran before lmlab recorded it")
            + ".",
            "",
        ]
    out.write_text("\n".join(L))
    return [out] + ([forest] if forest else []) + readmes


README_START = "<!-- lmlab:ablation-summary (generated by `lmlab report --index ... --readme`; do not edit) -->"


README_END = "<!-- /lmlab:ablation-summary -->"


COUNTS_START = "<!-- lmlab:ablation-counts (generated by `lmlab report --index ... --readme`; do not edit) -->"


COUNTS_END = "<!-- /lmlab:ablation-counts -->"


def counts_line(claims: list[dict], index: Path) -> str:
    """The one-line count of the verdicts, linking the index page ``index`` (relative to the file)."""
    return (
        f"The shipped specs' executions so far: {len(claims)} claims, **{_counts_text(_verdict_counts(claims))}** "
        f"([every claim, interval and note]({index.as_posix()}))."
    )


def summary_block(claims: list[dict], executed: dict, index: Path) -> str:
    """The lab page's summary (docs/lab.md): one row per claim (spec, claim, verdict, effect [interval]), the
    counts, the execution dates and machines, and a link to the index page ``index`` (relative to the
    README)."""
    counts = _verdict_counts(claims)
    dates = sorted({str(executed.get(k) or "")[:10] for k in ("first", "last")} - {""})
    machines = "; ".join(executed.get("machines") or []) or "machine not recorded"
    L = [
        f"{len(claims)} claims: **{_counts_text(counts)}**; executed {' to '.join(dates) or 'on unrecorded dates'} on "
        f"{machines}. The verdict column of [the index]({index.as_posix()}), where every interval and "
        f"note is.",
        "",
        "| spec | claim | verdict | measured effect [interval] |",
        "| --- | --- | --- | --- |",
    ]
    for c in claims:
        scale = f" (@{c['scale']})" if c.get("scale") else ""
        L.append(f"| {_md_escape(c['spec'])} | {_md_escape(c['text'])}{scale} | **{c['verdict']}** | {_effect(c)} |")
    return "\n".join(L)


def update_readme(readme: Path, block: str, counts: Optional[str] = None) -> None:
    """Replace what lies between :data:`README_START` and :data:`README_END` in ``readme`` with ``block``,
    and between :data:`COUNTS_START` and :data:`COUNTS_END` with ``counts`` (each where its markers are;
    atomically). Raises ValueError when the file has neither pair in order."""

    text = readme.read_text()
    done = 0
    for start, end, body in ((README_START, README_END, block), (COUNTS_START, COUNTS_END, counts)):
        a, b = text.find(start), text.find(end)
        if body is None or a < 0 or b < a:
            continue
        text = text[: a + len(start)] + "\n" + body + "\n" + text[b:]
        done += 1
    if not done:
        raise ValueError(
            f"{str(readme)!r} has no summary markers; put the lines {README_START!r} and {README_END!r} "
            f"where the table should go (or {COUNTS_START!r} and {COUNTS_END!r} for the counts alone)"
        )
    atomic_write_text(readme, text)


def readme_block(readme: Path, start: str = README_START, end: str = README_END) -> str:
    """The block now in ``readme`` between ``start`` and ``end`` (default: the summary's markers), ''
    without them."""
    text = readme.read_text()
    a, b = text.find(start), text.find(end)
    return text[a + len(start) : b].strip("\n") if 0 <= a < b else ""


def _under(path: Path, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False
