"""Position switches: RoPE (half / interleaved, partial, scaling), NoPE, learned, sinusoidal, ALiBi, T5.

Each test checks a property that a wrong implementation would break, against an independent reference:
a hand computation, the paper's numbers, or Hugging Face transformers' own implementation.
"""

from __future__ import annotations

import math

import pytest
import torch

import lmlab.model.attention as attention_mod
from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM
from lmlab.model.attention import Attention
from lmlab.model.positions import RotaryEmbedding, alibi_slopes, rope_inv_freq, sinusoidal_table
from lmlab.model.t5_bias import T5RelativeBias, t5_bucket


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=2, ffn_ratio=2.0)
    base.update(kw)
    return ModelConfig(**base)


def model(seed: int = 0, **kw) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(tiny(**kw)).eval()


# --- RoPE -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_dot_product_depends_only_on_offset(style, fraction):
    rope = RotaryEmbedding(16, fraction, 10000.0, style, 64)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def dot(i, j):
        return float((rope(q, torch.tensor([i])) * rope(k, torch.tensor([j]))).sum())

    same = [dot(3, 1), dot(10, 8), dot(45, 43), dot(2, 0)]
    assert max(same) - min(same) < 1e-4
    assert abs(dot(3, 1) - dot(3, 0)) > 1e-3  # and it does depend on the offset


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_rotates_each_pair_by_position_times_frequency(style):
    # hand computation: pair 0 turns by p * theta^0 = p radians, pair 1 by p * theta^(-2/8) radians
    rope = RotaryEmbedding(8, 1.0, 10000.0, style, 16)
    first, second = ((0, 1), (2, 3)) if style == "interleaved" else ((0, 4), (1, 5))
    x = torch.zeros(1, 1, 1, 8)
    x[..., first[0]] = 1.0
    x[..., second[0]] = 1.0
    p = 3
    y = rope(x, torch.tensor([p]))[0, 0, 0]
    w1 = 10000.0 ** (-2 / 8)
    assert torch.allclose(y[list(first)], torch.tensor([math.cos(p), math.sin(p)]), atol=1e-6)
    assert torch.allclose(y[list(second)], torch.tensor([math.cos(p * w1), math.sin(p * w1)]), atol=1e-6)
    assert y.norm().item() == pytest.approx(math.sqrt(2), abs=1e-6)


def _interleaved_to_half(rot: int, head_dim: int) -> torch.Tensor:
    """Index map: half-split channel c reads interleaved channel perm[c] (pairs (2i, 2i+1) -> (i, i + rot/2))."""
    perm = list(range(head_dim))
    for i in range(rot // 2):
        perm[i], perm[i + rot // 2] = 2 * i, 2 * i + 1
    return torch.tensor(perm)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_interleaved_equals_half_after_permuting_qk_rows(fraction):
    kw = dict(n_heads=4, n_kv_heads=2, rope_fraction=fraction)
    inter = model(rope_style="interleaved", **kw)
    half = model(rope_style="half", **kw)
    half.load_state_dict(inter.state_dict())
    cfg = half.cfg
    D, H, K = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    perm = _interleaved_to_half(int(round(D * fraction)), D)
    rows = torch.cat([h * D + perm for h in range(H + K)] + [torch.arange((H + K) * D, (H + 2 * K) * D)])
    with torch.no_grad():
        w = half.blocks[0].attn.qkv.weight
        w.copy_(w[rows])
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = inter(idx), half(idx)
    assert torch.allclose(a, b, atol=1e-5)
    # without the permutation the two pairings differ
    with torch.no_grad():
        half.blocks[0].attn.qkv.weight.copy_(inter.blocks[0].attn.qkv.weight)
        assert not torch.allclose(inter(idx), half(idx), atol=1e-4)


def test_partial_rope_leaves_unrotated_dims_position_independent():
    rope = RotaryEmbedding(16, 0.25, 10000.0, "half", 32)
    assert rope.rot_dim == 4
    x = torch.randn(1, 2, 5, 16)
    y0 = rope(x, torch.arange(5))
    y1 = rope(x, torch.arange(20, 25))
    assert torch.equal(y0[..., 4:], x[..., 4:]) and torch.equal(y1[..., 4:], x[..., 4:])
    assert not torch.allclose(y0[..., :4], y1[..., :4], atol=1e-3)


def test_half_style_matches_hugging_face_llama():
    hf = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    conf = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16)
    pos = torch.arange(3, 10)
    cos, sin = hf.LlamaRotaryEmbedding(conf)(q, pos[None].expand(2, -1))
    q_hf, k_hf = hf.apply_rotary_pos_emb(q, k, cos, sin)
    ours = RotaryEmbedding(16, 1.0, 500.0, "half", 64)
    assert torch.allclose(ours(q, pos), q_hf, atol=1e-5) and torch.allclose(ours(k, pos), k_hf, atol=1e-5)


def test_nope_attention_is_permutation_equivariant_without_causal_mask(monkeypatch):
    """NoPE has no position signal besides the mask: with the mask all-True, permuting the tokens permutes
    the outputs. RoPE (control) breaks this."""
    monkeypatch.setattr(
        attention_mod, "causal_mask", lambda q, k, w, chunk=False: torch.ones(len(q), len(k), dtype=torch.bool)
    )
    x = torch.randn(1, 9, 32)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(3))
    for position, equivariant in (("nope", True), ("rope", False)):
        torch.manual_seed(0)
        attn = Attention(tiny(position=position), 0).eval()
        attn.record_max_logit = True  # forces the explicit path, which applies our (patched) mask
        with torch.no_grad():
            y = attn(x, torch.arange(9))
            y_perm = attn(x[:, perm], torch.arange(9))
        assert torch.allclose(y_perm, y[:, perm], atol=1e-5) == equivariant


def test_hybrid_positions_nope_global_layers_and_local_theta():
    cfg = tiny(
        n_layers=4,
        layer_pattern="LLLG",
        sliding_window=4,
        nope_global_layers=True,
        rope_theta=1e6,
        rope_local_theta=1e4,
        rope_scaling={"type": "linear", "factor": 8.0},
    )
    m = TransformerLM(cfg)
    ropes = [b.attn.rope for b in m.blocks]
    assert ropes[3] is None and all(r is not None for r in ropes[:3])  # NoPE on the global layer only
    for r in ropes[:3]:  # local layers: their own theta, no scaling (Gemma 3)
        assert torch.allclose(r.inv_freq, rope_inv_freq(16, 1e4))
    cfg2 = tiny(
        n_layers=2,
        layer_pattern="LG",
        sliding_window=4,
        rope_theta=1e6,
        rope_local_theta=1e4,
        rope_scaling={"type": "linear", "factor": 8.0},
    )
    r_local, r_global = (b.attn.rope for b in TransformerLM(cfg2).blocks)
    assert torch.allclose(r_local.inv_freq, rope_inv_freq(16, 1e4))
    assert torch.allclose(r_global.inv_freq, rope_inv_freq(16, 1e6) / 8)


def test_rope_tables_rebuilt_in_fp32_after_cast_and_beyond_length():
    rope = RotaryEmbedding(8, 1.0, 10000.0, "half", 4)
    ref = RotaryEmbedding(8, 1.0, 10000.0, "half", 64)
    rope.to(torch.bfloat16)
    x = torch.randn(1, 1, 3, 8)
    pos = torch.tensor([2, 9, 40])  # beyond the initial table of 4 positions
    rope.ensure(41)  # the model calls this with a Python int before each forward
    assert torch.allclose(rope(x, pos), ref(x, pos), atol=1e-6)
    assert rope.cos.dtype == torch.float32


# --- absolute positions -------------------------------------------------------------------------


def test_sinusoidal_table_by_hand():
    t = sinusoidal_table(6, 8)
    p = 5
    expected = [math.sin(p), math.cos(p), math.sin(p / 10000 ** (2 / 8)), math.cos(p / 10000 ** (2 / 8))]
    assert torch.allclose(t[p, :4], torch.tensor(expected), atol=1e-6)


def test_learned_positions_beyond_context_raise_and_sinusoidal_extends():
    idx = torch.randint(0, 64, (1, 33))  # context_length 32
    with pytest.raises(ValueError, match="context_length"):
        model(position="learned")(idx)
    assert model(position="sinusoidal")(idx).shape == (1, 33, 64)


# --- ALiBi ------------------------------------------------------------------------------------------


def test_alibi_slopes_match_the_paper():
    # Press et al. 2022, section 3: 8 heads -> 1/2, 1/4, ..., 1/256
    eight = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
    assert torch.allclose(alibi_slopes(8), torch.tensor(eight))
    # 16 heads -> 1/sqrt(2), 1/2, 1/(2 sqrt 2), ..., 1/256
    assert torch.allclose(alibi_slopes(16), torch.tensor([2 ** (-0.5 * (i + 1)) for i in range(16)]))
    # 12 heads (not a power of two; the paper's code): the 8-head slopes, then every other 16-head slope
    twelve = eight + [0.70710678, 0.35355339, 0.17677670, 0.08838835]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve))


def test_alibi_bias_is_minus_slope_times_distance():
    m = model(position="alibi", n_heads=4)
    bias = m._bias_fn()(torch.arange(5), torch.arange(5), 0)
    slopes = torch.tensor([0.25, 0.0625, 0.015625, 0.00390625])  # 4 heads: 2^-2, 2^-4, 2^-6, 2^-8
    assert torch.allclose(bias[:, 4, 1], -3 * slopes) and torch.allclose(bias[:, 2, 2], torch.zeros(4))


# --- T5 relative bias -------------------------------------------------------------------------------


def test_t5_buckets_by_hand():
    # unidirectional, 32 buckets, max_distance 128: max_exact 16; n >= 16 -> 16 + floor(ln(n/16)/ln(8) * 16)
    offsets = torch.tensor([0, -1, -15, -16, -20, -32, -64, -112, -113, -128, -1000, 3])
    expected = torch.tensor([0, 1, 15, 16, 17, 21, 26, 30, 31, 31, 31, 0])
    assert torch.equal(t5_bucket(offsets, 32, 128), expected)
    # bidirectional: 16 per direction, keys after the query in 16..31; max_exact 8
    offsets = torch.tensor([0, -3, 3, -8, -16, 16, 200])
    expected = torch.tensor([0, 3, 19, 8, 10, 26, 31])
    assert torch.equal(t5_bucket(offsets, 32, 128, bidirectional=True), expected)


def test_t5_buckets_match_hugging_face():
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = torch.arange(-300, 300)
    for bidirectional in (False, True):
        for nb, md in ((32, 128), (8, 20)):
            ref = t5.T5Attention._relative_position_bucket(
                rel, bidirectional=bidirectional, num_buckets=nb, max_distance=md
            )
            assert torch.equal(t5_bucket(rel, nb, md, bidirectional), ref)


def test_t5_bias_shape_lookup_and_sharing():
    m = model(position="t5", n_layers=2, t5_num_buckets=8, t5_max_distance=16)
    assert sum(isinstance(mod, T5RelativeBias) for mod in m.modules()) == 1  # one table for all layers
    rb = m.rel_bias
    bias = rb(torch.arange(6), torch.arange(6))
    assert bias.shape == (2, 6, 6) and bias.dtype == torch.float32
    w = rb.embedding.weight  # (buckets, heads)
    assert torch.equal(bias[:, 5, 2], w[3]) and torch.equal(bias[:, 1, 4], w[0])
    with pytest.raises(ConfigError, match="t5_max_distance"):
        TransformerLM(tiny(position="t5", t5_num_buckets=32, t5_max_distance=16))


# --- RoPE scaling vs Hugging Face -------------------------------------------------------------------

SCALINGS = [
    {"type": "linear", "factor": 4.0},
    {"type": "ntk", "factor": 4.0},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    {
        "type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 2048,
        "beta_fast": 16,
        "beta_slow": 2,
        "attention_factor": 1.3,
    },
    {
        "type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "truncate": False,
    },
    {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
]


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["type"])
def test_rope_scaling_matches_hugging_face(scaling, fraction):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theta, head_dim, max_pos = 10000.0, 32, 1024
    params = {k: v for k, v in scaling.items() if k != "type"}
    hf_type = "dynamic" if scaling["type"] == "ntk" else scaling["type"]
    params.update(rope_type=hf_type, rope_theta=theta, partial_rotary_factor=fraction)
    conf = LlamaConfig(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    kwargs = {}
    if hf_type == "dynamic":  # HF's dynamic NTK has effective factor f*L/L0 - (f-1); = f at L = L0 (2f-1)/f
        f = scaling["factor"]
        kwargs["seq_len"] = max_pos * (2 * f - 1) / f
    ref_inv_freq, ref_factor = ROPE_INIT_FUNCTIONS[hf_type](conf, **kwargs)

    cfg = tiny(
        d_model=64, n_heads=2, context_length=64, rope_theta=theta, rope_fraction=fraction, rope_scaling=dict(scaling)
    )
    rope = TransformerLM(cfg).blocks[0].attn.rope
    assert torch.allclose(rope.inv_freq, ref_inv_freq, rtol=1e-5, atol=0)
    assert rope.attention_factor == pytest.approx(ref_factor, rel=1e-9)
    base = rope_inv_freq(rope.rot_dim, theta)
    assert not torch.allclose(rope.inv_freq, base)  # the scaling did something
    if scaling["type"] == "llama3":  # the example covers all three regimes: kept, blended, divided
        ratio = base / rope.inv_freq
        assert (ratio == 1).any() and (ratio == 8).any() and ((ratio > 1.01) & (ratio < 7.99)).any()


def test_yarn_attention_factor_applied_like_hugging_face():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    conf = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        max_position_embeddings=64,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    pos = torch.arange(40)
    cos, sin = LlamaRotaryEmbedding(conf)(torch.zeros(1, 40, 16), pos[None])
    ours = RotaryEmbedding(16, 1.0, 10000.0, "half", 64, scaling)
    assert ours.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    assert torch.allclose(ours.cos[:40], cos[0], atol=1e-5) and torch.allclose(ours.sin[:40], sin[0], atol=1e-5)


def test_ntk_base_change_by_hand():
    # theta' = theta * factor^(d/(d-2)): the slowest pair is interpolated by exactly `factor`, the fastest kept
    rope = RotaryEmbedding(16, 1.0, 10000.0, "half", 8, {"type": "ntk", "factor": 4.0})
    base = rope_inv_freq(16, 10000.0)
    assert rope.inv_freq[0] == pytest.approx(1.0)
    assert float(base[-1] / rope.inv_freq[-1]) == pytest.approx(4.0, rel=1e-5)
    assert torch.allclose(rope.inv_freq, rope_inv_freq(16, 10000.0 * 4.0 ** (16 / 14)))


@pytest.mark.parametrize(
    "scaling, field",
    [
        ({"type": "yarn", "factor": 4.0}, "rope_scaling.original_max_position_embeddings"),
        (
            {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 256},
            "rope_scaling.high_freq_factor",
        ),
        (
            {
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 256,
            },
            "rope_scaling.high_freq_factor",
        ),
        ({"type": "linear", "factor": 0.5}, "rope_scaling.factor"),
        ({"type": "linear"}, "rope_scaling.factor"),
        ({"type": "linear", "factor": 2.0, "beta_fast": 32}, "rope_scaling.beta_fast"),
        ({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0}, "rope_scaling.original_max"),
        (
            {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "beta_fast": 1, "beta_slow": 2},
            "rope_scaling.beta_fast",
        ),
        ({"type": "dynamic", "factor": 2.0}, "rope_scaling.type"),
        ({"factor": 2.0}, "rope_scaling"),
    ],
)
def test_rope_scaling_validation_names_the_key(scaling, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        tiny(rope_scaling=scaling)


def test_rope_scaling_needs_rope():
    with pytest.raises(ConfigError, match="rope_scaling"):
        tiny(position="alibi", rope_scaling={"type": "linear", "factor": 2.0})


def test_odd_rotated_width_raises():
    with pytest.raises(ConfigError, match="rope_fraction"):
        tiny(rope_fraction=0.3)  # head_dim 16 * 0.3 -> 5 rotated channels
