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
import itertools
import operator
import re
import sys
from typing import Iterable, Iterator, Optional, Sequence

import torch

from lmlab.kernels.compiled_decode import compiled_decoder
from lmlab.kernels.decode_layout import decode_layout
from lmlab.model import KVCache, TransformerLM


def _check_sampling(temperature: float, top_k: Optional[int], top_p: Optional[float]) -> None:
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
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
    logits = logits - logits.max(dim=-1, keepdim=True).values  # <= 0, the maxima at 0
    if temperature < torch.finfo(torch.float32).tiny:  # in float32 it could round to 0 (0/0 at the maxima)
        logits = (logits.double() / temperature).float()  # the maxima 0, the other logits -inf
    else:
        logits = logits / temperature
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


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` for the duration, then the train/eval mode it had before (generation leaves a
    model that was training in training mode); nothing at all where no module is training (no walk of
    every module twice; docs/bench/decode_overhead.md)."""
    was = model.training
    training = any(m.training for m in model.modules())
    if training:
        model.eval()
    try:
        yield
    finally:
        if training:
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


SAMPLING = ("temperature", "top_k", "top_p", "seed", "eos_id", "device", "compile")  # generate_logprobs's keywords


def _check_ids(ids: Sequence[int], vocab_size: int, what: str) -> None:
    """ValueError naming the first of token ``ids`` (integers, numpy's included) outside 0..vocab_size - 1
    or not an integer (``what``: 'prompt', 'eos_id')."""
    for i in ids:
        try:
            ok = not isinstance(i, bool) and 0 <= operator.index(i) < vocab_size
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{what} id {i!r} is outside the model's vocabulary 0..{vocab_size - 1}")


def decode_step(model: TransformerLM, compile: bool = False):
    """The decode loops' one-token step: (ids (batch, 1), cache) -> fp32 logits (batch, vocab), the cache
    advanced by one. Eager (the model's lean path) by default; with ``compile``, the compiled step over
    the preallocated cache (:func:`lmlab.kernels.compiled_decode.compiled_decoder`: seconds to compile once
    per model, then less time per token at batch 1; docs/usage.md says when it pays).
    Raises ValueError at once for a ``compile`` that is not a bool, or asked for a model it cannot run,
    naming why."""
    if not isinstance(compile, bool):
        raise ValueError(f"compile={compile!r} must be True or False")
    if not compile:
        return lambda ids, cache: model.logits(model.hidden(ids, cache)[:, -1])
    return compiled_decoder(model)


def _check_keywords(sampling: dict, valid: Sequence[str], fn: str) -> None:
    unknown = sorted(set(sampling) - set(valid))
    if unknown:
        raise TypeError(f"{fn}() got unexpected keyword(s) {', '.join(unknown)}; valid: {', '.join(valid)}")


def generate(model: TransformerLM, prompt: list[int], max_new_tokens: int, **sampling) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` token ids continuing ``prompt`` (a non-empty list of ids), one
    at a time; stops after yielding an id of ``eos_id`` (one id or several). ``sampling``: the keywords of
    :func:`generate_logprobs` (``temperature`` 1.0, ``top_k``, ``top_p``, ``seed``, ``eos_id``, ``device``).
    Raises ValueError for an empty prompt, one longer than ``context_length`` (see the module docstring
    for what happens when the window fills) or an id outside the vocabulary, TypeError for an unknown
    keyword."""
    _check_keywords(sampling, SAMPLING, "generate")
    for token, _ in generate_logprobs(model, prompt, max_new_tokens, **sampling):
        yield token


@torch.inference_mode()
def generate_logprobs(
    model: TransformerLM,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    seed: Optional[int] = None,
    eos_id: "int | Sequence[int] | None" = None,
    device: str | torch.device = "cpu",
    compile: bool = False,
) -> Iterator[tuple[int, float]]:
    """Yield up to ``max_new_tokens`` (token id, its log-probability in nats under the model's own
    distribution: log-softmax of the logits before temperature, top-k or top-p) continuing ``prompt``, one
    at a time, sampled with ``temperature`` (0: greedy), ``top_k`` and ``top_p`` (:func:`sample_next`) from a
    generator seeded with ``seed`` on ``device``; stops after an id of ``eos_id`` (one id or several).
    ``compile``: decode steps through the compiled step (:func:`decode_step`). Raises ValueError for an
    empty prompt, one longer than ``context_length``, a prompt or ``eos_id`` id outside the vocabulary, or
    ``compile`` with a model the compiled step cannot run."""
    eos = eos_set(eos_id)
    _check_ids(list(prompt), model.cfg.vocab_size, "prompt")
    _check_ids(sorted(eos), model.cfg.vocab_size, "eos_id")
    T = model.cfg.context_length
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    if len(prompt) > T:
        raise ValueError(f"the prompt has {len(prompt)} tokens, more than context_length={T}; shorten it")
    _check_sampling(temperature, top_k, top_p)
    step = decode_step(model, compile)
    gen = _generator(device, seed)
    dtype = _dtype(model)
    history = list(prompt)
    max_len = min(T, len(prompt) + max(max_new_tokens - 1, 0))
    with eval_mode(model), decode_layout(model, compiled=compile):
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
                keep = history[-(T // 2) :]
                cache = KVCache(model.cfg, 1, T, device=device, dtype=dtype)
                logits = model.logits(model.hidden(torch.tensor([keep], device=device), cache)[:, -1])
            else:
                logits = step(nxt.view(1, 1), cache)


def left_pad_batch(
    prompts: Sequence[Sequence[int]], pad_id: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths -> (ids (batch, longest) left-padded with ``pad_id``, left_pad (batch,))."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    for row, p in enumerate(prompts):
        if len(p):
            ids[row, longest - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
    pad = torch.tensor([longest - len(p) for p in prompts], dtype=torch.long)
    return ids.to(device), pad.to(device)


@torch.inference_mode()
def stream_batch(
    model: TransformerLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    seed: Optional[int] = None,
    device: str | torch.device = "cpu",
    pad_id: int = 0,
    compile: bool = False,
) -> Iterator[torch.Tensor]:
    """Yield the next ids of every row, (batch,) long tensors, ``max_new_tokens`` times: the first
    right after the prefill of the left-padded prompts, then one per decode step. Rows never stop on their
    own (see :func:`generate_batch` for end-of-sequence ids). ``compile``: decode steps through the
    compiled step (:func:`decode_step`). Raises ValueError for no prompts, an empty prompt, the longest
    prompt plus max_new_tokens - 1 exceeding context_length, or ``compile`` with a model the compiled step
    cannot run."""
    if not prompts:
        raise ValueError("no prompts given")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt is empty; give at least one token per prompt")
    for p in prompts:
        _check_ids(list(p), model.cfg.vocab_size, "prompt")
    _check_sampling(temperature, top_k, top_p)
    step = decode_step(model, compile)
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
    cache = KVCache(
        model.cfg, len(prompts), longest + max_new_tokens - 1, device=device, dtype=_dtype(model), left_pad=pad
    )
    with eval_mode(model), decode_layout(model, len(prompts), compiled=compile):
        logits = model.logits(model.hidden(ids, cache)[:, -1])
        for i in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, top_p, gen)
            yield nxt
            if i + 1 < max_new_tokens:
                logits = step(nxt[:, None], cache)


def generate_batch(
    model: TransformerLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_id: "int | Sequence[int] | None" = None,
    **sampling,
) -> list[list[int]]:
    """Continue every prompt by up to ``max_new_tokens`` ids; a row ends after an id of ``eos_id`` (kept),
    and decoding stops once every row has ended. ``sampling``: the keywords of :func:`stream_batch`
    (``temperature``, ``top_k``, ``top_p``, ``seed``, ``device``, ``pad_id``, ``compile``). Greedy rows equal
    :func:`generate` on each prompt alone (within context_length). Returns one list of new ids per prompt."""
    _check_keywords(
        sampling, ("temperature", "top_k", "top_p", "seed", "device", "pad_id", "compile"), "generate_batch"
    )
    eos = eos_set(eos_id)
    _check_ids(sorted(eos), model.cfg.vocab_size, "eos_id")
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for nxt in stream_batch(model, prompts, max_new_tokens, **sampling):
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
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]


def encode_prompt(tok, text: str, after_eot: bool = False) -> list[int]:
    """The ids ``generate`` starts from: ``text`` encoded by ``tok``, after the end-of-text token when
    ``text`` is empty or ``after_eot`` (a document's start). Raises TokenizerError (no such token)."""
    ids = tok.encode(text) if text else []
    return [tok.eot_id] + ids if not ids or after_eot else ids


def generate_text(
    model: TransformerLM, tok, ids: list[int], max_new_tokens: int, stop: Iterable[str] = (), **sampling
) -> Iterator[tuple[str, Optional[int], Optional[float]]]:
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


def print_logprobs(seen: list, text_of=None) -> None:
    """``lmlab generate --logprobs``: one line per (token id, log-probability in nats), with the token's
    text when ``text_of`` (id -> str) is given, then the total."""
    print(
        "token id\tlog-probability (nats, the model's distribution before sampling settings)"
        + ("\ttext" if text_of else "")
    )
    for i, lp in seen:
        print(f"{i}\t{lp:.4f}" + (f"\t{text_of(i)}" if text_of else ""))
    print(f"total\t{sum(lp for _, lp in seen):.4f}\t({len(seen)} tokens)")


def print_completion(
    model: TransformerLM,
    tok,
    text: str,
    ids: list[int],
    max_new_tokens: int,
    stop: Iterable[str] = (),
    raw: bool = False,
    logprobs: bool = False,
    **sampling,
) -> None:
    """``lmlab generate`` with one prompt: ``text`` (the prompt, encoded as ``ids``) and its continuation
    streamed to stdout as it comes (:func:`generate_text`, ``sampling`` its keywords; :func:`write_text`
    escapes control characters unless ``raw``), then with ``logprobs`` the table of :func:`print_logprobs`.
    A bad prompt raises ValueError before anything is printed; Ctrl-C ends the text's line first."""
    pieces = generate_text(model, tok, ids, max_new_tokens, stop, **sampling)
    first = next(pieces)  # checks the prompt (ValueError -> one-line error) before anything is printed
    write_text(text, raw)
    seen = []
    try:
        for piece, i, lp in itertools.chain([first], pieces):
            write_text(piece, raw)
            sys.stdout.flush()
            if i is not None:
                seen.append((i, lp))
    except KeyboardInterrupt:
        sys.stdout.write("\n")  # end the text's line before the 'interrupted' message
        sys.stdout.flush()
        raise
    write_text("\n", raw)
    if logprobs:
        print_logprobs(seen, lambda i: repr(tok.token_bytes(i).decode("utf-8", errors="replace")))


def print_completions(
    model: TransformerLM,
    tok,
    texts: Sequence[str],
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    stop: Iterable[str] = (),
    raw: bool = False,
    **sampling,
) -> None:
    """``lmlab generate`` with several prompts: one batch (:func:`generate_batch`, left-padded), each
    prompt and continuation (cut at the first of ``stop``) printed under a ``--- [n] ---`` line."""
    outs = generate_batch(model, prompts, max_new_tokens, **sampling)
    for n, (text, ids) in enumerate(zip(texts, outs)):
        print(f"--- [{n}] ---")
        write_text(text + text_until_stop(tok, ids, stop) + "\n", raw)
