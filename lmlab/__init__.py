"""lmlab: a language-model architecture lab on PyTorch.

The public Python API is :mod:`lmlab.api` (``import lmlab.api as lm``): configs and models, attention
with an arbitrary mask, data, training, evaluation, sampling, cost analysis, runs and checkpoints.
``import lmlab`` itself imports nothing heavy, so the CLI starts fast.
"""

__version__ = "0.1.0"
