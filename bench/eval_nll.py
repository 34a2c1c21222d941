"""The evaluation's per-token loss: ``lmlab.kernels.loss.token_nll`` (logsumexp minus the target's logit, a
block of rows at a time) against ``F.cross_entropy(logits.float(), targets, reduction="none")`` (what
``lmlab.evaluate`` used before), alternated in one process.

1. The loss alone, on random fp32 logits of 2,048 rows (a batch of 16 windows of 128 tokens) at several
   vocabulary sizes.
2. Whole ``evaluate`` calls over a token file (default: the demo corpus' validation split,
   ``data/shakespeare-bpe4096/val.bin``, made by ``lmlab prepare``) for lab-shaped models (random weights:
   the time does not depend on them): as ``lmlab.evaluate`` is (the blocks once, then the LM head and
   ``token_nll`` a block of rows at a time) against the whole forward's logits and torch's cross-entropy
   (the code before), swapped between rounds; both give the same bits per byte up to fp32 rounding
   (printed).

Prints the machine, threads and load, median ms and the median of the per-round ratios (cross_entropy /
token_nll: above 1, token_nll is faster) with its IQR. Run:

    python bench/eval_nll.py [--threads 1] [--rounds 9] [--val data/shakespeare-bpe4096/val.bin]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternate import alternate, paired_ratio  # noqa: E402

import lmlab.evaluate as evaluate_module  # noqa: E402
from lmlab.bench import describe_machine  # noqa: E402
from lmlab.config import ModelConfig  # noqa: E402
from lmlab.kernels.loss import token_nll  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets, reduction="none")


def before(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``lmlab.evaluate``'s loss before 2026-12-07: the whole forward's logits, torch's cross-entropy."""
    return cross_entropy(model(x).flatten(0, 1), y.flatten())


lmlab_nll = evaluate_module._nll


def _summary(times: dict, rounds: int) -> str:
    ratio, q1, q3 = paired_ratio(times["cross_entropy"], times["token_nll"])
    return (
        f"cross_entropy {statistics.median(times['cross_entropy']) * 1e3:.2f} ms, token_nll "
        f"{statistics.median(times['token_nll']) * 1e3:.2f} ms: {ratio:.3f}x (IQR {q1:.3f}-{q3:.3f}, {rounds} rounds)"
    )


def loss_alone(rounds: int) -> None:
    for vocab in (256, 4096, 32768, 50257):
        g = torch.Generator().manual_seed(vocab)
        logits, targets = torch.randn(2048, vocab, generator=g), torch.randint(0, vocab, (2048,), generator=g)
        variants = {
            "cross_entropy": lambda: cross_entropy(logits, targets),
            "token_nll": lambda: token_nll(logits, targets),
        }
        print(f"  loss alone, 2,048 rows, vocab {vocab:,}: {_summary(alternate(variants, rounds), rounds)}")


def whole_evaluations(val: Path, rounds: int) -> None:
    tokens = np.memmap(val, dtype=np.uint16, mode="r")
    for d_model, n_layers, context in ((64, 2, 128), (128, 4, 256)):
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=4096, context_length=context, d_model=d_model, n_layers=n_layers, n_heads=4)
        model = TransformerLM(cfg).eval()
        bpb = {}

        def run(name, nll):
            evaluate_module._nll = nll
            try:
                bpb[name] = evaluate_module.evaluate(model, tokens, len(tokens) * 4)["bits_per_byte"]
            finally:
                evaluate_module._nll = lmlab_nll

        variants = {
            "cross_entropy": lambda: run("cross_entropy", before),
            "token_nll": lambda: run("token_nll", lmlab_nll),
        }
        times = alternate(variants, rounds)
        print(
            f"  evaluate, d_model {d_model}, {n_layers} layers, context {context}, vocab 4,096, {len(tokens):,} "
            f"tokens: {_summary(times, rounds)}; bits per byte (of a nominal 4 bytes a token) "
            f"{bpb['cross_entropy']:.7f} and {bpb['token_nll']:.7f}"
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
    print(f"machine: {describe_machine()}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    loss_alone(args.rounds)
    whole_evaluations(args.val, args.rounds)
    print(f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
