"""lmlab's compiled decode step now against the same file at an earlier commit, whole greedy calls alternated
in one process: the A/B behind a change to ``lmlab/kernels/compiled_decode.py``.

The earlier ``lmlab/kernels/compiled_decode.py`` is read from git (``git show REV:...``) and loaded as a
module of its own; ``lmlab.generate`` is pointed at one or the other before each call. Two copies of one
demo-shape model (random weights, ``bench/decode_vs_hf.py``'s), --dtype, each compiled once by its own
version; then --rounds rounds of one ``stream_batch`` call each (prompt --prompt-len tokens, --new-tokens
new), the order alternating. Everything else (lmlab.generate, the decode layout, the model) is the working
tree's. Prints the machine, threads and load, whether the two give the same greedy tokens, median call
times and the median of the per-round ratios (earlier / now: above 1, now is faster) with its IQR. Run:

    python bench/compiled_decode_ab.py --against c0f4ab7 [--threads 1 2] [--rounds 31] [--dtype fp32|bf16]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternate import alternate, load_average, paired_ratio  # noqa: E402
from decode_vs_hf import build_pair  # noqa: E402

import lmlab.generate as generate  # noqa: E402
from lmlab.bench import describe_machine, random_prompts  # noqa: E402
from lmlab.kernels import compiled_decode  # noqa: E402


def load_at(rev: str):
    """``lmlab/kernels/compiled_decode.py`` as it was at git revision ``rev``, as a module of its own.
    Raises SystemExit naming the revision when git cannot show the file there."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:lmlab/kernels/compiled_decode.py"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(
            f"--against {rev}: git cannot show lmlab/kernels/compiled_decode.py there: {out.stderr.strip()}"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(out.stdout)
    spec = importlib.util.spec_from_file_location(f"compiled_decode_at_{rev}", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.unlink(f.name)
    return module


def measure(earlier, rev: str, threads: int, dtype: torch.dtype, args) -> None:
    torch.set_num_threads(threads)
    model, hf, cfg = build_pair(0)
    del hf
    now_model = model.to(dtype)
    then_model = copy.deepcopy(now_model)
    prompts = random_prompts(cfg.vocab_size, 1, args.prompt_len, seed=1)
    versions = {rev: (earlier, then_model), "now": (compiled_decode, now_model)}

    def call(name):
        module, m = versions[name]
        generate.compiled_decoder = module.compiled_decoder
        try:
            with torch.inference_mode():
                return torch.stack(
                    list(generate.stream_batch(m, prompts, args.new_tokens, temperature=0.0, compile=True)), 1
                )
        finally:
            generate.compiled_decoder = compiled_decode.compiled_decoder

    same = torch.equal(call(rev), call("now"))  # (each compiles here)
    times = alternate({rev: lambda: call(rev), "now": lambda: call("now")}, args.rounds)
    ratio, q1, q3 = paired_ratio(times[rev], times["now"])
    print(
        f"{threads} thread(s), {str(dtype).replace('torch.', '')}: {rev} {statistics.median(times[rev]) * 1e3:.2f} ms "
        f"a call, now {statistics.median(times['now']) * 1e3:.2f} ms; {rev} / now {ratio:.3f}x "
        f"(IQR {q1:.3f}-{q3:.3f}), {args.rounds} rounds; same greedy tokens: {same}"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=True, help="the git revision to compare with, e.g. a commit hash")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    earlier = load_at(args.against)
    print(f"machine: {describe_machine()}; load average {load_average()}")
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    for threads in args.threads:
        measure(earlier, args.against, threads, dtype, args)
    print(f"load average after {load_average()}")


if __name__ == "__main__":
    main()
