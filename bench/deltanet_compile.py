"""Spec 16's hybrid run under ``compile: true``, its Gated DeltaNet recurrence eager or compiled in a graph
of its own (issue 42: the hybrid's runs had gained nothing from compile).

Both trainers are the spec's first hybrid run (bf16 autocast, ``torch.compile``, one thread, the same seed
and data) in one process; they differ only in how the layers' ``_delta_rule`` runs under compile:

- ``eager``: ``torch.compiler.disable(_delta_rule)`` (recursive: the recurrence runs eagerly, a graph break
  around it; lmlab from b65ea65 to this script's commit);
- ``separate``: lmlab's layer as built (``recursive=False``: the recurrence is compiled as a graph of its
  own; lmlab.model.deltanet).

After both have compiled (their first two steps, reported), blocks of ``--steps`` training steps alternate,
``--rounds`` each; per round the ratio eager / separate of the seconds a step. Prints the machine, threads,
load, the medians and the paired ratio's median and IQR, and the two trainers' losses at the end (they
train the same batches, so they should agree to bf16 rounding).

    python bench/deltanet_compile.py --rounds 10 --steps 5
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5, help="training steps a block")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    from bench.train_vs_peers import quartiles
    from lmlab.bench import describe_machine
    from lmlab.data.shards import TokenData
    from lmlab.lab.plan import plan_runs
    from lmlab.lab.spec import load_spec
    from lmlab.model import deltanet
    from lmlab.train import Trainer

    torch.set_num_threads(args.threads)
    p = next(q for q in plan_runs(load_spec("16-hybrid-linear-attention")) if q.cfg.layer_pattern)
    tc = dataclasses.replace(p.tc, dtype="bf16", compile=True)
    data = TokenData(p.data)
    load0 = os.getloadavg()
    print(f"machine: {describe_machine()}; load average {' '.join(f'{x:.2f}' for x in load0)}")
    print(
        f"run: {p.name} (d_model {p.cfg.d_model}, layers {p.cfg.layer_pattern}, batch {tc.batch_size} x "
        f"{p.cfg.context_length}), bf16 autocast, torch.compile, {args.threads} thread(s)"
    )
    ways = {"eager": torch.compiler.disable(deltanet._delta_rule), "separate": None}
    trainers = {}
    work = tempfile.TemporaryDirectory(prefix="lmlab-gdn-")  # the trainers' run folders, removed at exit
    for name, fn in ways.items():
        torch.manual_seed(0)
        tr = Trainer(Path(work.name) / name, p.cfg, tc, data, progress=False)
        if fn is not None:
            for m in tr.model.modules():
                if isinstance(m, deltanet.GatedDeltaNet):
                    m._delta_rule = fn
        t = time.perf_counter()
        tr.train_step(), tr.train_step()
        print(f"{name}: first two steps (compile included) {time.perf_counter() - t:.1f} s")
        trainers[name] = tr
    sec = {n: [] for n in trainers}
    for r in range(args.rounds):
        for n in list(trainers) if r % 2 == 0 else list(trainers)[::-1]:
            t = time.perf_counter()
            for _ in range(args.steps):
                out = trainers[n].train_step()
            sec[n].append((time.perf_counter() - t) / args.steps)
            if out.get("skipped"):
                raise SystemExit(f"{n}: a non-finite step at {trainers[n].step}")
    for n, v in sec.items():
        print(f"{n}: {statistics.median(v) * 1e3:.1f} ms a step (median of {args.rounds} blocks of {args.steps})")
    lo, mid, hi = quartiles([a / b for a, b in zip(sec["eager"], sec["separate"])])
    print(f"eager / separate: {mid:.3f}x (IQR {lo:.3f}-{hi:.3f}) over {args.rounds} paired rounds")
    print("last losses: " + ", ".join(f"{n} {tr.train_step()['loss']:.5f}" for n, tr in trainers.items()))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work.cleanup()


if __name__ == "__main__":
    main()
