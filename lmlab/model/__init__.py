"""Model components, one lecture topic per file: norms, ffn, positions, attention, transformer (and
the kernels under them: linear, causal_attention, loss)."""

from lmlab.model.attention import KVCache
from lmlab.model.transformer import TransformerLM, lm_loss

__all__ = ["KVCache", "TransformerLM", "lm_loss"]
