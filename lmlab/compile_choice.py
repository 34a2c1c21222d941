"""``compile: auto``: whether a run compiles its model, and how, from what it costs on this machine.

Compiling pays only when the steps left repay the compile time. Before its first step a run with
``compile=auto`` times eager forward + backward passes of its own first batch (:func:`probe_step_seconds`:
no optimizer step, its random state forked, gradients cleared: the run itself is unchanged) and predicts
for each candidate (eager, ``blocks``: :func:`compile_blocks`, ``model``: ``torch.compile``
of the whole model) the time of the steps left plus the compile (:func:`choose`):

    time(eager) = steps x probe x r_eager
    time(scope) = steps x probe x r_scope + compile_s(scope)

``r`` (a steady step's seconds over the probe's) and ``compile_s`` (the first compiled step's seconds
past a steady one) come from this machine's record for this shape (:class:`CompileRecords`), which every
run that compiles or may compile updates with what it measured (:class:`RunClock`); where there is none
yet, from :data:`PRIORS` (a compile scope's prior relative to eager's step). A run with
``budget_seconds`` instead picks the candidate that fits the most steps into its budget. The choice,
its figures and whether they were measured or prior are printed, kept in run.yaml (``compile``) and
reused on resume, so a resumed run computes as the uninterrupted one did.

The compiled code itself is cached by torch's inductor (its FX graph and autograd caches, on by default
in ``TORCHINDUCTOR_CACHE_DIR``), across runs and sweep members of the same shape: that is why a record's
``compile_s`` after a first, cold compile is predicted warm (:data:`WARM_FRACTION`).

Sources: PyTorch's recipe "Reducing torch.compile cold start compilation time with regional
compilation" (the ``blocks`` candidate); measurements: docs/training.md, docs/bench/default_vs_hf.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from lmlab.data.corpus import cache_root
from lmlab.fsutil import atomic_write_text
from lmlab.json_checks import parse_json, read_text
from lmlab.parallel import barrier
from lmlab.run_folder import RUN_FILE, read_run, write_run

RECORD_VERSION = 1
SCOPES = ("eager", "blocks", "model")
# Where a machine has no record for a shape: a steady step's time over eager's (eager's over the probe's:
# 1.0) and the compile seconds (cold inductor cache). From the issue-42 bar config and the demo recipe
# (bf16, 2 threads, a 2-core AMD EPYC family 25 model 17, torch 2.13; docs/training.md): whole model
# 0.64x eager's step, blocks 1.066x the whole model's; cold compile 62 s whole model (15 s a layer), 23 s
# a block kind. A record replaces each figure as soon as one run has measured it.
PRIORS = {
    "eager": {"ratio": 1.0},
    "model": {"ratio": 0.64, "compile_s_per_layer": 15.0},
    "blocks": {"ratio": 0.68, "compile_s_per_kind": 23.0},
}
# a compile candidate never measured on this machine is tried when its prior prediction is within this
# fraction of eager's: one run pays at most that to measure it, and every later run of the shape decides on
# measured figures (without it a shape whose priors say "about even" would never be measured)
EXPLORE = 0.10
PROBE_PASSES = 5  # timed passes of the probe (median): a record's figures are relative to it, run to run
KEEP_RATIOS = 5  # a record keeps a scope's last five steady-step / probe figures; their median decides
RATIO_BOUNDS = (0.25, 4.0)  # a figure outside: the probe or the steps were slowed by other work
CLOCK_EARLY, CLOCK_LATE_FROM, CLOCK_LATE = 8, 100, 200  # the steps a StepClock times (see there)
# a record's first compile was cold (an empty inductor cache); the next one finds torch's cache warm and
# takes this fraction of it (demo recipe, 2-core Zen 4: whole model 12 s of 62, blocks 3.8 s of 23)
WARM_FRACTION = {"model": 0.19, "blocks": 0.17}


def compile_blocks(model: torch.nn.Module) -> None:
    """Regional compilation: ``torch.compile`` each Transformer block of ``model`` in place
    (``nn.Module.compile``), the embedding, final norm and loss left eager.

    The blocks share their code, so Dynamo traces and inductor compiles one block and reuses it for the
    others (parameters are graph inputs): the cold compile time of one block instead of the whole
    model (PyTorch's recipe "Reducing torch.compile cold start compilation time with regional
    compilation"; measured: docs/bench/measured-choices.md). Calls outside training should run under
    :func:`eager` (no graphs compiled for them)."""
    for block in model.blocks:
        block.compile()


def eager():
    """A context in which compiled modules run their eager code (``torch.compiler.set_stance``):
    evaluation and diagnostics of a run whose blocks were compiled for training. Before torch 2.6
    (no set_stance) a no-op; compile_scope=blocks is refused there."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance else contextlib.nullcontext()


def no_compiler_reason(device: torch.device) -> Optional[str]:
    """Why inductor cannot compile for ``device`` here (None when it can): on CPU it needs a C++
    compiler (``CXX`` or g++/clang++ on PATH, as torch's cpp_builder looks for)."""
    if device.type != "cpu":
        return None
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        compiler = get_cpp_compiler()
    except Exception as exc:  # torch raises its own error types when no compiler is found
        return f"inductor finds no C++ compiler ({type(exc).__name__})"
    if not shutil.which(compiler):
        return f"inductor's C++ compiler {compiler!r} is not on PATH"
    return None


def shape_key(cfg, tc, amp_dtype: Optional[torch.dtype], device: torch.device, threads: int, world: int) -> str:
    """A record's key: everything that changes a step's time or its compiled graph (the model's config,
    the micro-batch, precision, device, threads, ranks), hashed."""

    desc = json.dumps(
        {
            "model": cfg.to_dict(),
            "batch": tc.batch_size,
            "accum": tc.grad_accum,
            "checkpointing": tc.activation_checkpointing,
            "optimizer": tc.optimizer,
            "dtype": str(amp_dtype),
            "device": str(device.type),
            "threads": threads,
            "world": world,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(desc.encode()).hexdigest()[:20]


def machine_name(device: torch.device) -> str:
    """The records' folder: the CPU model (family/model) or the CUDA device's name, and torch's version."""
    if device.type == "cpu":  # named as this machine's kernel calibration is
        from lmlab.kernels.settings import cache_path

        return cache_path().stem
    name = f"{torch.cuda.get_device_name(device)}-torch{torch.__version__}"
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", name).strip("_")[:150]


class CompileRecords:
    """This machine's measured compile figures, one JSON file per shape key under
    ``$LMLAB_CACHE/compile/<machine>/``: ``{"version", "<scope>": {"ratios", "compile_s", "compiles",
    "date"}}``, ``ratios`` the last :data:`KEEP_RATIOS` steady-step / probe figures (a scope's ratio is
    their median, so one run on a busy machine does not set it). A figure outside :data:`RATIO_BOUNDS`
    (the probe or the steps slowed by other work) is not recorded. A file that does not parse as a
    record is ignored with a line on stderr and left as it is (never trusted, never overwritten or
    deleted); writes are atomic (the last writer wins when two runs of one shape finish together), and
    one that fails (a read-only cache) is said on stderr while the run goes on."""

    def __init__(self, device: torch.device, root: Optional[Path] = None):

        self.folder = (root or cache_root() / "compile") / machine_name(device)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def _read(self, key: str) -> tuple[Optional[dict], Optional[str]]:
        """(the stored entries, None), ({}, None) for no file, or (None, why) for a file that is not a
        record."""
        path = self.path(key)
        if not path.is_file():
            return {}, None
        try:
            # UTF-8 and nesting checked before parsing (json_checks: no RecursionError)
            rec = parse_json(read_text(path), str(path), finite=False)
            if rec.get("version") != RECORD_VERSION:
                raise ValueError(f"version {rec.get('version')!r}, not {RECORD_VERSION}")
            out = {}
            for scope in SCOPES:
                if scope in rec:
                    entry = rec[scope]
                    ratios = [float(r) for r in entry["ratios"]] if "ratios" in entry else [float(entry["ratio"])]
                    comp, n = float(entry.get("compile_s", 0.0)), int(entry.get("compiles", 0))
                    if (
                        not ratios
                        or not all(RATIO_BOUNDS[0] <= r <= RATIO_BOUNDS[1] for r in ratios)
                        or not (0 <= comp < 1e6 and n >= 0)
                    ):
                        raise ValueError(f"{scope}: ratios {ratios}, compile_s {comp}, compiles {n} out of range")
                    out[scope] = {
                        "ratios": ratios[-KEEP_RATIOS:],
                        "ratio": statistics.median(ratios[-KEEP_RATIOS:]),
                        "compile_s": comp,
                        "compiles": n,
                        "date": str(entry.get("date", "?")),
                    }
            return out, None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:  # ConfigError: a ValueError
            return None, str(exc).removeprefix(f"{path}: ")

    def load(self, key: str, warn: Callable[[str], None] = lambda s: None) -> dict:
        """This shape's entries (``ratio``: the median of ``ratios``), {} when there is none or the file is
        not a record (``warn`` then gets a line saying so)."""
        rec, why = self._read(key)
        if rec is None:
            warn(f"note: compile record {str(self.path(key))!r} is not usable ({why}); using the priors")
            return {}
        return rec

    def update(self, key: str, scope: str, ratio: float, compile_s: Optional[float] = None) -> None:
        """Add ``scope``'s steady step over the probe (``ratio``) and, when given, a compile's seconds
        (counted in ``compiles``: the first was cold, see :data:`WARM_FRACTION`)."""

        path = self.path(key)
        if not RATIO_BOUNDS[0] <= ratio <= RATIO_BOUNDS[1]:
            print(
                f"note: this run's steps took {ratio:.2f}x its probe's time: other work shared the machine, so "
                f"{str(path)!r} does not record it",
                file=sys.stderr,
            )
            return
        rec, why = self._read(key)
        if rec is None:
            print(
                f"note: compile record {str(path)!r} is not usable ({why}); left as it is, this run's figures "
                f"not recorded",
                file=sys.stderr,
            )
            return
        old = rec.get(scope, {})
        entry = {
            "ratios": [round(r, 4) for r in old.get("ratios", [])] + [round(ratio, 4)],
            "compile_s": old.get("compile_s", 0.0),
            "compiles": old.get("compiles", 0),
            "date": time.strftime("%Y-%m-%d"),
        }
        entry["ratios"] = entry["ratios"][-KEEP_RATIOS:]
        if compile_s is not None and scope != "eager":
            entry.update(compile_s=round(max(0.0, compile_s), 2), compiles=entry["compiles"] + 1)
        out = {"version": RECORD_VERSION}
        for name, e in {**rec, scope: entry}.items():
            out[name] = {k: v for k, v in e.items() if k != "ratio"}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(out, indent=1) + "\n")
        except OSError as exc:  # a cache: the run goes on, and says so
            print(
                f"note: could not write the compile record {str(path)!r} ({exc}); later runs of this "
                f"shape decide on priors",
                file=sys.stderr,
            )


@dataclass
class Choice:
    """The decision: ``scope`` (eager, blocks or model), the predicted seconds (or steps, for a budget)
    of every candidate considered, and one line saying why."""

    scope: str
    predicted: dict
    reason: str


def prior_compile_s(scope: str, n_layers: int, n_kinds: int) -> float:
    """The cold compile seconds :data:`PRIORS` predict for ``scope``."""
    if scope == "model":
        return PRIORS["model"]["compile_s_per_layer"] * n_layers
    return PRIORS["blocks"]["compile_s_per_kind"] * n_kinds


def choose(
    probe_s: float,
    record: dict,
    n_layers: int,
    n_kinds: int,
    candidates: tuple[str, ...],
    steps: Optional[int] = None,
    budget_s: Optional[float] = None,
) -> Choice:
    """Pick among ``candidates`` (a subset of :data:`SCOPES`, eager first) from the probe's seconds,
    this shape's ``record`` (:meth:`CompileRecords.load`) and the priors. With ``steps`` (the steps
    left): the least predicted seconds; with ``budget_s``: the most steps in it, up to ``steps`` (the
    cap), then the least seconds. Ties go to the earlier
    candidate (eager before compiling), except that eager's win by less than :data:`EXPLORE` over a
    compile scope known only from priors goes to that scope (measured once, then known)."""
    figures, sources = {}, {}
    for scope in candidates:
        known = record.get(scope, {})
        eager_ratio = record.get("eager", {}).get("ratio", PRIORS["eager"]["ratio"])  # eager's step / probe
        ratio = known.get("ratio", eager_ratio * PRIORS[scope]["ratio"])  # priors: relative to eager's step
        sources[scope] = "measured here" if scope in record else "prior"
        if scope == "eager":
            comp = 0.0
        elif known.get("compiles", 0) >= 2:
            comp = known["compile_s"]
        elif known.get("compiles") == 1:  # one cold compile measured: the next finds the inductor cache warm
            comp = known["compile_s"] * WARM_FRACTION[scope]
            sources[scope] += ", warm compile predicted"
        else:
            comp = prior_compile_s(scope, n_layers, n_kinds)
            sources[scope] = "prior" if scope not in record else sources[scope] + ", compile prior"
        figures[scope] = (probe_s * ratio, comp)
    if budget_s is not None:  # the most steps in the budget (at most ``steps``, the cap), then the least time
        predicted = {s: min(steps, max(0.0, budget_s - c) / t) for s, (t, c) in figures.items()}
        seconds = {s: predicted[s] * t + c for s, (t, c) in figures.items()}
        best = max(candidates, key=lambda s: (predicted[s], -seconds[s], -candidates.index(s)))
        close = [
            s
            for s in candidates
            if predicted[s] >= (1 - EXPLORE) * predicted[best] and seconds[s] <= (1 + EXPLORE) * seconds[best]
        ]
        unit = "steps in the budget"
    else:
        predicted = {s: steps * t + c for s, (t, c) in figures.items()}
        best = min(candidates, key=lambda s: (predicted[s], candidates.index(s)))
        close = [s for s in candidates if predicted[s] <= (1 + EXPLORE) * predicted[best]]
        unit = "s predicted"
    untried = [s for s in close if s != "eager" and s not in record]
    note = ""
    if best == "eager" and untried:  # a near tie on priors: measure the compile once (the record learns)
        best = untried[0]
        note = (
            f"; {best} is within {EXPLORE:.0%} of eager on priors alone, so this run measures it for the "
            f"next runs of this shape"
        )
    parts = [
        f"{s} {predicted[s]:,.0f} ({figures[s][0] * 1e3:.0f} ms/step"
        + (f" + {figures[s][1]:.0f} s compile" if s != "eager" else "")
        + f", {sources[s]})"
        for s in candidates
    ]
    what = f"{steps:,} steps left" if budget_s is None else f"a budget of {budget_s:g} s (cap {steps:,} steps)"
    return Choice(best, predicted, f"{what}, {unit}: " + "; ".join(parts) + note)


def probe_step_seconds(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, autocast, grad_accum: int, device: torch.device
) -> float:
    """Seconds of one eager training step's forward + backward for ``model`` on the micro-batch
    ``(x, y)`` (B, T) int64, times ``grad_accum``: the median of :data:`PROBE_PASSES` passes after a first
    that warms the allocator and the kernels' primitives. The run is left as it was: random state forked (dropout),
    gradients set back to None (they are None between steps)."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        times = []
        for _ in range(1 + PROBE_PASSES):
            sync()
            t = time.perf_counter()
            with autocast():
                loss, _ = model(x, targets=y, reduction="sum")
            loss.backward()
            sync()
            times.append(time.perf_counter() - t)
    for p in model.parameters():
        p.grad = None
    return statistics.median(times[1:]) * grad_accum


class StepClock:
    """The seconds of a process's first :data:`CLOCK_LATE` steps (train steps only: evaluations and
    checkpoints not counted). ``compile_s`` = the first step minus the median of the next
    :data:`CLOCK_EARLY`; ``steady_s`` = the median of steps :data:`CLOCK_LATE_FROM` to :data:`CLOCK_LATE`
    when the run got that far (a compiled step keeps getting faster for its first ~150 steps:
    docs/bench/measured-choices.md), else of the steps after the first."""

    def __init__(self):
        self.times: list[float] = []

    def add(self, seconds: float) -> bool:
        """Add a step; True when the figures are ready to record (after the early steps, and when the
        clock is full)."""
        if len(self.times) >= CLOCK_LATE:
            return False
        self.times.append(seconds)
        return len(self.times) in (CLOCK_EARLY + 1, CLOCK_LATE)

    @property
    def full(self) -> bool:
        return len(self.times) >= CLOCK_LATE

    def figures(self) -> Optional[tuple[float, float]]:
        """(steady_s, compile_s), or None before 3 steps after the first."""
        if len(self.times) < 4:
            return None
        early = statistics.median(self.times[1 : CLOCK_EARLY + 1])
        late = self.times[CLOCK_LATE_FROM:CLOCK_LATE]
        steady = statistics.median(late) if len(late) >= 20 else statistics.median(self.times[1:])
        return steady, self.times[0] - early


# --- a run's decision and its clock (lmlab.train.Trainer.fit) -------------------------------------
class RunClock:
    """A :class:`StepClock` of one process of a run and where its figures go: this machine's
    ``records`` under ``key``, relative to the ``probe`` seconds, for the scope the run computes with.
    Only the main rank writes."""

    def __init__(self, records: CompileRecords, key: str, probe: float):
        self.clock, self.records, self.key, self.probe = StepClock(), records, key, probe
        self.recorded = False  # the compile seconds of this process are recorded once

    def step(self, seconds: float, trainer) -> bool:
        """Add a step's seconds; record when the figures are ready. True when the clock is done."""
        if self.clock.add(seconds):
            self._record(trainer)
        return self.clock.full

    def finish(self, trainer) -> None:
        """The run ends before the clock fills: record what it measured."""
        self._record(trainer)

    def _record(self, trainer) -> None:
        figures = self.clock.figures()
        if figures and trainer.dist.is_main:
            steady, compile_s = figures
            self.records.update(
                self.key, trainer.compile_choice, steady / self.probe, None if self.recorded else compile_s
            )
        self.recorded = self.recorded or figures is not None


def probe_run(trainer) -> float:
    """:func:`probe_step_seconds` on ``trainer``'s model and the first micro-batch of its next step
    (compiled blocks run their eager code)."""
    x, y = trainer._global_batch()[0]
    trainer.model.train()
    with eager():
        return probe_step_seconds(trainer.model, x, y, trainer._autocast, trainer.tc.grad_accum, trainer.device)


def choose_for_run(trainer) -> tuple[Optional[str], Optional[RunClock]]:
    """Before a process's first step of ``trainer`` (a :class:`lmlab.train.Trainer`): with compile=auto,
    decide (:func:`choose`) and compile (``trainer._apply_compile``), or take the decision kept in
    run.yaml (``compile``) when resuming, so that the run computes as before; the decision is written to
    run.yaml. A process that compiles or may compile (compile=true or auto, one rank) gets a
    :class:`RunClock` for this machine's record. Returns (the line to print or None, the clock or
    None). Under torchrun, or with no C++ compiler for inductor, auto stays eager and says why."""

    tc, cfg, dist = trainer.tc, trainer.cfg, trainer.dist
    records = CompileRecords(trainer.device)
    key = shape_key(cfg, tc, trainer.amp_dtype, trainer.device, torch.get_num_threads(), dist.world_size)
    decide, message = trainer.compile_choice is None, None
    run_file = trainer.run_dir / RUN_FILE
    kept = read_run(trainer.run_dir).get("compile") if decide and run_file.is_file() else None
    if isinstance(kept, dict) and kept.get("choice") in SCOPES:
        trainer._apply_compile(kept["choice"])
        message = (
            f"compile auto: {kept['choice']}, as decided at step {kept.get('decided_at_step')} (kept on "
            f"resume: the run computes as it did)"
        )
        decide = False
    if trainer.tc.compile != "auto" and run_file.is_file() and "compile" in read_run(trainer.run_dir):
        if dist.is_main:  # resumed with compile set: an earlier auto decision no longer describes the run
            run = read_run(trainer.run_dir)
            del run["compile"]
            write_run(trainer.run_dir, run)
        barrier(dist)
    cannot = no_compiler_reason(trainer.device) if decide else None
    if dist.enabled and not cannot:  # a probe's backward would run DDP's / FSDP's gradient hooks
        cannot = "not measured under torchrun (a probe would run the ranks' gradient hooks); set compile=true"
    probe = None if cannot or dist.enabled or trainer.compile_choice == "eager" else probe_run(trainer)
    clock = RunClock(records, key, probe) if probe is not None else None
    if not decide:
        return message, clock
    if cannot:
        scope, why = "eager", cannot
    else:
        candidates = (
            ("eager",)
            + (("blocks",) if tc.compile_scope in ("auto", "blocks") else ())
            + (("model",) if tc.compile_scope in ("auto", "model") else ())
        )
        warn = (lambda line: print(line, file=sys.stderr)) if dist.is_main else (lambda line: None)
        budget = tc.budget_seconds if tc.budget_seconds is not None and not trainer.budget_planned else None
        kinds = len(set(cfg.layer_pattern)) if cfg.layer_pattern else 1
        choice = choose(
            probe,
            records.load(key, warn),
            cfg.n_layers,
            kinds,
            candidates,
            steps=tc.max_steps - trainer.step,
            budget_s=budget,
        )
        scope, why = choice.scope, choice.reason
    trainer._apply_compile(scope)
    if dist.is_main:
        run = read_run(trainer.run_dir)
        run["compile"] = {"choice": scope, "decided_at_step": trainer.step, "reason": why}
        write_run(trainer.run_dir, run)
    barrier(dist)
    return f"compile auto: {scope} ({why})", clock


def warm_for_fork(argv: list, env: dict, warmed: set) -> Optional[str]:
    """In lmlab's fork server (:mod:`lmlab.lab.fork_server`), before it forks ``lmlab train ARGV``: when
    that run compiles (its config's ``compile: true``) with one thread, train one step of a throwaway
    model of its shape here, so that Dynamo's and Inductor's compiled code is in this process and every
    run forked after it finds it (a new model of the same shape passes the same guards: its parameters
    are graph inputs) instead of compiling again (about 4 s a run for a spec's model, measured:
    docs/bench/lab_throughput.md). ``warmed``: the shapes this server has warmed (model config, batch,
    accumulation, precision, compile scope), to which the run's is added. Returns the shape's key when it
    warmed now (None: nothing to do: warmed before, or the run does not compile, uses more than one
    thread, or is not a ``--config ... --data ...`` run). The
    throwaway trainer writes nothing (its folder is a temporary one) and leaves no state a run reads:
    each run seeds itself. One thread only: a process that has run OpenMP with several threads is not
    safe to fork in general (its thread pool is not the child's), and Dynamo guards the thread count
    (Inductor's kernels are generated for it). Errors propagate (the caller reports them and forks anyway:
    the run then compiles for itself)."""
    if env.get("OMP_NUM_THREADS") != "1" or "--config" not in argv or "--data" not in argv:
        return None
    import tempfile

    import torch._inductor.config as inductor_config

    from lmlab.data.shards import TokenData
    from lmlab.runs import build_configs
    from lmlab.threads import using_threads
    from lmlab.train import Trainer

    data = TokenData(argv[argv.index("--data") + 1])
    cfg, tc = build_configs(argv[argv.index("--config") + 1], data_vocab=data.vocab_size)
    key = json.dumps([cfg.to_dict(), tc.batch_size, tc.grad_accum, tc.dtype, tc.compile_scope], sort_keys=True)
    if tc.compile is not True or tc.device not in ("cpu", "auto") or torch.cuda.is_available() or key in warmed:
        return None
    warmed.add(key)  # once, whatever happens below
    compile_threads = inductor_config.compile_threads
    inductor_config.compile_threads = 1  # compiled in this process: no worker pool for the runs to inherit
    try:
        with using_threads(1), tempfile.TemporaryDirectory(prefix="lmlab-warm-") as tmp:
            trainer = Trainer(Path(tmp), cfg, tc, data, progress=False)
            trainer.train_step()
            del trainer
    finally:
        inductor_config.compile_threads = compile_threads
    return key
