"""The compiled decode step with Inductor's ``freezing`` against lmlab's decode paths and HF, GPT-2 small
(124M) in bf16, batch 1, whole calls alternated in one process.

With ``freezing`` (``torch._inductor.config.patch(freezing=True)`` while the step compiles, under inference
mode) Inductor takes the model's weights as constants of the graph and, on a CPU with oneDNN, multiplies bf16
linears by weights it packs for oneDNN itself (``mkldnn._linear_pointwise``); without it the compiled step
multiplies by the transposed copies through MKL (``lmlab.kernels.compiled_decode``), which on the CPUs
measured was slower at this size than the eager step over oneDNN-packed weights (docs/usage.md). Inductor
refuses packed weights passed to a graph as inputs (its oneDNN linear lowering asserts they are constants), so
freezing is the way to packed products inside the graph. A frozen graph reads no weight at call time: it would
go stale when the weights change. (Measured before lmlab's compiled step froze where calibrated: with a
calibration that has ``decode_frozen``, ``compiled`` below is itself frozen where it chose so; the
measurements in docs/bench/decode_freezing.md were made with one that had not.)

Variants per round, in rotated order: ``eager`` (lmlab's eager step in the layout this machine's
calibration chose), ``compiled`` (``compile=True`` as shipped), ``compiled, frozen`` (the same step
compiled with ``freezing``, on a copy of the model), ``HF`` (``generate``, SDPA, bf16). Figures: median
ms per whole call (prompt 32 tokens, 64 new), HF's time / the variant's with IQR over rounds.

    python bench/decode_freezing.py --threads 1 2 --rounds 5
    python bench/decode_freezing.py --logits

``--logits``: instead of timing, 48 teacher-forced steps (the same forced ids for every variant) after the
32-token prompt, each variant's logits against the fp32 eager model's: max and mean absolute difference,
and how often the top-1 id is fp32's.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from decode_vs_hf import build_gpt2_pair  # noqa: E402

from lmlab.bench import describe_machine, random_prompts  # noqa: E402
from lmlab.generate import stream_batch  # noqa: E402
from lmlab.kernels import compiled_decode  # noqa: E402


def compare_logits(steps: int = 48) -> None:
    """Print each bf16 variant's logits against the fp32 eager model's, over ``steps`` teacher-forced steps."""
    import lmlab.generate as generate

    torch.set_num_threads(2)
    ours, hf, cfg = build_gpt2_pair(0)
    del hf
    ours = ours.eval()
    prompt = random_prompts(cfg.vocab_size, 1, 32, seed=1)
    forced = torch.randint(0, cfg.vocab_size, (steps,), generator=torch.Generator().manual_seed(5)).tolist()
    shipped = generate.sample_next

    def run(model, compile: bool, freeze: bool = False) -> torch.Tensor:
        seen = []

        def forced_next(logits, *args, **kwargs):
            seen.append(logits.float().clone())
            return torch.tensor([forced[len(seen) - 1]])

        generate.sample_next = forced_next
        try:
            with torch._inductor.config.patch(freezing=freeze):
                list(generate.stream_batch(model, prompt, steps, temperature=0.0, compile=compile))
        finally:
            generate.sample_next = shipped
        return torch.stack(seen)[:, 0]  # (steps, vocab)

    ref = run(ours, False)
    print(f"machine: {describe_machine()}")
    print(f"GPT-2 small, prompt 32, {steps} teacher-forced steps; logits against the fp32 eager model's")
    print("| variant | max abs diff | mean abs diff | top-1 as fp32 |")
    print("| --- | --- | --- | --- |")
    for name, compile, freeze in [
        ("bf16 eager", False, False),
        ("bf16 compiled (shipped)", True, False),
        ("bf16 compiled, frozen", True, True),
    ]:
        got = run(copy.deepcopy(ours).to(torch.bfloat16), compile, freeze)
        d = (got - ref).abs()
        top = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
        print(f"| {name} | {d.max().item():.3e} | {d.mean().item():.3e} | {top:.0%} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--logits", action="store_true", help="compare logits with fp32's instead of timing")
    args = ap.parse_args()
    if args.logits:
        return compare_logits()
    ours, hf, cfg = build_gpt2_pair(0)
    ours, hf = ours.to(torch.bfloat16).eval(), hf.to(torch.bfloat16).eval()
    frozen = copy.deepcopy(ours)
    shipped = compiled_decode._compiled_fn

    def with_freezing(model, padded, tying=()):
        if model is not frozen:
            return shipped(model, padded, tying)
        key = ("frozen", padded, torch.get_num_threads(), tying)
        fns = compiled_decode._COMPILED.setdefault(model, {})
        if key not in fns:
            own = types.FunctionType(compiled_decode._step.__code__.replace(), compiled_decode._step.__globals__)
            options = {"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe}
            fns[key] = torch.compile(own, fullgraph=True, dynamic=None, options=options)
        return fns[key]

    def frozen_call():
        # freezing as a config patch around the calls that compile: passed in torch.compile's options
        # instead, the step took 1,710 ms a call against 970 (2 threads; the options reach Inductor after
        # the graph's parameters were already lifted as inputs)
        with torch._inductor.config.patch(freezing=True):
            return lmlab_call(frozen, True)

    compiled_decode._compiled_fn = with_freezing
    prompt = random_prompts(cfg.vocab_size, 1, 32, seed=1)

    def lmlab_call(model, compile):
        return [int(t) for t in stream_batch(model, prompt, args.new_tokens, temperature=0.0, compile=compile)]

    def hf_call():
        with torch.inference_mode():
            out = hf.generate(
                torch.tensor(prompt),
                attention_mask=torch.ones(1, 32, dtype=torch.long),
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return out[0, 32:].tolist()

    variants = {
        "eager": lambda: lmlab_call(ours, False),
        "compiled": lambda: lmlab_call(ours, True),
        "compiled, frozen": frozen_call,
        "HF": hf_call,
    }
    print(f"machine: {describe_machine()}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"GPT-2 small, bf16, batch 1, prompt 32, {args.new_tokens} new tokens, greedy; {args.rounds} rotated rounds")
    print(
        "| threads | variant | ms per call (median) | HF's time / this one (IQR) | first call, s "
        "| greedy tokens as eager |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for threads in args.threads:
        torch.set_num_threads(threads)
        first, tokens = {}, {}
        for name, run in variants.items():
            t = time.perf_counter()
            tokens[name] = run()
            first[name] = time.perf_counter() - t
            run()  # warm
        times = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - t)
        for name in names:
            ratios = [h / t for h, t in zip(times["HF"], times[name])]
            q = statistics.quantiles(ratios, n=4)
            same = sum(a == b for a, b in zip(tokens[name], tokens["eager"])) / len(tokens["eager"])
            print(
                f"| {threads} | {name} | {statistics.median(times[name]) * 1e3:,.1f} | "
                f"**{statistics.median(ratios):.2f}x** ({q[0]:.2f}-{q[2]:.2f}) | {first[name]:.1f} | {same:.0%} |",
                flush=True,
            )
    print(f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
