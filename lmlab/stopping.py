"""How a training run stops early: SIGINT/SIGTERM ask the loop to finish its step and checkpoint
(:class:`StopSignals`, then :class:`TrainingInterrupted`), and too many non-finite steps in a row end it
(:class:`TrainingDiverged`). :meth:`lmlab.train.Trainer.fit` writes the outcome to the run folder's
``outcome.json`` (:mod:`lmlab.run_folder`), which the lab reads instead of any log text."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Optional


class TrainingDiverged(FloatingPointError):
    """``max_bad_steps`` non-finite steps in a row stopped :meth:`Trainer.fit` (the last good state was
    checkpointed first). ``step``: the step of the last skipped update."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached :meth:`Trainer.fit`, which checkpointed the last finished step and stopped.
    ``signum``: the signal; ``exit_code``: 128 + signum (130 for SIGINT, 143 for SIGTERM), as a shell reports."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum, self.exit_code = signum, 128 + signum


class StopSignals:
    """While active (``with``), SIGINT and SIGTERM only ask the training loop to stop after the step in
    progress (:attr:`signum` set, one line on stderr); a second signal interrupts at once
    (KeyboardInterrupt; the checkpoints on disk stay intact, being written atomically). A SIGTERM within
    :attr:`SAME_REQUEST_S` seconds of a first SIGTERM is the same request: a scheduler delivers it twice
    (Slurm's preemption signals every process of a job, and srun forwards the SIGTERM it received to its
    tasks once more), and taking the second as "stop at once" would abandon the checkpoint. Installed only
    in the main thread (elsewhere signals cannot be caught and this does nothing); the previous handlers
    come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    SAME_REQUEST_S = 2.0

    def __init__(self):
        self.signum: Optional[int] = None
        self._first_at = 0.0
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == self.signum == signal.SIGTERM and time.monotonic() - self._first_at < self.SAME_REQUEST_S:
                return
            raise KeyboardInterrupt
        self.signum, self._first_at = signum, time.monotonic()
        print(
            f"\n{signal.Signals(signum).name} received: finishing the current step and saving a checkpoint "
            f"(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
