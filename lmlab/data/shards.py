"""A prepared data folder (the output of ``lmlab prepare``, :mod:`lmlab.data.prepare`): its manifest,
tokenizer and token shards, opened as :class:`TokenData`, every field checked before use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from lmlab.data.sources import JSON_SUFFIXES, PARQUET_SUFFIXES, DataError
from lmlab.data.tokenizer import Tokenizer
from lmlab.fsutil import sha256_file


def _key(obj, key: str, kind, path: Path, where: str = ""):
    """``obj[key]`` checked to be of ``kind``; DataError naming the file and the key otherwise."""
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(
            f"manifest {str(path)!r} has no key {where + key!r}; the file is damaged or not "
            f"lmlab's: re-run `lmlab prepare`"
        )
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DataError(
            f"manifest {str(path)!r}: {where + key!r} is {value!r:.60}, not a {names}; the file is "
            f"damaged: re-run `lmlab prepare`"
        )
    return value


def _file_name(obj, key: str, path: Path, where: str) -> str:
    name = _key(obj, key, str, path, where)
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise DataError(
            f"manifest {str(path)!r}: {where + key!r} = {name!r} is not a file name inside the data "
            f"folder; the file is damaged: re-run `lmlab prepare`"
        )
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
            holds_text = self.folder.is_dir() and any(  # the documents `lmlab prepare` reads
                p.name.endswith((".txt", *JSON_SUFFIXES, *PARQUET_SUFFIXES)) for p in self.folder.iterdir()
            )
            how = (
                f"it holds documents: prepare them into another folder, `lmlab prepare --data {self.folder} "
                f"--out DIR`, and pass DIR"
                if holds_text
                else f"run `lmlab prepare --data PATH --out {self.folder}` first"
            )
            raise DataError(f"{str(self.folder)!r} is not a prepared data folder (no manifest.json); {how}")
        try:
            from lmlab.json_checks import check_nesting

            self.manifest = json.loads(
                check_nesting(
                    path.read_text(),
                    f"manifest {str(path)!r}",
                    DataError,
                    "; the file is damaged: re-run `lmlab prepare`",
                )
            )
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(
                f"manifest {str(path)!r} could not be read ({exc}); the file is damaged: re-run `lmlab prepare`"
            ) from None
        if not isinstance(self.manifest, dict):
            raise DataError(
                f"manifest {str(path)!r} holds a JSON {type(self.manifest).__name__}, not an object; "
                f"the file is damaged: re-run `lmlab prepare`"
            )
        self._path = path
        tok_info = _key(self.manifest, "tokenizer", dict, path)
        tok_path = self.folder / _file_name(tok_info, "file", path, "tokenizer.")
        sha = _key(tok_info, "sha256", str, path, "tokenizer.")
        dtype = _key(self.manifest, "dtype", str, path)
        if dtype not in ("uint16", "uint32"):
            raise DataError(
                f"manifest {str(path)!r}: 'dtype' is {dtype!r}, not 'uint16' or 'uint32'; the file is "
                f"damaged: re-run `lmlab prepare`"
            )
        splits = _key(self.manifest, "splits", dict, path)
        for split in ("train", "val"):
            info = _key(splits, split, dict, path, "splits.")
            _file_name(info, "file", path, f"splits.{split}.")
            for key in ("tokens", "bytes"):
                if _key(info, key, int, path, f"splits.{split}.") < 0:
                    raise DataError(
                        f"manifest {str(path)!r}: 'splits.{split}.{key}' is negative; re-run `lmlab prepare`"
                    )
        if not tok_path.is_file() or sha256_file(tok_path) != sha:
            raise DataError(
                f"tokenizer {str(tok_path)!r} does not match manifest {str(path)!r} "
                f"(missing or changed since prepare); re-run `lmlab prepare`"
            )
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
            raise DataError(
                f"shard {str(path)!r} (manifest key 'splits.{split}.file') could not be read: "
                f"{exc.strerror or exc}; re-run `lmlab prepare`"
            ) from None
        if size != info["tokens"] * dtype.itemsize:
            raise DataError(
                f"shard {str(path)!r} has {size:,} bytes, manifest 'splits.{split}.tokens' says "
                f"{info['tokens']:,} {dtype.name} tokens ({info['tokens'] * dtype.itemsize:,} bytes): "
                f"the file is truncated or changed: re-run `lmlab prepare`"
            )
        if info["tokens"] == 0:
            return np.zeros(0, dtype=dtype)
        if split not in self._checked:
            want = info.get("sha256")
            if isinstance(want, str) and sha256_file(path) != want:
                raise DataError(
                    f"shard {str(path)!r} does not match its SHA-256 in the manifest "
                    f"('splits.{split}.sha256'): the file is damaged or changed: re-run `lmlab prepare`"
                )
        arr = np.memmap(path, dtype=dtype, mode="r")
        if split not in self._checked:
            top = int(arr.max())
            if top >= self.vocab_size:
                raise DataError(
                    f"{str(path)!r} holds token id {top} >= tokenizer vocab_size "
                    f"{self.vocab_size}: the shards do not match the tokenizer; re-run `lmlab prepare`"
                )
            self._checked[split] = True
        return arr

    def bytes(self, split: str) -> int:
        """UTF-8 bytes of the documents of ``split``."""
        return int(self.manifest["splits"][split]["bytes"])
