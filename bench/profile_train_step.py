"""Where a training step's time goes: torch.profiler over lmlab's training step, CPU time grouped by
kind of work (matmuls, attention, norms / activations / RoPE, cross-entropy, optimizer, the rest).

    python bench/profile_train_step.py                     # LLaMA-style, d_model 256, 4 layers, 1 thread
    python bench/profile_train_step.py --recipe gpt2 --threads 2 --dtype bf16 --top 25

"Self" CPU time of each aten op is summed into its group; "python / other" is the step's wall time
minus the ops' self time (Python, dispatch, the autograd engine's own work). Shares are of the median
step wall time. The model, loss and optimizer are the ones ``lmlab train`` uses (lmlab.train.Trainer's
step without data loading), built by bench/train_vs_peers.py's ``make_system``; ``--system hf`` (or
litgpt, nanogpt) profiles a peer's step the same way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

GROUPS = (  # (group, substrings of aten op names), first match wins
    ("cross-entropy", ("log_softmax", "nll_loss", "cross_entropy", "logsumexp", "gather", "scatter_add", "exp_")),
    # lmlab's blocked attention is batched matmuls (bmm) and a softmax; the model's linears are mm/addmm
    (
        "attention",
        (
            "scaled_dot_product",
            "flash_attention",
            "_efficient_attention",
            "softmax",
            "bmm",
            "baddbmm",
            "masked_fill",
            "triu",
        ),
    ),
    ("matmul", ("mm", "matmul", "linear", "addmm")),
    ("optimizer", ("_foreach", "_fused_adam", "addcdiv", "lerp", "sqrt", "clip_grad", "norm")),
    (
        "norms/activations/RoPE",
        (
            "rms_norm",
            "layer_norm",
            "silu",
            "gelu",
            "mul",
            "add",
            "cat",
            "neg",
            "rsqrt",
            "pow",
            "mean",
            "addcmul",
            "sigmoid",
            "relu",
            "tanh",
            "sub",
            "div",
            "sum",
            "amax",
            "where",
        ),
    ),
    ("embedding", ("embedding",)),
    (
        "copies/casts/layout",
        (
            "copy_",
            "to",
            "clone",
            "contiguous",
            "transpose",
            "view",
            "reshape",
            "permute",
            "expand",
            "slice",
            "select",
            "_unsafe_view",
            "t",
            "fill_",
            "zero_",
            "empty",
            "zeros",
            "ones",
            "detach",
            "as_strided",
        ),
    ),
)


def group_of(name: str) -> str:
    op = name.split("::")[-1]
    base = op.strip("_")  # mul_ is mul, _softmax is softmax
    for group, keys in GROUPS:
        if base in keys or any(len(k) > 3 and k in op for k in keys):
            return group
    return "other ops"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=["llama", "gpt2", "demo"], default="llama")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--top", type=int, default=15, help="also list the N ops with the most self time")
    ap.add_argument("--system", default="lmlab", help="lmlab or a peer of bench/train_vs_peers.py")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--nanogpt", help="folder with nanoGPT's model.py (--system nanogpt)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from bench.train_vs_peers import RECIPES, Args, make_system
    from lmlab.bench import describe_machine

    shape = Args(recipe=a.recipe, nanogpt=a.nanogpt, **RECIPES[a.recipe])
    shape.batch, shape.context = a.batch, a.context
    dtype = torch.bfloat16 if a.dtype == "bf16" else None
    s = make_system(a.system, shape, dtype, compile_=a.compile, fused=a.compile)
    for _ in range(3):
        s.step()
    walls = []
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(a.steps):
            t0 = time.perf_counter()
            s.step()
            walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    totals: dict[str, float] = defaultdict(float)
    per_op: dict[str, float] = defaultdict(float)
    mm_flops = mm_us = 0.0  # the matrix products torch counts FLOPs for (aten::mm, addmm, bmm, baddbmm)
    for ev in prof.key_averages():
        if not ev.key.startswith(("aten::", "mkldnn::")):  # mkldnn: lmlab's fp32 linears (oneDNN)
            continue
        us = ev.self_cpu_time_total / a.steps
        totals[group_of(ev.key)] += us
        per_op[ev.key] += us
        if ev.flops:
            mm_flops += ev.flops / a.steps
            mm_us += us
    ops = sum(totals.values()) / 1e6
    load = os.getloadavg()
    print(f"machine: {describe_machine()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        f"{a.system}{' + compile' if a.compile else ''}, recipe {a.recipe}, {a.dtype}, batch {a.batch}, "
        f"context {a.context}: "
        f"median step {wall * 1e3:.1f} ms (under the profiler)"
    )
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    for g, us in rows:
        print(f"  {g:24s} {us / 1e3:8.2f} ms  {us / 1e6 / wall:6.1%}")
    print(f"  {'python / other':24s} {(wall - ops) * 1e3:8.2f} ms  {(wall - ops) / wall:6.1%}")
    if mm_us:
        print(
            f"matrix products with a FLOP count (aten mm/addmm/bmm/baddbmm; oneDNN's mkldnn linears have none): "
            f"{mm_flops / 1e9:.1f} GFLOP a step in {mm_us / 1e3:.1f} ms, {mm_flops / mm_us / 1e3:.0f} GFLOP/s "
            f"({mm_us / 1e6 / wall:.1%} of the step)"
        )
    if a.top:
        print(f"top {a.top} ops by self CPU time per step:")
        for k, us in sorted(per_op.items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"  {k:40s} {us / 1e3:8.2f} ms  {group_of(k)}")


if __name__ == "__main__":
    main()
