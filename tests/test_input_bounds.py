"""Input bounds: sizes checked before any work (grids, seeds, lengths, nesting depth); imports, prompts
and checkpoints refused in one line naming what is wrong; the Python API agreeing with the CLI. One test
per defect, each failing before its fix."""

import re
import time

import pytest

from lmlab.cli import main
from lmlab.config import ConfigError
from lmlab.lab.spec import parse_spec

BASE = {
    "name": "t",
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context_length": 16},
    "seeds": [1],
    "budget": {"steps": 2},
}


def _spec_file(tmp_path, text):
    path = tmp_path / "big.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("dry", [True, False])
def test_a_million_variant_grid_is_refused_at_once_with_its_count(tmp_path, capsys, dry):
    grid = "\n".join(
        f"    {f}: [{', '.join(str(i) for i in range(1, 11))}]"
        for f in ("lr", "warmup_steps", "batch_size", "grad_accum", "max_steps", "weight_decay")
    )
    path = _spec_file(tmp_path, f"name: big\nbudget: {{steps: 2}}\nseeds: [1]\naxes:\n  grid:\n{grid}\n")
    t0 = time.perf_counter()
    rc = main(["sweep", str(path), "--out", str(tmp_path / "sw")] + (["--dry-run"] if dry else []))
    assert time.perf_counter() - t0 < 2
    err = capsys.readouterr().err
    assert rc != 0 and "plans 1,000,000 runs" in err and "--max-runs 1000000" in err
    assert not (tmp_path / "sw").exists()


def test_the_cli_refuses_a_million_runs_in_under_two_seconds_end_to_end(tmp_path):
    import subprocess
    import sys

    grid = ", ".join(
        f"{f}: [{', '.join(str(i) for i in range(1, 11))}]"
        for f in ("lr", "warmup_steps", "batch_size", "grad_accum", "max_steps", "weight_decay")
    )
    path = _spec_file(tmp_path, f"name: big\nbudget: {{steps: 2}}\naxes: {{grid: {{{grid}}}}}\n")
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "lmlab.cli", "sweep", str(path), "--dry-run"], capture_output=True, text=True, timeout=60
    )
    assert time.perf_counter() - t0 < 2  # the count comes before torch is imported
    assert done.returncode == 2 and "plans 1,000,000 runs" in done.stderr and not done.stdout


def test_a_hundred_thousand_seeds_are_refused_at_once(tmp_path, capsys):
    path = _spec_file(
        tmp_path, "name: big\nbudget: {steps: 2}\nseeds: [" + ", ".join(map(str, range(1, 100001))) + "]\n"
    )
    t0 = time.perf_counter()
    rc = main(["sweep", str(path), "--dry-run"])
    assert time.perf_counter() - t0 < 15  # PyYAML parsing the 100,000 numbers (~2 s); the count is arithmetic
    err = capsys.readouterr().err
    assert rc != 0 and "plans 100,000 runs" in err and "100,000 seed(s)" in err


def test_the_run_limit_is_the_users_to_raise_or_lower():
    raw = {**BASE, "seeds": [1, 2, 3], "axes": {"grid": {"lr": [1e-3, 2e-3]}}, "tune": {"warmup_steps": [0, 1]}}
    assert parse_spec(raw).planned_runs == 12
    assert parse_spec({**raw, "max_runs": 12}).planned_runs == 12
    with pytest.raises(ConfigError, match=r"plans 12 runs .*more than max_runs=11"):
        parse_spec({**raw, "max_runs": 11})
    with pytest.raises(ConfigError, match=r"plans 12 runs .*more than max_runs=5"):
        parse_spec({**raw, "max_runs": 100}, max_runs=5)
    with pytest.raises(ConfigError, match=r"max_runs=0 must be an integer >= 1"):
        parse_spec({**raw, "max_runs": 0})
    # two-stage tuning: tune seeds 1, 2 over the 2 warmup values, seed 3 at the chosen one: 2 cells x (2 x 2 + 1)
    assert parse_spec({**raw, "tune_seeds": [1, 2]}).planned_runs == 10
    with pytest.raises(ConfigError, match=r"plans 10 runs .*two-stage.*more than max_runs=9"):
        parse_spec({**raw, "tune_seeds": [1, 2], "max_runs": 9})


def test_the_planned_count_is_shown_in_a_dry_run(tmp_path, capsys):
    path = _spec_file(
        tmp_path,
        "name: small\nmodel: {d_model: 32, n_layers: 1, n_heads: 2, context_length: 16}\n"
        "budget: {steps: 2}\nseeds: [1, 2]\naxes: {grid: {lr: [0.001, 0.002]}}\n",
    )
    assert main(["sweep", str(path), "--dry-run", "--out", str(tmp_path / "sw")]) == 0
    out = capsys.readouterr().out
    assert "planning 4 run(s)" in out
    # every run has the same tokens per parameter: one value, not "x to x"
    assert re.search(r"tokens per non-embedding parameter: [0-9.e+-]+ \(", out), out


def test_deep_json_and_yaml_are_one_line_naming_the_file(tmp_path):
    from lmlab.config_files import load_mapping
    from lmlab.data.sources import DataError, iter_records

    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "deep.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    for name in ("deep.yaml", "deep.json"):
        with pytest.raises(ConfigError, match=f"{name}.*nesting too deep"):
            load_mapping(tmp_path / name)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "fine"}\n{"text": "hi", "x": ' + "[" * 100000 + "]" * 100000 + "}\n")
    with pytest.raises(DataError, match=r"c.jsonl' row 1: JSON nested more than 64 deep \(100,001 levels\)"):
        list(iter_records(corpus, "json"))


def _tiny_model():
    import torch

    from lmlab.config import ModelConfig
    from lmlab.model import TransformerLM

    torch.manual_seed(0)
    return TransformerLM(ModelConfig(vocab_size=257, context_length=32, d_model=16, n_layers=1, n_heads=2))


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    import yaml

    from lmlab.checkpoint import save_checkpoint
    from lmlab.data.tokenizer import Tokenizer

    run = tmp_path_factory.mktemp("gen44") / "run"
    run.mkdir()
    model = _tiny_model()
    Tokenizer.bytes_tokenizer().save(run / "tokenizer.json")
    (run / "run.yaml").write_text(yaml.safe_dump({"model": model.cfg.to_dict(), "train": {}, "data": "none"}))
    save_checkpoint(run, 1, model, None, {"step": 1, "tokens_seen": 0})
    return run


def test_generation_lengths_past_the_context_are_one_line_or_a_sliding_window(byte_run, capsys):
    rc = main(["generate", str(byte_run), "--prompt", "a", "--prompt", "b", "--max-new-tokens", str(10**15)])
    err = capsys.readouterr().err
    assert rc != 0 and "max_new_tokens=1000000000000000" in err and len(err.strip().splitlines()) == 1
    # one prompt: the window slides (the cache holds at most the context), so any length streams
    assert main(["generate", str(byte_run), "--prompt", "a", "--max-new-tokens", "100", "--seed", "1"]) == 0
    assert len(capsys.readouterr().out) > 60


def test_grad_accum_past_the_training_split_is_refused_before_allocating(byte_data, tmp_path):
    from lmlab.config import ModelConfig
    from lmlab.train import TrainConfig, Trainer

    cfg = ModelConfig(vocab_size=257, context_length=32, d_model=16, n_layers=1, n_heads=2)
    t0 = time.perf_counter()
    with pytest.raises(
        ConfigError,
        match=r"grad_accum=1000000000000: a step of batch_size x grad_accum x ranks = "
        r"8 x 1000000000000 x 1 = 8,000,000,000,000 windows is more than the ",
    ):
        Trainer.create(
            tmp_path / "r",
            cfg,
            TrainConfig(batch_size=8, grad_accum=10**12, max_steps=1, tensorboard=False),
            byte_data,
            progress=False,
        )
    assert time.perf_counter() - t0 < 10 and not (tmp_path / "r").exists()


def test_eval_windows_past_the_validation_split_are_capped_with_a_note(byte_data, tmp_path, capsys):
    from lmlab.config import ModelConfig
    from lmlab.train import TrainConfig, Trainer

    cfg = ModelConfig(vocab_size=257, context_length=32, d_model=16, n_layers=1, n_heads=2)
    tc = TrainConfig(
        batch_size=2, max_steps=1, eval_interval=1, eval_windows=10**12, tensorboard=False, checkpoint_interval=0
    )
    t0 = time.perf_counter()
    trainer = Trainer.create(tmp_path / "r", cfg, tc, byte_data, progress=False)
    trainer.fit()
    trainer.close() if hasattr(trainer, "close") else None
    assert time.perf_counter() - t0 < 60
    assert "eval_windows=1,000,000,000,000 is more than the 188 windows the validation split" in capsys.readouterr().err


@pytest.fixture()
def hf_folder(tmp_path):
    import json

    from lmlab.config import ModelConfig
    from lmlab.interop.hf import export_model
    from lmlab.model import TransformerLM

    model = TransformerLM(
        ModelConfig(
            vocab_size=64,
            context_length=32,
            d_model=32,
            n_layers=2,
            n_heads=4,
            d_ff=64,
            norm_type="rmsnorm",
            norm_position="pre",
            norm_bias=False,
            bias="none",
            activation="swiglu",
            position="rope",
            rope_style="half",
            tie_embeddings=False,
        )
    )
    export_model(model, tmp_path / "hf", family="llama")
    path = tmp_path / "hf"
    return path, json.loads((path / "config.json").read_text())


def _import_with(hf_folder, tmp_path, capsys, change):
    import json

    path, hf = hf_folder
    (path / "config.json").write_text(json.dumps({**hf, **change}))
    t0 = time.perf_counter()
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) != 0
    assert time.perf_counter() - t0 < 10 and not (tmp_path / "run").exists()
    err = capsys.readouterr().err
    assert "config.json" in err and len(err.strip().splitlines()) == 1
    return err


def test_import_refuses_more_layers_than_the_weights_hold_at_once(hf_folder, tmp_path, capsys):
    err = _import_with(hf_folder, tmp_path, capsys, {"num_hidden_layers": 1000000000})
    assert "num_hidden_layers=1000000000 but the weights hold 2 layer(s) (indices 0-1)" in err


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"torch_dtype": "float7"}, "torch_dtype='float7' is not a dtype; valid: 'auto' or a torch dtype name"),
        ({"dtype": [1]}, "dtype=[1] is not a dtype; valid: "),
    ],
)
def test_import_refuses_unknown_dtypes(hf_folder, tmp_path, capsys, change, needle):
    assert needle in _import_with(hf_folder, tmp_path, capsys, change)


def test_import_refuses_non_finite_weights_naming_the_tensor(hf_folder, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    path, _ = hf_folder
    state = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    state[name][0, 0] = float("nan")
    save_file(state, str(path / "model.safetensors"))
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert f"tensor {name!r} holds 1 NaN or infinite value" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_import_still_takes_a_sound_folder(hf_folder, tmp_path):
    assert main(["import", str(hf_folder[0]), "--out", str(tmp_path / "run")]) == 0


@pytest.fixture(scope="module")
def bpe():
    from lmlab.data.tokenizer import Tokenizer

    return Tokenizer.train_bpe(["HAMLET: to be, or not to be, that is the question"] * 20, 300)


def test_prompts_with_invalid_utf8_are_encoded_as_their_bytes(bpe):
    from lmlab.data.tokenizer import Tokenizer, TokenizerError

    prompt = b"HAM\xffLET \xfe\xc3".decode("utf-8", errors="surrogateescape")  # as argv gives it
    assert Tokenizer.bytes_tokenizer().encode(prompt) == list(b"HAM\xffLET \xfe\xc3")
    ids = bpe.encode(prompt)
    assert ids == bpe.encode_bytes(b"HAM\xffLET \xfe\xc3") and bpe.decode_bytes(ids) == b"HAM\xffLET \xfe\xc3"
    with pytest.raises(TokenizerError, match=r"lone surrogate U\+D800 at character 1"):
        bpe.encode("a\ud800")


def _hf_tokenizer(specials=()):
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    from lmlab.data.tokenizer import Tokenizer

    hf = HF(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    if specials:
        hf.add_special_tokens(list(specials))
    return Tokenizer("hf", hf)


def test_a_tokenizer_without_separators_encodes_prompts_and_names_what_needs_one():
    from lmlab.data.tokenizer import TokenizerError

    tok = _hf_tokenizer()
    assert tok.encode("a b a") == [0, 1, 0]
    with pytest.raises(TokenizerError, match="none of the document separators .*give a prompt"):
        tok.eot_id
    with pytest.raises(
        TokenizerError,
        match=r"byte 0xff at character 2, which is not UTF-8, and this tokenizer "
        r"has no byte tokens",
    ):
        tok.encode(b"a \xff".decode("utf-8", errors="surrogateescape"))


PROMPT = "\x1b]0;pwned\x07HAM" + b"\xff".decode("utf-8", errors="surrogateescape") + "LET\x9b"


def test_generate_escapes_control_characters_and_invalid_bytes_by_default(byte_run, capsys):
    import re

    assert main(["generate", str(byte_run), "--prompt", PROMPT, "--max-new-tokens", "40", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\\x1b]0;pwned\\x07HAM\\xffLET\\x9b")
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out)


def test_generate_raw_writes_the_prompt_as_it_came(byte_run, capsysbinary):
    assert main(["generate", str(byte_run), "--prompt", PROMPT, "--max-new-tokens", "2", "--raw"]) == 0
    assert capsysbinary.readouterr().out.startswith(b"\x1b]0;pwned\x07HAM\xffLET\xc2\x9b")


@pytest.mark.parametrize(
    "step,state,needle",
    [
        (3, {"step": 3}, "missing key 'tokens_seen'"),
        (3, {"step": 4, "tokens_seen": 0}, "key 'step' is 4 but its folder is step 3"),
        (3, {"step": 3, "tokens_seen": -1}, "key 'tokens_seen' must be a non-negative integer"),
        (3, {"step": 3, "tokens_seen": 0, "loss_ema": float("nan")}, "key 'loss_ema' must be a finite number"),
        (3, {"step": 3, "tokens_seen": 0, "note": object()}, "not JSON-able"),
        (-1, {"step": -1, "tokens_seen": 0}, "step=-1 must be a non-negative integer"),
        (3, [3], "expected a JSON object of trainer counters"),
    ],
)
def test_save_checkpoint_refuses_what_resuming_would_refuse(tmp_path, step, state, needle):
    from lmlab.checkpoint import save_checkpoint
    from lmlab.run_folder import CheckpointError

    with pytest.raises(CheckpointError, match=needle):
        save_checkpoint(tmp_path / "r", step, _tiny_model(), None, state)
    assert not (tmp_path / "r" / "checkpoints").exists() or not any((tmp_path / "r" / "checkpoints").iterdir())


def test_save_checkpoint_refuses_foreign_optimizer_and_rng_states(tmp_path):
    import torch

    from lmlab.checkpoint import read_checkpoint, save_checkpoint
    from lmlab.run_folder import CheckpointError

    model, state = _tiny_model(), {"step": 2, "tokens_seen": 64}
    with pytest.raises(CheckpointError, match="key 'state' holds 'nope'"):
        save_checkpoint(tmp_path / "r", 2, model, {"state": {"nope": {}}, "param_groups": [{"params": []}]}, state)
    with pytest.raises(CheckpointError, match="expected RNG states"):
        save_checkpoint(tmp_path / "r", 2, model, None, state, rng={"cpu": torch.zeros(3)})
    opt = torch.optim.AdamW(model.parameters())
    path = save_checkpoint(tmp_path / "r", 2, model, opt, state, rng={"cpu": torch.get_rng_state()})
    assert read_checkpoint(path, model, with_optimizer=True)[2]["tokens_seen"] == 64


def test_allowed_special_encodes_listed_special_texts_as_tokens(bpe):
    from lmlab.data.tokenizer import EOT, Tokenizer, TokenizerError

    text = f"to be{EOT}or not"
    assert EOT.encode() in bpe.decode_bytes(bpe.encode(text))  # default: text stays text
    assert bpe.eot_id not in bpe.encode(text)
    ids = bpe.encode(text, allowed_special={EOT})
    assert ids == bpe.encode("to be") + [bpe.eot_id] + bpe.encode("or not")
    assert bpe.encode(text, allowed_special="all") == ids
    byt = Tokenizer.bytes_tokenizer()
    assert byt.encode(text, allowed_special=[EOT]) == list(b"to be") + [256] + list(b"or not")
    assert 256 not in byt.encode(text)
    hf = _hf_tokenizer(["<s>"])
    assert hf.encode("a<s>b", allowed_special=["<s>"]) == [0, hf.eot_id, 1]
    with pytest.raises(TokenizerError, match=r"allowed_special: '<x>' is not a special token .*'<\|endoftext\|>'"):
        bpe.encode(text, allowed_special=["<x>"])


DEEP = "[" * 100000 + "]" * 100000


def test_deep_json_in_an_import_config_a_tokenizer_a_checkpoint_and_a_data_manifest_is_one_line(
    hf_folder, tmp_path, byte_run, byte_data, capsys
):
    import shutil

    from lmlab.checkpoint import read_checkpoint
    from lmlab.data.shards import TokenData
    from lmlab.data.sources import DataError
    from lmlab.data.tokenizer import Tokenizer, TokenizerError
    from lmlab.run_folder import CheckpointError, checkpoint_dirs

    (hf_folder[0] / "config.json").write_text('{"model_type": "llama", "x": ' + DEEP + "}")
    assert main(["import", str(hf_folder[0]), "--out", str(tmp_path / "run")]) == 2
    assert "config.json': JSON nested more than 64 deep (100,001 levels)" in capsys.readouterr().err
    (tmp_path / "tokenizer.json").write_text(DEEP)
    deep = r"JSON nested more than 64 deep \(100,000 levels\)"
    with pytest.raises(TokenizerError, match=r"tokenizer file .*tokenizer.json': " + deep):
        Tokenizer.load(tmp_path / "tokenizer.json")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint_dirs(byte_run)[-1], ckpt)
    (ckpt / "trainer.json").write_text(DEEP)
    (ckpt / "manifest.json").unlink()  # read without a manifest, as an older lmlab wrote it
    with pytest.raises(CheckpointError, match=r"trainer.json': " + deep):
        read_checkpoint(ckpt, _tiny_model())
    data = tmp_path / "data"
    shutil.copytree(byte_data, data)
    (data / "manifest.json").write_text(DEEP)
    with pytest.raises(DataError, match=r"manifest .*manifest.json': " + deep + ".*re-run `lmlab prepare`"):
        TokenData(data)


def test_a_deep_yaml_run_file_is_one_line(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "run.yaml' could not be read: nesting too deep" in err and len(err.strip().splitlines()) == 1
