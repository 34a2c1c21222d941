"""Training settings: :class:`TrainConfig`, every optimisation, evaluation, checkpoint, precision and
compile choice of a run as a named, validated field (``lmlab/train.py`` runs them). A bad value raises
ConfigError naming the field, the value and what is valid; ``docs/switches.md`` lists every field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

from lmlab.config import build_checked
from lmlab.config_checks import ConfigError, _choice, _non_negative, _number_in, _positive, _positive_int
from lmlab.optim import OPTIMIZERS

WD_GROUPS = ("norm", "bias", "embedding")
MAX_COUNT = 2**53  # step counts and intervals: exact as floats (schedules divide them)
SCHEDULES = ("cosine", "wsd", "constant")


@dataclass
class TrainConfig:
    """Optimisation settings. Units: lr per step, intervals in steps, batch_size in sequences per
    micro-batch per rank (global batch = batch_size * grad_accum * ranks)."""

    batch_size: int = 16  # sequences per micro-batch per rank
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int = 1000  # optimizer steps (a budget, when set, plans them)
    lr: float = 1e-3  # the peak learning rate
    min_lr_ratio: float = 0.1  # the schedule ends at lr * min_lr_ratio
    warmup_steps: int = 100  # linear warmup from 0 to lr
    schedule: str = "cosine"  # cosine | wsd (warmup-stable-decay) | constant
    decay_fraction: float = 0.2  # wsd: the last fraction of steps decays linearly (Hu et al. 2024, MiniCPM)
    weight_decay: float = 0.1  # decoupled, AdamW's (Loshchilov & Hutter 2019)
    wd_exclude: list = field(default_factory=lambda: ["norm", "bias"])  # of: norm, bias, embedding
    optimizer: str = "adamw"  # adamw | muon (Muon on the blocks' weight matrices, AdamW on the rest; lmlab.optim)
    muon_lr: Optional[float] = None  # Muon's peak lr (same schedule as lr); None = lr
    beta1: float = 0.9  # Adam's first-moment decay
    beta2: float = 0.95  # Adam's second-moment decay (0.95: LLaMA, GPT-3)
    eps: float = 1e-8  # Adam's epsilon
    grad_clip: float = 1.0  # max global L2 norm; 0 disables
    eval_interval: int = 200  # steps between periodic held-out evaluations
    eval_windows: int = 32  # validation windows (spread over the split) scored at each periodic evaluation
    checkpoint_interval: int = 0  # 0 = only at the end
    keep_checkpoints: int = 2  # newest K kept; 0 keeps all
    log_interval: int = 10  # steps between training-log lines
    diag_interval: int = 0  # every N steps and at step 1: attention-logit max, log Z, update/param RMS,
    # per-layer gradient norms (0 = off)
    spike_ratio: float = 1.5  # a loss above spike_ratio x its running mean counts as a spike
    max_bad_steps: int = 5  # stop after this many consecutive non-finite steps
    seed: int = 1337  # initialisation, data order and dropout
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # auto (bf16 autocast where the device computes bf16 natively, else fp32) | fp32 | bf16 (autocast) |
    # fp16 (autocast + GradScaler, CUDA)
    dtype: str = "auto"
    # torch.compile the model for training: true | false | auto (when the steps left repay the compile time
    # measured on this machine, lmlab.compile_choice)
    compile: bool | str = "auto"
    # what compile compiles: "model" (one graph: embedding, blocks, loss), "blocks" (each block apart, one
    # compiled code for all: a fraction of the cold compile time; lmlab.compile_choice.compile_blocks), or "auto"
    # (compile=true: model; compile=auto: whichever repays best)
    compile_scope: str = "auto"
    activation_checkpointing: bool = False  # recompute each block's activations in backward: less memory
    parallel: str = "ddp"  # with torchrun and >1 ranks: ddp | fsdp
    peak_flops: Optional[float] = None  # device peak FLOP/s for MFU; default from lmlab.analysis's table
    tensorboard: bool = True  # also write TensorBoard events when the package is installed
    max_seconds: Optional[float] = None  # stop after this many seconds of one fit() (wall time; None = no limit)
    budget_seconds: Optional[float] = None  # plan max_steps (then a cap) so that fit() takes about this many
    # seconds (wall time: compile, evaluations and checkpoints included), from the step time measured in the
    # run (see budget_plan_after, budget_steps; wsd and constant rates check the plan again: budget_replan_step)

    def __post_init__(self) -> None:
        for name in (
            "batch_size",
            "grad_accum",
            "max_steps",
            "eval_interval",
            "eval_windows",
            "log_interval",
            "max_bad_steps",
        ):
            _positive_int(name, getattr(self, name), 1, MAX_COUNT)
        for name in ("warmup_steps", "checkpoint_interval", "keep_checkpoints", "diag_interval"):
            _positive_int(name, getattr(self, name), 0, MAX_COUNT)
        _positive_int("seed", self.seed, 0, 2**63 - 1)  # torch.manual_seed's range
        _positive("lr", self.lr)
        _non_negative("weight_decay", self.weight_decay)
        _non_negative("grad_clip", self.grad_clip)
        _positive("eps", self.eps)
        _number_in("spike_ratio", self.spike_ratio, 1, math.inf, lo_open=True, hi_open=True)
        _number_in("min_lr_ratio", self.min_lr_ratio, 0, 1)
        _number_in("decay_fraction", self.decay_fraction, 0, 1, lo_open=True)
        for name in ("beta1", "beta2"):
            _number_in(name, getattr(self, name), 0, 1, hi_open=True)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.muon_lr is not None:
            _positive("muon_lr", self.muon_lr)
            if self.optimizer != "muon":
                raise ConfigError(
                    f"muon_lr={self.muon_lr!r} is set but optimizer={self.optimizer!r}; set "
                    f"optimizer=muon or drop muon_lr"
                )
        if self.optimizer == "muon" and self.dtype == "fp16":
            raise ConfigError("optimizer=muon with dtype=fp16 (GradScaler) is not supported; use dtype=bf16 or fp32")
        if not isinstance(self.device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device={self.device!r:.60} is not valid; use auto, cpu, cuda or cuda:N")
        _choice("dtype", self.dtype, ("fp32", "bf16", "fp16", "auto"))
        _choice("parallel", self.parallel, ("ddp", "fsdp"))
        _choice("compile_scope", self.compile_scope, COMPILE_SCOPES)
        if not (isinstance(self.compile, bool) or self.compile == "auto"):
            raise ConfigError(f"compile={self.compile!r:.60} must be true, false or auto")
        if self.compile_scope == "blocks" and self.compile is False:
            raise ConfigError(
                f"compile_scope={self.compile_scope!r} is set but compile={self.compile!r}; set "
                f"compile=true (or auto) or drop compile_scope"
            )
        for name in ("tensorboard", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false")
        if self.peak_flops is not None:
            _positive("peak_flops", self.peak_flops)
        for name in ("max_seconds", "budget_seconds"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if not isinstance(self.wd_exclude, list) or any(g not in WD_GROUPS for g in self.wd_exclude):
            raise ConfigError(f"wd_exclude={self.wd_exclude!r} must be a list drawn from {list(WD_GROUPS)}")

    @classmethod
    def from_dict(cls, data: dict, source: Optional[str] = None) -> "TrainConfig":
        """Build from a mapping, as ``ModelConfig.from_dict`` (errors start with ``source`` when given)."""
        return build_checked(cls, data, source)


AUTO = "auto"
COMPILE_SCOPES = (AUTO, "model", "blocks")
