"""``lmlab prepare``: documents -> tokenizer + token shards + manifest.

Output folder:
- ``tokenizer.json``: the trained byte-level BPE (HF ``tokenizers``) or the raw-bytes marker;
- ``train.bin`` / ``val.bin``: flat numpy memmaps of token ids (uint16 when vocab_size <= 65536, else
  uint32). Each split is ``EOT doc1 EOT doc2 ...``: every document is preceded by the end-of-text
  token, so its first token is predicted from a defined context;
- ``manifest.json``: tokenizer, dtype, and per split the documents with their UTF-8 bytes and tokens.

Splits are made of whole documents, never by cutting one text. The tokenizer is trained on the
training split only. A folder is a set of documents (every ``*.txt``, recursively, sorted); a single
file is split into documents at blank lines (paragraphs).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from lmlab.data.tokenizer import Tokenizer

MANIFEST_VERSION = 1


class DataError(ValueError):
    """Unusable input data or a prepared data folder that does not hold together."""


def read_documents(path: str | Path) -> list[tuple[str, bytes]]:
    """Read (name, raw bytes) documents from a ``.txt`` file or a folder; raises DataError when the
    path is missing or holds no non-empty text."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"data path {str(path)!r} does not exist; give a text file or a folder of .txt documents")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        docs = [(str(p.relative_to(path)), p.read_bytes()) for p in files]
        docs = [(n, b) for n, b in docs if b.strip()]
        if not docs:
            raise DataError(f"data folder {str(path)!r} holds no non-empty .txt files")
        return docs
    raw = path.read_bytes()
    parts = [p for p in re.split(rb"\r?\n(?:[ \t]*\r?\n)+", raw) if p.strip()]
    if not parts:
        raise DataError(f"data file {str(path)!r} is empty")
    return [(f"{path.name}#{i}", p) for i, p in enumerate(parts)]


def split_documents(docs: list[tuple[str, bytes]], val_docs: Optional[Sequence[str]], val_fraction: float,
                    source: str) -> tuple[list, list]:
    """Whole-document train/validation split: the named documents, else the last ``val_fraction`` of
    them (at least one). Raises DataError when a named document is absent or nothing is left to train."""
    if len(docs) < 2:
        raise DataError(f"data {source!r} holds {len(docs)} document; at least 2 are needed for a "
                        f"train/validation split by whole documents")
    if val_docs:
        names = {n for n, _ in docs}
        missing = [v for v in val_docs if v not in names]
        if missing:
            raise DataError(f"validation document(s) {missing} not found in {source!r}; "
                            f"available: {', '.join(sorted(names)[:10])}{' ...' if len(names) > 10 else ''}")
        val = [d for d in docs if d[0] in set(val_docs)]
        train = [d for d in docs if d[0] not in set(val_docs)]
    else:
        n_val = max(1, int(round(len(docs) * val_fraction)))
        train, val = docs[:-n_val], docs[-n_val:]
    if not train:
        raise DataError(f"no training documents left in {source!r} after holding out {len(val)} for validation")
    return train, val


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(source: str | Path, out_dir: str | Path, tokenizer: str = "bpe", vocab_size: int = 4096,
            val_docs: Optional[Sequence[str]] = None, val_fraction: float = 0.1, overwrite: bool = False,
            tokenizer_file: Optional[str | Path] = None) -> dict:
    """Tokenise the documents at ``source`` into ``out_dir`` (see module docstring); returns the manifest.
    ``tokenizer_file``: use this existing ``tokenizer.json`` (e.g. an imported run's) instead of training one.

    Raises DataError for bad input, an existing non-empty ``out_dir`` without ``overwrite`` (with it, one
    that is not a prepared data folder), or an ``out_dir`` that holds ``source``. The
    folder is written beside and renamed into place, so a failure leaves nothing half-written.
    """
    out_dir = Path(out_dir)
    src = Path(source).resolve()
    if out_dir.resolve() == src or out_dir.resolve() in src.parents:
        raise DataError(f"--out {str(out_dir)!r} holds the input documents {str(source)!r}; write the prepared "
                        f"data to another folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out {str(out_dir)!r} is a file, not a folder; choose a folder path")
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise DataError(f"output folder {str(out_dir)!r} already exists and is not empty; "
                            f"choose another --out or pass --overwrite")
        if not (out_dir / "manifest.json").is_file():  # --overwrite replaces prepared data, nothing else
            raise DataError(f"--overwrite refused: {str(out_dir)!r} is not a prepared data folder (no manifest.json) "
                            f"and would be deleted; choose another --out")
    docs = read_documents(source)
    train, val = split_documents(docs, val_docs, val_fraction, str(source))
    if tokenizer_file is not None:
        if not Path(tokenizer_file).is_file():
            raise DataError(f"tokenizer file {str(tokenizer_file)!r} " + ("is not a file; give a tokenizer.json"
                            if Path(tokenizer_file).exists() else "does not exist"))
        tok = Tokenizer.load(tokenizer_file)
    elif tokenizer == "bytes":
        tok = Tokenizer.bytes_tokenizer()
    elif tokenizer == "bpe":
        tok = Tokenizer.train_bpe((b.decode("utf-8", errors="replace") for _, b in train), vocab_size)
    else:
        raise DataError(f"tokenizer={tokenizer!r} is not valid; choose 'bpe' or 'bytes'")
    dtype = np.uint16 if tok.vocab_size <= 2 ** 16 else np.uint32

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if tokenizer_file is not None:  # byte for byte, so runs and data compare equal
        shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
    else:
        tok.save(tmp / "tokenizer.json")
    manifest = {
        "version": MANIFEST_VERSION,
        "source": str(Path(source).resolve()),
        "tokenizer": {"type": tok.kind, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
                      "file": "tokenizer.json", "sha256": _sha256(tmp / "tokenizer.json")},
        "dtype": np.dtype(dtype).name,
        "splits": {},
    }
    for split, split_docs in (("train", train), ("val", val)):
        ids_per_doc = [tok.encode_bytes(b) for _, b in split_docs]
        stream = np.empty(sum(len(i) + 1 for i in ids_per_doc), dtype=dtype)
        pos = 0
        for ids in ids_per_doc:
            stream[pos] = tok.eot_id
            stream[pos + 1: pos + 1 + len(ids)] = ids
            pos += len(ids) + 1
        stream.tofile(tmp / f"{split}.bin")
        manifest["splits"][split] = {
            "file": f"{split}.bin",
            "documents": [{"name": n, "bytes": len(b), "tokens": len(i)} for (n, b), i in zip(split_docs, ids_per_doc)],
            "bytes": sum(len(b) for _, b in split_docs),
            "tokens": int(len(stream)),
        }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return manifest


class TokenData:
    """A prepared data folder: its manifest, tokenizer, and token streams as read-only memmaps."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        path = self.folder / "manifest.json"
        if not path.is_file():
            raise DataError(f"{str(self.folder)!r} is not a prepared data folder (no manifest.json); "
                            f"run `lmlab prepare --data PATH --out {self.folder}` first")
        try:
            self.manifest = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"manifest {str(path)!r} could not be read: {exc}") from None
        tok_info = self.manifest["tokenizer"]
        tok_path = self.folder / tok_info["file"]
        if not tok_path.is_file() or _sha256(tok_path) != tok_info["sha256"]:
            raise DataError(f"tokenizer {str(tok_path)!r} does not match manifest {str(path)!r} "
                            f"(missing or changed since prepare); re-run `lmlab prepare`")
        self.tokenizer = Tokenizer.load(tok_path)
        self.vocab_size = self.tokenizer.vocab_size

    def tokens(self, split: str) -> np.ndarray:
        """The token stream of ``split`` ('train' | 'val'), (n_tokens,) memmap."""
        info = self.manifest["splits"][split]
        path = self.folder / info["file"]
        arr = np.memmap(path, dtype=self.manifest["dtype"], mode="r")
        if len(arr) != info["tokens"]:
            raise DataError(f"{str(path)!r} holds {len(arr)} tokens, manifest says {info['tokens']}; "
                            f"the file is truncated or changed: re-run `lmlab prepare`")
        if len(arr) and int(arr.max()) >= self.vocab_size:
            raise DataError(f"{str(path)!r} holds token id {int(arr.max())} >= tokenizer vocab_size "
                            f"{self.vocab_size}: the shards do not match the tokenizer; re-run `lmlab prepare`")
        return arr

    def bytes(self, split: str) -> int:
        """UTF-8 bytes of the documents of ``split``."""
        return int(self.manifest["splits"][split]["bytes"])
