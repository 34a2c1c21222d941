"""CPU threads: the one place that decides how many torch uses and sets it.

``torch.set_num_threads`` is called only here. Every count is in physical cores of this process's
affinity mask (hyper-threads counted once: the models' matmuls gain nothing from SMT siblings):
:func:`physical_cores`; a compute command without ``--threads`` takes :func:`default_threads`; the
lab's sweep splits the cores over its jobs with :func:`sweep_threads`; decoding one sequence of a small
model takes fewer (:func:`lmlab.kernels.decode_layout.decode_threads`, through :func:`set_threads`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Optional


def physical_cores() -> int:
    """CPU cores this process may run on, counting SMT siblings (hyper-threads) once: distinct
    (package, core) pairs of the CPUs in the affinity mask, from Linux's sysfs topology; elsewhere the
    logical CPU count."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus) or os.cpu_count() or 1


def default_threads() -> int:
    """Torch CPU threads of a compute command without ``--threads``: the physical cores, capped by
    ``OMP_NUM_THREADS`` when that is set to a positive integer (as torchrun and ``lmlab sweep`` do)."""
    n = physical_cores()
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        n = min(n, int(env))
    return max(1, n)


def set_threads(threads: Optional[int]) -> int:
    """Set torch's intra-op CPU threads to ``threads`` (None: :func:`default_threads`); returns it."""
    import torch

    n = threads or default_threads()
    torch.set_num_threads(n)
    return n


def sweep_threads(jobs: int, per_task: int = 1) -> int:
    """Torch threads of each of ``jobs`` local sweep jobs that each train ``per_task`` runs at once: the
    physical cores shared out, at least 1."""
    return max(1, physical_cores() // jobs // per_task)


def current_threads() -> int:
    """Torch's intra-op CPU threads now."""
    import torch

    return torch.get_num_threads()


@contextlib.contextmanager
def using_threads(threads: Optional[int]) -> Iterator[int]:
    """Within the block torch uses ``threads`` threads (None: :func:`default_threads`); the previous
    count comes back on exit, also on an exception."""
    before = current_threads()
    try:
        yield set_threads(threads)
    finally:
        set_threads(before)
