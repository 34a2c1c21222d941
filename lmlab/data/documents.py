"""The documents ``lmlab prepare`` reads (:class:`Corpus`): a folder is a set of documents (every ``*.txt``,
recursively, sorted); a single text file is split into documents at blank lines (paragraphs); JSON lines /
JSON arrays / parquet shards / ``datasets`` folders give one document per record
(:mod:`lmlab.data.sources`); several inputs are read in the order given. A document is read in segments
of about :data:`SEGMENT_BYTES`, cut where the tokenizer gives the same ids as for the whole text
(:func:`cut_point`). Special files (FIFOs, devices, sockets) are refused unless allowed, then copied (at
most :data:`SPECIAL_FILE_LIMIT` bytes) first; symlink loops, broken links and unreadable files are refused
with one line naming them.
"""

from __future__ import annotations

import io
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from lmlab.data.sources import DataError, input_kind, iter_records

SEGMENT_BYTES = 1 << 20  # a document is read and encoded in pieces of about this size
MAX_SEGMENT_BYTES = 8 << 20  # past this without a safe cut (no space / line break), a piece is cut anyway
SPECIAL_FILE_LIMIT = 1 << 30  # at most this much is read from a FIFO / device, and only if allowed
_WS = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips
_PARAGRAPH_SEP = re.compile(rb"\r?\n(?:[ \t]*\r?\n)+")
# a cut between printable ASCII: after "X\n" before "Y", or after "X" before " Y". GPT-2's pre-tokeniser
# ends a chunk there whatever follows or precedes, so both sides encode as they would in the whole text
_SAFE_CUT = re.compile(rb"[!-~]\n(?=[!-~])|[!-~](?= [!-~])")


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
            with io.BytesIO(self.data) if self.data is not None else open(self.path, "rb") as f:
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
            raise DataError(
                f"document {self.name!r}: {str(self.path)!r} could not be read: {exc.strerror or exc}"
            ) from None


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


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def _describe_special(mode: int) -> str:
    """What a file of ``mode`` that is not a regular file is, in words."""
    return next((name for test, name in _SPECIAL if test(mode)), "not a regular file")


def _stat_input(path: Path) -> os.stat_result:
    """stat ``path`` following links; one-line DataError for a symlink loop, broken link or no access."""
    try:
        return os.stat(path)
    except OSError as exc:
        if os.path.islink(path):
            if exc.errno == 40:  # ELOOP
                raise DataError(f"{str(path)!r} is a symlink loop; point it at a text file or remove it") from None
            if not os.path.lexists(os.path.realpath(path)):
                raise DataError(
                    f"{str(path)!r} is a broken symlink (its target {os.path.realpath(path)!r} does not exist)"
                ) from None
        if exc.errno == 40:
            raise DataError(f"{str(path)!r} goes through a symlink loop") from None
        if not os.path.lexists(path):
            raise DataError(
                f"data path {str(path)!r} does not exist; give a text file or a folder of .txt documents"
            ) from None
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
        raise DataError(
            f"{str(path)!r} is {_describe_special(mode)}, not a regular file; lmlab reads such "
            f"files only with --allow-special-files"
        )
    spool_dir.mkdir(exist_ok=True)
    copy = Path(spool_dir) / f"{len(list(spool_dir.iterdir()))}.txt"
    n = 0
    try:
        with open(path, "rb") as src, open(copy, "xb") as dst:
            while chunk := src.read(SEGMENT_BYTES):
                n += len(chunk)
                if n > SPECIAL_FILE_LIMIT:
                    raise DataError(
                        f"{str(path)!r} ({_describe_special(mode)}) gave more than "
                        f"{SPECIAL_FILE_LIMIT:,} bytes; refused (special files are read up to "
                        f"that size)"
                    )
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
                if nonblank or buf[pos : m.start()].strip(_WS):
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
            raise DataError(f"{str(folder)!r} leads back to a folder already read (a symlink loop); remove the link")
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


def scan_documents(path: str | Path, allow_special: bool = False, spool_dir: Optional[Path] = None) -> list[Document]:
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
            raise DataError(
                f"data folder {str(path)!r} holds no non-empty .txt files (a folder is read as "
                f".txt documents; give .jsonl / .parquet shards as files, e.g. --data DIR/*.parquet)"
            )
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

    def __init__(
        self,
        sources: Sequence[str | Path],
        text_field: str = "text",
        allow_special: bool = False,
        spool_dir: Optional[Path] = None,
    ):
        if not sources:
            raise DataError(
                "no data given; give a .txt file, a folder of .txt documents, .jsonl / .parquet "
                "files or a saved `datasets` folder"
            )
        self.text_field = text_field
        self.parts: list = []  # a list of Documents (text input) or (path, kind, label) of a record input
        for source in map(Path, sources):
            if not os.path.lexists(source):
                raise DataError(
                    f"data path {str(source)!r} does not exist; give a text file, a folder of .txt "
                    f"documents, .jsonl / .parquet files or a saved `datasets` folder"
                )
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
