"""``lmlab report`` and ``lmlab report --index`` validate every file they read (lmlab.lab.validate):
a damaged results.jsonl, results.csv, verdicts.json, provenance.jsonl or load.jsonl gives one line
naming the file, line and field (exit 2), or, for the informational load.jsonl, a warning; never a
traceback and never a verdict computed from a value that could not be validated."""

import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from lmlab.cli import main
from lmlab.lab import plots

ROOT = Path(__file__).resolve().parents[1]

TINY_MODEL = {"context_length": 32, "d_model": 32, "n_layers": 1, "n_heads": 2}
TINY_TRAIN = {
    "batch_size": 4,
    "warmup_steps": 2,
    "log_interval": 2,
    "eval_interval": 1000,
    "eval_windows": 2,
    "device": "cpu",
    "checkpoint_interval": 0,
}
SPEC = {
    "name": "damage",
    "model": TINY_MODEL,
    "train": TINY_TRAIN,
    "axes": {"zip": [{"label": "fast", "lr": 1.0e-2}, {"label": "slow", "lr": 1.0e-3}]},
    "baseline": "slow",
    "expect": [{"better": "fast", "than": "slow", "by": 0.05}, {"equal": ["fast", "slow"], "within": 0.01}],
    "judging": {"min_seeds": 2, "tokens_per_param": 0},
    "seeds": [1, 2],
    "budget": {"steps": 8},
}
VERDICT = re.compile(
    r"\*\*(agrees|disagrees|inconclusive|rate not bracketed|not testable at this scale|too few seeds)"
    r"\*\*"
)
SWEEP_FILES = ("results.jsonl", "provenance.jsonl", "load.jsonl", "spec.yaml")


@pytest.fixture(scope="module")
def tiny(byte_data, tmp_path_factory):
    """One real tiny sweep (2 variants x 2 seeds, 8 steps) and its report folder: (a copy of the sweep
    folder's files the report reads, the report folder)."""
    root = tmp_path_factory.mktemp("damage")
    path = root / "damage.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "data": str(byte_data)}))
    assert main(["sweep", str(path), "--out", str(root / "sweep"), "--jobs", "2"]) == 0
    light = root / "light"  # the files a report reads, without the run folders (copied for every damage)
    light.mkdir()
    for name in SWEEP_FILES:
        shutil.copy(root / "sweep" / name, light / name)
    assert main(["report", str(root / "sweep"), "--out", str(root / "rep" / "report.md")]) == 0
    return light, root / "rep"


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch):
    """Figures are not what is checked here, and drawing them would take most of the time."""
    for name in (
        "lr_sensitivity",
        "basin",
        "init_grads",
        "loss_by_position",
        "ladder",
        "loss_curves",
        "diagnostics",
        "bpb_by_variant",
        "throughput",
        "forest",
    ):
        monkeypatch.setattr(plots, name, lambda *a, **k: None)


def _report(sweep, out, capsys) -> tuple[int, list, list]:
    """(exit status, verdicts, stderr lines) of `lmlab report SWEEP --out OUT/report.md`."""
    (out / "verdicts.json").unlink(missing_ok=True)
    rc = main(["report", str(sweep), "--out", str(out / "report.md")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    verdicts = [c["verdict"] for c in json.loads((out / "verdicts.json").read_text())["claims"]] if rc == 0 else []
    return rc, verdicts, err


def _index(folder, out, capsys) -> tuple[int, list, list]:
    """(exit status, verdicts, stderr lines) of `lmlab report --index FOLDER --out OUT/index.md`."""
    (out / "index.md").unlink(missing_ok=True)
    rc = main(["report", "--index", str(folder), "--out", str(out / "index.md")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    table = [line for line in (out / "index.md").read_text().splitlines() if line.startswith("| ")] if rc == 0 else []
    verdicts = [v for line in table for v in VERDICT.findall(line)]
    return rc, verdicts, err


def _copy(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _one_error(err, *names):
    assert len(err) == 1 and err[0].startswith("lmlab report: error: "), err
    for name in names:
        assert name in err[0], (name, err[0])
    return err[0]


# --- results.jsonl --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda rows: [[1, 2]] + rows[1:], "line 1: a results row must be a JSON object, got list"),
        (lambda rows: [None] + rows[1:], "line 1: a results row must be a JSON object, got NoneType"),
        (
            lambda rows: [{**rows[0], "val_bpb": "abc"}] + rows[1:],
            "line 1: field 'val_bpb' is 'abc'; give a finite number",
        ),
        (lambda rows: [{k: v for k, v in rows[0].items() if k != "run"}] + rows[1:], "line 1: field 'run' is missing"),
        (lambda rows: [{**rows[0], "variant": 7}] + rows[1:], "line 1: field 'variant' is 7; give a non-empty string"),
        (lambda rows: [{**rows[0], "steps": "x"}] + rows[1:], "line 1: field 'steps' is 'x'; give an integer >= 0"),
        (
            lambda rows: [{**rows[0], "val_bpb": -5.0}] + rows[1:],
            "line 1: field 'val_bpb' is -5.0; give a finite number",
        ),
        (lambda rows: [{**rows[0], "val_bpb": float("nan")}] + rows[1:], "line 1: field 'val_bpb' is NaN or infinite"),
        (
            lambda rows: rows + [{**rows[0], "val_bpb": rows[0]["val_bpb"] + 1}],
            "line 5: a second row for run 'fast-s1' (first at line 1)",
        ),
        (
            lambda rows: [{**rows[0], "status": "weird"}] + rows[1:],
            "line 1: field 'status' is 'weird'; give one of ok, ",
        ),
        (
            lambda rows: [{**rows[0], "sweep": "another"}] + rows[1:],
            "line 1: field 'sweep' is 'another', not this sweep's",
        ),
        (lambda rows: [{**rows[0], "seed": 9, "run": "fast-s9"}] + rows[1:], "line 1: field 'seed' is 9, not a seed"),
        (lambda rows: [{**rows[0], "run": "slow-s1"}] + rows[1:], "line 1: field 'run' is 'slow-s1', but its variant"),
        (
            lambda rows: [{k: v for k, v in rows[0].items() if k != "tokens"}] + rows[1:],
            "line 1: field 'tokens' is missing or null, though the other 'ok' rows hold it",
        ),
    ],
)
def test_damaged_results_rows_are_refused_in_one_line(tiny, tmp_path, capsys, damage, says):
    light, _ = tiny
    sweep = _copy(light, tmp_path / "sweep")
    _write_rows(sweep / "results.jsonl", damage(_rows(sweep / "results.jsonl")))
    rc, _, err = _report(sweep, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "results.jsonl: ", says)
    rc, _, err = _index(sweep, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "results.jsonl: ", says)


def test_identical_duplicate_row_is_dropped(tiny, tmp_path, capsys):
    light, _ = tiny
    rc, want, _ = _report(light, tmp_path, capsys)
    assert rc == 0 and want
    sweep = _copy(light, tmp_path / "sweep")
    rows = _rows(sweep / "results.jsonl")
    _write_rows(sweep / "results.jsonl", rows + [rows[0]])
    assert _report(sweep, tmp_path, capsys)[:2] == (0, want)


def test_deep_nesting_cut_line_and_invalid_utf8_are_named(tiny, tmp_path, capsys):
    light, _ = tiny
    sweep = _copy(light, tmp_path / "sweep")
    lines = (light / "results.jsonl").read_text().splitlines()
    deep = "[" * 100_000 + "]" * 100_000
    (sweep / "results.jsonl").write_text("\n".join([lines[0][:-1] + f', "fields": {deep}}}'] + lines[1:]) + "\n")
    rc, _, err = _report(sweep, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "results.jsonl: line 1: JSON nested more than 64 deep")
    # a last line cut by a kill: the report judges no run it could not read (the sweep scores it again)
    (sweep / "results.jsonl").write_text("\n".join(lines[:-1] + [lines[-1][:40]]) + "\n")
    rc, _, err = _report(sweep, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "results.jsonl: line 4: not JSON", "rerun `lmlab sweep`")
    for name in ("results.jsonl", "provenance.jsonl"):
        _copy(light, sweep)
        data = (sweep / name).read_bytes()
        (sweep / name).write_bytes(data[:30] + b"\xff\xfe" + data[30:])
        rc, _, err = _report(sweep, tmp_path, capsys)
        assert rc == 2
        _one_error(err, f"{name}: line 1: byte 0xff is not UTF-8")


# --- provenance.jsonl and load.jsonl ----------------------------------------------------------------------------
def test_damaged_provenance_is_named_and_garbage_load_only_warns(tiny, tmp_path, capsys):
    light, _ = tiny
    rc, want, _ = _report(light, tmp_path, capsys)
    sweep = _copy(light, tmp_path / "sweep")
    recs = _rows(sweep / "provenance.jsonl")
    _write_rows(sweep / "provenance.jsonl", [{**recs[0], "spec_sha256": 7}] + recs[1:])
    rc, _, err = _report(sweep, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "provenance.jsonl: line 1: field 'spec_sha256' is 7")
    _write_rows(sweep / "provenance.jsonl", recs[:-1] + [{**recs[-1], "wall_s": "abc"}])
    assert _report(sweep, tmp_path, capsys)[0] == 2
    _copy(light, sweep)
    (sweep / "load.jsonl").write_bytes(
        b'\x00garbage\n[1, 2]\n{"load_1m": "high"}\n\xff\n' + (light / "load.jsonl").read_bytes()
    )
    rc, got, err = _report(sweep, tmp_path, capsys)
    assert rc == 0 and got == want
    assert len(err) == 1 and err[0].startswith(f"warning: {sweep / 'load.jsonl'}: line 1: not JSON")
    assert "4 damaged line(s) of load.jsonl skipped" in err[0]
    assert "Load average" in (tmp_path / "report.md").read_text()  # from the good samples


# --- a report folder read by --index: results.csv and verdicts.json -----------------------------------------------
def _csv_cell(path, run, column, value):
    import csv

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    rows[[r[1] for r in rows].index(run)][rows[0].index(column)] = value
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


def test_index_never_judges_a_bad_results_csv_cell(tiny, tmp_path, capsys):
    _, rep = tiny
    rc, want, _ = _index(rep, tmp_path, capsys)
    assert rc == 0 and want and "agrees" in want  # the fast variant beats the slow baseline
    folder = _copy(rep, tmp_path / "rep")
    for cell, says in (
        ("abc", "column 'val_bpb' is 'abc'; give a finite number"),
        ("nan", "column 'val_bpb' is 'nan'"),
        ("inf", "column 'val_bpb' is 'inf'"),
        ("-5.0", "field 'val_bpb' is -5.0"),
    ):
        _copy(rep, folder)
        _csv_cell(folder / "results.csv", "slow-s1", "val_bpb", cell)  # the baseline's row
        rc, _, err = _index(folder, tmp_path, capsys)
        assert rc == 2  # before: the bad cell counted as a failed run, and the claim read 'agrees'
        _one_error(err, "results.csv: row ", says)
    _copy(rep, folder)
    data = (folder / "results.csv").read_text()
    (folder / "results.csv").write_text("name,value,run\n" + data.split("\n", 1)[1])
    rc, _, err = _index(folder, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "results.csv: line 1: the header")
    (folder / "results.csv").write_text(data.replace(",ok,", ",o\0k,", 1))
    rc, _, err = _index(folder, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "results.csv: line 2: a NUL byte")


@pytest.mark.parametrize(
    "claims, says",
    [
        ({"claims": [1, 2]}, "claims[0]: a claim must be a JSON object, got int"),
        ({"claims": [{}]}, "claims[0]: field 'text' is missing"),
        (None, "claims[0]: field 'verdict' is 'probably'; give one of agrees"),  # an unknown verdict
        ("nan", "is NaN or infinite"),
    ],
)
def test_damaged_verdicts_json_is_refused_in_one_line(tiny, tmp_path, capsys, claims, says):
    _, rep = tiny
    folder = tmp_path / "verdicts-only"  # a folder read from its verdicts.json alone
    folder.mkdir()
    data = json.loads((rep / "verdicts.json").read_text())
    if claims is None:
        data["claims"][0]["verdict"] = "probably"
    elif claims == "nan":
        data["comparisons"][0]["mean"] = float("nan")
    else:
        data = claims
    (folder / "verdicts.json").write_text(json.dumps(data))
    rc, _, err = _index(folder, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "verdicts.json: ", says)
    shutil.copy(rep / "results.csv", folder / "results.csv")  # a report folder: its verdicts.json read too
    shutil.copy(rep / "spec.yaml", folder / "spec.yaml")
    rc, _, err = _index(folder, tmp_path, capsys)
    assert rc == 2
    _one_error(err, "verdicts.json: ", says)


def test_a_hand_edited_verdict_or_interval_is_refused(tiny, tmp_path, capsys):
    """A verdicts.json whose verdict its own interval does not give (flipped by hand), whose lo > hi or
    whose effect lies outside its interval is refused naming the claim, never published; the new-user
    check of issue 44 found the flipped verdict published by --index."""
    _, rep = tiny
    data = json.loads((rep / "verdicts.json").read_text())
    judged = next(
        i for i, c in enumerate(data["claims"]) if c["lo"] is not None and c["verdict"] in ("agrees", "disagrees")
    )
    c = data["claims"][judged]
    flip = {"agrees": "disagrees", "disagrees": "agrees"}[c["verdict"]]
    for edit, says in (
        ({"verdict": flip, "measured": flip}, "(a hand-edited verdict?)"),
        ({"lo": c["hi"] + 1.0}, "above hi="),
        ({"effect": c["hi"] + 1.0}, "outside its interval"),
    ):
        folder = tmp_path / f"v-{len(says)}"
        folder.mkdir()
        damaged = json.loads(json.dumps(data))
        damaged["claims"][judged].update(edit)
        (folder / "verdicts.json").write_text(json.dumps(damaged))
        rc, _, err = _index(folder, tmp_path, capsys)
        assert rc == 2
        _one_error(err, f"verdicts.json: claims[{judged}]", says)


def test_report_names_a_file_given_as_the_sweep_and_index_refuses_a_folder_twice(tiny, tmp_path, capsys):
    light, rep = tiny
    assert main(["report", str(light / "results.jsonl"), "--out", str(tmp_path / "r" / "report.md")]) == 2
    _one_error([x for x in capsys.readouterr().err.splitlines() if x.strip()], "is a file, not a sweep folder")
    assert not (tmp_path / "r").exists()
    assert main(["report", "--index", str(rep), str(rep) + "/", "--out", str(tmp_path / "i" / "index.md")]) == 2
    _one_error([x for x in capsys.readouterr().err.splitlines() if x.strip()], "is given twice")


# --- the property: 200 random damages ------------------------------------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000


def _damage(rng: random.Random, name: str, data: bytes) -> tuple[str, bytes]:
    """One random damage of a file's bytes: (what was done, the damaged bytes)."""
    kind = rng.choice(["truncate", "flip", "value", "duplicate", "remove", "utf8", "deep"])
    text = data.decode()
    lines = text.splitlines()
    if kind == "truncate":  # cut inside a line (a cut at a line's end is a sweep with fewer rows)
        cuts = [i for i in range(1, len(data)) if data[i - 1] != 0x0A and data[i] != 0x0A]
        at = rng.choice(cuts)
        return f"truncate at {at}", data[:at]
    if kind == "flip":  # an ASCII byte's top bit: never valid UTF-8 beside ASCII
        spots = [i for i in range(1, len(data) - 1) if data[i - 1] < 0x80 and data[i] < 0x80 and data[i + 1] < 0x80]
        at = rng.choice(spots)
        return f"flip byte {at}", data[:at] + bytes([data[at] ^ 0x80]) + data[at + 1 :]
    if kind == "utf8":
        at = rng.randrange(len(data))
        return f"invalid UTF-8 at {at}", data[:at] + b"\xc3\x28\xff" + data[at:]
    bad = rng.choice(["abc", -5.0, float("nan"), [1, 2], {"x": 1}, -1, ""])
    if name == "results.csv":
        import csv
        import io

        rows = list(csv.reader(io.StringIO(text, newline="")))
        r, c = rng.randrange(1, len(rows)), rng.randrange(len(rows[0]))
        if kind == "value":
            rows[r][c] = DEEP if isinstance(bad, list) else str(bad).lower()
        elif kind == "deep":
            rows[r][c] = DEEP
        elif kind == "remove":
            del rows[r][c]
        else:  # duplicate a row with another value in one cell
            rows.append(list(rows[r]))
            rows[-1][c] = rows[-1][c] + "1" if rows[-1][c] else "1"
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        return f"{kind} row {r} column {rows[0][c] if c < len(rows[0]) else c}", out.getvalue().encode()
    if name == "verdicts.json":
        obj = json.loads(text)
        target = rng.choice([obj] + obj["claims"])
        key = rng.choice(sorted(target))
        if kind == "remove":
            del target[key]
        elif kind in ("value", "duplicate"):
            target[key] = bad
        else:
            target[key] = "DEEP"
        dumped = json.dumps(obj, indent=1).replace('"DEEP"', DEEP)
        return f"{kind} {key}", dumped.encode()
    i = rng.randrange(len(lines))
    row = json.loads(lines[i])
    key = rng.choice(sorted(row))
    if kind == "value":
        lines[i] = json.dumps({**row, key: bad})
    elif kind == "deep":
        lines[i] = json.dumps({**row, key: "DEEP"}).replace('"DEEP"', DEEP)
    elif kind == "remove":
        lines[i] = json.dumps({k: v for k, v in row.items() if k != key})
    else:  # a second copy of the row with another value
        other = row[key] + 1 if isinstance(row[key], (int, float)) and not isinstance(row[key], bool) else "other"
        lines.append(json.dumps({**row, key: other}))
    return f"{kind} line {i + 1} field {key}", ("\n".join(lines) + "\n").encode()


def test_random_damages_never_give_a_traceback_or_another_verdict(tiny, tmp_path, capsys):
    light, rep = tiny
    out = tmp_path / "out"
    out.mkdir()
    rc, want_report, _ = _report(light, out, capsys)
    assert rc == 0 and want_report
    rc, want_sweep_index, _ = _index(light, out, capsys)
    assert rc == 0 and want_sweep_index
    rc, want_rep_index, _ = _index(rep, out, capsys)
    assert rc == 0 and want_rep_index == want_sweep_index
    sweep, folder = _copy(light, tmp_path / "sweep"), _copy(rep, tmp_path / "rep")
    rng = random.Random(44)
    files = [
        (sweep, "results.jsonl"),
        (sweep, "provenance.jsonl"),
        (sweep, "load.jsonl"),
        (folder, "results.csv"),
        (folder, "verdicts.json"),
    ]
    outcomes = {0: 0, 2: 0}
    for n in range(200):
        where, name = files[n % len(files)]
        original = (where / name).read_bytes()
        what, damaged = _damage(rng, name, original)
        (where / name).write_bytes(damaged)
        try:
            checks = (
                [(_report, want_report), (_index, want_sweep_index)] if where == sweep else [(_index, want_rep_index)]
            )
            for run, want in checks:
                try:
                    rc, got, err = run(where, out, capsys)
                except BaseException as exc:  # noqa: BLE001 -- name the damage that raised
                    raise AssertionError(f"damage {n} ({name}: {what}) raised {type(exc).__name__}: {exc}") from exc
                assert rc in (0, 2), (n, name, what, rc, err)
                outcomes[rc] += 1
                if rc == 0:
                    assert got == want, (n, name, what, got, want)
                else:
                    assert len(err) == 1 and name in err[0] and "Traceback" not in err[0], (n, name, what, err)
        finally:
            (where / name).write_bytes(original)
    assert outcomes[0] > 10 and outcomes[2] > 100, outcomes


def test_report_on_damaged_sweep_files_gives_one_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "results.jsonl").write_text('{"run": "a-s1", "variant": "a", "seed": 1, "status": "ok", "val_bpb": 2.0}\n')
    for text, says in ((": :", "could not be parsed"), ("[1, 2]", "must hold a mapping"), (b"\xff", "not UTF-8")):
        (sweep / "spec.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
        assert main(["report", str(sweep)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and "spec.yaml" in err[0]
    shutil.copy(sweep / "results.jsonl", tmp_path / "keep.jsonl")
    (sweep / "spec.yaml").write_text("seeds: [1]\n")
    (sweep / "timing.json").write_text("{")
    assert main(["report", str(sweep)]) == 2
    assert "timing.json' could not be read" in capsys.readouterr().err.strip().splitlines()[-1]
    assert (sweep / "results.jsonl").read_bytes() == (tmp_path / "keep.jsonl").read_bytes()


def test_report_and_plot_without_matplotlib_name_the_extra_before_writing(tmp_path, capsys, monkeypatch):
    """Without the plot extra, `lmlab report` and `lmlab plot` stop in one line naming it, before writing
    anything (report used to write results.csv, then fail with a traceback)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "results.jsonl").write_text('{"run": "a-s1", "variant": "a", "seed": 1, "status": "ok", "val_bpb": 2.0}\n')
    (sweep / "spec.yaml").write_text("seeds: [1]\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    before = sorted(p.name for p in sweep.iterdir())
    assert main(["report", str(sweep)]) == 2
    assert "pip install 'lmlab[plot]'" in capsys.readouterr().err
    assert sorted(p.name for p in sweep.iterdir()) == before
    assert main(["plot", str(sweep), "--out", str(tmp_path / "figs")]) == 2
    assert "lmlab plot draws its figures with matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "figs").exists()


def _timed_sweep(tmp_path):
    """A sweep folder rebuilt from a committed report folder with a timing block (09-parallel-block)."""
    from lmlab.lab.validate import read_results_csv

    src = ROOT / "docs" / "ablations" / "09-parallel-block"
    sweep = tmp_path / "09-parallel-block"
    sweep.mkdir()
    rows = read_results_csv(src / "results.csv")
    (sweep / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("spec.yaml", "timing.json"):
        shutil.copy(src / name, sweep / name)
    return sweep, json.loads((src / "timing.json").read_text())


def _break(timing, how):
    t = json.loads(json.dumps(timing))
    block = t["scales"][""]["step_s"]
    first = next(iter(block))
    if how == "scales a list":
        t["scales"] = [1]
    elif how == "times as strings":
        block[first] = [str(x) for x in block[first]]
    elif how == "a negative time":
        block[first][0] = -0.01
    elif how == "an infinite time":
        block[first][0] = float("inf")
    elif how == "other settings":
        t["key"]["settings"]["pairs"] = 99
    elif how == "no key":
        del t["key"]
    elif how == "a round missing":
        block[first] = block[first][:-1]
    return t


@pytest.mark.parametrize(
    "how, says",
    [
        ("scales a list", "field 'scales' must map each scale"),
        ("times as strings", "must be a non-empty list of seconds"),
        ("a negative time", "must be a non-empty list of seconds"),
        ("an infinite time", "NaN or infinite"),
        ("other settings", "is not the spec's timing settings"),
        ("no key", "field 'key.settings' must be an object"),
        ("a round missing", "rounds; interleaved rounds pair them"),
    ],
)
def test_report_refuses_a_damaged_timing_block(tmp_path, capsys, how, says):
    """timing.json's numbers decide the step-time claims: a damaged or foreign block is refused in one line
    naming the file and the field (it used to be judged, e.g. a negative time read as a +8,884% gain)."""
    sweep, timing = _timed_sweep(tmp_path)
    assert main(["report", str(sweep), "--out", str(tmp_path / "ok" / "report.md")]) == 0
    capsys.readouterr()
    (sweep / "timing.json").write_text(json.dumps(_break(timing, how)))
    assert main(["report", str(sweep), "--out", str(tmp_path / "bad" / "report.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.json" in err[0] and says in err[0], err
    assert not (tmp_path / "bad").exists()
