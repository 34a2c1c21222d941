"""The ablation runner (``lmlab sweep SPEC``): every run of a spec as an ordinary run folder.

The sweep folder holds ``spec.yaml`` (the spec as run), ``configs/RUN.yaml`` (each run's full config),
``logs/RUN.log`` (the training output), ``runs/RUN/`` (ordinary run folders: ``lmlab eval``,
``generate`` and ``plot`` work on them), ``results.jsonl`` (one JSON object per run), ``timing.json``
(the spec's timing block, :mod:`lmlab.lab.timing`), ``init_grads.json`` (per-layer gradient norms at
initialisation, :mod:`lmlab.lab.init_grads`), ``provenance.jsonl`` (a record per invocation:
command, lmlab version, git commit, spec SHA-256, machine, time; and one closing it with its wall time)
and ``load.jsonl`` (the 1-minute load average, sampled every 15 s while the sweep runs). A run is named
after its variant, scale, tuned values and seed (``parallel_block=true-s1``, ``SwiGLU_d128_lr=0.003-s2``).

Each run trains in a subprocess (``python -m lmlab.cli train``, which sets the run up with
:func:`lmlab.runs.setup_run`; ``--jobs N`` runs N at once, each with cores // N torch threads); the
sweep process then scores the whole validation split (bits-per-byte, :func:`lmlab.evaluate.evaluate`),
optionally at longer contexts and the decode speed, and records the result. The timing block runs
first, alone, before any training. Rerunning the same command resumes: runs with a result are skipped,
trained runs are only evaluated, interrupted runs continue from their last checkpoint, a finished timing
block is kept. A run that stops on non-finite losses (``FloatingPointError`` after ``max_bad_steps``)
is recorded as diverged and the sweep goes on. With ``tune_seeds`` (two-stage tuning) the tune seeds'
runs of every grid value train first; the value each (scale, variant) gets is then chosen from their
recorded results and the other seeds train at it alone (a resumed sweep makes the same choice from the
same rows).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from lmlab.config import ConfigError
from lmlab.fsutil import atomic_write_text
from lmlab.lab.validate import check_nesting
from lmlab.lab.worker import stop_training
from lmlab.threads import current_threads, physical_cores, set_threads, sweep_threads, using_threads
from lmlab.run_folder import RUN_FILE, checkpoint_dirs, metrics_path, read_metrics_file, read_run
from lmlab.lab.spec import TIMING_METRICS, Spec, _fmt, load_spec
from lmlab.lab.plan import RunPlan, control_flags, plan_quantities, plan_runs, trained_plans

RESULTS_FILE = "results.jsonl"
TIMING_FILE = "timing.json"
INIT_GRADS_FILE = "init_grads.json"
PROVENANCE_FILE = "provenance.jsonl"
LOAD_FILE = "load.jsonl"


# --- run state -----------------------------------------------------------------------------
def run_metrics(run_dir: Path) -> list[dict]:
    """A run's validated training log (:func:`lmlab.run_folder.read_metrics_file`; [] when absent)."""

    return read_metrics_file(metrics_path(run_dir))


def read_results(sweep_dir: str | Path) -> list[dict]:
    """The rows of ``results.jsonl`` (one per run), validated by
    :func:`lmlab.lab.validate.read_results_jsonl`. A last line that is not JSON (cut by a kill
    mid-write) is skipped with a warning on stderr: its run counts as not finished, so ``lmlab sweep``
    scores it again. Raises ConfigError naming the file, line and field of any other damaged row."""
    from lmlab.lab.validate import read_results_jsonl

    return read_results_jsonl(Path(sweep_dir) / RESULTS_FILE, cut_last="skip")


def _last_checkpoint_step(run_dir: Path) -> int:

    ckpts = checkpoint_dirs(run_dir)
    return int(ckpts[-1].name.split("_")[1]) if ckpts else 0


def run_state(run_dir: Path, max_steps: int) -> str:
    """``new`` (no run folder), ``trained`` (the last checkpoint is at max_steps, or training stopped on
    its wall-time budget) or ``partial``."""
    if not (run_dir / RUN_FILE).is_file():
        return "new"
    step = _last_checkpoint_step(run_dir)
    if step >= max_steps:
        return "trained"
    if step and any(
        r.get("stopped") == "max_seconds" and r.get("step") == step for r in run_metrics(run_dir)
    ):
        return "trained"
    return "partial"


def _check_existing(p: RunPlan, run_dir: Path) -> None:
    """An existing run folder must hold this very run (else the spec changed under it)."""

    if not (run_dir / RUN_FILE).is_file():
        return
    run = read_run(run_dir)
    want = {"model": p.cfg.to_dict(), "train": dataclasses.asdict(p.tc)}
    diff = [
        f"{sec}.{k}: run has {run.get(sec, {}).get(k)!r}, spec asks {v!r}"
        for sec in ("model", "train")
        for k, v in want[sec].items()
        if run.get(sec, {}).get(k, v) != v
    ]
    if run.get("data") != str(p.data):
        diff.append(f"data: run has {run.get('data')!r}, spec asks {str(p.data)!r}")
    if diff:
        raise ConfigError(
            f"run folder {str(run_dir)!r} holds a different run than the spec asks "
            f"({'; '.join(diff[:3])}); give the sweep another --out, or delete that run folder"
        )


# --- evaluation ----------------------------------------------------------------------------
def _machine(device_name: str) -> str:
    from lmlab.bench import describe_machine
    from lmlab.train import resolve_device

    try:
        return describe_machine(resolve_device(device_name))
    except ConfigError:  # a device name the run itself already refused: it trained nowhere else
        return describe_machine("cpu")


def _nan_to_none(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def evaluate_run(
    run_dir: Path, contexts: list, decode: Optional[dict] = None, by_position: bool = False
) -> dict:
    """Full validation split of a trained run: loss and bits-per-byte at ``contexts`` multiples of the
    training context (a multiple the positions cannot reach, learned positions beyond the table, gives
    None and the reason), KV-cache bytes, with ``decode`` decode tokens/s and with ``by_position``
    ``val_loss_by_position`` (nats/token at each position of the training context,
    :func:`lmlab.evaluate.evaluate`)."""
    import torch

    from lmlab.analysis import kv_cache_bytes
    from lmlab.checkpoint import load_run
    from lmlab.data.prepare import TokenData
    from lmlab.evaluate import evaluate
    from lmlab.model import TransformerLM
    from lmlab.train import resolve_device

    device = resolve_device("auto")
    model, cfg, _, run, _ = load_run(run_dir, device=str(device))
    data = TokenData(run["data"])
    tokens, n_bytes = data.tokens("val"), data.bytes("val")
    out: dict = {"params": model.num_params(), "non_embedding_params": model.num_params(non_embedding=True)}
    for mult in contexts:
        suffix = "" if mult == 1 else f"_{_fmt(mult)}x"
        ctx = int(cfg.context_length * mult)
        if mult == 1:
            m = model
        elif cfg.position == "learned" and ctx > cfg.context_length:
            out[f"val_loss{suffix}"] = out[f"val_bpb{suffix}"] = None
            out[f"eval_note{suffix}"] = (
                f"learned positions exist only below context_length={cfg.context_length}"
            )
            continue
        else:  # the same weights in a model built for the longer context
            m = TransformerLM(dataclasses.replace(cfg, context_length=ctx)).to(device)
            m.load_state_dict(model.state_dict())
            m.eval()
        res = evaluate(
            m, tokens, n_bytes, batch_size=16, device=device, by_position=by_position and mult == 1
        )
        if res.get("loss_by_position"):
            out["val_loss_by_position"] = [round(x, 5) for x in res["loss_by_position"]]
        out[f"val_loss{suffix}"] = _nan_to_none(res["loss"])
        out[f"val_bpb{suffix}"] = _nan_to_none(res["bits_per_byte"])
        if mult == 1:
            out["val_tokens"], out["val_bytes"] = res["tokens"], res["bytes"]
    kv = kv_cache_bytes(cfg, cfg.context_length, batch=1, dtype="fp32")
    out["kv_bytes_per_token"] = kv["per_token"]
    out["kv_bytes_context"] = kv["total"]
    if decode:
        from lmlab.bench import bench_decode

        d = dict(decode)
        d["prompt_len"] = min(d["prompt_len"], cfg.context_length // 2)
        d["new_tokens"] = max(2, min(d["new_tokens"], cfg.context_length - d["prompt_len"] + 1))
        res = bench_decode(
            model,
            batch=d["batch"],
            prompt_len=d["prompt_len"],
            new_tokens=d["new_tokens"],
            repeats=d["repeats"],
            device=device,
        )
        out["decode_tokens_per_s"] = res["decode_tokens_per_s"]
        out["prefill_tokens_per_s"] = res["prefill_tokens_per_s"]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def training_summary(run_dir: Path) -> dict:
    """From ``metrics.jsonl`` and the last checkpoint: steps, tokens, training wall time (summed over
    resumed invocations), median tokens/s, final train loss (mean of those logged in the last 10% of the
    steps), spikes, skipped
    steps and whether training stopped on its wall-time budget."""
    from lmlab.plot import cumulative_wall_time

    recs = run_metrics(run_dir)
    train = [r for r in recs if "loss" in r and "tokens" in r and not r.get("skipped")]
    timed = cumulative_wall_time([r for r in recs if r.get("elapsed_s") is not None])  # across resumes
    wall = timed[-1]["elapsed_s"] if timed else 0.0
    losses = [r["loss"] for r in train if r["step"] >= 0.9 * train[-1]["step"]] if train else []
    tps = [r["tokens_per_s"] for r in train if r.get("tokens_per_s")]
    state: dict = {}
    ckpts = checkpoint_dirs(run_dir)
    if ckpts and (ckpts[-1] / "trainer.json").is_file():
        state = json.loads(check_nesting((ckpts[-1] / "trainer.json").read_text(), str(ckpts[-1] / "trainer.json")))
    final = sum(losses) / len(losses) if losses else None
    diag = [r for r in recs if "max_attn_logit" in r]  # TrainConfig.diag_interval records
    return {
        "steps": state.get("step", train[-1]["step"] if train else 0),
        "tokens": state.get("tokens_seen", train[-1]["tokens"] if train else 0),
        "wall_s": wall,
        "tokens_per_s": statistics.median(tps) if tps else None,
        "first_train_loss": train[0]["loss"] if train else None,
        "final_train_loss": _nan_to_none(final),
        "spikes": train[-1].get("spikes", 0) if train else 0,
        "skipped_steps": sum(1 for r in recs if r.get("skipped")),
        "stopped_early": any(r.get("stopped") == "max_seconds" for r in recs),
        # largest attention logit (any layer) and output log Z seen by the diagnostics, None without them
        "max_attn_logit": _nan_to_none(
            max((max(x for x in r["max_attn_logit"] if x is not None) for r in diag
                 if any(x is not None for x in r["max_attn_logit"] or [])), default=None)
        ),
        "log_z_max": _nan_to_none(max((r["log_z_max"] for r in diag if "log_z_max" in r), default=None)),
        # the attention-sink share at the last diagnostics: the first key's mean attention probability over
        # the attention layers (Qiu et al. 2025, Fig. 2: 0.47 without an output gate, 0.05 with one)
        "attn_sink": _nan_to_none(_mean_known((diag[-1].get("attn_first_key") or []) if diag else [])),
    }


def _mean_known(xs: list) -> Optional[float]:
    """The mean of the non-None entries of ``xs``; None when there are none."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def collect_result(p: RunPlan, run_dir: Path, spec: Spec, diverged: bool, error: Optional[str]) -> dict:
    """The results row of one run (columns: lmlab.lab.report.COLUMNS)."""
    summary = training_summary(run_dir)
    final = summary["final_train_loss"]
    first = summary["first_train_loss"]
    if summary["steps"] and not error and (final is None or (first is not None and final > first)):
        diverged = True  # non-finite at the end, or the loss ended above where it was first logged
    row: dict = {
        "sweep": spec.name,
        "run": p.name,
        "variant": p.variant,
        "seed": p.seed,
        "status": "failed" if error else ("diverged" if diverged else "ok"),
        "diverged": bool(diverged),
        "max_steps": p.steps,
        "scale": p.scale,
        "tune": p.tune,
        "solved": p.solved,
    }
    row.update(summary)
    row["flops_per_token"] = p.flops_per_token
    row["flops"] = summary["tokens"] * p.flops_per_token
    row["step_ms"] = (1000 * p.tokens_per_step / summary["tokens_per_s"]) if summary["tokens_per_s"] else None
    if error:
        row["error"] = error
    if not diverged and not error:
        row.update(
            evaluate_run(
                run_dir,
                spec.eval_contexts,
                spec.decode if spec.measure_decode else None,
                by_position=spec.loss_by_position,
            )
        )
    else:
        from lmlab.analysis import kv_cache_bytes, param_counts

        counts = param_counts(p.cfg)
        row["params"], row["non_embedding_params"] = counts["total"], counts["non_embedding"]
        for mult in spec.eval_contexts:
            suffix = "" if mult == 1 else f"_{_fmt(mult)}x"
            row[f"val_loss{suffix}"] = row[f"val_bpb{suffix}"] = None
        kv = kv_cache_bytes(p.cfg, p.cfg.context_length, batch=1, dtype="fp32")
        row["kv_bytes_per_token"], row["kv_bytes_context"] = kv["per_token"], kv["total"]
    row["fields"] = p.fields
    row["finished_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    row["machine"] = _machine(p.tc.device)
    row["load_avg_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {k: _nan_to_none(v) for k, v in row.items()}


# --- the sweep -----------------------------------------------------------------------------
def retuned(p: RunPlan, tune: dict) -> RunPlan:
    """Run ``p`` at other tuned values ``tune`` (a TrainConfig field such as the learning rate: the grid's
    extension, :mod:`lmlab.lab.tuning`): the same model, seed, data and steps, named as the spec names
    its runs (:func:`lmlab.lab.spec.run_stem`). Raises ConfigError for a tuned model field (its steps
    could change under a FLOPs budget: not extended)."""
    from lmlab.lab.plan import _split_fields, run_stem

    tm, tt = _split_fields(tune)
    if tm:
        raise ConfigError(f"the grid of {sorted(tm)} cannot be extended (a model field); extend it in the spec")
    return dataclasses.replace(
        p, name=f"{run_stem(p.variant, p.scale, tune)}-s{p.seed}", tc=dataclasses.replace(p.tc, **tt),
        tune=dict(tune), fields={**p.fields, **tune})


class _Sweep:
    def __init__(
        self,
        spec: Spec,
        sweep_dir: Path,
        plans: list[RunPlan],
        jobs: int,
        threads: int,
        log: Callable[[str], None],
        executor: Any = None,
    ):
        """``executor``: None trains ``jobs`` runs at once in threads of this process (each a training
        subprocess); else an executor of :mod:`lmlab.lab.executors` (Slurm, submitit-local) whose
        ``run(names, on_row)`` returns when each run has a row."""
        self.spec, self.dir, self.plans, self.jobs, self.threads = spec, sweep_dir, plans, jobs, threads
        self.executor = executor
        self._say, self.log_lock = log, threading.Lock()
        self.lock = threading.Lock()  # results file
        self.eval_lock = threading.Lock()  # one evaluation at a time in this process
        self.stopping = False
        self.rows = {r["run"]: r for r in read_results(sweep_dir)}
        self.done_count = 0

    def write_results(self) -> None:
        order = [p.name for p in self.plans]
        rows = [self.rows[n] for n in order if n in self.rows] + [
            r for n, r in self.rows.items() if n not in order
        ]
        path = self.dir / RESULTS_FILE
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))

    def log(self, line: str) -> None:
        """One line of progress; one worker's at a time (print from two threads can run lines together)."""
        with self.log_lock:
            self._say(line)

    def job(self, p: RunPlan) -> None:
        from lmlab.lab.worker import EvalSettings, run_planned

        if self.stopping:
            return
        t0 = time.perf_counter()
        row = run_planned(self.dir, p, EvalSettings.of(self.spec), self.threads, self.eval_lock,
                          stopping=lambda: self.stopping, log=self.log)
        self.record(row, time.perf_counter() - t0)

    def record(self, row: dict, took: float) -> None:
        """Merge one run's row into ``results.jsonl`` and log it."""
        with self.lock:
            self.rows[row["run"]] = row
            self.write_results()
            self.done_count += 1
            n = self.done_count
        what = f"val bpb {row['val_bpb']:.4f}" if row.get("val_bpb") is not None else row["status"].upper()
        loss = row.get("final_train_loss")
        self.log(
            f"[{n}/{self.pending}] {row['run']}: {what}, train loss {'n/a' if loss is None else f'{loss:.4f}'}, "
            f"{took:.0f} s" + (f" ({row['error']})" if row.get("error") else "")
        )

    def stage2_plans(self) -> list[RunPlan]:
        """Two-stage tuning (``spec.tune_seeds``): the stage-2 runs at the tuned values stage 1 chose
        for their (scale, variant), from the recorded stage-1 rows (lmlab.lab.verdicts.select_tuned); a
        value the grid's extension added gets its stage-2 runs planned here (:func:`retuned`)."""
        from lmlab.lab.verdicts import select_tuned, split_stages

        tune_rows, _ = split_stages(list(self.rows.values()), self.spec)
        chosen = select_tuned(tune_rows, self.spec)
        out = []
        for (scale, variant), sel in chosen.items():
            mine = [p for p in self.plans if p.stage2 and (p.scale, p.variant) == (scale, variant)]
            picks = []
            for seed in sorted({p.seed for p in mine}):
                p = next((q for q in mine if q.seed == seed and q.cell[2] == sel["key"]), None)
                if p is None:  # the chosen value is one the extension added: plan it from another value's run
                    p = retuned(next(q for q in mine if q.seed == seed), sel["tune"])
                    self.plans.append(p)
                picks.append(p)
            at = ", ".join(f"{k}={v:g}" for k, v in sel["tune"].items())
            self.log(
                f"stage 2: {variant}{f' @{scale}' if scale else ''} at {at} (chosen by seed(s) "
                f"{', '.join(map(str, self.spec.tune_seeds))}), seeds {', '.join(str(p.seed) for p in picks)}"
                + (" -- every stage-1 run of it diverged or failed" if sel.get("all_failed") else "")
                + (f" -- not bracketed: {sel['why']}" if sel.get("why") else "")
            )
            out += picks
        order = {p.name: i for i, p in enumerate(self.plans)}
        return sorted(out, key=lambda p: order[p.name])

    def extend_grid(self) -> None:
        """Add tuned values past an edge that wins (:func:`lmlab.lab.tuning.extensions`) and train them on
        the seeds that tune, until every variant's best is bracketed or has used ``tuning.extend`` values
        per side. The choice is remade from the recorded rows, so a resumed sweep extends the same way."""
        from lmlab.lab.tuning import extensions
        from lmlab.lab.verdicts import split_stages

        while True:
            tune_rows, _ = split_stages(list(self.rows.values()), self.spec)
            todo = []
            for scale, variant, tune in extensions(tune_rows, self.spec):
                cell = [p for p in self.plans if not p.stage2 and (p.scale, p.variant) == (scale, variant)]
                seeds = sorted({p.seed for p in cell})
                at = ", ".join(f"{k}={v:g}" for k, v in tune.items())
                self.log(f"extend: {variant}{f' @{scale}' if scale else ''}: its best value is at an edge of "
                         f"the grid; adding {at} for seed(s) {', '.join(map(str, seeds))}")
                for seed in seeds:
                    new = retuned(next(p for p in cell if p.seed == seed), tune)
                    if new.name not in {p.name for p in self.plans}:
                        self.plans.append(new)
                    todo.append(new)
            if not todo:
                return
            done = {n for n, r in self.rows.items() if r.get("status") in ("ok", "diverged")}
            if all(p.name in done for p in todo):  # recorded, yet still proposed: nothing new to learn
                return
            self.run_batch(todo)

    def run(self) -> None:
        self.run_batch([p for p in self.plans if not p.stage2])
        self.extend_grid()
        if any(p.stage2 for p in self.plans):
            self.run_batch(self.stage2_plans())

    def run_batch(self, plans: list[RunPlan]) -> None:
        """Train, evaluate and record ``plans`` (one stage: returns when every one has a row)."""
        from lmlab.lab.worker import finished_row, write_plan

        todo, merged = [], []
        for p in plans:
            row = self.rows.get(p.name)
            if row is None or row.get("status") not in ("ok", "diverged"):
                row = finished_row(self.dir, p.name, p.steps)  # written by a job that ended while no coordinator ran
                if row is not None:
                    merged.append(row)
            if row is not None and row.get("status") in ("ok", "diverged"):
                self.log(f"skip {p.name}: done ({row['status']})")
                continue
            todo.append(p)
        if merged:
            with self.lock:
                self.rows.update({r["run"]: r for r in merged})
                self.write_results()
        self.pending, self.done_count = len(todo), 0  # "[n/pending]" counts this batch (stage)
        if not todo:
            return
        for p in todo:  # what a worker reads (lmlab sweep-worker SWEEP RUN reproduces any of them)
            write_plan(self.dir, p, self.spec)
        if self.executor is not None:
            self.executor.run([p.name for p in todo], self.record)
            return
        pool = ThreadPoolExecutor(max_workers=self.jobs) if self.jobs > 1 else None
        try:
            if pool is None:
                for p in todo:
                    self.job(p)
            else:
                futures = [pool.submit(self.job, p) for p in todo]
                for f in futures:
                    f.result()
        except KeyboardInterrupt:
            self.stopping = True
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            stop_training(timeout=30)  # the training subprocesses this sweep started: each checkpoints
            raise
        finally:
            if pool is not None:
                pool.shutdown(wait=True)


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by SIGINT or SIGTERM after stopping its training subprocesses (each checkpoints
    its last finished step); ``exit_code`` 130 or 143. The same command resumes."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


def _on_stop_signals() -> dict:
    """From the main thread: make SIGTERM raise KeyboardInterrupt (exit 143) and SIGINT raise it (exit
    130) so that ``kill`` or ``kill -INT`` stops the sweep's training subprocesses too. SIGINT's handler
    is installed explicitly: a process started in the background inherits SIGINT ignored, and Python then
    installs none. Returns {signal: previous handler} to restore ({} off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_term(signum, frame):
        exc = KeyboardInterrupt("SIGTERM")
        exc.exit_code = 143
        raise exc

    def on_int(signum, frame):
        raise KeyboardInterrupt("SIGINT")

    return {signal.SIGTERM: signal.signal(signal.SIGTERM, on_term), signal.SIGINT: signal.signal(signal.SIGINT, on_int)}


# --- provenance, machine load and the timing block ---------------------------------------
def git_commit(path: Path = Path(__file__)) -> Optional[str]:
    """The git commit of the lmlab source tree holding ``path`` (``+dirty`` when the package's source,
    ``lmlab/`` and ``pyproject.toml``, has uncommitted changes: the pages ``make ablations`` writes into
    ``docs/`` between its sweeps do not count), or None outside a git checkout or without git."""
    root = Path(path).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "lmlab",
             "pyproject.toml"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def spec_sha256(spec: Spec) -> str:
    """SHA-256 of the spec file's bytes (of its canonical YAML dump when it came from no file)."""
    if spec.path is not None and Path(spec.path).is_file():
        data = Path(spec.path).read_bytes()
    else:
        data = yaml.safe_dump(spec.raw, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def end_record(wall_s: float, finished: bool) -> dict:
    """The provenance record closing one invocation: when it ended, its wall time in seconds (timing
    block, training and evaluation) and whether every run finished (False: interrupted or failed)."""
    return {
        "ended_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "wall_s": round(wall_s, 1),
        "finished": finished,
    }


def _repo_relative(path: Path) -> str:
    """``path`` relative to the lmlab checkout it lies in (a shipped spec: ``lmlab/specs/NAME.yaml``),
    else to the working directory, else as given: provenance that names no one machine's folders."""
    path = Path(path).resolve()
    for base in (Path(__file__).resolve().parents[2], Path.cwd().resolve()):
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            continue
    return str(path)


def provenance_record(spec: Spec, command: Optional[str]) -> dict:
    """What a reader needs to reproduce one sweep invocation: the command, lmlab version and git
    commit, the spec file and its SHA-256, the machine, the time and the load average at the start."""
    import lmlab

    return {
        "command": command or f"lmlab sweep {spec.path or spec.name}",
        "cwd": os.getcwd(),
        "lmlab_version": getattr(lmlab, "__version__", None),
        "git_commit": git_commit(),
        "spec": _repo_relative(spec.path) if spec.path else None,
        "spec_sha256": spec_sha256(spec),
        "tier": spec.tier,
        "machine": _machine("auto"),
        "python": sys.version.split()[0],
        "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


class LoadSampler(threading.Thread):
    """Appends {time, load_1m, load_5m} to ``path`` every ``interval`` seconds until stopped: the
    machine's load while the sweep ran, for the report (contended runs are not speed measurements)."""

    def __init__(self, path: Path, interval: float = 15.0):
        super().__init__(daemon=True)
        self.path, self.interval, self.halt = path, interval, threading.Event()

    def sample(self) -> None:
        if not hasattr(os, "getloadavg"):
            return
        one, five, _ = os.getloadavg()
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": time.time(), "load_1m": one, "load_5m": five}) + "\n")

    def run(self) -> None:
        while True:
            self.sample()
            if self.halt.wait(self.interval):
                return

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)
        self.sample()


def timing_key(spec: Spec, plans: list[RunPlan]) -> dict:
    """What a stored timing block must match to be reused: its settings and every model config timed."""
    cells = {}
    for p in plans:
        cells.setdefault(f"{p.variant}@{p.scale}" if p.scale else p.variant, p.cfg.to_dict())
    return {"settings": spec.timing, "dtype": plans[0].tc.dtype, "models": cells}


def _kept(path: Path, key: dict, what: str, log: Callable[[str], None]) -> Optional[dict]:
    """The block stored in ``path`` when it was measured with ``key`` (settings and models), else None
    (also for a missing or unreadable file: the block is measured again)."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(check_nesting(path.read_text(), str(path)))
    except (json.JSONDecodeError, ConfigError):  # damaged: measured again
        return None
    if isinstance(stored, dict) and stored.get("key") == json.loads(json.dumps(key)):
        log(f"{what}: kept {path} (same settings and models)")
        return stored
    return None


def run_timing(
    spec: Spec, plans: list[RunPlan], sweep_dir: Path, log: Callable[[str], None]
) -> Optional[dict]:
    """Run the spec's timing block (per scale, every variant's untrained model, interleaved; see
    :mod:`lmlab.lab.timing`) unless ``timing.json`` holds one with the same settings and models; returns
    {"key", "scales": {scale or "": time_variants result}, "machine", "finished_at"}."""
    if not spec.timing:
        return None
    path = sweep_dir / TIMING_FILE
    key = timing_key(spec, plans)
    stored = _kept(path, key, "timing", log)
    if stored:
        return stored
    from lmlab.lab.timing import time_variants
    from lmlab.train import resolve_device, resolve_dtype

    t = spec.timing
    device = resolve_device(plans[0].tc.device)
    dtype = resolve_dtype(plans[0].tc.dtype, device)
    out: dict = {"key": key, "scales": {}}
    for scale in dict.fromkeys(p.scale for p in plans):
        cfgs: dict = {}
        for p in plans:
            if p.scale == scale:
                cfgs.setdefault(p.variant, p.cfg)
        log(
            f"timing{f' @{scale}' if scale else ''}: {len(cfgs)} model(s), {t['pairs']} interleaved rounds of "
            f"{t['steps']} training steps at batch {t['batch']}"
        )
        out["scales"][scale or ""] = time_variants(
            cfgs,
            t["batch"],
            t["context"],
            t["pairs"],
            t["steps"],
            dtype,
            device,
            t["threads"],
            t["decode"],
            t["decode_batch"],
            t["decode_context"],
            decode_steps=t.get("decode_steps"),
        )
    out["machine"] = _machine(plans[0].tc.device)
    out["finished_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    atomic_write_text(path, json.dumps(out, indent=1))
    return out


def run_init_grads(
    spec: Spec, plans: list[RunPlan], sweep_dir: Path, log: Callable[[str], None]
) -> Optional[dict]:
    """The spec's ``init_grads:`` block (:mod:`lmlab.lab.init_grads`) for every variant (and scale),
    kept when ``init_grads.json`` holds one with the same settings and models; returns
    {"key", "variants": {label: {depth: {seed: [norm per block]}}}, "finished_at"}."""
    if not spec.init_grads:
        return None
    path = sweep_dir / INIT_GRADS_FILE
    cfgs: dict = {}
    for p in plans:
        cfgs.setdefault(f"{p.variant} @{p.scale}" if p.scale else p.variant, p)
    key = {"settings": spec.init_grads, "models": {k: p.cfg.to_dict() for k, p in cfgs.items()}}
    stored = _kept(path, key, "init_grads", log)
    if stored:
        return stored
    from lmlab.data.prepare import TokenData
    from lmlab.lab.init_grads import init_grad_norms

    g = spec.init_grads
    log(f"init_grads: {len(cfgs)} model(s) at depths {g['depths']}, seeds {g['seeds']}, batch {g['batch']}")
    with using_threads(physical_cores()):
        out = {
            "key": key,
            "variants": {
                label: init_grad_norms(
                    p.cfg, TokenData(p.data).tokens("train"), g["depths"], g["seeds"], g["batch"]
                )
                for label, p in cfgs.items()
            },
        }
    out["finished_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    atomic_write_text(path, json.dumps(out, indent=1))
    return json.loads(json.dumps(out))  # depths and seeds as the file holds them (string keys)


def default_out(spec: Spec) -> Path:
    return Path("sweeps") / spec.name


def most_epochs(plans: list[RunPlan]) -> tuple[float, int, Path, int]:
    """(passes, training tokens, data folder, tokens read) of the run that reads its data's training
    split most often."""
    from lmlab.data.prepare import TokenData

    worst = None
    for data in dict.fromkeys(p.data for p in plans):
        train = int(TokenData(data).manifest["splits"]["train"]["tokens"])
        most = max(p.tokens for p in plans if p.data == data)
        if worst is None or most / max(train, 1) > worst[0]:
            worst = (most / max(train, 1), train, data, most)
    return worst


def epochs_line(plans: list[RunPlan]) -> str:
    """How many passes over the data's training split the longest run makes; past one pass the
    comparison is made on repeated data (a different regime: memorisation, where dropout and weight
    decay act differently), so the line then starts with ``warning:``."""
    epochs, train, data, most = most_epochs(plans)
    text = (f"data: {train:,} training tokens in {data}; the run with the most passes reads "
            f"{most:,} ({epochs:.2f} epochs)")
    if epochs > 1:
        text = (f"warning: {text}: the runs repeat the data; pass a larger corpus (`lmlab sweep --data DIR`, "
                f"a folder of `lmlab prepare`) for single-pass results")
    return text


def too_few_tokens(spec: Spec, plans: list[RunPlan]) -> Optional[str]:
    """Why the data cannot carry the spec's runs (the longest reads its training split more than the
    spec's ``max_epochs`` times), or None."""
    if spec.max_epochs is None or not plans:
        return None
    epochs, train, data, most = most_epochs(plans)
    if epochs <= spec.max_epochs:
        return None
    return (f"{spec.name}: the longest run reads {most:,} tokens, {epochs:.1f} passes over the {train:,} training "
            f"tokens of {data}, and the spec allows max_epochs={spec.max_epochs:g}; give a corpus of at least "
            f"{math.ceil(most / spec.max_epochs):,} training tokens with --data DIR (a folder of `lmlab prepare "
            f"--data ...`: parquet shards, JSONL or a `datasets` save_to_disk folder such as FineWeb-Edu's)")


def protocol_lines(spec: Spec) -> list[str]:
    """The dry run's account of the learning-rate protocol and what a verdict needs
    (:mod:`lmlab.lab.tuning`, :func:`lmlab.lab.verdicts.gate`), with a warning for each rule the spec's
    design cannot meet (its claims would get no verdict)."""
    t, j = spec.tuning, spec.judging
    L = []
    if spec.tune:
        n_tune = len(spec.tune_seeds) if spec.tune_seeds else len(spec.seeds)
        points = math.prod(len(v) for v in spec.tune.values())
        L.append(f"tuning: each variant's value from the mean over {n_tune} seed(s) on {points} value(s); "
                 f"up to {t.extend} value(s) added past an edge that wins, per side and variant (runs not "
                 f"counted above); unstable cells (a diverged seed, or seed SD > {t.unstable_ratio:g}x the "
                 f"median) are never chosen")
        if n_tune < t.min_seeds:
            L.append(f"warning: {n_tune} tuning seed(s) < tuning.min_seeds={t.min_seeds}: every claim will read "
                     f"'rate not bracketed'")
        if points < t.min_points:
            L.append(f"warning: {points} tuned value(s) < tuning.min_points={t.min_points}: claims read 'rate "
                     f"not bracketed' unless the extension adds enough")
    compared = len(spec.seeds) - (len(spec.tune_seeds) if spec.tune_seeds else 0)
    if spec.expect and compared < j.min_seeds and any(e.metric not in TIMING_METRICS
                                                      for e in spec.expect):
        L.append(f"warning: {compared} compared seed(s) < judging.min_seeds={j.min_seeds}: claims on trained "
                 f"quantities will read 'too few seeds'")
    return L


def format_plan(plans: list[RunPlan], states: dict, spec: Optional[Spec] = None) -> str:
    """The dry-run table: one line per run (steps, tokens, FLOPs, parameters, state), the totals and,
    with ``spec``, the controls: quantities that differ > 5% from the baseline without being declared."""
    from lmlab.analysis import param_counts

    lines = [
        f"{'run':44} {'steps':>6} {'tokens':>11} {'train FLOPs':>11} {'params':>10} {'non-emb':>10}  state"
    ]
    todo = trained_plans(plans)
    for p in (p for p in todo if not p.stage2):
        c = param_counts(p.cfg)
        lines.append(
            f"{p.name[:44]:44} {p.steps:>6} {p.tokens:>11,} {p.flops:>11.3g} {c['total']:>10,} "
            f"{c['non_embedding']:>10,}  {states[p.name]}"
        )
    # stage 2 of two-stage tuning: one run per (scale, variant, seed), at the value stage 1 chooses
    stage2 = [p for p in todo if p.stage2]
    done2 = sum(states[p.name] == "done" for p in plans if p.stage2)
    if stage2:
        seeds2 = sorted({p.seed for p in stage2})
        lines.append(
            f"stage 2: {len(stage2)} runs (each variant, seeds {', '.join(map(str, seeds2))}) at the "
            f"tuned values stage 1 chooses; {done2} done"
        )
    total = sum(p.flops for p in todo)
    lines.append(
        f"{len(todo)} runs, {sum(p.tokens for p in todo):,} tokens, {total:.3g} training FLOPs in all"
    )
    if plans:
        lines.append(epochs_line(plans))
    short = [p for p in todo if p.tc.warmup_steps > p.steps]
    if short:
        p = short[0]
        lines.append(
            f"warning: {len(short)} run(s) end before their warmup does (e.g. {p.name}: warmup_steps="
            f"{p.tc.warmup_steps} > {p.steps} steps), so their learning rate never reaches its value; "
            f"set train: {{warmup_steps: ...}} below the budget"
        )
    if spec is not None:
        lines += protocol_lines(spec)
        per = {}  # (scale, variant) -> the fewest tokens per non-embedding parameter of its runs
        for p in todo:
            ne = param_counts(p.cfg)["non_embedding"]
            if ne:
                per[(p.scale, p.variant)] = min(per.get((p.scale, p.variant), math.inf), p.tokens / ne)
        if per:
            floor = spec.judging.tokens_per_param
            lines.append(f"tokens per non-embedding parameter: {min(per.values()):.3g} to {max(per.values()):.3g} "
                         f"(a claim about trained quality needs {floor:g}, unless it sets its own floor)")
            low = []
            for e in spec.expect:
                if e.metric in TIMING_METRICS:
                    continue
                f = e.floor if e.floor is not None else floor
                got = min((v for (sc, var), v in per.items() if var in (e.a, e.b)), default=math.inf)
                if got < f:
                    low.append(f"{e.text!r} ({got:.3g} < {f:g})")
            if low:
                lines.append(f"warning: below their tokens-per-parameter floor, these claims will read 'not testable "
                             f"at this scale': {'; '.join(low)}")
        if spec.match:
            solved = {(p.scale, p.variant): p.solved for p in plans if p.solved}
            lines.append(
                f"control: {spec.match.hold} held"
                + (
                    f" by solving {spec.match.solve} (multiple " f"{spec.match.multiple})"
                    if spec.match.solve
                    else ""
                )
                + "".join(
                    f"; {v}{f' @{s}' if s else ''}: " + ", ".join(f"{k}={x}" for k, x in f.items())
                    for (s, v), f in solved.items()
                )
            )
        flags = control_flags(
            plan_quantities(plans), spec.baseline, spec.match.hold if spec.match else None, spec.varies
        )
        for (s, v), bad in flags.items():
            lines.append(
                f"warning: {v}{f' @{s}' if s else ''} differs from the baseline {spec.baseline!r} in "
                + ", ".join(f"{q} ({100 * r:+.0f}%)" for q, r in bad)
                + " (not held and not declared in 'varies:')"
            )
    return "\n".join(lines)


def run_sweep(
    spec: str | Path | Spec,
    out: Optional[str | Path] = None,
    jobs: int = 1,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
    data_dir: Optional[Path] = None,
    command: Optional[str] = None,
    tier: Optional[str] = None,
    max_runs: Optional[int] = None,
    executor: str = "local",
    executor_params: Optional[dict] = None,
    runs_per_task: int = 1,
) -> Path:
    """Plan, time, train, evaluate and record every run of ``spec`` in the sweep folder ``out`` (default
    ``sweeps/NAME``, ``sweeps/NAME-TIER`` at a ``tier`` of the spec's ``tiers:``); returns the folder.
    Resumes a folder it finds (see the module docstring). ``command`` is recorded in the provenance
    (default: ``lmlab sweep SPEC``). Raises ConfigError for a bad spec, tier, --out or --jobs before
    anything is written. The folder is locked while the sweep runs (:func:`lmlab.fsutil.acquire_lock`,
    the lock the runs take: a stale lock, its process gone, is taken over with a note on stderr); a second
    sweep on it raises LockError naming the folder and the holder's PID. SIGINT (also when inherited as
    ignored, as by a background job) and SIGTERM stop the training subprocesses, which checkpoint, and
    raise :class:`SweepInterrupted` (exit status 130 / 143); the same command resumes. The number of
    runs is counted and logged before they are planned; more than ``max_runs`` (None: the spec's
    ``max_runs:``, default :data:`lmlab.lab.spec.MAX_RUNS`) raises ConfigError naming the count.

    ``executor``: ``local`` (``jobs`` runs at once, each a training subprocess of this process),
    ``slurm`` or ``submitit-local`` (:mod:`lmlab.lab.executors`: each job trains ``runs_per_task`` runs at
    once; ``executor_params`` are submitit's parameters, e.g. ``slurm_partition``, ``timeout_min``,
    ``cpus_per_task``, ``gpus_per_node``, ``slurm_array_parallelism``; submitit-local runs at most ``jobs``
    jobs at once). Stopping the coordinator of a submitit sweep leaves its jobs running; the same command
    re-attaches to them."""
    if not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs {jobs!r} must be an integer >= 1")
    from lmlab.lab.executors import EXECUTORS

    if executor not in EXECUTORS:
        raise ConfigError(f"--executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if not isinstance(runs_per_task, int) or runs_per_task < 1:
        raise ConfigError(f"--runs-per-task {runs_per_task!r} must be an integer >= 1")
    from lmlab.lab.executors import check_executor_params

    check_executor_params(executor, dict(executor_params or {}), runs_per_task)
    if isinstance(spec, Spec) and tier is not None and spec.tier != tier:
        raise ConfigError(f"the spec was read at tier {spec.tier!r}, not {tier!r}; pass its file or name")
    spec = spec if isinstance(spec, Spec) else load_spec(spec, tier, max_runs)
    if max_runs is not None and spec.planned_runs > max_runs:
        raise ConfigError(f"the spec plans {spec.planned_runs:,} runs, more than --max-runs {max_runs:,}")
    sweep_dir = Path(out) if out else default_out(spec)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ConfigError(f"--out {str(sweep_dir)!r} is a file, not a sweep folder; choose a folder path")
    if sweep_dir.is_dir() and any(sweep_dir.iterdir()) and not (sweep_dir / "spec.yaml").is_file():
        raise ConfigError(
            f"--out {str(sweep_dir)!r} is a non-empty folder that is not a sweep (no spec.yaml); "
            f"choose a new folder or an existing sweep's folder"
        )
    lock = None
    if not dry_run:  # one sweep per folder (the runs' own locks keep each run folder to one trainer)
        from lmlab.fsutil import acquire_lock

        lock = acquire_lock(sweep_dir, "lmlab sweep")
        if lock.note:
            print(lock.note, file=sys.stderr)
    try:
        return _run_locked(spec, sweep_dir, jobs, dry_run, log, data_dir, command,
                           (executor, dict(executor_params or {}), runs_per_task))
    finally:
        if lock is not None:
            lock.release()


def _run_locked(spec: Spec, sweep_dir: Path, jobs: int, dry_run: bool, log: Callable[[str], None],
                data_dir: Optional[Path], command: Optional[str],
                how: tuple = ("local", {}, 1)) -> Path:
    """The body of :func:`run_sweep`, with the sweep folder locked (unless ``dry_run``)."""
    log(f"sweep {spec.name}: planning {spec.planned_runs:,} run(s)")
    plans = plan_runs(spec, data_dir)
    if (sweep_dir / "spec.yaml").is_file():
        from lmlab.config import load_mapping

        try:
            load_mapping(sweep_dir / "spec.yaml")
        except ConfigError as exc:  # lmlab's own copy, damaged: the runs are checked against the spec below
            log(
                f"warning: {exc}; it is rewritten from the spec given (every run folder is checked against it)"
            )
    jobs = min(jobs, len(plans))  # no more workers than runs
    for p in plans:
        _check_existing(p, sweep_dir / "runs" / p.name)
    rows = {r["run"]: r for r in read_results(sweep_dir)}
    states = {}
    for p in plans:
        row = rows.get(p.name)
        states[p.name] = (
            "done"
            if row is not None and row.get("status") in ("ok", "diverged")
            else run_state(sweep_dir / "runs" / p.name, p.steps)
        )
    kind, params, per_task = how
    if kind in ("slurm", "ray"):  # the CPUs of each task, shared by the runs it trains at once
        threads = max(1, int(params.get("cpus_per_task", per_task)) // per_task)
    else:
        threads = sweep_threads(jobs, per_task)
    cells = len({p.cell for p in plans})
    log(
        f"sweep {spec.name}: {cells} cell(s) (variant x scale x tuned values) x {len(spec.seeds)} seed(s)"
        + (
            f" in two stages (seed(s) {', '.join(map(str, spec.tune_seeds))} over the grid, the others at "
            f"the chosen values)"
            if spec.tune_seeds
            else ""
        )
        + f" ({len(trained_plans(plans))} runs) in {sweep_dir}, "
        + (f"{jobs} job(s) x {threads} thread(s)" if kind == "local" else
           f"executor {kind}, {per_task} run(s) per task x {threads} thread(s)"
           + (f", at most {jobs} task(s) at once" if kind == "submitit-local" else ""))
    )
    log(format_plan(plans, states, spec))
    short = too_few_tokens(spec, plans)
    if dry_run:
        if short:
            log(f"error: {short} (the sweep refuses to start)")
        return sweep_dir
    if short:
        raise ConfigError(short)
    ex = None
    if kind in ("slurm", "submitit-local"):  # its parameters checked before anything is written
        from lmlab.lab.executors import SubmititExecutor

        ex = SubmititExecutor(sweep_dir, kind, params, per_task, threads, parallelism=jobs, log=log)
    elif kind == "ray":
        from lmlab.lab.executors import RayExecutor

        ex = RayExecutor(sweep_dir, params.get("address"), per_task, threads, params.get("cpus_per_task"),
                         params.get("gpus_per_node", 0), params.get("max_retries", 3), parallelism=jobs, log=log)
    for sub in ("runs", "configs", "logs"):
        (sweep_dir / sub).mkdir(parents=True, exist_ok=True)
    (sweep_dir / "spec.yaml").write_text(yaml.safe_dump(spec.raw, sort_keys=False, allow_unicode=True))
    with open(sweep_dir / PROVENANCE_FILE, "a") as f:
        f.write(json.dumps(provenance_record(spec, command)) + "\n")
    threads_before = current_threads()  # the workers set their own: this process's count comes back
    t0 = time.perf_counter()
    sampler = LoadSampler(sweep_dir / LOAD_FILE)
    sampler.start()
    previous = _on_stop_signals()
    finished = False
    try:
        run_timing(spec, plans, sweep_dir, log)  # alone on the machine, before any training job
        run_init_grads(spec, plans, sweep_dir, log)
        _Sweep(spec, sweep_dir, plans, jobs, threads, log, ex).run()
        finished = True
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM: the training subprocesses were stopped first
        done = len([r for r in read_results(sweep_dir) if r.get("status") in ("ok", "diverged")])
        raise SweepInterrupted(
            f"sweep interrupted ({exc or 'SIGINT'}); {done} of {len(trained_plans(plans))} run(s) "
            f"recorded, the others "
            + ("checkpointed where they stopped; the same command resumes" if kind == "local" else
               "stopped with the coordinator (their trainings checkpointed); the same command continues them"
               if kind == "ray" else
               f"that were submitted keep running in their {kind} jobs (not cancelled); the same command "
               f"re-attaches to them"),
            getattr(exc, "exit_code", 130),
        ) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sampler.stop()
        set_threads(threads_before)
        with open(sweep_dir / PROVENANCE_FILE, "a") as f:  # this invocation's wall time (lmlab.lab.report)
            f.write(json.dumps(end_record(time.perf_counter() - t0, finished)) + "\n")
    log(
        f"sweep {spec.name} finished in {time.perf_counter() - t0:.0f} s; results in {sweep_dir / RESULTS_FILE}; "
        f"`lmlab report {sweep_dir}` writes the report"
    )
    return sweep_dir
