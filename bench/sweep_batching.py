"""Does a sweep run faster with its runs batched into one model? (issue 14, item 4)

The runs of a sweep that differ only in seed or learning rate have the same shapes, so K of them can
train as one module with stacked weights (``torch.func.stack_module_state`` + ``vmap`` over
``functional_call``), each member with its own AdamW learning rate and its own gradient clipping.
This script trains the same K runs (seeds 0..K-1, learning rates spread over ``--lr-span``) for
``--steps`` steps in each of these ways and prints the sweep's wall time:

  separate   one run after another in this process, ``--threads`` threads (``lmlab sweep --jobs 1``)
  jobs       the K runs split over ``--threads`` processes of 1 thread each, started together
             (``lmlab sweep --jobs N``); timed from a barrier after every process has built its models
  batched    one vmapped module of K members, ``--threads`` threads
  bound      one model with a K-times larger batch: the same FLOPs as the K runs with shared weights, so
             every matmul is K times larger. No batching of K *different* models can beat it on the
             same device, so it bounds what batching could ever buy here.

The separate runs are ``lmlab train``'s step (TransformerLM.forward with targets: the chunked linear
cross-entropy, fused AdamW, clip_grad_norm_, weight decay groups of lmlab.train.param_groups). The batched
path runs the transformer blocks under vmap (SDPA attention; lmlab's blocked CPU kernel has no vmap rule),
the LM head + loss per member with the same linear cross-entropy, and an AdamW written out on the stacked
tensors (decoupled weight decay, bias correction as torch.optim.AdamW). Before timing, the script trains
K = 2 members both ways for 3 steps in fp32 and exits with status 1 unless losses and weights agree to
fp32 tolerance (max |difference| printed).

Timing: ``--rounds`` rounds, the ways in rotated order within each round; the figure per way is the
median over rounds of (separate time / its time), with the interquartile range.

    python bench/sweep_batching.py --threads 2                      # a lab spec's shape (d_model 128)
    python bench/sweep_batching.py --threads 2 --shape demo --k 4   # the demo model's shape
    python bench/sweep_batching.py --device cuda --k 8              # GPU: jobs is skipped
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = {  # lab: the model of lmlab/specs/03-gated-ffn.yaml etc.; demo: lmlab/configs/demo.yaml
    "lab": dict(model=dict(vocab_size=4096, context_length=128, d_model=128, n_layers=4, n_heads=4), batch=16),
    "demo": dict(
        model=dict(vocab_size=4096, context_length=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4), batch=8
    ),
    "small": dict(model=dict(vocab_size=4096, context_length=128, d_model=64, n_layers=2, n_heads=2), batch=16),
}
BETAS, EPS, WD, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0


def model_config(shape: str):
    from lmlab.config import ModelConfig

    return ModelConfig(**SHAPES[shape]["model"])


def train_config(lr: float):
    from lmlab.train import TrainConfig

    return TrainConfig(lr=lr, weight_decay=WD, beta1=BETAS[0], beta2=BETAS[1], eps=EPS, grad_clip=CLIP)


def lrs_of(k: int, span: float, base: float = 1e-3) -> list[float]:
    """k learning rates log-spaced over [base / sqrt(span), base * sqrt(span)]."""
    if k == 1:
        return [base]
    return [base * span ** (i / (k - 1) - 0.5) for i in range(k)]


def batches(cfg, batch: int, steps: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length + 1), generator=g)
        out.append((x[:, :-1].to(device), x[:, 1:].to(device)))
    return out


def autocast(device, dtype):
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


class Separate:
    """K runs as ``lmlab train`` steps them, one after another."""

    def __init__(self, cfg, seeds, lrs, device, dtype):
        from lmlab.model import TransformerLM
        from lmlab.optim import adamw, param_groups

        self.runs, self.device, self.dtype = [], device, dtype
        for seed, lr in zip(seeds, lrs):
            torch.manual_seed(seed)
            model = TransformerLM(cfg).to(device)
            tc = train_config(lr)
            self.runs.append((model, adamw(param_groups(model, tc), tc, device)))

    def step(self, data) -> list[float]:
        losses = []
        for model, opt in self.runs:
            x, y = data
            with autocast(self.device, self.dtype):
                loss, _ = model(x, targets=y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        return [float(v) for v in losses]


class _Hidden(torch.nn.Module):
    """functional_call target: the model's final hidden states (the LM head + loss run outside vmap)."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        return self.m.hidden(x)


class Batched:
    """K runs as one module with stacked weights: blocks under vmap, LM head + loss per member,
    a per-member AdamW (own lr, own clipping) on the stacked tensors."""

    def __init__(self, cfg, seeds, lrs, device, dtype):
        from torch.func import functional_call, stack_module_state, vmap

        from lmlab.model import TransformerLM
        from lmlab.train import param_groups

        models = []
        for seed in seeds:
            torch.manual_seed(seed)
            models.append(TransformerLM(cfg).to(device))
        decayed = {id(p) for p in param_groups(models[0], train_config(lrs[0]))[0]["params"]}
        self.decay = {name: id(p) in decayed for name, p in models[0].named_parameters()}
        wrapped = [_Hidden(m) for m in models]
        params, buffers = stack_module_state(wrapped)  # {name: (K, ...)}
        self.params = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
        self.buffers = buffers
        base = copy.deepcopy(wrapped[0]).to("meta")
        for block in base.m.blocks:
            block.attn.blocked_kernel = False  # the custom autograd kernel has no vmap rule
        self.fn = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)), in_dims=(0, 0, None))
        self.cfg, self.device, self.dtype, self.k = cfg, device, dtype, len(seeds)
        self.lr = torch.tensor(lrs, device=device, dtype=torch.float32)
        self.m = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.t = 0
        self.head = "m.lm_head.weight" if "m.lm_head.weight" in self.params else "m.embed.weight"

    def losses(self, x, y) -> torch.Tensor:
        from lmlab.kernels.loss import linear_cross_entropy

        with autocast(self.device, self.dtype):
            h = self.fn(self.params, self.buffers, x)  # (K, batch, seq, d_model)
            w = self.params[self.head]
            return torch.stack([linear_cross_entropy(h[i], w[i], y)[0] for i in range(self.k)])

    @torch.no_grad()
    def update(self) -> None:
        """torch.optim.AdamW's update per member (decoupled weight decay, bias-corrected moments) after
        per-member gradient clipping as clip_grad_norm_ does it (coefficient max_norm / (norm + 1e-6))."""
        grads = {n: p.grad for n, p in self.params.items()}
        sq = sum(g.float().pow(2).flatten(1).sum(1) for g in grads.values())
        coef = (CLIP / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        self.t += 1
        b1, b2 = BETAS
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for n, p in self.params.items():
            shape = (self.k,) + (1,) * (p.dim() - 1)
            g = grads[n] * coef.view(shape).to(p.dtype)
            lr = self.lr.view(shape).to(p.dtype)
            if self.decay[n[2:]]:
                p.mul_(1 - lr * WD)
            self.m[n].lerp_(g, 1 - b1)
            self.v[n].mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (self.v[n] / c2).sqrt_().add_(EPS)
            p.sub_(lr / c1 * self.m[n] / denom)
            p.grad = None

    def step(self, data) -> list[float]:
        x, y = data
        losses = self.losses(x, y)
        losses.sum().backward()
        self.update()
        return losses.detach().tolist()

    def member_state(self, i: int) -> dict:
        return {n[2:]: p[i].detach() for n, p in self.params.items()}


class Bound:
    """One model, K times the batch: what no batching of K models can beat on this device."""

    def __init__(self, cfg, k, device, dtype):
        self.sep = Separate(cfg, [0], [1e-3], device, dtype)
        self.k = k

    def step(self, data) -> list[float]:
        x, y = data
        return self.sep.step((x.repeat(self.k, 1), y.repeat(self.k, 1)))


def check_equal(shape: str, device, k: int = 2, steps: int = 3) -> float:
    """Train k members both ways in fp32; return the largest |difference| over losses and weights.
    Runs on one CPU thread (restored after): with two, the products' sums split across threads in an
    order that varies between processes, and AdamW turns that rounding into visible weight differences
    where a gradient is near zero (its update m / (sqrt(v) + eps) is then any size up to lr): measured
    4.9e-7 in 7 of 8 processes and 4.5e-5 in one (small shape, a qkv weight at lr 3.2e-4); on one thread
    9.5e-7 in every process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _max_difference(shape, device, k, steps)
    finally:
        torch.set_num_threads(threads)


def _max_difference(shape: str, device, k: int, steps: int) -> float:
    cfg = model_config(shape)
    seeds, lrs = list(range(k)), lrs_of(k, 10.0)
    data = batches(cfg, 4, steps, device)
    sep, bat = Separate(cfg, seeds, lrs, device, None), Batched(cfg, seeds, lrs, device, None)
    worst = 0.0
    for d in data:
        a, b = sep.step(d), bat.step(d)
        worst = max(worst, max(abs(u - v) for u, v in zip(a, b)))
    for i, (model, _) in enumerate(sep.runs):
        mine = bat.member_state(i)
        for n, p in model.named_parameters():
            worst = max(worst, float((p.detach() - mine[n]).abs().max()))
    return worst


def _job_worker(shape, seeds, lrs, steps, dtype_name, barrier, queue):
    torch.set_num_threads(1)
    dtype = {"fp32": None, "bf16": torch.bfloat16}[dtype_name]
    cfg = model_config(shape)
    device = torch.device("cpu")
    sep = Separate(cfg, seeds, lrs, device, dtype)
    data = batches(cfg, SHAPES[shape]["batch"], steps + 1, device)
    sep.step(data[0])  # warm-up, as the in-process ways get
    barrier.wait()
    t0 = time.perf_counter()
    for d in data[1:]:
        sep.step(d)
    queue.put(time.perf_counter() - t0)


def time_jobs(shape, seeds, lrs, steps, dtype_name, procs) -> float:
    """Wall time of the K runs split over ``procs`` one-thread processes started together."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    parts = [(seeds[i::procs], lrs[i::procs]) for i in range(procs)]
    workers = [
        ctx.Process(target=_job_worker, args=(shape, s, lr, steps, dtype_name, barrier, queue)) for s, lr in parts if s
    ]
    for w in workers:
        w.start()
    times = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    return max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="lab")
    from bench.train_vs_peers import check_device
    from lmlab.argtypes import int_at_least

    ap.add_argument("--k", type=int_at_least(2), default=4, help="runs in the sweep (members of the batched module)")
    ap.add_argument("--steps", type=int_at_least(1), default=6, help="timed steps per run per round")
    ap.add_argument("--rounds", type=int_at_least(1), default=5)
    ap.add_argument("--threads", type=int_at_least(1), default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--lr-span", type=float, default=10.0, help="largest / smallest learning rate, 1 to 1000 (around 1e-3)"
    )
    args = ap.parse_args()
    device = check_device(ap, args.device)
    if not 1 <= args.lr_span <= 1000:  # also refuses nan
        ap.error(f"--lr-span {args.lr_span}: give a ratio of largest to smallest learning rate from 1 to 1000")
    torch.set_num_threads(args.threads)
    dtype = {"fp32": None, "bf16": torch.bfloat16}[args.dtype]
    from lmlab.bench import describe_machine

    worst = check_equal(args.shape, device)
    print(
        f"batched vs separate, 2 members x 3 steps, fp32, 1 thread: max |difference| of losses and weights {worst:.2e}"
    )
    if not worst < 1e-4:
        raise SystemExit("batched training does not reproduce separate runs: not timing it")

    cfg, k = model_config(args.shape), args.k
    seeds, lrs = list(range(k)), lrs_of(k, args.lr_span)
    batch = SHAPES[args.shape]["batch"]
    data = batches(cfg, batch, args.steps + 1, device)
    ways = {
        "separate": Separate(cfg, seeds, lrs, device, dtype),
        "batched": Batched(cfg, seeds, lrs, device, dtype),
        "bound": Bound(cfg, k, device, dtype),
    }
    for way in ways.values():
        way.step(data[0])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(name: str) -> float:
        if name == "jobs":
            return time_jobs(args.shape, seeds, lrs, args.steps, args.dtype, args.threads)
        sync()
        t0 = time.perf_counter()
        for d in data[1:]:
            ways[name].step(d)
        sync()
        return time.perf_counter() - t0

    names = ["separate", "batched", "bound"] + (["jobs"] if device.type == "cpu" and args.threads > 1 else [])
    times = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(timed(n))
    print(f"machine: {describe_machine(device)}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(
        f"shape {args.shape} ({cfg.d_model=}, {cfg.n_layers=}, {cfg.context_length=}, batch {batch}), "
        f"{args.dtype}, K = {k} runs x {args.steps} steps, {args.rounds} rounds"
    )
    print(f"{'way':<10} {'sweep s':>8} {'ms/run-step':>12} {'speed-up vs separate (IQR)':>28}")
    for n in names:
        ratios = sorted(a / b for a, b in zip(times["separate"], times[n]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        med = statistics.median(times[n])
        print(
            f"{n:<10} {med:8.2f} {1000 * med / (k * args.steps):12.1f} "
            f"{statistics.median(ratios):13.2f}x ({q[0]:.2f}-{q[2]:.2f})"
        )


if __name__ == "__main__":
    main()
