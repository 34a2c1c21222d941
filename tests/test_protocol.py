"""The lab's protocol on synthetic result tables (issue 41): learning rates chosen on several seeds and
bracketed, the grid extended past a winning edge, unstable (bimodal) cells never chosen, claims gated on
their preconditions, tokens per parameter and paired seeds, relative margins and detectable effects."""

import math
import statistics

import pytest

from lmlab.config import ConfigError
from lmlab.lab import stats
from lmlab.lab.plan import plan_runs
from lmlab.lab.spec import parse_spec
from lmlab.lab.tuning import extensions, select
from lmlab.lab.verdicts import analyze

SEEDS = [1, 2, 3, 4, 5, 6]
GRID = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]


def _spec(**extra):
    raw = {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context_length": 32},
        "axes": {"grid": {"v": [{"label": "A", "activation": "silu"}, {"label": "B", "activation": "swiglu"}]}},
        "seeds": SEEDS,
        "tune": {"lr": GRID},
        **extra,
    }
    return parse_spec(raw)


def bowl(lr, best, depth=0.1, base=2.5):
    """A basin in log10(lr): base at ``best``, + depth per decade squared."""
    return base + depth * math.log10(lr / best) ** 2


def _rows(table, tokens=1_000_000, params=10_000, **cols):
    """{(variant, lr): [bpb per seed, None = diverged]} -> results rows (100 tokens per parameter)."""
    rows = []
    for (variant, lr), vals in table.items():
        for seed, v in enumerate(vals, 1):
            rows.append(
                {
                    "run": f"{variant}_lr={lr}-s{seed}",
                    "variant": variant,
                    "seed": seed,
                    "scale": None,
                    "tune": {"lr": lr},
                    "val_bpb": v,
                    "status": "ok" if v is not None else "diverged",
                    "tokens": tokens,
                    "non_embedding_params": params,
                    **cols,
                }
            )
    return rows


def _table(best_a=4e-3, best_b=4e-3, gap=0.05, noise=(0.0, 0.004, -0.003, 0.002, -0.004, 0.001), grid=GRID):
    """A's and B's basins on the grid, B worse by ``gap``, with a per-seed offset shared by both (paired)
    and a small per-variant jitter."""
    jit = {"A": (0.001, -0.002, 0.0, 0.002, -0.001, 0.0), "B": (-0.001, 0.0, 0.002, -0.002, 0.001, 0.0)}
    return {
        (v, lr): [
            bowl(lr, best_a if v == "A" else best_b) + (gap if v == "B" else 0) + n + j for n, j in zip(noise, jit[v])
        ]
        for v in "AB"
        for lr in grid
    }


def test_a_bracketed_choice_is_judged():
    spec = _spec(expect=[{"better": "A", "than": "B", "by": 0.01}])
    res = analyze(_rows(_table()), spec)
    sel = {s["variant"]: s for s in res["selected"]}
    assert all(s["bracketed"] and s["tune"] == {"lr": 4e-3} for s in sel.values())
    # the parabola through (2e-3, 4e-3, 8e-3) of a bowl centred on 4e-3 puts its vertex there
    assert sel["A"]["fit"] == pytest.approx(4e-3, rel=0.02)
    (c,) = res["claims"]
    assert c["verdict"] == "agrees" and c["n"] == 6 and c["effect"] == pytest.approx(0.05, abs=0.002)
    assert c["tokens_per_param"] == pytest.approx(100)


def test_an_edge_best_extends_the_grid_until_bracketed_or_the_limit():
    spec = _spec(tuning={"extend": 2})
    # A's optimum at 2.5e-2, past the grid's top (1.6e-2): the next value is one step (x2) further
    rows = _rows(_table(best_a=2.5e-2))
    assert extensions(rows, spec) == [(None, "A", {"lr": 0.032})]
    rows += _rows({("A", 0.032): [bowl(0.032, 2.5e-2)] * 6})
    # 0.032 (0.11 decades past the optimum) beats 1.6e-2 (0.19 below it): the new edge wins, so again
    sel = select(rows, spec)[(None, "A")]
    assert sel["tune"] == {"lr": 0.032} and not sel["bracketed"]
    assert extensions(rows, spec) == [(None, "A", {"lr": 0.064})]
    rows += _rows({("A", 0.064): [bowl(0.064, 2.5e-2)] * 6})
    sel = select(rows, spec)[(None, "A")]
    assert sel["tune"] == {"lr": 0.032} and sel["bracketed"] and extensions(rows, spec) == []
    # the limit: two values past the spec's top already tried, the best still at the edge: no more,
    # and the claim gets no verdict
    far = _rows(_table(best_a=1.0))
    far += _rows({("A", x): [bowl(x, 1.0)] * 6 for x in (0.032, 0.064)})
    assert extensions(far, spec) == []
    s2 = _spec(tuning={"extend": 2}, expect=[{"better": "A", "than": "B"}])
    (c,) = analyze(far, s2)["claims"]
    assert c["verdict"] == "rate not bracketed" and "A: best at lr=0.064, an edge of the 7 values" in c["gate"]
    # the low edge, and every value diverged: below the lowest (a step of /2, rounded to 3 figures)
    low = _rows({**_table(best_a=1e-4), **{("B", lr): [None] * 6 for lr in GRID}})
    assert sorted(extensions(low, spec), key=str) == [(None, "A", {"lr": 0.0005}), (None, "B", {"lr": 0.0005})]
    assert extensions(low, _spec(tuning={"extend": 0})) == []


def test_a_bimodal_cell_is_never_chosen():
    """At the edge of stability some seeds train and some stall (12 ratio 0.5 at one rate: 2.64, 2.83,
    2.85, 2.66): that cell's mean may be the lowest by chance, but its seed SD is far above the sweep's
    median cell SD, so it is unstable and the next value is chosen."""
    t = _table()
    t[("A", 8e-3)] = [2.38, 2.60, 2.39, 2.58, 2.38, 2.59]  # the lowest mean (2.487), two clusters
    sel = select(_rows(t), _spec())[(None, "A")]
    cell = next(g for g in sel["grid"] if g["tune"] == {"lr": 8e-3})
    assert cell["unstable"] and cell["sd"] > 3 * sel["noise"]
    assert cell["mean"] < min(g["mean"] for g in sel["grid"] if g is not cell)
    assert sel["tune"] == {"lr": 4e-3} and sel["bracketed"]
    # with a lax ratio the same cell would be chosen
    assert select(_rows(t), _spec(tuning={"unstable_ratio": 1000}))[(None, "A")]["tune"] == {"lr": 8e-3}


def test_choice_on_too_few_seeds_or_values_is_not_bracketed():
    spec = _spec(tune_seeds=[1, 2], seeds=[1, 2, 3, 4, 5, 6, 7, 8], expect=[{"better": "A", "than": "B"}])
    sel = select([r for r in _rows(_table()) if r["seed"] in (1, 2)], spec)[(None, "A")]
    assert not sel["bracketed"] and sel["why"] == "chosen on 2 seed(s), fewer than 3"
    three = _spec(tune={"lr": [2e-3, 4e-3, 8e-3]})
    s3 = select(_rows(_table(grid=[2e-3, 4e-3, 8e-3])), three)[(None, "A")]
    assert s3["why"] == "3 tuned values tried, fewer than 5"
    with pytest.raises(ConfigError, match=r"tuning.min_seeds=0 must be an integer >= 1"):
        _spec(tuning={"min_seeds": 0})
    with pytest.raises(ConfigError, match=r"tuning: unknown key\(s\) \['seeds'\]"):
        _spec(tuning={"seeds": 3})
    with pytest.raises(ConfigError, match=r"judging.power=1.2 must be a probability"):
        _spec(judging={"power": 1.2})


def test_a_failed_precondition_reads_not_testable_with_its_value():
    """Spec 11's claim needs the annealing phase to help the baseline: WSD minus constant measured on
    its own runs. At 150 steps it did not (+0.008, WSD worse): not testable, with the value."""
    variants = [
        {"label": n, "schedule": s, "weight_decay": w}
        for n, s, w in (("wd0 wsd", "wsd", 0.0), ("wd1 wsd", "wsd", 1.0), ("wd0 const", "constant", 0.0))
    ]
    raw = {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context_length": 32},
        "axes": {"zip": variants},
        "seeds": SEEDS,
        "tune": {"lr": GRID},
        "baseline": "wd0 wsd",
        "expect": [
            {
                "better": "wd1 wsd",
                "than": "wd0 wsd",
                "requires": [
                    {"better": "wd0 wsd", "than": "wd0 const", "by": 0.005, "why": "the decay phase must help"}
                ],
            }
        ],
    }
    spec = parse_spec(raw)
    off = (0.0, 0.004, -0.003, 0.002, -0.004, 0.001)
    table = {
        (v, lr): [bowl(lr, 4e-3) + d + o + 0.001 * (i % 2) for i, o in enumerate(off)]
        for v, d in (("wd0 wsd", 0.008), ("wd1 wsd", -0.02), ("wd0 const", 0.0))
        for lr in GRID
    }
    (c,) = analyze(_rows(table), spec)["claims"]
    assert c["measured"] == "agrees" and c["verdict"] == "not testable at this scale"
    (pre,) = c["preconditions"]
    assert not pre["holds"] and pre["value"].startswith("-0.0080") and "precondition failed" in c["gate"]
    assert pre["why"] == "the decay phase must help"
    # where annealing does help (constant worse by 0.03), the claim is judged
    table2 = {**table, **{("wd0 const", lr): [x + 0.038 for x in table[("wd0 const", lr)]] for lr in GRID}}
    (c2,) = analyze(_rows(table2), spec)["claims"]
    assert c2["preconditions"][0]["holds"] and c2["verdict"] == "agrees"


def test_value_context_and_device_preconditions():
    from lmlab.lab.preconditions import context_gain, device_of

    # z-loss: log Z must grow past 5 somewhere on the grid without it (over: grid)
    spec = _spec(
        expect=[
            {
                "better": "B",
                "than": "A",
                "metric": "val_bpb",
                "requires": [{"value": "log_z_max", "of": "A", "above": 5, "over": "grid"}],
            }
        ]
    )
    rows = _rows(_table(), log_z_max=3.0)
    (c,) = analyze(rows, spec)["claims"]
    assert (
        c["verdict"] == "not testable at this scale" and "log_z_max geometric mean 3 " in c["preconditions"][0]["value"]
    )
    for r in rows:
        if r["tune"]["lr"] == 1.6e-2 and r["variant"] == "A":
            r["log_z_max"] = 9.0 + 0.1 * r["seed"]
    (c,) = analyze(rows, spec)["claims"]
    assert c["preconditions"][0]["holds"], c["preconditions"]
    # context gain by hand: loss 4 at positions 1-16, 3 at 17-32, 2 afterwards (T = 128), past 16:
    # mean(17-32) - mean(65-128) = 3 - 2
    curve = [4.0] * 16 + [3.0] * 16 + [2.0] * 96
    assert context_gain(curve, 16) == pytest.approx(1.0)
    assert context_gain(curve, 40) is None  # 81-...: the ranges meet
    flat = [4.0] * 16 + [3.0] * 112
    s8 = _spec(
        expect=[{"better": "B", "than": "A", "by": -0.03, "requires": [{"context_gain": "A", "past": 16, "by": 0.02}]}]
    )
    rows8 = _rows(_table(gap=0.0))
    for r in rows8:
        r["val_loss_by_position"] = [x + 0.001 * r["seed"] for x in flat]
    (c8,) = analyze(rows8, s8)["claims"]
    assert c8["verdict"] == "not testable at this scale" and "gain +0.0000" in c8["preconditions"][0]["value"]
    for r in rows8:
        r["val_loss_by_position"] = [x + 0.001 * r["seed"] for x in curve]
    assert analyze(rows8, s8)["claims"][0]["preconditions"][0]["holds"]
    # a speed claim about GPU memory traffic, timed on a CPU
    sd = _spec(
        timing={"pairs": 15},
        expect=[
            {
                "better": "B",
                "than": "A",
                "metric": "step_time",
                "requires": [{"device": "cuda", "why": "memory-bound norms"}],
            }
        ],
    )
    timing = {
        "machine": "Intel(R) Xeon(R) Processor (family 6, model 167), 2 cores visible, 24 GiB",
        "scales": {
            "": {"step_s": {"A": [1.0 + 0.01 * i for i in range(15)], "B": [0.8 + 0.01 * i for i in range(15)]}}
        },
    }
    (ct,) = analyze(_rows(_table()), sd, timing)["claims"]
    assert ct["measured"] == "agrees" and ct["verdict"] == "not testable at this scale"
    assert "measured on cpu" in ct["gate"] and ct["tokens_per_param"] is None
    # a speed verdict names the processor it was timed on (the same claim can differ on another CPU)
    assert ct["method"] == "interleaved timing on Intel Xeon Processor (family 6, model 167)"
    assert device_of("AMD EPYC, 16 cores visible, torch 2.13, NVIDIA H200") == "cuda"
    assert device_of("x", "cuda:0") == "cuda" and device_of("NVIDIA H200", "cpu") == "cpu"
    with pytest.raises(ConfigError, match=r"requires\[0\].device='tpu' must be one of cpu, cuda"):
        _spec(expect=[{"better": "B", "than": "A", "requires": [{"device": "tpu"}]}])
    with pytest.raises(ConfigError, match=r"requires\[0\]: no variant 'C'|requires\[0\].of: no variant 'C'"):
        _spec(expect=[{"better": "B", "than": "A", "requires": [{"value": "log_z_max", "of": "C", "above": 1}]}])


def test_tokens_per_parameter_floor():
    spec = _spec(expect=[{"better": "A", "than": "B"}, {"better": "A", "than": "B", "floor": 0.5}])
    rows = _rows(_table(), tokens=7_000, params=10_000)  # 0.7 tokens per parameter
    c, c_low = analyze(rows, spec)["claims"]
    assert c["verdict"] == "not testable at this scale" and c["tokens_per_param"] == pytest.approx(0.7)
    assert "0.7 tokens per non-embedding parameter, below the floor of 10" in c["gate"]
    assert c_low["verdict"] == "agrees"  # its own floor, 0.5


def test_relative_margin_by_hand():
    """'A better than B by 1%': the paired difference B - A divided by B's mean bits/byte."""
    spec = _spec(expect=[{"better": "A", "than": "B", "by": "1%"}, {"better": "A", "than": "B", "by": "3%"}])
    rows = _rows(_table())
    c1, c3 = analyze(rows, spec)["claims"]
    a = {r["seed"]: r["val_bpb"] for r in rows if r["variant"] == "A" and r["tune"] == {"lr": 4e-3}}
    b = {r["seed"]: r["val_bpb"] for r in rows if r["variant"] == "B" and r["tune"] == {"lr": 4e-3}}
    d = [b[s] - a[s] for s in SEEDS]
    scale = statistics.fmean(b.values())
    half = stats.t_quantile(0.975, 5) * statistics.stdev(d) / math.sqrt(6)
    assert c1["effect"] == pytest.approx(statistics.fmean(d) / scale)
    assert c1["lo"] == pytest.approx((statistics.fmean(d) - half) / scale)
    assert c1["relative"] and c1["verdict"] == "agrees"  # 0.05 / 2.55 = 1.96% > 1%
    assert c3["verdict"] == "disagrees"  # the whole interval below 3%
    # detectable at 80% by hand, in the same relative unit
    mde = (stats.t_quantile(0.975, 5) + stats.t_quantile(0.8, 5)) * statistics.stdev(d) / math.sqrt(6) / scale
    assert c1["detectable"] == pytest.approx(mde)


def test_underpowered_and_far_from_published_are_flagged():
    spec = _spec(
        expect=[{"equal": ["A", "B"], "within": 0.001}, {"better": "A", "than": "B", "published": [0.005, 0.01]}]
    )
    eq, pub = analyze(_rows(_table()), spec)["claims"]
    assert eq["detectable"] > 0.001 and "underpowered: detects" in eq["note"]
    assert "far outside the published range [0.005, 0.01]" in pub["note"]  # 0.05 measured
    with pytest.raises(ConfigError, match=r"published=\[0.02, 0.01\] must be \[lo, hi\]"):
        _spec(expect=[{"better": "A", "than": "B", "published": [0.02, 0.01]}])


def test_dry_run_states_the_protocol_and_warns_of_designs_without_verdicts(byte_data):
    from lmlab.lab import runner

    spec = _spec(
        data=str(byte_data),
        tune={"lr": [1e-3, 3e-3]},
        tune_seeds=[1],
        seeds=[1, 2, 3],
        budget={"steps": 2},
        expect=[{"better": "A", "than": "B"}, {"better": "B", "than": "A", "floor": 0}],
    )
    plans = plan_runs(spec, byte_data)
    text = runner.format_plan(plans, {p.name: "new" for p in plans}, spec)
    assert "tuning: each variant's value from the mean over 1 seed(s) on 2 value(s)" in text
    assert "warning: 1 tuning seed(s) < tuning.min_seeds=3" in text
    assert "warning: 2 tuned value(s) < tuning.min_points=5" in text
    assert "warning: 2 compared seed(s) < judging.min_seeds=6" in text
    (low,) = [line for line in text.splitlines() if "below their tokens-per-parameter floor" in line]
    assert "'A better than B' (" in low and "'B better than A'" not in low  # that one's floor is 0


def test_the_sweep_extends_the_grid_and_trains_stage_2_at_an_added_value(tmp_path, monkeypatch, byte_data):
    """The runner: stage 1 (3 tune seeds x 5 values), an extension while A's best is the grid's top,
    then stage 2 at the value the extension found; a second invocation trains nothing."""
    from lmlab.lab import runner

    spec = parse_spec(
        {
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context_length": 32},
            "train": {"batch_size": 2, "device": "cpu"},
            "data": str(byte_data),
            "axes": {"grid": {"v": [{"label": "A", "activation": "silu"}, {"label": "B", "activation": "swiglu"}]}},
            "seeds": [1, 2, 3, 4],
            "tune_seeds": [1, 2, 3],
            "tune": {"lr": GRID},
            "budget": {"steps": 2},
            "tuning": {"extend": 3},
        }
    )
    plans = plan_runs(spec, byte_data)
    planned = {p.name.split("-s")[0] for p in plans}
    best = {"A": 4e-2, "B": 4e-3}
    trained = []

    def job(self, p):  # a stand-in for training + evaluation: a basin per variant
        trained.append(p.name)
        with self.lock:
            self.rows[p.name] = {
                "run": p.name,
                "variant": p.variant,
                "seed": p.seed,
                "scale": p.scale,
                "tune": p.tune,
                "status": "ok",
                "val_bpb": bowl(p.tune["lr"], best[p.variant]) + 0.001 * p.seed,
            }

    monkeypatch.setattr(runner._Sweep, "job", job)
    logs = []
    sweep = runner._Sweep(spec, tmp_path, plans, 1, 1, logs.append)
    sweep.run()
    added = sorted({n.split("-s")[0] for n in trained} - planned)
    # A: 1.6e-2 wins -> 0.032 added; 0.032 wins -> 0.064 added; 0.064 loses to 0.032 (optimum 0.04): bracketed
    assert added == ["A_lr=0.032", "A_lr=0.064"]
    assert any("extend: A: its best value is at an edge" in line for line in logs)
    assert sorted(n for n in trained if n.endswith("-s4")) == ["A_lr=0.032-s4", "B_lr=0.004-s4"]
    tune_rows = [r for r in sweep.rows.values() if r["seed"] != 4]
    assert select(tune_rows, spec)[(None, "A")]["bracketed"]
    n = len(trained)
    again = runner._Sweep(spec, tmp_path, plan_runs(spec, byte_data), 1, 1, logs.append)
    again.rows = dict(sweep.rows)
    again.run()
    assert len(trained) == n  # nothing trained twice


def test_a_positive_value_precondition_is_judged_on_the_log_scale():
    """A positive quantity against a positive bound: the Student-t interval of the log values (of the
    geometric mean), checked against scipy's t quantile by hand. Spec 15's baseline max attention logits
    over three seeds (564, 632, 1,552 against 20) pass on the log scale though their arithmetic interval
    reaches below zero; a seed at or below zero keeps the arithmetic interval."""
    from scipy import stats as st

    from lmlab.lab.preconditions import Requirement, check
    from lmlab.lab.verdicts import tune_key

    per_seed = {1: 564.0, 2: 632.0, 3: 1552.0}
    rows = [
        {"scale": None, "variant": "A", "seed": s, "tune": {"lr": 1e-3}, "max_attn_logit": v}
        for s, v in per_seed.items()
    ]
    ctx = {"rows": rows, "tune_rows": rows, "confidence": 0.95, "scale": None}
    ctx["selected"] = {(None, "A"): {"key": tune_key(rows[0])}}
    logs = [math.log(v) for v in per_seed.values()]
    m, half = statistics.fmean(logs), st.t.ppf(0.975, 2) * statistics.stdev(logs) / math.sqrt(3)
    lo, hi = math.exp(m - half), math.exp(m + half)
    assert 150 < lo < 250 and 2900 < hi < 3500  # [207, 3255]: the hand figure quoted in the docs
    above = check(Requirement("value", "A", metric="max_attn_logit", bound=20.0, over="grid"), ctx)
    assert above["holds"] and above["value"] == (
        f"max_attn_logit geometric mean {math.exp(m):.4g} [{lo:.4g}, {hi:.4g}] over 3 seed(s)"
    )
    assert not check(Requirement("value", "A", metric="max_attn_logit", bound=250.0, over="grid"), ctx)["holds"]
    below = check(Requirement("value", "A", metric="max_attn_logit", bound=4000.0, above=False), ctx)
    assert below["holds"] and f"[{lo:.4g}, {hi:.4g}]" in below["value"]
    assert not check(Requirement("value", "A", metric="max_attn_logit", bound=3000.0, above=False), ctx)["holds"]
    # one value at zero: the arithmetic interval (mean 732, lower end below 20: fails)
    rows[0]["max_attn_logit"] = 0.0
    flat = check(Requirement("value", "A", metric="max_attn_logit", bound=20.0, over="grid"), ctx)
    vals = [0.0, 632.0, 1552.0]
    a_lo = statistics.fmean(vals) - st.t.ppf(0.975, 2) * statistics.stdev(vals) / math.sqrt(3)
    assert not flat["holds"] and flat["value"].startswith(f"max_attn_logit {statistics.fmean(vals):.4g} [{a_lo:.4g},")


def test_spec_precision_names_how_the_runs_train():
    """The precision a sweep's provenance records: the train block's, unless the spec varies it."""
    assert _spec().precision == "fp32"
    assert _spec(train={"dtype": "bf16", "compile": True}).precision == "bf16, compiled"
    assert parse_spec(_spec().raw, dtype="bf16", compile=True).precision == "bf16, compiled"  # the switches
    by_variant = {"grid": {"v": [{"label": "A", "dtype": "fp32"}, {"label": "B", "dtype": "bf16"}]}}
    assert _spec(axes=by_variant, train={"compile": True}).precision == "dtype per variant, compiled"
