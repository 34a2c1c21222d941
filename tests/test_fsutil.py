"""lmlab.fsutil: folder locks (live holder refused, stale lock taken over), atomic writes, owned temp folders."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lmlab.fsutil import (
    LockError,
    LockHeld,
    acquire_lock,
    atomic_write_bytes,
    atomic_write_text,
    lock_path,
    make_temp_dir,
)

HOLD = textwrap.dedent("""
    import sys, time
    from lmlab.fsutil import acquire_lock
    lock = acquire_lock(sys.argv[1], "test holder")
    print("held", flush=True)
    time.sleep(60)
""")


def _holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_live_lock_refuses_second_writer_naming_holder(tmp_path):
    folder = tmp_path / "out"
    proc = _holder(folder)
    try:
        with pytest.raises(LockError) as exc:
            acquire_lock(folder, "lmlab prepare")
        msg = str(exc.value)
        assert isinstance(exc.value, LockHeld)  # a live holder (the error a retried run waits out)
        assert f"PID {proc.pid}" in msg and "test holder" in msg and str(folder) in msg
        assert "\n" not in msg
    finally:
        proc.kill()
        proc.wait()


def test_a_retried_run_waits_for_the_previous_attempt_to_let_go(tmp_path):
    """lmlab.lab.worker.wait_for_previous_attempt: while a live process holds the run folder's lock it waits,
    False after its timeout; True once the holder is gone (here terminated a second in, leaving its lock
    file, which is taken over and removed); True at once for a free folder (nothing created) and for a lock
    file that cannot be used (the training reports that)."""
    from lmlab.lab.worker import wait_for_previous_attempt

    folder = tmp_path / "runs" / "r"
    proc = _holder(folder)
    try:
        t0 = time.monotonic()
        assert wait_for_previous_attempt(folder, timeout_s=0.3, poll_s=0.05) is False
        assert time.monotonic() - t0 >= 0.3
        threading.Timer(1.0, proc.terminate).start()
        t0 = time.monotonic()
        assert wait_for_previous_attempt(folder, timeout_s=30, poll_s=0.05) is True
        assert 0.9 <= time.monotonic() - t0 < 30
    finally:
        proc.kill()
        proc.wait()
    assert not lock_path(folder).exists() and not folder.exists()
    assert wait_for_previous_attempt(tmp_path / "free", timeout_s=0) is True and not (tmp_path / "free").exists()
    lock_path(tmp_path / "odd").mkdir()  # a folder where the lock file goes: not a lock anyone holds
    assert wait_for_previous_attempt(tmp_path / "odd", timeout_s=30) is True


def test_stale_lock_of_killed_process_is_taken_over(tmp_path):
    folder = tmp_path / "out"
    proc = _holder(folder)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert lock_path(folder).is_file()  # left behind by the killed holder
    lock = acquire_lock(folder, "lmlab prepare")
    try:
        assert lock.took_over["pid"] == proc.pid
        assert str(proc.pid) in lock.note
        assert json.loads(lock_path(folder).read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert not lock_path(folder).exists()
    with acquire_lock(folder, "again") as again:  # released: free again, nothing to take over
        assert again.took_over is None


def test_second_acquire_in_same_process_refused_and_release_frees(tmp_path):
    lock = acquire_lock(tmp_path / "run", "lmlab train")
    with pytest.raises(LockError, match="in use by lmlab train"):
        acquire_lock(tmp_path / "run", "lmlab train")
    lock.release()
    lock.release()  # twice is harmless
    acquire_lock(tmp_path / "run", "lmlab train").release()


def test_lock_path_that_is_a_folder_is_refused_untouched(tmp_path):
    (tmp_path / ".out.lock").mkdir()
    (tmp_path / ".out.lock" / "keep").write_text("mine")
    with pytest.raises(LockError, match="not a regular file"):
        acquire_lock(tmp_path / "out", "lmlab prepare")
    assert (tmp_path / ".out.lock" / "keep").read_text() == "mine"


def test_atomic_write_keeps_old_file_when_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "run.yaml"
    target.write_text("old")
    os.chmod(target, 0o640)

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]  # no temp file left
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and (os.stat(target).st_mode & 0o777) == 0o640


def test_atomic_write_replaces_symlink_not_its_target(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("user data")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write_text(link, "ours")
    assert real.read_text() == "user data" and not link.is_symlink() and link.read_text() == "ours"


def test_make_temp_dir_is_new_each_time_beside_target(tmp_path):
    target = tmp_path / "sub" / "data"
    a, b = make_temp_dir(target), make_temp_dir(target)
    assert a != b and a.parent == b.parent == target.parent and not any(a.iterdir())


def test_a_symlink_does_not_bypass_a_folder_lock(tmp_path):
    real = tmp_path / "run"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    held = acquire_lock(real, "lmlab train")
    try:
        with pytest.raises(LockError):
            acquire_lock(link, "lmlab train")
    finally:
        held.release()
