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
:func:`lmlab.runs.setup_run`; ``--jobs N`` runs N at once, each with physical cores // N torch threads,
:func:`lmlab.threads.sweep_threads`); the
sweep process then scores the whole validation split (bits-per-byte, :func:`lmlab.evaluate.evaluate`),
optionally at longer contexts and the decode speed, and records the result. The timing block runs
first, alone, before any training. Rerunning the same command resumes: runs with a result are skipped,
trained runs are only evaluated, interrupted runs continue from their last checkpoint, a finished timing
block is kept. A run that stops on non-finite losses (after ``max_bad_steps``: its ``outcome.json`` says
``diverged``, :mod:`lmlab.run_folder`) is recorded as diverged and the sweep goes on. With
``tune_seeds`` (two-stage tuning) the tune seeds' runs of every grid value train first; the value each
(scale, variant) gets is then chosen from their recorded results and the other seeds train at it alone
(a resumed sweep makes the same choice from the same rows). The sweep folder's files and each run's row:
:mod:`lmlab.lab.results`; the provenance records: :mod:`lmlab.lab.provenance`; the plan it prints:
:mod:`lmlab.lab.plan`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from lmlab.config import ConfigError
from lmlab.data.shards import TokenData
from lmlab.fsutil import atomic_write_text
from lmlab.json_checks import check_nesting
from lmlab.kernels.settings import default_kernels
from lmlab.lab.executors import EXECUTORS, check_executor_params
from lmlab.lab.plan import RunPlan, _split_fields, format_plan, plan_runs, run_stem, too_few_tokens, trained_plans
from lmlab.lab.provenance import LoadSampler, end_record, provenance_record
from lmlab.lab.results import (
    INIT_GRADS_FILE,
    LOAD_FILE,
    PROVENANCE_FILE,
    RESULTS_FILE,
    TIMING_FILE,
    _check_existing,
    _machine,
    read_results,
    run_state,
)
from lmlab.lab.spec import Spec, load_spec
from lmlab.lab.tuning import extensions
from lmlab.lab.validate import read_provenance
from lmlab.lab.verdicts import select_tuned, split_stages
from lmlab.lab.worker import EvalSettings, finished_row, run_planned, stop_training, write_plan
from lmlab.threads import current_threads, physical_cores, set_threads, sweep_threads, using_threads


# --- the sweep -----------------------------------------------------------------------------
def retuned(p: RunPlan, tune: dict) -> RunPlan:
    """Run ``p`` at other tuned values ``tune`` (a TrainConfig field such as the learning rate: the grid's
    extension, :mod:`lmlab.lab.tuning`): the same model, seed, data and steps, named as the spec names
    its runs (:func:`lmlab.lab.spec.run_stem`). Raises ConfigError for a tuned model field (its steps
    could change under a FLOPs budget: not extended)."""

    tm, tt = _split_fields(tune)
    if tm:
        raise ConfigError(f"the grid of {sorted(tm)} cannot be extended (a model field); extend it in the spec")
    return dataclasses.replace(
        p,
        name=f"{run_stem(p.variant, p.scale, tune)}-s{p.seed}",
        tc=dataclasses.replace(p.tc, **tt),
        tune=dict(tune),
        fields={**p.fields, **tune},
    )


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
        rows = [self.rows[n] for n in order if n in self.rows] + [r for n, r in self.rows.items() if n not in order]
        path = self.dir / RESULTS_FILE
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))

    def log(self, line: str) -> None:
        """One line of progress; one worker's at a time (print from two threads can run lines together)."""
        with self.log_lock:
            self._say(line)

    def job(self, p: RunPlan) -> None:

        if self.stopping:
            return
        t0 = time.perf_counter()
        row = run_planned(
            self.dir,
            p,
            EvalSettings.of(self.spec),
            self.threads,
            self.eval_lock,
            stopping=lambda: self.stopping,
            log=self.log,
        )
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

        while True:
            tune_rows, _ = split_stages(list(self.rows.values()), self.spec)
            todo = []
            for scale, variant, tune in extensions(tune_rows, self.spec):
                cell = [p for p in self.plans if not p.stage2 and (p.scale, p.variant) == (scale, variant)]
                seeds = sorted({p.seed for p in cell})
                at = ", ".join(f"{k}={v:g}" for k, v in tune.items())
                self.log(
                    f"extend: {variant}{f' @{scale}' if scale else ''}: its best value is at an edge of "
                    f"the grid; adding {at} for seed(s) {', '.join(map(str, seeds))}"
                )
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


def run_timing(spec: Spec, plans: list[RunPlan], sweep_dir: Path, log: Callable[[str], None]) -> Optional[dict]:
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
    from lmlab.devices import resolve_device, resolve_dtype
    from lmlab.lab.timing import time_variants

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


def run_init_grads(spec: Spec, plans: list[RunPlan], sweep_dir: Path, log: Callable[[str], None]) -> Optional[dict]:
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
    from lmlab.lab.init_grads import init_grad_norms

    g = spec.init_grads
    log(f"init_grads: {len(cfgs)} model(s) at depths {g['depths']}, seeds {g['seeds']}, batch {g['batch']}")
    with using_threads(physical_cores()):
        out = {
            "key": key,
            "variants": {
                label: init_grad_norms(p.cfg, TokenData(p.data).tokens("train"), g["depths"], g["seeds"], g["batch"])
                for label, p in cfgs.items()
            },
        }
    out["finished_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    atomic_write_text(path, json.dumps(out, indent=1))
    return json.loads(json.dumps(out))  # depths and seeds as the file holds them (string keys)


def default_out(spec: Spec) -> Path:
    return Path("sweeps") / spec.name


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
    dtype: Optional[str] = None,
    compile: bool = False,
) -> Path:
    """Plan, time, train, evaluate and record every run of ``spec`` in the sweep folder ``out`` (default
    ``sweeps/NAME``, ``sweeps/NAME-TIER`` at a ``tier`` of the spec's ``tiers:``, ``sweeps/NAME-DTYPE``
    with every run in precision ``dtype`` instead of the spec's, ``-compiled`` with ``compile``:
    :func:`lmlab.lab.spec.apply_switches`); returns the folder.
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

    if executor not in EXECUTORS:
        raise ConfigError(f"--executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if not isinstance(runs_per_task, int) or runs_per_task < 1:
        raise ConfigError(f"--runs-per-task {runs_per_task!r} must be an integer >= 1")

    check_executor_params(executor, dict(executor_params or {}), runs_per_task)
    if isinstance(spec, Spec) and tier is not None and spec.tier != tier:
        raise ConfigError(f"the spec was read at tier {spec.tier!r}, not {tier!r}; pass its file or name")
    if isinstance(spec, Spec) and (dtype is not None or compile):
        raise ConfigError("dtype and compile apply to a spec file or name, not a parsed Spec (read it so)")
    spec = spec if isinstance(spec, Spec) else load_spec(spec, tier, max_runs, dtype, compile)
    if max_runs is not None and spec.planned_runs > max_runs:
        raise ConfigError(f"the spec plans {spec.planned_runs:,} runs, more than --max-runs {max_runs:,}")
    sweep_dir = Path(out) if out else default_out(spec)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ConfigError(f"--out {str(sweep_dir)!r} is a file, not a sweep folder; choose a folder path")
    check_sweep_folder(sweep_dir, spec.name)
    lock = None
    if not dry_run:  # one sweep per folder (the runs' own locks keep each run folder to one trainer)
        from lmlab.fsutil import acquire_lock

        lock = acquire_lock(sweep_dir, "lmlab sweep")
        if lock.note:
            print(lock.note, file=sys.stderr)
    try:
        return _run_locked(
            spec,
            sweep_dir,
            jobs,
            dry_run,
            log,
            data_dir,
            command,
            (executor, dict(executor_params or {}), runs_per_task),
        )
    finally:
        if lock is not None:
            lock.release()


def check_sweep_folder(sweep_dir: Path, name: str) -> None:
    """Refuse ``--out`` unless it is new, empty, or a sweep of the spec ``name``: lmlab sweep's own folder
    holds ``spec.yaml`` with its ``provenance.jsonl`` or ``results.jsonl``, and every row and provenance
    record there names this sweep. Raises ConfigError naming the folder and what it holds, before
    anything is written (a foreign ``spec.yaml`` is never overwritten, another sweep's rows never mixed)."""
    if not sweep_dir.is_dir() or not any(sweep_dir.iterdir()):
        return
    held = sorted(p.name for p in sweep_dir.iterdir())
    ours = [f for f in (PROVENANCE_FILE, RESULTS_FILE) if (sweep_dir / f).is_file()]
    if not (sweep_dir / "spec.yaml").is_file() or not ours:
        raise ConfigError(
            f"--out {str(sweep_dir)!r} is a non-empty folder that is not a sweep (it holds "
            f"{', '.join(held[:6])}{', ...' if len(held) > 6 else ''}; a sweep's folder holds spec.yaml with "
            f"{PROVENANCE_FILE} or {RESULTS_FILE}); choose a new folder or an existing sweep's folder"
        )

    names = {r.get("sweep") for r in read_results(sweep_dir)}
    names |= {r.get("sweep") for r in read_provenance(sweep_dir / PROVENANCE_FILE)}
    others = sorted(str(n) for n in names - {name, None})
    if others:
        raise ConfigError(
            f"--out {str(sweep_dir)!r} holds sweep {others[0]!r}, not {name!r}: one folder holds one spec's "
            f"sweep; choose another folder (nothing was written)"
        )


def _run_locked(
    spec: Spec,
    sweep_dir: Path,
    jobs: int,
    dry_run: bool,
    log: Callable[[str], None],
    data_dir: Optional[Path],
    command: Optional[str],
    how: tuple = ("local", {}, 1),
) -> Path:
    """The body of :func:`run_sweep`, with the sweep folder locked (unless ``dry_run``)."""
    log(f"sweep {spec.name}: planning {spec.planned_runs:,} run(s)")
    plans = plan_runs(spec, data_dir)

    log(f"kernels: {default_kernels().describe()}")  # every run's model uses these (provenance.jsonl)
    if (sweep_dir / "spec.yaml").is_file():
        from lmlab.config_files import load_mapping

        try:
            load_mapping(sweep_dir / "spec.yaml")
        except ConfigError as exc:  # lmlab's own copy, damaged: the runs are checked against the spec below
            log(f"warning: {exc}; it is rewritten from the spec given (every run folder is checked against it)")
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
        + (
            f"{jobs} job(s) x {threads} thread(s)"
            if kind == "local"
            else f"executor {kind}, {per_task} run(s) per task x {threads} thread(s)"
            + (f", at most {jobs} task(s) at once" if kind == "submitit-local" else "")
        )
    )
    log(format_plan(plans, states, spec))
    short = too_few_tokens(spec, plans)
    if short:  # after the plan, so a dry run shows what it needs; a dry run of a refused sweep fails too
        raise ConfigError(short + (" (the plan above; the sweep refuses to start)" if dry_run else ""))
    if dry_run:
        return sweep_dir
    from lmlab.lab.executors import check_no_jobs_elsewhere, check_same_resources

    check_no_jobs_elsewhere(sweep_dir, kind, log)
    ex = None
    if kind in ("slurm", "submitit-local"):  # its parameters checked before anything is written
        from lmlab.lab.executors import SubmititExecutor

        check_same_resources(sweep_dir, kind, threads, params, log)
        ex = SubmititExecutor(sweep_dir, kind, params, per_task, threads, parallelism=jobs, log=log)
    elif kind == "ray":
        from lmlab.lab.ray_executor import RayExecutor

        ex = RayExecutor(
            sweep_dir,
            params.get("address"),
            per_task,
            threads,
            params.get("cpus_per_task"),
            params.get("gpus_per_node", 0),
            params.get("max_retries", 3),
            parallelism=jobs,
            log=log,
        )
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
            f"sweep interrupted ({str(exc) or 'SIGINT'}); {done} of {len(trained_plans(plans))} run(s) "
            f"recorded, the others "
            + (
                "checkpointed where they stopped; the same command resumes"
                if kind == "local"
                else "stopped with the coordinator (their trainings checkpointed); the same command continues them"
                if kind == "ray"
                else f"that were submitted keep running in their {kind} jobs (not cancelled); the same command "
                f"re-attaches to them"
            ),
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
