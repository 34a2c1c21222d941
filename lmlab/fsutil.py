"""File-system safety shared by the commands that write folders: locks, atomic writes, owned temp folders.

- :func:`acquire_lock` makes one process the only writer of a folder (``lmlab prepare --out``,
  ``lmlab train --out``). The lock is a small JSON file *beside* the folder, ``<parent>/.<name>.lock``,
  holding the holder's PID, host, command and start time; it stays valid while the folder itself is
  created, replaced or renamed into place. Mutual exclusion is an exclusive ``fcntl.flock`` on that
  file, which the kernel drops when the holder dies, so a lock left by a killed process (a *stale*
  lock: its PID is no longer running) is detected and taken over, with a note, without any race
  between two processes taking it over at once.
- :func:`atomic_write_bytes` / :func:`atomic_write_text` write a file so that a reader (or a crash,
  kill or full disk) sees either the old content or the complete new one, never a partial file:
  temporary file in the same folder, ``fsync``, ``os.replace``, ``fsync`` of the folder.
- :func:`make_temp_dir` creates a uniquely named temporary folder beside a target
  (``tempfile.mkdtemp``), so a command only ever removes folders it created itself.

Errors: :class:`LockError` (a ``ValueError``; the CLI prints it as one line, exit 2).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Union

PathLike = Union[str, os.PathLike]


class LockError(ValueError):
    """A folder is locked by another running lmlab process, or its lock file cannot be used."""


class LockHeld(LockError):
    """The :class:`LockError` of a folder whose lock a live process holds (the others: a lock file that
    cannot be used)."""


def lock_path(folder: PathLike) -> Path:
    """The lock file of ``folder``: ``<parent>/.<name>.lock`` (beside it, so the folder may not exist yet)."""
    folder = Path(os.path.abspath(folder))
    return folder.with_name(f".{folder.name}.lock")


def _read_holder(fd: int) -> Optional[dict]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 65536)
        from lmlab.json_checks import check_nesting

        info = json.loads(check_nesting(raw.decode("utf-8"), "lock file", ValueError))
    except (OSError, ValueError):  # UnicodeDecodeError, JSONDecodeError, nested too deep: no holder named
        return None
    return info if isinstance(info, dict) else None


def _describe(info: Optional[dict]) -> str:
    if not info:
        return "another process"
    what = info.get("what") or "lmlab"
    return f"{what} (PID {info.get('pid')} on {info.get('host')}, since {info.get('started')})"


class FolderLock:
    """A held lock (see :func:`acquire_lock`). ``release()`` (or leaving the ``with`` block) removes it.

    Attributes: ``folder`` (the locked folder), ``path`` (the lock file), ``took_over`` (the holder
    record of the stale lock this one replaced, or None), ``note`` (a one-line message about that
    takeover for the user, or None).
    """

    def __init__(self, folder: Path, path: Path, fd: int, took_over: Optional[dict]):
        self.folder, self.path, self._fd, self.took_over = folder, path, fd, took_over
        self.note = None
        if took_over is not None:
            self.note = (
                f"note: took over the stale lock {str(path)!r} left by {_describe(took_over)}: that process is gone"
            )

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and drop the lock; safe to call twice."""
        if self._fd is None:
            return
        try:
            # unlink while still holding the flock, so a waiting process re-checks the inode (see acquire)
            st = os.fstat(self._fd)
            cur = os.stat(self.path)
            if (cur.st_dev, cur.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):  # a lock object dropped without release: the kernel lock goes with the fd
        if getattr(self, "_fd", None) is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


def acquire_lock(folder: PathLike, what: str) -> FolderLock:
    """Make this process the only writer of ``folder``; returns a :class:`FolderLock` to release.

    ``folder``: the folder to protect (need not exist; its parent is created if missing). ``what``: the
    holder's command, e.g. ``"lmlab prepare"``, shown to a second process that is refused.

    Non-blocking: raises :class:`LockHeld` (a :class:`LockError`) at once, naming the folder, the lock file
    and the holder's PID / host / command / start time, when a live process holds the lock. A lock file
    whose holder died (no ``flock`` held; its PID not running) is taken over; ``FolderLock.note`` then says
    so.
    Raises :class:`LockError` also when the lock path is not a regular file (a user's folder or
    symlink of that name is never touched) or cannot be created (e.g. a read-only parent).
    Locks are advisory and per open file: a second acquire in the same process is refused too. The
    lock belongs to the real folder (symlinks resolved), so a symlink to a locked folder is refused too.
    """
    folder = Path(os.path.realpath(folder))  # one lock per real folder, whatever symlink names it
    path = lock_path(folder)
    above = next((p for p in folder.parents if os.path.lexists(p)), None)
    if above is not None and not above.is_dir():
        raise LockError(f"{str(folder)!r} lies under a file, {str(above)!r}, not a folder; choose a folder path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LockError(
            f"cannot create the folder {str(path.parent)!r} for the lock of {str(folder)!r}: {exc.strerror or exc}"
        ) from None
    for _ in range(100):  # retried only if the holder removed the file between our open and flock
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise LockError(
                f"lock path {str(path)!r} of {str(folder)!r} exists and is not a regular file; "
                f"move it away (lmlab never removes it)"
            )
        try:
            fd = os.open(
                path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644
            )
        except OSError as exc:
            raise LockError(
                f"cannot create the lock file {str(path)!r} for {str(folder)!r}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            info = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockHeld(
                    f"{str(folder)!r} is in use by {_describe(info)} (lock file {str(path)!r}); "
                    f"wait for it to finish or choose another folder"
                ) from None
            raise LockError(f"cannot lock {str(path)!r}: {exc.strerror or exc}") from None
        try:  # the file we locked must still be the one at `path` (not unlinked by a releasing holder)
            st, cur = os.fstat(fd), os.stat(path)
            same = (cur.st_dev, cur.st_ino) == (st.st_dev, st.st_ino)
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        previous = _read_holder(fd)
        took_over = None
        if previous is not None and isinstance(previous.get("pid"), int):
            took_over = previous  # we hold the flock, so the process that wrote this record is gone
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "what": what,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "argv": sys.argv[:8],
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(info) + "\n").encode())
        os.fsync(fd)
        return FolderLock(folder, path, fd, took_over)
    raise LockError(f"could not lock {str(folder)!r}: its lock file {str(path)!r} keeps changing")


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder; the rename is still atomic
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: PathLike, data: bytes, mode: Optional[int] = None) -> None:
    """Replace ``path`` by ``data`` atomically: readers and crashes see the old file or the whole new one.

    Writes ``.<name>.<random>.tmp`` in the same folder, fsyncs it, ``os.replace``s it onto ``path`` and
    fsyncs the folder. ``mode``: permission bits (default: those of the existing file, else 0o666 less
    the umask). A symlink at ``path`` is replaced by the file (never written through). On any error
    the temporary file is removed and the old ``path`` is left as it was; the OSError propagates.
    """
    path = Path(path)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777 if not path.is_symlink() else None
        except FileNotFoundError:
            mode = None
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8", mode: Optional[int] = None) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded with ``encoding`` (UTF-8 by default)."""
    atomic_write_bytes(path, text.encode(encoding), mode=mode)


def sha256_file(path: PathLike, block: int = 1 << 20) -> str:
    """Hex SHA-256 of the file at ``path``, read in ``block``-byte pieces (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def make_temp_dir(target: PathLike, purpose: str = "partial") -> Path:
    """A new, uniquely named empty folder beside ``target``: ``<parent>/.<name>.<purpose>.<random>``.

    Made with ``tempfile.mkdtemp`` (never an existing path), so the caller owns it and may remove it,
    then given the mode a plain ``mkdir`` would (0777 less the umask), as it is renamed into place;
    the parent is created if missing. Being on the same file system as ``target``, it can be renamed
    onto it atomically.
    """
    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{target.name}.{purpose}.", dir=target.parent))
    mask = os.umask(0)  # mkdtemp makes it 0700; the folder it becomes gets a plain mkdir's mode
    os.umask(mask)
    os.chmod(path, 0o777 & ~mask)
    return path


def fsync_tree(folder: PathLike) -> None:
    """fsync every regular file under ``folder`` and the folders themselves (before renaming it into place)."""
    folder = Path(folder)
    for root, dirs, files in os.walk(folder):
        for name in files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                continue
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(root))
