"""A fork server for a sweep's training processes: one Python process that has imported torch and lmlab's
training command forks each run's ``lmlab train`` (:func:`lmlab.lab.worker.train_run`), so that a run
does not pay Python's and torch's start again (torch, and torch._dynamo, which ``torch.optim`` imports
when the first optimizer is built: about 3 s of every run on a 2-core VM, docs/bench/lab_throughput.md).
Each run is still its own process (a crash, a leak or a signal stays in it), and it computes what
``python -m lmlab.cli train`` computes: the same code, a fresh fork of a process that has run nothing but,
for runs that compile (``compile: true``, one thread), one throwaway training step of each run shape, so
that its forked runs find the compiled code instead of compiling it again
(:func:`lmlab.compile_choice.warm_for_fork`; the forked runs equal new processes bit for bit, tested).

Why not ``multiprocessing``'s forkserver: it imports the parent's main module again in every child (a
script that calls the lab's API without an ``if __name__ == "__main__"`` guard would run itself once per
training run). This server only imports lmlab.

Protocol (JSON lines): the client writes ``{"argv", "log", "env", "cwd"}`` to the server's stdin; the
server forks, answers ``{"pid"}`` and, when that process has exited, ``{"exit": pid, "status"}`` (an exit
code, or minus the signal that ended it, as ``subprocess`` reports). The server ignores SIGINT, SIGTERM and
SIGUSR2 (a terminal's Ctrl-C and Slurm's signals reach every process; the worker decides what they do to
the runs); it exits when its stdin closes (the worker is gone), and its runs then receive SIGTERM
(PR_SET_PDEATHSIG, set in each run), on which ``lmlab train`` checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional


# --- the server -------------------------------------------------------------------------------------
def _run_child(req: dict, server: int) -> int:
    """In the forked process (``server``: the fork server's pid): the environment, working folder and log a
    new process would have had, then ``lmlab train``; returns its exit status."""
    from lmlab.lab.worker import _child_setup

    _child_setup(server)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    try:
        from lmlab.cli import main

        code = main(list(req["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 -- reported as a process would: the traceback, status 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return int(code or 0)


def _warm(req: dict, warmed: set) -> None:
    """Compile here, once per run shape, what a forked run would compile for itself
    (:func:`lmlab.compile_choice.warm_for_fork`); a failure is said on the server's stderr (the worker's)
    and the run compiles for itself."""
    try:
        from lmlab.compile_choice import warm_for_fork

        os.chdir(req["cwd"])
        t = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # this server's stdout is its answers to the worker
            done = warm_for_fork(list(req["argv"]), req["env"], warmed)
        if done:
            print(
                f"fork server: compiled the model of this shape once for its runs ({time.perf_counter() - t:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    except Exception as exc:  # noqa: BLE001 -- the run then compiles for itself, as without this server
        print(f"fork server: could not compile ahead ({exc}); the run compiles itself", file=sys.stderr, flush=True)


def serve() -> None:
    """The server's loop (``python -m lmlab.lab.fork_server``): see the module's docstring."""
    import torch  # noqa: F401 -- what every run would import: paid once here
    import torch._dynamo  # noqa: F401

    import lmlab.cli  # noqa: F401
    import lmlab.train  # noqa: F401

    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR2", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)
    # SIGTERM also blocked: a run inherits the mask, so a SIGTERM sent the moment it is forked (a stop that
    # came while it was being launched) waits, pending, until the run has restored the default and unblocks
    # it (lmlab.lab.worker._child_setup), instead of being discarded as an ignored signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()

    def say(msg: dict) -> None:
        try:
            os.write(fd_out, (json.dumps(msg) + "\n").encode())
        except OSError:  # the worker is gone (e.g. killed while this server started): nothing to report
            os._exit(0)

    server = os.getpid()
    say({"ready": server})
    running: set = set()
    warmed: set = set()  # the run shapes whose compiled code this server holds
    buf = b""
    while True:
        ready, _, _ = select.select([fd_in], [], [], 0.05 if running else 1.0)
        if ready:
            chunk = os.read(fd_in, 1 << 16)
            if not chunk:  # the worker is gone: exit now, without tearing torch down (the runs get SIGTERM
                os._exit(0)  # from PR_SET_PDEATHSIG at once, checkpoint and stop)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                _warm(req, warmed)
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        code = _run_child(req, server)  # its stdin (this server's) becomes /dev/null
                    except BaseException:  # noqa: BLE001 -- before the log was opened: the server's stderr
                        import traceback

                        traceback.print_exc()
                    finally:
                        os._exit(code)
                running.add(pid)
                say({"pid": pid})
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                say({"exit": pid, "status": os.waitstatus_to_exitcode(status)})


# --- the client -------------------------------------------------------------------------------------
class ForkedRun:
    """A training process forked by the server, with the part of ``subprocess.Popen``'s interface that
    :mod:`lmlab.lab.worker` uses: ``pid``, ``returncode``, ``wait()``, ``send_signal()``, ``kill()``, and
    :meth:`running` (``kill(pid, 0)``, safe in a signal handler: the server reaps its runs)."""

    def __init__(self, server: "ForkServer", pid: int):
        self._server, self.pid = server, pid
        self.returncode: Optional[int] = None
        self.server_lost = False

    def running(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (or the pid reused by another user)
            return False
        return True

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self.running():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self) -> int:
        """The exit status; a server lost before it reported one gives -SIGTERM (interrupted: the run
        continues from its checkpoint) once the process is gone."""
        rc = self._server.wait_exit(self.pid)
        if rc is None:
            self.server_lost = True
            while self.running():
                time.sleep(0.05)
            rc = -int(signal.SIGTERM)
        self.returncode = rc
        return rc


class ForkServer:
    """The client side: starts ``python -m lmlab.lab.fork_server`` (in its own session, so that a
    terminal's Ctrl-C reaches the sweep, which stops the runs itself) and forks runs through it."""

    _lock = threading.Lock()
    _current: Optional["ForkServer"] = None

    def __init__(self):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the lmlab being run, also when not installed
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmlab.lab.fork_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self._cond = threading.Condition()
        self._pids: list = []
        self._exits: dict = {}
        self.alive = True
        self.ready = False
        self._start_lock = threading.Lock()
        threading.Thread(target=self._read, name="lmlab-fork-server", daemon=True).start()

    @classmethod
    def get(cls) -> "ForkServer":
        """This process's server, started on first use and again after one was lost."""
        with cls._lock:
            if cls._current is None or not cls._current.alive:
                cls._current = cls()
            return cls._current

    @classmethod
    def fork(cls, argv: list, log: Path, env: dict) -> ForkedRun:
        """:meth:`start` on this process's server; a server found dead (killed between two runs) is
        replaced once. Raises RuntimeError when the new one fails too."""
        try:
            return cls.get().start(argv, log, env)
        except RuntimeError:
            return cls.get().start(argv, log, env)

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._cond:
                if "ready" in msg:
                    self.ready = True
                elif "pid" in msg:
                    self._pids.append(msg["pid"])
                else:
                    self._exits[msg["exit"]] = msg["status"]
                self._cond.notify_all()
        with self._cond:
            self.alive = False
            self._cond.notify_all()
        self.proc.wait()

    def start(self, argv: list, log: Path, env: dict) -> ForkedRun:
        """Fork ``lmlab train ARGV`` with environment ``env``, stdout and stderr appended to ``log``.
        Raises RuntimeError when the server exited (its stderr says why)."""
        req = json.dumps({"argv": list(argv), "log": str(log), "env": dict(env), "cwd": os.getcwd()}) + "\n"
        with self._start_lock:  # one request at a time: the answers come in order
            with self._cond:
                try:
                    self.proc.stdin.write(req.encode())
                    self.proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    self.alive = False
                while self.alive and not self._pids:
                    self._cond.wait()
                if not self._pids:
                    raise RuntimeError(
                        f"lmlab's fork server (python -m lmlab.lab.fork_server) exited with status "
                        f"{self.proc.poll()} before it started the run"
                    )
                return ForkedRun(self, self._pids.pop(0))

    def wait_exit(self, pid: int) -> Optional[int]:
        """``pid``'s exit status, or None when the server was lost first."""
        with self._cond:
            while pid not in self._exits and self.alive:
                self._cond.wait()
            return self._exits.pop(pid, None)


if __name__ == "__main__":
    serve()
