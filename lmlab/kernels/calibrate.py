"""Kernel choices measured on the machine at hand: ``lmlab bench calibrate``.

Each decision of :class:`lmlab.kernels.settings.KernelSettings` that depends on the CPU is measured as
what it changes: whole fp32 training steps (forward, backward, AdamW) of an untrained model, built once
per setting with the same weights and batch, timed in interleaved rounds (every round times each setting
once, the order alternating), after one untimed warm-up round. A cell is one (model shape, threads);
its figure is the median over rounds of the per-round ratio (setting on / setting off) with the
interquartile range; a decision takes the setting on when the geometric mean of its cells' medians is
below ``1 - MIN_GAIN``: a smaller difference does not survive from one calibration to the next (the
repeat calibrations behind it: docs/bench/measured-choices.md), and then torch's own kernel, the
reference, stays.

- ``onednn_fp32`` (fp32 linears and the chunked loss's products on oneDNN rather than MKL): the lab's run
  shape at one thread (what ``lmlab sweep --jobs 2`` runs on 2 cores) and the demo's layer shape at
  every physical core;
- ``blocked_attention_fp32`` (fp32 training attention through the blocked loops rather than SDPA, a
  one-thread path): both shapes at one thread, with the linears as just chosen;
- ``fused_loops`` concerns compiled models only and is not measured (True).

The result is cached as JSON under ``$LMLAB_CACHE/kernels/`` (default ``~/.cache/lmlab``), one file per
CPU model and torch version (:func:`cache_path`), with the machine, the date and every cell, and
:func:`lmlab.kernels.settings.default_kernels` reads it. Calibration never runs by itself: a process
that measured while others trained would measure them, and kernel choices changing under a running
test suite or sweep would make runs of one comparison differ in summation order. ``make demo`` and
``make ablations`` run it once per machine.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from lmlab.config import ConfigError, ModelConfig
from lmlab.kernels.linear import onednn_available
from lmlab.kernels.settings import CALIBRATION_VERSION, KernelSettings, cache_path, cpu_identity
from lmlab.model import TransformerLM
from lmlab.optim import adamw
from lmlab.threads import physical_cores, using_threads
from lmlab.train_config import TrainConfig

# (label, ModelConfig fields, batch): the shipped specs' byte-level run shape and the demo's layer shape
# (two of its four layers, half its batch: the same products, a quarter of the time)
SHAPES = (
    ("lab d64x2", dict(vocab_size=257, context_length=256, d_model=64, n_layers=2, n_heads=2), 16),
    (
        "demo d256",
        dict(
            vocab_size=4096,
            context_length=256,
            d_model=256,
            n_layers=2,
            n_heads=8,
            n_kv_heads=4,
            norm_type="rmsnorm",
            activation="swiglu",
            position="rope",
            bias="none",
        ),
        8,
    ),
)
TARGET_S = 0.25  # each timed measurement runs about this long (whole steps, at least one)
MIN_GAIN = 0.05  # a kernel is taken only when it makes the steps at least this much faster (geometric mean)


def _timer(fields: dict, batch: int, kernels: KernelSettings) -> Callable[[int], float]:
    """A closure timing ``n`` fp32 training steps of a fresh model with ``kernels``; returns s/step."""

    cfg = ModelConfig(**fields)
    torch.manual_seed(0)
    model = TransformerLM(cfg, kernels=kernels).train()
    opt = adamw([{"params": list(model.parameters())}], TrainConfig(lr=1e-4), torch.device("cpu"))
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length + 1), generator=torch.Generator().manual_seed(0))

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            loss, _ = model(x[:, :-1], targets=x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) / n

    return run


def measure_cell(fields: dict, batch: int, threads: int, on: KernelSettings, off: KernelSettings, rounds: int) -> dict:
    """Interleaved step times of ``on`` and ``off`` at ``threads``: {"ratio": median of on/off per
    round, "q1", "q3", "on_ms", "off_ms" (medians), "rounds", "steps"}."""

    with using_threads(threads):
        timers = {"on": _timer(fields, batch, on), "off": _timer(fields, batch, off)}
        first = {k: t(1) for k, t in timers.items()}  # warm-up, and the size of a measurement
        steps = max(1, round(TARGET_S / max(min(first.values()), 1e-6)))
        times: dict = {"on": [], "off": []}
        for r in range(rounds):
            for k in ("on", "off") if r % 2 == 0 else ("off", "on"):
                times[k].append(timers[k](steps))
    ratios = sorted(a / b for a, b in zip(times["on"], times["off"]))
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {
        "ratio": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "rounds": rounds,
        "steps": steps,
        "on_ms": 1e3 * statistics.median(times["on"]),
        "off_ms": 1e3 * statistics.median(times["off"]),
    }


def _geomean(xs: list) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def calibrate(rounds: int = 7, log: Callable[[str], None] = print) -> dict:
    """Measure every decision (see the module docstring) and return the calibration record:
    {"version", "identity" (:func:`cpu_identity`), "date", "load_avg" [before, after], "threads"
    (physical cores), "choices" {field: bool}, "cells" [{"decision", "shape", "threads", ...}]}.
    Raises ValueError for ``rounds`` < 3."""

    if rounds < 3:
        raise ValueError(f"rounds={rounds} must be >= 3 (a median of paired ratios and its quartiles)")
    cores = physical_cores()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cells: list = []
    choices: dict = {}

    def decide(decision: str, plan: list, on: KernelSettings, off: KernelSettings) -> bool:
        ratios = []
        for label, fields, batch, threads in plan:
            cell = measure_cell(fields, batch, threads, on, off, rounds)
            cells.append({"decision": decision, "shape": label, "threads": threads, **cell})
            ratios.append(cell["ratio"])
            log(
                f"{decision}: {label}, {threads} thread(s): on/off {cell['ratio']:.3f} "
                f"(IQR {cell['q1']:.3f}-{cell['q3']:.3f}; {cell['on_ms']:.1f} vs {cell['off_ms']:.1f} ms/step)"
            )
        chosen = _geomean(ratios) < 1 - MIN_GAIN
        log(
            f"{decision}: {'on' if chosen else 'off'} (geometric mean of the cells' ratios {_geomean(ratios):.3f}; "
            f"on below {1 - MIN_GAIN:g})"
        )
        return chosen

    (lab_label, lab, lab_batch), (demo_label, demo, demo_batch) = SHAPES
    if onednn_available():
        choices["onednn_fp32"] = decide(
            "onednn_fp32",
            [(lab_label, lab, lab_batch, 1), (demo_label, demo, demo_batch, cores)],
            KernelSettings(True, False),
            KernelSettings(False, False),
        )
    else:
        choices["onednn_fp32"] = False
        log("onednn_fp32: off (this torch build has no oneDNN linear op on this CPU)")
    choices["blocked_attention_fp32"] = decide(
        "blocked_attention_fp32",
        [(lab_label, lab, lab_batch, 1), (demo_label, demo, demo_batch, 1)],
        KernelSettings(choices["onednn_fp32"], True),
        KernelSettings(choices["onednn_fp32"], False),
    )
    return {
        "version": CALIBRATION_VERSION,
        "identity": cpu_identity(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_avg": [load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "threads": cores,
        "rounds": rounds,
        "min_gain": MIN_GAIN,
        "choices": choices,
        "cells": cells,
    }


def check_destination(path: Optional[Path] = None) -> Path:
    """Where a calibration may be written (``path``, default :func:`cache_path`), checked before any
    measuring: ConfigError naming the path when it is a folder, a special file, or a file that is not a
    kernel calibration (nothing else is ever overwritten), or when its folder is a file."""

    path = Path(path or cache_path())
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(
                f"--out {str(path)!r}: {str(parent)!r} is a file, not a folder; give a .json path in a folder"
            )
    if path.is_dir():
        raise ConfigError(
            f"--out {str(path)!r} is a folder; give a .json file path (new, or an earlier calibration to replace)"
        )
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise ConfigError(f"--out {str(path)!r} is not a regular file; give a .json file path")
        try:
            old = json.loads(path.read_text())
            ours = isinstance(old, dict) and "choices" in old and "identity" in old and "cells" in old
        except (OSError, ValueError, UnicodeDecodeError):
            ours = False
        if not ours:
            raise ConfigError(
                f"--out {str(path)!r} exists and is not a kernel calibration; refusing to overwrite "
                f"it (give a new path)"
            )
    return path


def write_calibration(record: dict, path: Optional[Path] = None) -> Path:
    """Write ``record`` atomically to ``path`` (default :func:`cache_path`); returns the path."""
    path = Path(path or cache_path(record["identity"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
