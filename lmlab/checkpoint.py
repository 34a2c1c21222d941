"""Run folders and checkpoints.

A run folder holds:
- ``run.yaml``: the ModelConfig (``model``), the TrainConfig (``train``) and the data folder (``data``);
- ``tokenizer.json``: a copy of the data's tokenizer, so ``eval``/``generate`` need nothing else;
- ``metrics.jsonl``: one JSON object per logged step / evaluation;
- ``checkpoints/step_XXXXXXX/``: ``model.safetensors`` (weights), ``optimizer.pt`` (AdamW state,
  read back with ``torch.load(weights_only=True)``), ``trainer.json`` (step, tokens, RNG seed).

Checkpoints are written into a ``.tmp`` folder beside and renamed into place, so a checkpoint folder
that exists is complete; an interrupted write leaves only a ``.tmp`` folder, which is never loaded.
Weights are never unpickled: safetensors only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM

RUN_FILE = "run.yaml"


class CheckpointError(RuntimeError):
    """A run folder or checkpoint that is missing, incomplete, corrupt or of another config."""


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and not p.name.endswith(".tmp"))


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
                    state: dict, keep: int = 3) -> Path:
    """Write checkpoint ``step`` atomically and keep the newest ``keep`` (0 = all). Returns its folder.

    Raises CheckpointError when the write fails (e.g. a full disk); earlier checkpoints stay intact."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f"step_{step:07d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if getattr(model, "cfg", None) is not None and model.cfg.tie_embeddings:
            weights.pop("lm_head.weight", None)  # shares storage with embed.weight
        save_file(weights, str(tmp / "model.safetensors"))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer.json").write_text(json.dumps(state, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {str(final)!r}: {exc}; "
                              f"earlier checkpoints in {str(root)!r} are intact") from None
    if keep:
        for old in checkpoint_dirs(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def read_run(run_dir: str | Path) -> dict:
    """The parsed ``run.yaml`` of a run folder; raises CheckpointError when absent or unreadable."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        raise CheckpointError(f"{str(run_dir)!r} is not an lmlab run folder (no {RUN_FILE}); "
                              f"give the folder that `lmlab train --out` created")
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{str(path)!r} could not be read: {exc}") from None


def load_weights(model: TransformerLM, ckpt_dir: Path) -> None:
    """Load ``model.safetensors`` of ``ckpt_dir`` into ``model`` strictly; raises CheckpointError for a
    truncated/corrupt file or tensors of another config."""
    path = ckpt_dir / "model.safetensors"
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} is unreadable (truncated or corrupt?): {exc}") from None
    expected = model.state_dict()
    if model.cfg.tie_embeddings:
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    wrong = sorted(k for k in set(expected) & set(weights) if expected[k].shape != weights[k].shape)
    if missing or extra or wrong:
        detail = "; ".join(x for x in (
            f"missing {missing[:3]}" if missing else "", f"unexpected {extra[:3]}" if extra else "",
            f"shape mismatch {[(k, tuple(weights[k].shape), tuple(expected[k].shape)) for k in wrong[:3]]}" if wrong else "",
        ) if x)
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this model config: {detail}")
    model.load_state_dict(weights, strict=False)


def load_run(run_dir: str | Path, step: Optional[int] = None, device: str = "cpu"):
    """Load a run's model (latest checkpoint or ``step``), config and tokenizer.

    Returns (model in eval mode, ModelConfig, Tokenizer, run dict, checkpoint folder).
    Raises CheckpointError when the run has no complete checkpoint or it does not fit its config."""
    from lmlab.data.tokenizer import Tokenizer

    run = read_run(run_dir)
    try:
        cfg = ModelConfig.from_dict(run["model"], source=f"{run_dir}/{RUN_FILE}")
    except (ConfigError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{run_dir}/{RUN_FILE}: invalid model config: {exc}") from None
    ckpts = checkpoint_dirs(run_dir)
    if step is not None:
        ckpts = [c for c in ckpts if c.name == f"step_{step:07d}"]
    if not ckpts:
        raise CheckpointError(f"run {str(run_dir)!r} has no complete checkpoint"
                              f"{f' at step {step}' if step is not None else ''}; train it first")
    tok = Tokenizer.load(Path(run_dir) / "tokenizer.json")
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"run {str(run_dir)!r}: tokenizer has {tok.vocab_size} tokens but the model "
                              f"config says vocab_size={cfg.vocab_size}")
    model = TransformerLM(cfg)
    load_weights(model, ckpts[-1])
    return model.to(device).eval(), cfg, tok, run, ckpts[-1]
