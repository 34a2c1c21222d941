"""Training loop: AdamW, LR schedules, gradient accumulation, clipping, stability diagnostics, mixed
precision, torch.compile, DDP/FSDP2, JSON-lines metrics and atomic, exactly resumable checkpoints.

Settings: :class:`lmlab.train_config.TrainConfig`. Data order (``lmlab/data/batches.py``): the global
batch of step s is drawn from a generator seeded with (seed, s) and split into micro-batches and ranks, so
resuming, accumulating gradients or running on N ranks sees the windows of one uninterrupted large-batch run.

Loss normalisation: each micro-batch contributes its *summed* token losses divided by the global
number of scored tokens, so gradient accumulation and data parallelism give the large-batch gradient
(token-weighted, not an average of per-micro-batch means).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from lmlab import run_folder, schedule
from lmlab.analysis import flops_per_token
from lmlab.checkpoint import check_run_files, check_run_model, load_latest, save_checkpoint
from lmlab.compile_choice import choose_for_run, compile_blocks, eager
from lmlab.config import ModelConfig
from lmlab.config_checks import ConfigError
from lmlab.data.batches import check_data_bounds, global_batch_starts, windows_to_batch
from lmlab.data.prepare import DataError
from lmlab.data.shards import TokenData
from lmlab.devices import (
    PRECISIONS,
    check_memory,
    device_peak_flops,
    keep_freed_memory,
    precision_name,
    resolve_device,
    resolve_dtype,
)
from lmlab.diagnostics import forward_diagnostics, layer_grad_norms, update_rms_ratios, weights_before
from lmlab.evaluate import evaluate
from lmlab.kernels.linear import fp32_linears_on_onednn
from lmlab.model import TransformerLM
from lmlab.optim import build_optimizer, muon_lr_at, optimizer_of, param_groups, set_lr
from lmlab.parallel import Dist, all_reduce_mean, barrier, full_state, init_distributed, load_full_state, wrap_model
from lmlab.run_folder import CheckpointError
from lmlab.stopping import NonFiniteFromStart, StopSignals, TrainingDiverged, TrainingInterrupted
from lmlab.train_config import AUTO, TrainConfig


def restart_rate(bar) -> None:
    """Restart a tqdm bar's clock at its current count, so its rate (steps/s) and ETA leave out what
    came before: the first step, which compiles the model. Without this a log file (one refresh per
    30 s) showed the compile's 57 s/step and a 47-hour ETA for the first half minute of training."""
    if bar.disable:
        return
    n = bar.n
    bar.reset(total=bar.total)  # a fresh clock and fresh moving averages, count 0
    bar.initial = bar.last_print_n = bar.n = n  # rate = (n - initial) / time since the restart
    bar.refresh()


class Trainer:
    """Train a model in a run folder. Build with :meth:`create` (new run) or :meth:`resume`."""

    def __init__(
        self,
        run_dir: Path,
        cfg: ModelConfig,
        tc: TrainConfig,
        data: TokenData,
        progress: bool = True,
        padded_vocab: bool = False,
    ):
        self.run_dir, self.cfg, self.tc, self.data = Path(run_dir), cfg, tc, data
        self.progress = progress
        # an imported model may pad its embedding past its tokenizer (padded_vocab); otherwise exact
        if data.vocab_size > cfg.vocab_size or (data.vocab_size != cfg.vocab_size and not padded_vocab):
            raise ConfigError(
                f"model vocab_size={cfg.vocab_size} does not match the tokenizer of "
                f"{str(data.folder)!r} ({data.vocab_size} tokens); set vocab_size={data.vocab_size}"
            )
        self.train_tokens = data.tokens("train")
        self.val_tokens = data.tokens("val")
        if len(self.train_tokens) < cfg.context_length + 2:
            raise DataError(
                f"training split of {str(data.folder)!r} has {len(self.train_tokens)} tokens, fewer than one "
                f"context of {cfg.context_length} + 1; use more text or a smaller context_length"
            )
        if len(self.val_tokens) < 2:
            raise DataError(f"validation split of {str(data.folder)!r} has no tokens to score")
        device_type = (
            "cuda" if (tc.device.startswith("cuda") or (tc.device == "auto" and torch.cuda.is_available())) else "cpu"
        )
        self.dist: Dist = init_distributed(device_type)
        check_data_bounds(
            tc,
            cfg.context_length,
            len(self.train_tokens),
            len(self.val_tokens),
            self.dist.world_size,
            str(data.folder),
            self.dist.is_main,
        )
        self.device = resolve_device(tc.device, self.dist.local_rank)
        self.amp_dtype = resolve_dtype(tc.dtype, self.device)
        resumed = (self.run_dir / run_folder.RUN_FILE).is_file()
        kept = run_folder.read_run(self.run_dir).get("precision") if resumed else None
        # resuming: what dtype=auto chose when the run started holds
        if tc.dtype == AUTO and isinstance(kept, str) and kept in PRECISIONS:
            if kept != precision_name(self.amp_dtype) and self.dist.is_main:
                print(
                    f"note: dtype=auto chose {kept} when this run started; it keeps {kept} (this device alone "
                    f"would choose {precision_name(self.amp_dtype)}; set dtype to change it)",
                    file=sys.stderr,
                )
            self.amp_dtype = PRECISIONS[kept]
        # CPU steps allocate and free their activations in host memory: keep it mapped (1.18x, above)
        self.malloc_kept = keep_freed_memory() if self.device.type == "cpu" else False
        torch.manual_seed(tc.seed)
        check_memory(
            cfg,
            self.device,
            self.dist.world_size if tc.parallel == "fsdp" else 1,
            tc.batch_size,
            4 if self.amp_dtype is None else 2,
        )
        self.model = TransformerLM(cfg).to(self.device)  # this process's kernels (lmlab.kernels.settings)
        # fp32 on an x86 CPU: the linear layers multiply on oneDNN (lmlab.kernels.linear), said at startup
        self.onednn_linears = fp32_linears_on_onednn(self.device, self.amp_dtype, self.model.kernels)
        self.model.checkpoint_blocks = tc.activation_checkpointing
        self.mode = tc.parallel if self.dist.enabled else "none"
        self.fwd = wrap_model(self.model, self.mode, self.dist, self.device)
        if tc.compile_scope == "blocks" and not hasattr(torch.compiler, "set_stance"):
            raise ConfigError(
                f"compile_scope='blocks' needs torch >= 2.6 (this is {torch.__version__}); use compile_scope=model"
            )
        self.compile_choice: Optional[str] = None  # eager | blocks | model; compile=auto: choose_for_run in fit()
        self._clock = None  # a lmlab.compile_choice.RunClock: this process's first steps, for the machine's record
        self._compile_checked = False
        if tc.compile != AUTO:
            self._apply_compile(("blocks" if tc.compile_scope == "blocks" else "model") if tc.compile else "eager")
        try:
            self.opt = build_optimizer(self.model, param_groups(self.model, tc), tc, self.device, self.mode)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.step = 0
        self.tokens_seen = 0
        self.clipped_steps = 0
        self.spikes = 0
        self.bad_in_row = 0
        self.loss_ema: Optional[float] = None
        self.flops_per_token, self.peak_flops = self._mfu_inputs()
        self._tb = None
        self.lock = None  # the run folder's lmlab.fsutil.FolderLock, set by lmlab.runs.setup_run
        self.budget_planned = False  # max_steps already planned from budget_seconds (run.yaml's "budget")
        self.budget_plan: Optional[dict] = None  # the plan this process made (run.yaml's "budget")

    def release_lock(self) -> None:
        """Release the run folder's lock (if this trainer holds one)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _apply_compile(self, scope: str) -> None:
        """Compile for training as ``scope`` says (eager: nothing; blocks: :func:`compile_blocks`, in
        place; model: ``torch.compile`` of the (wrapped) model's forward)."""
        if scope == "blocks":
            compile_blocks(self.model)  # in place: every call of a block runs the compiled code
        elif scope == "model":
            self.fwd = torch.compile(self.fwd)
        self.compile_choice = scope

    # --- run folder ------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: str | Path, cfg: ModelConfig, tc: TrainConfig, data_dir: str | Path, **kw) -> "Trainer":
        """Start a new run in ``run_dir``; raises CheckpointError if it already holds a run."""
        run_dir = Path(run_dir)
        run_folder.check_new_run_dir(run_dir)
        data = TokenData(data_dir)
        trainer = cls(run_dir, cfg, tc, data, **kw)
        barrier(trainer.dist)  # every rank has checked the folder before rank 0 writes it
        if trainer.dist.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            run_folder.copy_tokenizer(data.folder, run_dir)
            spec = {"model": cfg.to_dict(), "train": dataclasses.asdict(tc), "data": str(Path(data_dir).resolve())}
            if tc.dtype == AUTO:  # what dtype=auto chose here: a resume elsewhere computes alike
                spec["precision"] = precision_name(trainer.amp_dtype)
            run_folder.write_run(run_dir, spec)  # last: marks a run
        barrier(trainer.dist)
        return trainer

    @classmethod
    def resume(
        cls, run_dir: str | Path, cfg: Optional[ModelConfig] = None, tc: Optional[TrainConfig] = None, **kw
    ) -> "Trainer":
        """Continue ``run_dir`` from its last complete checkpoint (from scratch if it has none): weights,
        optimizer state, step and token counters, RNG state; data order and LR schedule follow from the
        step. A ``cfg`` differing from the run's is refused, naming the fields; ``tc`` may change (e.g. a
        larger max_steps) and is written to run.yaml, unless the run is already at ``tc.max_steps`` (no
        step will run, so run.yaml keeps the settings it trained with)."""
        run = run_folder.read_run(run_dir)
        saved = ModelConfig.from_dict(run["model"], source=f"{run_dir}/{run_folder.RUN_FILE}")
        if cfg is not None and cfg != saved:
            diff = [
                f"{k}: run has {v!r}, asked {getattr(cfg, k)!r}"
                for k, v in saved.to_dict().items()
                if getattr(cfg, k) != v
            ]
            raise CheckpointError(f"cannot resume {str(run_dir)!r} with another architecture ({'; '.join(diff)})")
        tc = tc or TrainConfig.from_dict(run["train"], source=f"{run_dir}/{run_folder.RUN_FILE}")
        if tc.optimizer != optimizer_of(run.get("train")):
            raise CheckpointError(
                f"cannot resume {str(run_dir)!r} with optimizer={tc.optimizer!r}: the run "
                f"trains with optimizer={optimizer_of(run.get('train'))!r}, whose state its "
                f"checkpoints hold; keep it, or start a new run"
            )
        tc, planned = schedule.planned_config(run, tc)
        if run.get("data") is None:
            raise CheckpointError(f"run {str(run_dir)!r} names no data folder; pass --data to fine-tune it")
        trainer = cls(run_dir, saved, tc, TokenData(run["data"]), padded_vocab=isinstance(run.get("hf"), dict), **kw)
        if not trainer._load():
            run_folder.check_lost_checkpoints(trainer.run_dir)
        trainer.budget_planned = planned
        if trainer.step > tc.max_steps:
            raise CheckpointError(
                f"max_steps={tc.max_steps} is below the step {trainer.step} run {str(run_dir)!r} "
                f"has reached; give max_steps >= {trainer.step}"
            )
        if trainer.dist.is_main:
            keep = run_folder.metrics_to_keep(trainer.run_dir, trainer.step, tc.log_interval)  # checked before writing
            spec = dict(run, train=dataclasses.asdict(tc))
            # stale: a plan for another budget or cap; what dtype=auto chose, once dtype is set
            for key in ([] if planned else ["budget"]) + ([] if tc.dtype == AUTO else ["precision"]):
                spec.pop(key, None)
            if trainer.step < tc.max_steps:  # a finished run trains no step: its record stays as it ran
                run_folder.write_run(run_dir, spec)
            if keep is not None:
                run_folder.rewrite_metrics(trainer.run_dir, keep)
        barrier(trainer.dist)
        return trainer

    def _load(self) -> bool:
        """Load the newest checkpoint that verifies (a damaged one falls back to the previous one, with a
        warning; none usable: CheckpointError); no checkpoint: stay at step 0 and return False."""
        run = run_folder.read_run(self.run_dir)
        check_run_model(self.run_dir, run)  # an edited architecture field is named, not reported as a misfit
        found = load_latest(self.run_dir, self.model, with_optimizer=True)
        if found is None:
            return False
        ckpt, weights, opt_state, state, rng = found
        check_run_files(self.run_dir, ckpt, run)
        load_full_state(self.model, self.opt, weights, opt_state, self.mode, self.dist)
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.clipped_steps = state.get("clipped_steps", 0)
        self.spikes = state.get("spikes", 0)
        self.loss_ema = state.get("loss_ema")
        if self.scaler is not None and "grad_scaler" in state:
            self.scaler.load_state_dict(state["grad_scaler"])
        if rng is not None and state.get("world_size", 1) == self.dist.world_size:
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        return True

    # --- pieces ----------------------------------------------------------------------------
    def _mfu_inputs(self) -> tuple[float, Optional[float]]:

        fpt = flops_per_token(self.cfg, self.cfg.context_length, training=True)
        peak = self.tc.peak_flops or device_peak_flops(self.device, self.amp_dtype)
        return fpt, peak

    def _log(self, record: dict) -> None:
        if not self.dist.is_main:
            return
        run_folder.append_metrics(self.run_dir, record)  # a kill leaves at most a cut last line, dropped on resume
        if self.tc.tensorboard:
            if self._tb is None:
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
                except ImportError:
                    self._tb = False
            if self._tb:
                for k, v in record.items():
                    if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                        self._tb.add_scalar(k, v, record["step"])

    def _autocast(self):
        return torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None
        )

    def validate(self) -> dict:
        with eager():  # compiled blocks: no inference graphs to compile for a few evaluation batches
            return evaluate(
                self.model,
                self.val_tokens,
                self.data.bytes("val"),
                batch_size=self.tc.batch_size,
                device=self.device,
                max_windows=self.tc.eval_windows,
                autocast_dtype=self.amp_dtype,
            )

    def save(self) -> Optional[Path]:
        """Checkpoint the current state (gathered to rank 0, written there atomically), then log a
        ``{"step", "checkpoint": folder name}`` record to metrics.jsonl: the run's proof that it had one."""
        msd, osd = full_state(self.model, self.opt, self.mode, self.dist)
        path = None
        if self.dist.is_main:
            state = {
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "seed": self.tc.seed,
                "clipped_steps": self.clipped_steps,
                "spikes": self.spikes,
                "loss_ema": self.loss_ema,
                "world_size": self.dist.world_size,
            }
            if self.scaler is not None:
                state["grad_scaler"] = self.scaler.state_dict()
            rng = {"cpu": torch.get_rng_state()}
            if self.device.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state(self.device)
            path = save_checkpoint(
                self.run_dir,
                self.step,
                msd,
                osd,
                state,
                self.tc.keep_checkpoints,
                tied=self.cfg.tie_embeddings,
                rng=rng,
            )
            self._log({"step": self.step, "checkpoint": path.name})  # after the rename: it exists
        barrier(self.dist)
        return path

    def _global_batch(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of the current step."""
        tc, T, info = self.tc, self.cfg.context_length, self.dist
        n = tc.batch_size * tc.grad_accum * info.world_size
        starts = global_batch_starts(len(self.train_tokens), self.step, n, tc, T)
        micro = []
        for m in range(tc.grad_accum):
            first = (m * info.world_size + info.rank) * tc.batch_size
            x, y = windows_to_batch(self.train_tokens, starts[first : first + tc.batch_size], T)
            micro.append((x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)))
        return micro

    def train_step(self) -> dict:
        """One optimiser step over ``grad_accum`` micro-batches (token-weighted); returns its metrics.
        A non-finite loss or gradient skips the update (``skipped``: True)."""
        tc, info = self.tc, self.dist
        lr = schedule.lr_at(self.step, tc)
        set_lr(self.opt, lr, tc)
        micro = self._global_batch()
        local_tokens = sum(int((y != -100).sum()) for _, y in micro)
        global_tokens = all_reduce_mean(float(local_tokens), info, self.device) * info.world_size
        diag = (
            forward_diagnostics(self.model, micro[0][0], self._autocast)
            if tc.diag_interval and (self.step == 0 or (self.step + 1) % tc.diag_interval == 0)
            else None
        )  # step 1: at initialisation
        ce_sum = 0.0
        for i, (x, y) in enumerate(micro):
            sync = i == len(micro) - 1
            ctx = self.fwd.no_sync() if (self.mode == "ddp" and not sync) else contextlib.nullcontext()
            with ctx:
                with self._autocast():  # the chunked LM head + loss (TransformerLM.forward with targets)
                    loss, ce = self.fwd(x, targets=y, reduction="sum")
                # DDP/FSDP average gradients over ranks; scale so the result is sum / global tokens
                scaled = loss * (info.world_size / global_tokens)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            ce_sum += float(ce)
        mean_loss = all_reduce_mean(ce_sum, info, self.device) * info.world_size / global_tokens
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        if diag is not None:  # before clipping: the gradients backprop delivered
            diag["grad_norm_layers"] = layer_grad_norms(self.model)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), tc.grad_clip if tc.grad_clip else float("inf")
        )
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        rec = {"step": self.step + 1, "loss": mean_loss, "lr": lr, "grad_norm": grad_norm}
        if tc.optimizer == "muon":  # "lr" is AdamW's (embeddings, head, norms); Muon's beside it
            rec["muon_lr"] = muon_lr_at(lr, tc)
        if getattr(self.model, "mtp_last", None):  # multi-token prediction: each depth's loss (nats), apart
            rec["mtp_loss"] = [round(float(x), 6) for x in self.model.mtp_last]
        moe = self.model.moe_layers() if hasattr(self.model, "moe_layers") else []
        if moe and all(m.aux is not None for m in moe):  # the last micro-batch's, averaged over MoE layers
            rec["moe_balance"] = float(sum(float(m.aux[0].detach()) for m in moe) / len(moe))
            rec["moe_router_z"] = float(sum(float(m.aux[1].detach()) for m in moe) / len(moe))
            # the busiest expert's share of the routed slots, worst layer (1/n_experts when balanced)
            rec["moe_max_load"] = max(float(m.tokens_per_expert.max() / m.tokens_per_expert.sum()) for m in moe)
            if self.cfg.moe_seq_aux_loss:
                rec["moe_seq_balance"] = float(sum(float(m.aux[2].detach()) for m in moe) / len(moe))
        reduce = (lambda t: torch.distributed.all_reduce(t)) if info.enabled else None
        if not (math.isfinite(mean_loss) and math.isfinite(grad_norm)):
            if moe:
                self.model.update_moe_bias(apply=False)  # the skipped step's load is dropped
            self.opt.zero_grad(set_to_none=True)
            if self.scaler is not None:
                self.scaler.update()  # lowers the scale after an overflow
            self.bad_in_row += 1
            self.step += 1
            rec["skipped"] = True
            return rec
        self.bad_in_row = 0
        before = None
        if diag is not None:
            before = weights_before(self.model)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if moe:  # DeepSeek-V3's auxiliary-loss-free bias (moe_balance aux_free / both), after the step
            self.model.update_moe_bias(reduce=reduce)
            if self.cfg.moe_balance != "aux_loss":
                rec["moe_bias_range"] = max(float(m.expert_bias.max() - m.expert_bias.min()) for m in moe)
        if tc.grad_clip and grad_norm > tc.grad_clip:
            self.clipped_steps += 1
        if self.loss_ema is not None and mean_loss > tc.spike_ratio * self.loss_ema:
            self.spikes += 1
        self.loss_ema = mean_loss if self.loss_ema is None else 0.95 * self.loss_ema + 0.05 * mean_loss
        self.step += 1
        self.tokens_seen += tc.batch_size * tc.grad_accum * info.world_size * self.cfg.context_length
        rec.update(clip_fraction=self.clipped_steps / self.step, spikes=self.spikes)
        if diag is not None:
            rec.update(diag, **update_rms_ratios(self.model, before))
        return rec

    def fit(self) -> dict:
        """Train to ``max_steps``, evaluating every ``eval_interval`` and checkpointing every
        ``checkpoint_interval`` steps and at the end (or when ``max_seconds`` of wall time are spent: then
        a ``{"stopped": "max_seconds"}`` record is logged). Returns the last validation figures.
        Raises :class:`TrainingDiverged` (a FloatingPointError) after ``max_bad_steps`` non-finite steps
        in a row (the last good state is checkpointed first), :class:`NonFiniteFromStart` (recorded as
        failed, nothing checkpointed) when those were every step from the first. The run folder's ``outcome.json`` says
        ``running`` meanwhile and then how it ended (finished, diverged at step N, interrupted, failed
        with the error): what the ablation lab reads. SIGINT / SIGTERM (:class:`StopSignals`) stop it after the step in
        progress (and its evaluation / checkpoint, if due): the last finished step is checkpointed, a
        ``{"stopped": "SIGINT"}`` record logged, and :class:`TrainingInterrupted` raised; running the
        same command again resumes bit for bit."""
        self._outcome("running")
        try:  # (an error choosing the compile scope is the run's failure too)
            if not self._compile_checked and self.step < self.tc.max_steps:  # once per process
                self._compile_checked = True
                message, self._clock = choose_for_run(self)  # compile=auto decides; the clock starts
                if self.dist.is_main and message:
                    print(message, file=sys.stderr)
            with StopSignals() as stop:
                last_val = self._fit(stop)
        except TrainingDiverged as exc:
            self._outcome("diverged", exc.step)
            raise
        except KeyboardInterrupt:  # a second signal: stopped at once (the checkpoints on disk are intact)
            self._outcome("interrupted")
            raise
        except Exception as exc:
            self._outcome("failed", error=f"{type(exc).__name__}: {exc}")
            raise
        if stop.signum is not None and self.step < self.tc.max_steps:  # (a signal after the last step: done)
            self._outcome("interrupted")
            name = signal.Signals(stop.signum).name
            raise TrainingInterrupted(
                f"interrupted by {name} at step {self.step} of {self.tc.max_steps}; its "
                f"checkpoint is saved in {str(self.run_dir)!r}: run the same command again "
                f"to continue",
                stop.signum,
            )
        self._outcome("finished")
        return last_val

    def _outcome(self, status: str, step: Optional[int] = None, error: Optional[str] = None) -> None:
        """The run folder's ``outcome.json`` (:func:`lmlab.checkpoint.write_outcome`), on the main rank."""
        if self.dist.is_main:
            run_folder.write_outcome(self.run_dir, status, self.step if step is None else step, error)

    def _stop_requested(self, stop: StopSignals) -> bool:
        if not self.dist.enabled:
            return stop.signum is not None
        asked = all_reduce_mean(float(stop.signum is not None), self.dist, self.device) > 0  # every rank agrees
        if asked and stop.signum is None:
            stop.signum = signal.SIGTERM  # a signal reached another rank only
        return asked

    def _validate_and_log(self, bar) -> dict:
        """Validate, log the figures to metrics.jsonl and print them above the progress bar."""
        val = self.validate()
        self._log(
            {"step": self.step, "val_loss": val["loss"], "val_bpb": val["bits_per_byte"], "val_tokens": val["tokens"]}
        )
        if self.dist.is_main:
            bar.write(
                f"step {self.step}: val loss {val['loss']:.4f} nats/token, "
                f"~{val['bits_per_byte']:.3f} bits/byte ({val['tokens']} val tokens sampled)"
            )
        return val

    def _plan_budget(self, bar, t0: float, step_s: float) -> dict:
        """Plan ``max_steps`` from ``budget_seconds`` (at the step :func:`schedule.budget_plan_after` allows): time
        one evaluation and one checkpoint now (both kept: a validation record and a checkpoint at this
        step), then :func:`schedule.budget_steps` with the measured step time ``step_s`` (seconds, the mean over
        ranks, evaluations and checkpoints not counted). The plan goes into ``self.tc``, metrics.jsonl
        (``budget_steps``) and run.yaml (``budget``: seconds, cap, steps, the timings). The run is then
        the run ``max_steps=steps`` would have been from the start (same data, same learning rates),
        as long as the plan comes before the schedule's decay (always for cosine: its plan ends warmup)."""
        t = time.perf_counter()
        val = self._validate_and_log(bar)
        eval_s = time.perf_counter() - t
        t = time.perf_counter()
        self.save()
        save_s = time.perf_counter() - t
        step_s, eval_s, save_s, elapsed = (
            all_reduce_mean(v, self.dist, self.device) for v in (step_s, eval_s, save_s, time.perf_counter() - t0)
        )
        cap = self.tc.max_steps
        steps = schedule.budget_steps(self.step, elapsed, step_s, eval_s, save_s, self.tc)
        plan = {
            "seconds": self.tc.budget_seconds,
            "cap": cap,
            "steps": steps,
            "planned_at_step": self.step,
            "step_s": step_s,
            "eval_s": eval_s,
            "save_s": save_s,
            "elapsed_s": elapsed,
        }
        self._record_plan(
            bar,
            plan,
            f"budget {self.tc.budget_seconds:g} s: {steps} steps planned (cap {cap}) "
            f"at {step_s * 1e3:.0f} ms/step, {eval_s:.1f} s/evaluation, {save_s:.1f} "
            f"s/checkpoint, {elapsed:.0f} s spent",
        )
        return val

    def _replan_budget(self, bar, t0: float, step_s: float) -> None:
        """Check the plan again at :func:`schedule.budget_replan_step` with ``step_s`` timed since the plan (more
        and later steps than the plan saw): :func:`schedule.budget_steps` with the plan's evaluation and
        checkpoint times, kept within [:func:`schedule.shortest_plan`, cap] so the decay has not begun and the run
        stays the run of the new length from the start. Recorded like the plan (``replanned_at_step``,
        ``replan_step_s``, ``first_steps``: the first plan's count)."""
        plan = dict(self.budget_plan)
        step_s, elapsed = (all_reduce_mean(v, self.dist, self.device) for v in (step_s, time.perf_counter() - t0))
        cap_tc = dataclasses.replace(self.tc, max_steps=plan["cap"])
        steps = max(
            schedule.shortest_plan(self.step, self.tc),
            schedule.budget_steps(self.step, elapsed, step_s, plan["eval_s"], plan["save_s"], cap_tc),
        )
        plan.update(
            first_steps=plan.get("first_steps", plan["steps"]),
            steps=steps,
            replanned_at_step=self.step,
            replan_step_s=step_s,
            replan_elapsed_s=elapsed,
        )
        self._record_plan(
            bar,
            plan,
            f"budget {self.tc.budget_seconds:g} s: {steps} steps planned again at step "
            f"{self.step} (was {self.tc.max_steps}) at {step_s * 1e3:.0f} ms/step since "
            f"the plan, {elapsed:.0f} s spent",
        )

    def _record_plan(self, bar, plan: dict, message: str) -> None:
        """Apply a budget plan: ``self.tc.max_steps``, metrics.jsonl (``budget_steps``, ``budget``),
        run.yaml (``train.max_steps``, ``budget``), the progress bar and a line above it."""
        steps = plan["steps"]
        self.tc = dataclasses.replace(self.tc, max_steps=steps)
        self.budget_planned, self.budget_plan = True, plan
        self._log({"step": self.step, "budget_steps": steps, "budget": plan})
        if self.dist.is_main:
            run_folder.write_budget(self.run_dir, plan)
            bar.total = steps
            bar.refresh()
            bar.write(message)
        barrier(self.dist)

    def _fit(self, stop: StopSignals) -> dict:
        from tqdm import tqdm

        tc = self.tc
        tok_per_step = tc.batch_size * tc.grad_accum * self.dist.world_size * self.cfg.context_length
        bar = tqdm(
            total=tc.max_steps,
            initial=self.step,
            disable=not (self.progress and self.dist.is_main),
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5 if sys.stderr.isatty() else 30.0,
        )  # logs: 1 line / 30 s
        last_val: dict = {}
        t0, window_t, window_steps = time.perf_counter(), time.perf_counter(), 0
        first_step, timed_from, side_s, replan_at = self.step, t0, 0.0, None
        self.model.train()
        while self.step < tc.max_steps:
            if self._stop_requested(stop):  # the previous step, its evaluation and checkpoint are done
                self._log({"step": self.step, "stopped": signal.Signals(stop.signum).name})
                break
            step_t = time.perf_counter()
            rec = self.train_step()
            if self._clock is not None and self._clock.step(time.perf_counter() - step_t, self):
                self._clock = None
            window_steps += 1
            if rec.get("skipped"):
                self._log(rec)
                bar.write(
                    f"step {rec['step']}: non-finite loss/gradient ({rec['loss']}, {rec['grad_norm']}); "
                    f"update skipped ({self.bad_in_row} in a row)"
                )
                if self.bad_in_row >= tc.max_bad_steps and self.bad_in_row == self.step:  # never one good step
                    bar.close()
                    raise NonFiniteFromStart(self.bad_in_row, tc.dtype, tc.compile)
                if self.bad_in_row >= tc.max_bad_steps:
                    path = self.save()  # the weights are those of the last good step
                    bar.close()
                    raise TrainingDiverged(
                        f"{self.bad_in_row} non-finite steps in a row at step {rec['step']}; stopped, last good state "
                        f"saved in {path}; lower lr={tc.lr}, raise warmup_steps={tc.warmup_steps}, "
                        "or try z_loss / qk_norm",
                        rec["step"],
                    )
                bar.update(1)
                continue
            if self.step % tc.log_interval == 0 or self.step == tc.max_steps or "log_z_mean" in rec:
                now = time.perf_counter()
                rec["tokens"] = self.tokens_seen
                rec["tokens_per_s"] = window_steps * tok_per_step / (now - window_t)
                if self.flops_per_token and self.peak_flops:
                    rec["mfu"] = self.flops_per_token * rec["tokens_per_s"] / self.peak_flops
                rec["elapsed_s"] = now - t0
                window_t, window_steps = now, 0
                self._log(rec)
                bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", lr=f"{rec['lr']:.1e}")
            bar.update(1)
            if self.step == first_step + 1:
                restart_rate(bar)  # the first step's compile (tens of seconds) out of the rate and ETA
            planned_now = False
            if tc.budget_seconds is not None and not self.budget_planned:
                if self.step == first_step + schedule.BUDGET_SKIP_STEPS:
                    timed_from, side_s = time.perf_counter(), 0.0
                elif (
                    self.step
                    >= max(tc.warmup_steps, first_step + schedule.BUDGET_SKIP_STEPS + schedule.BUDGET_TIMED_STEPS)
                    and all_reduce_mean(
                        float(time.perf_counter() - t0 >= schedule.budget_plan_after(tc)), self.dist, self.device
                    )
                    > 0
                ):
                    step_s = (time.perf_counter() - timed_from - side_s) / (
                        self.step - first_step - schedule.BUDGET_SKIP_STEPS
                    )
                    last_val = self._plan_budget(bar, t0, step_s)
                    tc, planned_now = self.tc, True
                    window_t = timed_from = time.perf_counter()  # the re-plan times the steps from here
                    side_s, replan_at = 0.0, schedule.budget_replan_step(tc, self.step)
            elif replan_at is not None and self.step == replan_at:
                plan_step = self.budget_plan["planned_at_step"]
                self._replan_budget(bar, t0, (time.perf_counter() - timed_from - side_s) / (self.step - plan_step))
                tc, replan_at = self.tc, None
            side_t = time.perf_counter()  # evaluations and checkpoints are not step time
            if not planned_now and (self.step % tc.eval_interval == 0 or self.step == tc.max_steps):
                last_val = self._validate_and_log(bar)
                window_t = time.perf_counter()  # evaluation time is not training throughput
            if (
                tc.checkpoint_interval
                and self.step % tc.checkpoint_interval == 0
                and self.step < tc.max_steps
                and not planned_now
            ):
                self.save()
            side_s += time.perf_counter() - side_t
            if (
                tc.max_seconds is not None
                and self.step < tc.max_steps
                and all_reduce_mean(float(time.perf_counter() - t0 >= tc.max_seconds), self.dist, self.device) > 0
            ):
                self._log({"step": self.step, "stopped": "max_seconds", "elapsed_s": time.perf_counter() - t0})
                break  # wall-time budget spent: checkpointed below, marked as stopped in metrics.jsonl
        bar.close()
        if self._clock is not None:  # a run shorter than the clock: what it measured
            self._clock.finish(self)
            self._clock = None
        done = run_folder.checkpoint_dirs(self.run_dir)
        if not done or done[-1].name != f"step_{self.step:07d}":
            self.save()
        if self._tb:
            self._tb.close()
        return last_val
