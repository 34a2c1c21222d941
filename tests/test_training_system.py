"""The training system: exact resume after SIGKILL, gradient accumulation, schedules, stability
diagnostics and the non-finite guard, precision, compile, checkpoint write failures."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from lmlab.config import ConfigError, ModelConfig
from lmlab.diagnostics import forward_diagnostics
from lmlab.run_folder import CheckpointError, checkpoint_dirs
from lmlab.schedule import lr_at
from lmlab.train import TrainConfig, Trainer


def tiny_cfg(**kw):
    return ModelConfig(
        **{**dict(vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2), **kw}
    )


def losses(run) -> dict:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = r["loss"]
    return out


def test_sigkill_then_same_command_reproduces_losses_exactly(tmp_path, corpus_bytes):
    sets = [
        "d_model=32",
        "n_layers=2",
        "n_heads=4",
        "n_kv_heads=2",
        "context_length=32",
        "batch_size=4",
        "max_steps=40",
        "checkpoint_interval=5",
        "log_interval=1",
        "eval_interval=100",
        "eval_windows=2",
        "device=cpu",
        "resid_dropout=0.1",
        "attn_dropout=0.1",
        "warmup_steps=5",
        "tensorboard=false",
    ]
    args = ["train", "--data", str(corpus_bytes), "--no-progress"] + [a for s in sets for a in ("--set", s)]
    cmd = lambda out: [sys.executable, "-m", "lmlab.cli", *args, "--out", str(out)]  # noqa: E731
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd(tmp_path / "straight"), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(cmd(tmp_path / "killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "killed" / "checkpoints" / "step_0000015").exists():
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = checkpoint_dirs(tmp_path / "killed")
    assert done and done[-1].name != "step_0000040", "the run finished before it could be killed"
    out = subprocess.run(cmd(tmp_path / "killed"), env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "resuming" in out.stderr
    a, b = losses(tmp_path / "straight"), losses(tmp_path / "killed")
    assert sorted(a) == sorted(b) == list(range(1, 41))
    assert a == b  # bit-identical per-step losses


def test_grad_accumulation_equals_large_batch(tmp_path, corpus_bytes):
    common = dict(max_steps=1, lr=1e-2, warmup_steps=0, device="cpu", eval_interval=10, tensorboard=False, dtype="fp32")
    big = Trainer.create(
        tmp_path / "big", tiny_cfg(), TrainConfig(batch_size=8, grad_accum=1, **common), corpus_bytes, progress=False
    )
    acc = Trainer.create(
        tmp_path / "acc", tiny_cfg(), TrainConfig(batch_size=2, grad_accum=4, **common), corpus_bytes, progress=False
    )
    # SGD makes the update proportional to the gradient (Adam's first step is ~lr * sign(g), which
    # magnifies fp32 summation-order noise in near-zero gradients), so the step compares gradients
    for t in (big, acc):
        t.opt = torch.optim.SGD(t.model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in big.model.parameters()]
    ra, rb = big.train_step(), acc.train_step()
    assert any((p - b).abs().max() > 1e-4 for p, b in zip(big.model.parameters(), before))  # a real step
    assert abs(ra["loss"] - rb["loss"]) <= 1e-6
    assert abs(ra["grad_norm"] - rb["grad_norm"]) <= 1e-6
    for (name, p), q in zip(big.model.named_parameters(), acc.model.parameters()):
        assert (p - q).abs().max() <= 1e-6, name


def test_schedules():
    wsd = TrainConfig(lr=1.0, warmup_steps=10, max_steps=100, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.0)
    assert lr_at(4, wsd) == pytest.approx(0.5)
    assert lr_at(50, wsd) == 1.0 and lr_at(79, wsd) == 1.0
    assert lr_at(90, wsd) == pytest.approx(0.5)  # half-way through the linear decay of steps 80..100
    assert lr_at(100, wsd) == pytest.approx(0.0)
    cos = TrainConfig(lr=1.0, warmup_steps=0, max_steps=100, min_lr_ratio=0.0)
    assert lr_at(25, cos) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_diagnostics_logged_and_correct(tmp_path, corpus_bytes):
    tc = TrainConfig(
        batch_size=4,
        max_steps=4,
        diag_interval=2,
        log_interval=1,
        eval_interval=100,
        device="cpu",
        tensorboard=False,
        warmup_steps=0,
        lr=1e-2,
        grad_clip=1e-3,
        dtype="fp32",
    )
    t = Trainer.create(tmp_path / "run", tiny_cfg(qk_norm="rmsnorm"), tc, corpus_bytes, progress=False)
    t.fit()
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    diag = [r for r in recs if "log_z_mean" in r]
    assert [r["step"] for r in diag] == [1, 2, 4]  # step 1: at initialisation, then every diag_interval
    for r in diag:
        assert len(r["max_attn_logit"]) == 2
        # QK-norm with unit RMSNorm weights bounds |q.k|/sqrt(d) by sqrt(head_dim) = sqrt(8)
        assert all(0 < m <= math.sqrt(8) * 1.05 for m in r["max_attn_logit"])
        assert r["log_z_max"] >= r["log_z_mean"]
        assert 0 < r["update_rms_ratio_mean"] <= r["update_rms_ratio_max"]
    assert all(r["clip_fraction"] == 1.0 for r in recs if "clip_fraction" in r)  # clip at 1e-3 clips every step
    # the probe's figures by hand on a batch: log Z = logsumexp of the logits; layer 0's max attention
    # logit = max over heads and causal pairs of (q_h . k_g(h)) / sqrt(head_dim) after QK-norm and RoPE
    x = torch.randint(0, 257, (4, 32))
    probe = forward_diagnostics(t.model, x, t._autocast)
    m = t.model.eval()
    with torch.no_grad():
        log_z = torch.logsumexp(m(x), dim=-1)
        attn = m.blocks[0].attn
        h = m.blocks[0].attn_norm(m.embed(x))
        q, k, _ = attn.qkv(h).split([32, 16, 16], dim=-1)
        q = attn.q_norm(q.view(4, 32, 4, 8)).transpose(1, 2)
        k = attn.k_norm(k.view(4, 32, 2, 8)).transpose(1, 2).repeat_interleave(2, dim=1)
        pos = torch.arange(32)
        q, k = attn.rope(q, pos), attn.rope(k, pos)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
        scores = scores.masked_fill(torch.triu(torch.ones(32, 32, dtype=torch.bool), 1), float("-inf"))
    assert probe["log_z_mean"] == pytest.approx(float(log_z.mean()), rel=1e-5)
    assert probe["log_z_max"] == pytest.approx(float(log_z.max()), rel=1e-5)
    assert probe["max_attn_logit"][0] == pytest.approx(float(scores.max()), abs=1e-4)
    # the attention-sink share: the mean probability queries 1.. give key 0 (query 0 sees only key 0)
    assert probe["attn_first_key"][0] == pytest.approx(float(scores.softmax(-1)[:, :, 1:, 0].mean()), abs=1e-4)
    assert 1 / 32 < probe["attn_first_key"][0] < 1 and len(probe["attn_first_key"]) == 2
    assert all(len(r["attn_first_key"]) == 2 for r in diag)


def _guard_config() -> TrainConfig:
    """The non-finite guard's tests: 3 bad steps in a row stop a 20-step run; compile off (no probe)."""
    return TrainConfig(
        batch_size=2,
        max_steps=20,
        max_bad_steps=3,
        log_interval=1,
        eval_interval=100,
        device="cpu",
        tensorboard=False,
        compile=False,
    )


def test_non_finite_from_the_first_step_is_a_failure_not_a_divergence(tmp_path, corpus_bytes, monkeypatch):
    """A loss that is NaN from the first step, before any update (a broken kernel or precision, as Inductor's
    bf16 Gated DeltaNet was): no learning rate causes that, so the run is recorded as failed with the reason,
    not as diverged (which the lab would read as an unstable rate), and no checkpoint is written."""
    from lmlab.run_folder import read_outcome
    from lmlab.stopping import NonFiniteFromStart, TrainingDiverged

    tc = _guard_config()
    t = Trainer.create(tmp_path / "run", tiny_cfg(), tc, corpus_bytes, progress=False)
    real = t.model.loss_from_hidden

    def nan_loss(h, y, reduction="mean"):
        loss, ce = real(h, y, reduction)
        return loss * float("nan"), ce * float("nan")

    monkeypatch.setattr(t.model, "loss_from_hidden", nan_loss)
    with pytest.raises(NonFiniteFromStart, match="every step from the first was non-finite .3 in a row") as info:
        t.fit()
    assert not isinstance(info.value, TrainingDiverged) and "dtype=" in str(info.value)
    outcome = read_outcome(tmp_path / "run")
    assert outcome["status"] == "failed" and outcome["step"] == 3 and "NonFiniteFromStart" in outcome["error"]
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))


def test_non_finite_guard_skips_then_stops_with_last_good_state(tmp_path, corpus_bytes, monkeypatch):

    tc = _guard_config()  # no compile=auto probe: the flaky loss counts its calls
    t = Trainer.create(tmp_path / "run", tiny_cfg(), tc, corpus_bytes, progress=False)
    real = t.model.loss_from_hidden  # the training loss (TransformerLM.forward with targets)
    calls = {"n": 0}

    def flaky(h, y, reduction="mean"):
        calls["n"] += 1
        loss, ce = real(h, y, reduction)
        if calls["n"] == 3 or calls["n"] >= 6:  # one bad step (recovered), then bad for good
            return loss * float("nan"), ce * float("nan")
        return loss, ce

    monkeypatch.setattr(t.model, "loss_from_hidden", flaky)
    good = {}
    orig_step = t.train_step

    def step_and_snapshot():
        rec = orig_step()
        if not rec.get("skipped"):
            good.update({k: v.clone() for k, v in t.model.state_dict().items()})
        return rec

    t.train_step = step_and_snapshot
    with pytest.raises(FloatingPointError, match="3 non-finite steps in a row"):
        t.fit()
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r.get("skipped")] == [3, 6, 7, 8]
    from lmlab.run_folder import read_outcome

    assert read_outcome(tmp_path / "run") == {"status": "diverged", "step": 8, "error": None}
    from lmlab.checkpoint import load_run

    model, *_ = load_run(tmp_path / "run")
    for k, v in model.state_dict().items():
        assert torch.equal(v, good[k]), k  # the checkpoint holds the last good weights


def test_bf16_autocast_on_cpu_tracks_fp32(tmp_path, corpus_bytes):
    common = dict(batch_size=4, max_steps=3, device="cpu", eval_interval=100, tensorboard=False, warmup_steps=0)
    a = Trainer.create(tmp_path / "a", tiny_cfg(), TrainConfig(dtype="fp32", **common), corpus_bytes, progress=False)
    b = Trainer.create(tmp_path / "b", tiny_cfg(), TrainConfig(dtype="bf16", **common), corpus_bytes, progress=False)
    la = [a.train_step()["loss"] for _ in range(3)]
    lb = [b.train_step()["loss"] for _ in range(3)]
    assert b.amp_dtype == torch.bfloat16
    assert max(abs(x - y) for x, y in zip(la, lb)) < 0.05  # bf16 rounding, not a different computation
    assert la != lb  # and bf16 was really used
    assert b.model.blocks[0].attn.rope.cos.dtype == torch.float32  # RoPE tables stay fp32


def test_fp16_refused_on_cpu(tmp_path, corpus_bytes):
    from lmlab.config import ConfigError

    with pytest.raises(ConfigError, match="fp16"):
        Trainer.create(tmp_path / "r", tiny_cfg(), TrainConfig(dtype="fp16", device="cpu"), corpus_bytes)


def test_torch_compile_matches_eager(tmp_path, corpus_bytes):
    common = dict(batch_size=2, max_steps=2, device="cpu", eval_interval=100, tensorboard=False, warmup_steps=0)
    cfg = tiny_cfg(n_layers=1)
    a = Trainer.create(tmp_path / "a", cfg, TrainConfig(**common), corpus_bytes, progress=False)
    b = Trainer.create(tmp_path / "b", cfg, TrainConfig(compile=True, **common), corpus_bytes, progress=False)
    la = [a.train_step()["loss"] for _ in range(2)]
    lb = [b.train_step()["loss"] for _ in range(2)]
    assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4


def test_compiled_blocks_match_eager_and_evaluate_eagerly(tmp_path, corpus_bytes):
    """compile_scope=blocks: each block compiled in place (one traced frame serves both blocks), the
    same losses as eager, and evaluation runs the eager code (no frame compiled for it)."""
    from torch._dynamo.utils import counters

    from lmlab.config import ConfigError

    common = dict(batch_size=2, max_steps=2, device="cpu", eval_interval=100, tensorboard=False, warmup_steps=0)
    cfg = tiny_cfg(n_layers=2)
    a = Trainer.create(tmp_path / "a", cfg, TrainConfig(**common), corpus_bytes, progress=False)
    torch._dynamo.reset()
    counters.clear()
    b = Trainer.create(
        tmp_path / "b", cfg, TrainConfig(compile=True, compile_scope="blocks", **common), corpus_bytes, progress=False
    )
    assert b.fwd is b.model and all(blk._compiled_call_impl is not None for blk in b.model.blocks)
    la = [a.train_step()["loss"] for _ in range(2)]
    lb = [b.train_step()["loss"] for _ in range(2)]
    assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4
    traced, graphs = counters["frames"]["ok"], counters["stats"]["unique_graphs"]
    assert traced >= 1 and graphs >= 1
    assert b.validate()["loss"] == pytest.approx(a.validate()["loss"], abs=1e-4)
    assert counters["frames"]["ok"] == traced  # evaluation compiled nothing
    # one block's code compiled for all: three blocks trace what two did
    torch._dynamo.reset()
    counters.clear()
    c = Trainer.create(
        tmp_path / "c",
        tiny_cfg(n_layers=3),
        TrainConfig(compile=True, compile_scope="blocks", **common),
        corpus_bytes,
        progress=False,
    )
    c.train_step()
    assert (counters["frames"]["ok"], counters["stats"]["unique_graphs"]) == (traced, graphs)
    with pytest.raises(ConfigError, match="compile_scope='blocks' is set but compile=False"):
        TrainConfig(compile=False, compile_scope="blocks")
    with pytest.raises(ConfigError, match="compile_scope='layers' is not"):
        TrainConfig(compile=True, compile_scope="layers")


def test_full_disk_keeps_previous_checkpoint(tmp_path, corpus_bytes, monkeypatch):
    import errno

    import lmlab.checkpoint as ck

    tc = TrainConfig(
        batch_size=2, max_steps=4, checkpoint_interval=2, eval_interval=100, device="cpu", tensorboard=False
    )
    t = Trainer.create(tmp_path / "run", tiny_cfg(), tc, corpus_bytes, progress=False)
    t.train_step(), t.train_step()
    first = t.save()
    before = (first / "model.safetensors").read_bytes()
    t.train_step()

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "_fsync_write", full)
    with pytest.raises(CheckpointError, match="No space left on device.*earlier checkpoints .* are intact"):
        t.save()
    assert checkpoint_dirs(tmp_path / "run") == [first]
    assert (first / "model.safetensors").read_bytes() == before
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))


def test_activation_checkpointing_gives_the_same_gradients_and_is_validated():
    from lmlab.model import TransformerLM

    cfg = ModelConfig(vocab_size=50, context_length=16, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    x, y = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    grads = []
    for ckpt in (False, True):
        model.checkpoint_blocks = ckpt
        model.zero_grad(set_to_none=True)
        loss, _ = model(x, targets=y)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-7, msg=n)
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        TrainConfig(activation_checkpointing="yes")
