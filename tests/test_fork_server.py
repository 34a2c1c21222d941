"""The fork server of a sweep's training processes (lmlab.lab.fork_server): a forked run computes what a
new ``python -m lmlab.cli train`` computes, bit for bit; a lost server is an interrupted run that the next
attempt continues; and importing the model does not import torch._dynamo (what the server saves a run
is Python's, torch's and dynamo's start)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from lmlab.config import ModelConfig
from lmlab.lab import worker
from lmlab.lab.fork_server import ForkServer
from lmlab.lab.plan import RunPlan
from lmlab.train import TrainConfig

pytestmark = pytest.mark.skipif(not worker.FORK_SERVER, reason="the fork server runs on Linux only")

MODEL = dict(vocab_size=257, context_length=32, d_model=32, n_layers=2, n_heads=2)


def _plan(data, steps: int, **train) -> RunPlan:
    fields = dict(
        max_steps=steps,
        batch_size=4,
        lr=3e-3,
        warmup_steps=2,
        log_interval=1,
        eval_interval=steps,
        eval_windows=4,
        device="cpu",
        dtype="fp32",
        compile=False,
        seed=3,
    )
    tc = TrainConfig(**{**fields, **train})
    return RunPlan(
        name="r",
        variant="v",
        seed=3,
        fields={},
        cfg=ModelConfig(**MODEL),
        tc=tc,
        tokens_per_step=4 * 32,
        flops_per_token=1.0,
        data=data,
    )


def _losses(run_dir):
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _weights(run_dir):
    ckpt = sorted(run_dir.glob("checkpoints/step_*"))[-1]
    return load_file(str(ckpt / "model.safetensors"))


def test_a_forked_run_equals_an_exec_run_bit_for_bit(byte_data, tmp_path):
    p = _plan(byte_data, 6)
    got = {}
    for launch in ("fork", "exec"):
        assert worker.train_run(tmp_path / launch, p, 1, launch=launch) == (False, None)
        run_dir = tmp_path / launch / "runs" / "r"
        got[launch] = (_losses(run_dir), _weights(run_dir))
        log = (tmp_path / launch / "logs" / "r.log").read_text()
        assert ("(forked by lmlab.lab.fork_server)" in log) == (launch == "fork") and "done: step 6" in log
    assert got["fork"][0] == got["exec"][0] and len(got["fork"][0]) == 6
    for name, w in got["exec"][1].items():
        assert torch.equal(got["fork"][1][name], w), name
    with pytest.raises(ValueError, match="launch='spawn': expected 'exec' or 'fork'"):
        worker.train_run(tmp_path / "x", p, 1, launch="spawn")


def test_a_refused_config_reports_its_error_and_status(byte_data, tmp_path):
    """A forked `lmlab train` that refuses its input exits 2 with its one-line error in the run's log,
    as a new process would: a failed run, not a hang or a silent success."""
    p = _plan(tmp_path / "no-such-data", 3)
    diverged, error = worker.train_run(tmp_path / "s", p, 1, launch="fork")
    assert not diverged and error.startswith("training exited with status 2: lmlab train: error:")
    assert "no-such-data" in error


def test_a_lost_server_is_an_interrupted_run_that_continues(byte_data, tmp_path):
    """The fork server killed mid-run: the run gets SIGTERM (its parent died), checkpoints and stops; the
    worker reads that as an interruption (KeyboardInterrupt, no failed row), the next call starts a new
    server and continues the run from its checkpoint to the same result as an uninterrupted run."""
    p = _plan(byte_data, 300, checkpoint_interval=2)
    ref = tmp_path / "ref"
    assert worker.train_run(ref, p, 1, launch="exec") == (False, None)
    sweep = tmp_path / "s"
    metrics = sweep / "runs" / "r" / "metrics.jsonl"
    server = ForkServer.get()

    def kill_server_after_a_checkpoint():
        t0 = time.time()
        while time.time() - t0 < 120:
            if metrics.is_file() and '"checkpoint": "step_0000004"' in metrics.read_text():
                os.kill(server.proc.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    import threading

    killer = threading.Thread(target=kill_server_after_a_checkpoint, daemon=True)
    killer.start()
    with pytest.raises(KeyboardInterrupt, match=r"^r: its training was stopped by SIGTERM \(its fork server exited\)$"):
        worker.train_run(sweep, p, 1, launch="fork")
    killer.join(5)
    log = (sweep / "logs" / "r.log").read_text()
    assert "SIGTERM received" in log and "interrupted by SIGTERM" in log
    assert ForkServer.get() is not server  # a new one
    dead = ForkServer.get()
    dead.proc.kill()  # killed between two runs, before the worker noticed: replaced on the next run
    dead.proc.wait()
    assert worker.train_run(sweep, p, 1, launch="fork") == (False, None)
    assert ForkServer.get() is not dead
    assert "resuming" in (sweep / "logs" / "r.log").read_text()
    assert _losses(sweep / "runs" / "r")[-1] == _losses(ref / "runs" / "r")[-1]
    for name, w in _weights(ref / "runs" / "r").items():
        assert torch.equal(_weights(sweep / "runs" / "r")[name], w), name


def test_importing_the_model_does_not_import_dynamo():
    """torch.compiler's decorators import torch._dynamo (about 1.5 s); lmlab marks its kernels lazily,
    with the mark torch's own decorator sets (checked here), so `lmlab eval` or `generate` start without it."""
    code = "import sys, lmlab.model, lmlab.evaluate, lmlab.generate; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from lmlab.kernels import causal_attention

    def f():
        return 0

    torch.compiler.assume_constant_result(f)
    assert {k: v for k, v in vars(causal_attention._threads).items() if k != "__wrapped__"} == vars(f)


def test_a_stop_while_the_run_is_being_launched_stops_it(byte_data, tmp_path):
    """stop_training() (a sweep's Ctrl-C or SIGTERM) while a run waits for a fork server that is still
    starting: the run is stopped as soon as it exists (a SIGTERM sent the moment it is forked waits,
    blocked, until the run can act on it), not trained to the end; the next call trains it in full."""
    import threading

    p = _plan(byte_data, 3000)
    old = ForkServer.get()
    old.proc.kill()  # the next run starts a new server: about 2-3 s of imports to stop inside
    old.proc.wait()
    got = {}

    def launch():
        t = time.time()
        try:
            worker.train_run(tmp_path / "s", p, 1, launch="fork")
            got["outcome"] = "finished"
        except KeyboardInterrupt as exc:
            got["outcome"] = str(exc)
        got["s"] = time.time() - t

    thread = threading.Thread(target=launch)
    thread.start()
    time.sleep(0.3)
    worker.stop_training(timeout=30)
    thread.join(60)
    assert got["outcome"] == "r: its training was stopped by SIGTERM", got
    metrics = tmp_path / "s" / "runs" / "r" / "metrics.jsonl"
    assert not metrics.is_file() or '"step": 3000' not in metrics.read_text()
    p = _plan(byte_data, 4)
    assert worker.train_run(tmp_path / "s2", p, 1, launch="fork") == (False, None)  # a later run is not stopped


def test_a_compiled_run_forked_after_the_server_compiled_its_shape_equals_an_exec_run(byte_data, tmp_path):
    """Runs with compile: true, one thread: the server compiles their shape once (a throwaway step) and the
    forked runs use that code; each equals, bit for bit, a new process that compiled for itself."""
    p = _plan(byte_data, 4, compile=True)
    got = {}
    for launch in ("fork", "fork2", "exec"):
        assert worker.train_run(tmp_path / launch, p, 1, launch=launch.rstrip("2")) == (False, None)
        run_dir = tmp_path / launch / "runs" / "r"
        got[launch] = (_losses(run_dir), _weights(run_dir))
        assert "compile model" in (tmp_path / launch / "logs" / "r.log").read_text()
    for launch in ("fork", "fork2"):
        assert got[launch][0] == got["exec"][0] and len(got[launch][0]) == 4
        for name, w in got["exec"][1].items():
            assert torch.equal(got[launch][1][name], w), (launch, name)


def test_warming_a_shape_leaves_nothing_to_compile_for_the_next_model_of_it(byte_data, tmp_path):
    """lmlab.compile_choice.warm_for_fork, in this process: it trains one throwaway step of a compiling
    run's shape (once per shape, one thread only, compile: true only), after which a new model of that
    shape trains without Dynamo compiling another graph: what a run forked from the server inherits."""
    import dataclasses

    import yaml
    from torch._dynamo.utils import counters

    from lmlab.compile_choice import warm_for_fork
    from lmlab.data.shards import TokenData
    from lmlab.train import Trainer

    p = _plan(byte_data, 4, compile=True)
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump({"model": p.cfg.to_dict(), "train": dataclasses.asdict(p.tc)}))
    argv = ["train", "--out", str(tmp_path / "run"), "--config", str(cfg_path), "--data", str(byte_data)]
    warmed: set = set()
    assert warm_for_fork(argv, {"OMP_NUM_THREADS": "2"}, warmed) is None and not warmed  # several threads
    key = warm_for_fork(argv, {"OMP_NUM_THREADS": "1"}, warmed)
    assert key is not None and warmed == {key} and not (tmp_path / "run").exists()  # nothing written
    assert warm_for_fork(argv, {"OMP_NUM_THREADS": "1"}, warmed) is None  # once per shape
    eager = tmp_path / "e.yaml"
    eager_train = {**dataclasses.asdict(p.tc), "compile": False}
    eager.write_text(yaml.safe_dump({"model": p.cfg.to_dict(), "train": eager_train}))
    assert warm_for_fork([*argv[:4], str(eager), *argv[5:]], {"OMP_NUM_THREADS": "1"}, warmed) is None
    graphs, threads = counters["stats"]["unique_graphs"], torch.get_num_threads()
    torch.set_num_threads(1)  # as the forked run (Dynamo guards the thread count)
    try:
        torch.manual_seed(1)
        trainer = Trainer(tmp_path / "new", p.cfg, p.tc, TokenData(byte_data), progress=False)
        trainer.train_step()
    finally:
        torch.set_num_threads(threads)
    assert counters["stats"]["unique_graphs"] == graphs > 0  # the warmed graph served the new model
