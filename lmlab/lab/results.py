"""A sweep folder's files and its runs' results: the file names, each run's state (not started, partial,
trained, recorded), its evaluation (bits-per-byte over the validation split, longer contexts, decode
speed) and its row of ``results.jsonl`` (:func:`collect_result`), read back by :func:`read_results`."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Optional

from lmlab.analysis import kv_cache_bytes
from lmlab.config import ConfigError
from lmlab.data.shards import TokenData
from lmlab.json_checks import check_nesting
from lmlab.lab.axes import _fmt
from lmlab.lab.plan import RunPlan
from lmlab.lab.spec import Spec
from lmlab.lab.validate import read_results_jsonl
from lmlab.plot import cumulative_wall_time
from lmlab.run_folder import RUN_FILE, checkpoint_dirs, metrics_path, read_metrics_file, read_run

RESULTS_FILE = "results.jsonl"


TIMING_FILE = "timing.json"


INIT_GRADS_FILE = "init_grads.json"


PROVENANCE_FILE = "provenance.jsonl"


LOAD_FILE = "load.jsonl"


# --- run state -----------------------------------------------------------------------------
def run_metrics(run_dir: Path) -> list[dict]:
    """A run's validated training log (:func:`lmlab.run_folder.read_metrics_file`; [] when absent)."""

    return read_metrics_file(metrics_path(run_dir))


def read_results(sweep_dir: str | Path) -> list[dict]:
    """The rows of ``results.jsonl`` (one per run), validated by
    :func:`lmlab.lab.validate.read_results_jsonl`. A last line that is not JSON (cut by a kill
    mid-write) is skipped with a warning on stderr: its run counts as not finished, so ``lmlab sweep``
    scores it again. Raises ConfigError naming the file, line and field of any other damaged row."""

    return read_results_jsonl(Path(sweep_dir) / RESULTS_FILE, cut_last="skip")


def _last_checkpoint_step(run_dir: Path) -> int:

    ckpts = checkpoint_dirs(run_dir)
    return int(ckpts[-1].name.split("_")[1]) if ckpts else 0


def run_state(run_dir: Path, max_steps: int) -> str:
    """``new`` (no run folder), ``trained`` (the last checkpoint is at max_steps, or training stopped on
    its wall-time budget) or ``partial``."""
    if not (run_dir / RUN_FILE).is_file():
        return "new"
    step = _last_checkpoint_step(run_dir)
    if step >= max_steps:
        return "trained"
    if step and any(r.get("stopped") == "max_seconds" and r.get("step") == step for r in run_metrics(run_dir)):
        return "trained"
    return "partial"


def _check_existing(p: RunPlan, run_dir: Path) -> None:
    """An existing run folder must hold this very run (else the spec changed under it)."""

    if not (run_dir / RUN_FILE).is_file():
        return
    run = read_run(run_dir)
    want = {"model": p.cfg.to_dict(), "train": dataclasses.asdict(p.tc)}
    diff = [
        f"{sec}.{k}: run has {run.get(sec, {}).get(k)!r}, spec asks {v!r}"
        for sec in ("model", "train")
        for k, v in want[sec].items()
        if run.get(sec, {}).get(k, v) != v
    ]
    if run.get("data") != str(p.data):
        diff.append(f"data: run has {run.get('data')!r}, spec asks {str(p.data)!r}")
    if diff:
        raise ConfigError(
            f"run folder {str(run_dir)!r} holds a different run than the spec asks "
            f"({'; '.join(diff[:3])}); give the sweep another --out, or delete that run folder"
        )


# --- evaluation ----------------------------------------------------------------------------
def _machine(device_name: str) -> str:
    from lmlab.bench import describe_machine
    from lmlab.devices import resolve_device

    try:
        return describe_machine(resolve_device(device_name))
    except ConfigError:  # a device name the run itself already refused: it trained nowhere else
        return describe_machine("cpu")


def _nan_to_none(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def evaluate_run(run_dir: Path, contexts: list, decode: Optional[dict] = None, by_position: bool = False) -> dict:
    """Full validation split of a trained run: loss and bits-per-byte at ``contexts`` multiples of the
    training context (a multiple the positions cannot reach, learned positions beyond the table, gives
    None and the reason), KV-cache bytes, with ``decode`` decode tokens/s and with ``by_position``
    ``val_loss_by_position`` (nats/token at each position of the training context,
    :func:`lmlab.evaluate.evaluate`)."""
    import torch

    from lmlab.checkpoint import load_run
    from lmlab.devices import resolve_device
    from lmlab.evaluate import evaluate
    from lmlab.model import TransformerLM

    device = resolve_device("auto")
    model, cfg, _, run, _ = load_run(run_dir, device=str(device))
    data = TokenData(run["data"])
    tokens, n_bytes = data.tokens("val"), data.bytes("val")
    out: dict = {"params": model.num_params(), "non_embedding_params": model.num_params(non_embedding=True)}
    for mult in contexts:
        suffix = "" if mult == 1 else f"_{_fmt(mult)}x"
        ctx = int(cfg.context_length * mult)
        if mult == 1:
            m = model
        elif cfg.position == "learned" and ctx > cfg.context_length:
            out[f"val_loss{suffix}"] = out[f"val_bpb{suffix}"] = None
            out[f"eval_note{suffix}"] = f"learned positions exist only below context_length={cfg.context_length}"
            continue
        else:  # the same weights in a model built for the longer context
            m = TransformerLM(dataclasses.replace(cfg, context_length=ctx)).to(device)
            m.load_state_dict(model.state_dict())
            m.eval()
        res = evaluate(m, tokens, n_bytes, batch_size=16, device=device, by_position=by_position and mult == 1)
        if res.get("loss_by_position"):
            out["val_loss_by_position"] = [round(x, 5) for x in res["loss_by_position"]]
        out[f"val_loss{suffix}"] = _nan_to_none(res["loss"])
        out[f"val_bpb{suffix}"] = _nan_to_none(res["bits_per_byte"])
        if mult == 1:
            out["val_tokens"], out["val_bytes"] = res["tokens"], res["bytes"]
    kv = kv_cache_bytes(cfg, cfg.context_length, batch=1, dtype="fp32")
    out["kv_bytes_per_token"] = kv["per_token"]
    out["kv_bytes_context"] = kv["total"]
    if decode:
        from lmlab.bench import bench_decode

        d = dict(decode)
        d["prompt_len"] = min(d["prompt_len"], cfg.context_length // 2)
        d["new_tokens"] = max(2, min(d["new_tokens"], cfg.context_length - d["prompt_len"] + 1))
        res = bench_decode(
            model,
            batch=d["batch"],
            prompt_len=d["prompt_len"],
            new_tokens=d["new_tokens"],
            repeats=d["repeats"],
            device=device,
        )
        out["decode_tokens_per_s"] = res["decode_tokens_per_s"]
        out["prefill_tokens_per_s"] = res["prefill_tokens_per_s"]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def training_summary(run_dir: Path) -> dict:
    """From ``metrics.jsonl`` and the last checkpoint: steps, tokens, training wall time (summed over
    resumed invocations), median tokens/s, final train loss (mean of those logged in the last 10% of the
    steps), spikes, skipped
    steps and whether training stopped on its wall-time budget."""

    recs = run_metrics(run_dir)
    train = [r for r in recs if "loss" in r and "tokens" in r and not r.get("skipped")]
    timed = cumulative_wall_time([r for r in recs if r.get("elapsed_s") is not None])  # across resumes
    wall = timed[-1]["elapsed_s"] if timed else 0.0
    losses = [r["loss"] for r in train if r["step"] >= 0.9 * train[-1]["step"]] if train else []
    tps = [r["tokens_per_s"] for r in train if r.get("tokens_per_s")]
    state: dict = {}
    ckpts = checkpoint_dirs(run_dir)
    if ckpts and (ckpts[-1] / "trainer.json").is_file():
        state = json.loads(check_nesting((ckpts[-1] / "trainer.json").read_text(), str(ckpts[-1] / "trainer.json")))
    final = sum(losses) / len(losses) if losses else None
    diag = [r for r in recs if "max_attn_logit" in r]  # TrainConfig.diag_interval records
    return {
        "steps": state.get("step", train[-1]["step"] if train else 0),
        "tokens": state.get("tokens_seen", train[-1]["tokens"] if train else 0),
        "wall_s": wall,
        "tokens_per_s": statistics.median(tps) if tps else None,
        "first_train_loss": train[0]["loss"] if train else None,
        "final_train_loss": _nan_to_none(final),
        "spikes": train[-1].get("spikes", 0) if train else 0,
        "skipped_steps": sum(1 for r in recs if r.get("skipped")),
        "stopped_early": any(r.get("stopped") == "max_seconds" for r in recs),
        # largest attention logit (any layer) and output log Z seen by the diagnostics, None without them
        "max_attn_logit": _nan_to_none(
            max(
                (
                    max(x for x in r["max_attn_logit"] if x is not None)
                    for r in diag
                    if any(x is not None for x in r["max_attn_logit"] or [])
                ),
                default=None,
            )
        ),
        "log_z_max": _nan_to_none(max((r["log_z_max"] for r in diag if "log_z_max" in r), default=None)),
        # the attention-sink share at the last diagnostics: the first key's mean attention probability over
        # the attention layers (Qiu et al. 2025, Fig. 2: 0.47 without an output gate, 0.05 with one)
        "attn_sink": _nan_to_none(_mean_known((diag[-1].get("attn_first_key") or []) if diag else [])),
    }


def _mean_known(xs: list) -> Optional[float]:
    """The mean of the non-None entries of ``xs``; None when there are none."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def collect_result(p: RunPlan, run_dir: Path, spec: Spec, diverged: bool, error: Optional[str]) -> dict:
    """The results row of one run (columns: lmlab.lab.report.COLUMNS)."""
    summary = training_summary(run_dir)
    final = summary["final_train_loss"]
    first = summary["first_train_loss"]
    if summary["steps"] and not error and (final is None or (first is not None and final > first)):
        diverged = True  # non-finite at the end, or the loss ended above where it was first logged
    row: dict = {
        "sweep": spec.name,
        "run": p.name,
        "variant": p.variant,
        "seed": p.seed,
        "status": "failed" if error else ("diverged" if diverged else "ok"),
        "diverged": bool(diverged),
        "max_steps": p.steps,
        "scale": p.scale,
        "tune": p.tune,
        "solved": p.solved,
    }
    row.update(summary)
    row["flops_per_token"] = p.flops_per_token
    row["flops"] = summary["tokens"] * p.flops_per_token
    row["step_ms"] = (1000 * p.tokens_per_step / summary["tokens_per_s"]) if summary["tokens_per_s"] else None
    if error:
        row["error"] = error
    if not diverged and not error:
        row.update(
            evaluate_run(
                run_dir,
                spec.eval_contexts,
                spec.decode if spec.measure_decode else None,
                by_position=spec.loss_by_position,
            )
        )
    else:
        from lmlab.analysis import kv_cache_bytes
        from lmlab.param_counts import param_counts

        counts = param_counts(p.cfg)
        row["params"], row["non_embedding_params"] = counts["total"], counts["non_embedding"]
        for mult in spec.eval_contexts:
            suffix = "" if mult == 1 else f"_{_fmt(mult)}x"
            row[f"val_loss{suffix}"] = row[f"val_bpb{suffix}"] = None
        kv = kv_cache_bytes(p.cfg, p.cfg.context_length, batch=1, dtype="fp32")
        row["kv_bytes_per_token"], row["kv_bytes_context"] = kv["per_token"], kv["total"]
    row["fields"] = p.fields
    row["finished_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    row["machine"] = _machine(p.tc.device)
    row["load_avg_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {k: _nan_to_none(v) for k, v in row.items()}
