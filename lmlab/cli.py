"""The ``lmlab`` command line: prepare, train, eval, generate, import, export, presets, coordcheck, ...

Every error a user can cause (bad config, missing data, wrong checkpoint, ...) ends in one line
``lmlab <command>: error: <what, where, what to do>`` and exit status 2; nothing is overwritten.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from lmlab.argtypes import int_at_least
from lmlab.config import ConfigError

# --- argument types: a bad number is refused by argparse, naming the flag (exit 2) -----------------------
_int_at_least = int_at_least  # lmlab.argtypes, shared with the scripts in bench/


def _float_in(low: float, high: float, low_open: bool = False, high_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if too_low or too_high or value != value:
            lo, hi = "(" if low_open else "[", ")" if high_open else "]"
            raise argparse.ArgumentTypeError(f"{value} must be in {lo}{low}, {high}{hi}")
        return value
    parse.__name__ = "number"
    return parse


def _int_range(low: int, high: int):
    at_least = _int_at_least(low)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{value} must be <= {high}")
        return value
    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


POSITIVE, NON_NEGATIVE = _int_at_least(1), _int_at_least(0)


def _preset_name(text: str) -> str:
    """A --preset value: any non-blank name (checked against the presets where it is used)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a preset name (see `lmlab presets`)")
    return text
_preset_name.__name__ = "preset name"


def _stop_text(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an empty stop string would stop before the first token; give some text")
    return text


_stop_text.__name__ = "stop text"


def _path(text: str) -> str:
    """A file or folder argument: refused when blank (``--out ""`` would otherwise mean the current folder
    or, where the flag has a default, the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is blank; give a file or folder path")
    return text


_path.__name__ = "path"


# --- prepare -------------------------------------------------------------------------------
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
        raise ConfigError(f"{flag} does not apply with --tokenizer-file {args.tokenizer_file!r} (the file's own "
                          f"tokenizer and vocabulary are used); give one or the other")
    if args.tokenizer == "bytes" and args.vocab_size is not None:
        raise ConfigError(f"--vocab-size {args.vocab_size} does not apply with --tokenizer bytes (its vocabulary is "
                          f"the 256 bytes and <|endoftext|>: 257)")
    vocab_size = 4096 if args.vocab_size is None else args.vocab_size
    out = Path(args.out) if args.out else default_data_dir(args.tokenizer, vocab_size)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    manifest = prepare(source, out, args.tokenizer, vocab_size, val_docs, args.val_fraction, args.overwrite,
                       tokenizer_file=args.tokenizer_file, allow_special=args.allow_special_files,
                       text_field=args.text_field, progress=progress)
    for line in describe_manifest(manifest):
        print(line)
    sec, mb = manifest["stats"]["seconds"], manifest["stats"]["bytes"] / 1e6
    print(f"{mb:,.1f} MB of text: scan {sec['scan']:.1f} s, tokenizer {sec['tokenizer']:.1f} s, encoding "
          f"{sec['encode']:.1f} s ({mb / max(sec['encode'], 1e-9):,.1f} MB/s)")
    for line in manifest["notes"]:
        print(f"note: {line}", file=sys.stderr)
    got = manifest["tokenizer"]["vocab_size"]
    print(f"wrote {out} (tokenizer {manifest['tokenizer']['type']}, vocab {got})")
    if args.tokenizer == "bpe" and not args.tokenizer_file and got < vocab_size:
        print(f"note: the BPE stopped at {got:,} tokens, below --vocab-size {vocab_size:,}: the training split "
              f"has no more pairs to merge within its words", file=sys.stderr)
    return 0


# --- train ---------------------------------------------------------------------------------
def cmd_train(args) -> int:
    from lmlab.runs import setup_run

    _resolve_scale(args, "tiny")
    out = Path(args.out)
    trainer = setup_run(out, config=args.config, preset=args.preset, scale=args.scale, sets=args.set or [],
                        data=args.data, resume=args.resume, progress=not args.no_progress)
    try:
        return _train(trainer, out)
    finally:
        trainer.release_lock()


def _train(trainer, out: Path) -> int:
    if trainer.dist.is_main:
        print(
            f"model: {trainer.model.num_params():,} parameters ({trainer.model.num_params(non_embedding=True):,} "
            f"non-embedding), device {trainer.device}, dtype {str(trainer.amp_dtype or 'fp32').replace('torch.', '')}, "
            f"{trainer.dist.world_size} process(es) ({trainer.mode})"
            f"{'; freed memory kept by malloc' if trainer.malloc_kept else ''}"
            f"{'; fp32 linears on oneDNN' if trainer.onednn_linears else ''}"
            f"{'; kernels: ' + trainer.model.kernels.describe() if trainer.device.type == 'cpu' else ''}; "
            f"run folder {out}",
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
    from lmlab.lab.spec import builtin_specs, load_spec

    if args.list:
        for name, path in builtin_specs().items():
            spec = load_spec(path)
            tiers = spec.tiers
            print(f"{name}: {len(spec.variants)} variant(s) x {len(spec.seeds)} seed(s)"
                  + (f"; tiers: {', '.join(tiers)}" if tiers else "") + f"; {spec.claim}")
        return 0
    if not args.spec:
        raise ConfigError("give a spec file or a shipped spec name (`lmlab sweep --list` shows them)")
    command = (f"lmlab sweep {args.spec}" + (f" --tier {args.tier}" if args.tier else "")
               + (f" --out {args.out}" if args.out else "") + f" --jobs {args.jobs}")
    if args.data:
        command += f" --data {args.data}"
    params = {}
    if args.executor_config:
        from lmlab.config import load_mapping

        params.update(load_mapping(Path(args.executor_config)))
    for flag, key in (("slurm_partition", "slurm_partition"), ("time", "timeout_min"),
                      ("cpus_per_task", "cpus_per_task"), ("gpus_per_task", "gpus_per_node"),
                      ("array_parallelism", "slurm_array_parallelism"), ("address", "address"),
                      ("max_retries", "max_retries")):
        if getattr(args, flag) is not None:
            params[key] = getattr(args, flag)
    gpus = params.get("gpus_per_node")
    if args.executor != "ray" and isinstance(gpus, float) and gpus.is_integer():
        params["gpus_per_node"] = int(gpus)  # Slurm counts whole GPUs; Ray takes fractions
    if args.executor != "local":
        command += f" --executor {args.executor}"
    for flag in ("runs_per_task", "slurm_partition", "time", "cpus_per_task", "gpus_per_task", "array_parallelism",
                 "address", "max_retries", "executor_config"):
        value = getattr(args, flag)
        if value is not None and not (flag == "runs_per_task" and value == 1):
            command += f" --{flag.replace('_', '-')} {value:g}" if isinstance(value, float) else \
                f" --{flag.replace('_', '-')} {value}"
    out = run_sweep(args.spec, out=args.out, jobs=args.jobs, dry_run=args.dry_run, command=command, tier=args.tier,
                    data_dir=Path(args.data) if args.data else None, max_runs=args.max_runs,
                    executor=args.executor, executor_params=params, runs_per_task=args.runs_per_task)
    if args.dry_run:
        return 0
    from lmlab.lab.results import read_results

    failed = [r["run"] for r in read_results(out) if r.get("status") == "failed"]
    if failed:  # a diverged run is a result; a failed one is not
        print(f"lmlab sweep: {len(failed)} run(s) failed without a result ({', '.join(failed[:5])}"
              f"{', ...' if len(failed) > 5 else ''}); `lmlab report {out}` lists why, `lmlab sweep-worker "
              f"{out} RUN` reproduces one, and the same command retries them", file=sys.stderr)
        return 1
    return 0


def cmd_sweep_worker(args) -> int:
    from lmlab.lab.worker import run_names

    rows = run_names(Path(args.sweep), args.runs, args.threads)
    return 0 if all(r.get("status") in ("ok", "diverged") for r in rows) else 1


def cmd_report(args) -> int:
    from lmlab.lab.index import write_index
    from lmlab.lab.report import write_report

    if args.readme and not args.index:
        raise ConfigError("--readme goes with --index DIR... --out FILE.md (the summary is the index's)")
    if args.index:
        if args.out is None:
            raise ConfigError("--index needs --out FILE.md (the index page; its forest plot goes beside it)")
        paths = write_index([Path(d) for d in [*([args.sweep] if args.sweep else []), *args.index]], Path(args.out),
                            readme=[Path(r) for r in args.readme] if args.readme else None)
    else:
        if not args.sweep:
            raise ConfigError("give a sweep folder (`lmlab sweep --out`), or --index DIR... --out FILE.md")
        paths = write_report(Path(args.sweep), args.out)
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_plot(args) -> int:
    from lmlab.plot import plot_runs

    for path in plot_runs([Path(r) for r in args.runs], Path(args.out)):
        print(f"wrote {path}")
    return 0


# --- eval ----------------------------------------------------------------------------------
def _eval_tasks(args, device) -> int:
    try:
        from lmlab.lm_eval_backend import run_tasks
    except ImportError as exc:
        raise ConfigError(f"--tasks needs lm-evaluation-harness ({exc}); install the extra: "
                          f"pip install 'lmlab[eval]'") from None
    names = args.tasks.split(",")  # blanks dropped and every name checked by run_tasks
    out = run_tasks(args.run, names, include_path=args.include_path, num_fewshot=args.num_fewshot,
                    limit=args.limit, batch_size=args.batch_size, device=str(device))
    if args.json:
        print(json.dumps(out["results"], default=str))
        return 0
    for task, metrics in out["results"].items():
        shown = ", ".join(f"{k.split(',')[0]} {v:.4f}" for k, v in metrics.items()
                          if isinstance(v, float) and not k.endswith("_stderr,none"))
        print(f"{task}: {shown}")
    return 0


def _check_eval_flags(args) -> None:
    """Refuse flags that do not apply: the harness's (--limit, --include-path, --num-fewshot) without
    --tasks, and bits-per-byte's (--data, --split, --stride, --dtype) with it (either would be ignored)."""
    task_only = [f for f, v in (("--limit", args.limit), ("--include-path", args.include_path),
                                ("--num-fewshot", args.num_fewshot)) if v is not None]
    bpb_only = [f for f, v in (("--data", args.data), ("--split", args.split), ("--stride", args.stride),
                               ("--dtype", args.dtype)) if v is not None]
    if args.tasks is not None and not args.tasks.strip(" ,"):
        raise ConfigError("--tasks names no task; give lm-eval task names, e.g. hellaswag,arc_easy")
    if not args.tasks and task_only:
        raise ConfigError(f"{', '.join(task_only)} {'only apply' if len(task_only) > 1 else 'only applies'} with "
                          f"--tasks (lm-evaluation-harness tasks); drop {'them' if len(task_only) > 1 else 'it'} "
                          f"or name the tasks")
    if args.tasks and bpb_only:
        raise ConfigError(f"{', '.join(bpb_only)} {'only apply' if len(bpb_only) > 1 else 'only applies'} to the "
                          f"held-out bits-per-byte evaluation, not with --tasks (the harness brings its own "
                          f"documents); drop {'them' if len(bpb_only) > 1 else 'it'} or --tasks")


def cmd_eval(args) -> int:
    from lmlab.checkpoint import load_run
    from lmlab.evaluate import evaluate
    from lmlab.run_folder import run_data
    from lmlab.train import resolve_device, resolve_dtype

    _check_eval_flags(args)
    device = resolve_device(args.device)
    if args.tasks:  # downstream tasks through lm-evaluation-harness
        return _eval_tasks(args, device)
    args.split, args.dtype = args.split or "val", args.dtype or "fp32"
    model, cfg, tok, run, ckpt = load_run(args.run, device=str(device))
    data = run_data(args.run, run, args.data, cfg.vocab_size)
    res = evaluate(model, data.tokens(args.split), data.bytes(args.split), batch_size=args.batch_size,
                   stride=args.stride, device=device, autocast_dtype=resolve_dtype(args.dtype, device))
    res.update(checkpoint=str(ckpt), split=args.split, data=str(data.folder), stride=args.stride or cfg.context_length)
    if args.json:
        print(json.dumps(res))
    else:
        print(
            f"{args.split} of {data.folder} ({res['tokens']:,} tokens, {res['bytes']:,} bytes), checkpoint {ckpt.name}:"
        )
        print(f"  loss            {res['loss']:.4f} nats/token")
        print(f"  perplexity      {res['perplexity']:.2f}")
        print(f"  bits-per-byte   {res['bits_per_byte']:.4f}")
    return 0


# --- generate ------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    from lmlab.checkpoint import load_run
    from lmlab.data.tokenizer import TokenizerError
    from lmlab.generate import encode_prompt, generate_batch, generate_text, text_until_stop, write_text
    from lmlab.train import resolve_device

    device = resolve_device(args.device)
    if args.prompt_ids is not None:
        return _generate_ids(args, device)
    model, cfg, tok, _, _ = load_run(args.run, device=str(device))
    if args.threads is None and device.type == "cpu" and len(args.prompt or [""]) == 1:
        from lmlab.generate import decode_threads
        from lmlab.threads import default_threads, set_threads

        set_threads(decode_threads(model, default_threads()))  # small models: 1 thread
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
    if args.logprobs and len(prompts) > 1:
        raise ConfigError("--logprobs takes one --prompt (the log-probabilities of one stream)")
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_id=eos,
                    device=device)
    if len(prompts) == 1:  # one prompt: stream the text as it comes
        pieces = generate_text(model, tok, prompts[0], args.max_new_tokens, args.stop or (), **sampling)
        first = next(pieces)  # checks the prompt (ValueError -> one-line error) before anything is printed
        write_text(texts[0], args.raw)
        seen = []
        try:
            for text, i, lp in itertools.chain([first], pieces):
                write_text(text, args.raw)
                sys.stdout.flush()
                if i is not None:
                    seen.append((i, lp))
        except KeyboardInterrupt:
            sys.stdout.write("\n")  # end the text's line before the 'interrupted' message
            sys.stdout.flush()
            raise
        write_text("\n", args.raw)
        if args.logprobs:
            _print_logprobs(seen, lambda i: repr(tok.token_bytes(i).decode("utf-8", errors="replace")))
        return 0
    # several prompts: one batch (left-padded), each continuation printed when the batch is done
    outs = generate_batch(model, prompts, args.max_new_tokens, **sampling)
    for n, (text, ids) in enumerate(zip(texts, outs)):
        print(f"--- [{n}] ---")
        write_text(text + text_until_stop(tok, ids, args.stop or ()) + "\n", args.raw)
    return 0


def _generate_ids(args, device) -> int:
    """``generate --prompt-ids``: token ids in, token ids out (a run without a tokenizer, e.g. imported
    from a Hugging Face folder without tokenizer.json)."""

    from lmlab.checkpoint import load_run
    from lmlab.generate import decode_threads, generate_logprobs
    from lmlab.threads import default_threads, set_threads

    if args.prompt or args.stop or args.stop_at_eot or args.prompt_after_eot:
        raise ConfigError("--prompt-ids takes token ids and prints ids: it cannot be combined with --prompt, "
                          "--stop, --stop-at-eot or --prompt-after-eot (they need a tokenizer)")
    try:
        ids = [int(x) for x in args.prompt_ids.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"--prompt-ids {args.prompt_ids!r}: give token ids separated by commas or spaces, "
                          f"e.g. 1,2,3") from None
    model, cfg, _, _, _ = load_run(args.run, device=str(device), tokenizer=False)
    bad = [i for i in ids if not 0 <= i < cfg.vocab_size]
    if not ids or bad:
        raise ConfigError(f"--prompt-ids {args.prompt_ids!r}: " + (f"id {bad[0]} is outside 0..{cfg.vocab_size - 1}, "
                          f"the model's vocabulary" if bad else "no ids given"))
    if args.threads is None and device.type == "cpu":
        set_threads(decode_threads(model, default_threads()))
    seen = list(generate_logprobs(model, ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                                  args.seed, device=device))
    print(" ".join(str(i) for i, _ in seen))
    if args.logprobs:
        _print_logprobs(seen)
    return 0


def _print_logprobs(seen: list, text_of=None) -> None:
    """``generate --logprobs``: one line per (token id, log-probability in nats), with the token's text
    when ``text_of`` is given, then the total."""
    print("token id\tlog-probability (nats, the model's distribution before sampling settings)"
          + ("\ttext" if text_of else ""))
    for i, lp in seen:
        print(f"{i}\t{lp:.4f}" + (f"\t{text_of(i)}" if text_of else ""))
    print(f"total\t{sum(lp for _, lp in seen):.4f}\t({len(seen)} tokens)")


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
            raise ConfigError(f"--context {args.context:,} is beyond the model's learned positions (context_length "
                              f"{cfg.context_length:,}): it cannot run that long; choose --context <= "
                              f"{cfg.context_length:,}")
        print(f"note: --context {args.context:,} exceeds the model's context_length {cfg.context_length:,} "
              f"(its training length); the figures assume it runs that long", file=sys.stderr)
    device = DEVICES[args.device]
    if args.peak_flops or args.bandwidth:
        device = replace(device, name=device.name + " (overridden)", peak_flops=args.peak_flops or device.peak_flops,
                         bandwidth=args.bandwidth or device.bandwidth)
    res = analyze(cfg, args.context, args.batch, device, published)
    print(json.dumps(res, indent=1) if args.json else format_analysis(res, f"lmlab analyze: {title}"))
    return 0


def cmd_survey(args) -> int:
    from lmlab.analysis import format_survey, survey_rows

    print(format_survey(survey_rows(), args.format))
    return 0


def cmd_bench_decode(args) -> int:
    from lmlab.bench import decode_benchmark, format_decode_benchmark
    from lmlab.train import resolve_device

    args.config = None
    if args.run and args.preset:
        raise ConfigError("give one of --preset NAME or a RUN folder, not both")
    _resolve_scale(args, "tiny")
    cfg, title, _ = _model_config_for(args)  # a run's config from its run.yaml: checked before any weights load
    res = decode_benchmark(cfg, title, args.run, resolve_device(args.device), args.batch, args.prompt_len,
                           args.new_tokens, args.repeats, args.dtype)
    print(json.dumps(res) if args.json else format_decode_benchmark(res, args.batch, args.prompt_len,
                                                                     args.new_tokens, args.repeats))
    return 0


# --- coordcheck ----------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    """A comma-separated list of integers >= 1 (``--widths 64,128,256``, ``--seeds 1,2``)."""
    items = [t.strip() for t in text.split(",")]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


_int_list.__name__ = "list of integers"


def cmd_coordcheck(args) -> int:
    from lmlab.lab.coordcheck import format_result, plot_result, run_coordcheck
    from lmlab.train import resolve_device

    _resolve_scale(args, "tiny")
    res = run_coordcheck(args.config, args.preset, args.scale, list(args.set or []), args.parametrization,
                         args.widths, args.depths, args.base_width, args.base_depth, args.lr, args.batch_size,
                         args.steps, args.seeds, args.data, resolve_device(args.device), args.threshold)
    print(format_result(res))
    if args.out:
        print(f"wrote {plot_result(res, args.out)}")
    return 1 if (args.check and not res["passed"]) else 0


# --- Hugging Face interop ------------------------------------------------------------------
def cmd_import(args) -> int:
    from lmlab.interop.hf import import_hf

    info = import_hf(args.path, args.out, dtype=args.dtype)
    print(f"imported {info['model_type']} ({info['params']:,} parameters, {info['dtype']}) into {info['run']}"
          + ("" if info["tokenizer"] else "; the HF folder has no tokenizer.json, so the run has no tokenizer"))
    for note in info["notes"]:  # the conversion from Meta's layout; accepted config.json fields HF never reads
        print(f"note: {note}")
    return 0


def cmd_export(args) -> int:
    from lmlab.interop.hf import export_hf

    info = export_hf(args.run, args.out, family=args.family, step=args.step, dtype=args.dtype)
    print(f"exported {info['checkpoint']} as {info['hf_class']} (model_type {info['model_type']}, {info['dtype']}) "
          f"to {info['out']}")
    for what in info["left_out"]:
        print(f"note: not written: {what}")
    return 0


def cmd_presets(args) -> int:
    from lmlab.presets import format_presets

    print(format_presets())
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (and where to find the usage) instead of the usage block; each
    command's parser is remembered in the parsed arguments (``command_parser``), to refuse what it did
    not take with its own usage hint."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def set_defaults(self, **kwargs) -> None:
        if "func" in kwargs:
            kwargs["command_parser"] = self
        super().set_defaults(**kwargs)


THREADS_HELP = "torch CPU threads (default: the physical cores, at most OMP_NUM_THREADS when set)"


def make_parser() -> argparse.ArgumentParser:
    from lmlab import __version__

    p = _Parser(prog="lmlab", description="A language-model architecture lab.")
    p.add_argument("--version", action="version", version=f"lmlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("prepare", help="tokenise a corpus into shards + manifest")
    sp.add_argument("--data", type=_path, nargs="+", metavar="PATH",
                    help="one or more inputs: a .txt file (split at blank lines), a folder of .txt documents, "
                         ".jsonl / .jsonl.gz / .json files, .parquet shards (a quoted glob such as "
                         "'shards/*.parquet' is expanded), a `datasets` save_to_disk folder "
                         "(default: the Shakespeare corpus)")
    sp.add_argument("--text-field", default="text", help="the text field of JSON / parquet / datasets records "
                                                          "(default: text)")
    sp.add_argument("--out", type=_path,
                    help="output folder (default data/shakespeare-bpe<V> or data/shakespeare-bytes)")
    sp.add_argument("--tokenizer", choices=["bpe", "bytes"], default="bpe")
    sp.add_argument("--vocab-size", type=_int_at_least(257), help="BPE vocabulary size incl. <|endoftext|> "
                                                                   "(default 4096; an upper bound: a small corpus may "
                                                                   "run out of merges first)")
    sp.add_argument("--tokenizer-file", type=_path,
                    help="tokenise with this existing tokenizer.json (e.g. an imported run's), "
                         "or an HF model folder's (tokenizer.json or vocab.json + merges.txt), "
                         "instead of training one")
    sp.add_argument("--val-docs", help="comma-separated document names held out for validation "
                                       "(default corpus: hamlet, sonnets, tempest)")
    sp.add_argument("--val-fraction", type=_float_in(0, 1, True, True), default=0.1,
                    help="otherwise about this fraction of the documents is held out, chosen by a hash of each "
                         "document's text (adding documents moves none of the others)")
    sp.add_argument("--overwrite", action="store_true")
    sp.add_argument(
        "--allow-special-files",
        action="store_true",
        help="also read FIFOs and devices given as --data or inside it (refused otherwise; read up to 1 GiB)",
    )
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bars with MB/s on stderr (default: when stderr is a terminal)")
    sp.set_defaults(func=cmd_prepare)

    sp = sub.add_parser("train", help="train a model from scratch (or --resume a run)")
    sp.add_argument("--config", type=_path,
                    help="YAML file with 'model:' and 'train:' sections, or a built-in name (demo)")
    sp.add_argument("--preset", type=_preset_name, help="a model family preset (see `lmlab presets`)")
    sp.add_argument("--scale", choices=["tiny", "real"], help="preset scale (default tiny)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a model or train field")
    sp.add_argument("--data", type=_path,
                    help="a prepared data folder (default: data/shakespeare-bpe4096, prepared on first use)")
    sp.add_argument("--out", type=_path, required=True, help="run folder to create")
    sp.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.add_argument("--threads", type=POSITIVE, help=THREADS_HELP)
    sp.set_defaults(func=cmd_train)

    sp = sub.add_parser("eval", help="held-out loss, perplexity and bits-per-byte of a run")
    sp.add_argument("run", type=_path)
    sp.add_argument("--data", type=_path, help="prepared data folder (default: the run's)")
    sp.add_argument("--split", choices=["val", "train"], help="the split scored (default val)")
    sp.add_argument("--stride", type=POSITIVE, help="new tokens scored per window (default context_length)")
    sp.add_argument("--batch-size", type=POSITIVE, default=16)
    sp.add_argument("--device", default="auto")
    sp.add_argument("--dtype", choices=["fp32", "bf16", "auto"], help="autocast dtype (default fp32)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--tasks", help="comma-separated lm-evaluation-harness tasks (the eval extra) instead of "
                                    "bits-per-byte, e.g. hellaswag,arc_easy")
    sp.add_argument("--include-path", type=_path, help="with --tasks: a folder of task YAMLs of your own")
    sp.add_argument("--num-fewshot", type=NON_NEGATIVE, help="with --tasks: few-shot examples per prompt")
    sp.add_argument("--limit", type=POSITIVE, help="with --tasks: at most this many documents per task")
    sp.add_argument("--threads", type=POSITIVE, help=THREADS_HELP)
    sp.set_defaults(func=cmd_eval)

    sp = sub.add_parser("generate", help="sample from a run with a KV cache")
    sp.add_argument("run", type=_path)
    sp.add_argument("--prompt", action="append", help="text to continue (default: start of a document); "
                                                      "repeat for a batch of prompts")
    sp.add_argument("--prompt-ids", metavar="IDS", help="token ids to continue, e.g. 1,2,3 (a run without a "
                    "tokenizer); prints the new ids instead of text")
    sp.add_argument(
        "--stop", action="append", type=_stop_text, metavar="TEXT", help="stop before this text (repeatable)"
    )
    sp.add_argument("--max-new-tokens", type=POSITIVE, default=200)
    sp.add_argument("--temperature", type=_float_in(0, float("inf")), default=0.8, help="0 = greedy")
    sp.add_argument("--top-k", type=POSITIVE)
    sp.add_argument("--top-p", type=_float_in(0, 1, low_open=True))
    sp.add_argument("--seed", type=_int_range(0, 2**63 - 1))
    sp.add_argument("--stop-at-eot", action="store_true", help="stop at the end-of-text token")
    sp.add_argument("--raw", action="store_true",
                    help="write the prompt and the text as they are; by default control characters (ESC, the "
                         "other C0 but newline and tab, C1) and a prompt's invalid bytes are written as \\xNN")
    sp.add_argument("--prompt-after-eot", action="store_true", help="prefix the prompt with <|endoftext|>")
    sp.add_argument("--logprobs", action="store_true",
                    help="after the text, each new token's id, log-probability (nats) and text")
    sp.add_argument("--device", default="auto")
    sp.add_argument("--threads", type=POSITIVE, help="torch CPU threads (default: with one prompt, one per 200M "
                    "weights of the model, so 1 for small models; else the physical cores, at most OMP_NUM_THREADS)")
    sp.set_defaults(func=cmd_generate)

    sp = sub.add_parser("plot", help="PNG plots of runs: loss vs step, tokens and wall time; the LR schedule")
    sp.add_argument("runs", nargs="+", type=_path, help="run folders")
    sp.add_argument("--out", type=_path, default="plots", help="output folder (default ./plots)")
    sp.set_defaults(func=cmd_plot)

    sp = sub.add_parser("sweep", help="run an ablation spec: every variant x seed trained, evaluated, recorded")
    sp.add_argument("spec", nargs="?", type=_path, help="a sweep spec YAML file or a shipped spec name (see --list)")
    sp.add_argument("--out", type=_path, help="sweep folder (default sweeps/NAME); an existing one is resumed")
    sp.add_argument("--jobs", type=POSITIVE, default=1, help="runs trained at once, each with cores // jobs threads")
    sp.add_argument("--dry-run", action="store_true", help="print the runs, steps, tokens and FLOPs; train nothing")
    sp.add_argument("--list", action="store_true", help="list the shipped specs and their claims")
    sp.add_argument("--max-runs", type=POSITIVE, default=None,
                    help="the most runs the spec may plan (default: its 'max_runs:', else 10,000); counted "
                         "before anything is planned")
    sp.add_argument("--data", type=_path,
                    help="a prepared data folder (`lmlab prepare --out`) for every run, over the spec's "
                         "'data:' (default: the spec's, else the default corpus)")
    sp.add_argument("--tier", help="run the spec at one of its tiers (e.g. gpu: 20-100M parameters on one GPU); "
                                   "default: the spec as written (CPU-sized)")
    sp.add_argument("--executor", choices=["local", "slurm", "submitit-local", "ray"], default="local",
                    help="where runs train: local (--jobs at once, default), slurm (job arrays through submitit; "
                         "needs lmlab[slurm]), submitit-local (submitit's local executor, --jobs jobs at once) "
                         "or ray (tasks on a Ray cluster, --address; needs lmlab[ray])")
    sp.add_argument("--runs-per-task", "--runs-per-gpu", dest="runs_per_task", type=POSITIVE, default=1,
                    help="runs each Slurm/submitit task trains at once (sharing its CPUs, or its GPU)")
    sp.add_argument("--slurm-partition", help="Slurm partition of the runs' jobs")
    sp.add_argument("--time", type=POSITIVE, help="each job's time limit in minutes (default 1440); near it "
                    "the job checkpoints and is requeued")
    sp.add_argument("--cpus-per-task", type=POSITIVE, help="CPUs of each Slurm task")
    sp.add_argument("--gpus-per-task", type=float, help="GPUs of each task (Slurm: whole GPUs of its node; "
                    "Ray: fractions too, e.g. 0.25 for four tasks on one GPU)")
    sp.add_argument("--address", help="the Ray cluster (ray://HOST:10001, HOST:6379 or auto); local (the "
                    "default): a Ray started here with --jobs tasks at once")
    sp.add_argument("--max-retries", type=int, help="Ray: times a task is retried when its worker or node dies "
                    "(default 3, -1 unlimited; the run continues from its checkpoint)")
    sp.add_argument("--array-parallelism", type=POSITIVE, help="Slurm array tasks running at once")
    sp.add_argument("--executor-config", type=_path, metavar="FILE.yaml",
                    help="other submitit parameters, a YAML mapping (e.g. slurm_account, mem_gb, "
                         "slurm_additional_parameters); the flags above take precedence")
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("sweep-worker", help="train, evaluate and record planned runs of a sweep (what each "
                        "Slurm/submitit job runs; reproduces a failed run)")
    sp.add_argument("sweep", type=_path, help="the sweep folder (`lmlab sweep --out`)")
    sp.add_argument("runs", nargs="+", help="run names (its plans/RUN.json); several train at once")
    sp.add_argument("--threads", type=POSITIVE, default=1, help="torch threads per run (default 1)")
    sp.set_defaults(func=cmd_sweep_worker)

    sp = sub.add_parser("report", help="markdown report of a sweep (verdicts, plots, results.csv), or an index")
    sp.add_argument("sweep", nargs="?", type=_path, help="a sweep folder (`lmlab sweep --out`)")
    sp.add_argument("--out", type=_path, help="the markdown file (default SWEEP/report.md; plots and CSV beside it)")
    sp.add_argument("--index", nargs="+", type=_path, metavar="DIR",
                    help="write one index page of every claim of these sweep folders (needs --out)")
    sp.add_argument("--readme", type=_path, metavar="FILE.md", action="append",
                    help="with --index: also rewrite the summary table (lmlab:ablation-summary markers) and/or the "
                         "counts line (lmlab:ablation-counts) in FILE.md; may be given more than once")
    sp.set_defaults(func=cmd_report)

    sp = sub.add_parser("import", help="convert a Hugging Face model folder into a new run folder")
    sp.add_argument("path", type=_path,
                    help="HF model folder: config.json + model.safetensors (or shards, or pytorch_model.bin)")
    sp.add_argument("--out", type=_path, required=True, help="run folder to create")
    sp.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                    help="dtype of the stored weights (default auto: the HF checkpoint's, bf16 when all its "
                         "floating tensors are bf16, else fp32)")
    sp.set_defaults(func=cmd_import)

    sp = sub.add_parser("export", help="write a run's checkpoint as a Hugging Face model folder")
    sp.add_argument("run", type=_path)
    sp.add_argument("--format", choices=["hf"], default="hf")
    sp.add_argument("--out", type=_path, required=True, help="folder to create (config.json, model.safetensors)")
    sp.add_argument("--family", help="HF model_type to write (default: the imported one, else the first that fits)")
    sp.add_argument("--step", type=NON_NEGATIVE, help="checkpoint step (default: the latest)")
    sp.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                    help="dtype of the written weights (default auto: the checkpoint's, so a run imported in "
                         "bf16 exports bf16 and a run lmlab trained exports fp32)")
    sp.set_defaults(func=cmd_export)

    sp = sub.add_parser("analyze", help="parameters, FLOPs/token, KV cache and arithmetic intensity of a config")
    sp.add_argument("run", type=_path, nargs="?", help="a run folder (its run.yaml)")
    sp.add_argument("--preset", type=_preset_name, help="a model family preset (see `lmlab presets`)")
    sp.add_argument("--scale", choices=["real", "tiny"], help="preset scale (default real)")
    sp.add_argument("--config", type=_path, help="a YAML/JSON file with a 'model:' section (and optionally 'train:')")
    sp.add_argument("--context", type=POSITIVE, help="sequence length (default the config's context_length)")
    sp.add_argument("--batch", type=POSITIVE, default=1, help="sequences (KV cache, decode intensity)")
    sp.add_argument("--device", choices=["h100", "h200", "a100", "cpu"], default="h100")
    sp.add_argument(
        "--peak-flops",
        type=_float_in(0, float("inf"), low_open=True, high_open=True),
        help="override the device's peak FLOP/s",
    )
    sp.add_argument(
        "--bandwidth",
        type=_float_in(0, float("inf"), low_open=True, high_open=True),
        help="override the device's memory bandwidth in bytes/s",
    )
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_analyze)

    sp = sub.add_parser("survey", help="the lecture's cross-model table over all presets")
    sp.add_argument("--format", choices=["table", "markdown", "csv"], default="table")
    sp.set_defaults(func=cmd_survey)

    sp = sub.add_parser("bench", help="benchmarks: `lmlab bench decode`")
    bench = sp.add_subparsers(dest="bench", required=True)
    bp = bench.add_parser("decode", help="prefill and decode tokens/s of KV-cache generation (greedy)")
    bp.add_argument("run", type=_path, nargs="?", help="a run folder (its trained weights); default the demo config")
    bp.add_argument("--preset", type=_preset_name, help="a preset with random weights")
    bp.add_argument("--scale", choices=["tiny", "real"], help="preset scale (default tiny)")
    bp.add_argument("--batch", type=POSITIVE, default=1)
    bp.add_argument("--prompt-len", type=POSITIVE, default=32)
    bp.add_argument("--new-tokens", type=_int_at_least(2), default=64)
    bp.add_argument("--repeats", type=POSITIVE, default=5, help="timed runs (medians), after one warm-up")
    bp.add_argument("--device", default="cpu")
    bp.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    bp.add_argument("--threads", type=POSITIVE, help=THREADS_HELP)
    bp.add_argument("--json", action="store_true", help="print one JSON object")
    bp.set_defaults(func=cmd_bench_decode, command="bench decode")

    sp = sub.add_parser("coordcheck", help="coordinate check of a parametrization (sp | mup | completep): "
                                           "activation sizes across widths after a few AdamW steps")
    sp.add_argument("--config", type=_path, help="YAML file with 'model:' and 'train:' sections, or a built-in name")
    sp.add_argument("--preset", type=_preset_name, help="a model family preset (see `lmlab presets`)")
    sp.add_argument("--scale", choices=["tiny", "real"], help="preset scale (default tiny)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a model or train field")
    sp.add_argument("--parametrization", choices=["sp", "mup", "completep"],
                    help="the parametrization checked (default: the config's; sp)")
    sp.add_argument("--widths", type=_int_list, default=None,
                    help="d_model values, comma-separated, each a multiple of n_heads (default 64,128,256)")
    sp.add_argument("--depths", type=_int_list, default=None,
                    help="check over depth instead: n_layers values, comma-separated, at the config's d_model "
                         "(CompleteP's claim; e.g. 2,4,8,16)")
    sp.add_argument("--base-depth", type=POSITIVE,
                    help="completep over --depths: base_n_layers (default: the smallest depth)")
    sp.add_argument("--base-width", type=POSITIVE,
                    help="mup / completep: base_d_model (default: the config's, else the smallest width)")
    sp.add_argument("--steps", type=POSITIVE, default=4, help="AdamW steps per width (default 4)")
    sp.add_argument("--seeds", type=_int_list, default=[1], help="seeds, comma-separated, averaged (default 1)")
    sp.add_argument("--lr", type=_float_in(0, float("inf"), low_open=True, high_open=True),
                    help="constant learning rate (default: the config's lr; 0.005 for the built-in model)")
    sp.add_argument("--batch-size", type=POSITIVE, help="sequences per step (default: the config's; 8)")
    sp.add_argument("--data", type=_path, metavar="DIR|random",
                    help="a prepared data folder, or 'random' for random token ids (Zipf-distributed: a unigram to "
                         "learn) (default: the default corpus, prepared on first use as `lmlab train` does)")
    sp.add_argument("--threshold", type=_float_in(0, float("inf"), low_open=True, high_open=True), default=0.25,
                    help="the check passes when every layer's |slope| of log(mean |x|) against log(width) is "
                         "below this at the last step (default 0.25)")
    sp.add_argument("--check", action="store_true", help="exit 1 when the check fails (default: exit 0 either way)")
    sp.add_argument("--out", type=_path, help="also write the figure to this PNG file (matplotlib)")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--threads", type=POSITIVE, help=THREADS_HELP)
    sp.set_defaults(func=cmd_coordcheck)

    sp = sub.add_parser("presets", help="list the model family presets")
    sp.set_defaults(func=cmd_presets)
    return p


def _one_line(exc: BaseException) -> bool:
    """Whether ``exc`` is an error the CLI reports in one line (exit 2). The classes of modules that
    import torch are imported only here, when something failed: a command refused early (a spec that
    plans too many runs) is not kept waiting for torch."""
    if isinstance(exc, (ConfigError, ValueError, FloatingPointError)):  # DataError, TokenizerError, ...
        return True
    from lmlab.run_folder import CheckpointError
    from lmlab.data.corpus import CorpusError

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
        return args.func(args)
    except BrokenPipeError:  # e.g. `lmlab survey | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # a path that cannot be read or written: one line naming it
        where = f": {exc.filename!r}" if exc.filename else ""
        print(f"lmlab {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # lmlab.train.TrainingInterrupted says what was saved
        print(f"lmlab {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except Exception as exc:  # ConfigError, DataError, CheckpointError, ...: one line; anything else a bug
        if not _one_line(exc):
            raise
        print(f"lmlab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
