"""Feed-forward networks (lecture 3: "activations and gated linear units", "FF ratio").

Non-gated: W2 act(W1 x) with act in ReLU (Vaswani 2017), GELU exact / tanh (Hendrycks & Gimpel 2016;
GPT-2), SiLU, squared ReLU (So et al. 2021, "Primer"; Nemotron-4), ELU (Clevert et al. 2016), SELU
(Klambauer et al. 2017).
Gated (Shazeer 2020, "GLU Variants Improve Transformer"): W2 (act(W_gate x) * W_up x) with
ReGLU (ReLU), GeGLU (GELU, tanh approximation as in T5 v1.1 / Gemma), SwiGLU (SiLU; PaLM, LLaMA),
GLU (sigmoid; Dauphin et al. 2017) and Bilinear (no nonlinearity: the gate is W_gate x itself); gpt-oss's
clamped SwiGLU (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"; HF ``GptOssExperts``):
(clamp(u, -l, l) + 1) * g sigmoid(alpha g) with g = min(gate, l), alpha ``swiglu_alpha``, l ``swiglu_limit``.
Gated FFNs carry three matrices, so d_ff is usually scaled by 2/3 (the 8/3 rule) to keep parameters equal.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.config import ModelConfig
from lmlab.config_checks import GATED_ACTIVATIONS
from lmlab.kernels.linear import Linear


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


ACTIVATION_FNS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu2": _relu2,
    "elu": F.elu,
    "selu": F.selu,
    "reglu": F.relu,
    "geglu": lambda x: F.gelu(x, approximate="tanh"),
    "swiglu": F.silu,
    "glu": torch.sigmoid,
    "bilinear": lambda x: x,
}


class FeedForward(nn.Module):
    """Position-wise FFN: (batch, seq, d_model) -> (batch, seq, d_model).

    Gated variants fuse W_gate and W_up into one (d_model -> 2 d_ff) matmul, gate first.
    """

    def __init__(self, cfg: ModelConfig, d_ff: Optional[int] = None):
        super().__init__()
        bias = cfg.bias in ("all", "mlp")
        self.gated = cfg.activation in GATED_ACTIVATIONS
        self.d_ff = d_ff = cfg.d_ff if d_ff is None else d_ff  # another width: Gemma 4's double-wide FFNs
        self.act = ACTIVATION_FNS.get(cfg.activation)
        self.clamp = (cfg.swiglu_alpha, cfg.swiglu_limit) if cfg.activation == "swiglu_clamped" else None
        self.w_in = Linear(cfg.d_model, (2 if self.gated else 1) * d_ff, bias=bias)
        self.w_out = Linear(d_ff, cfg.d_model, bias=bias)
        self.w_out.is_residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(self.hidden(self.w_in(x)))

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        """The activation between the two projections: (..., (2 if gated else 1) * d_ff) -> (..., d_ff)."""
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            if self.clamp is not None:  # gpt-oss
                alpha, limit = self.clamp
                gate = gate.clamp(max=limit)
                return gate * torch.sigmoid(alpha * gate) * (up.clamp(-limit, limit) + 1)
            return self.act(gate) * up
        return self.act(h)
