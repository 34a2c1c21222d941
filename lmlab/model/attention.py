"""Causal self-attention with grouped KV heads, sliding windows, QK-norm and logit soft-caps
(lecture 3: "MQA/GQA", "KV cache", "sliding-window and hybrid attention", "stability tricks").

- GQA (Ainslie et al. 2023): ``n_kv_heads`` key/value heads shared by groups of n_heads / n_kv_heads
  query heads; n_kv_heads = 1 is MQA (Shazeer 2019). The KV cache stores n_kv_heads heads only.
- Sliding window (Child et al. 2019; Beltagy et al. 2020; Mistral 7B): a query at position i sees keys
  j with i - W < j <= i, i.e. the window of W tokens counts the current token (Mistral / Hugging Face).
- QK-norm (Dehghani et al. 2023; OLMo 2, Qwen3): RMSNorm or LayerNorm of q and k over each head.
- Attention-logit soft-cap (Gemma 2): s -> cap * tanh(s / cap) before the softmax.
- Query scale 1/sqrt(head_dim), or query_pre_attn_scalar**-0.5 (Gemma 2).

The fast path is ``torch.nn.functional.scaled_dot_product_attention``; the soft-cap needs the
explicit softmax (computed in fp32).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.config import ModelConfig
from lmlab.model.norms import make_norm
from lmlab.model.positions import RotaryEmbedding


class KVCache:
    """Preallocated key/value cache for all layers: per layer (batch, n_kv_heads, max_len, head_dim).

    ``length`` is the number of positions already stored. Memory in bytes:
    2 * n_layers * batch * n_kv_heads * max_len * head_dim * dtype bytes.
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device=None, dtype=torch.float32):
        shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.max_len = max_len
        self.length = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (batch, n_kv_heads, seq, head_dim) after the ``length`` cached positions and
        return all keys and values so far, (batch, n_kv_heads, length + seq, head_dim)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions needed, {self.max_len} allocated")
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: Optional[int]) -> torch.Tensor:
    """Boolean (seq_q, seq_k) mask, True where query at q_pos may attend key at k_pos:
    k_pos <= q_pos and, with a window W, q_pos - k_pos < W."""
    diff = q_pos[:, None] - k_pos[None, :]
    allowed = diff >= 0
    if window is not None:
        allowed = allowed & (diff < window)
    return allowed


def softcap(x: torch.Tensor, cap: Optional[float]) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2); identity when cap is None. Keeps |x| < cap."""
    return x if cap is None else cap * torch.tanh(x / cap)


class Attention(nn.Module):
    """Multi-head causal self-attention: (batch, seq, d_model) -> (batch, seq, d_model).

    One fused projection produces q (n_heads heads), k and v (n_kv_heads heads each) of ``head_dim``;
    query head h reads key/value head h // (n_heads / n_kv_heads). Per layer (``cfg.layer_window``):
    local layers mask to the sliding window and use ``rope_local_theta`` (without ``rope_scaling``) when
    set; global layers attend to the whole prefix and carry no RoPE when ``nope_global_layers``.
    Order of operations: projections -> QK-norm -> RoPE -> logits * scale -> soft-cap -> + position
    bias (ALiBi / T5) -> causal / window mask -> softmax (fp32 on the explicit path).
    """

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.layer = layer
        self.window = cfg.layer_window(layer)
        bias = cfg.bias in ("all", "qkv")
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=bias)
        self.out = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=cfg.bias == "all")
        self.out.is_residual_projection = True
        if cfg.qk_norm != "none":
            self.q_norm = make_norm(cfg.qk_norm, cfg.head_dim, cfg.norm_eps, bias=False)
            self.k_norm = make_norm(cfg.qk_norm, cfg.head_dim, cfg.norm_eps, bias=False)
        else:
            self.q_norm = self.k_norm = None
        self.rope = None
        if cfg.position == "rope" and not (cfg.nope_global_layers and self.window is None):
            theta = cfg.rope_local_theta if (self.window is not None and cfg.rope_local_theta) else cfg.rope_theta
            scaling = None if (self.window is not None and cfg.rope_local_theta) else cfg.rope_scaling
            self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_fraction, theta, cfg.rope_style,
                                        cfg.context_length, scaling)
        self.scale = (cfg.query_pre_attn_scalar ** -0.5) if cfg.query_pre_attn_scalar else 1.0 / math.sqrt(cfg.head_dim)
        self.logit_cap = cfg.attn_logit_softcap
        self.attn_dropout = cfg.attn_dropout
        self.max_logit: Optional[float] = None  # set when record_max_logit is on (stability diagnostics)
        self.record_max_logit = False

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Optional[KVCache] = None,
                bias_fn: Optional[Callable] = None) -> torch.Tensor:
        """x: (batch, seq, d_model); positions: (seq,) absolute positions of x's tokens;
        cache: KV cache holding the earlier positions; bias_fn(q_pos, k_pos, layer) -> additive
        (n_heads, seq_q, seq_k) fp32 logit bias (ALiBi, T5) or None."""
        B, T, _ = x.shape
        H, K, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split([H * D, K * D, K * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
        v = v.view(B, T, K, D).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
            k_pos = torch.arange(k.shape[2], device=x.device)
            k_pos = k_pos + (positions[0] - cache.length)  # cache slot 0 holds position positions[0]-length
        else:
            k_pos = positions
        bias = bias_fn(positions, k_pos, self.layer) if bias_fn is not None else None
        dropout = self.attn_dropout if self.training else 0.0
        plain_causal = cache is None or cache.length == 0
        if self.logit_cap is None and not self.record_max_logit and bias is None and self.window is None and plain_causal:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=self.scale,
                                               enable_gqa=K != H)
        else:
            allowed = causal_mask(positions, k_pos, self.window)
            if self.logit_cap is None and not self.record_max_logit:
                mask = torch.zeros(allowed.shape, device=x.device, dtype=q.dtype)
                mask = mask.masked_fill(~allowed, float("-inf"))
                if bias is not None:
                    mask = mask + bias.to(q.dtype)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.scale,
                                                   enable_gqa=K != H)
            else:
                y = self._explicit(q, k, v, allowed, bias, dropout)
        y = y.transpose(1, 2).reshape(B, T, H * D)
        return self.out(y)

    def _explicit(self, q, k, v, allowed, bias, dropout):
        """Softmax attention written out (fp32 logits), for soft-caps and logit diagnostics."""
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * self.scale  # (B, H, T, S)
        scores = softcap(scores, self.logit_cap)
        if bias is not None:
            scores = scores + bias
        if self.record_max_logit:
            self.max_logit = float(scores.masked_fill(~allowed, float("-inf")).max())
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if dropout:
            probs = F.dropout(probs, dropout)
        return torch.matmul(probs.to(v.dtype), v)
