"""CPU kernels under the model's lecture topics, kept apart from them: the same functions as PyTorch's
ordinary ops, computed faster (or reproducibly) on a CPU.

- :mod:`lmlab.kernels.linear`: ``nn.Linear`` whose fp32 products may run on oneDNN instead of MKL;
- :mod:`lmlab.kernels.causal_attention`: causal softmax attention in row blocks (training, short contexts);
- :mod:`lmlab.kernels.embedding`: a token embedding with a deterministic backward under torch.compile;
- :mod:`lmlab.kernels.loss`: next-token cross-entropy and z-loss, chunked over rows from the hidden states;
- :mod:`lmlab.kernels.decode_layout`: the linear weights laid out for decoding (packed or transposed copies).

Each is checked against the ordinary op in ``tests/test_kernels.py`` and ``tests/test_linear.py``; the
measurements behind their defaults: docs/bench/measured-choices.md.
"""
