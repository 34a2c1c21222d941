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
- ``fused_loops`` concerns compiled models only and is not measured (True);
- ``decode_threads`` (whether ``lmlab generate`` decodes one prompt on every physical core rather than on
  one thread, :func:`lmlab.kernels.decode_layout.decode_threads`): whole greedy batch-1 fp32 decode steps
  (:func:`lmlab.generate.stream_batch`, the KV cache after a 16-token prompt), eager at the shapes of
  ``decode_layout`` and compiled at those of ``decode_reductions`` (below), measured **together with**
  those two decisions' fp32 batch-1 cells: the four settings (one thread or every core) x (transposed
  weights or the alternative: oneDNN-packed eager, fused reductions compiled) in one interleaved cell
  (each thread count built and compiled once before timing), because whether a second thread pays
  depends on the layout (a Zen 5 EPYC: nothing over transposed weights, a quarter of the step over packed
  ones or the reductions). A setting is taken where it is at least ``MIN_GAIN`` faster than every setting
  that changes less (:func:`pick_one_row`); a model takes the choice of the measured size nearest its own
  (docs/bench/decode_threads.md). No threads choice on a one-core machine. Measured first: the other
  batch-1 cells (bf16) run on the threads it chose.
- ``decode_layout`` (whether eager CPU decoding multiplies by oneDNN-packed weights rather than
  transposed ones, :mod:`lmlab.kernels.decode_layout`): whole greedy decode steps of the demo shape
  (4.0M linear weights) and a GPT-2-wide one (d_model 768, 20.4M), in fp32 and bf16 weights (fp32 batch
  1 with the threads, above), batch 1 on the threads ``decode_threads`` chose for the shape (what
  ``lmlab generate`` uses for one prompt) and batch 8 on every physical core: each of these cells and
  shapes by the same rule, and a model takes the choice of the measured size nearest its own (which
  layout wins can change with the size: a 2-core Xeon, fp32 batch 8, packed 1.31x the time at the demo
  shape and 0.87x at d_model 768).
- ``decode_reductions`` (whether the compiled decode step at batch 1, :mod:`lmlab.kernels.compiled_decode`,
  multiplies and attends by fused reductions over the weights as they are rather than over transposed
  weights through MKL): the demo's shape and the GPT-2-wide one with GPT-2's vocabulary (52.8M weights),
  fp32 (with the threads, above) and bf16, on the threads ``decode_threads`` chose for the shape, each
  step compiled once before timing; the nearest measured size decides as above (which wins changes with the size:
  docs/bench/decode_reductions.md).
- ``decode_frozen`` (whether that compiled batch-1 step is compiled with Inductor's freezing, its weights
  constants of the graph, :mod:`lmlab.kernels.compiled_decode`): bf16 weights at the same shapes and
  threads, against the compiled step ``decode_reductions`` chose (on the model-167 Xeon it took 0.82x /
  0.78x the eager packed step's time at 124M and gained nothing at the demo's shape:
  docs/bench/decode_freezing.md). fp32 is not measured (it lost at 124M there) and is never frozen.

The result is cached as JSON under ``$LMLAB_CACHE/kernels/`` (default ``~/.cache/lmlab``), one file per
CPU model and torch version (:func:`cache_path`), with the machine, the date and every cell, and
:func:`lmlab.kernels.settings.default_kernels` reads it. Calibration never runs by itself: a process
that measured while others trained would measure them, and kernel choices changing under a running
test suite or sweep would make runs of one comparison differ in summation order. ``make demo`` and
``make ablations`` run it once per machine.
"""

from __future__ import annotations

import dataclasses
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
from lmlab.fsutil import atomic_write_text
from lmlab.json_checks import parse_json, read_text
from lmlab.kernels.decode_layout import linear_weight_count, packed_decode_available
from lmlab.kernels.linear import onednn_available
from lmlab.kernels.settings import (
    CALIBRATION_VERSION,
    DECODE_DECISIONS,
    ONE_ROW,
    KernelSettings,
    cache_path,
    cpu_identity,
    decode_cell,
)
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
# the decode layout's shapes: the demo's (all four layers: a step is cheap) and a GPT-2-wide one
DECODE_SHAPES = (
    ("demo d256", dict(SHAPES[1][1], n_layers=4)),
    (
        "d768x2",
        dict(vocab_size=8192, context_length=256, d_model=768, n_layers=2, n_heads=12, norm_type="layernorm"),
    ),
)
# the compiled step's reductions: the demo's shape and the GPT-2-wide one with GPT-2's vocabulary (a step's
# bytes are then mostly its 50,257 x 768 LM head, where the reductions lose)
REDUCTION_SHAPES = (DECODE_SHAPES[0], ("d768x2 vocab 50257", dict(DECODE_SHAPES[1][1], vocab_size=50257)))
DECODE_PROMPT = 16  # tokens of the prompt before the timed decode steps
DECODE_BATCHES = (1, 8)  # rows a step: the DECODE_CELLS batch classes 1 and 2+
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


def _decode_timer(
    fields: dict, batch: int, dtype: torch.dtype, kernels: KernelSettings, compile: bool = False
) -> Callable[[int], float]:
    """A closure timing ``n`` greedy decode steps, eager or ``compile``d (after a :data:`DECODE_PROMPT`-token
    prompt, in one :func:`lmlab.generate.stream_batch` call) of a fresh model in ``dtype`` with ``kernels``;
    returns s/step. ``n`` is capped by the context. A compiled step is compiled here, before any timing."""
    from lmlab.generate import stream_batch

    cfg = ModelConfig(**fields)
    torch.manual_seed(0)
    model = TransformerLM(cfg, kernels=kernels).eval().to(dtype)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (batch, DECODE_PROMPT), generator=g).tolist()
    if compile:
        for _ in stream_batch(model, prompts, 3, temperature=0.0, compile=True):
            pass

    def run(n: int) -> float:
        n = min(n, cfg.context_length - DECODE_PROMPT)
        steps = stream_batch(model, prompts, n + 1, temperature=0.0, compile=compile)
        next(steps)  # the prompt's forward and the first token
        t0 = time.perf_counter()
        for _ in steps:
            pass
        return (time.perf_counter() - t0) / n

    return run


def measure_cell(fields: dict, batch: int, threads: int, on: KernelSettings, off: KernelSettings, rounds: int) -> dict:
    """Interleaved step times of ``on`` and ``off`` at ``threads``: {"ratio": median of on/off per
    round, "q1", "q3", "on_ms", "off_ms" (medians), "rounds", "steps"}."""
    with using_threads(threads):
        return _interleave({"on": _timer(fields, batch, on), "off": _timer(fields, batch, off)}, rounds)


def measure_decode_cell(fields: dict, batch: int, threads: int, dtype: torch.dtype, rounds: int, base: KernelSettings):
    """:func:`measure_cell` for decode steps: 'on' multiplies by oneDNN-packed weights in the cell of
    ``dtype`` and ``batch``, 'off' by transposed ones (``base``'s other choices in both); adds "weights"
    (the model's linear weights)."""
    cell = decode_cell(dtype, batch)
    weights = linear_weight_count(TransformerLM(ModelConfig(**fields)))
    on = dataclasses.replace(base, decode_layout=((cell, weights, True),))
    off = dataclasses.replace(base, decode_layout=())
    with using_threads(threads):
        timers = {"on": _decode_timer(fields, batch, dtype, on), "off": _decode_timer(fields, batch, dtype, off)}
        return {**_interleave(timers, rounds), "weights": weights}


def measure_reduction_cell(
    fields: dict, dtype: torch.dtype, rounds: int, base: KernelSettings, threads: int = 1
) -> dict:
    """:func:`measure_decode_cell` for the compiled decode step at batch 1 on ``threads`` threads: 'on'
    multiplies and attends by fused reductions (decode_layout's 'row-reductions'), 'off' over transposed
    weights through MKL; adds "weights". Each compiles once before timing (seconds)."""
    cell = decode_cell(dtype, 1)
    weights = linear_weight_count(TransformerLM(ModelConfig(**fields)))
    on = dataclasses.replace(base, decode_reductions=((cell, weights, True),))
    off = dataclasses.replace(base, decode_reductions=())
    with using_threads(threads):
        timers = {"on": _decode_timer(fields, 1, dtype, on, True), "off": _decode_timer(fields, 1, dtype, off, True)}
        return {**_interleave(timers, rounds), "weights": weights}


def measure_frozen_cell(fields: dict, rounds: int, off: KernelSettings, threads: int = 1) -> dict:
    """:func:`measure_decode_cell` for the compiled bf16 decode step at batch 1 on ``threads`` threads: 'on'
    compiled with Inductor's freezing (decode_layout's 'frozen'), 'off' as ``off`` compiles it; adds
    "weights". Each compiles once before timing (seconds; the frozen one longer)."""
    cell = decode_cell(torch.bfloat16, 1)
    weights = linear_weight_count(TransformerLM(ModelConfig(**fields)))
    on = dataclasses.replace(off, decode_frozen=((cell, weights, True),))
    with using_threads(threads):
        timers = {
            "on": _decode_timer(fields, 1, torch.bfloat16, on, True),
            "off": _decode_timer(fields, 1, torch.bfloat16, off, True),
        }
        return {**_interleave(timers, rounds), "weights": weights}


def measure_one_row_cell(
    fields: dict, compile: bool, cores: int, rounds: int, base: KernelSettings, alternative: bool = True
) -> dict:
    """One prompt's greedy fp32 decode steps at batch 1, eager or ``compile``d, in every setting of two
    decisions at once: one thread or ``cores`` threads (``decode_threads``) x transposed weights or the
    ``alternative`` (eager: oneDNN-packed, ``decode_layout``; compiled: fused reductions,
    ``decode_reductions``; False: transposed only), each model built, and compiled, at its own thread
    count, with ``base``'s other choices. Timed together (:func:`_interleave_many`), so the thread count is
    judged in the layout it would run with (on a Zen 5 EPYC a second thread gained nothing over transposed
    weights and cut a quarter of the step over packed ones or the reductions). Returns {"variants":
    {(threads, alternative): {"ratio", "q1", "q3", "ms"}} (ratios to (1, False) per round), "rounds",
    "steps", "weights"}; one core: the two layouts on one thread."""
    weights = linear_weight_count(TransformerLM(ModelConfig(**fields)))
    cell = decode_cell(torch.float32, 1)

    def timer(n_threads: int, alt: bool) -> Callable[[int], float]:
        if compile:
            kernels = dataclasses.replace(base, decode_reductions=((cell, weights, alt),))
        else:
            kernels = dataclasses.replace(base, decode_layout=((cell, weights, alt),))
        with using_threads(n_threads):
            run = _decode_timer(fields, 1, torch.float32, kernels, compile)

        def timed(n: int) -> float:
            with using_threads(n_threads):
                return run(n)

        return timed

    keys = [(t, a) for a in ((False, True) if alternative else (False,)) for t in sorted({1, cores})]
    return {**_interleave_many({k: timer(*k) for k in keys}, (1, False), rounds), "weights": weights}


def _interleave_many(timers: dict, base, rounds: int) -> dict:
    """Time each of ``timers`` (closures: n steps -> s/step) once per round for ``rounds`` rounds, the order
    rotating by one each round, after one untimed step each (also the size of a measurement): {"variants":
    {key: {"ratio" (median over rounds of its time / ``base``'s), "q1", "q3", "ms" (median)}}, "rounds",
    "steps"}."""
    keys = list(timers)
    first = {k: t(1) for k, t in timers.items()}  # warm-up, and the size of a measurement
    steps = max(1, round(TARGET_S / max(min(first.values()), 1e-6)))
    times: dict = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            times[k].append(timers[k](steps))
    variants = {}
    for k in keys:
        ratios = sorted(a / b for a, b in zip(times[k], times[base]))
        q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
        variants[k] = {
            "ratio": statistics.median(ratios),
            "q1": q[0],
            "q3": q[2],
            "ms": 1e3 * statistics.median(times[k]),
        }
    return {"variants": variants, "rounds": rounds, "steps": steps}


def _interleave(timers: dict, rounds: int) -> dict:
    """Time ``timers['on']`` and ``timers['off']`` (closures: n steps -> s/step) in ``rounds`` rounds, the
    order alternating, after one untimed step each: {"ratio" (median of on/off per round), "q1", "q3",
    "rounds", "steps", "on_ms", "off_ms"}."""
    out = _interleave_many({"on": timers["on"], "off": timers["off"]}, "off", rounds)
    on, off = out["variants"]["on"], out["variants"]["off"]
    return {k: on[k] for k in ("ratio", "q1", "q3")} | {
        "rounds": rounds,
        "steps": out["steps"],
        "on_ms": on["ms"],
        "off_ms": off["ms"],
    }


def pick_one_row(variants: dict):
    """The (threads, alternative) setting a one-row cell (:func:`measure_one_row_cell`) chooses: of the
    settings at least ``MIN_GAIN`` faster than every setting that changes less (for (cores, True): than
    (1, False), (cores, False) and (1, True); for the others: than (1, False)), the fastest; (1, False)
    where none is."""

    def fewer(k) -> list:
        return [j for j in variants if j != k and j[0] in (1, k[0]) and j[1] in (False, k[1])]

    ok = [
        k
        for k in variants
        if fewer(k) and all(variants[k]["ratio"] < (1 - MIN_GAIN) * variants[j]["ratio"] for j in fewer(k))
    ]
    return min(ok, key=lambda k: variants[k]["ratio"]) if ok else (1, False)


def _geomean(xs: list) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def calibrate(rounds: int = 7, log: Callable[[str], None] = print, decode: bool = True) -> dict:
    """Measure every decision (see the module docstring) and return the calibration record:
    {"version", "identity" (:func:`cpu_identity`), "date", "load_avg" [before, after], "threads"
    (physical cores), "choices" {field: bool or decode list}, "cells" [{"decision", "shape", "threads",
    ...}]}. ``decode`` False: the training decisions only (about a tenth of the time on a cold compile
    cache: the decode decisions compile a dozen decode steps); the record then has no decode lists, and
    decoding keeps torch's defaults and the fixed thread rule. Raises ValueError for ``rounds`` < 3."""

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
    base = KernelSettings(choices["onednn_fp32"], choices["blocked_attention_fp32"])
    if not decode:
        log("decode decisions: not measured (training only; `lmlab bench calibrate` measures them)")
    else:
        _decide_decoding(base, rounds, cores, choices, cells, log)
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


def _decide_decoding(base: KernelSettings, rounds: int, cores: int, choices: dict, cells: list, log) -> None:
    """The four decode decisions into ``choices`` (their cells appended to ``cells``), with the training
    kernels ``base``: one prompt's fp32 steps first, threads and layout together (:func:`decide_one_row`),
    then the other layout cells, bf16 batch 1 on the threads chosen for the shape, then the frozen step."""
    choices["decode_threads"], known, one_row = decide_one_row(base, rounds, cores, cells, log)
    choices["decode_layout"] = decide_decode(base, rounds, cores, cells, log, one_row, known)
    choices["decode_reductions"] = decide_decode_reductions(base, rounds, cells, log, one_row, known)
    choices["decode_frozen"] = decide_decode_frozen(base, rounds, cells, log, one_row, choices["decode_reductions"])


def decide_decode_frozen(
    base: KernelSettings, rounds: int, cells: list, log: Callable[[str], None], one_row: dict, reductions: list
) -> list:
    """The ``decode_frozen`` decision (module docstring): [{"cell": "bf16 batch 1", "weights", "on"}] for each
    of :data:`REDUCTION_SHAPES`, ``on`` where the frozen compiled step was at least ``MIN_GAIN`` faster than
    the compiled step with ``reductions`` (the ``decode_reductions`` entries just chosen), on ``one_row[
    ('compiled batch 1', shape label)]`` threads (1 where it has none); each measurement is appended to
    ``cells``. A step that cannot compile here is left out, and the log says why."""
    off = dataclasses.replace(base, decode_reductions=tuple((e["cell"], e["weights"], e["on"]) for e in reductions))
    entries = []
    for label, fields in REDUCTION_SHAPES:
        threads = one_row.get(("compiled batch 1", label), 1)
        try:
            cell = measure_frozen_cell(fields, rounds, off, threads)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            log(f"decode_frozen bf16 batch 1: not frozen (the compiled step does not compile here: {str(exc)[:160]})")
            break
        entries.append(_decode_entry("decode_frozen", decode_cell(torch.bfloat16, 1), label, threads, cell, cells, log))
    return entries


def decide_decode(
    base: KernelSettings,
    rounds: int,
    cores: int,
    cells: list,
    log: Callable[[str], None],
    one_row: Optional[dict] = None,
    known: Optional[dict] = None,
) -> list:
    """The ``decode_layout`` decision (module docstring): [{"cell", "weights", "packed"}] for each of
    :data:`DECODE_CELLS` and :data:`DECODE_SHAPES`, ``packed`` where oneDNN-packed weights made the
    decode steps at least ``MIN_GAIN`` faster than transposed ones; batch 8 on ``cores`` threads, batch 1
    on ``one_row[('eager batch 1', shape label)]`` (:func:`decide_one_row`; 1 where it has none); an entry
    of ``known`` ({(decision, cell, shape label): entry}, decided with the threads) is taken as it is; each
    measurement is appended to ``cells``. Empty where this torch cannot pack; a cell oneDNN cannot
    pack here is left out."""
    if not packed_decode_available():
        log("decode_layout: transposed (this torch build cannot pack weights for oneDNN)")
        return []
    entries = []
    for dtype in (torch.float32, torch.bfloat16):
        for batch in DECODE_BATCHES:
            name = decode_cell(dtype, batch)
            for label, fields in DECODE_SHAPES:
                if ("decode_layout", name, label) in (known or {}):
                    entries.append(known["decode_layout", name, label])
                    continue
                threads = (one_row or {}).get(("eager batch 1", label), 1) if batch == 1 else cores
                try:
                    cell = measure_decode_cell(fields, batch, threads, dtype, rounds, base)
                except RuntimeError as exc:  # e.g. no oneDNN packing for bf16 on this CPU
                    log(f"decode_layout {name}: transposed (oneDNN cannot pack it here: {str(exc)[:120]})")
                    break
                entries.append(_decode_entry("decode_layout", name, label, threads, cell, cells, log))
    return entries


def _decode_entry(decision: str, name: str, label: str, threads: int, cell: dict, cells: list, log) -> dict:
    """Record one measured decode cell of ``decision`` (a key of :data:`DECODE_DECISIONS`) in ``cells``,
    log it, and return its calibration entry {"cell", "weights", choice}: the setting measured as 'on'
    (oneDNN-packed weights, fused reductions: against transposed weights; every core: against one thread)
    taken where it made the steps at least ``MIN_GAIN`` faster."""
    chosen = cell["ratio"] < 1 - MIN_GAIN
    cells.append({"decision": f"{decision} {name}", "shape": label, "threads": threads, **cell})
    on, off = {
        "decode_layout": ("packed", "transposed"),
        "decode_reductions": ("reductions", "transposed"),
        "decode_frozen": ("frozen", "not frozen"),
    }.get(decision, (f"{threads} threads", "1 thread"))
    log(
        f"{decision} {name}: {label} ({cell['weights'] / 1e6:.1f}M weights), {threads} thread(s): "
        f"{on}/{off} {cell['ratio']:.3f} (IQR {cell['q1']:.3f}-{cell['q3']:.3f}; "
        f"{cell['on_ms']:.2f} vs {cell['off_ms']:.2f} ms/step): {on if chosen else off}"
    )
    value = (threads if chosen else 1) if decision == "decode_threads" else chosen  # a thread count, or a choice
    return {"cell": name, "weights": cell["weights"], DECODE_DECISIONS[decision]: value}


def decide_decode_reductions(
    base: KernelSettings,
    rounds: int,
    cells: list,
    log: Callable[[str], None],
    one_row: Optional[dict] = None,
    known: Optional[dict] = None,
) -> list:
    """The ``decode_reductions`` decision (module docstring): [{"cell", "weights", "on"}] for each of
    :data:`REDUCTION_CELLS` and :data:`REDUCTION_SHAPES`, ``on`` where the compiled step by fused reductions
    was at least ``MIN_GAIN`` faster than over transposed weights, on ``one_row[('compiled batch 1', shape
    label)]`` threads (1 where it has none); an entry of ``known`` is taken as it is (:func:`decide_decode`);
    each measurement is appended to ``cells``. A cell whose step cannot compile here (no C++ compiler for
    Inductor) is left out, and the log says why."""
    entries = []
    for dtype in (torch.float32, torch.bfloat16):
        name = decode_cell(dtype, 1)
        for label, fields in REDUCTION_SHAPES:
            if ("decode_reductions", name, label) in (known or {}):
                entries.append(known["decode_reductions", name, label])
                continue
            threads = (one_row or {}).get(("compiled batch 1", label), 1)
            try:
                cell = measure_reduction_cell(fields, dtype, rounds, base, threads)
            except torch._dynamo.exc.BackendCompilerFailed as exc:  # e.g. no C++ compiler: said, stays transposed
                log(f"decode_reductions {name}: transposed (the compiled step does not compile here: {str(exc)[:160]})")
                break
            entries.append(_decode_entry("decode_reductions", name, label, threads, cell, cells, log))
    return entries


def decide_one_row(base: KernelSettings, rounds: int, cores: int, cells: list, log) -> tuple:
    """The ``decode_threads`` decision and the fp32 batch-1 cells of ``decode_layout`` and
    ``decode_reductions``, measured together (module docstring; :func:`measure_one_row_cell`, chosen by
    :func:`pick_one_row`): the eager step at :data:`DECODE_SHAPES` (packed against transposed weights where
    this torch can pack) and the compiled one at :data:`REDUCTION_SHAPES` (fused reductions against
    transposed weights), with the training kernels ``base``. Returns (threads entries [{"cell", "weights",
    "threads"}], {(decision, "fp32 batch 1", shape label): entry}, {(threads cell, shape label): threads});
    each setting's figures are appended to ``cells``. On one core no threads entry (one thread is all
    there is). Where the compiled step cannot compile here its cells are left out (said in the log)."""
    entries, known, chosen = [], {}, {}
    name = decode_cell(torch.float32, 1)
    for cell, compile, shapes, decision, alt_name in (
        ("eager batch 1", False, DECODE_SHAPES, "decode_layout", "packed"),
        ("compiled batch 1", True, REDUCTION_SHAPES, "decode_reductions", "reductions"),
    ):
        alternative = compile or packed_decode_available()
        for label, fields in shapes:
            try:
                m = measure_one_row_cell(fields, compile, cores, rounds, base, alternative)
            except torch._dynamo.exc.BackendCompilerFailed as exc:
                log(f"decode_threads {cell}: not measured (the compiled step does not compile here: {str(exc)[:160]})")
                break
            threads, alt = pick_one_row(m["variants"])
            base_ms = m["variants"][1, False]["ms"]
            for (t, a), v in m["variants"].items():
                what = f"{t} thread(s), {alt_name if a else 'transposed'}"
                cells.append(
                    {
                        "decision": f"{ONE_ROW} {cell}",
                        "shape": label,
                        "threads": t,
                        "setting": what,
                        **{k: v[k] for k in ("ratio", "q1", "q3")},
                        "on_ms": v["ms"],
                        "off_ms": base_ms,
                        "rounds": m["rounds"],
                        "steps": m["steps"],
                        "weights": m["weights"],
                    }
                )
                if (t, a) != (1, False):
                    log(
                        f"{ONE_ROW} {cell}: {label} ({m['weights'] / 1e6:.1f}M weights): {what} / 1 thread, transposed "
                        f"{v['ratio']:.3f} (IQR {v['q1']:.3f}-{v['q3']:.3f}; {v['ms']:.2f} vs {base_ms:.2f} ms/step)"
                    )
            log(f"{ONE_ROW} {cell}: {label}: {threads} thread(s), {alt_name if alt else 'transposed'}")
            if cores > 1:
                entries.append({"cell": cell, "weights": m["weights"], "threads": threads})
            chosen[cell, label] = threads
            if alternative:
                known[decision, name, label] = {"cell": name, "weights": m["weights"], DECODE_DECISIONS[decision]: alt}
    return entries, known, chosen


def check_destination(path: Optional[Path] = None) -> tuple[Path, bool]:
    """Where a calibration may be written (``path``, default :func:`cache_path`), checked before any
    measuring: (the path, whether it holds a damaged file to set aside first). ConfigError naming the path
    when it is a folder, a special file, a file that is not a kernel calibration given as ``path`` (nothing
    the user named is ever overwritten), when its folder is a file, or when nothing can be written in its
    folder (a read-only or missing ``LMLAB_CACHE``). A damaged file at the default path (lmlab's own
    cache, unreadable as a calibration) is not refused: the second value says to set it aside
    (:func:`set_aside`) before the new one is written."""

    where = "--out" if path else "this machine's calibration file"
    default = path is None
    path = Path(path or cache_path())
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(
                f"{where} {str(path)!r}: {str(parent)!r} is a file, not a folder; give a .json path in a folder"
            )
    if path.is_dir():
        raise ConfigError(
            f"{where} {str(path)!r} is a folder; give a .json file path (new, or an earlier calibration to replace)"
        )
    damaged = False
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise ConfigError(f"{where} {str(path)!r} is not a regular file; give a .json file path")
        try:  # UTF-8 and nesting checked before parsing (json_checks)
            old = parse_json(read_text(path), str(path), finite=False)
            ours = isinstance(old, dict) and "choices" in old and "identity" in old and "cells" in old
        except (OSError, ConfigError):
            ours = False
        if not ours and not default:
            raise ConfigError(
                f"{where} {str(path)!r} exists and is not a kernel calibration; refusing to overwrite it "
                f"(delete it, or give --out another path)"
            )
        damaged = not ours
    try:  # writable? (else minutes of measuring would be lost at the end)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=".write-check-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        hint = " (the cache folder: LMLAB_CACHE, default ~/.cache/lmlab)" if default else ""
        raise ConfigError(
            f"{where} {str(path)!r}: cannot write in {str(path.parent)!r}{hint}: {exc.strerror or exc}"
        ) from None
    return path, damaged


def set_aside(path: Path) -> Path:
    """Rename the damaged file ``path`` to ``PATH.damaged-<UTC time>`` (kept, never deleted); returns the
    new path."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    os.replace(path, aside)
    return aside


def write_calibration(record: dict, path: Optional[Path] = None) -> Path:
    """Write ``record`` atomically to ``path`` (default :func:`cache_path`; :func:`lmlab.fsutil.atomic_write_text`:
    an ordinary file's mode, readable by a shared cache's users); returns the path."""
    path = Path(path or cache_path(record["identity"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return path
