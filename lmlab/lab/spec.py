"""``lmlab sweep``: run an ablation side by side, every variant x seed as an ordinary run folder.

A spec is a YAML mapping::

    name: parallel-block                 # default: the file name
    claim: "..."                         # the claim under test, printed at the top of the report
    preset: llama-2-7b                   # optional base preset (scale: tiny by default)
    model: {d_model: 128, n_layers: 4}   # ModelConfig fields, over the preset
    train: {batch_size: 16, lr: 3.0e-3}  # TrainConfig fields
    data: data/shakespeare-bpe4096       # a prepared data folder (default: the default corpus, BPE 4096)
    axes:
      grid:                              # cartesian product of the axes
        parallel_block: [false, true]    # a field and its values ...
        norm:                            # ... or an axis of field bundles, each with an optional label
          - {label: RMSNorm, norm_type: rmsnorm}
          - {label: LayerNorm, norm_type: layernorm}
      zip:                               # lists varied together (equal lengths), crossed with the grid
        activation: [gelu, swiglu]
        d_ff: [512, 341]
        label: [GELU, SwiGLU]            # optional
    seeds: [1, 2]
    budget: {steps: 300}                 # or {tokens: N}, {flops: F} (training FLOPs per run, converted
                                         # with lmlab.analysis.flops_per_token), {seconds: S} (wall time)
    eval_contexts: [1, 2]                # held-out bits-per-byte at 1x and 2x the training context
    measure_decode: true                 # KV-cache decode tokens/s (lmlab.bench.bench_decode)

Axis values name ModelConfig or TrainConfig fields (found by name, as ``--set`` does). The sweep folder
holds ``spec.yaml`` (the spec as run), ``configs/RUN.yaml`` (each run's full config), ``logs/RUN.log``
(the training output), ``runs/RUN/`` (ordinary run folders: ``lmlab eval``, ``generate`` and ``plot``
work on them) and ``results.jsonl`` (one JSON object per run). A run is named after its variant and
seed (``parallel_block=true-s1``).

Each run trains in a subprocess (``python -m lmlab.cli train``; ``--jobs N`` runs N at once, each with
cores // N torch threads); the sweep process then scores the whole validation split (bits-per-byte,
:func:`lmlab.evaluate.evaluate`), optionally at longer contexts and the decode speed, and records the
result. Rerunning the same command resumes: runs with a result are skipped, trained runs are only
evaluated, interrupted runs continue from their last checkpoint. A run that stops on non-finite losses
(``FloatingPointError`` after ``max_bad_steps``) is recorded as diverged and the sweep goes on.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from lmlab.config import ConfigError, ModelConfig, check_keys, load_mapping

SPECS_DIR = Path(__file__).parent / "specs"
SPEC_KEYS = ("name", "claim", "preset", "scale", "model", "train", "data", "axes", "seeds", "budget",
             "eval_contexts", "measure_decode", "decode", "notes")
BUDGET_KEYS = ("steps", "tokens", "flops", "seconds")
# training settings a sweep changes from TrainConfig's defaults unless the spec sets them
SWEEP_TRAIN_DEFAULTS = {"tensorboard": False, "keep_checkpoints": 1, "checkpoint_interval": 100}
DECODE_DEFAULTS = {"batch": 8, "prompt_len": 32, "new_tokens": 64, "repeats": 3}
RESULTS_FILE = "results.jsonl"
DIVERGED_MARK = "non-finite steps in a row"  # the FloatingPointError message of Trainer.fit


@dataclass
class Variant:
    label: str
    fields: dict  # field name -> value, model and train fields together


@dataclass
class Spec:
    name: str
    claim: str
    path: Optional[Path]
    raw: dict
    preset: Optional[str]
    scale: str
    model: dict
    train: dict
    data: Optional[str]
    variants: list
    seeds: list
    budget: dict
    eval_contexts: list
    measure_decode: bool
    decode: dict


@dataclass
class RunPlan:
    name: str
    variant: str
    seed: int
    fields: dict
    cfg: ModelConfig
    tc: Any  # TrainConfig
    tokens_per_step: int
    flops_per_token: float
    data: Path

    @property
    def steps(self) -> int:
        return self.tc.max_steps

    @property
    def tokens(self) -> int:
        return self.tc.max_steps * self.tokens_per_step

    @property
    def flops(self) -> float:
        return self.tokens * self.flops_per_token


# --- spec ----------------------------------------------------------------------------------
def builtin_specs() -> dict[str, Path]:
    """Shipped specs by name (``lmlab/specs/NAME.yaml``)."""
    return {p.stem: p for p in sorted(SPECS_DIR.glob("*.yaml"))}


def resolve_spec_path(spec: str | Path) -> Path:
    """A spec file path, or the name of a shipped spec."""
    path = Path(spec)
    if path.is_file():
        return path
    shipped = builtin_specs()
    if str(spec) in shipped:
        return shipped[str(spec)]
    import difflib

    near = difflib.get_close_matches(str(spec), list(shipped), n=1)
    raise ConfigError(f"sweep spec {str(spec)!r} is neither a file nor a shipped spec"
                      + (f"; did you mean {near[0]!r}?" if near else f"; shipped: {', '.join(shipped)}"))


def _fmt(value: Any) -> str:
    """A value in a label: YAML spelling for booleans and null, else str."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value)


def _field_names() -> tuple[set, set]:
    from lmlab.train import TrainConfig

    return set(ModelConfig.__dataclass_fields__), set(TrainConfig.__dataclass_fields__)


def _check_field(name: str, source: str) -> None:
    model_keys, train_keys = _field_names()
    if name not in model_keys | train_keys:
        import difflib

        near = difflib.get_close_matches(name, sorted(model_keys | train_keys), n=1)
        raise ConfigError(f"{source}: {name!r} is not a ModelConfig or TrainConfig field"
                          + (f"; did you mean {near[0]!r}?" if near else ""))


def _bundle(value: dict, source: str) -> tuple[Optional[str], dict]:
    value = dict(value)
    label = value.pop("label", None)
    if not value:
        raise ConfigError(f"{source}: a variant needs at least one field besides 'label'")
    for k in value:
        _check_field(str(k), source)
    return (None if label is None else str(label)), value


def expand_axes(axes: Any, source: str = "axes") -> list[Variant]:
    """The variants of ``axes``: the cartesian product of the ``grid`` axes, crossed with the ``zip``
    lists taken together. Without axes, one variant ``base``. Labels: the given ``label``, else
    ``field=value`` joined by ``, ``."""
    if axes is None or axes == {}:
        return [Variant("base", {})]
    if not isinstance(axes, dict):
        raise ConfigError(f"{source}: expected a mapping with 'grid' and/or 'zip', got {type(axes).__name__}")
    unknown = set(axes) - {"grid", "zip"}
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {sorted(unknown)}; use 'grid:' (cartesian product) and "
                          f"'zip:' (lists varied together)")
    groups: list[list[tuple[str, dict]]] = []
    grid = axes.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{source}.grid: expected a mapping of axis name -> list of values")
    for axis, values in grid.items():
        where = f"{source}.grid.{axis}"
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: expected a non-empty list of values")
        options = []
        for i, v in enumerate(values):
            if isinstance(v, dict):
                label, fields_ = _bundle(v, f"{where}[{i}]")
                options.append((label or ", ".join(f"{k}={_fmt(x)}" for k, x in fields_.items()), fields_))
            else:
                _check_field(str(axis), where)
                options.append((f"{axis}={_fmt(v)}", {axis: v}))
        groups.append(options)
    zipped = axes.get("zip")
    if zipped:
        where = f"{source}.zip"
        options = []
        if isinstance(zipped, list):  # a list of variants, each a mapping of fields (and a label)
            for i, v in enumerate(zipped):
                if not isinstance(v, dict):
                    raise ConfigError(f"{where}[{i}]: expected a mapping of fields")
                label, fields_ = _bundle(v, f"{where}[{i}]")
                options.append((label or ", ".join(f"{k}={_fmt(x)}" for k, x in fields_.items()), fields_))
        elif isinstance(zipped, dict):
            lists = dict(zipped)
            labels = lists.pop("label", None)
            if not lists:
                raise ConfigError(f"{where}: needs at least one field besides 'label'")
            lengths = {k: len(v) if isinstance(v, list) else -1 for k, v in lists.items()}
            if labels is not None:
                lengths["label"] = len(labels) if isinstance(labels, list) else -1
            if min(lengths.values()) < 1 or len(set(lengths.values())) != 1:
                raise ConfigError(f"{where}: every entry must be a non-empty list, all of one length; got lengths "
                                  + ", ".join(f"{k}={n if n >= 0 else 'not a list'}" for k, n in lengths.items()))
            for k in lists:
                _check_field(str(k), where)
            for i in range(len(next(iter(lists.values())))):
                fields_ = {k: v[i] for k, v in lists.items()}
                label = str(labels[i]) if labels is not None else ", ".join(f"{k}={_fmt(x)}" for k, x in fields_.items())
                options.append((label, fields_))
        else:
            raise ConfigError(f"{where}: expected a mapping of field -> list, or a list of variants")
        groups.append(options)
    variants = []
    for combo in itertools.product(*groups):
        merged: dict = {}
        for _, fields_ in combo:
            for k, v in fields_.items():
                if k in merged and merged[k] != v:
                    raise ConfigError(f"{source}: field {k!r} is set twice in one variant ({merged[k]!r} and {v!r})")
                merged[k] = v
        variants.append(Variant(", ".join(label for label, _ in combo), merged))
    labels = [v.label for v in variants]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"{source}: variant label(s) {dupes} occur more than once; give distinct labels")
    return variants


def _number(value: Any, where: str) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 2.5e12 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}={value!r} must be a finite number > 0")
    return value


def parse_budget(budget: Any, source: str = "budget") -> dict:
    """``{steps|tokens|flops|seconds: N}``; ``seconds`` may come with ``steps`` (the step cap, over
    which the LR schedule runs)."""
    if budget is None:
        return {}
    if not isinstance(budget, dict):
        raise ConfigError(f"{source}: expected a mapping such as {{steps: 300}}, got {budget!r}")
    unknown = set(budget) - set(BUDGET_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {sorted(unknown)}; use one of {', '.join(BUDGET_KEYS)}")
    keys = set(budget)
    if len(keys) > 1 and keys != {"seconds", "steps"}:
        raise ConfigError(f"{source}: give one of {', '.join(BUDGET_KEYS)} (or seconds with a steps cap), got "
                          f"{sorted(keys)}")
    out = {k: _number(v, f"{source}.{k}") for k, v in budget.items()}
    for k in ("steps", "tokens"):
        if k in out:
            if out[k] != int(out[k]):
                raise ConfigError(f"{source}.{k}={budget[k]!r} must be an integer")
            out[k] = int(out[k])
    return out


def parse_spec(raw: dict, path: Optional[Path] = None) -> Spec:
    """Validate a spec mapping (see the module docstring); raises ConfigError naming the key."""
    source = str(path) if path else "sweep spec"
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a sweep spec must be a mapping")
    if not raw:
        raise ConfigError(f"{source}: the spec is empty; give at least 'axes' (the variants to compare) or "
                          f"'model'/'train' settings (examples: lmlab/specs/*.yaml)")
    unknown = [k for k in raw if k not in SPEC_KEYS]
    if unknown:
        import difflib

        near = difflib.get_close_matches(str(unknown[0]), SPEC_KEYS, n=1)
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}" + (f"; did you mean {near[0]!r}?" if near else
                                                                     f"; valid keys: {', '.join(SPEC_KEYS)}"))
    from lmlab.train import TrainConfig

    for section in ("model", "train"):
        if not isinstance(raw.get(section) or {}, dict):
            raise ConfigError(f"{source}: '{section}:' must be a mapping of field names to values, got {raw[section]!r}")
    model = dict(raw.get("model") or {})
    train = dict(raw.get("train") or {})
    check_keys(ModelConfig, model, f"{source} model")
    check_keys(TrainConfig, train, f"{source} train")
    seeds = raw.get("seeds", [train.get("seed", TrainConfig.seed)])
    if not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                                                       for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{source}: seeds={seeds!r} must be a non-empty list of distinct integers >= 0")
    contexts = raw.get("eval_contexts", [1])
    if not isinstance(contexts, list) or any(isinstance(c, bool) or not isinstance(c, (int, float)) or c <= 0
                                             for c in contexts):
        raise ConfigError(f"{source}: eval_contexts={contexts!r} must be a list of context multiples, e.g. [1, 2]")
    if any(c < 1 or int(c * 8) != c * 8 for c in contexts):
        raise ConfigError(f"{source}: eval_contexts={contexts!r}: multiples must be >= 1 and whole eighths "
                          f"(1, 1.5, 2, ...)")
    decode = {**DECODE_DEFAULTS, **(raw.get("decode") or {})}
    if set(decode) != set(DECODE_DEFAULTS):
        raise ConfigError(f"{source}: decode keys must be among {', '.join(DECODE_DEFAULTS)}")
    for k, v in decode.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{source}: decode.{k}={v!r} must be an integer >= 1")
    if not isinstance(raw.get("measure_decode", False), bool):
        raise ConfigError(f"{source}: measure_decode must be true or false")
    scale = raw.get("scale", "tiny")
    if scale not in ("tiny", "real"):
        raise ConfigError(f"{source}: scale={scale!r} must be 'tiny' or 'real'")
    name = raw.get("name") or (path.stem if path else "sweep")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", str(name)):
        raise ConfigError(f"{source}: name={name!r} may hold only letters, digits, '.', '_' and '-'")
    return Spec(name=str(name), claim=str(raw.get("claim") or "").strip(), path=path, raw=raw,
                preset=raw.get("preset"), scale=scale, model=model, train=train,
                data=None if raw.get("data") is None else str(raw["data"]),
                variants=expand_axes(raw.get("axes"), f"{source} axes"), seeds=seeds,
                budget=parse_budget(raw.get("budget"), f"{source} budget"),
                eval_contexts=sorted({1, *contexts}), measure_decode=raw.get("measure_decode", False), decode=decode)


def load_spec(spec: str | Path) -> Spec:
    path = resolve_spec_path(spec)
    return parse_spec(load_mapping(path), path)


# --- plan ----------------------------------------------------------------------------------
def slug(text: str) -> str:
    """A folder-name-safe version of a label."""
    s = re.sub(r"[^A-Za-z0-9._+=-]+", "-", text.replace(", ", "_")).strip("-.")
    return s or "run"


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token at the model's context (:func:`lmlab.analysis.flops_per_token`)."""
    from lmlab.analysis import flops_per_token as fpt

    return float(fpt(cfg, cfg.context_length, training=True))


def budget_steps(budget: dict, tokens_per_step: int, flops_per_tok: float, default_steps: int) -> int:
    """Training steps a budget buys: ``steps``; floor(tokens / tokens per step); floor(FLOPs / (training
    FLOPs per token x tokens per step)); for ``seconds`` the step cap (``steps`` or the spec's max_steps).
    Raises ConfigError when a tokens or FLOPs budget buys no whole step."""
    if "tokens" in budget:
        steps = int(budget["tokens"] // tokens_per_step)
        unit = f"{tokens_per_step:,} tokens"
    elif "flops" in budget:
        steps = int(budget["flops"] // (flops_per_tok * tokens_per_step))
        unit = f"{flops_per_tok * tokens_per_step:.3g} FLOPs"
    else:
        return int(budget.get("steps", default_steps))
    if steps < 1:
        key = "tokens" if "tokens" in budget else "flops"
        raise ConfigError(f"budget {key}={budget[key]:g} buys no training step (one step is {unit}); raise the budget")
    return steps


def plan_runs(spec: Spec, data_dir: Optional[Path] = None) -> list[RunPlan]:
    """Every (variant, seed) of ``spec`` with its validated ModelConfig and TrainConfig. Without
    ``data_dir`` the spec's data (or the default corpus, prepared on first use) is used; every variant is
    checked before anything is prepared."""
    from lmlab.data.prepare import TokenData

    if data_dir is None:
        from lmlab.runs import DEFAULT_VOCAB, ensure_default_data

        _plan(spec, None, TokenData(spec.data).vocab_size if spec.data else DEFAULT_VOCAB)
        data_dir = ensure_default_data(spec.data)
    data_dir = Path(data_dir).resolve()
    return _plan(spec, data_dir, TokenData(data_dir).vocab_size)


def _plan(spec: Spec, data_dir: Optional[Path], vocab: int) -> list[RunPlan]:
    from lmlab.train import TrainConfig

    base_model: dict = {}
    if spec.preset:
        from lmlab.presets import get_preset

        preset = get_preset(spec.preset)
        base_model = {**preset.real, **(preset.tiny if spec.scale == "tiny" else {})}
    model_keys, train_keys = _field_names()
    plans, names = [], set()
    for v in spec.variants:
        vm = {k: x for k, x in v.fields.items() if k in model_keys}
        vt = {k: x for k, x in v.fields.items() if k in train_keys and k not in model_keys}
        model = {**base_model, **spec.model, **vm}
        if "vocab_size" not in spec.model and "vocab_size" not in vm:
            model["vocab_size"] = vocab  # the data's tokenizer decides
        where = f"{spec.path or 'sweep spec'}, variant {v.label!r}"  # named in every error of this variant
        try:
            cfg = ModelConfig.from_dict(model, f"{where} model")
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        for seed in spec.seeds:
            train = {**SWEEP_TRAIN_DEFAULTS, **spec.train, **vt, "seed": seed}
            try:
                tc = TrainConfig.from_dict(train, f"{where} train")
            except TypeError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            tps = tc.batch_size * tc.grad_accum * cfg.context_length
            fpt = flops_per_token(cfg)
            try:
                steps = budget_steps(spec.budget, tps, fpt, tc.max_steps)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            changes = {"max_steps": steps}
            if "seconds" in spec.budget:
                changes["max_seconds"] = float(spec.budget["seconds"])
            tc = dataclasses.replace(tc, **changes)
            name = f"{slug(v.label)}-s{seed}"
            k = 2
            while name in names:  # two labels with one slug
                name = f"{slug(v.label)}-{k}-s{seed}"
                k += 1
            names.add(name)
            plans.append(RunPlan(name, v.label, seed, dict(v.fields), cfg, tc, tps, fpt, data_dir))
    return plans


# --- run state -----------------------------------------------------------------------------
def read_jsonl(path: Path) -> list[dict]:
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return out


def read_results(sweep_dir: str | Path) -> list[dict]:
    """The rows of ``results.jsonl`` (one per run). A line that is not JSON (cut by a kill mid-write) is
    skipped with a warning on stderr: its run counts as not finished, so ``lmlab sweep`` scores it again."""
    path = Path(sweep_dir) / RESULTS_FILE
    rows = read_jsonl(path)
    if path.is_file():
        bad = sum(1 for line in path.read_text().splitlines() if line.strip()) - len(rows)
        if bad:
            print(f"warning: {path}: skipped {bad} unreadable line(s) (cut by an interrupted write?); "
                  f"their runs count as unfinished", file=sys.stderr)
    return rows


def _last_checkpoint_step(run_dir: Path) -> int:
    from lmlab.checkpoint import checkpoint_dirs

    ckpts = checkpoint_dirs(run_dir)
    return int(ckpts[-1].name.split("_")[1]) if ckpts else 0


def run_state(run_dir: Path, max_steps: int) -> str:
    """``new`` (no run folder), ``trained`` (the last checkpoint is at max_steps, or training stopped on
    its wall-time budget) or ``partial``."""
    if not (run_dir / "run.yaml").is_file():
        return "new"
    step = _last_checkpoint_step(run_dir)
    if step >= max_steps:
        return "trained"
    if step and any(r.get("stopped") == "max_seconds" and r.get("step") == step
                    for r in read_jsonl(run_dir / "metrics.jsonl")):
        return "trained"
    return "partial"


def _check_existing(p: RunPlan, run_dir: Path) -> None:
    """An existing run folder must hold this very run (else the spec changed under it)."""
    from lmlab.checkpoint import read_run

    if not (run_dir / "run.yaml").is_file():
        return
    run = read_run(run_dir)
    want = {"model": p.cfg.to_dict(), "train": dataclasses.asdict(p.tc)}
    diff = [f"{sec}.{k}: run has {run.get(sec, {}).get(k)!r}, spec asks {v!r}"
            for sec in ("model", "train") for k, v in want[sec].items() if run.get(sec, {}).get(k, v) != v]
    if run.get("data") != str(p.data):
        diff.append(f"data: run has {run.get('data')!r}, spec asks {str(p.data)!r}")
    if diff:
        raise ConfigError(f"run folder {str(run_dir)!r} holds a different run than the spec asks "
                          f"({'; '.join(diff[:3])}); give the sweep another --out, or delete that run folder")


# --- evaluation ----------------------------------------------------------------------------
def _machine(device_name: str) -> str:
    from lmlab.bench import describe_machine
    from lmlab.train import resolve_device

    try:
        return describe_machine(resolve_device(device_name))
    except ConfigError:  # a device name the run itself already refused: it trained nowhere else
        return describe_machine("cpu")


def _nan_to_none(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def evaluate_run(run_dir: Path, contexts: list, decode: Optional[dict] = None) -> dict:
    """Full validation split of a trained run: loss and bits-per-byte at ``contexts`` multiples of the
    training context (a multiple the positions cannot reach, learned positions beyond the table, gives
    None and the reason), KV-cache bytes and, with ``decode``, decode tokens/s."""
    import torch

    from lmlab.analysis import kv_cache_bytes
    from lmlab.checkpoint import load_run
    from lmlab.data.prepare import TokenData
    from lmlab.evaluate import evaluate
    from lmlab.model import TransformerLM
    from lmlab.train import resolve_device

    device = resolve_device("auto")
    model, cfg, _, run, _ = load_run(run_dir, device=str(device))
    data = TokenData(run["data"])
    tokens, n_bytes = data.tokens("val"), data.bytes("val")
    out: dict = {"params": model.num_params(), "non_embedding_params": model.num_params(non_embedding=True)}
    for mult in contexts:
        suffix = "" if mult == 1 else f"_{_fmt(mult)}x"
        ctx = int(cfg.context_length * mult)
        if mult == 1:
            m = model
        elif cfg.position == "learned" and ctx > cfg.context_length:
            out[f"val_loss{suffix}"] = out[f"val_bpb{suffix}"] = None
            out[f"eval_note{suffix}"] = f"learned positions exist only below context_length={cfg.context_length}"
            continue
        else:  # the same weights in a model built for the longer context
            m = TransformerLM(dataclasses.replace(cfg, context_length=ctx)).to(device)
            m.load_state_dict(model.state_dict())
            m.eval()
        res = evaluate(m, tokens, n_bytes, batch_size=16, device=device)
        out[f"val_loss{suffix}"] = _nan_to_none(res["loss"])
        out[f"val_bpb{suffix}"] = _nan_to_none(res["bits_per_byte"])
        if mult == 1:
            out["val_tokens"], out["val_bytes"] = res["tokens"], res["bytes"]
    kv = kv_cache_bytes(cfg, cfg.context_length, batch=1, dtype="fp32")
    out["kv_bytes_per_token"] = kv["per_token"]
    out["kv_bytes_context"] = kv["total"]
    if decode:
        from lmlab.bench import bench_decode

        d = dict(decode)
        d["prompt_len"] = min(d["prompt_len"], cfg.context_length // 2)
        d["new_tokens"] = max(2, min(d["new_tokens"], cfg.context_length - d["prompt_len"] + 1))
        res = bench_decode(model, batch=d["batch"], prompt_len=d["prompt_len"], new_tokens=d["new_tokens"],
                           repeats=d["repeats"], device=device)
        out["decode_tokens_per_s"] = res["decode_tokens_per_s"]
        out["prefill_tokens_per_s"] = res["prefill_tokens_per_s"]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def training_summary(run_dir: Path) -> dict:
    """From ``metrics.jsonl`` and the last checkpoint: steps, tokens, training wall time (summed over
    resumed invocations), median tokens/s, final train loss (mean of those logged in the last 10% of the
    steps), spikes, skipped
    steps and whether training stopped on its wall-time budget."""
    from lmlab.checkpoint import checkpoint_dirs
    from lmlab.plot import cumulative_wall_time

    recs = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in recs if "loss" in r and "tokens" in r and not r.get("skipped")]
    timed = cumulative_wall_time([r for r in recs if r.get("elapsed_s") is not None])  # across resumes
    wall = timed[-1]["elapsed_s"] if timed else 0.0
    losses = [r["loss"] for r in train if r["step"] >= 0.9 * train[-1]["step"]] if train else []
    tps = [r["tokens_per_s"] for r in train if r.get("tokens_per_s")]
    state: dict = {}
    ckpts = checkpoint_dirs(run_dir)
    if ckpts and (ckpts[-1] / "trainer.json").is_file():
        state = json.loads((ckpts[-1] / "trainer.json").read_text())
    final = sum(losses) / len(losses) if losses else None
    diag = [r for r in recs if "max_attn_logit" in r]  # TrainConfig.diag_interval records
    return {
        "steps": state.get("step", train[-1]["step"] if train else 0),
        "tokens": state.get("tokens_seen", train[-1]["tokens"] if train else 0),
        "wall_s": wall,
        "tokens_per_s": statistics.median(tps) if tps else None,
        "first_train_loss": train[0]["loss"] if train else None,
        "final_train_loss": _nan_to_none(final),
        "spikes": train[-1].get("spikes", 0) if train else 0,
        "skipped_steps": sum(1 for r in recs if r.get("skipped")),
        "stopped_early": any(r.get("stopped") == "max_seconds" for r in recs),
        # largest attention logit (any layer) and output log Z seen by the diagnostics, None without them
        "max_attn_logit": _nan_to_none(max((max(r["max_attn_logit"]) for r in diag if r["max_attn_logit"]),
                                           default=None)),
        "log_z_max": _nan_to_none(max((r["log_z_max"] for r in diag if "log_z_max" in r), default=None)),
    }


def collect_result(p: RunPlan, run_dir: Path, spec: Spec, diverged: bool, error: Optional[str]) -> dict:
    """The results row of one run (see RESULT_COLUMNS in lmlab.report)."""
    summary = training_summary(run_dir)
    final = summary["final_train_loss"]
    first = summary["first_train_loss"]
    if summary["steps"] and not error and (final is None or (first is not None and final > first)):
        diverged = True  # non-finite at the end, or the loss ended above where it was first logged
    row: dict = {"sweep": spec.name, "run": p.name, "variant": p.variant, "seed": p.seed,
                 "status": "failed" if error else ("diverged" if diverged else "ok"),
                 "diverged": bool(diverged), "max_steps": p.steps}
    row.update(summary)
    row["flops_per_token"] = p.flops_per_token
    row["flops"] = summary["tokens"] * p.flops_per_token
    row["step_ms"] = (1000 * p.tokens_per_step / summary["tokens_per_s"]) if summary["tokens_per_s"] else None
    if error:
        row["error"] = error
    if not diverged and not error:
        row.update(evaluate_run(run_dir, spec.eval_contexts, spec.decode if spec.measure_decode else None))
    else:
        from lmlab.analysis import kv_cache_bytes, param_counts

        counts = param_counts(p.cfg)
        row["params"], row["non_embedding_params"] = counts["total"], counts["non_embedding"]
        for mult in spec.eval_contexts:
            suffix = "" if mult == 1 else f"_{_fmt(mult)}x"
            row[f"val_loss{suffix}"] = row[f"val_bpb{suffix}"] = None
        kv = kv_cache_bytes(p.cfg, p.cfg.context_length, batch=1, dtype="fp32")
        row["kv_bytes_per_token"], row["kv_bytes_context"] = kv["per_token"], kv["total"]
    row["fields"] = p.fields
    row["finished_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    row["machine"] = _machine(p.tc.device)
    return {k: _nan_to_none(v) for k, v in row.items()}


# --- the sweep -----------------------------------------------------------------------------
def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _log_since(path: Path, offset: int, n: int = 4000) -> str:
    """The last ``n`` characters written to ``path`` after byte ``offset``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")[-n:]
    except OSError:
        return ""


class _Sweep:
    def __init__(self, spec: Spec, sweep_dir: Path, plans: list[RunPlan], jobs: int, threads: int,
                 log: Callable[[str], None]):
        self.spec, self.dir, self.plans, self.jobs, self.threads, self.log = spec, sweep_dir, plans, jobs, threads, log
        self.lock = threading.Lock()  # results file
        self.eval_lock = threading.Lock()  # one evaluation at a time in this process
        self.procs: set = set()
        self.stopping = False
        self.rows = {r["run"]: r for r in read_results(sweep_dir)}
        self.done_count = 0

    def write_results(self) -> None:
        order = [p.name for p in self.plans]
        rows = [self.rows[n] for n in order if n in self.rows] + [r for n, r in self.rows.items() if n not in order]
        path = self.dir / RESULTS_FILE
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, path)

    def train(self, p: RunPlan, run_dir: Path) -> tuple[bool, Optional[str]]:
        """Train (or continue) one run in a subprocess; returns (diverged, error)."""
        cfg_path = self.dir / "configs" / f"{p.name}.yaml"
        cfg_path.write_text(yaml.safe_dump({"model": p.cfg.to_dict(), "train": dataclasses.asdict(p.tc)},
                                           sort_keys=False))
        log_path = self.dir / "logs" / f"{p.name}.log"
        cmd = [sys.executable, "-m", "lmlab.cli", "train", "--out", str(run_dir), "--config", str(cfg_path),
               "--data", str(p.data), "--no-progress"]
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        root = str(Path(__file__).resolve().parents[1])  # the lmlab being run, also when not installed
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(log_path, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            offset = f.tell()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
            with self.lock:
                self.procs.add(proc)
            try:
                rc = proc.wait()
            finally:
                with self.lock:
                    self.procs.discard(proc)
        if rc == 0:
            return False, None
        if self.stopping or rc == 130 or rc < 0:  # interrupted (Ctrl-C reaches the subprocess too) or killed
            raise KeyboardInterrupt
        tail = _log_since(log_path, offset)  # this attempt's output only
        if DIVERGED_MARK in tail:
            return True, None
        lines = [line for line in tail.splitlines() if line.strip()]
        return False, f"training exited with status {rc}: {lines[-1] if lines else '(no output)'} (see {log_path})"

    def job(self, p: RunPlan) -> None:
        if self.stopping:
            return
        run_dir = self.dir / "runs" / p.name
        state = run_state(run_dir, p.steps)
        t0 = time.perf_counter()
        diverged, error = False, None
        if state != "trained":
            self.log(f"train {p.name}: {'continuing, ' if state == 'partial' else ''}{p.steps} steps, "
                     f"{p.tokens:,} tokens, {p.flops:.3g} FLOPs")
            diverged, error = self.train(p, run_dir)
        with self.eval_lock:
            import torch

            torch.set_num_threads(self.threads)
            try:
                row = collect_result(p, run_dir, self.spec, diverged, error)
            except Exception as exc:  # noqa: BLE001 -- one broken run must not end the sweep
                if self.stopping:
                    raise KeyboardInterrupt from None
                row = {"sweep": self.spec.name, "run": p.name, "variant": p.variant, "seed": p.seed,
                       "status": "failed", "diverged": False, "error": f"evaluation failed: {exc}",
                       "fields": p.fields}
        with self.lock:
            self.rows[p.name] = row
            self.write_results()
            self.done_count += 1
            n = self.done_count
        took = time.perf_counter() - t0
        what = f"val bpb {row['val_bpb']:.4f}" if row.get("val_bpb") is not None else row["status"].upper()
        loss = row.get("final_train_loss")
        self.log(f"[{n}/{self.pending}] {p.name}: {what}, train loss {'n/a' if loss is None else f'{loss:.4f}'}, "
                 f"{took:.0f} s" + (f" ({row['error']})" if row.get("error") else ""))

    def run(self) -> None:
        todo = []
        for p in self.plans:
            row = self.rows.get(p.name)
            if row is not None and row.get("status") in ("ok", "diverged"):
                self.log(f"skip {p.name}: done ({row['status']})")
                continue
            todo.append(p)
        self.pending = len(todo)
        if not todo:
            return
        pool = ThreadPoolExecutor(max_workers=self.jobs) if self.jobs > 1 else None
        try:
            if pool is None:
                for p in todo:
                    self.job(p)
            else:
                futures = [pool.submit(self.job, p) for p in todo]
                for f in futures:
                    f.result()
        except KeyboardInterrupt:
            self.stopping = True
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            with self.lock:
                procs = list(self.procs)
            for proc in procs:  # the training subprocesses this sweep started
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            raise
        finally:
            if pool is not None:
                pool.shutdown(wait=True)


def default_out(spec: Spec) -> Path:
    return Path("sweeps") / spec.name


def format_plan(plans: list[RunPlan], states: dict) -> str:
    from lmlab.analysis import param_counts

    lines = [f"{'run':40} {'steps':>6} {'tokens':>11} {'train FLOPs':>11} {'params':>10} {'non-emb':>10}  state"]
    for p in plans:
        c = param_counts(p.cfg)
        lines.append(f"{p.name[:40]:40} {p.steps:>6} {p.tokens:>11,} {p.flops:>11.3g} {c['total']:>10,} "
                     f"{c['non_embedding']:>10,}  {states[p.name]}")
    total = sum(p.flops for p in plans)
    lines.append(f"{len(plans)} runs, {sum(p.tokens for p in plans):,} tokens, {total:.3g} training FLOPs in all")
    return "\n".join(lines)


def run_sweep(spec: str | Path | Spec, out: Optional[str | Path] = None, jobs: int = 1, dry_run: bool = False,
              log: Callable[[str], None] = print, data_dir: Optional[Path] = None) -> Path:
    """Plan, train, evaluate and record every run of ``spec`` in the sweep folder ``out`` (default
    ``sweeps/NAME``); returns the folder. Resumes a folder it finds (see the module docstring)."""
    if not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs {jobs!r} must be an integer >= 1")
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    sweep_dir = Path(out) if out else default_out(spec)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ConfigError(f"--out {str(sweep_dir)!r} is a file, not a sweep folder; choose a folder path")
    if sweep_dir.is_dir() and any(sweep_dir.iterdir()) and not (sweep_dir / "spec.yaml").is_file():
        raise ConfigError(f"--out {str(sweep_dir)!r} is a non-empty folder that is not a sweep (no spec.yaml); "
                          f"choose a new folder or an existing sweep's folder")
    plans = plan_runs(spec, data_dir)
    jobs = min(jobs, len(plans))  # no more workers than runs
    for p in plans:
        _check_existing(p, sweep_dir / "runs" / p.name)
    rows = {r["run"]: r for r in read_results(sweep_dir)}
    states = {}
    for p in plans:
        row = rows.get(p.name)
        states[p.name] = ("done" if row is not None and row.get("status") in ("ok", "diverged")
                          else run_state(sweep_dir / "runs" / p.name, p.steps))
    threads = max(1, _cores() // jobs)
    log(f"sweep {spec.name}: {len(spec.variants)} variant(s) x {len(spec.seeds)} seed(s) in {sweep_dir}, "
        f"{jobs} job(s) x {threads} thread(s)")
    log(format_plan(plans, states))
    if dry_run:
        return sweep_dir
    for sub in ("runs", "configs", "logs"):
        (sweep_dir / sub).mkdir(parents=True, exist_ok=True)
    (sweep_dir / "spec.yaml").write_text(yaml.safe_dump(spec.raw, sort_keys=False, allow_unicode=True))
    import torch

    before = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        _Sweep(spec, sweep_dir, plans, jobs, threads, log).run()
    finally:
        torch.set_num_threads(before)
    log(f"sweep {spec.name} finished in {time.perf_counter() - t0:.0f} s; results in {sweep_dir / RESULTS_FILE}; "
        f"`lmlab report {sweep_dir}` writes the report")
    return sweep_dir
