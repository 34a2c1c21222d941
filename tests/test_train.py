"""Training loop, schedule, weight-decay groups and checkpoints."""

import json

import pytest
import torch

from lmlab.checkpoint import CheckpointError, checkpoint_dirs, load_run
from lmlab.config import ConfigError, ModelConfig
from lmlab.data.prepare import prepare
from lmlab.model import TransformerLM
from lmlab.train import TrainConfig, Trainer, lr_at, param_groups


@pytest.fixture(scope="module")
def byte_data(tmp_path_factory, small_corpus):
    out = tmp_path_factory.mktemp("data") / "bytes"
    prepare(small_corpus, out, "bytes", val_docs=["tempest_gut.txt"])
    return out


def small_model(**kw):
    return ModelConfig(**{**dict(vocab_size=257, context_length=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2), **kw})


def test_short_training_run_lowers_loss(tmp_path, byte_data):
    tc = TrainConfig(batch_size=8, max_steps=60, lr=3e-3, warmup_steps=10, eval_interval=30, eval_windows=8,
                     log_interval=10, device="cpu")
    trainer = Trainer.create(tmp_path / "run", small_model(), tc, byte_data, progress=False)
    before = trainer.validate()["loss"]
    after = trainer.fit()["loss"]
    assert before == pytest.approx(torch.log(torch.tensor(257.0)).item(), abs=0.3)  # uniform at init
    assert after < before - 1.5  # bytes of English: well below log(257) = 5.55 nats after 60 steps
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_losses = [r["loss"] for r in lines if "loss" in r]
    assert train_losses[-1] < train_losses[0]
    assert all(r["tokens_per_s"] > 0 for r in lines if "loss" in r)
    # MFU = model FLOPs per token (6N + attention, lmlab.analysis) x tokens/s / the device's peak
    from lmlab.analysis import DEVICES, flops_per_token

    fpt = flops_per_token(trainer.cfg, 64, training=True)
    assert all(r["mfu"] == pytest.approx(fpt * r["tokens_per_s"] / DEVICES["cpu"].peak_flops) for r in lines if "loss" in r)
    # the final checkpoint reproduces the trained model exactly
    model, cfg, tok, run, ckpt = load_run(tmp_path / "run")
    x = torch.randint(0, 257, (2, 64))
    trainer.model.eval()
    assert torch.equal(model(x), trainer.model(x))
    assert ckpt.name == "step_0000060" and cfg == trainer.cfg


def test_lr_schedule():
    tc = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert lr_at(0, tc) == pytest.approx(1e-4)
    assert lr_at(9, tc) == pytest.approx(1e-3)
    assert lr_at(60, tc) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way down the cosine
    assert lr_at(110, tc) == pytest.approx(1e-4)
    assert lr_at(10, TrainConfig(lr=2e-3, warmup_steps=10, schedule="constant")) == 2e-3


def test_weight_decay_groups():
    model = TransformerLM(small_model(bias="all", tie_embeddings=False))
    decay, no_decay = param_groups(model, TrainConfig(wd_exclude=["norm", "bias"]))
    names = {id(p): n for n, p in model.named_parameters()}
    d = {names[id(p)] for p in decay["params"]}
    nd = {names[id(p)] for p in no_decay["params"]}
    assert "embed.weight" in d and "lm_head.weight" in d and "blocks.0.attn.qkv.weight" in d
    assert "blocks.0.attn_norm.weight" in nd and "blocks.0.attn.qkv.bias" in nd and "final_norm.weight" in nd
    assert len(d) + len(nd) == len(list(model.parameters()))
    _, nd2 = param_groups(model, TrainConfig(wd_exclude=["embedding"]))
    assert {names[id(p)] for p in nd2["params"]} == {"embed.weight"}


def test_train_config_validation():
    with pytest.raises(ConfigError, match="lr=-1"):
        TrainConfig(lr=-1)
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        TrainConfig.from_dict({"max_step": 3})
    with pytest.raises(ConfigError, match="wd_exclude"):
        TrainConfig(wd_exclude=["norms"])


def test_existing_run_refused_and_resume_rules(tmp_path, byte_data):
    tc = TrainConfig(batch_size=2, max_steps=4, eval_interval=4, eval_windows=2, device="cpu", checkpoint_interval=2)
    Trainer.create(tmp_path / "run", small_model(), tc, byte_data, progress=False).fit()
    before = (tmp_path / "run" / "run.yaml").read_text()
    with pytest.raises(CheckpointError, match="already holds a run"):
        Trainer.create(tmp_path / "run", small_model(), tc, byte_data, progress=False)
    assert (tmp_path / "run" / "run.yaml").read_text() == before
    with pytest.raises(CheckpointError, match="d_model: run has 64, asked 32"):
        Trainer.resume(tmp_path / "run", small_model(d_model=32))
    # resuming with a longer schedule continues from step 4
    t = Trainer.resume(tmp_path / "run", tc=TrainConfig(**{**tc.__dict__, "max_steps": 6}), progress=False)
    assert t.step == 4
    t.fit()
    assert [p.name for p in checkpoint_dirs(tmp_path / "run")] == ["step_0000004", "step_0000006"]


def test_truncated_checkpoint_is_refused(tmp_path, byte_data):
    tc = TrainConfig(batch_size=2, max_steps=2, eval_interval=2, eval_windows=2, device="cpu")
    Trainer.create(tmp_path / "run", small_model(), tc, byte_data, progress=False).fit()
    path = checkpoint_dirs(tmp_path / "run")[-1] / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="unreadable"):
        load_run(tmp_path / "run")


def test_vocab_mismatch_refused(tmp_path, byte_data):
    with pytest.raises(ConfigError, match="vocab_size=300 does not match"):
        Trainer.create(tmp_path / "run", small_model(vocab_size=300), TrainConfig(), byte_data)
    assert not (tmp_path / "run").exists()
