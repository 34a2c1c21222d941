"""Causal self-attention with grouped KV heads, sliding windows, QK-norm and logit soft-caps
(lecture 3: "MQA/GQA", "KV cache", "sliding-window and hybrid attention", "stability tricks").

- GQA (Ainslie et al. 2023): ``n_kv_heads`` key/value heads shared by groups of n_heads / n_kv_heads
  query heads; n_kv_heads = 1 is MQA (Shazeer 2019). The KV cache stores n_kv_heads heads only.
- Sliding window (Child et al. 2019; Beltagy et al. 2020; Mistral 7B): a query at position i sees keys
  j with i - W < j <= i, i.e. the window of W tokens counts the current token (Mistral / Hugging Face).
- QK-norm (Dehghani et al. 2023; OLMo 2, Qwen3): RMSNorm or LayerNorm of q and k over each head
  (``qk_norm_scope='head'``, one weight shared by the heads: Qwen3, Gemma 3), over the whole projection
  (``'all'``: OLMo 2, one norm of width n_heads * head_dim for q and n_kv_heads * head_dim for k), or over
  each head with per-head weights (``'head_untied'``: Cohere's ``use_qk_norm``).
- ``clip_qkv`` (OLMo 1.7): the q, k and v projections are clamped to [-c, c] before anything else.
- Attention-logit soft-cap (Gemma 2): s -> cap * tanh(s / cap) before the softmax.
- Query scale 1/sqrt(head_dim), or query_pre_attn_scalar**-0.5 (Gemma 2); under ``parametrization`` mup /
  completep 1/(sqrt(head_dim) sqrt(m)) (:mod:`lmlab.model.parametrization`).
- Gemma 4 (Gemma Team 2026; HF ``Gemma4TextAttention``): on the global layers their own head_dim and KV
  heads (``global_head_dim``, ``global_n_kv_heads``) and, with ``global_k_eq_v``, no value projection: the
  values are the raw key projection; ``v_norm``: a weightless RMSNorm on each value head. KV sharing
  (``kv_shared_layers``, Gemma 4 E2B/E4B): the last layers project queries only and attend to the keys and
  values their source layer (``ModelConfig.layer_kv_source``) computed in the same forward; they cache none.

The fast path is ``torch.nn.functional.scaled_dot_product_attention``; the soft-cap needs the
explicit softmax (computed in fp32).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.config import ModelConfig
from lmlab.kernels.causal_attention import blocked_causal_attention, use_blocked
from lmlab.kernels.linear import Linear
from lmlab.kernels.settings import default_kernels
from lmlab.model.norms import HeadwiseNorm, make_norm
from lmlab.model.parametrization import attention_scale
from lmlab.model.positions import RotaryEmbedding


class KVCache:
    """Preallocated key/value cache for all layers, storing the n_kv_heads key/value heads only.

    Cache index ``i`` is the i-th token fed through the cache (``length`` tokens so far). Full-attention
    layers keep every index: (batch, n_kv_heads, max_len, head_dim), and raise ValueError past max_len.
    Sliding-window layers with a window W < max_len keep a rolling buffer of W entries, index i in slot
    i % W: fixed memory however long the sequence, and they never fill up (a model whose layers are all
    windowed decodes past max_len). Memory in bytes:
    2 * batch * dtype bytes * sum over layers of n_kv_heads * head_dim (each layer's) * min(window or max_len,
    max_len);
    for multi-head latent attention, (kv_lora_rank + qk_rope_head_dim) instead of 2 * n_kv_heads * head_dim.
    Linear-attention layers ('D' in ``layer_pattern``) cache no keys: each holds a fixed-size recurrent state
    per sequence (:meth:`linear_state`, filled by the layer on its first call), counted in :attr:`nbytes`.

    ``left_pad`` (batch,) counts padding tokens at the start of each row (batched prompts of different
    lengths, left-padded): the model gives token i of row b the position i - left_pad[b] and never lets a
    real token attend to padding. Set it before the first token (constructor or ``model(idx, cache, left_pad)``).
    """

    # single-query attention as fused reductions (Attention._attend_one): only the compiled decode step's
    # view of a cache (lmlab.kernels.compiled_decode) sets it, in decode_layout's 'row-reductions' layout
    reductions = False

    def __init__(
        self,
        cfg: ModelConfig,
        batch: int,
        max_len: int,
        device=None,
        dtype=torch.float32,
        left_pad: Optional[torch.Tensor] = None,
    ):
        self.windows = [cfg.layer_window(i) for i in range(cfg.n_layers)]
        self.capacity = [w if (w is not None and w < max_len) else max_len for w in self.windows]
        self.rolling = [c < max_len for c in self.capacity]
        if cfg.attention == "mla":  # lmlab.model.mla: the latent and the shared RoPE key per token
            self.k = [torch.zeros((batch, 1, c, cfg.kv_lora_rank), device=device, dtype=dtype) for c in self.capacity]
            self.v = [
                torch.zeros((batch, 1, c, cfg.qk_rope_head_dim), device=device, dtype=dtype) for c in self.capacity
            ]
        else:  # per layer: Gemma 4's global layers have their own KV heads and head_dim; KV-shared and linear none
            self.k = [
                torch.zeros(
                    (
                        batch,
                        cfg.layer_n_kv_heads(i),
                        0 if (cfg.layer_kv_source(i) is not None or cfg.layer_is_linear(i)) else c,
                        cfg.layer_head_dim(i),
                    ),
                    device=device,
                    dtype=dtype,
                )
                for i, c in enumerate(self.capacity)
            ]
            self.v = [torch.zeros_like(t) for t in self.k]
        self.batch, self.max_len, self.device = batch, max_len, self.k[0].device
        self.states: dict[int, dict] = {i: {} for i in range(cfg.n_layers) if cfg.layer_is_linear(i)}
        self.length = 0
        self.left_pad: Optional[torch.Tensor] = None  # (batch,) long, None when no row is padded
        self.pad_max = 0  # Python ints: no device sync on the decode path
        self.pad_min = 0
        self._real_key: Optional[torch.Tensor] = None  # (batch, max_len) bool: index >= left_pad[b]
        if left_pad is not None:
            self.set_left_pad(left_pad)

    @property
    def nbytes(self) -> int:
        """Bytes held: keys and values, and the linear-attention layers' states."""
        states = [t for st in self.states.values() for t in st.values()]
        return sum(t.numel() * t.element_size() for t in self.k + self.v + states)

    def linear_state(self, layer: int) -> dict:
        """The recurrent state of linear-attention layer ``layer`` (a dict the layer fills and updates in
        place: ``GatedDeltaNet.forward``'s ``state``). Raises KeyError for an attention layer."""
        return self.states[layer]

    def set_left_pad(self, left_pad) -> None:
        """Record the left padding of each row (a sequence or tensor of ``batch`` ints); only while empty."""
        pad = torch.as_tensor(left_pad, dtype=torch.long, device=self.device).reshape(-1)
        if pad.shape[0] != self.batch:
            raise ValueError(f"left_pad has {pad.shape[0]} entries for a cache of batch {self.batch}")
        if self.length:
            raise ValueError("left_pad must be set before the first token enters the cache")
        self.pad_max, self.pad_min = int(pad.max()), int(pad.min())
        if self.pad_min < 0:
            raise ValueError(f"left_pad must be >= 0, got {pad.tolist()}")
        self.left_pad = pad if self.pad_max else None
        self._real_key = (
            (torch.arange(self.max_len, device=self.device)[None, :] >= pad[:, None]) if self.pad_max else None
        )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (batch, n_kv_heads, seq, head_dim), the cache indices length .. length+seq-1, and
        return (keys, values, first): every key the new queries may need, (batch, n_kv_heads, S, head_dim).
        ``first`` is the cache index of keys[..., 0, :] when the keys are consecutive indices in order;
        None when they are a wrapped rolling buffer (slot order; see :meth:`key_index`)."""
        T = k.shape[2]
        start, end = self.length, self.length + k.shape[2]
        kb, vb, cap = self.k[layer], self.v[layer], self.capacity[layer]
        if end <= cap:  # not (yet) wrapped: index i in slot i
            kb.narrow(2, start, T).copy_(k)
            vb.narrow(2, start, T).copy_(v)
            return kb.narrow(2, 0, end), vb.narrow(2, 0, end), 0
        if not self.rolling[layer]:
            raise ValueError(f"KV cache full: {end} positions needed, {self.max_len} allocated")
        if T == 1:  # decode: overwrite the oldest entry; every slot then lies inside the window
            kb.narrow(2, start % cap, 1).copy_(k)
            vb.narrow(2, start % cap, 1).copy_(v)
            return kb, vb, None
        # a chunk of several tokens: the cached window in index order, then the new keys
        n_old, r = min(start, cap), start % cap
        old_k = kb.narrow(2, 0, start) if start <= cap else torch.cat([kb[:, :, r:], kb[:, :, :r]], dim=2)
        old_v = vb.narrow(2, 0, start) if start <= cap else torch.cat([vb[:, :, r:], vb[:, :, :r]], dim=2)
        keys, values = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        keep = min(T, cap)  # then keep the newest ``cap`` entries in their slots
        slots = torch.arange(end - keep, end, device=kb.device) % cap
        kb.index_copy_(2, slots, k[:, :, T - keep :])
        vb.index_copy_(2, slots, v[:, :, T - keep :])
        return keys, values, start - n_old

    def key_index(self, layer: int, first: Optional[int], n_keys: int) -> torch.Tensor:
        """Cache indices (n_keys,) of the keys :meth:`update` returned for the current step."""
        if first is not None:
            return torch.arange(first, first + n_keys, device=self.device)
        cap, last = self.capacity[layer], self.length  # wrapped rolling buffer, one new token at index length
        slots = torch.arange(cap, device=self.device)
        return last - (last - slots) % cap

    def real_keys(self, layer: int, first: Optional[int], n_keys: int) -> Optional[torch.Tensor]:
        """(batch, 1, 1, n_keys) bool, False at padding keys, for one decoded token; None when no key of
        this step is padding."""
        if self.left_pad is None:
            return None
        lowest = first if first is not None else self.length + 1 - n_keys
        if lowest >= self.pad_max:
            return None
        if first is not None and first + n_keys <= self.max_len:
            return self._real_key[:, None, None, first : first + n_keys]
        idx = self.key_index(layer, first, n_keys)
        return (idx[None, :] >= self.left_pad[:, None])[:, None, None, :]


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: Optional[int], chunk: bool = False) -> torch.Tensor:
    """Boolean (seq_q, seq_k) mask, True where query at q_pos may attend key at k_pos:
    k_pos <= q_pos and, with a window W, q_pos - k_pos < W; with ``chunk``, instead k_pos // W ==
    q_pos // W (chunked attention: the earlier tokens of the query's own block of W; Llama 4)."""
    diff = q_pos[:, None] - k_pos[None, :]
    allowed = diff >= 0
    if window is not None and chunk:
        allowed = allowed & (
            torch.div(q_pos, window, rounding_mode="floor")[:, None]
            == torch.div(k_pos, window, rounding_mode="floor")[None, :]
        )
    elif window is not None:
        allowed = allowed & (diff < window)
    return allowed


def softcap(x: torch.Tensor, cap: Optional[float]) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2); identity when cap is None. Keeps |x| < cap."""
    return x if cap is None else cap * torch.tanh(x / cap)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    scale: Optional[float] = None,
    logit_softcap: Optional[float] = None,
    bias: Optional[torch.Tensor] = None,
    dropout: float = 0.0,
    stats: Optional[dict] = None,
    sinks: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Softmax attention with an arbitrary boolean mask, written out (fp32 logits).

    q: (batch, n_heads, T, head_dim); k, v: (batch, n_kv_heads, S, head_dim) with n_heads a multiple of
    n_kv_heads (GQA/MQA: each group of n_heads / n_kv_heads query heads reads one K/V head; Ainslie et
    al. 2023); mask: bool, broadcastable to (batch, n_heads, T, S), True where a query may attend (None:
    everywhere; a causal mask is :func:`causal_mask`); scale: default 1 / sqrt(head_dim) (Vaswani et al.
    2017); logit_softcap: cap * tanh(s / cap) on the logits (Gemma 2); bias: added to the logits
    after the cap (ALiBi, T5), broadcastable to the scores; dropout: on the probabilities (training
    only: pass 0 at evaluation); stats: a dict that gets "max_logit", the largest unmasked logit, and
    "first_key", the mean probability the queries after the first give the first key (the "attention sink"
    share of Xiao et al. 2024 and Qiu et al. 2025, meaningful when key 0 is the sequence's first token); sinks:
    (n_heads,) one more logit per head in every query's softmax, whose probability weighs no value
    (attention sinks, gpt-oss: HF ``GptOssAttention``'s ``sinks``; Xiao et al. 2024 keep a real sink token).
    Returns (batch, n_heads, T, head_dim) in v's dtype. A query row with no allowed key is NaN (with sinks: 0)."""
    group = q.shape[1] // k.shape[1]
    if group * k.shape[1] != q.shape[1]:
        raise ValueError(f"attention: {q.shape[1]} query heads are not a multiple of {k.shape[1]} K/V heads")
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # (B, H, T, S)
    scores = softcap(scores, logit_softcap)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if stats is not None:
        stats["max_logit"] = float(scores.max())
    if sinks is not None:  # the sink's column takes its share of the softmax and is dropped
        sink = sinks.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    if stats is not None:
        stats["first_key"] = float(probs[..., 1:, 0].mean()) if probs.shape[-2] > 1 else None
    if dropout:
        probs = F.dropout(probs, dropout)
    return torch.matmul(probs.to(v.dtype), v)


class Attention(nn.Module):
    """Multi-head causal self-attention: (batch, seq, d_model) -> (batch, seq, d_model).

    One fused projection produces q (n_heads heads), k and v (n_kv_heads heads each) of ``head_dim``;
    query head h reads key/value head h // (n_heads / n_kv_heads). Per layer (``cfg.layer_window``):
    local layers mask to the sliding window and use ``rope_local_theta`` (without ``rope_scaling``) when
    set; global layers attend to the whole prefix and carry no RoPE when ``nope_global_layers``, nor do
    the 'N' layers of ``nope_layers`` (``cfg.layer_has_rope``).
    Order of operations: projections -> QK-norm -> RoPE (or, on a layer without it, Llama 4's
    temperature) -> logits * scale -> soft-cap -> + position bias (ALiBi / T5) -> causal / window mask
    -> softmax (fp32 on the explicit path; with ``attn_sinks`` a learned logit per head joins it and takes
    probability mass without a value) -> with ``attn_output_gate``, each head's output times
    sigmoid(W_g x) (elementwise: one gate per output value; headwise: one per head; Qiu et al. 2025,
    "Gated Attention for Large Language Models", arXiv 2505.06708; Qwen3-Next puts W_g in the query
    projection) -> output projection.
    """

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        H, K, D = cfg.n_heads, cfg.layer_n_kv_heads(layer), cfg.layer_head_dim(layer)
        self.n_heads, self.n_kv_heads, self.head_dim = H, K, D
        self.layer = layer
        self.window = cfg.layer_window(layer)
        self.chunk = self.window is not None and cfg.local_attention == "chunk"
        self.k_eq_v = cfg.layer_k_eq_v(layer)  # Gemma 4: values are the key projection (no v rows)
        # KV sharing: a consumer layer projects queries only and reads its source layer's keys and values
        # (TransformerLM links them: _kv_source, a plain attribute, not a submodule)
        self.kv_source_layer = cfg.layer_kv_source(layer)
        self.cache_layer = layer if self.kv_source_layer is None else self.kv_source_layer
        self._kv_source: Optional["Attention"] = None
        self.kv_store = False  # set on a source layer: keep this forward's (keys, values, first) in _kv
        self._kv = None
        kv_rows = 0 if self.kv_source_layer is not None else (1 if self.k_eq_v else 2) * K
        bias = cfg.bias in ("all", "qkv", "attention")
        self.qkv = Linear(cfg.d_model, (H + kv_rows) * D, bias=bias)
        self.out = Linear(H * D, cfg.d_model, bias=cfg.bias in ("all", "attention"))
        self.out.is_residual_projection = True
        self.gate = (
            None
            if cfg.attn_output_gate == "none"
            else Linear(cfg.d_model, H * D if cfg.attn_output_gate == "elementwise" else H, bias=bias)
        )
        self.sinks = nn.Parameter(torch.zeros(H)) if cfg.attn_sinks else None  # reset_parameters: zeros
        self.qk_norm_all = cfg.qk_norm_scope == "all"
        self.clip_qkv = cfg.clip_qkv
        qk_norm = cfg.qk_norm if (cfg.qk_norm_layers == "all" or cfg.layer_has_rope(layer)) else "none"
        if qk_norm == "l2":  # Llama 4's L2Norm: RMS over each head, no weight (commutes with RoPE, a rotation)
            self.q_norm = make_norm("rmsnorm", D, cfg.norm_eps, affine=False)
            self.k_norm = make_norm("rmsnorm", D, cfg.norm_eps, affine=False)
        elif qk_norm != "none" and cfg.qk_norm_scope == "head_untied":
            self.q_norm = HeadwiseNorm(cfg.qk_norm, H, D, cfg.norm_eps)
            self.k_norm = HeadwiseNorm(cfg.qk_norm, K, D, cfg.norm_eps)
        elif qk_norm != "none":
            width_q, width_k = (H * D, K * D) if self.qk_norm_all else (D, D)
            fp32 = cfg.norm_weight_fp32  # OLMo 2's order of weight and cast (see RMSNorm)
            self.q_norm = make_norm(cfg.qk_norm, width_q, cfg.norm_eps, bias=False, weight_fp32=fp32)
            self.k_norm = make_norm(cfg.qk_norm, width_k, cfg.norm_eps, bias=False, weight_fp32=fp32)
        else:
            self.q_norm = self.k_norm = None
        if self.kv_source_layer is not None:  # no keys of its own to normalise
            self.k_norm = None
        self.v_norm = (
            make_norm("rmsnorm", D, cfg.norm_eps, affine=False) if cfg.v_norm and self.kv_source_layer is None else None
        )  # Gemma 4
        self.rope = None
        if cfg.layer_has_rope(layer):
            theta = cfg.rope_local_theta if (self.window is not None and cfg.rope_local_theta) else cfg.rope_theta
            scaling = None if (self.window is not None and cfg.rope_local_theta) else cfg.rope_scaling
            proportion = cfg.global_rope_proportion if self.window is None else None
            self.rope = RotaryEmbedding(
                D, cfg.rope_fraction, theta, cfg.rope_style, cfg.context_length, scaling, proportion
            )
        # Llama 4's attention temperature on layers without RoPE: (floor, scale), see temperature()
        self.temperature = (
            (cfg.attn_temperature_floor, cfg.attn_temperature_scale)
            if cfg.attn_temperature_tuning and self.rope is None
            else None
        )
        # training on CPU: lmlab.kernels.causal_attention's blocked kernel where use_blocked() says so
        # (False: always SDPA, e.g. to compare the two)
        self.blocked_kernel = True
        self.kernels = default_kernels()  # the model's KernelSettings (TransformerLM.set_kernels)
        # 1/sqrt(D), or query_pre_attn_scalar**-0.5; mup / completep: 1/(sqrt(D) sqrt(m)) (lmlab.model.parametrization)
        self.scale = attention_scale(cfg, D)
        self.logit_cap = cfg.attn_logit_softcap
        self.attn_dropout = cfg.attn_dropout
        self.max_logit: Optional[float] = None  # set when record_max_logit is on (stability diagnostics)
        self.first_key: Optional[float] = None  # and the attention share of the first key (see attention())
        self.record_max_logit = False

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: Optional[KVCache] = None,
        bias_fn: Optional[Callable] = None,
        left_pad: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """x: (batch, seq, d_model); positions: (seq,) absolute positions of x's tokens, or (batch, seq)
        per row; cache: KV cache holding the earlier tokens (its ``length`` is the cache index of x's first
        token); bias_fn(q_idx, k_idx, layer) -> additive (n_heads, seq_q, seq_k) fp32 logit bias (ALiBi,
        T5; a function of k_idx - q_idx only) or None; left_pad: (batch,) leading padding tokens per row
        (masked as keys), None for none."""
        B, T, _ = x.shape
        H, K, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv(x)
        if self.clip_qkv is not None:
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        shared = self.kv_source_layer is not None
        if shared:  # KV sharing: queries only; keys and values from the source layer's forward
            q = qkv.view(B, T, H, D)
            if self.q_norm is not None and self.qk_norm_all:
                q = self.q_norm(qkv).view(B, T, H, D)
            q = q.transpose(1, 2)
            if self.q_norm is not None and not self.qk_norm_all:
                q = self.q_norm(q)
            if self.rope is not None:
                q = self.rope(q, positions)
            k, v, first = self._kv_source._kv
        elif self.q_norm is None and not self.k_eq_v and self.v_norm is None:  # q, k rotated together
            qkv = qkv.view(B, T, H + 2 * K, D)
            qk, v = qkv.narrow(2, 0, H + K), qkv.narrow(2, H + K, K).transpose(1, 2)
            if self.rope is not None:
                qk = self.rope.rotate(qk, positions)
            qk = qk.transpose(1, 2)
            q, k = qk.narrow(1, 0, H), qk.narrow(1, H, K)  # (B, H, T, D), (B, K, T, D)
        else:
            if self.k_eq_v:  # Gemma 4's global layers: the values are the raw key projection
                q, k = qkv.split([H * D, K * D], dim=-1)
                v = k
            else:
                q, k, v = qkv.split([H * D, K * D, K * D], dim=-1)
            if self.q_norm is not None and self.qk_norm_all:  # OLMo 2: one norm across all heads
                q, k = self.q_norm(q), self.k_norm(k)
            q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
            k = k.view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
            v = v.view(B, T, K, D).transpose(1, 2)
            if self.q_norm is not None and not self.qk_norm_all:
                q, k = self.q_norm(q), self.k_norm(k)
            if self.v_norm is not None:
                v = self.v_norm(v)
            if self.rope is not None:
                q, k = self.rope(q, positions), self.rope(k, positions)
        if self.temperature is not None:
            q = q * self.temperature_of(positions).to(q.dtype)
        dropout = self.attn_dropout if self.training else 0.0
        plain = self.logit_cap is None and not self.record_max_logit and bias_fn is None and self.sinks is None
        if cache is None and self.kv_store:
            self._kv = (k, v, None)
        if cache is None:
            if plain and self.window is None and left_pad is None:  # the training path
                if (
                    not dropout
                    and self.blocked_kernel
                    and torch.is_grad_enabled()
                    and use_blocked(q, self.kernels.blocked_attention_fp32)
                ):
                    # CPU: faster than SDPA there; traced into the graph when the model is compiled
                    y = blocked_causal_attention(q, k, v, self.scale, fused=self.kernels.fused_loops)
                else:
                    y = F.scaled_dot_product_attention(
                        q, k, v, is_causal=True, dropout_p=dropout, scale=self.scale, enable_gqa=K != H
                    )
                return self._out(y.transpose(1, 2).reshape(B, T, H * D), x)
            q_idx = k_idx = torch.arange(T, device=x.device)
        else:
            start = cache.length
            if not shared:
                k, v, first = cache.update(self.layer, k, v)
                if self.kv_store:
                    self._kv = (k, v, first)
            S = k.shape[2]
            if T == 1 and plain and not dropout:  # decode: every returned key is causal and in the window
                mask = cache.real_keys(self.cache_layer, first, S) if left_pad is not None else None
                mask = self._chunk_keys(cache, first, S, mask)
                return self._out(self._attend_one(q, k, v, mask).view(B, 1, H * D), x)
            if plain and S == T and self.window is None and left_pad is None:  # prefill of an empty cache
                y = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, dropout_p=dropout, scale=self.scale, enable_gqa=K != H
                )
                return self._out(y.transpose(1, 2).reshape(B, T, H * D), x)
            q_idx = torch.arange(start, start + T, device=x.device)
            k_idx = cache.key_index(self.cache_layer, first, S)
        # cache indices and positions differ by the row's padding only: masks and relative biases use indices
        bias = bias_fn(q_idx, k_idx, self.layer) if bias_fn is not None else None
        allowed = causal_mask(q_idx, k_idx, self.window, self.chunk)
        if left_pad is not None:  # no attending to padding; a padding query attends to itself (no empty row)
            allowed = (allowed & (k_idx[None, :] >= left_pad[:, None])[:, None, None, :]) | (
                q_idx[:, None] == k_idx[None, :]
            )
        if self.logit_cap is None and not self.record_max_logit and self.sinks is None:
            mask = torch.zeros(allowed.shape, device=x.device, dtype=q.dtype)
            mask = mask.masked_fill(~allowed, float("-inf"))
            if bias is not None:
                mask = mask + bias.to(q.dtype)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.scale, enable_gqa=K != H
            )
        else:
            y = self._explicit(q, k, v, allowed, bias, dropout)
        return self._out(y.transpose(1, 2).reshape(B, T, H * D), x)

    def _out(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The output projection of the heads' outputs y (batch, seq, n_heads * head_dim), after the output
        gate sigmoid(W_g x) when ``attn_output_gate`` is set (x: the layer's input, (batch, seq, d_model))."""
        if self.gate is not None:
            g = torch.sigmoid(self.gate(x))
            if g.shape[-1] == self.n_heads:  # headwise: one gate per head, broadcast over its values
                y = (y.view(*y.shape[:-1], self.n_heads, self.head_dim) * g.unsqueeze(-1)).view_as(y)
            else:
                y = y * g
        return self.out(y)

    def decode_one_obstacle(self) -> Optional[str]:
        """What keeps :meth:`decode_one` from running this layer, as a phrase (the first of: QK-norm,
        clip_qkv, a logit soft-cap, max-logit recording, Llama 4's temperature, values equal to keys, a
        value norm, KV sharing, an output gate, sinks), or None when it can (position biases are the
        model's: ALiBi and T5 models never take the lean path)."""
        checks = (
            (self.q_norm is not None, "QK-norm"),
            (self.clip_qkv is not None, "clip_qkv"),
            (self.logit_cap is not None, "an attention logit soft-cap"),
            (self.record_max_logit, "max-logit recording"),
            (self.temperature is not None, "Llama 4's attention temperature"),
            (self.k_eq_v, "values equal to keys (k_eq_v)"),
            (self.v_norm is not None, "a value norm (v_norm)"),
            (self.kv_source_layer is not None or self.kv_store, "keys and values shared across layers"),
            (self.gate is not None, "an attention output gate"),
            (self.sinks is not None, "attention sinks"),
        )
        return next((what for present, what in checks if present), None)

    @property
    def supports_decode_one(self) -> bool:
        """Whether :meth:`decode_one` can run this layer (:meth:`decode_one_obstacle` is None)."""
        return self.decode_one_obstacle() is None

    def temperature_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Llama 4's query scale at each position p: 1 + scale * log(1 + floor((p + 1) / floor)), fp32,
        (1, 1, seq, 1) for positions (seq,) or (batch, 1, seq, 1) for (batch, seq). 1 below p = floor - 1:
        it only grows past the floor (8192 tokens in Llama 4). Source: HF ``Llama4TextAttention``, citing
        Nakanishi 2025, "Scalable-Softmax Is Superior for Attention" (arXiv 2501.19399)."""
        floor, scale = self.temperature
        t = 1.0 + scale * torch.log1p(torch.floor((positions.float() + 1.0) / floor))
        return t.view(1, 1, -1, 1) if t.dim() == 1 else t[:, None, :, None]

    def decode_one(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One new token per row, inference only (see ``TransformerLM.hidden``): x (batch, d_model) ->
        (batch, d_model), the same as :meth:`forward` for a layer with :attr:`supports_decode_one`, in fewer
        operations: the projections are called without ``nn.Module`` hooks, q and k are rotated together
        and the cache's left padding (if any) masks the keys."""
        B = x.shape[0]
        H, K, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv.forward(x).view(B, H + 2 * K, 1, D)  # one token: (B, 1, heads, D) is (B, heads, 1, D)
        qk = qkv.narrow(1, 0, H + K)
        if self.rope is not None:
            qk = self.rope.rotate(qk, positions)
        keys, values, first = cache.update(self.layer, qk.narrow(1, H, K), qkv.narrow(1, H + K, K))
        mask = cache.real_keys(self.layer, first, keys.shape[2]) if cache.left_pad is not None else None
        mask = self._chunk_keys(cache, first, keys.shape[2], mask)
        return self.out.forward(self._attend_one(qk.narrow(1, 0, H), keys, values, mask, cache.reductions))

    def _chunk_keys(
        self, cache: KVCache, first: Optional[int], n_keys: int, mask: Optional[torch.Tensor]
    ) -> Optional[torch.Tensor]:
        """For a chunked layer decoding one token (its cache index is ``cache.length``: the model advances
        the length after every layer): ``mask`` (batch, 1, 1, n_keys) or None, also False at the cached
        keys of earlier chunks (the rolling buffer of W slots still holds some of them)."""
        if not self.chunk:
            return mask
        idx = cache.key_index(self.cache_layer, first, n_keys)
        start = (cache.length // self.window) * self.window  # the new token's index is cache.length
        if int(idx.min()) >= start:
            return mask
        same = (idx >= start)[None, None, None, :]
        return same if mask is None else mask & same

    def _attend_one(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], reductions: bool = False
    ):
        """Single-query attention over every key given (all causal and inside the window): q (batch, heads,
        1, head_dim), k and v (batch, n_kv_heads, S, head_dim), mask (batch or 1,
        1, 1, S) bool (False: padding) or None -> (batch, heads * head_dim).

        The query heads of a KV group are folded into the query-length dimension: no K/V repeat. Written
        out, for one query row per head two matmuls and a softmax beat SDPA's flash kernel on CPU (107 vs
        59 us at batch 8, 21 vs 22 at batch 1, demo shape). With ``reductions`` (the compiled decode step in
        decode_layout's 'row-reductions' layout) the two products are sums of elementwise products instead,
        which Inductor fuses with the softmax into the layer's own loops (the same values up to summation
        order; in bf16 it keeps the products in fp32)."""
        B, H, K, D = q.shape[0], self.n_heads, self.n_kv_heads, self.head_dim
        S = k.shape[2]
        if reductions:
            scores = (q.reshape(B, K, H // K, 1, D) * k.reshape(B, K, 1, S, D)).sum(-1) * self.scale  # (B, K, G, S)
            if mask is not None:
                scores = scores.masked_fill(~mask.view(mask.shape[0], 1, 1, S), float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1)
            return (probs.unsqueeze(-1) * v.reshape(B, K, 1, S, D)).sum(-2).to(v.dtype).reshape(B, H * D)
        # (B * K, G, D) @ (B * K, D, S): one bmm over the batch and the KV heads, then the scale in place
        scores = torch.bmm(q.reshape(B * K, H // K, D), k.reshape(B * K, S, D).transpose(1, 2)).mul_(self.scale)
        if mask is not None:
            scores.view(B, K, H // K, S).masked_fill_(~mask, float("-inf"))
        probs = (
            torch.softmax(scores, dim=-1)
            if scores.dtype == torch.float32
            else torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        )  # fp32 whatever the cache dtype
        return torch.bmm(probs, v.reshape(B * K, S, D)).view(B, H * D)

    def _explicit(self, q, k, v, allowed, bias, dropout):
        """:func:`attention` written out, for soft-caps and logit diagnostics (records max_logit)."""
        stats = {} if self.record_max_logit else None
        y = attention(
            q,
            k,
            v,
            allowed,
            scale=self.scale,
            logit_softcap=self.logit_cap,
            bias=bias,
            dropout=dropout,
            stats=stats,
            sinks=self.sinks,
        )
        if stats is not None:
            self.max_logit, self.first_key = stats["max_logit"], stats["first_key"]
        return y
