"""Fuzz of every ModelConfig and TrainConfig field through ``lmlab train --set`` (in-process): wrong
types, NaN/inf, negative, huge and unknown enum values are all refused with exit 2 and one line naming
the field, nothing is written; and ``lmlab analyze`` answers any valid size in bounded time."""

import dataclasses
import typing

import pytest

import lmlab.config as config_module
import lmlab.train as train_module
from lmlab.cli import main
from lmlab.config import ModelConfig
from lmlab.config_checks import MAX_SIZE
from lmlab.data.prepare import prepare
from lmlab.train import TrainConfig

HUGE = "1" + "0" * 40  # 10**40: past int64 and any model size
NOT_A_NUMBER = ["true", "false", "abc", "[1]", "{a: 1}", "nan", "inf", "-inf", "-1", "1e400"]
BAD = {  # annotation -> values that no field of that type may accept
    int: NOT_A_NUMBER + ["1.5", HUGE, str(MAX_SIZE * 2**33)],
    float: NOT_A_NUMBER,
    bool: ["1", "0", "2", "1.0", "abc", "[true]", "{a: 1}"],
    str: ["no_such_choice", "1", "true", "[a]", "{a: 1}"],
    dict: [
        "abc",
        "1",
        "true",
        "[1]",
        "{type: nope, factor: 2}",
        "{type: linear, factor: nan}",
        "{type: linear, factor: true}",
        "{type: linear}",
        "{type: linear, factor: 2, extra: 1}",
    ],
    list: ["norm", "1", "true", "[weights]", "{a: 1}", "[[norm]]", "[1]"],
}
EXTRA = {  # fields whose valid values are narrower than their type's
    "rope_fraction": ["0", "1.5"],
    "embd_dropout": ["1"],
    "attn_dropout": ["1"],
    "resid_dropout": ["1"],
    "min_lr_ratio": ["1.5"],
    "decay_fraction": ["0"],
    "beta1": ["1"],
    "beta2": ["1"],
    "spike_ratio": ["1", "0.5"],
    "layer_pattern": ["LX", "''", "L"],  # 'L' needs sliding_window, which the demo does not set
    "device": ["gpu", "cuda:x", "cuda:", "CPU"],
    "t5_num_buckets": ["1"],
    "norm_eps": ["0"],
    "lr": ["0"],
    "eps": ["0"],
    "batch_size": ["0"],
    "max_steps": ["0"],
    "n_layers": ["0", "1e8"],
    "seed": [str(2**63)],
}


def _kind(cls, f) -> tuple[type, bool]:
    """(base type, optional?) of a dataclass field from its annotation."""
    hint = typing.get_type_hints(cls, vars(config_module) | vars(train_module))[f.name]
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    return typing.get_origin(base) or base, optional


def cases():
    out = []
    for cls in (ModelConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            base, optional = _kind(cls, f)
            values = list(BAD[base]) + EXTRA.get(f.name, [])
            if not optional:
                values.append("null")
            out += [(f.name, v) for v in values]
    return out


CASES = cases()


@pytest.fixture(scope="module")
def data(tmp_path_factory, small_corpus):
    folder = tmp_path_factory.mktemp("fuzz") / "data"
    prepare(small_corpus, folder, "bytes")
    return folder


def test_every_field_is_fuzzed():
    names = {f.name for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)}
    assert {name for name, _ in CASES} == names and len(CASES) > 400


@pytest.mark.parametrize("field,value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_bad_set_value_is_refused_naming_the_field(field, value, data, tmp_path, capsys):
    out = tmp_path / "run"
    # max_steps=1 first: were the value accepted, the run would be one step, not a hang (and the test fails)
    rc = main(
        [
            "train",
            "--config",
            "demo",
            "--data",
            str(data),
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "max_steps=1",
            "--set",
            f"{field}={value}",
        ]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2, f"{field}={value} was accepted"
    assert len(err) == 1 and err[0].startswith("lmlab train: error:"), err
    assert f"{field}=" in err[0] or f"{field}." in err[0] or f"'{field}'" in err[0], err[0]
    assert not out.exists()


def test_run_yaml_without_train_section_is_refused(data, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--config",
                "demo",
                "--data",
                str(data),
                "--out",
                str(run),
                "--no-progress",
                "--set",
                "max_steps=1",
                "--set",
                "eval_interval=1",
                "--set",
                "compile=false",
            ]
        )
        == 0
    )
    text = (run / "run.yaml").read_text()
    head, _, rest = text.partition("train:")
    tail = rest.split("\n", 1)[1]
    kept = "\n".join(line for line in tail.splitlines() if not line.startswith((" ", "-")))
    (run / "run.yaml").write_text(head + kept + "\n")
    capsys.readouterr()
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["train", "--out", str(run), "--resume", "--set", "max_steps=2", "--no-progress"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert "run.yaml" in line and "'train'" in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def _analyze(tmp_path, model: str, capsys) -> tuple[int, str, str]:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model:\n" + model)
    rc = main(["analyze", "--config", str(cfg)])
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_analyze_deep_models_in_bounded_time(tmp_path, capsys):
    """n_layers=1e8 (it hung): answered by formula, the meta-device cross-check skipped and said so;
    the figures scale exactly with the depth (checked against a 2-layer model)."""
    import json

    small = "  d_model: 64\n  n_heads: 4\n  vocab_size: 256\n  context_length: 32\n"
    rc, out, _ = _analyze(tmp_path, small + "  n_layers: 100000000\n", capsys)
    assert rc == 0 and "skipped (n_layers=100,000,000 > 512" in out
    cfg = tmp_path / "cfg.yaml"
    res = {}
    for n in (2, 100_000_000):
        cfg.write_text("model:\n" + small + f"  n_layers: {n}\n")
        assert main(["analyze", "--config", str(cfg), "--json"]) == 0
        res[n] = json.loads(capsys.readouterr().out)
    assert res[2]["instantiated"]["equal"] is True
    per_layer = res[2]["params"]["per_layer"]["total"]
    assert res[10**8]["params"]["layers"] == 10**8 * per_layer
    attn2 = res[2]["flops"]["forward_attention"]
    assert res[10**8]["flops"]["forward_attention"] == pytest.approx(attn2 * 5e7, rel=1e-12)
    kv2 = res[2]["kv_cache"]["bf16"]["total"]
    assert res[10**8]["kv_cache"]["bf16"]["total"] == kv2 * 5 * 10**7


def test_analyze_windowed_pattern_counts_each_kind(tmp_path, capsys):
    """A tiled L/G pattern at depth 3e6: the layer kinds counted from one period of the pattern."""
    import json

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "model:\n  d_model: 64\n  n_heads: 4\n  vocab_size: 256\n  context_length: 64\n"
        "  n_layers: 3000000\n  sliding_window: 8\n  layer_pattern: LLG\n"
    )
    assert main(["analyze", "--config", str(cfg), "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)["intensity"]["kinds"]
    assert kinds["local"]["layers"] == 2_000_000 and kinds["global"]["layers"] == 1_000_000
    # one layer more ends mid-pattern ('L'): counted without walking the layers
    cfg.write_text(cfg.read_text().replace("3000000", "3000001"))
    assert main(["analyze", "--config", str(cfg), "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)["intensity"]["kinds"]
    assert kinds["local"]["layers"] == 2_000_001 and kinds["global"]["layers"] == 1_000_000


def test_analyze_refuses_sizes_past_the_limit(tmp_path, capsys):
    rc, _, err = _analyze(tmp_path, f"  n_layers: {HUGE}\n", capsys)
    assert rc == 2 and "n_layers=" in err and "too large" in err and len(err.strip().splitlines()) == 1
