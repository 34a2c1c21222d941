"""Attention switches: causality, sliding windows and hybrid patterns, GQA/MQA, KV cache, QK-norm,
soft-caps, query scale, z-loss, and the invalid combinations that must raise ConfigError."""

from __future__ import annotations

import math

import pytest
import torch

import lmlab.model.attention as attention_mod
from lmlab.config import ConfigError, ModelConfig
from lmlab.model import KVCache, TransformerLM, lm_loss
from lmlab.model.attention import Attention, causal_mask


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=4, ffn_ratio=2.0)
    base.update(kw)
    return ModelConfig(**base)


def model(seed: int = 0, **kw) -> TransformerLM:
    torch.manual_seed(seed)
    m = TransformerLM(tiny(**kw)).eval()
    with torch.no_grad():  # sink logits away from their zero init, so a misplaced sink shows
        for b in m.blocks:
            if getattr(b.attn, "sinks", None) is not None:
                b.attn.sinks.normal_(0.0, 1.0)
    return m


def tokens(T: int = 12, seed: int = 1, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 64, (batch, T), generator=torch.Generator().manual_seed(seed))


def changed(idx: torch.Tensor, pos: int) -> torch.Tensor:
    out = idx.clone()
    out[:, pos] = (out[:, pos] + 1) % 64
    return out


# --- masks ------------------------------------------------------------------------------------------


def test_causal_mask_window_by_hand():
    # window 3 counts the current token: query i sees i-2, i-1, i
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(causal_mask(torch.arange(5), torch.arange(5), 3), expected)
    assert torch.equal(causal_mask(torch.arange(5), torch.arange(5), None), torch.ones(5, 5).tril().bool())
    # offset queries (KV-cache decoding): query at position 4 against keys 0..4
    assert torch.equal(causal_mask(torch.tensor([4]), torch.arange(5), 3), expected[4:])


POSITION_KINDS = ["rope", "nope", "learned", "sinusoidal", "alibi", "t5"]


@pytest.mark.parametrize("position", POSITION_KINDS)
def test_causal_for_every_position_kind(position):
    m = model(position=position, n_layers=2)
    idx = tokens()
    with torch.no_grad():
        ref = m(idx)
        for t in (3, 8):
            out = m(changed(idx, t + 1))
            assert torch.allclose(out[:, : t + 1], ref[:, : t + 1], atol=1e-6)
            assert not torch.allclose(out[:, t + 1], ref[:, t + 1], atol=1e-4)


@pytest.mark.parametrize("position", ["rope", "alibi", "nope"])
def test_sliding_window_receptive_field(position):
    W, t = 4, 10
    with torch.no_grad():
        for n_layers in (1, 2):
            m = model(position=position, n_layers=n_layers, sliding_window=W)
            idx = tokens(T=12)
            ref = m(idx)[:, t]
            first_seen = t - n_layers * (W - 1)  # receptive field grows by W - 1 per layer
            for pos in range(first_seen):
                assert torch.allclose(m(changed(idx, pos))[:, t], ref, atol=1e-6), (n_layers, pos)
            for pos in (first_seen, t - 1):
                assert not torch.allclose(m(changed(idx, pos))[:, t], ref, atol=1e-4), (n_layers, pos)


def test_hybrid_pattern_places_global_layers():
    cfg = tiny(n_layers=6, layer_pattern="LLG", sliding_window=3)
    m = TransformerLM(cfg)
    assert [b.attn.window for b in m.blocks] == [3, 3, None, 3, 3, None]
    assert [cfg.layer_is_local(i) for i in range(6)] == [True, True, False, True, True, False]
    # behaviour: a 1-layer model whose only layer is global sees the whole prefix despite sliding_window
    with torch.no_grad():
        for pattern, sees_first in (("G", True), ("L", False)):
            mm = model(layer_pattern=pattern, sliding_window=3)
            idx = tokens()
            assert torch.allclose(mm(changed(idx, 0))[:, 10], mm(idx)[:, 10], atol=1e-6) != sees_first


# --- GQA / MQA --------------------------------------------------------------------------------------


def reference_attention(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """Hand-written causal attention with key/value head h // (H/K) for query head h (no RoPE: NoPE)."""
    B, T, _ = x.shape
    H, K, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    W = attn.qkv.weight
    out = torch.zeros(B, T, H * D)
    for h in range(H):
        g = h // (H // K)
        q = x @ W[h * D : (h + 1) * D].T
        k = x @ W[(H + g) * D : (H + g + 1) * D].T
        v = x @ W[(H + K + g) * D : (H + K + g + 1) * D].T
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        s = s.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        out[..., h * D : (h + 1) * D] = s.softmax(-1) @ v
    return attn.out(out)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_attention_matches_hand_reference(n_kv_heads):
    torch.manual_seed(0)
    attn = Attention(tiny(position="nope", n_kv_heads=n_kv_heads), 0).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        assert torch.allclose(attn(x, torch.arange(7)), reference_attention(attn, x), atol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads):
    gqa = model(n_kv_heads=n_kv_heads)
    mha = model(n_kv_heads=4)
    state = gqa.state_dict()
    H, K, D = 4, n_kv_heads, 8
    w = state["blocks.0.attn.qkv.weight"]
    q, k, v = w.split([H * D, K * D, K * D])
    rep = lambda t: t.view(K, D, -1).repeat_interleave(H // K, dim=0).reshape(H * D, -1)  # noqa: E731
    state["blocks.0.attn.qkv.weight"] = torch.cat([q, rep(k), rep(v)])
    mha.load_state_dict(state)
    idx = tokens()
    with torch.no_grad():
        assert torch.allclose(gqa(idx), mha(idx), atol=1e-5)


# --- KV cache ---------------------------------------------------------------------------------------

CACHE_CONFIGS = {
    "mha": dict(),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "window": dict(sliding_window=3, n_layers=2),
    "hybrid": dict(n_layers=2, layer_pattern="LG", sliding_window=3, nope_global_layers=True, rope_local_theta=100.0),
    "alibi": dict(position="alibi", n_heads=3, d_model=36, sliding_window=5),
    "t5": dict(position="t5", t5_num_buckets=8, t5_max_distance=12),
    "partial_interleaved": dict(rope_fraction=0.5, rope_style="interleaved"),
    "softcaps": dict(attn_logit_softcap=1.0, final_logit_softcap=3.0, query_pre_attn_scalar=12.0),
    "qk_norm_yarn": dict(
        qk_norm="rmsnorm", rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    ),
    "learned": dict(position="learned", n_kv_heads=2),
    "sinusoidal": dict(position="sinusoidal"),
    "sinks_gate_window": dict(
        attn_sinks=True, attn_output_gate="elementwise", sliding_window=3, n_layers=2, n_kv_heads=2, bias="attention"
    ),
    "sinks_alibi_headwise": dict(position="alibi", attn_sinks=True, attn_output_gate="headwise"),
}


@pytest.mark.parametrize("name", list(CACHE_CONFIGS))
def test_kv_cache_decoding_equals_full_forward(name):
    m = model(**CACHE_CONFIGS[name])
    idx = tokens(T=10)
    with torch.no_grad():
        full = m(idx)
        cache = KVCache(m.cfg, batch=2, max_len=10)
        steps = [m(idx[:, :4], cache=cache), m(idx[:, 4:7], cache=cache)]  # prefill, a chunk, then one by one
        for t in range(7, 10):
            steps.append(m(idx[:, t : t + 1], cache=cache))
    assert cache.length == 10
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


LEAN_CONFIGS = {
    "gqa": dict(n_kv_heads=2, n_layers=2),
    "mqa_bias_layernorm": dict(n_kv_heads=1, bias="all", norm_type="layernorm", norm_bias=True),
    "rolling_hybrid_nope_global": dict(
        n_layers=3, layer_pattern="LLG", sliding_window=3, nope_global_layers=True, rope_local_theta=100.0
    ),
    "partial_interleaved_geglu": dict(rope_fraction=0.5, rope_style="interleaved", activation="geglu"),
    "parallel_shared_norm_gemma": dict(
        parallel_block=True, parallel_shared_norm=True, norm_type="gemma_rmsnorm", activation="gelu"
    ),
    "parallel_two_norms_nope": dict(parallel_block=True, position="nope", n_kv_heads=2),
    "learned_window": dict(position="learned", sliding_window=4, tie_embeddings=True),
    "scaled_query_and_embeddings": dict(query_pre_attn_scalar=12.0, scale_embeddings=True),
}


@pytest.mark.parametrize("name", list(LEAN_CONFIGS))
@pytest.mark.parametrize("padded", [False, True])
def test_lean_decode_step_equals_the_full_forward(name, padded, monkeypatch):
    """Inside ``decode_layout`` one-token steps run each block's ``decode_one`` (counted here), and the
    logits still equal the full forward, past the window, with and without left padding."""
    from lmlab.kernels.decode_layout import decode_layout
    from lmlab.model.transformer import Block

    calls = []
    original = Block.decode_one
    monkeypatch.setattr(Block, "decode_one", lambda self, *a: calls.append(1) or original(self, *a))
    m = model(**LEAN_CONFIGS[name])
    T, P = 14, 4
    idx = tokens(T=T)
    pad = torch.tensor([0, 2]) if padded else None
    with torch.no_grad():
        full = m(idx, left_pad=pad)
    with decode_layout(m, batch=2), torch.inference_mode():
        assert m.lean_decode
        cache = KVCache(m.cfg, batch=2, max_len=T, left_pad=pad)
        steps = [m(idx[:, :P], cache=cache)] + [m(idx[:, t : t + 1], cache=cache) for t in range(P, T)]
    assert not m.lean_decode  # only while generating
    assert len(calls) == (T - P) * m.cfg.n_layers
    stepped = torch.cat(steps, dim=1)
    rows = [slice(None)] if pad is None else [(i, slice(int(pad[i]), None)) for i in range(2)]
    for r in rows:
        assert torch.allclose(stepped[r], full[r], atol=1e-5)
    assert not torch.allclose(stepped[:, -1], stepped[:, -2])  # the positions differ: the check can fail


@pytest.mark.parametrize(
    "kw",
    [
        dict(qk_norm="rmsnorm"),
        dict(attn_logit_softcap=5.0),
        dict(clip_qkv=1.0),
        dict(position="alibi"),
        dict(position="t5"),
        dict(norm_position="post"),
        dict(norm_position="sandwich"),
    ],
)
def test_lean_decode_not_used_where_it_does_not_apply(kw):
    from lmlab.kernels.decode_layout import decode_layout

    m = model(**kw)
    with decode_layout(m, batch=1):
        assert not m.lean_decode


def test_forward_hooks_keep_the_ordinary_decode_path():
    """A hook on any module inside the blocks must see every step: decode_layout then leaves lean
    decoding off, and the hooked module is called on each one-token step."""
    from lmlab.generate import generate

    m = model(n_layers=2)
    seen = []
    handle = m.blocks[1].mlp.w_in.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape))
    out = list(generate(m, [1, 2, 3], 5, temperature=0))
    assert len(seen) == 1 + 4  # the prefill, then the 4 steps after the first new token
    handle.remove()
    assert list(generate(m, [1, 2, 3], 5, temperature=0)) == out  # same tokens on the lean path
    assert len(seen) == 5


def test_kv_cache_stores_only_kv_heads():
    cfg = tiny(n_kv_heads=1, n_layers=2)
    cache = KVCache(cfg, batch=3, max_len=16)
    assert cache.k[0].shape == (3, 1, 16, 8)
    assert cache.nbytes == 2 * 2 * 3 * 1 * 16 * 8 * 4
    with pytest.raises(ValueError, match="KV cache full"):
        TransformerLM(cfg)(torch.zeros(3, 17, dtype=torch.long), cache=cache)


ROLLING_CONFIGS = {  # every layer kind with a window, decoded far past it through the rolling buffer
    "window": dict(sliding_window=3, n_layers=2),
    "window_gqa_softcap": dict(sliding_window=4, n_kv_heads=2, attn_logit_softcap=1.0),  # explicit softmax
    "hybrid": dict(n_layers=2, layer_pattern="LG", sliding_window=3, nope_global_layers=True, rope_local_theta=100.0),
    "alibi": dict(position="alibi", n_heads=3, d_model=36, sliding_window=5),
    "t5_mqa": dict(position="t5", t5_num_buckets=8, t5_max_distance=12, sliding_window=4, n_kv_heads=1),
    "learned_partial": dict(position="learned", sliding_window=5, rope_fraction=0.5),
    "sinks_gpt_oss_like": dict(
        attn_sinks=True, n_layers=2, layer_pattern="LG", sliding_window=3, n_kv_heads=2, bias="attention"
    ),  # gpt-oss: sinks on alternating local/global layers
}


@pytest.mark.parametrize("name", list(ROLLING_CONFIGS))
def test_rolling_window_cache_decodes_far_past_the_window(name):
    """Sliding-window layers keep only `sliding_window` entries (index i in slot i % W), yet prefill, chunks
    longer than the window, chunks crossing the wrap and single tokens all equal the full forward."""
    m = model(**ROLLING_CONFIGS[name])
    T = 26
    idx = tokens(T=T)
    schedule = [5, 1, 1, 4, 1, 2, 7, 1, 1, 1, 2, 1]  # sums to 27 > T: cut at T
    with torch.no_grad():
        full = m(idx)
        cache = KVCache(m.cfg, batch=2, max_len=T)
        steps, t = [], 0
        for n in schedule:
            n = min(n, T - t)
            if n:
                steps.append(m(idx[:, t : t + n], cache=cache))
                t += n
    assert t == T == cache.length
    windows = [m.cfg.layer_window(i) for i in range(m.cfg.n_layers)]
    assert [c.shape[2] for c in cache.k] == [w or T for w in windows]  # fixed memory on windowed layers
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_all_window_model_decodes_past_max_len_in_fixed_memory():
    m = model(sliding_window=4, n_layers=2, n_kv_heads=2)
    idx = tokens(T=20)
    with torch.no_grad():
        full = m(idx)
        cache = KVCache(m.cfg, batch=2, max_len=6)  # every layer windowed: the buffers never fill
        steps = [m(idx[:, :3], cache=cache)] + [m(idx[:, t : t + 1], cache=cache) for t in range(3, 20)]
    assert cache.length == 20 and all(k.shape[2] == 4 for k in cache.k)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_kv_cache_nbytes_formula_with_windows():
    cfg = tiny(n_layers=4, layer_pattern="LG", sliding_window=3, n_kv_heads=2)
    batch, max_len, head_dim, fp32 = 2, 16, 8, 4
    cache = KVCache(cfg, batch=batch, max_len=max_len)
    per_entry = 2 * batch * cfg.n_kv_heads * head_dim * fp32  # k and v of one cache index in one layer
    assert cache.nbytes == per_entry * (3 + 16 + 3 + 16)
    bf16 = KVCache(cfg, batch=batch, max_len=max_len, dtype=torch.bfloat16)
    assert bf16.nbytes == cache.nbytes // 2
    assert KVCache(tiny(n_layers=4), batch=batch, max_len=max_len).nbytes == 2 * batch * 4 * head_dim * fp32 * 16 * 4


PAD_CONFIGS = {
    "rope_gqa": dict(n_kv_heads=2, n_layers=2),
    "sinks_gate_window": dict(attn_sinks=True, attn_output_gate="elementwise", sliding_window=3, n_layers=2),
    "window_hybrid": dict(n_layers=2, layer_pattern="LG", sliding_window=3),
    "alibi": dict(position="alibi", sliding_window=6),
    "t5": dict(position="t5", t5_num_buckets=8, t5_max_distance=12),
    "learned": dict(position="learned", n_kv_heads=1),
    "sinusoidal_softcap": dict(position="sinusoidal", attn_logit_softcap=1.0),
    "qk_norm_partial": dict(qk_norm="rmsnorm", rope_fraction=0.5),
}


@pytest.mark.parametrize("name", list(PAD_CONFIGS))
def test_left_padded_batch_equals_each_row_alone(name):
    """Rows of different lengths, left-padded: with ``left_pad`` every real token's logits equal the row run
    alone, in a full forward and through the cache (prefill then one token at a time)."""
    m = model(**PAD_CONFIGS[name])
    lengths, extra = [9, 4, 1], 6
    rows = [tokens(T=n + extra, seed=10 + i, batch=1)[0] for i, n in enumerate(lengths)]
    P = max(lengths)
    pad = torch.tensor([P - n for n in lengths])
    batch = torch.full((3, P + extra), 63, dtype=torch.long)  # padding token id 63, deliberately not 0
    for i, r in enumerate(rows):
        batch[i, pad[i] :] = r
    with torch.no_grad():
        alone = [m(r[None])[0] for r in rows]
        full = m(batch, left_pad=pad)
        cache = KVCache(m.cfg, batch=3, max_len=P + extra, left_pad=pad)
        stepped = torch.cat(
            [m(batch[:, :P], cache=cache)] + [m(batch[:, t : t + 1], cache=cache) for t in range(P, P + extra)], dim=1
        )
    for i in range(3):
        assert torch.allclose(full[i, pad[i] :], alone[i], atol=1e-5)
        assert torch.allclose(stepped[i, pad[i] :], alone[i], atol=1e-5)
    assert torch.isfinite(full).all() and torch.isfinite(stepped).all()  # padding rows too (no empty softmax)


def test_left_pad_checks():
    cfg = tiny()
    cache = KVCache(cfg, batch=2, max_len=8)
    with pytest.raises(ValueError, match="2"):
        cache.set_left_pad([1, 2, 3])
    TransformerLM(cfg)(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="before the first token"):
        cache.set_left_pad([1, 0])
    assert KVCache(cfg, batch=2, max_len=8, left_pad=[0, 0]).left_pad is None  # no padding: the fast path


# --- stability tricks -------------------------------------------------------------------------------


def test_attention_softcap_bounds_logits(monkeypatch):
    seen = []
    real = attention_mod.softcap

    def spy(x, cap):
        y = real(x, cap)
        seen.append((x.detach().abs().max().item(), y.detach().abs().max().item()))
        return y

    monkeypatch.setattr(attention_mod, "softcap", spy)
    m = model(attn_logit_softcap=2.0, init_std=0.25, n_layers=2)  # raw logits up to ~10 (fp32 tanh < 1)
    with torch.no_grad():
        m(tokens())
    assert len(seen) == 2
    assert max(raw for raw, _ in seen) > 4.0  # the cap was needed...
    assert all(capped < 2.0 for _, capped in seen)  # ...and held


def test_softcap_function_and_final_logit_softcap():
    x = torch.tensor([-100.0, -1.0, 0.0, 0.5, 100.0])
    assert torch.allclose(attention_mod.softcap(x, 5.0), 5.0 * torch.tanh(x / 5.0))
    assert torch.equal(attention_mod.softcap(x, None), x)
    idx = tokens()
    with torch.no_grad():
        raw = model(init_std=0.5)(idx)
        capped = model(init_std=0.5, final_logit_softcap=3.0)(idx)
    assert raw.abs().max() > 3.0
    assert capped.abs().max() < 3.0
    assert torch.allclose(capped, 3.0 * torch.tanh(raw / 3.0), atol=1e-5)


def test_z_loss_by_hand():
    logits = torch.tensor([[[0.0, 1.0, 2.0], [1.0, 1.0, 1.0], [5.0, 0.0, 0.0]]])
    targets = torch.tensor([[2, 0, -100]])
    log_z = [math.log(1 + math.e + math.e**2), 1 + math.log(3)]
    ce = ((log_z[0] - 2.0) + (log_z[1] - 1.0)) / 2
    alpha = 1e-2
    loss, ce_out = lm_loss(logits, targets, z_loss=alpha)
    assert ce_out.item() == pytest.approx(ce, rel=1e-6)
    assert loss.item() == pytest.approx(ce + alpha * (log_z[0] ** 2 + log_z[1] ** 2) / 2, rel=1e-6)
    assert lm_loss(logits, targets)[0].item() == pytest.approx(ce, rel=1e-6)


def test_qk_norm_bounds_attention_logits():
    D = 8
    torch.manual_seed(0)
    x = torch.randn(2, 10, 32) * 10
    for qk_norm, bounded in (("rmsnorm", True), ("none", False)):
        torch.manual_seed(0)
        attn = Attention(tiny(qk_norm=qk_norm, init_std=1.0), 0).eval()
        with torch.no_grad():
            q, k, _ = attn.qkv(x).split([4 * D, 4 * D, 4 * D], dim=-1)
            q, k = q.view(2, 10, 4, D).transpose(1, 2), k.view(2, 10, 4, D).transpose(1, 2)
            if attn.q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            pos = torch.arange(10)
            q, k = attn.rope(q, pos), attn.rope(k, pos)
            logits = (q @ k.transpose(-1, -2)) * attn.scale
            attn.record_max_logit = True
            attn(x, pos)  # the module's own diagnostic agrees with the bound
        assert (logits.abs().max() <= math.sqrt(D) + 1e-4) == bounded
        assert (attn.max_logit <= math.sqrt(D) + 1e-4) == bounded
    assert logits.abs().max() > 0.5 * math.sqrt(D)


def test_query_pre_attn_scalar_sets_the_scale():
    x = torch.randn(1, 6, 32)
    pos = torch.arange(6)
    torch.manual_seed(0)
    a = Attention(tiny(query_pre_attn_scalar=32.0), 0).eval()  # scale 32^-0.5 = (1/sqrt(8)) / 2
    torch.manual_seed(0)
    b = Attention(tiny(), 0).eval()
    assert a.scale == pytest.approx(32**-0.5)
    with torch.no_grad():
        b.qkv.weight[:32] *= 0.5  # halve q instead
        assert torch.allclose(a(x, pos), b(x, pos), atol=1e-5)


def test_attention_fast_and_explicit_paths_agree():
    m = model(n_kv_heads=2, n_layers=2)
    idx = tokens()
    with torch.no_grad():
        fast = m(idx)
        for block in m.blocks:
            block.attn.record_max_logit = True  # forces the explicit softmax
        slow = m(idx)
    assert torch.allclose(fast, slow, atol=1e-5)


# --- invalid combinations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(sliding_window=0), "sliding_window"),
        (dict(d_model=64, rope_fraction=0.3125), "rope_fraction"),  # head_dim 16 * 0.3125 = 5 rotated channels
        (dict(n_kv_heads=3), "n_kv_heads"),
        (dict(n_kv_heads=8), "n_kv_heads"),
        (dict(n_layers=4, layer_pattern="", sliding_window=2), "layer_pattern"),  # (a pattern may end mid-way)
        (dict(layer_pattern="LX", n_layers=2, sliding_window=2), "layer_pattern"),
        (dict(layer_pattern="L"), "sliding_window"),
        (dict(nope_global_layers=True), "nope_global_layers"),
        (dict(attn_logit_softcap=0.0), "attn_logit_softcap"),
        (dict(qk_norm="l1"), "qk_norm"),
    ],
)
def test_invalid_attention_configs_raise(kw, field):
    with pytest.raises(ConfigError, match=field):
        tiny(**kw)


def test_chunked_attention_sees_exactly_its_own_chunk():
    """Llama 4's chunked local attention: position t attends to s <= t with s // W == t // W."""
    from lmlab.model.attention import causal_mask

    W, n = 4, 11
    pos = torch.arange(n)
    got = causal_mask(pos, pos, W, chunk=True)
    want = torch.tensor([[s <= t and s // W == t // W for s in range(n)] for t in range(n)])
    assert torch.equal(got, want)
    assert got[4].tolist() == [False] * 4 + [True] + [False] * 6  # a chunk's first token sees itself only
    from lmlab.analysis import mean_keys

    assert mean_keys(10, 4, chunk=True) == pytest.approx(23 / 10)  # 1,2,3,4,1,2,3,4,1,2


def test_chunked_model_ignores_earlier_chunks_and_decodes_as_its_forward():
    from lmlab.config import ModelConfig
    from lmlab.model import TransformerLM

    cfg = ModelConfig(
        vocab_size=50,
        context_length=32,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        sliding_window=4,
        local_attention="chunk",
    )
    torch.manual_seed(0)
    model = TransformerLM(cfg).eval()
    x = torch.randint(0, 50, (1, 12))
    y = x.clone()
    y[0, :8] = (y[0, :8] + 7) % 50  # change every token before the last chunk (positions 8..11)
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[0, 8:], b[0, 8:], atol=1e-6) and not torch.allclose(a[0, :8], b[0, :8])
    window = TransformerLM(ModelConfig(**{**cfg.to_dict(), "local_attention": "window"})).eval()
    window.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(window(y)[0, 8:], b[0, 8:])  # a sliding window would see them
    from lmlab.generate import generate_logprobs

    prompt = [3, 1, 4, 1, 5]
    steps = list(generate_logprobs(model, prompt, 20, temperature=0.0))  # past several chunks: the buffer wraps
    seq = prompt + [t for t, _ in steps]
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([seq]))[0], -1)
    for i, (t, lp) in enumerate(steps):  # each decoded token's log-probability from the cache = the forward's
        assert t == int(full[len(prompt) - 1 + i].argmax())
        assert lp == pytest.approx(float(full[len(prompt) - 1 + i, t]), abs=1e-5)


def test_llama4_temperature_and_l2_qk_norm_by_hand():
    """Llama 4 (HF Llama4TextAttention): NoPE layers scale q by 1 + scale * log(1 + floor((p + 1) / floor));
    the weightless L2 QK-norm sits on the RoPE layers only and has no parameters."""
    from lmlab.generate import generate_logprobs
    from lmlab.param_counts import param_counts

    cfg = ModelConfig(
        vocab_size=40,
        context_length=32,
        d_model=32,
        n_layers=4,
        n_heads=4,
        nope_layers="RRRN",
        qk_norm="l2",
        qk_norm_layers="rope",
        attn_temperature_tuning=True,
        attn_temperature_floor=4,
        attn_temperature_scale=0.5,
    )
    model = TransformerLM(cfg)
    rope_layer, nope_layer = model.blocks[0].attn, model.blocks[3].attn
    assert rope_layer.q_norm is not None and nope_layer.q_norm is None and rope_layer.temperature is None
    assert sum(p.numel() for p in rope_layer.q_norm.parameters()) == 0
    assert model.num_params() == param_counts(cfg)["total"]
    t = nope_layer.temperature_of(torch.tensor([0, 2, 3, 7, 8, 30])).flatten().tolist()
    want = [1.0, 1.0, 1 + 0.5 * math.log(2), 1 + 0.5 * math.log(3), 1 + 0.5 * math.log(3), 1 + 0.5 * math.log(8)]
    assert t == pytest.approx(want, abs=1e-6)
    q = torch.randn(2, 4, 5, 8)
    normed = rope_layer.q_norm(q)
    assert torch.allclose(normed, q / q.pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt(), atol=1e-6)
    x = torch.randint(0, 40, (1, 20))  # cached decoding equals the full forward with both switched on
    got = [lp for _, lp in generate_logprobs(model.eval(), x[0, :6].tolist(), 10, temperature=0)]
    ids = x[0, :6].tolist()
    for lp in got:
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0, -1]
        nxt = int(logits.argmax())
        assert lp == pytest.approx(float(torch.log_softmax(logits, -1)[nxt]), abs=1e-5)
        ids.append(nxt)


# --- attention sinks and output gates (issue 45) -----------------------------------------------------


def test_sinks_of_minus_infinity_are_plain_attention_and_a_sink_takes_mass():
    """A sink logit of -inf takes no probability: the model equals the same weights without sinks. A finite
    sink s_h scales head h's softmax by Z / (Z + e^s_h) (Z: the sum over the keys), checked by hand."""
    plain, sunk = model(n_kv_heads=2), model(n_kv_heads=2, attn_sinks=True)
    state = {k: v for k, v in sunk.state_dict().items() if not k.endswith("sinks")}
    plain.load_state_dict(state)
    idx = tokens(T=9)
    with torch.no_grad():
        for b in sunk.blocks:
            b.attn.sinks.fill_(float("-inf"))
        assert torch.allclose(sunk(idx), plain(idx), atol=1e-5)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    sinks = torch.tensor([0.5, -1.0])
    allowed = causal_mask(torch.arange(3), torch.arange(3), None)
    y = attention_mod.attention(q, k, v, allowed, sinks=sinks)
    scores = (q @ k.transpose(-1, -2)) / 2.0  # head_dim 4
    scores = scores.masked_fill(~allowed, float("-inf"))
    z = scores.exp().sum(-1, keepdim=True)
    by_hand = (scores.exp() / (z + sinks.exp().view(1, 2, 1, 1))) @ v
    assert torch.allclose(y, by_hand, atol=1e-6)
    assert not torch.allclose(y, attention_mod.attention(q, k, v, allowed), atol=1e-3)


def test_sinks_equal_hugging_face_gpt_oss_attention():
    """lmlab's softmax with sinks against transformers' ``GptOssAttention`` eager path (its own
    ``eager_attention_forward``: the sink concatenated as a last column, the max subtracted, dropped),
    GQA 4:2 with a causal mask."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 4, 6, 8, generator=g),
        torch.randn(2, 2, 6, 8, generator=g),
        torch.randn(2, 2, 6, 8, generator=g),
    )
    module = torch.nn.Module()
    module.sinks = torch.nn.Parameter(torch.randn(4, generator=g))
    module.num_key_value_groups, module.training = 2, False
    allowed = causal_mask(torch.arange(6), torch.arange(6), 4)  # a window of 4, as gpt-oss's local layers
    additive = torch.zeros(1, 1, 6, 6).masked_fill(~allowed, float("-inf"))
    theirs, _ = gpt_oss.eager_attention_forward(module, q, k, v, additive, scaling=8**-0.5, dropout=0.0)
    ours = attention_mod.attention(q, k, v, allowed, sinks=module.sinks.detach())
    assert torch.allclose(ours.transpose(1, 2), theirs, atol=1e-6)


def test_elementwise_output_gate_equals_hugging_face_qwen3_next_attention():
    """An attention layer with attn_output_gate='elementwise', (1 + w) per-head QK RMSNorm and partial RoPE
    (a quarter of each head) against transformers' ``Qwen3NextAttention`` with the same weights: its
    q_proj interleaves each head's query and gate rows (H x [q; gate] x D), split here into lmlab's qkv
    and gate projections."""
    qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    H, K, D, d, T = 4, 2, 16, 32, 7
    hf_cfg = Qwen3NextConfig(
        hidden_size=d,
        num_attention_heads=H,
        num_key_value_heads=K,
        head_dim=D,
        attention_bias=True,
        partial_rotary_factor=0.25,
        max_position_embeddings=32,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    )
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = qn.Qwen3NextAttention(hf_cfg, 0).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.2)
    cfg = tiny(
        d_model=d,
        n_heads=H,
        n_kv_heads=K,
        head_dim=D,
        bias="attention",
        qk_norm="gemma_rmsnorm",
        norm_eps=hf_cfg.rms_norm_eps,
        rope_fraction=0.25,
        attn_output_gate="elementwise",
    )
    ours = Attention(cfg, 0).eval()
    qg_w = ref.q_proj.weight.view(H, 2, D, d)
    qg_b = ref.q_proj.bias.view(H, 2, D)
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([qg_w[:, 0].reshape(H * D, d), ref.k_proj.weight, ref.v_proj.weight]))
        ours.qkv.bias.copy_(torch.cat([qg_b[:, 0].reshape(-1), ref.k_proj.bias, ref.v_proj.bias]))
        ours.gate.weight.copy_(qg_w[:, 1].reshape(H * D, d))
        ours.gate.bias.copy_(qg_b[:, 1].reshape(-1))
        ours.out.weight.copy_(ref.o_proj.weight)
        ours.out.bias.copy_(ref.o_proj.bias)
        ours.q_norm.weight.copy_(ref.q_norm.weight)
        ours.k_norm.weight.copy_(ref.k_norm.weight)
    x = torch.randn(2, T, d, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T)
    rope = qn.Qwen3NextRotaryEmbedding(hf_cfg)
    cos, sin = rope(x, pos[None].expand(2, T))
    mask = torch.zeros(1, 1, T, T).masked_fill(~causal_mask(pos, pos, None), float("-inf"))
    with torch.no_grad():
        theirs, _ = ref(x, (cos, sin), mask)
        mine = ours(x, pos)
    assert theirs.abs().max() > 0.1
    assert torch.allclose(mine, theirs, atol=1e-5), float((mine - theirs).abs().max())
    with torch.no_grad():  # without the gate (its projection's rows left out) the outputs part
        gate = ours.gate
        ours.gate = None
        assert not torch.allclose(ours(x, pos), theirs, atol=1e-2)
        ours.gate = gate


def test_headwise_output_gate_by_hand():
    """headwise: one sigmoid(w_h . x + b_h) per head multiplies that head's whole output; with W_g = 0 and
    b = 0 every gate is 1/2."""
    m = model(attn_output_gate="headwise", bias="attention", n_kv_heads=2)
    attn = m.blocks[0].attn
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    pos = torch.arange(5)
    captured = {}
    attn.out.register_forward_hook(lambda mod, inp, out: captured.update(y=inp[0]))
    with torch.no_grad():
        attn(x, pos)
        gated = captured["y"].view(2, 5, 4, 8)
        gate, attn.gate = attn.gate, None
        attn(x, pos)
        ungated = captured["y"].view(2, 5, 4, 8)
        attn.gate = gate
        g = torch.sigmoid(x @ gate.weight.T + gate.bias)  # (2, 5, 4): one per head
        assert torch.allclose(gated, ungated * g[..., None], atol=1e-6)
        gate.weight.zero_()
        gate.bias.zero_()
        attn(x, pos)
        assert torch.allclose(captured["y"].view(2, 5, 4, 8), ungated / 2, atol=1e-6)


def test_gates_and_sinks_refused_where_they_do_not_apply():
    with pytest.raises(ConfigError, match="attn_output_gate='sometimes'"):
        tiny(attn_output_gate="sometimes")
    with pytest.raises(ConfigError, match="multi-head latent attention"):
        tiny(attention="mla", attn_sinks=True, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8)
    with pytest.raises(ConfigError, match="attn_sinks"):
        tiny(attn_sinks="yes")
    from lmlab.interop.hf import lmlab_to_hf_config
    from lmlab.interop.registry import UnsupportedError

    for kw in (dict(attn_sinks=True), dict(attn_output_gate="headwise")):  # no converted family has them yet
        with pytest.raises(UnsupportedError, match=f"llama: {next(iter(kw))}="):
            lmlab_to_hf_config(tiny(**kw))


def test_sinks_count_as_biases_for_weight_decay():
    from lmlab.optim import param_kind

    assert param_kind("blocks.0.attn.sinks") == "bias" and param_kind("blocks.0.attn.gate.weight") == "weight"


def test_first_key_share_by_hand():
    """stats['first_key']: with zero queries every allowed key gets the same probability, so under a causal
    mask queries 1, 2, 3 give key 0 1/2, 1/3, 1/4 (mean 13/36); a window of 2 leaves query 3 none."""
    from lmlab.model.attention import attention, causal_mask

    q, k, v = torch.zeros(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    pos = torch.arange(4)
    stats: dict = {}
    attention(q, k, v, causal_mask(pos, pos, None), stats=stats)
    assert stats["first_key"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    attention(q, k, v, causal_mask(pos, pos, 2), stats=stats)
    assert stats["first_key"] == pytest.approx((1 / 2 + 0 + 0) / 3)
