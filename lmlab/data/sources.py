"""The corpus formats ``lmlab prepare`` reads besides text files: JSON lines, JSON arrays, parquet
shards and folders written by Hugging Face ``datasets`` (``Dataset.save_to_disk``).

Each record is one document: the string in its text field (``text_field``, default ``"text"``),
named ``FILE#ROW`` (ROW counts every record of the file from 0, so a name points at its row).
Records are read one at a time, in file order (:func:`iter_records`), never the whole file: JSON
lines line by line (``.gz`` decompressed as it is read), parquet in row batches through
``pyarrow``, a ``datasets`` folder through its memory-mapped Arrow files. The one exception is a
``.json`` file holding a single JSON array, which the standard library can only parse whole.

Bad records raise :class:`DataError` naming the file, the row and the field: a line that is not
JSON, a record without the field (its fields listed), a value that is not a string. A record whose
text is empty or only whitespace is skipped, as a blank ``.txt`` document is.

``pyarrow`` and ``datasets`` are optional (``pip install 'lmlab[data]'``); they are imported only
for the formats that need them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator, Optional

from lmlab.json_checks import check_nesting

_WS = " \t\n\r\x0b\x0c"
JSON_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
BATCH_ROWS = 1024  # parquet / datasets rows decoded at a time


class DataError(ValueError):
    """Unusable input data or a prepared data folder that does not hold together."""


def input_kind(path: Path) -> str:
    """How ``path`` is read: ``"json"`` (``.jsonl``, ``.jsonl.gz``, ``.json``, ``.json.gz``,
    ``.ndjson``), ``"parquet"``, ``"datasets"`` (a folder with ``state.json`` or
    ``dataset_dict.json``), else ``"text"`` (a ``.txt`` file split at blank lines, a folder of
    ``*.txt``, or any other file, read as text)."""
    name = path.name.lower()
    if path.is_dir():
        saved = (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
        return "datasets" if saved else "text"
    return "json" if name.endswith(JSON_SUFFIXES) else "parquet" if name.endswith(PARQUET_SUFFIXES) else "text"


def iter_records(
    path: Path, kind: str, text_field: str = "text", label: Optional[str] = None
) -> Iterator[tuple[str, bytes]]:
    """(name, UTF-8 bytes) of every non-blank record of ``path`` (an :func:`input_kind` other than
    ``"text"``), in file order; names are ``LABEL#ROW`` (``label`` defaults to the file name). Raises
    DataError naming the file, row and field for bad records, and for a missing optional library
    (which extra installs it)."""
    label = label or path.name
    if kind == "json":
        rows = _json_rows(path)
    elif kind == "parquet":
        rows = _parquet_rows(path, text_field)
    elif kind == "datasets":
        yield from _datasets_records(path, text_field, label)
        return
    else:
        raise DataError(f"{str(path)!r}: no record reader for kind {kind!r}")
    for i, value in rows:
        text = _text_of(value, text_field, path, i) if kind == "json" else _check_str(value, text_field, path, i)
        if text.strip(_WS):
            yield f"{label}#{i}", text.encode("utf-8", errors="surrogatepass")


def _text_of(obj, field: str, path: Path, row: int) -> str:
    if not isinstance(obj, dict):
        raise DataError(
            f"{str(path)!r} row {row}: a JSON {type(obj).__name__}, not an object with a "
            f"{field!r} field (each record must be an object; choose the field with --text-field)"
        )
    if field not in obj:
        keys = ", ".join(map(repr, list(obj)[:8])) or "none"
        raise DataError(
            f"{str(path)!r} row {row} has no field {field!r} (its fields: {keys}); choose the "
            f"text field with --text-field"
        )
    return _check_str(obj[field], field, path, row)


def _check_str(value, field: str, path: Path, row: int) -> str:
    if not isinstance(value, str):
        raise DataError(
            f"{str(path)!r} row {row}: field {field!r} is {value!r:.40} "
            f"({type(value).__name__}), not a string; give a text field"
        )
    return value


def _open_text(path: Path):
    try:
        return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")
    except OSError as exc:
        raise DataError(f"{str(path)!r} could not be read: {exc.strerror or exc}") from None


def _json_rows(path: Path) -> Iterator[tuple[int, object]]:
    """(row, parsed value) of a JSON-lines file (blank lines skipped, not counted) or of a file holding
    one JSON array (parsed whole)."""
    try:
        with _open_text(path) as f:
            first = b""
            while not first.strip():  # the first non-blank line says which of the two the file is
                first = f.readline()
                if not first:
                    return
            if first.lstrip().startswith(b"["):
                data = _loads(first + f.read(), path, "the file")
                if not isinstance(data, list):
                    raise DataError(f"{str(path)!r} starts with '[' but is not a JSON array")
                yield from enumerate(data)
                return
            row, line = 0, first
            while line:
                if line.strip():
                    yield row, _loads(line, path, f"row {row}")
                    row += 1
                line = f.readline()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"{str(path)!r} could not be read: {getattr(exc, 'strerror', None) or exc}") from None


def _loads(raw: bytes, path: Path, where: str):
    """``raw`` parsed as JSON; DataError naming ``path`` and ``where`` when it is not JSON or nests
    deeper than :data:`lmlab.json_checks.MAX_DEPTH` (counted before parsing: no RecursionError)."""

    check_nesting(
        raw.decode("utf-8", errors="replace"), f"{str(path)!r} {where}", DataError, " (a text record needs one or two)"
    )
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(
            f"{str(path)!r} {where} is not valid JSON ({exc}); a .jsonl file holds one JSON "
            f"object per line, a .json file JSON lines or one array of objects"
        ) from None


def _need(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise DataError(
            f"reading this corpus needs the {module.split('.')[0]!r} package: pip install 'lmlab[data]'"
        ) from None


def _parquet_rows(path: Path, field: str) -> Iterator[tuple[int, object]]:
    """(row, value of ``field``) of a parquet file, in row batches. Page checksums are verified where
    the writer stored them (pyarrow's ``write_page_checksum``); a page that fails its checksum or does
    not decode raises DataError naming the file and the rows after the last good batch."""
    pq = _need("pyarrow.parquet")
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a damaged or foreign file
        raise DataError(f"{str(path)!r} could not be read as parquet: {exc}") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise DataError(
            f"{str(path)!r} has no column {field!r} (its columns: "
            f"{', '.join(map(repr, names[:8]))}); choose the text column with --text-field"
        )
    row = 0
    batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=[field])
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except Exception as exc:  # OSError "CRC checksum verification failed", ArrowInvalid, a codec's error
            raise DataError(
                f"{str(path)!r} is damaged at or after row {row} of column {field!r}: {' '.join(str(exc).split())}"
            ) from None
        for value in batch.column(0).to_pylist():
            yield row, value
            row += 1


def _datasets_records(path: Path, field: str, label: str) -> Iterator[tuple[str, bytes]]:
    datasets = _need("datasets")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises FileNotFoundError / ValueError / ArrowInvalid
        raise DataError(f"{str(path)!r} could not be read as a saved `datasets` folder: {exc}") from None
    parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    for split, ds in parts:
        where = path / split if split else path
        if field not in ds.column_names:
            raise DataError(
                f"{str(where)!r} has no column {field!r} (its columns: "
                f"{', '.join(map(repr, ds.column_names[:8]))}); choose it with --text-field"
            )
        prefix = f"{label}/{split}" if split else label
        row = 0
        for batch in ds.select_columns([field]).iter(batch_size=BATCH_ROWS):
            for value in batch[field]:
                text = _check_str(value, field, where, row)
                if text.strip(_WS):
                    yield f"{prefix}#{row}", text.encode("utf-8", errors="surrogatepass")
                row += 1
