"""The run folder: the one module that names its files and reads and writes the records in it.

A run folder (``lmlab train --out DIR``) holds:
- ``run.yaml``: the ModelConfig (``model``), the TrainConfig (``train``) and the data folder (``data``);
  :func:`read_run` is its reader;
- ``tokenizer.json``: a copy of the data's tokenizer, so ``eval``/``generate`` need nothing else;
- ``metrics.jsonl``: one JSON object per logged step / evaluation (:func:`metrics_lines`,
  :func:`read_metrics_file`);
- ``outcome.json``: how the last ``Trainer.fit`` ended (:func:`write_outcome`, :func:`read_outcome`):
  ``running`` while it trains, then ``finished``, ``diverged`` (with the step), ``interrupted``
  (checkpointed) or ``failed`` (with the error); the ablation lab classifies its runs from this file,
  never from log text;
- ``checkpoints/step_XXXXXXX/`` (:func:`checkpoint_dirs`), each with its ``manifest.json``: written and
  verified by :mod:`lmlab.checkpoint`.

Nothing here imports torch: the lab's coordinator reads run folders without it. Errors are
:class:`CheckpointError`, naming the file and the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import yaml

from lmlab.fsutil import atomic_write_text
from lmlab.lab.validate import check_nesting

RUN_FILE = "run.yaml"
MANIFEST = "manifest.json"
OUTCOME_FILE = "outcome.json"
OUTCOMES = ("running", "finished", "diverged", "interrupted", "failed")


class CheckpointError(RuntimeError):
    """A run folder or checkpoint that is missing, incomplete, corrupt or of another config."""


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and not p.name.endswith(".tmp")
    )


def is_count(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def run_copy_hint(run_dir: Path) -> str:
    """'; the run's config as of its last checkpoint is in PATH (copy it back ...)' or '' when no
    checkpoint of run_dir keeps a copy of run.yaml: the tail of errors about a missing or damaged one."""
    copies = [c / RUN_FILE for c in checkpoint_dirs(run_dir) if (c / RUN_FILE).is_file()]
    return (f"; the run's config as of its last checkpoint is in {str(copies[-1])!r} (copy it back to restore "
            f"the run)" if copies else "")


def read_run(run_dir: str | Path) -> dict:
    """The parsed ``run.yaml`` of a run folder, its shape checked: ``model`` and ``train`` mappings,
    ``data`` a path or null, ``hf`` a mapping or absent. Raises CheckpointError when absent, unreadable
    or of the wrong shape, naming the file and the key (and the copy kept in the last checkpoint)."""
    path = Path(run_dir) / RUN_FILE
    hint = run_copy_hint(Path(run_dir))
    if not path.is_file():
        raise CheckpointError(f"{str(run_dir)!r} is not an lmlab run folder (no {RUN_FILE}); "
                              f"give the folder that `lmlab train --out` created{hint}")
    try:
        run = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise CheckpointError(f"{str(path)!r} is not UTF-8 text (a binary file?); it should be the run's YAML "
                              f"config{hint}") from None
    except RecursionError:  # YAML flow or block nesting thousands deep: PyYAML's parser recurses
        raise CheckpointError(f"{str(path)!r} could not be read: nesting too deep; it should be the run's YAML "
                              f"config{hint}") from None
    except (OSError, yaml.YAMLError) as exc:
        from lmlab.config import yaml_error_line

        raise CheckpointError(f"{str(path)!r} could not be read: {yaml_error_line(exc)}{hint}") from None
    if not isinstance(run, dict) or not isinstance(run.get("model"), dict):
        raise CheckpointError(f"{str(path)!r} has no 'model:' mapping; it is not an lmlab run file (lmlab train "
                              f"writes 'model:' and 'train:' sections){hint}")
    if not isinstance(run.get("train"), dict):
        raise CheckpointError(f"{str(path)!r}: key 'train' must be a mapping of training settings, got "
                              f"{run.get('train')!r:.60}{hint}")
    if run.get("data") is not None and not isinstance(run["data"], str):
        raise CheckpointError(f"{str(path)!r}: key 'data' must be a data folder path or null, got "
                              f"{run['data']!r:.60}{hint}")
    if run.get("hf") is not None and not isinstance(run["hf"], dict):
        raise CheckpointError(f"{str(path)!r}: key 'hf' must be a mapping (an imported model's origin), got "
                              f"{run['hf']!r:.60}{hint}")
    return run


def write_outcome(run_dir: str | Path, status: str, step: int, error: Optional[str] = None) -> None:
    """Record how training of ``run_dir`` ended (or that it is ``running``), atomically, in
    ``outcome.json``: ``{"status", "step", "error"}``. ``status`` is one of :data:`OUTCOMES`; ``step`` the
    last finished step (for ``diverged``: the step whose update was the last one skipped); ``error`` the
    one-line error of a ``failed`` run. A process killed outright (SIGKILL, out of memory) leaves
    ``running``: a reader that saw it exit reads that as a crash. Raises ValueError on a status not in
    OUTCOMES."""
    if status not in OUTCOMES:
        raise ValueError(f"outcome status must be one of {', '.join(OUTCOMES)}, got {status!r}")
    atomic_write_text(Path(run_dir) / OUTCOME_FILE,
                      json.dumps({"status": status, "step": int(step), "error": error}) + "\n")


def read_outcome(run_dir: str | Path) -> Optional[dict]:
    """The ``outcome.json`` of ``run_dir`` (see :func:`write_outcome`), or None when there is none (a run
    folder written before outcomes existed, or one that never started training). Raises CheckpointError
    naming the file when it is not such a record."""
    path = Path(run_dir) / OUTCOME_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{str(path)!r} could not be read as JSON ({exc}); it records how training ended "
                              f"(lmlab train writes it)") from None
    if not isinstance(rec, dict) or rec.get("status") not in OUTCOMES or not is_count(rec.get("step")):
        raise CheckpointError(f"{str(path)!r}: expected {{'status': one of {', '.join(OUTCOMES)}, 'step': a "
                              f"non-negative integer, 'error': text or null}}, got {str(rec)[:80]}")
    return rec


METRIC_NUMBERS = ("loss", "lr", "muon_lr", "grad_norm", "val_loss", "val_bpb", "val_tokens", "tokens",
                  "tokens_per_s", "mfu", "elapsed_s", "clip_fraction", "spikes")


def metrics_lines(path: str | Path) -> list[tuple[str, dict]]:
    """The lines of a run's ``metrics.jsonl`` with their records, validated: each a JSON object with a
    non-negative integer ``step``, and numbers where the trainer writes numbers (``loss``, ``lr``,
    ``val_loss``, ``tokens``, ``elapsed_s``, ...). A last line without its newline that is not JSON (cut
    by a kill mid-write) is dropped. Raises CheckpointError naming the file, the line and the key."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{str(path)!r} is not UTF-8 text (byte {exc.start}); expected one JSON object "
                              f"per line (lmlab's training log)") from None
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(check_nesting(line, f"{str(path)!r} line {i}", CheckpointError))
        except json.JSONDecodeError:
            if i == len(lines):  # no newline after it: the cut last line of a killed writer
                continue
            raise CheckpointError(f"{str(path)!r} line {i} is not JSON (damaged?); expected one JSON object per "
                                  f"line (lmlab's training log)") from None
        if not isinstance(rec, dict):
            raise CheckpointError(f"{str(path)!r} line {i}: expected a JSON object, got a JSON {type(rec).__name__}")
        if not is_count(rec.get("step")):
            raise CheckpointError(f"{str(path)!r} line {i}: key 'step' must be a non-negative integer, got "
                                  f"{rec.get('step', '(missing)')!r:.40}")
        for key in METRIC_NUMBERS:
            v = rec.get(key)
            if key in rec and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise CheckpointError(f"{str(path)!r} line {i}: key {key!r} must be a number, got {v!r:.40}")
        out.append((line, rec))
    return out


def read_metrics_file(path: str | Path) -> list[dict]:
    """The validated records of a ``metrics.jsonl`` (see :func:`metrics_lines`); [] when absent."""
    return [rec for _, rec in metrics_lines(path)] if Path(path).is_file() else []
