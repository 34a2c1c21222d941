"""Import Hugging Face checkpoints into lmlab run folders, and export runs back.

- :func:`import_hf` reads an HF model folder (or Meta's original Llama layout, :mod:`lmlab.interop.meta`)
  (``config.json`` plus ``model.safetensors``, a sharded
  ``model.safetensors.index.json``, or ``pytorch_model.bin`` / its index, the latter only through
  ``torch.load(weights_only=True)``), picks the family by ``model_type`` (:mod:`lmlab.interop.registry`),
  maps config and tensors, loads them strictly into :class:`lmlab.model.TransformerLM` and writes a run
  folder: ``run.yaml`` (``model``, a default ``train`` section, ``data: null``, and ``hf`` saying where it
  came from), ``tokenizer.json`` when the HF folder has one (or one built from GPT-2-style
  ``vocab.json`` + ``merges.txt``), and ``checkpoints/step_0000000/``, its
  weights in the HF checkpoint's dtype (bf16 or fp32) or the one asked for (``dtype``).
- :func:`export_hf` writes ``config.json`` (with ``model_type``, ``architectures``, ``dtype``) and
  ``model.safetensors`` (in the run checkpoint's dtype, or the one asked for) that
  ``transformers.AutoModelForCausalLM.from_pretrained`` loads, choosing the family from the run's
  ``hf.model_type`` (set by import), else the first family that represents the config exactly, or the
  one asked for.

Whatever a family cannot represent is refused with :class:`UnsupportedError` naming it; nothing is
dropped or approximated. transformers itself is not needed for either direction.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lmlab import checkpoint
from lmlab.checkpoint import load_run, state_mismatch
from lmlab.config import ConfigError, ModelConfig
from lmlab.fsutil import make_temp_dir
from lmlab.interop.meta import is_meta_folder, read_meta
from lmlab.interop.registry import Family, StateDict, UnsupportedError, families, get_family
from lmlab.interop.roundtrip import verify_roundtrip
from lmlab.json_checks import check_nesting
from lmlab.model import TransformerLM
from lmlab.run_folder import write_run
from lmlab.train import TrainConfig

# Export tries families in this order when the run names none (the common recipes first).
PREFERRED = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo",
    "olmo2",
    "cohere",
    "cohere2",
)


class HFFormatError(ValueError):
    """An HF model folder that is missing, unreadable or incomplete."""


# ------------------------------------------------------------------------------------------------
# Reading an HF folder
# ------------------------------------------------------------------------------------------------


def read_hf_config(path: str | Path) -> dict:
    """The parsed ``config.json`` of HF model folder ``path``; raises HFFormatError naming the file when
    the folder or the file is missing, unreadable, not JSON, nested too deep or has no model_type."""
    path = Path(path)
    if not path.is_dir():
        raise HFFormatError(f"{str(path)!r} is not a folder; give a Hugging Face model folder (config.json + weights)")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise HFFormatError(f"{str(path)!r} has no config.json; it is not a Hugging Face model folder")
    try:
        hf = json.loads(check_nesting(cfg_path.read_text(), repr(str(cfg_path)), HFFormatError))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HFFormatError(f"{str(cfg_path)!r} could not be parsed: {exc}") from None
    if not isinstance(hf, dict) or "model_type" not in hf:
        raise HFFormatError(f"{str(cfg_path)!r} has no 'model_type'")
    return hf


def _load_safetensors(file: Path) -> StateDict:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise HFFormatError(f"{str(file)!r} is unreadable (truncated or corrupt?): {exc}") from None


def _bin_error(file: Path, exc: Exception) -> HFFormatError:
    """One line for a pytorch_model.bin that ``torch.load(weights_only=True)`` refused: a pickle of
    Python objects beyond tensors (naming the first global torch names, e.g. posix.system), or a damaged
    file (the first line of torch's message); torch's own text spans several lines."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and "weights only load failed" in text.lower():
        found = re.search(r"GLOBAL ([\w.]+)", text)
        what = f" ({found.group(1)})" if found else ""
        return HFFormatError(
            f"{str(file)!r} holds Python objects beyond tensors{what} that only full "
            f"unpickling would load: refused, lmlab never unpickles (torch.load("
            f"weights_only=True) at most); convert it to safetensors where it comes from"
        )
    first = (text.strip().splitlines() or [type(exc).__name__])[0]
    return HFFormatError(
        f"{str(file)!r} could not be read with torch.load(weights_only=True) (truncated or corrupt?): {first[:200]}"
    )


def _load_bin(file: Path) -> StateDict:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle errors of many kinds; weights_only refuses arbitrary objects
        raise _bin_error(file, exc) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HFFormatError(f"{str(file)!r} does not hold a flat state dict of tensors")
    return state


def read_hf_state(path: str | Path) -> StateDict:
    """All tensors of HF model folder ``path``: model.safetensors, sharded safetensors (index), or
    pytorch_model.bin (sharded or not; read with ``weights_only=True``)."""
    path = Path(path)
    for index_name, loader in (
        ("model.safetensors.index.json", _load_safetensors),
        ("pytorch_model.bin.index.json", _load_bin),
    ):
        index = path / index_name
        if index.is_file():
            try:
                weight_map = json.loads(check_nesting(index.read_text(), repr(str(index)), HFFormatError))["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
                raise HFFormatError(f"{str(index)!r} is not a valid shard index: {exc}") from None
            state: StateDict = {}
            for shard in sorted(set(weight_map.values())):
                if not (path / shard).is_file():
                    raise HFFormatError(f"shard {shard!r} named by {str(index)!r} is missing")
                part = loader(path / shard)
                state.update({k: v for k, v in part.items() if weight_map.get(k) == shard})
            missing = sorted(set(weight_map) - set(state))
            if missing:
                raise HFFormatError(f"tensors {missing[:3]} named by {str(index)!r} are not in their shards")
            return state
    if (path / "model.safetensors").is_file():
        return _load_safetensors(path / "model.safetensors")
    if (path / "pytorch_model.bin").is_file():
        return _load_bin(path / "pytorch_model.bin")
    raise HFFormatError(
        f"{str(path)!r} has no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)"
    )


def load_strict(model: torch.nn.Module, state: StateDict) -> None:
    """Load ``state`` into ``model`` requiring exactly its tensors (a tied LM head may be left out) and
    their shapes; UnsupportedError naming what differs."""
    expected = model.state_dict()
    tied = getattr(model.cfg, "tie_embeddings", False)
    need = {k: v for k, v in expected.items() if not (tied and k == "lm_head.weight")}
    mismatch = state_mismatch({k: v for k, v in state.items() if k in need or k not in expected}, need)
    if mismatch:
        raise UnsupportedError(f"the converted tensors do not fit the lmlab model: {mismatch}")
    full = dict(state)
    if tied:
        full["lm_head.weight"] = full["embed.weight"]
    with torch.no_grad():
        model.load_state_dict({k: v.to(expected[k].dtype) for k, v in full.items()}, strict=True)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HF_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}  # config.json's spelling
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}  # lmlab's (--dtype)
DTYPE_CHOICES = ("auto", "fp32", "bf16")


def stored_dtype(dtypes) -> torch.dtype:
    """The dtype ``--dtype auto`` keeps for weights stored in ``dtypes`` (their floating dtypes): bf16 when
    every floating tensor is bf16, else fp32 (fp32, fp16 or a mix convert to fp32 exactly; lmlab stores
    no fp16)."""
    floating = {d for d in dtypes if d.is_floating_point}
    return torch.bfloat16 if floating == {torch.bfloat16} else torch.float32


def resolve_dtype(dtype: str, source: torch.dtype) -> torch.dtype:
    """``dtype`` ('auto' | 'fp32' | 'bf16') -> a torch dtype, 'auto' being ``source``; ValueError otherwise."""
    if dtype == "auto":
        return source
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(map(repr, DTYPE_CHOICES))}")
    return DTYPES[dtype]


def _read_folder(path: Path) -> tuple[dict, StateDict, list[str]]:
    """(HF config, HF state dict, notes) of an HF model folder, or of a Meta checkpoint folder
    (``params.json`` + ``consolidated.NN.pth``, converted to the HF Llama form by
    :func:`lmlab.interop.meta.read_meta`)."""

    if path.is_dir() and not (path / "config.json").is_file() and is_meta_folder(path):
        return read_meta(path)
    return read_hf_config(path), read_hf_state(path), []


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def check_declared(hf: dict, state: StateDict, where: str) -> None:
    """Check what ``hf`` (the config read from ``where``) declares against the tensors of ``state``
    before any model is built from it: ``dtype`` / ``torch_dtype`` a torch dtype name or 'auto' (or
    null); ``num_hidden_layers`` (also ``n_layer``, ``num_layers``, and in ``text_config``) no more
    than the layers whose tensors are present (the other sizes are checked against the tensors' shapes
    by the family's conversion, before allocating); every floating tensor finite. Raises HFFormatError
    naming the field or tensor, the value and what the weights hold."""
    for key in ("torch_dtype", "dtype"):
        value = hf.get(key)
        if value is None or value == "auto":
            continue
        name = value.removeprefix("torch.") if isinstance(value, str) else None
        if not (name and isinstance(getattr(torch, name, None), torch.dtype)):
            raise HFFormatError(
                f"{where}: {key}={value!r} is not a dtype; valid: 'auto' or a torch dtype name "
                f"(float32, bfloat16, float16, float64, ...)"
            )
    layers = {int(m.group(1)) for k in state for m in [_LAYER_INDEX.search(k)] if m}
    found = max(layers) + 1 if layers else 0
    for section in (hf, hf.get("text_config") if isinstance(hf.get("text_config"), dict) else {}):
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and layers and value > found:
                raise HFFormatError(
                    f"{where}: {key}={value} but the weights hold {found} layer(s) "
                    f"(indices {min(layers)}-{max(layers)}); the config and the weights disagree"
                )
    for name, t in state.items():
        if t.is_floating_point():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                raise HFFormatError(
                    f"{where}: tensor {name!r} holds {bad:,} NaN or infinite value(s) of "
                    f"{t.numel():,}; the weights are damaged, refused"
                )


def hf_to_lmlab(path: str | Path, dtype: str = "fp32", notes: Optional[list] = None):
    """(model (eval mode), ModelConfig, Family, HF config) from HF model folder ``path`` (or a Meta
    checkpoint folder, see :func:`_read_folder`; its conversion notes are appended to ``notes``). The
    model's parameters are fp32 or bf16 (``dtype``: 'fp32', 'bf16', or 'auto': bf16 when the checkpoint
    stores every floating tensor in bf16, else fp32; see :func:`stored_dtype`). Raises HFFormatError
    (:func:`check_declared`) before building the model when the config's sizes or dtype contradict the
    weights or a tensor is not finite."""

    resolve_dtype(dtype, torch.float32)  # the name checked before anything is read
    hf, hf_state, extra = _read_folder(Path(path))
    if notes is not None:
        notes.extend(extra)
    check_declared(
        hf, hf_state, str(Path(path) / "config.json") if (Path(path) / "config.json").is_file() else str(path)
    )
    family = get_family(hf["model_type"])
    cfg = family.config_to_lmlab(dict(hf))
    target = resolve_dtype(dtype, stored_dtype(t.dtype for t in hf_state.values()))
    state = family.state_to_lmlab(hf_state, cfg, hf)
    model = TransformerLM(cfg)
    load_strict(model, state)  # fp32: exact for bf16 and fp16 tensors
    return model.to(target).eval(), cfg, family, hf


# ------------------------------------------------------------------------------------------------
# Import
# ------------------------------------------------------------------------------------------------


def _refuse_existing(folder: Path, what: str) -> None:
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise HFFormatError(f"{what} {str(folder)!r} already exists; choose another folder (nothing is overwritten)")


def import_hf(path: str | Path, out_run_dir: str | Path, dtype: str = "auto") -> dict:
    """Convert HF model folder ``path`` into a new lmlab run folder ``out_run_dir``.

    ``dtype`` of the stored checkpoint: 'auto' (default) keeps the HF checkpoint's, bf16 when all its
    floating tensors are bf16 and fp32 otherwise (fp16 becomes fp32, exactly); 'fp32' or 'bf16' convert
    (fp32 -> bf16 rounds to nearest). Runs load any checkpoint into an fp32 model for training and
    evaluation; the dtype is that of the stored weights (a bf16 checkpoint is half the size).

    Returns a summary: model_type, parameter count, whether a tokenizer was copied, checkpoint folder, and
    ``notes``, one line each: what a conversion from Meta's layout did, and the config.json fields
    transformers never reads that were accepted as describing this model anyway (``common.Unread``;
    e.g. Qwen2.5's ``use_mrope: false``).
    Raises UnsupportedError (a config or tensor lmlab cannot represent), HFFormatError (an unreadable
    folder, or ``out_run_dir`` exists). Nothing is written unless the import succeeds."""

    path, out = Path(path), Path(out_run_dir)
    _refuse_existing(out, "run folder")
    conversion: list[str] = []
    model, cfg, family, hf = hf_to_lmlab(path, dtype, conversion)
    stored = DTYPE_NAMES[next(model.parameters()).dtype]

    tmp = make_temp_dir(out, "import-tmp")  # a new, uniquely named folder: the only one ever removed here
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the run folder gets the usual permissions
        from lmlab.data.tokenizer import Tokenizer

        if (path / "tokenizer.json").is_file():  # byte for byte
            shutil.copyfile(path / "tokenizer.json", tmp / "tokenizer.json")
        else:  # GPT-2-style vocab.json + merges.txt, built into a tokenizer.json
            tok, text = Tokenizer.from_folder(path)
            if tok is not None:
                (tmp / "tokenizer.json").write_text(text)
        tokenizer = (tmp / "tokenizer.json").is_file()
        spec = {
            "model": cfg.to_dict(),
            "train": dataclasses.asdict(TrainConfig()),
            "data": None,
            "hf": {
                "model_type": family.model_type,
                "hf_class": family.hf_class,
                "source": str(path.resolve()),
                "tokenizer": tokenizer,
                "dtype": stored,
                "special_tokens": {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in hf},
                "note": "imported with `lmlab import`; fine-tune with `lmlab train --out RUN --resume "
                "--data DIR` on data prepared with this run's tokenizer",
            },
        }
        write_run(tmp, spec)
        checkpoint.save_checkpoint(
            tmp, 0, model, None, {"step": 0, "tokens_seen": 0, "imported_from": str(path.resolve())}, keep=0
        )
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    unread = family.unread_notes(hf) if family.unread_notes is not None else []
    notes = conversion + [f"config.json {n}" for n in unread]
    return {
        "model_type": family.model_type,
        "params": model.num_params(),
        "tokenizer": tokenizer,
        "run": str(out),
        "checkpoint": str(out / "checkpoints" / "step_0000000"),
        "notes": notes,
        "dtype": stored,
    }


# ------------------------------------------------------------------------------------------------
# Export
# ------------------------------------------------------------------------------------------------


def _ordered_families() -> list[Family]:
    fams = families()
    names = [n for n in PREFERRED if n in fams] + sorted(n for n in fams if n not in PREFERRED)
    return [fams[n] for n in names]


def lmlab_to_hf_config(
    cfg: ModelConfig, family: Optional[str] = None, hint: Optional[str] = None
) -> tuple[Family, dict]:
    """(family, config.json mapping) for ``cfg``: the family named ``family``, else ``hint`` (the run's
    imported model_type) when it represents cfg, else the first family that does. Every choice is checked
    by converting the mapping back (roundtrip.verify_roundtrip). UnsupportedError when none represents it."""
    if family is not None:
        fam = get_family(family)
        return fam, verify_roundtrip(fam.model_type, cfg, fam.config_to_hf(cfg), fam.config_to_lmlab)
    candidates = _ordered_families()
    if hint is not None and hint in families():
        candidates = [families()[hint]] + [f for f in candidates if f.model_type != hint]
    reasons = []
    for fam in candidates:
        try:
            return fam, verify_roundtrip(fam.model_type, cfg, fam.config_to_hf(cfg), fam.config_to_lmlab)
        except (UnsupportedError, ConfigError) as exc:
            why = str(exc).split(": ", 1)[-1]
            reasons.append(f"  {fam.model_type}: {why if len(why) <= 160 else why[:157] + '...'}")
    raise UnsupportedError(
        "no Hugging Face family represents this config exactly; why not, per "
        "family (`--family NAME` gives one family's reasons in full):\n" + "\n".join(reasons)
    )


def load_run_model(run_dir: str | Path, step: Optional[int] = None):
    """(model (fp32, eval mode), ModelConfig, run dict, checkpoint folder) of a run's latest checkpoint
    (or ``step``): :func:`lmlab.checkpoint.load_run` without the tokenizer (an imported run has none),
    so run.yaml is checked against its checkpoint's copy and a damaged newest checkpoint falls back to
    the previous one, with a warning. Raises CheckpointError."""

    model, cfg, _, run, ckpt = load_run(run_dir, step=step, tokenizer=False)
    return model, cfg, run, ckpt


def export_model(
    model: torch.nn.Module,
    out_dir: str | Path,
    family: Optional[str] = None,
    hint: Optional[str] = None,
    extra_config: Optional[dict] = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Family, dict]:
    """Write ``model`` (a TransformerLM) as an HF model folder: config.json and model.safetensors in
    ``dtype`` (torch.float32 or torch.bfloat16; config.json's ``dtype`` says which). ``family`` / ``hint``
    as in :func:`lmlab_to_hf_config`; ``extra_config``: metadata fields added to config.json (special
    token ids). Returns (family, config.json mapping)."""
    cfg = model.cfg
    fam, hf = lmlab_to_hf_config(cfg, family, hint)
    state = fam.state_to_hf(
        {
            k: v.detach().to(device="cpu", dtype=dtype)
            for k, v in model.state_dict().items()
            if not k.startswith("mtp.")
        },
        cfg,
    )  # MTP: training only (export_hf says so)
    state = {k: v.clone().contiguous() for k, v in state.items()}  # no shared storage in safetensors
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out / "model.safetensors", 0o666 & ~umask)  # safetensors creates it 0600; match config.json
    hf = dict(hf, **(extra_config or {}), dtype=HF_DTYPE_NAMES[dtype], torch_dtype=HF_DTYPE_NAMES[dtype])
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return fam, hf


def checkpoint_dtype(ckpt_dir: str | Path) -> torch.dtype:
    """The dtype of the weights stored in checkpoint ``ckpt_dir`` (:func:`stored_dtype` of its
    model.safetensors, read from the header only)."""
    from safetensors import safe_open

    with safe_open(str(Path(ckpt_dir) / "model.safetensors"), framework="pt") as f:
        names = set(f.get_slice(k).get_dtype() for k in f.keys())
    return stored_dtype({"BF16": torch.bfloat16, "F16": torch.float16}.get(n, torch.float32) for n in names)


def export_hf(
    run_dir: str | Path,
    out_dir: str | Path,
    family: Optional[str] = None,
    step: Optional[int] = None,
    dtype: str = "auto",
) -> dict:
    """Write the run's latest checkpoint (or ``step``) as an HF model folder ``out_dir``: config.json,
    model.safetensors and tokenizer.json when the run has one. ``dtype`` of the written weights: 'auto'
    (default) that of the checkpoint's stored weights (:func:`checkpoint_dtype`: bf16 for an import kept
    in bf16, fp32 for a run lmlab trained), else 'fp32' or 'bf16'. An imported run's special token ids
    (bos/eos/pad) go back into config.json; a run with lmlab's own tokenizer gets its <|endoftext|> as
    bos and eos. Returns a summary. Raises UnsupportedError when the family (or none) represents the
    config, CheckpointError for a bad run, HFFormatError when ``out_dir`` exists and is not empty."""
    run_dir, out = Path(run_dir), Path(out_dir)
    resolve_dtype(dtype, torch.float32)  # the name checked before anything is read
    _refuse_existing(out, "output folder")
    model, cfg, run, ckpt = load_run_model(run_dir, step)
    target = resolve_dtype(dtype, checkpoint_dtype(ckpt))
    meta = run["hf"] if isinstance(run.get("hf"), dict) else {}
    special = dict(meta.get("special_tokens") or {})
    if not meta and (run_dir / "tokenizer.json").is_file():
        from lmlab.data.tokenizer import Tokenizer, TokenizerError

        try:
            eot = Tokenizer.load(run_dir / "tokenizer.json").eot_id
            special = {"bos_token_id": eot, "eos_token_id": eot}
        except TokenizerError:
            pass
    fam, hf = export_model(model, out, family, meta.get("model_type"), special, target)
    if (run_dir / "tokenizer.json").is_file():
        shutil.copyfile(run_dir / "tokenizer.json", out / "tokenizer.json")
    left_out = (
        [
            f"the {cfg.mtp_depth} multi-token prediction module(s) (training only; the logits do not use "
            f"them, and no converted family holds them: transformers' DeepSeek-V3 drops them too)"
        ]
        if cfg.mtp_depth
        else []
    )
    return {
        "model_type": fam.model_type,
        "hf_class": fam.hf_class,
        "checkpoint": str(ckpt),
        "out": str(out),
        "dtype": DTYPE_NAMES[target],
        "left_out": left_out,
    }
