"""Devices, precision and memory: which device and autocast dtype a run uses, whether a model fits
before anything is built, the peak FLOP/s behind MFU, and the CPU allocator setting of ``lmlab train``."""

from __future__ import annotations

import ctypes
import sys
from typing import Optional

import torch

from lmlab.analysis import DEVICES
from lmlab.config import ConfigError, ModelConfig
from lmlab.kernels import settings as kernel_settings
from lmlab.param_counts import param_counts

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the kernel:
    ``mallopt(M_TRIM_THRESHOLD, 2 GiB - 1)`` (no trimming of the heap's free top) and
    ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` (blocks below glibc's maximum threshold come from the heap, not
    from a fresh ``mmap`` each time). By default glibc returns and maps again the tens of megabytes of
    activations a CPU training step frees, and the kernel zeroes every page again on its next use
    (measured: docs/bench/measured-choices.md). The cost: the process
    keeps its peak heap until it exits. Returns whether it applied (False where the C library is not
    glibc or has no ``mallopt``, e.g. macOS or musl: nothing changes there)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1)) and bool(mallopt(M_MMAP_THRESHOLD, 32 << 20))


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not a device name; use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r} is not supported; use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but CUDA is not available here; use device=cpu or auto")
    return dev


def available_memory(device: torch.device) -> Optional[int]:
    """Bytes that can still be allocated on ``device``: free GPU memory (``torch.cuda.mem_get_info``), or
    MemAvailable of /proc/meminfo for the CPU; None where neither is known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(
    cfg: ModelConfig, device: torch.device, shards: int = 1, batch_size: int = 0, activation_bytes: int = 4
) -> None:
    """Refuse (ConfigError) to build a model for training whose fp32 weights, gradients and AdamW moments
    (16 bytes per parameter, ``shards`` ways split under FSDP) and the activations one micro-batch of
    ``batch_size`` x context_length tokens certainly keeps for the backward pass exceed the memory
    available on ``device``, checked before any memory is taken. The activation count is a lower bound:
    the fp32 logits and their gradient (2 x vocab per token) and, per layer, the block input, the normed
    input, q|k|v, the attention output and its projection, the FFN input and its d_ff-wide hidden states
    (6 x d_model + 2 x d_ff per token, ``activation_bytes`` each: 2 under bf16/fp16 autocast)."""

    n = param_counts(cfg)["total"]
    tokens = batch_size * cfg.context_length
    acts = tokens * (2 * cfg.vocab_size * 4 + cfg.n_layers * (6 * cfg.d_model + 2 * cfg.d_ff) * activation_bytes)
    detail = (
        f" (fp32 weights, gradients and AdamW moments, 16 bytes per parameter"
        f"{f' over {shards} FSDP shards' if shards > 1 else ''}: {16 * n / shards / 2**30:.1f} GiB"
    )
    detail += (
        f"; activations of one micro-batch of {batch_size:,} x {cfg.context_length:,} tokens: at least "
        f"{acts / 2**30:.1f} GiB)"
        if acts
        else ")"
    )
    count = f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"
    require_memory(
        16 * n / shards + acts,
        device,
        f"training this model ({count} parameters)",
        "choose a smaller model (e.g. --scale tiny), batch_size or context_length, or a larger device",
        detail,
    )


def require_memory(need: float, device: torch.device, what: str, advice: str, detail: str = "") -> None:
    """Raise ConfigError when ``need`` bytes exceed :func:`available_memory` on ``device`` (unknown: pass),
    saying ``what`` needs them (``detail`` after the figure) and ``advice``."""
    free = available_memory(device)
    if free is not None and need > free:
        raise ConfigError(
            f"{what} needs at least {need / 2**30:.1f} GiB on {device}{detail}, but "
            f"{free / 2**30:.1f} GiB is available; {advice}"
        )


def resolve_dtype(name: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype (None = fp32). 'auto' picks bf16 on CUDA with bf16 support and on CPUs with
    native bf16 (AVX512-BF16, AMX-BF16 or Arm BF16 in /proc/cpuinfo's flags:
    :func:`lmlab.kernels.settings.native_bf16`), else fp32. fp16 is CUDA-only (it needs loss scaling)."""
    if name == "fp32":
        return None
    if name == "bf16":
        return torch.bfloat16
    if name == "fp16":
        if device.type != "cuda":
            raise ConfigError(
                f"dtype='fp16' needs a CUDA device (loss scaling), got device={device.type!r}; "
                f"use dtype=bf16 or fp32 on CPU"
            )
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None

    return torch.bfloat16 if kernel_settings.native_bf16() else None


PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # names of autocast dtypes


def precision_name(amp_dtype: Optional[torch.dtype]) -> str:
    """The name of an autocast dtype (None: fp32), as ``dtype`` and run.yaml's ``precision`` spell it."""
    return next(name for name, d in PRECISIONS.items() if d == amp_dtype)


def describe_dtype(name: str, device: torch.device, amp_dtype: Optional[torch.dtype]) -> str:
    """The startup line's precision: the dtype and, for ``dtype=auto``, why (e.g. 'bf16 (auto: this
    CPU computes bf16 natively)')."""
    chosen = precision_name(amp_dtype)
    if name != "auto":
        return chosen
    where = "this CPU" if device.type == "cpu" else "this GPU"
    native = "computes bf16 natively" if amp_dtype is not None else "has no native bf16"
    return f"{chosen} (auto: {where} {native}; set dtype=fp32 or bf16 to choose)"


def device_peak_flops(device: torch.device, amp_dtype: Optional[torch.dtype]) -> Optional[float]:
    """Peak dense FLOP/s of ``device`` for MFU, from lmlab.analysis.DEVICES: the H100/H200/A100 bf16/fp16
    datasheet figure (under bf16/fp16 autocast; None in fp32, whose tensor-core rate depends on TF32
    settings), the nominal 2-core fp32 figure on CPU in fp32 (None under autocast: MFU against the
    fp32 peak could pass 1), None for an unknown GPU (pass peak_flops)."""

    if device.type == "cpu":  # the table's CPU figure is fp32 (AVX-512 FMA); bf16 runs faster (AVX512-BF16,
        return DEVICES["cpu"].peak_flops if amp_dtype is None else None  # AMX) by a factor we do not know
    if device.type != "cuda" or amp_dtype is None:
        return None
    name = torch.cuda.get_device_name(device).lower()
    for key in ("h200", "h100", "a100"):
        if key in name:
            return DEVICES[key].peak_flops
    return None
