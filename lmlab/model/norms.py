"""Normalisation layers and where they go (lecture 3: "pre-norm vs post-norm", "LayerNorm vs RMSNorm").

- LayerNorm (Ba et al. 2016): (x - mean) / sqrt(var + eps) * weight (+ bias).
- RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight. No mean subtraction, no bias:
  fewer memory movements for the same quality, which is why LLaMA-era models use it.
- Gemma's RMSNorm stores ``weight`` as an offset from one: x / rms(x) * (1 + weight).

All of them compute in fp32 whatever the input dtype and cast back, as bf16 statistics are too coarse.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """RMSNorm over the last dim: (..., dim) -> (..., dim). ``offset=1`` gives Gemma's (1 + weight)."""

    def __init__(self, dim: int, eps: float = 1e-5, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (self.weight.float() + self.offset)).to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm over the last dim, with an optional bias: (..., dim) -> (..., dim)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), bias, self.eps).to(x.dtype)


def make_norm(norm_type: str, dim: int, eps: float, bias: bool = False) -> nn.Module:
    """Build the norm named by ``ModelConfig.norm_type`` ('rmsnorm' | 'layernorm' | 'gemma_rmsnorm')."""
    if norm_type == "rmsnorm":
        return RMSNorm(dim, eps)
    if norm_type == "gemma_rmsnorm":
        return RMSNorm(dim, eps, offset=1.0)
    if norm_type == "layernorm":
        return LayerNorm(dim, eps, bias=bias)
    raise ValueError(f"norm_type={norm_type!r} is not one of 'rmsnorm', 'layernorm', 'gemma_rmsnorm'")
