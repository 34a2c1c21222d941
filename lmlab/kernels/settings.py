"""Which CPU kernels a model uses: one explicit record, decided once per process (:func:`default_kernels`),
passed at model build (``TransformerLM(cfg, kernels=...)``), changed only through
``TransformerLM.set_kernels`` and printed at ``lmlab train``'s startup. No module of :mod:`lmlab.kernels`
reads a global switch.

The defaults are measured, never inferred from the CPU's vendor: :func:`default_kernels` reads this
machine's calibration (``lmlab bench calibrate``, :mod:`lmlab.kernels.calibrate`: whole training steps
timed both ways on this CPU model and torch version, decode steps in each weight layout and at one thread
and every core); where there is none, torch's own kernels (MKL linears, SDPA attention), transposed decode
weights and the fixed thread rule of :func:`lmlab.kernels.decode_layout.decode_threads`, and the startup
line says the machine is uncalibrated.
"""

from __future__ import annotations

import math
import platform
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from lmlab.config_checks import ConfigError
from lmlab.data.corpus import cache_root
from lmlab.json_checks import json_type, parse_json, read_text

CALIBRATION_VERSION = 1  # of the calibration file's format

# The cells of the decode layout decision (:mod:`lmlab.kernels.decode_layout`): the linear weights' dtype
# and whether a step multiplies one row (one sequence) or several.
DECODE_CELLS = ("fp32 batch 1", "fp32 batch 2+", "bf16 batch 1", "bf16 batch 2+")
MAX_WEIGHTS = 10**15  # the largest weight count a calibration entry may name (beyond: not a model, a damaged file)
# The cells of the compiled step's product decision (``KernelSettings.decode_reductions``): one row a step.
REDUCTION_CELLS = ("fp32 batch 1", "bf16 batch 1")
# The cells of the one-prompt decode threads decision (``KernelSettings.decode_threads``): eager steps or the
# compiled step, one row a step (measured with fp32 weights; bf16 decoding takes the same choice).
THREAD_CELLS = ("eager batch 1", "compiled batch 1")
# the calibration cells (their "decision" prefix) that time one prompt's threads together with the fp32 batch-1
# layouts (lmlab.kernels.calibrate.decide_one_row); a record without them measured the threads apart
ONE_ROW = "one row"
# each decode decision's list in a calibration record, and the key of its per-entry choice
DECODE_DECISIONS = {
    "decode_layout": "packed",
    "decode_reductions": "on",
    "decode_threads": "threads",
    "decode_frozen": "on",
}


def decode_cell(dtype, batch: int) -> Optional[str]:
    """The :data:`DECODE_CELLS` entry for weights of torch dtype ``dtype`` decoding ``batch`` rows a
    step; None for another dtype (those always take the transposed layout)."""
    import torch

    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype)
    return None if name is None else f"{name} batch {'1' if batch <= 1 else '2+'}"


@dataclass(frozen=True)
class KernelSettings:
    """``onednn_fp32``: fp32 CPU linears (and the chunked loss's head products) on oneDNN rather than
    MKL (:mod:`lmlab.kernels.linear`; used only where this torch build has oneDNN's op on x86-64);
    ``blocked_attention_fp32``: fp32 training attention on one thread through the blocked loops rather
    than SDPA (:mod:`lmlab.kernels.causal_attention`; bf16 always takes them); ``fused_loops``: inside a
    compiled model the blocked loops are traced into its graph (False: eager loops behind a graph break
    per layer, for comparisons); ``decode_layout``: the measured weight layouts of eager CPU decoding
    (:mod:`lmlab.kernels.decode_layout`), ``(cell, weights, packed)`` triples: in the
    :data:`DECODE_CELLS` entry ``cell``, a model with ``weights`` linear weights decoded faster with them
    oneDNN-packed (``packed`` True) or transposed; see :meth:`decode_packs` (empty: transposed
    everywhere); ``decode_reductions``: the same for the compiled one-row decode step
    (:mod:`lmlab.kernels.compiled_decode`), ``(cell, weights, on)`` triples in the
    :data:`REDUCTION_CELLS`: ``on`` where its products and attention written as reductions (which
    Inductor fuses with the layer's other work) decoded faster than over transposed weights through
    MKL; see :meth:`decode_reduces` (empty: transposed everywhere); ``decode_threads``: ``(cell, weights,
    threads)`` triples in the :data:`THREAD_CELLS`: the thread count that decoded one sequence faster (every
    physical core of the calibrating machine, or 1); see :meth:`decode_thread_count` (empty: not measured,
    the fixed rule of :func:`lmlab.kernels.decode_layout.decode_threads`); ``decode_frozen``: ``(cell, weights,
    on)`` triples in the :data:`REDUCTION_CELLS`: ``on`` where the compiled one-row step compiled with
    Inductor's freezing (the weights constants of its graph, packed by Inductor) decoded faster than the
    compiled step otherwise chosen; see :meth:`decode_freezes` (empty: never frozen). Raises ValueError for an unknown
    cell, a weight count below 1 or above :data:`MAX_WEIGHTS`, a thread count below 1, or two entries for
    one cell and weight count."""

    onednn_fp32: bool
    blocked_attention_fp32: bool
    fused_loops: bool = True
    decode_layout: tuple = ()
    decode_reductions: tuple = ()
    decode_threads: tuple = ()
    decode_frozen: tuple = ()
    source: str = field(default="explicit", compare=False)  # where the choice came from (not compared)

    def __post_init__(self):
        for name, cells in (
            ("decode_layout", DECODE_CELLS),
            ("decode_reductions", REDUCTION_CELLS),
            ("decode_threads", THREAD_CELLS),
            ("decode_frozen", REDUCTION_CELLS),
        ):
            value = int if name == "decode_threads" else bool  # a thread count, else a choice
            entries = tuple(sorted((str(c), int(w), value(p)) for c, w, p in getattr(self, name)))
            bad = [
                (c, w) for c, w, p in entries if c not in cells or not 1 <= w <= MAX_WEIGHTS or (value is int and p < 1)
            ]
            if bad:
                raise ValueError(
                    f"{name}: {bad} are not (cell, 1 <= weights <= {MAX_WEIGHTS:.0e}"
                    + (", threads >= 1" if value is int else "")
                    + f"); cells: {', '.join(cells)}"
                )
            twice = sorted({(c, w) for c, w, _ in entries if sum(e[:2] == (c, w) for e in entries) > 1})
            if twice:
                raise ValueError(f"{name}: {twice} measured twice (one entry per cell and weight count)")
            object.__setattr__(self, name, entries)

    @staticmethod
    def _nearest(entries: tuple, cell: Optional[str], weights: int) -> bool:
        """The choice of ``entries`` measured in ``cell`` at the size nearest ``weights`` on a log scale
        (the smaller on a tie: False, or fewer threads; False where the cell was not measured)."""
        measured = [(round(abs(math.log(max(weights, 1) / w)), 9), p) for c, w, p in entries if c == cell]
        return min(measured)[1] if measured else False

    def decode_packs(self, cell: Optional[str], weights: int) -> bool:
        """Whether eager decoding in ``cell`` (:func:`decode_cell`) of a model with ``weights`` linear
        weights multiplies by oneDNN-packed weights: the choice measured at the size nearest ``weights``
        on a log scale (transposed on a tie, and where the cell was not measured)."""
        return self._nearest(self.decode_layout, cell, weights)

    def decode_reduces(self, cell: Optional[str], weights: int) -> bool:
        """Whether the compiled decode step in ``cell`` (:func:`decode_cell`, batch 1) of a model with
        ``weights`` linear weights multiplies and attends by fused reductions over its weights as they are
        (out, in): the nearest measured size decides, as in :meth:`decode_packs` (transposed weights and
        MKL on a tie, and where the cell was not measured)."""
        return self._nearest(self.decode_reductions, cell, weights)

    def decode_freezes(self, cell: Optional[str], weights: int) -> bool:
        """Whether the compiled decode step in ``cell`` (:func:`decode_cell`, batch 1) of a model with
        ``weights`` linear weights is compiled with Inductor's freezing (decode_layout's 'frozen'): the
        nearest measured size decides, as in :meth:`decode_packs` (not frozen on a tie, and where the cell
        was not measured)."""
        return self._nearest(self.decode_frozen, cell, weights)

    def decode_thread_count(self, cell: str, weights: int) -> Optional[int]:
        """The threads that decoded one sequence faster in ``cell`` (:data:`THREAD_CELLS`) at the measured
        size nearest ``weights`` linear weights on a log scale (the fewer threads on a tie); None where the
        cell was not measured."""
        if not any(c == cell for c, _, _ in self.decode_threads):
            return None
        return self._nearest(self.decode_threads, cell, weights)

    def describe(self, amp_dtype=None) -> str:
        """One line for the startup message, e.g. 'fp32 linears on oneDNN, fp32 attention SDPA (calibrated
        ...)'. With ``amp_dtype`` (torch.bfloat16 or torch.float16: the run computes under autocast) the
        line names what that run's products and attention use (torch's autocast matmul; the blocked loops,
        :func:`lmlab.kernels.causal_attention.use_blocked`) before the calibrated fp32 choices, which then
        apply only to fp32 runs."""
        from lmlab.kernels.causal_attention import MAX_CONTEXT, MAX_SAVED_BYTES
        from lmlab.kernels.linear import onednn_available

        unfused = [] if self.fused_loops else ["unfused attention loops"]
        linears = "linears on " + ("oneDNN" if self.onednn_fp32 and onednn_available() else "MKL")
        attention = "attention " + ("blocked on one thread" if self.blocked_attention_fp32 else "SDPA")
        if amp_dtype is None:
            return ", ".join([f"fp32 {linears}", f"fp32 {attention}"] + unfused) + f" ({self.source})"
        name = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(amp_dtype), str(amp_dtype))
        parts = [
            f"{name} linears by torch's autocast matmul",
            f"{name} training attention by the blocked loops (SDPA past {MAX_CONTEXT:,} tokens or "
            f"{MAX_SAVED_BYTES >> 20} MiB of saved probabilities)",
        ]
        return ", ".join(parts + unfused) + f" (an fp32 run here: {linears}, {attention}; {self.source})"

    def describe_decode(self, with_source: bool = True) -> str:
        """The decode layout choice in words, e.g. 'decode weights oneDNN-packed for fp32 batch 2+ at 20.4M
        weights, transposed otherwise (the nearest measured size decides; calibrated ...)'."""
        packed = [f"{c} at {w / 1e6:.1f}M" for c in DECODE_CELLS for cc, w, p in self.decode_layout if cc == c and p]
        reduced = [
            f"{c} at {w / 1e6:.1f}M" for c in REDUCTION_CELLS for cc, w, p in self.decode_reductions if cc == c and p
        ]
        frozen = [f"{c} at {w / 1e6:.1f}M" for c in REDUCTION_CELLS for cc, w, p in self.decode_frozen if cc == c and p]
        compiled = f"; the compiled step by fused reductions for {', '.join(reduced)} weights" if reduced else ""
        compiled += f"; the compiled step frozen for {', '.join(frozen)} weights" if frozen else ""
        if self.decode_threads:
            more = [
                f"{t} threads for {c} at {w / 1e6:.1f}M"
                for c in THREAD_CELLS
                for cc, w, t in self.decode_threads
                if cc == c and t > 1
            ]
            compiled += "; one prompt decoded on " + (
                f"{', '.join(more)} weights, one thread otherwise" if more else "one thread"
            )
        if packed:
            compiled = f" for {', '.join(packed)} weights, transposed otherwise{compiled}"
            notes = ["the nearest measured size decides"] + ([self.source] if with_source else [])
        else:
            notes = [self.source] if with_source else []
        what = "oneDNN-packed" if packed else "transposed"
        return f"decode weights {what}{compiled}" + (f" ({'; '.join(notes)})" if notes else "")


def cpu_identity(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """What a calibration is valid for: the CPU's model name, family and model numbers (the first
    processor of ``cpuinfo``; '?' where it does not say, e.g. off Linux: then ``platform.processor()``),
    the machine architecture and torch's version."""
    import torch

    info: dict = {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "cpu family", "model") and key.strip() not in info:
                    info[key.strip()] = value.strip()
                if not line.strip() and info:
                    break
    except OSError:
        pass
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine() or "?",
        "family": info.get("cpu family", "?"),
        "model": info.get("model", "?"),
        "machine": platform.machine(),
        "torch": str(torch.__version__),
    }  # a plain str: compared exactly


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The first processor's instruction-set flags in ``cpuinfo`` (x86 ``flags``, Arm ``Features``);
    empty where the file does not exist or says nothing (off Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def native_bf16(flags: Optional[set] = None) -> bool:
    """Whether the CPU multiplies bf16 in hardware: x86 AVX512-BF16 or AMX-BF16 (``avx512_bf16``,
    ``amx_bf16``), Arm's BF16 extension (``bf16``). oneDNN's own check
    (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) also says yes for plain AVX-512 (Skylake), where it
    emulates bf16 through fp32: that is not native."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def cache_dir() -> Path:
    """``$LMLAB_CACHE/kernels`` (default ``~/.cache/lmlab/kernels``)."""

    return cache_root() / "kernels"


def cache_path(identity: Optional[dict] = None) -> Path:
    """This machine's calibration file: named by the CPU's family, model and name and torch's version."""
    ident = identity or cpu_identity()
    name = f"{ident['cpu']}-f{ident['family']}-m{ident['model']}-torch{ident['torch']}"
    return cache_dir() / (re.sub(r"[^A-Za-z0-9.+-]+", "_", name).strip("_")[:150] + ".json")


def load_calibration(path=None) -> Optional[dict]:
    """This machine's calibration record (:mod:`lmlab.kernels.calibrate`), or None when there is none.
    A file that cannot be read as one, or that was measured on another CPU model or torch version, is
    not used: a one-line warning on stderr names it and what is wrong (``lmlab bench calibrate`` measures
    again: it replaces a calibration, and sets a damaged file at this default path aside, kept)."""
    ident = cpu_identity()
    path = path or cache_path(ident)
    try:
        if path.exists() and not path.is_file():  # a folder, or /dev/zero: never read without end
            raise OSError(f"{path}: not a regular file")
        text = read_text(path)
    except FileNotFoundError:
        return None
    except (OSError, ConfigError) as exc:  # (ConfigError: not UTF-8)
        why = str(exc).removeprefix(f"{path}: ")
        print(
            f"lmlab: warning: cannot read the kernel calibration {path}: {why}; using torch's defaults", file=sys.stderr
        )
        return None
    try:  # nesting bounded before parsing (json_checks): no RecursionError
        record = parse_json(text, str(path), finite=False)
        why = _calibration_problem(record)
    except ConfigError as exc:  # json_checks' message, without the path the warning names
        msg = str(exc).removeprefix(f"{path}: ")[:100]
        why = msg if msg.startswith("not ") else f"not JSON ({msg})"
    if why:
        print(
            f"lmlab: warning: {path} is not a kernel calibration of version {CALIBRATION_VERSION} ({why}); "
            f"using torch's defaults (`lmlab bench calibrate` sets it aside and measures this machine)",
            file=sys.stderr,
        )
        return None
    if {k: str(v) for k, v in record["identity"].items()} != ident or set(record["identity"]) != set(ident):
        print(
            f"lmlab: warning: {path} was measured on {record.get('identity')}, not this machine ({ident}); "
            f"using torch's defaults (`lmlab bench calibrate` measures this one)",
            file=sys.stderr,
        )
        return None
    return record


@lru_cache(maxsize=None)
def default_kernels() -> KernelSettings:
    """This process's defaults, decided once: this machine's calibration (:func:`load_calibration`),
    else torch's own kernels (MKL linears, SDPA attention) and transposed decode weights. After
    ``lmlab bench calibrate`` in the same process, ``default_kernels.cache_clear()`` reads the new file."""
    record = load_calibration()
    if record is None:
        return KernelSettings(
            onednn_fp32=False,
            blocked_attention_fp32=False,
            source="uncalibrated: torch's defaults; `lmlab bench calibrate` measures this CPU",
        )
    return calibrated_kernels(record)


def _calibration_problem(record) -> Optional[str]:
    """What makes the parsed JSON ``record`` not a calibration of :data:`CALIBRATION_VERSION` (a phrase
    naming the field), or None."""
    if not isinstance(record, dict):
        return f"a JSON {json_type(record)}, not an object"
    if type(record.get("version")) is not int or record["version"] != CALIBRATION_VERSION:
        return f"version {record.get('version')!r}"
    for key, kind in (("date", str), ("identity", dict), ("choices", dict)):
        if not isinstance(record.get(key), kind):
            return f"{key} is not a {kind.__name__}"
    choices = record["choices"]
    for key in ("onednn_fp32", "blocked_attention_fp32"):
        if not isinstance(choices.get(key), bool):
            return f"choices.{key} {choices.get(key)!r} is not true or false"
    for key in DECODE_DECISIONS:
        if key in choices and _decode_entries(choices[key], key) is None:
            return f"choices.{key} is not a list of {{cell, weights, {DECODE_DECISIONS[key]}}} entries"
    return None


def _decode_entries(items, name: str = "decode_layout") -> Optional[tuple]:
    """A calibration's list of the decode decision ``name`` (:data:`DECODE_DECISIONS`: ``decode_layout``
    [{"cell", "weights", "packed"}, ...], ``decode_reductions`` and ``decode_frozen`` [{..., "on"}],
    ``decode_threads`` [{..., "threads"}]) as :class:`KernelSettings` triples; None when it is not one."""
    choice = DECODE_DECISIONS[name]
    value = int if name == "decode_threads" else bool  # exactly: a bool is no thread count
    if not isinstance(items, list) or not all(
        isinstance(e, dict) and set(e) == {"cell", "weights", choice} for e in items
    ):
        return None
    if not all(type(e["weights"]) is int and type(e[choice]) is value for e in items):
        return None
    entries = tuple((e["cell"], e["weights"], e[choice]) for e in items)
    try:
        KernelSettings(False, False, **{name: entries})  # the cells and counts valid
    except ValueError:
        return None
    return entries


def threads_measured_apart(record: dict) -> bool:
    """True for a valid calibration ``record`` whose ``decode_threads`` were timed over transposed weights
    alone (before 2026-12-07), not together with the layouts (its cells have no 'one row' decision): a
    second thread's gain depends on the layout (on a Zen 5 EPYC none over transposed weights, a quarter of
    the step over packed ones), so those counts are not used and ``--if-missing`` measures again."""
    cells = record.get("cells")
    joint = isinstance(cells, list) and any(
        isinstance(c, dict) and str(c.get("decision", "")).startswith(ONE_ROW) for c in cells
    )
    return "decode_threads" in record["choices"] and not joint


def calibrated_kernels(record: dict) -> KernelSettings:
    """The settings a valid calibration record (:func:`load_calibration`) chose (its ``decode_threads``
    left out where :func:`threads_measured_apart`)."""
    c = record["choices"]
    decode = "" if "decode_layout" in c else "; decode not calibrated (`lmlab bench calibrate` measures it)"
    apart = threads_measured_apart(record)
    if "decode_layout" in c and "decode_reductions" not in c:
        decode = "; compiled decode step not calibrated (an older calibration)"
    elif "decode_layout" in c and "decode_threads" not in c:
        decode = "; decode threads not calibrated (an older calibration)"
    elif apart:
        decode = "; decode threads measured apart from the layout, not used (an older calibration)"
    elif "decode_layout" in c and "decode_frozen" not in c:
        decode = "; the compiled step's freezing not calibrated (an older calibration)"
    return KernelSettings(
        onednn_fp32=c["onednn_fp32"],
        blocked_attention_fp32=c["blocked_attention_fp32"],
        decode_layout=_decode_entries(c.get("decode_layout", [])),
        decode_reductions=_decode_entries(c.get("decode_reductions", []), "decode_reductions"),
        decode_threads=() if apart else _decode_entries(c.get("decode_threads", []), "decode_threads"),
        decode_frozen=_decode_entries(c.get("decode_frozen", []), "decode_frozen"),
        source=f"calibrated on this CPU {record['date'][:10]}{decode}",
    )
