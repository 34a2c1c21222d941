"""Width and depth transfer: the ``parametrization`` switch of :class:`lmlab.config.ModelConfig`.

A parametrization says how the initialisation, the per-parameter Adam learning rates and a few forward
multipliers change with the model's size, so that hyperparameters tuned on a small model (the *base*)
carry over to a larger one. Three are implemented; every rule is here, and the model
(``TransformerLM.reset_parameters``, ``Attention.scale``, ``Block``, the LM head) and the optimiser
(:func:`lmlab.optim.param_groups`) read them from the functions below.

- ``sp`` (standard, the default): lmlab's GPT-2 recipe, whatever the size. Every weight N(0, init_std),
  the projections that write into the residual stream (attention ``out``, FFN ``w_out``) N(0, init_std /
  sqrt(2 n_layers)); one learning rate; attention scale 1/sqrt(head_dim); logits unscaled.

- ``mup``: the Maximal Update Parametrization for Adam (Yang et al. 2022, "Tensor Programs V: Tuning Large
  Neural Networks via Zero-Shot Hyperparameter Transfer", Table 3 and its equivalent Table 8 with an output
  multiplier; in the form of Dey, Anthony & Hestness 2024, "The Practitioner's Guide to the Maximal Update
  Parameterization", and its reference code EleutherAI/nanoGPT-mup). With the width multiplier
  m = d_model / base_d_model (base_d_model None: m = 1):

  ========================  ==================================  =======================================
  parameter / quantity      sp                                  mup
  ========================  ==================================  =======================================
  embeddings (input)        N(0, init_std), lr                  unchanged
  hidden weights (every     N(0, init_std), lr                  N(0, init_std / sqrt(m)) (variance
  2-D weight inside the                                         sigma^2 / m), Adam lr / m
  blocks)
  residual projections      x 1/sqrt(2 n_layers)                the same factor, on top (a depth rule,
                                                                independent of the width)
  LM head (untied)          N(0, init_std), lr                  unchanged (Table 8: the output
                                                                multiplier takes the 1/fan_in)
  logits                    h W^T                               h W^T / m (output multiplier 1/m)
  attention scale           1/sqrt(head_dim)                    1/(sqrt(head_dim) sqrt(m)), below
  norm gains, biases        lr                                  unchanged
  Adam epsilon              eps                                 eps / m on every group (gradients
                                                                shrink like 1/m; Dey et al. 2025, Eq. 40)
  ========================  ==================================  =======================================

  Tied embeddings (lmlab's default): the one matrix keeps the embedding rules (init and learning rate
  unchanged) and the logits take the output multiplier 1/m, the practitioner's guide's choice.

  Attention: muP replaces 1/sqrt(head_dim) by 1/head_dim, because after training queries and keys are
  correlated and q.k grows like head_dim. lmlab writes it sqrt(base_head_dim) / head_dim with
  base_head_dim = head_dim / m, i.e. 1/(sqrt(head_dim) sqrt(m)): equal to sp's at the base width, and
  1/head_dim up to a constant when head_dim grows with the width at a fixed number of heads, the way
  ``lmlab coordcheck`` (and the references' coordinate checks) widen a model. A family that keeps
  head_dim and adds heads would want sp's scale instead; lmlab does not guess which one is meant.

- ``completep``: mup plus CompleteP's depth rules with alpha = 1 (Dey et al. 2025, "Don't be lazy:
  CompleteP enables compute-efficient deep transformers", Table 1, as its authors' reference code
  implements it: the ``completep`` branch of EleutherAI/nanoGPT-mup, whose optimiser groups and residual
  scaling the rules below follow). With the depth multiplier d = n_layers / base_n_layers:

  - each residual branch's output is multiplied by 1/d^alpha = base_n_layers / n_layers before it is
    added to the stream (pre-norm: x + s f(norm(x)); parallel blocks: each branch; sandwich and OLMo 2's
    reordered blocks: the normalised branch output). Post-norm blocks are refused.
  - the depth factor of the learning rate of the blocks' weights, gains and biases is d^(alpha - 1) = 1 at
    alpha = 1: no change, nothing to implement.
  - initialisation: hidden weights keep mup's N(0, init_std / sqrt(m)) with no depth factor; the residual
    projections' GPT-2 factor 1/sqrt(2 n_layers) is taken at the base depth, 1/sqrt(2 base_n_layers), so
    it no longer changes with depth (the branch multiplier does that job) and completep equals mup at
    d = 1.
  - Adam epsilon: the blocks' parameters eps / (m d); embeddings, LM head and final norm eps / m (Eq. 40).
  - weight decay of the hidden weights x m, so that AdamW's decay per step, lr x weight_decay, does not
    shrink with the width when their learning rate is divided by m (as the reference code does).

  Left out: alpha other than 1 (the paper's family of depth parametrizations, alpha = 0.5 among them),
  whose learning-rate factor d^(alpha - 1) would then apply; and CompleteP's rules for other optimisers.

Not covered by mup / completep here (refused by ModelConfig with a ConfigError): multi-head latent
attention, mixture-of-experts layers, ``embed_dim`` projections, per-layer input embeddings,
``scale_embeddings`` and ``query_pre_attn_scalar``; and Muon (``optimizer=muon``), whose orthogonalised
updates need rules of their own (:func:`check_optimizer`).

At m = 1 and d = 1 (the bases left at None) mup and completep build the same model as sp, with the same
initial weights for a seed and the same learning rates (the tests check it).
"""

from __future__ import annotations

import math
from typing import Optional

from lmlab.config import ModelConfig
from lmlab.config_checks import PARAMETRIZATIONS, ConfigError

__all__ = [
    "PARAMETRIZATIONS",
    "width_multiplier",
    "depth_multiplier",
    "init_std",
    "attention_scale",
    "output_multiplier",
    "branch_multiplier",
    "param_role",
    "optimizer_scales",
    "check_optimizer",
]


def width_multiplier(cfg: ModelConfig) -> float:
    """m = d_model / base_d_model under mup and completep (1 under sp, or with base_d_model None)."""
    if cfg.parametrization == "sp" or cfg.base_d_model is None:
        return 1.0
    return cfg.d_model / cfg.base_d_model


def depth_multiplier(cfg: ModelConfig) -> float:
    """d = n_layers / base_n_layers under completep (1 otherwise, or with base_n_layers None)."""
    if cfg.parametrization != "completep" or cfg.base_n_layers is None:
        return 1.0
    return cfg.n_layers / cfg.base_n_layers


def init_std(cfg: ModelConfig, role: str, residual: bool = False) -> float:
    """The standard deviation of a weight's normal initialisation. ``role``: 'embedding', 'output' (an
    untied LM head) or 'hidden' (a linear layer inside the blocks); ``residual``: a projection that writes
    into the residual stream (attention ``out``, FFN ``w_out``)."""
    std = cfg.init_std
    if role != "hidden":
        return std
    if cfg.parametrization != "sp":
        std = std / math.sqrt(width_multiplier(cfg))
    if residual:  # written as sp always computed it (std x (1 / sqrt(2 L))), so sp's draws stay bit-identical
        depth = (cfg.base_n_layers or cfg.n_layers) if cfg.parametrization == "completep" else cfg.n_layers
        std = std * (1 / math.sqrt(2 * depth))
    return std


def attention_scale(cfg: ModelConfig, head_dim: int) -> float:
    """The query-key scale of a layer whose heads are ``head_dim`` wide: 1/sqrt(head_dim) under sp (or
    ``query_pre_attn_scalar``**-0.5 when set), 1/(sqrt(head_dim) sqrt(m)) under mup / completep (see the
    module docstring)."""
    if cfg.query_pre_attn_scalar:
        return cfg.query_pre_attn_scalar**-0.5
    scale = 1.0 / math.sqrt(head_dim)
    m = width_multiplier(cfg)
    return scale if m == 1.0 else scale / math.sqrt(m)


def output_multiplier(cfg: ModelConfig) -> float:
    """What the logits are multiplied by on top of ``logit_scale``: 1/m under mup / completep, else 1."""
    return 1.0 / width_multiplier(cfg)


def branch_multiplier(cfg: ModelConfig) -> float:
    """What each residual branch's output is multiplied by: base_n_layers / n_layers under completep
    (alpha = 1), else 1."""
    return 1.0 / depth_multiplier(cfg)


def param_role(name: str) -> str:
    """A parameter's role for the rules, from its qualified name in :class:`lmlab.model.TransformerLM`:
    'embedding' (token and position embeddings, T5 bias tables), 'output' (an untied LM head's weight),
    'hidden' (a weight matrix inside the blocks), 'block_vector' (a norm gain or bias inside the blocks)
    or 'vector' (the final norm, the LM head's bias)."""
    from lmlab.optim import param_kind

    kind = param_kind(name)
    if kind == "embedding":
        return "embedding"
    inside = name.startswith("blocks.")
    if kind == "weight":
        return "hidden" if inside else "output"
    return "block_vector" if inside else "vector"


def optimizer_scales(cfg: ModelConfig, name: str) -> Optional[dict]:
    """Multipliers of the run's AdamW settings for parameter ``name``: {'lr': .., 'eps': ..,
    'weight_decay': ..}; None under sp (one learning rate for all, nothing stored in the groups)."""
    if cfg.parametrization == "sp":
        return None
    m, d = width_multiplier(cfg), depth_multiplier(cfg)
    role = param_role(name)
    inside = role in ("hidden", "block_vector")
    scales = {"lr": 1.0, "eps": 1.0 / m, "weight_decay": 1.0}
    if role == "hidden":
        scales["lr"] = 1.0 / m
    if cfg.parametrization == "completep":
        if inside:
            scales["eps"] = 1.0 / (m * d)
        if role == "hidden":
            scales["weight_decay"] = m
    return scales


def check_optimizer(cfg: ModelConfig, optimizer: str) -> None:
    """Refuse an optimiser whose rules lmlab does not implement for ``cfg.parametrization``: Muon under mup
    or completep (its orthogonalised updates have a width scaling of their own). Raises ConfigError."""
    if cfg.parametrization != "sp" and optimizer != "adamw":
        raise ConfigError(
            f"optimizer={optimizer!r} with parametrization={cfg.parametrization!r} is not "
            f"implemented (lmlab's {cfg.parametrization} rules are Adam's); use optimizer=adamw "
            f"or parametrization=sp"
        )
