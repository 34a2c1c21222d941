"""Trained runs per hour for the lab's own run shapes: where a sweep run's time goes, and what a plain
PyTorch loop of the same model costs (issue 42, item 3).

For each spec (default: every shipped CPU-tier spec), its first planned run (the baseline variant at the
first learning rate, seed 1: the spec's real model, batch, steps and evaluation) is trained and
evaluated as a sweep does (:func:`lmlab.lab.worker.train_run`, then
:func:`lmlab.lab.results.collect_result`), ``--threads`` torch threads (1, as ``--jobs 2`` on 2 cores
gives each run), each round in two ways, alternated:

- ``fork``: the run forked from lmlab's fork server (:mod:`lmlab.lab.fork_server`, the default);
- ``exec``: ``python -m lmlab.cli train``, a new Python per run (the lab before the fork server).

``--compare dtype`` alternates two precisions instead, both forked: the spec's run as planned in fp32
and the same run in bf16 autocast (its ``dtype`` changed, nothing else; the final evaluation in fp32 for
both, as the lab evaluates); ``--compare compile`` alternates bf16 eager and bf16 with ``compile: true``
(the compile's own seconds counted in the run, as a sweep pays them); ``--compare lab`` alternates the
lab as issue 42 found it (exec, fp32, eager, also for a spec that now sets ``compile: true``) and both
changes together (fork, bf16, eager), ``--compare lab-compiled``
the same with the forked runs compiled (``lmlab sweep --dtype bf16 --compile``: the fork server compiles
each shape once, in the first run's wall time).

A run's seconds are split into: process (the training process's time outside its loop: Python's and
torch's start, imports, model, optimizer and data, the last checkpoint, exit), steps (the training
loop's step time, from metrics.jsonl, checkpoints included), in-loop evaluations (the rest of the loop),
and the final evaluation (the full validation split, in the sweep's process). The fork server's own start (once
per sweep process) is reported apart.

``--plain`` also times, in this process, ``--plain-steps`` steps of a plain PyTorch loop of the same
model (lmlab's TransformerLM, ``torch.optim.AdamW``, random windows of the same data, the spec's
precision) and the same loop under bf16 autocast, and prints the per-step figures beside the trainer's.

Runs per hour assume ``--jobs 2`` on 2 cores: 2 x 3600 / a run's seconds (each run alone on its core).

    python bench/lab_throughput.py --rounds 3 --plain --markdown docs/bench/lab_throughput.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


ARMS = {  # --compare: {arm: (launch, TrainConfig fields changed)}, the reference first
    "launch": {"exec": ("exec", {}), "fork": ("fork", {})},
    "dtype": {"fp32": ("fork", {"dtype": "fp32"}), "bf16": ("fork", {"dtype": "bf16"})},
    # the lab as issue 42 found it: exec-launched, fp32, eager (also for a spec that sets compile: true)
    "lab": {
        "exec fp32": ("exec", {"dtype": "fp32", "compile": False}),
        "fork bf16": ("fork", {"dtype": "bf16", "compile": False}),
    },
    "lab-compiled": {
        "exec fp32": ("exec", {"dtype": "fp32", "compile": False}),
        "fork bf16 compiled": ("fork", {"dtype": "bf16", "compile": True}),
    },
    "compile": {
        "bf16": ("fork", {"dtype": "bf16", "compile": False}),
        "bf16+compile": ("fork", {"dtype": "bf16", "compile": True}),
    },
}


def with_train(p, changes: dict):
    """Plan ``p`` with its TrainConfig's ``changes`` applied (same name, model, data and steps)."""
    import dataclasses

    return dataclasses.replace(p, tc=dataclasses.replace(p.tc, **changes)) if changes else p


def one_run(spec, p, threads: int, launch: str, work: Path) -> dict:
    """Train and evaluate plan ``p`` as a sweep does; its seconds split into parts."""
    from lmlab.lab.results import collect_result, training_summary
    from lmlab.lab.worker import EvalSettings, train_run, write_plan
    from lmlab.threads import set_threads

    sweep = work / f"{launch}-{time.monotonic_ns()}"
    sweep.mkdir(parents=True)
    write_plan(sweep, p, spec)
    t0 = time.time()
    diverged, error = train_run(sweep, p, threads, launch=launch)
    t1 = time.time()
    if error:
        raise SystemExit(f"{spec.name}: {error}")
    run_dir = sweep / "runs" / p.name
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in recs if r.get("elapsed_s") is not None and "tokens_per_s" in r]
    loop_s = timed[-1]["elapsed_s"]
    steps_s, prev = 0.0, 0
    for r in timed:  # each logged window: its steps at its own rate
        steps_s += (r["step"] - prev) * p.tokens_per_step / r["tokens_per_s"]
        prev = r["step"]
    set_threads(threads)
    t2 = time.time()
    collect_result(p, run_dir, EvalSettings.of(spec), diverged, None)
    eval_s = time.time() - t2
    summary = training_summary(run_dir)
    shutil.rmtree(sweep)
    return {
        "total": (t1 - t0) + eval_s,
        "process": (t1 - t0) - loop_s,
        "steps": steps_s,
        "loop_side": loop_s - steps_s,
        "final_eval": eval_s,
        "train_loss": summary["final_train_loss"],
    }


def plain_steps(p, n: int, threads: int, bf16: bool) -> float:
    """Seconds per step of a plain PyTorch loop of ``p``'s model (median of 3 blocks of ``n`` steps)."""
    import numpy as np
    import torch

    from lmlab.data.shards import TokenData
    from lmlab.model import TransformerLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = TransformerLM(p.cfg)
    opt = torch.optim.AdamW(
        model.parameters(), lr=p.tc.lr, betas=(p.tc.beta1, p.tc.beta2), weight_decay=p.tc.weight_decay
    )
    tokens = TokenData(p.data).tokens("train")
    T, B, rng = p.cfg.context_length, p.tc.batch_size, np.random.default_rng(0)

    def step():
        starts = rng.integers(0, len(tokens) - T - 1, B)
        w = torch.from_numpy(np.stack([np.asarray(tokens[s : s + T + 1], dtype=np.int64) for s in starts]))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = model(w[:, :-1], targets=w[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), p.tc.grad_clip or float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    blocks = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            step()
        blocks.append((time.perf_counter() - t) / n)
    return statistics.median(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", nargs="*", help="spec names or files (default: every shipped spec but the GPU-only)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plain", action="store_true", help="also time a plain PyTorch loop, fp32 and bf16")
    ap.add_argument("--plain-steps", type=int, default=20)
    ap.add_argument("--markdown", help="write the report here too")
    ap.add_argument(
        "--compare",
        choices=sorted(ARMS),
        default="launch",
        help="what the alternated arms differ in: launch (exec vs fork, default), dtype (fp32 vs bf16, forked), "
        "compile (bf16 eager vs bf16 compiled, forked), lab (exec fp32 vs fork bf16), lab-compiled (exec fp32 vs "
        "fork bf16 compiled)",
    )
    args = ap.parse_args()
    arms = ARMS[args.compare]
    ref, other = list(arms)

    import torch

    from bench.train_vs_peers import quartiles
    from lmlab.bench import describe_machine
    from lmlab.lab.fork_server import ForkServer
    from lmlab.lab.plan import plan_runs
    from lmlab.lab.spec import builtin_specs, load_spec
    from lmlab.param_counts import param_counts

    torch.set_num_threads(args.threads)
    names = args.specs or [n for n in sorted(builtin_specs()) if not n.startswith("16")]
    t = time.perf_counter()
    ForkServer.get().start(["--version"], Path(os.devnull), dict(os.environ)).wait()
    server_s = time.perf_counter() - t
    load0 = os.getloadavg()
    lines = [
        "# Lab throughput (generated by bench/lab_throughput.py)",
        "",
        f"`python bench/lab_throughput.py {' '.join(sys.argv[1:])}`, {time.strftime('%Y-%m-%d')}; "
        f"machine: {describe_machine()}; load average {' '.join(f'{x:.2f}' for x in load0)}; "
        f"{args.rounds} rounds, {ref} and {other} alternated; the fork server's own start {server_s:.1f} s "
        f"(once per sweep process).",
        "",
        "| spec | steps | tokens/param | arm | run s | process | steps | evaluations in loop | "
        f"final eval | runs/hour (--jobs 2) | {ref} / {other} (IQR) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    plain_lines = []
    pooled = []
    loss_notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            spec = load_spec(name)
            p = plan_runs(spec)[0]
            tpp = p.steps * p.tokens_per_step / param_counts(p.cfg)["non_embedding"]
            res = {arm: [] for arm in arms}
            for r in range(args.rounds):
                for arm in (other, ref) if r % 2 == 0 else (ref, other):
                    launch, changes = arms[arm]
                    res[arm].append(one_run(spec, with_train(p, changes), args.threads, launch, Path(tmp)))
                    print(f"{spec.name} round {r + 1} {arm}: {res[arm][-1]['total']:.2f} s", flush=True)
            ratios = [e["total"] / f["total"] for e, f in zip(res[ref], res[other])]
            pooled += ratios
            q1, med, q3 = quartiles(ratios)
            for arm in (ref, other):
                m = {k: statistics.median(x[k] for x in res[arm]) for k in res[arm][0] if k != "train_loss"}
                ratio = f"**{med:.3f}x** ({q1:.3f}-{q3:.3f})" if arm == other else "1 (reference)"
                lines.append(
                    f"| {spec.name} | {p.steps} | {tpp:.1f} | {arm} | {m['total']:.2f} | "
                    f"{m['process']:.2f} | {m['steps']:.2f} | {m['loop_side']:.2f} | {m['final_eval']:.2f} | "
                    f"{2 * 3600 / m['total']:.0f} | {ratio} |"
                )
            for arm in arms:  # each arm deterministic: its rounds end on the same loss
                if len({x["train_loss"] for x in res[arm]}) != 1:
                    raise SystemExit(f"{spec.name}: the {arm} runs differ between rounds (final train loss)")
            losses = {arm: res[arm][0]["train_loss"] for arm in arms}
            if args.compare == "launch" and len(set(losses.values())) != 1:
                raise SystemExit(f"{spec.name}: fork and exec runs differ (final train loss {losses})")
            loss_notes.append(f"{spec.name}: " + ", ".join(f"{a} {v:.4f}" for a, v in losses.items()))
            if args.plain:
                trainer_step = statistics.median(x["steps"] for k in res for x in res[k]) / p.steps
                fp32 = plain_steps(p, args.plain_steps, args.threads, False)
                bf16 = plain_steps(p, args.plain_steps, args.threads, True)
                plain_lines.append(
                    f"| {spec.name} | {p.tc.dtype} | {1e3 * trainer_step:.1f} | {1e3 * fp32:.1f} | "
                    f"{1e3 * bf16:.1f} | {fp32 / bf16:.2f}x |"
                )
    q1, med, q3 = quartiles(pooled)
    lines += [
        "",
        f"Every spec: {ref} / {other} per run {med:.3f}x (IQR {q1:.3f}-{q3:.3f}) over {len(pooled)} paired "
        f"rounds; "
        + (
            "final training losses identical between fork and exec in every spec (checked)."
            if args.compare == "launch"
            else "final training losses (each arm's rounds identical, checked): " + "; ".join(loss_notes) + "."
        ),
    ]
    if plain_lines:
        lines += [
            "",
            "Per step, ms: the sweep's trainer (its steps' time / steps), a plain PyTorch loop of the "
            f"same model in this process ({args.plain_steps} steps x 3, median), and that loop under bf16 "
            "autocast:",
            "",
            "| spec | spec's dtype | trainer | plain loop | plain loop, bf16 | fp32 / bf16 |",
            "| --- | --- | --- | --- | --- | --- |",
        ] + plain_lines
    lines += ["", f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
