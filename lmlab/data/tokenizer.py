"""Tokenizers: byte-level BPE trained with Hugging Face ``tokenizers``, or raw UTF-8 bytes.

Both reserve one special token, ``<|endoftext|>`` (EOT), which lmlab places before every document.
- "bpe": byte-level BPE (GPT-2; Radford et al. 2019): text -> UTF-8 bytes -> merges; any byte
  sequence is representable. The trained vocabulary has ``vocab_size`` entries, EOT included (id 0).
- "bytes": ids 0..255 are the bytes themselves and 256 is EOT: vocab_size 257.

``encode_bytes``/``decode_bytes`` round-trip arbitrary bytes, including ones that are not valid UTF-8
(an invalid byte becomes its single-byte token); ``decode`` returns text with U+FFFD for invalid UTF-8.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

EOT = "<|endoftext|>"


class TokenizerError(ValueError):
    """A tokenizer file that is missing, unreadable or of an unknown kind."""


@lru_cache(maxsize=1)
def byte_level_alphabet() -> tuple[dict[int, str], dict[str, int]]:
    """The reversible byte -> printable-unicode table of byte-level BPE (GPT-2's ``bytes_to_unicode``):
    printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onward in byte order.
    This is the table HF ``tokenizers``' ByteLevel pre-tokenizer uses. Returns (byte->char, char->byte)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table, {c: b for b, c in table.items()}


_SURROGATES = re.compile("([\udc80-\udcff]+)")


class Tokenizer:
    """A trained tokenizer. Use :meth:`train_bpe`, :meth:`bytes_tokenizer` or :meth:`load` to build one."""

    def __init__(self, kind: str, hf=None):
        self.kind = kind
        self.hf = hf
        if kind == "bytes":
            self.vocab_size, self.eot_id = 257, 256
        elif kind == "bpe":
            self.vocab_size = hf.get_vocab_size()
            self.eot_id = hf.token_to_id(EOT)
            to_char, _ = byte_level_alphabet()
            self._byte_ids = [hf.token_to_id(to_char[b]) for b in range(256)]
            _, to_byte = byte_level_alphabet()
            self._id_bytes = []
            for i in range(self.vocab_size):
                tok = hf.id_to_token(i)
                self._id_bytes.append(b"" if tok == EOT else bytes(to_byte[c] for c in tok))
        else:
            raise TokenizerError(f"tokenizer kind {kind!r} is not valid; choose 'bpe' or 'bytes'")

    # --- construction ----------------------------------------------------------------------
    @classmethod
    def bytes_tokenizer(cls) -> "Tokenizer":
        return cls("bytes")

    @classmethod
    def train_bpe(cls, texts: Iterable[str], vocab_size: int) -> "Tokenizer":
        """Train byte-level BPE on ``texts`` with HF ``tokenizers`` (BpeTrainer): ``vocab_size`` >= 257
        entries (256 byte tokens + EOT + merges). Raises TokenizerError for a smaller vocab_size."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if not isinstance(vocab_size, int) or vocab_size < 257:
            raise TokenizerError(f"vocab_size={vocab_size!r} is too small for byte-level BPE; it needs >= 257 "
                                 f"(256 bytes + {EOT})")
        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        hf.train_from_iterator(texts, trainer=trainer)
        return cls("bpe", hf)

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load ``tokenizer.json``: an HF tokenizer file, or lmlab's ``{"type": "bytes"}``."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"tokenizer file {str(path)!r} could not be read: {exc}") from None
        if data.get("type") == "bytes":
            return cls.bytes_tokenizer()
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return cls("bpe", HFTokenizer.from_str(json.dumps(data)))
        except Exception as exc:  # tokenizers raises a plain Exception for malformed files
            raise TokenizerError(f"tokenizer file {str(path)!r} is not a valid tokenizer: {exc}") from None

    def save(self, path: str | Path) -> None:
        path = Path(path)
        if self.kind == "bytes":
            path.write_text(json.dumps({"type": "bytes", "vocab_size": 257, "eot": 256}))
        else:
            self.hf.save(str(path))

    # --- encoding --------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Text -> token ids (no EOT added)."""
        if self.kind == "bytes":
            return list(text.encode("utf-8"))
        return self.hf.encode(text).ids if text else []

    def encode_bytes(self, data: bytes) -> list[int]:
        """Arbitrary bytes -> token ids; bytes that are not valid UTF-8 become single-byte tokens."""
        if self.kind == "bytes":
            return list(data)
        ids: list[int] = []
        for i, part in enumerate(_SURROGATES.split(data.decode("utf-8", errors="surrogateescape"))):
            if i % 2:  # a run of undecodable bytes, escaped as U+DC80..U+DCFF
                ids.extend(self._byte_ids[ord(c) - 0xDC00] for c in part)
            elif part:
                ids.extend(self.hf.encode(part).ids)
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self.kind == "bytes":
            return [list(t.encode("utf-8")) for t in texts]
        return [e.ids for e in self.hf.encode_batch(list(texts))]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Token ids -> the exact bytes they stand for (EOT decodes to nothing)."""
        if self.kind == "bytes":
            return bytes(i for i in ids if i != self.eot_id)
        return b"".join(self._id_bytes[i] for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        """The bytes of one token id (b'' for EOT)."""
        return self.decode_bytes([i])
