"""The ablation spec: parse, expand into runs, and hold the controls (``lmlab sweep SPEC``).

A spec is a YAML mapping::

    name: gated-ffn                      # default: the file name
    claim: "..."                         # the claim under test, printed at the top of the report
    preset: llama-2-7b                   # optional base preset (scale: tiny by default)
    model: {d_model: 128, n_layers: 4}   # ModelConfig fields, over the preset
    train: {batch_size: 16, lr: 3.0e-3}  # TrainConfig fields
    data: data/shakespeare-bpe4096       # a prepared data folder (default: the default corpus, BPE 4096)
    axes:
      grid:                              # cartesian product of the axes
        parallel_block: [false, true]    # a field and its values ...
        norm:                            # ... or an axis of field bundles, each with an optional label
          - {label: RMSNorm, norm_type: rmsnorm}
          - {label: LayerNorm, norm_type: layernorm}
      zip:                               # lists varied together (equal lengths), crossed with the grid
        activation: [gelu, swiglu]
        label: [GELU, SwiGLU]            # optional
    baseline: GELU                       # the variant every other is compared with (default: the first)
    tune: {lr: [1.0e-3, 3.0e-3, 1.0e-2]} # trained at every value; the best per variant enters verdicts
    tune_seeds: [1]                      # optional two-stage tuning: only these seeds train the whole
                                         # grid; the other seeds train at the value they chose, and
                                         # only those (unbiased) seeds enter the comparisons
    match:                               # what is held fixed across variants (the control)
      hold: non_embedding_params         # non_embedding_params | params | flops_per_token | tokens | flops
      solve: d_ff                        # the size lmlab sets per variant to hold it: d_ff | d_model | n_layers
      multiple: 8                        # ... in steps of this (d_model: also a multiple of head_dim)
      target: baseline                   # the baseline variant's count, or a number
      tolerance: 0.02                    # every variant within 2% of the target, else an error
    varies: [flops_per_token]            # quantities meant to differ (others > 5% off baseline are flagged)
    expect:                              # the claims, each judged by lmlab.lab.stats.verdict
      - {better: SwiGLU, than: GELU, by: 0.01}     # SwiGLU lower by >= 0.01 bits/byte ("1%": relative)
      - {better: parallel, than: serial, by: -0.02}  # non-inferiority: parallel at most 0.02 worse
      - {equal: [RMSNorm, LayerNorm], within: 0.01}  # |difference| < 0.01 bits/byte
      - {better: RMSNorm, than: LayerNorm, metric: step_time, by: "5%"}  # from the timing block
      - better: wd 1                     # a claim with a precondition on its own runs: judged only when
        than: wd 0                       # the mechanism it is about is present (lmlab.lab.preconditions)
        requires: [{better: "wd 0, WSD", than: "wd 0, constant", by: 0.005}]
        floor: 20                        # tokens per non-embedding parameter (default judging's)
        published: [0.01, 0.05]          # the effect the literature reports (flagged when far outside)
    scales:                              # a ladder: the whole comparison at each size
      - {label: d64, d_model: 64}
      - {label: d128, d_model: 128}
    timing: {batch: 8, pairs: 15}        # interleaved step-time micro-benchmark (lmlab.lab.timing)
    init_grads: {depths: [4, 16]}        # per-layer gradient norms at initialisation (lmlab.lab.init_grads)
    confidence: 0.95                     # of every interval
    tolerated_within: 0.05               # bits/byte: the tuned values this close to a variant's best
                                         # are the range it tolerates (the report's "tolerated" column)
    tuning:                              # the learning-rate protocol (lmlab.lab.tuning); defaults shown
      min_seeds: 3                       # a rate is chosen from the mean over at least this many seeds
      min_points: 5                      # ... on at least this many (log-spaced) values
      extend: 2                          # values the sweep adds past an edge that wins, per side
      unstable_ratio: 3.0                # a cell whose seed SD exceeds this x the sweep's median cell SD
                                         # is unstable (bimodal), like one with a diverged seed: never "best"
      window: 2                          # lr_sensitivity: grid steps each side of a variant's own optimum
    judging:                             # what a verdict needs (lmlab.lab.verdicts); defaults shown
      min_seeds: 6                       # paired seeds before a verdict on a trained quantity
      tokens_per_param: 10               # tokens per non-embedding parameter below which a claim about
                                         # trained quality is "not testable at this scale" (per claim: floor)
      power: 0.8                         # of the smallest detectable effect stated on the page
    seeds: [1, 2, 3]
    max_epochs: 1                        # refuse data the longest run would read more than once
    budget: {steps: 300}                 # or {tokens: N}, {flops: F} (training FLOPs per run, converted
                                         # with lmlab.analysis.flops_per_token), {seconds: S} (wall time)
    eval_contexts: [1, 2]                # held-out bits-per-byte at 1x and 2x the training context
    measure_decode: true                 # KV-cache decode tokens/s per trained run (information only)
    loss_by_position: true               # held-out loss at each context position (the report's figure)
    tiers:                               # named sizes of the same comparison: `lmlab sweep SPEC --tier gpu`
      gpu:                               # model/train merged field by field, other keys replaced
        model: {d_model: 512, n_layers: 8, context_length: 512}
        train: {batch_size: 32, dtype: bf16}
        budget: {tokens: 5.2e+8}

Axis values name ModelConfig or TrainConfig fields (found by name, as ``--set`` does). A *cell* is one
(scale, variant, tuned values); each cell is trained once per seed. Runs with the same seed see the
same batches in the same order (the data order is a function of the seed and the step), so differences
between variants are paired by seed (:mod:`lmlab.lab.stats`). Metrics for ``expect``: ``val_bpb``
(default; held-out bits/byte), ``val_bpb_2x`` (at an ``eval_contexts`` multiple), ``final_train_loss``,
``step_time`` and ``decode_time`` (ratios from the timing block), ``lr_sensitivity`` (Wortsman et al.
2023: the mean of min(bits/byte, the untrained model's) minus the best over the tuned values around each
variant's own optimum, per seed; see :func:`lmlab.lab.tuning.sensitivity`).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lmlab.config import ConfigError, ModelConfig, check_keys
from lmlab.config_files import load_mapping
from lmlab.lab.axes import _check_variant_data, expand_axes, parse_scales
from lmlab.lab.claims import TIMING_METRICS, parse_expect
from lmlab.lab.spec_blocks import (
    Match,
    _number,
    parse_init_grads,
    parse_match,
    parse_timing,
    parse_tune,
    parse_tune_seeds,
)

SPECS_DIR = Path(__file__).resolve().parents[1] / "specs"
SPEC_KEYS = (
    "name",
    "claim",
    "preset",
    "scale",
    "model",
    "train",
    "data",
    "axes",
    "seeds",
    "budget",
    "eval_contexts",
    "measure_decode",
    "loss_by_position",
    "decode",
    "notes",
    "baseline",
    "tune",
    "tune_seeds",
    "match",
    "varies",
    "expect",
    "scales",
    "timing",
    "confidence",
    "tolerated_within",
    "init_grads",
    "tiers",
    "tuning",
    "judging",
    "max_epochs",
    "max_runs",
)
MAX_RUNS = 10_000  # runs a spec may plan unless it (max_runs:) or `lmlab sweep --max-runs N` allows more
BUDGET_KEYS = ("steps", "tokens", "flops", "seconds")
# training settings a sweep changes from TrainConfig's defaults unless the spec sets them: fp32 and no
# compile, so that neither the machine's bf16 support nor a per-run compile decision (compile=auto,
# measured per run) differs between a spec's runs or its executions
SWEEP_TRAIN_DEFAULTS = {
    "tensorboard": False,
    "keep_checkpoints": 1,
    "checkpoint_interval": 100,
    "dtype": "fp32",
    "compile": False,
    "compile_scope": "model",
}
DECODE_DEFAULTS = {"batch": 8, "prompt_len": 32, "new_tokens": 64, "repeats": 3}
QUANTITIES = ("params", "non_embedding_params", "flops_per_token", "tokens", "flops", "steps")
# what a tier (``tiers: {gpu: {...}}``) may change: model/train are merged over the spec's, the rest replaced
TIER_KEYS = (
    "model",
    "train",
    "data",
    "axes",
    "seeds",
    "tune_seeds",
    "budget",
    "tune",
    "match",
    "scales",
    "timing",
    "notes",
    "eval_contexts",
    "expect",
    "varies",
    "baseline",
    "tuning",
    "judging",
    "max_epochs",
)


@dataclass
class Tuning:
    """The learning-rate protocol (:mod:`lmlab.lab.tuning`): a variant's value is chosen from the mean
    over >= ``min_seeds`` seeds on >= ``min_points`` values, never in an unstable cell (a diverged seed,
    or a seed SD over ``unstable_ratio`` x the sweep's median cell SD); a best value at an edge of the
    grid makes the sweep add up to ``extend`` values past it (same log step); ``window`` grid steps each
    side of the optimum define the LR sensitivity."""

    min_seeds: int = 3
    min_points: int = 5
    extend: int = 2
    unstable_ratio: float = 3.0
    window: int = 2


@dataclass
class Judging:
    """What a verdict needs (:mod:`lmlab.lab.verdicts`): ``min_seeds`` paired seeds on a trained
    quantity, ``tokens_per_param`` tokens per non-embedding parameter for a claim about trained quality;
    the page states the smallest effect detectable at ``power``."""

    min_seeds: int = 6
    tokens_per_param: float = 10.0
    power: float = 0.8


@dataclass
class Spec:
    name: str
    claim: str
    path: Optional[Path]
    raw: dict
    preset: Optional[str]
    scale: str
    model: dict
    train: dict
    data: Any  # None, a prepared folder, or {tokenizer: ...} (the default corpus tokenised so)
    variants: list
    seeds: list
    budget: dict
    eval_contexts: list
    measure_decode: bool
    decode: dict
    baseline: str = ""
    tune: dict = field(default_factory=dict)  # field -> list of values
    tune_seeds: list = field(default_factory=list)  # [] = every seed trains the whole grid
    match: Optional[Match] = None
    varies: list = field(default_factory=list)
    expect: list = field(default_factory=list)  # Expectation
    scales: list = field(default_factory=list)  # Variant (label + fields); [] = one unnamed scale
    timing: Optional[dict] = None
    init_grads: Optional[dict] = None  # {depths, seeds, batch}: lmlab.lab.init_grads
    loss_by_position: bool = False  # record the held-out loss at every context position per run
    confidence: float = 0.95
    tolerated_within: float = 0.05  # bits/byte: a tuned value this close to a variant's best is tolerated
    tier: Optional[str] = None  # the tier the spec was read at (None: the spec as written, the CPU tier)
    tiers: list = field(default_factory=list)  # the tier names the spec defines
    tuning: Tuning = field(default_factory=Tuning)
    judging: Judging = field(default_factory=Judging)
    max_epochs: Optional[float] = None  # passes over the training data the longest run may make (None: any)
    planned_runs: int = 0  # runs planned (variants x scales x tuned values x seeds), counted before expanding

    @property
    def precision(self) -> str:
        """How the runs train: ``"fp32"`` or ``"bf16"`` (autocast), ``", compiled"`` added when
        ``train.compile`` is set; ``"... per variant"`` where a variant, scale or ``tune:`` sets it."""
        fields = [self.tune or {}, *(v.fields for v in [*self.variants, *self.scales])]
        varied = {k for k in ("dtype", "compile") if any(k in f for f in fields)}
        dtype = "dtype per variant" if "dtype" in varied else self.train.get("dtype") or "fp32"
        compiled = ", compiled" if self.train.get("compile") else ""
        return dtype + (", compile per variant" if "compile" in varied else compiled)


# --- spec ----------------------------------------------------------------------------------
def builtin_specs() -> dict[str, Path]:
    """Shipped specs by name (``lmlab/specs/NAME.yaml``)."""
    return {p.stem: p for p in sorted(SPECS_DIR.glob("*.yaml"))}


def resolve_spec_path(spec: str | Path) -> Path:
    """A spec file path, or the name of a shipped spec."""
    path = Path(spec)
    if path.is_file():
        return path
    shipped = builtin_specs()
    if str(spec) in shipped:
        return shipped[str(spec)]

    near = difflib.get_close_matches(str(spec), list(shipped), n=1)
    raise ConfigError(
        f"sweep spec {str(spec)!r} is neither a file nor a shipped spec"
        + (f"; did you mean {near[0]!r}?" if near else f"; shipped: {', '.join(shipped)}")
    )


def parse_budget(budget: Any, source: str = "budget") -> dict:
    """``{steps|tokens|flops|seconds: N}``; ``seconds`` may come with ``steps`` (the step cap, over
    which the LR schedule runs)."""
    if budget is None:
        return {}
    if not isinstance(budget, dict):
        raise ConfigError(f"{source}: expected a mapping such as {{steps: 300}}, got {budget!r}")
    unknown = set(budget) - set(BUDGET_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {sorted(unknown)}; use one of {', '.join(BUDGET_KEYS)}")
    keys = set(budget)
    if len(keys) > 1 and keys != {"seconds", "steps"}:
        raise ConfigError(
            f"{source}: give one of {', '.join(BUDGET_KEYS)} (or seconds with a steps cap), got {sorted(keys)}"
        )
    out = {k: _number(v, f"{source}.{k}") for k, v in budget.items()}
    for k in ("steps", "tokens"):
        if k in out:
            if out[k] != int(out[k]):
                raise ConfigError(f"{source}.{k}={budget[k]!r} must be an integer")
            out[k] = int(out[k])
    return out


def apply_tier(raw: dict, tier: Optional[str], source: str = "sweep spec", base: str = "sweep") -> dict:
    """The spec mapping at ``tier``: the spec's ``tiers.TIER`` entries over the spec (``model`` and
    ``train`` merged field by field, every other key in TIER_KEYS replaced), named ``NAME-TIER`` (NAME: the
    spec's ``name``, else ``base``, the file's stem) so its
    sweep gets a folder of its own; ``tier=None`` gives the spec as written. The ``tiers`` key itself is
    dropped either way, so the mapping recorded in a sweep folder is one plain spec. Raises ConfigError
    for a malformed ``tiers`` or a tier the spec does not define (naming the ones it does)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a sweep spec must be a mapping")
    tiers = raw.get("tiers") or {}
    if not isinstance(tiers, dict) or any(not isinstance(v, dict) for v in tiers.values()):
        raise ConfigError(
            f"{source}: tiers must map tier names to mappings of spec keys, e.g. "
            f"tiers: {{gpu: {{model: {{d_model: 512}}, budget: {{tokens: 2.0e7}}}}}}"
        )
    out = {k: v for k, v in raw.items() if k != "tiers"}
    if tier is None:
        return out
    if tier not in tiers:
        raise ConfigError(
            f"{source}: no tier {tier!r}; "
            + (
                f"this spec defines {', '.join(map(repr, tiers))}"
                if tiers
                else "this spec defines none (add a 'tiers:' mapping)"
            )
        )
    for key, value in tiers[tier].items():
        if key not in TIER_KEYS:
            raise ConfigError(
                f"{source}: tiers.{tier}.{key} is not a key a tier may set; valid: {', '.join(TIER_KEYS)}"
            )
        if key in ("model", "train"):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: tiers.{tier}.{key} must be a mapping of fields, got {value!r}")
            out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = value
    if "notes" not in tiers[tier] and out.get("notes"):  # the spec's notes describe the spec as written
        out["notes"] = (
            f"(The spec's notes, written for the spec as written; this sweep ran its tier {tier!r}, whose "
            f"model, training and budget are in this page's Setup above.) {str(out['notes']).strip()}"
        )
    out["name"] = f"{raw.get('name') or base}-{tier}"
    return out


def apply_switches(
    raw: dict, dtype: Optional[str] = None, compile: bool = False, source: str = "sweep spec", base: str = "sweep"
) -> dict:
    """The spec mapping with every run in precision ``dtype`` (fp32, bf16 or auto: the trainer's ``dtype``)
    instead of the spec's ``train.dtype``, and with ``compile`` every run compiled (``train.compile: true``;
    on Linux the fork server compiles each run shape once for all its runs: :mod:`lmlab.lab.fork_server`);
    nothing else changes. The sweep is named ``NAME-DTYPE``, ``NAME-compiled`` or ``NAME-DTYPE-compiled``
    so it gets a folder of its own; a switch that is already the spec's setting changes nothing. Raises
    ConfigError for another dtype (a spec whose variants, scales or ``tune:`` set the field themselves is
    refused by :func:`check_switches`, on the parsed spec)."""
    changes = {}
    if dtype is not None:
        if dtype not in ("fp32", "bf16", "auto"):
            raise ConfigError(f"--dtype {dtype!r}: choose fp32, bf16 or auto")
        changes["dtype"] = dtype
    if compile:
        changes["compile"] = True
    train = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    changes = {k: v for k, v in changes.items() if train.get(k, SWEEP_TRAIN_DEFAULTS[k]) != v}
    if not changes:
        return raw
    suffix = (f"-{changes['dtype']}" if "dtype" in changes else "") + ("-compiled" if "compile" in changes else "")
    return {**raw, "train": {**train, **changes}, "name": f"{raw.get('name') or base}{suffix}"}


def check_switches(spec: "Spec", dtype: Optional[str], compile: bool, source: str) -> None:
    """Refuse (ConfigError) a ``--dtype`` / ``--compile`` for a spec whose variants, scales or ``tune:``
    set that field themselves: the switch would override only some runs (a comparison of precisions, or
    of compile, half erased under a sweep name that claims one setting)."""
    for key, flag in (("dtype", f"--dtype {dtype}"), ("compile", "--compile")):
        if (key == "dtype" and dtype is None) or (key == "compile" and not compile):
            continue
        where = [f"variant {v.label!r}" for v in spec.variants if key in v.fields]
        where += [f"scale {v.label!r}" for v in spec.scales if key in v.fields]
        where += ["tune:"] if key in (spec.tune or {}) else []
        if where:
            raise ConfigError(
                f"{source}: {where[0]} sets {key} itself (the spec varies it); {flag} would override only the "
                f"other runs: run the spec as written"
            )


def parse_spec(
    raw: dict,
    path: Optional[Path] = None,
    tier: Optional[str] = None,
    max_runs: Optional[int] = None,
    dtype: Optional[str] = None,
    compile: bool = False,
) -> Spec:
    """Validate a spec mapping (see the module docstring) at ``tier`` (:func:`apply_tier`; None: as
    written) in ``dtype`` and with ``compile`` (:func:`apply_switches`; None / False: the spec's);
    raises ConfigError naming the key, and (:func:`check_run_count`) when it plans more runs than
    ``max_runs`` (None: the spec's ``max_runs:``, else :data:`MAX_RUNS`) before expanding them."""
    source = str(path) if path else "sweep spec"
    tiers = list(raw.get("tiers") or {}) if isinstance(raw, dict) and isinstance(raw.get("tiers"), dict) else []
    raw = apply_tier(raw, tier, source, path.stem if path else "sweep")
    raw = apply_switches(raw, dtype, compile, source, path.stem if path else "sweep")
    if not raw:
        raise ConfigError(
            f"{source}: the spec is empty; give at least 'axes' (the variants to compare) or "
            f"'model'/'train' settings (examples: lmlab/specs/*.yaml)"
        )
    unknown = [k for k in raw if k not in SPEC_KEYS]
    if unknown:
        import difflib

        near = difflib.get_close_matches(str(unknown[0]), SPEC_KEYS, n=1)
        raise ConfigError(
            f"{source}: unknown key {unknown[0]!r}"
            + (f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(SPEC_KEYS)}")
        )
    # counted before anything is expanded, or imported (torch): a 10^6-run spec is refused at once
    planned = check_run_count(raw, source, max_runs)
    from lmlab.train import TrainConfig

    for key in ("claim", "notes"):  # free text: a list or mapping here (YAML aliases) would be dumped whole
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"{source}: {key} must be text, got {type(raw[key]).__name__} {str(raw[key])[:60]!r}")
    for section in ("model", "train", "decode", "axes"):
        if section in raw and raw[section] is None:
            raise ConfigError(f"{source}: '{section}: null' is empty; give a mapping of fields or drop the key")
        if not isinstance(raw.get(section) or {}, dict):
            raise ConfigError(
                f"{source}: '{section}:' must be a mapping of field names to values, got {raw[section]!r}"
            )
    model = dict(raw.get("model") or {})
    train = dict(raw.get("train") or {})
    check_keys(ModelConfig, model, f"{source} model")
    check_keys(TrainConfig, train, f"{source} train")
    seeds = raw.get("seeds", [train.get("seed", TrainConfig.seed)])
    if (
        not isinstance(seeds, list)
        or not seeds
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ConfigError(f"{source}: seeds={seeds!r} must be a non-empty list of distinct integers >= 0")
    contexts = raw.get("eval_contexts", [1])
    if not isinstance(contexts, list) or any(
        isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0 for c in contexts
    ):
        raise ConfigError(
            f"{source}: eval_contexts={contexts!r} must be a list of finite context multiples, e.g. [1, 2]"
        )
    if any(c < 1 or int(c * 8) != c * 8 for c in contexts):
        raise ConfigError(
            f"{source}: eval_contexts={contexts!r}: multiples must be >= 1 and whole eighths (1, 1.5, 2, ...)"
        )
    decode = {**DECODE_DEFAULTS, **(raw.get("decode") or {})}
    if set(decode) != set(DECODE_DEFAULTS):
        raise ConfigError(f"{source}: decode keys must be among {', '.join(DECODE_DEFAULTS)}")
    for k, v in decode.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{source}: decode.{k}={v!r} must be an integer >= 1")
    if not isinstance(raw.get("measure_decode", False), bool):
        raise ConfigError(f"{source}: measure_decode must be true or false")
    if not isinstance(raw.get("loss_by_position", False), bool):
        raise ConfigError(f"{source}: loss_by_position must be true or false")
    preset = raw.get("preset")
    if preset is not None:
        from lmlab.presets import PRESETS

        if not isinstance(preset, str) or preset not in PRESETS:
            raise ConfigError(
                f"{source}: preset={preset!r} is not a model family preset; choose one of "
                f"{', '.join(sorted(PRESETS))} (see `lmlab presets`)"
            )
    scale = raw.get("scale", "tiny")
    if scale not in ("tiny", "real"):
        raise ConfigError(f"{source}: scale={scale!r} must be 'tiny' or 'real'")
    name = raw.get("name") or (path.stem if path else "sweep")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", str(name)):
        raise ConfigError(f"{source}: name={name!r} may hold only letters, digits, '.', '_' and '-'")
    variants = expand_axes(raw.get("axes"), f"{source} axes")
    labels = [v.label for v in variants]
    baseline = raw.get("baseline", labels[0])
    if str(baseline) not in labels:
        import difflib

        near = difflib.get_close_matches(str(baseline), labels, n=1)
        raise ConfigError(
            f"{source}: baseline={baseline!r} is not a variant"
            + (f"; did you mean {near[0]!r}?" if near else f"; variants: {', '.join(labels)}")
        )
    contexts = sorted({1, *contexts})
    varies = raw.get("varies") or []
    if not isinstance(varies, list) or any(q not in QUANTITIES for q in varies):
        raise ConfigError(f"{source}: varies={varies!r} must list quantities among {', '.join(QUANTITIES)}")
    confidence = raw.get("confidence", 0.95)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 <= confidence < 1:
        raise ConfigError(f"{source}: confidence={confidence!r} must be a probability in [0.5, 1), e.g. 0.95")
    tune = parse_tune(raw.get("tune"), source)
    tolerated = raw.get("tolerated_within", 0.05)
    if isinstance(tolerated, bool) or not isinstance(tolerated, (int, float)) or not tolerated > 0:
        raise ConfigError(f"{source}: tolerated_within={tolerated!r} must be a positive number of bits/byte, e.g. 0.05")
    tolerated = float(tolerated)
    clash = sorted(set(tune) & {k for v in variants for k in v.fields})
    if clash:
        raise ConfigError(f"{source}: {clash} is both tuned and set by a variant; tune a field the axes leave alone")
    tune_seeds = parse_tune_seeds(raw.get("tune_seeds"), seeds, tune, source)
    timing = parse_timing(raw.get("timing"), source)
    expect = parse_expect(raw.get("expect"), labels, str(baseline), contexts, source)
    if any(e.metric in TIMING_METRICS for e in expect) and timing is None:
        raise ConfigError(f"{source}: an expectation on step_time/decode_time needs a 'timing:' block")
    if any(e.metric == "attn_sink" for e in expect) and not train.get("diag_interval"):
        raise ConfigError(
            f"{source}: an expectation on attn_sink reads the diagnostics: set train.diag_interval (e.g. 50)"
        )
    if any(e.metric == "decode_time" for e in expect) and not timing["decode"]:
        raise ConfigError(f"{source}: an expectation on decode_time needs timing: {{decode: true}}")
    if any(e.metric == "lr_sensitivity" for e in expect) and math.prod(len(v) for v in tune.values()) < 2:
        raise ConfigError(
            f"{source}: an expectation on lr_sensitivity needs a tuned grid of at least 2 values, "
            f"e.g. tune: {{lr: [1.0e-3, 3.0e-3, 1.0e-2]}}"
        )
    if any(e.metric == "lr_sensitivity" for e in expect) and 0 < len(tune_seeds) < 2:
        raise ConfigError(
            f"{source}: an expectation on lr_sensitivity is judged over the seeds that train the whole "
            f"grid, and tune_seeds={tune_seeds!r} gives one (no interval); list at least two, or drop "
            f"tune_seeds"
        )
    spec = Spec(
        name=str(name),
        claim=str(raw.get("claim") or "").strip(),
        path=path,
        raw=raw,
        preset=raw.get("preset"),
        scale=scale,
        model=model,
        train=train,
        data=_spec_data(raw.get("data"), source),
        variants=variants,
        seeds=seeds,
        budget=parse_budget(raw.get("budget"), f"{source} budget"),
        eval_contexts=contexts,
        measure_decode=raw.get("measure_decode", False),
        loss_by_position=raw.get("loss_by_position", False),
        decode=decode,
        baseline=str(baseline),
        tune=tune,
        tune_seeds=tune_seeds,
        match=parse_match(raw.get("match"), source),
        varies=varies,
        expect=expect,
        scales=parse_scales(raw.get("scales"), source),
        timing=timing,
        init_grads=parse_init_grads(raw.get("init_grads"), seeds, source),
        confidence=float(confidence),
        tolerated_within=tolerated,
        tier=tier,
        tiers=tiers,
        tuning=parse_block(raw.get("tuning"), Tuning, f"{source}.tuning"),
        judging=parse_block(raw.get("judging"), Judging, f"{source}.judging"),
        max_epochs=parse_max_epochs(raw.get("max_epochs"), source),
        planned_runs=planned,
    )
    check_switches(spec, dtype, compile, source)
    return spec


def parse_max_epochs(value: Any, source: str) -> Optional[float]:
    """``max_epochs``: the most passes over its data's training split the longest run may make; a
    sweep whose data is smaller refuses to start (:func:`lmlab.lab.runner.run_sweep`). None: any."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{source}: max_epochs must be a positive number of passes over the training data (e.g. 1), got {value!r}"
        )
    return float(value)


def parse_block(raw: Any, cls: type, where: str):
    """``tuning:`` / ``judging:``: a mapping over the fields of ``cls`` (:class:`Tuning`,
    :class:`Judging`), each a number of the field's type; absent fields keep their defaults. Raises
    ConfigError naming the key and the valid ones."""
    if raw is None:
        return cls()
    names = list(cls.__dataclass_fields__)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with keys among {', '.join(names)}, got {raw!r}")
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid: {', '.join(names)}")
    out = cls()
    for k, v in raw.items():
        default = getattr(out, k)
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if isinstance(default, int) and not isinstance(default, bool):
            ok = ok and isinstance(v, int) and v >= 0 and (v >= 1 or k == "extend")
        else:
            ok = ok and v >= 0 and (k != "power" or 0.5 <= v < 1) and (k != "unstable_ratio" or v > 1)
        if not ok:
            what = {
                "power": "a probability in [0.5, 1)",
                "unstable_ratio": "a number > 1",
                "extend": "an integer >= 0",
                "tokens_per_param": "a number >= 0",
            }.get(k, "an integer >= 1")
            raise ConfigError(f"{where}.{k}={v!r} must be {what}")
        setattr(out, k, type(default)(v))
    return out


def _spec_data(value: Any, source: str):
    """The spec's ``data:``: None (the default corpus, BPE 4096), a prepared folder (a path) or the default
    corpus with another tokenizer, ``{tokenizer: bytes}`` / ``{tokenizer: bpe, vocab_size: N}`` (prepared
    on first use, :func:`variant_data`)."""
    if value is None:
        return None
    _check_variant_data(value, f"{source}: data")
    return dict(value) if isinstance(value, dict) else str(value)


def list_specs(tier: Optional[str] = None, dtype: Optional[str] = None, compile: bool = False) -> list[str]:
    """One line per shipped spec as ``lmlab sweep NAME`` with these switches would run it: variants, seeds,
    precision, tiers and claim. With ``tier``, only the specs that define it, read at it; raises ConfigError
    when none does."""
    lines = []
    for name, path in builtin_specs().items():
        if tier is not None and tier not in load_spec(path).tiers:
            continue
        spec = load_spec(path, tier, None, dtype, compile)
        tiers = f"; tiers: {', '.join(spec.tiers)}" if spec.tiers else ""
        runs = f"{len(spec.variants)} variant(s) x {len(spec.seeds)} seed(s)"
        lines.append(f"{name}: {runs}, {spec.precision}{tiers}; {spec.claim}")
    if not lines:
        raise ConfigError(f"--tier {tier!r}: no shipped spec defines it (`lmlab sweep --list` shows their tiers)")
    return lines


def load_spec(
    spec: str | Path,
    tier: Optional[str] = None,
    max_runs: Optional[int] = None,
    dtype: Optional[str] = None,
    compile: bool = False,
) -> Spec:
    """A spec file or shipped spec name, read at ``tier`` (None: as written) in ``dtype`` and with
    ``compile`` (:func:`apply_switches`; None / False: the spec's); raises ConfigError as
    :func:`parse_spec` does (``max_runs``: the most runs it may plan, see :func:`check_run_count`)."""
    path = resolve_spec_path(spec)
    return parse_spec(load_mapping(path), path, tier, max_runs, dtype, compile)


def _options(value: Any) -> int:
    """How many options a grid axis, zip block or scales block lists (1 when malformed: the parser
    that expands it names the problem)."""
    if isinstance(value, list):
        return max(1, len(value))
    if isinstance(value, dict):
        lists = [v for k, v in value.items() if k != "label" and isinstance(v, list)]
        return max(1, len(lists[0])) if lists else 1
    return 1


def check_run_count(raw: dict, source: str, max_runs: Optional[int] = None) -> int:
    """The number of runs ``raw`` plans, computed arithmetically before anything is expanded: the
    product of the grid axes' lengths x the zip length x the scales x the tuned values x the seeds; with
    two-stage tuning (``tune_seeds``) each cell's tune seeds train every tuned value and its other seeds
    one (grid extensions past a winning edge are not counted).
    Raises ConfigError naming the count and how to allow it when it exceeds ``max_runs`` (None: the
    spec's ``max_runs:``, default :data:`MAX_RUNS`), or when ``max_runs`` is not an integer >= 1."""
    limit = max_runs if max_runs is not None else raw.get("max_runs", MAX_RUNS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"{source}: max_runs={limit!r} must be an integer >= 1 (default {MAX_RUNS})")
    axes = raw.get("axes") if isinstance(raw.get("axes"), dict) else {}
    grid = axes.get("grid") if isinstance(axes.get("grid"), dict) else {}
    tune = raw.get("tune") if isinstance(raw.get("tune"), dict) else {}
    scales = raw.get("scales")
    seeds = raw["seeds"] if isinstance(raw.get("seeds"), list) else [None]  # default: train.seed
    cells = (
        math.prod(_options(v) for v in grid.values())
        * (_options(axes["zip"]) if "zip" in axes else 1)
        * (_options(scales) if scales is not None else 1)
    )
    values = math.prod(_options(v) for v in tune.values())
    per_cell = values * len(seeds)
    tune_seeds = raw.get("tune_seeds")
    if tune and isinstance(tune_seeds, list) and 0 < len(tune_seeds) < len(seeds):
        # stage 1: the tune seeds over every value; stage 2: the other seeds at the chosen one (the parser
        # names a malformed tune_seeds; this count only has to be right for a valid one)
        per_cell = values * len(tune_seeds) + len(seeds) - len(tune_seeds)
    count = cells * per_cell
    if count > limit:
        raise ConfigError(
            f"{source}: the spec plans {count:,} runs (variants x scales x tuned values x {len(seeds):,} "
            f"seed(s){', two-stage' if per_cell != values * len(seeds) else ''}), more than max_runs={limit:,}; "
            f"narrow the axes or seeds, or allow them with "
            f"'max_runs: {count}' in the spec or `lmlab sweep --max-runs {count}`"
        )
    return count
