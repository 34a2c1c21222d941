"""Gated DeltaNet: linear attention with a gated delta-rule state (Yang, Kautz and Hatamizadeh 2024, "Gated
Delta Networks: Improving Mamba2 with Delta Rule", arXiv 2412.06464; the linear layers of Qwen3-Next's
3 linear : 1 full hybrid). Lecture 3's local/global idea taken to its end: a layer whose "cache" is a
fixed-size state per head, however long the sequence.

Per value head, with a state S (d_k x d_v), a decay g_t <= 0 (log space), a write strength beta_t in
(0, 1), and L2-normalised q_t, k_t (q also x d_k^-1/2):

    S_t = e^{g_t} S_{t-1} + k_t (beta_t (v_t - e^{g_t} S_{t-1}^T k_t))^T      (decay, then the delta rule:
    o_t = S_t^T q_t                                                             replace what k_t recalls)

Two forms compute it. :func:`gated_delta_recurrent` steps token by token (decoding: one step per token
from the carried state). :func:`gated_delta_chunked` (training) works on chunks of C tokens: with the
chunk's cumulative decay gamma_t = sum_{j <= t} g_j and its entry state S_0, the state is
S_t = e^{gamma_t} S_0 + sum_{i <= t} e^{gamma_t - gamma_i} k_i w_i^T, where the pseudo-values w solve the
unit lower-triangular system (I + A) W = beta (V - e^{gamma} K S_0), A_ti = beta_t e^{gamma_t - gamma_i}
k_t . k_i for i < t (the WY form of Yang et al. 2024, "Parallelizing Linear Transformers with the Delta
Rule over Sequence Length", with the gate); then O = e^{gamma} Q S_0 + (Q K^T o D o causal) W with
D_ti = e^{gamma_t - gamma_i}, and the chunk's exit state S_C = e^{gamma_C} S_0 + (e^{gamma_C - gamma} K)^T W.
The two forms agree to rounding (tests/test_deltanet.py, against a float64 loop too).

:class:`GatedDeltaNet` is the layer as Qwen3-Next builds it (HF ``Qwen3NextGatedDeltaNet``): projections
to q, k (``n_k_heads`` x d_k), v and the output gate z (``n_v_heads`` x d_v), beta and the decay input a
(one per value head); a causal depthwise convolution (kernel ``conv_kernel``) with SiLU over q, k, v;
beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias); value heads share key heads in groups; the
output RMSNorm(o) x SiLU(z) per head, then the output projection. Its decoding state per sequence: the
convolution's last ``conv_kernel - 1`` inputs and S per value head.

In a model, ``layer_pattern`` letter 'D' puts this layer where attention would be (``ModelConfig.linear_*``
fields give its sizes); its decoding state lives in :class:`lmlab.model.attention.KVCache` beside the other
layers' keys and values. The recurrence runs in fp32 (float64 for a float64 model) with autocast off:
the decay products and the triangular solve lose too much in bf16. Under ``torch.compile`` the
recurrence is compiled apart from the layer, in a graph of its own with autocast off (a graph break
around :func:`_delta_rule`, :func:`_separate_delta_rule`): Inductor (torch 2.13, CPU) compiled the whole
layer under bf16 autocast to NaN outputs from the first step, while eager, ``aot_eager`` and fp32 Inductor
were finite, and so is the recurrence compiled alone (found 2026-12-06 by spec 16's move to bf16;
tests/test_deltanet.py).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.kernels.linear import Linear


def gated_delta_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token (module docstring). q, k (batch, heads, T, d_k) (already
    normalised and scaled), v (batch, heads, T, d_v), g and beta (batch, heads, T), state (batch, heads, d_k,
    d_v) or None (zeros). Returns (o (batch, heads, T, d_v), the final state), in the inputs' dtype."""
    B, H, T, dk = k.shape
    S = state if state is not None else k.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, :, t, None, None].exp()
        recalled = torch.einsum("bhk,bhkv->bhv", k[:, :, t], S)
        S = S + k[:, :, t, :, None] * (beta[:, :, t, None] * (v[:, :, t] - recalled))[:, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(out, 2), S


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk: int = 64,
    state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as :func:`gated_delta_recurrent`, ``chunk`` tokens at a time (module docstring); T need not
    be a multiple of ``chunk`` (the last chunk is shorter). Raises ValueError for chunk < 1."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    B, H, T, dk = k.shape
    S = state if state is not None else k.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for s in range(0, T, chunk):
        Q, K, V = q[:, :, s : s + chunk], k[:, :, s : s + chunk], v[:, :, s : s + chunk]
        gam, bet = g[:, :, s : s + chunk].cumsum(-1), beta[:, :, s : s + chunk]
        C = K.shape[2]
        causal = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
        diff = (gam[..., :, None] - gam[..., None, :]).masked_fill(~causal, float("-inf"))
        D = diff.exp()  # e^{gamma_t - gamma_i} for i <= t, else 0
        A = (bet[..., :, None] * D * (K @ K.transpose(-1, -2))).tril(-1)
        eye = torch.eye(C, dtype=k.dtype, device=k.device)
        rhs = bet[..., None] * (V - gam.exp()[..., None] * (K @ S))
        W = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        out.append(gam.exp()[..., None] * (Q @ S) + ((Q @ K.transpose(-1, -2)) * D) @ W)
        last = gam[..., -1:]
        S = last.exp()[..., None] * S + ((last - gam).exp()[..., None] * K).transpose(-1, -2) @ W
    return torch.cat(out, 2), S


def _delta_rule(q, k, v, g, beta, chunk: int, state: Optional[torch.Tensor], device_type: str):
    """The recurrence with autocast off (the projections around it may autocast): one token by
    :func:`gated_delta_recurrent`, more by :func:`gated_delta_chunked`."""
    with torch.autocast(device_type, enabled=False):
        if q.shape[2] == 1:
            return gated_delta_recurrent(q, k, v, g, beta, state)
        return gated_delta_chunked(q, k, v, g, beta, chunk, state)


_SEPARATE = []  # _delta_rule wrapped by torch.compiler.disable, made once (it imports torch._dynamo: 1.5 s)


def _separate_delta_rule():
    """:func:`_delta_rule` as ``torch.compile`` must run it: a graph break around its own frame (module
    docstring: Inductor's bf16 NaN in the layer's graph), whose autocast switch runs eagerly, while the
    recurrence it calls (:func:`gated_delta_chunked` or :func:`gated_delta_recurrent`, fp32 inputs, autocast
    off) is compiled by the same ``torch.compile`` as a graph of its own (``recursive=False``; against
    running it eagerly: docs/bench/lab_throughput.md). Without ``torch.compile``
    it is :func:`_delta_rule`. Made on first use, so that importing lmlab.model does not import
    torch._dynamo."""
    if not _SEPARATE:
        _SEPARATE.append(
            torch.compiler.disable(
                _delta_rule, recursive=False, reason="Inductor (torch 2.13, CPU) gives NaN for the layer in bf16"
            )
        )
    return _SEPARATE[0]


class GatedDeltaNet(nn.Module):
    """A Gated DeltaNet layer (module docstring): (batch, seq, d_model) -> (batch, seq, d_model).

    ``state``: None (a fresh sequence), or a dict {"conv": (batch, channels, conv_kernel - 1), "S": (batch,
    n_v_heads, d_k, d_v)} carried from the previous call and updated in place (decoding, or a long
    sequence in pieces)."""

    def __init__(
        self,
        d_model: int,
        n_k_heads: int,
        n_v_heads: int,
        d_k: int,
        d_v: int,
        conv_kernel: int = 4,
        chunk: int = 64,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        if n_v_heads % n_k_heads:
            raise ValueError(f"n_v_heads={n_v_heads} must be a multiple of n_k_heads={n_k_heads}")
        self.n_k, self.n_v, self.d_k, self.d_v, self.chunk, self.eps = n_k_heads, n_v_heads, d_k, d_v, chunk, norm_eps
        self.kernel = conv_kernel
        self.channels = 2 * n_k_heads * d_k + n_v_heads * d_v  # q, k, v through the convolution
        self.in_proj = Linear(d_model, self.channels + n_v_heads * d_v + 2 * n_v_heads, bias=False)  # qkv, z, b, a
        self.conv_weight = nn.Parameter(torch.empty(self.channels, 1, conv_kernel))  # depthwise, causal, no bias
        self.A_log = nn.Parameter(torch.empty(n_v_heads))
        self.dt_bias = nn.Parameter(torch.empty(n_v_heads))
        self.norm = nn.Module()  # the gated RMSNorm (its weight, shared by the heads: an optimiser 'norm')
        self.norm.weight = nn.Parameter(torch.empty(d_v))
        self.rope = None  # (what TransformerLM asks of every layer's mixer)
        self.supports_decode_one = False  # one-token steps take the ordinary forward
        self.record_max_logit, self.max_logit, self.first_key = False, None, None  # no attention (diagnostics: None)
        self.out = Linear(n_v_heads * d_v, d_model, bias=False)
        self.out.is_residual_projection = True
        self._delta_rule = _separate_delta_rule()  # a plain function attribute: no parameters, not in state_dict
        self.reset_gdn_parameters()

    def reset_gdn_parameters(self) -> None:
        """Convolution N(0, 1/kernel)-ish uniform (PyTorch Conv1d's default), A = 1..16 (log), dt_bias so that
        softplus(dt_bias) spans 1e-3..1e-1 (Mamba's init), the norm weight 1."""
        with torch.no_grad():
            bound = 1 / math.sqrt(self.kernel)
            self.conv_weight.uniform_(-bound, bound)
            self.A_log.copy_(torch.log(torch.empty_like(self.A_log).uniform_(1, 16)))
            dt = torch.exp(torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # the inverse of softplus
            self.norm.weight.fill_(1.0)

    def forward(
        self, x: torch.Tensor, state: Optional[dict] = None, real: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """x (batch, seq, d_model) -> (batch, seq, d_model). ``real`` (batch, seq) bool: False at left
        padding, whose inputs are zeroed (HF's ``apply_mask_to_padding_states``): with zero inputs the padding
        writes nothing to the state (k = 0) and leaves the convolution's history at its initial zeros, so a
        padded row gives the same outputs as the row alone."""
        if real is not None:
            x = x * real[..., None].to(x.dtype)
        B, T, _ = x.shape
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32  # the state's dtype: fp32 at least
        Hk, Hv, dk, dv = self.n_k, self.n_v, self.d_k, self.d_v
        qkv, z, b, a = self.in_proj(x).split([self.channels, Hv * dv, Hv, Hv], dim=-1)
        qkv = qkv.transpose(1, 2)  # (B, channels, T)
        past = (
            state["conv"] if state is not None and "conv" in state else qkv.new_zeros(B, self.channels, self.kernel - 1)
        )
        padded = torch.cat([past.to(qkv.dtype), qkv], dim=2)
        if state is not None:
            state["conv"] = padded[:, :, -(self.kernel - 1) :].detach() if self.kernel > 1 else past
        qkv = F.silu(F.conv1d(padded.to(self.conv_weight.dtype), self.conv_weight, groups=self.channels)).transpose(
            1, 2
        )
        q, k, v = qkv.split([Hk * dk, Hk * dk, Hv * dv], dim=-1)
        q, k = (t.reshape(B, T, Hk, dk).to(ct) for t in (q, k))  # x / sqrt(|x|^2 + 1e-6), as FLA's l2norm
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        if Hv != Hk:  # each key head serves n_v / n_k consecutive value heads
            q, k = q.repeat_interleave(Hv // Hk, dim=2), k.repeat_interleave(Hv // Hk, dim=2)
        v = v.reshape(B, T, Hv, dv).to(ct)
        beta = torch.sigmoid(b.to(ct))
        g = -self.A_log.to(ct).exp() * F.softplus(a.to(ct) + self.dt_bias.to(ct))
        q, k, v, beta, g = (t.transpose(1, 2) for t in (q, k, v, beta, g))  # heads first
        S = state.get("S") if state is not None else None
        o, S = self._delta_rule(q, k, v, g, beta, self.chunk, S, x.device.type)
        if state is not None:
            state["S"] = S.detach()
        o = o.transpose(1, 2)  # (B, T, Hv, dv)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm.weight.to(ct)
        o = o * F.silu(z.reshape(B, T, Hv, dv).to(ct))
        return self.out(o.reshape(B, T, Hv * dv).to(self.out.weight.dtype))

    def state_bytes(self, dtype_bytes: int = 4, state_dtype_bytes: int = 4) -> int:
        """Bytes of one sequence's decoding state: the convolution's last inputs (in the model's dtype,
        ``dtype_bytes``) and S per value head (fp32: ``state_dtype_bytes``)."""
        return dtype_bytes * self.channels * (self.kernel - 1) + state_dtype_bytes * self.n_v * self.d_k * self.d_v
