"""The command line end to end on a small real corpus, and its answers to bad input: one error line
naming what and where, exit status 2, nothing overwritten."""

import json
import re
import subprocess
import sys

import pytest
import torch

from lmlab.cli import main

TRAIN = [
    "--set",
    "d_model=32",
    "--set",
    "n_layers=1",
    "--set",
    "n_heads=2",
    "--set",
    "context_length=32",
    "--set",
    "batch_size=4",
    "--set",
    "max_steps=6",
    "--set",
    "eval_interval=6",
    "--set",
    "eval_windows=2",
    "--set",
    "device=cpu",
    "--no-progress",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, small_corpus):
    out = tmp_path_factory.mktemp("cli") / "data"
    assert (
        main(
            [
                "prepare",
                "--data",
                str(small_corpus),
                "--out",
                str(out),
                "--tokenizer",
                "bpe",
                "--vocab-size",
                "400",
                "--val-docs",
                "tempest_gut.txt",
            ]
        )
        == 0
    )
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--data", str(data_dir), "--out", str(out), *TRAIN]) == 0
    return out


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no error printed"
    return err[-1]


def test_eval_json_and_generate(run_dir, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"loss", "perplexity", "bits_per_byte", "tokens", "bytes"} <= set(res)
    assert res["bytes"] == 30000 and res["bits_per_byte"] > 0 and res["dtype"] == "fp32"
    assert main(["eval", str(run_dir), "--dtype", "bf16"]) == 0  # the text names the precision scored in
    head = capsys.readouterr().out.splitlines()[0]
    assert head.endswith(", bf16:") and "checkpoint" in head
    from lmlab.devices import precision_name, resolve_dtype

    assert main(["eval", str(run_dir), "--dtype", "auto", "--json"]) == 0  # names what 'auto' chose here
    auto = precision_name(resolve_dtype("auto", torch.device("cpu")))
    assert json.loads(capsys.readouterr().out)["dtype"] == auto and auto in ("fp32", "bf16")
    assert main(["generate", str(run_dir), "--prompt", "KING.", "--max-new-tokens", "5", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("KING.")


def test_missing_data_path(tmp_path, capsys):
    assert main(["prepare", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "d")]) == 2
    line = error_line(capsys)
    assert "nowhere" in line and "does not exist" in line
    assert not (tmp_path / "d").exists()


def test_empty_data(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    assert main(["prepare", "--data", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "d")]) == 2
    assert "empty.txt" in error_line(capsys)


def test_text_shorter_than_one_context(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    for i in range(2):
        (tmp_path / "docs" / f"{i}.txt").write_text("Short text.")
    assert (
        main(["prepare", "--data", str(tmp_path / "docs"), "--out", str(tmp_path / "d"), "--tokenizer", "bytes"]) == 0
    )
    capsys.readouterr()
    assert main(["train", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "run"), *TRAIN]) == 2
    line = error_line(capsys)
    assert "fewer than one context of 32" in line and str(tmp_path / "d") in line
    assert not (tmp_path / "run").exists()


def test_prompt_longer_than_context(run_dir, capsys):
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--prompt", "word " * 200]) == 2
    assert "more than context_length=32" in error_line(capsys)
    assert capsys.readouterr().out == ""  # the prompt is not echoed before the error


@pytest.mark.parametrize(
    "argv, flag, says",
    [
        (["eval", "RUN", "--batch-size", "0"], "--batch-size", "0 must be >= 1"),
        (["eval", "RUN", "--stride", "-3"], "--stride", "-3 must be >= 1"),
        (["generate", "RUN", "--max-new-tokens", "-5"], "--max-new-tokens", "-5 must be >= 1"),
        (["generate", "RUN", "--top-p", "1.5"], "--top-p", "1.5 must be in (0, 1]"),
        (["generate", "RUN", "--top-k", "x"], "--top-k", "'x' is not an integer"),
        (["generate", "RUN", "--temperature", "-1"], "--temperature", "must be in [0, inf]"),
        (["prepare", "--val-fraction", "1.5"], "--val-fraction", "1.5 must be in (0, 1)"),
        (["bench", "decode", "--new-tokens", "1"], "--new-tokens", "1 must be >= 2"),
        (["generate", "RUN", "--stop", ""], "--stop", "an empty stop string would stop before the first token"),
        (["analyze", "--preset", "llama-2-7b", "--peak-flops", "inf"], "--peak-flops", "inf must be in (0, inf)"),
        # a blank path would mean the current folder, or the flag's default: refused
        (["train", "--config", "demo", "--out", ""], "--out", "is blank; give a file or folder path"),
        (["prepare", "--out", " "], "--out", "is blank"),
        (["eval", ""], "run", "is blank"),
        (["eval", "RUN", "--data", ""], "--data", "is blank"),
        (["plot", "RUN", "--out", ""], "--out", "is blank"),
        (["sweep", "--out", ""], "--out", "is blank"),
        (["import", "", "--out", "x"], "path", "is blank"),
    ],
)
def test_bad_numbers_are_refused_naming_the_flag(run_dir, argv, flag, says, capsys):
    argv = [str(run_dir) if a == "RUN" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    line = error_line(capsys)
    assert f"argument {flag}" in line and says in line


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--limit", "3"], "--limit only applies with --tasks"),
        (["--tasks", " , "], "--tasks names no task"),
        (["--num-fewshot", "1", "--include-path", "x"], "--include-path, --num-fewshot only apply with --tasks"),
        (["--tasks", "hellaswag", "--stride", "8"], "--stride only applies to the held-out bits-per-byte"),
        (
            ["--tasks", "hellaswag", "--split", "train", "--dtype", "bf16"],
            "--split, --dtype only apply to the held-out",
        ),
    ],
)
def test_eval_flags_of_the_other_mode_are_refused(run_dir, extra, says, capsys):
    """eval scores bits-per-byte, or lm-evaluation-harness tasks with --tasks: a flag of the other mode
    would be ignored, so it is refused (exit 2) before any model is loaded or harness imported."""
    capsys.readouterr()
    assert main(["eval", str(run_dir), *extra]) == 2
    assert says in error_line(capsys)


def test_prepare_tokenizer_flags_that_do_not_combine(small_corpus, data_dir, tmp_path, capsys):
    """--vocab-size means nothing to the byte tokenizer or an existing tokenizer file: refused, nothing
    written; a --vocab-size the corpus cannot reach is reported, not silently shrunk."""
    out = tmp_path / "d"
    base = ["prepare", "--data", str(small_corpus), "--out", str(out), "--val-docs", "tempest_gut.txt"]
    for extra, says in [
        (["--tokenizer", "bytes", "--vocab-size", "300"], "--vocab-size 300 does not apply with --tokenizer bytes"),
        (
            ["--tokenizer-file", str(data_dir / "tokenizer.json"), "--vocab-size", "300"],
            "--vocab-size 300 does not apply with --tokenizer-file",
        ),
        (
            ["--tokenizer-file", str(data_dir / "tokenizer.json"), "--tokenizer", "bytes"],
            "--tokenizer bytes does not apply with --tokenizer-file",
        ),
    ]:
        assert main(base + extra) == 2
        assert says in error_line(capsys)
        assert not out.exists()
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for i in range(2):
        (tiny / f"d{i}.txt").write_text("to be or not to be " * 50)
    assert (
        main(
            [
                "prepare",
                "--data",
                str(tiny),
                "--out",
                str(tmp_path / "t"),
                "--val-docs",
                "d1.txt",
                "--vocab-size",
                "5000",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    got = json.loads((tmp_path / "t" / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    assert 257 < got < 5000 and f"vocab {got})" in captured.out
    assert f"the BPE stopped at {got:,} tokens, below --vocab-size 5,000" in captured.err


def test_existing_run_folder_not_overwritten(run_dir, data_dir, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    assert main(["train", "--data", str(data_dir), "--out", str(run_dir), *TRAIN, "--set", "d_model=48"]) == 2
    line = error_line(capsys)
    assert "already holds a different run (model.d_model: run has 32, asked 48" in line
    assert line.endswith("choose another --out")  # --resume refuses another architecture: not offered
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before
    # a train setting alone: --resume is offered; more than four differences are counted, not dropped
    assert main(["train", "--data", str(data_dir), "--out", str(run_dir), *TRAIN, "--set", "lr=0.5"]) == 2
    assert error_line(capsys).endswith("or pass --resume to continue it with new train settings")
    wider = [
        "--set",
        "d_model=48",
        "--set",
        "n_layers=3",
        "--set",
        "n_heads=4",
        "--set",
        "d_ff=64",
        "--set",
        "lr=0.5",
        "--set",
        "seed=7",
    ]
    assert main(["train", "--data", str(data_dir), "--out", str(run_dir), *TRAIN, *wider]) == 2
    shown = re.search(r"different run \((.*); and (\d+) more;", error_line(capsys))
    assert shown and shown[1].count(": run has ") == 4 and 4 + int(shown[2]) >= 6  # six asked, all counted
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before
    # the same command again resumes; the run is complete, so nothing changes
    contents = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert main(["train", "--data", str(data_dir), "--out", str(run_dir), *TRAIN]) == 0
    captured = capsys.readouterr()
    assert "already complete at step 6" in captured.out and "resuming" not in captured.err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == contents


def test_resume_of_a_finished_run_keeps_its_record(run_dir, data_dir, tmp_path, capsys):
    """--resume with new settings on a run already at max_steps trains nothing, so run.yaml keeps the
    settings it trained with and the plain command still matches the run afterwards."""
    import shutil

    run = tmp_path / "done"
    shutil.copytree(run_dir, run)
    before = (run / "run.yaml").read_bytes()
    assert main(["train", "--data", str(data_dir), "--out", str(run), *TRAIN, "--set", "lr=0.1", "--resume"]) == 0
    assert "already complete at step 6" in capsys.readouterr().out
    assert (run / "run.yaml").read_bytes() == before
    assert main(["train", "--data", str(data_dir), "--out", str(run), *TRAIN]) == 0
    assert "already complete at step 6" in capsys.readouterr().out
    # with steps left, the new settings are recorded: they are the ones the next steps train with
    assert (
        main(
            [
                "train",
                "--data",
                str(data_dir),
                "--out",
                str(run),
                *TRAIN[:-1],
                "--set",
                "max_steps=7",
                "--set",
                "lr=0.1",
                "--resume",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "lr: 0.1" in (run / "run.yaml").read_text()


def test_lm_eval_backend_module_without_the_harness(monkeypatch):
    """python -m lmlab.lm_eval_backend without the eval extra: one line naming the extra."""
    import runpy
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "lm_eval.models", None)
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("lmlab.lm_eval_backend", run_name="__main__")
    assert "needs lm-evaluation-harness" in str(exc.value.code) and "pip install 'lmlab[eval]'" in str(exc.value.code)


def test_version_and_warmup_past_max_steps(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == "lmlab 0.1.0"
    assert (
        main(
            [
                "train",
                "--data",
                str(data_dir),
                "--out",
                str(tmp_path / "w"),
                *TRAIN,
                "--set",
                "warmup_steps=10",
                "--set",
                "max_steps=2",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "warning: warmup_steps=10 > max_steps=2" in err and "peaks at" in err


def test_resume_with_other_config_refused(run_dir, capsys):
    assert main(["train", "--out", str(run_dir), "--resume", *TRAIN[:-1], "--set", "d_model=64", "--no-progress"]) == 2
    assert "d_model: run has 32, asked 64" in error_line(capsys)


def test_checkpoint_of_another_vocabulary(run_dir, tmp_path, small_corpus, capsys):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    (other / "tokenizer.json").write_text(json.dumps({"type": "bytes"}))  # 257 tokens, model has 400
    assert main(["eval", str(other)]) == 2
    assert "vocab_size=400" in error_line(capsys)


def test_trained_run_without_its_tokenizer_says_where_it_came_from(run_dir, data_dir, tmp_path, capsys):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    (other / "tokenizer.json").unlink()
    assert main(["eval", str(other)]) == 2
    line = error_line(capsys)
    assert "trained with the data folder" in line and str(data_dir.resolve()) in line
    assert "imported from a Hugging Face" not in line


def test_truncated_checkpoint(run_dir, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    ckpt = next((broken / "checkpoints").iterdir()) / "model.safetensors"
    ckpt.write_bytes(ckpt.read_bytes()[:500])
    assert main(["eval", str(broken)]) == 2
    line = error_line(capsys)
    assert "model.safetensors" in line and "truncated or corrupt" in line


def test_unknown_set_key_suggests(data_dir, tmp_path, capsys):
    assert main(["train", "--data", str(data_dir), "--out", str(tmp_path / "r"), "--set", "d_modle=64"]) == 2
    assert "did you mean 'd_model'" in error_line(capsys)
    assert (
        main(
            [
                "train",
                "--data",
                str(data_dir),
                "--out",
                str(tmp_path / "r"),
                "--set",
                "n_heads=6",
                "--set",
                "n_kv_heads=4",
                "--set",
                "d_model=48",
            ]
        )
        == 2
    )
    assert "n_heads=6 is not a multiple of n_kv_heads=4" in error_line(capsys)


def test_console_exit_status(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lmlab.cli", "eval", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"lmlab eval: error: {str(tmp_path)!r} is not an lmlab run folder (no run.yaml); "
        f"give the folder that `lmlab train --out` created"
    ]


def test_out_folder_that_is_not_a_run_is_refused(tmp_path, data_dir, capsys):
    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("mine")
    assert main(["train", "--data", str(data_dir), "--out", str(folder), *TRAIN]) == 2
    assert "is not an empty folder or an lmlab run" in error_line(capsys)
    assert [p.name for p in folder.iterdir()] == ["tokenizer.json"] and (
        folder / "tokenizer.json"
    ).read_text() == "mine"
    (tmp_path / "afile").write_text("x")
    assert main(["train", "--data", str(data_dir), "--out", str(tmp_path / "afile"), *TRAIN]) == 2
    assert "afile" in error_line(capsys)


def test_resume_rules_for_data_steps_and_devices(run_dir, tmp_path, small_corpus, capsys):
    before = (run_dir / "run.yaml").read_text()
    other = tmp_path / "other-data"
    assert main(["prepare", "--data", str(small_corpus), "--out", str(other), "--tokenizer", "bytes"]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(run_dir), "--resume", "--data", str(other), "--no-progress"]) == 2
    assert "differs from the data of run" in error_line(capsys)
    assert main(["train", "--out", str(run_dir), "--resume", "--set", "max_steps=3", "--no-progress"]) == 2
    assert "max_steps=3 is below the step 6" in error_line(capsys)
    assert (run_dir / "run.yaml").read_text() == before
    assert main(["eval", str(run_dir), "--device", "tpu"]) == 2
    assert "device='tpu' is not" in error_line(capsys)


def test_resume_without_a_run_is_refused(tmp_path, data_dir, capsys):
    out = tmp_path / "nothing-here"
    assert main(["train", "--data", str(data_dir), "--out", str(out), *TRAIN, "--resume"]) == 2
    assert "holds no run" in error_line(capsys) and not out.exists()


def test_plot_checks_every_run_before_writing(run_dir, tmp_path, capsys):
    out = tmp_path / "plots"
    (tmp_path / "not-a-run").mkdir()
    assert main(["plot", str(run_dir), str(tmp_path / "not-a-run"), "--out", str(out)]) == 2
    assert "not a run folder" in error_line(capsys) and not out.exists()
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    assert {"loss.png", "lr.png"} <= {p.name for p in out.iterdir()}
    assert all((out / n).stat().st_size > 1000 for n in ("loss.png", "lr.png"))


def test_wall_time_keeps_counting_across_resumes():
    from lmlab.plot import cumulative_wall_time

    recs = [{"step": s, "elapsed_s": t} for s, t in [(1, 1.0), (2, 2.5), (3, 0.4), (4, 1.4), (5, 0.2)]]
    # second segment starts after 2.5 s, third after 2.5 + 1.4 s
    assert [r["elapsed_s"] for r in cumulative_wall_time(recs)] == pytest.approx([1.0, 2.5, 2.9, 3.9, 4.1])
    assert recs[2]["elapsed_s"] == 0.4  # the input is not modified


def test_model_too_large_for_memory_is_refused_before_building(data_dir, tmp_path, monkeypatch, capsys):
    import lmlab.devices as devices
    import lmlab.train as train

    monkeypatch.setattr(devices, "available_memory", lambda device: 2**10)  # 1 KiB free
    built = []
    monkeypatch.setattr(train, "TransformerLM", lambda cfg: built.append(cfg))
    out = tmp_path / "big"
    assert main(["train", "--data", str(data_dir), "--out", str(out), *TRAIN]) == 2
    line = error_line(capsys)
    # d_model 32, 1 layer, vocab 400 (tied): about 25k parameters x 16 bytes is more than 1 KiB
    assert "needs at least" in line and "16 bytes per parameter" in line and "GiB is available" in line
    assert not built and not (out / "checkpoints").exists()


def test_decode_benchmark_checks_memory_and_lengths_before_building(run_dir, monkeypatch, capsys):
    """bench decode sizes weights + KV cache (+ the packed copy) against free memory, and the prompt and
    new tokens against the context, before it builds or loads anything."""
    import lmlab.bench as bench
    import lmlab.checkpoint as checkpoint
    import lmlab.devices as devices
    import lmlab.model as model_pkg
    from lmlab.analysis import kv_cache_bytes
    from lmlab.config import ModelConfig
    from lmlab.config_files import load_mapping

    monkeypatch.setattr(checkpoint, "load_run", lambda *a, **k: pytest.fail("loaded weights"))
    for module in (model_pkg, bench):  # bench holds its own name for the class (imported before the patch)
        monkeypatch.setattr(module, "TransformerLM", lambda cfg: pytest.fail("built a model"))
    from lmlab.runs import BUILTIN_CONFIGS

    demo = ModelConfig.from_dict(load_mapping(BUILTIN_CONFIGS / "demo.yaml")["model"])
    kv = kv_cache_bytes(demo, 32 + 64 - 1, 4096, "fp32")["total"]  # the KV cache alone: about 1.6 GiB
    monkeypatch.setattr(devices, "available_memory", lambda device: kv)
    assert main(["bench", "decode", "--batch", "4096"]) == 2
    line = error_line(capsys)
    assert f"KV cache for batch 4,096 x 95 tokens {kv / 2**30:.2f} GiB" in line and "GiB is available" in line
    assert main(["bench", "decode", str(run_dir), "--prompt-len", "30", "--new-tokens", "4"]) == 2
    assert "--prompt-len 30 + --new-tokens 4 - 1 = 33 tokens exceed the model's context_length 32" in error_line(capsys)


def test_prepare_overwrite_only_replaces_prepared_data(data_dir, small_corpus, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    args = ["prepare", "--data", str(small_corpus), "--tokenizer", "bytes", "--overwrite", "--out"]
    assert main([*args, str(mine)]) == 2
    assert "not a prepared data folder" in error_line(capsys) and (mine / "notes.txt").read_text() == "keep me"
    assert main([*args, str(small_corpus)]) == 2  # would delete the input itself
    assert "holds the input documents" in error_line(capsys) and any(small_corpus.iterdir())
    (tmp_path / "file").write_text("x")
    assert main([*args, str(tmp_path / "file")]) == 2
    assert "is a file" in error_line(capsys)


def test_report_and_sweep_refuse_foreign_outputs(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "results.jsonl").write_text(
        json.dumps({"run": "a-s1", "variant": "a", "seed": 1, "status": "ok", "val_bpb": 2.0}) + "\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text("# my project\n")
    assert main(["report", str(sweep), "--out", str(readme)]) == 2
    assert "is not an lmlab sweep report" in error_line(capsys) and readme.read_text() == "# my project\n"
    assert main(["report", str(sweep), "--out", str(tmp_path)]) == 2
    assert "must be a markdown file" in error_line(capsys)
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.txt").write_text("x")
    assert main(["sweep", "09-parallel-block", "--out", str(other), "--dry-run"]) == 2
    assert "not a sweep" in error_line(capsys) and sorted(p.name for p in other.iterdir()) == ["data.txt"]
    assert main(["sweep", "09-parallel-block", "--out", str(readme), "--dry-run"]) == 2
    assert "is a file" in error_line(capsys)


def test_unwritable_paths_give_one_line(run_dir, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "f")]) == 2
    line = error_line(capsys)
    assert str(tmp_path / "f") in line and "choose a folder" in line


def test_output_into_a_closed_pipe_is_quiet():
    proc = subprocess.run(
        f"{sys.executable} -m lmlab.cli survey --format csv | head -1", shell=True, capture_output=True, text=True
    )
    assert proc.stdout.startswith("preset") or proc.stdout.count(",") > 3
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_config_files_and_analyze_inputs_are_checked(run_dir, tmp_path, capsys):
    """Each bad config file or analyze input: one line naming the file (or flag), exit 2."""
    cases = {
        "value.yaml": (
            "model:\n  d_model: 64\n  n_heads: 4\n  sliding_window: -5\n",
            "sliding_window=-5 must be an integer >= 1",
        ),
        "train.yaml": ("model:\n  d_model: 64\ntrain:\n  lr: -1\n", "lr=-1 must be a finite number > 0"),
        "steps.yaml": ("train:\n  max_steps: 5.0\n", "max_steps=5.0 must be an integer >= 1 (written in digits"),
        "syntax.yaml": (
            "model:\n  d_model: [\n",
            "could not be parsed: expected the node content, but found '<stream end>' at line 3, column 1",
        ),
        "section.yaml": ("d_model: 64\n", "unknown section(s) ['d_model']; use 'model:' and 'train:'"),
        "empty.yaml": ("", "is empty; give a 'model:' and/or a 'train:' section"),
    }
    for name, (text, says) in cases.items():
        (tmp_path / name).write_text(text)
        for argv in (
            ["analyze", "--config", str(tmp_path / name)],
            ["train", "--out", str(tmp_path / "never"), "--config", str(tmp_path / name)],
        ):
            assert main(argv) == 2, (name, argv)
            line = error_line(capsys)
            assert says in line and name in line, (name, line)
    assert not (tmp_path / "never").exists()
    (tmp_path / "binary.yaml").write_bytes(bytes(range(128, 256)))
    assert main(["analyze", "--config", str(tmp_path / "binary.yaml")]) == 2
    assert "binary.yaml' is not UTF-8 text" in error_line(capsys)
    assert main(["analyze", "--config", str(tmp_path)]) == 2
    assert "is a folder; give a YAML or JSON file" in error_line(capsys)
    assert main(["analyze", "--config", str(tmp_path / "value.yaml"), "--scale", "tiny"]) == 2
    assert "--scale tiny applies to --preset only" in error_line(capsys)
    assert main(["analyze", "--preset", "gpt2-124m", "--context", "2048"]) == 2
    assert "--context 2,048 is beyond the model's learned positions (context_length 1,024)" in error_line(capsys)
    assert main(["analyze", "--preset", "llama-2-7b", "--context", "8192", "--batch", "1000", "--json"]) == 0
    captured = capsys.readouterr()
    assert "exceeds the model's context_length 4,096" in captured.err and json.loads(captured.out)["batch"] == 1000
    # a run folder whose run.yaml is not an lmlab run file
    fake = tmp_path / "fake_run"
    fake.mkdir()
    (fake / "run.yaml").write_text("hello: 1\n")
    assert main(["analyze", str(fake)]) == 2
    assert "run.yaml' has no 'model:' mapping; it is not an lmlab run file" in error_line(capsys)
    # `lmlab report` on a training run's folder says what the folder is, not to sweep into it
    assert main(["report", str(run_dir)]) == 2
    line = error_line(capsys)
    assert "it is a training run's folder: `lmlab eval` scores it" in line and "lmlab sweep SPEC --out DIR" in line


def test_training_memory_bound_counts_weights_and_activations(monkeypatch):
    """16 bytes per parameter plus, per token of a micro-batch, fp32 logits and their gradient and six
    d_model-wide and two d_ff-wide activations per layer: refused one byte short of that, accepted at it."""
    import torch

    import lmlab.devices as devices
    from lmlab.config import ConfigError, ModelConfig
    from lmlab.param_counts import param_counts

    cfg = ModelConfig(vocab_size=400, context_length=32, d_model=32, n_layers=2, n_heads=2, d_ff=96)
    n = param_counts(cfg)["total"]
    need = 16 * n + 8 * 32 * (2 * 400 * 4 + 2 * (6 * 32 + 2 * 96) * 2)  # batch 8, bf16 activations
    for free, ok in ((need - 1, False), (need, True)):
        monkeypatch.setattr(devices, "available_memory", lambda device, free=free: free)
        if ok:
            devices.check_memory(cfg, torch.device("cpu"), batch_size=8, activation_bytes=2)
        else:
            with pytest.raises(ConfigError, match="activations of one micro-batch of 8 x 32 tokens"):
                devices.check_memory(cfg, torch.device("cpu"), batch_size=8, activation_bytes=2)


def test_train_checks_its_config_before_preparing_data(tmp_path, monkeypatch, capsys):
    import lmlab.runs as runs

    monkeypatch.setattr(runs, "ensure_default_data", lambda data: pytest.fail("prepared data first"))
    bad = tmp_path / "bad.yaml"
    for text, says in (
        ("model:\n  sliding_window: -5\n", "sliding_window=-5 must be an integer >= 1"),
        ("model: 5\n", "'model:' must be a mapping of field names to values, got 5"),
    ):
        bad.write_text(text)
        assert main(["train", "--config", str(bad), "--out", str(tmp_path / "run")]) == 2
        line = error_line(capsys)
        assert says in line and "bad.yaml" in line
    assert main(["train", "--preset", "nope", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()
    # a run folder whose model section lacks vocab_size: one line, not a KeyError
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "run.yaml").write_text("model:\n  d_model: -3\ntrain: {}\n")
    assert main(["train", "--out", str(tmp_path / "odd"), "--set", "max_steps=1"]) == 2
    line = error_line(capsys)  # the hand-edited file is named: the values come from it
    assert "already holds a different run (model.d_model: run has -3" in line
    assert f"as {str(tmp_path / 'odd' / 'run.yaml')!r} records them" in line
    assert main(["train", "--out", str(tmp_path / "odd"), "--resume", "--set", "max_steps=1"]) == 2
    odd_file = str(tmp_path / "odd" / "run.yaml")
    assert f"(from {odd_file} + --set): d_model=-3 must be an integer >= 1" in error_line(capsys)


@pytest.mark.parametrize(
    "argv, prog",
    [
        (["train", "--out", "x", "--bogus"], "lmlab train"),
        (["bench", "decode", "--bogus"], "lmlab bench decode"),
        (["presets", "extra"], "lmlab presets"),
    ],
)
def test_unknown_arguments_name_their_subcommand(argv, prog, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    line = error_line(capsys)
    assert line.startswith(f"{prog}: error: unrecognized arguments") and line.endswith(f"(see `{prog} --help`)")


def test_refused_train_and_sweep_write_no_data(tmp_path, monkeypatch, capsys):
    """A bad --out, a model too large for memory, or a spec that plans no step is refused before the
    default corpus is prepared (nothing is written)."""
    import lmlab.runs as runs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs, "ensure_default_data", lambda data: pytest.fail("prepared data first"))
    (tmp_path / "afile").write_text("x")
    for out, says in (("afile/x", "lies under a file"), ("afile", "exists and is not an empty folder")):
        assert main(["train", "--config", "demo", "--out", out]) == 2
        assert says in error_line(capsys)
    assert main(["train", "--out", "run", "--set", "batch_size=100000"]) == 2
    assert "activations of one micro-batch of 100,000 x 256 tokens" in error_line(capsys)
    spec = tmp_path / "s.yaml"
    spec.write_text("model:\n  d_model: 32\n  n_layers: 1\n  n_heads: 2\n  context_length: 32\nbudget:\n  tokens: 5\n")
    assert main(["sweep", str(spec), "--dry-run"]) == 2
    assert "budget tokens=5 buys no training step" in error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "s.yaml"]


def test_threads_flag_and_default(run_dir, monkeypatch, capsys, tmp_path):
    """--threads N sets torch's CPU threads for train/eval/generate/bench; without it, the physical
    cores capped by OMP_NUM_THREADS (a hand count of the sysfs topology), and for generate of one
    prompt one thread per DECODE_WEIGHTS_PER_THREAD weights on an uncalibrated machine, else what the
    calibration measured for the eager or the compiled step (--compile)."""
    import json
    import os
    from pathlib import Path

    from lmlab.kernels import settings as S
    from lmlab.threads import default_threads, physical_cores

    before = torch.get_num_threads()
    try:
        assert main(["eval", str(run_dir), "--json", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        pairs = set()
        for cpu in os.sched_getaffinity(0):
            t = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
            pairs.add(((t / "physical_package_id").read_text(), (t / "core_id").read_text()))
        assert physical_cores() == len(pairs)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert default_threads() == 1
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert default_threads() == physical_cores()
        assert main(["eval", str(run_dir), "--json"]) == 0
        assert torch.get_num_threads() == physical_cores()
        # generate decodes one prompt of this small model on one thread (lmlab.kernels.decode_layout.decode_threads)
        # on an uncalibrated machine
        monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
        S.default_kernels.cache_clear()
        gen = ["generate", str(run_dir), "--prompt", "To", "--max-new-tokens", "2"]
        assert main(gen) == 0
        assert torch.get_num_threads() == 1
        assert main(gen + ["--threads", "2"]) == 0
        assert torch.get_num_threads() == 2
        # calibrated: eager steps on one thread, the compiled step on two (each cell measured at 4M)
        path = S.cache_path()
        path.parent.mkdir(parents=True)
        cells = [("eager batch 1", 1), ("compiled batch 1", 2)]
        choices = {"onednn_fp32": False, "blocked_attention_fp32": False, "decode_layout": [], "decode_reductions": []}
        choices["decode_threads"] = [{"cell": c, "weights": 4_000_000, "threads": t} for c, t in cells]
        record = {"version": S.CALIBRATION_VERSION, "identity": S.cpu_identity(), "date": "2026-12-06"}
        record["cells"] = [{"decision": "one row compiled batch 1"}]  # threads measured with the layouts
        path.write_text(json.dumps({**record, "choices": choices}))
        S.default_kernels.cache_clear()
        assert main(gen) == 0
        assert torch.get_num_threads() == 1
        assert main(gen + ["--compile"]) == 0
        assert torch.get_num_threads() == min(2, physical_cores())  # the threads measured, at most the cores
        with pytest.raises(SystemExit) as exc:  # refused by the parser
            main(["eval", str(run_dir), "--threads", "0"])
        assert exc.value.code == 2 and "--threads" in capsys.readouterr().err
        cpus = len(os.sched_getaffinity(0))  # more threads than CPUs: refused, not minutes of threads in a queue
        for cmd in (["eval", str(run_dir)], ["bench", "train"], ["train", "--preset", "llama-3-8b"]):
            with pytest.raises(SystemExit) as exc:
                main(cmd + ["--threads", str(cpus + 1)])
            err = capsys.readouterr().err
            assert exc.value.code == 2 and f"{cpus + 1} is more than the {cpus} CPUs" in err, err
    finally:
        torch.set_num_threads(before)
        S.default_kernels.cache_clear()


def test_tensorboard_events_hold_the_logged_scalars(data_dir, tmp_path):
    """With tensorboard installed (the `tb` extra, in `make` installs), a run writes event files that
    TensorBoard's own reader reads back: the training loss and lr of every logged step, as in
    metrics.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    assert main(["train", "--data", str(data_dir), "--out", str(out), *TRAIN, "--set", "log_interval=2"]) == 0
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r and "lr" in r]
    assert {"loss", "lr"} <= set(acc.Tags()["scalars"])
    got = {e.step: e.value for e in acc.Scalars("loss")}
    assert sorted(got) == [r["step"] for r in train]
    assert all(abs(got[r["step"]] - r["loss"]) <= 1e-6 * abs(r["loss"]) for r in train)


@pytest.mark.parametrize(
    "argv",
    [["analyze", "--preset", ""], ["train", "--preset", " ", "--out", "RUN"], ["bench", "decode", "--preset", ""]],
)
def test_an_empty_preset_name_is_refused(argv, tmp_path, capsys):
    argv = [str(tmp_path / a) if a == "RUN" else a for a in argv]
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2 and "--preset: is empty" in capsys.readouterr().err
    assert not (tmp_path / "RUN").exists()


def test_generate_prompt_ids(run_dir, capsys):
    """--prompt-ids: ids in, ids out, equal to greedy generate on the loaded model (an imported run
    without tokenizer.json is tested in test_hf_parity); bad ids and text-only flags are refused."""
    from lmlab.checkpoint import load_run
    from lmlab.generate import generate

    run = run_dir
    assert (
        main(
            ["generate", str(run), "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--temperature", "0", "--logprobs"]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    model = load_run(run, tokenizer=False)[0]
    assert [int(i) for i in out[0].split()] == list(generate(model, [1, 2, 3], 6, temperature=0))
    assert out[-1].startswith("total\t") and len(out) == 1 + 1 + 6 + 1
    vocab = model.cfg.vocab_size
    for bad, words in (
        (f"1,{vocab}", f"id {vocab} is outside 0..{vocab - 1}"),
        ("1,x", "separated by commas"),
        ("1,,2", "separated by commas"),  # an empty id between two commas is a typo, not nothing
        ("", "no ids given"),
    ):
        assert main(["generate", str(run), "--prompt-ids", bad]) == 2
        assert words in capsys.readouterr().err
    assert main(["generate", str(run), "--prompt-ids", "1", "--prompt", "a"]) == 2
    assert "cannot be combined" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # repeated: refused (argparse keeps the last one silently)
        main(["generate", str(run), "--prompt-ids", "1,2", "--prompt-ids", "3"])
    assert exc.value.code == 2 and "--prompt-ids given twice ('1,2', then '3'): give it once" in capsys.readouterr().err


def test_bench_train_times_the_precisions_side_by_side(capsys):
    """`lmlab bench train`: one JSON object whose figures agree with each other (tokens/s = batch x
    context / step seconds; the reference variant's ratio to itself is 1), the machine named by CPU
    model; bad input refused with the flag named."""
    assert (
        main(
            [
                "bench",
                "train",
                "--preset",
                "llama-3-8b",
                "--batch",
                "2",
                "--rounds",
                "2",
                "--steps",
                "1",
                "--threads",
                "1",
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert list(res["variants"]) == ["fp32 eager", "bf16 eager"] and res["threads"] == 1
    for v in res["variants"].values():
        assert v["tokens_per_s"] == pytest.approx(2 * res["context"] / v["s_per_step"])
        assert v["compile_s"] is None
    assert res["variants"]["fp32 eager"]["vs_first"] == 1.0
    assert "family" in res["machine"] or "?" in res["machine"] or "CPU" in res["machine"]
    assert (
        main(
            [
                "bench",
                "train",
                "--preset",
                "llama-3-8b",
                "--dtype",
                "fp32",
                "--batch",
                "1",
                "--rounds",
                "2",
                "--steps",
                "1",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "lmlab bench train:" in text and "fp32 eager" in text and "bf16" not in text
    with pytest.raises(SystemExit):
        main(["bench", "train", "--rounds", "1"])
    assert "--rounds" in capsys.readouterr().err
    assert main(["bench", "train", "--preset", "llama-3-8b", "--config", "demo"]) == 2
    assert "one of --config or --preset" in capsys.readouterr().err


def test_sweep_list_shows_each_spec_as_the_switches_would_run_it(capsys):
    """`lmlab sweep --list` names each spec's precision as written (every shipped spec moved to bf16 + compile
    by 2026-12-06), --dtype/--compile change what it lists, --tier lists the specs that define the tier."""
    import yaml

    from lmlab.lab.spec import builtin_specs

    written = {n: yaml.safe_load(p.read_text()).get("train", {}) for n, p in builtin_specs().items()}
    assert main(["sweep", "--list"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert sorted(lines) == sorted(written)
    for name, train in written.items():
        how = train.get("dtype", "fp32") + (", compiled" if train.get("compile") else "")
        assert lines[name].split(";")[0].endswith(f"seed(s), {how}"), (name, lines[name])
    assert main(["sweep", "--list", "--dtype", "fp32", "--compile"]) == 0
    assert all(", fp32, compiled" in line for line in capsys.readouterr().out.splitlines())
    with_gpu = [n for n, p in builtin_specs().items() if "gpu" in (yaml.safe_load(p.read_text()).get("tiers") or {})]
    assert main(["sweep", "--list", "--tier", "gpu"]) == 0
    assert sorted(line.split(": ")[0] for line in capsys.readouterr().out.splitlines()) == sorted(with_gpu)
    assert main(["sweep", "--list", "--tier", "tpu"]) == 2
    assert "--tier 'tpu': no shipped spec defines it" in capsys.readouterr().err


def test_startup_line_says_a_set_compile_apart_from_autos_choice(data_dir, tmp_path, capsys):
    """compile=false prints "compile eager (compile=false)"; compile=auto prints its own reasoned line and
    no "(compile=" suffix."""
    base = ["train", "--data", str(data_dir), *TRAIN, "--set", "max_steps=2"]
    assert main(base + ["--out", str(tmp_path / "a"), "--set", "compile=false"]) == 0
    err = capsys.readouterr().err
    assert "compile eager (compile=false);" in err, err
    assert main(base + ["--out", str(tmp_path / "b"), "--set", "compile=auto"]) == 0
    err = capsys.readouterr().err
    assert "compile auto: eager (" in err and "(compile=" not in err, err
