"""Where the compiled batch-1 decode step's time goes at the demo shape: the generated kernel, Inductor's
Python wrapper around it, Dynamo's and AOT autograd's code around that, and lmlab's decode loop.

One demo-shape model (random weights, ``bench/decode_vs_hf.py``'s), --dtype, one greedy ``stream_batch``
call to compile the step (``compile=True``, the layout this machine's calibration chose); then, each
--steps times in a row and --rounds rounds, alternated:

- ``through Dynamo``: the compiled step as lmlab calls it (``torch.compile``'s function: guards, the code
  that gathers the graph's inputs, AOT autograd's runtime wrapper, Inductor's ``call``), one step at a
  fixed cache position;
- ``Inductor's call``: the same graph's ``CompiledFxGraph`` called directly with the inputs Dynamo passed it
  (captured on one call): Inductor's Python wrapper (buffer allocations) and its kernels;
- ``generated call``: the generated module's ``call`` alone (``CompiledFxGraph.current_callable``, without
  ``CompiledFxGraph.__call__``'s per-call bookkeeping): what a call's later steps run since 2026-12-07 15:40;
- ``kernels``: the generated C++ kernels alone, the time Python's profiler attributes to them within
  ``Inductor's call`` (their own time, excluding the wrapper);
- ``whole call`` and ``whole call, free step``: a ``stream_batch`` call (prompt --prompt-len tokens,
  --new-tokens new), and the same with the compiled step replaced by one returning fixed logits: the
  prefill and lmlab's loop around the step (sampling, the weights' checks, the cache index); the prefill
  (eager, into a new cache) is also timed alone.

Prints the machine, threads and load, medians over rounds (ms; per step, or per call) and the weight-read
floor (``bench/decode_vs_hf.py``'s: every weight a step multiplies by read once). The graph and its inputs
are the ones lmlab's own first step captures (``lmlab.kernels.compiled_decode._first_step``). Run:

    python bench/decode_overhead.py [--threads 1 2] [--dtype fp32|bf16] [--rounds 7]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternate import load_average  # noqa: E402
from decode_vs_hf import build_pair, read_floor  # noqa: E402

from lmlab.bench import describe_machine, random_prompts  # noqa: E402
from lmlab.generate import stream_batch  # noqa: E402
from lmlab.kernels import compiled_decode  # noqa: E402
from lmlab.kernels.decode_layout import decode_layout, decode_layout_kind  # noqa: E402
from lmlab.model import KVCache  # noqa: E402


def _ms(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def _kernel_ms(call, n: int) -> float:
    """ms per ``call()`` spent in generated kernels: functions named ``kernel`` of Inductor's compiled modules
    (their own time under cProfile, which counts a C function's time without the profiler's per-Python-call
    overhead inside it)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        call()
    prof.disable()
    stats = pstats.Stats(prof).stats
    own = sum(v[2] for (file, _line, name), v in stats.items() if "kernel" in name and "built-in method" in name)
    return own / n * 1e3


def measure(threads: int, dtype: torch.dtype, rounds: int, steps: int, prompt_len: int, new_tokens: int) -> None:
    torch.set_num_threads(threads)
    model, hf, cfg = build_pair(0)
    del hf
    model = model.to(dtype)
    prompts = random_prompts(cfg.vocab_size, 1, prompt_len, seed=1)

    def call():
        with torch.inference_mode():
            return list(stream_batch(model, prompts, new_tokens, temperature=0.0, compile=True))

    t = time.perf_counter()
    call()
    print(
        f"{threads} thread(s), {str(dtype).replace('torch.', '')}: compiled step "
        f"({decode_layout_kind(model, 1, compiled=True)}) compiled in {time.perf_counter() - t:.1f} s"
    )
    (key, fn) = next(iter(compiled_decode._COMPILED[model].items()))
    length = prompt_len + new_tokens - 1
    with torch.inference_mode(), decode_layout(model, 1, compiled=True):
        cache = KVCache(cfg, 1, length, dtype=dtype)
        model.hidden(torch.tensor([prompts[0]]), cache)
        for tensor in cache.k + cache.v:
            torch._dynamo.mark_dynamic(tensor, 2)
        idx, pos = torch.tensor([[5]]), torch.tensor(cache.length)
        _, direct = compiled_decode._first_step(fn, model, idx, cache)  # the graph and the inputs Dynamo gave it
        if direct is None:
            raise SystemExit("the compiled step's Inductor graph was not seen: nothing to time directly")
        graph, inputs = direct.graph, direct.inputs
        free = torch.zeros(1, cfg.vocab_size)
        rows: dict = {k: [] for k in ("dynamo", "inductor", "run", "kernels", "call", "free", "prefill")}
        ids = torch.tensor([prompts[0]])
        for _ in range(rounds):
            rows["prefill"].append(
                _ms(lambda: model.logits(model.hidden(ids, KVCache(cfg, 1, length, dtype=dtype))[:, -1]), 20)
            )
            rows["dynamo"].append(_ms(lambda: fn(model, idx, pos, cache.k, cache.v, None), steps))
            rows["inductor"].append(_ms(lambda: graph(list(inputs)), steps))
            rows["run"].append(_ms(lambda: direct.run(list(inputs)), steps))
            rows["kernels"].append(_kernel_ms(lambda: graph(list(inputs)), steps))
    for _ in range(rounds):
        rows["call"].append(_ms(call, 3))
        compiled_decode._COMPILED[model][key] = lambda *a: free
        rows["free"].append(_ms(call, 3))
        compiled_decode._COMPILED[model][key] = fn
    m = {k: statistics.median(v) for k, v in rows.items()}
    floor = read_floor(model) * 1e3
    print(
        f"  per step (ms): through Dynamo {m['dynamo']:.3f}, Inductor's call {m['inductor']:.3f}, generated call "
        f"{m['run']:.3f}, kernels {m['kernels']:.3f}; weight-read floor {floor:.3f}\n"
        f"  around the kernels (ms a step): Dynamo and AOT autograd {m['dynamo'] - m['inductor']:.3f}, "
        f"CompiledFxGraph's bookkeeping {m['inductor'] - m['run']:.3f}, "
        f"Inductor's Python wrapper {m['run'] - m['kernels']:.3f}\n"
        f"  whole call {m['call']:.2f} ms; with a free step {m['free']:.2f} ms (the prefill, {m['prefill']:.2f} ms "
        f"alone, and lmlab's loop around {new_tokens - 1} steps)"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=300, help="steps timed in a row per round and variant")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    print(f"machine: {describe_machine()}; load average {load_average()}")
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    for threads in args.threads:
        measure(threads, dtype, args.rounds, args.steps, args.prompt_len, args.new_tokens)
    print(f"load average after {load_average()}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
