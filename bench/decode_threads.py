"""How many threads batch-1 decoding wants, by model size: `generate` timed at each thread count on
LLaMA-style models of growing width and depth (random weights), the counts alternated per round.

    python bench/decode_threads.py [--threads 1 2] [--rounds 5] [--new-tokens 100] [--compile]
        [--dtype fp32|bf16] [--sizes 0 1 2 3]

It measures what ``lmlab bench calibrate``'s ``decode_threads`` decision decides on a machine (and where
``lmlab.kernels.decode_layout.DECODE_WEIGHTS_PER_THREAD``, the rule of an uncalibrated one, came from):
whether a second thread pays, by the model's weights per token; ``--compile``: the compiled step, compiled
once per thread count before timing, in the layout this machine's calibration chooses (printed per size).
``--sizes`` picks rows of ``SIZES`` by index. Prints the machine, threads and load average; run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lmlab.argtypes import int_at_least  # noqa: E402
from lmlab.bench import describe_machine  # noqa: E402
from lmlab.config import ModelConfig  # noqa: E402
from lmlab.generate import generate  # noqa: E402
from lmlab.kernels.decode_layout import decode_layout_kind  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402

SIZES = [(256, 4, 8), (512, 8, 8), (768, 12, 12), (1024, 16, 16)]  # d_model, n_layers, n_heads


def seconds(model, threads: int, new_tokens: int, compile: bool = False) -> float:
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    for _ in generate(model, list(range(10, 26)), new_tokens, temperature=0.8, top_k=50, seed=0, compile=compile):
        pass
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int_at_least(1), nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int_at_least(1), default=5)
    p.add_argument("--new-tokens", type=int_at_least(1), default=100)
    p.add_argument("--compile", action="store_true", help="time the compiled decode step (generate compile=True)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument(
        "--sizes", type=int, nargs="+", choices=range(len(SIZES)), default=list(range(len(SIZES))), help="rows of SIZES"
    )
    args = p.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(f"machine: {describe_machine()}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'compiled' if args.compile else 'eager'} decode step, {args.dtype}, batch 1, {args.new_tokens} tokens")
    print(
        "| d_model x layers | weights per token | layout | "
        + " | ".join(f"{t} thread(s), ms/token" for t in args.threads)
        + f" | {args.threads[-1]} / {args.threads[0]} threads |"
    )
    print("|" + " --- |" * (4 + len(args.threads)))
    for d, L, H in [SIZES[i] for i in args.sizes]:
        cfg = ModelConfig(
            vocab_size=4096,
            context_length=256,
            d_model=d,
            n_layers=L,
            n_heads=H,
            n_kv_heads=H // 2,
            tie_embeddings=True,
        )
        torch.manual_seed(0)
        model = TransformerLM(cfg).eval().to(dtype)
        weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        for t in args.threads:  # warm-up; compiles the step once per thread count (its key holds the count)
            seconds(model, t, 10, args.compile)
        layout = decode_layout_kind(model, 1, compiled=args.compile)
        times = {t: [] for t in args.threads}
        for r in range(args.rounds):
            order = args.threads if r % 2 == 0 else list(reversed(args.threads))
            for t in order:
                times[t].append(seconds(model, t, args.new_tokens, args.compile))
        med = {t: statistics.median(v) * 1000 / args.new_tokens for t, v in times.items()}
        ratio = statistics.median(b / a for a, b in zip(times[args.threads[0]], times[args.threads[-1]]))
        print(
            f"| {d} x {L} | {weights / 1e6:.1f}M | {layout} | "
            + " | ".join(f"{med[t]:.2f}" for t in args.threads)
            + f" | {ratio:.2f}x |",
            flush=True,
        )
    print(f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
