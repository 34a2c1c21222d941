"""T5's relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", section 2.1; lecture 3, "relative position embeddings").

Each attention logit gets a learned scalar b[bucket(j - i), head], added before the softmax. Offsets are
grouped into ``num_buckets`` buckets: small offsets get one bucket each, larger ones share
logarithmically wider buckets up to ``max_distance``, beyond which all offsets share the last bucket.
One table serves every layer (T5 computes it in the first layer and reuses it).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from lmlab.config import ConfigError, ModelConfig


def t5_bucket(
    relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False
) -> torch.Tensor:
    """Bucket ids of T5's relative positions (Mesh TensorFlow / Hugging Face ``_relative_position_bucket``).

    ``relative_position`` = key position - query position (integer tensor, any shape); a causal query
    sees offsets <= 0. Unidirectional (decoder): n = max(-relative_position, 0), so every future offset
    shares bucket 0. Bidirectional (encoder): half the buckets for each sign, keys after the query in the
    upper half. Of the buckets of one direction, the first half are the exact offsets 0 .. max_exact - 1
    (max_exact = buckets // 2); offset n >= max_exact goes to
    max_exact + floor(ln(n / max_exact) / ln(max_distance / max_exact) * (buckets - max_exact)),
    capped at buckets - 1. Returns int64 bucket ids in [0, num_buckets), same shape.
    """
    relative_position = relative_position.long()
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = torch.log(n.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, n, large)


class T5RelativeBias(nn.Module):
    """Learned relative position bias: ``embedding`` (t5_num_buckets, n_heads) of logit offsets.

    forward(q_pos (T,), k_pos (S,)) -> (n_heads, T, S) fp32 additive attention-logit bias, using the
    unidirectional (causal) buckets of ``t5_bucket`` with ``cfg.t5_num_buckets`` and ``cfg.t5_max_distance``.
    The weight is an ``nn.Embedding``, initialised N(0, init_std) by ``TransformerLM.reset_parameters``.
    Raises ConfigError when t5_max_distance <= t5_num_buckets // 2 (no room for the log-spaced buckets).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.t5_max_distance <= cfg.t5_num_buckets // 2:
            raise ConfigError(
                f"t5_max_distance={cfg.t5_max_distance} must exceed t5_num_buckets // 2 = {cfg.t5_num_buckets // 2} "
                f"(the exact-offset buckets); T5 uses 128 with 32 buckets"
            )
        self.num_buckets = cfg.t5_num_buckets
        self.max_distance = cfg.t5_max_distance
        self.embedding = nn.Embedding(cfg.t5_num_buckets, cfg.n_heads)
        nn.init.normal_(self.embedding.weight, 0.0, cfg.init_std)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        relative = k_pos[None, :] - q_pos[:, None]  # (T, S): key - query, <= 0 where attended
        buckets = t5_bucket(relative, self.num_buckets, self.max_distance, bidirectional=False)
        return self.embedding(buckets).float().permute(2, 0, 1)  # (n_heads, T, S)
