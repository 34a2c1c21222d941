"""The blocked attention's compiled loops against its eager loops, in a whole compiled training step.

Two lmlab models (bench/train_vs_peers.py's make_system: the step ``lmlab train`` runs, compiled, fused
AdamW) are stepped with ``KernelSettings.fused_loops`` on (the loops traced into the
model's one graph) and off (the eager loops behind a graph break per layer) in alternating order,
``--steps`` steps each per round; the figure is the median over rounds of the per-round ratio
(eager-loop step time / fused-loop step time) with its IQR, and the compiled regions per step of each
(each model compiled apart and stepped with one value of the flag). fp32 takes the blocked
attention only at one thread (lmlab.kernels.causal_attention.use_blocked), so ``--dtype fp32
--threads 2`` times SDPA twice: a check of the method's own bias.

    python bench/fused_attention_loops.py --recipe gpt2 --dtype bf16 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    from lmlab.argtypes import int_at_least

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=["llama", "gpt2", "demo"], default="gpt2")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--threads", type=int_at_least(1), default=2)
    ap.add_argument("--rounds", type=int_at_least(2), default=11)
    ap.add_argument("--steps", type=int_at_least(1), default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from dataclasses import replace

    from bench.train_vs_peers import RECIPES, Args, machine_line, make_system, quartiles
    from lmlab.kernels.settings import default_kernels

    shape = Args(recipe=a.recipe, nanogpt=None, **RECIPES[a.recipe])
    systems, regions = {}, {}
    for fused in (True, False):  # one model per setting, compiled apart (compile_apart)
        systems[fused] = make_system(
            "lmlab",
            shape,
            torch.bfloat16 if a.dtype == "bf16" else None,
            compile_=True,
            fused=True,
            kernels=replace(default_kernels(), fused_loops=fused),
        )
        systems[fused].step()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            systems[fused].step()  # compiled regions per step: 1 with the fused loops (no graph break)
        regions[fused] = sum(ev.count for ev in prof.key_averages() if ev.key == "CompiledFunction")
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(a.rounds):
        for fused in (True, False) if r % 2 == 0 else (False, True):
            t0 = time.perf_counter()
            for _ in range(a.steps):
                systems[fused].step()
            times[fused].append((time.perf_counter() - t0) / a.steps)
    q1, m, q3 = quartiles([e / f for e, f in zip(times[False], times[True])])
    print(machine_line(a.threads))
    print(
        f"recipe {a.recipe}, {a.dtype}, batch {shape.batch} x {shape.context}, compiled; "
        f"{a.rounds} rounds x {a.steps} steps, alternating order"
    )
    print(
        f"eager loops {statistics.median(times[False]) * 1e3:.1f} ms/step ({regions[False]} compiled "
        f"regions), fused loops {statistics.median(times[True]) * 1e3:.1f} ms/step ({regions[True]}): "
        f"speed-up {m:.3f}x (IQR {q1:.3f}-{q3:.3f})"
    )


if __name__ == "__main__":
    main()
