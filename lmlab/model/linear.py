"""Linear layers whose fp32 matmuls on x86 CPUs run on oneDNN instead of MKL.

PyTorch's CPU build multiplies fp32 matrices with MKL's sgemm, and bf16 ones with oneDNN. On the
project's machine (AMD EPYC with AVX-512, 2 vCPUs; torch 2.13 with MKL 2024.2 and oneDNN 3.12) MKL's
sgemm runs at 85-100 GFLOP/s per core on the shapes of a small LM (2048 rows x 256 x 1024), about half
the core's fp32 FMA peak (2 x 16 fp32 FMA lanes x 2 FLOPs per cycle), while oneDNN's fp32 matmul,
reached through ``torch.ops.mkldnn._linear_pointwise`` (the op Inductor's CPU inference path and
:mod:`lmlab.generate` already use), runs the same products at 200-220 GFLOP/s: 2.2-2.3x faster forward,
2.2x for the input gradient, 1.5-2.0x for the weight gradient (``python bench/linear_backends.py``).
The results are fp32 products with fp32 accumulation (oneDNN's default, strict fp32 math: relative
error 5e-7 against fp64, as MKL's 3e-7), in another summation order.

:class:`Linear` is an ``nn.Linear`` (same parameters, state-dict names and initialisation) whose
forward takes that path when :func:`uses_onednn` says so: a CPU fp32 input of at least
:data:`MIN_ROWS` rows outside autocast (under CPU autocast the matmul is bf16 and already oneDNN's),
and oneDNN available in this PyTorch build on an x86-64 CPU; otherwise it is ``F.linear``. The op
is a ``torch.library`` custom op with its own backward (input and weight gradients on oneDNN too), so
``torch.compile`` keeps it in one graph as an extern call; under ``torch.func.vmap`` (the batched
sweeps of bench/sweep_batching.py) it runs one product per member. Below 16 rows (one-token decoding) MKL's matrix-vector path is as fast or faster (1 row:
0.6-0.9x with oneDNN), and decoding has its own packed-weight path (:func:`lmlab.generate.decode_layout`).

:data:`ONEDNN_FP32` = False turns the path off for the process (``F.linear`` everywhere), e.g. to
compare the two or on a CPU where MKL is the faster one.
"""

from __future__ import annotations

import platform
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

ONEDNN_FP32 = True
# Rows (product of the input's leading dims) from which oneDNN is used: measured forward on 1 and 2
# threads, (rows, 256) x (256, 1024) and (rows, 1024) x (1024, 256): 4 rows 0.88-1.80x, 16 rows
# 1.43-1.72x, 64 rows 1.9-2.0x, 256 rows and more 2.2-2.3x the time of F.linear; 1 row 0.59-0.86x.
MIN_ROWS = 16


def onednn_available() -> bool:
    """True when this PyTorch build has oneDNN's linear op and the CPU is x86-64 (on ARM builds oneDNN
    runs on the Compute Library, which this path was not measured with)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and platform.machine().lower() in ("x86_64", "amd64"))


_AVAILABLE = onednn_available()  # once per process: a constant to torch.compile


@torch.library.custom_op("lmlab::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ weight.T + bias on oneDNN. x: (rows, in), weight: (out, in), bias: (out,) or None, all fp32
    on CPU, any strides (the backward passes transposed views). Returns (rows, out), contiguous."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    # dx = grad @ weight: the (out, in) weight read as the (in, out) "weight" of a linear
    gx = onednn_linear(grad, weight.t(), None) if ctx.needs_input_grad[0] else None
    gw = weight_grad(grad, x) if ctx.needs_input_grad[1] else None
    gb = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb


onednn_linear.register_autograd(_backward, setup_context=_setup_context)


def _vmap(info, in_dims, x, weight, bias):
    """Under ``torch.func.vmap`` (bench/sweep_batching.py's K runs as one module): one oneDNN product per
    member when each is one (fp32, CPU, enough rows), else torch's batched matmul."""
    x_dim, w_dim, b_dim = in_dims
    x = x if x_dim is None else x.movedim(x_dim, 0)
    weight = weight if w_dim is None else weight.movedim(w_dim, 0)
    if bias is not None and b_dim is not None:
        bias = bias.movedim(b_dim, 0)
    batched = x_dim is not None or w_dim is not None or b_dim is not None
    if not batched:
        return onednn_linear(x, weight, bias), None
    if w_dim is None and b_dim is None and x.dim() == 3:  # shared weight: one product over all rows
        return onednn_linear(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:2], -1), 0
    pick = lambda t, d, i: t if d is None or t is None else t[i]  # noqa: E731
    if uses_onednn(pick(x, x_dim, 0), pick(weight, w_dim, 0)):
        out = torch.stack([onednn_linear(pick(x, x_dim, i), pick(weight, w_dim, i), pick(bias, b_dim, i))
                           for i in range(info.batch_size)])
        return out, 0
    out = torch.matmul(x, weight.transpose(-1, -2))
    if bias is not None:
        out = out + (bias if b_dim is None else bias.unsqueeze(-2))
    return out, 0


torch.library.register_vmap(onednn_linear, _vmap)


def weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad^T @ x, a linear layer's weight gradient: grad (rows, out), x (rows, in) -> (out, in),
    contiguous, on oneDNN (as :func:`onednn_linear`; the caller checked :func:`uses_onednn`). oneDNN
    is faster with the narrower side as the product's rows (rows 2048: out 4096, in 256: 2.0x; out 256,
    in 1024: 1.35x the other way), so with out > in it makes the (in, out) product x^T grad and
    transposes it (a copy of out x in elements)."""
    if grad.shape[1] > x.shape[1]:
        return onednn_linear(x.t(), grad.t(), None).t().contiguous()
    return onednn_linear(grad.t(), x.t(), None)


def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`linear` runs x (..., in) times weight (out, in) on oneDNN (see the module)."""
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    return (ONEDNN_FP32 and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.device.type == "cpu" and rows >= MIN_ROWS
            and not torch.is_autocast_enabled("cpu") and _AVAILABLE)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in), bias (out,) -> (..., out), on
    oneDNN when :func:`uses_onednn` (equal to F.linear up to fp32 summation order), else F.linear."""
    if not uses_onednn(x, weight):
        return F.linear(x, weight, bias)
    out = onednn_linear(x.reshape(-1, x.shape[-1]), weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (m, k) @ b (k, n) -> (m, n) for callers that do their own backward (the chunked loss): on
    oneDNN under the conditions of :func:`uses_onednn` (with a as the input), else ``torch.mm``."""
    if uses_onednn(a, b):
        return onednn_linear(a, b.t(), None)
    return a @ b


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, names and initialisation) whose forward is :func:`linear`:
    input (..., in_features) -> (..., out_features)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
