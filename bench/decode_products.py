"""One-row products (a batch-1 decode step's work) in fp32 and bf16, in each weight layout lmlab's decode
can use, side by side in one process: what a precision or layout choice for decoding gains on this CPU.

For each weight shape (out, in) of GPT-2 small (q|k|v 2304x768, out 768x768, MLP 3072x768 and 768x3072,
the LM head 50257x768) and of the demo's fused matrices (q|k|v, gate|up, down, the LM head: the
:data:`SHAPES`), in fp32 and bf16, it times ``y = x W^T`` for one row ``x`` three ways:

- ``plain``: ``F.linear(x, W)`` with W stored (out, in), as training keeps it;
- ``transposed``: ``x @ Wt`` with Wt the (in, out) copy (:mod:`lmlab.kernels.decode_layout`'s batch-1
  layout);
- ``packed``: oneDNN's blocked copy (``torch.ops.mkldnn._reorder_linear_weight`` and
  ``_linear_pointwise``: the layout decode uses at batch >= 2 in fp32), where this torch has it.

Each round times every layout once (``--calls`` products each, after one untimed call), the order
rotating; figures are medians over ``--rounds`` rounds, with the weight bytes read per microsecond
(GB/s) and the largest difference from an fp32 product of the same (rounded) values. Run:

    python bench/decode_products.py [--threads 1] [--rounds 7] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [  # (out, in): GPT-2 small's, then the demo's (fused q|k|v and gate|up, down, LM head)
    (2304, 768),
    (768, 768),
    (3072, 768),
    (768, 3072),
    (50257, 768),
    (1536, 256),
    (1408, 256),
    (256, 704),
    (4096, 256),
]


def layouts(W: torch.Tensor, x: torch.Tensor) -> dict:
    """The products to time for weight ``W`` (out, in) and row ``x`` (1, in), by layout name."""
    Wt = W.t().contiguous()
    out = {"plain": lambda: F.linear(x, W), "transposed": lambda: x @ Wt}
    try:
        Wp = torch.ops.mkldnn._reorder_linear_weight(W, 1)
        torch.ops.mkldnn._linear_pointwise(x, Wp, None, "none", [], "")
        out["packed"] = lambda: torch.ops.mkldnn._linear_pointwise(x, Wp, None, "none", [], "")
    except (AttributeError, RuntimeError):  # no oneDNN packing for this dtype in this torch build
        pass
    return out


def bench_shape(out_f: int, in_f: int, dtype: torch.dtype, rounds: int) -> dict:
    """{layout: (median us, GB/s, max |difference| from fp32)} for one weight shape and dtype."""
    g = torch.Generator().manual_seed(out_f * 7 + in_f)
    W = torch.randn(out_f, in_f, generator=g).to(dtype)
    x = torch.randn(1, in_f, generator=g).to(dtype)
    fns = layouts(W, x)
    ref = F.linear(x.float(), W.float())
    err = {k: (f().float() - ref).abs().max().item() for k, f in fns.items()}
    calls = 200 if out_f * in_f < 3_000_000 else 40
    times: dict = {k: [] for k in fns}
    items = list(fns.items())
    with torch.inference_mode():
        for r in range(rounds):
            for name, f in items[r % len(items) :] + items[: r % len(items)]:
                f()
                t = time.perf_counter()
                for _ in range(calls):
                    f()
                times[name].append((time.perf_counter() - t) / calls * 1e6)
    nbytes = W.numel() * W.element_size()
    return {k: (statistics.median(v), nbytes / statistics.median(v) / 1e3, err[k]) for k, v in times.items()}


def main() -> None:
    from lmlab.bench import describe_machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--markdown", help="also write the table as a page here")
    args = ap.parse_args()
    if args.threads < 1 or args.rounds < 1:
        ap.error("--threads and --rounds must be >= 1")
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    head = (
        f"{datetime.date.today().isoformat()}; machine: {describe_machine()}; load average "
        f"{' '.join(f'{v:.2f}' for v in load)}; {args.rounds} rounds, layouts rotated, medians"
    )
    print(head)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for out_f, in_f in SHAPES:
            res = bench_shape(out_f, in_f, dtype, args.rounds)
            name = str(dtype).removeprefix("torch.")
            cells = {k: f"{us:,.1f} us ({gbs:.1f} GB/s)" for k, (us, gbs, _) in res.items()}
            best = min(res, key=lambda k: res[k][0])
            print(
                f"{name:9} {out_f:>6}x{in_f:<5} " + "  ".join(f"{k} {v}" for k, v in cells.items()) + f"  best {best}"
            )
            rows.append(
                f"| {name} | {out_f} x {in_f} | {cells['plain']} | {cells['transposed']} | "
                f"{cells.get('packed', 'n/a')} | {best} | {max(e for *_, e in res.values()):.1e} |"
            )
    print(f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.markdown:
        page = [
            "# One-row products by precision and layout (generated by bench/decode_products.py)",
            "",
            f"`python bench/decode_products.py {' '.join(sys.argv[1:])}`",
            "",
            head + ".",
            "",
            "| dtype | weight (out x in) | plain (out, in) | transposed (in, out) | oneDNN-packed | fastest | max abs "
            "difference from fp32 |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
        Path(args.markdown).write_text("\n".join(page))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
