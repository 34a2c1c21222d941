"""Held-out evaluation: loss (nats/token), perplexity and bits-per-byte.

Bits-per-byte = (total negative log-likelihood in nats / ln 2) / (UTF-8 bytes of the text scored).
It does not depend on the tokenizer, so runs with different tokenizers compare on it (a BPE model
spreads the same information over fewer, harder tokens). Every token of the stream after the first
(the leading end-of-text token, context only) is scored exactly once: the stream is cut into chunks of
``stride`` targets, each predicted from a window of at most ``context_length`` preceding tokens; no
target is scored twice through overlapping windows and none is skipped at window edges. The
end-of-text tokens between documents are scored too (they carry no bytes, so this is conservative).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from lmlab.kernels.loss import chunk_rows
from lmlab.model import TransformerLM


def windows(n_tokens: int, context_length: int, stride: Optional[int] = None) -> list[tuple[int, int, int]]:
    """Evaluation windows over a stream of ``n_tokens``: a list of (start, a, b) meaning inputs
    ``tokens[start : b-1]`` score targets ``tokens[a:b]``. Targets 1..n_tokens-1 appear exactly once.
    Raises ValueError for a stride outside [1, context_length]."""
    stride = stride or context_length
    if not 1 <= stride <= context_length:
        raise ValueError(f"stride={stride} must be in [1, context_length={context_length}]")
    out = []
    a = 1
    while a < n_tokens:
        b = min(a + stride, n_tokens)
        out.append((max(0, b - 1 - context_length), a, b))
        a = b
    return out


def _nll(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each target's cross-entropy (nats, fp32, flattened) for inputs ``x`` and targets ``y`` (batch, seq). A
    plain :class:`TransformerLM` (no forward hooks: not an FSDP-sharded or hooked model, which must be
    called whole) runs its blocks once, then its LM head and the loss a block of rows at a time (some 2^20
    logits on a CPU, :func:`lmlab.kernels.loss.chunk_rows`), each block's loss taken while its logits are in
    cache rather than after a batch's logits were all written out: the same numbers as
    ``cross_entropy(model(x))``, which any other module gets (docs/bench/eval_nll.md)."""
    y = y.flatten()
    if not isinstance(model, TransformerLM) or model._forward_pre_hooks or model._forward_hooks:
        return F.cross_entropy(model(x).float().flatten(0, 1), y, reduction="none")
    h = model.hidden(x).flatten(0, 1)
    rows = chunk_rows(model.cfg.vocab_size, h.device)
    return torch.cat(
        [F.cross_entropy(model.logits(hb), yb, reduction="none") for hb, yb in zip(h.split(rows), y.split(rows))]
    )


@torch.no_grad()
def evaluate(
    model: TransformerLM,
    tokens: np.ndarray,
    n_bytes: int,
    batch_size: int = 16,
    stride: Optional[int] = None,
    device: str | torch.device = "cpu",
    max_windows: Optional[int] = None,
    autocast_dtype: Optional[torch.dtype] = None,
    by_position: bool = False,
) -> dict:
    """Score ``tokens`` (1-D ids) with ``model``. Returns a dict with ``loss`` (nats/token),
    ``perplexity``, ``bits_per_byte``, ``nll_nats`` (total), ``tokens`` (scored) and ``bytes``.

    ``by_position``: also ``loss_by_position``, a list of ``context_length`` mean losses (nats/token):
    entry j averages the targets predicted from j + 1 tokens of context, over the windows that score
    all their targets (with the default stride every window but a short last one); the figure of loss against
    context position that shows what a sliding window or a short receptive field gives up.

    ``max_windows`` scores only that many windows, evenly spread over the split (a quick estimate
    during training); then ``bytes`` is prorated by the fraction of tokens scored and the figures are marked
    ``partial``.
    """
    was_training = model.training
    model.eval()
    T = model.cfg.context_length
    wins = windows(len(tokens), T, stride)
    partial = max_windows is not None and max_windows < len(wins)
    if partial:  # evenly spread over the split, so the estimate is not biased to its first document
        wins = [wins[i] for i in np.linspace(0, len(wins) - 1, max_windows).round().astype(int)]
    total_nll, scored = 0.0, 0
    pos_sum = torch.zeros(T, dtype=torch.float64)
    pos_n = 0
    # group windows of equal input length so they batch
    by_len: dict[int, list] = {}
    for w in wins:
        by_len.setdefault(w[2] - 1 - w[0], []).append(w)
    for length, group in by_len.items():
        for i in range(0, len(group), batch_size):
            chunk = group[i : i + batch_size]
            x = torch.from_numpy(np.stack([np.asarray(tokens[s : b - 1], dtype=np.int64) for s, _, b in chunk])).to(
                device
            )
            y = torch.from_numpy(np.stack([np.asarray(tokens[s + 1 : b], dtype=np.int64) for s, _, b in chunk])).to(
                device
            )
            with torch.autocast(
                torch.device(device).type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
            ):
                nll = _nll(model, x, y).view(len(chunk), length)
            for row, (s, a, b) in enumerate(chunk):  # score only this window's new targets a..b-1
                total_nll += float(nll[row, a - 1 - s :].sum(dtype=torch.float64))
                scored += b - a
                if by_position and length == T and a - 1 == s:  # a full window, every target scored
                    pos_sum += nll[row].double().cpu()
                    pos_n += 1
    model.train(was_training)
    if partial:
        n_bytes = n_bytes * scored / max(1, len(tokens) - 1)
    loss = total_nll / max(scored, 1)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_byte": total_nll / math.log(2) / n_bytes,
        "nll_nats": total_nll,
        "tokens": scored,
        "bytes": n_bytes,
        "partial": partial,
        **({"loss_by_position": (pos_sum / pos_n).tolist() if pos_n else None} if by_position else {}),
    }
