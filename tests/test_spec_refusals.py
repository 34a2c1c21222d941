"""Issue 44 item 5: spec and config parsing refuses, naming the key, what it used to accept silently or
turn into a traceback: non-mapping sections, non-finite context multiples, a preset that is no preset,
empty axes, null sections, non-string labels, duplicate YAML/JSON keys and over-long integers."""

import pytest

from lmlab.cli import main
from lmlab.config import ConfigError
from lmlab.config_files import load_mapping
from lmlab.lab.spec import parse_spec

BASE = {
    "name": "t",
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context_length": 16},
    "seeds": [1],
    "budget": {"steps": 2},
}


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"decode": [1, 2]}, "'decode:' must be a mapping of field names to values, got [1, 2]"),
        ({"eval_contexts": [float("inf")]}, "eval_contexts=[inf] must be a list of finite context multiples"),
        ({"eval_contexts": [float("nan")]}, "eval_contexts=[nan] must be a list of finite context multiples"),
        ({"preset": [1]}, "preset=[1] is not a model family preset; choose one of"),
        ({"preset": "llama-9"}, "preset='llama-9' is not a model family preset"),
        ({"axes": {"grid": {}}}, "axes.grid is empty"),
        ({"axes": {"zip": []}}, "axes.zip is empty"),
        ({"model": None}, "'model: null' is empty"),
        ({"train": None}, "'train: null' is empty"),
        ({"axes": None}, "'axes: null' is empty"),
        ({"notes": [["a", "b"], ["a", "b"]]}, "notes must be text, got list"),
        ({"claim": {"x": 1}}, "claim must be text, got dict"),
        (
            {"axes": {"zip": [{"label": 1, "d_model": 32}, {"label": "b", "d_model": 64}]}},
            "axes.zip[0].label=1 must be a non-empty string",
        ),
        (
            {"axes": {"zip": [{"label": "a", "d_model": 32}, {"label": [2], "d_model": 64}]}},
            "axes.zip[1].label=[2] must be a non-empty string",
        ),
        ({"axes": {"zip": {"label": ["a", 7], "d_model": [32, 64]}}}, "axes.zip.label[1]=7 must be a non-empty string"),
        ({"axes": {"grid": {"act": [{"label": "", "activation": "gelu"}]}}}, "label='' must be a non-empty string"),
    ],
)
def test_spec_refuses_by_name(extra, needle):
    with pytest.raises(ConfigError) as exc:
        parse_spec({**BASE, **extra})
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_duplicate_keys_and_long_integers_are_refused_with_their_line(tmp_path):
    (tmp_path / "d.yaml").write_text("name: a\nmodel:\n  d_model: 32\n  d_model: 64\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'd_model' \(first given at line 3\) at line 4, column 3"):
        load_mapping(tmp_path / "d.yaml")
    (tmp_path / "d.json").write_text('{"seeds": [1], "seeds": [2]}')
    with pytest.raises(ConfigError, match="duplicate key 'seeds' in one object"):
        load_mapping(tmp_path / "d.json")
    (tmp_path / "n.yaml").write_text("seeds: [" + "9" * 5000 + "]\n")
    with pytest.raises(
        ConfigError, match=r"seeds\[0\]: an integer of 5000 digits \(at most 4000\) at line 1, column 9"
    ):
        load_mapping(tmp_path / "n.yaml")
    (tmp_path / "n2.yaml").write_text("model:\n  n_layers: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"n_layers: an integer of 5000 digits"):
        load_mapping(tmp_path / "n2.yaml")
    # YAML merge keys are not duplicates; 40-digit integers still read (the config then names the field)
    (tmp_path / "m.yaml").write_text("a: &b {x: 1}\nc:\n  <<: *b\n  y: 2\nz: " + "9" * 40 + "\n")
    assert load_mapping(tmp_path / "m.yaml") == {"a": {"x": 1}, "c": {"x": 1, "y": 2}, "z": int("9" * 40)}


def test_cli_names_the_file_and_the_override(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text("name: s\nname: t\nseeds: [1]\n")
    assert main(["sweep", str(tmp_path / "s.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s.yaml" in err[0] and "duplicate key 'name'" in err[0]
    assert main(["train", "--set", "d_model=" + "9" * 5000, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set 'd_model=999" in err[0] and "an integer of 5000 digits" in err[0]
    assert not (tmp_path / "r").exists()
