"""`lmlab train` with no compile or dtype setting against a plain eager Hugging Face loop (issue 42's bar).

The bar's Llama-style config: d_model 256, 4 layers, 8 heads / 2 KV heads, d_ff 688, context 256,
batch 8, vocab 4096 (the Shakespeare BPE-4096 data folder), ``--steps`` steps (400), ``--threads``
threads (2). Each round runs, as separate processes and in alternating order:
- ``lmlab train --config <bar> --threads N``: its own defaults (dtype=auto, compile=auto); its
  tokens/s over the steps after ``--skip`` (100) from metrics.jsonl (evaluations not counted), and
  what compile=auto chose (run.yaml ``compile``);
- a plain PyTorch loop over ``transformers.LlamaForCausalLM`` (SDPA attention, tied embeddings, the
  same shape and RoPE base), logits then ``F.cross_entropy``, torch's AdamW (foreach) with lmlab's
  hyperparameters, random windows of the same data, in the precision lmlab chose (``dtype=auto``:
  bf16 autocast where this CPU computes bf16 natively), eager, no malloc setting: the loop its users
  write. Its tokens/s over the steps after ``--skip``.
Reported: each round's pair, the median over rounds of lmlab / HF with the range, the machine (CPU
model with family/model, threads, load). Round 1 starts from an empty compile record and an empty
inductor cache (a new machine, unless ``--cache DIR`` keeps them), so it shows a first run; later
rounds show runs on a machine that has run this shape before.

    python bench/default_vs_hf.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = dict(vocab_size=4096, context_length=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688)
BATCH = 8


def lmlab_round(data: str, steps: int, skip: int, threads: int, env: dict, out: Path) -> dict:
    """One `lmlab train` run with the bar's config and nothing else set; its tokens/s after ``skip``."""
    import yaml

    cfg = out.parent / "bar.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": SHAPE,
                "train": {"batch_size": BATCH, "max_steps": steps, "eval_interval": 10 * steps, "log_interval": 20},
            }
        )
    )
    t = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmlab.cli",
            "train",
            "--config",
            str(cfg),
            "--data",
            data,
            "--out",
            str(out),
            "--threads",
            str(threads),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"lmlab train failed:\n{proc.stderr[-3000:]}")
    tokens_per_step = BATCH * SHAPE["context_length"]
    seconds = tokens = 0.0
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "tokens_per_s" in rec and rec["step"] > skip:
            seconds += 20 * tokens_per_step / rec["tokens_per_s"]
            tokens += 20 * tokens_per_step
    run = yaml.safe_load((out / "run.yaml").read_text())
    dtype = next(
        (ln.split("dtype ")[1].split(" ")[0].rstrip(",") for ln in proc.stderr.splitlines() if ln.startswith("model:")),
        "?",
    )
    return {
        "tokens_per_s": tokens / seconds,
        "compile": run.get("compile", {}).get("choice"),
        "wall_s": wall,
        "dtype": dtype,
        "reason": run.get("compile", {}).get("reason"),
    }


def hf_child(data: str, steps: int, skip: int, threads: int, dtype: str) -> None:
    """The plain HF loop (run as a child process); prints its tokens/s after ``skip`` as JSON."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmlab.data.shards import TokenData

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=SHAPE["vocab_size"],
        hidden_size=SHAPE["d_model"],
        intermediate_size=SHAPE["d_ff"],
        num_hidden_layers=SHAPE["n_layers"],
        num_attention_heads=SHAPE["n_heads"],
        num_key_value_heads=SHAPE["n_kv_heads"],
        max_position_embeddings=SHAPE["context_length"],
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    tokens = TokenData(data).tokens("train")
    T, rng = SHAPE["context_length"], np.random.default_rng(0)
    amp = torch.bfloat16 if dtype == "bf16" else None
    times = []
    for _ in range(steps):
        starts = rng.integers(0, len(tokens) - T - 1, BATCH)
        w = torch.from_numpy(np.stack([np.asarray(tokens[s : s + T + 1], dtype=np.int64) for s in starts]))
        x, y = w[:, :-1], w[:, 1:]
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    print(json.dumps({"tokens_per_s": (steps - skip) * BATCH * T / sum(times[skip:])}))


def hf_round(data: str, steps: int, skip: int, threads: int, dtype: str) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--hf-child",
            dtype,
            "--data",
            data,
            "--steps",
            str(steps),
            "--skip",
            str(skip),
            "--threads",
            str(threads),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode:
        raise SystemExit(f"HF loop failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data",
        default=str(ROOT / "data" / "shakespeare-bpe4096"),
        help="a data folder with a 4096-token tokenizer (`lmlab prepare --vocab-size 4096`)",
    )
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--skip", type=int, default=100, help="steps not timed (compile, warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", help="LMLAB_CACHE and inductor cache folder to use (default: a new empty one)")
    ap.add_argument("--hf-child", choices=["fp32", "bf16"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.steps <= a.skip or a.skip < 0 or a.threads < 1 or a.rounds < 1:
        ap.error("need --steps > --skip >= 0, --threads >= 1, --rounds >= 1")
    if not (Path(a.data) / "tokenizer.json").is_file():
        ap.error(f"--data {a.data!r} is not a data folder; make it with `lmlab prepare --vocab-size 4096`")
    if a.hf_child:
        hf_child(a.data, a.steps, a.skip, a.threads, a.hf_child)
        return
    from lmlab.bench import describe_machine

    print(f"machine: {describe_machine()}; threads {a.threads}; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(a.cache) if a.cache else Path(tmp) / "cache"
        env = dict(
            os.environ, LMLAB_CACHE=str(cache), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), PYTHONWARNINGS="ignore"
        )
        ratios = []
        for r in range(a.rounds):
            runs = {}
            order = ("lmlab", "hf") if r % 2 == 0 else ("hf", "lmlab")
            for system in order:
                if system == "lmlab":
                    runs["lmlab"] = lmlab_round(a.data, a.steps, a.skip, a.threads, env, Path(tmp) / f"run{r}")
                else:
                    dtype = runs["lmlab"]["dtype"] if "lmlab" in runs else None
                    if dtype is None:  # HF first: the precision lmlab's dtype=auto picks here
                        import torch

                        from lmlab.devices import resolve_dtype

                        dtype = "bf16" if resolve_dtype("auto", torch.device("cpu")) else "fp32"
                    runs["hf"] = hf_round(a.data, a.steps, a.skip, a.threads, dtype)
                    runs["hf"]["dtype"] = dtype
            ratio = runs["lmlab"]["tokens_per_s"] / runs["hf"]["tokens_per_s"]
            ratios.append(ratio)
            print(
                f"round {r + 1}: lmlab train {runs['lmlab']['tokens_per_s']:,.0f} tokens/s (dtype "
                f"{runs['lmlab']['dtype']}, compile {runs['lmlab']['compile']}, {runs['lmlab']['wall_s']:.0f} s "
                f"wall), HF eager {runs['hf']['dtype']} {runs['hf']['tokens_per_s']:,.0f} tokens/s: {ratio:.2f}x"
                f"\n  compile auto's reason: {runs['lmlab']['reason']}",
                flush=True,
            )
    print(
        f"lmlab train (defaults) / plain eager HF loop, steps {a.skip + 1}-{a.steps}: median "
        f"{statistics.median(ratios):.2f}x over {a.rounds} rounds (range {min(ratios):.2f}-{max(ratios):.2f})"
    )
    print(f"machine: {describe_machine()}; threads {a.threads}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
