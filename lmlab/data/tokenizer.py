"""Tokenizers: byte-level BPE trained with Hugging Face ``tokenizers``, or raw UTF-8 bytes.

Both reserve one special token, ``<|endoftext|>`` (EOT), which lmlab places before every document.
- "bpe": byte-level BPE (GPT-2; Radford et al. 2019): text -> UTF-8 bytes -> merges; any byte
  sequence is representable. The trained vocabulary has ``vocab_size`` entries, EOT included (id 0).
- "bytes": ids 0..255 are the bytes themselves and 256 is EOT: vocab_size 257.
- "hf": any other Hugging Face ``tokenizer.json`` (an imported model's: SentencePiece-style BPE with
  byte fallback, byte-level BPE with special tokens, ...). Text is encoded without the tokenizer's
  post-processor (no BOS added); the token placed before each document ("EOT") is its <|endoftext|>,
  else its beginning-of-sequence token (<s>, <bos>, ...), else an end-of-sequence one. Token bytes:
  ``<0xNN>`` byte-fallback pieces are that byte, byte-level pieces go through the
  byte table, SentencePiece's U+2581 is a space, special tokens are empty.

Bounded pre-tokenisation: lmlab's BPE splits every pre-tokenisation chunk (GPT-2 regex word) longer
than :data:`MAX_CHUNK_BYTES` into pieces of at most that many bytes (a ``Split`` after ``ByteLevel``),
so no token spans more and BPE training / encoding cannot go quadratic on one giant "word" (a 1 MB
line without whitespace). Real text rarely has such chunks (the Shakespeare corpus has none over 200
bytes, so its tokenizer is unchanged); :func:`long_chunks` counts them for a note.

``encode_bytes``/``decode_bytes`` round-trip arbitrary bytes, including ones that are not valid UTF-8
(an invalid byte becomes its single-byte token); ``decode`` returns text with U+FFFD for invalid UTF-8.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from lmlab.fsutil import atomic_write_text
from lmlab.json_checks import check_nesting

EOT = "<|endoftext|>"
MAX_CHUNK_BYTES = 256  # longest pre-tokenisation chunk lmlab's BPE sees; longer ones are cut into pieces


class TokenizerError(ValueError):
    """A tokenizer file that is missing, unreadable or of an unknown kind."""


@lru_cache(maxsize=1)
def byte_level_alphabet() -> tuple[dict[int, str], dict[str, int]]:
    """The reversible byte -> printable-unicode table of byte-level BPE (GPT-2's ``bytes_to_unicode``):
    printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onward in byte order.
    This is the table HF ``tokenizers``' ByteLevel pre-tokenizer uses. Returns (byte->char, char->byte)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table, {c: b for b, c in table.items()}


_SURROGATES = re.compile("([\udc80-\udcff]+)")
_ANY_SURROGATE = re.compile("[\ud800-\udfff]")


class Tokenizer:
    """A trained tokenizer. Use :meth:`train_bpe`, :meth:`bytes_tokenizer` or :meth:`load` to build one."""

    def __init__(self, kind: str, hf=None, byte_level: bool = True):
        self.kind = kind
        self.hf = hf
        if hf is not None:
            # text is text: a literal "<|endoftext|>" (or another special token's string) in a document
            # or a prompt is encoded as its characters, never as the special id (lmlab places EOT itself)
            hf.encode_special_tokens = True
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
    HF_EOT_NAMES = (
        "<|endoftext|>",
        "<s>",
        "<bos>",
        "<|begin_of_text|>",
        "<BOS_TOKEN>",
        "</s>",
        "<eos>",
        "<|end_of_text|>",
        "<|im_end|>",
    )

    def _init_hf(self, hf, byte_level: bool) -> None:
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        # None: no separator; only what needs one (a document start, --stop-at-eot, preparing a corpus)
        # refuses, when it asks for eot_id; a prompt is encoded without one
        self.eot_id = next((hf.token_to_id(n) for n in self.HF_EOT_NAMES if hf.token_to_id(n) is not None), None)
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

    @property
    def eot_id(self) -> int:
        """The id placed before every document; raises TokenizerError when the tokenizer has none of
        :data:`HF_EOT_NAMES` (an imported tokenizer without special tokens)."""
        if self._eot_id is None:
            raise TokenizerError(
                f"the tokenizer has none of the document separators {', '.join(self.HF_EOT_NAMES)}; "
                f"give a prompt (generation from a document start needs one)"
            )
        return self._eot_id

    @eot_id.setter
    def eot_id(self, value: Optional[int]) -> None:
        self._eot_id = value

    def special_tokens(self) -> dict[str, int]:
        """The special tokens' literal texts and ids (``<|endoftext|>`` -> 256 for bytes)."""
        if self.kind == "bytes":
            return {EOT: 256}
        return {t.content: i for i, t in self.hf.get_added_tokens_decoder().items() if t.special}

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
            raise TokenizerError(
                f"vocab_size={vocab_size!r} is too small for byte-level BPE; it needs >= 257 (256 bytes + {EOT})"
            )
        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = _bounded_byte_level()
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        # the trainer does not split at special tokens: cut the texts there, so no merge learns a piece
        # of the reserved string (b"<|", b"endoftext") from a literal occurrence
        hf.train_from_iterator((piece for t in texts for piece in t.split(EOT)), trainer=trainer)
        return cls("bpe", hf)

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load ``tokenizer.json``: an HF tokenizer file, or lmlab's ``{"type": "bytes"}``; raises
        TokenizerError naming the file when it is unreadable, not JSON or nested too deep."""

        path = Path(path)
        try:
            data = json.loads(check_nesting(path.read_text(), f"tokenizer file {str(path)!r}", TokenizerError))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"tokenizer file {str(path)!r} could not be read: {exc}") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Tokenizer":
        """A tokenizer from the parsed contents of a ``tokenizer.json`` (``where`` names it in errors)."""
        path = where
        if not isinstance(data, dict):
            raise TokenizerError(
                f"tokenizer file {str(path)!r} holds a JSON {type(data).__name__}, not an object "
                f'(a Hugging Face tokenizer.json or lmlab\'s {{"type": "bytes"}}); re-run '
                f"`lmlab prepare` or restore the file"
            )
        if data.get("type") == "bytes":
            if data.get("vocab_size", 257) != 257 or data.get("eot", 256) != 256:
                raise TokenizerError(
                    f"tokenizer file {str(path)!r}: a bytes tokenizer has vocab_size 257 and eot "
                    f"256, not {data.get('vocab_size')!r} / {data.get('eot')!r}"
                )
            return cls.bytes_tokenizer()
        if "model" not in data:
            raise TokenizerError(
                f'tokenizer file {str(path)!r} has no key \'model\' (nor "type": "bytes"): not a tokenizer.json'
            )
        from tokenizers import Tokenizer as HFTokenizer

        try:
            hf = HFTokenizer.from_str(json.dumps(data))
        except Exception as exc:  # tokenizers raises a plain Exception for malformed files
            raise TokenizerError(f"tokenizer file {str(path)!r} is not a valid tokenizer: {exc}") from None
        if data.get("post_processor") is None and hf.token_to_id(EOT) is not None:
            try:
                return cls("bpe", hf)  # lmlab's own byte-level BPE
            except (KeyError, TypeError, IndexError):
                pass
        byte_level = '"ByteLevel"' in json.dumps([data.get("pre_tokenizer"), data.get("decoder")])
        return cls("hf", hf, byte_level)

    @classmethod
    def from_vocab_merges(cls, vocab: str | Path, merges: str | Path) -> "Tokenizer":
        """GPT-2-style byte-level BPE from ``vocab.json`` + ``merges.txt`` (the files of GPT-2, RoBERTa
        and other slow-tokenizer folders): the BPE model from the tokenizers library with GPT-2's
        byte-level pre-tokeniser and decoder, ``<|endoftext|>`` (when the vocabulary has it) a special
        token. Raises TokenizerError naming the files when they cannot be read."""
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        try:
            hf = HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
        except Exception as exc:  # tokenizers raises a plain Exception for malformed files
            raise TokenizerError(
                f"{str(vocab)!r} + {str(merges)!r} are not a BPE vocabulary and merges: {exc}"
            ) from None
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.ByteLevel()
        if hf.token_to_id(EOT) is not None:
            hf.add_special_tokens([AddedToken(EOT, special=True)])
        return cls.from_json(json.loads(hf.to_str()), f"{vocab} + {merges}")

    @classmethod
    def from_folder(cls, folder: str | Path) -> tuple[Optional["Tokenizer"], Optional[str]]:
        """The tokenizer of a Hugging Face model folder: its ``tokenizer.json``, else GPT-2-style
        ``vocab.json`` + ``merges.txt`` (:meth:`from_vocab_merges`). Returns (tokenizer, the
        tokenizer.json text to store), or (None, None) when the folder has neither."""
        folder = Path(folder)
        if (folder / "tokenizer.json").is_file():
            return cls.load(folder / "tokenizer.json"), (folder / "tokenizer.json").read_text()
        if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            tok = cls.from_vocab_merges(folder / "vocab.json", folder / "merges.txt")
            return tok, tok.hf.to_str(pretty=True)
        return None, None

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` atomically (temp file + fsync + rename: never a half-written file)."""

        if self.kind == "bytes":
            atomic_write_text(path, json.dumps({"type": "bytes", "vocab_size": 257, "eot": 256}))
        else:
            atomic_write_text(path, self.hf.to_str(pretty=True))

    @property
    def segment_mode(self) -> str:
        """Where a long document may be cut into pieces encoded one by one with the same ids as whole:
        ``"any"`` (bytes), ``"safe"`` (byte-level BPE with GPT-2's regex and no normaliser: at a space or
        line break between printable ASCII, see :mod:`lmlab.data.prepare`), else ``"whole"``."""
        if self.kind == "bytes":
            return "any"
        if getattr(self, "_segment_mode", None) is None:
            data = json.loads(self.hf.to_str())
            pre = data.get("pre_tokenizer") or {}
            parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
            first_ok = bool(parts) and parts[0].get("type") == "ByteLevel" and parts[0].get("use_regex", True)
            rest_ok = all(p.get("type") == "Split" for p in parts[1:])
            self._segment_mode = "safe" if data.get("normalizer") is None and first_ok and rest_ok else "whole"
        return self._segment_mode

    # --- encoding --------------------------------------------------------------------------
    def encode(self, text: str, allowed_special: Iterable[str] | str = ()) -> list[int]:
        """Text -> token ids (no EOT added). A special token's literal text (``<|endoftext|>``) is encoded
        as text, unless it is in ``allowed_special`` (special token texts, or ``"all"``; as tiktoken's
        ``allowed_special``), where it becomes that token. Text holding undecodable bytes as surrogate
        escapes (``os.fsdecode``, a command-line argument: U+DC80..U+DCFF) is encoded as those bytes by
        the bytes and BPE tokenizers (:meth:`encode_bytes`). Raises TokenizerError for such bytes on an
        imported tokenizer (it has no byte tokens), for other lone surrogates, and for an
        ``allowed_special`` entry that is not one of :meth:`special_tokens` (naming the valid ones)."""
        if allowed_special:
            specials = self.special_tokens()
            wanted = (
                list(specials)
                if allowed_special == "all"
                else ([allowed_special] if isinstance(allowed_special, str) else list(allowed_special))
            )
            unknown = [t for t in wanted if t not in specials]
            if unknown:
                raise TokenizerError(
                    f"allowed_special: {unknown[0]!r} is not a special token of this tokenizer; "
                    f"its special tokens: {', '.join(map(repr, specials)) or 'none'}, or 'all'"
                )
            if wanted:
                pattern = "(" + "|".join(re.escape(t) for t in sorted(set(wanted), key=len, reverse=True)) + ")"
                ids: list[int] = []
                for i, part in enumerate(re.split(pattern, text)):
                    ids.extend([specials[part]] if i % 2 else self.encode(part))
                return ids
        if not text:
            return []
        if _ANY_SURROGATE.search(text):
            return self._encode_escaped(text)
        if self.kind == "bytes":
            return list(text.encode("utf-8"))
        if self.kind == "hf":
            return self.hf.encode(text, add_special_tokens=False).ids
        return self.hf.encode(text).ids

    def _encode_escaped(self, text: str) -> list[int]:
        """Text with surrogates: the undecodable bytes its surrogate escapes stand for, as bytes."""
        at = _ANY_SURROGATE.search(text).start()
        try:
            data = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError as exc:
            raise TokenizerError(
                f"the text holds a lone surrogate U+{ord(text[exc.start]):04X} at character "
                f"{exc.start}, which stands for no bytes; give UTF-8 text"
            ) from None
        if self.kind == "hf":
            raise TokenizerError(
                f"the text holds byte {ord(text[at]) - 0xDC00:#04x} at character {at}, which is not "
                f"UTF-8, and this tokenizer has no byte tokens to hold it; give UTF-8 text"
            )
        return self.encode_bytes(data)

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

    def encode_bytes_batch(self, pieces: Sequence[bytes], dtype=np.int64) -> list[np.ndarray]:
        """:meth:`encode_bytes` of each of ``pieces`` (a list of (n_i,) arrays of ``dtype``), the text in
        one call of HF ``tokenizers``' batch encoder (``encode_batch_fast``: all cores, no offsets
        kept). Equal to encoding each piece alone."""
        if self.kind == "bytes":
            return [np.frombuffer(p, dtype=np.uint8).astype(dtype) for p in pieces]
        texts: list[str] = []
        plans: list[list] = []  # per piece: an int (index into texts) or a list of byte-token ids, in order
        for p in pieces:
            if self.kind == "hf":
                parts = [p.decode("utf-8", errors="replace")]
            else:
                parts = _SURROGATES.split(p.decode("utf-8", errors="surrogateescape"))
            plan = []
            for i, part in enumerate(parts):
                if i % 2:
                    plan.append([self._byte_ids[ord(c) - 0xDC00] for c in part])
                elif part:
                    plan.append(len(texts))
                    texts.append(part)
            plans.append(plan)
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)
        encoded = encode(texts, add_special_tokens=self.kind != "hf") if texts else []
        out = []
        for plan in plans:
            arrays = [np.asarray(encoded[x].ids if isinstance(x, int) else x, dtype=dtype) for x in plan]
            out.append(np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype))
        return out

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


def _bounded_byte_level():
    """GPT-2's byte-level pre-tokeniser followed by a cut of every chunk into pieces of at most
    :data:`MAX_CHUNK_BYTES` byte-level characters (= bytes: each byte is one character there)."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            pre_tokenizers.Split(Regex(f".{{1,{MAX_CHUNK_BYTES}}}"), behavior="isolated"),
        ]
    )


_LONG_RUN = re.compile(rb"[^ \t\n\r\x0b\x0c]{%d,}" % (MAX_CHUNK_BYTES + 1))


def long_chunks(data: bytes) -> tuple[int, int]:
    """(count, longest in bytes) of GPT-2 pre-tokenisation chunks in ``data`` longer than
    :data:`MAX_CHUNK_BYTES`, i.e. the chunks lmlab's BPE cuts into pieces. Only runs without ASCII
    whitespace are candidates; each is pre-tokenised exactly (cheap: such runs are rare)."""
    from tokenizers import pre_tokenizers

    count, longest = 0, 0
    pre = None
    for m in _LONG_RUN.finditer(data):
        pre = pre or pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        start = m.start() - (m.start() > 0 and data[m.start() - 1] == 0x20)  # a leading space joins the chunk
        for piece, _ in pre.pre_tokenize_str(data[start : m.end()].decode("utf-8", errors="replace")):
            if len(piece) > MAX_CHUNK_BYTES:
                count, longest = count + 1, max(longest, len(piece))
    return count, longest
