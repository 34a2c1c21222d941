"""The decode layout of a CPU model's linear weights (:func:`decode_layout`): while a model generates,
each step multiplies a few rows (one per sequence) by every weight matrix, memory-bound, and a layout
chosen for that (weights oneDNN-packed for a batch, or stored transposed for one row) takes less time per
token than training's. :mod:`lmlab.generate` holds its models in this layout while it decodes; the model's
function is unchanged (tests/test_generate.py compares the logits with the plain layout's).
Measurements: docs/benchmarks.md (``python bench/decode_vs_hf.py``).
"""

from __future__ import annotations

import contextlib
import types
import weakref
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from lmlab.kernels.settings import decode_cell
from lmlab.model import TransformerLM

# linear weights up to this size (bytes, all layers together) get a decode copy (packed or transposed),
# kept between generate calls; larger ones are re-laid out in place on every call
PACK_LIMIT_BYTES = 1 << 30

# The thread rule of a machine whose calibration did not measure it (``KernelSettings.decode_threads``):
# batch-1 decoding multiplies one row by every weight matrix (memory-bound), and on a busy machine a thread
# waiting for a core stalls every step. bench/decode_threads.py on a 2-vCPU AMD EPYC (model not recorded,
# 2026-12-01), eager steps: 2 threads / 1 thread = 1.02x, 1.04x, 0.99x, 1.04x of the time per token at 4M,
# 26M, 81M, 190M weights, so one thread per this many weights. Other CPUs differ (a Xeon gains from a
# second thread at every size: docs/bench/decode_threads.md), hence the calibration.
DECODE_WEIGHTS_PER_THREAD = 200_000_000


def decode_threads(model: TransformerLM, available: int, compiled: bool = False) -> int:
    """CPU threads for decoding one sequence at a time with ``model`` (eager steps, or the ``compiled``
    step) when the user set none, at most ``available`` (the compute default: physical cores, capped by
    OMP_NUM_THREADS): where this machine's calibration measured the cell (``model.kernels.decode_threads``,
    :meth:`KernelSettings.decode_thread_count`), the thread count that decoded the measured size nearest
    the model's faster (1, or the calibrating machine's physical cores: never more threads than were
    measured); where it did not, one thread per :data:`DECODE_WEIGHTS_PER_THREAD` linear-layer weights
    (each tensor once; rounded up), at least 1."""
    weights = linear_weight_count(model)
    cell = f"{'compiled' if compiled else 'eager'} batch 1"
    measured = model.kernels.decode_thread_count(cell, weights)
    if measured is not None:
        return max(1, min(available, measured))
    return max(1, min(available, -(-weights // DECODE_WEIGHTS_PER_THREAD)))


def packed_decode_available() -> bool:
    """True when this PyTorch build can pack linear weights for oneDNN (``torch.ops.mkldnn``)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


# Gradients backward has accumulated into a weight since a decode copy of it was made: weight -> [count,
# hook handle]. An optimizer step needs a gradient, and a step may change the weight without bumping its
# version counter (torch's fused optimizers do not), so an arriving gradient makes the copy stale. Keyed
# weakly: a dropped weight takes its entry (and its hook) with it.
_GRAD_EVENTS: "WeakIdKeyDictionary" = WeakIdKeyDictionary()  # by identity: a tensor's == is elementwise


def _watch_gradients(w: torch.Tensor) -> None:
    """Count the gradients backward accumulates into ``w`` (a post-accumulate-grad hook on ``w`` itself,
    registered once, removed by :func:`release_decode_copies`); nothing for a weight without autograd."""
    if w in _GRAD_EVENTS or not (w.requires_grad and w.is_leaf):
        return
    entry = [0, None]

    def arrived(_: torch.Tensor) -> None:
        entry[0] += 1

    entry[1] = w.register_post_accumulate_grad_hook(arrived)
    _GRAD_EVENTS[w] = entry


_NO_EVENTS = (0,)  # the gradient count of a weight without autograd (never watched)


def _weight_state(w: torch.Tensor, events: Optional[list] = None) -> tuple:
    """What identifies the values of weight ``w`` without reading them: its storage, layout, dtype,
    version counter and the gradients accumulated into it since it was watched (see :func:`decode_layout`).
    ``events``: its entry of ``_GRAD_EVENTS`` when the caller holds it (each decode step: no lookup)."""
    count = (events or _GRAD_EVENTS.get(w, _NO_EVENTS))[0]
    return (w.data_ptr(), tuple(w.shape), w.stride(), w.dtype, w._version, count)


class _DecodeCopy:
    """A module's decode copy of its weight: the copy, whether it is oneDNN-packed, the weight's state
    when it was made, and the weight's gradient-count entry (read each step without a lookup). A deep copy
    or pickle of the model carries no copy (an opaque oneDNN tensor cannot be copied, and the clone's
    weights are other tensors): its forward then uses its own weight."""

    __slots__ = ("copy", "packed", "state", "events")

    def __init__(self, copy: Optional[torch.Tensor], packed: bool, state: Optional[tuple], events=None):
        self.copy, self.packed, self.state, self.events = copy, packed, state, events

    def __reduce__(self):  # pickle and copy.deepcopy both rebuild it empty
        return _DecodeCopy, (None, self.packed, None)


def _decode_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` for a module holding a decode copy of its weight (``self._decode_copy``, a
    :class:`_DecodeCopy`); bound to the module as its ``forward`` while decoding. The copy is used only
    while the weight is unchanged, without autograd, for an input of the weight's dtype; otherwise the
    module's own weight is (so a step taken while a generator is suspended, or a deep copy of the
    model, never multiplies by stale or foreign values), and so it is while the weight holds a gradient
    (an optimizer step may follow at any time)."""
    d = self._decode_copy
    copy, packed, state = d.copy, d.packed, d.state
    if torch.compiler.is_compiling():  # the compiled decode step checks decode_copies_current before each step
        return F.linear(x, copy, self.bias)
    if (
        copy is None
        or torch.is_grad_enabled()
        or x.dtype != self.weight.dtype
        or self.weight.grad is not None
        or _weight_state(self.weight, d.events) != state
    ):
        return F.linear(x, self.weight, self.bias)
    if packed:
        return torch.ops.mkldnn._linear_pointwise(x, copy, self.bias, "none", [], "")
    return F.linear(x, copy, self.bias)


class _RowReductions:
    """The mark of a linear module multiplying by fused reductions (``module._row_reductions``): pickling
    or deep-copying the module (e.g. a model copied while a generator holds it in the layout) gives the
    copy an unset mark, so the copy's leftover ``forward`` is plain ``F.linear``."""

    __slots__ = ("on",)

    def __init__(self, on: bool):
        self.on = on

    def __reduce__(self):
        return _RowReductions, (False,)


def _reduction_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` while the compiled one-row decode step multiplies by fused reductions (the
    'row-reductions' layout, bound as the module's ``forward``): inside ``torch.compile`` the product of x
    (rows, in) and the weight as it is, (out, in), written as a sum over ``in`` of their elementwise
    product, which Inductor generates as a loop of its own fused with the work around it (one row: no
    reuse of the weight a matrix kernel could exploit); eagerly (a step taken after a weight changed)
    ``F.linear``. Equal to ``F.linear`` up to summation order."""
    if torch.compiler.is_compiling() and self._row_reductions.on:
        y = (x.unsqueeze(-2) * self.weight).sum(-1)
        return y if self.bias is None else y + self.bias
    return F.linear(x, self.weight, self.bias)


# The decode copies of linear weights, kept between calls: module -> (what was prepared, the weight
# tensor it was made from (holding its storage, so an equal data_ptr means the same storage), the
# weight's state then (_weight_state), the copy). Keyed weakly, so a model that is dropped frees its
# copies; see decode_layout for when a copy is remade.
_DECODE_COPIES: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
_ACTIVE: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models inside decode_layout now
# the linear modules multiplying by a decode copy, per model inside decode_layout (decode_copies_current)
_PATCHED: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()


def decode_copy_modules(model: torch.nn.Module) -> frozenset:
    """The ids of the linear modules of ``model`` that multiply by a decode copy now (inside
    :func:`decode_layout`; empty outside it or when the weights were re-laid out in place)."""
    return frozenset(id(m) for m in _PATCHED.get(model, ()))


def decode_copies_current(model: torch.nn.Module) -> bool:
    """Whether every decode copy ``model`` multiplies by inside :func:`decode_layout` is current: made from
    the weight as it is now (same tensor, version, no gradient since, none held), as ``_decode_forward``
    checks per call. True outside decode_layout and for a model with no copies."""
    for module in _PATCHED.get(model, ()):
        d = module._decode_copy
        w = module.weight
        if d.copy is None or w.grad is not None or _weight_state(w, d.events) != d.state:
            return False
    return True


def _decode_copy(module: torch.nn.Linear, what: tuple) -> torch.Tensor:
    """``module``'s weight prepared as ``what`` (('packed', batch) or ('transposed',)), from the cache
    when it was made from the same tensor storage, at the same version, with no gradient accumulated since."""
    w = module.weight
    _watch_gradients(w)
    entry = _DECODE_COPIES.get(module)
    if entry is not None:
        made_as, _source, state, copy = entry
        if made_as == what and _weight_state(w) == state:
            return copy
    copy = _make_decode_copy(w, what)
    _DECODE_COPIES[module] = (what, w.detach(), _weight_state(w), copy)
    return copy


def _make_decode_copy(w: torch.Tensor, what: tuple) -> torch.Tensor:
    """A weight (out, in) oneDNN-packed for ``what[1]`` rows, or with its values stored as (in, out)."""
    with torch.inference_mode(False), torch.no_grad():
        if what[0] == "packed":
            return torch.ops.mkldnn._reorder_linear_weight(w.detach(), max(1, what[1]))
        return w.detach().t().contiguous().t()


def release_decode_copies(model: torch.nn.Module) -> int:
    """Free the decode copies of ``model``'s linear weights that :func:`decode_layout` keeps between
    calls; returns how many bytes they held. The next generation call makes them again. (A frozen compiled
    step's constants, :mod:`lmlab.kernels.compiled_decode`, stay with its graph, kept as long as the model.)"""
    freed = 0
    for module in model.modules():
        entry = _DECODE_COPIES.pop(module, None)
        if entry is not None:
            freed += entry[-1].numel() * entry[-1].element_size()
            watched = _GRAD_EVENTS.pop(module.weight, None)
            if watched is not None:
                watched[1].remove()
    return freed


def _transposes(w: torch.Tensor) -> bool:
    """Whether the 'transposed' layout holds ``w`` (out, in) as (in, out): a contiguous matrix with at
    least as many outputs as inputs (q|k|v, gate|up, the LM head; the FFN's down projection stays)."""
    return w.dim() == 2 and w.is_contiguous() and w.shape[0] >= w.shape[1] > 1


def _linear_weights(model: torch.nn.Module) -> list:
    """``model``'s linear weights, each tensor once (a tied LM head counts once)."""
    return list({id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}.values())


def linear_weight_count(model: torch.nn.Module) -> int:
    """The elements of ``model``'s linear weights, each tensor once: the size the decode layout's
    calibration compares models by."""
    return sum(w.numel() for w in _linear_weights(model))


def _linear_bytes(model: torch.nn.Module) -> int:
    return sum(w.numel() * w.element_size() for w in _linear_weights(model))


def decode_layout_kind(model: TransformerLM, batch: int = 1, compiled: bool = False) -> str:
    """Which weight layout :func:`decode_layout` uses for ``model`` decoding ``batch`` rows at a time:
    'onednn-packed', 'row-reductions', 'transposed' or 'unchanged' (not a CPU model). 'onednn-packed' where
    the model's kernels (``model.kernels``, measured by ``lmlab bench calibrate``) chose it for the weights'
    dtype and batch (:func:`lmlab.kernels.settings.decode_cell`) at the measured size nearest the model's
    (``KernelSettings.decode_packs``), the weights fit ``PACK_LIMIT_BYTES`` and this torch packs for
    oneDNN; never for ``compiled`` (the compiled decode step: Inductor cannot run over packed weights).
    'row-reductions' only for ``compiled`` at batch 1, where the kernels chose it the same way
    (``KernelSettings.decode_reduces``); before it, 'frozen' (``KernelSettings.decode_freezes``)."""
    weights = _linear_weights(model)
    if not weights or any(w.device.type != "cpu" for w in weights):
        return "unchanged"
    dtypes = {w.dtype for w in weights}
    cell = decode_cell(dtypes.pop(), batch) if len(dtypes) == 1 else None
    kernels = getattr(model, "kernels", None)
    if compiled and batch == 1 and kernels is not None:
        n = sum(w.numel() for w in weights)  # linear_weight_count's sum, over the weights gathered above
        if kernels.decode_freezes(cell, n):
            return "frozen"
        if kernels.decode_reduces(cell, n):
            return "row-reductions"
    pack = (
        not compiled
        and kernels is not None
        and kernels.decode_packs(cell, sum(w.numel() for w in weights))
        and sum(w.numel() * w.element_size() for w in weights) <= PACK_LIMIT_BYTES
        and packed_decode_available()
    )
    return "onednn-packed" if pack else "transposed"


@contextlib.contextmanager
def decode_layout(model: TransformerLM, batch: int = 1, compiled: bool = False) -> Iterator[None]:
    """Lay the linear weights out for decoding on CPU, where each step multiplies a few rows (``batch``,
    one per sequence) by every weight matrix, and let one-token steps take the model's lean path
    (``TransformerLM.lean_decode``: each block's ``decode_one``, when ``lean_decode_possible()``, i.e. no
    hooks and plain attention); both are undone on exit. Nested uses are left alone; non-CPU models keep
    their weights as they are (see :func:`decode_layout_kind`).

    - 'onednn-packed' (where this machine's calibration measured it faster for the weights' dtype and
      the batch, see :func:`decode_layout_kind`): each ``nn.Linear`` multiplies by a copy of its weight
      reordered into oneDNN's blocked format for ``batch`` rows (``torch.ops.mkldnn._reorder_linear_weight``,
      the packing Inductor's CPU "freezing" uses), through ``torch.ops.mkldnn._linear_pointwise``.
      Results equal ``F.linear`` up to summation order.
    - 'transposed' (otherwise, and on an uncalibrated machine): each weight with at least as many outputs
      as inputs (q|k|v, gate|up, the LM head) keeps its values and shape (out, in) but is stored as the
      (in, out) matrix, which MKL multiplies by one row faster than the (out, in) layout (whole demo-shape
      decode steps 9% faster for q|k|v, 20% for gate|up); the narrowing ones (the FFN's down projection)
      stay (out, in), 5-7% faster there. Up to ``PACK_LIMIT_BYTES`` of linear weights this is a copy the
      module multiplies by; above it the weights' own storage is re-laid out on entry and made contiguous
      again on exit (no second copy of a large model; what checkpoints and training expect).

    The copies (at most ``PACK_LIMIT_BYTES``: the linear weights' bytes once more) are kept between calls,
    so repeated generation pays the re-layout once; :func:`release_decode_copies` frees them. A copy is
    remade, and while decoding never used, once its weight changed: a different tensor, storage, shape,
    stride or dtype (``load_state_dict(assign=True)``, ``.to()``, ``p.data = ...``), an in-place write
    through the parameter (its version counter: ``load_state_dict``, ``p.copy_``), or a gradient that
    backward accumulated into it since the copy was made (a hook on the weight itself: torch's fused
    optimizers step without bumping version counters, but every step needs a gradient); a weight that holds
    a gradient is never multiplied through a copy (a step may come at any moment). Each call checks this, so
    a step taken while a generator is suspended takes effect at once. Writes that bypass both, a gradient
    assigned by hand (``p.grad = g``), stepped by a fused optimizer and cleared before the next call, or a
    write into ``p.data``'s storage in place (``p.data.mul_(2)``): call :func:`release_decode_copies` after
    them.

    - 'row-reductions' (the compiled decode step at batch 1, where this machine's calibration measured it
      faster): the weights stay as they are, and each ``nn.Linear``, inside the compiled graph only,
      multiplies as a sum of elementwise products (``_reduction_forward``), as the attention does
      (``model.decode_reductions``): Inductor fuses each layer into a few loops of its own instead of
      calling MKL's and Python's per product. Up to summation order the same as ``F.linear``.

    - 'frozen' (the compiled decode step at batch 1, where this machine's calibration measured it faster):
      the weights stay as they are and ``model.decode_frozen`` is set: the compiled step is compiled with
      Inductor's freezing (:mod:`lmlab.kernels.compiled_decode`), whose graph holds the weights as
      constants, bf16 linears packed for oneDNN by Inductor itself.

    ``compiled``: the layout for the compiled decode step (:mod:`lmlab.kernels.compiled_decode`):
    'frozen', 'row-reductions' or 'transposed' (Inductor multiplies by oneDNN-packed weights only as
    constants of a frozen graph, never as inputs).

    Side by side on the demo shape (2 CPU threads; ``python bench/decode_vs_hf.py``): see docs/benchmarks.md."""
    kind = decode_layout_kind(model, batch, compiled)
    if model in _ACTIVE:
        yield
        return
    _ACTIVE.add(model)
    model.lean_decode = model.lean_decode_possible()
    model.decode_reductions = model.decode_frozen = False  # a deep copy made inside the layout may carry True
    changed, patched, reducing = [], [], []
    try:
        if kind == "unchanged":
            yield
            return
        if kind == "frozen":  # the weights as they are: the frozen graph holds Inductor's packed constants
            model.decode_frozen = True
            yield
            return
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if kind == "row-reductions":
            for module in linears:
                module._row_reductions = _RowReductions(True)
                module.forward = types.MethodType(_reduction_forward, module)  # a deep copy's: F.linear
                reducing.append(module)
            model.decode_reductions = True
            yield
            return
        if kind == "onednn-packed" or _linear_bytes(model) <= PACK_LIMIT_BYTES:
            for module in linears:
                packed = kind == "onednn-packed"
                if (not packed and not _transposes(module.weight)) or module.weight.grad is not None:
                    continue
                copy = _decode_copy(module, ("packed", batch) if packed else ("transposed",))
                events = _GRAD_EVENTS.get(module.weight, _NO_EVENTS)  # watched by _decode_copy
                module._decode_copy = _DecodeCopy(copy, packed, _weight_state(module.weight, events), events)
                module.forward = types.MethodType(_decode_forward, module)  # deep copies rebind it
                patched.append(module)
            _PATCHED[model] = patched
        else:
            with torch.inference_mode(False), torch.no_grad():  # new storage must stay usable by autograd
                seen = set()
                for module in linears:
                    w = module.weight
                    if id(w) not in seen and _transposes(w):
                        seen.add(id(w))
                        w.data = w.data.t().contiguous().t()
                        changed.append(w)
        yield
    finally:
        with torch.inference_mode(False), torch.no_grad():
            for w in changed:
                w.data = w.data.contiguous()
        for module in patched:
            del module.forward, module._decode_copy  # back to nn.Linear.forward
        for module in reducing:
            del module.forward, module._row_reductions
        _PATCHED.pop(model, None)
        _ACTIVE.discard(model)
        model.lean_decode = model.decode_reductions = model.decode_frozen = False
