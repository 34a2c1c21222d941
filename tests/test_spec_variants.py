"""The shipped specs' variants equal their sources' definitions (issue 41, item 4), checked on the planned
runs of each spec and of its gpu tier (planned without data, as test_sweep's shipped-spec checks):

- 01: the reordered variant is OLMo 2's block, QK RMSNorm across heads included: the switches of lmlab's
  olmo-2-7b preset, and one decoder block (and the whole model) equal to transformers' Olmo2DecoderLayer
  (Olmo2ForCausalLM) with the weights copied by lmlab's HF export;
- 10: the sinusoidal variant at Vaswani et al.'s scale: embeddings N(0, d^-1/2) x sqrt(d) have RMS 1 and
  the sinusoid table is Vaswani et al.'s formula with RMS sqrt(1/2), both by hand;
- 05: each label's depth and aspect ratio (in units of d0, the rung's d_model) are the planned config's;
- 12: every head-dim ratio keeps the baseline's d_ff, and the label's ratio is n_heads x head_dim / d_model.
"""

import dataclasses
import math
import re
from fractions import Fraction

import pytest
import torch

from lmlab.config import ModelConfig
from lmlab.lab.plan import _plan, control_flags, plan_quantities
from lmlab.lab.spec import load_spec
from lmlab.model import TransformerLM

TIERS = [None, "gpu"]


def planned(name: str, tier=None):
    """(spec, {(scale, variant): first planned run}) of shipped spec ``name`` at ``tier``; validated,
    nothing prepared (the default corpus's 4,096-token vocabulary)."""
    spec = load_spec(name, tier)
    runs: dict = {}
    for p in _plan(spec, None, 4096):
        runs.setdefault((p.scale, p.variant), p)
    return spec, runs


# --- 01: reordered norm = OLMo 2's block -----------------------------------------------------------
def _reordered(tier):
    spec, runs = planned("01-norm-placement", tier)
    (p,) = [p for p in runs.values() if p.cfg.norm_position == "reordered"]
    return spec, p


@pytest.mark.parametrize("tier", TIERS)
def test_01_reordered_variant_has_olmo2_switches(tier):
    from lmlab.interop.hf import lmlab_to_hf_config
    from lmlab.interop.registry import UnsupportedError
    from lmlab.presets import get_preset

    spec, p = _reordered(tier)
    assert "OLMo 2" in p.variant and "QK-norm" in p.variant
    olmo2 = get_preset("olmo-2-7b").real
    switches = (
        "norm_type",
        "norm_position",
        "qk_norm",
        "qk_norm_scope",
        "norm_weight_fp32",
        "activation",
        "position",
        "bias",
    )
    assert {k: getattr(p.cfg, k) for k in switches} == {k: olmo2.get(k, getattr(ModelConfig(), k)) for k in switches}
    assert (p.cfg.qk_norm, p.cfg.qk_norm_scope) == ("rmsnorm", "all")  # QK RMSNorm across heads
    fam, hf = lmlab_to_hf_config(p.cfg, family="olmo2")  # OLMo 2's HF config represents it exactly
    assert fam.hf_class == "Olmo2ForCausalLM"
    # the block without OLMo 2's QK-norm (the variant executed before issue 41) is not OLMo 2's
    bare = dataclasses.replace(p.cfg, qk_norm="none", qk_norm_scope="head")
    with pytest.raises(UnsupportedError):
        lmlab_to_hf_config(bare, family="olmo2")


def test_01_reordered_block_equals_transformers_olmo2_decoder_layer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer

    from lmlab.interop.hf import export_model

    _, p = _reordered(None)
    cfg = p.cfg  # the planned config as it is: d_model 96, 3 heads, 4 layers, init N(0, 0.1)
    torch.manual_seed(0)
    model = TransformerLM(cfg).eval()
    with torch.no_grad():  # norm weights away from one, so a misplaced or missing norm shows
        for name, w in model.named_parameters():
            if "norm" in name:
                w.add_(0.2 * torch.randn_like(w))
    export_model(model, tmp_path, family="olmo2", extra_config={"eos_token_id": 0, "pad_token_id": 0})
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    layer = hf.model.layers[0]
    assert isinstance(layer, Olmo2DecoderLayer)
    assert layer.self_attn.q_norm.weight.shape == (cfg.n_heads * cfg.head_dim,)  # across heads

    T = 40
    x = torch.randn(2, T, cfg.d_model)
    pos = torch.arange(T)
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]  # the mask Olmo2Model would pass
    for module in model.modules():
        if hasattr(module, "ensure"):  # RoPE tables (TransformerLM.hidden does this before its blocks)
            module.ensure(T)
    with torch.no_grad():
        want = layer(
            x, attention_mask=causal, position_ids=pos[None], position_embeddings=hf.model.rotary_emb(x, pos[None])
        )
        got = model.blocks[0](x, pos)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        ids = torch.randint(0, cfg.vocab_size, (2, T))
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)  # all 4 blocks, head


# --- 10: sinusoidal positions at Vaswani et al.'s scale ---------------------------------------------
def _sinusoidal(tier):
    spec, runs = planned("10-positions", tier)
    (p,) = [p for p in runs.values() if p.cfg.position == "sinusoidal"]
    return p


@pytest.mark.parametrize("tier", TIERS)
def test_10_sinusoidal_variant_has_the_published_scale(tier):
    cfg = _sinusoidal(tier).cfg
    assert cfg.scale_embeddings and cfg.tie_embeddings
    assert math.isclose(cfg.embed_init_std, cfg.d_model**-0.5, rel_tol=1e-8)  # tensor2tensor's init


def test_10_sinusoidal_embeddings_rms_one_against_positions_rms_sqrt_half():
    cfg = _sinusoidal(None).cfg
    d, T = cfg.d_model, cfg.context_length
    torch.manual_seed(0)
    model = TransformerLM(cfg).eval()
    model.reset_parameters()  # again, now that the LM head is tied: it is the embedding, drawn at its std
    assert model.lm_head.weight is model.embed.weight
    # by hand: std d^-1/2 x sqrt(d) = 1 (sampling error of the RMS of 393k draws: about 0.1%)
    scaled = model.embed.weight * math.sqrt(d)
    assert scaled.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=0.01)
    # Vaswani et al. 2017 section 3.5, by hand: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)
    table = torch.tensor(
        [[f(p / 10000 ** (2 * (j // 2) / d)) for j, f in zip(range(d), [math.sin, math.cos] * d)] for p in range(T)]
    )
    torch.testing.assert_close(model.abs_pos.table[:T], table, atol=1e-6, rtol=0)
    assert table.pow(2).mean().sqrt().item() == pytest.approx(math.sqrt(0.5), abs=1e-6)  # sin^2 + cos^2 = 1
    # what the first block sees: the scaled embeddings plus the table, at RMS 1 and sqrt(1/2)
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))  # returns None
    ids = torch.arange(cfg.vocab_size).view(-1, T)  # every token once
    with torch.no_grad():
        model(ids)
    emb = seen["x"] - table
    assert emb.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=0.01)
    torch.testing.assert_close(emb, scaled.detach()[ids], atol=1e-5, rtol=0)


def test_embed_init_std_changes_only_the_token_embedding():
    """None (the default) draws exactly what lmlab drew before the field existed (every weight N(0,
    init_std), residual projections / sqrt(2 n_layers)); a value changes the token embedding (and a tied
    LM head, the same matrix) and nothing else, with the same random stream; an untied head keeps init_std."""
    base = dict(
        vocab_size=64,
        context_length=16,
        d_model=32,
        n_layers=2,
        n_heads=4,
        position="sinusoidal",
        scale_embeddings=True,
    )
    for tie in (True, False):
        cfg = ModelConfig(**base, tie_embeddings=tie)
        torch.manual_seed(1)
        default = TransformerLM(cfg)
        torch.manual_seed(1)  # the initialisation before embed_init_std, by hand
        ref = TransformerLM(cfg)
        with torch.no_grad():
            torch.manual_seed(1)
            for module in ref.modules():
                if isinstance(module, torch.nn.Linear):
                    res = getattr(module, "is_residual_projection", False)
                    module.weight.normal_(0.0, cfg.init_std / (math.sqrt(2 * cfg.n_layers) if res else 1.0))
                elif isinstance(module, torch.nn.Embedding):
                    module.weight.normal_(0.0, cfg.init_std)
        torch.manual_seed(1)
        default.reset_parameters()
        for (name, a), b in zip(default.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(a, b), name
        torch.manual_seed(1)
        wide = TransformerLM(dataclasses.replace(cfg, embed_init_std=0.5))
        torch.manual_seed(1)
        default = TransformerLM(cfg)
        for (name, a), b in zip(wide.state_dict().items(), default.state_dict().values()):
            embedding = name == "embed.weight" or (tie and name == "lm_head.weight")
            assert torch.equal(a, b) != embedding, name
        assert wide.embed.weight.std().item() == pytest.approx(0.5, rel=0.05)
        assert wide.lm_head.weight.std().item() == pytest.approx(0.5 if tie else cfg.init_std, rel=0.05)
    for bad in (0, -0.1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="embed_init_std"):
            ModelConfig(embed_init_std=bad)


# --- 05: aspect-ratio labels -------------------------------------------------------------------------
ASPECT = re.compile(r"(\d+) layers?, aspect (\d*)d0(?:/(\d+))?")


def _aspect(text: str) -> Fraction:
    """'2d0' -> 2, 'd0/32' -> 1/32 (in units of d0)."""
    m = re.fullmatch(r"(\d*)d0(?:/(\d+))?", text)
    assert m, text
    return Fraction(int(m.group(1) or 1), int(m.group(2) or 1))


@pytest.mark.parametrize("tier", TIERS)
def test_05_labels_state_the_planned_depth_and_aspect(tier):
    spec, runs = planned("05-aspect-ratio", tier)
    d0 = {scale: p.cfg.d_model for (scale, variant), p in runs.items() if variant == spec.baseline}
    assert len(d0) == max(1, len(spec.scales)) and (tier is None or len(d0) == 2)  # CPU: one rung
    for (scale, variant), p in runs.items():
        m = ASPECT.fullmatch(variant)
        assert m, variant
        assert p.cfg.n_layers == int(m.group(1)), variant
        assert Fraction(p.cfg.d_model, p.cfg.n_layers) == d0[scale] * _aspect(variant.split("aspect ")[1]), (
            scale,
            variant,
            p.cfg.d_model,
            p.cfg.n_layers,
        )
    # every aspect the claims name is one of the labels'
    labelled = {variant.split("aspect ")[1] for _, variant in runs}
    for e in spec.expect:
        for text in re.findall(r"\b\d*d0(?:/\d+)?\b", e.text):
            assert text in labelled, (e.text, labelled)


# --- 12: head-dim ratio without the d_ff confound ----------------------------------------------------
@pytest.mark.parametrize("tier", TIERS)
def test_12_ratios_hold_d_ff_and_match_their_labels(tier):
    spec, runs = planned("12-head-dim", tier)
    assert spec.match is None or spec.match.solve != "d_ff"
    base = runs[(None, spec.baseline)].cfg
    assert base.n_heads * base.head_dim == base.d_model  # ratio 1
    for (_, variant), p in runs.items():
        assert p.cfg.d_ff == base.d_ff, (variant, p.cfg.d_ff)
        assert (p.cfg.d_model, p.cfg.n_layers, p.cfg.n_heads) == (base.d_model, base.n_layers, base.n_heads)
        ratio = Fraction(re.fullmatch(r"ratio (\d+(?:\.\d+)?)", variant).group(1))
        assert Fraction(p.cfg.n_heads * p.cfg.head_dim, p.cfg.d_model) == ratio, variant
    # what now differs (parameters and FLOPs, from the wider q, k, v, o) is declared, nothing else
    cells = {k: v for k, v in plan_quantities(list(runs.values())).items()}
    assert control_flags(cells, spec.baseline, None, spec.varies) == {}
    assert control_flags(cells, spec.baseline, None, []) != {}
