"""The corruption matrix: every file of a run folder and of its data folder x {truncated, empty, bit flip,
deleted, wrong JSON/YAML type, missing key} x {train (the same command again: resume), eval, generate},
through ``lmlab.cli.main`` in-process. Each case must end without a traceback; an error is one line
``lmlab CMD: error: ...`` naming the damaged file, with exit status 2 and no file changed; a command that
succeeds either never reads the damaged file or said on stderr that it fell back past it (a damaged
checkpoint file); nothing outside the run folder's own outputs ever changes."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from lmlab.cli import main

SETS = [
    "d_model=32",
    "n_layers=1",
    "n_heads=2",
    "context_length=32",
    "batch_size=4",
    "max_steps=4",
    "checkpoint_interval=2",
    "keep_checkpoints=2",
    "eval_interval=4",
    "eval_windows=2",
    "log_interval=1",
    "device=cpu",
    "tensorboard=false",
    "warmup_steps=1",
]
CKPT = "run/checkpoints/step_0000004"
# name: (path under the case folder, kind, a required key)
FILES = {
    "weights": (f"{CKPT}/model.safetensors", "bin", None),
    "optimizer": (f"{CKPT}/optimizer.pt", "bin", None),
    "rng": (f"{CKPT}/rng.pt", "bin", None),
    "trainer_state": (f"{CKPT}/trainer.json", "json", "step"),
    "ckpt_manifest": (f"{CKPT}/manifest.json", "json", "files"),
    "run_yaml": ("run/run.yaml", "yaml", "train"),
    "run_tokenizer": ("run/tokenizer.json", "json", "model"),
    "metrics": ("run/metrics.jsonl", "jsonl", "step"),
    "data_manifest": ("data/manifest.json", "json", "splits"),
    "data_tokenizer": ("data/tokenizer.json", "json", "model"),
    "train_shard": ("data/train.bin", "bin", None),
    "val_shard": ("data/val.bin", "bin", None),
}
DAMAGE = ("truncate", "empty", "bitflip", "delete", "wrong_type", "missing_key")
COMMANDS = ("train", "eval", "generate")
# (file, command) pairs where the command does not read the file, so succeeding silently is right
NOT_READ = {
    ("metrics", "eval"),
    ("metrics", "generate"),
    ("train_shard", "eval"),
    ("data_manifest", "generate"),
    ("data_tokenizer", "generate"),
    ("train_shard", "generate"),
    ("val_shard", "generate"),
}
CHECKPOINT_FILES = {"weights", "optimizer", "rng", "trainer_state", "ckpt_manifest"}


@pytest.fixture(scope="module")
def built(tmp_path_factory, shakespeare):
    """A BPE-300 data folder and a run trained 4 steps on it (checkpoints at steps 2 and 4)."""
    root = tmp_path_factory.mktemp("matrix")
    src = root / "src"
    src.mkdir()
    for name, size in (("macbeth_gut.txt", 10000), ("tempest_gut.txt", 2500)):  # a small val split: fast evals
        (src / name).write_bytes((shakespeare / name).read_bytes()[5000 : 5000 + size])
    base = root / "base"
    assert (
        main(
            [
                "prepare",
                "--data",
                str(src),
                "--out",
                str(base / "data"),
                "--tokenizer",
                "bpe",
                "--vocab-size",
                "300",
                "--val-docs",
                "tempest_gut.txt",
            ]
        )
        == 0
    )
    assert main(train_argv(base)) == 0
    assert sorted(p.name for p in (base / "run" / "checkpoints").iterdir()) == ["step_0000002", "step_0000004"]
    return base


def train_argv(case: Path) -> list[str]:
    return [
        "train",
        "--data",
        str(case / "data"),
        "--out",
        str(case / "run"),
        "--no-progress",
        *[a for s in SETS for a in ("--set", s)],
    ]


def argv(command: str, case: Path) -> list[str]:
    if command == "train":
        return train_argv(case)
    if command == "eval":
        return ["eval", str(case / "run"), "--data", str(case / "data"), "--json"]
    return ["generate", str(case / "run"), "--prompt", "KING.", "--max-new-tokens", "3", "--seed", "1"]


def tree(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def damage(path: Path, kind: str, how: str, key) -> bool:
    """Damage ``path``; False when ``how`` does not apply to this kind of file."""
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "bitflip":
        flipped = bytearray(data)
        flipped[int(len(data) * 0.6)] ^= 0x10
        path.write_bytes(bytes(flipped))
    elif how == "delete":
        path.unlink()
    elif kind == "bin":
        return False
    elif how == "wrong_type":
        if kind == "jsonl":
            lines = data.decode().splitlines()
            path.write_text("\n".join(["[1, 2]"] + lines[1:]) + "\n")
        else:
            path.write_text("- 1\n- 2\n" if kind == "yaml" else "[1, 2]")
    else:  # missing_key
        if kind == "yaml":
            import yaml

            obj = yaml.safe_load(data)
            del obj[key]
            path.write_text(yaml.safe_dump(obj))
        elif kind == "jsonl":
            lines = data.decode().splitlines()
            first = json.loads(lines[0])
            del first[key]
            path.write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
        else:
            obj = json.loads(data)
            del obj[key]
            path.write_text(json.dumps(obj))
    return True


CASES = [(f, h, c) for f in FILES for h in DAMAGE for c in COMMANDS if FILES[f][1] != "bin" or h in DAMAGE[:4]]


@pytest.mark.parametrize("name, how, command", CASES)
def test_damaged_file(built, tmp_path, name, how, command, capsys):
    case = tmp_path / "case"
    shutil.copytree(built, case, symlinks=True)
    run_yaml = case / "run" / "run.yaml"  # point the copied run at the copied data folder
    run_yaml.write_text(run_yaml.read_text().replace(str((built / "data").resolve()), str((case / "data").resolve())))
    rel, kind, key = FILES[name]
    assert damage(case / rel, kind, how, key)
    before = tree(case)
    capsys.readouterr()
    rc = main(argv(command, case))  # an uncaught exception (a traceback) fails the test here
    err = capsys.readouterr().err
    assert "Traceback" not in err
    after = tree(case)
    assert {k: v for k, v in after.items() if k.startswith("data/")} == {
        k: v for k, v in before.items() if k.startswith("data/")
    }, "the data folder changed"
    file_name = Path(rel).name
    if rc != 0:
        lines = err.strip().splitlines()
        assert rc == 2 and lines and lines[-1].startswith(f"lmlab {command}: error: "), err
        assert file_name in lines[-1] or Path(rel).parent.name in lines[-1], lines[-1]
        assert after == before, "a refused command changed files"
        return
    if name == "metrics" and command == "train" and how != "bitflip":  # a lost log: said, training goes on
        assert "warning: " in err and "metrics.jsonl" in err and "its log will lack those steps" in err, err
        return
    if (name, how, command) == ("data_manifest", "bitflip", "eval"):  # the flipped byte: the train split's
        damaged, original = (json.loads(p.read_text()) for p in (case / rel, built / rel))  # hash, unread by eval
        assert damaged["splits"]["train"] != original["splits"]["train"]
        assert dict(damaged, splits=None) == dict(original, splits=None)
        assert damaged["splits"]["val"] == original["splits"]["val"]
        assert after == before
        return
    if (name, command) in NOT_READ or (name == "metrics" and how == "bitflip"):
        # not read (or a log line whose flipped byte still parses): the command's own outputs only
        if command != "train":
            assert after == before
        return
    # success after reading a damaged file is only right when a damaged checkpoint was skipped, loudly
    assert name in CHECKPOINT_FILES, f"{command} accepted a damaged {rel} silently"
    assert "falling back to the previous checkpoint step_0000002" in err and file_name in err, err
    if command != "train":
        assert after == before
