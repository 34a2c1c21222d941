"""Multi-token prediction (lmlab/model/mtp.py; DeepSeek-V3 Sec. 2.2): off at inference, the main loss
unchanged, each depth's loss against a position-by-position computation, counts, training and refusals."""

import json

import pytest
import torch
import torch.nn.functional as F

from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM
from lmlab.param_counts import param_counts

BASE = dict(vocab_size=64, context_length=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)


def pair(**kw):
    """(a model with 2 MTP modules, the same weights without them)."""
    torch.manual_seed(0)
    with_mtp = TransformerLM(ModelConfig(**BASE, mtp_depth=2, **kw))
    plain = TransformerLM(ModelConfig(**BASE, **kw))
    plain.load_state_dict({k: v for k, v in with_mtp.state_dict().items() if not k.startswith("mtp.")})
    return with_mtp, plain


def test_mtp_is_off_at_inference_and_leaves_the_main_loss_alone():
    m, plain = pair()
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    m.eval(), plain.eval()
    with torch.no_grad():
        assert torch.equal(m(idx), plain(idx))
        assert torch.equal(m(idx, targets=targets)[0], plain(idx, targets=targets)[0])  # validation: no MTP
    m.train(), plain.train()
    loss, ce = m(idx, targets=targets)
    ref_loss, ref_ce = plain(idx, targets=targets)
    assert torch.equal(ce, ref_ce) and len(m.mtp_last) == 2
    assert torch.allclose(loss, ref_loss + 0.3 / 2 * sum(m.mtp_last), atol=1e-6)  # lambda / D x sum of depths


def test_each_depth_by_hand():
    """Depth k at position i: h'_i = M_k [norm(h^{k-1}_i); norm(Emb(t_{i+k}))], a causal block over the
    positions 0..T-k-1, then the shared head after the module's norm; cross-entropy against t_{i+k+1}.
    Written position by position from the module's parts, with materialised logits."""
    torch.manual_seed(0)
    m = TransformerLM(ModelConfig(**BASE, mtp_depth=2, tie_embeddings=False)).train()
    T = 10
    seq = torch.randint(0, 64, (2, T + 1), generator=torch.Generator().manual_seed(3))
    idx, targets = seq[:, :T], seq[:, 1:].clone()
    targets[0, 7] = -100  # an unscored target is left out of every depth that reaches it
    m(idx, targets=targets)
    h = m.hidden(idx, final=False)  # h^0: the last block's output, before the final norm
    for k, module in enumerate(m.mtp, start=1):
        S = T - k
        rows = [
            module.proj(torch.cat([module.hnorm(h[:, i]), module.enorm(m.embed(seq[:, i + k]))], -1)) for i in range(S)
        ]
        h = module.block(torch.stack(rows, 1), torch.arange(S))
        logits = module.out_norm(h) @ m.lm_head.weight.T
        want = F.cross_entropy(logits.reshape(-1, 64), targets[:, k : k + S].reshape(-1), ignore_index=-100)
        assert float(m.mtp_last[k - 1]) == pytest.approx(float(want.detach()), rel=1e-5)


def test_mtp_parameters_are_counted():
    cfg = ModelConfig(**BASE, mtp_depth=2, sliding_window=4, layer_pattern="LG", bias="attention")
    p = param_counts(cfg)
    model = TransformerLM(cfg)
    assert p["total"] == model.num_params()
    assert p["mtp"] == sum(x.numel() for n, x in model.named_parameters() if n.startswith("mtp."))
    d = 32
    assert p["mtp"] == 2 * (3 * d + 2 * d * d + p["per_layer"]["total"])  # RMSNorms of d, the projection, a block


def test_a_run_with_mtp_trains_and_logs_each_depth(tmp_path, byte_data):
    from lmlab.train import TrainConfig, Trainer

    cfg = ModelConfig(vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=4, mtp_depth=2, mtp_weight=0.5)
    tc = TrainConfig(
        batch_size=8,
        max_steps=30,
        lr=3e-3,
        warmup_steps=3,
        eval_interval=30,
        eval_windows=2,
        log_interval=1,
        device="cpu",
        tensorboard=False,
    )
    Trainer.create(tmp_path / "run", cfg, tc, byte_data, progress=False).fit()
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "mtp_loss" in r]
    assert len(steps) == 30 and all(len(r["mtp_loss"]) == 2 for r in steps)
    first, last = steps[0]["mtp_loss"], steps[-1]["mtp_loss"]
    assert all(b < a - 0.5 for a, b in zip(first, last))  # both depths learn
    assert last[1] > last[0] - 0.05  # two tokens ahead is no easier than one


def test_export_writes_the_main_model_and_says_what_it_leaves_out(tmp_path, byte_data, capsys):
    """An MTP run exports as its main model (the logits are the same in transformers) and the command says
    the modules were not written."""
    transformers = pytest.importorskip("transformers")
    from lmlab.cli import main
    from lmlab.interop.hf import load_run_model
    from lmlab.train import TrainConfig, Trainer

    cfg = ModelConfig(
        vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=4, mtp_depth=1, tie_embeddings=False
    )
    tc = TrainConfig(
        batch_size=4,
        max_steps=2,
        lr=3e-3,
        warmup_steps=1,
        eval_interval=2,
        eval_windows=2,
        device="cpu",
        tensorboard=False,
    )
    Trainer.create(tmp_path / "run", cfg, tc, byte_data, progress=False).fit()
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert "note: not written: the 1 multi-token prediction module(s)" in capsys.readouterr().out
    model, _, _, _ = load_run_model(tmp_path / "run")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.randint(0, 257, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(hf(x).logits, model.eval()(x), atol=1e-4)


def test_mtp_refusals():
    with pytest.raises(ConfigError, match="mtp_depth=-1"):
        ModelConfig(**BASE, mtp_depth=-1)
    with pytest.raises(ConfigError, match="position='learned'"):
        ModelConfig(**BASE, mtp_depth=1, position="learned")
    with pytest.raises(ConfigError, match="mtp_weight"):
        ModelConfig(**BASE, mtp_depth=1, mtp_weight=-0.1)


def test_mtp_modules_with_moe_blocks():
    """DeepSeek-V3's MTP module is an MoE layer: a module built like an MoE last layer has the experts; the
    MoE losses average over the main and the modules' MoE layers in training (only the main ones at
    evaluation); the auxiliary-loss-free bias moves in the modules too; counts equal the model's."""
    from lmlab.analysis import analyze
    from lmlab.model.moe import MoEFeedForward

    cfg = ModelConfig(
        **BASE,
        mtp_depth=1,
        n_experts=4,
        experts_per_token=2,
        moe_aux_loss=0.01,
        moe_balance="both",
        moe_bias_update_rate=0.1,
    )
    torch.manual_seed(0)
    m = TransformerLM(cfg).train()
    assert isinstance(m.mtp[0].block.mlp, MoEFeedForward) and len(m.moe_layers(mtp=True)) == 3
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    loss, ce = m(idx, targets=targets)
    balance = torch.stack([layer.aux[0] for layer in m.moe_layers(mtp=True)]).mean()  # the 3 layers' last forward
    assert torch.allclose(loss, ce + 0.01 * balance + 0.3 * m.mtp_last[0], atol=1e-6)
    main_only = torch.stack([layer.aux[0] for layer in m.moe_layers()]).mean()
    assert not torch.allclose(balance, main_only)  # the module's layer weighs in
    m.eval()
    with torch.no_grad():  # evaluation: no module runs, the main MoE layers' losses alone
        loss_e, ce_e = m(idx, targets=targets)
        assert torch.allclose(loss_e, ce_e + 0.01 * torch.stack([x.aux[0] for x in m.moe_layers()]).mean(), atol=1e-6)
    m.train()
    loss.backward()
    m.update_moe_bias()
    assert m.mtp[0].block.mlp.expert_bias.abs().sum() > 0  # the module's load moved its bias
    res = analyze(cfg)
    assert res["instantiated"]["equal"] and res["params"]["mtp"] > 0
    assert res["params"]["active"] < res["params"]["total"] - res["params"]["mtp"]  # active: main model, k experts
