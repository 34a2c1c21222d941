"""Per-layer gradient norms at initialisation, at several depths: the figure of Xiong et al. 2020.

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture", Fig. 3) show that at
initialisation a post-norm Transformer's gradients grow towards the output layers (so the top layers
take large steps unless the learning rate is warmed up), while a pre-norm Transformer's gradient norms
are about equal across layers (and shrink with depth like 1/sqrt(L)). A spec's ``init_grads:`` block
measures exactly that for every variant: for each depth and seed, a freshly initialised
``TransformerLM`` (the variant's config with ``n_layers`` = depth) takes one forward and backward pass
on a real training batch (the batch step 0 of that seed trains on), and the L2 norm of each block's
gradient is recorded (:func:`lmlab.diagnostics.layer_grad_norms`). No training: it takes seconds.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import torch

from lmlab.config import ModelConfig
from lmlab.data.batches import global_batch_starts, windows_to_batch
from lmlab.diagnostics import layer_grad_norms
from lmlab.model import TransformerLM
from lmlab.train_config import TrainConfig


def init_grad_norms(cfg: ModelConfig, tokens: np.ndarray, depths: list[int], seeds: list[int], batch: int) -> dict:
    """{depth: {seed: [gradient L2 norm of block 0, 1, ..., depth-1]}} of untrained models.

    ``cfg``: the variant (its ``n_layers`` is replaced by each depth); ``tokens``: the training split,
    (n_tokens,) ids; ``batch``: windows of ``cfg.context_length`` tokens, the step-0 batch of each seed
    (:func:`lmlab.data.batches.global_batch_starts`). The loss is the training loss (mean cross-entropy in
    nats, plus the config's z-loss). Raises ValueError when the split is shorter than one window."""

    T = cfg.context_length
    if len(tokens) < T + 2:
        raise ValueError(
            f"init_grads: the training split has {len(tokens)} tokens, fewer than one "
            f"window of context_length + 1 = {T + 1}"
        )
    out: dict = {}
    for depth in depths:
        out[depth] = {}
        for seed in seeds:
            torch.manual_seed(seed)
            model = TransformerLM(dataclasses.replace(cfg, n_layers=depth))
            model.train()
            starts = global_batch_starts(len(tokens), 0, batch, TrainConfig(seed=seed), T)
            x, y = windows_to_batch(tokens, starts, T)
            loss, _ = model(x, targets=y)
            loss.backward()
            out[depth][seed] = layer_grad_norms(model)
    return out


def top_to_bottom(norms: dict) -> dict:
    """{depth: median over seeds of (last block's gradient norm / first block's)}: about 1 for a flat
    profile (pre-norm), well above 1 when gradients grow towards the output (post-norm, Xiong et al.)."""
    return {
        depth: statistics.median(v[-1] / v[0] for v in per_seed.values() if v and v[0] > 0)
        for depth, per_seed in norms.items()
        if any(v and v[0] > 0 for v in per_seed.values())
    }
