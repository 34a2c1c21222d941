"""torchrun with the gloo backend on CPU, 2 processes: DDP and FSDP2 per-step losses equal the
single-process run with the same global batch; checkpoints move between 1 and 2 ranks."""

import json
import os
import shutil
import subprocess
import sys

import pytest

MODEL = ["d_model=32", "n_layers=2", "n_heads=4", "n_kv_heads=2", "context_length=32"]
TRAIN = [
    "log_interval=1",
    "eval_interval=100",
    "eval_windows=2",
    "device=cpu",
    "warmup_steps=2",
    "lr=3e-3",
    "tensorboard=false",
    "dtype=fp32",
    "max_steps=8",
    "checkpoint_interval=4",
    "keep_checkpoints=0",
]


def run(out, data, sets, ranks=1, resume=False):
    args = ["train", "--data", str(data), "--out", str(out), "--no-progress"]
    args += ["--resume"] if resume else []
    for s in sets:
        args += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if ranks == 1:
        cmd = [sys.executable, "-m", "lmlab.cli", *args]
    else:
        torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
        cmd = [torchrun, "--standalone", f"--nproc_per_node={ranks}", "-m", "lmlab.cli", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses(out):
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def assert_same(got, ref):
    assert sorted(got) == sorted(ref) == list(range(1, 9))
    assert max(abs(got[s] - ref[s]) for s in ref) <= 1e-5, (got, ref)


@pytest.fixture(scope="module")
def single(tmp_path_factory, corpus_bytes):
    out = tmp_path_factory.mktemp("single") / "run"
    run(out, corpus_bytes, MODEL + TRAIN + ["batch_size=4"])
    return out


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, corpus_bytes):
    out = tmp_path_factory.mktemp("fsdp") / "run"
    run(out, corpus_bytes, MODEL + TRAIN + ["batch_size=2", "parallel=fsdp"], ranks=2)
    return out


def test_ddp_two_ranks_equal_one(tmp_path, corpus_bytes, single):
    run(tmp_path / "run", corpus_bytes, MODEL + TRAIN + ["batch_size=2", "parallel=ddp"], ranks=2)
    assert_same(losses(tmp_path / "run"), losses(single))


def test_fsdp_two_ranks_equal_one(fsdp_run, single):
    assert_same(losses(fsdp_run), losses(single))


@pytest.mark.parametrize("direction", ["2to1", "1to2"])
def test_checkpoint_moves_between_world_sizes(tmp_path, corpus_bytes, single, fsdp_run, direction):
    """Copy a finished 8-step run, drop its step-8 checkpoint, resume from step 4 on the other world
    size: steps 5..8 must reproduce the single-process losses."""
    src, ranks, batch = (fsdp_run, 1, 4) if direction == "2to1" else (single, 2, 2)
    out = tmp_path / "run"
    shutil.copytree(src, out)
    shutil.rmtree(out / "checkpoints" / "step_0000008")
    proc = run(out, corpus_bytes, [f"batch_size={batch}", "parallel=fsdp"], ranks=ranks, resume=True)
    assert "from step 4" in proc.stderr
    assert_same(losses(out), losses(single))
