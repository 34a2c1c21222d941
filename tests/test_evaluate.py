"""Bits-per-byte: every token scored exactly once, against hand computations."""

import math

import numpy as np
import pytest
import torch

from lmlab.config import ModelConfig
from lmlab.evaluate import evaluate, windows
from lmlab.model import TransformerLM


@pytest.mark.parametrize("n,T,stride", [(2, 4, None), (50, 8, None), (51, 8, 3), (17, 16, 16), (100, 7, 1)])
def test_windows_score_every_target_once(n, T, stride):
    seen = []
    for start, a, b in windows(n, T, stride):
        assert 0 <= start <= a - 1 and b - 1 - start <= T  # the inputs fit in one context
        seen.extend(range(a, b))
    assert seen == list(range(1, n))


def constant_model(vocab: int) -> tuple[TransformerLM, torch.Tensor]:
    """A model whose logits ignore the input: all weights zero except the LM-head bias."""
    cfg = ModelConfig(
        vocab_size=vocab, context_length=8, d_model=16, n_layers=1, n_heads=2, lm_head_bias=True, tie_embeddings=False
    )
    model = TransformerLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.lm_head.bias.copy_(torch.linspace(-2, 3, vocab))
    return model, torch.log_softmax(model.lm_head.bias.detach().double(), -1)


def test_bits_per_byte_hand_computation():
    """Text of 37 bytes (not a multiple of context 8), bytes tokenizer: bpb = sum of -log p over the
    36 targets / ln 2 / 37, computed by hand from the fixed output distribution."""
    text = "To be, or not to be: that is the Qu."
    tokens = np.array([256] + list(text.encode()), dtype=np.uint16)  # EOT then the bytes
    model, logp = constant_model(257)
    res = evaluate(model, tokens, n_bytes=len(text.encode()), batch_size=3)
    nll = -sum(logp[t].item() for t in tokens[1:])
    assert res["tokens"] == len(text) == 36
    assert res["nll_nats"] == pytest.approx(nll, rel=1e-6)
    assert res["bits_per_byte"] == pytest.approx(nll / math.log(2) / 36, rel=1e-6)
    assert res["loss"] == pytest.approx(nll / 36, rel=1e-6)
    assert res["perplexity"] == pytest.approx(math.exp(nll / 36), rel=1e-6)


@pytest.mark.parametrize("stride", [None, 3])
def test_windows_give_each_target_its_context(stride):
    """A real (random) model: evaluate() equals scoring each target with one forward pass over exactly
    the window the rule assigns it, written as a plain loop."""
    cfg = ModelConfig(vocab_size=50, context_length=8, d_model=16, n_layers=2, n_heads=2)
    model = TransformerLM(cfg).eval()
    tokens = np.random.default_rng(0).integers(0, 50, 43).astype(np.uint16)
    res = evaluate(model, tokens, n_bytes=100, batch_size=4, stride=stride)
    S = stride or 8
    nll = 0.0
    for t in range(1, 43):
        a = 1 + ((t - 1) // S) * S  # first target of t's chunk
        b = min(a + S, 43)
        start = max(0, b - 1 - 8)
        ctx = torch.tensor(tokens[start:t].astype(np.int64))[None]
        logp = torch.log_softmax(model(ctx)[0, -1].double(), -1)
        nll -= logp[int(tokens[t])].item()
    assert res["tokens"] == 42
    assert res["nll_nats"] == pytest.approx(nll, rel=1e-5)
    assert res["bits_per_byte"] == pytest.approx(nll / math.log(2) / 100, rel=1e-5)


def test_loss_by_position_is_the_mean_over_full_windows_by_hand():
    """by_position: entry j is the mean over the full windows (every one but a short last one with the
    default stride) of -log p(target j | its j + 1 tokens of context), each scored by its own forward
    pass here."""
    cfg = ModelConfig(vocab_size=50, context_length=8, d_model=16, n_layers=2, n_heads=2)
    model = TransformerLM(cfg).eval()
    tokens = np.random.default_rng(1).integers(0, 50, 43).astype(np.uint16)
    res = evaluate(model, tokens, n_bytes=100, batch_size=4, by_position=True)
    full = [(s, a, b) for s, a, b in windows(43, 8) if a - 1 == s and b - a == 8]
    assert len(full) == 5  # targets 1-8, 9-16, ..., 33-40; the last chunk (41-42) is short
    want = []
    for j in range(8):
        vals = []
        for s, a, b in full:
            ctx = torch.tensor(tokens[s : s + j + 1].astype(np.int64))[None]
            logp = torch.log_softmax(model(ctx)[0, -1].double(), -1)
            vals.append(-logp[int(tokens[s + j + 1])].item())
        want.append(sum(vals) / len(vals))
    assert res["loss_by_position"] == pytest.approx(want, rel=1e-5)
    assert "loss_by_position" not in evaluate(model, tokens, n_bytes=100)


def test_the_lm_head_in_row_blocks_gives_the_whole_forwards_numbers():
    """evaluate runs a plain TransformerLM's LM head and loss a block of rows at a time (128 rows at a
    vocabulary of 8,192: each batch of 16 x 16 targets in two blocks); a model with a forward hook is called
    whole (``model(x)``, as an FSDP-sharded one must be). Both give the same loss, bits per byte and loss by
    position, with a soft-capped, biased head (the parts ``model.logits`` applies); and the bits per byte
    are the hand computation's from the whole forward's logits (float64 log-softmax)."""
    cfg = ModelConfig(
        vocab_size=8192,
        context_length=16,
        d_model=16,
        n_layers=1,
        n_heads=2,
        final_logit_softcap=5.0,
        lm_head_bias=True,
        tie_embeddings=False,
    )
    torch.manual_seed(0)
    model = TransformerLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.bias.normal_()
    tokens = np.random.default_rng(0).integers(0, 8192, 593)  # 37 windows of 16 targets
    ours = evaluate(model, tokens, 1800, by_position=True)
    handle = model.register_forward_hook(lambda m, args, out: None)
    whole = evaluate(model, tokens, 1800, by_position=True)
    handle.remove()
    assert ours["tokens"] == whole["tokens"] == 592
    for key in ("loss", "bits_per_byte"):
        assert ours[key] == pytest.approx(whole[key], rel=1e-6)
    assert ours["loss_by_position"] == pytest.approx(whole["loss_by_position"], rel=1e-6)
    with torch.no_grad():  # windows of 16 from 0 (the default stride): every target once
        x = torch.as_tensor(tokens, dtype=torch.int64)
        nll = 0.0
        for start in range(0, 592, 16):
            ids = x[start : start + 17]
            logp = torch.log_softmax(model(ids[None, :-1]).double(), -1)[0]
            nll -= logp.gather(1, ids[1:, None]).sum().item()
    assert ours["bits_per_byte"] == pytest.approx(nll / math.log(2) / 1800, rel=1e-6)
