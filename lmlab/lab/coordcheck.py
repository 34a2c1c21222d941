"""The coordinate check of a parametrization: ``lmlab coordcheck``.

Yang et al. 2022 ("Tensor Programs V", section 7 and Appendix D.1; the ``mup`` package's coord check)
test a parametrization by training the same model at several widths for a few steps and watching the
size of the activations' coordinates: under muP every layer's coordinates keep their size as the width
grows (the claim that lets hyperparameters transfer), while under the standard parametrization they grow
with it (the logits first, each Adam step adding an amount proportional to the width).

:func:`coord_check` does that with lmlab's own model and optimiser: for each width the config is rebuilt
at ``d_model`` = width (the number of heads kept, so head_dim = width / n_heads grows; d_ff from its rule),
the model initialised with the seed, and trained ``steps`` steps of AdamW (the run's parameter groups,
:func:`lmlab.optim.param_groups`, so mup's per-group learning rates apply) at a constant learning rate,
without clipping, on the same batches at every width. At each step's forward (step 1: at initialisation)
it records the **mean absolute value per coordinate**, mean |x| over batch, positions and channels, of the
token embedding's output, each block's output and the logits (after the output multiplier).

The verdict: at the last step, the slope of log(mean |x|) against log(width) (least squares over the
widths, seeds averaged first) for every recorded layer; the check passes when every |slope| is below
``threshold`` (default 0.25: a layer whose size doubled over a 4x range of widths fails at slope 0.5).

**Over depth** (``depths``; ``lmlab coordcheck --depths 2,4,8``): the same check with ``n_layers`` varied
at the config's width (``base_n_layers`` = the smallest depth under completep), recording the token
embedding's output, the **last** block's output (the residual stream the head reads) and the logits;
slopes against log(depth). CompleteP's claim (Dey et al. 2025, section 4 and their Fig. 2 coordinate
checks over depth) is that with each residual branch scaled by base_n_layers / n_layers the stream's
size and its update per step stay the same as layers are added; without it (sp, mup) every block adds
its update to the stream, which grows with depth.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from lmlab.config import ConfigError, ModelConfig
from lmlab.kernels.loss import lm_loss
from lmlab.model import TransformerLM
from lmlab.optim import adamw, param_groups, set_lr
from lmlab.plot import check_own_outputs, save_png
from lmlab.runs import DEFAULT_VOCAB, build_configs, ensure_default_data

DEFAULT_MODEL = {"n_layers": 2, "n_heads": 4, "context_length": 64}  # without --config / --preset
DEFAULT_TRAIN = {"lr": 0.005, "batch_size": 8, "weight_decay": 0.0}
THRESHOLD = 0.25
RANDOM_VOCAB = 256  # --data random: uniform token ids below this


def at_width(cfg: ModelConfig, width: int, base_width: Optional[int]) -> ModelConfig:
    """``cfg`` rebuilt at d_model = ``width`` (head_dim and d_ff derived again from it; the heads kept) with
    ``base_d_model`` = ``base_width`` under mup / completep. Raises ConfigError (naming ``--widths``) for a
    width the config cannot take, or a config whose head_dim or d_ff is set apart from d_model."""
    fields = cfg.to_dict()
    derived = ModelConfig.from_dict({**fields, "head_dim": None, "d_ff": None})
    for name in ("head_dim", "d_ff"):
        if getattr(derived, name) != getattr(cfg, name):
            raise ConfigError(
                f"{name}={getattr(cfg, name)} is set apart from d_model={cfg.d_model} (derived: "
                f"{getattr(derived, name)}); the coordinate check widens d_model and derives "
                f"{name} from it: drop {name} from the config"
            )
    if width % cfg.n_heads:
        raise ConfigError(
            f"--widths: {width} is not a multiple of n_heads={cfg.n_heads} (the check keeps the "
            f"heads and widens each: head_dim = width / n_heads)"
        )
    fields.update(d_model=width, head_dim=None, d_ff=None)
    if cfg.parametrization != "sp":
        fields["base_d_model"] = base_width
    try:
        return ModelConfig.from_dict(fields)
    except ConfigError as exc:
        raise ConfigError(f"--widths: at width {width}: {exc}") from None


def at_depth(cfg: ModelConfig, depth: int, base_depth: Optional[int]) -> ModelConfig:
    """``cfg`` rebuilt with ``n_layers`` = ``depth`` (and ``base_n_layers`` = ``base_depth`` under completep).
    Raises ConfigError naming ``--depths`` for a depth the config cannot take."""
    fields = {**cfg.to_dict(), "n_layers": depth}
    if cfg.parametrization == "completep":
        fields["base_n_layers"] = base_depth
    try:
        return ModelConfig.from_dict(fields)
    except ConfigError as exc:
        raise ConfigError(f"--depths: at depth {depth}: {exc}") from None


def _batches(tokens: Optional[np.ndarray], vocab: int, steps: int, batch: int, T: int, seed: int):
    """``steps`` (x, y) batches of ``batch`` windows of ``T`` + 1 tokens: random windows of ``tokens``, or,
    when ``tokens`` is None, random ids below ``vocab`` drawn independently from a Zipf distribution
    (p(i) proportional to 1/(i + 1), as word frequencies roughly are: a unigram for the model to learn, so
    the updates have a direction); the same batches for every width (seeded)."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, vocab + 1)
    zipf /= zipf.sum()
    for _ in range(steps):
        if tokens is None:
            w = rng.choice(vocab, size=(batch, T + 1), p=zipf)
        else:
            starts = rng.integers(0, len(tokens) - T - 1, size=batch)
            w = np.stack([np.asarray(tokens[s : s + T + 1], dtype=np.int64) for s in starts])
        w = torch.from_numpy(w.astype(np.int64))
        yield w[:, :-1], w[:, 1:]


def _mean_abs(t: torch.Tensor) -> float:
    return float(t.detach().float().abs().mean())


def train_and_record(
    cfg: ModelConfig,
    tc,
    steps: int,
    seed: int,
    tokens: Optional[np.ndarray],
    device: torch.device,
    last_block: bool = False,
) -> dict[str, list[float]]:
    """{layer: [mean |x| at step 1, ..., steps]} of a model of ``cfg`` trained ``steps`` AdamW steps at
    ``tc.lr`` (constant) with ``tc``'s betas, eps and weight decay; layers 'embedding', 'block 0', ...,
    'logits' (``last_block``: 'embedding', 'last block', 'logits', for models of different depths)."""

    torch.manual_seed(seed)
    model = TransformerLM(cfg).to(device).train()
    opt = adamw(param_groups(model, tc), tc, device)
    blocks = [(f"block {i}", b) for i, b in enumerate(model.blocks)]
    if last_block:
        blocks = [("last block", model.blocks[-1])]
    names = ["embedding"] + [n for n, _ in blocks] + ["logits"]
    record: dict[str, list[float]] = {n: [] for n in names}
    hooks = [model.embed.register_forward_hook(lambda m, i, o: record["embedding"].append(_mean_abs(o)))]
    for name, block in blocks:
        hooks.append(block.register_forward_hook(lambda m, inp, out, name=name: record[name].append(_mean_abs(out))))
    try:
        for x, y in _batches(tokens, cfg.vocab_size, steps, tc.batch_size, cfg.context_length, seed):
            x, y = x.to(device), y.to(device)
            set_lr(opt, tc.lr, tc)
            logits = model(x)
            record["logits"].append(_mean_abs(logits))
            loss, _ = lm_loss(logits, y, cfg.z_loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if not math.isfinite(float(loss.detach())):
                raise FloatingPointError(f"the loss became {float(loss.detach())} at width {cfg.d_model}; lower --lr")
            opt.step()
    finally:
        for h in hooks:
            h.remove()
    return record


def slope(widths: Sequence[int], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) against log(width)."""
    x = np.log(np.asarray(widths, dtype=float))
    y = np.log(np.maximum(np.asarray(values, dtype=float), 1e-30))
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def coord_check(
    cfg: ModelConfig,
    tc,
    widths: Sequence[int],
    steps: int,
    seeds: Sequence[int] = (1,),
    tokens: Optional[np.ndarray] = None,
    device: str | torch.device = "cpu",
    threshold: float = THRESHOLD,
    base_width: Optional[int] = None,
    depths: Optional[Sequence[int]] = None,
    base_depth: Optional[int] = None,
) -> dict:
    """Run the coordinate check of ``cfg`` (its ``parametrization``) at ``widths`` (or, with ``depths``, at
    those n_layers and the config's width): ``steps`` AdamW steps at ``tc.lr`` for each size and seed (see
    the module docstring). ``base_width``: mup's base_d_model (default: the config's, else the smallest
    width); ``base_depth``: completep's base_n_layers (default: the smallest depth). Returns
    {'parametrization', 'axis' ('width' or 'depth'), 'sizes', 'widths' (= sizes over width), 'base', 'steps',
    'seeds', 'layers', 'scales': {layer: [[mean over seeds of mean |x| at step s for each size] per step]},
    'slopes': {layer: [slope at each step]}, 'threshold', 'passed', 'worst': (layer, slope at the last step)}.
    Raises ConfigError for fewer than two different sizes, no step, or a size the config cannot take."""
    axis = "depth" if depths is not None else "width"
    sizes = list(depths if depths is not None else widths)
    flag = "--depths" if depths is not None else "--widths"
    if len(sizes) < 2 or len(set(sizes)) != len(sizes):
        raise ConfigError(f"{flag} {','.join(map(str, sizes))}: give at least two different {axis}s")
    if steps < 1:
        raise ConfigError(f"--steps {steps}: give at least one step")
    device = torch.device(device)
    base = None
    if axis == "depth":
        if cfg.parametrization == "completep":
            base = base_depth or min(sizes)
        configs = [at_depth(cfg, d, base) for d in sizes]
    else:
        if cfg.parametrization != "sp":
            base = base_width or cfg.base_d_model or min(sizes)
        configs = [at_width(cfg, w, base) for w in sizes]
    runs = [
        [train_and_record(c, tc, steps, seed, tokens, device, last_block=axis == "depth") for seed in seeds]
        for c in configs
    ]
    layers = list(runs[0][0])
    scales = {
        layer: [[float(np.mean([r[layer][s] for r in per_size])) for per_size in runs] for s in range(steps)]
        for layer in layers
    }
    slopes = {layer: [slope(sizes, scales[layer][s]) for s in range(steps)] for layer in layers}
    worst = max(layers, key=lambda n: abs(slopes[n][-1]))
    return {
        "parametrization": cfg.parametrization,
        "axis": axis,
        "sizes": sizes,
        "widths": sizes if axis == "width" else [cfg.d_model],
        "base": base,
        "steps": steps,
        "seeds": list(seeds),
        "layers": layers,
        "scales": scales,
        "slopes": slopes,
        "threshold": threshold,
        "passed": abs(slopes[worst][-1]) < threshold,
        "worst": (worst, slopes[worst][-1]),
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "lr": tc.lr,
        "batch": tc.batch_size,
        "context": cfg.context_length,
    }


def format_result(res: dict) -> str:
    """The check as a text table: one row per layer and step, mean |x| per width, the slope; then the
    verdict."""
    axis, sizes = res.get("axis", "width"), res.get("sizes", res["widths"])
    if axis == "depth":
        base = f" (base_n_layers {res['base']})" if res["base"] else ""
        shape = (
            f"depths {', '.join(map(str, sizes))} layers{base} at d_model {res['widths'][0]}, {res['n_heads']} heads"
        )
    else:
        base = f" (base_d_model {res['base']})" if res["base"] else ""
        shape = f"widths {', '.join(map(str, sizes))}{base}, {res['n_layers']} layers x {res['n_heads']} heads"
    lines = [
        f"coordinate check, parametrization={res['parametrization']}: {shape}, {res['steps']} AdamW steps at lr "
        f"{res['lr']:g}, batch {res['batch']} x {res['context']} tokens, seed(s) "
        f"{', '.join(map(str, res['seeds']))}",
        "mean |x| per coordinate at each step's forward (step 1: at initialisation); slope: of log(mean |x|) "
        f"against log({axis})",
        "",
    ]
    head = ["layer", "step"] + [f"{axis} {w}" for w in sizes] + ["slope"]
    rows = [
        [layer, str(s + 1)] + [f"{v:.4g}" for v in res["scales"][layer][s]] + [f"{res['slopes'][layer][s]:+.2f}"]
        for layer in res["layers"]
        for s in range(res["steps"])
    ]
    widths_col = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  ".join(
        c.ljust(widths_col[i]) if i < 2 else c.rjust(widths_col[i])  # noqa: E731
        for i, c in enumerate(r)
    ).rstrip()
    lines += [fmt(head)] + [fmt(r) for r in rows] + [""]
    last = ", ".join(f"{layer} {res['slopes'][layer][-1]:+.2f}" for layer in res["layers"])
    lines.append(f"slopes at step {res['steps']}: {last}")
    layer, worst = res["worst"]
    if res["passed"]:
        lines.append(
            f"PASS: every |slope| < {res['threshold']:g} at step {res['steps']} (largest: {layer}, "
            f"{worst:+.2f}): the activations' size does not change with the {axis}"
        )
    else:
        lines.append(
            f"FAIL: {layer} has slope {worst:+.2f} at step {res['steps']} (|slope| >= {res['threshold']:g}):"
            f" its activations' size changes with the {axis}"
        )
    return "\n".join(lines)


def plot_result(res: dict, path: Path) -> Path:
    """A PNG of the check (matplotlib, Agg): one panel per layer, mean |x| against width (log-log), one
    line per step. Refuses (CheckpointError) to overwrite a file lmlab did not write."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--out needs matplotlib (pip install 'lmlab[plot]')") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    check_own_outputs([path])
    layers = res["layers"]
    cols = min(4, len(layers))
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax, layer in zip(axes.flat, layers):
        for s, values in enumerate(res["scales"][layer]):
            ax.plot(
                res.get("sizes", res["widths"]),
                values,
                marker="o",
                label=f"step {s + 1}",
                color=plt.cm.viridis(s / max(1, res["steps"] - 1)),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{layer} (slope {res['slopes'][layer][-1]:+.2f})", fontsize=9)
        ax.set_xlabel("width (d_model)" if res.get("axis", "width") == "width" else "depth (n_layers)", fontsize=8)
    for ax in list(axes.flat)[len(layers) :]:
        ax.axis("off")
    axes.flat[0].set_ylabel("mean |x|", fontsize=8)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"coordinate check: {res['parametrization']} ({'PASS' if res['passed'] else 'FAIL'})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path)
    plt.close(fig)
    return path


def train_settings(tc):
    """The train settings the check uses from ``tc``: its lr, batch size, betas, eps and weight decay (no
    schedule, no clipping); AdamW only (Muon is refused: the check is of the Adam rules)."""
    if tc.optimizer != "adamw":
        raise ConfigError(
            f"optimizer={tc.optimizer!r}: the coordinate check trains with AdamW (the rules of "
            f"lmlab's parametrizations are Adam's); drop optimizer"
        )
    return replace(tc, warmup_steps=0, schedule="constant")


def run_coordcheck(
    config,
    preset: Optional[str],
    scale: str,
    sets: list[str],
    parametrization: Optional[str],
    widths: Optional[Sequence[int]],
    depths: Optional[Sequence[int]],
    base_width: Optional[int],
    base_depth: Optional[int],
    lr: Optional[float],
    batch_size: Optional[int],
    steps: int,
    seeds: Sequence[int],
    data,
    device: torch.device,
    threshold: float = THRESHOLD,
) -> dict:
    """``lmlab coordcheck``: the model of a config file, a preset (at ``scale``) or, with neither, this
    check's own small one (:data:`DEFAULT_MODEL`, :data:`DEFAULT_TRAIN`), under ``sets`` (``--set``
    overrides) and ``parametrization``; checked at ``widths`` (default 64, 128, 256) or ``depths`` on
    the default corpus (``data``: a prepared folder, None, or ``"random"`` for random ids). Every size is
    validated before any data is prepared or model trained. Returns :func:`coord_check`'s result.
    Raises ConfigError for fewer than two different sizes, flags of the other axis or of another
    parametrization, or a vocabulary below the data's."""

    widths_given = widths is not None
    widths = list(widths) if widths is not None else [64, 128, 256]
    if depths is not None:
        if len(depths) < 2 or len(set(depths)) != len(depths):
            raise ConfigError(f"--depths {','.join(map(str, depths))}: give at least two different depths")
        if widths_given or base_width:
            raise ConfigError(
                "--depths checks over depth at the config's d_model: drop --widths / --base-width "
                "(set the width with --set d_model=N)"
            )
    elif len(widths) < 2 or len(set(widths)) != len(widths):
        raise ConfigError(f"--widths {','.join(map(str, widths))}: give at least two different widths")
    if base_depth and depths is None:
        raise ConfigError("--base-depth applies to a check over depth: give --depths")
    if not (config or preset):  # the check's own small model and lr, under any --set
        sets = [f"{k}={v}" for k, v in {**DEFAULT_MODEL, **DEFAULT_TRAIN}.items()] + list(sets)
    if parametrization:
        sets = list(sets) + [f"parametrization={parametrization}"]

    def configs(vocab: int):
        cfg, tc = build_configs(config, preset, scale, sets, vocab)
        if base_width and cfg.parametrization == "sp":
            raise ConfigError(
                f"--base-width {base_width} applies to --parametrization mup or completep (sp has no base width)"
            )
        tc = train_settings(tc)
        tc = replace(
            tc, lr=lr if lr is not None else tc.lr, batch_size=batch_size if batch_size is not None else tc.batch_size
        )
        if base_depth and cfg.parametrization != "completep":
            raise ConfigError(
                f"--base-depth {base_depth} applies to --parametrization completep (only it "
                f"scales the residual branches with depth)"
            )
        if depths is not None:  # every size checked before any data is prepared or any model trained
            for d in depths:
                at_depth(cfg, d, base_depth or min(depths))
        else:
            for w in widths:
                at_width(cfg, w, base_width or cfg.base_d_model or min(widths))
        return cfg, tc

    random = data == "random"
    cfg, tc = configs(RANDOM_VOCAB if random else DEFAULT_VOCAB)
    tokens = None
    if not random:
        from lmlab.data.shards import TokenData

        prepared = TokenData(ensure_default_data(data))
        tokens = prepared.tokens("train")
        cfg, tc = configs(prepared.vocab_size)
        if cfg.vocab_size < prepared.vocab_size:
            raise ConfigError(f"vocab_size={cfg.vocab_size} is below the {prepared.vocab_size} tokens of the data")
    return coord_check(cfg, tc, widths, steps, seeds, tokens, device, threshold, base_width, depths, base_depth)
