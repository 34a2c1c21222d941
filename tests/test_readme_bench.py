"""The performance tables of the README and the docs pages are the benchmarks' own output
(bench/readme_tables.py): each ``<!-- bench:NAME -->`` block equals what its generated page gives, so a
figure edited by hand, or a page regenerated without the README, fails here."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_blocks_equal_their_pages(tables):
    names = []
    for path in tables.files():
        text = path.read_text()
        names += re.findall(r"<!-- bench:(\w+) -->", text)
        assert tables.render(text, path.parent) == text, f"{path}: run python bench/readme_tables.py"
    assert sorted(names) == sorted(tables.BLOCKS), "every generated table appears once, in README.md or docs/*.md"


def test_demo_result_is_the_range_of_the_demo_page(tables):
    """The README's demo sentence: the range over the fresh-clone runs at the demo's budget (470 s), by hand
    from docs/demo.md's table, not the older recipes' rows at 450 or 480 s."""
    import yaml

    budget = yaml.safe_load((ROOT / "lmlab" / "configs" / "demo.yaml").read_text())["train"]["budget_seconds"]
    rows = [
        line.split("|")
        for line in (ROOT / "docs" / "demo.md").read_text().splitlines()
        if line.startswith("|") and f"| {budget} s |" in line
    ]
    walls = [int(r[4].strip().rstrip(" s")) for r in rows]
    bpbs = [float(r[5].strip().strip("*")) for r in rows]
    line = tables.demo_result()[0]
    assert len(rows) >= 3 and f"takes {min(walls)}-{max(walls)} s" in line
    assert f"reaches {min(bpbs):.2f}-{max(bpbs):.2f} held-out bits/byte" in line and f"{len(rows)} runs" in line


def test_a_figure_edited_by_hand_is_caught(tables):
    readme = (ROOT / "docs" / "benchmarks.md").read_text()
    block = re.search(r"<!-- bench:train_vs_peers -->.*?<!-- /bench:train_vs_peers -->", readme, flags=re.S)[0]
    cell = re.search(r"\| (?:\*\*)?(\d\.\d\d)x(?:\*\*)? \(", block)  # bold where >= 1.3x
    hand = cell[0].replace(cell[1], f"{float(cell[1]) + 0.2:.2f}")
    edited = readme.replace(block, block.replace(cell[0], hand, 1))
    base = ROOT / "docs"
    assert edited != readme and tables.render(edited, base) == readme  # rendering restores the measured figure


def test_peer_summary_is_read_from_the_cells(tables, tmp_path, monkeypatch):
    """The summary takes each cell's 'fastest ... peer' lines: a hand-made page gives a hand-checked row."""
    page = tmp_path / "docs" / "bench" / "train_vs_peers.md"
    page.parent.mkdir(parents=True)
    page.write_text(
        "# t\n\n2026-01-02\n\n## gpt2, bf16, 2 thread(s)\n\n- machine: x, load average 0.50 0.4 0.3\n"
        "- lmlab+compile / fastest eager peer (nanogpt): 1.31x (IQR 1.20-1.40)\n"
        "- lmlab+compile / fastest compiled peer (hf+compile): 0.97x (IQR 0.90-1.01)\n"
        "\n## llama, fp32, 1 thread(s)\n\n- machine: x, load average 0.70 0.6 0.6\n"
        "- lmlab+compile / fastest eager peer (litgpt): 1.10x (IQR 1.00-1.20)\n"
        "- lmlab+compile / fastest compiled peer (litgpt+compile): 1.01x (IQR 1.00-1.02)\n"
    )
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "DOCS", tmp_path / "docs" / "bench")
    out = tables.train_vs_peers()
    assert out[-2:] == [
        "| GPT-2 | bf16 | 2 | **1.31x** (1.20-1.40, nanoGPT) | 0.97x (0.90-1.01, HF) |",
        "| LLaMA | fp32 | 1 | 1.10x (1.00-1.20, litgpt) | 1.01x (1.00-1.02, litgpt) |",
    ]
    assert "2026-01-02" in out[0] and "load average 0.50-0.70" in out[0]  # the 1-min figures
    page.write_text(page.read_text().replace("fastest compiled", "slowest compiled"))
    with pytest.raises(SystemExit, match="no 'fastest compiled peer' line"):
        tables.train_vs_peers()


def test_unpaired_markers_are_refused(tables):
    """A block whose closing marker went missing would be skipped by the rewrite: refused instead."""
    readme = (ROOT / "docs" / "benchmarks.md").read_text()
    twice = readme + "\n<!-- bench:gpu_check -->\n<!-- /bench:gpu_check -->\n"
    for broken, words in (
        (readme.replace("<!-- /bench:gpu_check -->", "", 1), "closing marker: gpu_check"),
        (readme.replace("<!-- bench:gpu_check -->", "", 1), "opening one: gpu_check"),
        (twice, "more than once"),
    ):
        with pytest.raises(SystemExit, match=words):
            tables.render(broken)
