"""Position information (lecture 3: "position embeddings": sinusoidal, learned, relative, RoPE, NoPE).

- Sinusoidal absolute (Vaswani et al. 2017) and learned absolute (GPT-2/3): added to the token
  embeddings.
- RoPE (Su et al. 2021, "RoFormer"): rotate pairs of q/k channels by an angle proportional to the
  position, so q.k depends on positions only through their offset. Two pairings exist:
  "half" pairs channel i with i + rot/2 (GPT-NeoX, Hugging Face Llama), "interleaved" pairs 2i with 2i+1
  (GPT-J, Meta's original LLaMA code). Partial RoPE rotates only the first ``rope_fraction`` of
  head_dim (GPT-J, GPT-NeoX, Phi).
- ALiBi (Press et al. 2022): a per-head linear penalty -m_h * (i - j) on attention logits.
- NoPE (Kazemnejad et al. 2023): nothing; the causal mask alone carries order.

Tables are computed in fp32 whatever the autocast dtype.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn

from lmlab.config import ModelConfig


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """Vaswani et al. 2017 section 3.5: PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(...).

    Returns (length, dim) fp32. An odd ``dim`` drops the last cosine channel.
    """
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    inv = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)[:, : dim // 2]
    return table.float()


def rope_inv_freq(rot_dim: int, theta: float) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/rot_dim), i < rot_dim/2: (rot_dim // 2,) fp32."""
    return 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)).float()


class RotaryEmbedding(nn.Module):
    """RoPE applied to q or k of shape (batch, heads, seq, head_dim) at integer positions (seq,).

    ``rot_dim`` = round(head_dim * rope_fraction) leading channels are rotated, the rest pass through.
    ``proportion`` (Gemma 4's "proportional" RoPE, HF rope_type 'proportional'): the whole head is paired
    and the frequencies are theta^(-2i/head_dim), but only the first int(proportion * head_dim // 2) pairs
    rotate; the others get frequency 0 (cos 1, sin 0: they pass through). Unlike ``rope_fraction``
    (GPT-NeoX), which pairs and spaces the frequencies over the rotated channels alone.
    Angles are position * inv_freq radians (fp32). With ``scaling`` (``ModelConfig.rope_scaling``) the
    frequencies come from :func:`lmlab.model.rope_scaling.scale_inv_freq`, and its attention factor
    multiplies the cos/sin tables (so q.k by its square), as Hugging Face applies YaRN's factor.
    The tables are rebuilt (fp32, same device) when a position beyond them is asked for
    or when the module was cast to a lower precision.
    """

    def __init__(
        self,
        head_dim: int,
        rope_fraction: float,
        theta: float,
        style: str,
        max_len: int,
        scaling: Optional[dict] = None,
        proportion: Optional[float] = None,
    ):
        super().__init__()
        self.rot_dim = int(round(head_dim * rope_fraction))
        self.key = (head_dim, rope_fraction, theta, style, repr(scaling), proportion)  # equal keys: equal tables
        self.style = style
        self._theta, self._scaling, self._proportion = theta, scaling, proportion
        inv_freq = self._frequencies()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(min(max_len, 8192), inv_freq.device)  # grown on demand by ensure()

    def _frequencies(self) -> torch.Tensor:
        """(rot_dim // 2,) fp32 inverse frequencies (scaled), on the default device; sets the attention
        factor and the master copy ``_inv_freq_fp32`` (not cast by module.to(dtype))."""
        inv_freq = rope_inv_freq(self.rot_dim, self._theta)
        attention_factor = 1.0
        if self._scaling is not None:
            from lmlab.model.rope_scaling import scale_inv_freq  # RoPE context extension methods

            inv_freq, attention_factor = scale_inv_freq(inv_freq, self.rot_dim, self._theta, self._scaling)
        if self._proportion is not None:  # proportional RoPE: only the first pairs turn
            inv_freq = inv_freq.clone()
            inv_freq[int(self._proportion * self.rot_dim // 2) :] = 0.0
        self.attention_factor = attention_factor
        self._inv_freq_fp32 = inv_freq.float().clone()
        return inv_freq

    def reset_tables(self) -> None:
        """Recompute every table (non-persistent buffers, not in a state dict) from the constructor's
        arguments, on the device the tables are on: after ``Module.to_empty`` (meta-device construction)
        they hold uninitialised memory. ``TransformerLM`` calls this when it leaves the meta device."""
        device = self.cos.device
        with torch.device("cpu"):  # the formulas, whatever the default device (meta while building)
            inv_freq = self._frequencies()
        self.inv_freq = inv_freq.to(device=device, dtype=self.inv_freq.dtype)
        self._build(self.cos.shape[0], device)

    def _build(self, length: int, device) -> None:
        inv_freq = self._inv_freq_fp32.to(device)
        angles = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)  # (L, rot/2)
        if self.style == "half":
            angles = torch.cat([angles, angles], dim=-1)
        else:
            angles = torch.repeat_interleave(angles, 2, dim=-1)
        self.register_buffer("cos", angles.cos() * self.attention_factor, persistent=False)
        self.register_buffer("sin", angles.sin() * self.attention_factor, persistent=False)
        # sin with the sign of the rotation folded in: rotate(x) * sin == swap(x) * sin_signed, exactly
        sign = torch.ones(self.rot_dim, device=device)
        if self.style == "half":
            sign[: self.rot_dim // 2] = -1
        else:
            sign[0::2] = -1
        self.register_buffer("sin_signed", self.sin * sign, persistent=False)
        self._memo = None  # (positions, cos, sin) of the last rotate() without autograd

    def ensure(self, length: int) -> None:
        """Make the tables cover positions < ``length`` (and be fp32). Called by the model with a
        Python int before each forward, so the forward itself never syncs with the device."""
        current = self.cos.shape[0]
        if length > current or self.cos.dtype != torch.float32:
            self._build(max(length, 2 * current) if length > current else current, self.cos.device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (batch, heads, seq, head_dim); positions: (seq,) or per row (batch, seq), below the length
        given to :meth:`ensure`."""
        cos, sin = self.cos[positions], self.sin_signed[positions]  # (seq, rot) or (batch, seq, rot)
        if positions.dim() == 2:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return self._rotate(x, cos, sin)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Like :meth:`forward` for the (batch, seq, heads, head_dim) layout (q and k side by side); for one
        token (batch, heads, 1, head_dim) works too. ``positions``: (seq,), per row (batch, seq), or a
        ``slice`` of consecutive positions (then the tables are read as a view, no gather).

        Without autograd (inference, decoding) the gathered tables are kept for the next call with the
        same ``positions`` tensor: the layers sharing this module (TransformerLM shares one per distinct
        RoPE) gather them once per forward."""
        if torch.compiler.is_compiling():  # a compiled graph shares the gathers itself; no memo across graphs
            return self._rotate(x, self.cos[positions].unsqueeze(-2), self.sin_signed[positions].unsqueeze(-2))
        memo = self._memo
        if memo is not None and memo[0] is positions:
            return self._rotate(x, memo[1], memo[2])
        cos, sin = self.cos[positions].unsqueeze(-2), self.sin_signed[positions].unsqueeze(-2)
        if not torch.is_grad_enabled():
            self._memo = (positions, cos, sin)
        return self._rotate(x, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        # x * cos + rotate(x) * sin, with rotate(x) = (-x2, x1) per pair, written as swap(x) * sin_signed
        # (swap(x) = (x2, x1)): the same products, fewer ops
        rot, rest = (x, None) if self.rot_dim == x.shape[-1] else (x[..., : self.rot_dim], x[..., self.rot_dim :])
        xf = rot if rot.dtype == torch.float32 else rot.float()
        if self.style == "half":
            swapped = torch.roll(xf, self.rot_dim // 2, dims=-1)
        else:
            swapped = xf.unflatten(-1, (self.rot_dim // 2, 2)).flip(-1).flatten(-2)
        out = torch.addcmul(xf * cos, swapped, sin_signed)
        if out.dtype != x.dtype:
            out = out.to(x.dtype)
        return out if rest is None else torch.cat([out, rest], dim=-1)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2022): the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a
    power of two; otherwise the slopes of the closest smaller power of two, then every other slope of
    the next power of two (the paper's reference code). Returns (n_heads,) fp32."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class AbsolutePositions(nn.Module):
    """Learned (GPT-2) or fixed sinusoidal (Vaswani 2017) position vectors: positions (seq,) -> (seq, d_model).

    Learned vectors exist only below ``context_length`` (ValueError beyond); with ``learned_pos_offset``
    (OPT: 2) position p reads row p + offset of a (context_length + offset)-row table. The sinusoidal
    table is a formula and extends to any position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind = cfg.position
        self.max_len = cfg.context_length
        if self.kind == "learned":
            self.offset = cfg.learned_pos_offset  # OPT: position p reads row p + 2
            self.weight = nn.Parameter(torch.zeros(cfg.context_length + self.offset, cfg.d_model))
        else:
            self.register_buffer("table", sinusoidal_table(cfg.context_length, cfg.d_model), persistent=False)

    def reset_tables(self) -> None:
        """Recompute the sinusoidal table (a non-persistent buffer) in place of uninitialised memory
        after ``Module.to_empty``, on its device and in its dtype; learned positions have none."""
        if self.kind == "sinusoidal":
            with torch.device("cpu"):
                table = sinusoidal_table(self.table.shape[0], self.table.shape[1])
            self.table = table.to(device=self.table.device, dtype=self.table.dtype)

    def ensure(self, length: int) -> None:
        """Check/extend for positions < ``length`` (a Python int; no device sync in forward).
        Raises ValueError for learned positions beyond context_length."""
        if self.kind == "sinusoidal":
            if length > self.table.shape[0]:  # a formula: extends past the training length
                self.table = sinusoidal_table(max(length, 2 * self.table.shape[0]), self.table.shape[1]).to(
                    self.table.device
                )
        elif length > self.max_len:
            raise ValueError(
                f"position {length - 1} is beyond context_length={self.max_len}: "
                f"learned absolute positions exist only for positions < context_length"
            )

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if self.kind == "learned":
            return self.weight[positions + self.offset] if self.offset else self.weight[positions]
        return self.table[positions]
