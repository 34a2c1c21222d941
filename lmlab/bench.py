"""Benchmarks a user runs on their machine: training steps per second (``lmlab bench train``,
:func:`train_benchmark`) and decode throughput (below).

Decode throughput: prefill tokens/s and decode tokens/s of KV-cache generation (``lmlab bench decode``).

One measurement runs :func:`lmlab.generate.stream_batch` greedily on ``batch`` random prompts of
``prompt_len`` tokens for ``new_tokens`` tokens: the time to the first yielded ids is the prefill (the
forward over batch x prompt_len tokens, the LM head on the last position and the first pick), the time
from there to the last ids is decode (new_tokens - 1 steps of batch tokens each), and the whole call is
timed too (what a user waits for). Figures are medians over ``repeats`` calls after one warm-up: a call timed
after releasing the decode copies of the weights (:func:`lmlab.kernels.decode_layout.decode_layout`), which gives
the first call's cost (re-layout included); the timed calls then find the copies cached, as a user's
repeated calls do.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Iterable, Optional

import torch

from lmlab.analysis import kv_cache_bytes
from lmlab.config import ConfigError, ModelConfig
from lmlab.config_files import load_mapping
from lmlab.devices import check_memory, require_memory
from lmlab.generate import stream_batch
from lmlab.kernels.compiled_decode import check_compilable
from lmlab.kernels.decode_layout import PACK_LIMIT_BYTES, decode_layout_kind, release_decode_copies
from lmlab.kernels.settings import cpu_identity
from lmlab.model import TransformerLM
from lmlab.optim import adamw
from lmlab.param_counts import param_counts
from lmlab.runs import BUILTIN_CONFIGS
from lmlab.threads import current_threads
from lmlab.train_config import TrainConfig


def step_timer(
    cfg,
    batch: int,
    context: int,
    dtype: Optional[torch.dtype],
    device: torch.device,
    seed: int = 0,
    compiled: bool = False,
) -> tuple[Callable[[int], float], int]:
    """``lmlab train``'s training step (the chunked loss of ``TransformerLM.forward(targets=...)``, its
    AdamW with a learning rate too small to matter, autocast to ``dtype`` unless None) on a fresh
    ``TransformerLM(cfg)`` (seeded ``seed``; ``compiled``: ``torch.compile`` of the whole model) and one
    fixed random batch of ``batch`` x ``context`` tokens. Returns (``run``, parameters): ``run(n)`` takes
    ``n`` steps and returns seconds per step (CUDA synchronised). What ``lmlab bench train`` and the lab's
    timing block (:func:`lmlab.lab.timing.time_variants`) both time."""

    torch.manual_seed(seed)
    model = TransformerLM(cfg).to(device)
    model.train()
    opt = adamw([{"params": list(model.parameters())}], TrainConfig(lr=1e-4), device)
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (batch, context + 1), generator=g).to(device)
    inputs, targets = x[:, :-1], x[:, 1:]

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss, _ = fwd(inputs, targets=targets)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) / n

    return run, model.num_params()


def plural(n: int, word: str) -> str:
    """'1 thread', '2 threads'."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def describe_machine(device: str | torch.device = "cpu") -> str:
    """One line naming the machine measurements were taken on: CPU model, cores visible to this process,
    memory, torch version and threads, and the GPU when ``device`` is CUDA."""

    ident = cpu_identity()
    cpu = ident["cpu"]
    if "?" not in (ident["family"], ident["model"]):  # the vendor's string alone does not name the part
        cpu += f" (family {ident['family']}, model {ident['model']})"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mem = ""
    try:
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        pass
    line = f"{cpu}, {cores} cores visible{mem}, torch {torch.__version__} ({plural(torch.get_num_threads(), 'thread')})"
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        line += f", {torch.cuda.get_device_name(torch.device(device))}"
    return line


def stamps_of(stream: Iterable) -> list[float]:
    """Consume ``stream``, returning the time (``time.perf_counter``) of each item."""
    return [time.perf_counter() for _ in stream]


def time_stream(
    run: Callable[[], list[float]], batch: int, prompt_len: int, new_tokens: int, repeats: int = 3, warmup: int = 1
) -> dict:
    """Time ``run()``, which generates and returns the ``time.perf_counter()`` at which each new token
    was ready (the first right after the prefill); e.g. ``lambda: stamps_of(stream_batch(...))``.

    Returns medians: the whole call's seconds and new tokens/s (batch * new_tokens / call time), prefill
    seconds and tokens/s (batch * prompt_len / prefill time), decode seconds per step and tokens/s
    (batch * (new_tokens - 1) / decode time), and every repeat's prefill and decode figures."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens} must be >= 2 to time decode steps")
    prefill, decode, calls = [], [], []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        stamps = run()
        t1 = time.perf_counter()
        if len(stamps) != new_tokens:
            raise RuntimeError(f"{len(stamps)} tokens were generated, expected {new_tokens}")
        if i >= warmup:
            prefill.append(stamps[0] - t0)
            decode.append(stamps[-1] - stamps[0])
            calls.append(t1 - t0)
    p, d = statistics.median(prefill), statistics.median(decode)
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "call_s": statistics.median(calls),
        "call_tokens_per_s": batch * new_tokens / statistics.median(calls),
        "prefill_s": p,
        "prefill_tokens_per_s": batch * prompt_len / p,
        "decode_s_per_step": d / (new_tokens - 1),
        "decode_tokens_per_s": batch * (new_tokens - 1) / d,
        "prefill_tokens_per_s_all": [batch * prompt_len / x for x in prefill],
        "decode_tokens_per_s_all": [batch * (new_tokens - 1) / x for x in decode],
    }


def random_prompts(vocab_size: int, batch: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, prompt_len), generator=g).tolist()


def check_decode_memory(
    cfg, device: torch.device, batch: int, length: int, dtype: str = "fp32", models: int = 1
) -> None:
    """Refuse (ConfigError) a decode benchmark whose fp32 weights (as built or loaded) and KV cache for
    ``batch`` x ``length`` tokens, for each of ``models`` models, plus the decode copy of the weights
    (CPU, at most ``PACK_LIMIT_BYTES``, see :func:`lmlab.kernels.decode_layout.decode_layout`) exceed the memory
    available on ``device``."""

    weights = 4 * param_counts(cfg)["total"]
    kv = kv_cache_bytes(cfg, length, batch, "bf16" if dtype == "bf16" else "fp32")["total"]
    packed = weights if device.type == "cpu" and weights <= PACK_LIMIT_BYTES else 0
    what = "this decode benchmark" + (f" ({models} models)" if models > 1 else "")
    require_memory(
        models * (weights + kv) + packed,
        device,
        f"{what} (fp32 weights {weights / 2**30:.2f} GiB, "
        f"KV cache for batch {batch:,} x {length:,} tokens {kv / 2**30:.2f} GiB)",
        "choose a smaller model (e.g. --scale tiny), --batch or --prompt-len",
    )


def bench_decode(
    model: TransformerLM,
    batch: int = 1,
    prompt_len: int = 32,
    new_tokens: int = 64,
    repeats: int = 3,
    device: str | torch.device = "cpu",
    seed: int = 0,
    prompts: Optional[list[list[int]]] = None,
    compile: bool = False,
) -> dict:
    """Greedy KV-cache generation throughput of ``model`` (see the module docstring); ``compile``: through
    the compiled decode step (the first, untimed-as-warm call also compiles it). Raises ValueError for
    prompts and new tokens beyond the context, or ``compile`` with a model the compiled step cannot run."""

    if prompt_len + new_tokens - 1 > model.cfg.context_length:
        raise ValueError(
            f"prompt_len={prompt_len} + new_tokens={new_tokens} - 1 exceeds context_length={model.cfg.context_length}"
        )
    prompts = prompts or random_prompts(model.cfg.vocab_size, batch, prompt_len, seed)
    model.eval()

    def call() -> list[float]:
        return stamps_of(stream_batch(model, prompts, new_tokens, temperature=0.0, device=device, compile=compile))

    release_decode_copies(model)  # one cold call: it pays the weight re-layout, as a user's first call does,
    t0 = time.perf_counter()  # and is the warm-up of the timed calls
    call()
    cold = time.perf_counter() - t0
    res = time_stream(call, batch, prompt_len, new_tokens, repeats, warmup=0)  # whole calls, copies cached
    res.update(
        first_call_s=cold,
        threads=torch.get_num_threads(),
        device=str(device),
        dtype=str(next(model.parameters()).dtype),
        decode_layout=decode_layout_kind(model, batch, compile),
        lean_decode=model.lean_decode_possible(),
        compiled=compile,
    )
    return res


def decode_benchmark(
    cfg,
    title: Optional[str],
    run: Optional[str],
    device: torch.device,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    repeats: int,
    dtype: str = "fp32",
    compile: bool = False,
) -> dict:
    """``lmlab bench decode``: :func:`bench_decode` on run ``run``'s weights, or on random weights of
    ``cfg`` (None: the demo config), in ``dtype`` (fp32 or bf16), through the compiled decode step with
    ``compile``, with ``model`` (``title``) and ``params`` added. Raises ConfigError when prompt and new
    tokens exceed the context or the cache would not fit (:func:`check_decode_memory`), before any
    weights load; ValueError for ``compile`` with a model the compiled step cannot run."""

    if cfg is None:
        cfg, title = ModelConfig.from_dict(load_mapping(BUILTIN_CONFIGS / "demo.yaml")["model"]), "the demo config"
    length = prompt_len + new_tokens - 1
    if length > cfg.context_length:
        raise ConfigError(
            f"--prompt-len {prompt_len} + --new-tokens {new_tokens} - 1 = {length} tokens "
            f"exceed the model's context_length {cfg.context_length}; shorten one of them"
        )
    check_decode_memory(cfg, device, batch, length, dtype)
    if run:
        from lmlab.checkpoint import load_run

        model, cfg, _, _, _ = load_run(run, device=str(device))
    else:
        torch.manual_seed(0)
        model = TransformerLM(cfg).to(device)
        title += " (random weights)"
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    if compile:
        check_compilable(model, f"--compile: {title}")
    res = bench_decode(model, batch, prompt_len, new_tokens, repeats, device, compile=compile)
    res.update(model=title, params=model.num_params())
    return res


def format_decode_benchmark(res: dict, batch: int, prompt_len: int, new_tokens: int, repeats: int) -> str:
    """The lines ``lmlab bench decode`` prints for :func:`decode_benchmark`'s result."""
    return "\n".join(
        [
            f"lmlab bench decode: {res['model']}, {res['params']:,} params, {res['dtype'].replace('torch.', '')} on "
            f"{res['device']}"
            + (
                f" ({plural(res['threads'], 'thread')}, {res['decode_layout']} weights)"
                if res["device"] == "cpu"
                else ""
            )
            + ("" if res["lean_decode"] else " (ordinary block path: no lean one-token decode for this config)")
            + (", compiled decode step" if res["compiled"] else "")
            + f"; greedy, batch {batch}, prompt {prompt_len} tokens, {new_tokens} new tokens, median of {repeats}",
            f"  prefill {res['prefill_tokens_per_s']:>12,.0f} tokens/s   ({res['prefill_s'] * 1e3:.2f} ms for "
            f"{batch} x {plural(prompt_len, 'token')})",
            f"  decode  {res['decode_tokens_per_s']:>12,.0f} tokens/s   ({res['decode_s_per_step'] * 1e3:.2f} ms per "
            f"step of {batch} token{'s' if batch > 1 else ''})",
            f"  whole call {res['call_s'] * 1e3:.1f} ms ({res['call_tokens_per_s']:,.0f} new tokens/s); the first "
            "call on the model, which also lays out its weights for decoding"
            + (" and compiles the step" if res["compiled"] else "")
            + f", {res['first_call_s'] * 1e3:.1f} ms",
        ]
    )


# --- training throughput (`lmlab bench train`) ---------------------------------------------------
def train_benchmark(
    cfg,
    title: Optional[str],
    device: torch.device,
    batch: int,
    dtypes: list[str],
    compile_: bool,
    rounds: int,
    steps: int,
) -> dict:
    """``lmlab bench train``: the training step of ``lmlab train`` (the chunked loss, its AdamW, this
    machine's kernels) for ``cfg`` (None: the demo config) at ``batch`` x ``context_length`` tokens,
    in each precision of ``dtypes`` (fp32, bf16: autocast), eager and, with ``compile_``, compiled
    whole (``torch.compile``; its first step's seconds reported as ``compile_s``). Every variant is
    built once and warmed up, then timed in ``rounds`` rounds of ``steps`` steps in an order rotated
    per round. Returns {model, params, device, threads, batch, context, machine, variants: {name:
    {s_per_step (median), tokens_per_s, vs_first (median of per-round ratios to the first variant's
    step time: > 1 is faster) with q1/q3}}}. Raises ConfigError for a model that would not fit."""

    if cfg is None:
        cfg, title = ModelConfig.from_dict(load_mapping(BUILTIN_CONFIGS / "demo.yaml")["model"]), "the demo config"
    check_memory(cfg, device, 1, batch, 2 if dtypes == ["bf16"] else 4)
    T = cfg.context_length
    variants, compile_s = {}, {}
    for dtype in dtypes:
        for compiled in (False, True) if compile_ else (False,):
            name = f"{dtype} {'compiled' if compiled else 'eager'}"
            run, params = step_timer(
                cfg, batch, T, torch.bfloat16 if dtype == "bf16" else None, device, compiled=compiled
            )
            first = run(1)
            if compiled:
                compile_s[name] = first
            run(1)  # warm-up
            variants[name] = run
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(variants[name](steps))
    out = {}
    for name in names:
        ratios = sorted(a / b for a, b in zip(times[names[0]], times[name]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        s = statistics.median(times[name])
        out[name] = {
            "s_per_step": s,
            "tokens_per_s": batch * T / s,
            "vs_first": statistics.median(ratios),
            "vs_first_q1": q[0],
            "vs_first_q3": q[2],
            "compile_s": compile_s.get(name),
        }
    return {
        "model": title,
        "params": params,
        "device": str(device),
        "threads": current_threads() if device.type == "cpu" else None,
        "batch": batch,
        "context": T,
        "rounds": rounds,
        "steps": steps,
        "machine": describe_machine(device),
        "date": time.strftime("%Y-%m-%d"),
        "variants": out,
    }


def format_train_benchmark(res: dict) -> str:
    """The lines ``lmlab bench train`` prints for :func:`train_benchmark`'s result."""
    first = next(iter(res["variants"]))
    lines = [
        f"lmlab bench train: {res['model']}, {res['params']:,} params, batch {res['batch']} x {res['context']} "
        f"tokens on {res['device']}; median of {res['rounds']} rounds of {plural(res['steps'], 'step')}"
        + (", variants alternated" if len(res["variants"]) > 1 else ""),
        f"  machine: {res['machine']}; {res['date']}",
    ]
    for name, v in res["variants"].items():
        rel = (
            ""
            if name == first
            else (f"   {v['vs_first']:.2f}x {first} (IQR {v['vs_first_q1']:.2f}-{v['vs_first_q3']:.2f})")
        )
        comp = f"   (first step compiles: {v['compile_s']:.1f} s)" if v["compile_s"] is not None else ""
        lines.append(
            f"  {name:<14} {v['tokens_per_s']:>10,.0f} tokens/s  {v['s_per_step'] * 1e3:8.1f} ms/step" + rel + comp
        )
    return "\n".join(lines)
