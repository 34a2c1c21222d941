"""The command line's grammar: every ``lmlab`` command, its flags and their types (argparse). Parsing
only: each command's parser sets ``func`` to the command's name, and :data:`lmlab.cli.COMMANDS` maps it
to the function that runs it; a flag's type refuses a bad value itself (argparse names the flag, exit 2)."""

from __future__ import annotations

import argparse

from lmlab import __version__
from lmlab.argtypes import int_at_least, threads_count

_int_at_least = int_at_least


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


class _Once(argparse.Action):
    """An option that may be given once: a second one is an error naming both values (argparse would keep
    the last silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        if before is not None:
            parser.error(f"{option_string} given twice ({before!r}, then {values!r}): give it once")
        setattr(namespace, self.dest, values)


THREADS_HELP = "torch CPU threads (default: the physical cores, at most OMP_NUM_THREADS when set)"


def _weights_dtype(sp: argparse.ArgumentParser, what: str) -> None:
    """``--dtype auto|fp32|bf16``: the dtype of ``what`` (the rest of its help)."""
    sp.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto", help=f"dtype of {what}")


def make_parser() -> argparse.ArgumentParser:

    p = _Parser(prog="lmlab", description="A language-model architecture lab.")
    p.add_argument("--version", action="version", version=f"lmlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("prepare", help="tokenise a corpus into shards + manifest")
    sp.add_argument(
        "--data",
        type=_path,
        nargs="+",
        metavar="PATH",
        help="one or more inputs: a .txt file (split at blank lines), a folder of .txt documents, "
        ".jsonl / .jsonl.gz / .json files, .parquet shards (a quoted glob such as "
        "'shards/*.parquet' is expanded), a `datasets` save_to_disk folder "
        "(default: the Shakespeare corpus)",
    )
    sp.add_argument(
        "--text-field", default="text", help="the text field of JSON / parquet / datasets records (default: text)"
    )
    sp.add_argument(
        "--out", type=_path, help="output folder (default data/shakespeare-bpe<V> or data/shakespeare-bytes)"
    )
    sp.add_argument("--tokenizer", choices=["bpe", "bytes"], default="bpe")
    sp.add_argument(
        "--vocab-size",
        type=_int_at_least(257),
        help="BPE vocabulary size incl. <|endoftext|> "
        "(default 4096; an upper bound: a small corpus may "
        "run out of merges first)",
    )
    sp.add_argument(
        "--tokenizer-file",
        type=_path,
        help="tokenise with this existing tokenizer.json (e.g. an imported run's), "
        "or an HF model folder's (tokenizer.json or vocab.json + merges.txt), "
        "instead of training one",
    )
    sp.add_argument(
        "--val-docs",
        help="comma-separated document names held out for validation (default corpus: hamlet, sonnets, tempest)",
    )
    sp.add_argument(
        "--val-fraction",
        type=_float_in(0, 1, True, True),
        default=0.1,
        help="otherwise about this fraction of the documents is held out, chosen by a hash of each "
        "document's text (adding documents moves none of the others)",
    )
    sp.add_argument("--overwrite", action="store_true")
    sp.add_argument(
        "--allow-special-files",
        action="store_true",
        help="also read FIFOs and devices given as --data or inside it (refused otherwise; read up to 1 GiB)",
    )
    sp.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars with MB/s on stderr (default: when stderr is a terminal)",
    )
    sp.set_defaults(func="prepare")

    sp = sub.add_parser("train", help="train a model from scratch (or --resume a run)")
    sp.add_argument(
        "--config", type=_path, help="YAML file with 'model:' and 'train:' sections, or a built-in name (demo)"
    )
    sp.add_argument("--preset", type=_preset_name, help="a model family preset (see `lmlab presets`)")
    sp.add_argument("--scale", choices=["tiny", "real"], help="preset scale (default tiny)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a model or train field")
    sp.add_argument(
        "--data", type=_path, help="a prepared data folder (default: data/shakespeare-bpe4096, prepared on first use)"
    )
    sp.add_argument("--out", type=_path, required=True, help="run folder to create")
    sp.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.add_argument("--threads", type=threads_count, help=THREADS_HELP)
    sp.set_defaults(func="train")

    sp = sub.add_parser("eval", help="held-out loss, perplexity and bits-per-byte of a run")
    sp.add_argument("run", type=_path)
    sp.add_argument("--data", type=_path, help="prepared data folder (default: the run's)")
    sp.add_argument("--split", choices=["val", "train"], help="the split scored (default val)")
    sp.add_argument("--stride", type=POSITIVE, help="new tokens scored per window (default context_length)")
    sp.add_argument("--batch-size", type=POSITIVE, default=16)
    sp.add_argument("--device", default="auto")
    sp.add_argument("--dtype", choices=["fp32", "bf16", "auto"], help="autocast dtype (default fp32)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument(
        "--tasks",
        help="comma-separated lm-evaluation-harness tasks (the eval extra) instead of "
        "bits-per-byte, e.g. hellaswag,arc_easy",
    )
    sp.add_argument("--include-path", type=_path, help="with --tasks: a folder of task YAMLs of your own")
    sp.add_argument("--num-fewshot", type=NON_NEGATIVE, help="with --tasks: few-shot examples per prompt")
    sp.add_argument("--limit", type=POSITIVE, help="with --tasks: at most this many documents per task")
    sp.add_argument("--threads", type=threads_count, help=THREADS_HELP)
    sp.set_defaults(func="eval")

    sp = sub.add_parser("generate", help="sample from a run with a KV cache")
    sp.add_argument("run", type=_path)
    sp.add_argument(
        "--prompt",
        action="append",
        help="text to continue (default: start of a document); repeat for a batch of prompts",
    )
    sp.add_argument(
        "--prompt-ids",
        action=_Once,
        metavar="IDS",
        help="token ids to continue, e.g. 1,2,3 (a run without a tokenizer; one prompt); prints the new ids",
    )
    sp.add_argument(
        "--stop", action="append", type=_stop_text, metavar="TEXT", help="stop before this text (repeatable)"
    )
    sp.add_argument(
        "--max-new-tokens",
        type=POSITIVE,
        default=200,
        help="tokens to generate (default 200); one prompt goes on past the model's context_length (the "
        "window slides: the last half of the text is encoded again); several prompts must fit in it",
    )
    sp.add_argument("--temperature", type=_float_in(0, float("inf")), default=0.8, help="0 = greedy")
    sp.add_argument("--top-k", type=POSITIVE)
    sp.add_argument("--top-p", type=_float_in(0, 1, low_open=True))
    sp.add_argument("--seed", type=_int_range(0, 2**63 - 1))
    sp.add_argument("--stop-at-eot", action="store_true", help="stop at the end-of-text token")
    sp.add_argument(
        "--raw",
        action="store_true",
        help="write the prompt and the text as they are; by default control characters (ESC, the "
        "other C0 but newline and tab, C1) and a prompt's invalid bytes are written as \\xNN",
    )
    sp.add_argument("--prompt-after-eot", action="store_true", help="prefix the prompt with <|endoftext|>")
    sp.add_argument(
        "--logprobs", action="store_true", help="after the text, each new token's id, log-probability (nats) and text"
    )
    sp.add_argument(
        "--compile",
        action="store_true",
        help="decode through a compiled step (torch.compile over a preallocated cache): 4-15 s to compile once per "
        "process, then less time per token at batch 1 (not at batch 8); pays only past thousands of tokens in one "
        "process (docs/usage.md)",
    )
    sp.add_argument("--device", default="auto")
    sp.add_argument(
        "--threads",
        type=threads_count,
        help="torch CPU threads (default: with one prompt, one per 200M "
        "weights of the model, so 1 for small models; else the physical cores, at most OMP_NUM_THREADS)",
    )
    sp.set_defaults(func="generate")

    sp = sub.add_parser("plot", help="PNG plots of runs: loss vs step, tokens and wall time; the LR schedule")
    sp.add_argument("runs", nargs="+", type=_path, help="run folders")
    sp.add_argument("--out", type=_path, default="plots", help="output folder (default ./plots)")
    sp.set_defaults(func="plot")

    sp = sub.add_parser("sweep", help="run an ablation spec: every variant x seed trained, evaluated, recorded")
    sp.add_argument("spec", nargs="?", type=_path, help="a sweep spec YAML file or a shipped spec name (see --list)")
    sp.add_argument(
        "--out",
        type=_path,
        help="sweep folder (default sweeps/NAME, NAME with -TIER, -DTYPE and -compiled as --tier, --dtype and "
        "--compile change the spec); an existing one is resumed",
    )
    sp.add_argument("--jobs", type=POSITIVE, default=1, help="runs trained at once, each with cores // jobs threads")
    sp.add_argument("--dry-run", action="store_true", help="print the runs, steps, tokens and FLOPs; train nothing")
    sp.add_argument("--list", action="store_true", help="list the shipped specs and their claims")
    sp.add_argument(
        "--max-runs",
        type=POSITIVE,
        default=None,
        help="the most runs the spec may plan (default: its 'max_runs:', else 10,000); counted "
        "before anything is planned",
    )
    sp.add_argument(
        "--data",
        type=_path,
        help="a prepared data folder (`lmlab prepare --out`) for every run, over the spec's "
        "'data:' (default: the spec's, else the default corpus)",
    )
    sp.add_argument(
        "--tier",
        help="run the spec at one of its tiers (e.g. gpu: 20-100M parameters on one GPU); "
        "default: the spec as written (CPU-sized)",
    )
    sp.add_argument(
        "--dtype",
        choices=["fp32", "bf16", "auto"],
        help="train every run in this precision instead of the spec's (a sweep NAME-DTYPE of its own; bf16 "
        "autocast: about 1.3x the runs per hour on a CPU with native bf16; with --compile 1.7x, "
        "docs/bench/lab_throughput.md)",
    )
    sp.add_argument(
        "--compile",
        action="store_true",
        help="compile every run (a sweep NAME-compiled of its own); on Linux the fork server compiles each run "
        "shape once for all its one-thread runs",
    )
    sp.add_argument(
        "--executor",
        choices=["local", "slurm", "submitit-local", "ray"],
        default="local",
        help="where runs train: local (--jobs at once, default), slurm (job arrays through submitit; "
        "needs lmlab[slurm]), submitit-local (submitit's local executor, --jobs jobs at once) "
        "or ray (tasks on a Ray cluster, --address; needs lmlab[ray])",
    )
    sp.add_argument(
        "--runs-per-task",
        "--runs-per-gpu",
        dest="runs_per_task",
        type=POSITIVE,
        default=1,
        help="runs each Slurm/submitit task trains at once (sharing its CPUs, or its GPU)",
    )
    sp.add_argument("--slurm-partition", help="Slurm partition of the runs' jobs")
    sp.add_argument(
        "--time",
        type=POSITIVE,
        help="each job's time limit in minutes (default 1440); near it the job checkpoints and is requeued",
    )
    sp.add_argument("--cpus-per-task", type=POSITIVE, help="CPUs of each Slurm task")
    sp.add_argument(
        "--gpus-per-task",
        type=float,
        help="GPUs of each task (Slurm: whole GPUs of its node; "
        "Ray: fractions too, e.g. 0.25 for four tasks on one GPU)",
    )
    sp.add_argument(
        "--address",
        help="the Ray cluster (ray://HOST:10001, HOST:6379 or auto); local (the "
        "default): a Ray started here with --jobs tasks at once",
    )
    sp.add_argument(
        "--max-retries",
        type=int,
        help="Ray: times a task is retried when its worker or node dies "
        "(default 3, -1 unlimited; the run continues from its checkpoint)",
    )
    sp.add_argument("--array-parallelism", type=POSITIVE, help="Slurm array tasks running at once")
    sp.add_argument(
        "--executor-config",
        type=_path,
        metavar="FILE.yaml",
        help="other submitit parameters, a YAML mapping (e.g. slurm_account, mem_gb, "
        "slurm_additional_parameters); the flags above take precedence",
    )
    sp.set_defaults(func="sweep")

    sp = sub.add_parser(
        "sweep-worker",
        help="train, evaluate and record planned runs of a sweep (what each "
        "Slurm/submitit job runs; reproduces a failed run)",
    )
    sp.add_argument("sweep", type=_path, help="the sweep folder (`lmlab sweep --out`)")
    sp.add_argument("runs", nargs="+", help="run names (its plans/RUN.json); several train at once")
    sp.add_argument("--threads", type=threads_count, default=1, help="torch threads per run (default 1)")
    sp.set_defaults(func="sweep-worker")

    sp = sub.add_parser("report", help="markdown report of a sweep (verdicts, plots, results.csv), or an index")
    sp.add_argument("sweep", nargs="?", type=_path, help="a sweep folder (`lmlab sweep --out`)")
    sp.add_argument("--out", type=_path, help="the markdown file (default SWEEP/report.md; plots and CSV beside it)")
    sp.add_argument(
        "--index",
        nargs="+",
        type=_path,
        metavar="DIR",
        help="write one index page of every claim of these sweep folders (needs --out)",
    )
    sp.add_argument(
        "--readme",
        type=_path,
        metavar="FILE.md",
        action="append",
        help="with --index: also rewrite the summary table (lmlab:ablation-summary markers) and/or the "
        "counts line (lmlab:ablation-counts) in FILE.md; may be given more than once",
    )
    sp.set_defaults(func="report")

    sp = sub.add_parser("import", help="convert a Hugging Face model folder into a new run folder")
    sp.add_argument(
        "path", type=_path, help="HF model folder: config.json + model.safetensors (or shards, or pytorch_model.bin)"
    )
    sp.add_argument("--out", type=_path, required=True, help="run folder to create")
    _weights_dtype(
        sp,
        "the stored weights (default auto: the HF checkpoint's, bf16 when all its floating tensors "
        "are bf16, else fp32)",
    )
    sp.set_defaults(func="import")

    sp = sub.add_parser("export", help="write a run's checkpoint as a Hugging Face model folder")
    sp.add_argument("run", type=_path)
    sp.add_argument("--format", choices=["hf"], default="hf")
    sp.add_argument("--out", type=_path, required=True, help="folder to create (config.json, model.safetensors)")
    sp.add_argument("--family", help="HF model_type to write (default: the imported one, else the first that fits)")
    sp.add_argument("--step", type=NON_NEGATIVE, help="checkpoint step (default: the latest)")
    _weights_dtype(
        sp,
        "the written weights (default auto: the checkpoint's, so a run imported in bf16 exports "
        "bf16 and a run lmlab trained exports fp32)",
    )
    sp.set_defaults(func="export")

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
    sp.set_defaults(func="analyze")

    sp = sub.add_parser("survey", help="the lecture's cross-model table over all presets")
    sp.add_argument("--format", choices=["table", "markdown", "csv"], default="table")
    sp.set_defaults(func="survey")

    sp = sub.add_parser("bench", help="benchmarks: `lmlab bench train`, `lmlab bench decode`, `lmlab bench calibrate`")
    bench = sp.add_subparsers(dest="bench", required=True)
    bp = bench.add_parser(
        "train",
        help="training tokens/s of lmlab train's step on this machine, fp32 against bf16 "
        "(and compiled with --compile), alternated",
    )
    bp.add_argument("--config", type=_path, help="YAML file with a 'model:' section, or a built-in name (default demo)")
    bp.add_argument("--preset", type=_preset_name, help="a preset with random weights")
    bp.add_argument("--scale", choices=["tiny", "real"], help="preset scale (default tiny)")
    bp.add_argument("--batch", type=POSITIVE, default=16, help="sequences per step (default 16, the demo's)")
    bp.add_argument(
        "--dtype",
        choices=["fp32", "bf16", "both"],
        default="both",
        help="precisions to time (default both: fp32 eager first, the reference of the ratios)",
    )
    bp.add_argument(
        "--compile",
        action="store_true",
        help="also time each precision compiled (adds each compile: tens of seconds on a CPU)",
    )
    bp.add_argument("--rounds", type=_int_range(2, 100), default=5, help="rounds, 2-100 (default 5)")
    bp.add_argument("--steps", type=_int_range(1, 1000), default=2, help="steps per variant per round (default 2)")
    bp.add_argument("--device", default="cpu")
    bp.add_argument("--threads", type=threads_count, help=THREADS_HELP)
    bp.add_argument("--json", action="store_true", help="print one JSON object")
    bp.set_defaults(func="bench train", command="bench train")
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
    bp.add_argument(
        "--compile",
        action="store_true",
        help="time the compiled decode step (as generate --compile); the first call compiles",
    )
    bp.add_argument("--threads", type=threads_count, help=THREADS_HELP)
    bp.add_argument("--json", action="store_true", help="print one JSON object")
    bp.set_defaults(func="bench decode", command="bench decode")
    bp = bench.add_parser(
        "calibrate",
        help="measure which CPU kernels are faster on this machine and cache the choices: training (fp32 "
        "linears on oneDNN or MKL, blocked or SDPA attention) and decoding (the weight layout, fused "
        "reductions in the compiled step, one thread or every core for one prompt)",
    )
    bp.add_argument(
        "--rounds",
        type=_int_range(3, 100),
        default=7,
        help="interleaved rounds per cell, 3-100 (default 7: about two minutes on 2 cores)",
    )
    bp.add_argument("--out", type=_path, help="write the calibration here instead of this machine's cache file")
    bp.add_argument("--json", action="store_true", help="print the calibration record as JSON")
    bp.add_argument(
        "--if-missing",
        action="store_true",
        help="measure only when this machine has no valid calibration of every decision (make ablations; with "
        "--training-only, of the training decisions: make demo)",
    )
    bp.add_argument(
        "--training-only",
        action="store_true",
        help="measure the training kernels only (seconds; the decode decisions compile a dozen decode steps, "
        "minutes): the file then has no decode choices, and decoding keeps torch's defaults until a full run",
    )
    bp.set_defaults(func="bench calibrate", command="bench calibrate")

    sp = sub.add_parser(
        "coordcheck",
        help="coordinate check of a parametrization (sp | mup | completep): "
        "activation sizes across widths after a few AdamW steps",
    )
    sp.add_argument("--config", type=_path, help="YAML file with 'model:' and 'train:' sections, or a built-in name")
    sp.add_argument("--preset", type=_preset_name, help="a model family preset (see `lmlab presets`)")
    sp.add_argument("--scale", choices=["tiny", "real"], help="preset scale (default tiny)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a model or train field")
    sp.add_argument(
        "--parametrization",
        choices=["sp", "mup", "completep"],
        help="the parametrization checked (default: the config's; sp)",
    )
    sp.add_argument(
        "--widths",
        type=_int_list,
        default=None,
        help="d_model values, comma-separated, each a multiple of n_heads (default 64,128,256)",
    )
    sp.add_argument(
        "--depths",
        type=_int_list,
        default=None,
        help="check over depth instead: n_layers values, comma-separated, at the config's d_model "
        "(CompleteP's claim; e.g. 2,4,8,16)",
    )
    sp.add_argument(
        "--base-depth", type=POSITIVE, help="completep over --depths: base_n_layers (default: the smallest depth)"
    )
    sp.add_argument(
        "--base-width",
        type=POSITIVE,
        help="mup / completep: base_d_model (default: the config's, else the smallest width)",
    )
    sp.add_argument("--steps", type=POSITIVE, default=4, help="AdamW steps per width (default 4)")
    sp.add_argument("--seeds", type=_int_list, default=[1], help="seeds, comma-separated, averaged (default 1)")
    sp.add_argument(
        "--lr",
        type=_float_in(0, float("inf"), low_open=True, high_open=True),
        help="constant learning rate (default: the config's lr; 0.005 for the built-in model)",
    )
    sp.add_argument("--batch-size", type=POSITIVE, help="sequences per step (default: the config's; 8)")
    sp.add_argument(
        "--data",
        type=_path,
        metavar="DIR|random",
        help="a prepared data folder, or 'random' for random token ids (Zipf-distributed: a unigram to "
        "learn) (default: the default corpus, prepared on first use as `lmlab train` does)",
    )
    sp.add_argument(
        "--threshold",
        type=_float_in(0, float("inf"), low_open=True, high_open=True),
        default=0.25,
        help="the check passes when every layer's |slope| of log(mean |x|) against log(width) is "
        "below this at the last step (default 0.25)",
    )
    sp.add_argument("--check", action="store_true", help="exit 1 when the check fails (default: exit 0 either way)")
    sp.add_argument("--out", type=_path, help="also write the figure to this PNG file (matplotlib)")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--threads", type=threads_count, help=THREADS_HELP)
    sp.set_defaults(func="coordcheck")

    sp = sub.add_parser("presets", help="list the model family presets")
    sp.set_defaults(func="presets")
    return p
