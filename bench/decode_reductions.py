"""The compiled batch-1 decode step by fused reductions against the same step over transposed weights
(MKL), alternated in one process: the A/B behind ``KernelSettings.decode_reductions``
(:mod:`lmlab.kernels.decode_layout`'s 'row-reductions').

Two copies of one model (the demo shape with random weights, or GPT-2 small through lmlab's importer as in
``bench/decode_vs_hf.py``), in --dtype, one with kernels that choose the reductions for its cell, one
without; each compiled once (the time printed), then --rounds rounds of one greedy ``stream_batch`` call each
(--prompt-len tokens, --new-tokens new), the order alternating. Prints the machine, threads and load, the
share of greedy tokens equal to the eager step's, the median call times and the median of the per-round
ratios (transposed / reductions: above 1, the reductions are faster) with its IQR. Run:

    python bench/decode_reductions.py [--model demo|gpt2] [--dtype fp32|bf16] [--threads 1] [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_vs_hf import build_gpt2_pair, demo_config  # noqa: E402

from lmlab.bench import describe_machine  # noqa: E402
from lmlab.generate import stream_batch  # noqa: E402
from lmlab.kernels.decode_layout import decode_layout_kind  # noqa: E402
from lmlab.kernels.settings import REDUCTION_CELLS, KernelSettings  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["demo", "gpt2"], default="demo")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    if args.threads < 1 or args.rounds < 3 or args.prompt_len < 1 or args.new_tokens < 2:
        ap.error("--threads and --prompt-len must be >= 1, --rounds >= 3, --new-tokens >= 2")
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    if args.model == "gpt2":
        base = build_gpt2_pair()[0]
        cfg = base.cfg
    else:
        cfg = demo_config()
        base = TransformerLM(cfg)
    if args.prompt_len + args.new_tokens - 1 > cfg.context_length:
        ap.error(f"--prompt-len + --new-tokens - 1 exceeds the context of {cfg.context_length}")
    base.set_kernels(KernelSettings(False, False))
    transposed = base.eval().to(dtype)
    reduced = TransformerLM(
        cfg, kernels=KernelSettings(False, False, decode_reductions=[(c, 1, True) for c in REDUCTION_CELLS])
    ).eval()
    reduced.load_state_dict(transposed.state_dict())
    reduced.to(dtype)
    models = {"transposed": transposed, "reductions": reduced}
    assert decode_layout_kind(reduced, 1, compiled=True) == "row-reductions"
    assert decode_layout_kind(transposed, 1, compiled=True) == "transposed"
    prompt = [torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()]

    def call(model, compile=True):
        return [int(t) for t in stream_batch(model, prompt, args.new_tokens, temperature=0, compile=compile)]

    load0 = os.getloadavg()
    print(f"machine: {describe_machine()}; load average {' '.join(f'{v:.2f}' for v in load0)}")
    print(
        f"model: {args.model}, {transposed.num_params():,} params, {args.dtype}; batch 1, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, {args.rounds} alternated rounds"
    )
    eager = call(transposed, compile=False)
    for name, model in models.items():
        t = time.perf_counter()
        ids = call(model)
        same = sum(a == b for a, b in zip(ids, eager)) / len(eager)
        print(f"  {name}: first compiled call {time.perf_counter() - t:.1f} s; greedy ids equal to eager {same:.1%}")
    times: dict = {name: [] for name in models}
    for r in range(args.rounds):
        for name in list(models) if r % 2 == 0 else list(models)[::-1]:
            t = time.perf_counter()
            call(models[name])
            times[name].append(time.perf_counter() - t)
    ratios = [a / b for a, b in zip(times["transposed"], times["reductions"])]
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    print(
        f"  call ms: transposed {1e3 * statistics.median(times['transposed']):.1f}, reductions "
        f"{1e3 * statistics.median(times['reductions']):.1f}; transposed / reductions "
        f"{statistics.median(ratios):.3f}x (IQR {q[0]:.3f}-{q[2]:.3f})"
    )
    print(f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
