"""Corpora in the formats people keep (JSON lines, JSON arrays, parquet shards, a `datasets` folder)
prepare exactly the tokens of the same documents given as .txt files; bad records are refused naming
the file, row and field; memory does not grow with the corpus."""

import gzip
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lmlab.cli import main
from lmlab.data.prepare import DataError, expand_inputs, prepare
from lmlab.data.shards import TokenData
from lmlab.data.tokenizer import Tokenizer

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

WORDS = "the king and queen of france spoke to her lord with honour ye thou art café — naïve".split()


def _docs(n: int = 30) -> list[str]:
    rng = np.random.default_rng(0)
    return [f"Doc {i}.\n" + " ".join(rng.choice(WORDS, size=20 + 5 * i)) for i in range(n)]


def _as_txt(docs, folder):
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"doc{i:03d}.txt").write_text(d)
    return folder


def _write_jsonl(docs, path, field="text"):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, field: d}) + "\n")
    return path


def _same_data(a, b):
    """Two prepared folders hold the same tokens, tokenizer and per-document counts."""
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    for split in ("train", "val"):
        assert (a / f"{split}.bin").read_bytes() == (b / f"{split}.bin").read_bytes()
        strip = lambda m: [(d["bytes"], d["tokens"]) for d in m["splits"][split]["documents"]]  # noqa: E731
        assert strip(ma) == strip(mb) and len(strip(ma)) > 0
        for key in ("bytes", "tokens", "sha256", "file"):
            assert ma["splits"][split][key] == mb["splits"][split][key]
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert ma["tokenizer"] == mb["tokenizer"] and ma["dtype"] == mb["dtype"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The documents as .txt files, prepared with a trained BPE (vocab 320)."""
    root = tmp_path_factory.mktemp("ref")
    docs = _docs()
    prepare(_as_txt(docs, root / "txt"), root / "out", "bpe", 320, val_fraction=0.2)
    return docs, root / "out"


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json-array", "json-lines", "parquet-shards"])
def test_each_format_prepares_the_same_tokens_as_txt(tmp_path, reference, fmt):
    docs, ref = reference
    if fmt in ("jsonl", "jsonl.gz"):
        src = [_write_jsonl(docs, tmp_path / f"c.{fmt}")]
    elif fmt == "json-array":
        src = [tmp_path / "c.json"]
        src[0].write_text(json.dumps([{"text": d} for d in docs]))
    elif fmt == "json-lines":  # what datasets' to_json writes: JSON lines under a .json name
        src = [_write_jsonl(docs, tmp_path / "c.json")]
    else:
        (tmp_path / "shards").mkdir()
        src = []
        for k, part in enumerate((docs[:11], docs[11:25], docs[25:])):
            src.append(tmp_path / "shards" / f"part-{k}.parquet")
            pq.write_table(pa.table({"text": part, "n": list(range(len(part)))}), src[-1], row_group_size=4)
    m = prepare(src, tmp_path / "out", "bpe", 320, val_fraction=0.2)
    _same_data(ref, tmp_path / "out")
    names = [d["name"] for d in m["splits"]["train"]["documents"]]
    assert names[0] == f"{src[0].name}#0"


def test_datasets_folder_prepares_the_same_tokens_as_txt(tmp_path, reference):
    datasets = pytest.importorskip("datasets")
    docs, ref = reference
    datasets.Dataset.from_dict({"text": docs, "id": list(range(len(docs)))}).save_to_disk(str(tmp_path / "ds"))
    assert (
        main(
            [
                "prepare",
                "--data",
                str(tmp_path / "ds"),
                "--out",
                str(tmp_path / "out"),
                "--tokenizer",
                "bpe",
                "--vocab-size",
                "320",
                "--val-fraction",
                "0.2",
            ]
        )
        == 0
    )
    _same_data(ref, tmp_path / "out")
    # a DatasetDict: its splits in order, named folder/split#row
    dd = datasets.DatasetDict(
        {"a": datasets.Dataset.from_dict({"text": docs[:10]}), "b": datasets.Dataset.from_dict({"text": docs[10:]})}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    m = prepare(tmp_path / "dd", tmp_path / "out2", "bpe", 320, val_fraction=0.2)
    _same_data(ref, tmp_path / "out2")
    every = [d["name"] for s in ("train", "val") for d in m["splits"][s]["documents"]]
    assert "dd/a#0" in every and "dd/b#0" in every


def test_cli_takes_shards_and_a_quoted_glob_and_a_text_field(tmp_path, reference, capsys):
    docs, ref = reference
    (tmp_path / "s").mkdir()
    for k, part in enumerate((docs[:15], docs[15:])):
        _write_jsonl(part, tmp_path / "s" / f"p{k}.jsonl", field="body")
    out = tmp_path / "out"
    shards = [str(p) for p in sorted((tmp_path / "s").iterdir())]
    common = ["--vocab-size", "320", "--val-fraction", "0.2", "--text-field", "body"]
    assert main(["prepare", "--data", *shards, "--out", str(out), *common]) == 0
    _same_data(ref, out)
    assert main(["prepare", "--data", str(tmp_path / "s" / "*.jsonl"), "--out", str(tmp_path / "o2"), *common]) == 0
    _same_data(ref, tmp_path / "o2")
    assert json.loads((out / "manifest.json").read_text())["source"] == [
        str(p) for p in sorted((tmp_path / "s").resolve().iterdir())
    ]
    assert "MB/s" in capsys.readouterr().out
    # the default field is "text": these records have none, and the error says which they have
    assert main(["prepare", "--data", shards[0], "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert "p0.jsonl" in err and "row 0" in err and "'text'" in err and "'body'" in err and "--text-field" in err
    assert not (tmp_path / "o3").exists()


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"text": "a b"}\n{"text": "c d"\n', r"row 1 is not valid JSON"),
        ('{"text": "a b"}\n["c d"]\n', r"row 1: a JSON list, not an object"),
        ('{"text": "a b"}\n{"text": 7}\n', r"row 1: field 'text' is 7 \(int\), not a string"),
        ('{"text": "a b"}\n{"txt": "c"}\n', r"row 1 has no field 'text' \(its fields: 'txt'\)"),
        ('[{"text": "a"}, 3]', r"row 1: a JSON int"),
    ],
)
def test_bad_json_records_name_the_file_row_and_field(tmp_path, content, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(DataError, match=match) as info:
        prepare(f, tmp_path / "out", "bytes")
    assert "bad.jsonl" in str(info.value) and not (tmp_path / "out").exists()


def test_bad_parquet_and_globs_are_refused_clearly(tmp_path):
    pq.write_table(pa.table({"body": ["x y", "z w"]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a.parquet' has no column 'text' \(its columns: 'body'\)"):
        prepare(tmp_path / "a.parquet", tmp_path / "out", "bytes")
    pq.write_table(pa.table({"text": pa.array([1, 2])}), tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n.parquet' row 0: field 'text' is 1 \(int\), not a string"):
        prepare(tmp_path / "n.parquet", tmp_path / "out", "bytes")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="could not be read as parquet"):
        prepare(tmp_path / "junk.parquet", tmp_path / "out", "bytes")
    with pytest.raises(DataError, match=r"matches no file"):
        expand_inputs([str(tmp_path / "none-*.parquet")])
    (tmp_path / "z.jsonl.gz").write_bytes(b"\x1f\x8b\x08 broken")
    with pytest.raises(DataError, match="z.jsonl.gz' could not be read"):
        prepare(tmp_path / "z.jsonl.gz", tmp_path / "out", "bytes")
    # the same file name from two inputs would give two documents one name
    (tmp_path / "d1").mkdir(), (tmp_path / "d2").mkdir()
    for d in ("d1", "d2"):
        _write_jsonl(["one two", "three four"], tmp_path / d / "c.jsonl")
    with pytest.raises(DataError, match=r"two documents are named 'c.jsonl#0'"):
        prepare([tmp_path / "d1" / "c.jsonl", tmp_path / "d2" / "c.jsonl"], tmp_path / "out", "bytes")
    assert not (tmp_path / "out").exists()


def test_blank_records_are_skipped_and_rows_keep_their_numbers(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "alpha beta"}\n\n{"text": "  \\n "}\n{"text": "gamma"}\n{"text": "delta"}\n')
    m = prepare(f, tmp_path / "out", "bytes", val_docs=["c.jsonl#3"])
    assert [d["name"] for d in m["splits"]["train"]["documents"]] == ["c.jsonl#0", "c.jsonl#2"]
    stream = TokenData(tmp_path / "out").tokens("train")
    assert bytes(stream[stream != 256].astype(np.uint8)) == b"alpha betagamma"


def test_encode_bytes_batch_equals_one_at_a_time(tmp_path):
    bpe = Tokenizer.train_bpe(_docs(10), 300)
    pieces = [b"the king", b"", b"caf\xc3\xa9 \xff\xfe broken utf-8 \xc3", b"<|endoftext|> as text", b"x" * 300]
    for tok in (bpe, Tokenizer.bytes_tokenizer()):
        got = tok.encode_bytes_batch(pieces)
        assert [g.tolist() for g in got] == [tok.encode_bytes(p) for p in pieces]
        assert [tok.decode_bytes(g.tolist()) for g in got] == pieces


RSS_SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from lmlab.data.prepare import prepare

    def rss_kib():
        return int(open("/proc/self/statm").read().split()[1]) * 4

    peak, done = [rss_kib()], threading.Event()

    def sample():  # ru_maxrss would start at the parent's size (fork), so sample the RSS instead
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib())
            time.sleep(0.001)

    thread = threading.Thread(target=sample)
    thread.start()
    prepare(sys.argv[1], sys.argv[2], sys.argv[3])
    done.set()
    thread.join()
    print(peak[0])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path, tokenizer):
    """A JSON-lines corpus 10x larger (3 MB -> 30 MB) raises the peak RSS of `prepare` by under 20%:
    documents are streamed, not loaded (holding the file would add its size several times over; the
    peak is about 55 MB with bytes, 95-105 MB with BPE training)."""
    rng = np.random.default_rng(0)
    line = " ".join(rng.choice(WORDS, size=400))  # about 2.6 kB per document
    peaks = []
    for n in (1_200, 12_000):
        src = tmp_path / f"c{n}.jsonl"
        with open(src, "w") as f:
            for i in range(n):
                f.write(json.dumps({"text": f"{i} {line}"}) + "\n")
        run = subprocess.run(
            [sys.executable, "-c", RSS_SCRIPT, str(src), str(tmp_path / f"o{n}"), tokenizer],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks.append(int(run.stdout.split()[-1]))
    assert peaks[1] < 1.2 * peaks[0], peaks


def test_a_parquet_page_that_fails_its_checksum_is_named(tmp_path):
    """Issue 44 item 6: pages written with checksums (pyarrow's write_page_checksum) are verified; a byte
    flipped mid-file is refused in one line naming the file (without checksums it cannot be seen, and
    reads as before)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    docs = [("word %d " % i) * 50 for i in range(400)]
    for checksum in (True, False):
        path = tmp_path / f"c{checksum}.parquet"
        pq.write_table(
            pa.table({"text": docs}), path, write_page_checksum=checksum, compression="none", row_group_size=100
        )
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x20  # inside a data page: one letter's case
        path.write_bytes(bytes(data))
        if checksum:
            with pytest.raises(
                DataError, match=r"cTrue\.parquet' is damaged at or after row \d+ of column 'text': .*CRC checksum"
            ):
                prepare([path], tmp_path / "out", "bytes", val_fraction=0.2)
            assert not (tmp_path / "out").exists()
        else:
            prepare([path], tmp_path / "out2", "bytes", val_fraction=0.2)
