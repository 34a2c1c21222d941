"""Mixture-of-experts FFN (Shazeer et al. 2017, "Outrageously Large Neural Networks"; Fedus et al.
2021, "Switch Transformers"; Jiang et al. 2024, "Mixtral of Experts"; DeepSeek-AI 2024, DeepSeek-V2).

Each token's hidden state x (d_model) is scored by a router, r = W_r x (n_experts logits); the scores
are softmax(r) over the experts (Mixtral, DeepSeek-V2) or sigmoid(r) per expert (DeepSeek-V3); the
``experts_per_token`` (k) highest are kept (with ``router_groups`` > 1 only among the experts of the
``router_topk_groups`` groups whose best expert scores highest: DeepSeek-V2's device-limited routing;
with ``router_group_score='top2_sum'`` the sum of their best two: DeepSeek-V3's, on the biased scores)
and, with ``router_renormalize``, divided by their sum, then multiplied by ``routed_scaling_factor``. The
output is sum_{e in top-k} w_e FFN_e(x) (``router_weights='output'``), or sum_{e in top-k} FFN_e(w_e x)
(``'input'``: Llama 4 scales each expert's input, HF ``Llama4TextMoe``), plus the shared experts' FFN
(every token; DeepSeek, Llama 4) when ``n_shared_experts`` > 0, with ``shared_expert_gate`` multiplied by
sigmoid(w . x), a learned gate per token (Qwen2-MoE, Qwen3-Next: HF ``shared_expert_gate``). Gemma 4
(``router_input_norm``,
``router_expert_scale``): the router reads RMSNorm(x) x a learned vector / sqrt(d_model), and each kept
weight (after renormalisation) is multiplied by a learned scale of its expert. Each expert is an ordinary
:class:`lmlab.model.ffn.FeedForward` of width
``expert_d_ff``; the shared ones are one FeedForward of width n_shared x expert_d_ff (as DeepSeek-V2
fuses them).

Dispatch: the (token, slot) pairs are sorted by expert (a stable sort), each expert runs once on its
tokens gathered into one matrix, and its weighted outputs are added back at their tokens
(``index_add_``). No capacity limit: no token is dropped or duplicated, whatever the load.

Auxiliary losses (each layer's, averaged over the MoE layers by the model and weighted into the
training loss, :meth:`lmlab.model.transformer.TransformerLM.loss_from_hidden`):
- load balancing (Fedus et al. 2021, eq. 4; for top-k as in HF's Mixtral ``load_balancing_loss_func``):
  n_experts x sum_e f_e P_e, with f_e the fraction of tokens routed to expert e (counting each of
  the k slots, so sum_e f_e = k) and P_e the mean router probability of e (softmax scores; sigmoid
  scores normalised to sum 1 per token). Uniform routing gives k; all tokens on one expert, up to
  n_experts x k.
- router z-loss (Zoph et al. 2022, "ST-MoE", eq. 5): the mean over tokens of logsumexp(r)^2.
- sequence-wise balance loss (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", eqs. 17-20): per sequence of
  T tokens, sum_e f_e P_e with f_e = n_experts / (k T) x the tokens of the sequence routed to e and P_e the
  mean over its tokens of e's normalised score; the mean over the sequences (uniform routing: 1).

Auxiliary-loss-free balancing (``moe_balance`` 'aux_free' or 'both'; Wang et al. 2024, arXiv 2408.15664;
DeepSeek-V3 Sec. 2.1.2): a per-expert bias b (a buffer, saved with the weights) is added to the scores for
the top-k choice only (the weights stay the unbiased scores); training counts each expert's routed slots
over the step's micro-batches, and after the optimizer step :meth:`MoEFeedForward.update_bias` moves b_e by
``moe_bias_update_rate`` x sign(mean load - load_e): an overloaded expert's bias falls, an idle one's rises.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn as nn

from lmlab.config import ModelConfig
from lmlab.kernels.linear import Linear
from lmlab.model.ffn import FeedForward
from lmlab.model.norms import make_norm


class MoEFeedForward(nn.Module):
    """(batch, seq, d_model) -> (batch, seq, d_model); after each forward :attr:`aux` holds this
    layer's (load-balancing loss, router z-loss, sequence-wise balance loss or None when its weight is 0) as
    0-dim fp32 tensors (in the autograd graph) and
    :attr:`tokens_per_expert` the (n_experts,) routed counts of that call."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = cfg.expert_d_ff or cfg.d_ff
        expert_cfg = dataclasses.replace(
            cfg,
            d_ff=width,
            n_experts=0,
            moe_beside_dense=False,
            router_input_norm=False,
            router_expert_scale=False,
            kv_shared_wide_ffn=False,
            shared_expert_gate=False,
        )
        self.n_experts, self.k = cfg.n_experts, cfg.experts_per_token
        self.score, self.renormalize = cfg.router_score, cfg.router_renormalize
        self.weights_input = cfg.router_weights == "input"
        self.groups, self.topk_groups, self.scale = cfg.router_groups, cfg.router_topk_groups, cfg.routed_scaling_factor
        self.group_score = cfg.router_group_score
        self.router = Linear(cfg.d_model, cfg.n_experts, bias=cfg.router_bias)
        # Gemma 4: the router's input norm (weightless RMSNorm, then x a learned vector / sqrt(d_model)) and a
        # learned scale per expert on the routed weights (HF Gemma4TextRouter: scale, per_expert_scale)
        self.router_norm = (
            make_norm("rmsnorm", cfg.d_model, cfg.norm_eps, affine=False) if cfg.router_input_norm else None
        )
        self.router_scale = nn.Parameter(torch.ones(cfg.d_model)) if cfg.router_input_norm else None
        self.expert_scale = nn.Parameter(torch.ones(cfg.n_experts)) if cfg.router_expert_scale else None
        self.experts = nn.ModuleList(FeedForward(expert_cfg) for _ in range(cfg.n_experts))
        self.shared = (
            FeedForward(dataclasses.replace(expert_cfg, d_ff=width * cfg.n_shared_experts))
            if cfg.n_shared_experts
            else None
        )
        self.shared_gate = Linear(cfg.d_model, 1, bias=False) if cfg.shared_expert_gate else None
        self.aux: Optional[tuple] = None  # (balance, router z, sequence balance or None), 0-dim fp32
        self.tokens_per_expert: Optional[torch.Tensor] = None
        self.bias_rate = cfg.moe_bias_update_rate
        self.seq_balance = cfg.moe_seq_aux_loss > 0  # computed only when it is weighted into the loss
        if cfg.moe_balance in ("aux_free", "both"):  # DeepSeek-V3: the bias only picks; the step's load moves it
            self.register_buffer("expert_bias", torch.zeros(cfg.n_experts))
            self.register_buffer("load", torch.zeros(cfg.n_experts), persistent=False)
        else:
            self.expert_bias = self.load = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (tokens, d_model) -> (weights (tokens, k) fp32, experts (tokens, k) long, probabilities
        (tokens, n_experts) fp32 summing to 1 per token, router logits (tokens, n_experts) fp32)."""
        if self.router_norm is not None:  # Gemma 4: RMS-normalised, x a learned vector / sqrt(d_model)
            x = self.router_norm(x) * self.router_scale * x.shape[-1] ** -0.5
        logits = self.router(x).float()
        scores = torch.softmax(logits, -1) if self.score == "softmax" else torch.sigmoid(logits)
        pick = scores if self.expert_bias is None else scores + self.expert_bias  # the bias only chooses
        if self.groups > 1:  # DeepSeek-V2/V3: only the experts of the best router_topk_groups groups compete
            by_group = pick.view(-1, self.groups, self.n_experts // self.groups)
            score = by_group.amax(-1) if self.group_score == "max" else by_group.topk(2, dim=-1).values.sum(-1)
            best = score.topk(self.topk_groups, dim=-1).indices
            keep = torch.zeros_like(by_group[..., 0], dtype=torch.bool).scatter_(1, best, True)
            pick = by_group.masked_fill(~keep[..., None], float("-inf")).view_as(scores)
        experts = pick.topk(self.k, dim=-1).indices
        weights = scores.gather(-1, experts)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        if self.scale != 1.0:
            weights = weights * self.scale
        if self.expert_scale is not None:  # Gemma 4: a learned scale per expert
            weights = weights * self.expert_scale[experts].float()
        probs = scores if self.score == "softmax" else scores / scores.sum(-1, keepdim=True)
        return weights, experts, probs, logits

    def forward(self, x: torch.Tensor, router_x: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x (batch, seq, d_model) -> (batch, seq, d_model); ``router_x``: what the router reads, when not x
        (Gemma 4: the raw residual, while the experts read its pre-norm)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, experts, probs, logits = self.route(flat if router_x is None else router_x.reshape(-1, shape[-1]))
        slots = experts.reshape(-1)  # (tokens * k,): slot j belongs to token j // k
        order = torch.argsort(slots, stable=True)
        counts = torch.bincount(slots, minlength=self.n_experts)
        out = torch.zeros_like(flat)
        w = weights.reshape(-1)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                sel = order[start : start + n]
                tokens = sel // self.k
                if self.weights_input:
                    y = self.experts[e](flat[tokens] * w[sel, None].to(flat.dtype))
                else:
                    y = self.experts[e](flat[tokens]) * w[sel, None].to(flat.dtype)
                out.index_add_(0, tokens, y)
                start += n
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * shared)
        f = counts.float() / flat.shape[0]
        self.aux = (
            self.n_experts * (f * probs.mean(0)).sum(),
            torch.logsumexp(logits, -1).pow(2).mean(),
            self.sequence_balance(experts, probs, shape[0]) if self.seq_balance else None,
        )
        self.tokens_per_expert = counts.detach()
        if self.load is not None and self.training and torch.is_grad_enabled():
            self.load += counts.detach().to(self.load.dtype)
        return out.reshape(shape)

    def sequence_balance(self, experts: torch.Tensor, probs: torch.Tensor, batch: int) -> torch.Tensor:
        """DeepSeek-V3's sequence-wise balance loss (module docstring) from the chosen ``experts`` (tokens,
        k) and normalised scores ``probs`` (tokens, n_experts) of ``batch`` sequences: a 0-dim fp32 tensor."""
        E, k = self.n_experts, self.k
        chosen = torch.zeros_like(probs).scatter_(1, experts, 1.0).view(batch, -1, E)  # (B, T, E) 0/1
        T = chosen.shape[1]
        f = chosen.sum(1) * E / (k * T)
        return (f * probs.view(batch, T, E).mean(1)).sum(-1).mean()

    @torch.no_grad()
    def update_bias(self, apply: bool = True, reduce=None) -> None:
        """After an optimizer step: with ``apply``, move each expert's bias by the update rate towards
        balance, from the routed slots counted since the last call (``reduce``: a function summing a tensor
        over data-parallel ranks in place, so every rank moves the same bias); then start counting anew."""
        if self.expert_bias is None:
            return
        if apply and self.load.sum() > 0:
            if reduce is not None:
                reduce(self.load)
            self.expert_bias += self.bias_rate * torch.sign(self.load.mean() - self.load)
        self.load.zero_()
