"""Issue 12, item 6: correctness defects found outside the test suites, each checked against an
independent reference (Hugging Face transformers' implementation, or the model built the ordinary way).

- RMSNorm in bf16 rounds as the family's reference does: Llama / Qwen / Meta cast the normalised value
  to the input dtype before the weight, OLMo 2 and Gemma's (1 + w) multiply in fp32 and cast after.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lmlab.config import ModelConfig  # noqa: E402
from lmlab.interop import hf as hfio  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402
from lmlab.model.norms import RMSNorm  # noqa: E402

V = 128
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)


def _bf16_input(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# 1. RMSNorm rounding order in bf16
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hf_class, kwargs", [
    ("transformers.models.llama.modeling_llama.LlamaRMSNorm", dict()),
    ("transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm", dict()),
    ("transformers.models.olmo2.modeling_olmo2.Olmo2RMSNorm", dict(weight_fp32=True)),
    ("transformers.models.gemma.modeling_gemma.GemmaRMSNorm", dict(offset=1.0)),
    ("transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm", dict(offset=1.0)),
])
def test_rmsnorm_bf16_bitwise_equals_hf(hf_class, kwargs):
    """An lmlab RMSNorm cast to bf16 equals the family's HF norm bitwise on random input, and the other
    rounding order would not (so the comparison can tell the two apart)."""
    import importlib

    module, name = hf_class.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    d, eps = 256, 1e-6
    ours = RMSNorm(d, eps, **kwargs)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(d, generator=torch.Generator().manual_seed(1)) * 0.5 + (0.0 if kwargs.get("offset") else 1.0))
    ref = cls(d, eps=eps)
    ref.load_state_dict(ours.state_dict())
    ours, ref = ours.to(torch.bfloat16), ref.to(torch.bfloat16)
    x = _bf16_input((8, 64, d))
    with torch.no_grad():
        y, y_ref = ours(x), ref(x)
        assert y.dtype == y_ref.dtype == torch.bfloat16
        assert torch.equal(y, y_ref)
        if not kwargs.get("offset"):  # the other order differs in many places (one bf16 ulp)
            other = RMSNorm(d, eps, weight_fp32=not kwargs.get("weight_fp32", False)).to(torch.bfloat16)
            other.load_state_dict(ours.state_dict())
            assert (other(x) != y_ref).sum() > 1000


def test_rmsnorm_fp32_orders_agree():
    """In fp32 the two orders are the same computation (bitwise), so fp32 parity is unchanged."""
    x = torch.randn(4, 16, 64)
    a, b = RMSNorm(64), RMSNorm(64, weight_fp32=True)
    with torch.no_grad():
        a.weight.normal_()
        b.weight.copy_(a.weight)
        assert torch.equal(a(x), b(x))


# lmlab module -> HF module of the same norm, per family (the families whose HF norm classes differ)
NORM_PAIRS = {
    "llama": ("LlamaConfig", {}, [("blocks.0.attn_norm", "model.layers.0.input_layernorm"),
                                  ("final_norm", "model.norm")]),
    "qwen3": ("Qwen3Config", dict(head_dim=32), [("blocks.1.mlp_norm", "model.layers.1.post_attention_layernorm"),
                                                 ("blocks.0.attn.q_norm", "model.layers.0.self_attn.q_norm")]),
    "olmo2": ("Olmo2Config", {}, [("blocks.0.attn_norm", "model.layers.0.post_attention_layernorm"),
                                  ("blocks.0.attn.k_norm", "model.layers.0.self_attn.k_norm"),
                                  ("final_norm", "model.norm")]),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=16), [
        ("blocks.0.attn_out_norm", "model.layers.0.post_attention_layernorm"),
        ("blocks.0.attn.q_norm", "model.layers.0.self_attn.q_norm"), ("final_norm", "model.norm")]),
}


@pytest.mark.parametrize("family", list(NORM_PAIRS))
def test_imported_model_in_bf16_norms_equal_hf(tmp_path, family):
    """A random HF model of the family (norm weights randomised), imported and cast to bf16 with its HF
    original: each of its RMSNorms (block, final, QK) gives bitwise the HF module's output."""
    cls, extra, pairs = NORM_PAIRS[family]
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**BASE, **extra))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.5)
    ref.save_pretrained(tmp_path / "hf")
    model, cfg, _, _ = hfio.hf_to_lmlab(tmp_path / "hf")
    assert cfg.norm_weight_fp32 is (family == "olmo2")
    model, ref = model.to(torch.bfloat16), ref.to(torch.bfloat16)
    ours, theirs = dict(model.named_modules()), dict(ref.named_modules())
    for a, b in pairs:
        width = theirs[b].weight.shape[-1]
        x = _bf16_input((2, 8, width), seed=len(a))
        with torch.no_grad():
            assert torch.equal(ours[a](x), theirs[b](x)), (family, a)
