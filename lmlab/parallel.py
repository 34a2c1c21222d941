"""Data parallelism through PyTorch's own engine (``torch.distributed``), launched by ``torchrun``.

- DDP (``DistributedDataParallel``): every rank holds the whole model; gradients are all-reduced.
- FSDP2 (``torch.distributed.fsdp.fully_shard``; Zhao et al. 2023, "PyTorch FSDP"): parameters,
  gradients and optimizer state are sharded across ranks; each Transformer block is one unit.

Backends: NCCL on CUDA, gloo on CPU. The rank layout comes from torchrun's environment variables
(RANK, WORLD_SIZE, LOCAL_RANK). Checkpoints are always gathered into full (unsharded) tensors on
rank 0, so a run written by N ranks resumes on any number of ranks.

Meta-device initialisation (no memory for the full model on any rank): build ``TransformerLM`` under
``torch.device('meta')``, :func:`wrap_model` it, ``model.to_empty(device=...)``, then load the weights
(:func:`load_full_state`, or ``reset_parameters``). ``TransformerLM._apply`` re-ties a tied LM head and
recomputes the non-persistent tables (RoPE, ALiBi, sinusoidal), which no state dict carries, as it leaves
the meta device (``tests/test_hf_numerics.py`` checks the logits on 2 ranks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


@dataclass
class Dist:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str) -> Dist:
    """Join the process group torchrun set up (NCCL on CUDA, gloo on CPU); a single process when
    WORLD_SIZE is unset or 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    info = Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if device_type == "cuda":
        torch.cuda.set_device(info.local_rank)
    return info


def wrap_model(model: torch.nn.Module, mode: str, info: Dist, device: torch.device) -> torch.nn.Module:
    """Wrap ``model`` for ``mode`` ('none' | 'ddp' | 'fsdp'); returns the module to call for training."""
    if mode == "none" or not info.enabled:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"parallel={mode!r} is not one of 'none', 'ddp', 'fsdp'")


def optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` with parameters named by their fully qualified names instead of
    integer ids: the layout of ``torch.distributed.checkpoint``'s full optimizer state, so a
    checkpoint is the same whether written by one process, DDP or FSDP."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    sd = optimizer.state_dict()
    state = {order[i]: v for i, v in sd["state"].items()}
    groups = [dict(g, params=[order[i] for i in g["params"]]) for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}


def optimizer_state_from_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer, osd: dict) -> dict:
    """Inverse of :func:`optimizer_state_by_name` for this optimizer's parameter order.
    Raises ValueError when the saved parameters are not this model's."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    index = {n: i for i, n in enumerate(order)}
    saved = [n for g in osd["param_groups"] for n in g["params"]]
    if sorted(saved) != sorted(order):
        raise ValueError(
            f"optimizer state holds parameters {sorted(set(saved) ^ set(order))[:4]} that differ from the model's"
        )
    state = {index[n]: v for n, v in osd["state"].items()}
    groups = [dict(g, params=[index[n] for n in g["params"]]) for g in osd["param_groups"]]
    return {"state": state, "param_groups": groups}


def full_state(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer], mode: str, info: Dist):
    """(model state, optimizer state by parameter name) as full CPU tensors on rank 0 (None elsewhere)."""
    if mode == "fsdp" and info.enabled:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd = get_model_state_dict(model, options=opts)
        osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
        return (msd, osd) if info.is_main else (None, None)
    if not info.is_main:
        return None, None
    return model.state_dict(), (optimizer_state_by_name(model, optimizer) if optimizer is not None else None)


def load_full_state(
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer],
    msd: dict,
    osd: Optional[dict],
    mode: str,
    info: Dist,
) -> None:
    """Load full (unsharded) states, as written by :func:`full_state`, on every rank."""
    if mode == "fsdp" and info.enabled:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            _init_optim_state,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, msd, options=opts)
        if optimizer is not None and osd is not None:
            _init_optim_state(optimizer)
            set_optimizer_state_dict(model, optimizer, osd, options=opts)
        return
    model.load_state_dict(msd, strict=False)
    if optimizer is not None and osd is not None:
        optimizer.load_state_dict(optimizer_state_from_names(model, optimizer, osd))


def all_reduce_mean(value: float, info: Dist, device: torch.device) -> float:
    """Mean of a Python float over ranks (identity for one process)."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / info.world_size


def barrier(info: Dist) -> None:
    if info.enabled:
        dist.barrier()
