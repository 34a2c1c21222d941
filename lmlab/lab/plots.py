"""The figures of an ablation report (matplotlib, Agg). Each function writes one PNG and returns its path,
or None when the sweep has nothing to draw for it.

- :func:`lr_sensitivity`: final bits/byte against each tuned value (log x), one line per variant, seed
  band (min-max over seeds), the chosen value ringed: Wortsman et al. 2023, "Small-scale proxies for
  large-scale Transformer training instabilities", Fig. 1;
- :func:`basin`: bits/byte against a numeric axis (log x when geometric), with the t-interval band;
- :func:`ladder`: each claim's effect with its interval against model size (non-embedding parameters);
- :func:`loss_curves`: EMA-smoothed training loss and validation bits/byte per variant, seed bands,
  full y-range (a diverged variant stays visible);
- :func:`diagnostics`: per-layer gradient norms at initialisation and during training (Xiong et al.
  2020, Fig. 3), the largest attention logit, log Z and the loss spikes over training;
- :func:`bpb_by_variant`: every seed as a dot and the mean with its t-interval;
- :func:`throughput`: training tokens/s per variant, for information only;
- :func:`forest`: one row per claim (the index page).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Optional

from lmlab.lab.stats import finite as _ok
from lmlab.lab.stats import t_interval
from lmlab.plot import check_own_outputs, save_png

LN2 = math.log(2)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Write ``fig`` marked as lmlab's, atomically (:func:`lmlab.plot.save_png`); a file of that name
    that lmlab did not write is refused (CheckpointError), never overwritten."""

    fig.tight_layout()
    try:
        check_own_outputs([path])
        save_png(fig, path)
    finally:
        _plt().close(fig)
    return path


LINESTYLES = ("-", "--", ":", "-.")


def _dash(scale, scales: list) -> str:
    """The line style of a ladder rung (solid for the first or only scale)."""
    return LINESTYLES[scales.index(scale) % len(LINESTYLES)] if scale in scales else "-"


def geometric(values: list) -> bool:
    """Positive values spanning a factor >= 4: drawn on a log axis."""
    return all(_ok(v) and v > 0 for v in values) and max(values) >= 4 * min(values)


def _seed_band(vals: list[float], confidence: float) -> tuple[float, float, float]:

    if len(vals) >= 2:
        ti = t_interval(vals, confidence)
        return ti["mean"], ti["lo"], ti["hi"]
    return vals[0], vals[0], vals[0]


def lr_sensitivity(rows: list[dict], selected: list[dict], tuned: dict, path: Path, colors: dict) -> Optional[Path]:
    """Final held-out bits/byte against each tuned field (one panel per field), see the module doc."""
    fields = [f for f, vals in tuned.items() if all(_ok(v) for v in vals)]
    if not fields or not any(_ok(r.get("val_bpb")) for r in rows):  # nothing finished: no curve to draw
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(fields), figsize=(7 * len(fields), 4.6), squeeze=False)
    chosen = {(s["scale"], s["variant"]): s["tune"] for s in selected}
    for ax, fld in zip(axes[0], fields):
        groups: dict = {}
        for r in rows:
            t = r.get("tune") or {}
            if fld in t:
                groups.setdefault((r.get("scale"), r["variant"]), {}).setdefault(t[fld], []).append(r.get("val_bpb"))
        worst = max((v for g in groups.values() for vs in g.values() for v in vs if _ok(v)), default=None)
        scales = list(dict.fromkeys(k[0] for k in groups))
        for (scale, variant), by_x in groups.items():
            xs = sorted(by_x)
            mean, lo, hi, dx, dy = [], [], [], [], []
            for x in xs:
                vals = [v for v in by_x[x] if _ok(v)]
                if len(vals) < len(by_x[x]):  # a diverged seed: an x at the top of the axes
                    dx.append(x)
                    dy.append(worst)
                if vals:
                    mean.append(statistics.fmean(vals))
                    lo.append(min(vals))
                    hi.append(max(vals))
                else:
                    mean.append(math.nan)
                    lo.append(math.nan)
                    hi.append(math.nan)
            label = variant + (f" @{scale}" if scale else "")
            c = colors.get(variant, "k")
            ax.plot(xs, mean, "o", ls=_dash(scale, scales), color=c, label=label, lw=1.4, ms=4)
            ax.fill_between(xs, lo, hi, color=c, alpha=0.15)
            if dx:
                ax.plot(dx, dy, "x", color=c, ms=9, mew=2)
            best = chosen.get((scale, variant), {}).get(fld)
            if best in by_x:
                ax.plot([best], [mean[xs.index(best)]], "o", ms=12, mfc="none", color=c)
        if all(_ok(v) and v > 0 for v in tuned[fld]) and max(tuned[fld]) >= 2 * min(tuned[fld]):  # rates: log
            ax.set_xscale("log")
        ax.set_xlabel(f"{fld} (tuned)")
        ax.set_ylabel("held-out bits/byte (lower is better)")
        ax.set_title(f"sensitivity to {fld}: mean over seeds, band min-max, x = diverged, ring = chosen", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return _save(fig, path)


def basin(points: dict, axis: str, path: Path, confidence: float, colors: dict) -> Optional[Path]:
    """``points``: scale -> [(x, [per-seed bits/byte], variant)]; one line per scale."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    xs_all = []
    for i, (scale, pts) in enumerate(points.items()):
        pts = sorted((p for p in pts if p[1]), key=lambda p: p[0])
        if not pts:
            continue
        xs = [p[0] for p in pts]
        xs_all += xs
        bands = [_seed_band(p[1], confidence) for p in pts]
        c = f"C{i}"
        ax.plot(xs, [b[0] for b in bands], "o-", color=c, label=str(scale or "all"))
        ax.fill_between(xs, [b[1] for b in bands], [b[2] for b in bands], color=c, alpha=0.2)
        for p in pts:
            ax.plot([p[0]] * len(p[1]), p[1], ".", color="k", ms=3, alpha=0.5)
    if not xs_all:
        plt.close(fig)
        return None
    if geometric(xs_all):
        ax.set_xscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel("held-out bits/byte")
    ax.set_title(f"basin: mean over seeds, band {100 * confidence:g}% t-interval, dots: seeds", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if len(points) > 1:
        ax.legend(fontsize=8, title="scale")
    return _save(fig, path)


def init_grads(variants: dict, path: Path, colors: dict) -> Optional[Path]:
    """``variants``: label -> {depth: {seed: [gradient norm per block]}} (lmlab.lab.init_grads); one
    panel per depth, one line per variant (median over seeds, band min-max), log y: Xiong et al. 2020,
    Fig. 3."""
    depths = sorted({int(d) for v in variants.values() for d in v}, key=int)
    if not depths:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(depths), figsize=(6 * len(depths), 4.2), squeeze=False)
    for ax, depth in zip(axes[0], depths):
        for label, by_depth in variants.items():
            per_seed = list((by_depth.get(str(depth)) or by_depth.get(depth) or {}).values())
            if not per_seed:
                continue
            layers = range(len(per_seed[0]))
            cols = list(zip(*per_seed))
            col = colors.get(label.split(" @")[0], "k")
            ax.plot(layers, [statistics.median(c) for c in cols], "o-", color=col, label=label, ms=3)
            ax.fill_between(layers, [min(c) for c in cols], [max(c) for c in cols], color=col, alpha=0.15)
        ax.set_yscale("log")
        _axes(
            ax,
            "block (0 = next to the embedding)",
            "gradient L2 norm of the block",
            f"{depth} layers, at initialisation: median over seeds, band min-max",
        )
    return _save(fig, path)


def loss_by_position(curves: dict, path: Path, colors: dict, bucket: int = 8) -> Optional[Path]:
    """``curves``: label -> [per-seed list of held-out loss (nats/token) at each context position];
    one line per variant, the mean over seeds in buckets of ``bucket`` positions (log x)."""
    if not any(curves.values()):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for label, per_seed in curves.items():
        if not per_seed:
            continue
        mean = [statistics.fmean(col) for col in zip(*per_seed)]
        xs, ys = [], []
        for i in range(0, len(mean), bucket):
            part = mean[i : i + bucket]
            xs.append(i + 1 + (len(part) - 1) / 2)  # context tokens seen, bucket centre
            ys.append(statistics.fmean(part))
        ax.plot(xs, ys, "-", color=colors.get(label.split(" @")[0], "k"), label=label)
    ax.set_xscale("log")
    _axes(
        ax,
        "tokens of context (position + 1)",
        "held-out loss (nats/token)",
        f"loss by position: mean over seeds, buckets of {bucket} positions",
    )
    return _save(fig, path)


def _axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Labels, a small title, a light grid on both scales and a small legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def ladder(claims: list[dict], sizes: dict, path: Path) -> Optional[Path]:
    """Each claim's effect and interval against the baseline's non-embedding parameters per scale."""
    groups: dict = {}
    for c in claims:
        if c.get("effect") is not None and sizes.get(c["scale"]):
            groups.setdefault(c["text"], []).append(c)
    if not groups or all(len(g) < 2 for g in groups.values()):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, (text, cs) in enumerate(groups.items()):
        cs = sorted(cs, key=lambda c: sizes[c["scale"]])
        xs = [sizes[c["scale"]] for c in cs]
        ys = [c["effect"] for c in cs]
        err = [
            [y - (c["lo"] if c["lo"] is not None else y) for y, c in zip(ys, cs)],
            [(c["hi"] if c["hi"] is not None else y) - y for y, c in zip(ys, cs)],
        ]
        ax.errorbar(xs, ys, yerr=err, fmt="o-", color=f"C{i}", capsize=3, label=text)
        ax.axhline(cs[0]["by"], color=f"C{i}", ls=":", lw=1)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters of the baseline")
    ax.set_ylabel("effect (as claimed; dotted: the smallest that counts)")
    ax.set_title("does it hold as models grow? (bars: intervals)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, path)


def ema(values: list[float], alpha: float) -> list[float]:
    """Exponential moving average, m_t = alpha m_{t-1} + (1 - alpha) x_t, debiased as in Adam; a
    non-finite x_t is passed through (so a divergence stays visible)."""
    out, m, w = [], 0.0, 0.0
    for x in values:
        if not _ok(x):
            out.append(x)
            continue
        m = alpha * m + (1 - alpha) * x
        w = alpha * w + (1 - alpha)
        out.append(m / w)
    return out


def loss_curves(curves: dict, path: Path, colors: dict) -> Optional[Path]:
    """``curves``: label -> {"train": [{step: loss}] per seed, "val_bpb": [{step: bpb}] per seed}."""
    if not any(c["train"] for c in curves.values()):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    scales = list(dict.fromkeys(label.partition(" @")[2] or None for label in curves))
    for label, c in curves.items():
        col = colors.get(label.split(" @")[0], "k")
        for ax, key, smooth in ((axes[0], "train", True), (axes[1], "val_bpb", False)):
            seeds = [s for s in c[key] if s]
            if not seeds:
                continue
            steps = sorted(set().union(*seeds))
            per_seed = []
            for s in seeds:
                xs = sorted(s)
                ys = [s[x] for x in xs]
                if smooth:
                    ys = ema(ys, alpha=min(0.9, max(0.0, 1 - 10 / max(len(ys), 1))))
                per_seed.append(dict(zip(xs, ys)))
            mean, lo, hi = [], [], []
            for st in steps:
                vals = [p[st] for p in per_seed if st in p]
                fin = [v for v in vals if _ok(v)]
                mean.append(statistics.fmean(fin) if fin else math.nan)
                lo.append(min(fin) if fin else math.nan)
                hi.append(max(fin) if fin else math.nan)
            ax.plot(
                steps,
                mean,
                ls=_dash(label.partition(" @")[2] or None, scales),
                marker=None if smooth else "o",
                color=col,
                lw=1.3,
                ms=3,
                label=f"{label} ({len(seeds)} seed{'s' if len(seeds) != 1 else ''})",
            )
            if len(seeds) > 1:
                ax.fill_between(steps, lo, hi, color=col, alpha=0.15)
    axes[0].set_ylabel("training loss (nats/token), EMA-smoothed")
    axes[1].set_ylabel("validation bits/byte (periodic estimate)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[0].set_title("mean over seeds, band: min-max over seeds; full range", fontsize=9)
    return _save(fig, path)


def diagnostics(diag: dict, path: Path, colors: dict) -> Optional[Path]:
    """``diag``: label -> the metrics records of one seed's run (``grad_norm_layers``, ``max_attn_logit``,
    ``log_z_max`` from the diagnostics, ``spikes`` from every logged step). Five panels; None when no run
    logged diagnostics."""
    if not any(diag.values()):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 5, figsize=(24, 4.4))
    for label, recs in diag.items():
        col = colors.get(label.split(" @")[0], "k")
        gn = [r for r in recs if r.get("grad_norm_layers")]
        if gn:
            first = gn[0]["grad_norm_layers"]
            axes[0].plot(range(len(first)), first, "o-", color=col, label=f"{label} (step {gn[0]['step']})")
            steps = [r["step"] for r in gn]
            axes[1].plot(steps, [r["grad_norm_layers"][0] for r in gn], "-", color=col, label=f"{label}: layer 0")
            axes[1].plot(
                steps,
                [r["grad_norm_layers"][-1] for r in gn],
                "--",
                color=col,
                label=f"{label}: layer {len(first) - 1}",
            )
        al = [r for r in recs if r.get("max_attn_logit")]
        if al:
            axes[2].plot(
                [r["step"] for r in al],
                [max((x for x in r["max_attn_logit"] if x is not None), default=float("nan")) for r in al],
                "-",
                color=col,
                label=label,
            )
        lz = [r for r in recs if _ok(r.get("log_z_max"))]
        if lz:
            axes[3].plot([r["step"] for r in lz], [r["log_z_max"] for r in lz], "-", color=col, label=label)
        sp = [r for r in recs if "spikes" in r]
        if sp:
            axes[4].step([r["step"] for r in sp], [r["spikes"] for r in sp], where="post", color=col, label=label)
    titles = (
        "gradient norm per layer at initialisation",
        "gradient norm of the first/last layer",
        "largest attention logit (any layer)",
        "largest output log Z",
        "loss spikes so far (loss > spike_ratio x its running mean)",
    )
    xlabels = ("layer", "step", "step", "step", "step")
    for ax, t, xl in zip(axes, titles, xlabels):
        ax.set_title(t, fontsize=9)
        ax.set_xlabel(xl)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=6)
    for ax in axes[:3]:
        if ax.has_data():
            ax.set_yscale("log")
    return _save(fig, path)


def bpb_by_variant(
    groups: list[tuple[str, list[float], Optional[float], Optional[float]]],
    path: Path,
    colors: dict,
    confidence: float,
) -> Path:
    """``groups``: (label, per-seed bits/byte, interval lo, hi) in display order (best first)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, max(2.6, 0.45 * len(groups) + 1.4)))
    for i, (label, vals, lo, hi) in enumerate(groups):
        y = len(groups) - 1 - i
        col = colors.get(label.split(" @")[0], "k")
        if not vals:
            ax.text(
                0.01,
                y,
                "  n/a (diverged or failed)",
                transform=ax.get_yaxis_transform(),
                va="center",
                fontsize=8,
                color="C3",
            )
            continue
        m = statistics.fmean(vals)
        if lo is not None:
            ax.errorbar([m], [y], xerr=[[m - lo], [hi - m]], fmt="o", color=col, ms=7, capsize=3)
        else:
            ax.plot([m], [y], "o", color=col, ms=7)
        ax.plot(vals, [y] * len(vals), ".", color="k", ms=4, alpha=0.6)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([g[0] for g in reversed(groups)], fontsize=8)
    ax.set_xlabel("held-out bits/byte (full validation split; lower is better)")
    ax.set_title(
        f"mean over seeds, bar: {100 * confidence:g}% t-interval of the mean (>= 2 seeds), dots: seeds",
        fontsize=9,
    )
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def throughput(order: list[dict], path: Path, colors: dict) -> Path:
    """Training tokens/s per variant (``order``: aggregated rows, best first), median over logged steps
    with the min-max over seeds; for information only (speed claims come from the timing block)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, max(2.6, 0.45 * len(order) + 1.4)))
    ys = list(range(len(order)))[::-1]
    vals = [a.get("tokens_per_s") or 0.0 for a in order]
    err = [
        [v - (a.get("tokens_per_s_min") or v) for v, a in zip(vals, order)],
        [(a.get("tokens_per_s_max") or v) - v for v, a in zip(vals, order)],
    ]
    ax.barh(ys, vals, xerr=err, color=[colors.get(a["variant"].split(" @")[0], "C0") for a in order], capsize=3)
    ax.set_yticks(ys)
    ax.set_yticklabels([a["variant"] for a in order], fontsize=8)
    ax.set_xlabel("training tokens/s (median over logged steps; bar: min-max over seeds)")
    ax.set_title("information only: speed claims come from the timing block", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def forest(claims: list[dict], path: Path) -> Optional[Path]:
    """Index page: one row per claim, effect and interval; absolute (bits/byte) and relative (%) claims
    in two panels; the threshold of each claim marked."""
    claims = [c for c in claims if c.get("effect") is not None]
    if not claims:
        return None
    panels = [
        ("absolute", [c for c in claims if not c.get("relative")]),
        ("relative", [c for c in claims if c.get("relative")]),
    ]
    panels = [p for p in panels if p[1]]
    plt = _plt()
    n = max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), max(3, 0.38 * n + 1.5)), squeeze=False)
    color = {"agrees": "C2", "disagrees": "C3", "inconclusive": "C7"}
    for ax, (kind, cs) in zip(axes[0], panels):
        k = 100 if kind == "relative" else 1
        for i, c in enumerate(cs):
            y = len(cs) - 1 - i
            e = c["effect"] * k
            lo = c["lo"] * k if c.get("lo") is not None else e
            hi = c["hi"] * k if c.get("hi") is not None else e
            ax.errorbar([e], [y], xerr=[[e - lo], [hi - e]], fmt="o", color=color.get(c["verdict"], "k"), capsize=3)
            if c["kind"] == "equal":
                ax.plot([-c["by"] * k, c["by"] * k], [y, y], "|", color="k", ms=12)
            else:
                ax.plot([c["by"] * k], [y], "|", color="k", ms=12)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(cs)))
        ax.set_yticklabels(
            [f"{c['spec']}: {c['text']}"[:70] + (f" @{c['scale']}" if c.get("scale") else "") for c in reversed(cs)],
            fontsize=7,
        )
        ax.set_xlabel("effect as claimed (%)" if kind == "relative" else "effect as claimed (bits/byte)")
        ax.grid(alpha=0.3, axis="x")
        ax.set_title("green agrees, red disagrees, grey inconclusive; | threshold", fontsize=9)
    return _save(fig, path)
