"""Nothing lost: SIGINT/SIGTERM during `lmlab train` keep the work (the rerun resumes bit for bit), one
writer per run folder (a second `lmlab train` is refused, a stale lock taken over), and commands only
remove or overwrite what they made (`lmlab import`'s temporary folder, `lmlab plot`'s PNGs)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lmlab.cli import main
from lmlab.fsutil import lock_path
from lmlab.run_folder import checkpoint_dirs, metrics_lines

SETS = [
    "d_model=32",
    "n_layers=2",
    "n_heads=4",
    "context_length=32",
    "batch_size=8",
    "max_steps=40",
    "log_interval=1",
    "eval_interval=15",
    "eval_windows=2",
    "device=cpu",
    "tensorboard=false",
    "warmup_steps=5",
    "resid_dropout=0.1",
]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def train_cmd(data, out, sets=SETS):
    return [
        sys.executable,
        "-m",
        "lmlab.cli",
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--no-progress",
        *[a for s in sets for a in ("--set", s)],
    ]


def losses(run):
    return {r["step"]: r["loss"] for _, r in metrics_lines(run / "metrics.jsonl") if "loss" in r}


def tree(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(folder).rglob("*"))
        if p.is_file()
    }


def wait_for_lines(path, n, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if path.is_file() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{path} never reached {n} lines (exit status {proc.poll()})")


@pytest.fixture(scope="module")
def straight(tmp_path_factory, corpus_bytes):
    out = tmp_path_factory.mktemp("straight") / "run"
    subprocess.run(train_cmd(corpus_bytes, out), check=True, env=ENV, capture_output=True)
    return out


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_run_saves_and_the_same_command_resumes_bit_for_bit(straight, corpus_bytes, tmp_path, sig, code):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        train_cmd(corpus_bytes, out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wait_for_lines(out / "metrics.jsonl", 4, proc)
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"lmlab train: interrupted by {sig.name} at step ") and "run the same command" in last
    stopped = int(last.split(" at step ")[1].split()[0])
    assert 4 <= stopped < 40, "the run finished before the signal"
    # checkpoint_interval=0: without the signal handler nothing would have been saved before step 40
    assert [c.name for c in checkpoint_dirs(out)] == [f"step_{stopped:07d}"]
    assert not lock_path(out).exists()
    proc = subprocess.run(train_cmd(corpus_bytes, out), env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"resuming {out} from step {stopped}" in proc.stderr
    a, b = losses(straight), losses(out)
    assert sorted(a) == sorted(b) == list(range(1, 41))
    assert a == b  # bit-identical per-step losses (dropout on: the RNG state was saved too)


def test_second_train_into_the_same_folder_is_refused(corpus_bytes, tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(
        train_cmd(corpus_bytes, out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_lines(out / "metrics.jsonl", 2, first)
        first.send_signal(signal.SIGSTOP)  # keep it mid-run (holding its lock) while the second one starts
        second = subprocess.run(train_cmd(corpus_bytes, out), env=ENV, capture_output=True, text=True, timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    err = first.communicate(timeout=120)[1]
    assert first.returncode == 0, err
    assert second.returncode == 2
    line = second.stderr.strip().splitlines()
    assert len(line) == 1 and f"is in use by lmlab train (PID {first.pid} on " in line[0]
    steps = [r["step"] for _, r in metrics_lines(out / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 41))  # one writer: every step logged once
    assert not lock_path(out).exists()


def test_stale_lock_is_taken_over_with_a_note(corpus_bytes, tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "run"
    lock_path(out).write_text(
        json.dumps({"pid": dead.pid, "host": "here", "what": "lmlab train", "started": "earlier"}) + "\n"
    )
    sets = [a for s in SETS[:-3] + ["max_steps=2"] for a in ("--set", s)]
    assert main(["train", "--data", str(corpus_bytes), "--out", str(out), "--no-progress", *sets]) == 0
    assert (
        f"took over the stale lock {str(lock_path(out))!r} left by lmlab train (PID {dead.pid}"
        in capsys.readouterr().err
    )
    assert not lock_path(out).exists() and [c.name for c in checkpoint_dirs(out)] == ["step_0000002"]


# --- own only what you made ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A Llama-family HF model folder written by lmlab's exporter (config.json + model.safetensors)."""
    from lmlab.config import ModelConfig
    from lmlab.interop.hf import export_model
    from lmlab.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=64, context_length=16, d_model=16, n_layers=1, n_heads=2))
    out = tmp_path_factory.mktemp("hf") / "model"
    export_model(model, out, family="llama")
    return out


def test_import_leaves_a_folder_named_like_its_temporary_one_alone(hf_folder, tmp_path):
    out = tmp_path / "X"
    mine = tmp_path / "X.import-tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    (mine / "sub").mkdir()
    (mine / "sub" / "data.bin").write_bytes(os.urandom(100))
    before = tree(mine)
    assert main(["import", str(hf_folder), "--out", str(out)]) == 0
    assert tree(mine) == before
    assert (out / "run.yaml").is_file() and checkpoint_dirs(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X", "X.import-tmp"]  # no temporary folder left


def test_import_from_a_source_folder_named_like_the_temporary_one(hf_folder, tmp_path):
    import shutil

    src = tmp_path / "X.import-tmp"
    shutil.copytree(hf_folder, src)
    before = tree(src)
    assert main(["import", str(src), "--out", str(tmp_path / "X")]) == 0
    assert tree(src) == before
    assert (tmp_path / "X" / "run.yaml").is_file()


def test_failed_import_removes_only_its_own_temporary_folder(hf_folder, tmp_path, monkeypatch, capsys):
    import lmlab.checkpoint as ck

    (tmp_path / "X.import-tmp").mkdir()
    (tmp_path / "X.import-tmp" / "keep.txt").write_text("mine")

    def full(*a, **k):
        raise ck.CheckpointError("disk full (simulated)")

    monkeypatch.setattr(ck, "save_checkpoint", full)
    assert main(["import", str(hf_folder), "--out", str(tmp_path / "X")]) == 2
    assert "disk full (simulated)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X.import-tmp"]
    assert (tmp_path / "X.import-tmp" / "keep.txt").read_text() == "mine"


def test_plot_never_overwrites_a_users_png(straight, tmp_path, capsys):
    out = tmp_path / "figures"
    out.mkdir()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.savefig(out / "loss.png")  # a user's own matplotlib figure
    plt.close(fig)
    before = tree(out)
    assert main(["plot", str(straight), "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip().splitlines()
    assert len(line) == 1 and "already holds loss.png, which lmlab did not write" in line[0]
    assert tree(out) == before
    # lmlab's own plots are replaced by a new plot into the same folder
    own = tmp_path / "own"
    assert main(["plot", str(straight), "--out", str(own)]) == 0
    first = tree(own)
    assert main(["plot", str(straight), "--out", str(own)]) == 0
    assert set(tree(own)) == set(first) == {"loss.png", "lr.png"}


@pytest.mark.parametrize("section, key", [("model", "kv_shared_layers"), ("train", "compile_scope")])
def test_same_command_on_a_run_yaml_with_a_damaged_key_is_refused_naming_it(
    straight, corpus_bytes, tmp_path, section, key, capsys
):
    """The same `lmlab train` again compares the run's settings with the command's; a key of run.yaml
    that no config has (one flipped bit: kv_shared_|ayers) is refused naming the file, not a traceback."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(straight, run)
    text = (run / "run.yaml").read_text()
    assert key in yaml.safe_load(text)[section]
    (run / "run.yaml").write_text(text.replace(f"  {key}:", f"  {key[:-3]}|{key[-2:]}:", 1))
    before = tree(run)
    capsys.readouterr()
    assert main(train_cmd(corpus_bytes, run)[3:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lmlab train: error: ") and "run.yaml" in err[-1], err
    assert f"{key[:-3]}|{key[-2:]}" in err[-1] and "Traceback" not in "\n".join(err)
    assert tree(run) == before
