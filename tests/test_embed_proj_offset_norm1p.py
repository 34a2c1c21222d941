"""The switches added for OPT and Nemotron parity: ``embed_dim`` (embeddings projected in and out),
``learned_pos_offset`` and ``norm_type='layernorm1p'`` (no transformers needed)."""

import pytest
import torch
import torch.nn.functional as F

from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM
from lmlab.model.norms import make_norm

TINY = dict(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(embed_dim=0), "embed_dim=0 must be an integer >= 1"),
        (dict(learned_pos_offset=-1), "learned_pos_offset=-1 must be an integer >= 0"),
        (dict(learned_pos_offset=2), "learned_pos_offset=2 needs position='learned'"),
        (dict(norm_type="layernorm1p", norm_affine=False), "needs norm_affine=True"),
        (dict(norm_type="rmsnorm", norm_bias=True), "norm_bias=True needs norm_type='layernorm'"),
    ],
)
def test_invalid_values_raise(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**TINY, **overrides)


def test_embed_dim_equal_to_d_model_is_no_projection():
    assert ModelConfig(**TINY, embed_dim=32).embed_dim is None
    model = TransformerLM(ModelConfig(**TINY, embed_dim=32))
    assert model.proj_in is None and model.proj_out is None


def test_embed_dim_projects_in_and_out():
    cfg = ModelConfig(**TINY, embed_dim=16, position="learned", tie_embeddings=True)
    model = TransformerLM(cfg).eval()
    assert model.embed.weight.shape == (64, 16) and model.lm_head.weight is model.embed.weight
    assert model.proj_in.weight.shape == (32, 16) and model.proj_out.weight.shape == (16, 32)
    idx = torch.randint(0, 64, (2, 10))
    h = model.hidden(idx)
    assert h.shape == (2, 10, 32)
    torch.testing.assert_close(model.logits(h), model.lm_head(model.proj_out(h)))
    assert model(idx).shape == (2, 10, 64)


def test_learned_pos_offset_reads_row_p_plus_offset():
    cfg = ModelConfig(**TINY, position="learned", learned_pos_offset=2)
    model = TransformerLM(cfg)
    assert model.abs_pos.weight.shape == (32 + 2, 32)
    positions = torch.arange(5)
    torch.testing.assert_close(model.abs_pos(positions), model.abs_pos.weight[2:7])


def test_layernorm1p_is_layernorm_of_one_plus_weight():
    norm = make_norm("layernorm1p", 8, 1e-5, bias=True)
    assert torch.equal(norm.weight, torch.zeros(8))  # (1 + 0): plain LayerNorm at init
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 8)
    torch.testing.assert_close(norm(x), F.layer_norm(x, (8,), norm.weight + 1, norm.bias, 1e-5))
    cfg = ModelConfig(**TINY, norm_type="layernorm1p", norm_bias=True)
    assert TransformerLM(cfg)(torch.randint(0, 64, (1, 4))).shape == (1, 4, 64)
