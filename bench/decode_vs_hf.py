"""Side-by-side greedy KV-cache decoding: lmlab vs Hugging Face ``generate``, on the same weights.

A Hugging Face ``LlamaForCausalLM`` (d_model 256, 4 layers, 8 query heads, 4 KV heads, SwiGLU d_ff 704,
vocab 4096, tied embeddings, RMSNorm eps 1e-5, RoPE theta 10000) is built with HF's own init and its
weights are copied into the lmlab demo shape: q/k/v_proj -> ``attn.qkv`` rows [q | k | v], o_proj ->
``attn.out``, gate/up_proj -> ``mlp.w_in`` rows [gate | up], down_proj -> ``mlp.w_out``; RoPE's
half-split pairing is HF's rotate_half. The script checks that the two forwards agree (largest logit
difference at most 1e-4, else it stops), then times greedy generation of --new-tokens tokens after
prompts of --prompt-len tokens at each --batch, fp32: lmlab through ``lmlab.generate.stream_batch``, HF
through ``model.generate`` (default dynamic cache, sdpa attention) with a streamer that timestamps each
step. Prefill = time to the first new token;
decode = the remaining new_tokens - 1 steps. The two run alternately (lmlab, HF, lmlab, ...) after a
warm-up of each; medians of --repeats runs, and the median of the per-pair ratios. Run:

    python bench/decode_vs_hf.py [--batch 1 8] [--prompt-len 32] [--new-tokens 64] [--repeats 9] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lmlab.bench import describe_machine, random_prompts, stamps_of, time_stream
from lmlab.config import ModelConfig
from lmlab.generate import decode_layout, decode_layout_kind, stream_batch
from lmlab.model import TransformerLM


def demo_config() -> ModelConfig:
    return ModelConfig(vocab_size=4096, context_length=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                       tie_embeddings=True, norm_eps=1e-5, rope_theta=10000.0)


def build_pair(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = demo_config()
    hc = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                     num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                     num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                     max_position_embeddings=cfg.context_length, rms_norm_eps=cfg.norm_eps,
                     tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(hc).eval()
    ours = TransformerLM(cfg).eval()
    ours.load_state_dict(llama_to_lmlab(hf.state_dict(), cfg))
    return ours, hf, cfg


def llama_to_lmlab(sd: dict, cfg: ModelConfig) -> dict:
    """A Hugging Face Llama state dict in lmlab's names and fused layouts."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "final_norm.weight": sd["model.norm.weight"],
           "lm_head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"])}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        out[f"blocks.{i}.attn.out.weight"] = sd[p + "self_attn.o_proj.weight"]
        out[f"blocks.{i}.mlp.w_in.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        out[f"blocks.{i}.mlp.w_out.weight"] = sd[p + "mlp.down_proj.weight"]
        out[f"blocks.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        out[f"blocks.{i}.mlp_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
    return out


class StepClock:
    """A ``generate`` streamer recording when each new token is ready (its first put() is the prompt)."""

    def __init__(self):
        self.stamps: list[float] = []
        self.prompt_seen = False

    def put(self, value):
        if self.prompt_seen:
            self.stamps.append(time.perf_counter())
        self.prompt_seen = True

    def end(self):
        pass


def hf_stamps(hf, prompts: list[list[int]], new_tokens: int) -> list[float]:
    """Greedy HF ``generate`` of exactly new_tokens tokens; the time each one was ready."""
    ids = torch.tensor(prompts)
    clock = StepClock()
    with torch.inference_mode():
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, streamer=clock)
    return clock.stamps


def median_of(results: list[dict]) -> dict:
    """Medians over single-repeat :func:`lmlab.bench.time_stream` results."""
    keys = ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_s_per_step")
    return {k: statistics.median(r[k] for r in results) for k in keys}


def main() -> None:
    from lmlab.cli import POSITIVE, _int_at_least, _Parser

    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=POSITIVE, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-len", type=POSITIVE, default=32)
    ap.add_argument("--new-tokens", type=_int_at_least(2), default=64)
    ap.add_argument("--repeats", type=POSITIVE, default=9)
    ap.add_argument("--threads", type=POSITIVE, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    try:
        import transformers
    except ImportError:
        ap.error("needs Hugging Face transformers: pip install -e '.[hf]'")
    cfg = demo_config()
    length = args.prompt_len + args.new_tokens - 1
    if length > cfg.context_length:
        ap.error(f"--prompt-len {args.prompt_len} + --new-tokens {args.new_tokens} - 1 exceeds the context of "
                 f"{cfg.context_length}")
    from lmlab.bench import check_decode_memory
    from lmlab.config import ConfigError

    try:  # two models (lmlab, HF) with a KV cache each, at the largest batch
        check_decode_memory(cfg, torch.device("cpu"), max(args.batch), length, models=2)
    except ConfigError as exc:
        ap.error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)

    ours, hf, cfg = build_pair()
    x = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        diff = (ours(x) - hf(x).logits).abs().max().item()
    if diff > 1e-4:  # the same weights must give the same logits, else the timing compares different models
        raise SystemExit(f"lmlab and HF logits differ by {diff:.2e} (> 1e-4): the weight mapping is wrong")
    print(f"machine: {describe_machine()}, transformers {transformers.__version__}")
    print(f"model: d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads, "
          f"vocab {cfg.vocab_size}, {ours.num_params():,} params, fp32; max |logit difference| lmlab vs HF "
          f"{diff:.2e}")
    print(f"greedy, prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, median of {args.repeats}")
    print(f"{'batch':>5}  {'':6} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/step':>8}")
    for B in args.batch:
        prompts = random_prompts(cfg.vocab_size, B, args.prompt_len, seed=B)
        with torch.inference_mode():
            same = [list(r) for r in hf.generate(torch.tensor(prompts), attention_mask=torch.ones(B, args.prompt_len,
                    dtype=torch.long), max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                    pad_token_id=0)[:, args.prompt_len:].tolist()]
        mine = [[] for _ in range(B)]
        for nxt in stream_batch(ours, prompts, args.new_tokens, temperature=0.0):
            for r, t in enumerate(nxt.tolist()):
                mine[r].append(t)
        agree = sum(a == b for ra, rb in zip(mine, same) for a, b in zip(ra, rb)) / (B * args.new_tokens)
        run_o = lambda: stamps_of(stream_batch(ours, prompts, args.new_tokens, temperature=0.0))  # noqa: E731
        run_h = lambda: hf_stamps(hf, prompts, args.new_tokens)  # noqa: E731
        with decode_layout(ours, B):  # the once-per-generate weight re-layout, kept out of the timed prefill
            # interleaved: lmlab, HF, lmlab, HF, ... so that a slower minute of the machine hits both
            pairs = [(time_stream(run_o, B, args.prompt_len, args.new_tokens, 1, warmup=int(i == 0)),
                      time_stream(run_h, B, args.prompt_len, args.new_tokens, 1, warmup=int(i == 0)))
                     for i in range(args.repeats)]
        res_o, res_h = (median_of([p[j] for p in pairs]) for j in (0, 1))
        ratios = [p[0]["decode_tokens_per_s"] / p[1]["decode_tokens_per_s"] for p in pairs]
        print(f"{B:>5}  lmlab decode weight layout: {decode_layout_kind(ours, B)}")
        for name, r in (("lmlab", res_o), ("HF", res_h)):
            print(f"{B:>5}  {name:6} {r['prefill_tokens_per_s']:>14,.0f} {r['decode_tokens_per_s']:>13,.0f} "
                  f"{r['decode_s_per_step'] * 1e3:>8.2f}")
        print(f"{B:>5}  ratio lmlab/HF: prefill {res_o['prefill_tokens_per_s'] / res_h['prefill_tokens_per_s']:.2f}x, "
              f"decode {res_o['decode_tokens_per_s'] / res_h['decode_tokens_per_s']:.2f}x (median of the {len(ratios)} "
              f"interleaved pairs' ratios {statistics.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}); "
              f"greedy tokens identical: {agree:.1%}")


if __name__ == "__main__":
    main()
