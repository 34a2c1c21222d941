"""Where a sweep's runs train on a Ray cluster (``lmlab sweep --executor ray --address ...``): one Ray task per
``runs_per_task`` planned runs, each :func:`lmlab.lab.worker.run_names`, rows merged as in
:mod:`lmlab.lab.executors`.

Source: Ray's tasks (https://docs.ray.io/en/latest/ray-core/tasks.html), ``ray.wait``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from lmlab.config import ConfigError
from lmlab.lab.executors import chunks
from lmlab.lab.worker import failed_row, read_plan, read_row, run_names


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs ray: pip install 'lmlab[ray]' (or pip install ray)") from None
    return ray


def _ray_task(sweep_dir: str, names: list, threads: int) -> int:
    """One Ray task: :func:`lmlab.lab.worker.run_names` (the outcome is the rows it writes)."""

    return len(run_names(Path(sweep_dir), list(names), threads, log=lambda line: print(line, flush=True)))


class RayExecutor:
    """Runs batches of planned runs as Ray tasks: one task per ``runs_per_task`` runs, each with
    ``num_cpus``/``num_gpus`` resources (Ray places them; several small runs share a GPU with fractional
    ``num_gpus``), retried up to ``max_retries`` times when its worker or node dies (the run continues from
    its checkpoint). ``address``: a running cluster (``ray://HOST:10001`` or ``HOST:6379``, ``auto``), or
    ``local`` for a Ray started in this process with ``parallelism`` CPUs. The sweep folder must be on a
    filesystem every node sees (tasks read plans and write rows there). Ray tasks belong to the
    coordinator: stopping it stops them (their trainings checkpoint), and the same command continues.

    Source: Ray's tasks (https://docs.ray.io/en/latest/ray-core/tasks.html), ``ray.wait``."""

    def __init__(
        self,
        sweep_dir: Path,
        address: Optional[str],
        runs_per_task: int = 1,
        threads: int = 1,
        num_cpus: Optional[float] = None,
        num_gpus: float = 0,
        max_retries: int = 3,
        parallelism: int = 1,
        poll_s: float = 2.0,
        log: Callable[[str], None] = print,
    ):
        self.dir, self.runs_per_task, self.threads = Path(sweep_dir), int(runs_per_task), int(threads)
        self.num_cpus = float(num_cpus if num_cpus is not None else self.threads * self.runs_per_task)
        self.num_gpus, self.max_retries, self.poll_s, self.log = float(num_gpus), int(max_retries), poll_s, log
        ray = _ray()
        if not ray.is_initialized():
            try:
                if address in (None, "local"):
                    ray.init(
                        num_cpus=parallelism * self.num_cpus,
                        include_dashboard=False,
                        log_to_driver=False,
                        configure_logging=False,
                    )
                else:
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise ConfigError(f"--executor ray --address {address!r}: {str(exc).splitlines()[0]}") from None
        self.ray = ray

    def run(self, names: list, on_row: Callable[[dict, float], None]) -> None:
        """As :meth:`SubmititExecutor.run`: every run of ``names`` to a row, ``on_row`` as each finishes."""

        ray, t0 = self.ray, time.time()
        task = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=self.max_retries)(_ray_task)
        refs = {task.remote(str(self.dir), g, self.threads): g for g in chunks(list(names), self.runs_per_task)}
        n_done, last = 0, 0.0
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=self.poll_s)
            for ref in ready:
                group, error = refs.pop(ref), None
                try:
                    ray.get(ref)
                except Exception as exc:  # noqa: BLE001 -- the task failed after its retries
                    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                for n in group:
                    row = read_row(self.dir, n)
                    if row is None:
                        p, ev = read_plan(self.dir, n)
                        row = failed_row(
                            p,
                            ev.name,
                            f"ray task ended without a row ({error or 'no error'}); "
                            f"its log: {self.dir / 'logs' / (n + '.log')}; reproduce "
                            f"with `lmlab sweep-worker {self.dir} {n}`",
                        )
                    n_done += 1
                    on_row(row, time.time() - t0)
            if ready or time.time() - last >= 60:
                left = sum(map(len, refs.values()))
                eta = f", ETA {(time.time() - t0) / n_done * left / 60:.0f} min" if n_done and left else ""
                self.log(f"ray: {left} queued or running, {n_done}/{len(names)} done{eta}")
                last = time.time()
