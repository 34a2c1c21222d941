"""Side-by-side training-step throughput: lmlab TransformerLM vs Hugging Face LlamaForCausalLM.

Same dims (d_model 256, 4 layers, 8 heads, context 256, vocab 4096, SwiGLU d_ff 704), same batch,
torch.optim.AdamW, fp32. Prints median tokens/s of several repeats and the ratio. Run:
    python bench/train_step_vs_hf.py [--batch 16] [--steps 10] [--repeats 3]
"""

import argparse
import platform
import statistics
import time

import torch

from lmlab.config import ModelConfig
from lmlab.model import TransformerLM, lm_loss


def hf_model(cfg: ModelConfig):
    from transformers import LlamaConfig, LlamaForCausalLM

    hc = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                     num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                     num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.context_length,
                     tie_word_embeddings=cfg.tie_embeddings, attn_implementation="sdpa")
    return LlamaForCausalLM(hc)


def time_steps(step, steps, repeats):
    step()  # warm-up
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        rates.append(time.perf_counter() - t0)
    return statistics.median(rates) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = ModelConfig()
    B, T = args.batch, cfg.context_length
    x = torch.randint(0, cfg.vocab_size, (B, T + 1))
    ours = TransformerLM(cfg)
    theirs = hf_model(cfg)
    if args.compile:
        ours = torch.compile(ours)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    opt_t = torch.optim.AdamW(theirs.parameters(), lr=1e-3)

    def step_ours():
        loss, _ = lm_loss(ours(x[:, :-1]), x[:, 1:])
        loss.backward()
        opt_o.step()
        opt_o.zero_grad(set_to_none=True)

    def step_theirs():
        out = theirs(input_ids=x[:, :-1], labels=x[:, :-1])
        out.loss.backward()
        opt_t.step()
        opt_t.zero_grad(set_to_none=True)

    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    s_o = time_steps(step_ours, args.steps, args.repeats)
    s_t = time_steps(step_theirs, args.steps, args.repeats)
    print(f"lmlab : {B * T / s_o:8.0f} tokens/s  ({sum(p.numel() for p in ours.parameters()):,} params)")
    print(f"HF    : {B * T / s_t:8.0f} tokens/s  ({sum(p.numel() for p in theirs.parameters()):,} params)")
    print(f"ratio lmlab/HF: {s_t / s_o:.2f}x")


if __name__ == "__main__":
    main()
