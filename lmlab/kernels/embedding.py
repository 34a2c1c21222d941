"""Token embedding whose gradient is the same number every time, also under torch.compile.

The gradient of an embedding lookup adds the output gradients of all positions holding the same
token into that token's row. Inductor compiles that scatter-add, when it fuses it into the model's
graph, as a parallel loop with atomic float adds, whose order varies with thread timing: the same
step gave embedding gradients differing by up to 2e-9 between calls on 2 threads (2026-12-03, bf16,
LLaMA-style model), so compiled runs were not reproducible and exact resume failed. Here the
backward is torch's own ``embedding_dense_backward`` kernel (deterministic on CPU), called as an
opaque ``torch.library`` op that inductor leaves alone; the model keeps one graph. Its cost on the
GPT-2 recipe's compiled bf16 step at 2 threads: 0.975x (IQR 0.94-1.01; one process, alternated).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


@torch.library.custom_op("lmlab::embedding_backward", mutates_args=())
def embedding_backward(grad: torch.Tensor, idx: torch.Tensor, num_weights: int) -> torch.Tensor:
    """grad (..., dim) of a lookup of idx (...) into a (num_weights, dim) table -> the table's
    gradient (num_weights, dim): rows summed per token by torch's embedding_dense_backward."""
    return torch.ops.aten.embedding_dense_backward(grad, idx, num_weights, -1, False)


@embedding_backward.register_fake
def _(grad, idx, num_weights):
    return grad.new_empty(num_weights, grad.shape[-1])


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, idx, weight):
        ctx.save_for_backward(idx)
        ctx.num_weights = weight.shape[0]
        return F.embedding(idx, weight)

    @staticmethod
    def backward(ctx, grad):
        (idx,) = ctx.saved_tensors
        return None, embedding_backward(grad.contiguous(), idx, ctx.num_weights)


class Embedding(nn.Embedding):
    """``nn.Embedding(num_embeddings, embedding_dim)`` (same parameter, name and initialisation) for
    token ids idx (...) -> (..., embedding_dim), whose weight gradient under torch.compile comes from
    torch's deterministic kernel (see the module docstring); eager, it is ``F.embedding``."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        # no padding_idx / max_norm / sparse: forward does not apply them, so they are not accepted
        super().__init__(num_embeddings, embedding_dim)

    def reset_parameters(self) -> None:
        """``nn.Embedding``'s initialisation; nothing on the meta device, which holds no values."""
        if not self.weight.is_meta:
            super().reset_parameters()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and self.weight.requires_grad:
            return _Lookup.apply(idx, self.weight)
        return F.embedding(idx, self.weight)
