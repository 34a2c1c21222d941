"""Batches of a training run: which windows of the token stream each optimizer step reads.

Data order: the global batch of step s (``batch_size * grad_accum * world_size`` windows of
``context_length + 1`` tokens) is drawn from a generator seeded with (seed, s); micro-batch m of rank r
is a fixed slice of it (``lmlab.train.Trainer``). So the data a step sees depends only on the step and the
global batch, not on how it is split: resuming at step s, accumulating gradients, or running on N ranks
sees the same windows as one uninterrupted large-batch run.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from lmlab.config_checks import ConfigError
from lmlab.train_config import TrainConfig


def global_batch_starts(n_tokens: int, step: int, n_windows: int, tc: TrainConfig, T: int) -> np.ndarray:
    """Start offsets of the ``n_windows`` windows of the global batch of ``step``."""
    g = np.random.default_rng([tc.seed, step])
    return g.integers(0, n_tokens - T - 1, size=n_windows, endpoint=True)


def windows_to_batch(tokens: np.ndarray, starts: np.ndarray, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (each (len(starts), T) int64) of the windows of T + 1 tokens at ``starts``."""
    chunk = torch.from_numpy(np.stack([np.asarray(tokens[s : s + T + 1], dtype=np.int64) for s in starts]))
    return chunk[:, :-1], chunk[:, 1:]


def check_data_bounds(
    tc: TrainConfig, T: int, n_train: int, n_val: int, world_size: int, folder: str, say: bool = True
) -> None:
    """Bound ``grad_accum`` and ``eval_windows`` by what the data holds, before anything is allocated:
    a step's ``batch_size x grad_accum x world_size`` windows may not outnumber the training split's
    window starts (``n_train - T``; more would draw every window several times per step, and the
    index alone would not fit in memory at grad_accum=1e12): ConfigError naming the field, the value
    and the limit. ``eval_windows`` past the windows of the validation split (``n_val`` tokens) is
    capped there, as :func:`lmlab.evaluate.evaluate` does, with a note on stderr (when ``say``) if it
    exceeds the default as well."""
    starts = max(1, n_train - T)
    per_step = tc.batch_size * tc.grad_accum * world_size
    if per_step > starts:
        raise ConfigError(
            f"grad_accum={tc.grad_accum}: a step of batch_size x grad_accum x ranks = "
            f"{tc.batch_size} x {tc.grad_accum} x {world_size} = {per_step:,} windows is more than "
            f"the {starts:,} windows the training split of {folder!r} holds; lower grad_accum "
            f"(at most {max(1, starts // (tc.batch_size * world_size)):,} here) or batch_size"
        )
    n_windows = -(-(n_val - 1) // T)  # len(lmlab.evaluate.windows(n_val, T)), without listing them
    if tc.eval_windows > n_windows and tc.eval_windows > TrainConfig.eval_windows and say:
        print(
            f"note: eval_windows={tc.eval_windows:,} is more than the {n_windows:,} windows the validation split "
            f"of {folder!r} holds; each evaluation scores all {n_windows:,}",
            file=sys.stderr,
        )
