"""Sampling with a KV cache: greedy (temperature 0), temperature, top-k, top-p (nucleus; Holtzman et
al. 2020), seeded.

At ``context_length``: the model never attends over more than ``context_length`` tokens. The prompt
must fit in it (else ValueError). When prompt + generated tokens fill the window, the cache is
rebuilt from the last ``context_length // 2`` tokens (positions restart at 0) and decoding goes on;
so generation can run past context_length, at the cost of one prefill every context_length/2 tokens,
and each new token sees between context_length/2 and context_length tokens of context.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from lmlab.model import KVCache, TransformerLM


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Pick next tokens from logits (batch, vocab) -> ids (batch,).

    temperature 0 is greedy (argmax). top_k keeps the k largest logits; top_p keeps the smallest set
    of tokens whose probability reaches p (always at least the most likely one). Raises ValueError
    for temperature < 0, top_k < 1 or top_p outside (0, 1].
    """
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly better-ranked tokens
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: TransformerLM, prompt: list[int], max_new_tokens: int, temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
             eos_id: Optional[int] = None, device: str | torch.device = "cpu") -> Iterator[int]:
    """Yield up to ``max_new_tokens`` token ids continuing ``prompt`` (a non-empty list of ids), one
    at a time; stops early at ``eos_id``. Raises ValueError for an empty prompt or one longer than
    ``context_length`` (see the module docstring for what happens when the window fills)."""
    T = model.cfg.context_length
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    if len(prompt) > T:
        raise ValueError(f"the prompt has {len(prompt)} tokens, more than context_length={T}; shorten it")
    model.eval()
    gen = torch.Generator(device=device)
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()
    dtype = next(model.parameters()).dtype
    history = list(prompt)
    cache = KVCache(model.cfg, 1, T, device=device, dtype=dtype)
    logits = model(torch.tensor([history], device=device), cache)[:, -1]
    for _ in range(max_new_tokens):
        nxt = int(sample_next(logits, temperature, top_k, top_p, gen)[0])
        yield nxt
        if eos_id is not None and nxt == eos_id:
            return
        history.append(nxt)
        if cache.length == T:  # window full: keep the last half, re-encode from position 0
            keep = history[-(T // 2):]
            cache = KVCache(model.cfg, 1, T, device=device, dtype=dtype)
            logits = model(torch.tensor([keep], device=device), cache)[:, -1]
        else:
            logits = model(torch.tensor([[nxt]], device=device), cache)[:, -1]
