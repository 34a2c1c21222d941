"""Side-by-side greedy KV-cache generation, end to end: lmlab vs Hugging Face ``generate``, same weights.

A Hugging Face ``LlamaForCausalLM`` (d_model 256, 4 layers, 8 query heads, 4 KV heads, SwiGLU d_ff 704,
vocab 4096, tied embeddings, RMSNorm eps 1e-5, RoPE theta 10000) is built with HF's own init and its
weights are copied into the lmlab demo shape: q/k/v_proj -> ``attn.qkv`` rows [q | k | v], o_proj ->
``attn.out``, gate/up_proj -> ``mlp.w_in`` rows [gate | up], down_proj -> ``mlp.w_out``; RoPE's
half-split pairing is HF's rotate_half. The script checks that the two forwards agree (largest logit
difference at most 1e-4, else it stops) and that greedy generation gives the same tokens, then times
what a user calls, greedy, in --dtype (fp32 by default; bf16: both models' weights and caches cast to
bfloat16 after the fp32 check), --new-tokens tokens after prompts of --prompt-len tokens at each --batch:

- ``lmlab``: ``lmlab.generate.stream_batch`` consumed to the end, whole call timed (prefill, decode
  steps, and the check that the cached decode copies of the weights are current);
- ``lmlab cold``: the same call after ``release_decode_copies`` (so it also pays the weight re-layout,
  as the first call on a model or the first after a training step does);
- ``lmlab compiled``: the same call with ``compile=True`` (the compiled decode step over the preallocated
  cache, :mod:`lmlab.kernels.compiled_decode`), after one untimed call that compiles it (its time is
  printed as ``compile``: what the first such call in a process pays);
- ``HF``: ``model.generate`` (default dynamic cache, sdpa attention, a streamer that timestamps each
  new token), whole call timed;
- ``weight-read floor``: the time to read every weight matrix a decode step multiplies by, once
  (:func:`read_floor`), meant as the least a decode step in that dtype can take; HF's step over it bounds
  what any decode loop could gain over HF's (at batch 1, where a step is memory-bound). It is only as
  good as ``sum()``'s read rate: on the 2-core Xeon of family 6 model 207 a one-thread fp32 sum reads
  slower than the one-row products do, and the "floor" came out above lmlab's compiled step
  (docs/benchmarks.md). In bf16 the sum also converts each element.

``--model gpt2`` does the same for GPT-2 small (124M, HF's ``GPT2LMHeadModel`` with its own init,
imported by lmlab's own ``hf_to_lmlab``) instead of the demo shape.

Equalised and checked: the same weights (fp32 logits within 1e-4), the same greedy tokens (in bf16 the
share of positions where they agree is printed: the two models round differently, so a near tie can go
either way), the same precision for both, SDPA attention in HF, the same prompts, the same threads.
Prefill = call start to the first new token; decode = the remaining new_tokens - 1 steps. The four run in
rotated order in each round (so a slow minute of the machine hits all); figures are medians over --repeats
rounds, ratios the median of the per-round ratios with their IQR. Run:

    python bench/decode_vs_hf.py [--model demo|gpt2] [--dtype fp32|bf16] [--batch 1 8] [--threads 1 2]
        [--prompt-len 32] [--new-tokens 64] [--repeats 9] [--markdown FILE]

``--markdown FILE`` writes the tables as a page (dated, machine, threads, load average) with
``<!-- bench:decode_vs_hf -->`` markers; ``python bench/readme_tables.py`` copies it into the README.
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from pathlib import Path

import torch

from lmlab.bench import describe_machine, random_prompts, stamps_of
from lmlab.config import ModelConfig
from lmlab.generate import stream_batch
from lmlab.kernels.decode_layout import decode_layout_kind, release_decode_copies
from lmlab.model import TransformerLM


def demo_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=4096,
        context_length=256,
        d_model=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=4,
        tie_embeddings=True,
        norm_eps=1e-5,
        rope_theta=10000.0,
    )


def build_pair(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = demo_config()
    hc = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.context_length,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(hc).eval()
    ours = TransformerLM(cfg).eval()
    ours.load_state_dict(llama_to_lmlab(hf.state_dict(), cfg))
    return ours, hf, cfg


def build_gpt2_pair(seed: int = 0):
    """GPT-2 small (124M: d_model 768, 12 layers, 12 heads, vocab 50257, context 1024, tied), HF's own init,
    carried into lmlab through lmlab's own importer (``lmlab.interop.hf.hf_to_lmlab`` on a saved folder)."""
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel

    from lmlab.interop.hf import hf_to_lmlab

    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa")).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours, cfg, _, _ = hf_to_lmlab(tmp)
    return ours, hf, cfg


def read_floor(model, repeats: int = 7) -> float:
    """Seconds to read every weight matrix a decode step multiplies by (each ``nn.Linear``'s weight and the
    LM head; a tied table once) one time, as a sum over each (the least work that touches every byte),
    median of ``repeats`` passes after one: meant as a lower bound of any batch-1 decode step in the
    weights' dtype, lmlab's or HF's, since each step reads every weight; not one where ``sum()`` reads
    slower than a one-row product (see the module docstring)."""
    mats = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    mats[id(model.lm_head.weight)] = model.lm_head.weight  # the tied embedding's table when tied
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t = time.perf_counter()
            for w in mats.values():
                w.sum()
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def llama_to_lmlab(sd: dict, cfg: ModelConfig) -> dict:
    """A Hugging Face Llama state dict in lmlab's names and fused layouts."""
    out = {
        "embed.weight": sd["model.embed_tokens.weight"],
        "final_norm.weight": sd["model.norm.weight"],
        "lm_head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"]),
    }
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
        hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=clock,
        )
    return clock.stamps


def timed(run) -> tuple[float, float, float]:
    """(prefill s, decode s, whole call s) of ``run()``, which returns each new token's time stamp."""
    t0 = time.perf_counter()
    stamps = run()
    t1 = time.perf_counter()
    return stamps[0] - t0, stamps[-1] - stamps[0], t1 - t0


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def bench_batch(ours, hf, cfg, B: int, args) -> dict:
    """Check equal greedy tokens, then time lmlab (warm), lmlab cold and HF in rotated rounds."""
    prompts = random_prompts(cfg.vocab_size, B, args.prompt_len, seed=B)
    with torch.inference_mode():
        same = hf.generate(
            torch.tensor(prompts),
            attention_mask=torch.ones(B, args.prompt_len, dtype=torch.long),
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            pad_token_id=0,
        )[:, args.prompt_len :].tolist()
    mine = torch.stack(list(stream_batch(ours, prompts, args.new_tokens, temperature=0.0)), 1).tolist()
    agree = sum(a == b for ra, rb in zip(mine, same) for a, b in zip(ra, rb)) / (B * args.new_tokens)

    def lmlab_call(compile: bool = False):
        return stamps_of(stream_batch(ours, prompts, args.new_tokens, temperature=0.0, compile=compile))

    t0 = time.perf_counter()
    compiled = torch.stack(list(stream_batch(ours, prompts, args.new_tokens, temperature=0.0, compile=True)), 1)
    compile_s = time.perf_counter() - t0  # the first compiled call: it compiles the step for this batch size
    agree_compiled = sum(a == b for ra, rb in zip(compiled.tolist(), same) for a, b in zip(ra, rb)) / (
        B * args.new_tokens
    )
    runs = {
        "lmlab": lmlab_call,
        "lmlab cold": lmlab_call,
        "lmlab compiled": lambda: lmlab_call(compile=True),
        "HF": lambda: hf_stamps(hf, prompts, args.new_tokens),
    }
    names = list(runs)
    timed(lmlab_call), timed(runs["lmlab compiled"]), timed(runs["HF"])  # warm-up
    times = {name: [] for name in names}
    for r in range(args.repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if name == "lmlab cold":
                release_decode_copies(ours)  # not timed: the call then remakes the copies
            times[name].append(timed(runs[name]))
    out = {
        "batch": B,
        "agree": min(agree, agree_compiled),
        "compile_s": compile_s,
        "layout": decode_layout_kind(ours, B),
        "compiled_layout": decode_layout_kind(ours, B, compiled=True),
        "systems": {},
        "floor_ms": read_floor(ours) * 1e3,
    }
    for name in names:
        pre, dec, call = (statistics.median(t[j] for t in times[name]) for j in range(3))
        ratio = quartiles([h[2] / o[2] for h, o in zip(times["HF"], times[name])])
        out["systems"][name] = {
            "prefill_ms": pre * 1e3,
            "decode_ms_step": dec / (args.new_tokens - 1) * 1e3,
            "call_ms": call * 1e3,
            "tokens_s": B * args.new_tokens / call,
            "hf_over": ratio,
        }
    return out


def print_batch(res: dict, threads: int) -> list[str]:
    """Print one batch's results; return its markdown table rows."""
    B = res["batch"]
    print(
        f"batch {B}, {threads} thread(s): lmlab decode weight layout {res['layout']} (compiled: "
        f"{res['compiled_layout']}); greedy tokens identical "
        f"{res['agree']:.1%} (lmlab, lmlab compiled, HF); compiling the decode step took {res['compile_s']:.1f} s "
        "(the first compiled call for this batch size)"
    )
    print(
        f"  {'system':14} {'call ms':>9} {'tokens/s':>9} {'prefill ms':>11} {'ms/step':>8}  HF call / this call (IQR)"
    )
    rows = []
    for name, r in res["systems"].items():
        q1, med, q3 = r["hf_over"]
        vs = "" if name == "HF" else f"{med:.2f}x ({q1:.2f}-{q3:.2f})"
        print(
            f"  {name:14} {r['call_ms']:>9.1f} {r['tokens_s']:>9,.0f} {r['prefill_ms']:>11.2f} "
            f"{r['decode_ms_step']:>8.2f}  {vs}"
        )
        label = f"{name} ({res['compiled_layout']})" if name == "lmlab compiled" else name
        rows.append(
            f"| {threads} | {B} | {label} | {r['call_ms']:.1f} | {r['tokens_s']:,.0f} | {r['prefill_ms']:.2f} | "
            f"{r['decode_ms_step']:.2f} | {('**' + vs.replace(' (', '** (', 1)) if vs else '1 (reference)'} |"
        )
    hf_step = res["systems"]["HF"]["decode_ms_step"]
    print(
        f"  weight-read floor {res['floor_ms']:.2f} ms per step (every weight read once); HF's step / floor "
        f"{hf_step / res['floor_ms']:.2f}x"
    )
    rows.append(
        f"| {threads} | {B} | weight-read floor | | | | {res['floor_ms']:.2f} | HF's step / floor: "
        f"{hf_step / res['floor_ms']:.2f}x |"
    )
    rows.append(
        f"| {threads} | {B} | lmlab compiled, first call (compiles) | {res['compile_s'] * 1e3:,.0f} | | | | "
        "once per model in a process for batch 1, once more for larger batches |"
    )
    return rows


def main() -> None:
    import datetime
    import os

    from lmlab.cli_parser import POSITIVE, _int_at_least, _Parser

    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=POSITIVE, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-len", type=POSITIVE, default=32)
    ap.add_argument("--new-tokens", type=_int_at_least(2), default=64)
    ap.add_argument("--repeats", type=POSITIVE, default=9)
    ap.add_argument("--threads", type=POSITIVE, nargs="+", help="torch threads, one or more (default: torch's choice)")
    ap.add_argument("--markdown", metavar="FILE", help="also write the tables as a markdown page to FILE")
    ap.add_argument(
        "--model",
        choices=["demo", "gpt2"],
        default="demo",
        help="demo: the Llama-style demo shape (4M); gpt2: GPT-2 small (124M)",
    )
    ap.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default="fp32",
        help="weights and caches of both models (bf16: cast after the fp32 logit check)",
    )
    args = ap.parse_args()
    if args.markdown and not Path(args.markdown).resolve().parent.is_dir():
        ap.error(f"--markdown {args.markdown}: its folder does not exist")
    try:
        import transformers
    except ImportError:
        ap.error("needs Hugging Face transformers: pip install -e '.[hf]'")
    cfg = (
        demo_config()
        if args.model == "demo"
        else ModelConfig(vocab_size=50257, context_length=1024, d_model=768, n_layers=12, n_heads=12)
    )
    length = args.prompt_len + args.new_tokens - 1
    if length > cfg.context_length:
        ap.error(
            f"--prompt-len {args.prompt_len} + --new-tokens {args.new_tokens} - 1 exceeds the context of "
            f"{cfg.context_length}"
        )
    from lmlab.bench import check_decode_memory
    from lmlab.config import ConfigError

    try:  # two models (lmlab, HF) with a KV cache each, at the largest batch
        check_decode_memory(cfg, torch.device("cpu"), max(args.batch), length, models=2)
    except ConfigError as exc:
        ap.error(str(exc))

    ours, hf, cfg = build_pair() if args.model == "demo" else build_gpt2_pair()
    x = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        diff = (ours(x) - hf(x).logits).abs().max().item()
    if diff > 1e-4:  # the same weights must give the same logits, else the timing compares different models
        raise SystemExit(f"lmlab and HF logits differ by {diff:.2e} (> 1e-4): the weight mapping is wrong")
    if args.dtype == "bf16":  # both cast the same way after the mapping is checked in fp32
        ours.to(torch.bfloat16), hf.to(torch.bfloat16)
        with torch.inference_mode():
            diff_bf16 = (ours(x).float() - hf(x).logits.float()).abs().max().item()
    load0 = os.getloadavg()
    machine = re.sub(r" \(\d+ threads?\)", "", describe_machine())  # threads: per row
    head = [
        f"machine: {machine}, transformers {transformers.__version__}; load average "
        f"{' '.join(f'{v:.2f}' for v in load0)}",
        f"model: {args.model}, d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads / "
        f"{cfg.n_kv_heads} KV heads, "
        f"vocab {cfg.vocab_size}, {ours.num_params():,} params, {args.dtype}; max |logit difference| lmlab vs HF "
        f"{diff:.2e} in fp32" + (f", {diff_bf16:.2e} in bf16" if args.dtype == "bf16" else ""),
        f"equalised: same weights, {args.dtype} weights and caches in both, SDPA attention in HF, same prompts "
        f"and threads, greedy; whole calls timed (prompt {args.prompt_len} tokens, {args.new_tokens} new tokens), "
        f"{args.repeats} rotated rounds",
    ]
    print("\n".join(head))
    rows, agree = [], []
    for threads in args.threads or [torch.get_num_threads()]:
        torch.set_num_threads(threads)
        for B in args.batch:
            res = bench_batch(ours, hf, cfg, B, args)
            agree.append(res["agree"])
            rows += print_batch(res, threads)
    load1 = os.getloadavg()
    print(f"load average after {' '.join(f'{v:.2f}' for v in load1)}")
    if args.markdown:
        cmd = "python bench/decode_vs_hf.py " + " ".join(sys.argv[1:])
        block = "decode_vs_hf" + ("" if args.model == "demo" else f"_{args.model}")
        block += "" if args.dtype == "fp32" else f"_{args.dtype}"
        page = [
            "# Generation end to end: lmlab vs Hugging Face (generated by bench/decode_vs_hf.py)",
            "",
            f"`{cmd}`, {datetime.date.today().isoformat()}.",
            "",
            f"<!-- bench:{block} -->",
            f"{datetime.date.today().isoformat()}; {head[0]}, after {' '.join(f'{v:.2f}' for v in load1)}; "
            f"{head[1]}; {head[2]}; greedy tokens identical at {min(agree):.1%} of positions "
            "(the lowest of all batches).",
            "",
            "| threads | batch | system | ms per call | tokens/s (whole call) | prefill ms | ms per decode step "
            "| HF's call time / this one (IQR) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            f"<!-- /bench:{block} -->",
            "",
        ]
        Path(args.markdown).write_text("\n".join(page))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
