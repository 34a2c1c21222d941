"""Checkpoints of a run folder (the folder's files and records: :mod:`lmlab.run_folder`).

``checkpoints/step_XXXXXXX/`` holds ``model.safetensors`` (weights), ``optimizer.pt`` (AdamW state by
parameter name) and ``rng.pt`` (RNG states), both read back with ``torch.load(weights_only=True)``,
``trainer.json`` (step, tokens, counters), a copy of ``run.yaml`` as it was at that step, and
``manifest.json``: the size and SHA-256 of every other file, written last.

Integrity: checkpoints are written into a ``.tmp`` folder beside and renamed into place, so a checkpoint
folder that exists is complete; an interrupted write leaves only a ``.tmp`` folder, which is never
loaded. Every read (resume, ``eval``, ``generate``, ``export``) first checks each file against the
manifest, so a truncated, bit-flipped or missing file (e.g. ``optimizer.pt``) is never used: the
error names the file; :func:`load_latest` then falls back to the previous checkpoint that verifies,
saying so on stderr, and refuses when none does. Pruning (``keep``) only removes checkpoints older
than the one just written, so the newest intact checkpoint always stays.

Older checkpoints (written before manifests existed; their ``trainer.json`` has no
``checkpoint_version``) are accepted with a one-line note on stderr that their bytes are not verified.
A checkpoint whose ``trainer.json`` says it was written with a manifest but has none is damaged.
Weights are never unpickled: safetensors only.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from lmlab.config import ConfigError, ModelConfig
from lmlab.data.tokenizer import Tokenizer
from lmlab.fsutil import _fsync_dir, sha256_file
from lmlab.json_checks import check_nesting
from lmlab.model import TransformerLM
from lmlab.parallel import optimizer_state_by_name
from lmlab.run_folder import (
    MANIFEST,
    RUN_FILE,
    CheckpointError,
    checkpoint_dirs,
    is_count,
    read_run,
)

if TYPE_CHECKING:
    from lmlab.data.tokenizer import Tokenizer

CHECKPOINT_VERSION = 2  # 2: with manifest.json (SHA-256 per file); 1 (no key in trainer.json): none
REQUIRED_FILES = ("model.safetensors", "trainer.json")


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def tied_head(model: torch.nn.Module) -> bool:
    """Whether ``model``'s ``lm_head.weight`` is its ``embed.weight`` (the same tensor: tied
    embeddings), the one weight a checkpoint then stores once. Any module: one without these names
    is not tied."""
    sd = model.state_dict(keep_vars=True)
    head, emb = sd.get("lm_head.weight"), sd.get("embed.weight")
    return head is not None and emb is not None and head is emb


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model,
    optimizer,
    state: dict,
    keep: int = 3,
    tied: Optional[bool] = None,
    rng: Optional[dict] = None,
) -> Path:
    """Write checkpoint ``step`` atomically, with its manifest (size + SHA-256 per file) written last,
    and keep the newest ``keep`` (0 = all) up to this step. Returns its folder.

    ``model``: a module or its state dict; ``optimizer``: an optimizer, an optimizer state dict (by
    parameter name, see ``lmlab.parallel.optimizer_state_by_name``) or None; ``state``: JSON-able trainer
    counters; ``rng``: RNG state tensors. With ``tied`` (default: :func:`tied_head` of a module, False
    for a state dict) ``lm_head.weight`` is not stored (it is ``embed.weight``). :func:`read_checkpoint`
    and :func:`load_weights` take any module this accepted.
    Raises CheckpointError, before anything is written, for what :func:`read_checkpoint` with
    ``with_optimizer`` would refuse (the same checks): ``step`` not a non-negative integer, ``state``
    failing :func:`check_trainer_state` (``step`` equal to ``step``, ``tokens_seen`` present, the counters'
    types) or not JSON-able, an optimizer state that does not fit the module, RNG states of another
    form; and when the write fails (e.g. a full disk); earlier checkpoints stay intact."""

    if not is_count(step):
        raise CheckpointError(f"save_checkpoint: step={step!r} must be a non-negative integer")
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:07d}"
    tmp = root / f"step_{step:07d}.tmp"
    check_trainer_state(state, final / "trainer.json", resume=True, folder_step=step)
    try:
        trainer_json = json.dumps(dict(state, checkpoint_version=CHECKPOINT_VERSION), indent=1, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{str(final / 'trainer.json')!r}: the trainer state is not JSON-able ({exc}); give "
            f"numbers, strings, lists and mappings"
        ) from None
    if rng is not None:
        _check_rng_state(rng, final / "rng.pt")
    if isinstance(model, torch.nn.Module):
        if tied is None:
            tied = tied_head(model)
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer_state_by_name(model, optimizer)
        if optimizer is not None:
            _check_optimizer_state(optimizer, final / "optimizer.pt", model)
        weights = model.state_dict()
    else:
        weights = model
    weights = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    if tied:
        weights.pop("lm_head.weight", None)  # shares storage with embed.weight
    files = {"model.safetensors": save(weights)}
    if optimizer is not None:
        buf = io.BytesIO()
        torch.save(optimizer, buf)
        files["optimizer.pt"] = buf.getvalue()
    if rng is not None:
        buf = io.BytesIO()
        torch.save(rng, buf)
        files["rng.pt"] = buf.getvalue()
    files["trainer.json"] = trainer_json.encode()
    run_file = Path(run_dir) / RUN_FILE
    if run_file.is_file():
        files[RUN_FILE] = run_file.read_bytes()
    manifest = {
        "format": "lmlab checkpoint",
        "version": CHECKPOINT_VERSION,
        "step": step,
        "files": {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
        },
    }
    tok_file = Path(run_dir) / "tokenizer.json"
    if tok_file.is_file():  # the run's own copy of its tokenizer, checked by check_run_files
        tok = tok_file.read_bytes()
        manifest["run_files"] = {"tokenizer.json": {"bytes": len(tok), "sha256": hashlib.sha256(tok).hexdigest()}}
    aside = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # lmlab's own leftover of an interrupted save
        tmp.mkdir()
        for name, data in files.items():
            _fsync_write(tmp / name, data)
        _fsync_write(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())  # last
        if final.exists():  # the same step again (e.g. replacing a damaged checkpoint): swap, then remove
            aside = root / f".{final.name}.replaced"
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(final, aside)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException as exc:  # an OSError, or a stop at once (KeyboardInterrupt) mid-write
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None and aside.exists() and not final.exists():
            os.replace(aside, final)
        if not isinstance(exc, OSError):
            raise
        raise CheckpointError(
            f"could not write checkpoint {str(final)!r}: {exc}; earlier checkpoints in {str(root)!r} are intact"
        ) from None
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    if keep:  # only checkpoints older than this one count: a newer (damaged) one never pushes it out
        older = [c for c in checkpoint_dirs(run_dir) if c.name < final.name]
        for old in older[: max(0, len(older) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _note(text: str) -> None:
    print(text, file=sys.stderr)


def _read_json(path: Path, what: str):
    try:
        return json.loads(check_nesting(path.read_bytes().decode("utf-8"), repr(str(path)), CheckpointError))
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(
            f"{str(path)!r} is unreadable (truncated or corrupt?): expected {what} as JSON: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def verify_checkpoint(ckpt_dir: str | Path) -> Optional[dict]:
    """Check every file of a checkpoint folder against its ``manifest.json`` (size and SHA-256).

    Returns the manifest's file table ``{name: {"bytes": int, "sha256": hex}}``, or None for an
    older checkpoint without a manifest (a one-line note on stderr says its bytes are unverified).
    Raises CheckpointError naming the file when a listed file is missing, of another size or of
    another hash, when the manifest itself is unreadable or of the wrong shape (naming the key), or
    when it is missing from a checkpoint whose ``trainer.json`` says it was written with one."""
    ckpt_dir = Path(ckpt_dir)
    mpath = ckpt_dir / MANIFEST
    if not mpath.exists():
        tpath = ckpt_dir / "trainer.json"
        state = _read_json(tpath, "the trainer state") if tpath.is_file() else None
        if not isinstance(state, dict) or state.get("checkpoint_version", 1) != 1:
            raise CheckpointError(
                f"checkpoint {str(ckpt_dir)!r} has no {MANIFEST} (deleted or not fully "
                f"copied?), so its files cannot be verified"
            )
        _note(f"note: checkpoint {str(ckpt_dir)!r} predates checksum manifests; its files are read unverified")
        return None
    manifest = _read_json(mpath, "the checkpoint's manifest")
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        got = type(manifest).__name__ if not isinstance(manifest, dict) else f"files={files!r:.60}"
        raise CheckpointError(
            f"{str(mpath)!r}: key 'files' must map file names to their bytes and sha256 (a JSON object), got {got}"
        )
    for name in REQUIRED_FILES:
        if name not in files:
            raise CheckpointError(f"{str(mpath)!r}: key 'files' does not list {name!r}; the checkpoint is incomplete")
    for name, entry in files.items():
        if not name or "/" in name or name in (".", "..", MANIFEST):
            raise CheckpointError(f"{str(mpath)!r}: key 'files' lists {name!r}, which is not a checkpoint file name")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and isinstance(entry.get("bytes"), int)
            and not isinstance(entry.get("bytes"), bool)
        ):
            raise CheckpointError(
                f"{str(mpath)!r}: key 'files.{name}' must be an object with 'bytes' (an "
                f"integer) and 'sha256' (hex text), got {entry!r:.80}"
            )
        path = ckpt_dir / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {str(path)!r} is missing (it is listed in {MANIFEST})")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(
                f"checkpoint file {str(path)!r} is unreadable (truncated or corrupt?): "
                f"{size:,} bytes where {MANIFEST} records {entry['bytes']:,}"
            )
        if sha256_file(path) != entry["sha256"].lower():
            raise CheckpointError(
                f"checkpoint file {str(path)!r} is corrupt: its SHA-256 differs from the one "
                f"{MANIFEST} records (damaged on disk or edited)"
            )
    return files


def check_trainer_state(state, path: Path, resume: bool = False, folder_step: Optional[int] = None) -> dict:
    """Validate a checkpoint's ``trainer.json`` mapping: ``step`` (required; equal to ``folder_step``,
    the step in the folder's name, when given), ``tokens_seen`` (required when ``resume``), the
    counters ``clipped_steps``/``spikes`` (non-negative integers), ``world_size`` (positive),
    ``loss_ema`` (finite number or null), ``grad_scaler`` (mapping). Returns ``state``; raises
    CheckpointError naming the file, the key and what was expected."""
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{str(path)!r}: expected a JSON object of trainer counters (step, tokens_seen, ...), "
            f"got a JSON {type(state).__name__}"
        )
    checks = [
        ("step", True, lambda v: is_count(v), "a non-negative integer (the finished steps)"),
        ("tokens_seen", resume, lambda v: is_count(v), "a non-negative integer (tokens trained on)"),
        ("clipped_steps", False, lambda v: is_count(v), "a non-negative integer"),
        ("spikes", False, lambda v: is_count(v), "a non-negative integer"),
        ("world_size", False, lambda v: is_count(v, 1), "a positive integer"),
        ("checkpoint_version", False, lambda v: is_count(v, 1), "a positive integer"),
        (
            "loss_ema",
            False,
            lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
            "a finite number or null",
        ),
        ("grad_scaler", False, lambda v: isinstance(v, dict), "a JSON object"),
    ]
    for key, required, ok, what in checks:
        if key not in state:
            if required:
                raise CheckpointError(f"{str(path)!r}: missing key {key!r} ({what})")
        elif not ok(state[key]):
            raise CheckpointError(f"{str(path)!r}: key {key!r} must be {what}, got {state[key]!r:.60}")
    if folder_step is not None and state["step"] != folder_step:
        raise CheckpointError(f"{str(path)!r}: key 'step' is {state['step']} but its folder is step {folder_step}")
    return state


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged or foreign file: torch raises many kinds; one line naming it
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is unreadable (truncated, corrupt or not written by lmlab?): {first[:200]}"
        ) from None


def _check_optimizer_state(opt, path: Path, model: TransformerLM) -> None:
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if (
        not isinstance(opt, dict)
        or not isinstance(opt.get("state"), dict)
        or not isinstance(groups, list)
        or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    ):
        raise CheckpointError(
            f"checkpoint file {str(path)!r}: expected an optimizer state with keys 'state' (a "
            f"mapping) and 'param_groups' (a list of groups with 'params'), got {type(opt).__name__}"
        )
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for name, entry in opt["state"].items():
        if name not in shapes or not isinstance(entry, dict):
            raise CheckpointError(
                f"checkpoint file {str(path)!r}: key 'state' holds {name!r}, which is not a "
                f"parameter of this model (or not a mapping)"
            )
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() and tuple(value.shape) != shapes[name]:
                raise CheckpointError(
                    f"checkpoint file {str(path)!r}: state[{name!r}][{key!r}] has shape "
                    f"{tuple(value.shape)}, expected {shapes[name]}"
                )


def _check_rng_state(rng, path: Path) -> None:
    want = torch.get_rng_state().numel()
    cpu = rng.get("cpu") if isinstance(rng, dict) else None
    ok = isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8 and cpu.numel() == want
    cuda = rng.get("cuda") if isinstance(rng, dict) else None
    if not ok or (cuda is not None and not (isinstance(cuda, torch.Tensor) and cuda.dtype == torch.uint8)):
        raise CheckpointError(
            f"checkpoint file {str(path)!r}: expected RNG states {{'cpu': uint8 tensor of {want} "
            f"values, 'cuda': optional uint8 tensor}}, got {type(rng).__name__}"
        )


def read_checkpoint(
    ckpt_dir: Path, model: torch.nn.Module, with_optimizer: bool = False
) -> tuple[dict, Optional[dict], dict, Optional[dict]]:
    """Read and verify a checkpoint for ``model``: returns (weights, optimizer state or None,
    trainer state dict, rng dict or None). Every file is first checked against the manifest
    (:func:`verify_checkpoint`); weights through safetensors; optimizer and RNG states through
    ``torch.load(weights_only=True)``, their structure checked against ``model``. With
    ``with_optimizer`` (resuming) a checkpoint past step 0 must hold optimizer and RNG states (else a
    resume would silently restart AdamW's moments). Raises CheckpointError naming the file."""
    ckpt_dir = Path(ckpt_dir)
    listed = verify_checkpoint(ckpt_dir)

    def present(name: str) -> bool:
        return name in listed if listed is not None else (ckpt_dir / name).is_file()

    if not present("trainer.json"):
        raise CheckpointError(f"checkpoint {str(ckpt_dir)!r} has no trainer.json (its step and counters)")
    try:
        folder_step = int(ckpt_dir.name.split("_", 1)[1])
    except (IndexError, ValueError):
        folder_step = None
    state = check_trainer_state(
        _read_json(ckpt_dir / "trainer.json", "the trainer state"),
        ckpt_dir / "trainer.json",
        resume=with_optimizer,
        folder_step=folder_step,
    )
    weights = _verified_weights(model, ckpt_dir)
    opt = rng = None
    if with_optimizer and state["step"] > 0:
        for name in ("optimizer.pt", "rng.pt"):
            if not present(name):
                raise CheckpointError(
                    f"checkpoint {str(ckpt_dir)!r} has no {name}; resuming at step {state['step']} "
                    f"without it would not continue the same run"
                )
    if with_optimizer and present("optimizer.pt"):
        opt = _torch_load(ckpt_dir / "optimizer.pt")
        _check_optimizer_state(opt, ckpt_dir / "optimizer.pt", model)
    if present("rng.pt"):
        rng = _torch_load(ckpt_dir / "rng.pt")
        _check_rng_state(rng, ckpt_dir / "rng.pt")
    if tied_head(model) and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["embed.weight"]
    return weights, opt, state, rng


def check_run_files(run_dir: str | Path, ckpt_dir: str | Path, run: dict) -> None:
    """Check the run folder's own files against what checkpoint ``ckpt_dir`` recorded when it was written:
    ``tokenizer.json`` (its SHA-256 in the manifest's ``run_files``) and the ``model`` section of
    ``run.yaml`` (``run``, parsed) against the checkpoint's copy of run.yaml. Raises CheckpointError
    naming the file and how to restore it. Checkpoints without these records (older ones) pass."""
    run_dir, ckpt_dir = Path(run_dir), Path(ckpt_dir)
    manifest = _read_json(ckpt_dir / MANIFEST, "the checkpoint's manifest") if (ckpt_dir / MANIFEST).is_file() else {}
    record = (manifest.get("run_files") or {}).get("tokenizer.json") if isinstance(manifest, dict) else None
    tok = run_dir / "tokenizer.json"
    if isinstance(record, dict):
        if not tok.is_file():
            raise CheckpointError(
                f"{str(tok)!r} is missing (the run was trained with it); copy the data folder's "
                f"tokenizer.json back into the run folder"
            )
        if tok.stat().st_size != record.get("bytes") or sha256_file(tok) != record.get("sha256"):
            raise CheckpointError(
                f"{str(tok)!r} differs from the tokenizer the run was trained with (its SHA-256 "
                f"in {str(ckpt_dir / MANIFEST)!r}); damaged or replaced: copy the data folder's "
                f"tokenizer.json back into the run folder"
            )
    check_run_model(run_dir, run, ckpt_dir)


def check_run_model(run_dir: str | Path, run: dict, ckpt_dir: Optional[str | Path] = None) -> None:
    """Check the ``model`` section of ``run.yaml`` (``run``, parsed) against the copy of run.yaml that
    checkpoint ``ckpt_dir`` keeps (default: the newest copy whose size and SHA-256 match its
    checkpoint's manifest): an edited architecture field would otherwise surface as weights that fit
    no checkpoint. Raises CheckpointError naming the fields and the copy to restore; no checkpoint,
    or one without a readable copy, passes."""
    if ckpt_dir is None:
        ckpt_dir = next((c for c in reversed(checkpoint_dirs(run_dir)) if _intact_run_copy(c)), None)
        if ckpt_dir is None:
            return
    run_dir, copy = Path(run_dir), Path(ckpt_dir) / RUN_FILE
    if not copy.is_file():
        return
    try:
        saved = yaml.safe_load(copy.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return
    model = saved.get("model") if isinstance(saved, dict) else None
    if isinstance(model, dict) and _filled(model) != _filled(run["model"]):
        ours, theirs = _filled(run["model"]), _filled(model)
        diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
        raise CheckpointError(
            f"{str(run_dir / RUN_FILE)!r}: key 'model' differs from the config checkpoint "
            f"{Path(ckpt_dir).name} was trained with (fields {diff[:4]}{more}); damaged or "
            f"edited: copy {str(copy)!r} back to restore it"
        )


def _filled(model: dict) -> dict:
    """A run file's model section with ModelConfig's defaults filled in (a field left out means its
    default), or as written when it is not a valid config (then compared field by field as is)."""
    try:
        return ModelConfig.from_dict(model).to_dict()
    except (ConfigError, KeyError, TypeError, ValueError):
        return model


def _intact_run_copy(ckpt_dir: Path) -> bool:
    """Whether checkpoint ``ckpt_dir``'s copy of run.yaml has the size and SHA-256 its manifest lists."""
    try:
        manifest = json.loads((ckpt_dir / MANIFEST).read_text())
        entry = manifest["files"][RUN_FILE]
        copy = ckpt_dir / RUN_FILE
        return copy.stat().st_size == entry["bytes"] and sha256_file(copy) == str(entry["sha256"]).lower()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def load_latest(run_dir: str | Path, model: TransformerLM, with_optimizer: bool = False, step: Optional[int] = None):
    """The newest checkpoint of ``run_dir`` (or the one of ``step``) that verifies and fits ``model``:
    (checkpoint folder, weights, optimizer state, trainer state, rng), or None when the run has no
    checkpoint. A damaged newest checkpoint is skipped for the previous one, with a warning on stderr
    naming the damaged file; raises CheckpointError (the newest one's error) when none is usable."""
    ckpts = checkpoint_dirs(run_dir)
    if step is not None:
        ckpts = [c for c in ckpts if c.name == f"step_{step:07d}"]
    if not ckpts:
        return None
    errors = []
    for i in range(len(ckpts) - 1, -1, -1):
        try:
            return (ckpts[i], *read_checkpoint(ckpts[i], model, with_optimizer))
        except CheckpointError as exc:
            errors.append(str(exc))
            if i:
                _note(f"warning: {exc}; falling back to the previous checkpoint {ckpts[i - 1].name}")
    if len(errors) == 1:
        raise CheckpointError(errors[0])
    raise CheckpointError(f"{errors[0]}; and none of the {len(errors) - 1} older checkpoint(s) is usable either")


def _verified_weights(model: torch.nn.Module, ckpt_dir: Path) -> dict:
    path = ckpt_dir / "model.safetensors"
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} is unreadable (truncated or corrupt?): {exc}") from None
    expected = model.state_dict()
    if tied_head(model):
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    detail = state_mismatch(weights, expected)
    if detail:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this model config: {detail}")
    return weights


def state_mismatch(state: dict, expected: dict) -> str:
    """What keeps tensors ``state`` from loading as ``expected`` (name -> tensor, e.g. a model's
    ``state_dict()``): up to 3 missing names, 3 unexpected ones and 3 shape mismatches (name, given shape,
    expected shape), joined by '; '; '' when they fit."""
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    shapes = [(k, tuple(state[k].shape), tuple(expected[k].shape)) for k in wrong[:3]]
    parts = (f"missing {missing[:3]}" if missing else "", f"unexpected {extra[:3]}" if extra else "",
             f"shape mismatch {shapes}" if wrong else "")  # fmt: skip
    return "; ".join(x for x in parts if x)


def load_weights(model: torch.nn.Module, ckpt_dir: Path) -> None:
    """Load ``model.safetensors`` of ``ckpt_dir`` into ``model`` strictly, after checking the checkpoint
    against its manifest; raises CheckpointError for a truncated/corrupt file or tensors of another config."""
    verify_checkpoint(ckpt_dir)
    model.load_state_dict(_verified_weights(model, ckpt_dir), strict=False)


def load_run(
    run_dir: str | Path, step: Optional[int] = None, device: str = "cpu", tokenizer: bool = True
) -> tuple[TransformerLM, ModelConfig, Optional["Tokenizer"], dict, Path]:
    """Load a run's model (latest checkpoint or ``step``), config and tokenizer.

    Returns (model in eval mode, ModelConfig, Tokenizer, run dict, checkpoint folder); with
    ``tokenizer=False`` the tokenizer is None and a run without ``tokenizer.json`` (an imported model)
    loads too.
    Checkpoints are verified (:func:`load_latest`: a damaged newest one falls back to the previous one,
    saying so). Raises CheckpointError when the run has no usable checkpoint or it does not fit its config."""

    run = read_run(run_dir)
    check_run_model(run_dir, run)  # an edited architecture field is named before it breaks anything else
    try:
        cfg = ModelConfig.from_dict(run["model"], source=f"{run_dir}/{RUN_FILE} model")
    except ConfigError as exc:  # already names the file
        raise CheckpointError(str(exc)) from None
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{run_dir}/{RUN_FILE}: invalid model config: {exc}") from None
    if not checkpoint_dirs(run_dir) or (
        step is not None and not (Path(run_dir) / "checkpoints" / f"step_{step:07d}").is_dir()
    ):
        raise CheckpointError(
            f"run {str(run_dir)!r} has no complete checkpoint"
            f"{f' at step {step}' if step is not None else ''}; train it first"
        )
    tok = None
    if tokenizer and not (Path(run_dir) / "tokenizer.json").is_file():
        if isinstance(run.get("hf"), dict):
            why = (
                "it was imported from a Hugging Face folder without one); copy the model's tokenizer.json "
                "into the run folder"
            )
        else:
            data = run.get("data")
            why = (
                f"it was trained with {f'the data folder {str(data)!r}' if data else 'a data folder'}'s "
                f"tokenizer.json, missing here); copy that tokenizer.json back into the run folder"
            )
        raise CheckpointError(
            f"run {str(run_dir)!r} has no tokenizer (no tokenizer.json: {why}; or give token ids "
            f"(lmlab generate --prompt-ids 1,2,3; Python: load_run(..., tokenizer=False))"
        )
    if tokenizer:
        tok = Tokenizer.load(Path(run_dir) / "tokenizer.json")
    imported = isinstance(run.get("hf"), dict)  # HF models often pad the embedding past the tokenizer's vocabulary
    if tok is not None and tok.vocab_size != cfg.vocab_size and not (imported and tok.vocab_size < cfg.vocab_size):
        raise CheckpointError(
            f"run {str(run_dir)!r}: tokenizer has {tok.vocab_size} tokens but the model "
            f"config says vocab_size={cfg.vocab_size}"
        )
    model = TransformerLM(cfg)
    ckpt, weights = load_latest(run_dir, model, step=step)[:2]
    check_run_files(run_dir, ckpt, run)
    model.load_state_dict(weights, strict=False)
    return model.to(device).eval(), cfg, tok, run, ckpt
