"""Setting up a training run: configs + data + output folder + memory check, in one place.

``lmlab train`` and the ablation lab (``lmlab sweep``, whose runs are ordinary ``lmlab train``
invocations) both go through :func:`setup_run`; :func:`build_configs` is the one reader of config
files, presets and ``--set`` overrides, and :func:`ensure_default_data` prepares the default corpus on
first use. Nothing here imports the CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from lmlab.config import ConfigError, ModelConfig, check_keys
from lmlab.config_files import apply_overrides, load_mapping
from lmlab.data.shards import TokenData
from lmlab.fsutil import acquire_lock
from lmlab.run_folder import RUN_FILE, CheckpointError, check_new_run_dir, read_run, run_copy_hint, run_data, write_run
from lmlab.schedule import planned_config

if TYPE_CHECKING:
    from lmlab.train import Trainer

DEFAULT_DATA = Path("data")
BUILTIN_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_VOCAB = 4096  # the default corpus is prepared with a 4096-token byte-level BPE


def default_data_dir(tokenizer: str = "bpe", vocab_size: int = DEFAULT_VOCAB) -> Path:
    """Where ``lmlab prepare`` puts the default corpus: ``data/shakespeare-bpe{V}`` or ``-bytes``."""
    return DEFAULT_DATA / (f"shakespeare-bpe{vocab_size}" if tokenizer == "bpe" else "shakespeare-bytes")


def describe_manifest(manifest: dict) -> list[str]:
    """One line per split of a prepared data folder's manifest: documents, bytes, tokens, bytes/token."""
    return [
        f"{split}: {len(info['documents'])} documents, {info['bytes']:,} bytes, {info['tokens']:,} tokens "
        f"({info['bytes'] / max(info['tokens'], 1):.2f} bytes/token)"
        for split, info in manifest["splits"].items()
    ]


def ensure_default_data(data: Optional[str | Path], tokenizer: str = "bpe", vocab_size: int = DEFAULT_VOCAB) -> Path:
    """The prepared data folder to train on: ``data`` if given, else the default corpus (the
    Shakespeare works, :mod:`lmlab.data.corpus`) with ``tokenizer`` ('bpe' with ``vocab_size``, or
    'bytes'), prepared on first use into :func:`default_data_dir`. Raises DataError when the corpus
    cannot be obtained."""
    if data is not None:
        return Path(data)
    folder = default_data_dir(tokenizer, vocab_size)
    if not (folder / "manifest.json").is_file():
        from lmlab.data.corpus import VALIDATION_WORKS, default_corpus_dir
        from lmlab.data.prepare import prepare

        manifest = prepare(default_corpus_dir(), folder, tokenizer, vocab_size, list(VALIDATION_WORKS), 0.1, False)
        for line in describe_manifest(manifest):
            print(line)
        print(
            f"wrote {folder} (tokenizer {manifest['tokenizer']['type']}, vocab {manifest['tokenizer']['vocab_size']})"
        )
    return folder


def read_config_file(name: str | Path) -> tuple[Path, dict, dict]:
    """A config file (YAML/JSON, or the name of a built-in config such as 'demo') -> (path, model
    mapping, train mapping), its keys checked. Raises ConfigError for an empty file, a section other
    than 'model:'/'train:', or an unknown key, naming the file."""
    from lmlab.train import TrainConfig

    path = Path(name)
    if not path.exists() and (BUILTIN_CONFIGS / f"{name}.yaml").exists():
        path = BUILTIN_CONFIGS / f"{name}.yaml"
    spec = load_mapping(path)
    if not spec:
        raise ConfigError(f"config file {str(path)!r} is empty; give a 'model:' and/or a 'train:' section")
    unknown = sorted(str(k) for k in spec if k not in ("model", "train"))
    if unknown:
        raise ConfigError(f"config file {str(path)!r}: unknown section(s) {unknown}; use 'model:' and 'train:'")
    for section in ("model", "train"):
        if not isinstance(spec.get(section) or {}, dict):
            raise ConfigError(
                f"config file {str(path)!r}: '{section}:' must be a mapping of field names to "
                f"values, got {spec[section]!r}"
            )
    model, train = dict(spec.get("model") or {}), dict(spec.get("train") or {})
    check_keys(ModelConfig, model, f"{path} model")
    check_keys(TrainConfig, train, f"{path} train")
    return path, model, train


def build_configs(
    config: Optional[str] = None,
    preset: Optional[str] = None,
    scale: str = "tiny",
    sets: Sequence[str] = (),
    data_vocab: Optional[int] = None,
    base: Optional[dict] = None,
    base_source: str = "the resumed run",
):
    """(ModelConfig, TrainConfig) from ``base`` (a run's saved ``model``/``train``, when resuming), then
    the config file, the preset (at ``scale``: 'tiny' or 'real') and the ``KEY=VALUE`` overrides
    ``sets``. The data's vocabulary ``data_vocab`` replaces the preset's unless a file or override sets
    ``vocab_size``. Raises ConfigError naming the field and where it came from (``base_source``: the
    run file ``base`` was read from)."""
    from lmlab.train import TrainConfig

    model: dict = dict((base or {}).get("model") or {})
    train: dict = dict((base or {}).get("train") or {})
    sources = [base_source] if base else []
    if config:
        path, model, train = read_config_file(config)
        sources.append(str(path))
    explicit_vocab = "vocab_size" in model or any(i.partition("=")[0].strip() == "vocab_size" for i in sets)
    if preset:
        from lmlab.presets import get_preset

        p = get_preset(preset)
        fields = dict(p.real)
        if scale == "tiny":
            fields.update(p.tiny)
        model = {**fields, **model}
        sources.insert(0, f"preset {p.name!r}")
    model_keys = set(ModelConfig.__dataclass_fields__)
    train_keys = set(TrainConfig.__dataclass_fields__)
    m_over, t_over = [], []
    for item in sets:
        key = item.partition("=")[0].strip()
        if key in model_keys:
            m_over.append(item)
        elif key in train_keys:
            t_over.append(item)
        else:
            import difflib

            near = difflib.get_close_matches(key, sorted(model_keys | train_keys), n=1)
            raise ConfigError(f"--set {item!r}: unknown key {key!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    model = apply_overrides(model, m_over, ModelConfig)
    train = apply_overrides(train, t_over, TrainConfig)
    if base is not None:  # before the merged settings are checked (e.g. muon_lr without muon)
        from lmlab.optim import optimizer_of

        was, now = optimizer_of(base.get("train")), train.get("optimizer", "adamw")
        if now != was:
            raise ConfigError(
                f"optimizer={now!r}: the resumed run trains with optimizer={was!r}, whose state "
                f"its checkpoints hold; keep it, or start a new run"
            )
    if not explicit_vocab and data_vocab is not None:  # the data's tokenizer decides, not the preset
        model["vocab_size"] = data_vocab
    if sets:
        sources.append("--set")
    where = f" (from {' + '.join(sources)})" if sources else ""
    cfg, tc = ModelConfig.from_dict(model, f"model config{where}"), TrainConfig.from_dict(train, f"train config{where}")
    from lmlab.model.parametrization import check_optimizer

    check_optimizer(cfg, tc.optimizer)  # Muon under mup / completep: refused before any data is prepared
    return cfg, tc


def attach_data(out: Path, run: dict, data_dir: Path) -> None:
    """Give a run without data (an imported one) the data folder ``data_dir``, which must have been
    prepared with the run's own tokenizer (``lmlab prepare --tokenizer-file RUN/tokenizer.json``), and
    record it in run.yaml. Raises DataError otherwise."""

    run["data"] = str(run_data(out, run, data_dir).folder.resolve())
    write_run(out, run)


def model_config_for(
    preset: Optional[str], scale: Optional[str], config: Optional[str | Path], run: Optional[str | Path]
):
    """(ModelConfig, title, published parameter count or None) of a model named by exactly one of a
    preset (at ``scale``: ``real`` or ``tiny``), a config file or a run folder; (None, None, None) when
    none is given. Raises ConfigError for several, CheckpointError for a run folder without a valid
    model config."""

    if len([x for x in (preset, config, run) if x]) > 1:
        raise ConfigError("give one of --preset NAME, --config FILE or a RUN folder, not several")
    if preset:
        from lmlab.presets import get_preset

        found = get_preset(preset)
        published = found.published_params if scale == "real" else None
        return found.config(scale), f"{found.name} ({scale} scale)", published
    if config:
        from lmlab.train import TrainConfig

        path, model, train = read_config_file(config)
        TrainConfig.from_dict(train, f"{path} train")  # the same file `lmlab train` would accept
        return ModelConfig.from_dict(model, f"{path} model"), str(path), None
    if run:
        from lmlab.run_folder import RUN_FILE, CheckpointError, read_run

        saved = read_run(run)
        try:
            return ModelConfig.from_dict(saved["model"], f"{run}/{RUN_FILE} model"), f"run {run}", None
        except TypeError as exc:
            raise CheckpointError(f"{run}/{RUN_FILE}: no valid model config ({exc})") from None
    return None, None, None


def check_run_memory(cfg, tc) -> None:
    """The Trainer's memory check (:func:`lmlab.devices.check_memory`), before anything is built or
    prepared: fp32 weights + gradients + AdamW moments and one micro-batch's activations against the
    memory of ``tc.device``. Skipped under torchrun (each rank checks its own shard). Raises ConfigError."""
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        return
    from lmlab.devices import check_memory, resolve_device

    check_memory(cfg, resolve_device(tc.device), 1, tc.batch_size, 4 if tc.dtype == "fp32" else 2)


def setup_run(
    out: str | Path,
    config: Optional[str] = None,
    preset: Optional[str] = None,
    scale: str = "tiny",
    sets: Sequence[str] = (),
    data: Optional[str] = None,
    resume: bool = False,
    progress: bool = True,
) -> "Trainer":
    """A :class:`lmlab.train.Trainer` ready to ``fit()`` for the run folder ``out``: a new run (the
    config, ``out`` and the memory are checked before any data is prepared or downloaded), the same
    command again (continues the run; a different config is refused, naming the fields), or
    ``resume=True`` (continue, possibly with new training settings such as a larger max_steps).

    The run folder is locked first (:func:`lmlab.fsutil.acquire_lock`, by rank 0 under torchrun): a
    second ``lmlab train`` into the same ``out`` while this one runs is refused with a LockError naming
    the holder's PID and host; a stale lock (its process gone) is taken over with a note on stderr. The
    returned trainer holds the lock until ``trainer.release_lock()`` (or the process ends).
    Raises ConfigError / CheckpointError / DataError / LockError with one line naming what is wrong."""

    if not str(out).strip():
        raise CheckpointError("--out is blank; give a folder path for the new run")
    lock = None
    if int(os.environ.get("RANK", "0")) == 0:
        lock = acquire_lock(out, "lmlab train")
        if lock.note:
            print(lock.note, file=sys.stderr)
    try:
        trainer = _setup_locked(Path(out), config, preset, scale, sets, data, resume, progress)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    trainer.lock = lock
    tc = trainer.tc
    if tc.warmup_steps > tc.max_steps and trainer.dist.is_main:
        print(
            f"warning: warmup_steps={tc.warmup_steps} > max_steps={tc.max_steps}: the run ends before the "
            f"learning rate reaches lr={tc.lr:g} (it peaks at {tc.lr * tc.max_steps / tc.warmup_steps:g}); "
            f"lower warmup_steps (--set warmup_steps=N) or raise max_steps",
            file=sys.stderr,
        )
    return trainer


def _setup_locked(out: Path, config, preset, scale, sets, data, resume, progress):
    from lmlab.checkpoint import check_run_model
    from lmlab.train import TrainConfig, Trainer

    sets = list(sets)
    if (out / RUN_FILE).exists():
        run = read_run(out)
        check_run_model(out, run)  # an edited architecture field is named, not reported as a misfit
        if resume and data and run.get("data") is None:  # fine-tuning an imported run: record its data
            attach_data(out, run, Path(data))
        elif resume and data and str(Path(data).resolve()) != run.get("data"):
            raise ConfigError(
                f"--data {data!r} differs from the data of run {str(out)!r} ({run.get('data')!r}); "
                f"a run keeps its data: train a new run on the new data (another --out)"
            )
        if resume:  # continue, possibly with changed training settings
            cfg, tc = (
                build_configs(
                    config,
                    preset,
                    scale,
                    sets,
                    run["model"].get("vocab_size"),
                    base=run,
                    base_source=str(out / RUN_FILE),
                )
                if (config or preset or sets)
                else (None, None)
            )
        else:  # the same command again continues the run; a different one is refused
            data_dir = Path(data).resolve() if data else default_data_dir().resolve()
            cfg, tc = build_configs(config, preset, scale, sets, run["model"].get("vocab_size"))
            tc = planned_config(run, tc)[0]  # a budgeted run's planned max_steps is the asked cap's
            check_keys(ModelConfig, run["model"], f"{str(out / RUN_FILE)!r} model")  # a damaged key: said
            check_keys(TrainConfig, run["train"], f"{str(out / RUN_FILE)!r} train")
            diff = [
                f"model.{k}: run has {v!r}, asked {getattr(cfg, k)!r}"
                for k, v in run["model"].items()
                if getattr(cfg, k, None) != v
            ]
            diff += [
                f"train.{k}: run has {v!r}, asked {getattr(tc, k)!r}"
                for k, v in run["train"].items()
                if getattr(tc, k, None) != v
            ]
            if run.get("data") != str(data_dir):
                diff.append(f"data: run has {run.get('data')!r}, asked {str(data_dir)!r}")
            if diff:
                more = f"; and {len(diff) - 4} more" if len(diff) > 4 else ""
                # --resume takes new train settings, never another architecture or data
                advice = (
                    "choose another --out"
                    if any(not d.startswith("train.") for d in diff)
                    else "choose another --out, or pass --resume to continue it with new train settings"
                )
                raise ConfigError(
                    f"run folder {str(out)!r} already holds a different run ({'; '.join(diff[:4])}{more}; "
                    f"the run's settings as {str(out / RUN_FILE)!r} records them); {advice}"
                )
        trainer = Trainer.resume(out, cfg, tc, progress=progress)
        if trainer.dist.is_main and trainer.step < trainer.tc.max_steps:  # a finished run says so itself
            print(f"resuming {out} from step {trainer.step} of {trainer.tc.max_steps}", file=sys.stderr)
        return trainer
    if resume:
        raise ConfigError(
            f"--resume: {str(out)!r} holds no run (no run.yaml) to continue; drop --resume to start "
            f"a new run there{run_copy_hint(Path(out))}"
        )
    if (
        data is None
        and int(os.environ.get("WORLD_SIZE", "1")) > 1
        and not (default_data_dir() / "manifest.json").is_file()
    ):
        raise ConfigError("under torchrun, prepare the data first (`lmlab prepare`) or pass --data DIR")
    # a bad config or --out, or a model too large, is refused before any data is prepared or downloaded
    vocab = TokenData(data).vocab_size if data else DEFAULT_VOCAB
    cfg, tc = build_configs(config, preset, scale, sets, vocab)
    check_new_run_dir(out)
    check_run_memory(cfg, tc)
    data_dir = ensure_default_data(data)
    prepared = TokenData(data_dir)
    if prepared.vocab_size != vocab:
        cfg, tc = build_configs(config, preset, scale, sets, prepared.vocab_size)
    return Trainer.create(out, cfg, tc, data_dir, progress=progress)
