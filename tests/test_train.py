"""Training loop, schedule, weight-decay groups and checkpoints."""

import json

import pytest
import torch
import yaml

from lmlab.checkpoint import load_run
from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM
from lmlab.run_folder import CheckpointError, check_new_run_dir, checkpoint_dirs
from lmlab.schedule import lr_at
from lmlab.train import TrainConfig, Trainer, param_groups


def small_model(**kw):
    return ModelConfig(
        **{**dict(vocab_size=257, context_length=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2), **kw}
    )


def test_cpu_peak_flops_only_in_fp32():
    """The CPU row of lmlab.analysis.DEVICES is an fp32 figure: MFU on CPU only in fp32 (against it a
    bf16 run could pass 1)."""
    from lmlab.analysis import DEVICES
    from lmlab.devices import device_peak_flops

    assert DEVICES["cpu"].dtype == "fp32"
    assert device_peak_flops(torch.device("cpu"), None) == DEVICES["cpu"].peak_flops
    assert device_peak_flops(torch.device("cpu"), torch.bfloat16) is None
    assert device_peak_flops(torch.device("cpu"), torch.float16) is None


def test_short_training_run_lowers_loss(tmp_path, corpus_bytes):
    tc = TrainConfig(
        batch_size=8,
        max_steps=60,
        lr=3e-3,
        warmup_steps=10,
        eval_interval=30,
        eval_windows=8,
        log_interval=10,
        device="cpu",
        dtype="fp32",
    )  # MFU: fp32 (the CPU's bf16 peak is unknown)
    trainer = Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False)
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
    assert all(
        r["mfu"] == pytest.approx(fpt * r["tokens_per_s"] / DEVICES["cpu"].peak_flops) for r in lines if "loss" in r
    )
    # the final checkpoint reproduces the trained model exactly
    model, cfg, tok, run, ckpt = load_run(tmp_path / "run")
    x = torch.randint(0, 257, (2, 64))
    trainer.model.eval()
    assert torch.equal(model(x), trainer.model(x))
    assert ckpt.name == "step_0000060" and cfg == trainer.cfg


def test_startup_says_when_fp32_linears_run_on_onednn(tmp_path, corpus_bytes):
    """Trainer.onednn_linears (the startup line's "fp32 linears on oneDNN"): fp32 on a CPU with oneDNN
    when the model's kernels say so (this process's defaults: off on Intel's CPUs), not under bf16
    autocast; the startup line names the kernels."""
    from lmlab.kernels import linear
    from lmlab.kernels.causal_attention import use_blocked
    from lmlab.kernels.settings import KernelSettings, default_kernels

    def made(name, **kw):
        tc = TrainConfig(batch_size=2, max_steps=1, device="cpu", **kw)
        return Trainer.create(tmp_path / name, small_model(), tc, corpus_bytes, progress=False)

    t = made("fp32")
    assert t.model.kernels == default_kernels()
    assert t.onednn_linears == (default_kernels().onednn_fp32 and linear.onednn_available())
    assert all(m.kernels is t.model.kernels for m in t.model.modules() if isinstance(m, linear.Linear))
    assert made("bf16", dtype="bf16").onednn_linears is False
    on = KernelSettings(onednn_fp32=True, blocked_attention_fp32=False)
    assert linear.fp32_linears_on_onednn(torch.device("cpu"), None, on) == linear.onednn_available()
    assert linear.fp32_linears_on_onednn(torch.device("cpu"), torch.bfloat16, on) is False
    assert not linear.fp32_linears_on_onednn(torch.device("cpu"), None, KernelSettings(False, False))
    assert on.describe().startswith("fp32 linears on " + ("oneDNN" if linear.onednn_available() else "MKL"))
    # under bf16 autocast the line names bf16's products and attention first, the fp32 choices as an fp32 run's
    bf16 = on.describe(torch.bfloat16)
    assert bf16.startswith("bf16 linears by torch's autocast matmul, bf16 training attention by the blocked loops")
    assert "fp32 linears" not in bf16 and "(an fp32 run here: linears on " in bf16
    q = torch.zeros(1, 1, 8, 4, dtype=torch.bfloat16)  # what the line says: bf16 attention takes the blocked loops
    assert use_blocked(q, False) and not use_blocked(q.float(), False)


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


def test_existing_run_refused_and_resume_rules(tmp_path, corpus_bytes):
    tc = TrainConfig(batch_size=2, max_steps=4, eval_interval=4, eval_windows=2, device="cpu", checkpoint_interval=2)
    Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False).fit()
    before = (tmp_path / "run" / "run.yaml").read_text()
    with pytest.raises(CheckpointError, match="already holds a run"):
        Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False)
    assert (tmp_path / "run" / "run.yaml").read_text() == before
    with pytest.raises(CheckpointError, match="d_model: run has 64, asked 32"):
        Trainer.resume(tmp_path / "run", small_model(d_model=32))
    # resuming with a longer schedule continues from step 4
    t = Trainer.resume(tmp_path / "run", tc=TrainConfig(**{**tc.__dict__, "max_steps": 6}), progress=False)
    assert t.step == 4
    t.fit()
    assert [p.name for p in checkpoint_dirs(tmp_path / "run")] == ["step_0000004", "step_0000006"]


def test_truncated_checkpoint_is_refused(tmp_path, corpus_bytes):
    tc = TrainConfig(batch_size=2, max_steps=2, eval_interval=2, eval_windows=2, device="cpu")
    Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False).fit()
    path = checkpoint_dirs(tmp_path / "run")[-1] / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="unreadable"):
        load_run(tmp_path / "run")


def test_vocab_mismatch_refused(tmp_path, corpus_bytes):
    with pytest.raises(ConfigError, match="vocab_size=300 does not match"):
        Trainer.create(tmp_path / "run", small_model(vocab_size=300), TrainConfig(), corpus_bytes)
    assert not (tmp_path / "run").exists()


def test_budget_steps_hand_computed():
    """The planned max_steps is the largest N whose cost fits the budget: 10 s spent at step 50, 0.125 s
    a step, 1 s an evaluation (every 100 steps and at the end), 0.5 s a checkpoint, 60 s in all."""
    from lmlab.schedule import budget_steps

    tc = TrainConfig(max_steps=1000, eval_interval=100, budget_seconds=60)
    # N = 406: 10 + 356 x 0.125 + 5 evaluations (100..400, 406) + 1 final checkpoint x 0.5 = 60.0 s
    assert budget_steps(50, 10.0, 0.125, 1.0, 0.5, tc) == 406
    # checkpoints every 100 steps add 4 x 0.5 s at N = 406; N = 400 (its evaluation and checkpoint
    # are the final ones): 10 + 43.75 + 4 + 4 x 0.5 = 59.75 s; N = 401 costs 61.375 s
    tc_ckpt = TrainConfig(max_steps=1000, eval_interval=100, checkpoint_interval=100, budget_seconds=60)
    assert budget_steps(50, 10.0, 0.125, 1.0, 0.5, tc_ckpt) == 400
    assert (
        budget_steps(50, 10.0, 0.125, 1.0, 0.5, TrainConfig(max_steps=300, eval_interval=100, budget_seconds=60)) == 300
    )  # the cap
    assert budget_steps(50, 70.0, 0.125, 1.0, 0.5, tc) == 50  # budget spent: the run ends where it is
    with pytest.raises(ConfigError, match="budget_seconds=0 must be a finite number > 0"):
        TrainConfig(budget_seconds=0)


def test_budgeted_run_plans_its_steps_and_equals_a_fixed_run(tmp_path, corpus_bytes, monkeypatch):
    """A run with budget_seconds plans max_steps at the end of warmup (here forced to 37 steps) and is
    then the same run, weight for weight, as one asked for max_steps=37 from the start; the plan is in
    run.yaml and metrics.jsonl, and the same command again (cap and budget) finds the run complete."""
    import lmlab.schedule as schedule_mod
    from lmlab.run_folder import read_run
    from lmlab.runs import setup_run

    planned = []

    def fake_plan(step, elapsed_s, step_s, eval_s, save_s, tc):
        planned.append((step, elapsed_s, step_s, eval_s, save_s, tc.max_steps))
        return step + 7

    monkeypatch.setattr(schedule_mod, "budget_steps", fake_plan)
    train = dict(
        batch_size=2,
        max_steps=80,
        lr=3e-3,
        warmup_steps=30,
        eval_interval=20,
        eval_windows=2,
        checkpoint_interval=0,
        device="cpu",
        tensorboard=False,
        dtype="fp32",
    )
    tc = TrainConfig(**train, budget_seconds=600)
    budgeted = Trainer.create(tmp_path / "budget", small_model(), tc, corpus_bytes, progress=False)
    budgeted.fit()
    ((step, elapsed, step_s, eval_s, save_s, cap),) = planned
    assert step == 30 and cap == 80 and 0 < step_s and 0 < eval_s and 0 < save_s and elapsed > 25 * step_s
    assert budgeted.step == 37 and budgeted.tc.max_steps == 37
    run = read_run(tmp_path / "budget")
    assert run["train"]["max_steps"] == 37 and run["budget"]["steps"] == 37 and run["budget"]["cap"] == 80
    records = [json.loads(x) for x in (tmp_path / "budget" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "budget_steps" in r] == [30]
    assert [r["step"] for r in records if "val_loss" in r] == [20, 30, 37]  # the plan's evaluation at 30
    fixed = Trainer.create(
        tmp_path / "fixed", small_model(), TrainConfig(**{**train, "max_steps": 37}), corpus_bytes, progress=False
    )
    fixed.fit()
    for (name, a), b in zip(budgeted.model.state_dict().items(), fixed.model.state_dict().values()):
        assert torch.equal(a, b), name
    # the same command again: the asked cap (80) maps to the planned 37 steps, nothing left to train
    cfg_file = tmp_path / "budget.yaml"
    cfg_file.write_text(yaml.safe_dump({"model": small_model().to_dict(), "train": {**train, "budget_seconds": 600}}))
    again = setup_run(tmp_path / "budget", config=str(cfg_file), data=str(corpus_bytes), progress=False)
    assert again.step == 37 and again.tc.max_steps == 37 and again.budget_planned
    again.release_lock()
    # another budget is another plan: --resume with budget_seconds=1200 drops the old record
    other = Trainer.resume(tmp_path / "budget", tc=TrainConfig(**train, budget_seconds=1200), progress=False)
    assert other.tc.max_steps == 80 and not other.budget_planned and "budget" not in read_run(tmp_path / "budget")


@pytest.mark.parametrize("replan", ["longer", "shortest"])
def test_wsd_budget_plans_late_checks_again_and_equals_a_fixed_run(tmp_path, corpus_bytes, monkeypatch, replan):
    """With wsd the plan waits for half of the stable phase, (1 - 0.2) / 2 = 40% of the budget, so it
    times more steps; at 90% of the planned stable phase it is checked again with the steps timed since
    (a longer plan, or one far too short: kept to the shortest whose decay starts after the re-plan).
    Planned before the decay, the run equals the fixed run of the final length, weight for weight."""
    import lmlab.schedule as schedule_mod
    from lmlab.run_folder import read_run

    planned = []

    def fake_plan(step, elapsed_s, step_s, eval_s, save_s, tc):
        planned.append((step, elapsed_s, step_s, eval_s, save_s, tc.max_steps))
        if len(planned) == 1 or replan == "longer":  # + 40: long enough for a re-plan however few steps were timed
            return 2 * step + 40  # the decay starts at 0.8 x N > step: the plan came before it
        return step  # "no step fits": shortest_plan keeps the decay after the re-plan

    monkeypatch.setattr(schedule_mod, "budget_steps", fake_plan)
    train = dict(
        batch_size=2,
        max_steps=5000,
        lr=3e-3,
        warmup_steps=5,
        eval_interval=50,
        eval_windows=2,
        device="cpu",
        tensorboard=False,
        schedule="wsd",
    )
    tc = TrainConfig(**train, budget_seconds=1.0)
    assert schedule_mod.budget_plan_after(tc) == pytest.approx(0.4)
    assert schedule_mod.budget_plan_after(TrainConfig(budget_seconds=1.0)) == 0.0  # cosine: at warmup's end
    budgeted = Trainer.create(tmp_path / "budget", small_model(n_layers=1), tc, corpus_bytes, progress=False)
    budgeted.fit()
    (step, elapsed, *_), (again, _, step_s, eval_s, save_s, cap) = planned
    first = 2 * step + 40
    assert elapsed >= 0.4 and step >= schedule_mod.BUDGET_TIMED_STEPS  # more on a quiet machine (40% of 1 s)
    assert again == int(0.9 * (first - round(0.2 * first))) and cap == 5000  # the cap, not the first plan
    assert step_s > 0 and (eval_s, save_s) == (
        read_run(tmp_path / "budget")["budget"]["eval_s"],
        read_run(tmp_path / "budget")["budget"]["save_s"],
    )
    final = 2 * again + 40 if replan == "longer" else schedule_mod.shortest_plan(again, tc)
    if replan == "shortest":  # the smallest N whose decay starts at or after the re-plan step, by hand
        assert final - round(0.2 * final) >= again > (final - 1) - round(0.2 * (final - 1))
    assert budgeted.step == final
    plan = read_run(tmp_path / "budget")["budget"]
    assert (plan["steps"], plan["first_steps"], plan["replanned_at_step"], plan["planned_at_step"]) == (
        final,
        first,
        again,
        step,
    )
    records = [json.loads(x) for x in (tmp_path / "budget" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["budget_steps"]) for r in records if "budget_steps" in r] == [(step, first), (again, final)]
    fixed = Trainer.create(
        tmp_path / "fixed",
        small_model(n_layers=1),
        TrainConfig(**{**train, "max_steps": final}),
        corpus_bytes,
        progress=False,
    )
    fixed.fit()
    for (name, a), b in zip(budgeted.model.state_dict().items(), fixed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_budget_replan_step_by_schedule():
    """The re-plan comes at 90% of the steps before the decay (wsd), of the run (constant), never for
    cosine, and only with BUDGET_TIMED_STEPS steps since the plan."""
    from lmlab.schedule import budget_replan_step

    assert budget_replan_step(TrainConfig(max_steps=1000, schedule="wsd", decay_fraction=0.4), 300) == 540
    assert budget_replan_step(TrainConfig(max_steps=1000, schedule="constant"), 300) == 900
    assert budget_replan_step(TrainConfig(max_steps=1000, schedule="cosine"), 300) is None
    assert budget_replan_step(TrainConfig(max_steps=100, schedule="wsd", decay_fraction=0.4), 40) is None  # 54 < 60


def test_budget_seconds_end_to_end(tmp_path, corpus_bytes):
    """Unpatched: the recorded plan is budget_steps of the recorded timings, and the run stops there."""
    from lmlab.run_folder import read_run
    from lmlab.schedule import budget_steps

    tc = TrainConfig(
        batch_size=2,
        max_steps=100000,
        warmup_steps=30,
        eval_interval=40,
        eval_windows=2,
        device="cpu",
        tensorboard=False,
        budget_seconds=3.0,
    )
    trainer = Trainer.create(tmp_path / "run", small_model(n_layers=1), tc, corpus_bytes, progress=False)
    trainer.fit()
    plan = read_run(tmp_path / "run")["budget"]
    assert plan["planned_at_step"] == 30 and 30 <= plan["steps"] < 100000 and trainer.step == plan["steps"]
    assert plan["steps"] == budget_steps(30, plan["elapsed_s"], plan["step_s"], plan["eval_s"], plan["save_s"], tc)


FAULT_PROBE = """
import resource, sys, torch
import lmlab.train  # the trainer's process: its imports made before the setting (the heap they leave matters)
from lmlab.devices import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def make_and_free():  # blocks of 1-30 MiB made, written and freed, as a training step's activations
    held = [torch.ones(n << 18) for n in (1, 3, 6, 12, 24, 30, 2)]
    del held
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
make_and_free()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(19):
    make_and_free()
print(f1 - f0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f1)
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_keep_freed_memory_reuses_the_pages_it_freed():
    """With keep_freed_memory (the Trainer on CPU) the blocks a round frees are reused by the next rounds
    without faulting their pages in again: 256 or 512 minor faults in 19 later rounds against ~19.96k in
    the first round, and in 3 of 20 probes (AMD EPYC family 25 model 17, 2026-12-05; the same before and
    after that day's changes) 7,680: the heap grew once more by the largest block (30 MiB), then reused
    it. glibc's default faults 20k to 333k pages in the same 19 rounds (one to 17 rounds' worth), so the
    bound is on the kept mode: under half of one round's pages, at most one such growth."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", FAULT_PROBE, "keep"],
        check=True,
        capture_output=True,
        text=True,
        env=dict(__import__("os").environ, OMP_NUM_THREADS="1"),
    ).stdout
    first, later = map(int, out.split())
    assert first > 15_000  # 78 MiB of fresh pages: the probe did touch them
    assert later < 0.5 * first, (first, later)


def test_restart_rate_leaves_the_first_step_out_of_the_progress_rate():
    import io

    from tqdm import tqdm

    from lmlab.train import restart_rate

    bar = tqdm(total=100, initial=10, file=io.StringIO(), mininterval=0, unit="step")
    bar.start_t -= 60.0  # a first step (the compile) that took a minute
    bar.update(1)
    assert bar.format_dict["elapsed"] >= 60.0
    restart_rate(bar)
    for _ in range(5):
        bar.update(1)
    d = bar.format_dict
    assert bar.n == 16 and d["n"] == 16 and d["initial"] == 11
    assert d["elapsed"] < 5.0  # the minute is gone from the clock
    rate = d["rate"] or (d["n"] - d["initial"]) / d["elapsed"]
    assert rate > 1.0  # 5 steps in well under 5 s, not 6 steps in 60 s (0.1 step/s)
    bar.close()


def test_a_run_folder_without_run_yaml_points_to_the_copy_its_checkpoint_keeps(tmp_path):
    from lmlab.run_folder import read_run

    ckpt = tmp_path / "checkpoints" / "step_0000004"
    ckpt.mkdir(parents=True)
    (ckpt / "run.yaml").write_text("model: {}\ntrain: {}\n")
    copy = repr(str(ckpt / "run.yaml"))
    with pytest.raises(CheckpointError, match="holds checkpoints but no run.yaml") as new:
        check_new_run_dir(tmp_path)
    with pytest.raises(CheckpointError, match="not an lmlab run folder") as read:
        read_run(tmp_path)
    assert copy in str(new.value) and copy in str(read.value)
    (ckpt / "run.yaml").unlink()  # no copy either: no hint
    with pytest.raises(CheckpointError) as bare:
        read_run(tmp_path)
    assert "copy it back" not in str(bare.value)


def test_resume_of_a_run_whose_checkpoints_were_deleted_is_refused(tmp_path, corpus_bytes):
    """metrics.jsonl records a checkpoint saved (the last step's): with the checkpoints gone, resuming
    would retrain from step 0 and cut the log, so it is refused and nothing is changed; a run killed
    before its first checkpoint was in place (no such record) restarts from step 0."""
    import shutil

    tc = TrainConfig(batch_size=2, max_steps=4, eval_interval=4, eval_windows=2, log_interval=1, device="cpu")
    Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False).fit()
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    longer = TrainConfig(**{**tc.__dict__, "max_steps": 6})
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["checkpoint"]) for r in records if "checkpoint" in r] == [(4, "step_0000004")]
    with pytest.raises(CheckpointError, match="records one saved at step 4: deleted or moved") as exc:
        Trainer.resume(tmp_path / "run", tc=longer, progress=False)
    assert "checkpoints folder is missing" in str(exc.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before
    (tmp_path / "run" / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="checkpoints folder holds none complete"):
        Trainer.resume(tmp_path / "run", tc=longer, progress=False)
    # killed while the checkpoint at step 4 was written (its record not logged): restarts, the log cut
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(
        "".join(line + "\n" for line in metrics.read_text().splitlines() if "checkpoint" not in json.loads(line))
    )
    t = Trainer.resume(tmp_path / "run", tc=longer, progress=False)
    assert t.step == 0 and metrics.read_text() == ""


def test_an_edited_architecture_field_in_run_yaml_is_named(tmp_path, corpus_bytes):
    """run.yaml's model section is checked against the copy in the newest checkpoint before any weights
    are read: the error names run.yaml, the field and the copy, not a checkpoint that does not fit."""
    tc = TrainConfig(batch_size=2, max_steps=2, eval_interval=2, eval_windows=2, device="cpu")
    Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False).fit()
    run_file = tmp_path / "run" / "run.yaml"
    run = yaml.safe_load(run_file.read_text())
    run["model"]["n_layers"] += 1
    run_file.write_text(yaml.safe_dump(run, sort_keys=False))
    copy = str(checkpoint_dirs(tmp_path / "run")[-1] / "run.yaml")
    for call in (lambda: Trainer.resume(tmp_path / "run", progress=False), lambda: load_run(tmp_path / "run")):
        with pytest.raises(CheckpointError, match=r"key 'model' differs .* \(fields \['n_layers'\]\)") as exc:
            call()
        assert str(run_file) in str(exc.value) and copy in str(exc.value)
    # a field left out means its default: not an edit; five edits are named as four "and 1 more"
    run["model"]["n_layers"] -= 1
    default_std = run["model"].pop("init_std")
    assert default_std == ModelConfig().init_std
    run_file.write_text(yaml.safe_dump(run, sort_keys=False))
    load_run(tmp_path / "run")
    run["model"].update(n_layers=3, d_model=32, n_heads=2, n_kv_heads=1, rope_theta=1.0)
    run_file.write_text(yaml.safe_dump(run, sort_keys=False))
    with pytest.raises(
        CheckpointError,
        match=r"\(fields \['d_model', 'n_heads', 'n_kv_heads', 'n_layers'\] and 1 "
        r"more\)",
    ):
        load_run(tmp_path / "run")


def test_run_yaml_is_checked_against_an_intact_copy_only(tmp_path, corpus_bytes):
    """A newest checkpoint whose run.yaml copy was edited (its SHA-256 no longer the manifest's) is not
    taken as the reference: an intact run.yaml is not reported as edited, and the damaged checkpoint
    falls back to the previous one when loaded."""
    from lmlab.checkpoint import check_run_model
    from lmlab.run_folder import read_run

    tc = TrainConfig(batch_size=2, max_steps=4, eval_interval=4, eval_windows=2, checkpoint_interval=2, device="cpu")
    Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False).fit()
    older, newest = checkpoint_dirs(tmp_path / "run")
    copy = yaml.safe_load((newest / "run.yaml").read_text())
    copy["model"]["n_layers"] += 1
    (newest / "run.yaml").write_text(yaml.safe_dump(copy, sort_keys=False))
    check_run_model(tmp_path / "run", read_run(tmp_path / "run"))  # the older, intact copy agrees
    with pytest.raises(CheckpointError, match="n_layers"):  # named explicitly, the edited copy disagrees
        check_run_model(tmp_path / "run", read_run(tmp_path / "run"), newest)
    assert load_run(tmp_path / "run")[4] == older


def test_export_checks_run_yaml_and_falls_back_like_eval(tmp_path, corpus_bytes, capsys):
    """lmlab export reads a run as eval does: a damaged newest checkpoint falls back to the previous one
    (with a warning), and an edited architecture field that keeps every shape (rope_theta), which would
    otherwise be written into config.json for weights trained without it, is refused naming run.yaml."""
    from safetensors.torch import load_file

    from lmlab.cli import main

    tc = TrainConfig(batch_size=2, max_steps=4, eval_interval=4, eval_windows=2, checkpoint_interval=2, device="cpu")
    Trainer.create(tmp_path / "run", small_model(), tc, corpus_bytes, progress=False).fit()
    older, newest = checkpoint_dirs(tmp_path / "run")
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert "falling back to the previous checkpoint step_0000002" in capsys.readouterr().err
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    ours = load_file(str(older / "model.safetensors"))
    assert torch.equal(exported["model.embed_tokens.weight"], ours["embed.weight"])
    run_file = tmp_path / "run" / "run.yaml"
    run = yaml.safe_load(run_file.read_text())
    run["model"]["rope_theta"] = 500000.0
    run_file.write_text(yaml.safe_dump(run, sort_keys=False))
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert "run.yaml': key 'model' differs" in err and "rope_theta" in err and not (tmp_path / "hf2").exists()
