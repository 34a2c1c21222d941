"""Sweeps through submitit (lmlab.lab.executors, lmlab.lab.worker): the same rows as local threads, the
spec's barriers, preemption with requeue and exact resume, a coordinator killed and restarted; on submitit's
local executor and on a real one-node Slurm (`.ci/slurm-up`, which CI runs; the Slurm tests are skipped
where no Slurm answers, unless LMLAB_REQUIRE_SLURM=1, as .ci/run sets: then a missing cluster fails)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lmlab.cli import main
from lmlab.config import ConfigError
from lmlab.lab.results import read_results
from lmlab.lab.runner import run_sweep

pytest.importorskip("submitit")

ROOT = Path(__file__).resolve().parents[1]
# what is deterministic in a row (training is exact on CPU for a given seed and thread count)
SAME = ("status", "steps", "tokens", "val_bpb", "val_loss", "final_train_loss", "first_train_loss", "params")


def tiny_spec(data: Path, steps: int = 12) -> dict:
    """Two variants, two-stage tuning: seed 1 over two rates, seed 2 at the chosen one (6 runs)."""
    return {
        "name": "tiny-exec",
        "claim": "SwiGLU beats SiLU at equal non-embedding parameters.",
        "model": {"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2},
        "train": {
            "batch_size": 4,
            "warmup_steps": 2,
            "log_interval": 2,
            "eval_interval": 100,
            "eval_windows": 2,
            "device": "cpu",
            "checkpoint_interval": 4,
        },
        "data": str(data),
        "axes": {"zip": [{"label": "SiLU", "activation": "silu"}, {"label": "SwiGLU", "activation": "swiglu"}]},
        "seeds": [1, 2],
        "tune_seeds": [1],
        "tune": {"lr": [3e-3, 1e-2]},
        "tuning": {"extend": 0},
        "budget": {"steps": steps},
        "eval_contexts": [1],
    }


def _rows(out: Path) -> dict:
    return {r["run"]: {k: r.get(k) for k in SAME} for r in read_results(out)}


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (no longer listed, or a zombie not yet reaped)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _parent(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a task's fork server and the runs it forked)."""
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _wait(cond, timeout: float, what: str):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _release_requeued(job_id: str) -> None:
    """Start a requeued job now instead of after Slurm's 120-s hold (BeginTime), but not within the second
    its last attempt was killed: slurmd refuses to launch a job whose credential was created in the second
    its earlier one was revoked ("Job credential revoked" in slurmctld's log, and the job ends FAILED: five
    times on 2026-12-05, each a job released in the second of its requeue). Real clusters hold it 120 s."""
    time.sleep(2.0)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)


def _submitit_local_at_second_checkpoint(path: Path, out: Path):
    """`lmlab sweep PATH --executor submitit-local` started in a subprocess, once its run has checkpointed
    twice; returns (the process, the job's controller PID)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmlab.cli", "sweep", str(path), "--out", str(out), "--executor", "submitit-local"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = out / "runs" / "SiLU-s1" / "metrics.jsonl"
    _wait(
        lambda: metrics.is_file() and '"checkpoint": "step_0000008"' in metrics.read_text(),
        120,
        "the run's second checkpoint",
    )
    return proc, int(json.loads((out / "jobs.jsonl").read_text().splitlines()[0])["job_id"])


@pytest.fixture(scope="module")
def local_reference(byte_data, tmp_path_factory):
    """The tiny spec through local threads (--jobs 2): the rows every executor must reproduce."""
    path = tmp_path_factory.mktemp("ref") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_spec(byte_data)))
    out = path.parent / "sweep"
    run_sweep(path, out=out, jobs=2, log=lambda line: None)
    return path, _rows(out)


@pytest.fixture(scope="module")
def one_run(byte_data, tmp_path_factory):
    """One 1,600-step run (checkpoints every 4 steps: long enough that a test interrupting it after its
    second checkpoint lands mid-training on a fast machine: at 400 steps a Zen 4 core finished the training
    in the 1.6 s Slurm took to preempt it, 2026-12-05 CI) and its rows trained without interruption."""
    spec = tiny_spec(byte_data, steps=1600)
    spec.update(seeds=[1], tune_seeds=None, tune=None, train={**spec["train"], "lr": 3e-3})
    spec["axes"] = {"zip": spec["axes"]["zip"][:1]}
    path = tmp_path_factory.mktemp("one") / "one.yaml"
    path.write_text(yaml.safe_dump(spec))
    run_sweep(path, out=path.parent / "ref", jobs=1, log=lambda line: None)
    return path, _rows(path.parent / "ref")


def test_sweep_task_notes_a_sigterm_and_keeps_the_handler_before_it(monkeypatch):
    """SweepTask's SIGTERM note (what decides whether a task whose trainings stopped waits for Slurm to end
    the job): the first signal's time is noted, the handler installed before (submitit's) still runs, and is
    back after the block; with no SIGTERM nothing is noted."""
    from lmlab.lab import executors

    seen = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with executors._sigterm_noted() as got:
            assert got == []
        with executors._sigterm_noted() as got:
            t0 = time.time()
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert len(got) == 1 and t0 <= got[0] <= time.time()
        assert seen == [signal.SIGTERM, signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGTERM)  # the handler before the block again
        time.sleep(0.05)
        assert seen == [signal.SIGTERM] * 3 and len(got) == 1
        # a task that waits: no longer than SLURM_END_WAIT_S after the signal
        monkeypatch.setattr(executors, "SLURM_END_WAIT_S", 0.5)
        t0 = time.monotonic()
        executors._await_slurm_end(time.time() - 0.2)
        assert 0.2 <= time.monotonic() - t0 < 1.5
    finally:
        signal.signal(signal.SIGTERM, before)


def test_submitit_local_equals_local_threads_and_holds_the_barrier(local_reference, tmp_path):
    path, want = local_reference
    out = tmp_path / "sweep"
    lines = []
    run_sweep(path, out=out, jobs=2, executor="submitit-local", log=lines.append)
    assert _rows(out) == want and len(want) == 2 * 2 + 2  # 4 stage-1 runs, 2 stage-2
    jobs = [json.loads(x) for x in (out / "jobs.jsonl").read_text().splitlines()]
    assert all(j["executor"] == "submitit-local" and len(j["runs"]) == 1 for j in jobs) and len(jobs) == 6
    # the barrier: every stage-2 job was submitted after every stage-1 run had its row
    stage1 = [j for j in jobs if j["runs"][0].endswith("-s1")]
    stage2 = [j for j in jobs if j["runs"][0].endswith("-s2")]
    assert len(stage1) == 4 and len(stage2) == 2 and jobs[:4] == stage1
    last_row = max((out / "rows" / f"{j['runs'][0]}.json").stat().st_mtime for j in stage1)
    assert min(j["t"] for j in stage2) >= last_row
    assert any(line.startswith("submitit-local: ") and "done" in line for line in lines)
    # a second invocation submits nothing
    run_sweep(path, out=out, jobs=2, executor="submitit-local", log=lines.append)
    assert len((out / "jobs.jsonl").read_text().splitlines()) == 6


def test_preempted_job_is_requeued_and_resumes_exactly(one_run, tmp_path):
    """SIGUSR2 to a running job (Slurm's preemption / time-limit signal): its training checkpoints, the job
    is requeued by submitit and continues from the checkpoint; the row equals an uninterrupted run's."""
    path, ref_rows = one_run
    out = tmp_path / "sweep"
    proc, controller = _submitit_local_at_second_checkpoint(path, out)
    worker = _wait(lambda: _children(controller), 10, "the job's task process")[0]
    os.kill(worker, signal.SIGUSR2)
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text
    requeues = [json.loads(x) for x in (out / "requeues.jsonl").read_text().splitlines()]
    assert len(requeues) == 1 and requeues[0]["runs"] == ["SiLU-s1"] and requeues[0]["stopped_trainings"] == 1
    log = (out / "logs" / "SiLU-s1.log").read_text()
    assert log.count("$ ") == 2 and "resuming" in log  # trained twice: the second continued
    assert _rows(out) == ref_rows
    assert "1 requeue(s)" in text


SLURM_FLAGS = {"slurm_partition": "debug", "cpus_per_task": 1, "slurm_array_parallelism": 2, "timeout_min": 30}


@pytest.mark.parametrize("executor", ["submitit-local", "slurm"])
def test_coordinator_killed_and_restarted_reattaches(executor, local_reference, tmp_path):
    """The coordinator SIGKILLed while jobs run: the jobs go on; the same command re-attaches to the live
    ones, merges rows written meanwhile and submits and trains no run twice; the rows equal local threads'."""
    if executor == "slurm" and not _slurm_up():
        assert os.environ.get("LMLAB_REQUIRE_SLURM") != "1", "LMLAB_REQUIRE_SLURM=1 but no Slurm answers"
        pytest.skip("no Slurm cluster answers (.ci/slurm-up starts one)")
    path, want = local_reference
    out = tmp_path / "sweep"
    flags = ["--slurm-partition", "debug", "--cpus-per-task", "1", "--array-parallelism", "2", "--time", "30"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lmlab.cli",
            "sweep",
            str(path),
            "--out",
            str(out),
            "--executor",
            executor,
            "--jobs",
            "2",
        ]
        + (flags if executor == "slurm" else []),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait(lambda: (out / "rows").is_dir() and len(list((out / "rows").glob("*.json"))) >= 1, 180, "a first row")
    proc.kill()
    proc.wait()
    lines = []
    if executor == "slurm":  # 3 of its 4 jobs still queued or running: another executor is refused
        with pytest.raises(ConfigError, match=r"--executor local: runs of this sweep are still in \d+ job\(s\) sub"):
            run_sweep(path, out=out, jobs=2, executor="local", log=lines.append)
        # and the same executor with other CPUs per task: the live jobs' resources are not this command's
        with pytest.raises(
            ConfigError, match=r"job \S+ of this sweep still runs with .*--cpus-per-task 1 \(this command: 2\)"
        ):
            run_sweep(
                path,
                out=out,
                jobs=2,
                executor="slurm",
                log=lines.append,
                executor_params={**SLURM_FLAGS, "cpus_per_task": 2},
            )
    run_sweep(
        path,
        out=out,
        jobs=2,
        executor=executor,
        log=lines.append,
        executor_params=SLURM_FLAGS if executor == "slurm" else None,
    )
    assert _rows(out) == want
    for name in want:  # each run trained by one process from start to end
        log = (out / "logs" / f"{name}.log").read_text()
        assert log.count("$ ") == 1, (name, log[-2000:])
    submitted = [n for x in (out / "jobs.jsonl").read_text().splitlines() for n in json.loads(x)["runs"]]
    assert sorted(submitted) == sorted(want)  # each run submitted once, across both coordinators


def test_sweep_worker_cli_and_bad_input(local_reference, tmp_path, capsys):
    path, want = local_reference
    out = path.parent / "sweep"
    # a planned run with a row is skipped; exit 0
    assert main(["sweep-worker", str(out), "SiLU_lr=0.003-s1"]) == 0
    assert "skip SiLU_lr=0.003-s1: done (ok)" in capsys.readouterr().out
    assert main(["sweep-worker", str(out), "nope-s1"]) == 2
    err = capsys.readouterr().err
    assert "plans/nope-s1.json: no such plan" in err and "SiLU_lr=0.003-s1" in err
    # bad executor input: named, non-zero, nothing written
    fresh = tmp_path / "fresh"
    assert (
        main(
            [
                "sweep",
                str(path),
                "--out",
                str(fresh),
                "--executor",
                "submitit-local",
                "--executor-config",
                str(_write(tmp_path / "x.yaml", {"bogus_key": 1})),
            ]
        )
        == 2
    )
    assert "bogus_key" in capsys.readouterr().err and not (fresh / "runs").exists()
    assert main(["sweep", str(path), "--out", str(fresh), "--runs-per-task", "2"]) == 2
    assert "--runs-per-task: not an option of the local executor" in capsys.readouterr().err
    for argv, want in [
        (["--executor", "submitit-local", "--address", "local"], "--address: an option of --executor ray"),
        (["--executor", "submitit-local", "--slurm-partition", " "], "--slurm-partition: empty; give a value"),
        (["--executor", "slurm", "--time", "2"], "--time 2: not longer than the 120 s before the limit"),
        (
            ["--executor", "ray", "--slurm-partition", "debug", "--time", "5"],
            "--slurm-partition, --time: not options of --executor ray",
        ),
        (["--executor", "submitit-local", "--gpus-per-task", "0.5"], "Slurm counts whole GPUs"),
        (["--executor", "ray", "--gpus-per-task", "-1"], "--gpus-per-task -1.0: give a number >= 0"),
        (["--executor", "ray", "--max-retries", "-2"], "--max-retries -2: give an integer >= 0, or -1"),
    ]:
        assert main(["sweep", str(path), "--out", str(fresh)] + argv) == 2, argv
        assert want in capsys.readouterr().err, argv
    assert (
        main(
            [
                "sweep",
                str(path),
                "--out",
                str(fresh),
                "--executor",
                "submitit-local",
                "--executor-config",
                str(_write(tmp_path / "t.yaml", {"mem_gb": "lots"})),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "a parameter submitit refuses among ['mem_gb']" in err and "Traceback" not in err
    assert not fresh.exists()
    if not any((Path(p) / "srun").exists() for p in os.environ.get("PATH", "").split(os.pathsep)):
        assert main(["sweep", str(path), "--out", str(fresh), "--executor", "slurm"]) == 2
        assert "srun" in capsys.readouterr().err and not (fresh / "runs").exists()


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# --- a real one-node Slurm ------------------------------------------------------------------
def _slurm_up() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    # "planned": idle, held by the backfill scheduler for a pending job (seen right after a preemption test)
    usable = ("idle", "mix", "alloc", "planned")
    return out.returncode == 0 and any(s.startswith(usable) for s in out.stdout.split())


slurm = pytest.mark.skipif(
    not _slurm_up() and os.environ.get("LMLAB_REQUIRE_SLURM") != "1",
    reason="no Slurm cluster answers (.ci/slurm-up starts one)",
)


@pytest.fixture
def cluster():
    assert _slurm_up(), "LMLAB_REQUIRE_SLURM=1 but sinfo shows no usable node: run .ci/slurm-up"


@slurm
def test_slurm_sweep_equals_local_threads(cluster, local_reference, tmp_path, capsys):
    path, want = local_reference
    out = tmp_path / "sweep"
    lines = []
    run_sweep(
        path,
        out=out,
        executor="slurm",
        log=lines.append,
        runs_per_task=2,
        executor_params={
            "slurm_partition": "debug",
            "cpus_per_task": 2,
            "slurm_array_parallelism": 2,
            "timeout_min": 30,
        },
    )
    assert _rows(out) == want  # two runs per task, one thread each, as --jobs 2's one thread
    # what Slurm would refuse is refused before anything is written (sbatch --test-only)
    bad = tmp_path / "bad"
    for argv, want_err in [
        (["--slurm-partition", "nosuchpart"], "invalid partition"),
        (["--slurm-partition", "debug", "--cpus-per-task", "4096"], "Slurm refuses a job with"),
    ]:
        assert main(["sweep", str(path), "--out", str(bad), "--executor", "slurm"] + argv) == 2, argv
        err = capsys.readouterr().err
        assert want_err in err and "Traceback" not in err and not bad.exists(), err
    jobs = [json.loads(x) for x in (out / "jobs.jsonl").read_text().splitlines()]
    # two job arrays, one per stage: stage 1's four runs in two tasks, then stage 2's two in one
    arrays = {j["job_id"].split("_")[0] for j in jobs}
    assert [len(j["runs"]) for j in jobs] == [2, 2, 2] and len(arrays) == 2
    assert [j["job_id"] for j in jobs[:2]] == [f"{jobs[0]['job_id'].split('_')[0]}_{k}" for k in (0, 1)]  # an array
    assert all(r.endswith("-s2") for r in jobs[2]["runs"])
    assert any(line.startswith("slurm: ") for line in lines)


def _slurm_sweep_at_second_checkpoint(path: Path, out: Path, partition: str) -> subprocess.Popen:
    """`lmlab sweep PATH --executor slurm` (2 CPUs a task: the whole test node) started in a subprocess,
    returned once its run has checkpointed twice (the process is killed if that does not come)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmlab.cli", "sweep", str(path), "--out", str(out), "--executor", "slurm"]
        + ["--slurm-partition", partition, "--cpus-per-task", "2", "--time", "30"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = out / "runs" / "SiLU-s1" / "metrics.jsonl"
    try:
        _wait(
            lambda: metrics.is_file() and '"checkpoint": "step_0000008"' in metrics.read_text(),
            180,
            "the run's second checkpoint",
        )
    except BaseException:
        proc.kill()
        raise
    return proc


@slurm
def test_slurm_preemption_is_requeued_and_resumes(cluster, one_run, tmp_path):
    path, ref_rows = one_run
    out = tmp_path / "sweep"
    proc = _slurm_sweep_at_second_checkpoint(path, out, "debug")
    try:
        job_id = json.loads((out / "jobs.jsonl").read_text().splitlines()[0])["job_id"]
        subprocess.run(["scancel", "--signal", "USR2", job_id], check=True)
        # Slurm holds a requeued job for 120 s (BeginTime); this test cluster releases it at once
        _wait(
            lambda: (
                (out / "requeues.jsonl").is_file()
                and "PENDING"
                in subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
            ),
            120,
            "the requeue",
        )
        _release_requeued(job_id)
        text, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, text
    requeues = [json.loads(x) for x in (out / "requeues.jsonl").read_text().splitlines()]
    assert len(requeues) == 1 and requeues[0]["runs"] == ["SiLU-s1"] and requeues[0]["stopped_trainings"] == 1
    log = (out / "logs" / "SiLU-s1.log").read_text()
    assert log.count("$ ") == 2 and "resuming" in log
    assert _rows(out) == ref_rows


@slurm
@pytest.mark.parametrize("partition", ["debug", "scavenger"])
def test_slurm_partition_preemption_resumes(cluster, one_run, tmp_path, partition):
    """A cluster's preemption, not a signal sent by hand: a job of the higher-priority partition `urgent`
    needs the node, and Slurm (partition_prio) sends the sweep's job SIGTERM, on which the training
    checkpoints. debug's PreemptMode=REQUEUE: Slurm requeues the job and its next attempt continues the
    run; scavenger's PreemptMode=CANCEL: the job ends PREEMPTED and the coordinator submits the run again;
    grace: REQUEUE after a 15-s GraceTime; the training checkpoints and exits, and the task waits to be
    requeued (had it ended itself first, the job would be FAILED, not requeued). Each way the row equals an
    uninterrupted run's and the requeue is recorded."""
    path, ref_rows = one_run
    out = tmp_path / "sweep"
    proc = _slurm_sweep_at_second_checkpoint(path, out, partition)
    urgent = None

    def squeue(job: str) -> str:
        return subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout

    try:
        job_id = json.loads((out / "jobs.jsonl").read_text().splitlines()[0])["job_id"]
        urgent = subprocess.run(
            ["sbatch", "--parsable", "-p", "urgent", "-c", "2", "-o", "/dev/null", "--wrap", "sleep 1"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        want = "PREEMPTED" if partition == "scavenger" else "PENDING"
        _wait(lambda: want in squeue(job_id), 120, f"the sweep's job {want}")
        if want == "PENDING":  # Slurm holds a requeued job for 120 s (BeginTime); release it at once
            _wait(lambda: "COMPLETED" in squeue(urgent), 60, "the urgent job")
            _release_requeued(job_id)
        text, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
        if urgent:
            subprocess.run(["scancel", urgent], check=False)
    assert proc.returncode == 0, text
    log = (out / "logs" / "SiLU-s1.log").read_text()
    assert log.count("$ ") == 2 and "SIGTERM received" in log and "resuming" in log, log
    # the checkpoint was written at the SIGTERM (Slurm delivers it twice: one request, not "stop at once"),
    # and the next attempt resumed from it: the run's own records say so
    records = [json.loads(x) for x in (out / "runs" / "SiLU-s1" / "metrics.jsonl").read_text().splitlines()]
    at = [i for i, r in enumerate(records) if r.get("stopped") == "SIGTERM"]
    assert len(at) == 1, records
    step = records[at[0]]["step"]
    # (saved at the stop, or just before it where the step was a checkpoint step anyway)
    assert {"step": step, "checkpoint": f"step_{step:07d}"} in records[at[0] - 1 : at[0] + 2], records[at[0] - 1 :]
    assert f"from step {step} of 1600" in log, log
    # the training's last line, if it got to print it: srun, signalled again while Slurm cancels its step for
    # the preemption, forces the step's end ("srun: forcing job termination", SIGKILL) within a second, which
    # can fall between the checkpoint and this line (seen in CI on 2026-12-06 under PreemptMode=REQUEUE)
    stopped = re.search(r"interrupted by SIGTERM at step (\d+) of 1600; its checkpoint is saved", log)
    assert stopped is None or int(stopped[1]) == step, log
    if partition == "grace":  # it ended itself (in time, here), and the task waited for Slurm's requeue
        assert stopped, log
        out_logs = "".join(p.read_text() for p in (out / "submitit").glob("*/*_0_log.out"))
        assert f"SIGTERM from Slurm: trainings checkpointed; waiting for Slurm to end job {job_id}" in out_logs
    assert not list((out / "runs" / "SiLU-s1" / "checkpoints").glob("*.tmp"))
    assert _rows(out) == ref_rows
    requeues = [json.loads(x) for x in (out / "requeues.jsonl").read_text().splitlines()]
    jobs = [json.loads(x)["job_id"] for x in (out / "jobs.jsonl").read_text().splitlines()]
    assert len(requeues) == 1 and requeues[0]["runs"] == ["SiLU-s1"] and requeues[0]["job_id"] == job_id
    if partition != "scavenger":
        assert requeues[0]["by"].startswith("slurm") and requeues[0]["attempt"] == 1 and jobs == [job_id]
    else:
        assert len(jobs) == 2 and requeues[0]["by"].startswith("lmlab sweep") and jobs[1] in requeues[0]["by"]
        assert f"job {job_id} was preempted: SiLU-s1 submitted again as job {jobs[1]}" in text
    assert "slurm: 0 queued, 0 running, 1/1 done, 0 failed, 1 requeue(s)" in text, text


# --- Ray ---------------------------------------------------------------------------------------
def _training_pid(run_dir: Path):
    """The pid of the `lmlab train` that holds ``run_dir``'s lock (forked by the fork server or not)."""
    lock = run_dir.with_name(f".{run_dir.name}.lock")
    try:
        pid = json.loads(lock.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


@pytest.fixture(scope="module")
def ray_here():
    """One Ray for the module's Ray tests (started by the first sweep with 2 CPUs; Ray's start is the
    slow part)."""
    ray = pytest.importorskip("ray")
    yield ray
    ray.shutdown()


def test_ray_equals_local_threads(ray_here, local_reference, tmp_path):
    path, want = local_reference
    out = tmp_path / "sweep"
    lines = []
    run_sweep(path, out=out, jobs=2, executor="ray", executor_params={"address": "local"}, log=lines.append)
    assert _rows(out) == want
    assert any(line.startswith("ray: 0 queued or running, 2/2 done") for line in lines)


def test_ray_retries_a_killed_worker_and_the_run_resumes(ray_here, one_run, tmp_path):
    """The Ray worker of a running task SIGKILLed (a lost node): Ray retries the task and the run continues
    from its last checkpoint to the row of an uninterrupted run."""
    import threading

    path, ref_rows = one_run
    out = tmp_path / "sweep"
    metrics = out / "runs" / "SiLU-s1" / "metrics.jsonl"
    killed = []

    def kill_the_worker():
        _wait(
            lambda: metrics.is_file() and '"checkpoint": "step_0000008"' in metrics.read_text(),
            240,
            "the run's second checkpoint",
        )
        trainer = _training_pid(out / "runs" / "SiLU-s1")
        worker = _parent(trainer)
        if b"lmlab.lab.fork_server" in (Path("/proc") / str(worker) / "cmdline").read_bytes():
            worker = _parent(worker)  # the Ray worker that started the fork server
        os.kill(worker, signal.SIGKILL)
        killed.append(worker)

    thread = threading.Thread(target=kill_the_worker, daemon=True)
    thread.start()
    run_sweep(
        path, out=out, executor="ray", executor_params={"address": "local", "cpus_per_task": 2}, log=lambda line: None
    )  # the Ray of the test before: 2 CPUs, one 2-thread task at a time
    thread.join(timeout=5)
    assert killed, "the worker was not killed"
    log = (out / "logs" / "SiLU-s1.log").read_text()
    # the training gets SIGTERM when its worker dies (a checkpoint at its current step), unless Ray's own kill
    # of a dead worker's children comes first (then the last periodic checkpoint): either way it resumes
    resumed = re.search(r"resuming \S+ from step (\d+) of 1600", log)
    assert log.count("$ ") == 2 and resumed and 8 <= int(resumed.group(1)) < 1600
    assert _rows(out) == ref_rows


def test_a_killed_local_sweep_leaves_no_training_behind(one_run, tmp_path):
    """`lmlab sweep` SIGKILLed: its training subprocess gets SIGTERM (PR_SET_PDEATHSIG), checkpoints and
    exits, instead of training on as an orphan that holds the run's lock; the same command continues it."""
    path, ref_rows = one_run
    out = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmlab.cli", "sweep", str(path), "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = out / "runs" / "SiLU-s1" / "metrics.jsonl"
    _wait(
        lambda: metrics.is_file() and '"checkpoint": "step_0000008"' in metrics.read_text(),
        120,
        "the run's second checkpoint",
    )
    trainer = _training_pid(out / "runs" / "SiLU-s1")
    assert trainer is not None, "no process holds the run's lock"
    proc.kill()
    proc.wait()
    _wait(lambda: _gone(trainer), 60, "the training subprocess to stop")
    assert "SIGTERM received" in (out / "logs" / "SiLU-s1.log").read_text()  # it got SIGTERM (and stopped)
    run_sweep(path, out=out, log=lambda line: None)
    assert _rows(out) == ref_rows


def test_a_job_that_dies_gives_a_failed_row_the_report_lists_and_sweep_worker_reproduces(one_run, tmp_path):
    """A job whose task is SIGKILLed (an out-of-memory kill) ends without a row: the coordinator records a
    failed row naming the job, its log and `lmlab sweep-worker SWEEP RUN`; the report lists it; that
    command finishes the run (from its checkpoint) and the next `lmlab sweep` merges its row."""
    path, ref_rows = one_run
    out = tmp_path / "sweep"
    proc, controller = _submitit_local_at_second_checkpoint(path, out)
    task = _children(controller)[0]
    trainers = _descendants(task)  # the fork server and the run it forked
    assert trainers, "the task has no training subprocess to stop"
    for pid in trainers:  # frozen first, so the kill lands mid-training however fast this machine trains
        os.kill(pid, signal.SIGSTOP)
    os.kill(task, signal.SIGKILL)
    for pid in trainers:  # the SIGTERM its parent's death sent is handled now: it checkpoints and stops
        os.kill(pid, signal.SIGCONT)
    text, _ = proc.communicate(timeout=120)
    _wait(lambda: all(_gone(pid) for pid in trainers), 60, "the orphaned training to checkpoint and stop")
    assert proc.returncode == 1 and "1 run(s) failed without a result (SiLU-s1)" in text, text
    assert "submitit-local: 0 queued, 0 running, 1/1 done, 1 failed, 0 requeue(s)" in text, text
    (row,) = read_results(out)
    assert row["status"] == "failed" and f"job {controller} ended" in row["error"]
    assert f"reproduce with `lmlab sweep-worker {out} SiLU-s1`" in row["error"]
    assert main(["report", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "Failed runs (1;" in md and "- `SiLU-s1`: job" in md and "lmlab sweep-worker" in md
    assert main(["sweep-worker", str(out), "SiLU-s1", "--threads", "2"]) == 0
    assert "resuming" in (out / "logs" / "SiLU-s1.log").read_text()
    run_sweep(path, out=out, executor="submitit-local", log=lambda line: None)  # merges the row: no new job
    assert _rows(out) == ref_rows and len((out / "jobs.jsonl").read_text().splitlines()) == 1
    assert main(["report", str(out)]) == 0 and "Failed runs" not in (out / "report.md").read_text()


def test_requeues_slurm_holds_count_before_their_next_attempt_notes_them(tmp_path, monkeypatch):
    """squeue's lines (`-o '%i %T'` for states; `-O ArrayJobID:|,ArrayTaskID:|,RestartCnt:|` for restart
    counts, array tasks named JOB_TASK as submitit names them) are read per job; the progress line's
    requeue count is the recorded requeues plus the attempts Slurm made of this sweep's jobs that no record
    names yet (a preempted job held pending), never another sweep's."""
    import subprocess

    from lmlab.lab import executors

    lines = {
        "-o": "676 PENDING\n677_0 PENDING\n677_1 RUNNING\n680 RUNNING\n",
        "-O": "676|N/A|3|\n677|0|2|\n677|1|1|\n680|N/A|0|\n",
    }
    monkeypatch.setattr(
        executors.subprocess, "run", lambda cmd, **k: subprocess.CompletedProcess(cmd, 0, lines[cmd[-2]], "")
    )
    assert executors.slurm_states() == {"676": "PENDING", "677_0": "PENDING", "677_1": "RUNNING", "680": "RUNNING"}
    assert executors.slurm_restarts() == {"676": 3, "677_0": 2, "677_1": 1, "680": 0}
    records = [  # 677_0's first requeue noted (its USR2 handler), a resubmission of a cancelled job 675
        {"job_id": "677_0", "attempt": 1, "runs": ["a"], "by": "submitit"},
        {"job_id": "675", "runs": ["c"], "by": "lmlab sweep (preempted and cancelled; submitted again as job 680)"},
    ]
    (tmp_path / executors.REQUEUES_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    # submitit's Slurm executor needs srun on the PATH; the count reads only the records and squeue
    monkeypatch.setattr(executors, "_make", lambda *a: (None, {}))
    ex = executors.SubmititExecutor(tmp_path, "slurm", log=lambda line: None)
    assert ex.requeues() == 2  # the records alone
    # 677_0: attempt 2 unrecorded; 677_1: attempt 1 unrecorded; 680 never requeued; 676 is not this sweep's
    assert ex.requeues(["677_0", "677_1", "680"]) == 2 + 1 + 1
    monkeypatch.setattr(executors.subprocess, "run", lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", "down"))
    assert executors.slurm_restarts() is None and executors.slurm_states() is None
    assert ex.requeues(["677_0"]) == 2  # squeue cannot be run: the records


def test_another_executor_is_refused_only_while_the_first_ones_jobs_run(tmp_path, monkeypatch):
    """check_no_jobs_elsewhere on recorded jobs: a Slurm job squeue lists as running or pending refuses
    `--jobs`/Ray (naming it), an ended or forgotten one does not, and where squeue cannot be run one note
    says their state is unknown; the executor that submitted them is never refused (it re-attaches)."""
    from lmlab.lab import executors

    recs = [{"job_id": f"7_{i}", "runs": [f"r{i}"], "executor": "slurm", "t": 0.0} for i in range(3)]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = []
    for states, live in [({"7_0": "COMPLETED", "7_1": "PENDING"}, ["7_1"]), ({"7_2": "PREEMPTED"}, [])]:
        monkeypatch.setattr(executors, "slurm_states", lambda s=states: s)
        if live:
            with pytest.raises(ConfigError, match=r"still in 1 job\(s\) submitted with --executor slurm \(7_1\)"):
                executors.check_no_jobs_elsewhere(tmp_path, "local", lines.append)
        else:
            executors.check_no_jobs_elsewhere(tmp_path, "ray", lines.append)
        executors.check_no_jobs_elsewhere(tmp_path, "slurm", lines.append)
    monkeypatch.setattr(executors, "slurm_states", lambda: None)
    executors.check_no_jobs_elsewhere(tmp_path, "local", lines.append)
    assert lines == [
        "note: 3 Slurm job(s) of this sweep (7_2, ...): squeue cannot be run here, so whether they still run is unknown"
    ]


def test_reattaching_with_other_resources_is_refused(tmp_path, monkeypatch):
    """check_same_resources: a live job of the same executor recorded with other threads or CPUs per task
    refuses the command (naming the job, the option, both values and scancel); the same resources, an
    ended job, or a record from before resources were recorded do not."""
    from lmlab.lab import executors

    base = {"runs": ["r0"], "executor": "slurm", "t": 0.0}
    recs = [
        {**base, "job_id": "8_0", "resources": executors.resources(1, {"cpus_per_task": 1})},
        {**base, "job_id": "8_1", "resources": executors.resources(1, {"cpus_per_task": 1})},
        {**base, "job_id": "8_2"},  # recorded before 2026-12-06: no resources
    ]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(executors, "slurm_states", lambda: {"8_0": "COMPLETED", "8_1": "RUNNING", "8_2": "RUNNING"})
    executors.check_same_resources(tmp_path, "slurm", 1, {"cpus_per_task": 1, "slurm_partition": "debug"})
    with pytest.raises(ConfigError) as err:
        executors.check_same_resources(tmp_path, "slurm", 1, {"cpus_per_task": 2})
    assert str(err.value) == (
        "--executor slurm: job 8_1 of this sweep still runs with --cpus-per-task 1 (this command: 2); rerun with "
        "the job's options to re-attach to it, or cancel it first (scancel 8_1 / stop its controller)"
    )
    with pytest.raises(ConfigError, match=r"job 8_1 .* --threads 1 \(this command: 2\)"):
        executors.check_same_resources(tmp_path, "slurm", 2, {"cpus_per_task": 1})
    with pytest.raises(ConfigError, match=r"--cpus-per-task 1 \(this command: unset\)"):
        executors.check_same_resources(tmp_path, "slurm", 1, None)
    executors.check_same_resources(tmp_path, "submitit-local", 2, None)  # the Slurm jobs are not its own
    monkeypatch.setattr(executors, "slurm_states", lambda: {"8_1": "COMPLETED", "8_2": "RUNNING"})
    executors.check_same_resources(tmp_path, "slurm", 2, {"cpus_per_task": 2})
