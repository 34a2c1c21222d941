"""The shipped specs' gpu tiers on the machine at hand: their speed claims, their cost, and one sweep end to end.

Run on a machine with an NVIDIA GPU, from the repository root (the device check of issue 41):

    python bench/gpu_tiers.py --out OUT [--data data/shakespeare-bpe4096]

Three parts, each written to OUT as it finishes (gpu_tiers.md, gpu_tiers.json, timing-NAME.json):

1. **Speed claims** (specs with a ``timing:`` block: 02, 07, 08, 09). Each gpu tier's timing block runs
   as ``lmlab sweep`` runs it (:func:`lmlab.lab.runner.run_timing`: every variant's untrained model, in
   interleaved rounds, eager, in the tier's dtype), and its step_time / decode_time claims are judged
   by :func:`lmlab.lab.verdicts.judge_timing` (the median of per-round ratios with a sign-test
   interval). On CUDA the specs' ``device: cuda`` preconditions hold.
2. **Cost**. Every distinct model of every gpu tier (each variant at each scale) times ``--steps``
   training steps at the tier's batch, context and dtype after ``--warmup`` untimed ones (the timing
   block's step, random tokens, eager); tokens/s x the tier's planned tokens gives its GPU-hours, and
   the model FLOPs utilisation against ``--peak`` (dense bf16, FLOP/s) is shown. One round: a cost
   estimate, not a speed comparison.
3. **End to end**. One gpu tier (``--e2e``, default 09-parallel-block) as a sweep on ``--data`` cut to
   ``--e2e-steps`` steps, one rate and two seeds (``lmlab sweep`` then ``lmlab report``), so the tier's
   configuration is shown to train, evaluate and report on this device; its bits/byte say nothing
   about the claims.

``--device cpu`` with ``--specs`` and ``--batch`` runs the same code on a CPU (a check of this script,
not of the tiers)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmlab.analysis import flops_per_token  # noqa: E402
from lmlab.bench import describe_machine  # noqa: E402
from lmlab.config_files import load_mapping  # noqa: E402
from lmlab.lab.claims import TIMING_METRICS  # noqa: E402
from lmlab.lab.plan import _plan, trained_plans  # noqa: E402
from lmlab.lab.spec import builtin_specs, load_spec, parse_spec  # noqa: E402
from lmlab.param_counts import param_counts  # noqa: E402


def speed_claims(
    name: str, out: Path, device: str, log, pairs: int | None = None, batch: int | None = None
) -> list[dict]:
    """Part 1 for one spec: run its gpu tier's timing block on ``device``; one row per timing claim."""
    from lmlab.lab import runner
    from lmlab.lab.stats import NOT_TESTABLE
    from lmlab.lab.verdicts import judge_timing, kv_bound_check

    spec = load_spec(name, "gpu")
    if not spec.timing:
        return []
    if pairs or batch:  # a check of this script on a CPU
        spec = dataclasses.replace(
            spec,
            timing={
                **spec.timing,
                **({"pairs": pairs} if pairs else {}),
                **({"batch": batch, "decode_batch": batch} if batch else {}),
            },
        )
    plans = _plan(spec, None, 4096)  # untrained models: the data only sets the vocabulary
    plans = [dataclasses.replace(p, tc=dataclasses.replace(p.tc, device=device)) for p in plans]
    folder = out / f"timing-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timing = runner.run_timing(spec, plans, folder, log)
    (out / f"timing-{name}.json").write_text((folder / runner.TIMING_FILE).read_text())
    rows = []
    for e in spec.expect:
        if e.metric not in TIMING_METRICS:
            continue
        for scale, block in timing["scales"].items():
            c = judge_timing(e, block.get(TIMING_METRICS[e.metric], {}), spec.confidence)
            mech = kv_bound_check(e, block) if e.metric == "decode_time" else None
            c["mechanism"] = mech
            if mech is not None and not mech["holds"]:  # as lmlab report gates it (lmlab.lab.verdicts.gate)
                c["measured"], c["verdict"] = c["verdict"], NOT_TESTABLE
            c.update(
                spec=name,
                scale=scale or None,
                device=block["device"],
                dtype=block["dtype"],
                rounds=block["rounds"],
                seconds=time.perf_counter() - t0,
                a_s=statistics.median(block[TIMING_METRICS[e.metric]][e.a]),
                b_s=statistics.median(block[TIMING_METRICS[e.metric]][e.b]),
            )
            rows.append(c)
    return rows


def tier_cost(name: str, device: str, steps: int, warmup: int, batch: int | None, peak: float, log) -> dict:
    """Part 2 for one spec: seconds per step of each distinct model of its gpu tier; the tier's GPU-hours."""
    from lmlab.bench import step_timer
    from lmlab.devices import resolve_dtype

    spec = load_spec(name, "gpu")
    plans = trained_plans(_plan(spec, None, 4096))
    dev = torch.device(device)
    cells: dict = {}
    for p in plans:
        cells.setdefault((p.scale, p.variant), p)
    models = []
    for (scale, variant), p in cells.items():
        b = batch or p.tc.batch_size
        dtype = resolve_dtype(p.tc.dtype, dev)
        run, _ = step_timer(p.cfg, b, p.cfg.context_length, dtype, dev)
        timer = functools.partial(run, steps)
        for _ in range(max(warmup, 0)):  # allocation and kernel selection happen here
            timer()
        s = timer()
        tok_s = b * p.cfg.context_length / s
        fpt = flops_per_token(p.cfg, p.cfg.context_length)
        models.append(
            {
                "scale": scale,
                "variant": variant,
                "batch": b,
                "context": p.cfg.context_length,
                "step_s": s,
                "tokens_per_s": tok_s,
                "mfu": fpt * tok_s / peak,
                "non_embedding": param_counts(p.cfg)["non_embedding"],
            }
        )
        log(
            f"{name} {variant}{f' @{scale}' if scale else ''}: {1e3 * s:.1f} ms/step, {tok_s:,.0f} tokens/s, "
            f"MFU {100 * fpt * tok_s / peak:.1f}%"
        )
        del timer
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    rate = {(m["scale"], m["variant"]): m["tokens_per_s"] for m in models}
    seconds = sum(p.tokens / rate[(p.scale, p.variant)] for p in plans)
    tpp = min(p.tokens / param_counts(p.cfg)["non_embedding"] for p in plans)
    return {
        "spec": name,
        "runs": len(plans),
        "tokens": sum(p.tokens for p in plans),
        "gpu_hours": seconds / 3600,
        "min_tokens_per_param": tpp,
        "models": models,
    }


def end_to_end(name: str, out: Path, data: Path, device: str, steps: int, log, batch: int | None = None) -> dict:
    """Part 3: the gpu tier of ``name`` as a sweep cut to ``steps`` steps, one rate, seeds 1-2, then its report."""
    from lmlab.lab.report import write_report
    from lmlab.lab.results import read_results
    from lmlab.lab.runner import run_sweep

    raw = load_mapping(builtin_specs()[name])
    tier = raw["tiers"]["gpu"]
    lr = tier["tune"]["lr"][len(tier["tune"]["lr"]) // 2]  # the grid's middle
    tier.update(budget={"steps": steps}, tune=None, seeds=[1, 2], tune_seeds=None, max_epochs=None, timing=None)
    tier["train"] = {
        **tier.get("train", {}),
        "lr": lr,
        "device": device,
        "eval_interval": steps,
        "warmup_steps": steps // 10,
        "checkpoint_interval": steps,
        **({"batch_size": batch, "eval_windows": 2} if batch else {}),
    }
    raw.pop("timing", None)
    raw["expect"] = [e for e in raw.get("expect") or [] if "metric" not in e or e["metric"] == "val_bpb"]
    spec = parse_spec(raw, builtin_specs()[name], "gpu")
    folder = out / f"e2e-{name}"
    t0 = time.perf_counter()
    run_sweep(spec, folder, jobs=1, data_dir=data, log=log)
    pages = write_report(folder, folder / "report.md")
    rows = read_results(folder)
    return {
        "spec": name,
        "steps": steps,
        "seconds": time.perf_counter() - t0,
        "data": str(data),
        "runs": [{k: r.get(k) for k in ("run", "status", "val_bpb", "final_train_loss")} for r in rows],
        "report": [str(p) for p in pages],
    }


def markdown(machine: str, claims: list, costs: list, e2e: dict | None, args) -> str:
    L = [
        f"# The gpu tiers on {machine}",
        "",
        f"`python bench/gpu_tiers.py --out OUT --specs {' '.join(args.specs)}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
        "",
    ]
    if claims:
        L += [
            "## Speed claims (each tier's timing block: untrained models, interleaved rounds, eager)",
            "",
            "| spec | claim | scale | A / B median s | effect (time saved) | 95% interval | margin | mechanism "
            "| verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in claims:
            eff = "n/a" if c.get("effect") is None else f"{100 * c['effect']:+.1f}%"
            ci = "n/a" if c.get("lo") is None else f"[{100 * c['lo']:+.1f}%, {100 * c['hi']:+.1f}%]"
            margin = "" if c.get("by") is None else f"{100 * c['by']:g}%"
            m = c.get("mechanism")
            mech = "" if not m else f"{m['value'].split(' (')[0]} ({'holds' if m['holds'] else 'fails'})"
            L.append(
                f"| {c['spec']} | {c['text']} | {c['scale'] or ''} | {c['a_s'] * 1e3:.2f} / {c['b_s'] * 1e3:.2f} ms "
                f"| {eff} | {ci} | {margin} | {mech} | {c['verdict']} |"
            )
        L.append("")
    if costs:
        L += [
            "## Cost of each tier (one round per model: an estimate, not a comparison)",
            "",
            "| spec | runs | tokens | min tokens / non-emb param | ms/step (range) | MFU (range) | GPU-hours |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in costs:
            ms = [1e3 * m["step_s"] for m in c["models"]]
            mfu = [100 * m["mfu"] for m in c["models"]]
            L.append(
                f"| {c['spec']} | {c['runs']} | {c['tokens']:.3g} | {c['min_tokens_per_param']:.1f} | "
                f"{min(ms):.1f}-{max(ms):.1f} | {min(mfu):.1f}-{max(mfu):.1f}% | {c['gpu_hours']:.1f} |"
            )
        L += ["", f"All tiers: {sum(c['gpu_hours'] for c in costs):.0f} GPU-hours at these rates.", ""]
    if e2e:
        L += [
            f"## End to end: {e2e['spec']} gpu tier, {e2e['steps']} steps, on {e2e['data']}",
            "",
            f"{len(e2e['runs'])} runs in {e2e['seconds']:.0f} s: "
            + ", ".join(
                f"{r['run']} {r['status']} val bpb {r['val_bpb']:.4f}"
                for r in e2e["runs"]
                if r.get("val_bpb") is not None
            ),
            "",
        ]
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--specs", nargs="+", default=list(builtin_specs()))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--parts", default="claims,cost,e2e", help="comma-separated: claims, cost, e2e")
    ap.add_argument("--steps", type=int, default=5, help="timed training steps per model (cost)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls of the timer before (cost)")
    ap.add_argument("--batch", type=int, default=None, help="override every tier's batch (a CPU check)")
    ap.add_argument("--pairs", type=int, default=None, help="override the timing blocks' rounds (a CPU check)")
    ap.add_argument("--peak", type=float, default=989e12, help="dense bf16 peak FLOP/s for the MFU (H100/H200)")
    ap.add_argument("--data", type=Path, default=Path("data/shakespeare-bpe4096"), help="prepared folder (e2e)")
    ap.add_argument("--e2e", default="09-parallel-block")
    ap.add_argument("--e2e-steps", type=int, default=300)
    args = ap.parse_args()
    unknown = sorted(set(args.specs) - set(builtin_specs()))
    if unknown:
        ap.error(f"--specs: no shipped spec {unknown}; valid: {', '.join(builtin_specs())}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu for a check of this script)")
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    machine = describe_machine(args.device)
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"machine: {machine}")
    claims, costs, e2e = [], [], None

    def save():
        (args.out / "gpu_tiers.json").write_text(
            json.dumps({"machine": machine, "claims": claims, "costs": costs, "e2e": e2e}, indent=1, default=str)
        )
        (args.out / "gpu_tiers.md").write_text(markdown(machine, claims, costs, e2e, args))

    if "claims" in parts:
        for name in args.specs:
            claims += speed_claims(name, args.out, args.device, log, args.pairs, args.batch)
            save()
    if "cost" in parts:
        for name in args.specs:
            costs.append(tier_cost(name, args.device, args.steps, args.warmup, args.batch, args.peak, log))
            save()
    if "e2e" in parts:
        e2e = end_to_end(args.e2e, args.out, args.data, args.device, args.e2e_steps, log, args.batch)
        save()
    print(markdown(machine, claims, costs, e2e, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
