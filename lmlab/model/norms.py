"""Normalisation layers and where they go (lecture 3: "pre-norm vs post-norm", "LayerNorm vs RMSNorm").

- LayerNorm (Ba et al. 2016): (x - mean) / sqrt(var + eps) * weight (+ bias).
- RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight. No mean subtraction, no bias:
  fewer memory movements for the same quality, which is why LLaMA-era models use it.
- Gemma's RMSNorm stores ``weight`` as an offset from one: x / rms(x) * (1 + weight).
- "layernorm1p" (Megatron-LM ``apply_layernorm_1p``; Nemotron-4, HF ``NemotronLayerNorm1P``): LayerNorm
  whose weight is stored the same way, (x - mean) / sqrt(var + eps) * (1 + weight) + bias.
- Non-parametric norms (``affine=False``; OLMo 1's LayerNorm, Groeneveld et al. 2024, section 2.1): no
  weight and no bias, the normalisation alone.

All of them compute their statistics in fp32 whatever the input dtype and cast back, as bf16 statistics
are too coarse; where the weight is applied relative to that cast follows the reference of each family
(see :class:`RMSNorm`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """RMSNorm over the last dim: (..., dim) -> (..., dim), in the input's dtype. ``offset=1`` gives
    Gemma's (1 + weight); ``affine=False`` has no weight.

    The statistics are computed in fp32. Below fp32 the weight is applied in one of two orders, as the
    reference implementations differ (bitwise, in bf16):

    - default (``weight_fp32=False``): the normalised value is cast to the input dtype first, then
      multiplied by the weight in its own dtype, ``weight * norm(x.float()).to(x.dtype)`` (Meta's LLaMA
      reference ``RMSNorm``; HF ``LlamaRMSNorm``, also Mistral, Qwen2, Qwen3);
    - ``weight_fp32=True``, and always with ``offset``: the weight multiplies in fp32 and the product is
      cast, ``(norm(x.float()) * (offset + weight.float())).to(x.dtype)`` (HF ``Olmo2RMSNorm``;
      ``GemmaRMSNorm`` / ``Gemma2RMSNorm`` / ``Gemma3RMSNorm`` with the (1 + w) offset).
    """

    def __init__(
        self, dim: int, eps: float = 1e-5, offset: float = 0.0, affine: bool = True, weight_fp32: bool = False
    ):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight_fp32 = weight_fp32 or bool(offset)
        self.weight = (nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm: the same x * rsqrt(mean(x^2) + eps) * w (bitwise, here), in one op instead of ~8
        weight, shape = self.weight, (x.shape[-1],)
        if weight is not None and not self.weight_fp32 and x.dtype != torch.float32:
            # Llama / Meta: the normalised value cast to the input dtype first, then the weight in its own dtype
            y = F.rms_norm(x.float(), shape, None, self.eps).to(x.dtype) * weight
        else:  # the product in fp32, then the cast (in fp32 the two orders are the same)
            if weight is not None and (self.offset or weight.dtype != torch.float32):
                weight = weight.float() + self.offset
            y = F.rms_norm(x.float(), shape, weight, self.eps)  # x.float() is x itself for fp32
        return y if y.dtype == x.dtype else y.to(x.dtype)


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


def make_norm(
    norm_type: str, dim: int, eps: float, bias: bool = False, affine: bool = True, weight_fp32: bool = False
) -> nn.Module:
    """Build the norm named by ``ModelConfig.norm_type`` ('rmsnorm' | 'layernorm' | 'gemma_rmsnorm' |
    'layernorm1p'); ``affine=False``: no learnable parameters (the (1 + w) form then equals plain RMSNorm);
    ``weight_fp32``: 'rmsnorm' applies its weight in fp32 (``ModelConfig.norm_weight_fp32``, see RMSNorm).
    Raises ValueError for another name."""
    if norm_type == "rmsnorm" or (norm_type == "gemma_rmsnorm" and not affine):
        return RMSNorm(dim, eps, affine=affine, weight_fp32=weight_fp32)
    if norm_type == "gemma_rmsnorm":
        return RMSNorm(dim, eps, offset=1.0)
    if norm_type == "layernorm":
        return LayerNorm(dim, eps, bias=bias, affine=affine)
    if norm_type == "layernorm1p":
        return LayerNorm(dim, eps, bias=bias, affine=affine, offset=1.0)
    raise ValueError(f"norm_type={norm_type!r} is not one of 'rmsnorm', 'layernorm', 'gemma_rmsnorm', 'layernorm1p'")


def model_norm(cfg, dim: int | None = None) -> nn.Module:
    """The model's norm as its ModelConfig ``cfg`` sets it (``norm_type``, ``norm_eps``, ``norm_bias``,
    ``norm_affine``, ``norm_weight_fp32``) over ``dim`` channels (default ``cfg.d_model``): every block's
    norms, the final norm, the MTP modules' and the per-layer-embedding norm."""
    return make_norm(
        cfg.norm_type, dim or cfg.d_model, cfg.norm_eps, cfg.norm_bias, cfg.norm_affine, cfg.norm_weight_fp32
    )
