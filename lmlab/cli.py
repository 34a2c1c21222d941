"""The ``lmlab`` command line: prepare, train, eval, generate, import, export, presets, coordcheck, ...

Every error a user can cause (bad config, missing data, wrong checkpoint, ...) ends in one line
``lmlab <command>: error: <what, where, what to do>`` and exit status 2; nothing is overwritten.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from lmlab.cli_parser import make_parser
from lmlab.config import ConfigError


def cmd_prepare(args) -> int:
    from lmlab.data.corpus import VALIDATION_WORKS, default_corpus_dir
    from lmlab.data.prepare import expand_inputs, prepare
    from lmlab.runs import default_data_dir, describe_manifest

    if args.data is None:
        source = [default_corpus_dir()]
        val_docs = list(VALIDATION_WORKS) if args.val_docs is None else args.val_docs.split(",")
    else:
        source = expand_inputs(args.data)
        val_docs = args.val_docs.split(",") if args.val_docs else None
    if args.tokenizer_file and (args.tokenizer != "bpe" or args.vocab_size is not None):
        flag = "--tokenizer bytes" if args.tokenizer != "bpe" else f"--vocab-size {args.vocab_size}"
        raise ConfigError(
            f"{flag} does not apply with --tokenizer-file {args.tokenizer_file!r} (the file's own "
            f"tokenizer and vocabulary are used); give one or the other"
        )
    if args.tokenizer == "bytes" and args.vocab_size is not None:
        raise ConfigError(
            f"--vocab-size {args.vocab_size} does not apply with --tokenizer bytes (its vocabulary is "
            f"the 256 bytes and <|endoftext|>: 257)"
        )
    vocab_size = 4096 if args.vocab_size is None else args.vocab_size
    out = Path(args.out) if args.out else default_data_dir(args.tokenizer, vocab_size)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    manifest = prepare(
        source,
        out,
        args.tokenizer,
        vocab_size,
        val_docs,
        args.val_fraction,
        args.overwrite,
        tokenizer_file=args.tokenizer_file,
        allow_special=args.allow_special_files,
        text_field=args.text_field,
        progress=progress,
    )
    for line in describe_manifest(manifest):
        print(line)
    sec, mb = manifest["stats"]["seconds"], manifest["stats"]["bytes"] / 1e6
    print(
        f"{mb:,.1f} MB of text: scan {sec['scan']:.1f} s, tokenizer {sec['tokenizer']:.1f} s, encoding "
        f"{sec['encode']:.1f} s ({mb / max(sec['encode'], 1e-9):,.1f} MB/s)"
    )
    for line in manifest["notes"]:
        print(f"note: {line}", file=sys.stderr)
    got = manifest["tokenizer"]["vocab_size"]
    print(f"wrote {out} (tokenizer {manifest['tokenizer']['type']}, vocab {got})")
    if args.tokenizer == "bpe" and not args.tokenizer_file and got < vocab_size:
        print(
            f"note: the BPE stopped at {got:,} tokens, below --vocab-size {vocab_size:,}: the training split "
            f"has no more pairs to merge within its words",
            file=sys.stderr,
        )
    return 0


# --- train ---------------------------------------------------------------------------------
def cmd_train(args) -> int:
    from lmlab.runs import setup_run

    _resolve_scale(args, "tiny")
    out = Path(args.out)
    trainer = setup_run(
        out,
        config=args.config,
        preset=args.preset,
        scale=args.scale,
        sets=args.set or [],
        data=args.data,
        resume=args.resume,
        progress=not args.no_progress,
    )
    try:
        return _train(trainer, out)
    finally:
        trainer.release_lock()


def _train(trainer, out: Path) -> int:
    from lmlab.devices import describe_dtype

    if trainer.dist.is_main:
        dtype = describe_dtype(trainer.tc.dtype, trainer.device, trainer.amp_dtype)
        kernels = trainer.model.kernels.describe(trainer.amp_dtype) if trainer.device.type == "cpu" else None
        set_by = "" if trainer.tc.compile == "auto" else f" (compile={str(trainer.tc.compile).lower()})"
        print(
            f"model: {trainer.model.num_params():,} parameters ({trainer.model.num_params(non_embedding=True):,} "
            f"non-embedding), device {trainer.device}, dtype {dtype}, "
            f"{trainer.dist.world_size} process(es) ({trainer.mode}), "
            f"compile {trainer.compile_choice or 'auto (chosen before the first step)'}{set_by}"
            f"{'; freed memory kept by malloc' if trainer.malloc_kept else ''}"
            f"{'; kernels: ' + kernels if kernels else ''}; run folder {out}",
            file=sys.stderr,
        )
    if trainer.step >= trainer.tc.max_steps:
        if trainer.dist.is_main:
            print(f"run {out} is already complete at step {trainer.step}; raise max_steps with --resume to go on")
        return 0
    val = trainer.fit()
    if val and trainer.dist.is_main:
        print(f"done: step {trainer.step}, val loss {val['loss']:.4f} (sampled estimate); run `lmlab eval {out}`")
    return 0


def cmd_sweep(args) -> int:
    from lmlab.lab.runner import run_sweep
    from lmlab.lab.spec import list_specs

    if args.list:
        print("\n".join(list_specs(args.tier, args.dtype, args.compile)))
        return 0
    if not args.spec:
        raise ConfigError("give a spec file or a shipped spec name (`lmlab sweep --list` shows them)")
    command = (
        f"lmlab sweep {args.spec}"
        + (f" --tier {args.tier}" if args.tier else "")
        + (f" --dtype {args.dtype}" if args.dtype else "")
        + (" --compile" if args.compile else "")
        + (f" --out {args.out}" if args.out else "")
        + f" --jobs {args.jobs}"
        + (f" --data {args.data}" if args.data else "")
    )
    params = {}
    if args.executor_config:
        from lmlab.config_files import load_mapping

        params.update(load_mapping(Path(args.executor_config)))
    for flag, key in (
        ("slurm_partition", "slurm_partition"),
        ("time", "timeout_min"),
        ("cpus_per_task", "cpus_per_task"),
        ("gpus_per_task", "gpus_per_node"),
        ("array_parallelism", "slurm_array_parallelism"),
        ("address", "address"),
        ("max_retries", "max_retries"),
    ):
        if getattr(args, flag) is not None:
            params[key] = getattr(args, flag)
    gpus = params.get("gpus_per_node")
    if args.executor != "ray" and isinstance(gpus, float) and gpus.is_integer():
        params["gpus_per_node"] = int(gpus)  # Slurm counts whole GPUs; Ray takes fractions
    if args.executor != "local":
        command += f" --executor {args.executor}"
    for flag in (
        "runs_per_task",
        "slurm_partition",
        "time",
        "cpus_per_task",
        "gpus_per_task",
        "array_parallelism",
        "address",
        "max_retries",
        "executor_config",
    ):
        value = getattr(args, flag)
        if value is not None and not (flag == "runs_per_task" and value == 1):
            command += (
                f" --{flag.replace('_', '-')} {value:g}"
                if isinstance(value, float)
                else f" --{flag.replace('_', '-')} {value}"
            )
    out = run_sweep(
        args.spec,
        out=args.out,
        jobs=args.jobs,
        dry_run=args.dry_run,
        command=command,
        tier=args.tier,
        dtype=args.dtype,
        compile=args.compile,
        data_dir=Path(args.data) if args.data else None,
        max_runs=args.max_runs,
        executor=args.executor,
        executor_params=params,
        runs_per_task=args.runs_per_task,
    )
    if args.dry_run:
        return 0
    from lmlab.lab.results import read_results

    failed = [r["run"] for r in read_results(out) if r.get("status") == "failed"]
    if failed:  # a diverged run is a result; a failed one is not
        print(
            f"lmlab sweep: {len(failed)} run(s) failed without a result ({', '.join(failed[:5])}"
            f"{', ...' if len(failed) > 5 else ''}); `lmlab report {out}` lists why, `lmlab sweep-worker "
            f"{out} RUN` reproduces one, and the same command retries them",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_sweep_worker(args) -> int:
    from lmlab.lab.worker import run_names

    rows = run_names(Path(args.sweep), args.runs, args.threads)
    return 0 if all(r.get("status") in ("ok", "diverged") for r in rows) else 1


def cmd_report(args) -> int:
    from lmlab.lab.index import write_index
    from lmlab.lab.report import write_report
    from lmlab.plot import require_matplotlib

    require_matplotlib("lmlab report")
    if args.readme and not args.index:
        raise ConfigError("--readme goes with --index DIR... --out FILE.md (the summary is the index's)")
    if args.index:
        if args.out is None:
            raise ConfigError("--index needs --out FILE.md (the index page; its forest plot goes beside it)")
        paths = write_index(
            [Path(d) for d in [*([args.sweep] if args.sweep else []), *args.index]],
            Path(args.out),
            readme=[Path(r) for r in args.readme] if args.readme else None,
        )
    else:
        if not args.sweep:
            raise ConfigError("give a sweep folder (`lmlab sweep --out`), or --index DIR... --out FILE.md")
        paths = write_report(Path(args.sweep), args.out)
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_plot(args) -> int:
    from lmlab.plot import plot_runs, require_matplotlib

    require_matplotlib("lmlab plot")
    for path in plot_runs([Path(r) for r in args.runs], Path(args.out)):
        print(f"wrote {path}")
    return 0


# --- eval ----------------------------------------------------------------------------------
def _eval_tasks(args, device) -> int:
    try:
        from lmlab.lm_eval_backend import run_tasks
    except ImportError as exc:
        raise ConfigError(
            f"--tasks needs lm-evaluation-harness ({exc}); install the extra: pip install 'lmlab[eval]'"
        ) from None
    names = args.tasks.split(",")  # blanks dropped and every name checked by run_tasks
    out = run_tasks(
        args.run,
        names,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        batch_size=args.batch_size,
        device=str(device),
    )
    if args.json:
        print(json.dumps(out["results"], default=str))
        return 0
    for task, metrics in out["results"].items():
        shown = ", ".join(
            f"{k.split(',')[0]} {v:.4f}"
            for k, v in metrics.items()
            if isinstance(v, float) and not k.endswith("_stderr,none")
        )
        print(f"{task}: {shown}")
    return 0


def _check_eval_flags(args) -> None:
    """Refuse flags that do not apply: the harness's (--limit, --include-path, --num-fewshot) without
    --tasks, and bits-per-byte's (--data, --split, --stride, --dtype) with it (either would be ignored)."""
    task_only = [
        f
        for f, v in (
            ("--limit", args.limit),
            ("--include-path", args.include_path),
            ("--num-fewshot", args.num_fewshot),
        )
        if v is not None
    ]
    bpb_only = [
        f
        for f, v in (("--data", args.data), ("--split", args.split), ("--stride", args.stride), ("--dtype", args.dtype))
        if v is not None
    ]
    if args.tasks is not None and not args.tasks.strip(" ,"):
        raise ConfigError("--tasks names no task; give lm-eval task names, e.g. hellaswag,arc_easy")
    if not args.tasks and task_only:
        raise ConfigError(
            f"{', '.join(task_only)} {'only apply' if len(task_only) > 1 else 'only applies'} with "
            f"--tasks (lm-evaluation-harness tasks); drop {'them' if len(task_only) > 1 else 'it'} "
            f"or name the tasks"
        )
    if args.tasks and bpb_only:
        raise ConfigError(
            f"{', '.join(bpb_only)} {'only apply' if len(bpb_only) > 1 else 'only applies'} to the "
            f"held-out bits-per-byte evaluation, not with --tasks (the harness brings its own "
            f"documents); drop {'them' if len(bpb_only) > 1 else 'it'} or --tasks"
        )


def cmd_eval(args) -> int:
    from lmlab.checkpoint import load_run
    from lmlab.devices import precision_name, resolve_device, resolve_dtype
    from lmlab.evaluate import evaluate
    from lmlab.run_folder import run_data

    _check_eval_flags(args)
    device = resolve_device(args.device)
    if args.tasks:  # downstream tasks through lm-evaluation-harness
        return _eval_tasks(args, device)
    args.split, args.dtype = args.split or "val", args.dtype or "fp32"
    model, cfg, tok, run, ckpt = load_run(args.run, device=str(device))
    data = run_data(args.run, run, args.data, cfg.vocab_size)
    amp = resolve_dtype(args.dtype, device)  # ('auto': what this device computes natively)
    res = evaluate(
        model,
        data.tokens(args.split),
        data.bytes(args.split),
        batch_size=args.batch_size,
        stride=args.stride,
        device=device,
        autocast_dtype=amp,
    )
    res.update(checkpoint=str(ckpt), split=args.split, data=str(data.folder), dtype=precision_name(amp))
    res["stride"] = args.stride or cfg.context_length
    if args.json:
        print(json.dumps(res))
    else:
        print(
            f"{args.split} of {data.folder} ({res['tokens']:,} tokens, {res['bytes']:,} bytes), checkpoint "
            f"{ckpt.name}, {res['dtype']}:"
        )
        print(f"  loss            {res['loss']:.4f} nats/token")
        print(f"  perplexity      {res['perplexity']:.2f}")
        print(f"  bits-per-byte   {res['bits_per_byte']:.4f}")
    return 0


# --- generate ------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    from lmlab.data.tokenizer import TokenizerError
    from lmlab.devices import resolve_device
    from lmlab.generate import encode_prompt, print_completion, print_completions

    device = resolve_device(args.device)
    if args.prompt_ids is not None:
        return _generate_ids(args, device)
    if args.logprobs and len(args.prompt or ()) > 1:  # (before the model loads)
        raise ConfigError("--logprobs takes one --prompt (the log-probabilities of one stream)")
    model, tok = _generation_model(args, device)
    texts = args.prompt or [""]
    prompts = []
    for text in texts:
        try:
            prompts.append(encode_prompt(tok, text, args.prompt_after_eot))
        except TokenizerError as exc:
            raise ConfigError(f"--prompt: {exc}" if text else f"{args.run}: {exc}") from None
    try:
        eos = tok.eot_id if args.stop_at_eot else None
    except TokenizerError as exc:
        raise ConfigError(f"--stop-at-eot: {exc}") from None
    sampling = dict(_sampling(args, device), eos_id=eos)
    if len(prompts) == 1:  # one prompt: stream the text as it comes
        print_completion(
            model, tok, texts[0], prompts[0], args.max_new_tokens, args.stop or (), args.raw, args.logprobs, **sampling
        )
    else:  # several prompts: one batch (left-padded), each continuation printed when the batch is done
        print_completions(model, tok, texts, prompts, args.max_new_tokens, args.stop or (), args.raw, **sampling)
    return 0


def _sampling(args, device) -> dict:
    """``generate``'s sampling keywords (lmlab.generate) from its flags."""
    return dict({k: getattr(args, k) for k in ("temperature", "top_k", "top_p", "seed", "compile")}, device=device)


def _generation_model(args, device, tokenizer: bool = True) -> tuple:
    """``generate``'s (model, tokenizer or None); --compile checked; one prompt on a CPU: decode_threads."""
    from lmlab.checkpoint import load_run
    from lmlab.kernels.compiled_decode import check_compilable
    from lmlab.kernels.decode_layout import decode_threads
    from lmlab.threads import default_threads, set_threads

    model, _, tok, _, _ = load_run(args.run, device=str(device), tokenizer=tokenizer)
    if args.compile:
        check_compilable(model, f"--compile: {args.run}")
        print("--compile: the first decode step compiles (seconds, once in this process)", file=sys.stderr)
    if args.threads is None and device.type == "cpu" and len(args.prompt or [""]) == 1:
        set_threads(decode_threads(model, default_threads(), compiled=bool(args.compile)))
    return model, tok


def _generate_ids(args, device) -> int:
    """``generate --prompt-ids``: token ids in, token ids out (a run without a tokenizer, e.g. imported)."""
    from lmlab.generate import generate_logprobs, print_logprobs

    if args.prompt or args.stop or args.stop_at_eot or args.prompt_after_eot:
        raise ConfigError(
            "--prompt-ids takes token ids and prints ids: it cannot be combined with --prompt, "
            "--stop, --stop-at-eot or --prompt-after-eot (they need a tokenizer)"
        )
    text = args.prompt_ids.strip()
    try:  # one comma or whitespace between ids: '1,,2' is refused, not read as 1,2
        ids = [int(x) for x in re.split(r"\s*,\s*|\s+", text)] if text else []
    except ValueError:
        raise ConfigError(
            f"--prompt-ids {args.prompt_ids!r}: give token ids separated by commas or spaces, e.g. 1,2,3"
        ) from None
    model, _ = _generation_model(args, device, tokenizer=False)
    vocab = model.cfg.vocab_size
    bad = [i for i in ids if not 0 <= i < vocab]
    if not ids or bad:
        raise ConfigError(
            f"--prompt-ids {args.prompt_ids!r}: "
            + (f"id {bad[0]} is outside 0..{vocab - 1}, the model's vocabulary" if bad else "no ids given")
        )
    seen = list(generate_logprobs(model, ids, args.max_new_tokens, **_sampling(args, device)))
    print(" ".join(str(i) for i, _ in seen))
    if args.logprobs:
        print_logprobs(seen)
    return 0


# --- analyze / survey / bench --------------------------------------------------------------
def _resolve_scale(args, default: str) -> None:
    """--scale belongs to --preset: refused without one; ``default`` when not given."""
    if args.scale is not None and not args.preset:
        raise ConfigError(f"--scale {args.scale} applies to --preset only (a config file or run sets its own size)")
    args.scale = args.scale or default


def _model_config_for(args):
    """(ModelConfig, title, published params or None) from exactly one of --preset, --config, RUN."""
    from lmlab.runs import model_config_for

    return model_config_for(args.preset, args.scale, args.config, args.run)


def cmd_analyze(args) -> int:
    from dataclasses import replace

    from lmlab.analysis import DEVICES, analyze, format_analysis

    _resolve_scale(args, "real")
    cfg, title, published = _model_config_for(args)
    if cfg is None:
        raise ConfigError("give a model: --preset NAME [--scale real|tiny], --config FILE or a RUN folder")
    if args.context is not None and args.context < 1 or args.batch < 1:
        raise ConfigError(f"--context and --batch must be >= 1, got {args.context} and {args.batch}")
    if args.context is not None and args.context > cfg.context_length:
        if cfg.position == "learned":
            raise ConfigError(
                f"--context {args.context:,} is beyond the model's learned positions (context_length "
                f"{cfg.context_length:,}): it cannot run that long; choose --context <= "
                f"{cfg.context_length:,}"
            )
        print(
            f"note: --context {args.context:,} exceeds the model's context_length {cfg.context_length:,} "
            f"(its training length); the figures assume it runs that long",
            file=sys.stderr,
        )
    device = DEVICES[args.device]
    if args.peak_flops or args.bandwidth:
        device = replace(
            device,
            name=device.name + " (overridden)",
            peak_flops=args.peak_flops or device.peak_flops,
            bandwidth=args.bandwidth or device.bandwidth,
        )
    res = analyze(cfg, args.context, args.batch, device, published)
    print(json.dumps(res, indent=1) if args.json else format_analysis(res, f"lmlab analyze: {title}"))
    return 0


def cmd_survey(args) -> int:
    from lmlab.survey import format_survey, survey_rows

    print(format_survey(survey_rows(), args.format))
    return 0


def cmd_bench_decode(args) -> int:
    from lmlab.bench import decode_benchmark, format_decode_benchmark
    from lmlab.devices import resolve_device

    args.config = None
    if args.run and args.preset:
        raise ConfigError("give one of --preset NAME or a RUN folder, not both")
    _resolve_scale(args, "tiny")
    cfg, title, _ = _model_config_for(args)  # a run's config from its run.yaml: checked before any weights load
    res = decode_benchmark(
        cfg,
        title,
        args.run,
        resolve_device(args.device),
        args.batch,
        args.prompt_len,
        args.new_tokens,
        args.repeats,
        args.dtype,
        args.compile,
    )
    print(
        json.dumps(res)
        if args.json
        else format_decode_benchmark(res, args.batch, args.prompt_len, args.new_tokens, args.repeats)
    )
    return 0


def cmd_bench_train(args) -> int:
    from lmlab.bench import format_train_benchmark, train_benchmark
    from lmlab.devices import resolve_device

    if args.config and args.preset:
        raise ConfigError("give one of --config or --preset, not both")
    _resolve_scale(args, "tiny")
    args.run = None
    cfg, title = (None, None) if not (args.config or args.preset) else _model_config_for(args)[:2]
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    res = train_benchmark(
        cfg, title, resolve_device(args.device), args.batch, dtypes, args.compile, args.rounds, args.steps
    )
    print(json.dumps(res) if args.json else format_train_benchmark(res))
    return 0


def cmd_bench_calibrate(args) -> int:
    from lmlab.bench import describe_machine
    from lmlab.kernels import settings as ks
    from lmlab.kernels.calibrate import calibrate, check_destination, set_aside, write_calibration

    log = (lambda s: print(s, file=sys.stderr)) if args.json else print
    dest, damaged = check_destination(Path(args.out) if args.out else None)  # before minutes of measuring
    if args.if_missing:
        kept = ks.load_calibration(dest)
        wanted = set() if args.training_only else set(ks.DECODE_DECISIONS)  # the training choices: always there
        # else an older or training-only calibration, or one whose decode threads were measured apart
        if kept is not None and wanted <= set(kept["choices"]) and not (wanted and ks.threads_measured_apart(kept)):
            k = ks.calibrated_kernels(kept)
            log(f"kept {dest}: {k.describe()}; {k.describe_decode(with_source=False)}")
            if args.json:
                print(json.dumps(kept))
            return 0
    aside = f"; the damaged file set aside as {set_aside(dest)}" if damaged else ""
    log(f"calibrating CPU kernels on {describe_machine()}{aside}")
    record = calibrate(args.rounds, log=log, decode=not args.training_only)
    path = write_calibration(record, dest)
    ks.default_kernels.cache_clear()
    log(f"wrote {path}")
    if args.json:
        print(json.dumps(record))
    return 0


# --- coordcheck ----------------------------------------------------------------------------
def cmd_coordcheck(args) -> int:
    from lmlab.devices import resolve_device
    from lmlab.lab.coordcheck import format_result, plot_result, run_coordcheck

    _resolve_scale(args, "tiny")
    res = run_coordcheck(
        args.config,
        args.preset,
        args.scale,
        list(args.set or []),
        args.parametrization,
        args.widths,
        args.depths,
        args.base_width,
        args.base_depth,
        args.lr,
        args.batch_size,
        args.steps,
        args.seeds,
        args.data,
        resolve_device(args.device),
        args.threshold,
    )
    print(format_result(res))
    if args.out:
        print(f"wrote {plot_result(res, args.out)}")
    return 1 if (args.check and not res["passed"]) else 0


# --- Hugging Face interop ------------------------------------------------------------------
def cmd_import(args) -> int:
    from lmlab.interop.hf import import_hf

    info = import_hf(args.path, args.out, dtype=args.dtype)
    print(
        f"imported {info['model_type']} ({info['params']:,} parameters, {info['dtype']}) into {info['run']}"
        + ("" if info["tokenizer"] else "; the HF folder has no tokenizer.json, so the run has no tokenizer")
    )
    for note in info["notes"]:  # the conversion from Meta's layout; accepted config.json fields HF never reads
        print(f"note: {note}")
    return 0


def cmd_export(args) -> int:
    from lmlab.interop.hf import export_hf

    info = export_hf(args.run, args.out, family=args.family, step=args.step, dtype=args.dtype)
    print(
        f"exported {info['checkpoint']} as {info['hf_class']} (model_type {info['model_type']}, {info['dtype']}) "
        f"to {info['out']}"
    )
    for what in info["left_out"]:
        print(f"note: not written: {what}")
    return 0


def cmd_presets(args) -> int:
    from lmlab.presets import format_presets

    print(format_presets())
    return 0


COMMANDS = {  # what each parsed command calls (lmlab.cli_parser names them)
    "prepare": cmd_prepare,
    "train": cmd_train,
    "eval": cmd_eval,
    "generate": cmd_generate,
    "plot": cmd_plot,
    "sweep": cmd_sweep,
    "sweep-worker": cmd_sweep_worker,
    "report": cmd_report,
    "import": cmd_import,
    "export": cmd_export,
    "analyze": cmd_analyze,
    "survey": cmd_survey,
    "coordcheck": cmd_coordcheck,
    "presets": cmd_presets,
    "bench decode": cmd_bench_decode,
    "bench calibrate": cmd_bench_calibrate,
    "bench train": cmd_bench_train,
}


def _one_line(exc: BaseException) -> bool:
    """Whether ``exc`` is an error the CLI reports in one line (exit 2). The classes of modules that
    import torch are imported only here, when something failed: a command refused early (a spec that
    plans too many runs) is not kept waiting for torch."""
    if isinstance(exc, (ConfigError, ValueError, FloatingPointError)):  # DataError, TokenizerError, ...
        return True
    from lmlab.data.corpus import CorpusError
    from lmlab.run_folder import CheckpointError

    return isinstance(exc, (CheckpointError, CorpusError))


def main(argv=None) -> int:
    parser = make_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # refused by the (sub)command they were given to, so the hint names its --help
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if hasattr(args, "threads"):  # every compute command: train, eval, generate, bench decode
        from lmlab.threads import set_threads

        set_threads(args.threads)
    try:
        return COMMANDS[args.func](args)
    except BrokenPipeError:  # e.g. `lmlab survey | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # a path that cannot be read or written: one line naming it
        where = f": {exc.filename!r}" if exc.filename else ""
        print(f"lmlab {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # lmlab.stopping.TrainingInterrupted says what was saved
        print(f"lmlab {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except Exception as exc:  # ConfigError, DataError, CheckpointError, ...: one line; anything else a bug
        if not _one_line(exc):
            raise
        print(f"lmlab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
