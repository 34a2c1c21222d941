"""What each of lmlab's training-step optimisations buys, measured side by side in one process.

Variants, each adding one change to the one before (the last is ``lmlab train`` with compile=true):
  1. baseline: logits materialised + lm_loss, AdamW foreach, SDPA attention (lmlab before issue 14)
  2. + fused AdamW (lmlab.optim.adamw)
  3. + chunked linear cross-entropy (lmlab.kernels.loss, TransformerLM.forward(targets=...))
  4. + blocked causal attention on CPU (lmlab.kernels.causal_attention)
  5. + torch.compile of the model (the blocked attention's loops still eager)
  6. + the blocked attention's loops compiled too: traced into the model's graph (no graph break per
     layer; what a compiled model runs; at fp32 on more than one thread the attention is SDPA, so
     there rows 5 and 6 differ only in that graph break)
  7. + fp32 linear layers (and the chunked loss's products) on oneDNN instead of MKL
     (lmlab.kernels.linear; under bf16 autocast the matmuls are oneDNN's already, so in bf16 rows 6 and 7
     are the same code; lmlab's default except on Intel CPUs, where MKL measured faster and
     ``lmlab train`` runs row 6)
Rounds time ``--steps`` steps of every variant in a rotated order; the figure is the median over
rounds of baseline time / variant time (IQR), and, paired the same way, each row's gain over the row
above (its own share).

    python bench/train_step_gains.py --dtype bf16 --threads 1 [--markdown docs/bench/train_step_gains.md]

``--markdown FILE`` appends the run as a section (command, date, machine line, table) to FILE, making it
with a title when it does not exist; bench/readme_tables.py builds the README's table from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VARIANTS = (
    "baseline",
    "+fused AdamW",
    "+chunked loss",
    "+blocked attention",
    "+compile",
    "+compiled attention loops",
    "+oneDNN fp32 linears",
)


def training_step(fwd, opt, x: torch.Tensor, dtype, chunked_loss: bool = True):
    """A training step's closure over ``fwd`` and ``opt`` on the batch x (batch, context + 1):
    forward (the chunked loss of ``fwd(inputs, targets=...)``, or logits then ``lm_loss``) under
    ``dtype`` autocast (None: fp32), backward, optimiser step (the model's KernelSettings choose its
    kernels; each compiled variant is a model compiled apart: compile_apart).
    Returns (step, seconds of its first call)."""
    from lmlab.model import lm_loss

    inputs, targets = x[:, :-1], x[:, 1:]

    def step():
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            if chunked_loss:
                loss, _ = fwd(inputs, targets=targets)
            else:
                loss, _ = lm_loss(fwd(inputs), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()
    return step, time.perf_counter() - t0


def make_step(level: int, cfg, batch: int, dtype):
    from bench.train_vs_peers import compile_apart
    from lmlab.kernels.settings import KernelSettings, default_kernels
    from lmlab.model import TransformerLM

    torch.manual_seed(0)
    kernels = KernelSettings(
        onednn_fp32=level >= 6, blocked_attention_fp32=default_kernels().blocked_attention_fp32, fused_loops=level >= 5
    )
    model = TransformerLM(cfg, kernels=kernels)
    for block in model.blocks:
        block.attn.blocked_kernel = level >= 3
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True if level >= 1 else None
    )
    fwd = compile_apart(model) if level >= 4 else model
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length + 1))
    return training_step(fwd, opt, x, dtype, chunked_loss=level >= 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=["llama", "gpt2", "demo"], default="llama")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--markdown", metavar="FILE", help="append the table as a section of this markdown page")
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
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for n in order:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                steps[n]()
            times[n].append((time.perf_counter() - t0) / a.steps)
    lines = [
        machine_line(a.threads),
        f"recipe {a.recipe}, {a.dtype}, batch {shape.batch} x {shape.context}; {a.rounds} rounds x {a.steps} steps",
        "| variant | ms/step | speed-up over baseline (IQR) | over the row above (IQR) | first step s |",
        "|---|---|---|---|---|",
    ]
    for i, n in enumerate(VARIANTS):
        q1, m, q3 = quartiles([b / t for b, t in zip(times["baseline"], times[n])])
        p1, pm, p3 = quartiles([b / t for b, t in zip(times[VARIANTS[max(i - 1, 0)]], times[n])])
        lines.append(
            f"| {n} | {statistics.median(times[n]) * 1e3:.1f} | {m:.2f}x ({q1:.2f}-{q3:.2f}) | "
            f"{pm:.2f}x ({p1:.2f}-{p3:.2f}) | {first[n]:.1f} |"
        )
    print("\n".join(lines))
    if a.markdown:
        import datetime
        from pathlib import Path

        page = Path(a.markdown)
        head = (
            ""
            if page.exists()
            else ("# What each training-step change buys (generated by bench/train_step_gains.py)\n")
        )
        cmd = "python bench/train_step_gains.py " + " ".join(sys.argv[1:])
        with page.open("a") as f:
            f.write(
                f"{head}\n## {a.recipe}, {a.dtype}, {a.threads} thread(s)\n\n`{cmd}`, "
                f"{datetime.date.today().isoformat()}\n\n- "
                + "\n- ".join(lines[:2])
                + "\n\n"
                + "\n".join(lines[2:])
                + "\n"
            )
        print(f"appended to {page}")


if __name__ == "__main__":
    main()
