"""One unit of a sweep's work: train one planned run (continuing from its last checkpoint), evaluate it and
write its results row (``lmlab sweep-worker SWEEP RUN...``).

Every executor of a sweep (:mod:`lmlab.lab.executors`: local threads, Slurm or submitit's local executor,
Ray) runs its runs through :func:`run_planned`; the coordinator (:mod:`lmlab.lab.runner`) only plans,
submits, waits at the spec's barriers, merges rows and reports. What a worker needs is on disk in the
sweep folder, as JSON and YAML (nothing pickled):

- ``plans/RUN.json``: the run's plan (model and training config, data folder, variant, seed, tuned values,
  FLOPs per token) and the spec's evaluation settings, written by the coordinator before it submits;
- ``configs/RUN.yaml`` and ``logs/RUN.log``: the config ``lmlab train`` reads, and its output;
- ``runs/RUN/``: the ordinary run folder ``lmlab train`` writes (its own lock keeps it to one trainer);
- ``rows/RUN.json``: the results row, written atomically once the run is trained and evaluated; the
  coordinator merges it into ``results.jsonl``. A diverged run is a result (status ``diverged``); a
  training process that fails otherwise gives a ``failed`` row naming its log.

Training runs in its own process, ``lmlab train``, which checkpoints its last finished step on SIGTERM and
exits 143. On Linux the process is forked from a server that has torch and lmlab imported
(:mod:`lmlab.lab.fork_server`: about 3 s less per run than ``python -m lmlab.cli train``, the way
elsewhere and with ``launch="exec"``; the same results). The training process ignores SIGUSR2 (Slurm's
and submitit's preemption signal, sent to every process of a job step), so that the worker decides: it
forwards SIGTERM, waits for the checkpoint, and the requeued job continues from it. A worker that dies
outright takes its training down the same way (SIGTERM on the parent's death, Linux).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import yaml

from lmlab.config import ConfigError, ModelConfig
from lmlab.fsutil import LockError, LockHeld, acquire_lock, atomic_write_text
from lmlab.json_checks import read_json_object
from lmlab.lab.plan import RunPlan
from lmlab.lab.results import collect_result, run_state
from lmlab.lab.spec import Spec
from lmlab.lab.validate import check_row
from lmlab.run_folder import OUTCOME_FILE, CheckpointError, read_outcome
from lmlab.threads import set_threads

PLANS_DIR = "plans"
ROWS_DIR = "rows"

# The training subprocesses this process started and has not yet seen exit (any thread's): a preempted or
# interrupted worker stops them (SIGTERM: each checkpoints) before it exits. Not a switch: bookkeeping.
_LIVE: set = set()
_LIVE_LOCK = threading.Lock()
# How many times stop_training() ran: a training process registered after a stop (its launch was under
# way, e.g. waiting for the fork server to start) is stopped by the thread that launched it.
_STOPS = [0]


@dataclasses.dataclass
class EvalSettings:
    """What :func:`lmlab.lab.results.collect_result` reads of a spec: its name and evaluation settings."""

    name: str
    eval_contexts: list
    decode: dict
    measure_decode: bool
    loss_by_position: bool

    @classmethod
    def of(cls, spec: Spec) -> "EvalSettings":
        return cls(
            spec.name,
            list(spec.eval_contexts),
            dict(spec.decode),
            bool(spec.measure_decode),
            bool(spec.loss_by_position),
        )


# --- plans on disk -----------------------------------------------------------------------------
def plan_record(p: RunPlan, spec: Spec) -> dict:
    """``p`` and the spec's evaluation settings as JSON-ready data (:func:`read_plan` reads it back)."""
    return {
        "name": p.name,
        "variant": p.variant,
        "seed": p.seed,
        "fields": p.fields,
        "model": p.cfg.to_dict(),
        "train": dataclasses.asdict(p.tc),
        "tokens_per_step": p.tokens_per_step,
        "flops_per_token": p.flops_per_token,
        "data": str(p.data),
        "scale": p.scale,
        "tune": p.tune,
        "solved": p.solved,
        "stage2": p.stage2,
        "eval": dataclasses.asdict(EvalSettings.of(spec)),
    }


def write_plan(sweep_dir: Path, p: RunPlan, spec: Spec) -> Path:
    """Write ``plans/RUN.json`` (atomically; unchanged content is not rewritten) and return its path."""
    path = Path(sweep_dir) / PLANS_DIR / f"{p.name}.json"
    text = json.dumps(plan_record(p, spec), sort_keys=True, indent=1) + "\n"
    if not (path.is_file() and path.read_text() == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    return path


def read_plan(sweep_dir: Path, name: str) -> tuple[RunPlan, EvalSettings]:
    """The plan of run ``name`` in ``sweep_dir`` (``plans/NAME.json``). Raises ConfigError naming the file
    when it is missing (not a run the coordinator planned) or damaged."""
    from lmlab.train import TrainConfig

    path = Path(sweep_dir) / PLANS_DIR / f"{name}.json"
    if not path.is_file():
        have = sorted(q.stem for q in (Path(sweep_dir) / PLANS_DIR).glob("*.json"))
        raise ConfigError(
            f"{path}: no such plan; run {name!r} was not planned in sweep {str(sweep_dir)!r} "
            + (
                f"(planned: {', '.join(have[:5])}{', ...' if len(have) > 5 else ''})"
                if have
                else "(the folder has no plans: start the sweep with `lmlab sweep SPEC --out DIR`)"
            )
        )
    d = read_json_object(path)
    try:
        ev = EvalSettings(**d["eval"])
        p = RunPlan(
            name=d["name"],
            variant=d["variant"],
            seed=int(d["seed"]),
            fields=dict(d["fields"]),
            cfg=ModelConfig.from_dict(d["model"], str(path)),
            tc=TrainConfig.from_dict(d["train"], str(path)),
            tokens_per_step=int(d["tokens_per_step"]),
            flops_per_token=float(d["flops_per_token"]),
            data=Path(d["data"]),
            scale=d["scale"],
            tune=dict(d["tune"]),
            solved=dict(d["solved"]),
            stage2=bool(d["stage2"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{path}: not a plan lmlab wrote ({type(exc).__name__}: {exc}); the file is damaged; "
            f"rerun `lmlab sweep` on the folder to rewrite it"
        ) from None
    if p.name != name:
        raise ConfigError(f"{path}: holds the plan of {p.name!r}, not {name!r}; the file is damaged")
    return p, ev


def row_path(sweep_dir: Path, name: str) -> Path:
    return Path(sweep_dir) / ROWS_DIR / f"{name}.json"


def read_row(sweep_dir: Path, name: str) -> Optional[dict]:
    """The row a worker wrote for ``name`` (validated), or None when there is none yet."""

    path = row_path(sweep_dir, name)
    if not path.is_file():
        return None
    return check_row(read_json_object(path), str(path))


def finished_row(sweep_dir: Path, name: str, steps: Optional[int] = None) -> Optional[dict]:
    """The row of ``name`` when it is final: ok or diverged (a failed row is retried), and, given the
    planned ``steps``, an ok row only while its run folder is still trained that far (a row whose run lost
    its last checkpoint is not used: the run continues)."""

    row = read_row(sweep_dir, name)
    if row is None or row.get("status") not in ("ok", "diverged"):
        return None
    if steps is not None and row["status"] == "ok" and run_state(Path(sweep_dir) / "runs" / name, steps) != "trained":
        return None
    return row


# --- training and evaluation --------------------------------------------------------------------
def _log_since(path: Path, offset: int, n: int = 4000) -> str:
    """The last ``n`` characters written to ``path`` after byte ``offset``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")[-n:]
    except OSError:
        return ""


def _child_setup(parent: Optional[int] = None) -> None:
    """Runs in the training process first (before exec, or after the fork). SIGUSR2 ignored (SIG_IGN
    survives exec): the worker decides what a preemption does; SIGTERM at its default and unblocked (the
    fork server ignores and blocks it). On Linux, SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG; the
    parent is the worker, or the fork server, which exits with it), and at once when ``parent`` is no
    longer the parent: a worker killed outright (a Ray worker, a SIGKILLed coordinator) leaves no orphan
    training, which would hold the run's lock: the training checkpoints and stops, and the retried task
    continues it."""
    if hasattr(signal, "SIGUSR2"):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if parent is not None and os.getppid() != parent:  # the parent died before the line above: stop now
        os.kill(os.getpid(), signal.SIGTERM)


def _libc_prctl():
    """libc's prctl, looked up once in the parent (a forked child of a threaded process should call, not load)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
# Linux: forking a process that has imported torch is safe there (macOS's runtime is not fork-safe)
FORK_SERVER = sys.platform.startswith("linux")


# how long a run's (re)start waits for an earlier attempt's training to let go of the run folder
PREVIOUS_ATTEMPT_WAIT_S = 120.0


def wait_for_previous_attempt(run_dir: Path, timeout_s: Optional[float] = None, poll_s: float = 0.5) -> bool:
    """Wait until no process holds ``run_dir``'s lock (:func:`lmlab.fsutil.acquire_lock`, taken and released
    at once), at most ``timeout_s`` (default :data:`PREVIOUS_ATTEMPT_WAIT_S`); True when free. A task retried
    because its worker died (Ray, a requeued job) can start while the previous attempt's training, sent
    SIGTERM with its parent, still writes its checkpoint and holds the lock: launched then, the new training
    would be refused ("in use by") and the run recorded as failed. After the timeout it returns False and
    the training's own lock check names the holder (as it names a lock file that cannot be used)."""
    deadline = time.monotonic() + (PREVIOUS_ATTEMPT_WAIT_S if timeout_s is None else timeout_s)
    while True:
        try:
            acquire_lock(run_dir, "lmlab sweep (checking that no earlier attempt still trains this run)").release()
            return True
        except LockHeld:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        except LockError:  # a lock file that cannot be used: nothing to wait for (the training reports it)
            return True


def train_run(
    sweep_dir: Path,
    p: RunPlan,
    threads: int,
    stopping: Callable[[], bool] = lambda: False,
    launch: Optional[str] = None,
) -> tuple[bool, Optional[str]]:
    """Train (or continue) run ``p`` in its own process with ``threads`` torch threads; returns (diverged,
    error). ``launch``: ``fork`` (from :mod:`lmlab.lab.fork_server`; the default on Linux, where
    :data:`FORK_SERVER`) or ``exec`` (``python -m lmlab.cli train``); anything else raises ValueError.
    Raises KeyboardInterrupt when the process was stopped by a signal (it checkpointed: the same call
    continues it) or ``stopping()`` is true when it exits. Divergence is what the trainer wrote in the run
    folder's ``outcome.json`` (:func:`lmlab.checkpoint.read_outcome`), removed before each
    attempt so that one left by an earlier attempt is never read: never the text of its log."""
    sweep_dir = Path(sweep_dir)
    run_dir = sweep_dir / "runs" / p.name
    cfg_path = sweep_dir / "configs" / f"{p.name}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        cfg_path, yaml.safe_dump({"model": p.cfg.to_dict(), "train": dataclasses.asdict(p.tc)}, sort_keys=False)
    )
    log_path = sweep_dir / "logs" / f"{p.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stops_before = _STOPS[0]
    launch = launch or ("fork" if FORK_SERVER else "exec")
    if launch not in ("fork", "exec") or (launch == "fork" and not FORK_SERVER):
        raise ValueError(
            f"launch={launch!r}: expected 'exec'"
            + (" or 'fork'" if FORK_SERVER else " (no fork server on this platform)")
        )
    argv = ["train", "--out", str(run_dir), "--config", str(cfg_path), "--data", str(p.data), "--no-progress"]
    cmd = [sys.executable, "-m", "lmlab.cli", *argv]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    root = str(Path(__file__).resolve().parents[2])  # the lmlab being run, also when not installed
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    wait_for_previous_attempt(run_dir)
    (run_dir / OUTCOME_FILE).unlink(missing_ok=True)  # this attempt's outcome only (the sweep's own file)
    with open(log_path, "a") as f:
        f.write(f"$ {' '.join(cmd)}" + ("  (forked by lmlab.lab.fork_server)" if launch == "fork" else "") + "\n")
        f.flush()
        offset = f.tell()
        if launch == "fork":
            from lmlab.lab.fork_server import ForkServer

            proc = ForkServer.fork(argv, log_path, env)
        else:
            proc = subprocess.Popen(
                cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=functools.partial(_child_setup, os.getpid()) if os.name == "posix" else None,
            )
        with _LIVE_LOCK:
            _LIVE.add(proc)
            stopped = _STOPS[0] != stops_before
        if stopped or stopping():  # a stop came while it was being launched: it has nothing to save yet
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait()  # an interrupt here leaves proc in _LIVE: stop_training() stops it
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    if rc == 0:
        return False, None
    if stopping() or rc in (130, 143) or rc < 0:  # SIGINT/SIGTERM (checkpointed: 130/143) or killed
        how = {130: "SIGINT", 143: "SIGTERM"}.get(rc) or (
            signal.Signals(-rc).name if -rc in signal.valid_signals() else f"status {rc}"
        )
        raise KeyboardInterrupt(
            f"{p.name}: its training was stopped by {how}"
            + (" (its fork server exited)" if getattr(proc, "server_lost", False) else "")
        )
    try:
        outcome = read_outcome(run_dir)
    except CheckpointError as exc:
        return False, f"training exited with status {rc} and {exc} (see {log_path})"
    if outcome is not None and outcome["status"] == "diverged":
        return True, None
    if outcome is not None and outcome["status"] == "failed" and outcome.get("error"):
        return False, f"training failed at step {outcome['step']}: {outcome['error']} (see {log_path})"
    lines = [line for line in _log_since(log_path, offset).splitlines() if line.strip()]  # the message, for people
    return False, f"training exited with status {rc}: {lines[-1] if lines else '(no output)'} (see {log_path})"


def _exited(q: subprocess.Popen) -> bool:
    """Whether ``q`` has exited, without reaping it and without Popen's wait lock: callable from a signal
    handler that interrupted this very thread inside ``q.wait()`` (which holds that lock)."""
    if q.returncode is not None:
        return True
    if hasattr(q, "running"):  # a forked run (lmlab.lab.fork_server.ForkedRun): its server reaps it
        return not q.running()
    if not hasattr(os, "waitid"):
        return q.poll() is not None
    try:
        return os.waitid(os.P_PID, q.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped (by the thread that waits on it)
        return True


def stop_training(timeout: float = 60.0) -> int:
    """SIGTERM every training subprocess this process started that is still running (each checkpoints its
    last finished step and exits), wait up to ``timeout`` seconds, then SIGKILL what is left. Returns how
    many were signalled. Safe in a signal handler (it does not reap: the waiting thread does)."""
    with _LIVE_LOCK:
        _STOPS[0] += 1
        procs = [q for q in _LIVE if not _exited(q)]
    for q in procs:
        q.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(_exited(q) for q in procs):
        time.sleep(0.05)
    for q in procs:
        if not _exited(q):
            q.kill()
    while not all(_exited(q) for q in procs):
        time.sleep(0.05)
    return len(procs)


def failed_row(p: RunPlan, sweep_name: str, error: str) -> dict:
    return {
        "sweep": sweep_name,
        "run": p.name,
        "variant": p.variant,
        "seed": p.seed,
        "scale": p.scale,
        "tune": p.tune,
        "status": "failed",
        "diverged": False,
        "error": error,
        "fields": p.fields,
    }


def run_planned(
    sweep_dir: Path,
    p: RunPlan,
    ev: EvalSettings,
    threads: int,
    eval_lock: Optional[threading.Lock] = None,
    stopping: Callable[[], bool] = lambda: False,
    log: Callable[[str], None] = lambda line: None,
) -> dict:
    """Train ``p`` (unless trained), evaluate it and write ``rows/RUN.json``; returns the row. Evaluation
    holds ``eval_lock`` when given (one at a time in a process that trains several runs). A diverged run
    is a row with status ``diverged``; an evaluation that raises gives a ``failed`` row. Raises
    KeyboardInterrupt when training was stopped by a signal (continued by the next call)."""

    sweep_dir = Path(sweep_dir)
    run_dir = sweep_dir / "runs" / p.name
    state = run_state(run_dir, p.steps)
    t0 = time.perf_counter()
    diverged, error = False, None
    if state != "trained":
        log(
            f"train {p.name}: {'continuing, ' if state == 'partial' else ''}{p.steps} steps, "
            f"{p.tokens:,} tokens, {p.flops:.3g} FLOPs"
        )
        diverged, error = train_run(sweep_dir, p, threads, stopping)
    with eval_lock or threading.Lock():
        set_threads(threads)
        try:
            row = collect_result(p, run_dir, ev, diverged, error)
        except Exception as exc:  # noqa: BLE001 -- one broken run must not end the sweep
            if stopping():
                raise KeyboardInterrupt from None
            row = failed_row(p, ev.name, f"evaluation failed: {exc}")
    row["run_wall_s"] = time.perf_counter() - t0  # this invocation: training subprocess + evaluation
    path = row_path(sweep_dir, p.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(row) + "\n")
    return row


def run_names(sweep_dir: Path, names: list[str], threads: int, log: Callable[[str], None] = print) -> list[dict]:
    """Run the planned runs ``names`` of ``sweep_dir`` (all at once, ``threads`` torch threads each): those
    with a final row are skipped. Returns their rows. What a Slurm/Ray/submitit task and ``lmlab
    sweep-worker`` call. Raises ConfigError for a name that was not planned."""

    plans = [read_plan(sweep_dir, n) for n in names]  # every name checked before anything trains
    eval_lock = threading.Lock()

    def one(pe: tuple[RunPlan, EvalSettings]) -> dict:
        p, ev = pe
        row = finished_row(sweep_dir, p.name, p.steps)
        if row is not None:
            log(f"skip {p.name}: done ({row['status']})")
            return row
        row = run_planned(sweep_dir, p, ev, threads, eval_lock, log=log)
        what = f"val bpb {row['val_bpb']:.4f}" if row.get("val_bpb") is not None else row["status"].upper()
        log(f"{p.name}: {what}" + (f" ({row['error']})" if row.get("error") else ""))
        return row

    if len(plans) == 1:
        return [one(plans[0])]
    with ThreadPoolExecutor(max_workers=len(plans)) as pool:
        return list(pool.map(one, plans))
