"""fp32 linear layers on CPU: torch's default (MKL's sgemm through ``F.linear`` / ``torch.mm``) against
oneDNN's matmul (``lmlab.kernels.linear``), side by side in one process.

For each shape of a training step's linear layers (rows = batch x context) it times the three
products of a linear layer's training step: forward x W^T, input gradient dY W and weight gradient
dY^T x, each with both backends in alternating order; the figure is the median over rounds of the
per-round time ratio MKL / oneDNN (IQR beside it), with both GFLOP/s. The shapes are those of the
recipes' models (every distinct linear layer, the LM head included). It also prints the largest
relative difference of each product from an fp64 reference (both are fp32 with fp32 accumulation).

    python bench/linear_backends.py --threads 1
    python bench/linear_backends.py --threads 2 --rows 1 4 16 64 2048
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def recipe_shapes(recipes: list[str]) -> list[tuple[int, int]]:
    """(in, out) of every distinct linear layer of the recipes' models (bench/train_vs_peers.py),
    the LM head included."""
    from bench.train_vs_peers import RECIPES, Args, lmlab_config
    from lmlab.kernels.linear import Linear
    from lmlab.model import TransformerLM

    shapes = []
    for r in recipes:
        model = TransformerLM(lmlab_config(Args(recipe=r, **RECIPES[r])))
        for m in model.modules():
            if isinstance(m, Linear) and (m.in_features, m.out_features) not in shapes:
                shapes.append((m.in_features, m.out_features))
    return shapes


def products(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, onednn: bool) -> dict:
    """The three products as closures: forward, input gradient, weight gradient."""
    from lmlab.kernels.linear import onednn_grad_input, onednn_grad_weight, onednn_linear

    if onednn:
        return {
            "forward": lambda: onednn_linear(x, w, None),
            "grad input": lambda: onednn_grad_input(g, w),
            "grad weight": lambda: onednn_grad_weight(g, x),
        }
    return {"forward": lambda: x @ w.t(), "grad input": lambda: g @ w, "grad weight": lambda: g.t() @ x}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--recipes", nargs="+", choices=["llama", "gpt2", "demo"], default=["llama", "gpt2"])
    ap.add_argument("--rows", type=int, nargs="+", default=[2048], help="rows of the input (batch x context)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=5, help="calls per timing")
    a = ap.parse_args()
    if a.threads < 1 or a.rounds < 1 or a.reps < 1 or min(a.rows) < 1:
        ap.error("--threads, --rows, --rounds and --reps must be >= 1")
    torch.set_num_threads(a.threads)
    from bench.train_vs_peers import machine_line, quartiles
    from lmlab.kernels.linear import onednn_available

    if not onednn_available():
        sys.exit("this PyTorch build or CPU has no oneDNN linear op (torch.ops.mkldnn._linear_pointwise)")
    print(machine_line(a.threads))
    print(f"{a.rounds} rounds x {a.reps} calls per product and backend, alternating; ratio = MKL time / oneDNN time")
    print("| rows | in | out | product | MKL GFLOP/s | oneDNN GFLOP/s | speed-up (IQR) | max rel. err MKL / oneDNN |")
    print("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for rows in a.rows:
        for d_in, d_out in recipe_shapes(a.recipes):
            x = torch.randn(rows, d_in, generator=gen)
            w = torch.randn(d_out, d_in, generator=gen) / d_in**0.5
            g = torch.randn(rows, d_out, generator=gen)
            ref = {
                "forward": x.double() @ w.double().t(),
                "grad input": g.double() @ w.double(),
                "grad weight": g.double().t() @ x.double(),
            }
            mkl, dnn = products(x, w, g, False), products(x, w, g, True)
            for name in ref:
                flops = 2 * rows * d_in * d_out
                err = [
                    ((f().double() - ref[name]).abs().max() / ref[name].abs().max()).item()
                    for f in (mkl[name], dnn[name])
                ]
                times = {False: [], True: []}
                for r in range(a.rounds):
                    for which in (False, True) if r % 2 == 0 else (True, False):
                        f = dnn[name] if which else mkl[name]
                        f()
                        t0 = time.perf_counter()
                        for _ in range(a.reps):
                            f()
                        times[which].append((time.perf_counter() - t0) / a.reps)
                q1, m, q3 = quartiles([t0 / t1 for t0, t1 in zip(times[False], times[True])])
                rate = {k: flops / statistics.median(v) / 1e9 for k, v in times.items()}
                print(
                    f"| {rows} | {d_in} | {d_out} | {name} | {rate[False]:.0f} | {rate[True]:.0f} | "
                    f"{m:.2f}x ({q1:.2f}-{q3:.2f}) | {err[0]:.1e} / {err[1]:.1e} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
