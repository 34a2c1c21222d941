"""Checkpoint integrity: a SHA-256 per file in each checkpoint's manifest, checked on resume and load;
a damaged newest checkpoint falls back to the previous intact one (saying so), pruning never removes
the last intact one, and a run with no intact checkpoint is refused without touching anything."""

import hashlib
import json
import shutil

import pytest
import torch

from lmlab.checkpoint import load_run, verify_checkpoint
from lmlab.config import ModelConfig
from lmlab.run_folder import MANIFEST, CheckpointError, checkpoint_dirs, metrics_lines, read_run
from lmlab.train import TrainConfig, Trainer


def cfg():
    return ModelConfig(vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)


def tc(max_steps, **kw):
    return TrainConfig(
        **{
            **dict(
                batch_size=2,
                max_steps=max_steps,
                checkpoint_interval=2,
                keep_checkpoints=2,
                eval_interval=100,
                log_interval=1,
                device="cpu",
                tensorboard=False,
                warmup_steps=2,
            ),
            **kw,
        }
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus_bytes):
    """A run trained 8 steps straight (every second step checkpointed), and a copy as a kill after the
    checkpoint of step 6 leaves it (checkpoints 4 and 6, the log up to step 6)."""
    root = tmp_path_factory.mktemp("integrity")
    Trainer.create(root / "straight", cfg(), tc(8, keep_checkpoints=0), corpus_bytes, progress=False).fit()
    shutil.copytree(root / "straight", root / "at6")
    for name in ("step_0000002", "step_0000008"):
        shutil.rmtree(root / "at6" / "checkpoints" / name)
    kept = [line for line, r in metrics_lines(root / "at6" / "metrics.jsonl") if r["step"] <= 6]
    (root / "at6" / "metrics.jsonl").write_text("".join(k + "\n" for k in kept))
    return root


def losses(run):
    return {r["step"]: r["loss"] for _, r in metrics_lines(run / "metrics.jsonl") if "loss" in r}


def tree_hashes(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def flip_bit(path, at=0.6):
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


def test_manifest_lists_every_file_with_its_sha256(reference):
    ckpt = checkpoint_dirs(reference / "at6")[-1]
    manifest = json.loads((ckpt / MANIFEST).read_text())
    on_disk = {p.name for p in ckpt.iterdir()} - {MANIFEST}
    assert (
        set(manifest["files"]) == on_disk == {"model.safetensors", "optimizer.pt", "rng.pt", "trainer.json", "run.yaml"}
    )
    for name, entry in manifest["files"].items():  # an independent hash of the bytes on disk
        data = (ckpt / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert verify_checkpoint(ckpt) == manifest["files"]


@pytest.mark.parametrize(
    "damage, file",
    [
        ("flip", "model.safetensors"),
        ("flip", "optimizer.pt"),
        ("flip", "rng.pt"),
        ("flip", "trainer.json"),
        ("truncate", "model.safetensors"),
        ("delete", "optimizer.pt"),
        ("delete", MANIFEST),
    ],
)
def test_damaged_newest_checkpoint_falls_back_and_continues_exactly(reference, tmp_path, damage, file, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    path = checkpoint_dirs(run)[-1] / file
    if damage == "flip":
        flip_bit(path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    else:
        path.unlink()
    trainer = Trainer.resume(run, tc=tc(8), progress=False)
    err = capsys.readouterr().err
    assert "falling back to the previous checkpoint step_0000004" in err and file in err
    assert trainer.step == 4
    trainer.fit()
    assert losses(run) == losses(reference / "straight")  # bit for bit, as if nothing had happened
    # the damaged step 6 was replaced by a good one, and the intact step 4 outlived it until step 8
    assert [c.name for c in checkpoint_dirs(run)] == ["step_0000006", "step_0000008"]
    for c in checkpoint_dirs(run):
        verify_checkpoint(c)


def test_pruning_keeps_the_older_intact_checkpoint(reference, tmp_path, capsys):
    """The reported case: optimizer.pt missing in the newest checkpoint; the first save after the
    resume (step 5) must not prune step 4, the only intact checkpoint besides it."""
    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    (checkpoint_dirs(run)[-1] / "optimizer.pt").unlink()
    trainer = Trainer.resume(run, tc=tc(8, checkpoint_interval=1, keep_checkpoints=2), progress=False)
    trainer.train_step()
    trainer.save()
    assert [c.name for c in checkpoint_dirs(run)] == ["step_0000004", "step_0000005", "step_0000006"]
    assert "optimizer.pt" in capsys.readouterr().err


def test_no_intact_checkpoint_is_refused_and_nothing_changes(reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    for ckpt in checkpoint_dirs(run):
        flip_bit(ckpt / "model.safetensors")
    before = tree_hashes(run)
    with pytest.raises(CheckpointError) as info:
        Trainer.resume(run, tc=tc(8), progress=False)
    msg = str(info.value)
    assert "\n" not in msg and "step_0000006/model.safetensors" in msg and "SHA-256" in msg
    assert "none of the 1 older checkpoint(s) is usable" in msg
    assert tree_hashes(run) == before


def test_eval_load_falls_back_too(reference, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    flip_bit(checkpoint_dirs(run)[-1] / "model.safetensors")
    _, _, _, _, ckpt = load_run(run)
    assert ckpt.name == "step_0000004"
    assert "model.safetensors" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="SHA-256"):  # an explicit --step does not fall back
        load_run(run, step=6)


def test_legacy_checkpoint_without_manifest_is_accepted_with_a_note(reference, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    for ckpt in checkpoint_dirs(run):  # as written before manifests: no manifest, no checkpoint_version
        (ckpt / MANIFEST).unlink()
        state = json.loads((ckpt / "trainer.json").read_text())
        del state["checkpoint_version"]
        (ckpt / "trainer.json").write_text(json.dumps(state))
    trainer = Trainer.resume(run, tc=tc(8), progress=False)
    assert trainer.step == 6
    assert "predates checksum manifests; its files are read unverified" in capsys.readouterr().err


def test_manifest_of_the_wrong_shape_names_the_key(reference, tmp_path):
    ckpt = tmp_path / "step_0000006"
    shutil.copytree(checkpoint_dirs(reference / "at6")[-1], ckpt)
    (ckpt / MANIFEST).write_text(json.dumps([1, 2]))
    with pytest.raises(CheckpointError, match="key 'files' must map file names"):
        verify_checkpoint(ckpt)
    (ckpt / MANIFEST).write_text(json.dumps({"files": {"model.safetensors": {"bytes": 1}, "trainer.json": {}}}))
    with pytest.raises(CheckpointError, match=r"key 'files.model.safetensors' must be an object with 'bytes'"):
        verify_checkpoint(ckpt)


def test_run_files_checked_against_the_checkpoint(reference, tmp_path):
    """A run's tokenizer.json and run.yaml model section must be those its checkpoint was trained with."""
    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    tok = (run / "tokenizer.json").read_text()
    (run / "tokenizer.json").write_text(tok.replace("}", " }", 1))  # same JSON meaning, other bytes
    with pytest.raises(CheckpointError, match="tokenizer.json.*differs from the tokenizer the run was trained"):
        load_run(run)
    (run / "tokenizer.json").write_text(tok)
    spec = (run / "run.yaml").read_text()
    (run / "run.yaml").write_text(spec.replace("rope_theta: 10000.0", "rope_theta: 10001.0"))
    with pytest.raises(CheckpointError, match=r"key 'model' differs .* \['rope_theta'\]"):
        Trainer.resume(run, tc=tc(8), progress=False)
    assert (run / "run.yaml").read_text() == spec.replace("rope_theta: 10000.0", "rope_theta: 10001.0")


def test_damaged_run_yaml_points_at_the_checkpoint_copy(reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    good = (run / "run.yaml").read_bytes()
    (run / "run.yaml").write_text("")
    with pytest.raises(CheckpointError, match=r"step_0000006/run.yaml.*copy it back"):
        read_run(run)
    assert (checkpoint_dirs(run)[-1] / "run.yaml").read_bytes() == good


def test_a_stop_mid_write_leaves_no_tmp_and_the_earlier_checkpoints(reference, tmp_path, monkeypatch):
    """A stop at once (KeyboardInterrupt) while a checkpoint is being written: its ``.tmp`` folder is removed
    and the earlier checkpoints are as they were (before: the ``.tmp`` folder stayed behind)."""
    import lmlab.checkpoint as ck

    run = tmp_path / "run"
    shutil.copytree(reference / "at6", run)
    before = tree_hashes(run / "checkpoints")
    state = json.loads((run / "checkpoints" / "step_0000006" / "trainer.json").read_text())
    writes = []

    def interrupted(path, data):
        writes.append(path.name)
        raise KeyboardInterrupt

    model_state = {"w": torch.zeros(2)}
    monkeypatch.setattr(ck, "_fsync_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(run, 7, model_state, None, {**state, "step": 7}, keep=0)
    assert writes and not (run / "checkpoints" / "step_0000007.tmp").exists()
    assert not (run / "checkpoints" / "step_0000007").exists()
    assert tree_hashes(run / "checkpoints") == before
