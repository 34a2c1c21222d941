"""Tokenizers, corpus preparation and the default corpus."""

import hashlib
import json

import numpy as np
import pytest

from lmlab.data.documents import read_documents
from lmlab.data.prepare import DataError, prepare
from lmlab.data.shards import TokenData
from lmlab.data.tokenizer import EOT, Tokenizer, TokenizerError

SAMPLES = ["Hamlet — to be, or not to be ✓", "naïve café 日本語 😀", "", "tabs\tand\r\nnewlines\n\n"]
RAW = [b"\xff\xfe\x00abc", b"caf\xc3", b"\xc3\xa9\x80\x80 ok", bytes(range(256))]


@pytest.fixture(scope="module")
def bpe(small_corpus):
    texts = [p.read_text() for p in sorted(small_corpus.glob("*.txt"))]
    return Tokenizer.train_bpe(texts, 600)


def test_bpe_round_trip_and_vocab(bpe):
    assert bpe.vocab_size == 600
    assert bpe.eot_id == bpe.hf.token_to_id(EOT)
    for text in SAMPLES:
        assert bpe.decode(bpe.encode(text)) == text
    for raw in RAW:
        ids = bpe.encode_bytes(raw)
        assert bpe.decode_bytes(ids) == raw
    # BPE compresses English: fewer tokens than bytes on real text
    text = "To be, or not to be, that is the question"
    assert len(bpe.encode(text)) < len(text.encode()) / 2


def test_literal_end_of_text_is_text(tmp_path):
    """A document or prompt that contains the string "<|endoftext|>" round-trips as text (never the EOT
    id, also after save/load and through prepare), and BPE training learns no piece of that string."""
    texts = ["hello world <|endoftext|> foo bar " * 50, "x <|endoftext|> y " * 50, "the cat sat " * 50]
    tok = Tokenizer.train_bpe(texts, 400)
    assert [t for t in tok.hf.get_vocab() if t != EOT and ("<|" in t or "oftext" in t)] == []
    raw = b"x <|endoftext|> y"
    for t in (tok, Tokenizer.load(_saved(tok, tmp_path / "t.json"))):
        ids = t.encode_bytes(raw)
        assert t.eot_id not in ids and t.decode_bytes(ids) == raw
        assert t.eot_id not in t.encode_batch([raw.decode()])[0] and t.decode(t.encode(EOT)) == EOT
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("x <|endoftext|> y\n" * 40)
    (docs / "b.txt").write_text("the cat sat\n" * 40)
    prepare(docs, tmp_path / "data", "bpe", 300, val_docs=["b.txt"])
    data = TokenData(tmp_path / "data")
    train = list(data.tokens("train"))
    assert train.count(data.tokenizer.eot_id) == 1  # only the one lmlab puts before the document
    assert data.tokenizer.decode_bytes(train) == ("x <|endoftext|> y\n" * 40).encode()


def _saved(tok, path):
    tok.save(path)
    return path


def test_bytes_round_trip():
    tok = Tokenizer.bytes_tokenizer()
    assert (tok.vocab_size, tok.eot_id) == (257, 256)
    for text in SAMPLES:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    for raw in RAW:
        assert tok.decode_bytes(tok.encode_bytes(raw)) == raw
    assert tok.decode([0x63, 0x61, 0x66, 0xC3]) == "caf\ufffd"  # invalid UTF-8 -> replacement char


def test_tokenizer_save_load(tmp_path, bpe):
    bpe.save(tmp_path / "t.json")
    again = Tokenizer.load(tmp_path / "t.json")
    assert again.encode("Wherefore art thou") == bpe.encode("Wherefore art thou")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="bad.json"):
        Tokenizer.load(tmp_path / "bad.json")
    with pytest.raises(TokenizerError, match="vocab_size=100"):
        Tokenizer.train_bpe(["abc"], 100)


@pytest.mark.parametrize("kind", ["bpe", "bytes"])
def test_prepare_splits_whole_documents(tmp_path, small_corpus, kind):
    m = prepare(small_corpus, tmp_path / "d", kind, 500, val_docs=["tempest_gut.txt"])
    data = TokenData(tmp_path / "d")
    tok = data.tokenizer
    for split, names in (
        ("train", ["macbeth_gut.txt", "othello_gut.txt", "sonnets_gut.txt"]),
        ("val", ["tempest_gut.txt"]),
    ):
        info = m["splits"][split]
        assert [d["name"] for d in info["documents"]] == names
        raw = [(small_corpus / n).read_bytes() for n in names]
        assert info["bytes"] == sum(len(r) for r in raw)
        stream = data.tokens(split)
        assert stream.dtype == np.uint16 and len(stream) == info["tokens"]
        # the stream is EOT doc EOT doc ...: splitting at EOT gives back each document's bytes
        eots = np.flatnonzero(stream == tok.eot_id)
        assert len(eots) == len(names) and eots[0] == 0
        pieces = np.split(stream, eots[1:])
        assert [tok.decode_bytes(p[1:].tolist()) for p in pieces] == raw
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["tokenizer"]["type"] == kind


def _hash_fraction(raw: bytes) -> float:
    """The split key by hand: BLAKE2b-64 of the document's bytes as a fraction of 2**64."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big") / 2**64


def test_prepare_single_file_splits_at_paragraphs_by_hash(tmp_path):
    paras = [f"Paragraph {i}. " + "word " * 20 for i in range(20)]
    f = tmp_path / "play.txt"
    f.write_text("\n\n".join(paras))
    m = prepare(f, tmp_path / "d", "bytes", val_fraction=0.1)
    want = [f"play.txt#{i}" for i, p in enumerate(paras) if _hash_fraction(p.encode()) < 0.1]
    assert want  # this corpus has some (2): the rule, not the fallback, is tested
    assert [d["name"] for d in m["splits"]["val"]["documents"]] == want
    assert len(m["splits"]["train"]["documents"]) == 20 - len(want)


def test_hash_split_is_stable_as_the_corpus_grows(tmp_path):
    """Adding documents moves none of the old ones between the splits (a 'last 10%' rule would)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"d{i:03d}.txt").write_text(f"text number {i} " * 5)
    before = prepare(docs, tmp_path / "a", "bytes", val_fraction=0.2)
    for i in range(30, 60):
        (docs / f"d{i:03d}.txt").write_text(f"text number {i} " * 5)
    after = prepare(docs, tmp_path / "b", "bytes", val_fraction=0.2)
    val = lambda m: {d["name"] for d in m["splits"]["val"]["documents"]}  # noqa: E731
    old = {f"d{i:03d}.txt" for i in range(30)}
    assert val(after) & old == val(before) and len(val(after)) > len(val(before))
    want = {p.name for p in docs.iterdir() if _hash_fraction(p.read_bytes()) < 0.2}
    assert val(after) == want


def test_hash_split_holds_out_the_nearest_document_when_none_falls_below(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = {f"{c}.txt": f"{c} " * 9 for c in "abc"}
    for name, text in texts.items():
        (docs / name).write_text(text)
    keys = {name: _hash_fraction(t.encode()) for name, t in texts.items()}
    fraction = min(keys.values()) / 2  # below every key: none falls under it
    m = prepare(docs, tmp_path / "d", "bytes", val_fraction=fraction)
    assert [d["name"] for d in m["splits"]["val"]["documents"]] == [min(keys, key=keys.get)]
    assert any("nearest" in n for n in m["notes"])


def test_prepare_bad_input(tmp_path, small_corpus):
    with pytest.raises(DataError, match="does not exist"):
        prepare(tmp_path / "nope", tmp_path / "d")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no non-empty .txt"):
        prepare(tmp_path / "empty", tmp_path / "d")
    (tmp_path / "e.txt").write_text("  \n")
    with pytest.raises(DataError, match="empty"):
        read_documents(tmp_path / "e.txt")
    with pytest.raises(DataError, match="hamlet"):
        prepare(small_corpus, tmp_path / "d", "bytes", val_docs=["hamlet_gut.txt"])
    prepare(small_corpus, tmp_path / "d", "bytes")
    before = (tmp_path / "d" / "train.bin").read_bytes()
    with pytest.raises(DataError, match="already exists"):
        prepare(small_corpus, tmp_path / "d", "bpe", 300)
    assert (tmp_path / "d" / "train.bin").read_bytes() == before  # nothing overwritten


def test_manifest_tokenizer_mismatch_refused(tmp_path, small_corpus):
    prepare(small_corpus, tmp_path / "a", "bytes")
    prepare(small_corpus, tmp_path / "b", "bpe", 300)
    (tmp_path / "a" / "tokenizer.json").write_bytes((tmp_path / "b" / "tokenizer.json").read_bytes())
    with pytest.raises(DataError, match="does not match manifest"):
        TokenData(tmp_path / "a")


def test_default_corpus_is_complete(shakespeare):
    from lmlab.data.corpus import TOTAL_BYTES, VALIDATION_WORKS, WORKS, _complete

    assert len(WORKS) == 42 and TOTAL_BYTES == 5_057_198
    assert _complete(shakespeare)
    assert all(name in WORKS for name in VALIDATION_WORKS)


def test_a_folder_of_documents_given_as_data_names_the_prepare_command_that_works(tmp_path):
    """The hint for a folder that is not prepared: where it holds documents, prepare them into another
    folder (`lmlab prepare` refuses to write into the folder of its input)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("some text\n")
    with pytest.raises(DataError, match=rf"prepare them into another folder, `lmlab prepare --data {docs} --out DIR`"):
        TokenData(docs)
    with pytest.raises(DataError, match=rf"run `lmlab prepare --data PATH --out {tmp_path / 'new'}` first"):
        TokenData(tmp_path / "new")
