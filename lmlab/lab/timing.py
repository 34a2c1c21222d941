"""The timing block of a spec: speed claims measured apart from training, interleaved in one process.

Training throughput on a shared machine is not a speed measurement: two seeds of one config differ by
10-26% on a busy 2-core CPU. A spec's ``timing:`` block instead builds each variant's untrained model
once and times them in *rounds*: every round measures each variant once, in an order rotated from round
to round, so slow phases of the machine hit every variant alike. One measurement is the mean wall time
of ``steps`` training steps (forward + backward + AdamW step; seconds per step) on a fixed random batch
of ``batch`` x ``context`` tokens after one untimed warm-up round; with ``decode: true`` also the time
of one greedy KV-cache decode step at ``decode_batch`` x ``decode_context`` (:mod:`lmlab.bench`), and the
same model's decode step at a short cache (``decode_short_s``: from a one-token prompt for
:data:`SHORT_DECODE_STEPS` steps, or ``decode_steps``), from which the claims' mechanism check reads how
much of a decode step the cache's reads are (:func:`kv_share`).
Ratios are taken per round (variant / baseline in the same round) and summarised by their median and
a distribution-free interval (:func:`lmlab.lab.stats.median_interval`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
from typing import Callable, Optional

import torch

from lmlab import bench
from lmlab.config import ConfigError, ModelConfig
from lmlab.lab.stats import median_interval
from lmlab.model import TransformerLM
from lmlab.threads import current_threads, set_threads

SHORT_DECODE_STEPS = 64  # the short-cache decode: steps from a one-token prompt (``decode_steps`` if smaller)


def kv_share(block: dict, label: str) -> Optional[float]:
    """The share of ``label``'s decode step that grows with the cache: 1 - median(short-cache step) /
    median(full-cache step), from a timing block (:func:`time_variants`); None without both timings.
    Reading a KV cache costs time in proportion to its length, so this bounds what a smaller cache can
    save (a lower bound of the cache's share: the short cache is not empty). Near 0: the step is bound by
    something else (kernel launches, weights, Python), and a claim that a smaller cache decodes faster
    cannot show."""
    short, full = (block.get("decode_short_s") or {}).get(label), (block.get("decode_s") or {}).get(label)
    if not short or not full:
        return None
    return 1.0 - statistics.median(short) / statistics.median(full)


def _decode_timer(
    cfg: ModelConfig,
    batch: int,
    context: int,
    device: torch.device,
    seed: int = 0,
    decode_steps: Optional[int] = None,
) -> Callable[[], float]:
    """A closure timing greedy KV-cache decoding of an untrained ``TransformerLM(cfg)`` from a prompt
    of context // 2 tokens to ``context`` tokens (with ``decode_steps``: from context - decode_steps + 1,
    the last steps of a full cache); returns seconds per decode step (median of one call).
    A ``context`` beyond cfg.context_length (decode made long enough for the KV cache, not the weights,
    to dominate memory traffic) times the same architecture built with that context_length; learned
    absolute positions would then get a larger table, so they raise ConfigError instead."""

    if context > cfg.context_length:
        if cfg.position == "learned":
            raise ConfigError(
                f"timing.decode_context={context} exceeds context_length={cfg.context_length} "
                f"with learned positions (the position table would change); use at most "
                f"{cfg.context_length}"
            )
        cfg = dataclasses.replace(cfg, context_length=context)
    torch.manual_seed(seed)
    model = TransformerLM(cfg).to(device).eval()
    prompt_len = max(1, context // 2 if decode_steps is None else context - decode_steps + 1)
    new_tokens = max(2, context - prompt_len + 1)
    prompts = bench.random_prompts(cfg.vocab_size, batch, prompt_len, seed)

    def run() -> float:
        res = bench.bench_decode(
            model,
            batch=batch,
            prompt_len=prompt_len,
            new_tokens=new_tokens,
            repeats=1,
            device=device,
            prompts=prompts,
        )
        return res["decode_s_per_step"]

    return run


def time_variants(
    cfgs: dict[str, ModelConfig],
    batch: int,
    context: Optional[int] = None,
    pairs: int = 15,
    steps: int = 3,
    dtype: Optional[torch.dtype] = None,
    device: str | torch.device = "cpu",
    threads: Optional[int] = None,
    decode: bool = False,
    decode_batch: int = 8,
    decode_context: Optional[int] = None,
    log: Callable[[str], None] = lambda s: None,
    decode_steps: Optional[int] = None,
) -> dict:
    """Interleaved step-time (and decode-step-time) measurements of the models ``cfgs`` (label ->
    ModelConfig), ``pairs`` rounds after one warm-up round (see the module docstring).

    Returns {"step_s": {label: [seconds per step, one per round]}, "decode_s": {...} and
    "decode_short_s": {...} (with ``decode``; the short cache: see the module docstring),
    "rounds", "batch", "context", "steps", "threads", "dtype", "device", "load_avg": [1-min load average
    before and after]}. ``context`` defaults to each model's context_length."""
    device = torch.device(device)
    before = current_threads()
    if threads:
        set_threads(threads)
    labels = list(cfgs)
    try:
        from lmlab.bench import step_timer

        step_s = {k: step_timer(c, batch, context or c.context_length, dtype, device)[0] for k, c in cfgs.items()}
        timers = {"step_s": {k: functools.partial(run, steps) for k, run in step_s.items()}}
        if decode:
            timers["decode_s"] = {
                k: _decode_timer(c, decode_batch, decode_context or c.context_length, device, decode_steps=decode_steps)
                for k, c in cfgs.items()
            }
            n = min(SHORT_DECODE_STEPS, decode_steps or SHORT_DECODE_STEPS)
            timers["decode_short_s"] = {  # the mechanism check: the same step at a cache of at most n entries
                k: _decode_timer(
                    dataclasses.replace(c, context_length=max(c.context_length, decode_context or 0)),
                    decode_batch,
                    n,
                    device,
                    decode_steps=n,
                )
                for k, c in cfgs.items()
            }
        out: dict = {kind: {k: [] for k in labels} for kind in timers}
        load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        for r in range(pairs + 1):  # round 0 warms every model up and is not recorded
            order = labels[r % len(labels) :] + labels[: r % len(labels)]
            for kind, ts in timers.items():
                for k in order:
                    t = ts[k]()
                    if r:
                        out[kind][k].append(t)
            if r:
                log(
                    f"timing round {r}/{pairs}: "
                    + ", ".join(f"{k} {1e3 * out['step_s'][k][-1]:.1f} ms" for k in labels)
                )
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        out.update(
            rounds=pairs,
            batch=batch,
            context=context,
            steps=steps,
            threads=torch.get_num_threads(),
            dtype=str(dtype or "fp32").replace("torch.", ""),
            device=str(device),
            load_avg=[load0, load1],
        )
        if decode:
            out["decode_short_steps"] = n
        return out
    finally:
        set_threads(before)


def round_ratios(times: dict, a: str, b: str) -> list[float]:
    """Per-round ratios times[b] / times[a] (``times``: label -> seconds per round)."""
    return [tb / ta for ta, tb in zip(times[a], times[b])]


def summarize_ratio(times: dict, a: str, b: str, confidence: float = 0.95) -> dict:
    """Median of the per-round ratios b / a with its distribution-free interval and the spread
    (interquartile range): {median, lo, hi, n, coverage, q1, q3}."""

    ratios = round_ratios(times, a, b)
    out = median_interval(ratios, confidence)
    qs = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    out.update(q1=qs[0], q3=qs[2])
    return out
