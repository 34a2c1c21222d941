"""``lmlab plot``: PNG figures of one or more runs from their ``metrics.jsonl`` (matplotlib, Agg).

- ``loss.png``: training loss against step, tokens seen and wall time (three panels), validation
  estimates as markers;
- ``lr.png``: each run's learning-rate schedule over its ``max_steps`` (computed from ``run.yaml``
  by the same function the trainer uses).

Files are only ever replaced when lmlab wrote them: each PNG carries a ``Source: lmlab plot`` text
chunk, and an existing ``loss.png`` / ``lr.png`` without it (a user's file) makes ``plot_runs`` refuse
before anything is written. PNGs are written atomically (temp file + fsync + rename).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

from lmlab.config_checks import ConfigError
from lmlab.fsutil import atomic_write_bytes
from lmlab.run_folder import RUN_FILE, CheckpointError, metrics_path, read_metrics_file, read_run
from lmlab.schedule import lr_at

PNG_SOURCE = "lmlab plot"  # the text of the PNG "Source" chunk marking files this module wrote


def require_matplotlib(what: str) -> None:
    """ConfigError, before anything is written, when matplotlib (the ``plot`` extra) is not installed:
    ``what`` (a command) draws figures with it."""
    try:
        import matplotlib  # noqa: F401  (imported where it draws; this only asks whether it can be)
    except ImportError:
        raise ConfigError(f"{what} draws its figures with matplotlib, which is not installed: "
                          f"pip install 'lmlab[plot]'") from None  # fmt: skip


def read_metrics(run: Path) -> list[dict]:
    """The records of ``run/metrics.jsonl``, validated (:func:`lmlab.run_folder.metrics_lines`: a damaged
    line or a record of the wrong type is an error naming the file, line and key); CheckpointError when
    the run has none."""
    path = metrics_path(run)
    if not (run / RUN_FILE).is_file():
        raise CheckpointError(f"{str(run)!r} is not a run folder (no {RUN_FILE}); give folders made by `lmlab train`")
    if not path.is_file():
        raise CheckpointError(f"run {str(run)!r} has no metrics.jsonl to plot; train it first")
    return read_metrics_file(path)


def png_source(path: Path) -> str | None:
    """The text of the ``Source`` tEXt chunk of PNG file ``path`` (None: not a PNG, or no such chunk)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"tEXt" and body.startswith(b"Source\0"):
            return body[7:].decode("latin-1")
        if kind in (b"IDAT", b"IEND"):  # matplotlib writes its text chunks before the image data
            return None
        pos += 12 + length
    return None


def check_own_outputs(paths: list[Path], flag: str = "--out") -> None:
    """Refuse (CheckpointError) when any of ``paths`` exists but is not a PNG this module wrote."""
    for path in paths:
        if path.exists() and (not path.is_file() or png_source(path) != PNG_SOURCE):
            raise CheckpointError(
                f"{flag} {str(path.parent)!r} already holds {path.name}, which lmlab did not "
                f"write; choose another folder (nothing was written)"
            )


def save_png(fig, path: Path) -> None:
    """``fig`` as a PNG marked as lmlab's (``Source: lmlab plot``), written atomically to ``path``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Source": PNG_SOURCE})
    atomic_write_bytes(path, buf.getvalue())


def cumulative_wall_time(records: list[dict]) -> list[dict]:
    """Copies of training records whose ``elapsed_s`` keeps counting across resumes: each resumed
    process restarts its clock at 0, so a drop in elapsed_s adds the time reached before it."""
    out, offset, previous = [], 0.0, 0.0
    for r in records:
        t = r.get("elapsed_s", 0.0)
        if t < previous:  # a resumed segment began
            offset += previous
        previous = t
        out.append(dict(r, elapsed_s=t + offset))
    return out


def plot_runs(runs: list[Path], out_dir: Path) -> list[Path]:
    """Write ``loss.png`` and ``lr.png`` for ``runs`` into ``out_dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lmlab.train import TrainConfig

    records_of = {run: read_metrics(run) for run in runs}  # every run is checked before anything is written
    configs = {run: TrainConfig.from_dict(read_run(run)["train"], source=f"{run}/run.yaml train") for run in runs}
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"--out {str(out_dir)!r} is a file; choose a folder for the plots")
    paths = [out_dir / "loss.png", out_dir / "lr.png"]
    check_own_outputs(paths)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    fig_lr, ax_lr = plt.subplots(figsize=(6, 4))
    for run in runs:
        records = records_of[run]
        train = cumulative_wall_time([r for r in records if "loss" in r and "tokens" in r and not r.get("skipped")])
        val = [r for r in records if "val_loss" in r]
        label = run.name
        for ax, key in zip(axes, ("step", "tokens", "elapsed_s")):
            (line,) = ax.plot([r[key] for r in train], [r["loss"] for r in train], label=label, lw=1.2)
            if key == "step" and val:
                ax.plot(
                    [r["step"] for r in val],
                    [r["val_loss"] for r in val],
                    "o",
                    color=line.get_color(),
                    ms=4,
                    label=f"{label} (val)",
                )
        tc = configs[run]
        steps = list(range(tc.max_steps))
        ax_lr.plot(steps, [lr_at(s, tc) for s in steps], label=label)
    for ax, xlabel in zip(axes, ("step", "tokens", "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss (nats/token)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("learning rate")
    ax_lr.grid(alpha=0.3)
    ax_lr.legend(fontsize=8)
    fig_lr.tight_layout()
    save_png(fig, paths[0])
    save_png(fig_lr, paths[1])
    plt.close(fig)
    plt.close(fig_lr)
    return paths
