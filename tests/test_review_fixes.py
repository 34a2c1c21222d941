"""Review findings fixed: --overwrite never deletes what prepare did not write, prepared folders get a
plain mkdir's mode, a symlink does not bypass a run folder's lock, damaged sweep files give one line."""

import os
import shutil

import pytest

from lmlab.cli import main
from lmlab.fsutil import LockError, acquire_lock


def _err(capsys):
    return capsys.readouterr().err.strip().splitlines()


def test_overwrite_replaces_only_prepared_data(tmp_path, small_corpus, capsys):
    out = tmp_path / "data"
    assert main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(out)]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert (out.stat().st_mode & 0o777) == (0o777 & ~mask)  # not mkdtemp's 0700
    (out / "notes.txt").write_text("mine")
    assert main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(out),
                 "--overwrite"]) == 2
    err = _err(capsys)
    assert "also holds notes.txt" in err[-1] and (out / "notes.txt").read_text() == "mine"
    foreign = tmp_path / "webapp"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"name": "my webapp"}')
    (foreign / "a.txt").write_text("precious")
    assert main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(foreign),
                 "--overwrite"]) == 2
    assert "not a prepared data folder lmlab can read" in _err(capsys)[-1]
    assert (foreign / "a.txt").read_text() == "precious"
    (out / "notes.txt").unlink()  # a folder holding only what prepare wrote is replaced
    assert main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(out),
                 "--overwrite"]) == 0


def test_a_symlink_does_not_bypass_a_folder_lock(tmp_path):
    real = tmp_path / "run"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    held = acquire_lock(real, "lmlab train")
    try:
        with pytest.raises(LockError):
            acquire_lock(link, "lmlab train")
    finally:
        held.release()


def test_report_on_damaged_sweep_files_gives_one_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "results.jsonl").write_text('{"run": "a-s1", "variant": "a", "seed": 1, "status": "ok", "val_bpb": 2.0}\n')
    for text, says in ((": :", "could not be parsed"), ("[1, 2]", "must hold a mapping"), (b"\xff", "not UTF-8")):
        (sweep / "spec.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
        assert main(["report", str(sweep)]) == 2
        err = _err(capsys)
        assert len(err) == 1 and says in err[0] and "spec.yaml" in err[0]
    shutil.copy(sweep / "results.jsonl", tmp_path / "keep.jsonl")
    (sweep / "spec.yaml").write_text("seeds: [1]\n")
    (sweep / "timing.json").write_text("{")
    assert main(["report", str(sweep)]) == 2
    assert "timing.json' could not be read" in _err(capsys)[-1]
    assert (sweep / "results.jsonl").read_bytes() == (tmp_path / "keep.jsonl").read_bytes()
