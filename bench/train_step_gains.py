"""What each of lmlab's training-step optimisations buys, measured side by side in one process.

Variants, each adding one change to the one before (the last is ``lmlab train`` with compile=true):
  1. baseline: logits materialised + lm_loss, AdamW foreach, SDPA attention (lmlab before issue 14)
  2. + fused AdamW (lmlab.train.make_optimizer)
  3. + chunked linear cross-entropy (lmlab.model.loss, TransformerLM.forward(targets=...))
  4. + blocked causal attention on CPU (lmlab.model.causal_attention)
  5. + torch.compile of the model
Rounds time ``--steps`` steps of every variant in a rotated order; the figure is the median over
rounds of baseline time / variant time (IQR), so each row's gain over the row above is its share.

    python bench/train_step_gains.py --dtype bf16 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VARIANTS = ("baseline", "+fused AdamW", "+chunked loss", "+blocked attention", "+compile")


def make_step(level: int, cfg, batch: int, dtype):
    from lmlab.model import TransformerLM, lm_loss

    torch.manual_seed(0)
    model = TransformerLM(cfg)
    for block in model.blocks:
        block.attn.blocked_kernel = level >= 3
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True if level >= 1 else None)
    fwd = torch.compile(model) if level >= 4 else model
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length + 1))
    inputs, targets = x[:, :-1], x[:, 1:]

    def step():
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            if level >= 2:
                loss, _ = fwd(inputs, targets=targets)
            else:
                loss, _ = lm_loss(fwd(inputs), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()
    return step, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=["llama", "gpt2", "demo"], default="llama")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    if a.threads < 1 or a.rounds < 1 or a.steps < 1:
        ap.error("--threads, --rounds and --steps must be >= 1")
    torch.set_num_threads(a.threads)
    from bench.train_vs_peers import RECIPES, Args, lmlab_config, machine_line, quartiles

    shape = Args(recipe=a.recipe, **RECIPES[a.recipe])
    cfg = lmlab_config(shape)
    dtype = torch.bfloat16 if a.dtype == "bf16" else None
    steps, first = {}, {}
    for level, name in enumerate(VARIANTS):
        steps[name], first[name] = make_step(level, cfg, shape.batch, dtype)
        steps[name]()
    times = {n: [] for n in VARIANTS}
    for r in range(a.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for n in order:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                steps[n]()
            times[n].append((time.perf_counter() - t0) / a.steps)
    print(machine_line(a.threads))
    print(f"recipe {a.recipe}, {a.dtype}, batch {shape.batch} x {shape.context}; {a.rounds} rounds x {a.steps} steps")
    print("| variant | ms/step | speed-up over baseline (IQR) | first step s |")
    print("|---|---|---|---|")
    for n in VARIANTS:
        q1, m, q3 = quartiles([b / t for b, t in zip(times["baseline"], times[n])])
        print(f"| {n} | {statistics.median(times[n]) * 1e3:.1f} | {m:.2f}x ({q1:.2f}-{q3:.2f}) | {first[n]:.1f} |")


if __name__ == "__main__":
    main()
