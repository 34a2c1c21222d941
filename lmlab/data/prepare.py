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
  :data:`SEGMENT_BYTES`, cut where the tokenizer gives the same ids as for the whole document
  (:func:`cut_point`), records one at a time; segments go to the tokenizers library's batch encoder
  about :data:`ENCODE_BATCH_BYTES` at a time (all cores) and the ids straight to the shard files.
  Memory is O(batch) plus a name and two integers per document, not O(corpus) (an imported ``hf``
  tokenizer encodes one whole document at a time). Each pass checks it sees the documents of the
  first, so a corpus changed meanwhile is refused, not mixed.
- Special files (FIFOs, character/block devices, sockets) are refused naming the file unless
  ``allow_special`` (``--allow-special-files``); then they are copied (at most
  :data:`SPECIAL_FILE_LIMIT` bytes) into a temporary folder first. Symlink loops, broken links and
  unreadable files are refused with one line naming them.
- ``out_dir`` is locked (:func:`lmlab.fsutil.acquire_lock`) for the whole run, so a second
  ``prepare`` into it is refused. The result is written into a new ``tempfile.mkdtemp`` folder beside
  ``out_dir`` and renamed into place; only the folders this call created are ever removed. An
  interruption (Ctrl-C) or error leaves ``out_dir`` in its previous complete state.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import time
from array import array
import re
import shutil
import signal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from lmlab.data.sources import DataError, input_kind, iter_records
from lmlab.data.tokenizer import MAX_CHUNK_BYTES, Tokenizer, long_chunks
from lmlab.fsutil import acquire_lock, atomic_write_text, fsync_tree, make_temp_dir, sha256_file

MANIFEST_VERSION = 1
SEGMENT_BYTES = 1 << 20  # a document is read and encoded in pieces of about this size
MAX_SEGMENT_BYTES = 8 << 20  # past this without a safe cut (no space / line break), a piece is cut anyway
SPECIAL_FILE_LIMIT = 1 << 30  # at most this much is read from a FIFO / device, and only if allowed
_WS = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips
_PARAGRAPH_SEP = re.compile(rb"\r?\n(?:[ \t]*\r?\n)+")
# a cut between printable ASCII: after "X\n" before "Y", or after "X" before " Y". GPT-2's pre-tokeniser
# ends a chunk there whatever follows or precedes, so both sides encode as they would in the whole text
_SAFE_CUT = re.compile(rb"[!-~]\n(?=[!-~])|[!-~](?= [!-~])")


class PrepareInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``prepare``; the message says that the output folder was left as it was."""


@dataclass(frozen=True, slots=True)
class Document:
    """One document: ``name`` (its path relative to the input folder, ``file#paragraph`` or
    ``file#row``) and the byte range [``start``, ``end``) of ``path`` that holds it (read lazily, never
    kept whole), or, for a record of a JSON / parquet / ``datasets`` corpus, its UTF-8 ``data``."""
    name: str
    path: Path
    start: int
    end: int
    data: Optional[bytes] = None

    @property
    def size(self) -> int:
        return self.end - self.start

    def read(self) -> bytes:
        """The whole document (for small inputs and tests; :meth:`segments` streams)."""
        return b"".join(self.segments("any"))

    def segments(self, mode: str = "any", hard_cuts: Optional[list] = None) -> Iterator[bytes]:
        """The document in consecutive pieces of about :data:`SEGMENT_BYTES` whose concatenation is the
        document. ``mode``: ``"any"`` (cut anywhere), ``"safe"`` (only at :func:`cut_point`s; past
        :data:`MAX_SEGMENT_BYTES` without one, cut anyway and append the offset to ``hard_cuts``) or
        ``"whole"`` (one piece). Raises DataError naming the file when it cannot be read."""
        try:
            with (io.BytesIO(self.data) if self.data is not None else open(self.path, "rb")) as f:
                f.seek(self.start)
                left, buf = self.size, b""

                def more() -> bytes:
                    nonlocal left
                    chunk = f.read(min(left, SEGMENT_BYTES))
                    if not chunk:
                        raise DataError(f"{str(self.path)!r} became shorter while it was read; nothing was written")
                    left -= len(chunk)
                    return chunk

                while True:
                    while left > 0 and (mode == "whole" or len(buf) < SEGMENT_BYTES):
                        buf += more()
                    if left == 0 or mode == "whole":
                        if buf:
                            yield buf
                        return
                    cut = SEGMENT_BYTES if mode == "any" else cut_point(buf)
                    if cut is None:
                        if len(buf) < MAX_SEGMENT_BYTES:
                            buf += more()
                            continue
                        cut = len(buf)
                        if hard_cuts is not None:
                            hard_cuts.append(self.end - left - self.start)
                    yield buf[:cut]
                    buf = buf[cut:]
        except OSError as exc:
            raise DataError(f"document {self.name!r}: {str(self.path)!r} could not be read: "
                            f"{exc.strerror or exc}") from None


def cut_point(buf: bytes) -> Optional[int]:
    """The last position inside ``buf`` where the text may be cut so that byte-level BPE (GPT-2's
    pre-tokeniser) encodes both sides as it would the whole: between printable ASCII, after a line
    break or before a space (``_SAFE_CUT``); None if there is none. Searched from the end."""
    n, window = len(buf), 4096
    while True:
        lo = max(0, n - window)
        best = None
        for m in _SAFE_CUT.finditer(buf, lo):
            best = m.end()
        if best is not None:
            return best
        if lo == 0:
            return None
        window *= 4


def _describe_special(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _stat_input(path: Path) -> os.stat_result:
    """stat ``path`` following links; one-line DataError for a symlink loop, broken link or no access."""
    try:
        return os.stat(path)
    except OSError as exc:
        if os.path.islink(path):
            if exc.errno == 40:  # ELOOP
                raise DataError(f"{str(path)!r} is a symlink loop; point it at a text file or remove it") from None
            if not os.path.lexists(os.path.realpath(path)):
                raise DataError(f"{str(path)!r} is a broken symlink (its target "
                                f"{os.path.realpath(path)!r} does not exist)") from None
        if exc.errno == 40:
            raise DataError(f"{str(path)!r} goes through a symlink loop") from None
        if not os.path.lexists(path):
            raise DataError(f"data path {str(path)!r} does not exist; give a text file or a folder of .txt "
                            f"documents") from None
        raise DataError(f"{str(path)!r} could not be read: {exc.strerror or exc}") from None


def _check_readable(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise DataError(f"{str(path)!r} could not be read: {exc.strerror or exc}") from None


def _spool(path: Path, mode: int, allow_special: bool, spool_dir: Optional[Path]) -> Path:
    """A regular copy of the special file ``path`` (at most SPECIAL_FILE_LIMIT bytes) when allowed."""
    if not allow_special or spool_dir is None:
        raise DataError(f"{str(path)!r} is {_describe_special(mode)}, not a regular file; lmlab reads such "
                        f"files only with --allow-special-files")
    spool_dir.mkdir(exist_ok=True)
    copy = Path(spool_dir) / f"{len(list(spool_dir.iterdir()))}.txt"
    n = 0
    try:
        with open(path, "rb") as src, open(copy, "xb") as dst:
            while chunk := src.read(SEGMENT_BYTES):
                n += len(chunk)
                if n > SPECIAL_FILE_LIMIT:
                    raise DataError(f"{str(path)!r} ({_describe_special(mode)}) gave more than "
                                    f"{SPECIAL_FILE_LIMIT:,} bytes; refused (special files are read up to "
                                    f"that size)")
                dst.write(chunk)
    except OSError as exc:
        raise DataError(f"{str(path)!r} could not be read: {exc.strerror or exc}") from None
    return copy


def _has_text(path: Path, start: int = 0, end: Optional[int] = None) -> bool:
    """True when bytes [start, end) of ``path`` hold a non-whitespace byte (stops at the first)."""
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start if end is not None else None
        while left is None or left > 0:
            chunk = f.read(SEGMENT_BYTES if left is None else min(left, SEGMENT_BYTES))
            if not chunk:
                return False
            if chunk.strip(_WS):
                return True
            if left is not None:
                left -= len(chunk)
    return False


def paragraph_ranges(path: Path) -> list[tuple[int, int]]:
    """Byte ranges of the non-blank paragraphs of ``path``, exactly those of
    ``re.split(_PARAGRAPH_SEP, whole_file)`` that are not blank, found while streaming the file."""
    ranges: list[tuple[int, int]] = []
    para_start, nonblank = 0, False  # the open paragraph: its start and whether it has text so far
    buf, base, eof = b"", 0, False  # buf holds the file's bytes [base, base + len(buf))
    with open(path, "rb") as f:
        while not eof:
            chunk = f.read(SEGMENT_BYTES)
            eof = not chunk
            buf += chunk
            # a separator is whitespace only: one followed by a non-whitespace byte cannot grow any more
            settled = len(buf) if eof else len(buf.rstrip(_WS))
            pos = 0
            for m in _PARAGRAPH_SEP.finditer(buf):
                if m.end() >= settled and not eof:
                    break
                if nonblank or buf[pos:m.start()].strip(_WS):
                    ranges.append((para_start, base + m.start()))
                para_start, pos, nonblank = base + m.end(), m.end(), False
            keep = len(buf) if eof else max(pos, settled)  # later separators start in the trailing whitespace
            nonblank = nonblank or bool(buf[pos:keep].strip(_WS))
            buf, base = buf[keep:], base + keep
    if nonblank or buf.strip(_WS):
        ranges.append((para_start, base + len(buf)))
    return ranges


def _walk_txt(root: Path) -> Iterator[Path]:
    """Every ``*.txt`` entry under ``root``, by name; links to folders are followed, a folder reached
    twice (a symlink loop) is refused with DataError. Entries are checked by :func:`scan_documents`."""
    seen = set()

    def walk(folder: Path):
        st = _stat_input(folder)
        if (st.st_dev, st.st_ino) in seen:
            raise DataError(f"{str(folder)!r} leads back to a folder already read (a symlink loop); "
                            f"remove the link")
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise DataError(f"folder {str(folder)!r} could not be listed: {exc.strerror or exc}") from None
        for entry in entries:
            if entry.name.endswith(".txt"):
                yield Path(entry.path)
            try:
                is_dir = entry.is_dir()  # follows links; False for broken ones
            except OSError:  # a symlink loop: refused below if it is a .txt, else not a document
                is_dir = False
            if is_dir:
                yield from walk(Path(entry.path))

    yield from walk(root)


def scan_documents(path: str | Path, allow_special: bool = False,
                   spool_dir: Optional[Path] = None) -> list[Document]:
    """Locate the documents at ``path`` (a ``.txt`` file, split at blank lines, or a folder of ``*.txt``)
    without keeping their text: names and byte ranges, blank documents dropped. Raises DataError (one
    line, naming the file) for a missing path, symlink loop, broken link, unreadable file, a special
    file unless ``allow_special`` (then copied into ``spool_dir``), or no non-blank text."""
    path = Path(path)
    if not os.path.lexists(path):
        raise DataError(f"data path {str(path)!r} does not exist; give a text file or a folder of .txt documents")
    st = _stat_input(path)
    if stat.S_ISDIR(st.st_mode):
        docs = []
        for p in sorted(_walk_txt(path), key=lambda q: q.relative_to(path).parts):
            pst = _stat_input(p)
            if stat.S_ISDIR(pst.st_mode):
                continue  # a folder whose name ends in .txt
            source = p
            if not stat.S_ISREG(pst.st_mode):
                source = _spool(p, pst.st_mode, allow_special, spool_dir)
            _check_readable(source)
            size = os.path.getsize(source)
            if _has_text(source):
                docs.append(Document(str(p.relative_to(path)), source, 0, size))
        if not docs:
            raise DataError(f"data folder {str(path)!r} holds no non-empty .txt files (a folder is read as "
                            f".txt documents; give .jsonl / .parquet shards as files, e.g. --data DIR/*.parquet)")
        return docs
    source = path
    if not stat.S_ISREG(st.st_mode):
        source = _spool(path, st.st_mode, allow_special, spool_dir)
    _check_readable(source)
    try:
        ranges = paragraph_ranges(source)
    except OSError as exc:
        raise DataError(f"{str(path)!r} could not be read: {exc.strerror or exc}") from None
    if not ranges:
        raise DataError(f"data file {str(path)!r} is empty")
    return [Document(f"{path.name}#{i}", source, a, b) for i, (a, b) in enumerate(ranges)]


def read_documents(path: str | Path) -> list[tuple[str, bytes]]:
    """(name, raw bytes) of every document at ``path`` (see :func:`scan_documents`), read whole:
    for small inputs; :func:`prepare` streams instead."""
    return [(d.name, d.read()) for d in scan_documents(path)]


class Corpus:
    """The documents of one or more inputs, in input order, read afresh on each pass over them
    (iterating yields :class:`Document` s; a record's text is held only while it is processed).

    ``sources``: paths of :func:`lmlab.data.sources.input_kind` kinds: a ``.txt`` file (split at blank
    lines), a folder of ``*.txt``, ``.jsonl`` / ``.jsonl.gz`` / ``.json`` files, ``.parquet`` shards,
    a ``datasets.save_to_disk`` folder; ``text_field`` names the records' text. Text inputs are
    located at once (:func:`scan_documents`); record files are checked to exist and be readable here
    and read when iterated. Raises DataError naming the path."""

    def __init__(self, sources: Sequence[str | Path], text_field: str = "text", allow_special: bool = False,
                 spool_dir: Optional[Path] = None):
        if not sources:
            raise DataError("no data given; give a .txt file, a folder of .txt documents, .jsonl / .parquet "
                            "files or a saved `datasets` folder")
        self.text_field = text_field
        self.parts: list = []  # a list of Documents (text input) or (path, kind, label) of a record input
        for source in map(Path, sources):
            if not os.path.lexists(source):
                raise DataError(f"data path {str(source)!r} does not exist; give a text file, a folder of .txt "
                                f"documents, .jsonl / .parquet files or a saved `datasets` folder")
            st = _stat_input(source)
            kind = input_kind(source)
            if kind == "text":
                self.parts.append(scan_documents(source, allow_special, spool_dir))
                continue
            path = source
            if not stat.S_ISDIR(st.st_mode):
                if not stat.S_ISREG(st.st_mode):
                    path = _spool(source, st.st_mode, allow_special, spool_dir)
                _check_readable(path)
            self.parts.append((path, kind, source.name))

    def __iter__(self) -> Iterator[Document]:
        for part in self.parts:
            if isinstance(part, list):
                yield from part
                continue
            path, kind, label = part
            for name, data in iter_records(path, kind, self.text_field, label):
                yield Document(name, path, 0, len(data), data)


def split_key(data_segments) -> float:
    """A document's place in [0, 1) for the validation split: the first 8 bytes of the BLAKE2b hash of
    its bytes (fed in pieces, ``data_segments``) read as a fraction. It depends on the text alone, so
    adding or reordering documents moves no other document between the splits, and copies of one text
    land in the same split."""
    h = hashlib.blake2b(digest_size=8)
    for seg in data_segments:
        h.update(seg)
    return int.from_bytes(h.digest(), "big") / 2.0 ** 64


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
        raise DataError(f"two documents are named {dup!r} (inputs with the same file name?); give inputs "
                        f"whose names differ")
    return names, sizes, keys


def assign_splits(names: list[str], keys: Sequence[float], val_docs: Optional[Sequence[str]],
                  val_fraction: float, source: str) -> tuple[bytearray, list[str]]:
    """Which documents are held out (``is_val[i]`` = 1) and notes for the user. With ``val_docs``,
    exactly the named documents; else every document whose :func:`split_key` is below
    ``val_fraction`` (about that fraction of the documents, the same ones however the corpus grows),
    and if none falls below it, the one with the smallest key (said in a note). Raises DataError when
    a named document is absent, there are fewer than 2 documents, or no training document is left."""
    if len(names) < 2:
        raise DataError(f"data {source!r} holds {len(names)} document{'' if len(names) == 1 else 's'}; at least 2 are "
                        f"needed for a "
                        f"train/validation split by whole documents")
    notes = []
    if val_docs:
        present = set(names)
        missing = [v for v in val_docs if v not in present]
        if missing:
            shown = sorted(present)[:10]
            raise DataError(f"validation document(s) {missing} not found in {source!r}; "
                            f"available: {', '.join(shown)}{' ...' if len(present) > 10 else ''}")
        wanted = set(val_docs)
        is_val = bytearray(n in wanted for n in names)
    else:
        is_val = bytearray(k < val_fraction for k in keys)
        if not any(is_val):
            i = min(range(len(keys)), key=keys.__getitem__)
            is_val[i] = 1
            notes.append(f"no document's split hash fell below --val-fraction {val_fraction:g} "
                         f"({len(names)} documents); the one nearest it, {names[i]!r}, is held out")
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
        return {"file": self.path.name, "documents": self.docs, "bytes": sum(self.docs.nbytes),
                "tokens": self.tokens, "sha256": self.h.hexdigest()}


ENCODE_BATCH_BYTES = 1 << 21  # text handed to the batch encoder at once (all cores share it)


def _same_documents(corpus: Corpus, names: list[str], sizes: array) -> Iterator[tuple[int, Document]]:
    """(i, document) of ``corpus``, checked to be the documents the first pass found."""
    n = 0
    for i, doc in enumerate(corpus):
        if i >= len(names) or doc.name != names[i] or doc.size != sizes[i]:
            raise DataError(f"the input changed while it was prepared (document {doc.name!r}); nothing was "
                            f"written: run again on data that is not being modified")
        n = i + 1
        yield i, doc
    if n != len(names):
        raise DataError(f"the input changed while it was prepared ({n} documents, earlier {len(names)}); "
                        f"nothing was written")


def _write_splits(tok: Tokenizer, docs: Iterator[tuple[int, Document]], is_val: bytearray,
                  shards: dict, notes: dict, progress=None) -> None:
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
    skeleton = {**manifest, "splits": {s: {**info, "documents": marks[s]}
                                       for s, info in manifest["splits"].items()}}
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
        lines.append(f"{notes['long_chunks']:,} pre-tokenisation chunk(s) longer than {MAX_CHUNK_BYTES} bytes "
                     f"(runs without whitespace; longest {notes['longest']:,} bytes, first in "
                     f"{notes['long_doc']!r}) were tokenised in pieces of at most {MAX_CHUNK_BYTES} bytes")
    if notes.get("hard_cuts"):
        lines.append(f"{notes['hard_cuts']:,} place(s) with more than {MAX_SEGMENT_BYTES:,} bytes without a space "
                     f"or line break (first in {notes['hard_doc']!r}) were cut there to bound memory; the "
                     f"tokens at such a cut may differ from encoding that text whole")
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
        owned |= {info["file"] for info in data.manifest["splits"].values() if isinstance(info, dict) and "file" in info}
    except DataError as exc:
        raise DataError(f"--overwrite refused: {str(out_dir)!r} is not a prepared data folder lmlab can read ({exc})"
                        f"; choose another --out") from None
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in owned)
    if foreign:
        raise DataError(f"--overwrite refused: {str(out_dir)!r} also holds {', '.join(foreign[:5])}"
                        f"{' ...' if len(foreign) > 5 else ''}, which lmlab prepare did not write and would delete; "
                        f"move them away or choose another --out")


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

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000, file=sys.stderr,
                leave=False, mininterval=0.5, dynamic_ncols=True, disable=not progress)


def prepare(source: str | Path | Sequence[str | Path], out_dir: str | Path, tokenizer: str = "bpe",
            vocab_size: int = 4096, val_docs: Optional[Sequence[str]] = None, val_fraction: float = 0.1,
            overwrite: bool = False, tokenizer_file: Optional[str | Path] = None, allow_special: bool = False,
            text_field: str = "text", progress: bool = False) -> dict:
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
            raise DataError(f"--out {str(out_dir)!r} holds the input documents {str(src)!r}; write the prepared "
                            f"data to another folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out {str(out_dir)!r} is a file, not a folder; choose a folder path")
    if out_dir.is_symlink():
        raise DataError(f"--out {str(out_dir)!r} is a symlink; give the folder it points to "
                        f"({os.path.realpath(out_dir)!r}) or another path")
    lock = acquire_lock(out_dir, "lmlab prepare")
    if lock.note:  # a stale lock of a killed prepare was taken over
        print(lock.note, file=sys.stderr)
    tmp = spool = None
    shards: dict = {}
    try:
        if out_dir.exists() and any(out_dir.iterdir()):
            if not overwrite:
                raise DataError(f"output folder {str(out_dir)!r} already exists and is not empty; "
                                f"choose another --out or pass --overwrite")
            if not (out_dir / "manifest.json").is_file():  # --overwrite replaces prepared data, nothing else
                raise DataError(f"--overwrite refused: {str(out_dir)!r} is not a prepared data folder (no "
                                f"manifest.json) and would be deleted; choose another --out")
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
        dtype = np.uint16 if tok.vocab_size <= 2 ** 16 else np.uint32
        tmp = make_temp_dir(out_dir, "partial")
        if tokenizer_file is not None and Path(tokenizer_file).is_file():
            shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")  # byte for byte: runs and data compare equal
        else:
            tok.save(tmp / "tokenizer.json")
        real_src = [str(Path(os.path.realpath(p))) for p in sources]
        manifest = {
            "version": MANIFEST_VERSION,
            "source": real_src[0] if len(real_src) == 1 else real_src,
            "tokenizer": {"type": tok.kind, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
                          "file": "tokenizer.json", "sha256": sha256_file(tmp / "tokenizer.json")},
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
        raise PrepareInterrupted(f"interrupted: {str(out_dir)!r} {state} (its previous complete state); "
                                 f"nothing half-written kept") from None
    finally:
        for shard in shards.values():
            shard.f.close()
        for folder in (tmp, spool):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        lock.release()


def _make_tokenizer(train: Iterator[Document], tokenizer: str, vocab_size: int, tokenizer_file,
                    progress=None) -> Tokenizer:
    if tokenizer_file is not None:
        path = Path(tokenizer_file)
        if path.is_dir():  # an HF model folder: tokenizer.json, or GPT-2-style vocab.json + merges.txt
            tok, _ = Tokenizer.from_folder(path)
            if tok is None:
                raise DataError(f"--tokenizer-file {str(path)!r} is a folder without tokenizer.json or "
                                f"vocab.json + merges.txt; give a tokenizer.json or such a folder")
            return tok
        if not path.is_file():
            raise DataError(f"tokenizer file {str(tokenizer_file)!r} " + ("is not a file; give a tokenizer.json"
                            if path.exists() else "does not exist"))
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


def _key(obj, key: str, kind, path: Path, where: str = ""):
    """``obj[key]`` checked to be of ``kind``; DataError naming the file and the key otherwise."""
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(f"manifest {str(path)!r} has no key {where + key!r}; the file is damaged or not "
                        f"lmlab's: re-run `lmlab prepare`")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DataError(f"manifest {str(path)!r}: {where + key!r} is {value!r:.60}, not a {names}; the file is "
                        f"damaged: re-run `lmlab prepare`")
    return value


def _file_name(obj, key: str, path: Path, where: str) -> str:
    name = _key(obj, key, str, path, where)
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise DataError(f"manifest {str(path)!r}: {where + key!r} = {name!r} is not a file name inside the data "
                        f"folder; the file is damaged: re-run `lmlab prepare`")
    return name


class TokenData:
    """A prepared data folder: its manifest, tokenizer, and token streams as read-only memmaps.

    The manifest is validated when opened (a JSON object with ``tokenizer``, ``dtype`` and ``splits``
    of the right types; file names inside the folder); a shard is checked when first read (its size,
    its SHA-256 when the manifest records one, its largest id). Each problem raises DataError naming
    the file and the key, e.g. for a truncated, emptied or hand-edited file.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        path = self.folder / "manifest.json"
        if not path.is_file():
            raise DataError(f"{str(self.folder)!r} is not a prepared data folder (no manifest.json); "
                            f"run `lmlab prepare --data PATH --out {self.folder}` first")
        try:
            from lmlab.lab.validate import check_nesting

            self.manifest = json.loads(check_nesting(path.read_text(), f"manifest {str(path)!r}", DataError,
                                                     "; the file is damaged: re-run `lmlab prepare`"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"manifest {str(path)!r} could not be read ({exc}); the file is damaged: "
                            f"re-run `lmlab prepare`") from None
        if not isinstance(self.manifest, dict):
            raise DataError(f"manifest {str(path)!r} holds a JSON {type(self.manifest).__name__}, not an object; "
                            f"the file is damaged: re-run `lmlab prepare`")
        self._path = path
        tok_info = _key(self.manifest, "tokenizer", dict, path)
        tok_path = self.folder / _file_name(tok_info, "file", path, "tokenizer.")
        sha = _key(tok_info, "sha256", str, path, "tokenizer.")
        dtype = _key(self.manifest, "dtype", str, path)
        if dtype not in ("uint16", "uint32"):
            raise DataError(f"manifest {str(path)!r}: 'dtype' is {dtype!r}, not 'uint16' or 'uint32'; the file is "
                            f"damaged: re-run `lmlab prepare`")
        splits = _key(self.manifest, "splits", dict, path)
        for split in ("train", "val"):
            info = _key(splits, split, dict, path, "splits.")
            _file_name(info, "file", path, f"splits.{split}.")
            for key in ("tokens", "bytes"):
                if _key(info, key, int, path, f"splits.{split}.") < 0:
                    raise DataError(f"manifest {str(path)!r}: 'splits.{split}.{key}' is negative; re-run "
                                    f"`lmlab prepare`")
        if not tok_path.is_file() or sha256_file(tok_path) != sha:
            raise DataError(f"tokenizer {str(tok_path)!r} does not match manifest {str(path)!r} "
                            f"(missing or changed since prepare); re-run `lmlab prepare`")
        self.tokenizer = Tokenizer.load(tok_path)
        self.vocab_size = self.tokenizer.vocab_size
        self._checked: dict = {}

    def tokens(self, split: str) -> np.ndarray:
        """The token stream of ``split`` ('train' | 'val'), (n_tokens,) memmap. Raises DataError naming
        the shard when it is missing, truncated or changed (size, SHA-256, ids past the vocabulary)."""
        if split not in ("train", "val"):
            raise DataError(f"split {split!r} is not valid; choose 'train' or 'val'")
        info = self.manifest["splits"][split]
        path = self.folder / info["file"]
        dtype = np.dtype(self.manifest["dtype"])
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            raise DataError(f"shard {str(path)!r} (manifest key 'splits.{split}.file') could not be read: "
                            f"{exc.strerror or exc}; re-run `lmlab prepare`") from None
        if size != info["tokens"] * dtype.itemsize:
            raise DataError(f"shard {str(path)!r} has {size:,} bytes, manifest 'splits.{split}.tokens' says "
                            f"{info['tokens']:,} {dtype.name} tokens ({info['tokens'] * dtype.itemsize:,} bytes): "
                            f"the file is truncated or changed: re-run `lmlab prepare`")
        if info["tokens"] == 0:
            return np.zeros(0, dtype=dtype)
        if split not in self._checked:
            want = info.get("sha256")
            if isinstance(want, str) and sha256_file(path) != want:
                raise DataError(f"shard {str(path)!r} does not match its SHA-256 in the manifest "
                                f"('splits.{split}.sha256'): the file is damaged or changed: re-run `lmlab prepare`")
        arr = np.memmap(path, dtype=dtype, mode="r")
        if split not in self._checked:
            top = int(arr.max())
            if top >= self.vocab_size:
                raise DataError(f"{str(path)!r} holds token id {top} >= tokenizer vocab_size "
                                f"{self.vocab_size}: the shards do not match the tokenizer; re-run `lmlab prepare`")
            self._checked[split] = True
        return arr

    def bytes(self, split: str) -> int:
        """UTF-8 bytes of the documents of ``split``."""
        return int(self.manifest["splits"][split]["bytes"])
