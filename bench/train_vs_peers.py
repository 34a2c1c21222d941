"""Training throughput against peers, side by side in one process, with every setting equalised.

Systems (each one's own training step, as its users write it; the same config, batch, precision and
AdamW hyperparameters):
- ``lmlab``: ``lmlab train``'s step: ``TransformerLM(x, targets=y)`` (chunked LM head + loss,
  lmlab.kernels.loss), ``lmlab.optim.adamw`` (fused AdamW), and ``torch.compile`` of the model
  when ``--lmlab-compile`` (its recommended setting on CPU; compile time reported apart);
- ``hf``: Hugging Face ``LlamaForCausalLM`` / ``GPT2LMHeadModel`` (SDPA attention), logits then
  ``F.cross_entropy``;
- ``litgpt``: ``litgpt.model.GPT`` (LLaMA recipes only), logits then ``F.cross_entropy``;
- ``nanogpt``: karpathy/nanoGPT's ``model.py`` (GPT-2 recipe only) with its own loss, from the folder
  given by ``--nanogpt DIR`` (a clone of https://github.com/karpathy/nanoGPT, MIT licence; not
  shipped with lmlab);
- ``xt``: lucidrains' x-transformers ``TransformerWrapper`` (optional, when importable).
Peers run eagerly with torch's default AdamW (foreach), as their users run them; ``--peers-compiled``
also runs each peer with ``torch.compile`` and fused AdamW: the strongest form of each peer, for the
sceptic's column.

Recipes: ``llama`` (pre-norm RMSNorm, SwiGLU d_ff from the 8/3 rule, RoPE, no biases, tied
embeddings; ``--kv-heads`` for GQA), ``gpt2`` (pre-norm LayerNorm with biases, exact-erf GELU MLP 4x,
learned positions, tied embeddings), ``demo`` (lmlab's demo config: llama recipe, 4 KV heads, batch 16).
Checked before timing, and printed: equal parameter counts, no dropout module with p > 0 and no
attention dropout, the same activation, AdamW settings and autocast dtype. HF GPT-2 is built with
``activation_function="gelu"`` (exact) and all pdrop 0, as nanoGPT's GELU and lmlab's ``gelu``.

Timing: all systems built in one process, warmed up, then ``--rounds`` rounds, each timing
``--steps`` steps of every system in a rotated order; the figure per pair is the median over rounds of
the per-round ratio of step times, with its interquartile range. On CPU the process first applies
``lmlab train``'s malloc setting (``lmlab.devices.keep_freed_memory``: freed memory stays mapped, no
page faults on the next step's activations); it is process-wide, so the peers time with it too.
Peak memory: max RSS of a fresh process per system that imports, builds and trains a few steps, and
its RSS before the first step (what the import and the model cost), so "training adds" is comparable
across libraries (lmlab's process with its malloc setting, the peers' without, as each is run).

    python bench/train_vs_peers.py --recipe llama --threads 1 --dtype fp32 --lmlab-compile
    python bench/train_vs_peers.py --recipe gpt2 --nanogpt ~/src/nanoGPT --dtype bf16 --markdown
Install the peers in a separate venv (they pin their own dependencies):
    python -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 -e ".[hf]" litgpt x-transformers
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ADAMW = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
RECIPES = {  # d_model, layers, heads, kv heads, context, vocab, batch
    "llama": dict(d_model=256, layers=4, heads=8, kv_heads=8, context=256, vocab=4096, batch=8),
    "gpt2": dict(d_model=256, layers=4, heads=8, kv_heads=8, context=256, vocab=4096, batch=8),
    "demo": dict(d_model=256, layers=4, heads=8, kv_heads=4, context=256, vocab=4096, batch=16),
}
PEERS = {"llama": ("hf", "litgpt", "xt"), "demo": ("hf", "litgpt", "xt"), "gpt2": ("hf", "nanogpt", "xt")}


@dataclass
class Args:
    """The benchmark's shape (also used by bench/profile_train_step.py)."""

    recipe: str = "llama"
    d_model: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 8
    context: int = 256
    vocab: int = 4096
    batch: int = 8
    nanogpt: Optional[str] = None


def lmlab_config(a: Args):
    from lmlab.config import ModelConfig

    common = dict(
        vocab_size=a.vocab,
        context_length=a.context,
        d_model=a.d_model,
        n_layers=a.layers,
        n_heads=a.heads,
        n_kv_heads=a.kv_heads,
        tie_embeddings=True,
    )
    if a.recipe == "gpt2":
        return ModelConfig(
            **common,
            norm_type="layernorm",
            norm_bias=True,
            bias="all",
            activation="gelu",
            d_ff=4 * a.d_model,
            position="learned",
        )
    return ModelConfig(**common)


def build_peer(system: str, a: Args) -> tuple[torch.nn.Module, Callable]:
    """(model, loss_fn(model, x, y) -> scalar mean cross-entropy) for a peer library."""
    cfg = lmlab_config(a)
    ce = lambda logits, y: F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())  # noqa: E731
    if system == "hf" and a.recipe != "gpt2":
        from transformers import LlamaConfig, LlamaForCausalLM

        m = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=a.vocab,
                hidden_size=a.d_model,
                intermediate_size=cfg.d_ff,
                num_hidden_layers=a.layers,
                num_attention_heads=a.heads,
                num_key_value_heads=a.kv_heads,
                max_position_embeddings=a.context,
                tie_word_embeddings=True,
                attention_dropout=0.0,
                rms_norm_eps=cfg.norm_eps,
            )
        )
        m.config._attn_implementation = "sdpa"
        return m, lambda m, x, y: ce(m(input_ids=x).logits, y)
    if system == "hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        m = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=a.vocab,
                n_positions=a.context,
                n_embd=a.d_model,
                n_layer=a.layers,
                n_head=a.heads,
                activation_function="gelu",
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        )
        m.config._attn_implementation = "sdpa"
        return m, lambda m, x, y: ce(m(input_ids=x).logits, y)
    if system == "litgpt":
        from litgpt import Config
        from litgpt.model import GPT

        m = GPT(
            Config(
                n_embd=a.d_model,
                n_layer=a.layers,
                n_head=a.heads,
                n_query_groups=a.kv_heads,
                intermediate_size=cfg.d_ff,
                mlp_class_name="LLaMAMLP",
                norm_class_name="RMSNorm",
                bias=False,
                rotary_percentage=1.0,
                parallel_residual=False,
                padded_vocab_size=a.vocab,
                vocab_size=a.vocab,
                block_size=a.context,
                norm_eps=cfg.norm_eps,
            )
        )
        m.lm_head.weight = m.transformer.wte.weight  # tied, as the others
        return m, lambda m, x, y: ce(m(x), y)
    if system == "nanogpt":
        if not a.nanogpt:
            raise SystemExit("nanogpt: give --nanogpt DIR (a clone of https://github.com/karpathy/nanoGPT)")
        sys.path.insert(0, os.path.abspath(os.path.expanduser(a.nanogpt)))
        from model import GPT, GPTConfig  # nanoGPT's model.py

        m = GPT(
            GPTConfig(
                block_size=a.context,
                vocab_size=a.vocab,
                n_layer=a.layers,
                n_head=a.heads,
                n_embd=a.d_model,
                dropout=0.0,
                bias=True,
            )
        )
        return m, lambda m, x, y: m(x, y)[1]
    if system == "xt":
        from x_transformers import Decoder, TransformerWrapper

        if a.recipe == "gpt2":
            dec = Decoder(
                dim=a.d_model,
                depth=a.layers,
                heads=a.heads,
                attn_dim_head=a.d_model // a.heads,
                ff_mult=4,
                attn_flash=True,
            )
            m = TransformerWrapper(num_tokens=a.vocab, max_seq_len=a.context, attn_layers=dec, tie_embedding=True)
        else:
            dec = Decoder(
                dim=a.d_model,
                depth=a.layers,
                heads=a.heads,
                attn_kv_heads=a.kv_heads,
                attn_dim_head=a.d_model // a.heads,
                rotary_pos_emb=True,
                use_rmsnorm=True,
                ff_glu=True,
                ff_swish=True,
                ff_no_bias=True,
                attn_flash=True,
                ff_mult=cfg.d_ff / a.d_model,
            )
            m = TransformerWrapper(
                num_tokens=a.vocab, max_seq_len=a.context, attn_layers=dec, tie_embedding=True, use_abs_pos_emb=False
            )
        return m, lambda m, x, y: ce(m(x), y)
    raise SystemExit(f"unknown system {system!r}")


@dataclass
class System:
    name: str
    step: Callable[[], None]
    params: int
    compile_s: float = 0.0
    notes: list = field(default_factory=list)


def compile_apart(model: torch.nn.Module) -> Callable:
    """``torch.compile`` of ``model``'s forward through an entry function of its own (a new code
    object per call), so that models compiled with different KernelSettings in one process
    (lmlab.kernels.settings: fused_loops, onednn_fp32) keep separate graphs.
    Compiled the usual way they share TransformerLM.forward's cache: a variant whose graph breaks
    inside the attention has an entry that does not guard on a switch read after the break, and the
    other variant then ran through it (23 compiled regions per step instead of 1, measured)."""
    scope: dict = {}
    exec("def entry(*args, **kwargs):\n    return model(*args, **kwargs)\n", {"model": model}, scope)
    return torch.compile(scope["entry"])


def make_system(
    name: str,
    a: Args,
    dtype: Optional[torch.dtype],
    compile_: bool,
    fused: bool,
    device: str = "cpu",
    checkpointing: bool = False,
    kernels=None,
) -> System:
    """Build ``name`` ('lmlab' or a peer), its batch and its step on ``device``; runs the first step
    (compiling). ``checkpointing``: lmlab with activation checkpointing (TrainConfig's switch);
    ``kernels``: lmlab's KernelSettings (None: this process's defaults).
    Building lmlab on CPU applies ``lmlab.devices.keep_freed_memory`` (glibc keeps freed memory mapped),
    as ``lmlab train`` does: a process-wide setting, so every system built or stepped after it in the
    same process runs with it too (main() applies it before building any system)."""
    torch.manual_seed(0)
    dev = torch.device(device)
    x = torch.randint(0, a.vocab, (a.batch, a.context + 1), device=dev)
    inputs, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()  # nanoGPT views its targets
    if name == "lmlab":
        from lmlab.devices import keep_freed_memory
        from lmlab.model import TransformerLM
        from lmlab.optim import adamw, param_groups
        from lmlab.train_config import TrainConfig

        if dev.type == "cpu":  # as lmlab train's Trainer does on CPU; process-wide, so the peers too
            keep_freed_memory()
        model = TransformerLM(lmlab_config(a), kernels=kernels).to(dev)
        model.checkpoint_blocks = checkpointing
        tc = TrainConfig(
            lr=ADAMW["lr"],
            beta1=ADAMW["betas"][0],
            beta2=ADAMW["betas"][1],
            eps=ADAMW["eps"],
            weight_decay=ADAMW["weight_decay"],
        )
        opt = adamw(param_groups(model, tc), tc, dev)
        fwd = compile_apart(model) if compile_ else model
        loss_fn = lambda: fwd(inputs, targets=targets)[0]  # noqa: E731
    else:
        model, peer_loss = build_peer(name, a)
        model = model.to(dev)
        fwd = torch.compile(model) if compile_ else model
        opt = torch.optim.AdamW(model.parameters(), **ADAMW, fused=True if fused else None)
        loss_fn = lambda: peer_loss(fwd, inputs, targets)  # noqa: E731
    model.train()

    def step():
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    s = System(
        name,
        step,
        sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        compile_s=first if compile_ else 0.0,
    )
    s.notes = check_equal_settings(model)
    return s


def check_equal_settings(model: torch.nn.Module) -> list[str]:
    """What would make the comparison unequal: dropout modules with p > 0, attention dropout fields."""
    bad = [f"{n}: Dropout p={m.p}" for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    for n, m in model.named_modules():
        for attr in ("attention_dropout", "attn_dropout", "dropout"):
            v = getattr(m, attr, None)
            if isinstance(v, float) and v > 0:
                bad.append(f"{n}.{attr}={v}")
    return bad


def machine_line(threads: int, device: str = "cpu") -> str:
    """The machine, named to its CPU model (family/model), torch's threads (and ``threads`` where it is not
    what torch runs) and the load."""
    from lmlab.bench import describe_machine

    load = os.getloadavg()
    other = f", {threads} threads asked" if threads != torch.get_num_threads() else ""
    return f"machine: {describe_machine(device)}{other}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def peak_rss(system: str, argv: list[str]) -> dict:
    """A fresh process: import, build, 3 steps; its RSS before the first step and its max RSS (bytes)."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *argv, "--rss-of", system],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    if out.returncode:
        raise SystemExit(f"{system}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss_self() -> int:
    """This process's peak RSS in bytes (VmHWM; unlike getrusage's ru_maxrss it is not inherited
    across fork + exec from the parent's high-water mark)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def check_device(ap: argparse.ArgumentParser, name: str) -> torch.device:
    """``--device``'s value as a torch.device, or ``ap.error`` (exit 2) naming what is wrong: not a device
    name, a type other than cpu / cuda, or CUDA (or that GPU index) absent here."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        ap.error(f"--device {name!r} is not a device name; use cpu, cuda or cuda:N")
    if dev.type not in ("cpu", "cuda"):
        ap.error(f"--device {name!r}: use cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {name!r}: CUDA is not available here; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        ap.error(f"--device {name!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    return dev


def main() -> None:
    from lmlab.argtypes import int_at_least

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="llama")
    ap.add_argument("--kv-heads", type=int_at_least(1), help="KV heads (GQA) for the llama and demo recipes")
    ap.add_argument("--d-model", dest="d_model", type=int_at_least(1), help="width (default 256)")
    ap.add_argument("--layers", type=int_at_least(1), help="layers (default 4)")
    ap.add_argument("--heads", type=int_at_least(1), help="attention heads (default 8)")
    ap.add_argument("--vocab", type=int_at_least(1), help="vocabulary size (default 4096)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (CUDA: MFU and peak allocated memory)")
    ap.add_argument("--context", type=int_at_least(1), help="context length (default 256)")
    ap.add_argument("--batch", type=int_at_least(1), help="sequences per step (default: the recipe's)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16 = autocast, for every system")
    ap.add_argument("--threads", type=int_at_least(1), default=1)
    ap.add_argument("--systems", help="comma-separated subset of lmlab and the recipe's peers")
    ap.add_argument("--nanogpt", help="folder holding nanoGPT's model.py (GPT-2 recipe)")
    ap.add_argument("--lmlab-compile", action="store_true", help="torch.compile lmlab's model (its CPU default)")
    ap.add_argument("--peers-compiled", action="store_true", help="also time every peer compiled, fused AdamW")
    ap.add_argument(
        "--lmlab-checkpointing", action="store_true", help="also time lmlab with activation checkpointing (lmlab+ckpt)"
    )
    ap.add_argument("--steps", type=int_at_least(1), default=2, help="steps per system per round")
    ap.add_argument("--rounds", type=int_at_least(1), default=7)
    ap.add_argument("--warmup", type=int_at_least(0), default=2)
    ap.add_argument("--no-rss", action="store_true", help="skip the fresh-process memory measurement")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--rss-of", help=argparse.SUPPRESS)
    a = ap.parse_args()
    dev = check_device(ap, a.device)
    if a.kv_heads is not None and a.recipe == "gpt2":
        ap.error(
            f"--kv-heads {a.kv_heads}: the gpt2 recipe has one KV head per head (GPT-2, nanoGPT); "
            f"GQA is for --recipe llama or demo"
        )
    if a.nanogpt and not os.path.isfile(os.path.join(os.path.expanduser(a.nanogpt), "model.py")):
        ap.error(f"--nanogpt {a.nanogpt!r} holds no model.py; give a clone of https://github.com/karpathy/nanoGPT")
    torch.set_num_threads(a.threads)
    shape = Args(recipe=a.recipe, nanogpt=a.nanogpt, **RECIPES[a.recipe])
    for f in ("d_model", "layers", "heads", "vocab", "context", "batch"):
        if getattr(a, f) is not None:
            setattr(shape, f, getattr(a, f))
    if a.heads is not None and a.kv_heads is None:
        shape.kv_heads = a.heads if a.recipe != "demo" else max(1, a.heads // 2)
    if a.kv_heads is not None:
        shape.kv_heads = a.kv_heads
    if shape.heads % shape.kv_heads:
        ap.error(f"--kv-heads {shape.kv_heads} must divide the {shape.heads} heads")
    try:
        lmlab_config(shape)  # the shape's own checks (d_model divisible by the heads, ...), said in one line
    except ValueError as exc:
        ap.error(f"the shape is not a valid model: {exc}")
    dtype = torch.bfloat16 if a.dtype == "bf16" else None
    if a.rss_of:
        name, _, mode = a.rss_of.partition("+")
        base = rss_now()
        comp = mode == "c" or (mode == "k" and a.lmlab_compile)
        s = make_system(name, shape, dtype, compile_=comp, fused=comp, device=a.device, checkpointing=mode == "k")
        before = rss_now()
        if a.device.startswith("cuda"):
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            s.step()
        peak = torch.cuda.max_memory_allocated() if a.device.startswith("cuda") else peak_rss_self()
        print(json.dumps({"import_and_build": before, "base": base, "peak": peak}))
        return
    peers = [p for p in PEERS[a.recipe] if p != "nanogpt" or a.nanogpt]
    if a.recipe == "gpt2" and not a.nanogpt:
        print("nanoGPT not given (--nanogpt DIR): skipped")
    if a.nanogpt and "nanogpt" not in PEERS[a.recipe]:
        print(f"--nanogpt ignored: nanoGPT is a peer of the gpt2 recipe only, not {a.recipe}")
    if a.systems is not None and not a.systems.strip(","):
        ap.error("--systems is empty; name lmlab and some of " + ", ".join(PEERS[a.recipe]))
    wanted = [w for w in a.systems.split(",") if w] if a.systems else ["lmlab", *peers]
    unknown = [w for w in wanted if w not in ("lmlab", *PEERS[a.recipe])]
    if unknown:
        ap.error(f"--systems: {unknown} not among lmlab, {', '.join(PEERS[a.recipe])} for recipe {a.recipe}")
    if "lmlab" not in wanted:
        ap.error(f"--systems {a.systems!r}: include lmlab (every figure is a ratio to lmlab's step)")
    if "nanogpt" in wanted and not a.nanogpt:
        ap.error("--systems nanogpt: give --nanogpt DIR (a clone of https://github.com/karpathy/nanoGPT)")
    if "xt" in wanted:
        try:
            import x_transformers  # noqa: F401
        except ImportError:
            wanted.remove("xt")
            print("x-transformers not installed: skipped")
    variants = [(w, a.lmlab_compile if w == "lmlab" else False, False) for w in wanted]
    if a.lmlab_checkpointing and "lmlab" in wanted:
        variants.insert(1, ("lmlab", a.lmlab_compile, True))
    if a.peers_compiled:
        variants += [(w, True, False) for w in wanted if w != "lmlab"]
    from lmlab.devices import keep_freed_memory

    kept = (
        "glibc malloc keeps freed memory (lmlab train's setting) for every system in this process; "
        if dev.type == "cpu" and keep_freed_memory()
        else ""
    )
    systems = {}
    lm = "lmlab+compile" if a.lmlab_compile else "lmlab"
    for name, comp, ckpt in variants:
        label = "lmlab+ckpt" if ckpt else name + ("+compile" if comp else "")
        systems[label] = make_system(
            name, shape, dtype, compile_=comp, fused=comp and name != "lmlab", device=a.device, checkpointing=ckpt
        )
    counts = {k: s.params for k, s in systems.items()}
    ref = counts.get(lm, next(iter(counts.values())))
    for k in [k for k in systems if counts[k] != ref]:
        if not k.startswith("xt"):
            raise SystemExit(f"parameter counts differ, the comparison is not equal: {counts}")
        print(f"{k}: {counts[k]:,} params against lmlab's {ref:,}: left out (not equal)")
        del systems[k], counts[k]
    bad = {k: s.notes for k, s in systems.items() if s.notes}
    if bad:
        raise SystemExit(f"dropout is on, the comparison is not equal: {bad}")
    for s in systems.values():
        for _ in range(a.warmup):
            s.step()
    labels = list(systems)
    times: dict[str, list[float]] = {k: [] for k in labels}
    for r in range(a.rounds):
        for k in labels[r % len(labels) :] + labels[: r % len(labels)]:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                systems[k].step()
            times[k].append((time.perf_counter() - t0) / a.steps)
    tokens = shape.batch * shape.context
    print(machine_line(a.threads, a.device))
    print(
        f"recipe {a.recipe}: d_model {shape.d_model}, {shape.layers} layers, {shape.heads} heads, "
        f"{shape.kv_heads} KV heads, context {shape.context}, vocab {shape.vocab}, batch {shape.batch}; "
        f"{a.dtype}{' autocast' if dtype else ''}; {a.rounds} rounds x {a.steps} steps, rotated order"
    )
    from lmlab.kernels.causal_attention import use_blocked
    from lmlab.kernels.settings import default_kernels

    q = torch.empty(
        shape.batch,
        shape.heads,
        shape.context,
        shape.d_model // shape.heads,
        dtype=dtype or torch.float32,
        device=a.device,
    )
    blocked = "lmlab" in wanted and use_blocked(q, default_kernels().blocked_attention_fp32)  # lmlab's rule
    print(
        f"equalised: {counts[labels[0]]:,} params in every system; dropout 0 everywhere (checked); {kept}"
        f"AdamW {ADAMW} for all; activation {'GELU (erf)' if a.recipe == 'gpt2' else 'SwiGLU'}; "
        + ("SDPA attention in the peers" if blocked else "SDPA attention in every system")
    )
    print(
        "not equalised (printed, by design): "
        + ("lmlab's blocked causal attention (lmlab/kernels/causal_attention.py), " if blocked else "")
        + "lmlab's chunked loss, fused AdamW"
        f"{' and torch.compile' if a.lmlab_compile else ''}; peers eager with torch's default AdamW (foreach)"
        f"{', and again compiled with fused AdamW' if a.peers_compiled else ''}"
    )
    rss = (
        {}
        if a.no_rss
        else {k: peak_rss(k.replace("+compile", "+c").replace("+ckpt", "+k"), sys.argv[1:]) for k in labels}
    )
    mem_name = "peak allocated" if a.device.startswith("cuda") else "peak RSS"
    mfu_of = mfu_function(shape, a.device, dtype)
    rows = []
    for k in labels:
        med = statistics.median(times[k])
        q1, r, q3 = quartiles([t / b for t, b in zip(times[k], times[lm])]) if k != lm else (1, 1, 1)
        mem = rss.get(k)
        mfu = mfu_of(tokens / med)
        rows.append((k, med, tokens / med, r, q1, q3, systems[k].compile_s, mem, mfu))
        extra = (
            f"  {mem_name} {mem['peak'] / 2**20:6.0f} MiB (training adds "
            f"{(mem['peak'] - mem['import_and_build']) / 2**20:5.0f})"
            if mem
            else ""
        )
        comp = f"  compile {systems[k].compile_s:5.1f} s" if systems[k].compile_s else ""
        vs = "" if k == lm else f"  {lm} speed-up {r:.2f}x (IQR {q1:.2f}-{q3:.2f})"
        m = f"  MFU {mfu:.1%}" if mfu else ""
        print(f"{k:16s} {med * 1e3:8.1f} ms/step {tokens / med:8.0f} tokens/s{m}{vs}{comp}{extra}")
    for title, pick in (
        ("eager", lambda k: not k.endswith(("+compile", "+ckpt"))),
        ("compiled", lambda k: k.endswith("+compile")),
    ):
        cands = [row for row in rows if row[0] != lm and pick(row[0])]
        if cands:
            f = max(cands, key=lambda row: row[2])
            print(f"{lm} / fastest {title} peer ({f[0]}): {f[3]:.2f}x (IQR {f[4]:.2f}-{f[5]:.2f})")
    if a.markdown:
        print(
            f"\n| system | ms/step | tokens/s | {lm} speed-up (IQR) | compile s | {mem_name} MiB (training adds) |"
            f"{' MFU |' if mfu_of(1.0) else ''}"
        )
        print("|---|---|---|---|---|---|" + ("---|" if mfu_of(1.0) else ""))
        for k, med, tps, r, q1, q3, cs, mem, mfu in rows:
            sp = "1" if k == lm else f"{r:.2f}x ({q1:.2f}-{q3:.2f})"
            m = f"{mem['peak'] / 2**20:.0f} ({(mem['peak'] - mem['import_and_build']) / 2**20:.0f})" if mem else "-"
            print(
                f"| {k} | {med * 1e3:.1f} | {tps:.0f} | {sp} | {f'{cs:.1f}' if cs else '-'} | {m} |"
                + (f" {mfu:.1%} |" if mfu else "")
            )


def mfu_function(shape: Args, device: str, dtype: Optional[torch.dtype]) -> Callable[[float], Optional[float]]:
    """tokens/s -> model FLOPs utilisation on CUDA (lmlab.analysis.flops_per_token, attention included,
    against lmlab.devices.device_peak_flops); None on CPU or an unknown GPU."""
    if not device.startswith("cuda"):
        return lambda tps: None
    from lmlab.analysis import flops_per_token
    from lmlab.devices import device_peak_flops

    peak = device_peak_flops(torch.device(device), dtype)
    per_token = flops_per_token(lmlab_config(shape), shape.context, training=True)
    return lambda tps: per_token * tps / peak if peak else None


if __name__ == "__main__":
    main()
