"""Training loop: AdamW, warmup + cosine decay, gradient clipping, periodic validation, JSON-lines
metrics, atomic safetensors checkpoints.

Batches are random windows of ``context_length + 1`` tokens from the training stream. The windows of
step s are drawn from a generator seeded with (seed, s), so the data order is a pure function of the
step: resuming at step s sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import yaml

from lmlab.checkpoint import RUN_FILE, CheckpointError, checkpoint_dirs, load_weights, read_run, save_checkpoint
from lmlab.config import ConfigError, ModelConfig, _choice, _non_negative, _positive, _positive_int
from lmlab.data.prepare import DataError, TokenData
from lmlab.evaluate import evaluate
from lmlab.model import TransformerLM, lm_loss

WD_GROUPS = ("norm", "bias", "embedding")


@dataclass
class TrainConfig:
    """Optimisation settings. Units: lr per step, intervals in steps, batch in sequences."""

    batch_size: int = 16
    grad_accum: int = 1
    max_steps: int = 1000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine | constant
    weight_decay: float = 0.1
    wd_exclude: list = field(default_factory=lambda: ["norm", "bias"])  # of: norm, bias, embedding
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global L2 norm; 0 disables
    eval_interval: int = 200
    eval_windows: int = 32  # windows of the validation stream scored at each periodic evaluation
    checkpoint_interval: int = 0  # 0 = only at the end
    keep_checkpoints: int = 2
    log_interval: int = 10
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "fp32"  # fp32 | bf16 (autocast) | auto (bf16 where the device runs it natively)

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "max_steps", "eval_interval", "eval_windows", "log_interval"):
            _positive_int(name, getattr(self, name))
        for name in ("warmup_steps", "checkpoint_interval", "keep_checkpoints", "seed"):
            _positive_int(name, getattr(self, name), 0)
        _positive("lr", self.lr)
        _non_negative("weight_decay", self.weight_decay)
        _non_negative("grad_clip", self.grad_clip)
        _positive("eps", self.eps)
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be in [0, 1)")
        _choice("schedule", self.schedule, ("cosine", "constant"))
        _choice("dtype", self.dtype, ("fp32", "bf16", "auto"))
        if not isinstance(self.wd_exclude, list) or any(g not in WD_GROUPS for g in self.wd_exclude):
            raise ConfigError(f"wd_exclude={self.wd_exclude!r} must be a list drawn from {list(WD_GROUPS)}")

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> "TrainConfig":
        from lmlab.config import check_keys

        check_keys(cls, data, source)
        return cls(**data)


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warmup from lr/warmup to lr over ``warmup_steps``,
    then cosine decay to lr * min_lr_ratio at ``max_steps`` (Loshchilov & Hutter 2017), or constant."""
    if tc.warmup_steps and step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    if tc.schedule == "constant":
        return tc.lr
    span = max(1, tc.max_steps - tc.warmup_steps)
    progress = min(1.0, (step - tc.warmup_steps) / span)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def param_groups(model: TransformerLM, tc: TrainConfig) -> list[dict]:
    """AdamW groups: weight decay on every parameter except the excluded kinds (norm weights,
    biases, embeddings as chosen in ``wd_exclude``). Tied weights appear once."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # named_parameters yields a shared tensor once
        kind = ("bias" if name.endswith(".bias") else
                "norm" if "norm" in name.split(".")[-2] else
                "embedding" if name.startswith(("embed.", "abs_pos.")) or "rel_bias" in name else "weight")
        (no_decay if kind in tc.wd_exclude else decay).append(p)
    return [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but CUDA is not available here; use device=cpu or auto")
    return dev


def resolve_dtype(name: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype (None = fp32). 'auto' picks bf16 on CUDA with bf16 support and on CPUs with
    native bf16 (AVX512-BF16 / AMX, through oneDNN), else fp32."""
    if name == "fp32":
        return None
    if name == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    try:
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    except (AttributeError, RuntimeError):
        return None


def batch_at(tokens: np.ndarray, step: int, micro: int, tc: TrainConfig, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (inputs, targets) micro-batch ``micro`` of ``step``: (batch_size, T) int64 each."""
    g = np.random.default_rng([tc.seed, step, micro])
    starts = g.integers(0, len(tokens) - T - 1, size=tc.batch_size, endpoint=True)
    chunk = np.stack([np.asarray(tokens[s:s + T + 1], dtype=np.int64) for s in starts])
    chunk = torch.from_numpy(chunk)
    return chunk[:, :-1], chunk[:, 1:]


class Trainer:
    """Train a model from a run folder. Create with :meth:`create` (new run) or :meth:`resume`."""

    def __init__(self, run_dir: Path, cfg: ModelConfig, tc: TrainConfig, data: TokenData, progress: bool = True):
        self.run_dir, self.cfg, self.tc, self.data = Path(run_dir), cfg, tc, data
        self.progress = progress
        if data.vocab_size != cfg.vocab_size:
            raise ConfigError(f"model vocab_size={cfg.vocab_size} does not match the tokenizer of "
                              f"{str(data.folder)!r} ({data.vocab_size} tokens); set vocab_size={data.vocab_size}")
        self.train_tokens = data.tokens("train")
        self.val_tokens = data.tokens("val")
        if len(self.train_tokens) < cfg.context_length + 2:
            raise DataError(f"training split of {str(data.folder)!r} has {len(self.train_tokens)} tokens, fewer than one "
                            f"context of {cfg.context_length} + 1; use more text or a smaller context_length")
        if len(self.val_tokens) < 2:
            raise DataError(f"validation split of {str(data.folder)!r} has no tokens to score")
        self.device = resolve_device(tc.device)
        self.amp_dtype = resolve_dtype(tc.dtype, self.device)
        torch.manual_seed(tc.seed)
        self.model = TransformerLM(cfg).to(self.device)
        self.opt = torch.optim.AdamW(param_groups(self.model, tc), lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps,
                                     fused=self.device.type == "cuda")
        self.step = 0
        self.tokens_seen = 0

    # --- run folder ------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: str | Path, cfg: ModelConfig, tc: TrainConfig, data_dir: str | Path, **kw) -> "Trainer":
        """Start a new run in ``run_dir``; raises CheckpointError if it already holds a run."""
        run_dir = Path(run_dir)
        if (run_dir / RUN_FILE).exists() or checkpoint_dirs(run_dir):
            raise CheckpointError(f"run folder {str(run_dir)!r} already holds a run; pass --resume to continue it "
                                  f"or choose another --out")
        data = TokenData(data_dir)
        trainer = cls(run_dir, cfg, tc, data, **kw)
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data.folder / "tokenizer.json", run_dir / "tokenizer.json")
        spec = {"model": cfg.to_dict(), "train": dataclasses.asdict(tc), "data": str(Path(data_dir).resolve())}
        (run_dir / RUN_FILE).write_text(yaml.safe_dump(spec, sort_keys=False))
        return trainer

    @classmethod
    def resume(cls, run_dir: str | Path, cfg: Optional[ModelConfig] = None, tc: Optional[TrainConfig] = None,
               **kw) -> "Trainer":
        """Continue ``run_dir`` from its last complete checkpoint (or from scratch if it has none).
        A ``cfg`` that differs from the run's is refused, naming the differing fields; ``tc`` may
        change (e.g. a larger max_steps)."""
        run = read_run(run_dir)
        saved = ModelConfig.from_dict(run["model"], source=f"{run_dir}/{RUN_FILE}")
        if cfg is not None and cfg != saved:
            diff = [f"{k}: run has {v!r}, asked {getattr(cfg, k)!r}" for k, v in saved.to_dict().items()
                    if getattr(cfg, k) != v]
            raise CheckpointError(f"cannot resume {str(run_dir)!r} with another architecture ({'; '.join(diff)})")
        tc = tc or TrainConfig.from_dict(run["train"], source=f"{run_dir}/{RUN_FILE}")
        trainer = cls(run_dir, saved, tc, TokenData(run["data"]), **kw)
        ckpts = checkpoint_dirs(run_dir)
        if ckpts:
            load_weights(trainer.model, ckpts[-1])
            opt_path = ckpts[-1] / "optimizer.pt"
            trainer.opt.load_state_dict(torch.load(opt_path, map_location=trainer.device, weights_only=True))
            state = json.loads((ckpts[-1] / "trainer.json").read_text())
            trainer.step, trainer.tokens_seen = state["step"], state["tokens_seen"]
        spec = dict(run, train=dataclasses.asdict(tc))
        (Path(run_dir) / RUN_FILE).write_text(yaml.safe_dump(spec, sort_keys=False))
        return trainer

    # --- loop ------------------------------------------------------------------------------
    def _log(self, record: dict) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None)

    def validate(self) -> dict:
        return evaluate(self.model, self.val_tokens, self.data.bytes("val"), batch_size=self.tc.batch_size,
                        device=self.device, max_windows=self.tc.eval_windows, autocast_dtype=self.amp_dtype)

    def save(self) -> Path:
        state = {"step": self.step, "tokens_seen": self.tokens_seen, "seed": self.tc.seed}
        return save_checkpoint(self.run_dir, self.step, self.model, self.opt, state, self.tc.keep_checkpoints)

    def train_step(self) -> dict:
        """One optimiser step over ``grad_accum`` micro-batches; returns its metrics."""
        tc, T = self.tc, self.cfg.context_length
        lr = lr_at(self.step, tc)
        for group in self.opt.param_groups:
            group["lr"] = lr
        total = 0.0
        for micro in range(tc.grad_accum):
            x, y = batch_at(self.train_tokens, self.step, micro, tc, T)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self._autocast():
                logits = self.model(x)
            loss, ce = lm_loss(logits, y, self.cfg.z_loss)
            (loss / tc.grad_accum).backward()
            total += float(ce) / tc.grad_accum
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip if tc.grad_clip else float("inf"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += tc.batch_size * tc.grad_accum * T
        return {"step": self.step, "loss": total, "lr": lr, "grad_norm": float(grad_norm)}

    def fit(self) -> dict:
        """Train to ``max_steps``, evaluating every ``eval_interval`` and checkpointing every
        ``checkpoint_interval`` steps and at the end. Returns the last validation figures."""
        from tqdm import tqdm

        tc = self.tc
        tok_per_step = tc.batch_size * tc.grad_accum * self.cfg.context_length
        bar = tqdm(total=tc.max_steps, initial=self.step, disable=not self.progress, unit="step", dynamic_ncols=True)
        last_val: dict = {}
        t0, window_t, window_steps = time.perf_counter(), time.perf_counter(), 0
        self.model.train()
        while self.step < tc.max_steps:
            rec = self.train_step()
            window_steps += 1
            if not math.isfinite(rec["loss"]):
                raise FloatingPointError(f"loss became {rec['loss']} at step {self.step}; lower lr={tc.lr} "
                                         f"or raise warmup_steps={tc.warmup_steps}")
            if self.step % tc.log_interval == 0 or self.step == tc.max_steps:
                now = time.perf_counter()
                rec["tokens"] = self.tokens_seen
                rec["tokens_per_s"] = window_steps * tok_per_step / (now - window_t)
                rec["elapsed_s"] = now - t0
                window_t, window_steps = now, 0
                self._log(rec)
                bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", lr=f"{rec['lr']:.1e}")
            bar.update(1)
            if self.step % tc.eval_interval == 0 or self.step == tc.max_steps:
                last_val = self.validate()
                self._log({"step": self.step, "val_loss": last_val["loss"], "val_bpb": last_val["bits_per_byte"],
                           "val_tokens": last_val["tokens"]})
                bar.write(f"step {self.step}: val loss {last_val['loss']:.4f} nats/token, "
                          f"~{last_val['bits_per_byte']:.3f} bits/byte (first {last_val['tokens']} val tokens)")
                window_t = time.perf_counter()  # evaluation time is not training throughput
            if tc.checkpoint_interval and self.step % tc.checkpoint_interval == 0 and self.step < tc.max_steps:
                self.save()
        bar.close()
        if not checkpoint_dirs(self.run_dir) or checkpoint_dirs(self.run_dir)[-1].name != f"step_{self.step:07d}":
            self.save()
        return last_val
