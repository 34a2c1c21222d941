"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", Sec. 2.1; lecture 3's other way,
besides GQA/MQA, to shrink the KV cache).

Per token, keys and values are compressed jointly into one latent vector c (``kv_lora_rank``
values): c = RMSNorm(W_DKV x). Each head's key is [W_UK c, k_rope] and its value W_UV c, where
k_rope (``qk_rope_head_dim`` values) is one decoupled RoPE key shared by all heads, k_rope =
RoPE(W_KR x), since RoPE cannot pass through the low-rank up-projection. The query is
[q_nope, RoPE(q_rope)] per head, from x directly or through a low-rank bottleneck (``q_lora_rank``):
q = W_UQ RMSNorm(W_DQ x). Scores are scaled by (qk_nope_head_dim + qk_rope_head_dim)^-0.5, times
mscale(factor, mscale_all_dim)^2 = (0.1 mscale_all_dim ln(factor) + 1)^2 under YaRN scaling with
``mscale_all_dim`` (DeepSeek-V2's long-context models; HF ``DeepseekV2Attention``); heads output
``v_head_dim`` values each.

The KV cache stores only c and k_rope: kv_lora_rank + qk_rope_head_dim values per token and layer
(DeepSeek-V2: 512 + 64 = 576, against 2 x 128 heads x 128 = 32,768 for MHA). Each step here
re-expands the cached latents through W_UK / W_UV (correct and simple; the "absorbed" form that
multiplies W_UK into the query is an optimisation not made). Layout of the weights:
``kv_down`` = [W_DKV; W_KR] (d_model -> kv_lora_rank + rope), ``kv_up`` = [W_UK; W_UV] per head
(kv_lora_rank -> n_heads x (nope + v)), as DeepSeek's ``kv_a_proj_with_mqa`` / ``kv_b_proj``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from lmlab.config import ModelConfig
from lmlab.kernels.linear import Linear
from lmlab.model.attention import attention, causal_mask
from lmlab.model.norms import make_norm
from lmlab.model.positions import RotaryEmbedding


class MultiHeadLatentAttention(nn.Module):
    """(batch, seq, d_model) -> (batch, seq, d_model); the same call signature as
    :class:`lmlab.model.attention.Attention`. With a :class:`~lmlab.model.attention.KVCache` the
    layer's "keys" buffer holds the latents (batch, 1, S, kv_lora_rank) and its "values" buffer the
    RoPE keys (batch, 1, S, qk_rope_head_dim)."""

    supports_decode_one = False  # decoding goes through forward (the latents are re-expanded each step)

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads = cfg.n_heads
        self.nope, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        qk = self.nope + self.rope_dim
        if cfg.q_lora_rank:
            self.q_down = Linear(cfg.d_model, cfg.q_lora_rank, bias=False)
            self.q_norm = make_norm("rmsnorm", cfg.q_lora_rank, cfg.norm_eps, bias=False)
            self.q_up = Linear(cfg.q_lora_rank, cfg.n_heads * qk, bias=False)
        else:
            self.q_down = self.q_norm = None
            self.q_up = Linear(cfg.d_model, cfg.n_heads * qk, bias=False)
        self.kv_down = Linear(cfg.d_model, self.rank + self.rope_dim, bias=False)
        self.kv_norm = make_norm("rmsnorm", self.rank, cfg.norm_eps, bias=False)
        self.kv_up = Linear(self.rank, cfg.n_heads * (self.nope + self.v_dim), bias=False)
        self.out = Linear(cfg.n_heads * self.v_dim, cfg.d_model, bias=False)
        self.out.is_residual_projection = True
        self.rope = RotaryEmbedding(
            self.rope_dim, 1.0, cfg.rope_theta, cfg.rope_style, cfg.context_length, cfg.rope_scaling
        )
        self.scale = qk**-0.5
        rs = cfg.rope_scaling or {}
        if rs.get("mscale_all_dim"):  # DeepSeek-V2 with YaRN: softmax scale x mscale(factor, mscale_all_dim)^2
            from lmlab.model.rope_scaling import yarn_mscale

            self.scale *= yarn_mscale(float(rs["factor"]), float(rs["mscale_all_dim"])) ** 2
        self.window = None
        self.record_max_logit = False
        self.max_logit: Optional[float] = None
        self.first_key: Optional[float] = None
        self.attn_dropout = cfg.attn_dropout

    def latents(self, x: torch.Tensor, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """x (batch, seq, d_model) -> (c (batch, 1, seq, kv_lora_rank), k_rope (batch, 1, seq, rope)):
        what the cache keeps per token."""
        c, k_rope = self.kv_down(x).split([self.rank, self.rope_dim], dim=-1)
        c = self.kv_norm(c)
        return c.unsqueeze(1), self.rope(k_rope.unsqueeze(1), positions)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache=None,
        bias_fn: Optional[Callable] = None,
        left_pad: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:

        B, T, _ = x.shape
        H = self.n_heads
        q = self.q_up(self.q_norm(self.q_down(x)) if self.q_down is not None else x)
        q = q.view(B, T, H, self.nope + self.rope_dim).transpose(1, 2)  # (B, H, T, nope + rope)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)
        q = torch.cat([q_nope, self.rope(q_rope, positions)], dim=-1)
        c, k_rope = self.latents(x, positions)
        if cache is None:
            q_idx = k_idx = torch.arange(T, device=x.device)
        else:
            start = cache.length
            c, k_rope, first = cache.update(self.layer, c, k_rope)
            q_idx = torch.arange(start, start + T, device=x.device)
            k_idx = cache.key_index(self.layer, first, c.shape[2])
        S = c.shape[2]
        kv = self.kv_up(c[:, 0]).view(B, S, H, self.nope + self.v_dim).transpose(1, 2)  # (B, H, S, nope + v)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(B, H, S, self.rope_dim)], dim=-1)
        allowed = causal_mask(q_idx, k_idx, None)
        if left_pad is not None:  # as Attention: no attending to padding; a padding query sees itself
            allowed = (allowed & (k_idx[None, :] >= left_pad[:, None])[:, None, None, :]) | (
                q_idx[:, None] == k_idx[None, :]
            )
        bias = bias_fn(q_idx, k_idx, self.layer) if bias_fn is not None else None
        stats = {} if self.record_max_logit else None
        y = attention(
            q,
            k,
            v,
            allowed,
            scale=self.scale,
            bias=bias,
            dropout=self.attn_dropout if self.training else 0.0,
            stats=stats,
        )
        if stats is not None:
            self.max_logit, self.first_key = stats["max_logit"], stats["first_key"]
        return self.out(y.transpose(1, 2).reshape(B, T, H * self.v_dim))
