"""bench/sweep_batching.py's batched training (K runs as one vmapped module, per-member AdamW and
clipping) against the same runs trained separately with lmlab's training step (issue 14 item 4)."""

import importlib.util
from pathlib import Path

import torch

SPEC = importlib.util.spec_from_file_location(
    "sweep_batching", Path(__file__).resolve().parents[1] / "bench" / "sweep_batching.py"
)
sb = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sb)


def test_batched_members_match_separate_runs():
    # different seeds and learning rates 10x apart: each member must follow its own run
    assert sb.check_equal("small", torch.device("cpu"), k=2, steps=3) < 1e-4


def test_members_keep_their_own_learning_rate():
    """Swapping the two members' learning rates makes them differ from the separate runs: the check
    can fail, and per-member lr really reaches the update."""
    cfg = sb.model_config("small")
    data = sb.batches(cfg, 4, 3, torch.device("cpu"))
    lrs = sb.lrs_of(2, 10.0)
    sep = sb.Separate(cfg, [0, 1], lrs, torch.device("cpu"), None)
    bat = sb.Batched(cfg, [0, 1], lrs[::-1], torch.device("cpu"), None)
    for d in data:
        a, b = sep.step(d), bat.step(d)
    assert max(abs(u - v) for u, v in zip(a, b)) > 1e-3


def test_clipping_is_per_member(monkeypatch):
    """With a clip threshold far below both runs' gradient norms every step is clipped, by a different
    coefficient per run and per step (Adam's later steps see it): the members still follow their runs."""
    monkeypatch.setattr(sb, "CLIP", 0.05)
    assert sb.check_equal("small", torch.device("cpu"), k=2, steps=4) < 1e-4
