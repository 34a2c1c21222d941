"""The lm-evaluation-harness backend against the harness's own `hf` backend, offline, on tasks defined
here over a local JSON-lines file: same per-request log-likelihoods, same accuracy, same generations."""

import json

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")  # the `eval` extra (make installs it)
transformers = pytest.importorskip("transformers")

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must "
    "be in want of a wife. The cat sat on the mat and the dog sat on the log. "
)

TASKS = """
task: lmlab_mc
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
---
task: lmlab_ppl
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{question}}}} {{{{choices[answer]}}}}{{{{ (' ' ~ question) * 12 }}}}"
metric_list:
  - metric: word_perplexity
---
task: lmlab_gen
dataset_path: json
dataset_kwargs:
  data_files: {{test: {gen}}}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A random GPT-2 (HF folder with its tokenizer) and the same weights imported into an lmlab run."""
    from lmlab.cli import main
    from lmlab.data.tokenizer import Tokenizer

    tmp = tmp_path_factory.mktemp("lmeval")
    bpe = Tokenizer.train_bpe([TEXT * 20], 300)
    hf_dir = tmp / "hf"
    hf_dir.mkdir()
    bpe.hf.model.save(str(hf_dir))
    tok = transformers.GPT2TokenizerFast(vocab=str(hf_dir / "vocab.json"), merges=str(hf_dir / "merges.txt"))
    tok.save_pretrained(hf_dir)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = transformers.GPT2Config(
        vocab_size=len(tok),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        eos_token_id=eos,
        bos_token_id=eos,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(hf_dir)
    assert main(["import", str(hf_dir), "--out", str(tmp / "run")]) == 0
    docs = [
        {"question": "The cat sat on the", "choices": [" mat", " dog", " log"], "answer": 0},
        {"question": "a single man in possession of a good", "choices": [" fortune", " wife"], "answer": 0},
        {"question": "It is a truth universally", "choices": [" acknowledged", " sat", " cat"], "answer": 0},
        {"question": "", "choices": ["The dog", "The wife"], "answer": 1},
    ]
    data, gen = tmp / "docs.jsonl", tmp / "gen.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    gen.write_text("".join(json.dumps(d) + "\n" for d in docs if d["question"]))  # HF cannot generate from ""
    tasks = tmp / "tasks"
    tasks.mkdir()
    for i, body in enumerate(TASKS.format(data=data, gen=gen).split("---")):
        (tasks / f"t{i}.yaml").write_text(body)
    return hf_dir, tmp / "run", tasks


def _only_these_tasks(monkeypatch):
    """lm-eval's TaskManager without its ~15,000 bundled task YAMLs (indexing them takes 6-12 s a
    manager on 2 cores): the tests' tasks are all in their own folder."""
    import functools

    from lm_eval import tasks

    monkeypatch.setattr(tasks, "TaskManager", functools.partial(tasks.TaskManager, include_defaults=False))


def _evaluate(model, model_args, tasks):
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=["lmlab_mc", "lmlab_ppl", "lmlab_gen"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
        device="cpu",
        batch_size=1,
    )


def test_lmlab_backend_equals_the_hf_backend(models, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import lmlab.lm_eval_backend  # noqa: F401  (registers "lmlab")

    hf_dir, run, tasks = models
    ours = _evaluate("lmlab", f"run={run}", tasks)
    theirs = _evaluate("hf", f"pretrained={hf_dir},tokenizer={hf_dir},dtype=float32", tasks)
    for task in ("lmlab_mc", "lmlab_ppl", "lmlab_gen"):
        a, b = ours["samples"][task], theirs["samples"][task]
        assert len(a) == len(b) == (3 if task == "lmlab_gen" else 4)
        for sa, sb in zip(a, b):
            ra, rb = sa["resps"], sb["resps"]
            if task == "lmlab_gen":
                assert ra == rb  # the same greedy text
                continue
            la = [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in ra]
            lb = [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in rb]
            assert la == pytest.approx(lb, abs=1e-4), (task, la, lb)
    assert ours["results"]["lmlab_mc"]["acc,none"] == theirs["results"]["lmlab_mc"]["acc,none"]
    longest = max(len(s["arguments"][0][0]) for s in ours["samples"]["lmlab_ppl"])
    assert longest > 3 * 64  # characters: more than one rolling window of the 64-token model
    ppl = ours["results"]["lmlab_ppl"]["word_perplexity,none"]
    assert ppl == pytest.approx(theirs["results"]["lmlab_ppl"]["word_perplexity,none"], rel=1e-4) and ppl > 1


def test_lmlab_eval_tasks_cli(models, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    _only_these_tasks(monkeypatch)
    from lmlab.cli import main

    _, run, tasks = models
    assert main(["eval", str(run), "--tasks", "lmlab_mc", "--include-path", str(tasks), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= res["lmlab_mc"]["acc,none"] <= 1.0
    assert main(["eval", str(run), "--tasks", "lmlab_mc", "--include-path", str(tasks), "--limit", "2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("lmlab_mc: acc ")
    # an unknown task, a misspelt one, a blank list or a missing --include-path: one line, exit 2
    for args, says in (
        (
            ["--tasks", "lmlab_mcq", "--include-path", str(tasks)],
            "'lmlab_mcq' is not an lm-eval task, group or tag, nor a task YAML file; did you mean 'lmlab_mc'",
        ),
        (["--tasks", " ,"], "--tasks names no task"),
        (["--tasks", "lmlab_mc", "--include-path", str(tasks / "nope")], "is not a folder"),
    ):
        capsys.readouterr()
        assert main(["eval", str(run), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
