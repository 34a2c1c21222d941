"""Gemma 4's switches (lmlab/config.py global_*, v_norm, layer_scalar) checked against hand computations
and transformers; the logit parity of the whole family is tests/test_hf_parity.py's gemma4_text case."""

import json
import math

import pytest
import torch

from lmlab.analysis import kv_cache_bytes
from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM
from lmlab.model.attention import KVCache
from lmlab.model.positions import RotaryEmbedding
from lmlab.param_counts import param_counts

SMALL = dict(
    vocab_size=64,
    d_model=32,
    n_layers=5,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    sliding_window=4,
    layer_pattern="LLG",
    global_head_dim=16,
    global_n_kv_heads=1,
    global_k_eq_v=True,
    global_rope_proportion=0.25,
    v_norm=True,
    layer_scalar=True,
    qk_norm="rmsnorm",
    norm_position="sandwich",
    rope_local_theta=100.0,
    rope_theta=1e4,
    context_length=64,
)


def test_proportional_rope_turns_the_first_pairs_at_whole_head_frequencies():
    """Pairs (i, i + D/2) for i < int(p * D // 2) turn by pos * theta^(-2i/D); the others pass through
    (HF _compute_proportional_rope_parameters), unlike rope_fraction's theta^(-2i/rot)."""
    D, theta, pos = 16, 100.0, 5
    rope = RotaryEmbedding(D, 1.0, theta, "half", 32, proportion=0.25)
    x = torch.randn(1, 1, 1, D)
    y = rope(x, torch.tensor([pos]))[0, 0, 0]
    x = x[0, 0, 0]
    turned = int(0.25 * D // 2)
    assert turned == 2
    for i in range(D // 2):
        a, b = x[i], x[i + D // 2]
        angle = pos * theta ** (-2 * i / D) if i < turned else 0.0
        want = (a * math.cos(angle) - b * math.sin(angle), b * math.cos(angle) + a * math.sin(angle))
        assert torch.allclose(torch.stack([y[i], y[i + D // 2]]), torch.tensor(want), atol=1e-6), i
    # the GPT-NeoX partial rotation of the same fraction differs (frequencies over the rotated channels)
    partial = RotaryEmbedding(D, 0.25, theta, "half", 32)
    assert not torch.allclose(partial(x.view(1, 1, 1, D), torch.tensor([pos])), y.view(1, 1, 1, D))


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(sliding_window=None, layer_pattern=None), ["global_head_dim=16", "sliding_window is not set"]),
        (dict(global_n_kv_heads=3), ["global_n_kv_heads=3", "divide n_heads=4"]),
        (dict(global_rope_proportion=1.5), ["global_rope_proportion=1.5"]),
        (dict(rope_fraction=0.5), ["global_rope_proportion=0.25", "rope_fraction=0.5"]),
        (dict(global_rope_proportion=0.05), ["global_rope_proportion=0.05", "rotates no pair"]),
        (dict(local_attention="chunk"), ["global_head_dim", "local_attention='chunk'"]),
        (dict(global_k_eq_v="yes"), ["global_k_eq_v='yes'", "true or false"]),
        (dict(kv_shared_layers=5), ["kv_shared_layers=5", "<= 4"]),
        (dict(kv_shared_layers=4), ["kv_shared_layers=4", "layer 2 is global", "layers 0-0"]),
        (dict(kv_shared_wide_ffn=True), ["kv_shared_wide_ffn=True", "kv_shared_layers > 0"]),
        (dict(ple_vocab_size=64), ["ple_vocab_size=64 needs ple_dim > 0"]),
        (dict(ple_dim=4, ple_vocab_size=32), ["ple_vocab_size=32 must be >= vocab_size=64"]),
        (dict(ple_dim=-1), ["ple_dim=-1"]),
    ],
)
def test_global_layer_switches_refuse_bad_values(changes, words):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**{**SMALL, **changes})
    for w in words:
        assert w in str(err.value)


def test_per_layer_sizes_cache_and_analysis_agree():
    """Global layers get their own q/k(/v) rows, KV heads and head_dim; the KV cache holds exactly the
    bytes lmlab analyze reports; cached decoding equals the full forward past the window."""
    cfg = ModelConfig(**SMALL)
    assert param_counts(cfg)["ple_embedding"] == 0
    model = TransformerLM(cfg).eval()
    H = cfg.n_heads
    for i, block in enumerate(model.blocks):
        glob = cfg.layer_window(i) is None
        K, D = (1, 16) if glob else (2, 8)
        rows = (H + (1 if glob else 2) * K) * D  # keys as values: no v rows on the global layers
        assert block.attn.qkv.weight.shape == (rows, cfg.d_model), i
        assert block.attn.out.weight.shape == (cfg.d_model, H * D)
    assert [cfg.layer_window(i) for i in range(5)] == [4, 4, None, 4, 4]
    assert sum(p.numel() for p in model.parameters()) == param_counts(cfg)["total"]
    # bytes by hand: 4 local layers x 2 x 2 heads x 8 x min(20, 4) + 1 global x 2 x 1 x 16 x 20, fp32, batch 2
    check_cache_and_decoding(model, 2 * 4 * (4 * 2 * 2 * 8 * 4 + 2 * 1 * 16 * 20))


def check_cache_and_decoding(model, nbytes, n=20):
    """A KV cache of n (> window: local layers roll) positions x batch 2 holds ``nbytes`` (the hand figure),
    as lmlab analyze says; prefill + one-token steps equal the full forward."""
    cache = KVCache(model.cfg, 2, n)
    assert cache.nbytes == nbytes == kv_cache_bytes(model.cfg, n, batch=2, dtype="fp32")["total"]
    x = torch.randint(0, 64, (2, n))
    with torch.no_grad():
        full = model(x)
        steps = [model(x[:, :6], cache)] + [model(x[:, i : i + 1], cache) for i in range(6, n)]
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-5


def test_layer_scalar_is_a_stored_buffer_that_scales_the_block_output():
    cfg = ModelConfig(**SMALL)
    model = TransformerLM(cfg).eval()
    assert "blocks.0.layer_scalar" in model.state_dict()
    assert "blocks.0.layer_scalar" not in dict(model.named_parameters())  # not trained (HF: a buffer)
    x = torch.randn(1, 6, cfg.d_model)
    pos = torch.arange(6)
    block = model.blocks[1]
    with torch.no_grad():
        base = block(x, pos)
        block.layer_scalar.fill_(0.5)
        assert torch.allclose(block(x, pos), 0.5 * base)  # the residual stream included


# the card's figures: 31B "30.7B" (all of it), E2B / E4B "2.3B" / "4.5B effective" (without the per-layer
# embedding table; E4B's 4.64B is 3% above its card's rounded figure: stated in the preset's notes)
@pytest.mark.parametrize(
    "name, count, effective, card",
    [
        ("gemma-4-31b", 30_697_345_280, 30_697_345_280, 30.7e9),
        ("gemma-4-e2b", 4_628_569_344, 2_279_759_104, 2.3e9),
        ("gemma-4-e4b", 7_463_013_376, 4_644_441_088, None),
        ("gemma-4-26b-a4b", 25_233_141_760, 25_233_141_760, None),
    ],
)
def test_real_preset_count_equals_transformers(name, count, effective, card):
    """Each Gemma 4 preset at real scale: lmlab's count equals HF Gemma4ForCausalLM's on the same config
    (meta device); HF's KV-sharing modes put each shared layer's source where lmlab does."""
    transformers = pytest.importorskip("transformers")
    from lmlab.interop import hf as hfio
    from lmlab.presets import preset_config

    cfg = preset_config(name, "real")
    fam, hf = hfio.lmlab_to_hf_config(cfg)
    assert fam.model_type == "gemma4_text"
    hf_cfg = transformers.Gemma4TextConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        ref = transformers.Gemma4ForCausalLM(hf_cfg)
    theirs = sum(p.numel() for p in ref.parameters())
    counts = param_counts(cfg)
    assert counts["total"] == theirs == count
    assert counts["total"] - counts["ple_embedding"] == effective
    if card is not None:
        assert abs(effective / card - 1) < 0.01  # the card rounds to 0.1B
    # HF: a 'reuse' layer reads the states of the 'store' layer of its type (the last non-shared one)
    modes, types = hf_cfg.kv_sharing_modes, hf_cfg.layer_types
    store = {types[i]: i for i, m in enumerate(modes) if m == "store"}
    want = [store[types[i]] if m == "reuse" else None for i, m in enumerate(modes)]
    assert [cfg.layer_kv_source(i) for i in range(cfg.n_layers)] == want
    assert sum(m == "reuse" for m in modes) == cfg.kv_shared_layers
    if cfg.n_experts:  # 26B-A4B: the card's 3.8B active (its 26B total includes the vision encoder)
        assert abs(counts["active"] / 3.8e9 - 1) < 0.01


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("gemma4") / "hf"
    cfg = transformers.Gemma4TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        sliding_window=4,
        hidden_size_per_layer_input=0,
        layer_types=["sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    transformers.Gemma4ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(num_kv_shared_layers=2), ["num_kv_shared_layers=2", "0 to 1"]),
        (
            dict(enable_moe_block=True, num_experts=4, top_k_experts=None, moe_intermediate_size=8),
            ["top_k_experts=None", "enable_moe_block"],
        ),
        (dict(use_bidirectional_attention="all"), ["use_bidirectional_attention='all'"]),
        (dict(per_layer_config={"0": {"head_dim": 32}, "1": {"head_dim": 32}}), ["per_layer_config.0", "sliding"]),
        (dict(sliding_window=None), ["sliding_window=None"]),
        (dict(per_layer_config={"1": {"head_dim": None}}), ["per_layer_config.1.head_dim=None"]),
        (dict(per_layer_config={"9": {"head_dim": 32}}), ["per_layer_config.9", "0 to 1"]),
        (dict(attention_k_eq_v="yes"), ["attention_k_eq_v='yes'", "true or false"]),
        (
            dict(
                rope_parameters={
                    "sliding_attention": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                }
            ),
            ["rope_parameters.sliding_attention.rope_type='yarn'"],
        ),
    ],
)
def test_import_refuses_what_lmlab_cannot_represent(gemma4_dir, tmp_path, changes, words):
    import shutil

    from lmlab.interop import hf as hfio
    from lmlab.interop.registry import UnsupportedError

    src = tmp_path / "hf"
    shutil.copytree(gemma4_dir, src)
    data = json.loads((src / "config.json").read_text())
    data.update(changes)
    (src / "config.json").write_text(json.dumps(data))
    with pytest.raises(UnsupportedError) as err:
        hfio.import_hf(src, tmp_path / "run")
    for w in words:
        assert w in str(err.value)
    assert not (tmp_path / "run").exists()  # nothing half-written


SHARED = dict(
    SMALL, n_layers=6, kv_shared_layers=3, kv_shared_wide_ffn=True, ple_dim=8, ple_vocab_size=80, global_k_eq_v=False
)


def test_kv_sharing_and_per_layer_inputs():
    """The last 3 of 6 layers (L L G | L L G) read the keys and values of layers 1 (local) and 2 (global):
    queries only, double-wide FFNs, nothing in the KV cache; per-layer input embeddings add the gate,
    projection and norm; counts, cache bytes and cached decoding agree."""
    cfg = ModelConfig(**SHARED)
    assert [cfg.layer_kv_source(i) for i in range(6)] == [None, None, None, 1, 1, 2]
    model = TransformerLM(cfg).eval()
    H = cfg.n_heads
    for i, block in enumerate(model.blocks):
        glob = cfg.layer_window(i) is None
        D = 16 if glob else 8
        rows = H * D if i >= 3 else (H + 2 * (1 if glob else 2)) * D
        assert block.attn.qkv.weight.shape[0] == rows, i
        assert (block.attn.k_norm is None) == (i >= 3)
        assert block.mlp.d_ff == (2 * cfg.d_ff if i >= 3 else cfg.d_ff)
        assert block.ple.gate.weight.shape == (8, cfg.d_model)
    assert model.ple_embed.weight.shape == (80, 6 * 8)
    counts = param_counts(cfg)
    assert sum(p.numel() for p in model.parameters()) == counts["total"]
    assert model.num_params(non_embedding=True) == counts["non_embedding"]
    assert counts["ple_embedding"] == 80 * 6 * 8
    # only layers 0-2 cache: 2 local x (2 x 2 heads x 8) x min(20, 4) + 1 global x (2 x 1 x 16) x 20, fp32, batch 2
    check_cache_and_decoding(model, 2 * 4 * (2 * 2 * 2 * 8 * 4 + 2 * 1 * 16 * 20))
    # each consumer is linked to its source (which layer it reads is checked against HF in the parity test)
    assert [model.blocks[i].attn._kv_source for i in (3, 4, 5)] == [model.blocks[j].attn for j in (1, 1, 2)]
    assert "blocks.3.attn._kv_source.qkv.weight" not in model.state_dict()  # a link, not a submodule


def test_kv_sharing_trains_with_activation_checkpointing():
    """Gradients reach the source layers' key projections through their consumers, with activation
    checkpointing equal to without."""
    cfg = ModelConfig(**SHARED)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = TransformerLM(cfg).train()
        model.checkpoint_blocks = ckpt
        x = torch.randint(0, 64, (2, 12))
        loss, _ = model(x, targets=x)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_moe_block_beside_the_dense_ffn():
    """Gemma 4 26B-A4B's block: norm(norm1(FFN(n(x))) + norm2(MoE(n2(x)))) with the router reading the raw
    residual (weightless RMSNorm x a learned vector / sqrt(d)) and a learned scale per expert, by hand."""
    cfg = ModelConfig(
        **dict(
            SMALL,
            n_experts=4,
            experts_per_token=2,
            expert_d_ff=8,
            moe_beside_dense=True,
            router_input_norm=True,
            router_expert_scale=True,
        )
    )
    block = TransformerLM(cfg).blocks[0].eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.1 * torch.randn_like(p))
        x = torch.randn(1, 5, cfg.d_model)
        moe = block.moe
        # the routing by hand, on the raw x
        r = x[0] / x[0].pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt() * moe.router_scale / cfg.d_model**0.5
        probs = torch.softmax(r @ moe.router.weight.T, -1)
        w, e = probs.topk(2, -1)
        w = w / w.sum(-1, keepdim=True) * moe.expert_scale[e]
        h = block.moe_norm(x)[0]
        want = torch.stack([sum(w[t, j] * moe.experts[int(e[t, j])](h[t]) for j in range(2)) for t in range(5)])
        assert torch.allclose(moe(block.moe_norm(x), x)[0], want, atol=1e-6)
        # the block: attention as usual, then the two branches
        pos = torch.arange(5)
        mid = x + block.attn_out_norm(block.attn(block.attn_norm(x), pos))
        both = block.dense_out_norm(block.mlp(block.mlp_norm(mid))) + block.moe_out_norm(moe(block.moe_norm(mid), mid))
        assert torch.allclose(block(x, pos), (mid + block.mlp_out_norm(both)) * block.layer_scalar, atol=1e-6)
    counts = param_counts(cfg)
    assert sum(p.numel() for p in TransformerLM(cfg).parameters()) == counts["total"]
    with pytest.raises(ConfigError, match="moe_beside_dense=True"):
        ModelConfig(**dict(SMALL, norm_position="pre", n_experts=4, moe_beside_dense=True))


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(global_head_dim=25), ["global_head_dim=25 is odd"]),
        (dict(layer_pattern="L"), ["every layer is local", "layer_pattern='L'"]),
        (dict(nope_global_layers=True), ["global_rope_proportion=0.25", "nope_global_layers=True"]),
    ],
)
def test_global_layer_switches_refuse_what_would_not_take_effect(changes, words):
    """Found by a new-user trial: an odd global head (RoPE crashed), global_* fields with no global layer or
    next to NoPE global layers (silently moot) are refused."""
    with pytest.raises(ConfigError) as err:
        ModelConfig(**{**SMALL, **changes})
    for w in words:
        assert w in str(err.value)


def test_proportional_rope_turning_no_pair_imports_as_nope_global_layers(gemma4_dir, tmp_path):
    """partial_rotary_factor 0 (transformers: no pair turns) is NoPE on the full layers, not full RoPE; a
    factor of 0 and non-numbers are refused naming the field."""
    transformers = pytest.importorskip("transformers")
    import shutil

    from lmlab.interop import hf as hfio
    from lmlab.interop.registry import UnsupportedError

    def with_rope(name, full):
        src = tmp_path / name
        shutil.copytree(gemma4_dir, src)
        data = json.loads((src / "config.json").read_text())
        data["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": full,
        }
        (src / "config.json").write_text(json.dumps(data))
        return src

    src = with_rope("zero", {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.0})
    hfio.import_hf(src, tmp_path / "run")
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    assert cfg.nope_global_layers and cfg.global_rope_proportion is None
    ref = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    x = torch.randint(3, 64, (1, 12))
    with torch.no_grad():
        assert (model(x) - ref(input_ids=x).logits).abs().max() < 1e-4
    for name, full, field in (
        ("f0", {"rope_type": "proportional", "rope_theta": 1e6, "factor": 0.0}, "factor=0.0"),
        ("abc", {"rope_type": "proportional", "rope_theta": "abc"}, "rope_theta='abc'"),
    ):
        with pytest.raises(UnsupportedError, match=field):
            hfio.import_hf(with_rope(name, full), tmp_path / f"run_{name}")
