"""What a sweep records about itself: the provenance record of each invocation (command, lmlab version,
git commit, spec SHA-256, machine, time, load average) and the one closing it, and the load average
sampled while it runs (:class:`LoadSampler`)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import yaml

import lmlab
from lmlab.kernels.settings import default_kernels
from lmlab.lab.results import _machine
from lmlab.lab.spec import Spec


# --- provenance, machine load and the timing block ---------------------------------------
def git_commit(path: Path = Path(__file__)) -> Optional[str]:
    """The git commit of the lmlab source tree holding ``path`` (``+dirty`` when the package's source,
    ``lmlab/`` and ``pyproject.toml``, has uncommitted changes: the pages ``make ablations`` writes into
    ``docs/`` between its sweeps do not count), or None outside a git checkout or without git."""
    root = Path(path).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "lmlab", "pyproject.toml"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def spec_sha256(spec: Spec) -> str:
    """SHA-256 of the spec file's bytes (of its canonical YAML dump when it came from no file)."""
    if spec.path is not None and Path(spec.path).is_file():
        data = Path(spec.path).read_bytes()
    else:
        data = yaml.safe_dump(spec.raw, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def end_record(wall_s: float, finished: bool) -> dict:
    """The provenance record closing one invocation: when it ended, its wall time in seconds (timing
    block, training and evaluation) and whether every run finished (False: interrupted or failed)."""
    return {
        "ended_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "wall_s": round(wall_s, 1),
        "finished": finished,
    }


def _repo_relative(path: Path) -> str:
    """``path`` relative to the lmlab checkout it lies in (a shipped spec: ``lmlab/specs/NAME.yaml``),
    else to the working directory, else as given: provenance that names no one machine's folders."""
    path = Path(path).resolve()
    for base in (Path(__file__).resolve().parents[2], Path.cwd().resolve()):
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            continue
    return str(path)


def provenance_record(spec: Spec, command: Optional[str]) -> dict:
    """What a reader needs to reproduce one sweep invocation: the command, lmlab version and git
    commit, the spec file and its SHA-256, the precision its runs train in (the spec's ``train.dtype``
    and ``compile`` after any ``--dtype`` / ``--compile``: "bf16, compiled" or "fp32"), the machine and
    the CPU kernels its models use (this machine's calibration, :mod:`lmlab.kernels.calibrate`), the
    time and the load average at the start."""

    return {
        "command": command or f"lmlab sweep {spec.path or spec.name}",
        "sweep": spec.name,
        "cwd": os.getcwd(),
        "lmlab_version": getattr(lmlab, "__version__", None),
        "git_commit": git_commit(),
        "spec": _repo_relative(spec.path) if spec.path else None,
        "spec_sha256": spec_sha256(spec),
        "tier": spec.tier,
        "precision": spec.precision,
        "machine": _machine("auto"),
        "kernels": default_kernels().describe(),
        "python": sys.version.split()[0],
        "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


class LoadSampler(threading.Thread):
    """Appends {time, load_1m, load_5m} to ``path`` every ``interval`` seconds until stopped: the
    machine's load while the sweep ran, for the report (contended runs are not speed measurements)."""

    def __init__(self, path: Path, interval: float = 15.0):
        super().__init__(daemon=True)
        self.path, self.interval, self.halt = path, interval, threading.Event()

    def sample(self) -> None:
        if not hasattr(os, "getloadavg"):
            return
        one, five, _ = os.getloadavg()
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": time.time(), "load_1m": one, "load_5m": five}) + "\n")

    def run(self) -> None:
        while True:
            self.sample()
            if self.halt.wait(self.interval):
                return

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)
        self.sample()
