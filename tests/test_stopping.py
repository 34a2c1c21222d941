"""lmlab.stopping.StopSignals: the first SIGINT/SIGTERM asks for a stop after the step in progress, a second
stops at once; a SIGTERM delivered twice by a scheduler (Slurm's preemption reaches a training from its
step and again through srun) is one request, so the checkpoint it asks for is written."""

import os
import signal
import time

import pytest

from lmlab.stopping import StopSignals


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs between bytecodes, at the latest here


def test_a_sigterm_delivered_twice_at_once_is_one_request_and_a_later_one_stops_at_once():
    with StopSignals() as stop:
        _deliver(signal.SIGTERM)
        _deliver(signal.SIGTERM)  # within SAME_REQUEST_S: the scheduler's second copy
        assert stop.signum == signal.SIGTERM
        stop._first_at -= StopSignals.SAME_REQUEST_S  # as if the seconds had passed
        with pytest.raises(KeyboardInterrupt):
            _deliver(signal.SIGTERM)


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT)])
def test_a_second_signal_of_a_person_stops_at_once(first, second):
    """Ctrl-C twice, or Ctrl-C after a SIGTERM, is never taken as a duplicate."""
    with StopSignals() as stop:
        _deliver(first)
        assert stop.signum == first
        with pytest.raises(KeyboardInterrupt):
            _deliver(second)
    assert signal.getsignal(signal.SIGTERM) != stop._handle  # the previous handler is back
