"""The default (LLaMA-style) model: causality, KV-cache decoding, GQA, initialisation."""

import math

import pytest
import torch

from lmlab.config import ModelConfig
from lmlab.model import KVCache, TransformerLM


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("kw", [{}, {"n_kv_heads": 4}, {"n_kv_heads": 1}, {"tie_embeddings": False}])
def test_causality(kw):
    model = TransformerLM(tiny(**kw)).eval()
    x = torch.randint(0, 64, (2, 20))
    base = model(x)
    for t in (0, 7, 18):
        y = x.clone()
        y[:, t + 1 :] = torch.randint(0, 64, y[:, t + 1 :].shape)
        out = model(y)
        assert torch.equal(out[:, : t + 1], base[:, : t + 1])
        if t + 1 < 20:  # and the change is visible later: the test can fail
            assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_kv_cache_matches_full_forward(n_kv_heads):
    cfg = tiny(n_kv_heads=n_kv_heads)
    model = TransformerLM(cfg).eval()
    x = torch.randint(0, 64, (2, 24))
    full = model(x)
    cache = KVCache(cfg, batch=2, max_len=24)
    outs = [model(x[:, :5], cache)]  # a prefill of 5, then one token at a time
    for t in range(5, 24):
        outs.append(model(x[:, t : t + 1], cache))
    stepped = torch.cat(outs, dim=1)
    assert cache.length == 24
    assert (stepped - full).abs().max().item() <= 1e-5
    # cache holds only n_kv_heads heads: 2 (k, v) * layers * batch * kv_heads * len * head_dim * 4 bytes
    assert cache.nbytes == 2 * cfg.n_layers * 2 * n_kv_heads * 24 * cfg.head_dim * 4


def test_gqa_equals_mha_with_repeated_kv_heads():
    """A GQA model equals an MHA model whose K/V projections repeat each KV head for its group."""
    gqa_cfg = tiny(n_kv_heads=2, n_layers=1)
    mha_cfg = tiny(n_kv_heads=4, n_layers=1)
    gqa, mha = TransformerLM(gqa_cfg).eval(), TransformerLM(mha_cfg).eval()
    sd = gqa.state_dict()
    D, H, K = 8, 4, 2
    w = sd["blocks.0.attn.qkv.weight"]
    q, k, v = w.split([H * D, K * D, K * D])
    rep = lambda t: t.view(K, D, -1).repeat_interleave(H // K, dim=0).reshape(H * D, -1)  # noqa: E731
    sd = dict(sd)
    sd["blocks.0.attn.qkv.weight"] = torch.cat([q, rep(k), rep(v)])
    mha.load_state_dict(sd)
    x = torch.randint(0, 64, (2, 16))
    assert torch.allclose(gqa(x), mha(x), atol=1e-6)


def test_mha_matches_hand_written_attention():
    """With n_kv_heads == n_heads, one layer's attention equals softmax(QK^T/sqrt(d) + causal) V,
    written out independently (RoPE applied by its complex-number form)."""
    cfg = tiny(n_kv_heads=4, n_layers=1)
    model = TransformerLM(cfg).eval()
    attn = model.blocks[0].attn
    B, T, C, H, D = 1, 10, 32, 4, 8
    x = torch.randn(B, T, C)
    q, k, v = attn.qkv(x).split([C, C, C], dim=-1)
    q, k, v = (t.view(B, T, H, D) for t in (q, k, v))

    def rope(t):  # half-split pairing: channel i with i + D/2, angle p * 10000^(-2i/D)
        pos = torch.arange(T, dtype=torch.float64)[:, None]
        freq = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        z = torch.complex(t[..., : D // 2].double(), t[..., D // 2 :].double())
        z = z * torch.polar(torch.ones_like(pos * freq), pos * freq)[None, :, None, :]
        return torch.cat([z.real, z.imag], dim=-1).float()

    q, k = rope(q), rope(k)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, C)
    expected = attn.out(y)
    got = attn(x, torch.arange(T))
    assert torch.allclose(got, expected, atol=1e-5)


def test_initialisation_scales_residual_projections():
    cfg = ModelConfig(vocab_size=512, d_model=256, n_layers=8, n_heads=4, context_length=16)
    model = TransformerLM(cfg)
    std_in = model.blocks[0].attn.qkv.weight.std().item()
    std_out = model.blocks[0].mlp.w_out.weight.std().item()
    assert abs(std_in - 0.02) < 0.001
    assert abs(std_out - 0.02 / math.sqrt(16)) < 0.0005
    assert model.lm_head.weight is model.embed.weight  # tied by default


def test_param_count_formula():
    """Parameters of the default recipe by hand: embeddings + per layer (qkv, out, gated FFN, 2 norms)
    + final norm; tied head."""
    cfg = tiny()
    C, V, L, D, H, K, F = 32, 64, 2, 8, 4, 2, cfg.d_ff
    per_layer = C * (H + 2 * K) * D + H * D * C + 3 * C * F + 2 * C
    assert TransformerLM(cfg).num_params() == V * C + L * per_layer + C
    assert F == 128  # 8/3 * 32 = 85.3 rounded up to a multiple of 64


def test_meta_builds_draw_nothing_and_real_ones_draw_as_torch(monkeypatch):
    """lmlab's Linear and Embedding skip nn's default draws on the meta device (there are no values) and draw
    exactly as nn.Linear / nn.Embedding elsewhere (same seed, same tensors)."""
    import torch.nn as nn

    from lmlab.kernels.embedding import Embedding
    from lmlab.kernels.linear import Linear

    torch.manual_seed(3)
    want = nn.Linear(5, 3), nn.Embedding(7, 4)
    torch.manual_seed(3)
    got = Linear(5, 3), Embedding(7, 4)
    for w, g in zip(want, got):
        for a, b in zip(w.parameters(), g.parameters()):
            assert torch.equal(a, b)

    def refuse(*args, **kwargs):
        raise AssertionError("a draw on the meta device")

    monkeypatch.setattr(nn.init, "kaiming_uniform_", refuse)
    monkeypatch.setattr(nn.init, "normal_", refuse)
    with torch.device("meta"):
        model = TransformerLM(ModelConfig(vocab_size=64, context_length=16, d_model=32, n_layers=2, n_heads=2))
    assert all(p.is_meta for p in model.parameters())
    with pytest.raises(AssertionError, match="a draw on the meta device"):
        Linear(5, 3)  # on the CPU it draws


def test_a_model_build_leaves_the_garbage_collector_as_it_found_it(monkeypatch):
    """TransformerLM pauses Python's cyclic collector while it builds its blocks and restores its state after,
    also when the build fails; a collector the caller had turned off stays off."""
    import gc

    from lmlab.model import transformer

    cfg = ModelConfig(vocab_size=64, context_length=16, d_model=32, n_layers=2, n_heads=2)
    seen = []
    real_block = transformer.Block
    monkeypatch.setattr(transformer, "Block", lambda *a: seen.append(gc.isenabled()) or real_block(*a))
    assert gc.isenabled()
    TransformerLM(cfg)
    assert seen == [False, False] and gc.isenabled()
    monkeypatch.setattr(transformer, "Block", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        TransformerLM(cfg)
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(transformer, "Block", real_block)
        TransformerLM(cfg)
        assert not gc.isenabled()
    finally:
        gc.enable()
