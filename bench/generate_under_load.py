"""Decoding on a busy machine: `lmlab generate`'s sampling loop timed on an idle machine and beside a
concurrent CPU job (busy-loop processes), at `lmlab generate`'s default thread count
(``lmlab.kernels.decode_layout.decode_threads``) and at the counts given.

    python bench/generate_under_load.py [--busy 1] [--threads 1 2] [--rounds 5] [--new-tokens 200] [--compile]

The model is the demo config (4.0M parameters) with random weights (decode time does not depend on
training), batch 1, a 16-token prompt, temperature 0.8, top-k 50. Conditions are interleaved per
round (idle / busy, each thread count; the busy-loop processes started and stopped within the round),
the median over rounds is reported with the busy / idle ratio per setting. The busy loop is
``--busy`` pure-Python processes spinning (each takes one core). ``--compile``: the compiled decode step
(``generate(..., compile=True)``, compiled once per thread count before timing; the default thread count
is then ``decode_threads(model, available, compiled=True)``). Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
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
from lmlab.kernels.decode_layout import decode_threads  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402
from lmlab.runs import read_config_file  # noqa: E402
from lmlab.threads import default_threads  # noqa: E402


def spin(stop) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


def decode_seconds(model, threads: int, new_tokens: int, compile: bool = False) -> float:
    torch.set_num_threads(threads)
    prompt = list(range(10, 26))
    t0 = time.perf_counter()
    n = sum(1 for _ in generate(model, prompt, new_tokens, temperature=0.8, top_k=50, seed=0, compile=compile))
    assert n == new_tokens
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--busy", type=int_at_least(1), default=1, help="busy-loop processes in the busy condition")
    p.add_argument(
        "--threads", type=int_at_least(1), nargs="*", default=[1, 2], help="thread counts besides the default"
    )
    p.add_argument("--rounds", type=int_at_least(1), default=5)
    p.add_argument("--new-tokens", type=int_at_least(1), default=200)
    p.add_argument("--compile", action="store_true", help="the compiled decode step (generate compile=True)")
    args = p.parse_args()
    _, model_fields, _ = read_config_file("demo")
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(**model_fields)).eval()
    # what `lmlab generate` uses without --threads
    default = decode_threads(model, default_threads(), compiled=args.compile)
    settings = [("default", default)] + [(str(t), t) for t in args.threads if t != default]
    print(
        f"machine: {describe_machine()}; `lmlab generate`'s default threads for this model {default} "
        f"(compute default {default_threads()}); load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        flush=True,
    )
    for _, t in settings:  # warm-up; compiles the step once per thread count (its key holds the count)
        decode_seconds(model, t, 20, args.compile)
    times: dict = {(name, cond): [] for name, _ in settings for cond in ("idle", "busy")}
    ctx = mp.get_context("spawn")
    for r in range(args.rounds):
        for name, t in settings:
            times[(name, "idle")].append(decode_seconds(model, t, args.new_tokens, args.compile))
        stop = ctx.Event()
        procs = [ctx.Process(target=spin, args=(stop,), daemon=True) for _ in range(args.busy)]
        for proc in procs:
            proc.start()
        time.sleep(1.0)  # let the spinners start
        for name, t in settings:
            times[(name, "busy")].append(decode_seconds(model, t, args.new_tokens, args.compile))
        stop.set()
        for proc in procs:
            proc.join()
        print(f"round {r + 1}: " + ", ".join(f"{n} {c} {v[-1]:.2f} s" for (n, c), v in times.items()), flush=True)
    print(
        f"\n{args.new_tokens} tokens, batch 1, demo model, {'compiled' if args.compile else 'eager'} decode step; "
        f"{args.busy} busy-loop process(es) in 'busy'; "
        f"median of {args.rounds} rounds"
    )
    print("| threads | idle | busy | busy / idle |")
    print("| --- | --- | --- | --- |")
    for name, t in settings:
        idle, busy = statistics.median(times[(name, "idle")]), statistics.median(times[(name, "busy")])
        label = f"{t} (default)" if name == "default" else str(t)
        print(f"| {label} | {idle:.2f} s | {busy:.2f} s | {busy / idle:.2f}x |")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
