"""Tokenizers: byte-level BPE trained with Hugging Face ``tokenizers``, or raw UTF-8 bytes.

Both reserve one special token, ``<|endoftext|>`` (EOT), which lmlab places before every document.
- "bpe": byte-level BPE (GPT-2; Radford et al. 2019): text -> UTF-8 bytes -> merges; any byte
  sequence is representable. The trained vocabulary has ``vocab_size`` entries, EOT included (id 0).
- "bytes": ids 0..255 are the bytes themselves and 256 is EOT: vocab_size 257.
- "hf": any other Hugging Face ``tokenizer.json`` (an imported model's: SentencePiece-style BPE with
  byte fallback, byte-level BPE with special tokens, ...). Text is encoded without the tokenizer's
  post-processor (no BOS added); the token placed before each document ("EOT") is its <|endoftext|>,
  else its beginning-of-sequence token (<s>, <bos>, ...), else an end-of-sequence one. Token bytes: ``<0xNN>`` byte-fallback pieces are that byte, byte-level pieces go through the
  byte table, SentencePiece's U+2581 is a space, special tokens are empty.

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

    def __init__(self, kind: str, hf=None, byte_level: bool = True):
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
        elif kind == "hf":
            self._init_hf(hf, byte_level)
        else:
            raise TokenizerError(f"tokenizer kind {kind!r} is not valid; choose 'bpe' or 'bytes'")

    # the token an HF tokenizer puts before a document, in order of preference: GPT-2's <|endoftext|>,
    # else the beginning-of-sequence token (Llama, Gemma, Llama 3, Cohere), else an end-of-sequence one
    HF_EOT_NAMES = ("<|endoftext|>", "<s>", "<bos>", "<|begin_of_text|>", "<BOS_TOKEN>", "</s>", "<eos>",
                    "<|end_of_text|>", "<|im_end|>")

    def _init_hf(self, hf, byte_level: bool) -> None:
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        self.eot_id = next((hf.token_to_id(n) for n in self.HF_EOT_NAMES if hf.token_to_id(n) is not None), None)
        if self.eot_id is None:
            raise TokenizerError(f"the tokenizer has none of the document separators {', '.join(self.HF_EOT_NAMES)}")
        specials = {t.content for t in hf.get_added_tokens_decoder().values() if t.special}
        _, to_byte = byte_level_alphabet()
        self._id_bytes = []
        for i in range(self.vocab_size):
            tok = hf.id_to_token(i)
            if tok is None or tok in specials:
                self._id_bytes.append(b"")
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", tok):
                self._id_bytes.append(bytes([int(tok[3:5], 16)]))
            elif byte_level and all(c in to_byte for c in tok):
                self._id_bytes.append(bytes(to_byte[c] for c in tok))
            else:
                self._id_bytes.append(tok.replace("\u2581", " ").encode("utf-8"))

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
            hf = HFTokenizer.from_str(json.dumps(data))
        except Exception as exc:  # tokenizers raises a plain Exception for malformed files
            raise TokenizerError(f"tokenizer file {str(path)!r} is not a valid tokenizer: {exc}") from None
        if data.get("post_processor") is None and hf.token_to_id(EOT) is not None:
            try:
                return cls("bpe", hf)  # lmlab's own byte-level BPE
            except (KeyError, TypeError):
                pass
        byte_level = '"ByteLevel"' in json.dumps([data.get("pre_tokenizer"), data.get("decoder")])
        return cls("hf", hf, byte_level)

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
        if self.kind == "hf":
            return self.hf.encode(text, add_special_tokens=False).ids if text else []
        return self.hf.encode(text).ids if text else []

    def encode_bytes(self, data: bytes) -> list[int]:
        """Arbitrary bytes -> token ids; bytes that are not valid UTF-8 become single-byte tokens."""
        if self.kind == "bytes":
            return list(data)
        if self.kind == "hf":  # no byte tokens to escape into: invalid UTF-8 becomes U+FFFD
            return self.encode(data.decode("utf-8", errors="replace"))
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
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=self.kind != "hf")]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Token ids -> the exact bytes they stand for (EOT decodes to nothing)."""
        if self.kind == "bytes":
            return bytes(i for i in ids if i != self.eot_id)
        n = len(self._id_bytes)  # an imported model's padded embedding rows have no token: no bytes
        return b"".join(self._id_bytes[i] if i < n else b"" for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        """The bytes of one token id (b'' for EOT)."""
        return self.decode_bytes([i])
