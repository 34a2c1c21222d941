"""compile=auto (lmlab.compile_choice): the decision by hand-computed predictions, the machine's
records, the probe leaving a run unchanged, and the decision kept on resume."""

import json

import pytest
import torch
import yaml

from lmlab.compile_choice import (
    EXPLORE,
    PRIORS,
    WARM_FRACTION,
    CompileRecords,
    StepClock,
    choose,
    choose_for_run,
    prior_compile_s,
    probe_step_seconds,
)
from lmlab.config import ConfigError, ModelConfig
from lmlab.devices import describe_dtype
from lmlab.train import TrainConfig, Trainer

ALL = ("eager", "blocks", "model")


def test_steps_objective_by_hand():
    # probe 0.2 s; priors: eager x1.0, blocks x0.68 + 23 s, model x0.64 + 15 s a layer (4 layers: 60 s)
    c = choose(0.2, {}, n_layers=4, n_kinds=1, candidates=ALL, steps=1000)
    assert c.predicted["eager"] == pytest.approx(1000 * 0.2)
    assert c.predicted["blocks"] == pytest.approx(1000 * 0.2 * 0.68 + 23)  # 159
    assert c.predicted["model"] == pytest.approx(1000 * 0.2 * 0.64 + 60)  # 188
    assert c.scope == "blocks" and "1,000 steps left" in c.reason and "prior" in c.reason
    # 10 steps: compiling cannot repay (eager 2 s against 23.3 s), and it is not a near tie
    assert choose(0.2, {}, 4, 1, ALL, steps=10).scope == "eager"
    # a measured record replaces the priors: a warm compile of 4 s and a measured ratio
    rec = {"eager": {"ratio": 0.9}, "model": {"ratio": 0.5, "compile_s": 4.0, "compiles": 2}}
    c = choose(0.2, rec, 4, 1, ALL, steps=100)
    assert c.predicted["eager"] == pytest.approx(100 * 0.2 * 0.9)  # 18
    assert c.predicted["model"] == pytest.approx(100 * 0.2 * 0.5 + 4)  # 14
    assert c.scope == "model" and "measured here" in c.reason
    # only the candidates the config allows (compile_scope=model)
    assert set(choose(0.2, {}, 4, 1, ("eager", "model"), steps=1000).predicted) == {"eager", "model"}


def test_a_near_tie_on_priors_measures_the_compile_once():
    # 350 steps at 0.2 s: eager 70 s, blocks 350 x 0.136 + 23 = 70.6 s: eager wins by < EXPLORE
    c = choose(0.2, {}, 4, 1, ("eager", "blocks"), steps=350)
    assert c.predicted["eager"] < c.predicted["blocks"] <= (1 + EXPLORE) * c.predicted["eager"]
    assert c.scope == "blocks" and "measures it" in c.reason
    # once blocks has been measured here, the same figures decide on their merits: eager
    measured = {"blocks": {"ratio": PRIORS["blocks"]["ratio"], "compile_s": 23.0, "compiles": 2}}
    assert choose(0.2, measured, 4, 1, ("eager", "blocks"), steps=350).scope == "eager"
    # far from a tie: eager, untried or not
    assert choose(0.2, {}, 4, 1, ("eager", "blocks"), steps=200).scope == "eager"


def test_budget_objective_counts_steps():
    c = choose(0.1, {}, 4, 2, ALL, steps=10_000, budget_s=100.0)
    assert prior_compile_s("blocks", 4, 2) == 2 * PRIORS["blocks"]["compile_s_per_kind"]
    assert c.predicted["eager"] == pytest.approx(1000)
    assert c.predicted["blocks"] == pytest.approx((100 - 46) / 0.068)  # 794: two block kinds to compile
    assert c.predicted["model"] == pytest.approx((100 - 60) / 0.064)  # 625
    assert c.scope == "eager" and "budget of 100 s (cap 10,000 steps)" in c.reason
    # a longer budget: blocks fits the most steps ((500 - 23) / 0.068 = 7,015; model 6,875; eager 5,000)
    assert choose(0.1, {}, 4, 1, ALL, steps=100_000, budget_s=500.0).scope == "blocks"
    assert choose(0.1, {}, 4, 1, ALL, steps=100_000, budget_s=1000.0).scope == "model"  # 14,688 > 14,368
    # ... unless the cap binds first: every candidate reaches 500 steps, and eager takes the least time
    c = choose(0.1, {}, 4, 1, ALL, steps=500, budget_s=1000.0)
    assert c.predicted == {"eager": 500, "blocks": 500, "model": 500} and c.scope == "eager"


def test_records_round_trip_and_refuse_bad_files(tmp_path, capsys):
    recs = CompileRecords(torch.device("cpu"), root=tmp_path)
    assert recs.load("k") == {}
    recs.update("k", "blocks", 0.8, 21.5)
    recs.update("k", "eager", 0.93, 5.0)  # eager's compile seconds are not kept
    got = recs.load("k")
    assert got["blocks"]["ratio"] == 0.8 and got["blocks"]["compile_s"] == 21.5 and got["blocks"]["compiles"] == 1
    assert got["eager"]["compile_s"] == 0.0 and set(got) == {"blocks", "eager"}
    recs.update("k", "blocks", 0.7)  # a later steady figure: the compile kept, the ratio the median of both
    assert recs.load("k")["blocks"] | {"date": 0} == {
        "ratios": [0.8, 0.7],
        "ratio": 0.75,
        "compile_s": 21.5,
        "compiles": 1,
        "date": 0,
    }
    recs.update("k", "blocks", 0.7, 4.0)
    assert recs.load("k")["blocks"]["compiles"] == 2 and recs.load("k")["blocks"]["compile_s"] == 4.0
    for r in (0.6, 0.6, 0.6, 0.6):  # the last KEEP_RATIOS figures are kept
        recs.update("k", "blocks", r)
    assert recs.load("k")["blocks"]["ratios"] == [0.7] + [0.6] * 4 and recs.load("k")["blocks"]["ratio"] == 0.6
    # one run on a busy machine (steps 0.02x its probe, or 5x) is not recorded, and says so
    before = recs.path("k").read_text()
    recs.update("k", "model", 0.022, 7.0)
    recs.update("k", "eager", 5.0)
    assert recs.path("k").read_text() == before and capsys.readouterr().err.count("other work shared") == 2
    assert f"torch{torch.__version__}" in recs.path("k").parent.name
    notes = []
    for bad in (
        "{",
        json.dumps({"version": 99}),
        json.dumps({"version": 1, "model": {"ratio": -1}}),
        json.dumps({"version": 1, "model": {"compile_s": 3}}),
        json.dumps([1]),
        json.dumps({"version": 1, "model": {"ratios": []}}),
        "[" * 200_000 + "]" * 200_000,  # past the parser's recursion: refused before parsing, no RecursionError
    ):
        recs.path("k").write_text(bad)
        assert recs.load("k", notes.append) == {}
        recs.update("k", "eager", 0.9)  # never overwritten: left as it is, said on stderr
        assert recs.path("k").read_text() == bad and "left as it is" in capsys.readouterr().err
    assert len(notes) == 7 and all("not usable" in n and "k.json" in n for n in notes)
    assert "nested more than 64 deep" in notes[-1]


def test_priors_are_relative_to_eagers_measured_step():
    # eager measured at 1.1x the probe: a compile known only from priors is predicted at 1.1 x 0.68 x probe
    c = choose(0.2, {"eager": {"ratio": 1.1}}, 4, 1, ("eager", "blocks"), steps=1000)
    assert c.predicted["eager"] == pytest.approx(1000 * 0.2 * 1.1)
    assert c.predicted["blocks"] == pytest.approx(1000 * 0.2 * 1.1 * PRIORS["blocks"]["ratio"] + 23)


def test_step_clock():
    clock = StepClock()
    assert clock.figures() is None
    ready = [clock.add(t) for t in [10.0] + [1.0, 1.2, 0.9, 1.1, 1.0, 1.0, 1.3, 0.8]]
    assert ready == [False] * 8 + [True]  # the early figures: compile seconds and a first steady step
    steady, compile_s = clock.figures()
    assert steady == 1.0 and compile_s == 9.0
    ready = [clock.add(2.0 if i >= 91 else 1.5) for i in range(191)]  # steps 10-200; 100-200 take 2 s
    assert ready == [False] * 190 + [True] and clock.full
    assert clock.figures() == (2.0, 9.0)  # steady from steps 100-200, compile from the early steps
    assert clock.add(5.0) is False and len(clock.times) == 200


def test_a_cold_compile_predicts_a_warm_one():
    recs = {"blocks": {"ratio": 0.6, "compile_s": 20.0, "compiles": 1}}
    c = choose(0.1, recs, 4, 1, ("eager", "blocks"), steps=100)
    assert c.predicted["blocks"] == pytest.approx(100 * 0.1 * 0.6 + 20.0 * WARM_FRACTION["blocks"])
    assert "warm compile predicted" in c.reason
    recs["blocks"]["compiles"] = 2  # a second compile measured: its seconds as they are
    assert choose(0.1, recs, 4, 1, ("eager", "blocks"), steps=100).predicted["blocks"] == pytest.approx(26.0)


def test_probe_leaves_the_model_and_random_state_unchanged():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, context_length=16, d_model=32, n_layers=2, n_heads=4, resid_dropout=0.1)
    from lmlab.model import TransformerLM

    model = TransformerLM(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    state = torch.get_rng_state()
    seconds = probe_step_seconds(model, x, y, lambda: torch.autocast("cpu", enabled=False), 3, torch.device("cpu"))
    assert seconds > 0
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_auto_trains_as_compile_false_and_keeps_its_decision(tmp_path, corpus_bytes, monkeypatch):
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
    cfg = ModelConfig(vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=4, resid_dropout=0.1)
    common = dict(
        batch_size=4,
        max_steps=4,
        eval_interval=100,
        eval_windows=2,
        warmup_steps=1,
        device="cpu",
        tensorboard=False,
        dtype="fp32",
    )
    auto = Trainer.create(tmp_path / "auto", cfg, TrainConfig(**common), corpus_bytes, progress=False)
    auto.fit()
    plain = Trainer.create(tmp_path / "plain", cfg, TrainConfig(compile=False, **common), corpus_bytes, progress=False)
    plain.fit()
    # the probe (dropout on) changed nothing: the same weights bit for bit
    for a, b in zip(auto.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    run = yaml.safe_load((tmp_path / "auto" / "run.yaml").read_text())
    assert run["compile"]["choice"] == "eager" and run["compile"]["decided_at_step"] == 0
    assert "4 steps left" in run["compile"]["reason"]
    assert "compile" not in yaml.safe_load((tmp_path / "plain" / "run.yaml").read_text())
    # both runs measured this machine (the runs were shorter than the clock: what they timed)
    files = list((tmp_path / "cache" / "compile").rglob("*.json"))
    assert len(files) == 1 and "eager" in json.loads(files[0].read_text())
    # resumed with compiling made free, the run keeps its decision (it computes as it did)
    monkeypatch.setitem(PRIORS, "blocks", {"ratio": 0.01, "compile_s_per_kind": 0.0})
    monkeypatch.setitem(PRIORS, "model", {"ratio": 0.01, "compile_s_per_layer": 0.0})
    resumed = Trainer.resume(tmp_path / "auto", tc=TrainConfig(**{**common, "max_steps": 6}), progress=False)
    resumed.fit()
    assert resumed.compile_choice == "eager"
    fresh = Trainer.create(tmp_path / "fresh", cfg, TrainConfig(**common), corpus_bytes, progress=False)
    message, clock = choose_for_run(fresh)  # decides only: a compiled step would cost a cold compile here
    assert fresh.compile_choice == "blocks" and message.startswith("compile auto: blocks (4 steps left")
    assert clock is not None and clock.probe > 0


def test_config_values():
    assert TrainConfig().compile == "auto" and TrainConfig().dtype == "auto"
    for bad in ("yes", 1, 0, None):
        with pytest.raises(ConfigError, match="compile=.* must be true, false or auto"):
            TrainConfig(compile=bad)
    with pytest.raises(ConfigError, match="compile_scope='blocks' is set but compile=False"):
        TrainConfig(compile=False, compile_scope="blocks")
    TrainConfig(compile=False, compile_scope="model")  # what runs before compile=auto wrote: still valid
    TrainConfig(compile="auto", compile_scope="blocks")


def test_describe_dtype():
    cpu = torch.device("cpu")
    assert describe_dtype("fp32", cpu, None) == "fp32"
    assert describe_dtype("bf16", cpu, torch.bfloat16) == "bf16"
    assert describe_dtype("auto", cpu, torch.bfloat16).startswith("bf16 (auto: this CPU computes bf16 natively")
    assert describe_dtype("auto", cpu, None).startswith("fp32 (auto: this CPU has no native bf16")


def test_an_unwritable_cache_is_said_and_the_run_goes_on(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    recs = CompileRecords(torch.device("cpu"), root=blocker)
    recs.update("k", "eager", 0.9)  # no exception: a cache that cannot be written
    err = capsys.readouterr().err
    assert "could not write the compile record" in err and "k.json" in err
    assert blocker.read_text() == "not a folder"


def test_native_bf16_reads_the_cpu_flags(tmp_path):
    from lmlab.kernels.settings import cpu_flags, native_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n\nprocessor\t: 1\nflags\t\t: amx_bf16\n")
    assert cpu_flags(str(info)) == {"fpu", "sse", "avx2", "avx512f", "avx512bw"}  # the first processor's
    assert not native_bf16(cpu_flags(str(info)))  # AVX-512 without BF16 (Skylake): oneDNN emulates it
    assert native_bf16({"avx512f", "avx512_bf16"}) and native_bf16({"amx_bf16"}) and native_bf16({"bf16", "asimd"})
    assert cpu_flags(str(tmp_path / "none")) == set()


def test_resume_keeps_dtype_autos_choice_and_drops_a_stale_compile_decision(
    tmp_path, corpus_bytes, monkeypatch, capsys
):
    from lmlab.kernels import settings

    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
    cfg = ModelConfig(vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=4)
    common = dict(batch_size=4, max_steps=2, eval_interval=100, eval_windows=2, device="cpu", tensorboard=False)
    monkeypatch.setattr(settings, "native_bf16", lambda flags=None: False)
    t = Trainer.create(tmp_path / "run", cfg, TrainConfig(**common), corpus_bytes, progress=False)
    assert t.amp_dtype is None
    t.fit()
    run = yaml.safe_load((tmp_path / "run" / "run.yaml").read_text())
    assert run["precision"] == "fp32" and run["compile"]["choice"] == "eager"
    monkeypatch.setattr(settings, "native_bf16", lambda flags=None: True)  # "another CPU"
    capsys.readouterr()
    r = Trainer.resume(tmp_path / "run", tc=TrainConfig(**{**common, "max_steps": 3, "compile": False}), progress=False)
    assert r.amp_dtype is None and "dtype=auto chose fp32 when this run started" in capsys.readouterr().err
    r.fit()
    run = yaml.safe_load((tmp_path / "run" / "run.yaml").read_text())
    assert "compile" not in run and run["train"]["compile"] is False and run["precision"] == "fp32"
    # a set dtype replaces what auto chose: run.yaml no longer says both
    r = Trainer.resume(tmp_path / "run", tc=TrainConfig(**{**common, "max_steps": 4, "dtype": "bf16"}), progress=False)
    assert r.amp_dtype == torch.bfloat16
    run = yaml.safe_load((tmp_path / "run" / "run.yaml").read_text())
    assert run["train"]["dtype"] == "bf16" and "precision" not in run


def test_an_error_choosing_the_compile_scope_is_recorded_as_the_runs_failure(tmp_path, corpus_bytes, monkeypatch):
    """outcome.json never stays "running" after the process failed: an error in compile=auto's choice
    (before the first step) is the run's failure, with the error."""
    import lmlab.train as T

    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))

    def broken(trainer):
        raise RuntimeError("a damaged record")

    monkeypatch.setattr(T, "choose_for_run", broken)
    cfg = ModelConfig(vocab_size=257, context_length=32, d_model=32, n_layers=1, n_heads=4)
    tc = TrainConfig(batch_size=4, max_steps=2, eval_interval=100, eval_windows=2, device="cpu", tensorboard=False)
    t = Trainer.create(tmp_path / "run", cfg, tc, corpus_bytes, progress=False)
    with pytest.raises(RuntimeError, match="a damaged record"):
        t.fit()
    out = json.loads((tmp_path / "run" / "outcome.json").read_text())
    assert out == {"status": "failed", "step": 0, "error": "RuntimeError: a damaged record"}
