"""A parsed spec (:mod:`lmlab.lab.spec`) turned into runs: each variant's configs at each scale, tuned
value and seed, with the held quantity solved (``match``), the budget in steps, and the quantities
(parameters, FLOPs per token, tokens) the report's controls compare. ``lmlab sweep --dry-run`` prints
this plan."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lmlab.analysis import flops_per_token as fpt
from lmlab.config import ConfigError, ModelConfig
from lmlab.data.shards import TokenData
from lmlab.lab.axes import _field_names, _fmt, variant_data
from lmlab.lab.claims import TIMING_METRICS
from lmlab.lab.spec import QUANTITIES, SWEEP_TRAIN_DEFAULTS, Spec
from lmlab.lab.spec_blocks import Match
from lmlab.param_counts import param_counts
from lmlab.runs import DEFAULT_VOCAB, check_run_memory, ensure_default_data


@dataclass
class RunPlan:
    name: str
    variant: str
    seed: int
    fields: dict
    cfg: ModelConfig
    tc: Any  # TrainConfig
    tokens_per_step: int
    flops_per_token: float
    data: Path
    scale: Optional[str] = None  # the ladder rung's label, None without scales
    tune: dict = field(default_factory=dict)  # the tuned values this run trains with
    solved: dict = field(default_factory=dict)  # the size fields the match control set
    # stage 2 of two-stage tuning (Spec.tune_seeds): trained only if stage 1 chose this run's tuned
    # values for its (scale, variant); see lmlab.lab.runner
    stage2: bool = False

    @property
    def steps(self) -> int:
        return self.tc.max_steps

    @property
    def tokens(self) -> int:
        return self.tc.max_steps * self.tokens_per_step

    @property
    def flops(self) -> float:
        return self.tokens * self.flops_per_token

    @property
    def cell(self) -> tuple:
        """(scale, variant, tuned values): the runs of one cell differ only by seed."""
        return (self.scale, self.variant, json.dumps(self.tune, sort_keys=True))


# --- controls ------------------------------------------------------------------------------
def measure(cfg: ModelConfig, quantity: str) -> float:
    """A size of ``cfg`` by formula (:mod:`lmlab.analysis`): ``params``, ``non_embedding_params`` or
    ``flops_per_token`` (training FLOPs per token at the model's context)."""

    if quantity == "flops_per_token":
        return flops_per_token(cfg)
    counts = param_counts(cfg)
    return float(counts["total"] if quantity == "params" else counts["non_embedding"])


def solve_size(model: dict, match: Match, target: float, where: str) -> tuple[dict, dict]:
    """Set ``match.solve`` in the model mapping ``model`` (a multiple of ``match.multiple``) so that
    ``measure(cfg, match.hold)`` is as close to ``target`` as the grid allows. Solving ``d_model`` keeps
    head_dim and the query/KV group size (n_heads = d_model / head_dim); solving ``d_ff`` replaces an
    ``ffn_ratio``. Returns (the new mapping, {field: value set}); raises ConfigError when the closest
    value is more than ``match.tolerance`` off the target (the message gives it and the target)."""
    base = ModelConfig.from_dict(model, f"{where} model")
    step, extra = match.multiple, {}
    if match.solve == "d_model":
        step = math.lcm(step, base.head_dim)
        group = base.n_heads // base.n_kv_heads

    def build(k: int) -> tuple[dict, ModelConfig]:
        value = k * step
        m = dict(model)
        m[match.solve] = value
        if match.solve == "d_ff":
            m.pop("ffn_ratio", None)
        if match.solve == "d_model":
            heads = value // base.head_dim
            m.update(n_heads=heads, head_dim=base.head_dim)
            if heads % group == 0:
                m["n_kv_heads"] = heads // group
            else:
                m["n_kv_heads"] = math.gcd(heads, base.n_kv_heads)
        return m, ModelConfig.from_dict(m, f"{where} model ({match.solve}={value} solved for {match.hold})")

    f = lambda k: measure(build(k)[1], match.hold)  # noqa: E731 -- increasing in k
    lo, hi = 1, 1
    while f(hi) < target:
        lo, hi = hi, hi * 2
        if hi > 1 << 24:
            raise ConfigError(f"{where}: no {match.solve} reaches {match.hold}={target:,.0f}")
    while hi - lo > 1:  # f(lo) < target <= f(hi), or lo == hi == 1
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    k = min({lo, hi}, key=lambda k: abs(f(k) - target))
    m, cfg = build(k)
    got = measure(cfg, match.hold)
    if abs(got - target) > match.tolerance * target:
        raise ConfigError(
            f"{where}: {match.solve}={k * step} gives {match.hold}={got:,.0f}, "
            f"{100 * (got / target - 1):+.1f}% off the target {target:,.0f} (tolerance "
            f"{100 * match.tolerance:g}%); use a smaller match.multiple or another match.solve"
        )
    extra = {kk: m[kk] for kk in (match.solve, "n_heads", "n_kv_heads") if kk in m and m[kk] != model.get(kk)}
    return m, extra


def control_flags(cells: dict, baseline: str, hold: Optional[str], varies: list, limit: float = 0.05) -> dict:
    """Per (scale, variant) the quantities (QUANTITIES) that differ from the same scale's baseline by more
    than ``limit`` (a fraction), unless held (``hold``) or declared in ``varies``: {key: [(quantity,
    relative difference)]}. ``cells`` maps (scale, variant) -> {quantity: value}."""
    out: dict = {}
    for (scale, variant), q in cells.items():
        ref = cells.get((scale, baseline))
        if ref is None or variant == baseline:
            continue
        bad = []
        for name in QUANTITIES:
            if name == hold or name in varies or not q.get(name) or not ref.get(name):
                continue
            rel = q[name] / ref[name] - 1
            if abs(rel) > limit:
                bad.append((name, rel))
        if bad:
            out[(scale, variant)] = bad
    return out


# --- plan ----------------------------------------------------------------------------------
def slug(text: str) -> str:
    """A folder-name-safe version of a label."""
    s = re.sub(r"[^A-Za-z0-9._+=-]+", "-", text.replace(", ", "_")).strip("-.")
    return s or "run"


def run_stem(variant: str, scale: Optional[str], tune: dict) -> str:
    """A run's name before its seed: variant, scale and tuned values (``SwiGLU_d128_lr=0.003``)."""
    return slug(variant) + (f"_{slug(scale)}" if scale else "") + "".join(f"_{k}={_fmt(x)}" for k, x in tune.items())


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token at the model's context (:func:`lmlab.analysis.flops_per_token`)."""

    return float(fpt(cfg, cfg.context_length, training=True))


def budget_steps(budget: dict, tokens_per_step: int, flops_per_tok: float, default_steps: int) -> int:
    """Training steps a budget buys: ``steps``; floor(tokens / tokens per step); floor(FLOPs / (training
    FLOPs per token x tokens per step)); for ``seconds`` the step cap (``steps`` or the spec's max_steps).
    Raises ConfigError when a tokens or FLOPs budget buys no whole step."""
    if "tokens" in budget:
        steps = int(budget["tokens"] // tokens_per_step)
        unit = f"{tokens_per_step:,} tokens"
    elif "flops" in budget:
        steps = int(budget["flops"] // (flops_per_tok * tokens_per_step))
        unit = f"{flops_per_tok * tokens_per_step:.3g} FLOPs"
    else:
        return int(budget.get("steps", default_steps))
    if steps < 1:
        key = "tokens" if "tokens" in budget else "flops"
        raise ConfigError(f"budget {key}={budget[key]:g} buys no training step (one step is {unit}); raise the budget")
    return steps


def plan_runs(spec: Spec, data_dir: Optional[Path] = None) -> list[RunPlan]:
    """Every (scale, variant, tuned values, seed) of ``spec`` with its validated ModelConfig and
    TrainConfig, the match control solved and the memory checked. Without ``data_dir`` the spec's data
    (or the default corpus, prepared on first use) is used; every run is checked before anything is
    prepared. A variant with a ``data:`` field trains on that (:func:`variant_data`); ``data_dir``
    together with such variants raises ConfigError (it could not replace their data)."""

    if data_dir is None:
        if isinstance(spec.data, dict):  # the default corpus with the spec's tokenizer
            _, vocab = variant_data(spec.data, None, prepare=False)
        else:
            vocab = TokenData(spec.data).vocab_size if spec.data else DEFAULT_VOCAB
        plans = _plan(spec, None, vocab, False)
        for p in {p.cell: p for p in plans}.values():
            check_run_memory(p.cfg, p.tc)
        data_dir = (
            variant_data(spec.data, None, prepare=True)[0]
            if isinstance(spec.data, dict)
            else ensure_default_data(spec.data)
        )
        return _plan(spec, Path(data_dir).resolve(), TokenData(data_dir).vocab_size, True)
    own = [v.label for v in spec.variants if "data" in v.fields]
    if own:
        raise ConfigError(
            f"{spec.path or 'sweep spec'}: variant(s) {', '.join(map(repr, own))} train on their own data "
            f"(their 'data:' field), which --data {str(data_dir)!r} would not replace; run without --data, "
            f"or give those variants prepared folders of your corpus (data: PATH, from `lmlab prepare`)"
        )
    data_dir = Path(data_dir).resolve()
    plans = _plan(spec, data_dir, TokenData(data_dir).vocab_size, True)
    for p in {p.cell: p for p in plans}.values():
        check_run_memory(p.cfg, p.tc)
    return plans


def trained_plans(plans: list[RunPlan]) -> list[RunPlan]:
    """The runs a sweep of ``plans`` trains: every stage-1 plan, plus one stage-2 plan per (scale,
    variant, seed) standing for the run at the value stage 1 chooses (its tuned values are the first
    candidate's, so its steps, tokens and FLOPs are those of that value)."""
    stage2: dict = {}
    for p in plans:
        if p.stage2:
            stage2.setdefault((p.scale, p.variant, p.seed), p)
    return [p for p in plans if not p.stage2] + list(stage2.values())


def _split_fields(fields: dict) -> tuple[dict, dict]:
    model_keys, train_keys = _field_names()
    return (
        {k: x for k, x in fields.items() if k in model_keys},
        {k: x for k, x in fields.items() if k in train_keys and k not in model_keys},
    )


def _plan(spec: Spec, data_dir: Optional[Path], vocab: int, prepare: bool = False) -> list[RunPlan]:
    """The runs of ``spec`` on ``data_dir`` (tokenizer vocabulary ``vocab``); a variant with its own
    ``data:`` trains on that (prepared first when ``prepare``)."""
    from lmlab.train import TrainConfig

    base_model: dict = {}
    if spec.preset:
        from lmlab.presets import get_preset

        preset = get_preset(spec.preset)
        base_model = {**preset.real, **(preset.tiny if spec.scale == "tiny" else {})}
    tune_combos = [dict(zip(spec.tune, combo)) for combo in itertools.product(*spec.tune.values())] or [{}]
    plans, names = [], set()
    for scale in spec.scales or [None]:
        scale_fields = scale.fields if scale else {}
        sm, st = _split_fields(scale_fields)
        models, datas = {}, {}
        for v in spec.variants:
            vm, _ = _split_fields(v.fields)
            model = {**base_model, **spec.model, **sm, **vm}
            vdata, vvocab = (data_dir, vocab)
            if "data" in v.fields:
                vdata, vvocab = variant_data(v.fields["data"], data_dir, prepare)
            datas[v.label] = vdata
            if "vocab_size" not in model:
                model["vocab_size"] = vvocab  # the data's tokenizer decides
            models[v.label] = model
        target = None
        if spec.match and spec.match.solve:
            where = f"{spec.path or 'sweep spec'}, baseline {spec.baseline!r}" + (
                f", scale {scale.label!r}" if scale else ""
            )
            target = spec.match.target
            if target == "baseline":
                target = measure(ModelConfig.from_dict(models[spec.baseline], f"{where} model"), spec.match.hold)
        for v in spec.variants:
            where = f"{spec.path or 'sweep spec'}, variant {v.label!r}" + (f", scale {scale.label!r}" if scale else "")
            model, solved = models[v.label], {}
            if target is not None and not (v.label == spec.baseline and spec.match.target == "baseline"):
                model, solved = solve_size(model, spec.match, target, where)
            _, vt = _split_fields(v.fields)
            for tune in tune_combos:
                tm, tt = _split_fields(tune)
                try:
                    cfg = ModelConfig.from_dict({**model, **tm}, f"{where} model")
                except TypeError as exc:
                    raise ConfigError(f"{where}: {exc}") from None
                for seed in spec.seeds:
                    train = {**SWEEP_TRAIN_DEFAULTS, **spec.train, **st, **vt, **tt, "seed": seed}
                    try:
                        tc = TrainConfig.from_dict(train, f"{where} train")
                    except TypeError as exc:
                        raise ConfigError(f"{where}: {exc}") from None
                    tps = tc.batch_size * tc.grad_accum * cfg.context_length
                    fpt = flops_per_token(cfg)
                    try:
                        steps = budget_steps(spec.budget, tps, fpt, tc.max_steps)
                    except ConfigError as exc:
                        raise ConfigError(f"{where}: {exc}") from None
                    changes = {"max_steps": steps}
                    if "seconds" in spec.budget:
                        changes["max_seconds"] = float(spec.budget["seconds"])
                    tc = dataclasses.replace(tc, **changes)
                    stem = run_stem(v.label, scale.label if scale else None, tune)
                    name, k = f"{stem}-s{seed}", 2
                    while name in names:  # two labels with one slug
                        name = f"{stem}-{k}-s{seed}"
                        k += 1
                    names.add(name)
                    fields_ = {**scale_fields, **v.fields, **solved, **tune}
                    plans.append(
                        RunPlan(
                            name,
                            v.label,
                            seed,
                            fields_,
                            cfg,
                            tc,
                            tps,
                            fpt,
                            datas[v.label],
                            scale.label if scale else None,
                            dict(tune),
                            solved,
                            bool(spec.tune_seeds) and seed not in spec.tune_seeds,
                        )
                    )
    if spec.match and spec.match.hold in ("tokens", "flops"):
        _check_budget_hold(spec, plans)
    return plans


def _check_budget_hold(spec: Spec, plans: list[RunPlan]) -> None:
    """``match: tokens | flops``: every run's training tokens (FLOPs) within the tolerance of the
    baseline's at its scale; raises ConfigError naming the first that is not."""
    key = spec.match.hold
    ref = {p.scale: getattr(p, key) for p in plans if p.variant == spec.baseline}
    for p in plans:
        got, want = getattr(p, key), ref[p.scale]
        if abs(got - want) > spec.match.tolerance * want:
            raise ConfigError(
                f"{spec.path or 'sweep spec'}: match.hold={key}, but run {p.name!r} trains "
                f"{got:.4g} {key}, {100 * (got / want - 1):+.1f}% off the baseline's {want:.4g}; "
                f"set budget: {{{key}: ...}} so every variant gets the same"
            )


def plan_quantities(plans: list[RunPlan]) -> dict:
    """(scale, variant) -> {quantity: value} of the planned runs (first run of each), for control_flags."""

    out = {}
    for p in plans:
        key = (p.scale, p.variant)
        if key not in out:
            c = param_counts(p.cfg)
            out[key] = {
                "params": c["total"],
                "non_embedding_params": c["non_embedding"],
                "flops_per_token": p.flops_per_token,
                "tokens": p.tokens,
                "flops": p.flops,
                "steps": p.steps,
            }
    return out


def most_epochs(plans: list[RunPlan]) -> tuple[float, int, Path, int]:
    """(passes, training tokens, data folder, tokens read) of the run that reads its data's training
    split most often."""

    worst = None
    for data in dict.fromkeys(p.data for p in plans):
        train = int(TokenData(data).manifest["splits"]["train"]["tokens"])
        most = max(p.tokens for p in plans if p.data == data)
        if worst is None or most / max(train, 1) > worst[0]:
            worst = (most / max(train, 1), train, data, most)
    return worst


def epochs_line(plans: list[RunPlan]) -> str:
    """How many passes over the data's training split the longest run makes; past one pass the
    comparison is made on repeated data (a different regime: memorisation, where dropout and weight
    decay act differently), so the line then starts with ``warning:``."""
    epochs, train, data, most = most_epochs(plans)
    text = (
        f"data: {train:,} training tokens in {data}; the run with the most passes reads {most:,} ({epochs:.2f} epochs)"
    )
    if epochs > 1:
        text = (
            f"warning: {text}: the runs repeat the data; pass a larger corpus (`lmlab sweep --data DIR`, "
            f"a folder of `lmlab prepare`) for single-pass results"
        )
    return text


def too_few_tokens(spec: Spec, plans: list[RunPlan]) -> Optional[str]:
    """Why the data cannot carry the spec's runs (the longest reads its training split more than the
    spec's ``max_epochs`` times), or None."""
    if spec.max_epochs is None or not plans:
        return None
    epochs, train, data, most = most_epochs(plans)
    if epochs <= spec.max_epochs:
        return None
    return (
        f"{spec.name}: the longest run reads {most:,} tokens, {epochs:.1f} passes over the {train:,} training "
        f"tokens of {data}, and the spec allows max_epochs={spec.max_epochs:g}; give a corpus of at least "
        f"{math.ceil(most / spec.max_epochs):,} training tokens with --data DIR (a folder of `lmlab prepare "
        f"--data ...`: parquet shards, JSONL or a `datasets` save_to_disk folder such as FineWeb-Edu's)"
    )


def protocol_lines(spec: Spec) -> list[str]:
    """The dry run's account of the learning-rate protocol and what a verdict needs
    (:mod:`lmlab.lab.tuning`, :func:`lmlab.lab.verdicts.gate`), with a warning for each rule the spec's
    design cannot meet (its claims would get no verdict)."""
    t, j = spec.tuning, spec.judging
    L = []
    if spec.tune:
        n_tune = len(spec.tune_seeds) if spec.tune_seeds else len(spec.seeds)
        points = math.prod(len(v) for v in spec.tune.values())
        L.append(
            f"tuning: each variant's value from the mean over {n_tune} seed(s) on {points} value(s); "
            f"up to {t.extend} value(s) added past an edge that wins, per side and variant (runs not "
            f"counted above); unstable cells (a diverged seed, or seed SD > {t.unstable_ratio:g}x the "
            f"median) are never chosen"
        )
        if n_tune < t.min_seeds:
            L.append(
                f"warning: {n_tune} tuning seed(s) < tuning.min_seeds={t.min_seeds}: every claim will read "
                f"'rate not bracketed'"
            )
        if points < t.min_points:
            L.append(
                f"warning: {points} tuned value(s) < tuning.min_points={t.min_points}: claims read 'rate "
                f"not bracketed' unless the extension adds enough"
            )
    compared = len(spec.seeds) - (len(spec.tune_seeds) if spec.tune_seeds else 0)
    if spec.expect and compared < j.min_seeds and any(e.metric not in TIMING_METRICS for e in spec.expect):
        L.append(
            f"warning: {compared} compared seed(s) < judging.min_seeds={j.min_seeds}: claims on trained "
            f"quantities will read 'too few seeds'"
        )
    return L


def format_plan(plans: list[RunPlan], states: dict, spec: Optional[Spec] = None) -> str:
    """The dry-run table: one line per run (steps, tokens, FLOPs, parameters, state), the totals and,
    with ``spec``, the controls: quantities that differ > 5% from the baseline without being declared."""

    lines = [f"{'run':44} {'steps':>6} {'tokens':>11} {'train FLOPs':>11} {'params':>10} {'non-emb':>10}  state"]
    todo = trained_plans(plans)
    for p in (p for p in todo if not p.stage2):
        c = param_counts(p.cfg)
        lines.append(
            f"{p.name[:44]:44} {p.steps:>6} {p.tokens:>11,} {p.flops:>11.3g} {c['total']:>10,} "
            f"{c['non_embedding']:>10,}  {states[p.name]}"
        )
    # stage 2 of two-stage tuning: one run per (scale, variant, seed), at the value stage 1 chooses
    stage2 = [p for p in todo if p.stage2]
    done2 = sum(states[p.name] == "done" for p in plans if p.stage2)
    if stage2:
        seeds2 = sorted({p.seed for p in stage2})
        lines.append(
            f"stage 2: {len(stage2)} runs (each variant, seeds {', '.join(map(str, seeds2))}) at the "
            f"tuned values stage 1 chooses; {done2} done"
        )
    total = sum(p.flops for p in todo)
    lines.append(f"{len(todo)} runs, {sum(p.tokens for p in todo):,} tokens, {total:.3g} training FLOPs in all")
    if plans:
        lines.append(epochs_line(plans))
    short = [p for p in todo if p.tc.warmup_steps > p.steps]
    if short:
        p = short[0]
        lines.append(
            f"warning: {len(short)} run(s) end before their warmup does (e.g. {p.name}: warmup_steps="
            f"{p.tc.warmup_steps} > {p.steps} steps), so their learning rate never reaches its value; "
            f"set train: {{warmup_steps: ...}} below the budget"
        )
    if spec is not None:
        lines += protocol_lines(spec)
        per = {}  # (scale, variant) -> the fewest tokens per non-embedding parameter of its runs
        for p in todo:
            ne = param_counts(p.cfg)["non_embedding"]
            if ne:
                per[(p.scale, p.variant)] = min(per.get((p.scale, p.variant), math.inf), p.tokens / ne)
        if per:
            floor = spec.judging.tokens_per_param
            span = " to ".join(dict.fromkeys(f"{v:.3g}" for v in (min(per.values()), max(per.values()))))
            lines.append(
                f"tokens per non-embedding parameter: {span} "
                f"(a claim about trained quality needs {floor:g}, unless it sets its own floor)"
            )
            low = []
            for e in spec.expect:
                if e.metric in TIMING_METRICS:
                    continue
                f = e.floor if e.floor is not None else floor
                got = min((v for (sc, var), v in per.items() if var in (e.a, e.b)), default=math.inf)
                if got < f:
                    low.append(f"{e.text!r} ({got:.3g} < {f:g})")
            if low:
                lines.append(
                    f"warning: below their tokens-per-parameter floor, these claims will read 'not testable "
                    f"at this scale': {'; '.join(low)}"
                )
        if spec.match:
            solved = {(p.scale, p.variant): p.solved for p in plans if p.solved}
            lines.append(
                f"control: {spec.match.hold} held"
                + (f" by solving {spec.match.solve} (multiple {spec.match.multiple})" if spec.match.solve else "")
                + "".join(
                    f"; {v}{f' @{s}' if s else ''}: " + ", ".join(f"{k}={x}" for k, x in f.items())
                    for (s, v), f in solved.items()
                )
            )
        flags = control_flags(
            plan_quantities(plans), spec.baseline, spec.match.hold if spec.match else None, spec.varies
        )
        for (s, v), bad in flags.items():
            lines.append(
                f"warning: {v}{f' @{s}' if s else ''} differs from the baseline {spec.baseline!r} in "
                + ", ".join(f"{q} ({100 * r:+.0f}%)" for q, r in bad)
                + " (not held and not declared in 'varies:')"
            )
    return "\n".join(lines)
