"""Whole ``lmlab.evaluate`` calls as they are (a plain model's blocks once, then its LM head and the
cross-entropy a block of some 2^20 logits at a time, ``lmlab.evaluate._nll``) against the code before
2026-12-07 (the whole forward's logits for a batch, then torch's cross-entropy over them), alternated in one
process.

Lab-shaped models (random weights: the time does not depend on them) over a token file (default: the demo
corpus' validation split, ``data/shakespeare-bpe4096/val.bin``, made by ``lmlab prepare``; vocabulary 4,096)
and, for a byte-level vocabulary of 256, over 124,567 random ids. Prints the machine, threads and load, the
bits per byte of both (of a nominal 4 bytes a token: equal up to fp32 rounding), median seconds and the
median of the per-round ratios (before / now: above 1, now is faster) with its IQR. Run:

    python bench/eval_nll.py [--threads 1] [--rounds 9] [--val data/shakespeare-bpe4096/val.bin]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternate import alternate, load_average, paired_ratio  # noqa: E402

import lmlab.evaluate as evaluate_module  # noqa: E402
from lmlab.bench import describe_machine  # noqa: E402
from lmlab.config import ModelConfig  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402

now = evaluate_module._nll


def before(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``lmlab.evaluate``'s loss before 2026-12-07: the whole forward's logits, torch's cross-entropy."""
    return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten(), reduction="none")


def compare(tokens: np.ndarray, vocab: int, d_model: int, n_layers: int, context: int, rounds: int) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, context_length=context, d_model=d_model, n_layers=n_layers, n_heads=4)
    model = TransformerLM(cfg).eval()
    bpb = {}

    def run(name, nll):
        evaluate_module._nll = nll
        try:
            bpb[name] = evaluate_module.evaluate(model, tokens, len(tokens) * 4)["bits_per_byte"]
        finally:
            evaluate_module._nll = now

    times = alternate({"before": lambda: run("before", before), "now": lambda: run("now", now)}, rounds)
    ratio, q1, q3 = paired_ratio(times["before"], times["now"])
    print(
        f"  evaluate, vocab {vocab:,}, d_model {d_model}, {n_layers} layers, context {context}, {len(tokens):,} "
        f"tokens: before {statistics.median(times['before']):.3f} s, now {statistics.median(times['now']):.3f} s: "
        f"{ratio:.3f}x (IQR {q1:.3f}-{q3:.3f}, {rounds} rounds); bits per byte {bpb['before']:.9f} and "
        f"{bpb['now']:.9f}"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--val", type=Path, default=Path("data/shakespeare-bpe4096/val.bin"))
    args = p.parse_args(argv)
    if not args.val.is_file():
        raise SystemExit(f"--val {args.val}: no such file; run `lmlab prepare` or name a uint16 token file")
    torch.set_num_threads(args.threads)
    print(f"machine: {describe_machine()}; load average {load_average()}")
    val = np.memmap(args.val, dtype=np.uint16, mode="r")
    compare(np.random.default_rng(0).integers(0, 256, len(val)).astype(np.uint16), 256, 64, 2, 128, args.rounds)
    compare(val, 4096, 64, 2, 128, args.rounds)
    compare(val, 4096, 128, 4, 256, args.rounds)
    print(f"load average after {load_average()}")


if __name__ == "__main__":
    main()
