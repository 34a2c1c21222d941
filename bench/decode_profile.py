"""Where an eager decode step's time goes, fp32 against bf16: ``torch.profiler`` over lmlab's greedy decode
(``stream_batch``, the KV cache after a 32-token prompt) at batch 1, the weights in each dtype and in the
layout this machine's calibration chose (``decode_layout_kind``), and the ops that took the most self CPU
time (the ops' own time: the Python between them is in the step time only), grouped as the products
(``aten::mm``/``addmm``/``linear`` or oneDNN's ``_linear_pointwise``),
attention over the cache (``aten::bmm``), casts (``_to_copy``, ``copy_``) and the rest.

Each dtype's step time is the median of ``--rounds`` timed calls of ``--steps`` steps (profiler off),
then one profiled call; the dtypes alternate by round. Run:

    python bench/decode_profile.py [--model demo|gpt2] [--threads 1] [--steps 64] [--markdown FILE]
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
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_vs_hf import build_gpt2_pair, demo_config  # noqa: E402

from lmlab.bench import describe_machine  # noqa: E402
from lmlab.generate import stream_batch  # noqa: E402
from lmlab.kernels.decode_layout import decode_layout_kind  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402

GROUPS = {  # op name -> group
    "aten::mm": "products",
    "aten::addmm": "products",
    "aten::linear": "products",
    "mkldnn::_linear_pointwise": "products",
    "aten::bmm": "attention bmm",
    "aten::_to_copy": "casts and copies",
    "aten::copy_": "casts and copies",
    "aten::empty_strided": "casts and copies",
}


def timed_call(model, prompts, steps: int) -> float:
    """ms per decode step over one call of ``steps`` steps after the prompt."""
    it = stream_batch(model, prompts, steps + 1, temperature=0.0)
    next(it)
    t = time.perf_counter()
    for _ in it:
        pass
    return (time.perf_counter() - t) / steps * 1e3


def profiled_call(model, prompts, steps: int) -> dict:
    """{op name: (self CPU us per step, calls per step)} over one profiled call."""
    it = stream_batch(model, prompts, steps + 1, temperature=0.0)
    next(it)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in it:
            pass
    return {e.key: (e.self_cpu_time_total / steps, e.count / steps) for e in prof.key_averages()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["demo", "gpt2"], default="demo")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--markdown", metavar="FILE")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.model == "demo":
        torch.manual_seed(0)
        base = TransformerLM(demo_config()).eval()
    else:
        base = build_gpt2_pair()[0]
    cfg = base.cfg
    if 32 + args.steps > cfg.context_length:
        raise SystemExit(f"--steps {args.steps}: 32 + steps exceeds the context {cfg.context_length}")
    models = {"fp32": base}
    models["bf16"] = TransformerLM(cfg).eval()
    models["bf16"].load_state_dict(base.state_dict())
    models["bf16"].to(torch.bfloat16)
    prompts = [list(range(1, 33))]
    load0 = os.getloadavg()
    with torch.inference_mode(False):
        for m in models.values():
            timed_call(m, prompts, 4)  # warm-up: the decode copies made
        times: dict = {k: [] for k in models}
        for r in range(args.rounds):
            for k in list(models) if r % 2 == 0 else list(models)[::-1]:
                times[k].append(timed_call(models[k], prompts, args.steps))
        profiles = {k: profiled_call(m, prompts, args.steps) for k, m in models.items()}
    lines = [
        f"# Eager decode step profile: {args.model}, batch 1, {args.threads} thread(s)",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {describe_machine()}; load average "
        f"{load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after. `python bench/decode_profile.py --model "
        f"{args.model} --threads {args.threads} --steps {args.steps} --rounds {args.rounds}`.",
        "",
        "| dtype | weight layout | ms per step (median of rounds) | products | attention bmm | casts and copies "
        "| rest | op time profiled (Python between ops not counted) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k, m in models.items():
        groups: dict = {}
        for name, (us, _) in profiles[k].items():
            g = GROUPS.get(name, "rest")
            groups[g] = groups.get(g, 0.0) + us
        total = sum(groups.values())
        cell = lambda g: f"{groups.get(g, 0.0) / 1e3:.3f} ms ({100 * groups.get(g, 0.0) / total:.0f}%)"  # noqa: E731
        lines.append(
            f"| {k} | {decode_layout_kind(m, 1)} | {statistics.median(times[k]):.3f} | {cell('products')} | "
            f"{cell('attention bmm')} | {cell('casts and copies')} | {cell('rest')} | {total / 1e3:.3f} ms |"
        )
    lines += ["", "Top ops by self CPU time per step:", "", "| dtype | op | us per step | calls per step |"]
    lines.append("| --- | --- | --- | --- |")
    for k in models:
        top = sorted(profiles[k].items(), key=lambda kv: -kv[1][0])[:8]
        lines += [f"| {k} | `{name}` | {us:.1f} | {n:.0f} |" for name, (us, n) in top]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
