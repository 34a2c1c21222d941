"""How a training run stops early: SIGINT/SIGTERM ask the loop to finish its step and checkpoint
(:class:`StopSignals`, then :class:`TrainingInterrupted`), and too many non-finite steps in a row end it
(:class:`TrainingDiverged`; from the very first step, before any update: :class:`NonFiniteFromStart`).
:meth:`lmlab.train.Trainer.fit` writes the outcome to the run folder's ``outcome.json``
(:mod:`lmlab.run_folder`), which the lab reads instead of any log text."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Optional


class TrainingDiverged(FloatingPointError):
    """``max_bad_steps`` non-finite steps in a row stopped :meth:`Trainer.fit` (the last good state was
    checkpointed first). ``step``: the step of the last skipped update."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class NonFiniteFromStart(FloatingPointError):
    """Every step of a run from its first was non-finite (``max_bad_steps`` in a row, no update applied):
    the model's loss or gradient at its initial weights is not finite, which no learning rate causes (a
    kernel, the precision or the initialisation). Not a divergence: :meth:`Trainer.fit` records the run as
    ``failed``, so the lab reports it instead of reading it as an unstable learning rate."""

    def __init__(self, steps: int, dtype: str, compile: object):
        super().__init__(
            f"every step from the first was non-finite ({steps} in a row, no update applied): the loss or "
            f"gradient at the initial weights is not finite, which no learning rate causes; check "
            f"dtype={dtype!r} (fp32 is one switch away), compile={compile!r} and the model's initialisation"
        )


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached :meth:`Trainer.fit`, which checkpointed the last finished step and stopped.
    ``signum``: the signal; ``exit_code``: 128 + signum (130 for SIGINT, 143 for SIGTERM), as a shell reports."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum, self.exit_code = signum, 128 + signum


class StopSignals:
    """While active (``with``), SIGINT and SIGTERM only ask the training loop to stop after the step in
    progress (:attr:`signum` set, one line on stderr). A second SIGINT (Ctrl-C pressed again) interrupts at
    once (KeyboardInterrupt; the checkpoints on disk stay intact, being written atomically). A SIGTERM never
    does: it is how schedulers ask, and they repeat it (Slurm signals every process of a job, again when the
    job's end time comes, and srun forwards it once more; under load the copies came seconds apart), while
    their hard stop is SIGKILL after a grace period (Slurm's KillWait, Kubernetes' grace period, systemd's
    stop timeout); taking a repeat as "stop at once" would abandon the checkpoint it asked for. Installed
    only in the main thread (elsewhere signals cannot be caught and this does nothing); the previous
    handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: Optional[int] = None
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return  # a SIGTERM again: the same request
        self.signum = signum
        try:  # stderr may be a pipe whose reader the same Ctrl-C ended (`lmlab train ... | tee log`)
            print(
                f"\n{signal.Signals(signum).name} received: finishing the current step and saving a checkpoint "
                f"(Ctrl-C / SIGINT again stops at once)",
                file=sys.stderr,
                flush=True,
            )
        except (OSError, ValueError):  # a broken pipe or a closed stream must not cost the checkpoint asked for
            pass

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
