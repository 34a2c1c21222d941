"""Sampling with a KV cache: greedy (temperature 0), temperature, top-k, top-p (nucleus; Holtzman et
al. 2020), seeded; an end-of-sequence id and stop strings; one sequence or a batch of prompts.

One sequence (:func:`generate`, streaming ids): the model never attends over more than
``context_length`` tokens. The prompt must fit in it (else ValueError). When prompt + generated tokens
fill the window, the cache is rebuilt from the last ``context_length // 2`` tokens (positions restart
at 0) and decoding goes on; so generation can run past context_length, at the cost of one prefill every
context_length/2 tokens, and each new token sees between context_length/2 and context_length tokens.

A batch (:func:`generate_batch`, :func:`stream_batch`): prompts of different lengths are left-padded to
the longest; each row's tokens sit at their own positions (0 at its first real token) and padding is
masked, so greedy decoding gives every row exactly the tokens it gets alone. The longest prompt plus
the new tokens must fit in ``context_length``.

The decode loop feeds the sampled id tensor straight back (no Python list round trip), runs the LM
head on the last position only, and runs under ``torch.inference_mode``. Sliding-window layers keep a
rolling cache of ``sliding_window`` entries (see :class:`lmlab.model.KVCache`).

:func:`generate` and :func:`stream_batch` are generators that hold the model in :func:`decode_layout`
from the first token until they finish. Its weight copies are kept between calls (the re-layout is paid
once per model and weight change, not per call). A model with more than ``PACK_LIMIT_BYTES`` of linear
weights is re-laid out in place instead: a generator left suspended (partly consumed) then keeps those
weights non-contiguous, e.g. for ``safetensors.torch.save_file``; exhaust it or call its ``close()``
(``contextlib.closing``) before using the model otherwise. lmlab's own checkpoints and training work
either way.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import types
import weakref
from typing import Iterable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from lmlab.model import KVCache, TransformerLM


def _check_sampling(temperature: float, top_k: Optional[int], top_p: Optional[float]) -> None:
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Pick next tokens from logits (batch, vocab) -> ids (batch,).

    temperature 0 is greedy (argmax, the lowest id among equal maxima). top_k keeps the k largest logits
    (and every logit tied with the k-th). top_p keeps the smallest set of most likely tokens whose
    probability reaches p: a token is kept when the tokens ranked strictly before it hold less than p
    (ties ranked by id, so the choice is deterministic); the most likely token is always kept, and a token
    holding all the mass is always chosen. Logits are shifted by their maximum before dividing by the
    temperature, so tiny temperatures approach greedy instead of overflowing. Raises ValueError for
    temperature < 0, top_k < 1 or top_p outside (0, 1].
    """
    _check_sampling(temperature, top_k, top_p)
    if logits.dtype != torch.float32:
        logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly better-ranked tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _generator(device, seed: Optional[int]) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()
    return gen


def _dtype(model: TransformerLM) -> torch.dtype:
    return next(model.parameters()).dtype


# linear weights up to this size (bytes, all layers together) get a decode copy (packed or transposed),
# kept between generate calls; larger ones are re-laid out in place on every call
PACK_LIMIT_BYTES = 1 << 30

# Batch-1 decoding multiplies one row by every weight matrix (memory-bound): below this many weights per
# thread a second CPU thread does not pay, and on a busy machine a thread waiting for a core stalls every
# step. bench/decode_threads.py on the project's 2-vCPU machine: 2 threads / 1 thread = 1.02x, 1.04x,
# 0.99x, 1.04x of the time per token at 4M, 26M, 81M, 190M weights (no gain anywhere measured), so the
# threshold sits above the measured range.
DECODE_WEIGHTS_PER_THREAD = 200_000_000


def decode_threads(model: TransformerLM, available: int) -> int:
    """CPU threads for decoding one sequence at a time with ``model`` when the user set none: one per
    :data:`DECODE_WEIGHTS_PER_THREAD` linear-layer weights (rounded up), at least 1, at most
    ``available`` (the compute default: physical cores, capped by OMP_NUM_THREADS)."""
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return max(1, min(available, -(-weights // DECODE_WEIGHTS_PER_THREAD)))


def packed_decode_available() -> bool:
    """True when this PyTorch build can pack linear weights for oneDNN (``torch.ops.mkldnn``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") \
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _weight_state(w: torch.Tensor) -> tuple:
    """What identifies the values of weight ``w`` without reading them: its storage, layout, dtype,
    version counter and the process's optimizer-step count (see :func:`decode_layout`)."""
    return (w.data_ptr(), tuple(w.shape), w.stride(), w.dtype, w._version, _OPTIMIZER_STEPS[0])


class _DecodeCopy:
    """A module's decode copy of its weight: the copy, whether it is oneDNN-packed, and the weight's
    state when it was made. A deep copy or pickle of the model carries no copy (an opaque oneDNN
    tensor cannot be copied, and the clone's weights are other tensors): its forward then uses its
    own weight."""

    __slots__ = ("copy", "packed", "state")

    def __init__(self, copy: Optional[torch.Tensor], packed: bool, state: Optional[tuple]):
        self.copy, self.packed, self.state = copy, packed, state

    def __reduce__(self):  # pickle and copy.deepcopy both rebuild it empty
        return _DecodeCopy, (None, self.packed, None)


def _decode_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` for a module holding a decode copy of its weight (``self._decode_copy``, a
    :class:`_DecodeCopy`); bound to the module as its ``forward`` while decoding. The copy is used only
    while the weight is unchanged, without autograd, for an input of the weight's dtype; otherwise the
    module's own weight is (so a step taken while a generator is suspended, or a deep copy of the
    model, never multiplies by stale or foreign values)."""
    d = self._decode_copy
    copy, packed, state = d.copy, d.packed, d.state
    if copy is None or torch.is_grad_enabled() or x.dtype != self.weight.dtype \
            or _weight_state(self.weight) != state:
        return F.linear(x, self.weight, self.bias)
    if packed:
        return torch.ops.mkldnn._linear_pointwise(x, copy, self.bias, "none", [], "")
    return F.linear(x, copy, self.bias)


# The decode copies of linear weights, kept between calls: module -> (what was prepared, the weight
# tensor it was made from (holding its storage, so an equal data_ptr means the same storage), the
# weight's state then (_weight_state), the copy). Keyed weakly, so a model that is dropped frees its
# copies; see decode_layout for when a copy is remade.
_DECODE_COPIES: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
_OPTIMIZER_STEPS = [0]
_STEP_HOOK = []
_ACTIVE: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models inside decode_layout now


def _count_optimizer_steps() -> None:
    """Count every ``torch.optim`` step in this process (one global post-step hook, registered once):
    torch's fused AdamW updates parameters without bumping their version counters, so a step must
    invalidate the decode copies by itself."""
    if not _STEP_HOOK:
        def bump(*_):
            _OPTIMIZER_STEPS[0] += 1
        _STEP_HOOK.append(register_optimizer_step_post_hook(bump))


def _decode_copy(module: torch.nn.Linear, what: tuple) -> torch.Tensor:
    """``module``'s weight prepared as ``what`` (('packed', batch) or ('transposed',)), from the cache
    when it was made from the same tensor storage, at the same version, with no optimizer step since."""
    w = module.weight
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
    calls; returns how many bytes they held. The next generation call makes them again."""
    freed = 0
    for module in model.modules():
        entry = _DECODE_COPIES.pop(module, None)
        if entry is not None:
            freed += entry[-1].numel() * entry[-1].element_size()
    return freed


def _transposes(w: torch.Tensor) -> bool:
    """Whether the 'transposed' layout holds ``w`` (out, in) as (in, out): a contiguous matrix with at
    least as many outputs as inputs (q|k|v, gate|up, the LM head; the FFN's down projection stays)."""
    return w.dim() == 2 and w.is_contiguous() and w.shape[0] >= w.shape[1] > 1


def _linear_bytes(model: torch.nn.Module) -> int:
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() * w.element_size() for w in weights.values())


def decode_layout_kind(model: TransformerLM, batch: int = 1) -> str:
    """Which weight layout :func:`decode_layout` uses for ``model`` decoding ``batch`` rows at a time:
    'onednn-packed', 'transposed' or 'unchanged' (not a CPU model)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    if not weights or any(w.device.type != "cpu" for w in weights.values()):
        return "unchanged"
    fp32 = all(w.dtype == torch.float32 for w in weights.values())
    pack = batch >= 2 and fp32 and _linear_bytes(model) <= PACK_LIMIT_BYTES and packed_decode_available()
    return "onednn-packed" if pack else "transposed"


@contextlib.contextmanager
def decode_layout(model: TransformerLM, batch: int = 1) -> Iterator[None]:
    """Lay the linear weights out for decoding on CPU, where each step multiplies a few rows (``batch``,
    one per sequence) by every weight matrix, and let one-token steps take the model's lean path
    (``TransformerLM.lean_decode``: each block's ``decode_one``, when ``lean_decode_possible()``, i.e. no
    hooks and plain attention); both are undone on exit. Nested uses are left alone; non-CPU models keep
    their weights as they are (see :func:`decode_layout_kind`).

    - 'onednn-packed' (fp32 weights, at most ``PACK_LIMIT_BYTES`` of them, a PyTorch built with oneDNN):
      each ``nn.Linear`` multiplies by a copy of its weight reordered into oneDNN's blocked format for
      ``batch`` rows (``torch.ops.mkldnn._reorder_linear_weight``, the packing Inductor's CPU "freezing"
      uses), through ``torch.ops.mkldnn._linear_pointwise``. Results equal ``F.linear`` up to fp32
      summation order.
    - 'transposed' (otherwise, e.g. bf16 weights or batch 1): each weight with at least as many outputs
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
    through the parameter (its version counter: ``load_state_dict``, ``p.copy_``), or any ``torch.optim``
    step in the process since it was made (torch's fused AdamW does not bump version counters); each
    call checks this, so a step taken while a generator is suspended takes effect at once. Writes into
    ``p.data``'s storage in place (``p.data.mul_(2)``) bypass all of these: call
    :func:`release_decode_copies` after them.

    Side by side on the demo shape (2 CPU threads; ``python bench/decode_vs_hf.py``): see docs/benchmarks.md."""
    kind = decode_layout_kind(model, batch)
    if model in _ACTIVE:
        yield
        return
    _ACTIVE.add(model)
    model.lean_decode = model.lean_decode_possible()
    changed, patched = [], []
    try:
        if kind == "unchanged":
            yield
            return
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if kind == "onednn-packed" or _linear_bytes(model) <= PACK_LIMIT_BYTES:
            _count_optimizer_steps()
            for module in linears:
                packed = kind == "onednn-packed"
                if not packed and not _transposes(module.weight):
                    continue
                copy = _decode_copy(module, ("packed", batch) if packed else ("transposed",))
                module._decode_copy = _DecodeCopy(copy, packed, _weight_state(module.weight))
                module.forward = types.MethodType(_decode_forward, module)  # deep copies rebind it
                patched.append(module)
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
        _ACTIVE.discard(model)
        model.lean_decode = False


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` for the duration, then the train/eval mode it had before (generation leaves a
    model that was training in training mode)."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def eos_set(eos_id: "int | Sequence[int] | None") -> frozenset:
    """The end-of-sequence ids as a set: one id, several (e.g. Llama 3's <|end_of_text|> and
    <|eot_id|>), or none. Raises ValueError for anything that is not an int or a sequence of ints."""
    if eos_id is None:
        return frozenset()
    ids = [eos_id] if isinstance(eos_id, int) and not isinstance(eos_id, bool) else list(eos_id)
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ValueError(f"eos_id={eos_id!r} must be a token id or a list of token ids")
    return frozenset(ids)


def generate(model: TransformerLM, prompt: list[int], max_new_tokens: int, temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
             eos_id: "int | Sequence[int] | None" = None, device: str | torch.device = "cpu") -> Iterator[int]:
    """Yield up to ``max_new_tokens`` token ids continuing ``prompt`` (a non-empty list of ids), one
    at a time; stops after yielding an id of ``eos_id`` (one id or several). Raises ValueError for an
    empty prompt or one longer than ``context_length`` (see the module docstring for what happens when
    the window fills)."""
    for token, _ in generate_logprobs(model, prompt, max_new_tokens, temperature, top_k, top_p, seed,
                                      eos_id, device):
        yield token


@torch.inference_mode()
def generate_logprobs(model: TransformerLM, prompt: list[int], max_new_tokens: int, temperature: float = 1.0,
                      top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
                      eos_id: "int | Sequence[int] | None" = None,
                      device: str | torch.device = "cpu") -> Iterator[tuple[int, float]]:
    """:func:`generate`, yielding (token id, its log-probability in nats under the model's own
    distribution: log-softmax of the logits before temperature, top-k or top-p)."""
    eos = eos_set(eos_id)
    T = model.cfg.context_length
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    if len(prompt) > T:
        raise ValueError(f"the prompt has {len(prompt)} tokens, more than context_length={T}; shorten it")
    _check_sampling(temperature, top_k, top_p)
    gen = _generator(device, seed)
    dtype = _dtype(model)
    history = list(prompt)
    max_len = min(T, len(prompt) + max(max_new_tokens - 1, 0))
    with eval_mode(model), decode_layout(model):
        cache = KVCache(model.cfg, 1, max_len, device=device, dtype=dtype)
        logits = model.logits(model.hidden(torch.tensor([history], device=device), cache)[:, -1])
        for i in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, top_p, gen)
            token = int(nxt)
            yield token, float(torch.log_softmax(logits[0].float(), -1)[token])
            if token in eos or i + 1 == max_new_tokens:
                return
            history.append(token)
            if cache.length == T:  # window full: keep the last half, re-encode from position 0
                keep = history[-(T // 2):]
                cache = KVCache(model.cfg, 1, T, device=device, dtype=dtype)
                logits = model.logits(model.hidden(torch.tensor([keep], device=device), cache)[:, -1])
            else:
                logits = model.logits(model.hidden(nxt.view(1, 1), cache)[:, -1])


def left_pad_batch(prompts: Sequence[Sequence[int]], pad_id: int = 0,
                   device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths -> (ids (batch, longest) left-padded with ``pad_id``, left_pad (batch,))."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    for row, p in enumerate(prompts):
        if len(p):
            ids[row, longest - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
    pad = torch.tensor([longest - len(p) for p in prompts], dtype=torch.long)
    return ids.to(device), pad.to(device)


@torch.inference_mode()
def stream_batch(model: TransformerLM, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 seed: Optional[int] = None, device: str | torch.device = "cpu",
                 pad_id: int = 0) -> Iterator[torch.Tensor]:
    """Yield the next ids of every row, (batch,) long tensors, ``max_new_tokens`` times: the first
    right after the prefill of the left-padded prompts, then one per decode step. Rows never stop on their
    own (see :func:`generate_batch` for end-of-sequence ids). Raises ValueError for no prompts, an empty
    prompt, or the longest prompt plus max_new_tokens - 1 exceeding context_length."""
    if not prompts:
        raise ValueError("no prompts given")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt is empty; give at least one token per prompt")
    _check_sampling(temperature, top_k, top_p)
    longest, T = max(len(p) for p in prompts), model.cfg.context_length
    if longest + max_new_tokens - 1 > T:
        raise ValueError(
            f"the longest prompt ({longest} token{'s' if longest != 1 else ''}) plus "
            f"max_new_tokens={max_new_tokens} does not "
            f"fit in context_length={T}; batched generation does not slide the context"
        )
    if max_new_tokens <= 0:
        return
    gen = _generator(device, seed)
    ids, pad = left_pad_batch(prompts, pad_id, device)
    cache = KVCache(model.cfg, len(prompts), longest + max_new_tokens - 1, device=device, dtype=_dtype(model),
                    left_pad=pad)
    with eval_mode(model), decode_layout(model, len(prompts)):
        logits = model.logits(model.hidden(ids, cache)[:, -1])
        for i in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, top_p, gen)
            yield nxt
            if i + 1 < max_new_tokens:
                logits = model.logits(model.hidden(nxt[:, None], cache)[:, -1])


def generate_batch(model: TransformerLM, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
                   seed: Optional[int] = None, eos_id: "int | Sequence[int] | None" = None,
                   device: str | torch.device = "cpu", pad_id: int = 0) -> list[list[int]]:
    """Continue every prompt by up to ``max_new_tokens`` ids; a row ends after an id of ``eos_id`` (kept),
    and decoding stops once every row has ended. Greedy rows equal :func:`generate` on each prompt alone
    (within context_length). Returns one list of new ids per prompt."""
    eos = eos_set(eos_id)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for nxt in stream_batch(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, device, pad_id):
        for row, token in enumerate(nxt.tolist()):
            if not done[row]:
                out[row].append(token)
                done[row] = token in eos
        if all(done):
            break
    return out


_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\udc80-\udcff]")


def escape_controls(text: str) -> str:
    """``text`` with every control character but newline and tab (C0, DEL, C1: ESC would let a prompt
    or a model drive the terminal) written as ``\\xNN``, and an undecodable byte held as a surrogate
    escape (a command-line prompt's) as ``\\xNN`` of that byte."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()) & 0xFF:02x}", text)


def write_text(text: str, raw: bool = False, out=None) -> None:
    """Write ``text`` to ``out`` (default sys.stdout): escaped (:func:`escape_controls`) unless ``raw``;
    raw, the bytes of surrogate escapes (a prompt's invalid UTF-8) go out as they came in."""
    import sys

    out = out or sys.stdout
    if not raw:
        out.write(escape_controls(text))
        return
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a text-only stream (io.StringIO) holds the text as it is
        out.write(text)
        return
    out.flush()
    buffer.write(text.encode(out.encoding or "utf-8", errors="surrogateescape"))
    buffer.flush()


class TextStream:
    """Incremental detokenisation for streaming output, with stop strings.

    :meth:`push` takes the bytes of each new token and returns the text that is safe to print now: an
    incomplete UTF-8 sequence is held back until its continuation arrives (invalid bytes become U+FFFD),
    and so is any tail that could be the beginning of a stop string. Once a stop string appears,
    ``stopped`` is set and the text before it is the last returned; the stop string is not printed.
    :meth:`flush` returns what is held back at the end.
    """

    def __init__(self, stops: Iterable[str] = ()):
        self.stops = [s for s in stops if s]
        self.stopped = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""

    def push(self, data: bytes) -> str:
        if self.stopped:
            return ""
        return self._emit(self._held + self._decoder.decode(data))

    def flush(self) -> str:
        if self.stopped:
            return ""
        text = self._emit(self._held + self._decoder.decode(b"", final=True))
        text, self._held = text + self._held, ""
        return text

    def _emit(self, text: str) -> str:
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return text[:cut]
        hold = 0  # the longest tail of text that begins some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), hold, -1):
                if s.startswith(text[-n:]):
                    hold = n
                    break
        self._held = text[len(text) - hold:] if hold else ""
        return text[: len(text) - hold]


def encode_prompt(tok, text: str, after_eot: bool = False) -> list[int]:
    """The ids ``generate`` starts from: ``text`` encoded by ``tok``, after the end-of-text token when
    ``text`` is empty or ``after_eot`` (a document's start). Raises TokenizerError (no such token)."""
    ids = tok.encode(text) if text else []
    return [tok.eot_id] + ids if not ids or after_eot else ids


def generate_text(model: TransformerLM, tok, ids: list[int], max_new_tokens: int, stop: Iterable[str] = (),
                  **sampling) -> Iterator[tuple[str, Optional[int], Optional[float]]]:
    """Stream one continuation of ``ids`` as text: yields (text safe to print now, token id, its
    log-probability in nats) per new token (:func:`generate_logprobs`, ``sampling``: temperature, top_k,
    top_p, seed, eos_id, device), up to a stop string (:class:`TextStream`: never printed), then
    ("text held back", None, None) once. The prompt is checked (ValueError) before the first yield."""
    stream = TextStream(stop)
    for i, lp in generate_logprobs(model, ids, max_new_tokens, **sampling):
        yield stream.push(tok.token_bytes(i)), i, lp
        if stream.stopped:
            break
    yield stream.flush(), None, None


def text_until_stop(tok, ids: list[int], stop: Iterable[str] = ()) -> str:
    """The text of generated ``ids`` up to the first stop string (excluded), as :func:`generate_text`
    streams it: for the continuations of a batch (:func:`generate_batch`)."""
    stream, body = TextStream(stop), []
    for i in ids:
        body.append(stream.push(tok.token_bytes(i)))
        if stream.stopped:
            break
    return "".join(body) + stream.flush()

