"""What Muon costs per training step against AdamW, side by side in one process.

One model (the demo recipe by default: ``lmlab train``'s step, chunked loss, compiled) and two optimisers
over it, built as ``lmlab train`` builds them (``lmlab.optim.build_optimizer``): AdamW for every
parameter, and Muon on the blocks' matrices with AdamW on the rest. Rounds time ``--steps`` whole steps
(forward, backward, optimiser) of each in a rotated order, and the optimiser's ``step()`` alone; the
figure is the median over rounds of the per-round ratio Muon / AdamW (IQR beside it).

    python bench/optimizer_step.py --recipe demo --dtype bf16 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

OPTIMIZERS = ("adamw", "muon")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=["llama", "gpt2", "demo"], default="demo")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="time the eager model")
    a = ap.parse_args()
    if a.threads < 1 or a.rounds < 1 or a.steps < 1:
        ap.error("--threads, --rounds and --steps must be >= 1")
    torch.set_num_threads(a.threads)
    from bench.train_vs_peers import RECIPES, Args, lmlab_config, machine_line, quartiles
    from lmlab.model import TransformerLM
    from lmlab.optim import build_optimizer, muon_parameters, param_groups
    from lmlab.train import TrainConfig

    shape = Args(recipe=a.recipe, **RECIPES[a.recipe])
    cfg = lmlab_config(shape)
    dtype = torch.bfloat16 if a.dtype == "bf16" else None
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    fwd = model if a.no_compile else torch.compile(model)
    opts = {}
    for name in OPTIMIZERS:
        tc = TrainConfig(optimizer=name, lr=1e-4)
        opts[name] = build_optimizer(model, param_groups(model, tc), tc, torch.device("cpu"))
    x = torch.randint(0, cfg.vocab_size, (shape.batch, cfg.context_length + 1))
    inputs, targets = x[:, :-1], x[:, 1:]
    opt_s = {n: [] for n in OPTIMIZERS}

    def step(name: str) -> None:
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss, _ = fwd(inputs, targets=targets)
        loss.backward()
        t0 = time.perf_counter()
        opts[name].step()
        opt_s[name].append(time.perf_counter() - t0)
        opts[name].zero_grad(set_to_none=True)

    for name in OPTIMIZERS:  # compile, allocate optimiser state
        step(name)
        step(name)
    times = {n: [] for n in OPTIMIZERS}
    for n in OPTIMIZERS:
        opt_s[n].clear()
    for r in range(a.rounds):
        for n in OPTIMIZERS if r % 2 == 0 else OPTIMIZERS[::-1]:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step(n)
            times[n].append((time.perf_counter() - t0) / a.steps)
    n_muon = sum(p.numel() for p in muon_parameters(model))
    n_all = sum(p.numel() for p in model.parameters())
    q1, m, q3 = quartiles([mu / ad for ad, mu in zip(times["adamw"], times["muon"])])
    lines = [
        machine_line(a.threads),
        f"recipe {a.recipe}, {a.dtype}, batch {shape.batch} x {shape.context}, "
        f"{'eager' if a.no_compile else 'compiled'}; Muon on {n_muon:,} of {n_all:,} parameters; "
        f"{a.rounds} rounds x {a.steps} steps",
        "| optimizer | ms/step | optimizer step() ms |",
        "|---|---|---|",
    ]
    for n in OPTIMIZERS:
        lines.append(f"| {n} | {statistics.median(times[n]) * 1e3:.1f} | {statistics.median(opt_s[n]) * 1e3:.1f} |")
    lines.append(f"Muon / AdamW step time: {m:.3f}x (IQR {q1:.3f}-{q3:.3f})")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
