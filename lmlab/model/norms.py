"""Normalisation layers and where they go (lecture 3: "pre-norm vs post-norm", "LayerNorm vs RMSNorm").

- LayerNorm (Ba et al. 2016): (x - mean) / sqrt(var + eps) * weight (+ bias).
- RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight. No mean subtraction, no bias:
  fewer memory movements for the same quality, which is why LLaMA-era models use it.
- Gemma's RMSNorm stores ``weight`` as an offset from one: x / rms(x) * (1 + weight).
- "layernorm1p" (Megatron-LM ``apply_layernorm_1p``; Nemotron-4, HF ``NemotronLayerNorm1P``): LayerNorm
  whose weight is stored the same way, (x - mean) / sqrt(var + eps) * (1 + weight) + bias.
- Non-parametric norms (``affine=False``; OLMo 1's LayerNorm, Groeneveld et al. 2024, section 2.1): no
  weight and no bias, the normalisation alone.

All of them compute in fp32 whatever the input dtype and cast back, as bf16 statistics are too coarse.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """RMSNorm over the last dim: (..., dim) -> (..., dim). ``offset=1`` gives Gemma's (1 + weight);
    ``affine=False`` has no weight."""

    def __init__(self, dim: int, eps: float = 1e-5, offset: float = 0.0, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = (nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm: the same x * rsqrt(mean(x^2) + eps) * w (bitwise, here), in one op instead of ~8
        weight = self.weight
        if weight is not None and (self.offset or weight.dtype != torch.float32):
            weight = weight.float() + self.offset
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), weight, self.eps).to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm over the last dim, with an optional bias: (..., dim) -> (..., dim).
    ``affine=False`` has neither weight nor bias (OLMo 1)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, affine: bool = True, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset  # 1.0: weight stored as an offset from one (layernorm1p)
        self.weight = (nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if (bias and affine) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float() + self.offset
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, self.eps).to(x.dtype)


class HeadwiseNorm(nn.Module):
    """A norm over each head's ``head_dim`` channels with a separate weight per head, (n_heads, head_dim):
    Cohere's QK-norm (``use_qk_norm``; HF ``CohereLayerNorm((n_heads, head_dim))``). Input (batch, n_heads,
    seq, head_dim) -> same shape. ``norm_type`` 'layernorm' (no bias) or 'rmsnorm' / 'gemma_rmsnorm'."""

    def __init__(self, norm_type: str, n_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.norm = make_norm(norm_type, head_dim, eps, affine=False)  # the normalisation alone
        self.offset = 1.0 if norm_type == "gemma_rmsnorm" else 0.0
        self.weight = nn.Parameter(torch.zeros(n_heads, head_dim) if self.offset else torch.ones(n_heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float()[None, :, None, :] + self.offset
        return (self.norm(x.float()) * w).to(x.dtype)


def make_norm(norm_type: str, dim: int, eps: float, bias: bool = False, affine: bool = True) -> nn.Module:
    """Build the norm named by ``ModelConfig.norm_type`` ('rmsnorm' | 'layernorm' | 'gemma_rmsnorm');
    ``affine=False``: no learnable parameters (the (1 + w) form then equals plain RMSNorm)."""
    if norm_type == "rmsnorm" or (norm_type == "gemma_rmsnorm" and not affine):
        return RMSNorm(dim, eps, affine=affine)
    if norm_type == "gemma_rmsnorm":
        return RMSNorm(dim, eps, offset=1.0)
    if norm_type == "layernorm":
        return LayerNorm(dim, eps, bias=bias, affine=affine)
    if norm_type == "layernorm1p":
        return LayerNorm(dim, eps, bias=bias, affine=affine, offset=1.0)
    raise ValueError(f"norm_type={norm_type!r} is not one of 'rmsnorm', 'layernorm', 'gemma_rmsnorm', 'layernorm1p'")
