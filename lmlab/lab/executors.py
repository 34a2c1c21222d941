"""Where a sweep's runs train: local threads (``lmlab sweep --jobs N``, :class:`lmlab.lab.runner._Sweep`), a
Slurm cluster or this machine through submitit (``--executor slurm`` / ``--executor submitit-local``), or a
Ray cluster (``--executor ray --address ...``, :class:`lmlab.lab.ray_executor.RayExecutor`).

The coordinator (``lmlab sweep``) plans the runs, writes each one's ``plans/RUN.json``
(:mod:`lmlab.lab.worker`), submits them, waits for every job of a stage before planning the next (the spec's
barriers: the tuning stage before the evaluation seeds, the grid's extension), and merges the rows the
jobs write (``rows/RUN.json``) into ``results.jsonl``. Each job is :class:`SweepTask`: it trains its runs
(``runs_per_task`` of them at once, e.g. several small runs sharing one GPU) with
:func:`lmlab.lab.worker.run_names`.

Preemption and time limits: Slurm (``#SBATCH --signal=USR2@...``, which submitit sets) and ``scancel
--signal USR2`` send SIGUSR2; submitit then calls :meth:`SweepTask.checkpoint`, which sends SIGTERM to the
training subprocesses (each checkpoints its last finished step and exits), and requeues the job; the
requeued job continues every unfinished run from its checkpoint (resume is exact: the row equals an
uninterrupted run's). A cluster's own preemption sends SIGTERM to every process of the job: the trainings
checkpoint on it; a partition with ``PreemptMode=REQUEUE`` requeues the job (its next attempt continues the
runs), one with ``PreemptMode=CANCEL`` ends it as ``PREEMPTED``, and the coordinator submits its runs
again (they continue from their checkpoints). ``srun``, signalled with the job, ends the job's step within
about a second ("forcing job termination"): a training that has not saved its checkpoint by then continues
from its last periodic one. A task whose trainings did stop in time waits for Slurm to end the job (with a
``GraceTime`` on the partition, at its end): a task that ended itself first would leave the job FAILED,
which Slurm neither requeues nor calls preempted. Each requeue or resubmission is recorded in
``requeues.jsonl``.

Stopping the coordinator (SIGINT, SIGTERM, a lost login) leaves the jobs running: the submitted jobs are
recorded in ``jobs.jsonl`` (job id, runs, executor), and the same command later re-attaches to those still
queued or running (Slurm: by job id through ``squeue``; submitit-local: by process id), merges the
rows of those that finished meanwhile, and submits only runs that have neither a row nor a live job.

submitit's own files (``submitit/``: the submission and result pickles it writes and reads inside its
jobs) are written by this sweep's processes; lmlab reads no pickle back: a job's outcome is its row.

Source: submitit (https://github.com/facebookincubator/submitit), its ``helpers.Checkpointable`` and job
arrays (``Executor.map_array``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from lmlab.config import ConfigError
from lmlab.json_checks import jsonl_objects
from lmlab.lab.worker import failed_row, read_plan, read_row, run_names, stop_training

JOBS_FILE = "jobs.jsonl"
RAY_KEYS = ("address", "cpus_per_task", "gpus_per_node", "max_retries")  # what --executor ray takes
REQUEUES_FILE = "requeues.jsonl"
SLURM_END_WAIT_S = 600  # after a SIGTERM from Slurm, how long a task whose trainings stopped waits to be ended
SIGNAL_DELAY_S = 120  # Slurm sends SIGUSR2 this long before a job's time limit (submitit's slurm_signal_delay_s)
SUBMITIT_DIR = "submitit"
EXECUTORS = ("local", "slurm", "submitit-local", "ray")


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError(
            "--executor slurm and submitit-local need submitit: pip install 'lmlab[slurm]' (or pip install submitit)"
        ) from None
    return submitit


class SweepTask:
    """One submitit job: train, evaluate and record runs ``names`` of sweep ``sweep_dir`` (see the module
    docstring). Returns the number of rows written (the outcome lmlab reads is the rows, not this).
    Checkpointable in submitit's sense: submitit calls :meth:`checkpoint` on preemption or timeout."""

    def __call__(self, sweep_dir: str, names: list, threads: int) -> int:
        attempt, job_id = _attempt(), _job_id()
        if attempt and not any(  # requeued by Slurm itself (a preemption, `scontrol requeue`): note it once
            r.get("job_id") == job_id and r.get("attempt") == attempt for r in read_requeues(Path(sweep_dir))
        ):
            _note_requeue(
                Path(sweep_dir),
                {"runs": list(names), "job_id": job_id, "attempt": attempt, "by": "slurm (preempted or requeued)"},
            )
        with _sigterm_noted() as signalled:
            try:
                rows = run_names(Path(sweep_dir), list(names), threads, log=lambda line: print(line, flush=True))
            except KeyboardInterrupt:  # cancelled (SIGINT) or SIGTERM: stop the trainings (they checkpoint)
                stop_training()
                if signalled and os.environ.get("SLURM_JOB_ID"):
                    _await_slurm_end(signalled[0])
                raise
        return len(rows)

    def checkpoint(self, sweep_dir: str, names: list, threads: int):
        """Preempted or near the time limit (submitit calls this on SIGUSR2): stop the training
        subprocesses (each checkpoints its last finished step), note the requeue, and ask submitit to
        requeue the same task."""

        stopped = stop_training()
        rec = {
            "runs": list(names),
            "job_id": _job_id(),
            "attempt": _attempt() + 1,
            "by": "submitit (SIGUSR2: time limit or preemption)",
            "stopped_trainings": stopped,
        }
        _note_requeue(Path(sweep_dir), rec)
        return _submitit().helpers.DelayedSubmission(self, sweep_dir, names, threads)


@contextlib.contextmanager
def _sigterm_noted():
    """Yields a list that gets the time of the first SIGTERM this process receives inside the block; the
    handler before it (submitit's, which ignores the signal) still runs, and is restored after. Main thread."""
    got: list = []
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        if not got:
            got.append(time.time())
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _await_slurm_end(since: float) -> None:
    """Slurm sent this job SIGTERM (a preemption with a ``GraceTime``, ``scancel``) and its trainings have
    checkpointed and exited: wait for Slurm to end the job as its partition says (requeue it, cancel it as
    PREEMPTED, kill it at the grace time's end) instead of ending it here as FAILED, which Slurm would not
    requeue; after ``SLURM_END_WAIT_S`` without that, return (the caller raises: the job fails, and the runs
    continue from their checkpoints in the next sweep)."""
    print(f"SIGTERM from Slurm: trainings checkpointed; waiting for Slurm to end job {_job_id()}", flush=True)
    while time.time() - since < SLURM_END_WAIT_S:
        time.sleep(1.0)


def _job_id() -> Optional[str]:
    """This job's id as the coordinator recorded it (an array task's ``ARRAY_TASK``), from submitit."""
    try:
        return str(_submitit().JobEnvironment().job_id)
    except RuntimeError:  # not inside a submitit job (called directly, as in a test)
        return os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")


def _attempt() -> int:
    """This job's attempt: 0 the first, n after n requeues (Slurm's ``SLURM_RESTART_COUNT``; 0 elsewhere)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def _note_requeue(sweep_dir: Path, rec: dict) -> None:
    """Append ``rec`` (runs, job_id, by, ...) with the time to the sweep's ``requeues.jsonl`` (one line,
    appended: the jobs of a sweep write it concurrently)."""
    rec = {**rec, "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with open(sweep_dir / REQUEUES_FILE, "a") as f:
        f.write(json.dumps(rec) + "\n")


def read_requeues(sweep_dir: Path) -> list[dict]:
    """The records of ``requeues.jsonl`` (empty when there is none). Raises ConfigError for a line that is
    not a JSON object (a damaged file)."""
    path = sweep_dir / REQUEUES_FILE
    out = []
    for _, rec in jsonl_objects(path) if path.is_file() else []:
        if isinstance(rec, ConfigError):
            raise rec
        out.append(rec)
    return out


def job_records(sweep_dir: Path) -> list[dict]:
    """The records of the sweep's ``jobs.jsonl`` (job_id, runs, executor; empty when there is none).
    Raises ConfigError naming the line for one lmlab did not write (a damaged file)."""
    path = sweep_dir / JOBS_FILE
    if not path.is_file():
        return []
    out = []
    for where, rec in jsonl_objects(path):
        if not (
            isinstance(rec, dict)
            and isinstance(rec.get("job_id"), str)
            and isinstance(rec.get("runs"), list)
            and rec.get("executor") in ("slurm", "submitit-local")
            and isinstance(rec.get("resources", {}), dict)
        ):
            raise ConfigError(f"{where}: not a job record lmlab wrote (job_id, runs, executor); the file is damaged")
        out.append(rec)
    return out


def check_no_jobs_elsewhere(sweep_dir: Path, executor: str, log: Callable[[str], None] = print) -> None:
    """Refuse (ConfigError) to run the sweep with ``executor`` while jobs that another executor submitted
    for it still run: the same runs would be trained twice at once (their run locks let one of each pair
    fail). Slurm jobs are judged from ``squeue`` (a line is logged when it cannot be run: unknown, not
    refused); submitit-local jobs from their controller process."""
    live = _live([r for r in job_records(sweep_dir) if r["executor"] != executor], log)
    if live:
        kinds = sorted({r["executor"] for r in live})
        raise ConfigError(
            f"--executor {executor}: runs of this sweep are still in {len(live)} job(s) submitted with "
            f"--executor {' and '.join(kinds)} ({', '.join(r['job_id'] for r in live[:5])}"
            f"{', ...' if len(live) > 5 else ''}); rerun with --executor {kinds[0]} to wait for them, or cancel "
            f"them first (scancel / stop their controller)"
        )


def _live(records: list[dict], log: Callable[[str], None]) -> list[dict]:
    """The job records whose jobs still run: Slurm's by ``squeue`` (one line logged when it cannot be run:
    unknown, counted as not running), submitit-local's by their controller process."""
    slurm = [r for r in records if r["executor"] == "slurm"]
    states = slurm_states() if slurm else None
    if slurm and states is None:
        log(
            f"note: {len(slurm)} Slurm job(s) of this sweep ({slurm[-1]['job_id']}, ...): squeue cannot be run "
            "here, so whether they still run is unknown"
        )

    def running(r: dict) -> bool:
        if r["executor"] == "slurm":
            return states is not None and states.get(r["job_id"]) not in (None, *TERMINAL)
        return r["job_id"].isdigit() and _pid_alive(int(r["job_id"]))

    return [r for r in records if running(r)]


def resources(threads: int, params: Optional[dict]) -> dict:
    """What a job's runs are given, as recorded with it: torch threads per run, CPUs and GPUs per task."""
    params = params or {}
    return {
        "threads": int(threads),
        "cpus_per_task": params.get("cpus_per_task"),
        "gpus_per_node": params.get("gpus_per_node"),
    }


def check_same_resources(sweep_dir: Path, executor: str, threads: int, params: Optional[dict], log=print) -> None:
    """Refuse (ConfigError) to re-attach to jobs of ``executor`` that still run with other resources than
    this command gives (``--threads``, ``--cpus-per-task``, ``--gpus-per-task``): the runs of one sweep
    would train with different threads, and their speed figures would not compare. Jobs recorded before
    lmlab recorded resources (2026-12-06) are not checked."""
    want = resources(threads, params)
    for r in _live([r for r in job_records(sweep_dir) if r["executor"] == executor and "resources" in r], log):
        diff = [k for k in want if r["resources"].get(k) != want[k]]
        if diff:
            flag, shown = {**FLAGS, "threads": "--threads"}, lambda v: "unset" if v is None else v
            said = ", ".join(f"{flag[k]} {shown(r['resources'].get(k))} (this command: {shown(want[k])})" for k in diff)
            raise ConfigError(
                f"--executor {executor}: job {r['job_id']} of this sweep still runs with {said}; rerun with the "
                f"job's options to re-attach to it, or cancel it first (scancel {r['job_id']} / stop its controller)"
            )


def chunks(names: list, size: int) -> list[list]:
    return [names[i : i + size] for i in range(0, len(names), size)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    except OSError:
        return False
    try:  # the pid may have been reused: a submitit controller's command line names submitit
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        return b"submitit" in cmdline
    except OSError:
        return True


TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "SPECIAL_EXIT",
    "REVOKED",
    "PREEMPTED",  # a preemption that cancels (PreemptMode=CANCEL): the coordinator submits its runs again
}
# A job seen ended while a run of it has no row is taken as over only when it still is this many seconds
# later: one squeue snapshot is not trusted alone. (A requeue shows COMPLETING, then PENDING, not a terminal
# state; the FAILED requeues seen in CI were real failures: a test released the job within the second of
# its requeue, and slurmd refused it as "Job credential revoked".)
TERMINAL_CONFIRM_S = 10.0


def slurm_states() -> Optional[dict]:
    """{job id: state} of every job Slurm still knows, from one ``squeue`` call (which needs no
    accounting database, unlike submitit's ``sacct``; array tasks one per line as ``JOB_TASK``); None when
    squeue cannot be run (then nothing is concluded from it)."""
    out = _squeue("-o", "%i %T")
    return None if out is None else dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def slurm_restarts() -> Optional[dict]:
    """{job id: how many times Slurm requeued it} (a preemption, ``scontrol requeue``, submitit's requeue at
    the time limit) for every job Slurm still knows, ids as :func:`slurm_states` gives them; None when
    squeue cannot be run."""
    out = _squeue("-O", "ArrayJobID:|,ArrayTaskID:|,RestartCnt:|")
    counts = {}
    for parts in ([p.strip() for p in line.split("|")] for line in (out or "").splitlines()):
        if len(parts) >= 3 and parts[0] and parts[2].isdigit():
            counts[parts[0] if parts[1] in ("", "N/A") else f"{parts[0]}_{parts[1]}"] = int(parts[2])
    return None if out is None else counts


def _squeue(*fmt: str) -> Optional[str]:
    """The output of ``squeue -h -r -t all`` with format ``fmt``; None when it cannot be run."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", *fmt], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


class _OrphanLocalJob:
    """A submitit-local job started by an earlier coordinator: alive while its controller process is."""

    def __init__(self, job_id: str):
        self.job_id = job_id

    def done(self) -> bool:
        return not _pid_alive(int(self.job_id))

    @property
    def state(self) -> str:
        return "FINISHED" if self.done() else "RUNNING"


def _make(folder: Path, kind: str, params: Optional[dict], name: str):
    """submitit's executor for ``kind`` in ``folder`` (which it creates) with ``params`` and lmlab's
    defaults; returns (executor, parameters). Raises ConfigError: no Slurm here, or a bad parameter."""
    submitit = _submitit()
    try:
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm" if kind == "slurm" else "local")
    except RuntimeError as exc:  # submitit: no srun on this machine
        raise ConfigError(f"--executor {kind}: {exc}") from None
    given = dict(params or {})
    params = dict(given)
    params.setdefault("timeout_min", 24 * 60)
    params.setdefault("name", f"lmlab-{name}")
    if kind == "slurm":
        params.setdefault("slurm_signal_delay_s", SIGNAL_DELAY_S)
    try:
        ex.update_parameters(**params)
    except (NameError, ValueError, TypeError, AssertionError) as exc:
        why = " ".join(str(exc).split())
        why = why if len(why) <= 240 else why[:240] + "..."
        raise ConfigError(
            f"--executor {kind}: a parameter submitit refuses among {sorted(given)}: {why} (names: "
            f"submitit's AutoExecutor parameters, e.g. timeout_min, mem_gb, cpus_per_task, "
            f"gpus_per_node, slurm_partition, slurm_account, slurm_additional_parameters)"
        ) from None
    return ex, params


def slurm_preflight(params: dict) -> None:
    """Ask Slurm whether it would accept a job with ``params``' partition, CPUs, GPUs, time and memory
    (``sbatch --test-only``: nothing is queued); raise ConfigError with sbatch's reason if not."""

    flags = {
        "slurm_partition": "--partition={}",
        "cpus_per_task": "--cpus-per-task={}",
        "gpus_per_node": "--gpus-per-node={}",
        "timeout_min": "--time={}",
        "mem_gb": "--mem={}G",
        "slurm_account": "--account={}",
        "slurm_qos": "--qos={}",
        "slurm_constraint": "--constraint={}",
    }
    args = [f.format(params[k]) for k, f in flags.items() if params.get(k)]
    try:
        out = subprocess.run(
            ["sbatch", "--test-only", *args, "--wrap", "true"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--executor slurm: sbatch could not be run ({exc})") from None
    if out.returncode != 0:
        why = " ".join((out.stderr or out.stdout).split()) or f"exit status {out.returncode}"
        raise ConfigError(f"--executor slurm: Slurm refuses a job with {' '.join(args) or 'no options'}: {why}")


FLAGS = {
    "slurm_partition": "--slurm-partition",
    "timeout_min": "--time",
    "cpus_per_task": "--cpus-per-task",
    "gpus_per_node": "--gpus-per-task",
    "slurm_array_parallelism": "--array-parallelism",
    "address": "--address",
    "max_retries": "--max-retries",
}


def _named(keys) -> str:
    return ", ".join(FLAGS.get(k, k) for k in sorted(keys))


def _options(n: int) -> str:
    return "an option" if n == 1 else "options"


def check_executor_params(kind: str, params: dict, runs_per_task: int = 1) -> None:
    """Refuse (ConfigError, before anything is written) options that do not go with executor ``kind``, a
    negative GPU count, a fraction of a GPU on Slurm, retries below -1; for Slurm and submitit-local, also
    what submitit refuses and (Slurm) what ``sbatch --test-only`` refuses."""
    if kind not in EXECUTORS:
        raise ConfigError(f"--executor {kind!r}: choose one of {', '.join(EXECUTORS)}")
    if not isinstance(runs_per_task, int) or runs_per_task < 1:
        raise ConfigError(f"--runs-per-task {runs_per_task!r} must be an integer >= 1")
    ray_only = {k for k in params if k in ("address", "max_retries")}
    if kind == "local" and (params or runs_per_task != 1):
        given = _named(params) or "--runs-per-task"
        raise ConfigError(
            f"{given}: not {_options(len(params) or 1)} of the local executor (--jobs N sets its runs at once); "
            f"--address and --max-retries go with --executor ray, the others with --executor "
            f"slurm, submitit-local or ray"
        )
    if kind == "ray" and set(params) - set(RAY_KEYS):
        raise ConfigError(
            f"{_named(set(params) - set(RAY_KEYS))}: not {_options(len(set(params) - set(RAY_KEYS)))} of "
            f"--executor ray (it takes "
            f"{_named(RAY_KEYS)}); they go with --executor slurm or submitit-local"
        )
    if kind in ("slurm", "submitit-local") and ray_only:
        raise ConfigError(f"{_named(ray_only)}: {_options(len(ray_only))} of --executor ray, not of --executor {kind}")
    minutes, delay = params.get("timeout_min"), params.get("slurm_signal_delay_s", SIGNAL_DELAY_S)
    if kind == "slurm" and isinstance(minutes, (int, float)) and isinstance(delay, (int, float)):
        if 0 < minutes * 60 <= delay:  # signalled as it starts: every attempt stopped and requeued at once
            raise ConfigError(
                f"--time {minutes}: not longer than the {delay} s before the limit at which Slurm signals a "
                f"job to checkpoint and requeue; give --time above {delay / 60:g} minutes (or a smaller "
                f"slurm_signal_delay_s in --executor-config)"
            )
    empty = sorted(k for k, v in params.items() if isinstance(v, str) and not v.strip())
    if empty:  # e.g. --slurm-partition '': sbatch would take it as no partition and fail at submission
        raise ConfigError(f"{_named(empty)}: empty; give a value or leave the option out")
    gpus = params.get("gpus_per_node")
    if gpus is not None:
        if not isinstance(gpus, (int, float)) or isinstance(gpus, bool) or gpus < 0:
            raise ConfigError(f"--gpus-per-task {gpus!r}: give a number >= 0")
        if kind != "ray" and not float(gpus).is_integer():
            raise ConfigError(
                f"--gpus-per-task {gpus!r}: Slurm counts whole GPUs (give an integer); fractions "
                f"of a GPU go with --executor ray, or --runs-per-gpu N shares one"
            )
    retries = params.get("max_retries")
    if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool) or retries < -1):
        raise ConfigError(f"--max-retries {retries!r}: give an integer >= 0, or -1 for unlimited (Ray's meaning)")
    if kind in ("slurm", "submitit-local"):
        check_params(kind, params)


def check_params(kind: str, params: Optional[dict]) -> None:
    """Raise ConfigError now, before a sweep writes anything, for parameters :class:`SubmititExecutor`
    would refuse (checked on a scratch folder)."""

    with tempfile.TemporaryDirectory() as tmp:
        _, full = _make(Path(tmp) / "%j", kind, params, "check")
    if kind == "slurm":
        slurm_preflight(full)


class SubmititExecutor:
    """Runs batches of planned runs as submitit jobs on Slurm (``kind='slurm'``) or on this machine
    (``kind='submitit-local'``, submitit's LocalExecutor: one process per job, at most ``parallelism`` at
    once). ``params`` are submitit parameters (e.g. ``slurm_partition``, ``timeout_min``,
    ``cpus_per_task``, ``gpus_per_node``, ``slurm_array_parallelism``, ``slurm_additional_parameters``);
    an unknown name raises ConfigError naming it."""

    def __init__(
        self,
        sweep_dir: Path,
        kind: str,
        params: Optional[dict] = None,
        runs_per_task: int = 1,
        threads: int = 1,
        parallelism: int = 1,
        poll_s: Optional[float] = None,
        log: Callable[[str], None] = print,
    ):
        if kind not in ("slurm", "submitit-local"):
            raise ConfigError(f"executor {kind!r}: SubmititExecutor runs 'slurm' or 'submitit-local'")
        self.dir, self.kind, self.runs_per_task = Path(sweep_dir), kind, int(runs_per_task)
        # seconds between polls: one squeue call per poll on Slurm; on submitit-local a poll reads a file, and a
        # free slot waits for it (short runs one after another lost up to 5 s each at 5 s)
        poll_s = poll_s if poll_s is not None else (5.0 if kind == "slurm" else 0.5)
        self.threads, self.parallelism, self.poll_s, self.log = int(threads), int(parallelism), poll_s, log
        self.ex, params = _make(self.dir / SUBMITIT_DIR / "%j", kind, params, self.dir.name)
        self.params = params
        self.squeue: Optional[dict] = None  # {job id: state} at the last poll (Slurm; None: squeue failed)

    # --- bookkeeping ------------------------------------------------------------------------
    def _record(self, job_id: str, names: list) -> None:
        with open(self.dir / JOBS_FILE, "a") as f:
            f.write(
                json.dumps(
                    {
                        "job_id": job_id,
                        "runs": names,
                        "executor": self.kind,
                        "resources": resources(self.threads, self.params),
                        "t": time.time(),
                        "submitted": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    }
                )
                + "\n"
            )

    def _attach(self, job_id: str):
        submitit = _submitit()
        if self.kind == "slurm":
            return submitit.SlurmJob(folder=self.dir / SUBMITIT_DIR / "%j", job_id=job_id)
        return _OrphanLocalJob(job_id)

    def requeues(self, jobs=()) -> int:
        """Requeues and resubmissions of this sweep: those recorded in ``requeues.jsonl``, plus those Slurm
        made of ``jobs`` (ids) that no attempt has recorded yet (a requeued job Slurm holds pending before
        its next attempt starts and notes it: attempts 1..restart count without a record)."""
        records = read_requeues(self.dir)
        restarts = (slurm_restarts() or {}) if self.kind == "slurm" and jobs else {}
        unseen = 0
        for job_id in jobs:
            noted = {r.get("attempt") for r in records if r.get("job_id") == job_id}
            unseen += sum(a not in noted for a in range(1, restarts.get(job_id, 0) + 1))
        return len(records) + unseen

    # --- running a batch --------------------------------------------------------------------
    def live_jobs(self, names: set) -> dict:
        """Jobs recorded by earlier invocations that still run any of ``names``: {job: its runs}."""
        live = {}
        self.squeue = slurm_states() if self.kind == "slurm" else None
        for rec in job_records(self.dir):
            if rec["executor"] != self.kind or not names.intersection(rec["runs"]):
                continue
            job = self._attach(rec["job_id"])
            if not self._over(job):
                live[job] = list(rec["runs"])
        return live

    def _submit(self, groups: list[list]) -> dict:
        task = SweepTask()
        args = [(str(self.dir), g, self.threads) for g in groups]
        try:
            if self.kind == "slurm":  # one job array: Slurm runs slurm_array_parallelism tasks at once
                jobs = self.ex.map_array(task, *(list(col) for col in zip(*args)))
            else:
                jobs = [self.ex.submit(task, *a) for a in args]
        except _submitit().core.utils.FailedJobError as exc:
            why = " ".join(str(exc).split())
            raise ConfigError(
                f"--executor {self.kind}: the scheduler refused the jobs: {why[-400:]} (the sweep "
                f"folder {self.dir} keeps what was planned; fix the options and rerun the same "
                f"command)"
            ) from None
        for job, g in zip(jobs, groups):
            self._record(str(job.job_id), g)
        return dict(zip(jobs, groups))

    def run(self, names: list, on_row: Callable[[dict, float], None]) -> None:
        """Run ``names`` (their plans written) to a row each; ``on_row(row, seconds)`` as each finishes.
        Returns when every run has a row (a job that ended without one gives a ``failed`` row naming its
        log and the command that reproduces it)."""

        t0 = time.time()
        pending = list(names)
        running = self.live_jobs(set(pending))
        for job, g in running.items():
            self.log(f"re-attached to job {job.job_id} ({', '.join(g)})")
        attached = {n for g in running.values() for n in g}
        queue = chunks([n for n in pending if n not in attached], self.runs_per_task)
        if self.kind == "slurm" and queue:
            running.update(self._submit(queue))
            queue = []
        done_at: dict = {}
        failed: set = set()
        ended_at: dict = {}  # job -> when it was first seen ended with a run still without a row
        last_status = 0.0
        while running or queue:
            while queue and len(running) < self.parallelism:  # submitit-local: a bounded number at once
                running.update(self._submit([queue.pop(0)]))
            self.squeue = slurm_states() if self.kind == "slurm" else None
            finished = []
            for job, g in running.items():
                if not self._over(job):
                    ended_at.pop(job, None)
                elif all(read_row(self.dir, n) is not None for n in g):
                    finished.append(job)
                elif time.monotonic() - ended_at.setdefault(job, time.monotonic()) >= TERMINAL_CONFIRM_S:
                    finished.append(job)  # still ended, a row missing: the job ended without one
            for job in finished:
                g = running.pop(job)
                missing = [n for n in g if read_row(self.dir, n) is None]
                if missing and self._state(job) == "PREEMPTED":  # cancelled by a preemption: submit again
                    again = self._submit([missing])
                    (new_id,) = [str(j.job_id) for j in again]
                    _note_requeue(
                        self.dir,
                        {
                            "runs": missing,
                            "job_id": str(job.job_id),
                            "by": f"lmlab sweep (preempted and cancelled; submitted again as job {new_id})",
                        },
                    )
                    self.log(f"job {job.job_id} was preempted: {', '.join(missing)} submitted again as job {new_id}")
                    running.update(again)
                    g = [n for n in g if n not in missing]
                for n in g:
                    row = read_row(self.dir, n)
                    if row is None:
                        p, ev = read_plan(self.dir, n)
                        row = failed_row(p, ev.name, self._why(job, n))
                    done_at[n] = time.time()
                    if row["status"] == "failed":
                        failed.add(n)
                    on_row(row, time.time() - t0)
            if time.time() - last_status >= 60 or finished:
                self._status(len(names), done_at, len(failed), running, queue, t0)
                last_status = time.time()
            if running or queue:
                time.sleep(self.poll_s)

    def _over(self, job) -> bool:
        """Whether ``job`` has ended. Slurm: its state in ``squeue`` is terminal or Slurm forgot it (a job
        requeued after a preemption is not over, even if its first attempt left a result file); where
        squeue cannot be run, and on submitit-local, submitit's view (its result file)."""
        if self.kind == "slurm" and self.squeue is not None:
            state = self.squeue.get(str(job.job_id))
            return state is None or state in TERMINAL
        try:
            return bool(job.done())
        except Exception as exc:  # noqa: BLE001 -- scheduler unreachable: try again next poll
            self.log(f"job {job.job_id}: state unknown ({exc}); polling again")
            return False

    def _state(self, job) -> str:
        if self.kind == "slurm":
            return (self.squeue or {}).get(str(job.job_id), "GONE")
        try:
            return str(job.state)
        except Exception:  # noqa: BLE001
            return "UNKNOWN"

    def _why(self, job, name: str) -> str:
        state = self._state(job)
        paths = getattr(job, "paths", None)
        where = f"; its log: {paths.stderr}" if paths is not None else ""
        return (
            f"job {job.job_id} ended ({state}) without a row{where}; reproduce with "
            f"`lmlab sweep-worker {self.dir} {name}`"
        )

    def _status(self, total: int, done_at: dict, n_failed: int, running: dict, queue: list, t0: float) -> None:
        states: dict = {}
        for job in running:
            s = self._state(job)
            states[s] = states.get(s, 0) + len(running[job])
        queued = sum(v for k, v in states.items() if k in ("PENDING", "REQUEUED", "CONFIGURING")) + sum(map(len, queue))
        run_n = sum(v for k, v in states.items() if k not in ("PENDING", "REQUEUED", "CONFIGURING"))
        n_done = len(done_at)
        eta = ""
        if n_done and total > n_done:
            eta = f", ETA {((time.time() - t0) / n_done * (total - n_done)) / 60:.0f} min"
        self.log(
            f"{self.kind}: {queued} queued, {run_n} running, {n_done}/{total} done, {n_failed} failed, "
            f"{self.requeues([str(job.job_id) for job in running])} requeue(s){eta}"
        )
