"""Causal softmax attention in row blocks, for training on CPU: the same function as
``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, faster there at short contexts.

Queries are taken ``block`` rows at a time; block i attends only to keys 0 .. end of block i, so the
key blocks above the diagonal (almost half of the T x T scores) are never computed, and each block's
scores, softmax and products are large batched matmuls (``torch.bmm`` over batch x heads) instead of
the per-head tiles of SDPA's CPU flash kernel, which at head_dim 32 run far below the matmul rate.
Forward keeps each block's probabilities P (the compute dtype) for backward; backward is the standard
one (Dao et al. 2022, FlashAttention, Appendix B.2): dV = P^T dO, dP = dO V^T,
dS = P * (dP - rowsum(dO * O)), dQ = dS K * scale, dK = dS^T Q * scale, with dK and dV accumulated in
fp32. Scores and softmax are fp32 whatever the input dtype (bf16 under autocast). The loops run
eager, or, inside a compiled model, traced into the model's graph, where inductor fuses each block's
elementwise work (see :func:`blocked_causal_attention`).

The saved probabilities cost batch x heads x T (T + block) / 2 elements per layer (SDPA saves only O
and the log-sum-exp), so :func:`use_blocked` keeps SDPA where they would exceed ``MAX_SAVED_BYTES`` or
the context exceeds ``MAX_CONTEXT``, in fp32 unless this CPU's calibration chose the blocked loops
(``KernelSettings.blocked_attention_fp32``) or with more than one thread, and on GPUs (whose SDPA
kernels are the fast path). The measurements
behind these choices, with their CPUs and dates: docs/bench/measured-choices.md ("Blocked causal
attention").
"""

from __future__ import annotations

import torch

BLOCK = 64  # query rows per block (measured: docs/bench/measured-choices.md)
MAX_CONTEXT = 1024
MAX_SAVED_BYTES = 256 * 2**20


def _threads() -> int:
    """torch's intra-op thread count; a constant of the graph when a compiled model asks (a graph break
    otherwise): a model compiled at one thread count keeps its choice if the count changes later."""
    return torch.get_num_threads()


# what @torch.compiler.assume_constant_result sets, without importing torch._dynamo (1.5 s) at import:
# tests/test_fork_server.py checks that the mark equals torch's own decorator's
_threads._dynamo_marked_constant = True


def use_blocked(q: torch.Tensor, blocked_fp32: bool) -> bool:
    """Whether :func:`blocked_causal_attention` should run q (batch, heads, T, head_dim) in training:
    on CPU, T <= MAX_CONTEXT, the saved probabilities within MAX_SAVED_BYTES, and q in bf16/fp16 or
    torch running one thread (fp32 on one thread only with ``blocked_fp32``, the model's
    :attr:`KernelSettings.blocked_attention_fp32`, chosen by ``lmlab bench calibrate``).
    In fp32 on 2 threads the whole GPT-2-recipe step measured slower with it
    (505 vs 445 ms, eager loops, bench/train_step_gains.py), as SDPA's kernel parallelises better
    there; with the fused loops in one compiled graph (2026-12-03, in one process, alternated, sdpa /
    blocked step time) 0.98x LLaMA recipe, 1.03x GPT-2, 0.97x demo: no gain, so the rule stays.
    The thread count is read once per compiled graph (:func:`_threads`)."""
    B, H, T, _ = q.shape
    saved = B * H * T * (T + BLOCK) // 2 * q.element_size()
    low_precision_or_one_thread = q.dtype != torch.float32 or (blocked_fp32 and _threads() == 1)
    return q.device.type == "cpu" and 1 < T <= MAX_CONTEXT and saved <= MAX_SAVED_BYTES and low_precision_or_one_thread


def _forward_fused(q, k, v, scale: float, block: int):
    """The forward loop as inductor fuses it (traced into the compiled model's graph): per block the
    score cast, scale, causal mask (from indices) and softmax are one C++ kernel. q, k, v:
    (batch, heads, T, head_dim), one dtype. Returns (out, q3, k3, v3, probs): out and q3, k3, v3
    (batch*heads, T, head_dim), probs the per-block probabilities (batch*heads, rows, keys) in q's dtype."""
    B, H, T, D = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    q3, k3, v3 = (t.reshape(B * H, T, D) for t in (q, k, v))
    outs, probs = [], []
    for r0 in range(0, T, block):
        r1 = min(r0 + block, T)
        s = torch.bmm(_rows(q3, r0, r1), _rows(k3, 0, r1).transpose(1, 2)).to(acc) * scale
        rows = torch.arange(r0, r1, device=q.device)[:, None]
        cols = torch.arange(r1, device=q.device)[None, :]
        p = torch.softmax(s.masked_fill(cols > rows, float("-inf")), dim=-1).to(q.dtype)
        outs.append(torch.bmm(p, _rows(v3, 0, r1)))
        probs.append(p)
    return torch.cat(outs, dim=1), q3, k3, v3, probs


def _backward_fused(do, q3, k3, v3, out, probs, scale: float, block: int):
    """The backward loop as inductor fuses it (the same equations as _BlockedCausal.backward; the
    dS = P * (dP - rowsum(dO * O)) * scale step is one kernel). do: (batch*heads, T, head_dim) in q3's
    dtype. Returns dq, dk, dv (batch*heads, T, head_dim) in q3's dtype."""
    T = q3.shape[1]
    acc = torch.promote_types(q3.dtype, torch.float32)
    delta = (do.to(acc) * out.to(acc)).sum(-1)
    dqs, dks, dvs = [], [], []
    for i, r0 in enumerate(range(0, T, block)):
        r1 = min(r0 + block, T)
        p, do_i, q_i = probs[i], _rows(do, r0, r1), _rows(q3, r0, r1)
        dp = torch.bmm(do_i, _rows(v3, 0, r1).transpose(1, 2)).to(acc)
        ds = ((dp - delta[:, r0:r1, None]) * p.to(acc) * scale).to(q3.dtype)
        dqs.append(torch.bmm(ds, _rows(k3, 0, r1)))
        dvs.append(torch.bmm(p.transpose(1, 2), do_i))  # keys :r1
        dks.append(torch.bmm(ds.transpose(1, 2), q_i))
    return torch.cat(dqs, dim=1), _sum_padded(dks, T, acc), _sum_padded(dvs, T, acc)


def _rows(t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows r0:r1 of t (batch*heads, T, head_dim) as a contiguous tensor, for ``torch.bmm``. oneDNN's
    batched product (what bmm runs in bf16) takes a 3-D operand as it is only when it is contiguous or
    the transpose of a contiguous tensor; a row slice of t is neither (its batch stride stays T x
    head_dim), and bmm then copies it itself (``aten::contiguous``, a strided copy, transposing for a
    ``.transpose(1, 2)`` operand). Asked for here, inside the compiled graph, the copy is inductor's
    (vectorised, or fused into the kernel that produced t), and the transposed operand is a plain view.
    ``as_strided`` pins the copy's layout: inductor lowers ``contiguous()`` to a copy whose layout it
    chooses itself, and chose the producer's for the dO blocks (batch stride head_dim), which bmm copied
    again (measured: docs/bench/measured-choices.md)."""
    part = t[:, r0:r1]
    if r1 - r0 == t.shape[1]:
        return part
    n, rows, d = part.shape
    return torch.as_strided(part.contiguous(), (n, rows, d), (rows * d, d, 1))


def _sum_padded(parts, T: int, acc: torch.dtype) -> torch.Tensor:
    """Sum the blocks' contributions to dK (or dV), each (batch*heads, keys :r1, head_dim) for a
    growing r1, as zero-padded to T keys, in ``acc`` (fp32); returns (batch*heads, T, head_dim) in the
    parts' dtype. Written as one sum of pads, which inductor fuses into one kernel with one masked load
    per part: the in-place form ``dk[:, :r1] += part`` lowers to nested slice_scatters whose kernel
    reloaded each part once per level (1,600 lines of C++; docs/bench/measured-choices.md)."""
    total = None
    for part in parts:
        padded = torch.nn.functional.pad(part.to(acc), (0, 0, 0, T - part.shape[1]))
        total = padded if total is None else total + padded
    return total.to(parts[0].dtype)


class _BlockedCausal(torch.autograd.Function):
    """The blocked attention with its own backward. fused=False: the eager loops (in-place ops and
    ``out=`` products, fastest op by op); fused=True: :func:`_forward_fused` / :func:`_backward_fused`,
    functional code that Dynamo traces into the compiled model's graph (forward and backward)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, block, fused):
        B, H, T, D = q.shape
        ctx.meta = (B, H, T, D, scale, block, fused)
        if fused:
            out, q3, k3, v3, probs = _forward_fused(q, k, v, scale, block)
            ctx.save_for_backward(q3, k3, v3, out, *probs)
            return out.view(B, H, T, D)
        acc = torch.promote_types(q.dtype, torch.float32)
        q3, k3, v3 = (t.reshape(B * H, T, D) for t in (q, k, v))
        out = torch.empty_like(q3)
        above = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)
        probs = []
        for r0 in range(0, T, block):
            r1 = min(r0 + block, T)
            s = torch.bmm(q3[:, r0:r1], k3[:, :r1].transpose(1, 2)).to(acc).mul_(scale)
            s[:, :, r0:r1].masked_fill_(above[: r1 - r0, : r1 - r0], float("-inf"))
            p = torch.softmax(s, dim=-1).to(q.dtype)
            torch.bmm(p, v3[:, :r1], out=out[:, r0:r1])
            probs.append(p)
        ctx.save_for_backward(q3, k3, v3, out, *probs)
        return out.view(B, H, T, D)

    @staticmethod
    def backward(ctx, grad_out):
        q3, k3, v3, out, *probs = ctx.saved_tensors
        B, H, T, D, scale, block, fused = ctx.meta
        shape = (B, H, T, D)
        do = grad_out.reshape(B * H, T, D).to(q3.dtype)
        if fused:
            dq, dk, dv = _backward_fused(do, q3, k3, v3, out, probs, scale, block)
            return dq.view(shape), dk.view(shape), dv.view(shape), None, None, None
        acc = torch.promote_types(q3.dtype, torch.float32)
        dq = torch.empty_like(q3)
        dk = torch.zeros(q3.shape, dtype=acc, device=q3.device)
        dv = torch.zeros(q3.shape, dtype=acc, device=q3.device)
        delta = (do.to(acc) * out.to(acc)).sum(-1)  # rowsum(dO * O): (B*H, T)
        for i, r0 in enumerate(range(0, T, block)):
            r1 = min(r0 + block, T)
            p, do_i, q_i = probs[i], do[:, r0:r1], q3[:, r0:r1]
            ds = torch.bmm(do_i, v3[:, :r1].transpose(1, 2)).to(acc)
            ds = ds.sub_(delta[:, r0:r1, None]).mul_(p).mul_(scale).to(q3.dtype)
            torch.bmm(ds, k3[:, :r1], out=dq[:, r0:r1])
            if acc == q3.dtype:
                dv[:, :r1].baddbmm_(p.transpose(1, 2), do_i)
                dk[:, :r1].baddbmm_(ds.transpose(1, 2), q_i)
            else:
                dv[:, :r1] += torch.bmm(p.transpose(1, 2), do_i)
                dk[:, :r1] += torch.bmm(ds.transpose(1, 2), q_i)
        return dq.view(shape), dk.to(q3.dtype).view(shape), dv.to(q3.dtype).view(shape), None, None, None


def _eager_loops(q, k, v, scale: float, block: int) -> torch.Tensor:
    """The eager loops, outside any compiled graph (a graph break in a compiled model)."""
    return _BlockedCausal.apply(q, k, v, scale, block, False)


def blocked_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, block: int = BLOCK, fused: bool = True
) -> torch.Tensor:
    """Causal attention softmax(q k^T * scale, masked) v in query blocks of ``block`` rows.

    q: (batch, heads, T, head_dim); k, v: (batch, kv_heads, T, head_dim) with kv_heads dividing heads
    (GQA: query head h reads KV head h // (heads / kv_heads), as HF's ``repeat_kv``). Returns
    (batch, heads, T, head_dim) in q's dtype (the autocast dtype under autocast). Raises ValueError
    on shapes that do not match.

    Called eagerly it runs the eager loops. Traced by torch.compile (the compiled model's attention)
    it runs :func:`_forward_fused` / :func:`_backward_fused` inside the model's one graph: inductor
    fuses each block's casts, scale, causal mask and softmax into one kernel (the eager loops pass
    over the scores about ten times), and the model has no graph break. ``fused=False``
    (``KernelSettings.fused_loops``) keeps the eager loops in compiled models too (a graph break per
    layer; benches compare; the measurements: docs/bench/measured-choices.md).
    """
    B, H, T, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[2:] != (T, D) or H % k.shape[1]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected k and v "
            "(batch, kv_heads, T, head_dim) with kv_heads dividing q's heads"
        )
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)
        v = v.repeat_interleave(H // v.shape[1], dim=1)
    dtype = q.dtype
    if torch.is_autocast_enabled(q.device.type):
        dtype = torch.get_autocast_dtype(q.device.type)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if torch.compiler.is_compiling() and fused:
            return _BlockedCausal.apply(q, k, v, float(scale), int(block), True)
        if torch.compiler.is_compiling():
            return torch.compiler.disable(_eager_loops)(q, k, v, float(scale), int(block))
        return _eager_loops(q, k, v, float(scale), int(block))
