"""lmlab.run_folder: the one home of a run folder's files (outcome.json, the data folder's tokenizer check)."""

import json

import pytest

from lmlab.cli import main
from lmlab.config import ModelConfig
from lmlab.data.prepare import DataError, prepare
from lmlab.data.shards import TokenData
from lmlab.run_folder import CheckpointError, check_data_tokenizer, read_outcome, read_run, run_data, write_outcome
from lmlab.train import TrainConfig, Trainer

TINY = dict(context_length=32, d_model=32, n_layers=1, n_heads=2)


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory, byte_data):
    run = tmp_path_factory.mktemp("run_folder") / "run"
    tc = TrainConfig(batch_size=2, max_steps=3, log_interval=1, eval_interval=100, device="cpu", tensorboard=False)
    Trainer.create(run, ModelConfig(vocab_size=257, **TINY), tc, byte_data, progress=False).fit()
    return run


def test_a_finished_fit_records_its_outcome(byte_run):
    assert read_outcome(byte_run) == {"status": "finished", "step": 3, "error": None}


def test_outcome_records_are_checked(tmp_path):
    assert read_outcome(tmp_path) is None  # a folder from before outcomes: nothing to read
    with pytest.raises(ValueError, match="one of running, finished, diverged, interrupted, failed, got 'done'"):
        write_outcome(tmp_path, "done", 3)
    write_outcome(tmp_path, "failed", 2, "DataError: shard 0 is truncated")
    assert read_outcome(tmp_path) == {"status": "failed", "step": 2, "error": "DataError: shard 0 is truncated"}
    for bad in ('{"status": "finished", "step": -1}', '{"status": "ok", "step": 1}', "[1, 2]"):
        (tmp_path / "outcome.json").write_text(bad)
        with pytest.raises(CheckpointError, match="outcome.json.*expected"):
            read_outcome(tmp_path)
    (tmp_path / "outcome.json").write_bytes(b'{"status": "fin')
    with pytest.raises(CheckpointError, match="outcome.json' could not be read as JSON"):
        read_outcome(tmp_path)


def test_data_of_another_tokenizer_is_refused_by_eval_and_run_data(byte_run, byte_data, small_corpus, tmp_path, capsys):
    other = tmp_path / "bpe"
    prepare(small_corpus, other, "bpe", vocab_size=300, val_docs=["tempest_gut.txt"])
    run = read_run(byte_run)
    assert run_data(byte_run, run).folder == TokenData(byte_data).folder  # its own: accepted
    with pytest.raises(DataError, match="was not prepared with the tokenizer of run"):
        run_data(byte_run, run, other)
    with pytest.raises(DataError, match="has no data folder .it was imported.; pass --data DIR"):
        run_data(byte_run, dict(run, data=None))
    with pytest.raises(DataError, match="was not prepared with the tokenizer"):  # ids past the model's vocab
        check_data_tokenizer(byte_run, TokenData(byte_data), vocab_size=200)
    assert main(["eval", str(byte_run), "--data", str(other)]) == 2
    assert "was not prepared with the tokenizer of run" in capsys.readouterr().err
    assert main(["eval", str(byte_run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["bits_per_byte"] > 0


def test_threads_are_decided_in_one_module(monkeypatch):
    """lmlab.threads alone calls torch.set_num_threads; the sweep shares out physical cores; a block's
    thread count comes back after it, also on an exception."""
    from pathlib import Path

    import torch

    import lmlab
    from lmlab import threads

    root = Path(lmlab.__file__).parent
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "set_num_threads(" in p.read_text())
    assert callers == ["threads.py"]
    monkeypatch.setattr(threads, "physical_cores", lambda: 8)
    assert [threads.sweep_threads(j, k) for j, k in ((1, 1), (2, 1), (2, 2), (3, 1), (16, 1))] == [8, 4, 2, 2, 1]
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with threads.using_threads(1) as n:
            assert n == 1 and torch.get_num_threads() == 1
            raise RuntimeError
    assert torch.get_num_threads() == before
