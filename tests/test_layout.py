"""The layout rules the code keeps (docs/development.md): the modules of the paths that never need torch
(the CLI's parser, `lmlab prepare`, `lmlab report`, the sweep coordinator, the run folder) import without
torch, which is why they import torch-using modules inside the functions that use them; no module in
lmlab/ is longer than 700 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_FREE = ["lmlab.cli", "lmlab.cli_parser", "lmlab.config", "lmlab.presets", "lmlab.run_folder", "lmlab.runs",
              "lmlab.data.prepare", "lmlab.lab.runner", "lmlab.lab.report", "lmlab.lab.index", "lmlab.lab.worker",
              "lmlab.lab.executors", "lmlab.lab.ray_executor", "lmlab.analysis", "lmlab.param_counts",
              "lmlab.plot"]  # fmt: skip


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_paths_import_without_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()} at import time"


def test_no_module_over_700_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "lmlab").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}  # fmt: skip
    assert not long, f"modules over 700 lines (split them by job): {long}"
