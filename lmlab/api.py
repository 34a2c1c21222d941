"""The public Python API of lmlab, in one place: ``import lmlab.api as lm``.

- configs and models: :class:`ModelConfig` (every switch of lecture 3, validated), :class:`TransformerLM`
  ((batch, T) ids -> (batch, T, vocab_size) logits), :func:`get_preset` (model families with sources);
- attention with an arbitrary boolean mask: :func:`attention`, :func:`causal_mask`;
- data: :func:`prepare` (text -> tokenizer + shards), :class:`TokenData`, :class:`Tokenizer`;
- training: :class:`TrainConfig`, :class:`Trainer` (``Trainer.create(run_dir, cfg, tc, data_dir).fit()``),
  :func:`setup_run` (what ``lmlab train`` does);
- evaluation and sampling: :func:`evaluate` (loss in nats/token, bits/byte), :func:`generate`,
  :func:`generate_batch`, :func:`generate_logprobs`;
- cost analysis: :func:`param_counts`, :func:`flops_per_token`, :func:`kv_cache_bytes`;
- runs and checkpoints: :func:`load_run`, :func:`save_checkpoint`, :func:`read_checkpoint`,
  :func:`load_weights`.

Everything here is documented in its module and covered by tests; ``tests/test_readme_api.py`` runs
the example of docs/python-api.md.
"""

from lmlab.analysis import flops_per_token, kv_cache_bytes
from lmlab.checkpoint import load_run, load_weights, read_checkpoint, save_checkpoint
from lmlab.config import ConfigError, ModelConfig
from lmlab.data.prepare import prepare
from lmlab.data.shards import TokenData
from lmlab.data.tokenizer import Tokenizer
from lmlab.evaluate import evaluate
from lmlab.generate import generate, generate_batch, generate_logprobs
from lmlab.model import TransformerLM
from lmlab.model.attention import attention, causal_mask
from lmlab.param_counts import param_counts
from lmlab.presets import get_preset
from lmlab.runs import setup_run
from lmlab.train import TrainConfig, Trainer

__all__ = [
    "ConfigError",
    "ModelConfig",
    "TokenData",
    "Tokenizer",
    "TrainConfig",
    "Trainer",
    "TransformerLM",
    "attention",
    "causal_mask",
    "evaluate",
    "flops_per_token",
    "generate",
    "generate_batch",
    "generate_logprobs",
    "get_preset",
    "kv_cache_bytes",
    "load_run",
    "load_weights",
    "param_counts",
    "prepare",
    "read_checkpoint",
    "save_checkpoint",
    "setup_run",
]
