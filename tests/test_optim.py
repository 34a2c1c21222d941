"""Optimisers (lmlab.optim): which parameters Muon takes, its update against hand computations, the
schedule of its own lr, checkpoints that resume a Muon run bit for bit, and the refusals."""

import math

import pytest
import torch

from lmlab.checkpoint import load_run
from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM
from lmlab.optim import OptimizerPair, build_optimizer, muon_parameters, param_groups, set_lr
from lmlab.run_folder import CheckpointError, read_metrics_file
from lmlab.train import TrainConfig, Trainer

CPU = torch.device("cpu")


def small_model(**kw):
    return ModelConfig(
        **{**dict(vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2), **kw}
    )


def names_of(model, params):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for p in params}


@pytest.mark.parametrize("tie", [True, False])
def test_muon_takes_the_block_matrices_and_adamw_the_rest(tie):
    model = TransformerLM(small_model(bias="all", tie_embeddings=tie))
    muon = names_of(model, muon_parameters(model))
    assert muon == {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.out", "mlp.w_in", "mlp.w_out")
    }
    opt = build_optimizer(model, param_groups(model, TrainConfig(optimizer="muon")), TrainConfig(optimizer="muon"), CPU)
    adam = names_of(model, [p for g in opt.adamw.param_groups for p in g["params"]])
    assert adam.isdisjoint(muon) and "embed.weight" in adam and "final_norm.weight" in adam
    assert "blocks.0.attn.qkv.bias" in adam and ("lm_head.weight" in adam) == (not tie)
    assert len(adam) + len(muon) == len(list(model.parameters()))


def test_parameter_kinds_of_per_layer_inputs_and_positions():
    """Gemma 4's per-layer input table is an embedding (so wd_exclude=[embedding] spares it, as it
    does the token table); its projection is a weight, its norm a norm."""
    from lmlab.optim import param_kind

    kinds = {n: param_kind(n) for n, _ in TransformerLM(small_model(ple_dim=4)).named_parameters()}
    assert (kinds["ple_embed.weight"], kinds["ple_proj.weight"], kinds["ple_norm.weight"]) == (
        "embedding",
        "weight",
        "norm",
    )
    assert kinds["embed.weight"] == "embedding"
    model = TransformerLM(small_model(ple_dim=4))
    groups = param_groups(model, TrainConfig(wd_exclude=["embedding"]))
    assert names_of(model, groups[1]["params"]) == {"embed.weight", "ple_embed.weight"}


def test_one_step_matches_hand_computations():
    """From zero optimiser state, one step: AdamW moves each entry by lr * sign(grad) (its first update
    m / sqrt(v) = g / |g|) after the decoupled decay; Muon moves a matrix by lr * 0.2 * sqrt(max(rows,
    cols)) times an orthogonalised gradient: the singular vectors of the gradient, singular values
    near 1 (Newton-Schulz's quintic leaves them in about 0.5-1.5, Jordan et al. 2024)."""
    torch.manual_seed(0)
    model = TransformerLM(small_model(tie_embeddings=True))
    tc = TrainConfig(optimizer="muon", lr=1e-2, muon_lr=3e-2, weight_decay=0.1, eps=1e-30)
    opt = build_optimizer(model, param_groups(model, tc), tc, CPU)
    set_lr(opt, tc.lr, tc)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    after = dict(model.named_parameters())
    # AdamW: the embedding (decayed) and a norm gain (not decayed)
    for name, wd in (("embed.weight", 0.1), ("final_norm.weight", 0.0)):
        want = before[name] * (1 - tc.lr * wd) - tc.lr * torch.sign(grads[name])
        assert torch.allclose(after[name], want, atol=1e-6), name
    # Muon: the fused SwiGLU input projection (2 * d_ff x d_model)
    name = "blocks.1.mlp.w_in.weight"
    rows, cols = before[name].shape
    scale = tc.muon_lr * 0.2 * math.sqrt(max(rows, cols))
    update = (before[name] * (1 - tc.muon_lr * 0.1) - after[name].detach()) / scale
    u, s, vh = torch.linalg.svd(grads[name], full_matrices=False)
    inner = u.T @ update @ vh.T  # diagonal with the new singular values when the vectors are the gradient's
    diag = torch.diagonal(inner)
    off = inner - torch.diag(diag)
    assert 0.3 < float(diag.min()) and float(diag.max()) < 1.7
    assert float(off.abs().max()) < 0.05 * float(diag.abs().min())
    assert torch.linalg.matrix_rank(update.float()) == min(rows, cols)


def test_muon_lr_follows_the_schedule_with_its_own_peak():
    model = TransformerLM(small_model())
    tc = TrainConfig(optimizer="muon", lr=1e-3, muon_lr=4e-3)
    opt = build_optimizer(model, param_groups(model, tc), tc, CPU)
    set_lr(opt, 5e-4, tc)  # half the peak, e.g. during warmup
    assert [g["lr"] for g in opt.adamw.param_groups] == [5e-4, 5e-4]
    assert [g["lr"] for g in opt.muon.param_groups] == [pytest.approx(2e-3)]
    plain = build_optimizer(model, param_groups(model, TrainConfig()), TrainConfig(), CPU)
    assert isinstance(plain, torch.optim.AdamW) and not isinstance(plain, OptimizerPair)


def test_muon_run_trains_and_resumes_bit_for_bit(tmp_path, byte_data):
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
        optimizer="muon",
        muon_lr=6e-3,
        schedule="constant",
    )  # the same lr at each step whatever max_steps
    straight = Trainer.create(tmp_path / "straight", small_model(), TrainConfig(**base), byte_data, progress=False)
    first = straight.validate()["loss"]
    straight.fit()
    assert straight.validate()["loss"] < first - 0.5  # bytes: well below log(257) = 5.55 nats
    half = Trainer.create(
        tmp_path / "split", small_model(), TrainConfig(**{**base, "max_steps": 4}), byte_data, progress=False
    )
    half.fit()
    half.release_lock()
    resumed = Trainer.resume(tmp_path / "split", tc=TrainConfig(**base), progress=False)
    assert resumed.step == 4
    assert resumed.opt.muon.state and all("momentum_buffer" in s for s in resumed.opt.muon.state.values())
    resumed.fit()
    logged = read_metrics_file(tmp_path / "straight" / "metrics.jsonl")
    steps = [r for r in logged if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 9))  # log_interval 1
    # warmup 2 steps then constant: AdamW's lr and Muon's, each at its own peak, logged side by side
    assert [r["lr"] for r in steps[1:]] == pytest.approx([3e-3] * 7)
    assert [r["muon_lr"] for r in steps] == pytest.approx([r["lr"] * 2 for r in steps])
    a, *_ = load_run(tmp_path / "straight")
    b, *_ = load_run(tmp_path / "split")
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n


def test_optimizer_refusals(tmp_path, byte_data):
    with pytest.raises(ConfigError, match="optimizer='sgd'"):
        TrainConfig(optimizer="sgd")
    with pytest.raises(ConfigError, match="muon_lr=0.01 is set but optimizer='adamw'"):
        TrainConfig(muon_lr=0.01)
    with pytest.raises(ConfigError, match="muon_lr"):
        TrainConfig(optimizer="muon", muon_lr=-1.0)
    with pytest.raises(ConfigError, match="dtype=fp16"):
        TrainConfig(optimizer="muon", dtype="fp16")
    model = TransformerLM(small_model())
    tc = TrainConfig(optimizer="muon")
    with pytest.raises(ValueError, match="FSDP"):
        build_optimizer(model, param_groups(model, tc), tc, CPU, mode="fsdp")
    pair = build_optimizer(model, param_groups(model, tc), tc, CPU)
    adam_state = build_optimizer(model, param_groups(model, TrainConfig()), TrainConfig(), CPU).state_dict()
    with pytest.raises(ValueError, match="another optimizer"):
        pair.load_state_dict(adam_state)
    # a run's optimizer cannot change on resume: its checkpoints hold that optimizer's state
    tc = TrainConfig(
        batch_size=2, max_steps=2, eval_interval=2, eval_windows=2, device="cpu", tensorboard=False, optimizer="muon"
    )
    Trainer.create(tmp_path / "run", small_model(), tc, byte_data, progress=False).fit()
    with pytest.raises(CheckpointError, match="optimizer='adamw'.*trains with optimizer='muon'"):
        Trainer.resume(tmp_path / "run", tc=TrainConfig(**{**tc.__dict__, "optimizer": "adamw", "max_steps": 4}))


def test_resume_settings_refuse_another_optimizer_first():
    """`lmlab train --resume --set optimizer=adamw` on a Muon run that set muon_lr: the refusal names the
    optimizer change, not the muon_lr that the change leaves dangling."""
    from lmlab.runs import build_configs

    base = {"model": small_model().to_dict(), "train": {"optimizer": "muon", "muon_lr": 0.004}}
    with pytest.raises(ConfigError, match="optimizer='adamw': the resumed run trains with optimizer='muon'"):
        build_configs(sets=["optimizer=adamw"], base=base)
    _, tc = build_configs(sets=["max_steps=9"], base=base)
    assert tc.optimizer == "muon" and tc.muon_lr == 0.004
