"""Two forms of lmlab's CPU training attention, compared over the whole compiled training step.

``--compare dkdv-sum`` (default): the blocked attention's traced backward, dK and dV summed two ways.
lmlab.kernels.causal_attention._backward_fused adds each query block's contributions to dK and dV (keys
0 .. r1 of the block) as zero-padded terms of one sum (``_sum_padded``), which inductor fuses into one
kernel with one masked load per block. Before (2026-12-03) they were in-place slice adds into fp32
buffers, ``dk[:, :r1] += part``, which inductor lowered to nested slice updates whose kernel reloaded
each block at every level of the nesting. This script keeps that version (``slice_adds_backward``).

``--compare sdpa``: the blocked attention against torch's SDPA kernel (what
lmlab.kernels.causal_attention.use_blocked chooses between; the rule is bypassed here).

``--compare row-copies``: the traced loops' bmm operands as plain row slices of (batch*heads, T,
head_dim) (as before 2026-12-05), against the contiguous block copies the loops now make
(lmlab.kernels.causal_attention._rows): oneDNN's bf16 bmm copies a slice itself, a strided copy.

Both models are built and compiled in one process, then ``--rounds`` rounds of ``--steps`` steps
each, alternating which goes first; the figure is the median over rounds of the first variant's time /
the second's, with its interquartile range (above 1: the second, lmlab's choice for ``dkdv-sum``, is
faster).

    python bench/attention_step_ab.py --recipe gpt2 --dtype bf16 --threads 1
    python bench/attention_step_ab.py --compare sdpa --recipe gpt2 --dtype fp32 --threads 1
    python bench/attention_step_ab.py --compare row-copies --recipe gpt2 --dtype bf16 --threads 2

Dynamo guards on the module globals it reads, so each model keeps the variant it was compiled with as
long as the globals are set back before its steps (done here before every round).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def slice_adds_backward(do, q3, k3, v3, out, probs, scale: float, block: int):
    """The backward loop as it was: the same equations as _backward_fused, dK and dV accumulated by
    in-place slice adds into zero fp32 buffers."""
    T = q3.shape[1]
    acc = torch.promote_types(q3.dtype, torch.float32)
    delta = (do.to(acc) * out.to(acc)).sum(-1)
    dqs = []
    dk = torch.zeros(q3.shape, dtype=acc, device=q3.device)
    dv = torch.zeros(q3.shape, dtype=acc, device=q3.device)
    for i, r0 in enumerate(range(0, T, block)):
        r1 = min(r0 + block, T)
        p, do_i, q_i = probs[i], do[:, r0:r1], q3[:, r0:r1]
        dp = torch.bmm(do_i, v3[:, :r1].transpose(1, 2)).to(acc)
        ds = ((dp - delta[:, r0:r1, None]) * p.to(acc) * scale).to(q3.dtype)
        dqs.append(torch.bmm(ds, k3[:, :r1]))
        dv[:, :r1] += torch.bmm(p.transpose(1, 2), do_i)
        dk[:, :r1] += torch.bmm(ds.transpose(1, 2), q_i)
    return torch.cat(dqs, dim=1), dk.to(q3.dtype), dv.to(q3.dtype)


def variants(compare: str) -> dict:
    """name -> a function that sets the module globals of that variant (the second is lmlab's)."""
    import lmlab.kernels.causal_attention as ca
    import lmlab.model.attention as attention

    padded, rule, rows = ca._backward_fused, ca.use_blocked, ca._rows

    def setter(backward, use_blocked, rows_of=rows):
        def apply():
            ca._backward_fused, attention.use_blocked, ca._rows = backward, use_blocked, rows_of

        return apply

    if compare == "sdpa":
        # use_blocked(q, blocked_fp32) answered the same way whatever the calibration chose
        return {
            "sdpa": setter(padded, lambda q, blocked_fp32=False: False),
            "blocked": setter(padded, lambda q, blocked_fp32=False: True),
        }
    if compare == "row-copies":
        return {"row slices": setter(padded, rule, lambda t, r0, r1: t[:, r0:r1]), "row copies": setter(padded, rule)}
    return {"slice adds": setter(slice_adds_backward, rule), "padded sum": setter(padded, rule)}


def main() -> None:
    from lmlab.argtypes import int_at_least

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", choices=["dkdv-sum", "sdpa", "row-copies"], default="dkdv-sum")
    ap.add_argument("--recipe", choices=["llama", "gpt2", "demo"], default="gpt2")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--threads", type=int_at_least(1), default=1)
    ap.add_argument("--rounds", type=int_at_least(1), default=9)
    ap.add_argument("--steps", type=int_at_least(1), default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from bench.train_vs_peers import RECIPES, Args, make_system

    shape = Args(recipe=a.recipe, **RECIPES[a.recipe])
    dtype = torch.bfloat16 if a.dtype == "bf16" else None
    import lmlab.kernels.causal_attention as ca
    import lmlab.model.attention as attention

    originals = ca._backward_fused, attention.use_blocked, ca._rows  # read before any variant is set
    setters = variants(a.compare)
    names = list(setters)
    systems = {}
    for name in names:
        setters[name]()
        systems[name] = make_system("lmlab", shape, dtype, compile_=True, fused=True)  # runs the first step
        print(f"{name}: first step (compile) {systems[name].compile_s:.1f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(a.rounds + 1):  # round 0 warms both up, untimed
        for name in names if r % 2 else names[::-1]:
            setters[name]()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                systems[name].step()
            if r:
                times[name].append((time.perf_counter() - t0) / a.steps)
    ca._backward_fused, attention.use_blocked, ca._rows = originals  # lmlab's own globals back
    first, second = names
    ratios = [x / y for x, y in zip(times[first], times[second])]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    from bench.train_vs_peers import machine_line

    print(machine_line(a.threads))
    print(f"recipe {a.recipe}, {a.dtype}, compiled step, {a.rounds} rounds x {a.steps} steps, alternated")
    for name in names:
        print(f"  {name:11s} {statistics.median(times[name]) * 1e3:7.1f} ms/step (median)")
    print(f"  {first} / {second}: {statistics.median(ratios):.3f}x (IQR {q1:.3f}-{q3:.3f})")


if __name__ == "__main__":
    main()
