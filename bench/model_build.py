"""Building a real-size model on the meta device (``lmlab analyze --scale real``, the presets' parameter
counts): lmlab's build against torch's defaults, alternated in one process.

Two things make a build of tens of thousands of modules slow without computing anything:
- ``nn.Linear`` and ``nn.Embedding`` draw their default initialisation in ``__init__``; on the meta device
  there are no values, yet each draw goes through torch's meta decompositions. lmlab's ``Linear`` and
  ``Embedding`` skip it there (``TransformerLM.reset_parameters`` draws every weight itself on a real
  device);
- the objects a build allocates trigger Python's cyclic garbage collector, whose collections walk every
  live object of the process: the more a process already holds (a test suite, a notebook), the longer.
  ``TransformerLM`` pauses it while it builds its blocks (``lmlab.model.transformer._gc_paused``).

``torch`` here: both of those as torch and Python do by default (nn's draws, collector on). ``--ballast
N`` keeps N million small live objects in the process, as a long-running one holds. Each round builds
each preset once per variant, alternating which goes first; the figure is the median over rounds of
torch's build time over lmlab's, with its interquartile range.

    python bench/model_build.py --rounds 5 --ballast 0 2
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lmlab.bench import describe_machine  # noqa: E402
from lmlab.kernels.embedding import Embedding  # noqa: E402
from lmlab.kernels.linear import Linear  # noqa: E402
from lmlab.model import transformer  # noqa: E402
from lmlab.model.transformer import TransformerLM  # noqa: E402
from lmlab.presets import preset_config  # noqa: E402


@contextlib.contextmanager
def torch_defaults():
    """nn.Linear's and nn.Embedding's own draws on the meta device, the collector left on."""
    saved = Linear.reset_parameters, Embedding.reset_parameters, transformer._gc_paused
    Linear.reset_parameters, Embedding.reset_parameters = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    transformer._gc_paused = contextlib.nullcontext
    try:
        yield
    finally:
        Linear.reset_parameters, Embedding.reset_parameters, transformer._gc_paused = saved


def build_s(name: str) -> float:
    cfg = preset_config(name, "real")
    t = time.perf_counter()
    with torch.device("meta"):
        model = TransformerLM(cfg)
    s = time.perf_counter() - t
    del model
    gc.collect()
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", default=["qwen3-next-80b-a3b", "deepseek-v3", "llama-3-8b"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ballast", type=float, nargs="+", default=[0.0, 2.0], help="millions of live objects")
    args = ap.parse_args()
    print(f"machine: {describe_machine()}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| live objects held | preset | torch's build, s (median) | lmlab's build, s | torch / lmlab (IQR) |")
    print("| --- | --- | --- | --- | --- |")
    for millions in args.ballast:
        ballast = [[{} for _ in range(100)] for _ in range(int(millions * 1e4))]
        for name in args.presets:
            build_s(name)  # warm: imports, decompositions, allocator
            ratios, ours, theirs = [], [], []
            for r in range(args.rounds):
                pair = {}
                for variant in ("torch", "lmlab") if r % 2 == 0 else ("lmlab", "torch"):
                    with torch_defaults() if variant == "torch" else contextlib.nullcontext():
                        pair[variant] = build_s(name)
                ours.append(pair["lmlab"])
                theirs.append(pair["torch"])
                ratios.append(pair["torch"] / pair["lmlab"])
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
            print(
                f"| {millions:g}M | {name} | {statistics.median(theirs):.2f} | {statistics.median(ours):.2f} | "
                f"**{statistics.median(ratios):.2f}x** ({q[0]:.2f}-{q[2]:.2f}) |",
                flush=True,
            )
        del ballast
    print(f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
