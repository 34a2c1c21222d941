"""Several small runs per GPU (issue 43 item 4): the same sweep with ``--runs-per-gpu 1`` and ``K``, timed.

Run on a machine with an NVIDIA GPU and submitit, from the repository root:

    python bench/gpu_packing.py --out OUT [--data data/shakespeare-bpe4096] [--k 4] [--runs 8]

One spec of ``--runs`` small runs (two variants x seeds, one fixed rate; d_model 256, 4 layers, context 256,
batch 16, bf16 on CUDA) is swept through ``lmlab sweep --executor submitit-local --gpus-per-task 1
--jobs 1`` twice per round: one run per task (the runs one after another on the GPU) and ``--runs-per-gpu
K`` (K runs of a task training at once on the one GPU, CPUs split between them). The two arms alternate
within each of ``--rounds`` rounds (the order flips each round); the figure is the median of the per-round
ratios of wall times (runs per hour, packed / one at a time). Each arm's rows are compared run by run
(bits/byte; CUDA's embedding backward is not bitwise deterministic, so the largest difference is printed,
not asserted). Writes OUT/gpu_packing.md and OUT/gpu_packing.json.

``--device cpu --steps 4`` runs the same code on a CPU with --gpus-per-task 0 (a check of this script)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmlab.bench import describe_machine  # noqa: E402
from lmlab.lab.results import read_results  # noqa: E402


def spec(data: Path, runs: int, steps: int, device: str) -> dict:
    seeds = list(range(1, runs // 2 + 1))
    gpu = device == "cuda"
    return {
        "name": "gpu-packing",
        "claim": "SwiGLU beats GELU at equal non-embedding parameters.",
        "model": (
            {"context_length": 256, "d_model": 256, "n_layers": 4, "n_heads": 4}
            if gpu
            else {"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2}
        ),
        "train": {
            "batch_size": 16 if gpu else 4,
            "lr": 3e-3,
            "warmup_steps": max(1, steps // 10),
            "log_interval": max(1, steps // 10),
            "eval_interval": steps,
            "eval_windows": 8,
            "device": device,
            "dtype": "bf16" if gpu else "fp32",
            "checkpoint_interval": steps,
        },
        "data": str(data),
        "axes": {"zip": [{"label": "GELU", "activation": "gelu"}, {"label": "SwiGLU", "activation": "swiglu"}]},
        "seeds": seeds,
        "budget": {"steps": steps},
        "eval_contexts": [1],
    }


def sweep(path: Path, out: Path, k: int, gpus: int, cpus: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "lmlab.cli",
        "sweep",
        str(path),
        "--out",
        str(out),
        "--executor",
        "submitit-local",
        "--jobs",
        "1",
        "--gpus-per-task",
        str(gpus),
        "--cpus-per-task",
        str(cpus),
        "--runs-per-gpu",
        str(k),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("data/shakespeare-bpe4096"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", type=int, default=4, help="runs per GPU in the packed arm")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=8, help="--cpus-per-task in both arms")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine()
    if args.device == "cuda":
        import torch

        machine += f", {torch.cuda.get_device_name()}"
    print(machine, flush=True)
    path = args.out / "spec.yaml"
    path.write_text(yaml.safe_dump(spec(args.data.resolve(), args.runs, args.steps, args.device), sort_keys=False))
    gpus = 1 if args.device == "cuda" else 0
    rounds, rows = [], {}
    for r in range(args.rounds):
        arms = [1, args.k] if r % 2 == 0 else [args.k, 1]
        t = {}
        for k in arms:
            folder = args.out / f"r{r}-k{k}"
            t[k] = sweep(path, folder, k, gpus, args.cpus)
            rows[(r, k)] = {row["run"]: row for row in read_results(folder)}
            print(
                f"round {r}: --runs-per-gpu {k}: {args.runs} runs in {t[k]:.1f} s "
                f"({3600 * args.runs / t[k]:.0f} runs/hour)",
                flush=True,
            )
        rounds.append({"one": t[1], "packed": t[args.k], "ratio": t[1] / t[args.k]})
    ratios = [x["ratio"] for x in rounds]
    diffs = [
        abs(rows[(r, 1)][n]["val_bpb"] - rows[(r, args.k)][n]["val_bpb"])
        for r in range(args.rounds)
        for n in rows[(r, 1)]
    ]
    statuses = sorted({row["status"] for rr in rows.values() for row in rr.values()})
    bpb = [row["val_bpb"] for rr in rows.values() for row in rr.values()]
    result = {
        "machine": machine,
        "runs": args.runs,
        "steps": args.steps,
        "k": args.k,
        "cpus_per_task": args.cpus,
        "rounds": rounds,
        "median_ratio": statistics.median(ratios),
        "max_abs_diff_bpb": max(diffs),
        "statuses": statuses,
        "val_bpb_range": [min(bpb), max(bpb)],
    }
    (args.out / "gpu_packing.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"machine: {machine}",
        f"{args.runs} runs of {args.steps} steps; --cpus-per-task {args.cpus}; "
        f"rows' statuses {statuses}; val bits/byte {min(bpb):.4f}-{max(bpb):.4f}",
        "",
        "| round | one run per task, s | --runs-per-gpu %d, s | runs per hour, packed / one |" % args.k,
        "|---|---|---|---|",
    ]
    lines += [f"| {i} | {x['one']:.1f} | {x['packed']:.1f} | {x['ratio']:.2f}x |" for i, x in enumerate(rounds)]
    lines += [
        "",
        f"median ratio {statistics.median(ratios):.2f}x over {args.rounds} rounds; largest |difference| "
        f"in a run's bits/byte between the arms {max(diffs):.2e}",
    ]
    (args.out / "gpu_packing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
