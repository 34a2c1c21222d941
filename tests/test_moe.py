"""Mixture-of-experts FFN (lmlab/model/moe.py): exact against the dense FFN and a per-token loop,
the router and its auxiliary losses against a hand computation, cached decoding, training, counts."""

import math

import pytest
import torch

from lmlab.analysis import analyze
from lmlab.config import ConfigError, ModelConfig
from lmlab.generate import generate
from lmlab.model import TransformerLM
from lmlab.model.ffn import FeedForward
from lmlab.model.moe import MoEFeedForward

BASE = dict(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4)


def test_one_expert_top_1_is_the_dense_ffn_bit_for_bit():
    cfg = ModelConfig(**BASE, n_experts=1, experts_per_token=1)
    torch.manual_seed(0)
    moe, dense = MoEFeedForward(cfg), FeedForward(cfg)
    moe.experts[0].load_state_dict(dense.state_dict())
    x = torch.randn(3, 7, 32)
    assert torch.equal(moe(x), dense(x))


def naive(moe: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Token by token: sum over its top-k experts of weight x expert(x), plus the shared FFN."""
    flat = x.reshape(-1, x.shape[-1])
    w, idx, _, _ = moe.route(flat)
    rows = []
    for t in range(flat.shape[0]):
        if moe.weights_input:  # Llama 4: the expert sees the token times its weight
            y = sum(moe.experts[int(idx[t, j])](w[t, j] * flat[t : t + 1])[0] for j in range(moe.k))
        else:
            y = sum(w[t, j] * moe.experts[int(idx[t, j])](flat[t : t + 1])[0] for j in range(moe.k))
        rows.append(y + (moe.shared(flat[t : t + 1])[0] if moe.shared is not None else 0))
    return torch.stack(rows).reshape(x.shape)


@pytest.mark.parametrize(
    "over",
    [
        dict(n_experts=4, experts_per_token=2),
        dict(
            n_experts=5,
            experts_per_token=3,
            n_shared_experts=2,
            expert_d_ff=24,
            router_score="sigmoid",
            router_renormalize=False,
        ),
        dict(
            n_experts=4,
            experts_per_token=2,
            n_shared_experts=1,
            router_score="sigmoid",
            router_renormalize=False,
            router_weights="input",
        ),
    ],
)
def test_dispatch_equals_the_per_token_loop_and_keeps_every_token(over):
    cfg = ModelConfig(**BASE, **over)
    torch.manual_seed(1)
    moe = MoEFeedForward(cfg)
    x = torch.randn(2, 9, 32)
    assert torch.allclose(moe(x), naive(moe, x), atol=1e-6)
    assert int(moe.tokens_per_expert.sum()) == 18 * cfg.experts_per_token  # every (token, slot) once
    with torch.no_grad():  # every token's first choice is expert 0: still no token dropped
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0
    x = torch.rand(2, 9, 32) + 0.1  # positive: expert 0's logit is the largest for every token
    assert torch.allclose(moe(x), naive(moe, x), atol=1e-6)
    assert int(moe.tokens_per_expert[0]) == 18


def test_llama4_router_weights_scale_the_expert_input():
    """router_weights='input' (HF Llama4TextMoe): one expert, top-1, sigmoid score s of its logit: the
    output is FFN(s x), not s FFN(x) (they differ: the FFN is not linear)."""
    cfg = ModelConfig(
        **BASE,
        n_experts=1,
        experts_per_token=1,
        router_score="sigmoid",
        router_renormalize=False,
        router_weights="input",
    )
    torch.manual_seed(0)
    moe, dense = MoEFeedForward(cfg), FeedForward(cfg)
    moe.experts[0].load_state_dict(dense.state_dict())
    x = torch.randn(5, 32)
    s = torch.sigmoid(moe.router(x))  # (5, 1)
    assert torch.allclose(moe(x), dense(s * x), atol=1e-6)
    assert not torch.allclose(moe(x), s * dense(x), atol=1e-3)


def test_group_limited_routing_and_scaling_by_hand():
    """DeepSeek-V2's group-limited routing: 4 experts in 2 groups, the best group kept, top-2 within it,
    weights x routed_scaling_factor. Softmax scores of logits (3, 0, 2.5, 2.4): group {0, 1} is best (3),
    so experts 0 and 1 are chosen although expert 2 outscores 1 (plain top-2 takes 0 and 2)."""
    cfg = ModelConfig(
        **dict(BASE, d_model=4, n_heads=1),
        n_experts=4,
        experts_per_token=2,
        router_groups=2,
        router_topk_groups=1,
        routed_scaling_factor=2.0,
        router_renormalize=False,
    )
    moe = MoEFeedForward(cfg)
    logits = torch.tensor([3.0, 0.0, 2.5, 2.4])
    with torch.no_grad():  # x = e_0, so the logits are the router weight's first column
        moe.router.weight.zero_()
        moe.router.weight[:, 0] = logits
    w, idx, probs, _ = moe.route(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    p = torch.softmax(logits, -1)
    assert sorted(idx[0].tolist()) == [0, 1]
    assert torch.allclose(w[0].sort().values, (2.0 * p[[1, 0]]).sort().values)
    assert torch.allclose(probs[0], p)  # the aux loss sees the unmasked scores
    plain = MoEFeedForward(
        ModelConfig(**dict(BASE, d_model=4, n_heads=1), n_experts=4, experts_per_token=2, router_renormalize=False)
    )
    plain.router.load_state_dict(moe.router.state_dict())
    assert sorted(plain.route(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))[1][0].tolist()) == [0, 2]
    with pytest.raises(ConfigError, match="router_topk_groups=3 exceeds router_groups=2"):
        ModelConfig(**BASE, n_experts=4, router_groups=2, router_topk_groups=3)
    with pytest.raises(ConfigError, match="not a multiple of router_groups=3"):
        ModelConfig(**BASE, n_experts=4, router_groups=3)


def test_router_and_auxiliary_losses_by_hand():
    """4 tokens, 3 experts, top-2 softmax with renormalisation: logits fixed through the router weights."""
    cfg = ModelConfig(**dict(BASE, d_model=4, n_heads=1), n_experts=3, experts_per_token=2)
    moe = MoEFeedForward(cfg)
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 4.0], [0.5, 0.0, 0.0]])
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, :3] = torch.eye(3)  # x = [logits, 0] -> router(x) = logits
    x = torch.cat([logits, torch.zeros(4, 1)], 1)
    w, idx, probs, got_logits = moe.route(x)
    assert torch.equal(got_logits, logits)
    e = [[math.exp(v) for v in row] for row in logits.tolist()]
    p = [[v / sum(row) for v in row] for row in e]
    top = [sorted(range(3), key=lambda j: -p[t][j])[:2] for t in range(4)]
    assert idx.tolist() == top
    want_w = [[p[t][j] / (p[t][top[t][0]] + p[t][top[t][1]]) for j in top[t]] for t in range(4)]
    assert torch.allclose(w, torch.tensor(want_w), atol=1e-6)
    moe(x[None])
    f = [sum(j in top[t] for t in range(4)) / 4 for j in range(3)]  # fraction of tokens per expert
    P = [sum(p[t][j] for t in range(4)) / 4 for j in range(3)]
    balance = 3 * sum(fj * pj for fj, pj in zip(f, P))
    router_z = sum(math.log(sum(row)) ** 2 for row in e) / 4
    assert math.isclose(float(moe.aux[0].detach()), balance, rel_tol=1e-6)
    assert math.isclose(float(moe.aux[1].detach()), router_z, rel_tol=1e-6)


def test_aux_losses_enter_the_training_loss_and_decode_matches_the_forward():
    cfg = ModelConfig(
        **dict(BASE, n_layers=3),
        n_experts=4,
        experts_per_token=2,
        moe_aux_loss=0.02,
        moe_router_z_loss=0.001,
        moe_first_dense=1,
    )
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    assert [type(b.mlp).__name__ for b in model.blocks] == ["FeedForward", "MoEFeedForward", "MoEFeedForward"]
    x = torch.randint(0, 64, (2, 16))
    loss, ce = model(x, targets=x, reduction="sum")
    aux = [m.aux for m in model.moe_layers()]
    want = 0.02 * (aux[0][0] + aux[1][0]) / 2 + 0.001 * (aux[0][1] + aux[1][1]) / 2
    assert math.isclose(float(loss - ce), 32 * float(want), rel_tol=1e-4)
    loss.backward()
    assert model.blocks[1].mlp.router.weight.grad.abs().sum() > 0  # the router learns through both paths
    prompt = [1, 2, 3, 4]
    toks = list(generate(model, prompt, 8, temperature=0.0))
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(8):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert toks == seq[4:]


def test_counts_total_and_active_and_config_errors():
    cfg = ModelConfig(
        **dict(BASE, n_layers=4),
        n_experts=8,
        experts_per_token=2,
        n_shared_experts=1,
        expert_d_ff=16,
        moe_first_dense=1,
        moe_pattern="DM",
    )
    res = analyze(cfg)
    assert res["instantiated"]["equal"]
    p = res["params"]
    expert = 3 * 32 * 16  # SwiGLU: gate, up, down
    assert p["moe_layers"] == 1  # layers 0 (dense), 1 (D), 2 (M), 3 (D)
    assert p["total"] - p["active"] == 6 * expert  # 8 experts stored, 2 used
    assert p["matmul"] < p["total"]
    with pytest.raises(ConfigError, match="experts_per_token=3 exceeds n_experts=2"):
        ModelConfig(**BASE, n_experts=2, experts_per_token=3)
    with pytest.raises(ConfigError, match="no layer is MoE"):
        ModelConfig(**BASE, n_experts=2, moe_first_dense=2)
    with pytest.raises(ConfigError, match="router_score='relu' is not valid"):
        ModelConfig(**BASE, n_experts=2, router_score="relu")


def test_a_moe_model_trains_and_logs_its_router(tmp_path, byte_data):
    import json

    from lmlab.train import TrainConfig, Trainer

    cfg = ModelConfig(
        vocab_size=257,
        context_length=64,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_experts=4,
        experts_per_token=2,
        moe_aux_loss=0.02,
        moe_router_z_loss=0.001,
    )
    tc = TrainConfig(
        batch_size=8,
        max_steps=40,
        lr=3e-3,
        warmup_steps=5,
        eval_interval=40,
        eval_windows=4,
        log_interval=10,
        device="cpu",
    )
    trainer = Trainer.create(tmp_path / "run", cfg, tc, byte_data, progress=False)
    trainer.fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in lines if "moe_balance" in r]
    assert logged and logged[-1]["loss"] < min(logged[0]["loss"] - 0.3, math.log(257) - 1.5)
    for r in logged:  # balanced top-2 routing gives 2; all on one expert 8; the busiest share >= 1/4
        assert 2.0 - 1e-4 <= r["moe_balance"] <= 8.0 and r["moe_router_z"] >= 0 and 0.25 <= r["moe_max_load"] <= 1.0


def test_a_moe_model_exports_only_as_mixtral():
    from lmlab.interop.hf import lmlab_to_hf_config
    from lmlab.interop.registry import UnsupportedError

    fam, hf = lmlab_to_hf_config(ModelConfig(**BASE, n_experts=4, tie_embeddings=False))
    assert fam.model_type == "mixtral" and (hf["num_local_experts"], hf["num_experts_per_tok"]) == (4, 2)
    shared = ModelConfig(**BASE, n_experts=4, n_shared_experts=1, tie_embeddings=False)  # no family has both
    with pytest.raises(UnsupportedError, match=r"llama: moe=\(4, 2, 1"):
        lmlab_to_hf_config(shared)
    assert lmlab_to_hf_config(ModelConfig(**BASE, tie_embeddings=False))[0].model_type == "llama"


# --- auxiliary-loss-free balancing and the sequence-wise loss (DeepSeek-V3; issue 45) ------------------


def _skewed(moe_balance="aux_free", noise: float = 0.0, **kw) -> MoEFeedForward:
    """4 experts, top-1, a router that sends every token to expert 0 unless a bias intervenes (with
    ``noise``, the other experts' logits differ from token to token)."""
    cfg = ModelConfig(
        **{
            **BASE,
            "n_experts": 4,
            "experts_per_token": 1,
            "moe_balance": moe_balance,
            "moe_bias_update_rate": 0.01,
            **kw,
        }
    )
    torch.manual_seed(0)
    moe = MoEFeedForward(cfg).train()
    with torch.no_grad():
        moe.router.weight.normal_(0.0, noise) if noise else moe.router.weight.zero_()
        moe.router.weight[0, 0] = 1.0 if not noise else 3.0  # logit of expert 0 = x_0 (x 3), the others small
    return moe


def test_the_bias_picks_the_experts_but_not_their_weights():
    moe = _skewed(router_renormalize=False)
    x = torch.randn(1, 8, 32)
    x[..., 0] = 3.0  # expert 0's logit 3: softmax scores (e^3, 1, 1, 1) / (e^3 + 3)
    w, e, _, _ = moe.route(x.reshape(-1, 32))
    assert (e == 0).all()
    with torch.no_grad():
        moe.expert_bias.copy_(torch.tensor([0.0, 0.0, 1.0, 0.0]))  # 1/(e^3+3) + 1 > e^3/(e^3+3)
    w, e, _, _ = moe.route(x.reshape(-1, 32))
    assert (e == 2).all()
    assert torch.allclose(w, torch.full_like(w, 1 / (math.exp(3) + 3)))  # the unbiased score of expert 2


def test_bias_update_by_hand_and_towards_balance():
    """DeepSeek-V3's sigmoid scores, 32 tokens, top-1, expert 0 favoured: the loads by hand (argmax of
    sigmoid(W x)), then one update b = 0.01 x sign(mean load - load); repeated steps on the same router
    spread the tokens (the busiest share falls from 21/32 to at most 0.3) with the weights unchanged; with
    moe_balance='aux_loss' nothing moves."""
    moe = _skewed(noise=0.5, router_score="sigmoid")
    with torch.no_grad():
        moe.router.weight[0, 0] = 1.0
    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(1))
    x[..., 0] = 3.0 + torch.rand(4, 8, generator=torch.Generator().manual_seed(2))
    by_hand = torch.bincount(torch.sigmoid(x.reshape(-1, 32) @ moe.router.weight.T).argmax(-1), minlength=4)
    moe(x)
    assert moe.load.tolist() == by_hand.float().tolist() == [21.0, 3.0, 7.0, 1.0]
    moe.update_bias()
    assert moe.expert_bias.tolist() == pytest.approx([-0.01, 0.01, 0.01, 0.01]) and moe.load.sum() == 0
    router = moe.router.weight.clone()
    for _ in range(300):
        moe(x)
        moe.update_bias()
    moe(x)
    assert float(moe.tokens_per_expert.max()) / 32 <= 0.3 and torch.equal(moe.router.weight, router)
    moe.load.zero_()
    with torch.no_grad():  # evaluation counts nothing
        moe.eval()(x)
    assert moe.load.sum() == 0
    plain = _skewed("aux_loss")
    assert plain.expert_bias is None and "expert_bias" not in plain.state_dict()
    plain(x)
    plain.update_bias()  # a no-op


def test_sequence_wise_balance_loss_by_hand():
    """DeepSeek-V3 eqs. 17-20 on 2 sequences of 2 tokens, 2 experts, top-1: f_e = E / (k T) x tokens of the
    sequence on e; P_e = the mean normalised score; loss = mean over sequences of sum_e f_e P_e."""
    cfg = ModelConfig(**{**BASE, "n_experts": 2, "experts_per_token": 1})
    moe = MoEFeedForward(cfg)
    experts = torch.tensor([[0], [0], [0], [1]])
    probs = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.6, 0.4], [0.2, 0.8]])
    # sequence 1: f = (2, 0) x 2/2 -> (2, 0); P = (0.8, 0.2): 1.6. sequence 2: f = (1, 1); P = (0.4, 0.6): 1.0
    assert float(moe.sequence_balance(experts, probs, 2)) == pytest.approx((1.6 + 1.0) / 2)


def test_aux_free_bias_is_saved_and_a_run_resumes_bit_for_bit(tmp_path, byte_data):
    """The bias is model state: a run stopped at step 4 and resumed ends with the same bias and weights as
    one trained straight to 8 (the bias moved: its spread is logged), with the sequence-wise loss on."""
    import json

    from lmlab.checkpoint import load_run
    from lmlab.train import TrainConfig, Trainer

    cfg = ModelConfig(
        vocab_size=257,
        context_length=32,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_experts=4,
        experts_per_token=2,
        moe_balance="aux_free",
        moe_bias_update_rate=0.01,
        moe_seq_aux_loss=0.01,
    )
    base = dict(
        batch_size=4,
        max_steps=8,
        lr=3e-3,
        warmup_steps=2,
        eval_interval=8,
        eval_windows=2,
        log_interval=1,
        device="cpu",
        tensorboard=False,
        schedule="constant",
    )
    straight = Trainer.create(tmp_path / "straight", cfg, TrainConfig(**base), byte_data, progress=False)
    straight.fit()
    half = Trainer.create(tmp_path / "split", cfg, TrainConfig(**{**base, "max_steps": 4}), byte_data, progress=False)
    half.fit()
    half.release_lock()
    Trainer.resume(tmp_path / "split", tc=TrainConfig(**base), progress=False).fit()
    a, *_ = load_run(tmp_path / "straight")
    b, *_ = load_run(tmp_path / "split")
    sa, sb = a.state_dict(), b.state_dict()
    assert "blocks.0.mlp.expert_bias" in sa and sa["blocks.0.mlp.expert_bias"].abs().max() > 0
    for n in sa:
        assert torch.equal(sa[n], sb[n]), n
    logged = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in logged if "moe_bias_range" in r]
    assert len(logged) == 8 and logged[-1]["moe_bias_range"] > 0 and all(r["moe_seq_balance"] > 0 for r in logged)


def test_balance_settings_refused():
    with pytest.raises(ConfigError, match="moe_balance='aux'"):
        ModelConfig(**BASE, n_experts=4, moe_balance="aux")
    with pytest.raises(ConfigError, match="moe_aux_loss=0.01; set moe_aux_loss=0"):
        ModelConfig(**BASE, n_experts=4, moe_balance="aux_free", moe_aux_loss=0.01)
    with pytest.raises(ConfigError, match="moe_balance='both' adds"):
        ModelConfig(**BASE, n_experts=4, moe_balance="both")
    with pytest.raises(ConfigError, match="moe_bias_update_rate"):
        ModelConfig(**BASE, n_experts=4, moe_balance="aux_free", moe_bias_update_rate=-0.1)
    from lmlab.interop.hf import lmlab_to_hf_config
    from lmlab.interop.registry import UnsupportedError

    with pytest.raises(UnsupportedError, match="mixtral: moe="):  # no converted family has the routing bias
        lmlab_to_hf_config(ModelConfig(**BASE, n_experts=4, tie_embeddings=False, moe_balance="aux_free"))
