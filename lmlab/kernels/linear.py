"""Linear layers whose fp32 matmuls on x86 CPUs can run on oneDNN instead of MKL.

PyTorch's CPU build multiplies fp32 matrices with MKL's sgemm, and bf16 ones with oneDNN. oneDNN's
fp32 matmul, reached through ``torch.ops.mkldnn._linear_pointwise`` (the op Inductor's CPU inference
path and :mod:`lmlab.generate` already use), can run a small LM's products much faster than MKL's
sgemm on some CPUs and slower on others (measured per CPU: ``python bench/linear_backends.py``,
docs/bench/linear_backends.md and docs/bench/measured-choices.md). The results are fp32 products
with fp32 accumulation (oneDNN's default strict fp32 math; relative error from an fp64 product at
most 1.3e-6, MKL's 5e-7), in another summation order.

:class:`Linear` is an ``nn.Linear`` (same parameters, state-dict names and initialisation) whose
forward takes that path when :func:`uses_onednn` says so: a CPU fp32 input of at least
:data:`MIN_ROWS` rows outside autocast (under CPU autocast the matmul is bf16 and already oneDNN's),
and oneDNN available in this PyTorch build on an x86-64 CPU; otherwise it is ``F.linear``. The op
is a ``torch.library`` custom op with its own backward (input and weight gradients on oneDNN too), so
``torch.compile`` keeps it in one graph as extern calls; under ``torch.func.vmap`` (the batched
sweeps of bench/sweep_batching.py) each op runs once per member. The three ops are differentiable in
each other (double backward works); under forward-mode AD and torch.func's grad / jacrev / jvp, for
which torch.library ops have no rule, :func:`linear` is ``F.linear``. Small products (one-token
decoding, which has its own packed-weight path in :func:`lmlab.kernels.decode_layout.decode_layout`) stay on MKL.

Whether the path is taken at all is the model's :class:`lmlab.kernels.settings.KernelSettings`
(``onednn_fp32``: on where ``lmlab bench calibrate`` measured it faster on this CPU): a
:class:`Linear` holds it as ``kernels``, set by the model it belongs to.
"""

from __future__ import annotations

import platform
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.kernels.settings import KernelSettings, default_kernels

# Rows (product of the input's leading dims) from which oneDNN is used. Forward through this module's
# op against ``x @ w.T`` on MKL, the GPT-2 recipe's shapes (python bench/linear_backends.py --rows
# 1 4 16 32 64 --recipes gpt2), 1 and 2 threads: 1 row 0.2-0.9x, 16 rows 0.5-1.7x, 32 rows 0.8-1.8x,
# 64 rows 1.10-1.98x, 2048 rows 2.1-2.3x (the custom op's Python dispatch costs tens of microseconds
# a call, which only large products hide).
MIN_ROWS = 64


# once per process (a constant to torch.compile): this PyTorch build has oneDNN's linear op and the CPU
# is x86-64 (on ARM builds oneDNN runs on the Compute Library, which this path was not measured with)
_AVAILABLE = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and platform.machine().lower() in ("x86_64", "amd64")
)


def onednn_available() -> bool:
    """True when this PyTorch build has oneDNN's linear op and the CPU is x86-64."""
    return _AVAILABLE


def fp32_linears_on_onednn(
    device: torch.device, autocast_dtype: Optional[torch.dtype], kernels: KernelSettings
) -> bool:
    """Whether a model with ``kernels`` training on ``device`` under ``autocast_dtype`` (None: fp32)
    multiplies its linear layers on oneDNN (inputs of at least :data:`MIN_ROWS` rows; :func:`uses_onednn`)."""
    return device.type == "cpu" and autocast_dtype is None and kernels.onednn_fp32 and _AVAILABLE


def _pointwise(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    # a (m, k) @ b.T (b: (n, k)) + bias on oneDNN. a may be a strided view; b is made contiguous by the
    # op (a transposing copy when b is a transposed view: the weight gradient always has one).
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


# Three ops on the tensors as the model holds them; the transposed operands are views made inside each
# op, so what a compiled graph passes is what eager code passes.
@torch.library.custom_op("lmlab::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ weight.T + bias on oneDNN. x: (rows, in), weight: (out, in), bias: (out,) or None, fp32 on
    CPU. Returns (rows, out)."""
    # the op reads the bias as contiguous whatever its strides: a strided view would be misread
    return _pointwise(x, weight, None if bias is None else bias.contiguous())


@torch.library.custom_op("lmlab::onednn_grad_input", mutates_args=())
def onednn_grad_input(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """grad @ weight, a linear layer's input gradient, on oneDNN: grad (rows, out), weight (out, in) ->
    (rows, in)."""
    return _pointwise(grad, weight.t())


@torch.library.custom_op("lmlab::onednn_grad_weight", mutates_args=())
def onednn_grad_weight(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad^T @ x, a linear layer's weight gradient, on oneDNN: grad (rows, out), x (rows, in) ->
    (out, in), contiguous. oneDNN is faster with the narrower side as the product's rows (rows 2048:
    out 4096, in 256: 2.0x; out 256, in 1024: 1.35x the other way), so with out > in it makes the
    (in, out) product x^T grad and transposes it (a copy of out x in elements)."""
    if grad.shape[1] > x.shape[1]:
        return _pointwise(x.t(), grad.t()).t().contiguous()
    return _pointwise(grad.t(), x.t())


@onednn_linear.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


@onednn_grad_input.register_fake
def _(grad, weight):
    return grad.new_empty((grad.shape[0], weight.shape[1]))


@onednn_grad_weight.register_fake
def _(grad, x):
    return grad.new_empty((grad.shape[1], x.shape[1]))


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    gx = onednn_grad_input(grad, weight) if ctx.needs_input_grad[0] else None
    gw = onednn_grad_weight(grad, x) if ctx.needs_input_grad[1] else None
    gb = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb


def _save_both(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _grad_input_backward(ctx, h):
    # gx = G W: dG = H W^T, dW = G^T H
    g, weight = ctx.saved_tensors
    return (
        onednn_linear(h, weight, None) if ctx.needs_input_grad[0] else None,
        onednn_grad_weight(g, h) if ctx.needs_input_grad[1] else None,
    )


def _grad_weight_backward(ctx, h):
    # gW = G^T X: dG = X H^T, dX = G H
    g, x = ctx.saved_tensors
    return (
        onednn_linear(x, h, None) if ctx.needs_input_grad[0] else None,
        onednn_grad_input(g, h) if ctx.needs_input_grad[1] else None,
    )


# each op differentiable in the others, so gradients of gradients (create_graph=True) work too
onednn_linear.register_autograd(_backward, setup_context=_setup_context)
onednn_grad_input.register_autograd(_grad_input_backward, setup_context=_save_both)
onednn_grad_weight.register_autograd(_grad_weight_backward, setup_context=_save_both)


def _per_member(op):
    """A vmap rule for ``op`` (bench/sweep_batching.py's K runs as one vmapped module): ``op`` once
    per member on that member's slices, the results stacked along dim 0; the same oneDNN products as
    K separate runs."""

    def rule(info, in_dims, *args):
        def member(i):
            return [a if d is None or a is None else a.select(d, i) for a, d in zip(args, in_dims)]

        return torch.stack([op(*member(i)) for i in range(info.batch_size)]), 0

    return rule


for _op in (onednn_linear, onednn_grad_input, onednn_grad_weight):
    torch.library.register_vmap(_op, _per_member(_op))


def _under_transform(*tensors: torch.Tensor) -> bool:
    """Forward-mode AD (``torch.autograd.forward_ad``) or a torch.func transform other than vmap
    (``grad``, ``jacrev``, ``jvp``), which the custom ops do not support: the caller then uses
    F.linear. Not evaluated inside torch.compile'd code."""
    if torch.autograd.forward_ad._current_level >= 0:
        return True
    functorch = torch._C._functorch
    return any(functorch.is_functorch_wrapped_tensor(t) and not functorch.is_batchedtensor(t) for t in tensors)


def uses_onednn(x: torch.Tensor, weight: torch.Tensor, onednn: bool) -> bool:
    """Whether :func:`linear` runs x (..., in) times weight (out, in) on oneDNN (see the module), given
    ``onednn``, the model's :attr:`KernelSettings.onednn_fp32`."""
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    return (
        onednn
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and rows >= MIN_ROWS
        and not torch.is_autocast_enabled("cpu")
        and _AVAILABLE
        and (torch.compiler.is_compiling() or not _under_transform(x, weight))
    )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, onednn: bool = False
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in), bias (out,) -> (..., out), on
    oneDNN when ``onednn`` and :func:`uses_onednn` (equal to F.linear up to fp32 summation order), else
    F.linear."""
    if not uses_onednn(x, weight, onednn):
        return F.linear(x, weight, bias)
    out = onednn_linear(x.reshape(-1, x.shape[-1]), weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


def grad_input(grad: torch.Tensor, weight: torch.Tensor, onednn: bool) -> torch.Tensor:
    """grad (rows, out) @ weight (out, in) -> (rows, in) for callers that do their own backward (the
    chunked loss): :func:`onednn_grad_input` when :func:`uses_onednn` (grad as the input), else
    ``torch.mm``."""
    return onednn_grad_input(grad, weight) if uses_onednn(grad, weight, onednn) else grad @ weight


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, names and initialisation) whose forward is :func:`linear`:
    input (..., in_features) -> (..., out_features), on oneDNN as its ``kernels``
    (:class:`KernelSettings`; the process default until the model it belongs to sets its own) say."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernels = default_kernels()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialisation; nothing on the meta device, which holds no values (a real
        config sized there builds tens of thousands of linears, and torch's meta draws took half the time)."""
        if not self.weight.is_meta:
            super().reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.kernels.onednn_fp32)
