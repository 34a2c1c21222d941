"""lmlab: a language-model architecture lab on PyTorch."""

__version__ = "0.1.0"
