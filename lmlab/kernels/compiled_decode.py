"""A compiled one-token decode step over a fixed-length KV cache: the decode loops of :mod:`lmlab.generate`
with ``compile=True``.

An eager decode step of a small model is some 150 small PyTorch ops, each paying Python and dispatcher
time: for the demo shape that overhead, not the arithmetic, is most of a step. Here the step (embedding,
every block's ``decode_one``, final norm, LM head: :meth:`TransformerLM.decode_hidden`) is one
``torch.compile`` graph (Inductor, ``fullgraph``): elementwise work fused, no per-op Python. So that one
compiled graph serves every step and every call:

- the cache index being written is a tensor (``pos``): keys and values go in with ``index_copy_``, and
  each step attends over the whole preallocated buffer, masked to indices <= pos (and, for a left-padded
  batch, >= the row's padding), so shapes do not change from step to step;
- the buffer length (prompt + new tokens, dimension 2 of the cache) is marked dynamic, so calls of other
  lengths reuse the code: per model and each of its keys (padding kind, layout, thread count, tied
  weights; :func:`_compiled_fn`), one compile for batch 1 and one more for larger batches (dynamo makes
  the batch size dynamic at its second value); 4-15 s each on a CPU, kept for the model's lifetime
  (Inductor's on-disk cache shortens it in later processes);
- the linear weights are :func:`lmlab.kernels.decode_layout.decode_layout`'s copies ('transposed'); whether
  each is still current (same tensor, version and gradient count) is checked before every step, outside
  the graph; a step taken while any is stale runs eagerly, which uses the module's own weight (so training
  between the tokens of a suspended generator takes effect at once, as in eager decoding);
- or, at batch 1 where this machine's calibration measured it faster (decode_layout's 'row-reductions',
  ``KernelSettings.decode_reduces``), the weights as they are, every product and the attention written as
  sums of elementwise products: Inductor then generates each layer as a few loops of its own (no MKL
  call, no per-product Python), reading each weight once. The graph reads the module's weights at each
  call, so there is no copy to go stale; a weight tensor replaced during a call (which may untie a tied
  LM head) sends the call's remaining steps down the eager path;
- or, at batch 1 where the calibration measured it faster (decode_layout's 'frozen',
  ``KernelSettings.decode_freezes``), the weights as they are, compiled with Inductor's freezing: the graph
  holds them as constants (bf16 linears packed for oneDNN by Inductor itself, which it does only for
  constants). Such a graph is kept with the state of every parameter and buffer it read
  (:func:`frozen_state`): a call that finds other weights compiles a new one (seconds again), and a
  change during a call sends its remaining steps down the eager path. Measured: docs/bench/decode_freezing.md.

A call's first step runs the compiled function (Dynamo: its guards, compiling when they ask); its later
steps call the Inductor graph that step ran directly (:class:`_DirectStep`), the ids and position written
into the tensors it was given, skipping Dynamo's and AOT autograd's Python around the graph (1.10x / 1.15x
the demo's whole fp32 call on one / two threads, docs/bench/decode_overhead.md); what their guards would catch during
a call is checked per step instead (ids' shape and dtype, every input's storage).

Supported (:func:`compiled_decode_unsupported` says why not): models whose blocks all take the lean decode
path (``TransformerLM.lean_decode_obstacle``: pre-norm, plain attention) with full causal attention in
every layer (no sliding-window or chunked layer, no linear-attention layer), no mixture of experts and no
forward hooks on any module (a graph would call them once, when traced, not each step). In fp32 the
logits equal the eager step's up to summation order and greedy tokens are the same
(tests/test_compiled_decode.py); in bf16 Inductor keeps fused intermediates in fp32 where the eager ops
round each to bf16, so greedy tokens can part from the eager ones after a near tie. Timings in
docs/bench/decode_vs_hf.md.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Optional

import torch

from lmlab.kernels.decode_layout import _watch_gradients, _weight_state, decode_copies_current, decode_copy_modules
from lmlab.model import KVCache, TransformerLM


def compiled_decode_unsupported(model: TransformerLM) -> Optional[str]:
    """Why ``model`` cannot decode through the compiled step (a phrase for an error message), or None when
    it can."""
    cfg = model.cfg
    if model.moe_layers():
        return "its mixture-of-experts layers route each token by value (a graph of changing shapes)"
    if any(cfg.layer_window(i) is not None for i in range(cfg.n_layers)):
        return "it has sliding-window or chunked attention layers (a rolling cache)"
    why = model.lean_decode_obstacle()
    if why is not None:
        return f"its blocks cannot take the lean one-token path: {why}"
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):  # a graph would run them once
        return "it has forward hooks (a compiled graph would not call them each step)"
    return None


def check_compilable(model: TransformerLM, where: str = "compile") -> None:
    """ValueError ``"{where}: the compiled decode step cannot run this model: {why}; ..."`` when
    :func:`compiled_decode_unsupported` refuses ``model`` (``where``: the option and run, for the CLI)."""
    why = compiled_decode_unsupported(model)
    if why is not None:
        raise ValueError(f"{where}: the compiled decode step cannot run this model: {why}; decode without compiling")


class _StepCache:
    """What ``Attention.decode_one`` reads of a :class:`KVCache`, over the whole fixed-length buffers with
    the index being written a tensor: keys (batch, n_kv_heads, L, head_dim) per layer, ``pos`` () long, and
    ``left_pad`` (batch,) long or None."""

    def __init__(
        self, keys: list, values: list, pos: torch.Tensor, left_pad: Optional[torch.Tensor], reductions: bool = False
    ):
        self.k, self.v, self.index, self.reductions = keys, values, pos.view(1), reductions
        slots = torch.arange(keys[0].shape[2], device=pos.device)
        real = (slots <= pos)[None, :]  # written so far, the new token included
        if left_pad is not None:
            real = real & (slots[None, :] >= left_pad[:, None])
        self.mask = real[:, None, None, :]  # (batch or 1, 1, 1, L)
        self.left_pad = left_pad if left_pad is not None else real  # decode_one masks when this is not None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.k[layer].index_copy_(2, self.index, k)
        self.v[layer].index_copy_(2, self.index, v)
        return self.k[layer], self.v[layer], 0

    def real_keys(self, layer: int, first: int, n_keys: int) -> torch.Tensor:
        return self.mask


def _step(model: TransformerLM, idx, pos, keys, values, left_pad):
    """One token per row: ids (batch, 1) at cache index ``pos`` () -> fp32 logits (batch, vocab)."""
    cache = _StepCache(keys, values, pos, left_pad, model.decode_reductions)
    positions = pos.view(1) if left_pad is None else (pos - left_pad).clamp(min=0).view(-1, 1)
    return model.logits(model.decode_hidden(idx, positions, cache)[:, -1])


# model -> {(padded, layout signature): its compiled step}. Each gets a code object of its own, so that
# torch.compile's cache of graphs (and its limit of 8 per code object) is its own, not shared by every
# model a process builds.
_COMPILED: "weakref.WeakKeyDictionary[TransformerLM, dict]" = weakref.WeakKeyDictionary()


def _compiled_fn(model: TransformerLM, padded: bool, tying: tuple = ()):
    """The compiled ``_step`` for ``model`` with (``padded``) or without left padding, for the linear modules
    decode_layout multiplies by a copy now. Its guards are the tensors' (dtype, shape, stride, device of
    every input, parameter and table: a change recompiles; Inductor's own per-call size and stride asserts,
    which check the same again in Python, are not generated); dynamo's guards on module attributes are
    dropped (a tenth of a step at the demo shape), since what they would catch cannot change between its
    calls: the model's structure is fixed, hooks make the model unsupported (checked per call), and the
    things that do vary, left padding, which modules hold decode copies, whether the step runs by
    reductions (``model.decode_reductions``), torch's thread count (Inductor writes its loops for the
    threads there are when it compiles, and does not guard on them) and ``tying``, which of the weights are
    one tensor (a graph traced with the LM head tied to the embedding reads the embedding for both; the
    guard that would see the tie undone is among those dropped), select the function."""
    key = (
        padded,
        decode_copy_modules(model),
        model.decode_reductions,
        model.decode_frozen,
        torch.get_num_threads(),
        tying,
    )
    fns = _COMPILED.setdefault(model, {})
    fn = fns.get(key)
    state = frozen_state(model, watch=True) if model.decode_frozen else None  # a frozen graph: for these weights
    if fn is None or (state is not None and fn.state != state):
        own = types.FunctionType(_step.__code__.replace(), _step.__globals__, "_step")
        compiled = torch.compile(
            own,
            fullgraph=True,
            dynamic=None,
            # Inductor's asserts re-check each input's size and stride in Python per call: what the tensor
            # guards kept already checked (some 40 per step at the demo shape, 2% of a call)
            options={"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe, "size_asserts": False},
        )
        if state is None:
            fn = compiled
        else:

            def fn(*args, _compiled=compiled):
                with torch._inductor.config.patch(freezing=True):  # read while it compiles (options come too late)
                    return _compiled(*args)

            fn.state = state
        fns[key] = fn
    return fn


def frozen_state(model: TransformerLM, watch: bool = False) -> tuple:
    """What a frozen graph of ``model`` (decode_layout's 'frozen') took as constants, identified without
    reading values: each parameter's and buffer's tensor, storage, layout, dtype, version and the gradients
    accumulated into it (:func:`lmlab.kernels.decode_layout._weight_state`; ``watch``: start counting them,
    as the decode copies do). Another state means other weights: the graph is stale."""
    tensors = [*model.parameters(), *model.buffers()]
    if watch:
        for t in tensors:
            _watch_gradients(t)
    return tuple(
        (id(t), t.data_ptr(), t.shape, t.dtype) if t.is_inference() else (id(t), _weight_state(t), t.grad is None)
        for t in tensors
    )  # (an inference tensor, e.g. a table made while decoding, has no version counter: a new table is new)


class _DirectStep:
    """The Inductor graph a call's first compiled step ran, called directly on the call's later steps: the
    inputs Dynamo passed it (the model's tensors, the cache buffers, the cache length) are the same objects
    on every step of a call, so only the ids and the position change, written into the tensors the graph
    was given (``ids``, ``pos``). This skips Dynamo's and AOT autograd's Python around the graph (their
    guards, the gathering of the model's tensors, the runtime wrapper: at the demo shape some 0.09 ms of a
    0.72-ms step, bench/decode_overhead.py). What those guards would see change during a call is checked
    here instead: the ids' shape and dtype, and the storage of every tensor input (a weight given other
    storage, e.g. by ``.data =`` or ``model.to()``, ends the direct calls); a weight replaced by another
    tensor, a stale decode copy or a frozen graph's changed weights are checked by the step before."""

    def __init__(self, graph, inputs: list, ids: torch.Tensor, pos: torch.Tensor):
        # the generated module's ``call`` itself, without CompiledFxGraph.__call__'s per-call bookkeeping
        # (autotune-cache and runtime-metrics contexts, profiler check; docs/bench/decode_overhead.md), which
        # concerns a graph's first call only
        self.run = getattr(graph, "current_callable", None) or graph
        self.graph, self.inputs, self.ids, self.pos = graph, inputs, ids, pos
        self.tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        self.ptrs = [t.data_ptr() for t in self.tensors]

    def holds(self, idx: torch.Tensor) -> bool:
        """Whether the graph can take ``idx`` with every input where it was (else: through Dynamo)."""
        return (
            idx.shape == self.ids.shape
            and idx.dtype == self.ids.dtype
            and [t.data_ptr() for t in self.tensors] == self.ptrs
        )

    def __call__(self, idx: torch.Tensor, position: int) -> torch.Tensor:
        self.ids.copy_(idx)
        self.pos.fill_(position)
        (logits,) = self.run(list(self.inputs))  # (Inductor's call empties the list it is given)
        return logits


_CAPTURE = threading.Lock()


def _first_step(fn, model: TransformerLM, idx: torch.Tensor, cache: KVCache) -> tuple:
    """A call's first compiled step through Dynamo (``fn``, compiling when its guards ask), returning (its
    logits, a :class:`_DirectStep` for the call's later steps, or None where the Inductor graph it ran was
    not seen, or returned more than the logits). The graph is seen by wrapping Inductor's
    ``CompiledFxGraph.__call__`` for this one call (under a lock; only a call whose inputs hold this step's own
    ids and position tensors is taken)."""
    ids, pos = idx.clone(), torch.tensor(cache.length, device=idx.device)
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except ImportError:  # another torch: every step through Dynamo
        return fn(model, ids, pos, cache.k, cache.v, cache.left_pad), None
    seen: list = []
    with _CAPTURE:
        original = CompiledFxGraph.__call__

        def spy(graph, inputs):
            ours = not seen and any(x is ids for x in inputs) and any(x is pos for x in inputs)
            given = list(inputs) if ours else None
            out = original(graph, inputs)
            if ours:
                seen.append((graph, given, out))
            return out

        CompiledFxGraph.__call__ = spy
        try:
            logits = fn(model, ids, pos, cache.k, cache.v, cache.left_pad)
        finally:
            CompiledFxGraph.__call__ = original
    if not seen:
        return logits, None
    graph, given, out = seen[0]
    # the graph's one output is the logits Dynamo returned: the cache writes are inside the graph (a graph
    # that left them to AOT autograd's wrapper would return the written buffers too)
    direct = len(out) == 1 and out[0] is logits
    return logits, (_DirectStep(graph, given, ids, pos) if direct else None)


def compiled_decoder(model: TransformerLM):
    """The compiled one-token step of ``model``: ``step(idx, cache)`` decodes ``idx`` (batch, 1) ids
    continuing ``cache`` (a :class:`KVCache` of full-attention layers, after its prefill) -> fp32 logits
    (batch, vocab), advancing the cache by one. Call it inside
    :func:`lmlab.kernels.decode_layout.decode_layout` (``compiled=True``) under inference mode. The first
    step for a model and batch size compiles (seconds). Raises ValueError for a model
    :func:`compiled_decode_unsupported` refuses (here) and, from ``step``, for a full cache."""
    check_compilable(model)
    fn, traced = None, None
    # each weighted module's parameters: a weight replaced (a new Parameter, or none: eager) shows there,
    # read without nn.Module's attribute lookup (some 20 per step)
    weighted = [m._parameters for m in (model.embed, *(m for m in model.modules() if isinstance(m, torch.nn.Linear)))]

    def step(idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        nonlocal fn, traced
        if cache.length >= cache.max_len:
            raise ValueError(f"KV cache full: {cache.length + 1} positions needed, {cache.max_len} allocated")
        tensors = tuple([id(p.get("weight")) for p in weighted])
        if not decode_copies_current(model) or (traced is not None and tensors != traced):
            # a weight changed since its decode copy, or a weight tensor was replaced (e.g. an LM head
            # untied from the embedding) since this call's graph was chosen: the eager step reads them
            return model.logits(model.hidden(idx, cache)[:, -1])
        if not getattr(cache, "_dynamic_marked", False):  # once per cache (each call makes its own)
            for t in cache.k + cache.v:  # the buffer length varies between calls: one graph for all
                torch._dynamo.mark_dynamic(t, 2)
            cache._dynamic_marked = True
            for module in model._position_tables:  # tables cover every position the buffer can hold
                module.ensure(cache.max_len)
            first: dict = {}  # which of those tensors are one (tied): a graph is traced for one such pattern
            fn = _compiled_fn(
                model, cache.left_pad is not None, tuple(first.setdefault(t, i) for i, t in enumerate(tensors))
            )
            traced = tensors
            logits, cache._direct = _first_step(fn, model, idx, cache)
        elif model.decode_frozen and frozen_state(model) != fn.state:  # the weights changed during this call
            return model.logits(model.hidden(idx, cache)[:, -1])  # (the next call's first step compiles anew)
        elif cache._direct is not None and cache._direct.holds(idx):
            logits = cache._direct(idx, cache.length)
        else:
            logits = fn(model, idx, torch.tensor(cache.length, device=idx.device), cache.k, cache.v, cache.left_pad)
        cache.length += 1
        return logits

    return step
