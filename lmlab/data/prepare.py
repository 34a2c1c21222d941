"""``lmlab prepare``: documents -> tokenizer + token shards + manifest.

Output folder:
- ``tokenizer.json``: the trained byte-level BPE (HF ``tokenizers``) or the raw-bytes marker;
- ``train.bin`` / ``val.bin``: flat numpy memmaps of token ids (uint16 when vocab_size <= 65536, else
  uint32). Each split is ``EOT doc1 EOT doc2 ...``: every document is preceded by the end-of-text
  token, so its first token is predicted from a defined context;
- ``manifest.json``: tokenizer, dtype, per split the documents with their UTF-8 bytes and tokens and
  the shard's SHA-256, and ``notes`` (e.g. long pre-tokenisation chunks that were cut).

Splits are made of whole documents, never by cutting one text: the documents named by ``val_docs``,
else those whose hash falls below ``val_fraction`` (:func:`split_key`, :func:`assign_splits`). The
tokenizer is trained on the training split only. Inputs (:class:`Corpus`): a folder is a set of
documents (every ``*.txt``, recursively, sorted); a single text file is split into documents at blank
lines (paragraphs); JSON lines / JSON arrays / parquet shards / ``datasets`` folders give one document
per record (:mod:`lmlab.data.sources`); several inputs are read in the order given.

Bounded and safe:
- Input is streamed, in three passes (names, sizes and split hashes; BPE training on the training
  documents when a tokenizer is trained; encoding): text files are read in segments of about
  :data:`lmlab.data.documents.SEGMENT_BYTES`, cut where the tokenizer gives the same ids as for the whole document
  (:func:`cut_point`), records one at a time; segments go to the tokenizers library's batch encoder
  about :data:`ENCODE_BATCH_BYTES` at a time (all cores) and the ids straight to the shard files.
  Memory is O(batch) plus a name and two integers per document, not O(corpus) (an imported ``hf``
  tokenizer encodes one whole document at a time). Each pass checks it sees the documents of the
  first, so a corpus changed meanwhile is refused, not mixed.
- Special files (FIFOs, character/block devices, sockets) are refused naming the file unless
  ``allow_special`` (``--allow-special-files``); then they are copied (at most
  :data:`lmlab.data.documents.SPECIAL_FILE_LIMIT` bytes) into a temporary folder first. Symlink loops, broken links and
  unreadable files are refused with one line naming them.
- ``out_dir`` is locked (:func:`lmlab.fsutil.acquire_lock`) for the whole run, so a second
  ``prepare`` into it is refused. The result is written into a new ``tempfile.mkdtemp`` folder beside
  ``out_dir`` and renamed into place; only the folders this call created are ever removed. An
  interruption (Ctrl-C) or error leaves ``out_dir`` in its previous complete state.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from lmlab.data import documents
from lmlab.data.documents import Corpus, Document
from lmlab.data.shards import TokenData
from lmlab.data.sources import DataError
from lmlab.data.tokenizer import MAX_CHUNK_BYTES, Tokenizer, long_chunks
from lmlab.fsutil import acquire_lock, fsync_tree, make_temp_dir, sha256_file

MANIFEST_VERSION = 1


class PrepareInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``prepare``; the message says that the output folder was left as it was."""


def split_key(data_segments) -> float:
    """A document's place in [0, 1) for the validation split: the first 8 bytes of the BLAKE2b hash of
    its bytes (fed in pieces, ``data_segments``) read as a fraction. It depends on the text alone, so
    adding or reordering documents moves no other document between the splits, and copies of one text
    land in the same split."""
    h = hashlib.blake2b(digest_size=8)
    for seg in data_segments:
        h.update(seg)
    return int.from_bytes(h.digest(), "big") / 2.0**64


@dataclass
class DocumentTable(Sequence):
    """The documents of one split, kept compactly (a name and two integers each): item ``i`` is
    ``{"name", "bytes", "tokens"}``, as the manifest lists it."""

    names: list
    nbytes: array
    ntokens: array

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return {"name": self.names[i], "bytes": int(self.nbytes[i]), "tokens": int(self.ntokens[i])}


def scan_corpus(corpus: Corpus, progress=None) -> tuple[list[str], array, array]:
    """One pass over ``corpus``: every document's name, size (bytes) and :func:`split_key`. Raises
    DataError when two documents have one name."""
    names, sizes, keys = [], array("q"), array("d")
    for doc in corpus:
        names.append(doc.name)
        sizes.append(doc.size)
        keys.append(split_key(doc.segments("any")))
        if progress is not None:
            progress.update(doc.size)
    if len(set(names)) < len(names):
        seen: set = set()
        for dup in names:
            if dup in seen:
                break
            seen.add(dup)
        raise DataError(
            f"two documents are named {dup!r} (inputs with the same file name?); give inputs whose names differ"
        )
    return names, sizes, keys


def assign_splits(
    names: list[str], keys: Sequence[float], val_docs: Optional[Sequence[str]], val_fraction: float, source: str
) -> tuple[bytearray, list[str]]:
    """Which documents are held out (``is_val[i]`` = 1) and notes for the user. With ``val_docs``,
    exactly the named documents; else every document whose :func:`split_key` is below
    ``val_fraction`` (about that fraction of the documents, the same ones however the corpus grows),
    and if none falls below it, the one with the smallest key (said in a note). Raises DataError when
    a named document is absent, there are fewer than 2 documents, or no training document is left."""
    if len(names) < 2:
        raise DataError(
            f"data {source!r} holds {len(names)} document{'' if len(names) == 1 else 's'}; at least 2 are "
            f"needed for a "
            f"train/validation split by whole documents"
        )
    notes = []
    if val_docs:
        present = set(names)
        missing = [v for v in val_docs if v not in present]
        if missing:
            shown = sorted(present)[:10]
            raise DataError(
                f"validation document(s) {missing} not found in {source!r}; "
                f"available: {', '.join(shown)}{' ...' if len(present) > 10 else ''}"
            )
        wanted = set(val_docs)
        is_val = bytearray(n in wanted for n in names)
    else:
        is_val = bytearray(k < val_fraction for k in keys)
        if not any(is_val):
            i = min(range(len(keys)), key=keys.__getitem__)
            is_val[i] = 1
            notes.append(
                f"no document's split hash fell below --val-fraction {val_fraction:g} "
                f"({len(names)} documents); the one nearest it, {names[i]!r}, is held out"
            )
    if all(is_val):
        raise DataError(f"no training documents left in {source!r} after holding out {len(names)} for validation")
    return is_val, notes


class _Shard:
    """One split's token file being written: ``EOT doc EOT doc ...``, its SHA-256 and per-document
    counts."""

    def __init__(self, path: Path, dtype, eot_id: int):
        self.path, self.dtype = path, dtype
        self.f = open(path, "wb")
        self.h = hashlib.sha256()
        self.eot = np.array([eot_id], dtype=dtype)
        self.docs = DocumentTable([], array("q"), array("q"))
        self.tokens = 0

    def _write(self, ids: np.ndarray) -> None:
        raw = ids.astype(self.dtype, copy=False).tobytes()
        self.f.write(raw)
        self.h.update(raw)
        self.tokens += len(ids)

    def start(self, doc: Document) -> None:
        self._write(self.eot)
        self.docs.names.append(doc.name)
        self.docs.nbytes.append(doc.size)
        self.docs.ntokens.append(0)

    def add(self, ids: np.ndarray) -> None:
        self._write(ids)
        self.docs.ntokens[-1] += len(ids)

    def info(self) -> dict:
        self.f.close()
        return {
            "file": self.path.name,
            "documents": self.docs,
            "bytes": sum(self.docs.nbytes),
            "tokens": self.tokens,
            "sha256": self.h.hexdigest(),
        }


ENCODE_BATCH_BYTES = 1 << 21  # text handed to the batch encoder at once (all cores share it)


def _same_documents(corpus: Corpus, names: list[str], sizes: array) -> Iterator[tuple[int, Document]]:
    """(i, document) of ``corpus``, checked to be the documents the first pass found."""
    n = 0
    for i, doc in enumerate(corpus):
        if i >= len(names) or doc.name != names[i] or doc.size != sizes[i]:
            raise DataError(
                f"the input changed while it was prepared (document {doc.name!r}); nothing was "
                f"written: run again on data that is not being modified"
            )
        n = i + 1
        yield i, doc
    if n != len(names):
        raise DataError(
            f"the input changed while it was prepared ({n} documents, earlier {len(names)}); nothing was written"
        )


def _write_splits(
    tok: Tokenizer, docs: Iterator[tuple[int, Document]], is_val: bytearray, shards: dict, notes: dict, progress=None
) -> None:
    """Encode every document into its split's shard, many segments at a time
    (:meth:`Tokenizer.encode_bytes_batch`), in document order."""
    mode = tok.segment_mode
    pending: list = []  # (shard, document or None when not its first segment, segment bytes)
    size = 0

    def flush():
        nonlocal size
        for (shard, first, _), ids in zip(pending, tok.encode_bytes_batch([p[2] for p in pending])):
            if first is not None:
                shard.start(first)
            shard.add(ids)
        if progress is not None:
            progress.update(size)
        pending.clear()
        size = 0

    for i, doc in docs:
        shard = shards["val" if is_val[i] else "train"]
        cuts: list = []
        first: Optional[Document] = doc
        for seg in doc.segments(mode, cuts):
            if tok.kind == "bpe" and mode == "safe":
                count, longest = long_chunks(seg)
                if count:
                    notes["long_chunks"] = notes.get("long_chunks", 0) + count
                    notes["longest"] = max(notes.get("longest", 0), longest)
                    notes.setdefault("long_doc", doc.name)
            pending.append((shard, first, seg))
            first, size = None, size + len(seg)
            if size >= ENCODE_BATCH_BYTES:
                flush()
        if first is not None:  # an empty document: its EOT still marks it
            pending.append((shard, first, b""))
        if cuts:
            notes["hard_cuts"] = notes.get("hard_cuts", 0) + len(cuts)
            notes.setdefault("hard_doc", doc.name)
    flush()


def _write_manifest(path: Path, manifest: dict) -> None:
    """``manifest`` as JSON (indent 1), each split's documents written one line each from their
    :class:`DocumentTable` rather than built as one string."""
    marks = {split: f"\u0000documents:{split}" for split in manifest["splits"]}
    skeleton = {**manifest, "splits": {s: {**info, "documents": marks[s]} for s, info in manifest["splits"].items()}}
    text = json.dumps(skeleton, indent=1)
    with open(path, "w", encoding="utf-8") as f:
        for split, info in manifest["splits"].items():
            head, text = text.split(json.dumps(marks[split]), 1)
            f.write(head + "[")
            for j, d in enumerate(info["documents"]):
                f.write(("," if j else "") + "\n    " + json.dumps(d))
            f.write("\n   ]")
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _note_lines(notes: dict) -> list[str]:
    lines = []
    if notes.get("long_chunks"):
        lines.append(
            f"{notes['long_chunks']:,} pre-tokenisation chunk(s) longer than {MAX_CHUNK_BYTES} bytes "
            f"(runs without whitespace; longest {notes['longest']:,} bytes, first in "
            f"{notes['long_doc']!r}) were tokenised in pieces of at most {MAX_CHUNK_BYTES} bytes"
        )
    if notes.get("hard_cuts"):
        lines.append(
            f"{notes['hard_cuts']:,} place(s) with more than {documents.MAX_SEGMENT_BYTES:,} bytes without a "
            f"space or line break (first in {notes['hard_doc']!r}) were cut there to bound memory; the "
            f"tokens at such a cut may differ from encoding that text whole"
        )
    return lines


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the finished ``tmp`` onto ``out_dir`` (an existing one is moved aside first and removed
    after); SIGINT/SIGTERM are held back meanwhile so an interruption cannot fall between the renames."""
    blocked = {signal.SIGINT, signal.SIGTERM}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        old = None
        if os.path.lexists(out_dir):
            old = make_temp_dir(out_dir, "old")
            try:
                os.rename(out_dir, old)  # onto our own empty folder
            except OSError:
                old.rmdir()
                raise
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if old is not None:
                os.rename(old, out_dir)
            raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    if old is not None:
        shutil.rmtree(old)


def _check_replaceable(out_dir: Path) -> None:
    """--overwrite replaces a folder only if it is lmlab's prepared data and nothing else: a manifest
    that reads as one (not just any manifest.json) and no file besides the manifest, the tokenizer and
    the shards it names. Raises DataError naming what would be lost."""
    try:
        data = TokenData(out_dir)
        owned = {"manifest.json", data.manifest["tokenizer"].get("file", "tokenizer.json")}
        owned |= {
            info["file"] for info in data.manifest["splits"].values() if isinstance(info, dict) and "file" in info
        }
    except DataError as exc:
        raise DataError(
            f"--overwrite refused: {str(out_dir)!r} is not a prepared data folder lmlab can read ({exc})"
            f"; choose another --out"
        ) from None
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in owned)
    if foreign:
        raise DataError(
            f"--overwrite refused: {str(out_dir)!r} also holds {', '.join(foreign[:5])}"
            f"{' ...' if len(foreign) > 5 else ''}, which lmlab prepare did not write and would delete; "
            f"move them away or choose another --out"
        )


def expand_inputs(patterns: Sequence[str | Path]) -> list[Path]:
    """The input paths ``patterns`` name: each as it is when it exists, else its ``glob`` matches in
    sorted order (``--data 'shards/*.parquet'`` quoted, so the shell did not expand it). Raises
    DataError for a pattern that matches nothing."""
    out: list[Path] = []
    for pat in map(str, patterns):
        if os.path.lexists(pat) or not glob.has_magic(pat):
            out.append(Path(pat))
            continue
        found = sorted(glob.glob(pat))
        if not found:
            raise DataError(f"--data {pat!r} matches no file")
        out += map(Path, found)
    return out


def _bar(progress: bool, total: Optional[int], desc: str):
    """A tqdm bar over bytes (MB/s shown) when ``progress``, else one that shows nothing."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        file=sys.stderr,
        leave=False,
        mininterval=0.5,
        dynamic_ncols=True,
        disable=not progress,
    )


def prepare(
    source: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    tokenizer: str = "bpe",
    vocab_size: int = 4096,
    val_docs: Optional[Sequence[str]] = None,
    val_fraction: float = 0.1,
    overwrite: bool = False,
    tokenizer_file: Optional[str | Path] = None,
    allow_special: bool = False,
    text_field: str = "text",
    progress: bool = False,
) -> dict:
    """Tokenise the documents at ``source`` (one path or several: see :class:`Corpus`) into ``out_dir``
    (see module docstring); returns the manifest (its ``notes``: lines for the user, e.g. long chunks
    that were cut; ``stats``, not written to the file: ``bytes`` of text and ``seconds`` per pass,
    ``scan``, ``tokenizer`` (BPE training), ``encode``).

    Three streaming passes: every document's name, size and split hash (:func:`assign_splits`); BPE
    training on the training documents (only when a tokenizer is trained); encoding into both shards.
    ``val_docs``: hold out these documents by name; else by hash, about ``val_fraction`` of them.
    ``tokenizer_file``: use this existing ``tokenizer.json`` (e.g. an imported run's) instead of
    training one. ``allow_special``: read FIFOs / devices given as (or inside) ``source``.
    ``text_field``: the text of a JSON / parquet / ``datasets`` record. ``progress``: tqdm bars (MB/s)
    on stderr.

    Raises DataError for bad input, an existing non-empty ``out_dir`` without ``overwrite`` (with it, one
    that is not a prepared data folder), or an ``out_dir`` that holds ``source``; LockError when another
    process prepares into ``out_dir``; PrepareInterrupted on Ctrl-C. Then ``out_dir`` is as it was.
    """
    sources = [Path(source)] if isinstance(source, (str, Path)) else [Path(p) for p in source]
    out_dir = Path(os.path.abspath(out_dir))
    real_out = Path(os.path.realpath(out_dir))  # realpath: no error on loops
    for src in sources:
        real = Path(os.path.realpath(src))
        if real_out == real or real_out in real.parents:
            raise DataError(
                f"--out {str(out_dir)!r} holds the input documents {str(src)!r}; write the prepared "
                f"data to another folder"
            )
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out {str(out_dir)!r} is a file, not a folder; choose a folder path")
    if out_dir.is_symlink():
        raise DataError(
            f"--out {str(out_dir)!r} is a symlink; give the folder it points to "
            f"({os.path.realpath(out_dir)!r}) or another path"
        )
    lock = acquire_lock(out_dir, "lmlab prepare")
    if lock.note:  # a stale lock of a killed prepare was taken over
        print(lock.note, file=sys.stderr)
    tmp = spool = None
    shards: dict = {}
    try:
        if out_dir.exists() and any(out_dir.iterdir()):
            if not overwrite:
                raise DataError(
                    f"output folder {str(out_dir)!r} already exists and is not empty; "
                    f"choose another --out or pass --overwrite"
                )
            if not (out_dir / "manifest.json").is_file():  # --overwrite replaces prepared data, nothing else
                raise DataError(
                    f"--overwrite refused: {str(out_dir)!r} is not a prepared data folder (no "
                    f"manifest.json) and would be deleted; choose another --out"
                )
            _check_replaceable(out_dir)
        if allow_special:
            spool = make_temp_dir(out_dir, "input")
        where = str(sources[0]) if len(sources) == 1 else f"{len(sources)} inputs ({sources[0]} ...)"
        seconds: dict = {}
        t0 = time.perf_counter()
        corpus = Corpus(sources, text_field, allow_special, spool)
        with _bar(progress, None, "scan") as bar:
            names, sizes, keys = scan_corpus(corpus, bar)
        is_val, split_notes = assign_splits(names, keys, val_docs, val_fraction, where)
        del keys
        seconds["scan"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        total = sum(sizes)
        train_bytes = sum(n for n, v in zip(sizes, is_val) if not v)
        train_docs = (d for i, d in _same_documents(corpus, names, sizes) if not is_val[i])
        with _bar(progress and tokenizer_file is None and tokenizer == "bpe", train_bytes, "train BPE") as bar:
            tok = _make_tokenizer(train_docs, tokenizer, vocab_size, tokenizer_file, bar)
        seconds["tokenizer"] = time.perf_counter() - t0
        dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
        tmp = make_temp_dir(out_dir, "partial")
        if tokenizer_file is not None and Path(tokenizer_file).is_file():
            shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")  # byte for byte: runs and data compare equal
        else:
            tok.save(tmp / "tokenizer.json")
        real_src = [str(Path(os.path.realpath(p))) for p in sources]
        manifest = {
            "version": MANIFEST_VERSION,
            "source": real_src[0] if len(real_src) == 1 else real_src,
            "tokenizer": {
                "type": tok.kind,
                "vocab_size": tok.vocab_size,
                "eot_id": tok.eot_id,
                "file": "tokenizer.json",
                "sha256": sha256_file(tmp / "tokenizer.json"),
            },
            "dtype": np.dtype(dtype).name,
            "splits": {},
        }
        t0 = time.perf_counter()
        notes: dict = {}
        shards = {split: _Shard(tmp / f"{split}.bin", dtype, tok.eot_id) for split in ("train", "val")}
        with _bar(progress, total, "tokenise") as bar:
            _write_splits(tok, _same_documents(corpus, names, sizes), is_val, shards, notes, bar)
        manifest["splits"] = {split: shard.info() for split, shard in shards.items()}
        manifest["notes"] = split_notes + _note_lines(notes)
        _write_manifest(tmp / "manifest.json", manifest)
        fsync_tree(tmp)
        seconds["encode"] = time.perf_counter() - t0
        _swap_into_place(tmp, out_dir)
        tmp = None
        return {**manifest, "stats": {"bytes": total, "seconds": seconds}}
    except KeyboardInterrupt:
        state = "left as it was" if out_dir.exists() else "not created"
        raise PrepareInterrupted(
            f"interrupted: {str(out_dir)!r} {state} (its previous complete state); nothing half-written kept"
        ) from None
    finally:
        for shard in shards.values():
            shard.f.close()
        for folder in (tmp, spool):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        lock.release()


def _make_tokenizer(
    train: Iterator[Document], tokenizer: str, vocab_size: int, tokenizer_file, progress=None
) -> Tokenizer:
    if tokenizer_file is not None:
        path = Path(tokenizer_file)
        if path.is_dir():  # an HF model folder: tokenizer.json, or GPT-2-style vocab.json + merges.txt
            tok, _ = Tokenizer.from_folder(path)
            if tok is None:
                raise DataError(
                    f"--tokenizer-file {str(path)!r} is a folder without tokenizer.json or "
                    f"vocab.json + merges.txt; give a tokenizer.json or such a folder"
                )
            return tok
        if not path.is_file():
            raise DataError(
                f"tokenizer file {str(tokenizer_file)!r} "
                + ("is not a file; give a tokenizer.json" if path.exists() else "does not exist")
            )
        return Tokenizer.load(tokenizer_file)
    if tokenizer == "bytes":
        return Tokenizer.bytes_tokenizer()
    if tokenizer == "bpe":  # trained from a stream of segments: the HF trainer keeps word counts only

        def texts():
            for d in train:
                for seg in d.segments("safe"):
                    if progress is not None:
                        progress.update(len(seg))
                    yield seg.decode("utf-8", errors="replace")

        return Tokenizer.train_bpe(texts(), vocab_size)
    raise DataError(f"tokenizer={tokenizer!r} is not valid; choose 'bpe' or 'bytes'")
