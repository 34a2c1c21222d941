"""Training throughput against peers, side by side in one run: lmlab's TransformerLM vs Hugging Face
``LlamaForCausalLM`` (same LLaMA recipe) and ``GPT2LMHeadModel`` (GPT-2 recipe), and lmlab's own GPT-2
preset shape against GPT-2. Same d_model / layers / heads / context / vocab / batch, torch.optim.AdamW.

Each (model, repeat) runs in its own subprocess, in interleaved order, so peak memory (max RSS on CPU,
``torch.cuda.max_memory_allocated`` on CUDA) is per model and background load hits all alike. Prints
median tokens/s, peak memory, MFU (CUDA, from lmlab.analysis) and ratios.

    python bench/train_vs_peers.py                       # CPU, fp32, d_model 256, 4 layers, batch 8
    python bench/train_vs_peers.py --device cuda --dtype bf16 --compile --d-model 768 --layers 12 \\
        --heads 12 --context 1024 --batch 16 --vocab 50304    # GPT-2-small size on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

KINDS = ("lmlab-llama", "hf-llama", "lmlab-gpt2", "hf-gpt2")


def lmlab_config(kind: str, a):
    from lmlab.config import ModelConfig

    common = dict(vocab_size=a.vocab, context_length=a.context, d_model=a.d_model, n_layers=a.layers,
                  n_heads=a.heads, tie_embeddings=True)
    if kind == "lmlab-gpt2":
        return ModelConfig(**common, norm_type="layernorm", norm_bias=True, bias="all", activation="gelu_tanh",
                           position="learned")
    return ModelConfig(**common)


def build(kind: str, a):
    if kind.startswith("lmlab"):
        from lmlab.model import TransformerLM

        return TransformerLM(lmlab_config(kind, a))
    cfg = lmlab_config("lmlab-llama", a)
    if kind == "hf-llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(
            vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=a.layers,
            num_attention_heads=a.heads, num_key_value_heads=a.heads, max_position_embeddings=a.context,
            tie_word_embeddings=True, attn_implementation="sdpa"))
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.context, n_embd=a.d_model, n_layer=a.layers,
                                      n_head=a.heads, attn_implementation="sdpa"))


def measure(kind: str, a) -> dict:
    torch.manual_seed(0)
    device = torch.device(a.device)
    model = build(kind, a).to(device)
    if a.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x = torch.randint(0, a.vocab, (a.batch, a.context + 1), device=device)
    dtype = {"fp32": None, "bf16": torch.bfloat16}[a.dtype]
    from lmlab.model import lm_loss

    def step():
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            if kind.startswith("lmlab"):
                logits = model(x[:, :-1])
            else:
                logits = model(input_ids=x[:, :-1]).logits
        loss, _ = lm_loss(logits, x[:, 1:])  # the same fp32 cross-entropy for all
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    n_params = sum(p.numel() for p in (model._orig_mod if a.compile else model).parameters())
    return {"kind": kind, "tokens_per_s": a.batch * a.context * a.steps / dt, "peak_bytes": peak, "params": n_params}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--d-model", dest="d_model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one, a)))
        return
    kinds = a.kinds.split(",")
    results = {k: [] for k in kinds}
    argv = [x for x in sys.argv[1:]]
    for _ in range(a.repeats):
        for k in kinds:
            out = subprocess.run([sys.executable, __file__, *argv, "--one", k], capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONWARNINGS="ignore"))
            if out.returncode:
                sys.exit(out.stderr)
            results[k].append(json.loads(out.stdout.strip().splitlines()[-1]))
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else (platform.processor() or platform.machine())
    print(f"machine: {dev}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"{a.dtype}{' + compile' if a.compile else ''}; d_model {a.d_model}, {a.layers} layers, {a.heads} heads, "
          f"context {a.context}, vocab {a.vocab}, batch {a.batch}; median of {a.repeats} x {a.steps} steps")
    med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in results.items()}
    mem = {k: statistics.median(r["peak_bytes"] for r in v) for k, v in results.items()}
    mfu = {}
    if a.device.startswith("cuda"):
        from lmlab.analysis import flops_per_token
        from lmlab.train import device_peak_flops

        peak = device_peak_flops(torch.device(a.device), torch.bfloat16 if a.dtype == "bf16" else None)
        for k in kinds:
            cfg = lmlab_config("lmlab-gpt2" if "gpt2" in k else "lmlab-llama", a)
            mfu[k] = flops_per_token(cfg, a.context, training=True) * med[k] / peak if peak else None
    for k in kinds:
        extra = f"  MFU {mfu[k]:.1%}" if mfu.get(k) else ""
        print(f"{k:12s} {med[k]:10.0f} tokens/s  peak {mem[k] / 2**20:8.0f} MiB  {results[k][0]['params']:,} params{extra}")
    for ours, theirs in (("lmlab-llama", "hf-llama"), ("lmlab-gpt2", "hf-gpt2")):
        if ours in med and theirs in med:
            print(f"{ours} / {theirs}: {med[ours] / med[theirs]:.2f}x tokens/s, {mem[ours] / mem[theirs]:.2f}x peak memory")
    if "lmlab-llama" in med:
        peers = [med[k] for k in ("hf-llama", "hf-gpt2") if k in med]
        if peers:
            print(f"lmlab-llama / faster peer: {med['lmlab-llama'] / max(peers):.2f}x")


if __name__ == "__main__":
    main()
