"""The switches added for exact Hugging Face parity (tests/test_hf_parity.py proves them against
transformers): their validation, their formulas, and KV-cache decoding equal to the full forward."""

import pytest
import torch
import torch.nn.functional as F

from lmlab.config import ConfigError, ModelConfig
from lmlab.model import KVCache, TransformerLM

TINY = dict(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(qk_norm_scope="all"), ["qk_norm_scope='all'", "qk_norm"]),
        (dict(qk_norm_scope="rows", qk_norm="rmsnorm"), ["qk_norm_scope='rows'", "'head_untied'"]),
        (dict(norm_affine=False, norm_type="layernorm", norm_bias=True), ["norm_affine=False", "norm_bias"]),
        (dict(norm_affine=False, norm_type="gemma_rmsnorm"), ["norm_affine=False"]),
        (dict(norm_affine="no"), ["norm_affine='no'"]),
        (dict(logit_scale=0), ["logit_scale=0"]),
        (dict(clip_qkv=-1.0), ["clip_qkv=-1.0"]),
    ],
)
def test_validation(kw, words):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**TINY, **kw)
    for w in words:
        assert w in str(err.value)


def test_formulas():
    x = torch.randn(2, 5, 32)
    torch.manual_seed(0)
    # non-parametric LayerNorm (OLMo): no parameters at all, plain normalisation
    m = TransformerLM(ModelConfig(**TINY, norm_type="layernorm", norm_affine=False))
    assert not [n for n, _ in m.named_parameters() if "norm" in n]
    assert torch.allclose(m.blocks[0].attn_norm(x), F.layer_norm(x, (32,), eps=1e-5), atol=1e-6)
    # QK-norm over the whole projection (OLMo 2): one weight of n_heads * head_dim
    m = TransformerLM(ModelConfig(**TINY, qk_norm="rmsnorm", qk_norm_scope="all"))
    assert m.blocks[0].attn.q_norm.weight.shape == (32,) and m.blocks[0].attn.k_norm.weight.shape == (16,)
    # per-head weights (Cohere): (heads, head_dim), each head normalised alone
    m = TransformerLM(ModelConfig(**TINY, qk_norm="layernorm", qk_norm_scope="head_untied"))
    qn = m.blocks[0].attn.q_norm
    assert qn.weight.shape == (4, 8)
    with torch.no_grad():
        qn.weight.normal_()
    q = torch.randn(2, 4, 5, 8)
    ref = F.layer_norm(q, (8,), eps=1e-5) * qn.weight[None, :, None, :]
    assert torch.allclose(qn(q), ref, atol=1e-6)
    # logit_scale multiplies the logits before the final soft-cap
    base = TransformerLM(ModelConfig(**TINY))
    scaled = TransformerLM(ModelConfig(**TINY, logit_scale=0.25, final_logit_softcap=3.0))
    scaled.load_state_dict(base.state_dict())
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        assert torch.allclose(scaled(ids), 3.0 * torch.tanh(base(ids) * 0.25 / 3.0), atol=1e-6)


@pytest.mark.parametrize(
    "kw",
    [
        dict(norm_type="layernorm", norm_affine=False, clip_qkv=0.5),
        dict(qk_norm="rmsnorm", qk_norm_scope="all", norm_position="reordered"),
        dict(
            qk_norm="layernorm",
            qk_norm_scope="head_untied",
            parallel_block=True,
            rope_style="interleaved",
            logit_scale=0.5,
        ),
        dict(
            qk_norm="gemma_rmsnorm",
            norm_type="gemma_rmsnorm",
            norm_position="sandwich",
            sliding_window=4,
            layer_pattern="LG",
            rope_local_theta=100.0,
        ),
    ],
)
def test_kv_cache_decoding_equals_full_forward(kw):
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(**TINY, **kw)).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(model.cfg, 2, 32)
        steps = [model(ids[:, :5], cache)] + [model(ids[:, i : i + 1], cache) for i in range(5, 12)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
