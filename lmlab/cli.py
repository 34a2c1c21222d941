"""The ``lmlab`` command line: prepare, train, eval, generate, presets.

Every error a user can cause (bad config, missing data, wrong checkpoint, ...) ends in one line
``lmlab <command>: error: <what, where, what to do>`` and exit status 2; nothing is overwritten.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmlab.config import ConfigError

DEFAULT_DATA = Path("data")
BUILTIN_CONFIGS = Path(__file__).parent / "configs"


def _default_data_dir(tokenizer: str, vocab_size: int) -> Path:
    return DEFAULT_DATA / (f"shakespeare-bpe{vocab_size}" if tokenizer == "bpe" else "shakespeare-bytes")


# --- prepare -------------------------------------------------------------------------------
def cmd_prepare(args) -> int:
    from lmlab.data.corpus import VALIDATION_WORKS, default_corpus_dir
    from lmlab.data.prepare import prepare

    if args.data is None:
        source = default_corpus_dir()
        val_docs = list(VALIDATION_WORKS) if args.val_docs is None else args.val_docs.split(",")
    else:
        source = Path(args.data)
        val_docs = args.val_docs.split(",") if args.val_docs else None
    out = Path(args.out) if args.out else _default_data_dir(args.tokenizer, args.vocab_size)
    manifest = prepare(source, out, args.tokenizer, args.vocab_size, val_docs, args.val_fraction, args.overwrite)
    for split, info in manifest["splits"].items():
        print(f"{split}: {len(info['documents'])} documents, {info['bytes']:,} bytes, {info['tokens']:,} tokens "
              f"({info['bytes'] / max(info['tokens'], 1):.2f} bytes/token)")
    print(f"wrote {out} (tokenizer {manifest['tokenizer']['type']}, vocab {manifest['tokenizer']['vocab_size']})")
    return 0


def ensure_default_data(data: str | None) -> Path:
    """The prepared data folder to train on: ``data`` if given, else the default corpus with BPE 4096,
    prepared on first use."""
    if data is not None:
        return Path(data)
    folder = _default_data_dir("bpe", 4096)
    if not (folder / "manifest.json").is_file():
        ns = argparse.Namespace(data=None, val_docs=None, out=str(folder), tokenizer="bpe", vocab_size=4096,
                                val_fraction=0.1, overwrite=False)
        cmd_prepare(ns)
    return folder


# --- train ---------------------------------------------------------------------------------
def build_configs(args, data_vocab: int | None):
    """ModelConfig and TrainConfig from --config / --preset and --set overrides."""
    from lmlab.config import ModelConfig, apply_overrides, check_keys, load_mapping
    from lmlab.train import TrainConfig

    model: dict = {}
    train: dict = {}
    if args.config:
        path = Path(args.config)
        if not path.exists() and (BUILTIN_CONFIGS / f"{args.config}.yaml").exists():
            path = BUILTIN_CONFIGS / f"{args.config}.yaml"
        spec = load_mapping(path)
        check_keys_section = {k: v for k, v in spec.items() if k not in ("model", "train")}
        if check_keys_section:
            raise ConfigError(f"config file {str(path)!r}: unknown section(s) {sorted(check_keys_section)}; "
                              f"use 'model:' and 'train:'")
        model = dict(spec.get("model") or {})
        train = dict(spec.get("train") or {})
        check_keys(ModelConfig, model, f"{path} model")
        check_keys(TrainConfig, train, f"{path} train")
    explicit_vocab = "vocab_size" in model or any(i.partition("=")[0].strip() == "vocab_size" for i in args.set or [])
    if args.preset:
        from lmlab.presets import get_preset

        preset = get_preset(args.preset)
        base = dict(preset.real)
        if args.scale == "tiny":
            base.update(preset.tiny)
        model = {**base, **model}
    model_keys = {f for f in ModelConfig.__dataclass_fields__}
    train_keys = {f for f in TrainConfig.__dataclass_fields__}
    m_over, t_over = [], []
    for item in args.set or []:
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
    if not explicit_vocab and data_vocab is not None:  # the data's tokenizer decides, not the preset
        model["vocab_size"] = data_vocab
    return ModelConfig.from_dict(model, "model config"), TrainConfig.from_dict(train, "train config")


def cmd_train(args) -> int:
    from lmlab.data.prepare import TokenData
    from lmlab.train import Trainer

    out = Path(args.out)
    if args.resume and (out / "run.yaml").exists():
        if args.config or args.preset or args.set:
            from lmlab.checkpoint import read_run

            data_vocab = read_run(out)["model"]["vocab_size"]
            cfg, tc = build_configs(args, data_vocab)
        else:
            cfg, tc = None, None
        trainer = Trainer.resume(out, cfg, tc, progress=not args.no_progress)
    else:
        data_dir = ensure_default_data(args.data)
        data = TokenData(data_dir)
        cfg, tc = build_configs(args, data.vocab_size)
        trainer = Trainer.create(out, cfg, tc, data_dir, progress=not args.no_progress)
    n = trainer.model.num_params()
    print(f"model: {n:,} parameters ({trainer.model.num_params(non_embedding=True):,} non-embedding), "
          f"device {trainer.device}, dtype {trainer.amp_dtype or 'fp32'}; run folder {out}", file=sys.stderr)
    val = trainer.fit()
    if val:
        print(f"done: step {trainer.step}, val loss {val['loss']:.4f} (partial estimate); run `lmlab eval {out}`")
    return 0


# --- eval ----------------------------------------------------------------------------------
def cmd_eval(args) -> int:
    from lmlab.checkpoint import load_run
    from lmlab.data.prepare import DataError, TokenData
    from lmlab.evaluate import evaluate
    from lmlab.train import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    model, cfg, tok, run, ckpt = load_run(args.run, device=str(device))
    data = TokenData(args.data or run["data"])
    if data.tokenizer.vocab_size != cfg.vocab_size or (Path(args.run) / "tokenizer.json").read_bytes() != \
            (data.folder / "tokenizer.json").read_bytes():
        raise DataError(f"data {str(data.folder)!r} was tokenised with another tokenizer than run {args.run!r}; "
                        f"evaluate on the run's own data folder or re-prepare with its tokenizer")
    res = evaluate(model, data.tokens(args.split), data.bytes(args.split), batch_size=args.batch_size,
                   stride=args.stride, device=device, autocast_dtype=resolve_dtype(args.dtype, device))
    res.update(checkpoint=str(ckpt), split=args.split, data=str(data.folder), stride=args.stride or cfg.context_length)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{args.split} of {data.folder} ({res['tokens']:,} tokens, {res['bytes']:,} bytes), checkpoint {ckpt.name}:")
        print(f"  loss            {res['loss']:.4f} nats/token")
        print(f"  perplexity      {res['perplexity']:.2f}")
        print(f"  bits-per-byte   {res['bits_per_byte']:.4f}")
    return 0


# --- generate ------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    from lmlab.checkpoint import load_run
    from lmlab.generate import generate
    from lmlab.train import resolve_device

    device = resolve_device(args.device)
    model, cfg, tok, _, _ = load_run(args.run, device=str(device))
    prompt = tok.encode(args.prompt) if args.prompt else []
    if not prompt or args.prompt_after_eot:
        prompt = [tok.eot_id] + prompt
    sys.stdout.write(args.prompt)
    pending = b""
    for i in generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                      eos_id=tok.eot_id if args.stop_at_eot else None, device=device):
        pending += tok.token_bytes(i)
        text = pending.decode("utf-8", errors="ignore")
        try:  # hold back an incomplete UTF-8 sequence until its continuation arrives
            pending.decode("utf-8")
            pending = b""
        except UnicodeDecodeError:
            continue
        sys.stdout.write(text)
        sys.stdout.flush()
    if pending:
        sys.stdout.write(pending.decode("utf-8", errors="replace"))
    sys.stdout.write("\n")
    return 0


def cmd_presets(args) -> int:
    from lmlab.presets import format_presets

    print(format_presets())
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lmlab", description="A language-model architecture lab.")
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("prepare", help="tokenise a corpus into shards + manifest")
    sp.add_argument("--data", help="a .txt file or a folder of .txt documents (default: the Shakespeare corpus)")
    sp.add_argument("--out", help="output folder (default data/shakespeare-bpe<V> or data/shakespeare-bytes)")
    sp.add_argument("--tokenizer", choices=["bpe", "bytes"], default="bpe")
    sp.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size incl. <|endoftext|>")
    sp.add_argument("--val-docs", help="comma-separated document names held out for validation "
                                       "(default corpus: hamlet, sonnets, tempest)")
    sp.add_argument("--val-fraction", type=float, default=0.1, help="fraction of documents held out otherwise")
    sp.add_argument("--overwrite", action="store_true")
    sp.set_defaults(func=cmd_prepare)

    sp = sub.add_parser("train", help="train a model from scratch (or --resume a run)")
    sp.add_argument("--config", help="YAML file with 'model:' and 'train:' sections, or a built-in name (demo)")
    sp.add_argument("--preset", help="a model family preset (see `lmlab presets`)")
    sp.add_argument("--scale", choices=["tiny", "real"], default="tiny", help="preset scale (default tiny)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a model or train field")
    sp.add_argument("--data", help="a prepared data folder (default: data/shakespeare-bpe4096, prepared on first use)")
    sp.add_argument("--out", required=True, help="run folder to create")
    sp.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.set_defaults(func=cmd_train)

    sp = sub.add_parser("eval", help="held-out loss, perplexity and bits-per-byte of a run")
    sp.add_argument("run")
    sp.add_argument("--data", help="prepared data folder (default: the run's)")
    sp.add_argument("--split", default="val", choices=["val", "train"])
    sp.add_argument("--stride", type=int, help="new tokens scored per window (default context_length)")
    sp.add_argument("--batch-size", type=int, default=16)
    sp.add_argument("--device", default="auto")
    sp.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "auto"])
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_eval)

    sp = sub.add_parser("generate", help="sample from a run with a KV cache")
    sp.add_argument("run")
    sp.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    sp.add_argument("--max-new-tokens", type=int, default=200)
    sp.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    sp.add_argument("--top-k", type=int)
    sp.add_argument("--top-p", type=float)
    sp.add_argument("--seed", type=int)
    sp.add_argument("--stop-at-eot", action="store_true", help="stop at the end-of-text token")
    sp.add_argument("--prompt-after-eot", action="store_true", help="prefix the prompt with <|endoftext|>")
    sp.add_argument("--device", default="auto")
    sp.set_defaults(func=cmd_generate)

    sp = sub.add_parser("presets", help="list the model family presets")
    sp.set_defaults(func=cmd_presets)
    return p


def main(argv=None) -> int:
    from lmlab.checkpoint import CheckpointError
    from lmlab.data.corpus import CorpusError
    from lmlab.data.prepare import DataError
    from lmlab.data.tokenizer import TokenizerError

    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, DataError, CheckpointError, CorpusError, TokenizerError, ValueError, FloatingPointError) as exc:
        print(f"lmlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lmlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
