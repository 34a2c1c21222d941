"""Multi-token prediction (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 2.2, Fig. 3, eqs. 21-25).

Beside the next token, ``mtp_depth`` (D) sequential modules predict the tokens after it. Module k (1..D)
at position i combines the previous depth's hidden state h^{k-1}_i (h^0: the main model's last block
output, before the final norm) with the embedding of token t_{i+k}:

    h'_i = M_k [RMSNorm(h^{k-1}_i); RMSNorm(Emb(t_{i+k}))]     (M_k: a 2 d_model -> d_model projection)
    h^k_{1:T-k} = TRM_k(h'_{1:T-k})                             (one Transformer block, causal)
    P^k_{i+k+1} = OutHead(RMSNorm(h^k_i))                         (the shared LM head, a norm of its own)

and is trained on L^k = the cross-entropy of t_{i+k+1}; the training loss adds mtp_weight / D x sum_k L^k
(DeepSeek-V3: lambda 0.3, then 0.1). The embedding and the output head are the main model's; each module
has its own norms, projection and block. At inference the modules are not used (the logits are the main
model's). Positions: the module's block rotates its queries and keys at the tokens' own positions
(RoPE or none; learned and sinusoidal tables, ALiBi and T5 biases are refused by the config).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from lmlab.config import ModelConfig
from lmlab.kernels.linear import Linear
from lmlab.kernels.loss import linear_cross_entropy
from lmlab.model.norms import model_norm


class MTPModule(nn.Module):
    """One depth: (h_prev (batch, S, d_model), next-token embeddings (batch, S, d_model), positions (S,))
    -> h (batch, S, d_model), before the output norm :attr:`out_norm`."""

    def __init__(self, cfg: ModelConfig, block: nn.Module):
        super().__init__()
        norm = lambda: model_norm(cfg)
        self.hnorm, self.enorm, self.out_norm = norm(), norm(), norm()
        self.proj = Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.block = block

    def forward(self, h_prev: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat([self.hnorm(h_prev), self.enorm(emb)], dim=-1))
        return self.block(x, positions)


def mtp_losses(model, raw: torch.Tensor, idx: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """The D multi-token losses (each the mean cross-entropy over its scored tokens, 0-dim fp32) of
    ``model`` (a TransformerLM with ``mtp``) from its last block's output ``raw`` (batch, T, d_model), the
    input ids ``idx`` (batch, T) and the next-token ``targets`` (batch, T; -100 not scored). Depth k scores
    t_{i+k+1} = targets[:, i+k] from position i < T - k; a depth with no position left gives no loss."""

    T = idx.shape[1]
    h, out = raw, []
    for k, module in enumerate(model.mtp, start=1):
        S = T - k
        if S <= 0:
            break
        emb = model.embed_tokens(idx[:, k:])
        h = module(h[:, :S], emb, torch.arange(S, device=idx.device))
        loss, _ = linear_cross_entropy(
            model.head_input(module.out_norm(h)),
            model.lm_head.weight,
            targets[:, k:],
            model.head_bias(),
            0.0,
            model.cfg.final_logit_softcap,
            "mean",
        )
        out.append(loss)
    return out
