"""``lmlab sweep`` / ``lmlab report``: axes expansion, budgets, resume, divergence, report and CSV."""

import csv
import json
import math
import re
import shutil

import pytest
import torch
import yaml

from lmlab.cli import main
from lmlab.config import ConfigError, ModelConfig
from lmlab.data.prepare import prepare
from lmlab.lab.axes import expand_axes
from lmlab.lab.plan import _plan, plan_runs, trained_plans
from lmlab.lab.results import read_results, run_state
from lmlab.lab.runner import run_sweep
from lmlab.lab.spec import builtin_specs, load_spec, parse_spec
from lmlab.run_folder import read_outcome
from lmlab.train import TrainConfig, Trainer

TINY_MODEL = {"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2}
TINY_TRAIN = {
    "batch_size": 4,
    "lr": 3.0e-3,
    "warmup_steps": 2,
    "log_interval": 2,
    "eval_interval": 5,
    "eval_windows": 4,
    "device": "cpu",
    "max_bad_steps": 2,
}


def test_grid_and_zip_expansion():
    variants = expand_axes(
        {
            "grid": {
                "norm_position": ["pre", "post"],
                "warmup": [{"label": "warm", "warmup_steps": 5}, {"warmup_steps": 0}],
            },
            "zip": {"activation": ["gelu", "swiglu"], "d_ff": [64, 43], "label": ["GELU", "SwiGLU"]},
        }
    )
    assert len(variants) == 2 * 2 * 2  # grid product, crossed with the zipped pairs taken together
    assert variants[0].label == "norm_position=pre, warm, GELU"
    assert variants[0].fields == {"norm_position": "pre", "warmup_steps": 5, "activation": "gelu", "d_ff": 64}
    assert variants[3].label == "norm_position=pre, warmup_steps=0, SwiGLU"
    assert variants[3].fields == {"norm_position": "pre", "warmup_steps": 0, "activation": "swiglu", "d_ff": 43}
    assert [v.fields["norm_position"] for v in variants] == ["pre"] * 4 + ["post"] * 4
    # zip as a list of variants; no axes = one base variant
    listed = expand_axes({"zip": [{"label": "a", "lr": 1e-3}, {"lr": 2e-3, "seed": 3}]})
    assert [(v.label, v.fields) for v in listed] == [("a", {"lr": 1e-3}), ("lr=0.002, seed=3", {"lr": 2e-3, "seed": 3})]
    assert [v.label for v in expand_axes(None)] == ["base"]
    with pytest.raises(ConfigError, match="same length|one length"):
        expand_axes({"zip": {"activation": ["gelu", "relu"], "d_ff": [64]}})
    with pytest.raises(ConfigError, match="did you mean 'n_layers'"):
        expand_axes({"grid": {"n_layer": [1, 2]}})
    with pytest.raises(ConfigError, match="more than once"):
        expand_axes({"grid": {"x": [{"label": "same", "lr": 1e-3}, {"label": "same", "lr": 2e-3}]}})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_spec({"axis": {}})


def _hand_flops_per_token(d, layers, heads, d_ff, vocab, T):
    """Training FLOPs per token by hand: 3 x (2 x matmul weights + causal attention 4 x width x (T+1)/2),
    for MHA with head_dim = d / heads, a non-gated FFN and a tied LM head."""
    matmul = layers * (d * 3 * d + d * d + 2 * d * d_ff) + vocab * d
    attention = layers * 4 * d * (T + 1) / 2
    return 3 * (2 * matmul + attention)


def test_budget_conversion_and_dry_run(byte_data, tmp_path, capsys):
    model = {**TINY_MODEL, "activation": "gelu", "d_ff": 64}
    spec = {"model": model, "train": TINY_TRAIN, "axes": {"grid": {"n_layers": [1, 2]}}, "seeds": [1, 2]}
    tokens_per_step = 4 * 32
    by_tokens = plan_runs(parse_spec({**spec, "budget": {"tokens": 1000}}), byte_data)
    assert [p.steps for p in by_tokens] == [1000 // tokens_per_step] * 4  # 7: floor, never over the budget
    assert [p.name for p in by_tokens] == ["n_layers=1-s1", "n_layers=1-s2", "n_layers=2-s1", "n_layers=2-s2"]
    assert [p.tc.seed for p in by_tokens] == [1, 2, 1, 2]
    flops = 3.0e9
    by_flops = plan_runs(parse_spec({**spec, "budget": {"flops": "3e9"}}), byte_data)  # YAML 1.1 gives a string
    for p, layers in zip(by_flops, (1, 1, 2, 2)):
        fpt = _hand_flops_per_token(32, layers, 2, 64, 257, 32)
        assert p.flops_per_token == pytest.approx(fpt)
        assert p.steps == int(flops // (fpt * tokens_per_step))
    assert by_flops[0].steps > by_flops[2].steps  # equal FLOPs: the deeper model trains fewer steps
    timed = plan_runs(parse_spec({**spec, "budget": {"seconds": 30, "steps": 50}}), byte_data)
    assert timed[0].tc.max_seconds == 30 and timed[0].steps == 50
    with pytest.raises(ConfigError, match="give one of"):
        parse_spec({**spec, "budget": {"tokens": 10, "flops": 10}})
    with pytest.raises(
        ConfigError,
        match=r"variant 'n_layers=1': budget tokens=100 buys no training step \(one step "
        r"is 128 tokens\)",
    ):
        plan_runs(parse_spec({**spec, "budget": {"tokens": 100}}), byte_data)
    with pytest.raises(ConfigError, match="'train:' must be a mapping"):
        parse_spec({**spec, "train": [1]})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**spec, "data": str(byte_data), "budget": {"tokens": 1000}}))
    assert main(["sweep", str(path), "--out", str(tmp_path / "sw"), "--dry-run"]) == 0
    assert "n_layers=2-s2" in capsys.readouterr().out
    assert not (tmp_path / "sw").exists()  # a dry run writes nothing
    # a bad value inside a variant names the spec file and the variant; an empty spec is refused
    path.write_text(yaml.safe_dump({**spec, "data": str(byte_data), "axes": {"grid": {"d_model": [32, 33]}}}))
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{path}, variant 'd_model=33'" in err and "d_model=33 is not divisible by n_heads=2" in err
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["sweep", str(empty), "--dry-run"]) == 2
    assert "the spec is empty" in capsys.readouterr().err


def test_max_seconds_stops_training(byte_data, tmp_path):
    tc = TrainConfig(
        batch_size=2,
        max_steps=10**6,
        max_seconds=0.5,
        log_interval=1,
        eval_interval=10**6,
        device="cpu",
        tensorboard=False,
    )
    cfg = ModelConfig(vocab_size=257, **{**TINY_MODEL, "n_layers": 1})
    trainer = Trainer.create(tmp_path / "run", cfg, tc, byte_data, progress=False)
    trainer.fit()
    assert 0 < trainer.step < 10**6
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-2]["stopped"] == "max_seconds" and records[-2]["step"] == trainer.step
    assert records[-1] == {"step": trainer.step, "checkpoint": f"step_{trainer.step:07d}"}  # then saved
    assert run_state(tmp_path / "run", 10**6) == "trained"  # the sweep does not train it further


def test_sweep_resume_divergence_and_report(byte_data, tmp_path):
    spec = {
        "name": "tiny",
        "claim": "Learned positions cannot run past the training context.",
        "model": TINY_MODEL,
        "train": {**TINY_TRAIN, "checkpoint_interval": 5, "keep_checkpoints": 2, "diag_interval": 5},
        "data": str(byte_data),
        "axes": {
            "zip": [
                {"label": "rope", "position": "rope"},
                {"label": "learned", "position": "learned"},
                {"label": "boom", "lr": 1.0e30},
            ]
        },  # non-finite after one step
        "seeds": [1],
        "budget": {"steps": 10},
        "eval_contexts": [1, 2],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sweep"
    lines = []
    run_sweep(path, out=out, jobs=2, log=lines.append)
    rows = {r["run"]: r for r in read_results(out)}
    assert list(rows) == ["rope-s1", "learned-s1", "boom-s1"]
    rope, learned, boom = rows["rope-s1"], rows["learned-s1"], rows["boom-s1"]
    assert rope["status"] == "ok" and rope["steps"] == 10 and rope["tokens"] == 10 * 4 * 32
    assert 0 < rope["val_bpb"] < 9 and 0 < rope["val_bpb_2x"] < 9  # RoPE runs at 2x the training context
    assert learned["status"] == "ok" and learned["val_bpb"] > 0 and learned["val_bpb_2x"] is None
    assert "learned positions" in learned["eval_note_2x"]
    assert boom["status"] == "diverged" and boom["diverged"] and boom["val_bpb"] is None and boom["steps"] < 10
    assert read_outcome(out / "runs" / "boom-s1")["status"] == "diverged"  # what the worker read, not the log
    assert read_outcome(out / "runs" / "rope-s1") == {"status": "finished", "step": 10, "error": None}
    assert rope["params"] == rope["non_embedding_params"] + 257 * 32 and rope["flops"] == pytest.approx(
        rope["flops_per_token"] * rope["tokens"]
    )
    assert rope["kv_bytes_per_token"] == 2 * 2 * 32 * 4  # K and V, 2 layers, 32 channels, fp32
    assert rope["fields"] == {"position": "rope"} and rope["tokens_per_s"] > 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", rope["finished_at"])
    # diagnostics (diag_interval 5): the largest attention logit and log Z seen, from the metrics
    diag = [json.loads(x) for x in (out / "runs" / "rope-s1" / "metrics.jsonl").read_text().splitlines()]
    diag = [r for r in diag if "max_attn_logit" in r]
    assert [r["step"] for r in diag] == [1, 5, 10] and rope["max_attn_logit"] == max(
        max(r["max_attn_logit"]) for r in diag
    )
    assert rope["log_z_max"] == max(r["log_z_max"] for r in diag)
    # the attention-sink share: the last diagnostics' first-key shares, averaged over the layers
    assert rope["attn_sink"] == pytest.approx(sum(diag[-1]["attn_first_key"]) / 2) and 0 < rope["attn_sink"] < 1
    assert "cores visible" in rope["machine"] and torch.__version__ in rope["machine"]

    # a second invocation trains nothing
    files = [out / "runs" / n / "metrics.jsonl" for n in rows] + [out / "logs" / f"{n}.log" for n in rows]
    stamps = [f.stat().st_mtime_ns for f in files]
    lines.clear()
    run_sweep(path, out=out, jobs=1, log=lines.append)
    assert [f.stat().st_mtime_ns for f in files] == stamps
    assert sum(line.startswith("skip ") for line in lines) == 3 and not any(line.startswith("train ") for line in lines)

    # an interrupted run continues from its last checkpoint; a trained but unrecorded one is only evaluated
    shutil.rmtree(out / "runs" / "rope-s1" / "checkpoints" / "step_0000010")
    kept = [r for r in read_results(out) if r["run"] not in ("rope-s1", "learned-s1")]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    learned_log = (out / "logs" / "learned-s1.log").read_text()
    lines.clear()
    run_sweep(path, out=out, jobs=1, log=lines.append)
    assert any(line.startswith("train rope-s1: continuing") for line in lines)
    assert (
        "resuming" in (out / "logs" / "rope-s1.log").read_text()
        and "from step 5" in (out / "logs" / "rope-s1.log").read_text()
    )
    assert (out / "logs" / "learned-s1.log").read_text() == learned_log  # not trained again
    rows = {r["run"]: r for r in read_results(out)}
    assert set(rows) == {"rope-s1", "learned-s1", "boom-s1"} and rows["rope-s1"]["steps"] == 10

    # the report: markdown with the claim and every variant, the PNGs, a CSV equal to results.jsonl
    assert main(["report", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert spec["claim"] in md
    assert rows["rope-s1"]["machine"] in md and "**Executed** 20" in md and "max attn logit" in md
    table = [
        line
        for line in md.splitlines()
        if line.startswith("| 1 |") or line.startswith("| 2 |") or line.startswith("| 3 |")
    ]
    assert [line.split(" | ")[1] for line in table][2] == "boom"  # diverged sorts last
    assert {line.split(" | ")[1] for line in table} == {"rope", "learned", "boom"}
    for png in ("loss.png", "bpb.png", "throughput.png"):
        assert (out / png).stat().st_size > 1000 and f"]({png})" in md
    with open(out / "results.csv") as f:
        csv_rows = list(csv.DictReader(f))
    results = read_results(out)
    assert [r["run"] for r in csv_rows] == [r["run"] for r in results]
    for c, r in zip(csv_rows, results):
        for key, value in r.items():
            if isinstance(value, dict) and key != "fields":
                assert json.loads(c[key]) == value
            elif key == "fields":
                assert {k[4:]: v for k, v in c.items() if k.startswith("set.") and v} == {
                    k: str(v) for k, v in value.items()
                }
            elif value is None:
                assert c[key] == ""
            elif isinstance(value, bool):
                assert c[key] == str(value).lower()
            elif isinstance(value, (int, float)):
                assert math.isclose(float(c[key]), value)
            else:
                assert c[key] == str(value)


def test_shipped_specs_are_valid(byte_data):
    """Every shipped spec validates, meets the lab's protocol by design (rates over >= 5 values on >= 3
    seeds, >= 6 compared seeds, every claim on a trained quantity at or above its tokens-per-parameter
    floor) and fits the lab's CPU budget: about 9 hours for all 16 with `make ablations` on 2 cores (12
    specs executed on 2026-12-04: 1.12e15 training FLOPs in 6.0 h, ~1.9e14 FLOPs per hour)."""
    from lmlab.param_counts import param_counts

    specs = builtin_specs()
    assert len(specs) == 16
    total = 0.0
    for name, path in specs.items():
        spec = load_spec(path)
        assert spec.claim and spec.name == name
        if any("data" in v.fields for v in spec.variants):  # variants with their own tokenizations
            with pytest.raises(ConfigError, match="train on their own data"):
                plan_runs(spec, byte_data)
        else:
            plan_runs(spec, byte_data)  # every config validates
        vocab = 257 if isinstance(spec.data, dict) and spec.data.get("tokenizer") == "bytes" else 4096
        plans = _plan(spec, None, vocab)  # validated, nothing prepared
        assert all(p.cfg.d_model <= 256 and p.cfg.context_length <= 256 for p in plans)
        # the protocol, by design
        tuners = spec.tune_seeds or spec.seeds
        compared = [s for s in spec.seeds if s not in spec.tune_seeds] if spec.tune_seeds else spec.seeds
        assert len(spec.tune["lr"]) >= spec.tuning.min_points >= 5, name
        assert len(tuners) >= spec.tuning.min_seeds >= 3 and len(compared) >= spec.judging.min_seeds >= 6, name
        tpp: dict = {}
        for p in plans:
            tpp[p.variant] = min(tpp.get(p.variant, math.inf), p.tokens / param_counts(p.cfg)["non_embedding"])
        for e in spec.expect:
            if e.metric not in ("step_time", "decode_time"):
                floor = spec.judging.tokens_per_param if e.floor is None else e.floor
                assert min(tpp[e.a], tpp[e.b]) >= floor >= 2.5, (name, e.text, tpp[e.a], tpp[e.b])
        # sized from a measurement: the d_model-64 byte-level baseline trains at 74k tokens/s on one core
        # of a 2-core Intel Xeon (family 6, model 167), 6.2e10 FLOP/s per job, 1.2e11 with --jobs 2
        full = trained_plans(plans)
        flops = sum(p.flops for p in full)
        assert flops <= 2.2e14, (name, flops)
        total += flops
    assert total <= 1.8e15, total  # 4.2 h of training at 1.2e11 FLOP/s, plus per-run start and evaluation


def test_unreadable_results_line_is_reported(tmp_path, capsys):
    row = '{"run": "a-s1", "variant": "a", "seed": 1, "status": "failed"}'
    (tmp_path / "results.jsonl").write_text(row + '\n{"run": "b-s1", "bp\n')
    assert [r["run"] for r in read_results(tmp_path)] == ["a-s1"]  # the sweep: a cut last line is skipped
    err = capsys.readouterr().err
    assert "results.jsonl: line 2 is not JSON" in err and "counts as unfinished" in err
    (tmp_path / "results.jsonl").write_text(row + "\n")
    assert len(read_results(tmp_path)) == 1 and capsys.readouterr().err == ""


# --- tiers -----------------------------------------------------------------------------------------
def test_tier_overrides_and_errors(byte_data, tmp_path, capsys):
    """A tier merges model/train field by field, replaces the other keys it names, gets its own name
    (and so its own sweep folder); a missing tier or a key a tier may not set is refused by name."""
    spec = {
        "name": "t",
        "model": {**TINY_MODEL, "d_ff": 64},
        "train": TINY_TRAIN,
        "data": str(byte_data),
        "axes": {"grid": {"n_layers": [1, 2]}},
        "seeds": [1],
        "budget": {"steps": 2},
        "tiers": {
            "big": {
                "model": {"d_model": 64},
                "train": {"batch_size": 2},
                "axes": {"grid": {"n_layers": [3]}},
                "seeds": [4, 5],
            }
        },
    }
    plain = parse_spec(spec)
    assert plain.name == "t" and plain.tier is None and "tiers" not in plain.raw
    assert [p.cfg.d_model for p in plan_runs(plain, byte_data)] == [32, 32]
    big = parse_spec(spec, tier="big")
    assert big.name == "t-big" and big.tier == "big" and "tiers" not in big.raw
    plans = plan_runs(big, byte_data)
    assert [(p.cfg.d_model, p.cfg.n_layers, p.cfg.d_ff, p.tc.batch_size, p.tc.seed) for p in plans] == [
        (64, 3, 64, 2, 4),
        (64, 3, 64, 2, 5),
    ]  # d_ff and the rest of train kept from the spec
    assert plans[0].tc.lr == TINY_TRAIN["lr"]
    with pytest.raises(ConfigError, match="no tier 'gpu'; this spec defines 'big'"):
        parse_spec(spec, tier="gpu")
    with pytest.raises(ConfigError, match="tiers.big.claim is not a key a tier may set"):
        parse_spec({**spec, "tiers": {"big": {"claim": "x"}}}, tier="big")
    with pytest.raises(ConfigError, match="tiers must map tier names to mappings"):
        parse_spec({**spec, "tiers": [1]})
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(path), "--tier", "nope", "--dry-run"]) == 2
    assert "no tier 'nope'" in capsys.readouterr().err
    # the tier trains for real: its own folder, the tier recorded in the provenance and the plan's data line
    out = tmp_path / "sw"
    assert main(["sweep", str(path), "--tier", "big", "--out", str(out)]) == 0
    assert "data: " in capsys.readouterr().out
    rows = read_results(out)
    assert sorted(r["run"] for r in rows) == ["n_layers=3-s4", "n_layers=3-s5"]
    prov = [
        json.loads(line) for line in (out / "provenance.jsonl").read_text().splitlines() if "ended_at" not in line
    ]  # the invocations' start records (each is closed by an end record)
    assert prov[-1]["tier"] == "big" and "--tier big" in prov[-1]["command"]
    assert yaml.safe_load((out / "spec.yaml").read_text())["model"]["d_model"] == 64


def test_dtype_and_compile_switches_change_only_their_field_and_the_sweep_name(byte_data, tmp_path, capsys):
    """`lmlab sweep SPEC --dtype bf16 [--compile]`: every run's dtype (compile) and nothing else (same runs,
    models, steps and rates), a sweep named NAME-bf16 (-compiled; its own folder, the flag in its recorded
    command), the runs trained in bf16 autocast; the spec's own setting is a no-op, and a spec whose axes
    compare precisions (compile) is refused."""
    spec = {
        "name": "t",
        "model": {**TINY_MODEL, "d_ff": 64},
        "train": {**TINY_TRAIN, "dtype": "fp32"},
        "data": str(byte_data),
        "axes": {"grid": {"n_layers": [1, 2]}},
        "seeds": [1],
        "budget": {"steps": 2},
    }
    fp32 = plan_runs(parse_spec(spec), byte_data)
    bf16_spec = parse_spec(spec, dtype="bf16")
    assert bf16_spec.name == "t-bf16" and bf16_spec.raw["train"]["dtype"] == "bf16"
    bf16 = plan_runs(bf16_spec, byte_data)
    assert [p.tc.dtype for p in fp32] == ["fp32"] * 2 and [p.tc.dtype for p in bf16] == ["bf16"] * 2
    assert [(p.name, p.cfg, p.steps, p.tc.lr) for p in bf16] == [(p.name, p.cfg, p.steps, p.tc.lr) for p in fp32]
    assert parse_spec(spec, dtype="fp32").name == "t"  # the spec's own precision: the same sweep
    no_dtype = {**spec, "train": TINY_TRAIN}  # a sweep's default precision is fp32 (SWEEP_TRAIN_DEFAULTS)
    assert parse_spec(no_dtype, dtype="fp32").name == "t" and parse_spec(no_dtype, dtype="auto").name == "t-auto"
    both = parse_spec(spec, dtype="bf16", compile=True)
    assert both.name == "t-bf16-compiled" and [p.tc.compile for p in plan_runs(both, byte_data)] == [True, True]
    assert parse_spec({**spec, "train": {**spec["train"], "compile": True}}, compile=True).name == "t"
    with pytest.raises(ConfigError, match="variant 'compile=true' sets compile itself"):
        parse_spec({**spec, "axes": {"grid": {"compile": [True, False]}}}, compile=True)
    # scales and tune: the switch would reach only some runs (a new user's find); a label is not a field
    with pytest.raises(ConfigError, match="scale 's1' sets dtype itself"):
        parse_spec({**spec, "scales": [{"label": "s1", "dtype": "fp32"}, {"label": "s2", "d_model": 64}]}, dtype="bf16")
    with pytest.raises(ConfigError, match="tune: sets dtype itself"):
        parse_spec({**spec, "tune": {"dtype": ["fp32", "bf16"]}}, dtype="bf16")
    labelled = {**spec, "axes": {"grid": {"variant": [{"label": "dtype", "n_layers": 1}]}}}
    assert parse_spec(labelled, dtype="bf16").name == "t-bf16"
    assert load_spec("02-norm-type-and-biases", dtype="auto").name == "02-norm-type-and-biases-auto"
    with pytest.raises(ConfigError, match="variant 'dtype=fp32' sets dtype itself"):
        parse_spec({**spec, "axes": {"grid": {"variant": [{"dtype": "fp32"}, {"dtype": "bf16"}]}}}, dtype="bf16")
    with pytest.raises(ConfigError, match="--dtype 'fp8': choose fp32, bf16 or auto"):
        parse_spec(spec, dtype="fp8")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sw"
    assert main(["sweep", str(path), "--dtype", "bf16", "--out", str(out)]) == 0
    capsys.readouterr()
    assert sorted(r["run"] for r in read_results(out)) == ["n_layers=1-s1", "n_layers=2-s1"]
    assert all(r["sweep"] == "t-bf16" for r in read_results(out))
    run_yaml = yaml.safe_load((out / "runs" / "n_layers=1-s1" / "run.yaml").read_text())
    assert run_yaml["train"]["dtype"] == "bf16"
    start = json.loads((out / "provenance.jsonl").read_text().splitlines()[0])
    assert "--dtype bf16" in start["command"] and start["sweep"] == "t-bf16"
    # the same folder resumed without the flag is another sweep (t), refused before anything is written
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    assert "holds sweep 't-bf16', not 't'" in capsys.readouterr().err


def test_plan_warns_when_runs_repeat_the_data(byte_data, capsys):
    from lmlab.lab.plan import epochs_line

    spec = {"model": TINY_MODEL, "train": TINY_TRAIN, "seeds": [1]}
    train_tokens = 20000  # byte_data: 20,000 bytes of training text, one token per byte
    once = plan_runs(parse_spec({**spec, "budget": {"tokens": 4 * 32 * 10}}), byte_data)
    line = epochs_line(once)
    assert line.startswith("data: ") and "reads 1,280 (0.06 epochs)" in line
    twice = plan_runs(parse_spec({**spec, "budget": {"steps": 2 * train_tokens // (4 * 32) + 1}}), byte_data)
    assert epochs_line(twice).startswith("warning: ") and "2.0" in epochs_line(twice)


def test_shipped_gpu_tiers_train_every_run_past_20_tokens_per_parameter():
    """Every shipped spec has a gpu tier whose baseline has 20-100M parameters (every variant 10-150M:
    04 holds FLOPs, not parameters, across a 32x range of FF ratios), with its own learning-rate grid of
    5 values, every planned run at >= 20 tokens per non-embedding parameter (issue 41), max_epochs 1
    (so a corpus the runs would repeat is refused: the default Shakespeare is ~1.5M tokens), warmup
    inside the run, and a cost that stays under 60 GPU-hours per spec when estimated at 25% of an
    H100/H200's dense bf16 peak (989 TFLOP/s) plus 30 s per run (docs/bench/gpu-tiers.md measured
    8-47 GPU-hours per spec on an H200, eager bf16, MFU 7-35%)."""
    from lmlab.param_counts import param_counts

    total = 0.0
    for name, path in builtin_specs().items():
        spec = load_spec(path, tier="gpu")
        plans = trained_plans(_plan(spec, None, 4096))  # two-stage tuning: the runs trained
        sizes = [param_counts(p.cfg)["total"] for p in plans]
        base = [param_counts(p.cfg)["total"] for p in plans if p.variant == spec.baseline]
        assert base and all(20e6 <= n <= 100e6 for n in base), (name, base)
        assert all(10e6 <= n <= 150e6 for n in sizes), (name, min(sizes), max(sizes))
        assert all(p.tc.dtype == "bf16" for p in plans), name
        assert len(spec.tune["lr"]) == 5 and max(spec.tune["lr"]) <= 5e-3, name
        tpp = [p.tokens / param_counts(p.cfg)["non_embedding"] for p in plans]
        assert min(tpp) >= 20, (name, min(tpp))
        assert spec.max_epochs == 1, name
        assert all(p.tc.warmup_steps < p.steps // 4 or "warmup 20%" in p.variant for p in plans), name
        hours = (sum(p.flops for p in plans) / (0.25 * 989e12) + 30 * len(plans)) / 3600
        assert hours < 60, (name, hours)
        total += hours
    assert 100 < total < 500, total  # about 120 GPU-hours at this estimate, ~380 at the measured eager rates


def test_gpu_tier_model_trains_a_step_on_cpu():
    """Smoke test of a gpu tier on CPU: its baseline model (27M parameters, context 512) takes a
    forward + backward step in bf16 autocast at batch 1, and the loss is the untrained model's,
    about ln(vocab); an AdamW step then changes it."""
    from lmlab.model import TransformerLM

    spec = load_spec("09-parallel-block", tier="gpu")
    p = _plan(spec, None, 4096)[0]
    assert (p.cfg.d_model, p.cfg.n_layers, p.cfg.context_length, p.tc.dtype) == (512, 8, 512, "bf16")
    model = TransformerLM(p.cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 4096, (1, 513))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = model(x[:, :-1], targets=x[:, 1:])
    loss.backward()
    opt.step()
    assert abs(float(loss) - math.log(4096)) < 0.5
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        after, _ = model(x[:, :-1], targets=x[:, 1:])
    assert float(after) < float(loss)


def test_variants_with_their_own_data_train_and_score_on_it(byte_data, small_corpus, tmp_path, capsys):
    """A variant's data: (a prepared folder, or the default corpus with another tokenizer) sets its
    runs' data and vocab_size; bits/byte of two tokenizations of the same documents are compared; --data
    cannot replace it (refused, naming the variants); malformed values are refused by name."""
    from lmlab.lab.axes import variant_data
    from lmlab.runs import default_data_dir

    bpe = tmp_path / "bpe300"
    src = tmp_path / "src"
    src.mkdir()
    for name in ("macbeth_gut.txt", "tempest_gut.txt"):  # the documents byte_data holds
        (src / name).write_bytes((small_corpus / name).read_bytes()[: {"macbeth_gut.txt": 20000}.get(name, 6000)])
    prepare(src, bpe, "bpe", 300, val_docs=["tempest_gut.txt"])
    spec = {
        "name": "v",
        "model": TINY_MODEL,
        "train": TINY_TRAIN,
        "seeds": [1],
        "budget": {"flops": 2e9},
        "axes": {"grid": {"tok": [{"label": "bytes", "data": str(byte_data)}, {"label": "bpe", "data": str(bpe)}]}},
        "match": "flops",
        "varies": ["params", "tokens", "flops_per_token", "steps"],
        "expect": [{"better": "bpe", "than": "bytes"}],
    }
    plans = {p.variant: p for p in plan_runs(parse_spec(spec))}
    assert plans["bytes"].data == byte_data.resolve() and plans["bytes"].cfg.vocab_size == 257
    assert plans["bpe"].data == bpe.resolve() and plans["bpe"].cfg.vocab_size == 300
    assert plans["bytes"].steps > plans["bpe"].steps  # equal FLOPs: the smaller LM head trains longer
    with pytest.raises(ConfigError, match=r"variant\(s\) 'bytes', 'bpe' train on their own data"):
        plan_runs(parse_spec(spec), byte_data)
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sw"
    assert main(["sweep", str(path), "--out", str(out)]) == 0
    rows = {r["variant"]: r for r in read_results(out)}
    assert rows["bytes"]["val_bytes"] == rows["bpe"]["val_bytes"]  # the same held-out documents
    assert rows["bytes"]["val_tokens"] > rows["bpe"]["val_tokens"]
    assert main(["report", str(out)]) == 0  # a variant's data: mapping is no basin axis
    assert main(["sweep", str(path), "--out", str(tmp_path / "sw2"), "--data", str(byte_data)]) == 2
    assert "train on their own data" in capsys.readouterr().err
    # the default corpus with another tokenizer: its folder, not prepared without prepare=True
    folder, vocab = variant_data({"tokenizer": "bpe", "vocab_size": 1024}, None, prepare=False)
    assert (folder, vocab) in ((None, 1024), (default_data_dir("bpe", 1024).resolve(), 1024))
    for bad in ({"tokenizer": "bpe"}, {"tokenizer": "wordpiece"}, {"tokenizer": "bytes", "vocab_size": 9}, 3):
        raw = {
            **spec,
            "axes": {"grid": {"tok": [{"label": "x", "data": bad}, {"label": "y", "d_ff": 64}]}},
            "expect": [],
        }
        with pytest.raises(ConfigError, match=r"data=.* must be a prepared data folder"):
            parse_spec(raw)


# --- gpu tiers at >= 20 tokens per parameter, max_epochs, a datasets corpus ------------------------
def test_max_epochs_refuses_a_corpus_the_runs_would_repeat(byte_data, tmp_path, capsys):
    """max_epochs: the dry run says the sweep would refuse (naming the tokens needed and --data), the
    sweep raises ConfigError before writing anything, and a bad value is refused by name."""
    from lmlab.data.shards import TokenData

    train_tokens = int(TokenData(byte_data).manifest["splits"]["train"]["tokens"])
    steps = 2 * train_tokens // (4 * 32) + 1  # two passes at batch 4 x 32
    spec = {
        "name": "ep",
        "model": TINY_MODEL,
        "train": TINY_TRAIN,
        "seeds": [1],
        "budget": {"steps": steps},
        "max_epochs": 1,
    }
    out = tmp_path / "sw"
    with pytest.raises(ConfigError) as exc:  # the dry run prints the plan, then fails as the sweep would
        run_sweep(parse_spec(spec), out, dry_run=True, data_dir=byte_data)
    said = str(exc.value)
    assert "ep: the longest run reads" in said and "max_epochs=1" in said and "--data DIR" in said
    assert f"at least {steps * 4 * 32:,} training tokens" in said and "the sweep refuses to start" in said
    assert "run(s)" in capsys.readouterr().out  # the plan came first
    with pytest.raises(ConfigError, match=r"2\.0 passes over the .* max_epochs=1"):
        run_sweep(parse_spec(spec), out, data_dir=byte_data)
    assert not out.exists()
    run_sweep(parse_spec({**spec, "max_epochs": 2.5}), out, dry_run=True, data_dir=byte_data)
    assert "error:" not in capsys.readouterr().out
    for bad in (0, -1, "one", True, float("nan")):
        with pytest.raises(ConfigError, match="max_epochs must be a positive number"):
            parse_spec({**spec, "max_epochs": bad})


def test_shipped_gpu_tier_runs_end_to_end_on_a_datasets_corpus(small_corpus, tmp_path, capsys):
    """A shipped gpu tier (09) as written, with only its size cut (model, batch, steps, seeds) so it runs
    on a CPU: its max_epochs refuses the small corpus at the full budget, then it trains, evaluates
    and reports on a `datasets` save_to_disk corpus prepared with `lmlab prepare --data`."""
    datasets = pytest.importorskip("datasets")
    from lmlab.config_files import load_mapping
    from lmlab.lab.report import write_report

    docs = [p.read_text() for p in sorted(small_corpus.iterdir())]
    paras = [d for doc in docs for d in doc.split("\n\n") if d.strip()]
    datasets.Dataset.from_dict({"text": paras}).save_to_disk(str(tmp_path / "ds"))
    data = tmp_path / "prepared"
    assert (
        main(
            [
                "prepare",
                "--data",
                str(tmp_path / "ds"),
                "--out",
                str(data),
                "--tokenizer",
                "bpe",
                "--vocab-size",
                "300",
                "--val-fraction",
                "0.1",
                "--no-progress",
            ]
        )
        == 0
    )
    raw = load_mapping(builtin_specs()["09-parallel-block"])
    with pytest.raises(ConfigError, match="max_epochs=1"):  # 1.2e9 tokens per run on a 60 kB corpus
        run_sweep(parse_spec(raw, builtin_specs()["09-parallel-block"], "gpu"), tmp_path / "full", data_dir=data)
    gpu = raw["tiers"]["gpu"]
    gpu["model"].update(d_model=32, n_layers=1, n_heads=2, context_length=32)
    gpu["scales"] = [{"label": "d32", "d_model": 32, "n_heads": 2}, {"label": "d64", "d_model": 64, "n_heads": 4}]
    gpu["train"].update(batch_size=4, eval_interval=6, eval_windows=2, warmup_steps=2, checkpoint_interval=6)
    gpu.update(
        budget={"steps": 6},
        seeds=[1, 2],
        tune_seeds=[1],
        timing={"batch": 2, "pairs": 15, "steps": 1},
        tune={"lr": [1e-3, 3e-3]},
        tuning={"extend": 0},
    )
    spec = parse_spec(raw, builtin_specs()["09-parallel-block"], "gpu")
    assert spec.name == "09-parallel-block-gpu" and spec.max_epochs == 1 and spec.train["dtype"] == "bf16"
    folder = run_sweep(spec, tmp_path / "sw", data_dir=data)
    rows = read_results(folder)
    assert len(rows) == 2 * 2 * 2 + 2 * 2 and all(r["status"] == "ok" for r in rows)
    assert {r["scale"] for r in rows} == {"d32", "d64"}
    assert all(load_mapping(folder / "runs" / r["run"] / "run.yaml")["data"] == str(data.resolve()) for r in rows)
    assert all(math.isfinite(r["val_bpb"]) and r["val_bpb"] < 12 for r in rows)  # trained from ~ln(300) nats
    page = write_report(folder, tmp_path / "page" / "report.md")[0].read_text()
    # 6 steps on a CPU: every claim is below its floor; the speed claim needs CUDA
    assert "not testable at this scale" in page and "parallel blocks train faster" in page
    assert "written for the spec as written; this sweep ran its tier 'gpu'" in page


# --- signals and the sweep lock ----------------------------------------------------------------------
def _sweep_proc(path, out, session=False):
    """`lmlab sweep` as a background job has it: SIGINT inherited as ignored (and, with ``session``, in a
    process group of its own, as a terminal's foreground job is)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.Popen(
        [sys.executable, "-m", "lmlab.cli", "sweep", str(path), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        start_new_session=session,
    )


def _wait_for_steps(metrics, more, proc, timeout=120):
    import time

    start = metrics.read_text().count("\n") if metrics.is_file() else 0
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().count("\n") >= start + more:
            return
        time.sleep(0.1)
    raise AssertionError(f"{metrics} did not grow by {more} lines (sweep exit {proc.poll()})")


def test_sweep_stops_on_sigint_in_the_background_and_at_a_terminal(byte_data, tmp_path):
    """kill -INT to a sweep started in the background (SIGINT inherited ignored) stops it as SIGTERM
    does; so does Ctrl-C at a terminal (SIGINT to its whole process group, trainers included); the runs
    keep their checkpoints and the same command resumes to completion."""
    import os
    import signal
    import time

    spec = {
        "name": "sigint",
        "model": TINY_MODEL,
        "train": {**TINY_TRAIN, "log_interval": 1, "eval_interval": 10**4, "checkpoint_interval": 0},
        "data": str(byte_data),
        "seeds": [1],
        "budget": {"steps": 300},
    }
    path = tmp_path / "sigint.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sw"
    metrics = out / "runs" / "base-s1" / "metrics.jsonl"
    ckpts = out / "runs" / "base-s1" / "checkpoints"
    for session in (False, True):  # kill -INT PID to a background job; then Ctrl-C to a process group
        proc = _sweep_proc(path, out, session)
        _wait_for_steps(metrics, 3, proc)
        t0 = time.time()
        if session:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and time.time() - t0 < 30, (proc.returncode, err)
        assert "sweep interrupted (SIGINT)" in err.strip().splitlines()[-1] and "the same command resumes" in err
        assert list(ckpts.glob("step_*")), "the stopped trainer checkpointed its last finished step"
        assert not (out / "results.jsonl").is_file() or not read_results(out)
    proc = _sweep_proc(path, out)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    (row,) = read_results(out)
    assert row["status"] == "ok" and row["steps"] == 300
    assert (out / "logs" / "base-s1.log").read_text().count("resuming") == 2


def test_two_sweeps_on_one_folder_the_second_refuses(byte_data, tmp_path, capsys):
    """A sweep locks its folder (the runs' lock, lmlab.fsutil.acquire_lock): a second `lmlab sweep` on it
    refuses in one line naming the folder and the holder's PID; a stale lock is taken over."""
    import json
    import subprocess
    import sys

    from lmlab.fsutil import acquire_lock, lock_path

    spec = {
        "name": "locked",
        "model": TINY_MODEL,
        "train": TINY_TRAIN,
        "data": str(byte_data),
        "seeds": [1],
        "budget": {"steps": 4},
    }
    path = tmp_path / "locked.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sw"
    held = acquire_lock(out, "lmlab sweep")  # a running sweep (this process, as another would)
    try:
        assert main(["sweep", str(path), "--out", str(out)]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("lmlab sweep: error: ")
        assert (
            str(out) in err[0]
            and "is in use by lmlab sweep (PID" in err[0]
            and str(__import__("os").getpid()) in err[0]
        )
        assert not (out / "results.jsonl").exists()
        assert main(["sweep", str(path), "--out", str(out), "--dry-run"]) == 0  # a dry run only reads
    finally:
        held.release()
    # a lock left by a process that is gone: taken over with a note, and the sweep runs
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_path(out).write_text(
        json.dumps({"pid": int(dead.stdout), "host": "h", "what": "lmlab sweep", "started": "then"}) + "\n"
    )
    capsys.readouterr()
    assert main(["sweep", str(path), "--out", str(out)]) == 0
    assert "took over the stale lock" in capsys.readouterr().err
    assert not lock_path(out).exists() and read_results(out)[0]["status"] == "ok"


def test_attn_sink_claims_need_the_diagnostics():
    spec = {
        "name": "s",
        "model": TINY_MODEL,
        "train": TINY_TRAIN,
        "seeds": [1],
        "budget": {"steps": 2},
        "axes": {"grid": {"attn_output_gate": ["none", "elementwise"]}},
        "baseline": "attn_output_gate=none",
        "expect": [{"better": "attn_output_gate=elementwise", "than": "attn_output_gate=none", "metric": "attn_sink"}],
    }
    with pytest.raises(ConfigError, match="attn_sink reads the diagnostics: set train.diag_interval"):
        parse_spec(spec)
    assert parse_spec({**spec, "train": {**TINY_TRAIN, "diag_interval": 5}}).expect[0].metric == "attn_sink"


def test_run_outcome_comes_from_outcome_json_not_log_text(tmp_path, monkeypatch):
    """The worker tells a diverged run from a failed one by the ``outcome.json`` the trainer wrote: a
    reworded error message (or the old one printed by a run that failed otherwise) changes nothing, and an
    outcome left by an earlier attempt is never read."""
    from lmlab.lab import worker
    from lmlab.lab.plan import RunPlan

    fake = tmp_path / "fake-python"  # stands in for `python -m lmlab.cli train --out RUN ...`
    fake.write_text("""#!/bin/sh
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
mkdir -p "$out"
echo "$FAKE_SAY"
[ -n "$FAKE_OUTCOME" ] && printf '%s\\n' "$FAKE_OUTCOME" > "$out/outcome.json"
exit 2
""")
    fake.chmod(0o755)
    monkeypatch.setattr(worker.sys, "executable", str(fake))
    p = RunPlan(
        name="r",
        variant="v",
        seed=1,
        fields={},
        cfg=ModelConfig(vocab_size=257, **TINY_MODEL),
        tc=TrainConfig(max_steps=3),
        tokens_per_step=64,
        flops_per_token=1.0,
        data=tmp_path,
    )

    def attempt(say, outcome):
        monkeypatch.setenv("FAKE_SAY", say)
        monkeypatch.setenv("FAKE_OUTCOME", outcome)
        return worker.train_run(tmp_path / "sweep", p, 1, launch="exec")  # the fake is an executable

    diverged = '{"status": "diverged", "step": 7, "error": null}'
    assert attempt("the loss left the floats at step 7", diverged) == (True, None)  # reworded: still diverged
    ok, err = attempt(
        "5 non-finite steps in a row (an old message)",
        '{"status": "failed", "step": 2, "error": "DataError: shard 0 is truncated"}',
    )
    assert not ok and "DataError: shard 0 is truncated" in err  # the old text alone is not a divergence
    (tmp_path / "sweep" / "runs" / "r" / "outcome.json").write_text(diverged + "\n")
    ok, err = attempt("ConfigError: bad field", "")  # this attempt wrote none: the earlier one is not read
    assert not ok and "ConfigError: bad field" in err
    assert not (tmp_path / "sweep" / "runs" / "r" / "outcome.json").exists()
    ok, err = attempt("died", "not json")
    assert not ok and "outcome.json" in err and "could not be read" in err


def test_out_must_be_new_or_this_specs_sweep(byte_data, tmp_path):
    """--out holding a foreign spec.yaml, or another spec's sweep, is refused before anything is written
    (a new-user check ran a second spec into a sweep folder: it trained, mixed rows and broke both)."""
    spec = {
        "name": "tiny",
        "claim": "c",
        "model": TINY_MODEL,
        "train": TINY_TRAIN,
        "data": str(byte_data),
        "axes": {"zip": [{"label": "rope", "position": "rope"}]},
        "seeds": [1],
        "budget": {"steps": 2},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "spec.yaml").write_text("foo: bar\n")
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"is a non-empty folder that is not a sweep \(it holds notes.txt, spec.yaml"):
        run_sweep(path, out=foreign, jobs=1, log=lambda line: None)
    assert (foreign / "spec.yaml").read_text() == "foo: bar\n" and sorted(p.name for p in foreign.iterdir()) == [
        "notes.txt",
        "spec.yaml",
    ]
    other = tmp_path / "other-sweep"
    other.mkdir()
    (other / "spec.yaml").write_text("seeds: [1]\n")
    (other / "provenance.jsonl").write_text(json.dumps({"command": "lmlab sweep other.yaml", "sweep": "other"}) + "\n")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    for dry in (True, False):
        with pytest.raises(ConfigError, match="holds sweep 'other', not 'tiny'"):
            run_sweep(path, out=other, jobs=1, log=lambda line: None, dry_run=dry)
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before  # nothing written, nothing trained
