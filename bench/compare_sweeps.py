"""Paired differences between two sweeps of the same spec: runs matched by name (same variant, tuned
value and seed), ``val_bpb`` of B minus A, per variant and over all pairs, with a t interval.

What it is for: a change that should not alter results (a precision, a machine, a kernel) run as a whole
spec beside the shipped one; each pair differs only in that change, so the mean difference and its
interval say how far the change moves a run's bits/byte, and the spread says how much it reshuffles
seeds. Rows that failed or diverged in either sweep are left out and counted; the pairs with exactly
equal bits/byte (a run reproduced bit for bit) are counted too.

    python bench/compare_sweeps.py A B [--label-a fp32 --label-b bf16] [--seeds 4,5,6,7,8,9]

``--seeds``: only runs of these seeds (e.g. a two-stage spec's compared seeds, at the tuned values).

A and B: a sweep folder (its ``results.jsonl``) or a ``results.csv`` written by ``lmlab report``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats


def rows(path: Path) -> dict:
    """{run name: row} of a sweep folder's results.jsonl or a report's results.csv."""
    if path.is_dir():
        path = path / "results.jsonl"
    if not path.is_file():
        sys.exit(f"{path}: no such results file (give a sweep folder or a results.csv)")
    out = {}
    try:
        if path.suffix == ".csv":
            with open(path, newline="") as f:
                return {r["run"]: r for r in csv.DictReader(f)}
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[r["run"]] = r
    except (ValueError, KeyError, TypeError) as exc:  # a damaged or foreign file: one line naming it
        sys.exit(f"{path}: not a results file lmlab wrote ({type(exc).__name__}: {exc})")
    return out


def usable(r: dict) -> bool:
    return r.get("status") == "ok" and str(r.get("diverged")).lower() in ("false", "0", "none", "")


def summary(diffs: list[float]) -> str:
    n = len(diffs)
    mean = statistics.fmean(diffs)
    if n < 2:
        return f"n {n}, mean {mean:+.4f}"
    sd = statistics.stdev(diffs)
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    widest = max(map(abs, diffs))
    return f"n {n}, mean {mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}], sd {sd:.4f}, |max| {widest:.4f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--seeds", help="comma-separated seeds: only runs of these (default: every run)")
    args = ap.parse_args()
    a, b = rows(args.a), rows(args.b)
    common = sorted(set(a) & set(b))
    if args.seeds:
        try:
            keep = {int(s) for s in args.seeds.split(",")}
        except ValueError:
            ap.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 4,5,6,7,8,9")
        common = [n for n in common if int(a[n]["seed"]) in keep]
    pairs = [n for n in common if usable(a[n]) and usable(b[n])]
    if not pairs:
        raise SystemExit(
            f"compare_sweeps: no run of {args.a} and {args.b} to compare ({len(common)} matched by name"
            f"{' and --seeds' if args.seeds else ''}, none finished in both)"
        )
    print(
        f"{args.label_b} - {args.label_a}, val_bpb of runs matched by name: {len(common)} common runs, "
        f"{len(common) - len(pairs)} left out (failed or diverged in either), {len(set(a) ^ set(b))} in one only"
    )
    by_variant: dict = {}
    for n in pairs:
        by_variant.setdefault(a[n]["variant"], []).append(float(b[n]["val_bpb"]) - float(a[n]["val_bpb"]))
    for variant, diffs in sorted(by_variant.items()):
        print(f"  {variant}: {summary(diffs)}")
    every = [d for ds in by_variant.values() for d in ds]
    # both files keep a float's every digit (repr), so an exact zero means the same bits per byte
    print(f"  all: {summary(every)}; {sum(d == 0 for d in every)} of {len(every)} identical")


if __name__ == "__main__":
    main()
