"""Run folders and checkpoints.

A run folder holds:
- ``run.yaml``: the ModelConfig (``model``), the TrainConfig (``train``) and the data folder (``data``);
- ``tokenizer.json``: a copy of the data's tokenizer, so ``eval``/``generate`` need nothing else;
- ``metrics.jsonl``: one JSON object per logged step / evaluation;
- ``checkpoints/step_XXXXXXX/``: ``model.safetensors`` (weights), ``optimizer.pt`` (AdamW state by
  parameter name) and ``rng.pt`` (RNG states), both read back with ``torch.load(weights_only=True)``,
  and ``trainer.json`` (step, tokens, counters).

Checkpoints are written into a ``.tmp`` folder beside and renamed into place, so a checkpoint folder
that exists is complete; an interrupted write leaves only a ``.tmp`` folder, which is never loaded.
Weights are never unpickled: safetensors only.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Optional

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save

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


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(run_dir: str | Path, step: int, model, optimizer, state: dict, keep: int = 3,
                    tied: Optional[bool] = None, rng: Optional[dict] = None) -> Path:
    """Write checkpoint ``step`` atomically and keep the newest ``keep`` (0 = all). Returns its folder.

    ``model``: a module or its state dict; ``optimizer``: an optimizer, an optimizer state dict (by
    parameter name, see ``lmlab.parallel.optimizer_state_by_name``) or None; ``state``: JSON-able trainer
    counters; ``rng``: RNG state tensors. With ``tied`` (default: the model's ``tie_embeddings``)
    ``lm_head.weight`` is not stored (it is ``embed.weight``).
    Raises CheckpointError when the write fails (e.g. a full disk); earlier checkpoints stay intact."""
    from lmlab.parallel import optimizer_state_by_name

    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:07d}"
    tmp = root / f"step_{step:07d}.tmp"
    if isinstance(model, torch.nn.Module):
        if tied is None:
            tied = bool(getattr(getattr(model, "cfg", None), "tie_embeddings", False))
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer_state_by_name(model, optimizer)
        weights = model.state_dict()
    else:
        weights = model
    weights = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    if tied:
        weights.pop("lm_head.weight", None)  # shares storage with embed.weight
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _fsync_write(tmp / "model.safetensors", save(weights))
        if optimizer is not None:
            buf = io.BytesIO()
            torch.save(optimizer, buf)
            _fsync_write(tmp / "optimizer.pt", buf.getvalue())
        if rng is not None:
            buf = io.BytesIO()
            torch.save(rng, buf)
            _fsync_write(tmp / "rng.pt", buf.getvalue())
        _fsync_write(tmp / "trainer.json", json.dumps(state, indent=1).encode())
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


def read_checkpoint(ckpt_dir: Path, model: TransformerLM, with_optimizer: bool = False):
    """Read and verify a checkpoint for ``model``: returns (weights, optimizer state or None,
    trainer state dict, rng dict or None). Weights through safetensors; optimizer and RNG states
    through ``torch.load(weights_only=True)``. Raises CheckpointError for unreadable files or
    tensors that do not fit the model."""
    weights = _verified_weights(model, ckpt_dir)
    opt = rng = None
    try:
        if with_optimizer and (ckpt_dir / "optimizer.pt").exists():
            opt = torch.load(ckpt_dir / "optimizer.pt", map_location="cpu", weights_only=True)
        if (ckpt_dir / "rng.pt").exists():
            rng = torch.load(ckpt_dir / "rng.pt", map_location="cpu", weights_only=True)
        state = json.loads((ckpt_dir / "trainer.json").read_text()) if (ckpt_dir / "trainer.json").exists() else {}
    except (OSError, RuntimeError, EOFError, json.JSONDecodeError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"checkpoint {str(ckpt_dir)!r} is unreadable (truncated or corrupt?): {exc}") from None
    if model.cfg.tie_embeddings:
        weights["lm_head.weight"] = weights["embed.weight"]
    return weights, opt, state, rng


def read_run(run_dir: str | Path) -> dict:
    """The parsed ``run.yaml`` of a run folder; raises CheckpointError when absent or unreadable."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        raise CheckpointError(f"{str(run_dir)!r} is not an lmlab run folder (no {RUN_FILE}); "
                              f"give the folder that `lmlab train --out` created")
    try:
        run = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise CheckpointError(f"{str(path)!r} is not UTF-8 text (a binary file?); it should be the run's YAML "
                              f"config") from None
    except (OSError, yaml.YAMLError) as exc:
        from lmlab.config import yaml_error_line

        raise CheckpointError(f"{str(path)!r} could not be read: {yaml_error_line(exc)}") from None
    if not isinstance(run, dict) or not isinstance(run.get("model"), dict):
        raise CheckpointError(f"{str(path)!r} has no 'model:' mapping; it is not an lmlab run file (lmlab train "
                              f"writes 'model:' and 'train:' sections)")
    return run


def _verified_weights(model: TransformerLM, ckpt_dir: Path) -> dict:
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
    return weights


def load_weights(model: TransformerLM, ckpt_dir: Path) -> None:
    """Load ``model.safetensors`` of ``ckpt_dir`` into ``model`` strictly; raises CheckpointError for a
    truncated/corrupt file or tensors of another config."""
    model.load_state_dict(_verified_weights(model, ckpt_dir), strict=False)


def load_run(run_dir: str | Path, step: Optional[int] = None, device: str = "cpu"):
    """Load a run's model (latest checkpoint or ``step``), config and tokenizer.

    Returns (model in eval mode, ModelConfig, Tokenizer, run dict, checkpoint folder).
    Raises CheckpointError when the run has no complete checkpoint or it does not fit its config."""
    from lmlab.data.tokenizer import Tokenizer

    run = read_run(run_dir)
    try:
        cfg = ModelConfig.from_dict(run["model"], source=f"{run_dir}/{RUN_FILE} model")
    except ConfigError as exc:  # already names the file
        raise CheckpointError(str(exc)) from None
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{run_dir}/{RUN_FILE}: invalid model config: {exc}") from None
    ckpts = checkpoint_dirs(run_dir)
    if step is not None:
        ckpts = [c for c in ckpts if c.name == f"step_{step:07d}"]
    if not ckpts:
        raise CheckpointError(f"run {str(run_dir)!r} has no complete checkpoint"
                              f"{f' at step {step}' if step is not None else ''}; train it first")
    if not (Path(run_dir) / "tokenizer.json").is_file():
        raise CheckpointError(f"run {str(run_dir)!r} has no tokenizer (no tokenizer.json: it was imported from a "
                              f"Hugging Face folder without one); copy the model's tokenizer.json into the run folder")
    tok = Tokenizer.load(Path(run_dir) / "tokenizer.json")
    imported = isinstance(run.get("hf"), dict)  # HF models often pad the embedding past the tokenizer's vocabulary
    if tok.vocab_size != cfg.vocab_size and not (imported and tok.vocab_size < cfg.vocab_size):
        raise CheckpointError(f"run {str(run_dir)!r}: tokenizer has {tok.vocab_size} tokens but the model "
                              f"config says vocab_size={cfg.vocab_size}")
    model = TransformerLM(cfg)
    load_weights(model, ckpts[-1])
    return model.to(device).eval(), cfg, tok, run, ckpts[-1]
