"""The wheel `python -m build` makes installs on its own and finds its bundled configs and specs."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_and_runs_from_its_own_files(tmp_path, byte_data):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = dist.glob("lmlab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lmlab/configs/demo.yaml" in names and "lmlab/specs/13-vocab-size.yaml" in names
    assert any(n.endswith("dist-info/licenses/LICENSE") for n in names)
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    env = dict(os.environ, PYTHONPATH=str(site))  # the installed copy, not this checkout (cwd is elsewhere)
    run = lambda *args: subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,  # noqa: E731
        text=True,
    )
    where = run("-c", "import lmlab, lmlab.api; print(lmlab.__file__)")
    assert where.returncode == 0 and where.stdout.strip().startswith(str(site)), where.stderr
    listed = run("-m", "lmlab.cli", "sweep", "--list")
    assert listed.returncode == 0 and "13-vocab-size" in listed.stdout and "01-norm-placement" in listed.stdout
    trained = run(
        "-m",
        "lmlab.cli",
        "train",
        "--config",
        "demo",
        "--data",
        str(byte_data),
        "--out",
        "r",
        "--set",
        "max_steps=2",
        "--set",
        "d_model=32",
        "--set",
        "n_layers=1",
        "--set",
        "n_heads=2",
        "--set",
        "n_kv_heads=1",
        "--set",
        "context_length=32",
        "--set",
        "batch_size=2",
        "--set",
        "compile=false",
        "--set",
        "eval_interval=2",
        "--set",
        "eval_windows=1",
        "--set",
        "warmup_steps=1",
        "--set",
        "device=cpu",
        "--no-progress",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "r" / "checkpoints" / "step_0000002").is_dir()
