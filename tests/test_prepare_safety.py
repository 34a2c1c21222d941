"""``lmlab prepare`` is bounded and owns only what it makes: streamed segments encode as the whole
text, giant chunks are cut (with a note), special files and bad links are refused in one line, the
user's look-alike folders are untouched, Ctrl-C and a second writer leave the previous state, and a
damaged data folder is refused naming the file and the key."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lmlab.cli import main
from lmlab.data import documents as docs_mod
from lmlab.data import prepare as prep
from lmlab.data.documents import paragraph_ranges, scan_documents
from lmlab.data.prepare import DataError, PrepareInterrupted, prepare
from lmlab.data.shards import TokenData
from lmlab.data.tokenizer import MAX_CHUNK_BYTES, Tokenizer, TokenizerError
from lmlab.fsutil import lock_path

ROOT = Path(__file__).resolve().parents[1]


def tree(folder: Path) -> dict:
    """Every path under ``folder`` with its bytes (None for folders, the target for links)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        out[key] = ("link", os.readlink(p)) if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
    return out


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def split_stream(data: TokenData, split: str) -> list[list[int]]:
    stream = data.tokens(split)
    eots = np.flatnonzero(stream == data.tokenizer.eot_id)
    return [p[1:].tolist() for p in np.split(stream, eots[1:])]


TRICKY = [  # the places where a careless cut would change GPT-2 pre-tokenisation
    "To be, or not to be: that is the question.\n  Whether 'tis nobler\r\n\tin the mind's eye\n\n",
    "x  \ny\n\u00a0z naïve café 日本語 😀 it's they're we'll I'd \u3000 end",
    "1234abc---...   \n\n\n   ''s 's 'S aaaa" + "b" * 700 + " c" * 50 + "\n" + "de\n" * 40,
]


@pytest.fixture()
def tricky_corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    rnd = random.Random(0)
    alphabet = list("ab c\n\t'-.,1\r") + ["é", "\u00a0", "日"]
    for i in range(4):
        text = "".join(TRICKY) + "".join(rnd.choice(alphabet) for _ in range(3000)) + TRICKY[i % 3]
        (folder / f"doc{i}.txt").write_bytes(text.encode() + (b"\xff\xfe tail" if i == 1 else b""))
    return folder


@pytest.mark.parametrize("kind", ["bpe", "bytes"])
def test_streamed_segments_encode_as_the_whole_document(tmp_path, tricky_corpus, monkeypatch, kind):
    """With 64-byte segments every document's ids equal the whole-document encoding, and the BPE
    trained from segments is the one trained from whole documents (same tokenizer.json)."""
    whole = prepare(tricky_corpus, tmp_path / "whole", kind, 400, val_docs=["doc3.txt"])
    monkeypatch.setattr(docs_mod, "SEGMENT_BYTES", 64)
    small = prepare(tricky_corpus, tmp_path / "small", kind, 400, val_docs=["doc3.txt"])
    assert (tmp_path / "small" / "tokenizer.json").read_bytes() == (tmp_path / "whole" / "tokenizer.json").read_bytes()
    data = TokenData(tmp_path / "small")
    tok = Tokenizer.load(tmp_path / "whole" / "tokenizer.json")
    for split, names in (("train", ["doc0.txt", "doc1.txt", "doc2.txt"]), ("val", ["doc3.txt"])):
        docs = split_stream(data, split)
        assert docs == [tok.encode_bytes((tricky_corpus / n).read_bytes()) for n in names]
        assert small["splits"][split] == whole["splits"][split]
    assert small["notes"] == whole["notes"]


def test_paragraph_ranges_match_regex_split_while_streaming(tmp_path, monkeypatch):
    """The streamed paragraph finder gives exactly the non-blank parts of re.split over the whole file."""
    monkeypatch.setattr(docs_mod, "SEGMENT_BYTES", 7)
    rnd = random.Random(1)
    for trial in range(200):
        raw = bytes(rnd.choice(b"\n\n\r \ta") for _ in range(rnd.randrange(0, 120)))
        f = tmp_path / "f.txt"
        f.write_bytes(raw)
        want = [p for p in re.split(rb"\r?\n(?:[ \t]*\r?\n)+", raw) if p.strip()]
        assert [raw[a:b] for a, b in paragraph_ranges(f)] == want, raw


def test_giant_line_without_whitespace_is_cut_with_a_note(tmp_path, capsys):
    """A 200 kB 'word' (the issue's case) is tokenised in pieces of at most MAX_CHUNK_BYTES, said in a note;
    its bytes decode back exactly."""
    folder = tmp_path / "data"
    folder.mkdir()
    rnd = random.Random(2)
    giant = "".join(rnd.choice("abcdefghij") for _ in range(200_000)).encode()
    (folder / "a_giant.txt").write_bytes(giant)
    (folder / "b_play.txt").write_bytes(b"To be, or not to be, that is the question. " * 50)
    assert (
        main(
            [
                "prepare",
                "--data",
                str(folder),
                "--out",
                str(tmp_path / "out"),
                "--vocab-size",
                "300",
                "--val-docs",
                "b_play.txt",
            ]
        )
        == 0
    )
    notes = [line for line in error_lines(capsys) if line.startswith("note:")]
    assert any(
        f"longer than {MAX_CHUNK_BYTES} bytes" in n and "200,000 bytes" in n and "a_giant.txt" in n for n in notes
    ), notes
    data = TokenData(tmp_path / "out")
    ids = split_stream(data, "train")[0]
    assert data.tokenizer.decode_bytes(ids) == giant
    assert max(len(data.tokenizer.token_bytes(i)) for i in set(ids)) <= MAX_CHUNK_BYTES
    assert len(ids) >= len(giant) // MAX_CHUNK_BYTES


def test_hard_cut_of_a_segment_without_any_safe_cut_is_noted(tmp_path, monkeypatch):
    monkeypatch.setattr(docs_mod, "SEGMENT_BYTES", 64)
    monkeypatch.setattr(docs_mod, "MAX_SEGMENT_BYTES", 256)
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"x" * 1000)
    (folder / "b.txt").write_bytes(b"y y y")
    m = prepare(folder, tmp_path / "out", "bpe", 300, val_docs=["b.txt"])
    assert any("cut there to bound memory" in n and "'a.txt'" in n for n in m["notes"]), m["notes"]
    data = TokenData(tmp_path / "out")
    assert data.tokenizer.decode_bytes(split_stream(data, "train")[0]) == b"x" * 1000


def test_special_files_are_read_only_if_asked(tmp_path, capsys):
    fifo_dir = tmp_path / "with_fifo"
    fifo_dir.mkdir()
    (fifo_dir / "a.txt").write_text("some words here")
    os.mkfifo(fifo_dir / "pipe.txt")
    out = tmp_path / "out"
    for data in (str(fifo_dir), "/dev/zero", str(fifo_dir / "pipe.txt")):
        assert main(["prepare", "--data", data, "--out", str(out), "--tokenizer", "bytes"]) == 2
        (line,) = error_lines(capsys)
        assert "--allow-special-files" in line and ("pipe.txt" in line or "/dev/zero" in line), line
        assert ("FIFO" in line) if "pipe" in line else ("character device" in line)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["with_fifo"]

    def writer():
        with open(fifo_dir / "pipe.txt", "wb") as f:
            f.write(b"a piped document")

    thread = threading.Thread(target=writer)
    thread.start()
    assert (
        main(
            [
                "prepare",
                "--data",
                str(fifo_dir),
                "--out",
                str(out),
                "--tokenizer",
                "bytes",
                "--allow-special-files",
                "--val-docs",
                "pipe.txt",
            ]
        )
        == 0
    )
    thread.join()
    assert split_stream(TokenData(out), "val") == [list(b"a piped document")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "with_fifo"]  # the spool folder is gone


def test_special_file_allowed_is_still_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(docs_mod, "SPECIAL_FILE_LIMIT", 1 << 20)
    with pytest.raises(DataError, match="gave more than 1,048,576 bytes"):
        prepare("/dev/zero", tmp_path / "out", "bytes", allow_special=True)
    assert list(tmp_path.iterdir()) == []


def test_links_loops_and_unreadable_files_give_one_line(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "out")
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "a.txt").write_text("text")
    (loop / "self.txt").symlink_to("self.txt")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.txt").write_text("text")
    (broken / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    cycle = tmp_path / "cycle"
    (cycle / "sub").mkdir(parents=True)
    (cycle / "a.txt").write_text("text")
    (cycle / "sub" / "up").symlink_to("..")
    cases = [
        (loop, "symlink loop"),
        (loop / "self.txt", "symlink loop"),
        (broken, "broken symlink"),
        (cycle, "symlink loop"),
    ]
    for data, says in cases:
        assert main(["prepare", "--data", str(data), "--out", out, "--tokenizer", "bytes"]) == 2
        (line,) = error_lines(capsys)
        assert says in line and line.startswith("lmlab prepare: error:"), line

    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / "a.txt").write_text("text")
    (unreadable / "secret.txt").write_text("text")
    secret = str(unreadable / "secret.txt")
    real_open = open

    def deny(path, *args, **kw):  # as root chmod 000 does not stop reading, so the OS answer is simulated
        if str(path) == secret:
            raise PermissionError(13, "Permission denied", secret)
        return real_open(path, *args, **kw)

    monkeypatch.setattr("builtins.open", deny)
    assert main(["prepare", "--data", str(unreadable), "--out", out, "--tokenizer", "bytes"]) == 2
    (line,) = error_lines(capsys)
    assert "secret.txt" in line and "Permission denied" in line
    assert not Path(out).exists()


def test_temp_folders_of_the_user_are_never_touched(tmp_path, small_corpus, capsys):
    """`--out X` beside a user's `X.partial`, and `--data X.partial --out X`: both byte-identical after."""
    user = tmp_path / "X.partial"
    user.mkdir()
    for p in sorted(small_corpus.iterdir())[:2]:
        (user / p.name).write_bytes(p.read_bytes()[:3000])
    (user / "notes.md").write_text("my notes")
    before = tree(tmp_path)
    assert main(["prepare", "--data", str(small_corpus), "--out", str(tmp_path / "X"), "--tokenizer", "bytes"]) == 0
    assert tree(user) == {k.split("/", 1)[1]: v for k, v in before.items() if "/" in k}
    assert main(["prepare", "--data", str(user), "--out", str(tmp_path / "Y"), "--tokenizer", "bytes"]) == 0
    assert (
        main(["prepare", "--data", str(user), "--out", str(tmp_path / "X"), "--tokenizer", "bytes", "--overwrite"]) == 0
    )
    assert tree(user) == {k.split("/", 1)[1]: v for k, v in before.items() if "/" in k}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X", "X.partial", "Y"]  # no temp or lock left
    assert set(tree(tmp_path / "X")) == {"manifest.json", "tokenizer.json", "train.bin", "val.bin"}


def test_interrupt_keeps_the_previous_complete_state(tmp_path, small_corpus, monkeypatch, capsys):
    out = tmp_path / "out"
    assert main(["prepare", "--data", str(small_corpus), "--out", str(out), "--tokenizer", "bytes"]) == 0
    before = tree(out)
    real, started = prep._Shard.start, []

    def interrupted(shard, doc):
        started.append(doc.name)
        if len(started) >= 3:  # mid-encoding: the shards are half a new folder by now
            raise KeyboardInterrupt
        return real(shard, doc)

    monkeypatch.setattr(prep._Shard, "start", interrupted)
    with pytest.raises(PrepareInterrupted, match="left as it was"):
        prepare(small_corpus, out, "bpe", 300, overwrite=True)
    assert main(["prepare", "--data", str(small_corpus), "--out", str(out), "--overwrite"]) == 130
    (line,) = error_lines(capsys)
    assert line.startswith("lmlab prepare: interrupted:") and "previous complete state" in line
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _default_sigint() -> None:
    """In the child: SIGINT as Python expects it. A test suite started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_blocked_prepare(fifo: Path, out: Path) -> subprocess.Popen:
    """A real `lmlab prepare` that holds the lock of ``out`` while it waits on the FIFO ``fifo``."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lmlab.cli",
            "prepare",
            "--data",
            str(fifo),
            "--out",
            str(out),
            "--tokenizer",
            "bytes",
            "--allow-special-files",
            "--overwrite",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 60
    while not lock_path(out).exists() or f'"pid": {proc.pid}' not in lock_path(out).read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_sigint_and_a_second_writer(tmp_path, small_corpus, capsys):
    """While one prepare holds --out, a second is refused naming its PID; SIGINT then ends the first
    with 130, the folder as it was; a lock left by a SIGKILLed one is taken over with a note."""
    out = tmp_path / "out"
    assert main(["prepare", "--data", str(small_corpus), "--out", str(out), "--tokenizer", "bytes"]) == 0
    capsys.readouterr()
    before = tree(out)
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    first = _start_blocked_prepare(fifo, out)
    try:
        assert (
            main(["prepare", "--data", str(small_corpus), "--out", str(out), "--tokenizer", "bytes", "--overwrite"])
            == 2
        )
        (line,) = error_lines(capsys)
        assert f"PID {first.pid}" in line and "lmlab prepare" in line and "in use" in line
        assert tree(out) == before
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 130 and "previous complete state" in err and "Traceback" not in err
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out", "pipe.txt"]

    killed = _start_blocked_prepare(fifo, out)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert lock_path(out).exists() and tree(out) == before  # a stale lock; the data intact
    assert main(["prepare", "--data", str(small_corpus), "--out", str(out), "--tokenizer", "bytes", "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "stale lock" in err and f"PID {killed.pid}" in err
    assert not lock_path(out).exists() and tree(out) == before  # the same input gives the same bytes


@pytest.fixture()
def data_copy(tmp_path, small_corpus):
    prepare(small_corpus, tmp_path / "good", "bpe", 300)
    return tmp_path / "good"


def _damage(folder: Path, how: str) -> str:
    """Damage one file of a data folder; returns the text the error must name (file and key)."""
    man = folder / "manifest.json"
    m = json.loads(man.read_text())
    if how == "manifest_truncated":
        man.write_bytes(man.read_bytes()[:50])
        return "manifest.json"
    if how == "manifest_empty":
        man.write_bytes(b"")
        return "manifest.json"
    if how == "manifest_list":
        man.write_text("[1, 2]")
        return "JSON list"
    if how.startswith("manifest_no_"):
        key = how.removeprefix("manifest_no_")
        if key == "tokenizer.file":
            del m["tokenizer"]["file"]
        elif key == "splits.val":
            del m["splits"]["val"]
        else:
            del m[key]
        man.write_text(json.dumps(m))
        return key
    if how == "manifest_tokens_str":
        m["splits"]["train"]["tokens"] = "many"
        man.write_text(json.dumps(m))
        return "splits.train.tokens"
    if how == "manifest_escape":
        m["splits"]["val"]["file"] = "../../etc/passwd"
        man.write_text(json.dumps(m))
        return "splits.val.file"
    if how == "tokenizer_list":
        (folder / "tokenizer.json").write_text("[]")
        return "tokenizer.json"
    if how == "shard_truncated":
        shard = folder / "train.bin"
        shard.write_bytes(shard.read_bytes()[:-3])
        return "splits.train.tokens"
    if how == "shard_empty":
        (folder / "val.bin").write_bytes(b"")
        return "val.bin"
    if how == "shard_bitflip":
        shard = folder / "train.bin"
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        shard.write_bytes(bytes(raw))
        return "splits.train.sha256"
    raise AssertionError(how)


DAMAGE = [
    "manifest_truncated",
    "manifest_empty",
    "manifest_list",
    "manifest_no_tokenizer",
    "manifest_no_dtype",
    "manifest_no_splits",
    "manifest_no_tokenizer.file",
    "manifest_no_splits.val",
    "manifest_tokens_str",
    "manifest_escape",
    "tokenizer_list",
    "shard_truncated",
    "shard_empty",
    "shard_bitflip",
]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_data_folder_is_refused_naming_file_and_key(data_copy, how):
    says = _damage(data_copy, how)
    with pytest.raises((DataError, TokenizerError)) as exc:
        data = TokenData(data_copy)
        data.tokens("train"), data.tokens("val")
    msg = str(exc.value)
    assert says in msg and "\n" not in msg, msg
    assert str(data_copy) in msg


def test_damaged_data_folder_through_train_gives_exit_2(data_copy, tmp_path, capsys):
    _damage(data_copy, "manifest_list")
    rc = main(
        ["train", "--config", "demo", "--data", str(data_copy), "--out", str(tmp_path / "run"), "--set", "max_steps=1"]
    )
    (line,) = error_lines(capsys)
    assert rc == 2 and "manifest.json" in line and "JSON list" in line


def test_tokenizer_loader_refuses_wrong_shapes(tmp_path):
    for text, says in (
        ("[]", "JSON list"),
        ('"x"', "JSON str"),
        ("{}", "no key 'model'"),
        ('{"type": "bytes", "vocab_size": 300}', "vocab_size 257"),
    ):
        (tmp_path / "tokenizer.json").write_text(text)
        with pytest.raises(TokenizerError, match=re.escape(says)):
            Tokenizer.load(tmp_path / "tokenizer.json")


def test_scan_documents_keeps_no_text(tmp_path):
    """Documents are located as byte ranges of their files, not loaded (what bounds memory)."""
    f = tmp_path / "book.txt"
    f.write_bytes(b"one\n\ntwo two\n \n\nthree")
    docs = scan_documents(f)
    assert [(d.name, d.start, d.end) for d in docs] == [
        ("book.txt#0", 0, 3),
        ("book.txt#1", 5, 12),
        ("book.txt#2", 16, 21),
    ]
    assert all(d.data is None for d in docs) and docs[1].read() == b"two two"


def test_out_that_is_a_symlink_is_refused_untouched(tmp_path, small_corpus, capsys):
    real = tmp_path / "real"
    assert main(["prepare", "--data", str(small_corpus), "--out", str(real), "--tokenizer", "bytes"]) == 0
    (tmp_path / "link").symlink_to(real)
    before = tree(tmp_path)
    assert (
        main(
            [
                "prepare",
                "--data",
                str(small_corpus),
                "--out",
                str(tmp_path / "link"),
                "--tokenizer",
                "bytes",
                "--overwrite",
            ]
        )
        == 2
    )
    assert "is a symlink" in capsys.readouterr().err and tree(tmp_path) == before


def test_overwrite_replaces_only_prepared_data(tmp_path, small_corpus, capsys):
    out = tmp_path / "data"
    assert main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(out)]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert (out.stat().st_mode & 0o777) == (0o777 & ~mask)  # not mkdtemp's 0700
    (out / "notes.txt").write_text("mine")
    assert main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "also holds notes.txt" in err[-1] and (out / "notes.txt").read_text() == "mine"
    foreign = tmp_path / "webapp"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"name": "my webapp"}')
    (foreign / "a.txt").write_text("precious")
    assert (
        main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(foreign), "--overwrite"])
        == 2
    )
    assert "not a prepared data folder lmlab can read" in capsys.readouterr().err.strip().splitlines()[-1]
    assert (foreign / "a.txt").read_text() == "precious"
    (out / "notes.txt").unlink()  # a folder holding only what prepare wrote is replaced
    assert main(["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--out", str(out), "--overwrite"]) == 0
