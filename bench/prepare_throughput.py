"""`lmlab prepare` throughput and peak memory on a synthetic JSON-lines corpus, beside the floor: the
HF tokenizers library's own ``encode_batch`` on the same documents with the same tokenizer.

    python bench/prepare_throughput.py --mb 100 --repeats 3 --single --workdir DIR
    python bench/prepare_throughput.py --mb 1000 --repeats 1 --tokenizer DIR/bpe/tokenizer.json --workdir DIR

For each size: the corpus is written once (documents of about 4 kB: words drawn from a Zipf law over a
synthetic 30,000-word vocabulary, lines and punctuation; each document made distinct by its number), a
byte-level BPE of 8,192 tokens is trained once by `lmlab prepare` on the smallest corpus (its time is
reported: BPE training is part of a first prepare), and then, alternated ``repeats`` times:
- floor: the documents (read beforehand, not timed) encoded by ``Tokenizer.encode_batch`` in chunks of
  4,096 documents (one call on 1 GB would hold every Encoding), in this process;
- lmlab: ``lmlab prepare --data corpus.jsonl --tokenizer-file tokenizer.json`` in a fresh process (all
  of it: JSON parsing, the split-hash pass, encoding, writing the shards and the manifest), its peak
  RSS sampled from /proc every millisecond.
Reported: MB/s of UTF-8 text (10^6 bytes), the paired ratio lmlab / floor per round and its median,
peak RSS. Both use every core (the tokenizers library's Rayon pool); the machine, cores and load
average are printed. Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUN_PREPARE = """
import sys, threading, time
from lmlab.cli import main

def rss_kib():
    return int(open("/proc/self/statm").read().split()[1]) * 4

peak, done = [rss_kib()], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss_kib())
        time.sleep(0.001)

t = threading.Thread(target=sample, daemon=True)
t.start()
t0 = time.perf_counter()
rc = main(sys.argv[1:])
wall = time.perf_counter() - t0
done.set()
t.join()
print("RESULT", rc, wall, peak[0])
"""


def write_corpus(path: Path, mb: int, seed: int = 0) -> int:
    """A JSON-lines file of about ``mb`` MB of text; returns its number of documents."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1.0 / np.arange(1, 27)
    vocab = ["".join(rng.choice(letters, size=rng.integers(1, 11), p=weights / weights.sum())) for _ in range(30_000)]
    zipf = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    zipf /= zipf.sum()
    pool = []
    for _ in range(2_000):  # distinct bodies, reused with a distinct number each
        words = rng.choice(len(vocab), size=int(rng.integers(300, 1_000)), p=zipf)
        text, lines = [], []
        for k, w in enumerate(words):
            lines.append(vocab[w])
            if k % 12 == 11:
                text.append(" ".join(lines) + rng.choice([".", ",", ";", "!", "?"]))
                lines = []
        pool.append("\n".join(text) + " " + " ".join(lines))
    n, size = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < mb * 1_000_000:
            doc = f"Document {n}.\n{pool[n % len(pool)]}"
            f.write(json.dumps({"id": n, "text": doc}) + "\n")
            size += len(doc.encode())
            n += 1
    return n


def read_texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def floor_seconds(tok_path: Path, texts: list[str], chunk: int = 4_096) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    t0 = time.perf_counter()
    for i in range(0, len(texts), chunk):
        tok.encode_batch(texts[i : i + chunk])
    return time.perf_counter() - t0


def lmlab_prepare(args: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS KiB, stdout) of `lmlab prepare ARGS` in a fresh process."""
    run = subprocess.run(
        [sys.executable, "-c", RUN_PREPARE, "prepare", *args, "--no-progress"], capture_output=True, text=True, cwd=ROOT
    )
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT")), None)
    if run.returncode or line is None or line.split()[1] != "0":
        sys.exit(f"lmlab prepare failed:\n{run.stdout}\n{run.stderr}")
    _, _, wall, peak = line.split()
    return float(wall), int(peak), run.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, nargs="+", default=[100, 1000], help="corpus sizes in MB of text")
    p.add_argument("--repeats", type=int, nargs="+", default=[3, 1], help="rounds per size")
    p.add_argument("--workdir", help="where the corpora go (default: a temporary folder, removed)")
    p.add_argument("--tokenizer", help="a tokenizer.json to use (default: train BPE 8192 on the first corpus)")
    p.add_argument(
        "--single",
        action="store_true",
        help="also time the one-thread encoder (Tokenizer.encode per document), one round",
    )
    p.add_argument("--out", help="also write the table (markdown) here")
    args = p.parse_args()
    from lmlab.bench import describe_machine

    repeats = (args.repeats + [args.repeats[-1]] * len(args.mb))[: len(args.mb)]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="lmlab-prepare-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = [
        f"machine: {describe_machine()}; RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', 'unset')}; "
        f"load average before {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    ]
    print(lines[0], flush=True)
    rows = []
    tok_path = Path(args.tokenizer) if args.tokenizer else None
    try:
        for mb, reps in zip(args.mb, repeats):
            corpus = work / f"corpus-{mb}mb.jsonl"
            t0 = time.perf_counter()
            n_docs = write_corpus(corpus, mb)
            print(f"{mb} MB: {n_docs:,} documents written in {time.perf_counter() - t0:.0f} s", flush=True)
            if tok_path is None:  # the first prepare trains the tokenizer: timed, reported
                wall, peak, out = lmlab_prepare(
                    ["--data", str(corpus), "--out", str(work / "bpe"), "--vocab-size", "8192"]
                )
                tok_path = work / "bpe" / "tokenizer.json"
                rows.append(
                    {
                        "mb": mb,
                        "what": "lmlab prepare, training BPE 8192",
                        "mbps": [mb / wall],
                        "peak": [peak],
                        "ratio": [],
                    }
                )
                print(f"  BPE training prepare: {wall:.1f} s, peak {peak / 1024:.0f} MiB\n  {out.strip()}", flush=True)
            texts = read_texts(corpus)
            if args.single:
                from tokenizers import Tokenizer

                one = Tokenizer.from_file(str(tok_path))
                t0 = time.perf_counter()
                for text in texts:
                    one.encode(text)
                single = mb / (time.perf_counter() - t0)
                rows.append(
                    {
                        "mb": mb,
                        "what": "tokenizers encode, one document at a time (one thread)",
                        "mbps": [single],
                        "peak": [],
                        "ratio": [],
                    }
                )
                print(f"  one-thread encode: {single:.1f} MB/s", flush=True)
            floor, ours, peaks, ratio = [], [], [], []
            for r in range(reps):
                f = mb / floor_seconds(tok_path, texts)
                out_dir = work / "out"
                shutil.rmtree(out_dir, ignore_errors=True)
                wall, peak, _ = lmlab_prepare(
                    ["--data", str(corpus), "--out", str(out_dir), "--tokenizer-file", str(tok_path)]
                )
                floor.append(f)
                ours.append(mb / wall)
                peaks.append(peak)
                ratio.append(ours[-1] / f)
                print(
                    f"  round {r + 1}: floor {f:.1f} MB/s, lmlab {ours[-1]:.1f} MB/s ({ratio[-1]:.2f}x), "
                    f"peak {peak / 1024:.0f} MiB",
                    flush=True,
                )
            del texts
            rows.append({"mb": mb, "what": "tokenizers encode_batch (floor)", "mbps": floor, "peak": [], "ratio": []})
            rows.append(
                {"mb": mb, "what": "lmlab prepare --tokenizer-file", "mbps": ours, "peak": peaks, "ratio": ratio}
            )
            corpus.unlink()
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    lines.append(f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    table = [
        "| corpus | what | MB/s (median of rounds) | lmlab / floor (median of paired rounds) | peak RSS |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        ratio = f"{statistics.median(row['ratio']):.2f}x ({len(row['ratio'])} rounds)" if row["ratio"] else ""
        peak = f"{max(row['peak']) / 1024:.0f} MiB" if row["peak"] else ""
        table.append(f"| {row['mb']:,} MB | {row['what']} | {statistics.median(row['mbps']):.1f} | {ratio} | {peak} |")
    print("\n".join(table))
    print(lines[-1])
    if args.out:
        Path(args.out).write_text(
            "# `lmlab prepare` throughput and memory\n\nMeasured with `python "
            "bench/prepare_throughput.py "
            + " ".join(sys.argv[1:])
            + "`.\n\n"
            + "\n\n".join([lines[0], "\n".join(table), lines[-1]])
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
