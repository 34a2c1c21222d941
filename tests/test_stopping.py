"""lmlab.stopping.StopSignals: the first SIGINT/SIGTERM asks for a stop after the step in progress, a second
SIGINT stops at once; a SIGTERM, however often and however late it is repeated (a scheduler repeats it and
kills with SIGKILL after its grace period), stays one request, so the checkpoint it asks for is written."""

import os
import signal
import time

import pytest

from lmlab.stopping import StopSignals


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs between bytecodes, at the latest here


def test_a_repeated_sigterm_is_one_request_even_seconds_later():
    with StopSignals() as stop:
        _deliver(signal.SIGTERM)
        _deliver(signal.SIGTERM)  # Slurm's second copy, at once
        time.sleep(2.5)  # under load the copies of a preemption came seconds apart
        _deliver(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM  # asked to stop after the step, not interrupted


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_a_sigterm_after_a_first_signal_does_not_interrupt(first):
    with StopSignals() as stop:
        _deliver(first)
        _deliver(signal.SIGTERM)
        assert stop.signum == first


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT)])
def test_a_second_signal_of_a_person_stops_at_once(first, second):
    """Ctrl-C twice, or Ctrl-C after a SIGTERM, is never taken as a duplicate."""
    with StopSignals() as stop:
        _deliver(first)
        assert stop.signum == first
        with pytest.raises(KeyboardInterrupt):
            _deliver(second)
    assert signal.getsignal(signal.SIGTERM) != stop._handle  # the previous handler is back


def test_a_stop_whose_stderr_is_a_broken_pipe_still_stops_after_the_step(monkeypatch):
    """`lmlab train ... | tee log` and Ctrl-C: tee dies with the same SIGINT, so the handler's line meets a
    broken pipe; the stop request must stand (a new user lost 186 steps to a BrokenPipeError here)."""

    class Broken:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stderr", Broken())
    with StopSignals() as stop:
        _deliver(signal.SIGINT)
        assert stop.signum == signal.SIGINT
