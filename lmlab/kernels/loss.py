"""The training loss: next-token cross-entropy (nats) with the optional z-loss.

Two ways to compute the same numbers:
- :func:`lm_loss` from logits (batch, seq, vocab) that the caller materialised (evaluation, HF parity);
- :func:`linear_cross_entropy` from the final hidden states and the LM head's weight, chunk by chunk
  over the rows, never holding the (tokens, vocab) logits, their log-softmax or their gradient at once.
  Each chunk's logits are made, reduced to the loss and turned into their gradient while they are in
  cache; the gradients for the hidden states and the head's weight are accumulated during the forward
  pass and scaled by the incoming gradient in backward. This is the "fused linear cross-entropy" of
  Liger Kernel (Hsu et al. 2024, arXiv:2410.10989) and of Wijmans et al. 2024 ("Cut your losses",
  arXiv:2411.09009), written on torch matmuls. lmlab's training step uses it (``TransformerLM.forward``
  with ``targets``).

z-loss: z_loss * (log Z)^2 per scored token, log Z = logsumexp of the logits (PaLM, Chowdhery et al.
2022, section 5). Final-logit soft-cap: cap * tanh(logits / cap) (Gemma 2) before the softmax.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from lmlab.kernels.linear import grad_input, linear, onednn_grad_weight, uses_onednn

IGNORE = -100  # target id that is not scored (padding, document masks)


def lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0, reduction: str = "mean"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy in nats, computed in fp32, plus the z-loss z_loss * (log Z)^2.

    logits: (batch, seq, vocab); targets: (batch, seq) ids, -100 ignored.
    Returns (loss to optimise, cross-entropy without the z-loss, detached) with ``reduction`` 'mean'
    (per scored token) or 'sum'.
    """
    logits = logits.float().flatten(0, 1)
    targets = targets.flatten()
    ce = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction=reduction)
    if not z_loss:
        return ce, ce.detach()
    keep = targets != IGNORE
    log_z = torch.logsumexp(logits[keep], dim=-1)
    z = log_z.pow(2).sum()
    if reduction == "mean":
        z = z / keep.sum().clamp(min=1)
    return ce + z_loss * z, ce.detach()


def chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk of :func:`linear_cross_entropy`: 2^20 fp32 logits (4 MiB) on CPU, 2^25 (128 MiB)
    on a GPU (few, large matmuls); the chunk sizes measured: docs/bench/measured-choices.md."""
    budget = 2**25 if device.type == "cuda" else 2**20  # fp32 elements
    return max(16, budget // max(vocab_size, 1))


class _LinearCrossEntropy(torch.autograd.Function):
    """Sums over the scored rows of (cross-entropy + z-loss) and of cross-entropy alone, with the
    gradients for ``h`` (rows, d) and ``weight`` (vocab, d) (and ``bias``) made in forward."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, z_loss, cap, chunk, compute_dtype, onednn):
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        acc = torch.promote_types(compute_dtype, torch.float32)  # softmax and sums: fp32 (fp64 stays)
        w = weight.to(compute_dtype)
        b = None if bias is None else bias.to(acc)
        hc_all = h.to(compute_dtype)
        keep = targets != IGNORE
        safe = targets.clamp(min=0)
        total = torch.zeros((), dtype=acc, device=h.device)
        ce_total = torch.zeros((), dtype=acc, device=h.device)
        grad_h = torch.empty(h.shape, dtype=acc, device=h.device) if want_grad else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=h.device) if want_grad else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=h.device) if (want_grad and bias is not None) else None
        for s in range(0, h.shape[0], chunk):
            hc, yc, kc = hc_all[s : s + chunk], safe[s : s + chunk], keep[s : s + chunk]
            logits = linear(hc, w, onednn=onednn).to(acc)
            if b is not None:
                logits += b
            tanh = None
            if cap is not None:
                tanh = torch.tanh(logits / cap)
                logits = tanh * cap
            lse = torch.logsumexp(logits, dim=-1)
            ce_rows = (lse - logits.gather(1, yc[:, None]).squeeze(1)) * kc
            ce_total += ce_rows.sum()
            total += ce_rows.sum()
            if z_loss:
                total += z_loss * (lse.pow(2) * kc).sum()
            if not want_grad:
                continue
            # d(ce + z lse^2)/d logits = softmax * (1 + 2 z lse) - onehot(target); zero for ignored rows
            g = logits.sub_(lse[:, None]).exp_()
            scale = kc.to(acc)
            if z_loss:
                scale = scale * (1 + 2 * z_loss * lse)
            g.mul_(scale[:, None])
            g.scatter_add_(1, yc[:, None], -kc.to(acc)[:, None])
            if tanh is not None:  # through cap * tanh(x / cap): times 1 - tanh^2
                g.mul_(1 - tanh.pow_(2))
            if grad_b is not None:
                grad_b += g.sum(0)
            gc = g.to(compute_dtype)
            grad_h[s : s + chunk] = grad_input(gc, w, onednn)
            if uses_onednn(hc, gc, onednn):  # fp32 on oneDNN: its product, then the sum
                grad_w += onednn_grad_weight(gc, hc)
            elif gc.dtype == acc:
                grad_w.addmm_(gc.t(), hc)
            else:
                grad_w += (gc.t() @ hc).to(acc)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (h.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total, ce_total

    @staticmethod
    def backward(ctx, grad_total, grad_ce):
        # only the first output is differentiated by the caller; the second is reported, detached
        grad_h, grad_w, grad_b = ctx.saved_tensors
        h_dtype, w_dtype, b_dtype = ctx.dtypes
        gh = None if grad_h is None or not ctx.needs_input_grad[0] else (grad_h * grad_total).to(h_dtype)
        gw = None if grad_w is None or not ctx.needs_input_grad[1] else (grad_w * grad_total).to(w_dtype)
        gb = None if grad_b is None or not ctx.needs_input_grad[2] else (grad_b * grad_total).to(b_dtype)
        return gh, gw, gb, None, None, None, None, None, None


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    z_loss: float = 0.0,
    softcap_value: Optional[float] = None,
    reduction: str = "mean",
    chunk: Optional[int] = None,
    onednn: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy (nats) of the logits h @ weight.T (+ bias, soft-capped) against ``targets``,
    without materialising the logits: the same values and gradients as
    ``lm_loss(softcap(h @ weight.T + bias), targets, z_loss, reduction)`` (to fp32 rounding).

    h: (batch, seq, d) or (rows, d); weight: (vocab, d); bias: (vocab,) or None; targets: h's leading
    shape, ids in [0, vocab) or -100 (not scored). Under autocast the matmuls run in the autocast
    dtype, the softmax in fp32. ``chunk``: rows per chunk (default :func:`chunk_rows`). ``onednn``: fp32
    products on oneDNN (the model's :attr:`KernelSettings.onednn_fp32`; :mod:`lmlab.kernels.linear`).
    Returns (loss to optimise, cross-entropy without the z-loss, detached), summed or averaged over
    the scored tokens (``reduction`` 'sum' | 'mean').
    Raises ValueError for an unknown ``reduction`` or shapes that do not match.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction={reduction!r}: expected 'sum' or 'mean'")
    d = weight.shape[1]
    if h.shape[-1] != d or h.shape[:-1] != targets.shape:
        raise ValueError(
            f"h {tuple(h.shape)}, weight {tuple(weight.shape)}, targets {tuple(targets.shape)}: "
            f"expected h (..., {d}) and targets of h's leading shape"
        )
    rows, flat_t = h.reshape(-1, d), targets.reshape(-1)
    device_type = h.device.type
    compute = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else h.dtype
    with torch.autocast(device_type, enabled=False):
        total, ce = _LinearCrossEntropy.apply(
            rows,
            weight,
            bias,
            flat_t,
            float(z_loss),
            softcap_value,
            chunk or chunk_rows(weight.shape[0], h.device),
            compute,
            bool(onednn),
        )
    if reduction == "mean":
        n = (flat_t != IGNORE).sum().clamp(min=1)
        total, ce = total / n, ce / n
    return total, ce.detach()
