"""What ``compile_scope`` costs and buys: the whole model compiled against each block compiled apart.

Two figures for the demo recipe's training step (forward with the chunked loss, backward, fused
AdamW), both as ``lmlab train`` runs them (``torch.compile(model)`` or ``lmlab.compile_choice.compile_blocks``):
  1. cold compile: the first step of a fresh process with an empty inductor cache (a temporary
     TORCHINDUCTOR_CACHE_DIR), once per scope and repeat, processes alternated;
  2. step time once compiled: both compiled in one process, rounds of ``--steps`` steps each in a
     rotated order; the median over rounds of blocks / whole (IQR beside it).

    python bench/compile_scope.py --dtype bf16 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SCOPES = ("model", "blocks")


def make_step(scope: str, dtype):
    """A demo-recipe training step with ``scope`` compiled; returns (step, seconds of its first call)."""
    from bench.train_step_gains import training_step
    from lmlab.compile_choice import compile_blocks
    from lmlab.config import ModelConfig
    from lmlab.config_files import load_mapping
    from lmlab.model import TransformerLM
    from lmlab.runs import BUILTIN_CONFIGS

    cfg = ModelConfig.from_dict({**load_mapping(BUILTIN_CONFIGS / "demo.yaml")["model"], "vocab_size": 4096})
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    if scope == "blocks":
        compile_blocks(model)
        fwd = model
    else:
        fwd = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    x = torch.randint(0, cfg.vocab_size, (16, cfg.context_length + 1))
    return training_step(fwd, opt, x, dtype)


def cold_compile(scope: str, a) -> float:
    """First-step seconds of ``scope`` in a fresh process with an empty inductor cache."""
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--dtype",
                a.dtype,
                "--threads",
                str(a.threads),
                "--first-step-of",
                scope,
            ],
            capture_output=True,
            text=True,
            env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONWARNINGS="ignore"),
        )
    if out.returncode:
        raise SystemExit(f"{scope}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cold-repeats", type=int, default=2, help="fresh processes per scope (0: skip)")
    ap.add_argument("--first-step-of", choices=SCOPES, help=argparse.SUPPRESS)  # the child of cold_compile
    a = ap.parse_args()
    if a.threads < 1 or a.rounds < 1 or a.steps < 1 or a.cold_repeats < 0:
        ap.error("--threads, --rounds and --steps must be >= 1, --cold-repeats >= 0")
    torch.set_num_threads(a.threads)
    from bench.train_vs_peers import machine_line, quartiles
    from lmlab.devices import keep_freed_memory

    keep_freed_memory()  # as lmlab train does on CPU
    dtype = torch.bfloat16 if a.dtype == "bf16" else None
    if a.first_step_of:
        print(make_step(a.first_step_of, dtype)[1])
        return
    print(machine_line(a.threads))
    print(f"demo recipe, {a.dtype}, batch 16 x 256 tokens")
    cold = {s: [] for s in SCOPES}
    for _ in range(a.cold_repeats):
        for scope in SCOPES:
            cold[scope].append(cold_compile(scope, a))
    for scope in SCOPES if a.cold_repeats else ():
        print(
            f"cold compile (first step, empty cache) {scope:>6}: " + ", ".join(f"{t:.1f}" for t in cold[scope]) + " s"
        )
    steps = {s: make_step(s, dtype)[0] for s in SCOPES}
    for step in steps.values():
        for _ in range(3):
            step()
    times = {s: [] for s in SCOPES}
    for r in range(a.rounds):
        for scope in SCOPES[r % 2 :] + SCOPES[: r % 2]:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                steps[scope]()
            times[scope].append((time.perf_counter() - t0) / a.steps)
    ratio = [b / m for b, m in zip(times["blocks"], times["model"])]
    q1, med, q3 = quartiles(ratio)
    for scope in SCOPES:
        print(f"step {scope:>6}: {1000 * statistics.median(times[scope]):.1f} ms (median of {a.rounds} rounds)")
    print(f"blocks / model step time: {med:.3f}x (IQR {q1:.3f}-{q3:.3f})")
    print(machine_line(a.threads))


if __name__ == "__main__":
    main()
