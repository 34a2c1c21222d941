"""Model components, one lecture topic per file: norms, ffn, positions, attention, transformer, MoE,
MLA, Gated DeltaNet, MTP (the CPU kernels under them live apart, in :mod:`lmlab.kernels`)."""

from lmlab.model.attention import KVCache
from lmlab.model.transformer import TransformerLM, lm_loss

__all__ = ["KVCache", "TransformerLM", "lm_loss"]
