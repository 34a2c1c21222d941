"""The ablation lab's method: paired statistics and verdicts, tuned values, controls, timing block,
per-layer gradient norms, and a whole sweep + report (verdict table, plots, provenance, resume)."""

import json
import math
import shutil
import statistics

import pytest
import torch
import yaml

from lmlab.cli import main
from lmlab.config import ConfigError, ModelConfig
from lmlab.diagnostics import layer_grad_norms
from lmlab.lab import stats
from lmlab.lab.plan import plan_runs
from lmlab.lab.spec import parse_spec
from lmlab.lab.verdicts import analyze, select_tuned
from lmlab.model import TransformerLM
from lmlab.param_counts import param_counts

T975 = {2: 4.302652729911275, 1: 12.706204736174705}  # Student t 97.5% quantiles (tables), df 2 and 1


# --- statistics against hand computations ---------------------------------------------------------
def test_paired_difference_and_verdict_by_hand():
    base = {1: 2.50, 2: 2.52, 3: 2.48}
    var = {1: 2.46, 2: 2.49, 3: 2.43}  # differences -0.04, -0.03, -0.05
    d = stats.difference(base, var)
    assert d["method"] == "paired t" and d["n"] == 3
    assert d["mean"] == pytest.approx(-0.04)
    sd = math.sqrt(((0.0) ** 2 + 0.01**2 + 0.01**2) / 2)  # 0.01
    half = T975[2] * sd / math.sqrt(3)
    assert d["lo"] == pytest.approx(-0.04 - half) and d["hi"] == pytest.approx(-0.04 + half)
    # the claim "var better than base by 0.01": the improvement base - var has interval [0.04 -+ half]
    claim = stats.difference(var, base)
    assert stats.verdict("better", claim["lo"], claim["hi"], 0.01) == "agrees"  # 0.04 - 0.0248 > 0.01
    # remove a seed: 2 seeds, t(1) = 12.7 makes the interval contain 0.01
    two = stats.difference({1: 2.46, 2: 2.49}, {1: 2.50, 2: 2.52})
    half2 = T975[1] * statistics.stdev([0.04, 0.03]) / math.sqrt(2)
    assert two["lo"] == pytest.approx(0.035 - half2)
    assert stats.verdict("better", two["lo"], two["hi"], 0.01) == "inconclusive"
    # an interval wholly below the threshold disagrees; equivalence margins
    assert stats.verdict("better", -0.05, -0.01, 0.0) == "disagrees"
    assert stats.verdict("equal", -0.004, 0.006, 0.01) == "agrees"
    assert stats.verdict("equal", 0.02, 0.03, 0.01) == "disagrees"
    assert stats.verdict("equal", 0.005, 0.03, 0.01) == "inconclusive"
    assert stats.verdict("better", None, None, 0.0) == "inconclusive"
    # non-inferiority: "at most 0.02 worse" is a better-claim with margin -0.02
    assert stats.verdict("better", -0.015, 0.03, -0.02) == "agrees"
    assert stats.verdict("better", -0.03, 0.01, -0.02) == "inconclusive"
    assert stats.verdict("better", -0.08, -0.03, -0.02) == "disagrees"
    spec = _spec(expect=[{"better": "B", "than": "A", "by": -0.02}])
    assert spec.expect[0].by == -0.02 and "no worse than A by more than 0.02" in spec.expect[0].text


def test_seeds_to_settle_by_hand():
    """n = the smallest with (t(0.975, n-1) + t(0.8, n-1)) * sd / sqrt(n) <= the distance to the
    undecided region's edge (80% power). effect 0.05, sd 0.1, threshold 0 (distance 0.05):
    n = 33: (2.0369 + 0.8531) / 5.745 * 0.1 = 0.0503 > 0.05; n = 34: (2.0345 + 0.8528) / 5.831 * 0.1 =
    0.0495, so 34 (the normal rule (1.96 + 0.84)^2 / 0.5^2 gives 31.4); 'equal' measures to the nearer
    margin; the direction is where the effect lies from the boundary."""
    from lmlab.lab.stats import detectable, seeds_to_settle

    assert seeds_to_settle("better", 0.05, 0.1, 0.0) == (34, "agrees")
    assert seeds_to_settle("better", -0.05, 0.1, 0.0) == (34, "disagrees")
    assert seeds_to_settle("equal", 0.01, 0.02, 0.02) == (34, "agrees")  # 0.01 inside the margin
    assert seeds_to_settle("equal", 0.03, 0.02, 0.02) == (34, "disagrees")  # 0.01 outside it
    assert seeds_to_settle("better", 0.02, 0.1, 0.02) is None  # on the threshold
    assert seeds_to_settle("better", 1e-4, 0.5, 0.0) is None  # more than 1000 seeds
    assert seeds_to_settle("better", 0.05, None, 0.0) is None
    # centred on its boundary: with 6 seeds measured, distance 0.02 < t(0.75, 5) * 0.1 / sqrt(6) =
    # 0.7267 * 0.0408 = 0.0297: no direction; distance 0.05 > 0.0297: it leans
    assert seeds_to_settle("better", 0.02, 0.1, 0.0, n=6) is None
    assert seeds_to_settle("better", 0.05, 0.1, 0.0, n=6) == (34, "agrees")
    # the smallest effect 6 paired seeds of sd 0.1 detect at 80%: (2.5706 + 0.9195) * 0.1 / sqrt(6)
    assert detectable(0.1, 6) == pytest.approx((2.570582 + 0.919544) * 0.1 / math.sqrt(6), rel=1e-5)
    assert detectable(0.1, 1) is None and detectable(None, 6) is None


def test_inconclusive_verdict_says_where_it_leans_and_how_many_seeds_would_settle_it():
    from lmlab.lab.verdicts import judge

    e = _spec(expect=[{"better": "B", "than": "A"}]).expect[0]
    # effect 0.035 from 2 seeds (sd 0.00707): t(1) makes it inconclusive; at 80% power 4 seeds clear 0:
    # (t(0.975, 3) + t(0.8, 3)) * 0.00707 / 2 = (3.1824 + 0.9785) * 0.003536 = 0.0147 < 0.035, and 3:
    # (4.3027 + 1.0607) * 0.00707 / 1.732 = 0.0219 < 0.035 as well; 2: (12.706 + 1.3764) * 0.005 = 0.0704
    out = judge(e, {1: 2.46, 2: 2.49}, {1: 2.50, 2: 2.52}, 0.95, None)
    assert out["verdict"] == "inconclusive" and out["settle"] == [3, "agrees"]
    assert "leans agrees: about 3 paired seeds would decide it" in out["note"]
    decided = judge(e, {1: 2.46, 2: 2.49, 3: 2.43}, {1: 2.50, 2: 2.52, 3: 2.48}, 0.95, None)
    assert decided["verdict"] == "agrees" and "settle" not in decided
    # a null (both sides equal up to noise) leans nowhere
    null = judge(e, {1: 2.50, 2: 2.52, 3: 2.48}, {1: 2.51, 2: 2.50, 3: 2.49}, 0.95, None)
    assert null["verdict"] == "inconclusive" and null["settle"] is None and "leans nowhere" in null["note"]


def test_pooled_noise_for_single_seed_variants():
    groups = [[1.0, 1.2], [2.0, 2.1, 2.3]]
    sd, df = stats.pooled_sd(groups)
    assert df == 1 + 2
    assert sd == pytest.approx(math.sqrt((1 * 0.02 + 2 * statistics.variance([2.0, 2.1, 2.3])) / 3))
    d = stats.difference({1: 2.0}, {1: 1.9}, pooled=(0.01, 3))
    from scipy import stats as sst

    half = sst.t.ppf(0.975, 3) * 0.01 * math.sqrt(2)
    assert d["method"] == "pooled" and d["lo"] == pytest.approx(-0.1 - half) and d["hi"] == pytest.approx(-0.1 + half)
    assert stats.difference({1: 2.0}, {1: 1.9})["method"] == "none"


def test_median_interval_is_the_sign_test_interval():
    xs = list(range(1, 16))  # n = 15: the 95% interval is (x_(4), x_(12)), coverage 96.48%
    m = stats.median_interval(xs)
    assert m["median"] == 8 and (m["lo"], m["hi"]) == (4, 12)
    assert m["coverage"] == pytest.approx(1 - 2 * sum(math.comb(15, k) for k in range(4)) / 2**15)
    assert stats.median_interval([1.0, 2.0, 3.0])["lo"] is None  # too few for 95%


# --- tuned values, verdicts from rows --------------------------------------------------------------
def _rows(table):
    """table: {(variant, lr): [bpb per seed 1..n or None]} -> results rows."""
    rows = []
    for (variant, lr), vals in table.items():
        for seed, v in enumerate(vals, 1):
            rows.append(
                {
                    "run": f"{variant}-{lr}-s{seed}",
                    "variant": variant,
                    "seed": seed,
                    "tune": {"lr": lr},
                    "scale": None,
                    "val_bpb": v,
                    "status": "ok" if v is not None else "diverged",
                    "diverged": v is None,
                    "tokens": 1_000_000,
                    "non_embedding_params": 10_000,
                }
            )
    return rows


LENIENT = {
    "tuning": {"min_points": 2, "min_seeds": 1, "extend": 0, "window": 1},
    "judging": {"min_seeds": 2, "tokens_per_param": 0},
}  # the rules a test of other things sets aside


def _spec(**extra):
    raw = {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context_length": 32},
        "axes": {"grid": {"v": [{"label": "A", "activation": "silu"}, {"label": "B", "activation": "swiglu"}]}},
        "seeds": [1, 2, 3],
        "tune": {"lr": [1e-3, 3e-3, 1e-2]},
        **extra,
    }
    return parse_spec(raw)


def test_tune_picks_argmin_per_variant_and_flags_the_edge():
    spec = _spec(expect=[{"better": "B", "than": "A", "by": 0.01}], **LENIENT)
    rows = _rows(
        {
            ("A", 1e-3): [2.60, 2.62, 2.61],
            ("A", 3e-3): [2.50, 2.52, 2.48],
            ("A", 1e-2): [2.55, 2.56, 2.54],
            ("B", 1e-3): [2.70, 2.71, 2.69],
            ("B", 3e-3): [2.50, 2.51, 2.49],
            ("B", 1e-2): [2.46, 2.49, 2.43],
        }
    )
    sel = select_tuned(rows, spec)
    assert sel[(None, "A")]["tune"] == {"lr": 3e-3} and sel[(None, "A")]["edge"] == []
    assert sel[(None, "A")]["bracketed"]
    assert sel[(None, "B")]["tune"] == {"lr": 1e-2} and sel[(None, "B")]["edge"] == ["lr"]  # best at the end
    assert not sel[(None, "B")]["bracketed"] and "edge" in sel[(None, "B")]["why"]
    res = analyze(rows, spec)
    (claim,) = res["claims"]
    # paired at the chosen values: A@3e-3 minus B@1e-2 = 0.04, 0.03, 0.05: the interval agrees, but B's
    # rate is not bracketed, so there is no verdict
    assert claim["effect"] == pytest.approx(0.04) and claim["measured"] == "agrees"
    assert claim["verdict"] == "rate not bracketed" and "B: best at lr=0.01" in claim["gate"]
    # a seed diverging at the best value makes that cell unstable: the next best is chosen
    rows2 = _rows({("A", 1e-3): [2.6] * 3, ("A", 3e-3): [2.5, None, 2.5], ("A", 1e-2): [2.55] * 3})
    assert select_tuned(rows2, spec)[(None, "A")]["tune"] == {"lr": 1e-2}
    # a variant diverging everywhere has no rate: no verdict, though the divergence alone would agree
    rows3 = _rows({("A", 3e-3): [None, None, None], ("B", 3e-3): [2.5, 2.5, 2.5]})
    (c3,) = analyze(rows3, spec)["claims"]
    assert c3["measured"] == "agrees" and c3["verdict"] == "rate not bracketed" and "diverged" in c3["note"]
    # without the bracket, a claim on 3 paired seeds under the default rules has too few seeds
    ok = _rows(
        {
            (v, lr): [2.6 + abs(math.log10(lr / 3e-3)) + (0.05 if v == "B" else 0) + 0.01 * k for k in range(3)]
            for v in "AB"
            for lr in (1e-3, 3e-3, 1e-2)
        }
    )
    (c4,) = analyze(ok, _spec(expect=[{"better": "A", "than": "B"}], tuning={"min_points": 3, "min_seeds": 3}))[
        "claims"
    ]
    assert c4["measured"] == "agrees" and c4["verdict"] == "too few seeds" and "3 paired seed(s)" in c4["gate"]


def test_lr_sensitivity_around_each_variant_own_optimum_by_hand():
    """Wortsman et al. 2023 eq. 1 over the window of grid steps each side of each variant's own chosen
    value, per seed: mean of min(bpb, bpb_0) there minus the bpb at the chosen value; a diverged run
    counts as bpb_0 (the untrained model: first loss x tokens/byte / ln 2)."""
    grid = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    spec = _spec(
        tune={"lr": grid},
        tolerated_within=0.05,
        expect=[{"better": "B", "than": "A", "metric": "lr_sensitivity", "by": 0.1}],
        tuning={"min_points": 5, "min_seeds": 2, "extend": 0, "window": 1},
        judging={"min_seeds": 2, "tokens_per_param": 0},
    )
    A = {1e-3: [2.90, 2.92], 2e-3: [2.60, 2.70], 4e-3: [2.50, 2.52], 8e-3: [None, 9.0], 1.6e-2: [None, None]}
    B = {1e-3: [2.70, 2.72], 2e-3: [2.55, 2.57], 4e-3: [2.50, 2.50], 8e-3: [2.52, 2.56], 1.6e-2: [2.9, 2.8]}
    rows = _rows({**{("A", k): v for k, v in A.items()}, **{("B", k): v for k, v in B.items()}})
    for r in rows:  # untrained: 8 nats/token; validation split 1 token per 2 bytes
        r.update(first_train_loss=8.0, val_tokens=100, val_bytes=200)
    l0 = 8.0 * 0.5 / math.log(2)  # 5.7708 bits/byte
    res = analyze(rows, spec)
    sel = {s["variant"]: s for s in res["selected"]}
    assert sel["A"]["tune"] == {"lr": 4e-3} and sel["B"]["tune"] == {"lr": 4e-3}
    # A's cell at 8e-3 has a diverged seed (unstable) but lies in the window: it counts as l0 / 9.0 -> l0
    a1 = (2.60 + l0) / 2 - 2.50
    a2 = (2.70 + l0) / 2 - 2.52
    b1, b2 = (2.55 + 2.52) / 2 - 2.50, (2.57 + 2.56) / 2 - 2.50
    assert sel["A"]["lr_sensitivity"] == pytest.approx((a1 + a2) / 2)
    assert sel["B"]["lr_sensitivity"] == pytest.approx((b1 + b2) / 2)
    # tolerated: means within 0.05 of the best (A: 2.51 -> only 4e-3; B: 2.50 -> 8e-3 at 2.54 too)
    assert sel["A"]["tolerated"] == [{"lr": 4e-3}]
    assert sorted(t["lr"] for t in sel["B"]["tolerated"]) == [4e-3, 8e-3]
    (claim,) = res["claims"]
    assert claim["metric"] == "lr_sensitivity" and claim["n"] == 2 and claim["method"] == "paired t"
    assert claim["effect"] == pytest.approx(((a1 - b1) + (a2 - b2)) / 2)
    # a window of 3 steps each side leaves the grid: no sensitivity, and the claim has no verdict
    wide = parse_spec({**spec.raw, "tuning": {**spec.raw["tuning"], "window": 3}})
    (c2,) = analyze(rows, wide)["claims"]
    assert c2["verdict"] == "rate not bracketed" and "leaves the grid" in c2["gate"]
    with pytest.raises(ConfigError, match="lr_sensitivity needs a tuned grid"):
        parse_spec({**spec.raw, "tune": None})
    with pytest.raises(ConfigError, match="tolerated_within"):
        _spec(tolerated_within=-1)


def test_spec_refuses_bad_expectations_and_controls():
    with pytest.raises(ConfigError, match="no variant 'C'"):
        _spec(expect=[{"better": "C"}])
    with pytest.raises(ConfigError, match="needs within > 0"):
        _spec(expect=[{"equal": ["A", "B"]}])
    with pytest.raises(ConfigError, match="needs a 'timing:' block"):
        _spec(expect=[{"better": "B", "metric": "step_time"}])
    with pytest.raises(ConfigError, match="baseline='Z' is not a variant"):
        _spec(baseline="Z")
    with pytest.raises(ConfigError, match="match.solve='d_head'"):
        _spec(match={"hold": "params", "solve": "d_head"})
    with pytest.raises(ConfigError, match="pairs=5 must be >= 15"):
        _spec(timing={"pairs": 5})
    with pytest.raises(ConfigError, match="both tuned and set by a variant"):
        _spec(tune={"activation": ["gelu", "relu"]})


# --- controls ----------------------------------------------------------------------------------
def test_match_non_embedding_params_across_gated_and_ratios(byte_data):
    raw = {
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "context_length": 32},
        "axes": {
            "zip": [
                {"label": "GELU x4", "activation": "gelu", "ffn_ratio": 4},
                {"label": "SwiGLU", "activation": "swiglu"},
                {"label": "ReGLU", "activation": "reglu", "ffn_ratio": 1},
                {"label": "GELU x1", "activation": "gelu", "ffn_ratio": 1},
                {"label": "GELU x16", "activation": "gelu", "ffn_ratio": 16},
            ]
        },
        "match": {"hold": "non_embedding_params", "solve": "d_ff", "multiple": 1},
        "budget": {"steps": 5},
    }
    plans = plan_runs(parse_spec(raw), byte_data)
    target = param_counts(plans[0].cfg)["non_embedding"]
    for p in plans:
        n = param_counts(p.cfg)["non_embedding"]
        assert abs(n / target - 1) <= 0.02, (p.variant, n, target)
        # the count equals the instantiated model's (what `lmlab analyze` reports)
        assert TransformerLM(p.cfg).num_params(non_embedding=True) == n
    swiglu = next(p for p in plans if p.variant == "SwiGLU")
    assert swiglu.cfg.d_ff == round(2 / 3 * 4 * 64)  # the 2/3 rule, found by the solver (multiple 1)
    # solving d_model keeps head_dim and the KV group size
    raw2 = {
        "model": {"d_model": 128, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4, "context_length": 32},
        "axes": {"grid": {"n_layers": [2, 8]}},
        "match": {"hold": "non_embedding_params", "solve": "d_model"},
        "budget": {"steps": 5},
    }
    deep = plan_runs(parse_spec(raw2), byte_data)[-1]
    assert deep.cfg.head_dim == 16 and deep.cfg.n_heads // deep.cfg.n_kv_heads == 2
    assert deep.cfg.d_model == 64 and deep.solved == {"d_model": 64, "n_heads": 4, "n_kv_heads": 2}
    # an unreachable tolerance is refused, naming the variant and the target
    raw3 = {**raw, "match": {"hold": "non_embedding_params", "solve": "d_ff", "multiple": 512}}
    with pytest.raises(ConfigError, match="off the target"):
        plan_runs(parse_spec(raw3), byte_data)


# --- timing block ------------------------------------------------------------------------------
def test_timing_block_ratios():
    from lmlab.lab.timing import summarize_ratio, time_variants

    small = ModelConfig(vocab_size=64, context_length=32, d_model=64, n_layers=2, n_heads=2)
    cfgs = {"a": small, "b": small, "deep": ModelConfig(**{**small.to_dict(), "n_layers": 4})}
    res = time_variants(cfgs, batch=4, pairs=21, steps=5, threads=1, decode=True, decode_batch=2)
    assert all(len(v) == 21 for v in res["step_s"].values()) and all(len(v) == 21 for v in res["decode_s"].values())
    assert all(t > 0 for v in res["step_s"].values() for t in v)
    # no timed assertion (a loaded machine moves any bound): the ratio summary by hand instead, the
    # median of the per-round ratios b / a (rounds paired) and its sign-test interval
    ratios = [1.1, 1.2, 1.3, 1.1, 1.6, 1.2, 1.4, 1.0, 1.2]
    base = [1.0, 2.0, 1.0, 4.0, 1.0, 3.0, 1.0, 2.0, 1.0]
    r = summarize_ratio({"a": base, "b": [x * q for x, q in zip(base, ratios)]}, "a", "b")
    assert r["median"] == pytest.approx(1.2) and r["n"] == 9
    # 9 rounds, 95%: the 2nd and 8th order statistics (binomial coverage 0.961)
    assert (r["lo"], r["hi"]) == pytest.approx((1.1, 1.4))


def test_decode_timing_past_the_training_context(monkeypatch):
    """timing.decode_context beyond context_length (a KV-bound decode) times the same architecture built
    for that context, decoding from half of it to all of it; learned positions are refused."""
    import lmlab.bench
    from lmlab.config import ConfigError
    from lmlab.lab.timing import _decode_timer

    seen = {}

    def fake(model, batch, prompt_len, new_tokens, **kw):
        seen.update(ctx=model.cfg.context_length, prompt=prompt_len, new=new_tokens, batch=batch)
        return {"decode_s_per_step": 1e-3}

    monkeypatch.setattr(lmlab.bench, "bench_decode", fake)
    cfg = ModelConfig(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=2)
    assert _decode_timer(cfg, 2, 96, torch.device("cpu"))() == 1e-3
    assert seen == {"ctx": 96, "prompt": 48, "new": 49, "batch": 2}
    # decode_steps: only the last steps of a full cache (the gpu tiers' 4k-8k contexts): prompt 96 - 8 + 1
    # = 89 tokens, then 8 new ones, the last at position 96
    assert _decode_timer(cfg, 2, 96, torch.device("cpu"), decode_steps=8)() == 1e-3
    assert seen == {"ctx": 96, "prompt": 89, "new": 8, "batch": 2}
    from lmlab.lab.spec_blocks import parse_timing

    assert parse_timing({"decode": True, "decode_steps": 64}, "s")["decode_steps"] == 64
    assert "decode_steps" not in parse_timing({"decode": True}, "s")  # stored timing keys stay as they were
    with pytest.raises(ConfigError, match="timing.decode_steps=0 must be an integer >= 1"):
        parse_timing({"decode": True, "decode_steps": 0}, "s")
    learned = ModelConfig(**{**cfg.to_dict(), "position": "learned"})
    with pytest.raises(ConfigError, match="decode_context=96 exceeds context_length=32"):
        _decode_timer(learned, 2, 96, torch.device("cpu"))
    _decode_timer(learned, 2, 32, torch.device("cpu"))  # within the table: fine


def test_decode_claims_are_judged_only_where_the_step_is_bound_by_its_cache(monkeypatch):
    """The mechanism of "a smaller KV cache decodes faster": the baseline's step must spend more than the
    claim's margin on what grows with the cache. The timing block times each model's decode step at the
    full cache and at a short one (same architecture, one-token prompt, 64 steps); the share is 1 -
    median(short) / median(full); at or below the margin the claim is not testable (an eager GPU step
    bound by kernel launches: 07's gpu tier measured 2% of KV reads)."""
    import lmlab.bench
    from lmlab.lab import stats
    from lmlab.lab.spec import load_spec
    from lmlab.lab.timing import time_variants
    from lmlab.lab.verdicts import gate, judge_timing, kv_bound_check

    calls = []

    def fake(model, batch, prompt_len, new_tokens, **kw):
        calls.append((model.cfg.context_length, prompt_len, new_tokens))
        # full cache 4 ms, short cache 3 ms: 25% of the step grows with the cache
        return {"decode_s_per_step": 3e-3 if prompt_len == 1 else 4e-3}

    monkeypatch.setattr(lmlab.bench, "bench_decode", fake)
    small = ModelConfig(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=2)
    res = time_variants(
        {"MHA": small, "MQA": ModelConfig(**{**small.to_dict(), "n_kv_heads": 1})},
        batch=2,
        pairs=3,
        steps=1,
        threads=1,
        decode=True,
        decode_batch=2,
        decode_context=96,
    )
    assert (96, 48, 49) in calls and (96, 1, 64) in calls  # half the context; the short cache, same model
    assert set(res["decode_short_s"]) == {"MHA", "MQA"} and res["decode_short_steps"] == 64
    spec = load_spec("07-gqa-mqa")
    e = next(x for x in spec.expect if x.metric == "decode_time" and x.a.startswith("MQA"))
    block = {"decode_s": {e.a: [2e-3] * 9, e.b: [4e-3] * 9}, "decode_short_s": {e.a: [2e-3] * 9, e.b: [3e-3] * 9}}
    check = kv_bound_check(e, block)  # margin 10% < 25%: holds
    assert check["holds"] and check["value"].startswith("25.0% of a step")
    c = gate(
        {**judge_timing(e, block["decode_s"], 0.95), "mechanism": check}, e, None, spec, {"rows": [], "selected": {}}
    )
    assert c["verdict"] == stats.AGREES and c["preconditions"] == [check]
    block["decode_short_s"][e.b] = [3.8e-3] * 9  # 5% of the step grows with the cache: below the 10% margin
    check = kv_bound_check(e, block)
    assert not check["holds"]
    c = gate(
        {**judge_timing(e, block["decode_s"], 0.95), "mechanism": check}, e, None, spec, {"rows": [], "selected": {}}
    )
    assert c["measured"] == stats.AGREES and c["verdict"] == stats.NOT_TESTABLE and "bound by its KV" in c["gate"]
    assert kv_bound_check(e, {"decode_s": block["decode_s"]}) is None  # older blocks: no check, as before


# --- per-layer gradient norms ----------------------------------------------------------------------
def test_init_grad_norms_are_the_step0_batch_gradients_of_a_fresh_model(byte_data):
    """lmlab.lab.init_grads: per block, the gradient norm of a model initialised with the seed, on the
    batch that seed's step 0 trains on, at each depth; checked against torch.autograd.grad by hand."""
    import dataclasses

    from lmlab.data.shards import TokenData
    from lmlab.lab.init_grads import init_grad_norms, top_to_bottom
    from lmlab.train import TrainConfig, global_batch_starts, windows_to_batch

    tokens = TokenData(byte_data).tokens("train")
    cfg = ModelConfig(vocab_size=260, d_model=32, n_layers=2, n_heads=2, context_length=16, norm_position="post")
    got = init_grad_norms(cfg, tokens, [1, 3], [5, 6], 3)
    assert sorted(got) == [1, 3] and [len(v) for v in got[3].values()] == [3, 3]
    torch.manual_seed(6)
    model = TransformerLM(dataclasses.replace(cfg, n_layers=3))
    x, y = windows_to_batch(tokens, global_batch_starts(len(tokens), 0, 3, TrainConfig(seed=6), 16), 16)
    loss, _ = model(x, targets=y)
    grads = torch.autograd.grad(loss, [p for b in model.blocks for p in b.parameters()])
    per_block, i = [], 0
    for b in model.blocks:
        n = len(list(b.parameters()))
        per_block.append(math.sqrt(sum(float((g * g).sum()) for g in grads[i : i + n])))
        i += n
    assert got[3][6] == pytest.approx(per_block, rel=1e-5)
    assert got[3][5] != got[3][6]  # another seed: another model and batch
    assert top_to_bottom(got)[3] == pytest.approx(statistics.median([got[3][s][-1] / got[3][s][0] for s in (5, 6)]))
    with pytest.raises(ValueError, match="fewer than one window"):
        init_grad_norms(cfg, tokens[:10], [1], [1], 1)
    with pytest.raises(ConfigError, match="init_grads.depths"):
        _spec(init_grads={"depths": [0]})
    with pytest.raises(ConfigError, match="must be a mapping with 'depths'"):
        _spec(init_grads={"layers": [4]})


def test_layer_grad_norms_equal_autograd_by_hand():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, context_length=8, d_model=16, n_layers=2, n_heads=2)
    model = TransformerLM(cfg)
    x = torch.randint(0, 50, (2, 8))
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), x.roll(-1, 1).reshape(-1))
    params = [list(b.parameters()) for b in model.blocks]
    grads = torch.autograd.grad(loss, [p for ps in params for p in ps], retain_graph=True)
    loss.backward()
    hand, i = [], 0
    for ps in params:
        gs = grads[i : i + len(ps)]
        i += len(ps)
        hand.append(math.sqrt(sum(float((g.double() ** 2).sum()) for g in gs)))
    got = layer_grad_norms(model)
    assert len(got) == 2 and got == pytest.approx(hand, rel=1e-5)
    assert got[0] != pytest.approx(got[1])  # per layer, not one total


# --- a whole sweep -------------------------------------------------------------------------------
BAR_SPEC = {
    "name": "bar",
    "claim": "SwiGLU beats SiLU at equal non-embedding parameters.",
    "model": {"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2},
    "train": {
        "batch_size": 4,
        "warmup_steps": 2,
        "log_interval": 2,
        "eval_interval": 6,
        "eval_windows": 4,
        "device": "cpu",
        "diag_interval": 6,
    },
    "axes": {
        "grid": {
            "ffn": [
                {"label": "SiLU", "activation": "silu", "d_ff": 128},
                {"label": "SwiGLU", "activation": "swiglu"},
            ]
        }
    },
    "baseline": "SiLU",
    "tune": {"lr": [3.0e-3, 1.0e-2]},
    "match": {"hold": "non_embedding_params", "solve": "d_ff", "multiple": 4},
    "expect": [
        {"better": "SwiGLU", "than": "SiLU"},
        {"equal": ["SwiGLU", "SiLU"], "within": "50%", "metric": "step_time"},
    ],
    "timing": {"batch": 4, "pairs": 15, "steps": 1},
    "init_grads": {"depths": [2, 3], "seeds": [1, 2], "batch": 2},
    "loss_by_position": True,
    "seeds": [1, 2, 3],
    "budget": {"steps": 12},
    **LENIENT,
}


def _verdict_table(md):
    lines = md.splitlines()
    start = lines.index("## Verdicts")
    return [line for line in lines[start:] if line.startswith("| ") and not line.startswith("| ---")][:3]


def test_sweep_report_verdicts_plots_provenance_and_resume(byte_data, tmp_path, monkeypatch):
    spec = {**BAR_SPEC, "data": str(byte_data)}
    path = tmp_path / "bar.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sweep"
    assert main(["sweep", str(path), "--out", str(out), "--jobs", "2"]) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 3 * 2 and all(r["status"] == "ok" for r in rows)
    swiglu = next(r for r in rows if r["variant"] == "SwiGLU")
    assert swiglu["solved"] == {"d_ff": 84} and swiglu["tune"]["lr"] in (3.0e-3, 1.0e-2)
    # per-layer gradient norms logged at step 1 (initialisation) and every diag_interval
    recs = [json.loads(x) for x in (out / "runs" / rows[0]["run"] / "metrics.jsonl").read_text().splitlines()]
    gn = [r for r in recs if "grad_norm_layers" in r]
    assert [r["step"] for r in gn] == [1, 6, 12] and all(len(r["grad_norm_layers"]) == 2 for r in gn)
    timing = json.loads((out / "timing.json").read_text())
    assert set(timing["scales"][""]["step_s"]) == {"SiLU", "SwiGLU"}
    assert len(swiglu["val_loss_by_position"]) == 32  # one mean loss per position of the context
    grads = json.loads((out / "init_grads.json").read_text())["variants"]
    assert set(grads) == {"SiLU", "SwiGLU"} and sorted(grads["SiLU"]) == ["2", "3"]
    assert [len(v) for v in grads["SwiGLU"]["3"].values()] == [3, 3]  # a norm per block, per seed
    prov = [json.loads(x) for x in (out / "provenance.jsonl").read_text().splitlines()]
    assert prov[0]["spec_sha256"] == __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    from lmlab.kernels.settings import default_kernels

    assert prov[0]["kernels"] == default_kernels().describe()  # the kernels every run's model used
    assert prov[0]["precision"] == "fp32"  # the sweep default

    assert main(["report", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert f"- **CPU kernels**: {default_kernels().describe()}." in md
    assert "grad clip 1, dtype fp32.\n" in md  # the sweep default: fp32, not compiled
    assert "- **Precision**: fp32.\n" in md
    assert md.startswith("# Ablation: bar\n")  # the spec's name, also when basins are drawn
    assert md.index("## Verdicts") < md.index("## Against the baseline") < md.index("## Setup and provenance")
    table = _verdict_table(md)
    assert len(table) == 3 and "SwiGLU better than SiLU" in table[1] and "step time" in table[2]
    verdicts = json.loads((out / "verdicts.json").read_text())
    bpb = verdicts["claims"][0]
    # the verdict follows from the numbers on the page: recompute the paired difference by hand
    chosen = {s["variant"]: s["tune"]["lr"] for s in verdicts["selected"]}
    vals = {
        v: {r["seed"]: r["val_bpb"] for r in rows if r["variant"] == v and r["tune"]["lr"] == chosen[v]}
        for v in ("SiLU", "SwiGLU")
    }
    diffs = [vals["SiLU"][s] - vals["SwiGLU"][s] for s in (1, 2, 3)]
    assert bpb["effect"] == pytest.approx(statistics.fmean(diffs))
    half = T975[2] * statistics.stdev(diffs) / math.sqrt(3)
    assert bpb["lo"] == pytest.approx(statistics.fmean(diffs) - half)
    assert bpb["measured"] == stats.verdict("better", bpb["lo"], bpb["hi"], 0.0) and f"**{bpb['verdict']}**" in table[1]
    # two tuned values: each variant's best is an end of the grid, so no verdict (the interval is shown)
    assert bpb["verdict"] == "rate not bracketed" and "edge of the 2 values tried" in bpb["gate"]
    tpp = [r["tokens"] / r["non_embedding_params"] for r in rows if r["tune"]["lr"] == chosen[r["variant"]]]
    assert bpb["tokens_per_param"] == pytest.approx(min(tpp))
    assert "## Gradients at initialisation" in md and "## Loss by position" in md
    figs = (
        "sensitivity.png",
        "bpb.png",
        "loss.png",
        "diagnostics.png",
        "diagnostics-high.png",
        "basin-d_ff.png",
        "init-grads.png",
        "loss-by-position.png",
    )
    for fig in figs:
        assert (out / fig).stat().st_size > 1000, fig
    assert "](sensitivity.png)" in md and "SHA-256" in md and "Load average" in md and "lmlab sweep" in md
    assert "## Controls" in md and "d_ff=84" in md and "## Timing block" in md

    # interrupted and resumed: a lost result and a half-trained run come back to the same verdict table
    kept = [r for r in rows if r["run"] != rows[-1]["run"]]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    ckpts = sorted((out / "runs" / rows[-1]["run"] / "checkpoints").iterdir())
    shutil.rmtree(ckpts[-1])  # killed while its last checkpoint was written: not recorded in the log
    log = out / "runs" / rows[-1]["run"] / "metrics.jsonl"
    log.write_text(
        "".join(x + "\n" for x in log.read_text().splitlines() if json.loads(x).get("checkpoint") != ckpts[-1].name)
    )
    assert main(["sweep", str(path), "--out", str(out)]) == 0
    assert main(["report", str(out)]) == 0
    assert _verdict_table((out / "report.md").read_text()) == table
    # each invocation closes its provenance with its wall time; the page and verdicts.json sum them
    ends = [json.loads(x) for x in (out / "provenance.jsonl").read_text().splitlines() if "ended_at" in x]
    assert len(ends) == 2 and all(e["finished"] and e["wall_s"] > 0 for e in ends)
    wall = json.loads((out / "verdicts.json").read_text())["sweep_wall"]
    assert wall == {"wall_s": pytest.approx(ends[0]["wall_s"] + ends[1]["wall_s"]), "invocations": 2, "finished": True}
    assert "**Wall time** of `lmlab sweep`" in (out / "report.md").read_text()

    # a report into a user's folder never replaces a file lmlab did not write
    user = tmp_path / "user"
    user.mkdir()
    (user / "loss.png").write_bytes(b"my own figure")
    assert main(["report", str(out), "--out", str(user / "report.md")]) == 2
    assert (user / "loss.png").read_bytes() == b"my own figure" and not (user / "report.md").exists()

    # the index of claims reads the sweep and its committed report folder alike
    assert main(["report", "--index", str(out), "--out", str(tmp_path / "index.md")]) == 0
    index = (tmp_path / "index.md").read_text()
    assert index.startswith("# Ablation index") and "SwiGLU better than SiLU" in index
    assert "Wall time recorded for 1 of 1 sweep(s)" in index and "`lmlab sweep` took" in index
    assert (tmp_path / "index-forest.png").stat().st_size > 1000
    # a report folder named by a relative path, the index written by an absolute one: linked relative
    # to the index (pathlib refused to relate the two)
    assert main(["report", str(out), "--out", str(tmp_path / "rep" / "report.md")]) == 0
    monkeypatch.chdir(tmp_path / "rep")
    assert main(["report", "--index", ".", "--out", str(tmp_path / "i1.md")]) == 0
    assert "- [bar](rep/report.md): 2 claim(s)" in (tmp_path / "i1.md").read_text()
    # --readme rewrites only the block between the markers; a README without them is refused
    from lmlab.lab.index import README_END, README_START

    readme = tmp_path / "R.md"
    readme.write_text(f"intro\n{README_START}\nold table\n{README_END}\nrest\n")
    assert main(["report", "--index", str(out), "--out", str(tmp_path / "index.md"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{README_END}\nrest\n") and "old table" not in text
    assert "| bar | SwiGLU better than SiLU |" in text and "](index.md)" in text
    (tmp_path / "bad.md").write_text("no markers\n")
    assert (
        main(["report", "--index", str(out), "--out", str(tmp_path / "i2.md"), "--readme", str(tmp_path / "bad.md")])
        == 2
    )
    assert (tmp_path / "bad.md").read_text() == "no markers\n"
    # two files at once: one with the counts line alone, the other with the table; both rewritten
    from lmlab.lab.index import COUNTS_END, COUNTS_START

    short = tmp_path / "sub" / "S.md"
    short.parent.mkdir()
    short.write_text(f"a\n{COUNTS_START}\nold\n{COUNTS_END}\nb\n")
    assert (
        main(
            [
                "report",
                "--index",
                str(out),
                "--out",
                str(tmp_path / "index.md"),
                "--readme",
                str(readme),
                "--readme",
                str(short),
            ]
        )
        == 0
    )
    line = short.read_text().split("\n")[2]
    assert line.startswith("The shipped specs' executions so far: 2 claims, **") and "](../index.md))." in line
    assert "| bar | SwiGLU better than SiLU |" in readme.read_text()


def test_ladder_plans_every_scale_and_judges_each(byte_data, tmp_path):
    raw = {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context_length": 32},
        "axes": {
            "grid": {
                "v": [
                    {"label": "A", "activation": "silu", "d_ff": 96},
                    {"label": "B", "activation": "swiglu"},
                ]
            }
        },
        "match": {"hold": "non_embedding_params", "solve": "d_ff", "multiple": 2},
        "scales": [{"label": "small", "d_model": 32}, {"label": "big", "d_model": 64, "n_heads": 4}],
        "expect": [{"better": "B", "than": "A"}],
        "seeds": [1, 2],
        "budget": {"steps": 5},
    }
    spec = parse_spec(raw)
    plans = plan_runs(spec, byte_data)
    assert len(plans) == 2 * 2 * 2 and {p.scale for p in plans} == {"small", "big"}
    for scale in ("small", "big"):  # each rung holds its own baseline's non-embedding parameters
        a, b = (next(p for p in plans if p.scale == scale and p.variant == v) for v in "AB")
        assert abs(param_counts(b.cfg)["non_embedding"] / param_counts(a.cfg)["non_embedding"] - 1) <= 0.02
    assert next(p for p in plans if p.scale == "big").cfg.d_model == 64
    rows = [
        {
            "run": p.name,
            "variant": p.variant,
            "seed": p.seed,
            "scale": p.scale,
            "tune": {},
            "status": "ok",
            "val_bpb": 2.5 - (0.05 if p.variant == "B" and p.scale == "big" else 0.0) + 0.001 * p.seed,
            "non_embedding_params": param_counts(p.cfg)["non_embedding"],
        }
        for p in plans
    ]
    claims = {c["scale"]: c for c in analyze(rows, spec)["claims"]}
    assert claims["big"]["effect"] == pytest.approx(0.05) and claims["small"]["effect"] == pytest.approx(0.0)
    from lmlab.lab import plots

    sizes = {"small": 1e4, "big": 4e4}
    assert plots.ladder(list(claims.values()), sizes, tmp_path / "ladder.png").stat().st_size > 1000


def test_results_csv_reads_back_as_rows(tmp_path):
    from lmlab.lab.report import read_results_csv, write_csv

    rows = [
        {
            "sweep": "s",
            "run": "1e-3_lr=0.001-s1",  # the name the lab gives it (lmlab.lab.spec.run_stem)
            "variant": "1e-3",
            "seed": 1,
            "status": "ok",
            "diverged": False,
            "val_bpb": 2.5,
            "steps": 10,
            "tune": {"lr": 0.001},
            "solved": {},
            "error": None,
            "fields": {"n_layers": 2, "activation": "gelu"},
        },
        {
            "sweep": "s",
            "run": "b_lr=0.01-s1",
            "variant": "b",
            "seed": 1,
            "status": "diverged",
            "diverged": True,
            "val_bpb": None,
            "steps": 3,
            "tune": {"lr": 0.01},
            "solved": {"d_ff": 84},
            "error": None,
            "fields": {},
        },
    ]
    back = read_results_csv(write_csv(rows, tmp_path / "r.csv"))
    for r, b in zip(rows, back):
        for k, v in r.items():
            assert b.get(k) == v and type(b.get(k)) is type(v), (k, v, b.get(k))  # "1e-3" stays a label


def test_sweep_sigterm_stops_its_trainers(byte_data, tmp_path):
    """kill (SIGTERM) of a running sweep stops its training subprocesses (no orphan keeps writing a run
    folder; the trainer checkpoints its last step), says what was kept and exits 143."""
    import os
    import signal
    import subprocess
    import sys
    import time

    spec = {
        "model": {"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2},
        "train": {
            "batch_size": 4,
            "log_interval": 1,
            "eval_interval": 1000,
            "eval_windows": 2,
            "device": "cpu",
            "checkpoint_interval": 0,
        },
        "axes": {"grid": {"n_layers": [1, 2]}},
        "seeds": [1],
        "budget": {"steps": 4000},
        "data": str(byte_data),
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sw"
    env = dict(os.environ, PYTHONPATH=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmlab.cli", "sweep", str(path), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    metrics = out / "runs" / "n_layers=1-s1" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert "sweep interrupted (SIGTERM)" in err.strip().splitlines()[-1]
    time.sleep(1.0)
    size = metrics.stat().st_size
    time.sleep(1.5)
    assert metrics.stat().st_size == size  # no orphaned trainer writes on
    ckpts = list((out / "runs" / "n_layers=1-s1" / "checkpoints").glob("step_*"))
    assert ckpts, "the stopped trainer checkpointed its last finished step"
    (end,) = [json.loads(x) for x in (out / "provenance.jsonl").read_text().splitlines() if "ended_at" in x]
    assert end["finished"] is False and end["wall_s"] > 0  # the interrupted invocation says so


def test_two_stage_tuning_chooses_on_the_tune_seeds_and_compares_the_others():
    """tune_seeds: seed 1 trains the grid and picks each variant's value; only seeds 2 and 3 (trained
    at that value) enter the comparison, so seed 1's lucky best does not bias it."""
    spec = _spec(tune_seeds=[1], expect=[{"better": "B", "than": "A"}])
    rows = _rows(
        {
            # seed 1 over the grid; seeds 2-3 at the value seed 1 chose (A: 3e-3, B: 1e-2)
            ("A", 1e-3): [2.60],
            ("A", 3e-3): [2.40, 2.55, 2.57],  # seed 1 lucky at its chosen value
            ("A", 1e-2): [2.45],
            ("B", 1e-3): [2.70],
            ("B", 3e-3): [2.52],
            ("B", 1e-2): [2.50, 2.50, 2.54],
        }
    )
    sel = select_tuned([r for r in rows if r["seed"] == 1], spec)
    assert sel[(None, "A")]["tune"] == {"lr": 3e-3} and sel[(None, "B")]["tune"] == {"lr": 1e-2}
    res = analyze(rows, spec)
    assert {s["variant"]: s["tune"]["lr"] for s in res["selected"]} == {"A": 3e-3, "B": 1e-2}
    (claim,) = res["claims"]
    diffs = [2.55 - 2.50, 2.57 - 2.54]  # seeds 2 and 3 only (with seed 1: 2.40 - 2.50 would enter)
    assert claim["n"] == 2 and claim["effect"] == pytest.approx(statistics.fmean(diffs))
    half = T975[1] * statistics.stdev(diffs) / math.sqrt(2)
    assert claim["lo"] == pytest.approx(statistics.fmean(diffs) - half)
    for bad, msg in (
        ([4], r"tune_seeds \[4\] are not among seeds"),
        ([1, 2, 3], "lists every seed"),
        ([], "non-empty list"),
        ("1", "non-empty list"),
    ):
        with pytest.raises(ConfigError, match=msg):
            _spec(tune_seeds=bad)
    with pytest.raises(ConfigError, match="needs a 'tune:' grid"):
        _spec(tune_seeds=[1], tune=None)
    with pytest.raises(ConfigError, match="lr_sensitivity is judged over the seeds"):
        _spec(tune_seeds=[1], expect=[{"better": "B", "than": "A", "metric": "lr_sensitivity"}])
    assert _spec(tune_seeds=[1, 2], expect=[{"better": "B", "than": "A", "metric": "lr_sensitivity"}])


def test_report_figures_survive_a_sweep_where_every_run_diverged(byte_data, tmp_path):
    """No finite bits/byte anywhere: the LR-sensitivity figure is left out (it has no curve), not a
    matplotlib error; the dry run warns of runs that end inside their warmup."""
    from lmlab.lab import plots, runner

    rows = _rows({("A", 1e-3): [None, None], ("A", 1e-2): [None, None]})
    assert plots.lr_sensitivity(rows, [], {"lr": [1e-3, 1e-2]}, tmp_path / "s.png", {}) is None
    assert not (tmp_path / "s.png").exists()
    spec = parse_spec({**BAR_SPEC, "train": {**BAR_SPEC["train"], "warmup_steps": 100}, "budget": {"steps": 6}})
    plans = plan_runs(spec, byte_data)
    text = runner.format_plan(plans, {p.name: "new" for p in plans}, spec)
    assert f"warning: {len(plans)} run(s) end before their warmup does" in text


def test_two_stage_sweep_trains_stage_2_at_the_chosen_values(byte_data, tmp_path, monkeypatch):
    """The runner: stage 1 (seed 1 x every lr), then the other seeds at the lr seed 1 chose per variant,
    and on a second invocation nothing again (the choice is remade from the recorded rows)."""
    from lmlab.lab import runner

    spec = parse_spec(
        {
            **BAR_SPEC,
            "data": str(byte_data),
            "seeds": [1, 2, 3],
            "tune_seeds": [1],
            "tune": {"lr": [1e-3, 3e-3, 1e-2]},
            "timing": None,
            "init_grads": None,
            "expect": [{"better": "SwiGLU", "than": "SiLU"}],
        }
    )
    plans = plan_runs(spec, byte_data)
    assert sum(not p.stage2 for p in plans) == 2 * 3 and all(p.seed == 1 for p in plans if not p.stage2)
    assert len(runner.trained_plans(plans)) == 2 * 3 + 2 * 2
    text = runner.format_plan(plans, {p.name: "new" for p in plans}, spec)
    assert "stage 2: 4 runs (each variant, seeds 2, 3)" in text and "\n10 runs," in text
    fake = {"SiLU": {1e-3: 2.6, 3e-3: 2.4, 1e-2: 2.5}, "SwiGLU": {1e-3: 2.7, 3e-3: 2.6, 1e-2: 2.3}}
    trained = []

    def job(self, p):  # a stand-in for training + evaluation: bpb from the table above
        trained.append(p.name)
        with self.lock:
            self.rows[p.name] = {
                "run": p.name,
                "variant": p.variant,
                "seed": p.seed,
                "scale": p.scale,
                "tune": p.tune,
                "status": "ok",
                "val_bpb": fake[p.variant][p.tune["lr"]],
            }

    monkeypatch.setattr(runner._Sweep, "job", job)
    sweep = runner._Sweep(spec, tmp_path, plans, 2, 1, lambda line: None)
    sweep.run()
    stage2 = sorted(n for n in trained if not n.endswith("-s1"))
    assert len(trained) == 10 and stage2 == [
        "SiLU_lr=0.003-s2",
        "SiLU_lr=0.003-s3",
        "SwiGLU_lr=0.01-s2",
        "SwiGLU_lr=0.01-s3",
    ]
    trained.clear()
    again = runner._Sweep(spec, tmp_path, plans, 2, 1, lambda line: None)
    again.rows = dict(sweep.rows)
    again.run()
    assert trained == []


def test_page_names_the_precision_a_run_trained_in_and_whether_it_compiled():
    """dtype auto is shown with what it resolved to on the run's machine (run.yaml's precision)."""
    from lmlab.lab.page import _compiled, _precision

    assert _precision({"train": {"dtype": "auto"}, "precision": "bf16"}) == "auto (bf16) autocast"
    assert _precision({"train": {"dtype": "auto"}, "precision": "fp32"}) == "auto (fp32)"
    assert _precision({"train": {"dtype": "bf16"}}) == "bf16 autocast"
    assert _precision({"train": {"dtype": "fp32"}}) == "fp32"
    assert [_compiled({"compile": c}) for c in (True, False, "auto")] == [
        ", compiled (torch.compile)",
        "",
        ", compile auto",
    ]
