"""Model components, one lecture topic per file: norms, ffn, positions, attention, transformer."""

from lmlab.model.attention import KVCache
from lmlab.model.transformer import TransformerLM, lm_loss

__all__ = ["KVCache", "TransformerLM", "lm_loss"]
