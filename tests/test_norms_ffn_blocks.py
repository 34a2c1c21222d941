"""Norms, FFNs, block layouts, biases, output and regularisation switches (lecture 3).

Each test checks a property against an independent reference: the paper's formula computed by hand
(in float64 where it helps), a ``torch`` reference, or a Hugging Face ``transformers`` model with the
same weights. Sizes are tiny so the file runs in a few seconds on a CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.config import ConfigError, ModelConfig
from lmlab.config_checks import BOOL_FIELDS, glu_hidden_dim
from lmlab.model import TransformerLM, lm_loss
from lmlab.model.ffn import ACTIVATION_FNS, FeedForward
from lmlab.model.norms import RMSNorm, make_norm
from lmlab.model.transformer import Block


def small(**overrides) -> ModelConfig:
    base = dict(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4)
    base.update(overrides)
    return ModelConfig(**base)


def randomise_(module: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter ~ N(0, 0.3) (norm weights around 1), so no two sublayers or norms coincide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.3
            p.copy_(noise + 1.0 if name.endswith("norm.weight") else noise)


# ------------------------------------------------------------------------------------------------
# Norms
# ------------------------------------------------------------------------------------------------


def test_rmsnorm_is_x_over_rms_times_weight():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16) * 3 + 1
    norm = RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    xd = x.double()
    ref = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), ref, rtol=1e-5, atol=1e-6)
    # no mean subtraction: a constant vector keeps its sign and becomes all ones (times weight)
    ones = RMSNorm(4, eps=0.0)(torch.full((1, 4), 7.0))
    torch.testing.assert_close(ones, torch.ones(1, 4))


def test_gemma_rmsnorm_scales_by_one_plus_weight():
    torch.manual_seed(1)
    x = torch.randn(2, 7, 12)
    norm = make_norm("gemma_rmsnorm", 12, eps=1e-6)
    assert torch.equal(norm.weight, torch.zeros(12)), "Gemma stores the scale as an offset from one, zero at init"
    torch.testing.assert_close(norm(x), make_norm("rmsnorm", 12, eps=1e-6)(x))  # (1 + 0) == plain RMSNorm
    with torch.no_grad():
        norm.weight.copy_(torch.randn(12))
    xd = x.double()
    ref = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + norm.weight.double())
    torch.testing.assert_close(norm(x).double(), ref, rtol=1e-5, atol=1e-6)


def test_rmsnorms_match_hugging_face():
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    modeling_gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    torch.manual_seed(2)
    x, w = torch.randn(2, 3, 8), torch.randn(8)
    ours, hf = RMSNorm(8, 1e-6), modeling_llama.LlamaRMSNorm(8, eps=1e-6)
    ours_g, hf_g = make_norm("gemma_rmsnorm", 8, 1e-6), modeling_gemma.GemmaRMSNorm(8, eps=1e-6)
    with torch.no_grad():
        for m in (ours, hf, ours_g, hf_g):
            m.weight.copy_(w)
    torch.testing.assert_close(ours(x), hf(x))
    torch.testing.assert_close(ours_g(x), hf_g(x))


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_with_and_without_bias(bias):
    torch.manual_seed(3)
    x = torch.randn(4, 6, 10) * 2 + 5
    norm = make_norm("layernorm", 10, eps=1e-5, bias=bias)
    assert (norm.bias is not None) == bias
    assert sum(p.numel() for p in norm.parameters()) == (20 if bias else 10)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(10))
        if bias:
            norm.bias.copy_(torch.randn(10))
    xd = x.double()
    mean = xd.mean(-1, keepdim=True)
    var = xd.var(-1, unbiased=False, keepdim=True)
    ref = (xd - mean) / torch.sqrt(var + 1e-5) * norm.weight.double()
    if bias:
        ref = ref + norm.bias.double()
    torch.testing.assert_close(norm(x).double(), ref, rtol=1e-5, atol=1e-5)
    torch_ref = torch.nn.LayerNorm(10, eps=1e-5, bias=bias)
    torch_ref.load_state_dict(norm.state_dict())
    torch.testing.assert_close(norm(x), torch_ref(x))


def test_norm_computes_in_fp32_for_bf16_input():
    x = torch.randn(2, 64) * 100
    for kind in ("rmsnorm", "layernorm", "gemma_rmsnorm"):
        norm = make_norm(kind, 64, 1e-5)
        y = norm(x.bfloat16())
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), norm(x.bfloat16().float()).bfloat16().float())


def test_make_norm_rejects_unknown_type():
    with pytest.raises(ValueError, match="norm_type"):
        make_norm("batchnorm", 8, 1e-5)


# ------------------------------------------------------------------------------------------------
# Activations and FFNs
# ------------------------------------------------------------------------------------------------

_X = torch.linspace(-6, 6, 241, dtype=torch.float64)
_HAND = {
    "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),  # Hendrycks & Gimpel 2016, exact
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + torch.exp(-x)),  # a.k.a. swish-1
    "relu2": lambda x: torch.where(x > 0, x * x, torch.zeros_like(x)),  # So et al. 2021 (Primer)
    "elu": lambda x: torch.where(x > 0, x, torch.exp(x) - 1),  # Clevert et al. 2016, alpha 1
    # Klambauer et al. 2017: lambda and alpha to the digits of their eq. 14
    "selu": lambda x: 1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * (torch.exp(x) - 1)),
    "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
    "identity": lambda x: x,
}
_HF_NAME = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu", "relu2": "relu2"}
# the gate nonlinearity of each GLU variant (Shazeer 2020): ReGLU = ReLU, GeGLU = GELU (tanh form, as
# T5 v1.1 and Gemma ship it), SwiGLU = SiLU, GLU = sigmoid (Dauphin et al. 2017), Bilinear = none
_GATE_OF = {"reglu": "relu", "geglu": "gelu_tanh", "swiglu": "silu", "glu": "sigmoid", "bilinear": "identity"}
_PLAIN = sorted(k for k in _HAND if k not in ("sigmoid", "identity"))


@pytest.mark.parametrize("name", _PLAIN)
def test_activation_matches_formula(name):
    torch.testing.assert_close(ACTIVATION_FNS[name](_X), _HAND[name](_X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(_HF_NAME))
def test_activation_matches_hugging_face(name):
    activations = pytest.importorskip("transformers.activations")
    torch.testing.assert_close(ACTIVATION_FNS[name](_X), activations.ACT2FN[_HF_NAME[name]](_X))


@pytest.mark.parametrize("name", _PLAIN)
def test_plain_ffn_is_w2_act_w1(name):
    cfg = small(activation=name, bias="mlp")
    ffn = FeedForward(cfg)
    randomise_(ffn)
    assert ffn.w_in.weight.shape == (cfg.d_ff, cfg.d_model) and cfg.d_ff == 4 * cfg.d_model
    x = torch.randn(2, 3, cfg.d_model)
    h = x.double() @ ffn.w_in.weight.double().T + ffn.w_in.bias.double()
    ref = _HAND[name](h) @ ffn.w_out.weight.double().T + ffn.w_out.bias.double()
    torch.testing.assert_close(ffn(x).double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(_GATE_OF))
def test_gated_ffn_is_act_gate_times_up(name):
    cfg = small(activation=name)
    ffn = FeedForward(cfg)
    randomise_(ffn)
    d_ff = cfg.d_ff
    assert ffn.w_in.weight.shape == (2 * d_ff, cfg.d_model), "gate and up projections fused, gate first"
    w_gate, w_up = ffn.w_in.weight[:d_ff].double(), ffn.w_in.weight[d_ff:].double()
    x = torch.randn(2, 3, cfg.d_model)
    xd = x.double()
    ref = (_HAND[_GATE_OF[name]](xd @ w_gate.T) * (xd @ w_up.T)) @ ffn.w_out.weight.double().T
    torch.testing.assert_close(ffn(x).double(), ref, rtol=1e-4, atol=1e-4)


def test_swiglu_matches_hugging_face_llama_mlp():
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    transformers = pytest.importorskip("transformers")
    cfg = small(activation="swiglu", d_ff=48)
    ffn = FeedForward(cfg)
    randomise_(ffn)
    hf = modeling_llama.LlamaMLP(transformers.LlamaConfig(hidden_size=32, intermediate_size=48, hidden_act="silu"))
    with torch.no_grad():
        hf.gate_proj.weight.copy_(ffn.w_in.weight[:48])
        hf.up_proj.weight.copy_(ffn.w_in.weight[48:])
        hf.down_proj.weight.copy_(ffn.w_out.weight)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(ffn(x), hf(x))


def test_gated_width_rule_8_3():
    assert glu_hidden_dim(4096, 256) == 11008  # LLaMA 7B
    assert glu_hidden_dim(4096, 1024, 1.3) == 14336  # Llama 3 8B
    assert glu_hidden_dim(8192, 4096, 1.3) == 28672  # Llama 2 70B
    # the same rule drives ModelConfig when d_ff is not given
    assert ModelConfig(d_model=4096, n_heads=32, ffn_multiple_of=256).d_ff == 11008
    llama3 = ModelConfig(d_model=4096, n_heads=32, n_kv_heads=8, ffn_multiple_of=1024, ffn_dim_multiplier=1.3)
    assert llama3.d_ff == 14336
    # gated FFN with the 8/3 rule has ~ the parameters of a 4x plain FFN: 3 * 8/3 = 8 = 2 * 4
    gated, plain = small(d_model=96, n_heads=4, ffn_multiple_of=1), small(d_model=96, n_heads=4, activation="gelu")
    assert gated.d_ff == 256 and plain.d_ff == 384
    assert 3 * gated.d_ff * 96 == 2 * plain.d_ff * 96


def test_ffn_ratio_and_explicit_d_ff():
    assert small(ffn_ratio=2.5).d_ff == 80
    assert small(ffn_ratio=2.5, activation="gelu").d_ff == 80
    assert small(activation="relu").d_ff == 128  # plain FFN default: 4 d_model
    assert small(d_ff=50, ffn_ratio=2.5).d_ff == 50  # an explicit d_ff wins
    assert FeedForward(small(ffn_ratio=3.0, activation="relu")).w_in.out_features == 96
    with pytest.raises(ConfigError, match="ffn_ratio"):
        small(ffn_ratio=-1.0)


def test_ffn_width_knobs_are_validated_even_when_unused():
    with pytest.raises(ConfigError, match="ffn_dim_multiplier"):
        small(d_ff=64, ffn_dim_multiplier=0.0)
    with pytest.raises(ConfigError, match="ffn_ratio"):
        small(d_ff=64, ffn_ratio=float("nan"))


@pytest.mark.parametrize("name", BOOL_FIELDS)
@pytest.mark.parametrize("value", ["no", 0, None])
def test_boolean_switches_reject_non_booleans(name, value):
    with pytest.raises(ConfigError, match=name):
        small(**{name: value})


# ------------------------------------------------------------------------------------------------
# Block layouts
# ------------------------------------------------------------------------------------------------


def _block(**overrides) -> Block:
    block = Block(small(**overrides), layer=0).eval()
    randomise_(block, seed=4)
    return block


_POS = torch.arange(6)


def _x() -> torch.Tensor:
    return torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(5)) * 2


@pytest.mark.parametrize("norm_type", ["rmsnorm", "layernorm"])
def test_post_norm_block_output_is_normalised(norm_type):
    block = Block(small(norm_position="post", norm_type=norm_type), 0).eval()
    randomise_(block, seed=6)
    with torch.no_grad():  # norm weights back to one (and bias to zero) so the output is the raw norm
        for norm in (block.attn_norm, block.mlp_norm):
            norm.weight.fill_(1.0)
            if getattr(norm, "bias", None) is not None:
                norm.bias.zero_()
    y = block(_x(), _POS).double()
    if norm_type == "layernorm":
        torch.testing.assert_close(y.mean(-1), torch.zeros(2, 6, dtype=torch.double), atol=1e-5, rtol=0)
        torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(2, 6, dtype=torch.double), atol=1e-3, rtol=0)
    else:
        torch.testing.assert_close(y.pow(2).mean(-1).sqrt(), torch.ones(2, 6, dtype=torch.double), atol=1e-4, rtol=0)


def test_post_norm_equals_vaswani_composition():
    b = _block(norm_position="post", norm_type="layernorm", norm_bias=True)
    x = _x()
    h = b.attn_norm(x + b.attn(x, _POS))
    assert torch.equal(b(x, _POS), b.mlp_norm(h + b.mlp(h)))


def test_pre_norm_equals_hand_composition():
    b = _block(norm_position="pre")
    x = _x()
    h = x + b.attn(b.attn_norm(x), _POS)
    assert torch.equal(b(x, _POS), h + b.mlp(b.mlp_norm(h)))


def test_sandwich_norm_equals_hand_composition():
    b = _block(norm_position="sandwich", norm_type="gemma_rmsnorm")
    x = _x()
    h = x + b.attn_out_norm(b.attn(b.attn_norm(x), _POS))
    assert torch.equal(b(x, _POS), h + b.mlp_out_norm(b.mlp(b.mlp_norm(h))))
    assert len([m for m in b.modules() if isinstance(m, RMSNorm)]) == 4


def test_reordered_norm_equals_hand_composition():
    b = _block(norm_position="reordered")
    x = _x()
    h = x + b.attn_norm(b.attn(x, _POS))  # OLMo 2: norm on the sublayer output, none on its input
    assert torch.equal(b(x, _POS), h + b.mlp_norm(b.mlp(h)))


def test_parallel_block_with_one_shared_norm():
    b = _block(parallel_block=True, parallel_shared_norm=True)
    assert b.mlp_norm is None
    assert len([m for m in b.modules() if isinstance(m, RMSNorm)]) == 1
    x = _x()
    n = b.attn_norm(x)
    assert torch.equal(b(x, _POS), x + b.attn(n, _POS) + b.mlp(n))


def test_parallel_block_with_two_norms():
    b = _block(parallel_block=True, parallel_shared_norm=False, norm_type="layernorm", norm_bias=True)
    assert b.mlp_norm is not None and not torch.equal(b.mlp_norm.weight, b.attn_norm.weight)
    x = _x()
    out = b(x, _POS)
    assert torch.equal(out, x + b.attn(b.attn_norm(x), _POS) + b.mlp(b.mlp_norm(x)))
    assert not torch.allclose(out, x + b.attn(b.attn_norm(x), _POS) + b.mlp(b.attn_norm(x)))


def test_parallel_block_needs_pre_norm():
    with pytest.raises(ConfigError, match="parallel_block"):
        small(parallel_block=True, norm_position="post")


# ------------------------------------------------------------------------------------------------
# Biases, embeddings, output
# ------------------------------------------------------------------------------------------------

_EXPECTED_BIASES = {
    "none": set(),
    "all": {"attn.qkv", "attn.out", "mlp.w_in", "mlp.w_out"},
    "qkv": {"attn.qkv"},  # Qwen2
    "mlp": {"mlp.w_in", "mlp.w_out"},  # GPT-J
}


@pytest.mark.parametrize("bias", sorted(_EXPECTED_BIASES))
@pytest.mark.parametrize("lm_head_bias", [False, True])
def test_bias_switch_selects_linear_layers(bias, lm_head_bias):
    model = TransformerLM(small(bias=bias, lm_head_bias=lm_head_bias))
    for block in model.blocks:
        with_bias = {name for name, m in block.named_modules() if isinstance(m, torch.nn.Linear) and m.bias is not None}
        assert with_bias == _EXPECTED_BIASES[bias]
    assert (model.lm_head.bias is not None) == lm_head_bias
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            assert torch.count_nonzero(p) == 0, f"{name} must start at zero"


def test_tied_embeddings_share_storage():
    tied, untied = TransformerLM(small(tie_embeddings=True)), TransformerLM(small(tie_embeddings=False))
    assert tied.lm_head.weight is tied.embed.weight
    assert tied.lm_head.weight.data_ptr() == tied.embed.weight.data_ptr()
    assert untied.lm_head.weight.data_ptr() != untied.embed.weight.data_ptr()
    assert untied.num_params() - tied.num_params() == 64 * 32
    with torch.no_grad():  # a write through one is seen by the other
        tied.embed.weight[3, 0] = 123.0
    assert tied.lm_head.weight[3, 0] == 123.0
    # and a gradient step on the head moves the embedding
    loss = tied(torch.tensor([[1, 2, 3]])).sum()
    loss.backward()
    assert tied.embed.weight.grad is not None and tied.embed.weight.grad.abs().sum() > 0


def _block0_input(model: TransformerLM, idx: torch.Tensor) -> torch.Tensor:
    seen = {}
    handle = model.blocks[0].register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    model(idx)
    handle.remove()
    return seen["x"]


def test_scale_embeddings_multiplies_by_sqrt_d_model():
    idx = torch.tensor([[5, 1, 7, 7]])
    plain, scaled = TransformerLM(small()), TransformerLM(small(scale_embeddings=True))
    scaled.load_state_dict(plain.state_dict())
    torch.testing.assert_close(_block0_input(plain, idx), plain.embed(idx))
    torch.testing.assert_close(_block0_input(scaled, idx), plain.embed(idx) * math.sqrt(32))


@pytest.mark.parametrize("final_norm", [True, False])
def test_final_norm_switch(final_norm):
    model = TransformerLM(small(final_norm=final_norm, norm_type="layernorm", norm_bias=True))
    randomise_(model)
    assert (model.final_norm is not None) == final_norm
    seen = {}
    model.blocks[-1].register_forward_hook(lambda mod, args, out: seen.update(h=out))
    idx = torch.tensor([[1, 2, 3, 4]])
    hidden = model.hidden(idx)
    expected = model.final_norm(seen["h"]) if final_norm else seen["h"]
    assert torch.equal(hidden, expected)
    torch.testing.assert_close(model(idx), model.lm_head(expected))
    without = TransformerLM(small(final_norm=False, norm_type="layernorm", norm_bias=True))
    assert model.num_params() == without.num_params() + (64 if final_norm else 0)  # weight + bias of d_model 32


def test_final_logit_softcap_bounds_logits():
    model = TransformerLM(small(final_logit_softcap=3.0))
    randomise_(model)
    idx = torch.tensor([[1, 2, 3, 4, 5]])
    raw = model.lm_head(model.hidden(idx)).double()
    logits = model(idx)
    assert logits.abs().max() < 3.0 < raw.abs().max()
    torch.testing.assert_close(logits.double(), 3.0 * torch.tanh(raw / 3.0), rtol=1e-5, atol=1e-5)


def test_z_loss_adds_squared_log_partition():
    torch.manual_seed(7)
    logits, targets = torch.randn(2, 5, 11) * 3, torch.randint(0, 11, (2, 5))
    targets[0, 0] = -100  # ignored position: neither in CE nor in z-loss
    loss, ce = lm_loss(logits, targets, z_loss=1e-2)
    keep = targets.flatten() != -100
    flat = logits.flatten(0, 1).double()[keep]
    ref_ce = (flat.logsumexp(-1) - flat.gather(1, targets.flatten()[keep][:, None]).squeeze(1)).mean()
    ref_z = flat.logsumexp(-1).pow(2).mean()
    torch.testing.assert_close(ce.double(), ref_ce, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss.double(), ref_ce + 1e-2 * ref_z, rtol=1e-6, atol=1e-6)
    plain, ce2 = lm_loss(logits, targets)
    assert torch.equal(plain, ce2)


# ------------------------------------------------------------------------------------------------
# Regularisation: dropout only in training mode
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["embd_dropout", "attn_dropout", "resid_dropout"])
@pytest.mark.parametrize("softcap", [None, 20.0])  # 20.0: the explicit-softmax attention path
def test_dropout_only_in_train_mode(which, softcap):
    cfg = small(**{which: 0.5}, attn_logit_softcap=softcap)
    model, reference = TransformerLM(cfg), TransformerLM(small(attn_logit_softcap=softcap))
    reference.load_state_dict(model.state_dict())
    idx = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    model.eval()
    assert torch.equal(model(idx), reference.eval()(idx)), "eval mode must not drop anything"
    model.train()
    torch.manual_seed(0)
    a = model(idx)
    b = model(idx)
    assert not torch.allclose(a, b), f"{which} must be active in train mode"
    assert not torch.allclose(a, reference(idx))


def test_dropout_rates_are_validated():
    for name in ("embd_dropout", "attn_dropout", "resid_dropout"):
        with pytest.raises(ConfigError, match=name):
            small(**{name: 1.0})


# ------------------------------------------------------------------------------------------------
# Whole-model equivalence with Hugging Face reference implementations (same weights)
# ------------------------------------------------------------------------------------------------


def _copy(dst: torch.nn.Parameter, src: torch.Tensor) -> None:
    assert dst.shape == src.shape, (dst.shape, src.shape)
    dst.copy_(src)


def test_gpt2_layout_matches_hugging_face():
    """Pre-norm LayerNorm with biases, GELU (tanh), all-linear biases, learned positions, tied head."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    torch.manual_seed(8)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    ours = TransformerLM(
        small(
            norm_type="layernorm",
            norm_bias=True,
            bias="all",
            activation="gelu_tanh",
            position="learned",
            tie_embeddings=True,
        )
    ).eval()
    sd = {k: v for k, v in hf.state_dict().items()}
    with torch.no_grad():
        _copy(ours.embed.weight, sd["transformer.wte.weight"])
        _copy(ours.abs_pos.weight, sd["transformer.wpe.weight"])
        for i, b in enumerate(ours.blocks):
            p = f"transformer.h.{i}."
            for norm, name in ((b.attn_norm, "ln_1"), (b.mlp_norm, "ln_2")):
                _copy(norm.weight, sd[p + name + ".weight"])
                _copy(norm.bias, sd[p + name + ".bias"])
            for lin, name in (
                (b.attn.qkv, "attn.c_attn"),
                (b.attn.out, "attn.c_proj"),
                (b.mlp.w_in, "mlp.c_fc"),
                (b.mlp.w_out, "mlp.c_proj"),
            ):
                _copy(lin.weight, sd[p + name + ".weight"].T)  # GPT-2's Conv1D stores (in, out)
                _copy(lin.bias, sd[p + name + ".bias"])
        _copy(ours.final_norm.weight, sd["transformer.ln_f.weight"])
        _copy(ours.final_norm.bias, sd["transformer.ln_f.bias"])
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
    assert ours.num_params() == hf.num_parameters()


def test_neox_parallel_two_norms_matches_hugging_face():
    """GPT-NeoX: parallel block with two LayerNorms, partial RoPE (0.25, half pairing), untied head."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPTNeoXConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        hidden_act="gelu",
        max_position_embeddings=32,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    torch.manual_seed(10)
    hf = transformers.GPTNeoXForCausalLM(hf_cfg).eval()
    ours = TransformerLM(
        small(
            n_heads=2,
            norm_type="layernorm",
            norm_bias=True,
            bias="all",
            activation="gelu",
            parallel_block=True,
            parallel_shared_norm=False,
            rope_fraction=0.25,
            tie_embeddings=False,
        )
    ).eval()
    sd = hf.state_dict()
    H, D = 2, 16
    with torch.no_grad():
        _copy(ours.embed.weight, sd["gpt_neox.embed_in.weight"])
        _copy(ours.lm_head.weight, sd["lm_head.weight"])
        for i, b in enumerate(ours.blocks):
            p = f"gpt_neox.layers.{i}."
            for norm, name in ((b.attn_norm, "input_layernorm"), (b.mlp_norm, "post_attention_layernorm")):
                _copy(norm.weight, sd[p + name + ".weight"])
                _copy(norm.bias, sd[p + name + ".bias"])
            # NeoX interleaves per head [q_h, k_h, v_h]; ours is [all q, all k, all v]
            w = sd[p + "attention.query_key_value.weight"].view(H, 3, D, 32).transpose(0, 1).reshape(3 * H * D, 32)
            bias = sd[p + "attention.query_key_value.bias"].view(H, 3, D).transpose(0, 1).reshape(3 * H * D)
            _copy(b.attn.qkv.weight, w)
            _copy(b.attn.qkv.bias, bias)
            for lin, name in (
                (b.attn.out, "attention.dense"),
                (b.mlp.w_in, "mlp.dense_h_to_4h"),
                (b.mlp.w_out, "mlp.dense_4h_to_h"),
            ):
                _copy(lin.weight, sd[p + name + ".weight"])
                _copy(lin.bias, sd[p + name + ".bias"])
        _copy(ours.final_norm.weight, sd["gpt_neox.final_layer_norm.weight"])
        _copy(ours.final_norm.bias, sd["gpt_neox.final_layer_norm.bias"])
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
    assert ours.num_params() == hf.num_parameters()


def test_phi_parallel_shared_norm_matches_hugging_face():
    """Phi-2: parallel block with one shared LayerNorm, partial RoPE 0.4, GELU (tanh), LM-head bias."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.PhiConfig(
        vocab_size=64,
        hidden_size=40,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=1,
        max_position_embeddings=32,
        hidden_act="gelu_new",
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4},
    )
    torch.manual_seed(12)
    hf = transformers.PhiForCausalLM(hf_cfg).eval()
    ours = TransformerLM(
        small(
            d_model=40,
            n_heads=1,
            norm_type="layernorm",
            norm_bias=True,
            bias="all",
            activation="gelu_tanh",
            parallel_block=True,
            parallel_shared_norm=True,
            rope_fraction=0.4,
            tie_embeddings=False,
            lm_head_bias=True,
        )
    ).eval()
    sd = hf.state_dict()
    with torch.no_grad():
        _copy(ours.embed.weight, sd["model.embed_tokens.weight"])
        _copy(ours.lm_head.weight, sd["lm_head.weight"])
        _copy(ours.lm_head.bias, sd["lm_head.bias"])
        for i, b in enumerate(ours.blocks):
            p = f"model.layers.{i}."
            _copy(b.attn_norm.weight, sd[p + "input_layernorm.weight"])
            _copy(b.attn_norm.bias, sd[p + "input_layernorm.bias"])
            qkv = [p + f"self_attn.{n}_proj." for n in "qkv"]
            _copy(b.attn.qkv.weight, torch.cat([sd[n + "weight"] for n in qkv]))
            _copy(b.attn.qkv.bias, torch.cat([sd[n + "bias"] for n in qkv]))
            for lin, name in ((b.attn.out, "self_attn.dense"), (b.mlp.w_in, "mlp.fc1"), (b.mlp.w_out, "mlp.fc2")):
                _copy(lin.weight, sd[p + name + ".weight"])
                _copy(lin.bias, sd[p + name + ".bias"])
        _copy(ours.final_norm.weight, sd["model.final_layernorm.weight"])
        _copy(ours.final_norm.bias, sd["model.final_layernorm.bias"])
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(13))
    torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
    assert ours.num_params() == hf.num_parameters()


def test_llama_layout_matches_hugging_face():
    """LLaMA: pre-norm RMSNorm, SwiGLU, no biases, RoPE (half pairing), GQA, untied head."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=88,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(14)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    ours = TransformerLM(small(n_kv_heads=2, d_ff=88, norm_eps=1e-6, tie_embeddings=False)).eval()
    sd = hf.state_dict()
    with torch.no_grad():
        _copy(ours.embed.weight, sd["model.embed_tokens.weight"])
        _copy(ours.lm_head.weight, sd["lm_head.weight"])
        for i, b in enumerate(ours.blocks):
            p = f"model.layers.{i}."
            _copy(b.attn_norm.weight, sd[p + "input_layernorm.weight"])
            _copy(b.mlp_norm.weight, sd[p + "post_attention_layernorm.weight"])
            _copy(b.attn.qkv.weight, torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
            _copy(b.attn.out.weight, sd[p + "self_attn.o_proj.weight"])
            _copy(b.mlp.w_in.weight, torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
            _copy(b.mlp.w_out.weight, sd[p + "mlp.down_proj.weight"])
        _copy(ours.final_norm.weight, sd["model.norm.weight"])
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(15))
    torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
    assert ours.num_params() == hf.num_parameters()


def test_gemma2_layout_matches_hugging_face():
    """Gemma 2: sandwich norms with (1 + w) RMSNorm, GeGLU, embeddings x sqrt(d_model), tied head,
    attention and final logit soft-caps, query_pre_attn_scalar, alternating local / global layers."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=4,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
        max_position_embeddings=32,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    torch.manual_seed(16)
    hf = transformers.Gemma2ForCausalLM(hf_cfg).eval()
    randomise_(hf, seed=17)  # Gemma's norm weights start at 0: make them matter
    ours = TransformerLM(
        small(
            n_kv_heads=2,
            head_dim=16,
            d_ff=64,
            norm_type="gemma_rmsnorm",
            norm_eps=1e-6,
            norm_position="sandwich",
            activation="geglu",
            scale_embeddings=True,
            tie_embeddings=True,
            attn_logit_softcap=5.0,
            final_logit_softcap=3.0,
            query_pre_attn_scalar=24.0,
            sliding_window=4,
            layer_pattern="LG",
        )
    ).eval()
    sd = hf.state_dict()
    with torch.no_grad():
        _copy(ours.embed.weight, sd["model.embed_tokens.weight"])
        for i, b in enumerate(ours.blocks):
            p = f"model.layers.{i}."
            for norm, name in (
                (b.attn_norm, "input_layernorm"),
                (b.attn_out_norm, "post_attention_layernorm"),
                (b.mlp_norm, "pre_feedforward_layernorm"),
                (b.mlp_out_norm, "post_feedforward_layernorm"),
            ):
                _copy(norm.weight, sd[p + name + ".weight"])
            _copy(b.attn.qkv.weight, torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
            _copy(b.attn.out.weight, sd[p + "self_attn.o_proj.weight"])
            _copy(b.mlp.w_in.weight, torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
            _copy(b.mlp.w_out.weight, sd[p + "mlp.down_proj.weight"])
        _copy(ours.final_norm.weight, sd["model.norm.weight"])
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(18))
    torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
    assert ours.num_params() == hf.num_parameters()
