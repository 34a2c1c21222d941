"""The Python API page's example runs as written (on a slice of the default corpus); the README's and the lab
page's generated blocks are current; the README's Contents line is whole."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"
API_PAGE = README.parent / "docs" / "python-api.md"
LAB_PAGE = README.parent / "docs" / "lab.md"


def api_example() -> str:
    return re.search(r"```python\n(.*?)```", API_PAGE.read_text(), re.S).group(1)


def test_readme_python_api_example_runs(small_corpus, monkeypatch, capsys):
    import lmlab.data.corpus

    monkeypatch.setattr(lmlab.data.corpus, "default_corpus_dir", lambda download=True: small_corpus)
    scope: dict = {}
    exec(compile(api_example(), str(API_PAGE), "exec"), scope)
    out = capsys.readouterr().out.splitlines()  # the example's prints among the trainer's lines
    sizes = next(line for line in out if re.fullmatch(r"\d+ [\d.e+]+ \d+", line))
    non_emb, flops, kv = (float(x) for x in sizes.split())
    assert non_emb == scope["lm"].param_counts(scope["cfg"])["non_embedding"] > 0 and flops > 0 and kv > 0
    bpb = next(line for line in out if line.endswith("bits/byte (estimate from 32 windows)"))
    assert 0 < float(bpb.split()[0]) < 8.5  # a 30-step byte model: below uniform over 257 tokens
    assert any(line.startswith("HAMLET.") for line in out)
    # the functional attention is the written-out softmax with the mask
    q, k, v, mask, y = (scope[n] for n in ("q", "k", "v", "mask", "y"))
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ kk.transpose(-1, -2)) / 4.0
    want = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ vv
    assert y.shape == (1, 4, 6, 16) and torch.allclose(y, want, atol=1e-5)
    assert not mask[5, 2] and mask[5, 3]  # the window of 3 keeps keys 3, 4, 5 for query 5


def test_public_names_are_documented_and_typed():
    import inspect

    import lmlab.api

    for name in lmlab.api.__all__:
        obj = getattr(lmlab.api, name)
        assert not name.startswith("_") and (obj.__doc__ or "").strip(), name
        if inspect.isfunction(obj):
            sig = inspect.signature(obj)
            assert sig.return_annotation is not inspect.Signature.empty, name


def test_checkpoints_of_any_module_and_runs_without_a_tokenizer(tmp_path):
    """save_checkpoint and read_checkpoint/load_weights accept the same modules: one without a
    ``cfg`` and with a tied head included (stored once, restored shared); load_run(tokenizer=False)
    loads a run that has no tokenizer.json, which load_run refuses by default."""
    import pytest

    import lmlab.api as lm
    from lmlab.run_folder import CheckpointError, checkpoint_dirs

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            self.lm_head.weight = self.embed.weight  # tied

    a = Tiny()
    path = lm.save_checkpoint(tmp_path / "r", 3, a, None, {"step": 3, "tokens_seen": 0})
    b = Tiny()
    lm.load_weights(b, path)
    assert torch.equal(b.embed.weight, a.embed.weight) and b.lm_head.weight is b.embed.weight
    weights, opt, state, rng = lm.read_checkpoint(path, Tiny())
    assert state["step"] == 3 and opt is None and torch.equal(weights["lm_head.weight"], a.embed.weight)

    cfg = lm.ModelConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, context_length=8)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.yaml").write_text(__import__("yaml").safe_dump({"model": cfg.to_dict(), "train": {}, "data": None}))
    lm.save_checkpoint(run, 0, lm.TransformerLM(cfg), None, {"step": 0, "tokens_seen": 0})
    assert checkpoint_dirs(run)
    with pytest.raises(CheckpointError, match="tokenizer=False"):
        lm.load_run(run)
    model, cfg2, tok, _, _ = lm.load_run(run, tokenizer=False)
    assert tok is None and cfg2 == cfg and model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 20)


def test_readme_ablation_summary_is_the_committed_index():
    """The lab page's ablation table and the README's counts line are what `lmlab report --index
    docs/ablations/[0-9]* --readme README.md --readme docs/lab.md` writes from the committed results:
    regenerated, not edited by hand."""
    from lmlab.lab.index import COUNTS_END, COUNTS_START, collect_claims, counts_line, readme_block, summary_block

    root = README.parent
    dirs = sorted(d for d in (root / "docs" / "ablations").iterdir() if d.is_dir() and d.name[:1].isdigit())
    claims, _, executed = collect_claims(dirs)
    again = (
        "regenerate: lmlab report --index docs/ablations/[0-9]*/ --out docs/ablations/README.md "
        "--readme README.md --readme docs/lab.md"
    )
    assert readme_block(LAB_PAGE) == summary_block(claims, executed, Path("ablations/README.md")), again
    assert readme_block(README, COUNTS_START, COUNTS_END) == counts_line(claims, Path("docs/ablations/README.md")), (
        again
    )
    assert readme_block(README) == ""  # the full table lives on the lab page only (one figure, one source)
    from lmlab.lab.stats import VERDICTS

    assert len(claims) >= 14 and all(c["verdict"] in VERDICTS for c in claims)
    # the protocol holds on the committed index: no verdict on a rate at an edge or chosen on fewer than
    # 3 seeds, every verdict on a trained quantity at or above its floor of tokens per parameter (10, or
    # the floor its claim declares in the executed spec), and every such claim states its tokens per parameter
    import yaml

    floors = {
        (d.name, e["claim"]): e.get("floor", 10)
        for d in dirs
        for e in yaml.safe_load((d / "spec.yaml").read_text()).get("expect", [])
        if "claim" in e
    }
    for c in claims:
        if c["verdict"] in ("agrees", "disagrees", "inconclusive") and c["metric"] not in ("step_time", "decode_time"):
            floor = floors.get((c["spec"], c["text"]), 10)
            assert "rate not bracketed" not in (c.get("gate") or "") and c["tokens_per_param"] >= floor, c
        if c["metric"] not in ("step_time", "decode_time"):
            assert c["tokens_per_param"] is not None, c


def test_readme_contents_line_links_every_section():
    """The Contents line links each '## ' section by its GitHub anchor, in order."""
    text = README.read_text()
    heads = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]

    def anchor(h: str) -> str:
        return re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")

    contents = next(line for line in text.splitlines() if line.startswith("Contents: "))
    assert re.findall(r"\(#([^)]+)\)", contents) == [anchor(h) for h in heads]
