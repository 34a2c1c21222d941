"""Optimisers: AdamW for every parameter, or Muon for the blocks' weight matrices with AdamW for the rest.

Both come from ``torch.optim``; this module chooses which parameters each one updates and holds the pair as
one optimiser for the training loop and its checkpoints.

- **AdamW** (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"): torch's fused kernel.
- **Muon** (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/): SGD with Nesterov momentum
  0.95 whose update for a weight matrix is orthogonalised by 5 Newton-Schulz iterations (in bf16), so every
  direction of the matrix moves by about the same amount. It applies to 2-D hidden weights only: the
  embeddings and the LM head (tied or not), norm gains and biases keep AdamW, as in Jordan et al. and in
  Liu et al. 2025 ("Muon is Scalable for LLM Training", Moonlight). The update is rescaled by
  0.2 * sqrt(max(rows, cols)) (torch's ``adjust_lr_fn="match_rms_adamw"``, from Liu et al.), which gives
  it the RMS of a typical AdamW update, so a learning rate tuned for AdamW is the right order for Muon too
  (``muon_lr``, default ``lr``). Weight decay is decoupled, as AdamW's: ``p -= lr * weight_decay * p``.

Cost: Muon's Newton-Schulz iterations are about 20 m^2 n + 10 m^3 FLOPs per (m x n) matrix (m <= n) and
step, independent of the batch (the demo model's: docs/bench/measured-choices.md).
"""

from __future__ import annotations

from typing import Optional

import torch

OPTIMIZERS = ("adamw", "muon")


def param_kind(name: str) -> str:
    """What a parameter of :class:`lmlab.model.TransformerLM` is, from its qualified name: ``bias``,
    ``norm`` (a norm's gain), ``embedding`` (token, absolute-position and Gemma 4's per-layer input
    embeddings, T5 relative-bias tables) or ``weight`` (everything else: linear layers, the untied LM
    head, Gemma 4's per-layer input projection). Attention sinks (``attn.sinks``, a learned logit per head)
    count as biases, as do a Gated DeltaNet layer's per-head decay parameters (``A_log``, ``dt_bias``: no
    weight decay, as in the reference implementation, flash-linear-attention's ``_no_weight_decay``)."""
    return (
        "bias"
        if name.endswith((".bias", ".sinks", ".A_log", ".dt_bias"))
        else "norm"
        if "." in name and "norm" in name.split(".")[-2]
        else "embedding"
        if name.startswith(("embed.", "abs_pos.", "ple_embed.")) or "rel_bias" in name
        else "weight"
    )


def param_groups(model: torch.nn.Module, tc) -> list[dict]:
    """AdamW groups: weight decay ``tc.weight_decay`` on every parameter except the kinds
    (:func:`param_kind`) named in ``tc.wd_exclude``. Tied weights appear once.

    Under ``parametrization`` mup / completep (``model.cfg``) the parameters are grouped further by their
    rules (:func:`lmlab.model.parametrization.optimizer_scales`): each group then carries its own ``eps``
    and ``weight_decay`` and an ``lr_scale``, the multiple of the schedule's learning rate that
    :func:`set_lr` gives it (e.g. 1/m for the hidden weights). Under sp: the two groups above, no
    ``lr_scale``."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None and getattr(cfg, "parametrization", "sp") != "sp":
        return _scaled_groups(model, cfg, tc)
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # named_parameters yields a shared tensor once
        (no_decay if param_kind(name) in tc.wd_exclude else decay).append(p)
    return [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _scaled_groups(model: torch.nn.Module, cfg, tc) -> list[dict]:
    """:func:`param_groups` under mup / completep: one group per (weight decay, lr, eps) the rules give,
    in the order the parameters first appear."""
    from lmlab.model.parametrization import optimizer_scales

    groups: dict[tuple, dict] = {}
    for name, p in model.named_parameters():
        sc = optimizer_scales(cfg, name)
        wd = 0.0 if param_kind(name) in tc.wd_exclude else tc.weight_decay * sc["weight_decay"]
        key = (wd, sc["lr"], sc["eps"])
        groups.setdefault(key, {"params": [], "weight_decay": wd, "lr_scale": sc["lr"], "eps": tc.eps * sc["eps"]})
        groups[key]["params"].append(p)
    return list(groups.values())


def muon_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters Muon updates in ``model``: the 2-D ``weight`` kind (:func:`param_kind`) inside the
    Transformer blocks (attention and FFN projections, MLA's down/up projections, routers), not
    embeddings, the LM head (tied or not), norm gains or biases; 3-D tensors (stacked MoE experts) stay
    with AdamW. A fused projection (``qkv``, SwiGLU's ``w_in``) is orthogonalised as one matrix."""
    return [
        p
        for name, p in model.named_parameters()  # the LM head and embeddings lie outside blocks.
        if p.ndim == 2 and name.startswith("blocks.") and param_kind(name) == "weight"
    ]


class OptimizerPair:
    """AdamW and Muon over disjoint parameters, stepped as one optimiser.

    ``param_groups`` lists AdamW's groups, then Muon's; ``state_dict()`` is one dict in torch's format with
    the parameters numbered across both in that order (so :func:`lmlab.parallel.optimizer_state_by_name`
    names them as for a single optimiser), and ``load_state_dict`` is its inverse. Raises ValueError when a
    state's groups do not match this pair's (e.g. a state written by AdamW alone)."""

    def __init__(self, adamw: torch.optim.AdamW, muon: torch.optim.Muon):
        self.adamw, self.muon = adamw, muon

    @property
    def param_groups(self) -> list[dict]:
        return self.adamw.param_groups + self.muon.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)
        self.muon.zero_grad(set_to_none)

    def step(self) -> None:
        self.adamw.step()
        self.muon.step()

    def _split(self) -> tuple[int, int]:
        """(groups of AdamW, parameters of AdamW): where Muon's part of a joint state starts."""
        return len(self.adamw.param_groups), sum(len(g["params"]) for g in self.adamw.param_groups)

    def state_dict(self) -> dict:
        a, m = self.adamw.state_dict(), self.muon.state_dict()
        _, offset = self._split()
        state = dict(a["state"])
        state.update({i + offset: v for i, v in m["state"].items()})
        groups = a["param_groups"] + [dict(g, params=[i + offset for i in g["params"]]) for g in m["param_groups"]]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        n_groups, offset = self._split()
        want = [len(g["params"]) for g in self.param_groups]
        got = [len(g["params"]) for g in sd["param_groups"]]
        if got != want:
            raise ValueError(
                f"optimizer state has groups of {got} parameters, this AdamW + Muon optimizer "
                f"{want}: it was written by another optimizer or parameter split"
            )
        groups = sd["param_groups"]
        self.adamw.load_state_dict(
            {"state": {i: v for i, v in sd["state"].items() if i < offset}, "param_groups": groups[:n_groups]}
        )
        self.muon.load_state_dict(
            {
                "state": {i - offset: v for i, v in sd["state"].items() if i >= offset},
                "param_groups": [dict(g, params=[i - offset for i in g["params"]]) for g in groups[n_groups:]],
            }
        )


def build_optimizer(model: torch.nn.Module, groups: list[dict], tc, device: torch.device, mode: str = "none"):
    """The optimiser ``tc.optimizer`` names over ``groups`` (weight-decay groups of ``model``'s parameters,
    :func:`lmlab.train.param_groups`): torch's AdamW (:func:`adamw`), or an :class:`OptimizerPair` of
    AdamW and ``torch.optim.Muon`` (momentum 0.95, Nesterov, 5 Newton-Schulz steps, the AdamW-matched
    scale) over :func:`muon_parameters`. ``mode``: the data-parallel wrapping (none | ddp | fsdp); under
    DDP every rank holds whole parameters and gradients, so Muon runs as on one process; under FSDP each
    rank holds a shard of a matrix, which Muon cannot orthogonalise: ValueError. Muon under parametrization
    mup / completep: ConfigError (:func:`lmlab.model.parametrization.check_optimizer`)."""
    if getattr(model, "cfg", None) is not None:
        from lmlab.model.parametrization import check_optimizer

        check_optimizer(model.cfg, tc.optimizer)
    if tc.optimizer == "adamw":
        return adamw(groups, tc, device, sharded=mode != "none")
    if mode == "fsdp":
        raise ValueError(
            "optimizer=muon orthogonalises whole weight matrices and does not run over FSDP's "
            "sharded parameters; use parallel=ddp or optimizer=adamw"
        )
    muon_ids = {id(p) for p in muon_parameters(model)}
    rest = [dict(g, params=[p for p in g["params"] if id(p) not in muon_ids]) for g in groups]
    muon = [p for g in groups for p in g["params"] if id(p) in muon_ids]
    return OptimizerPair(
        adamw(rest, tc, device, sharded=mode != "none"),
        torch.optim.Muon(muon, lr=tc.muon_lr or tc.lr, weight_decay=tc.weight_decay, adjust_lr_fn="match_rms_adamw"),
    )


def adamw(groups: list[dict], tc, device: torch.device, sharded: bool = False) -> torch.optim.AdamW:
    """torch.optim.AdamW over ``groups`` with the run's lr / betas / eps, fused (one kernel over all
    parameters: torch's ``_fused_adamw_``, on CUDA and, since torch 2.4, on CPU) unless the parameters
    are DDP/FSDP-wrapped (``sharded``), where the multi-tensor ``foreach`` form is used (fused against
    foreach, measured: docs/bench/measured-choices.md)."""
    return torch.optim.AdamW(
        groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps, fused=not sharded and device.type in ("cuda", "cpu")
    )


def muon_lr_at(lr: float, tc) -> float:
    """Muon's learning rate when the schedule gives AdamW ``lr``: ``lr * muon_lr / lr`` (the same
    schedule scaled to Muon's own peak ``tc.muon_lr``, which defaults to ``tc.lr``)."""
    return lr * (tc.muon_lr or tc.lr) / tc.lr


def set_lr(opt, lr: float, tc) -> None:
    """Set the learning rate of step ``lr`` (the schedule's value for ``tc.lr``) on every group of
    ``opt``: AdamW's groups take ``lr`` (times the group's ``lr_scale`` where :func:`param_groups` set one:
    mup / completep), Muon's :func:`muon_lr_at` (the same schedule, its own peak)."""
    pair = isinstance(opt, OptimizerPair)
    for group in opt.adamw.param_groups if pair else opt.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr
    for group in opt.muon.param_groups if pair else []:
        group["lr"] = muon_lr_at(lr, tc)


def optimizer_of(run_train: Optional[dict]) -> str:
    """The optimiser a run's saved ``train`` settings name (runs from before the field: adamw)."""
    return (run_train or {}).get("optimizer", "adamw")
