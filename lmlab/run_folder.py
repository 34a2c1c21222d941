"""The run folder: the one module that names its files and reads and writes the records in it.

A run folder (``lmlab train --out DIR``) holds:
- ``run.yaml``: the ModelConfig (``model``), the TrainConfig (``train``) and the data folder (``data``);
  :func:`read_run` is its reader;
- ``tokenizer.json``: a copy of the data's tokenizer, so ``eval``/``generate`` need nothing else; a data
  folder used with the run must hold the same file (:func:`run_data`, :func:`check_data_tokenizer`);
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
import os
import sys
from pathlib import Path
from typing import Optional

import yaml

from lmlab.data.prepare import DataError
from lmlab.data.shards import TokenData
from lmlab.fsutil import atomic_write_bytes, atomic_write_text
from lmlab.json_checks import check_nesting

RUN_FILE = "run.yaml"
METRICS_FILE = "metrics.jsonl"
TOKENIZER_FILE = "tokenizer.json"
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
    return (
        f"; the run's config as of its last checkpoint is in {str(copies[-1])!r} (copy it back to restore the run)"
        if copies
        else ""
    )


def read_run(run_dir: str | Path) -> dict:
    """The parsed ``run.yaml`` of a run folder, its shape checked: ``model`` and ``train`` mappings,
    ``data`` a path or null, ``hf`` a mapping or absent. Raises CheckpointError when absent, unreadable
    or of the wrong shape, naming the file and the key (and the copy kept in the last checkpoint)."""
    path = Path(run_dir) / RUN_FILE
    hint = run_copy_hint(Path(run_dir))
    if not path.is_file():
        raise CheckpointError(
            f"{str(run_dir)!r} is not an lmlab run folder (no {RUN_FILE}); "
            f"give the folder that `lmlab train --out` created{hint}"
        )
    try:
        run = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise CheckpointError(
            f"{str(path)!r} is not UTF-8 text (a binary file?); it should be the run's YAML config{hint}"
        ) from None
    except RecursionError:  # YAML flow or block nesting thousands deep: PyYAML's parser recurses
        raise CheckpointError(
            f"{str(path)!r} could not be read: nesting too deep; it should be the run's YAML config{hint}"
        ) from None
    except (OSError, yaml.YAMLError) as exc:
        from lmlab.config_files import yaml_error_line

        raise CheckpointError(f"{str(path)!r} could not be read: {yaml_error_line(exc)}{hint}") from None
    if not isinstance(run, dict) or not isinstance(run.get("model"), dict):
        raise CheckpointError(
            f"{str(path)!r} has no 'model:' mapping; it is not an lmlab run file (lmlab train "
            f"writes 'model:' and 'train:' sections){hint}"
        )
    if not isinstance(run.get("train"), dict):
        raise CheckpointError(
            f"{str(path)!r}: key 'train' must be a mapping of training settings, got {run.get('train')!r:.60}{hint}"
        )
    if run.get("data") is not None and not isinstance(run["data"], str):
        raise CheckpointError(
            f"{str(path)!r}: key 'data' must be a data folder path or null, got {run['data']!r:.60}{hint}"
        )
    if run.get("hf") is not None and not isinstance(run["hf"], dict):
        raise CheckpointError(
            f"{str(path)!r}: key 'hf' must be a mapping (an imported model's origin), got {run['hf']!r:.60}{hint}"
        )
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
    atomic_write_text(
        Path(run_dir) / OUTCOME_FILE, json.dumps({"status": status, "step": int(step), "error": error}) + "\n"
    )


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
        raise CheckpointError(
            f"{str(path)!r} could not be read as JSON ({exc}); it records how training ended (lmlab train writes it)"
        ) from None
    if not isinstance(rec, dict) or rec.get("status") not in OUTCOMES or not is_count(rec.get("step")):
        raise CheckpointError(
            f"{str(path)!r}: expected {{'status': one of {', '.join(OUTCOMES)}, 'step': a "
            f"non-negative integer, 'error': text or null}}, got {str(rec)[:80]}"
        )
    return rec


METRIC_NUMBERS = (
    "loss",
    "lr",
    "muon_lr",
    "grad_norm",
    "val_loss",
    "val_bpb",
    "val_tokens",
    "tokens",
    "tokens_per_s",
    "mfu",
    "elapsed_s",
    "clip_fraction",
    "spikes",
)


def metrics_lines(path: str | Path) -> list[tuple[str, dict]]:
    """The lines of a run's ``metrics.jsonl`` with their records, validated: each a JSON object with a
    non-negative integer ``step``, and numbers where the trainer writes numbers (``loss``, ``lr``,
    ``val_loss``, ``tokens``, ``elapsed_s``, ...). A last line without its newline that is not JSON (cut
    by a kill mid-write) is dropped. Raises CheckpointError naming the file, the line and the key."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"{str(path)!r} is not UTF-8 text (byte {exc.start}); expected one JSON object "
            f"per line (lmlab's training log)"
        ) from None
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
            raise CheckpointError(
                f"{str(path)!r} line {i} is not JSON (damaged?); expected one JSON object per "
                f"line (lmlab's training log)"
            ) from None
        if not isinstance(rec, dict):
            raise CheckpointError(f"{str(path)!r} line {i}: expected a JSON object, got a JSON {type(rec).__name__}")
        if not is_count(rec.get("step")):
            raise CheckpointError(
                f"{str(path)!r} line {i}: key 'step' must be a non-negative integer, got "
                f"{rec.get('step', '(missing)')!r:.40}"
            )
        for key in METRIC_NUMBERS:
            v = rec.get(key)
            if key in rec and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise CheckpointError(f"{str(path)!r} line {i}: key {key!r} must be a number, got {v!r:.40}")
        out.append((line, rec))
    return out


def read_metrics_file(path: str | Path) -> list[dict]:
    """The validated records of a ``metrics.jsonl`` (see :func:`metrics_lines`); [] when absent."""
    return [rec for _, rec in metrics_lines(path)] if Path(path).is_file() else []


def write_run(run_dir: str | Path, run: dict) -> None:
    """Write ``run.yaml`` (``model``, ``train``, ``data``, and ``hf`` / ``budget`` when present)
    atomically: a reader sees the old file or the new one, never a cut one."""
    atomic_write_text(Path(run_dir) / RUN_FILE, yaml.safe_dump(run, sort_keys=False))


def copy_tokenizer(data_folder: str | Path, run_dir: str | Path) -> None:
    """Copy the data folder's ``tokenizer.json`` into the run folder (atomically), so ``eval`` and
    ``generate`` need nothing else."""
    atomic_write_bytes(Path(run_dir) / TOKENIZER_FILE, (Path(data_folder) / TOKENIZER_FILE).read_bytes())


def write_budget(run_dir: str | Path, plan: dict) -> None:
    """Record a time budget's ``plan`` in ``run.yaml``: ``budget`` (the plan) and ``train.max_steps`` (its
    ``steps``), so that a resumed run keeps the plan (:func:`lmlab.schedule.planned_config`)."""
    run = read_run(run_dir)
    run["train"]["max_steps"] = plan["steps"]
    run["budget"] = plan
    write_run(run_dir, run)


def metrics_path(run_dir: str | Path) -> Path:
    """The run's training log, ``metrics.jsonl``."""
    return Path(run_dir) / METRICS_FILE


def append_metrics(run_dir: str | Path, record: dict) -> None:
    """Append one record to ``metrics.jsonl`` as one ``write()`` of a whole line in append mode: a kill
    leaves at most a cut last line, which :func:`metrics_lines` skips and a resume drops."""
    fd = os.open(metrics_path(run_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def rewrite_metrics(run_dir: str | Path, lines: list[str]) -> None:
    """Replace ``metrics.jsonl`` with ``lines`` (as read by :func:`metrics_lines`), atomically: a resume
    keeps the log up to its checkpoint's step."""
    atomic_write_text(metrics_path(run_dir), "".join(line + "\n" for line in lines))


def check_data_tokenizer(run_dir: str | Path, data: TokenData, vocab_size: Optional[int] = None) -> None:
    """Raise DataError unless the prepared data folder ``data`` was tokenised with the run's own tokenizer
    (its ``tokenizer.json`` byte for byte the run's) and, given the model's ``vocab_size``, holds no id
    at or past it."""
    run_tok = Path(run_dir) / TOKENIZER_FILE
    if (
        not run_tok.is_file()
        or run_tok.read_bytes() != (data.folder / TOKENIZER_FILE).read_bytes()
        or (vocab_size is not None and data.tokenizer.vocab_size > vocab_size)
    ):
        raise DataError(
            f"data {str(data.folder)!r} was not prepared with the tokenizer of run {str(run_dir)!r}; "
            f"use the run's own data folder, or prepare one with `lmlab prepare --tokenizer-file "
            f"{run_tok} ...`"
        )


def run_data(
    run_dir: str | Path, run: dict, data: Optional[str | Path] = None, vocab_size: Optional[int] = None
) -> TokenData:
    """The data folder a command on run ``run_dir`` (``run``: its :func:`read_run`) reads: ``data`` when
    given, else the one in run.yaml, checked with :func:`check_data_tokenizer`. Raises DataError when
    there is none (an imported run: give ``data``) or it was tokenised otherwise."""
    if not data and not run.get("data"):
        raise DataError(
            f"run {str(run_dir)!r} has no data folder (it was imported); pass --data DIR, a folder "
            f"prepared with the run's tokenizer (`lmlab prepare --tokenizer-file "
            f"{Path(run_dir) / TOKENIZER_FILE} ...`)"
        )
    folder = TokenData(data or run["data"])
    check_data_tokenizer(run_dir, folder, vocab_size)
    return folder


def check_new_run_dir(run_dir: Path) -> None:
    """Raise CheckpointError unless ``run_dir`` can hold a new run: a new path or an empty folder (not
    a run, not a file, not a blank name)."""
    if not str(run_dir).strip():
        raise CheckpointError("--out is blank; give a folder path for the new run")
    if not (run_dir / RUN_FILE).exists() and checkpoint_dirs(run_dir):
        raise CheckpointError(
            f"run folder {str(run_dir)!r} holds checkpoints but no {RUN_FILE}; choose another "
            f"--out, or restore it and pass --resume{run_copy_hint(run_dir)}"
        )
    if (run_dir / RUN_FILE).exists():
        raise CheckpointError(
            f"run folder {str(run_dir)!r} already holds a run; pass --resume to continue it or choose another --out"
        )
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise CheckpointError(
            f"--out {str(run_dir)!r} exists and is not an empty folder or an lmlab run; choose a new run folder"
        )
    if any(p.exists() and not p.is_dir() for p in run_dir.parents):
        raise CheckpointError(f"--out {str(run_dir)!r} lies under a file; choose a folder path")


def check_lost_checkpoints(run_dir: Path) -> None:
    """Raise CheckpointError when the run ``run_dir`` has no checkpoint but its metrics.jsonl records one
    saved (a ``checkpoint`` record, logged once the folder was in place): its checkpoints were deleted or
    moved, and resuming would retrain from step 0 and cut the log. A run killed before its first
    checkpoint was complete passes (it restarts from step 0)."""
    path = metrics_path(run_dir)
    saved = [rec["step"] for _, rec in (metrics_lines(path) if path.exists() else []) if "checkpoint" in rec]
    if saved and max(saved) > 0:
        where = "holds none complete" if (run_dir / "checkpoints").is_dir() else "is missing"
        raise CheckpointError(
            f"run {str(run_dir)!r} has no checkpoint (its checkpoints folder {where}), but "
            f"{str(path)!r} records one saved at step {max(saved)}: deleted or moved? Restore the "
            f"checkpoints folder to continue from there; to train the run again from step 0, move "
            f"metrics.jsonl out of the run folder first (nothing was changed)"
        )


def metrics_to_keep(run_dir: Path, step: int, log_interval: int) -> Optional[list[str]]:
    """The lines of ``run_dir``'s metrics.jsonl up to the resumed ``step`` (later ones were written by the
    interrupted run after its last checkpoint; a line every ``log_interval`` steps), or None without a log.
    Raises CheckpointError for a damaged log."""
    path = metrics_path(run_dir)
    lines = metrics_lines(path) if path.exists() else []
    expected = step // log_interval * log_interval  # the last step logged for sure
    reached = max((rec["step"] for _, rec in lines), default=0)
    if reached < expected:
        print(
            f"warning: {str(path)!r} {'ends at step ' + str(reached) if lines else 'is missing or empty'}, "
            f"before step {expected} the checkpoint had logged (truncated or deleted?); training goes on "
            f"and its log will lack those steps",
            file=sys.stderr,
        )
    if not path.exists():
        return None
    return [line for line, rec in lines if rec["step"] <= step]
