"""Multi-head latent attention (lmlab/model/mla.py): cached decoding equals the full forward, the
cache holds exactly the latent and the RoPE key per token (the bytes lmlab analyze reports), padded
batches, parameter counts, and what MLA refuses."""

import pytest
import torch

from lmlab.analysis import analyze, kv_cache_bytes
from lmlab.config import ConfigError, ModelConfig
from lmlab.generate import generate_logprobs
from lmlab.model import KVCache, TransformerLM

MLA = dict(
    vocab_size=64,
    context_length=48,
    d_model=64,
    n_layers=2,
    n_heads=4,
    attention="mla",
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
)


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_cached_decoding_equals_the_forward(q_lora_rank):
    cfg = ModelConfig(**MLA, q_lora_rank=q_lora_rank)
    torch.manual_seed(0)
    model = TransformerLM(cfg).eval()
    prompt = [5, 9, 2, 7, 1, 3]
    steps = list(generate_logprobs(model, prompt, 16, temperature=0.0))
    seq = prompt + [t for t, _ in steps]
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([seq]))[0], -1)
    for i, (t, lp) in enumerate(steps):
        assert t == int(full[len(prompt) - 1 + i].argmax())
        assert lp == pytest.approx(float(full[len(prompt) - 1 + i, t]), abs=1e-5)
    # a left-padded batch gives each row what it gives alone
    short = torch.tensor([[4, 8, 15]])
    padded = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 4, 8, 15]])
    with torch.no_grad():
        both = model(padded, left_pad=torch.tensor([0, 2]))
        assert torch.allclose(both[1, 2:], model(short)[0], atol=1e-5)
        assert torch.allclose(both[0], model(padded[:1])[0], atol=1e-5)


def test_the_cache_holds_the_latent_and_the_rope_key_only():
    cfg = ModelConfig(**MLA)
    cache = KVCache(cfg, batch=2, max_len=40)
    assert [tuple(t.shape) for t in cache.k] == [(2, 1, 40, 16)] * 2  # kv_lora_rank per token
    assert [tuple(t.shape) for t in cache.v] == [(2, 1, 40, 8)] * 2  # qk_rope_head_dim per token
    per_token = (16 + 8) * 4 * cfg.n_layers  # fp32 bytes, all layers
    assert cache.nbytes == 2 * 40 * per_token == kv_cache_bytes(cfg, 40, 2, "fp32")["total"]
    mha = kv_cache_bytes(cfg, 40, 2, "fp32")["mha_total"]
    assert mha == 2 * 40 * 2 * 4 * 12 * 4 * cfg.n_layers  # K and V of 4 heads of width v_head_dim 12


def test_parameter_counts_and_refusals():
    for q_lora_rank in (None, 24):
        assert analyze(ModelConfig(**MLA, q_lora_rank=q_lora_rank))["instantiated"]["equal"]
    with pytest.raises(ConfigError, match="attention='mla' needs sliding_window=None"):
        ModelConfig(**MLA, sliding_window=8)
    with pytest.raises(ConfigError, match="attention='mla' needs position='rope'"):
        ModelConfig(**MLA, position="learned")
    with pytest.raises(ConfigError, match="qk_rope_head_dim=7 must be even"):
        ModelConfig(**{**MLA, "qk_rope_head_dim": 7})
    from lmlab.interop.hf import lmlab_to_hf_config
    from lmlab.interop.registry import UnsupportedError

    with pytest.raises(UnsupportedError, match=r"attention=\('mla', 16"):
        lmlab_to_hf_config(ModelConfig(**MLA, tie_embeddings=False))
