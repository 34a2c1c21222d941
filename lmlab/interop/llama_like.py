"""One converter for the Hugging Face families laid out like Llama (``model.embed_tokens``,
``model.layers.N.self_attn.{q,k,v,o}_proj``, ``model.layers.N.mlp.{gate,up,down}_proj``, ``model.norm``,
``lm_head``): Llama, Mistral, Mixtral (its MLP a mixture of experts), Qwen2, Qwen3, Gemma, Gemma 2,
Gemma 3 (text), OLMo, OLMo 2, OLMo 3, Cohere, Cohere 2, SmolLM3 (NoPE on every 4th layer).

Each family module describes its differences in a :class:`Spec` (which norm, where the norms go, which
biases, how sliding windows and RoPE are configured, QK-norm, soft-caps, logit scale, ...), read off the
family's ``configuration_*.py`` / ``modeling_*.py`` in transformers 5; :func:`build` turns a Spec into a
registered :class:`~lmlab.interop.registry.Family`. ``config_to_hf`` proves each export exact by
converting its output back (:func:`lmlab.interop.roundtrip.verify_roundtrip`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from lmlab.config import ModelConfig
from lmlab.interop import common as C
from lmlab.interop.registry import Family, StateDict, register
from lmlab.interop.roundtrip import verify_roundtrip

NORM_LAYOUTS = {
    "pre": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "sandwich": {
        "attn_norm": "input_layernorm",
        "attn_out_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm",
        "mlp_out_norm": "post_feedforward_layernorm",
    },
    "reordered": {"attn_norm": "post_attention_layernorm", "mlp_norm": "post_feedforward_layernorm"},
    "parallel": {"attn_norm": "input_layernorm"},
}


@dataclass(frozen=True)
class Spec:
    """What distinguishes one Llama-layout family (values are read from its transformers config class)."""

    model_type: str
    hf_class: str
    defaults: dict  # the transformers config class defaults of the fields read below
    norm: str = "rms"  # rms (rms_norm_eps) | gemma ((1 + w) RMSNorm) | olmo (LayerNorm without parameters, eps 1e-5)
    #                    | cohere (LayerNorm with weight, no bias, layer_norm_eps)
    rms_weight_fp32: bool = False  # RMSNorm weight applied in fp32 before the cast (OLMo 2), else after (Llama)
    layout: str = "pre"  # pre | sandwich (Gemma 2/3) | reordered (OLMo 2) | parallel (Cohere: one shared norm)
    act_key: str = "hidden_act"  # the field naming the gated MLP's activation (Gemma 2/3: hidden_activation)
    bias: str = "attention_bias"  # attention_bias (q, k, v, o) | llama (attention_bias + mlp_bias)
    #                              | qkv (Qwen2: always q, k, v) | none (Mistral: no field)
    head_dim: str = "key"  # key (head_dim field, else hidden/heads) | derived (always hidden/heads: Cohere 2)
    sliding: str = "none"  # none | all (Mistral: every layer) | qwen (use_sliding_window, max_window_layers,
    #                        layer_types) | types (layer_types, default from sliding_window_pattern)
    #                        | flag (Qwen3-MoE: use_sliding_window puts sliding_window on every layer)
    default_pattern: Optional[int] = None  # default layer_types: every p-th layer full, the others sliding
    pattern_key: bool = True  # the legacy sliding_window_pattern field sets p (Gemma 3, Cohere 2; not Gemma 2)
    qk_norm: Optional[str] = None  # None | head_rms (Qwen3) | head_gemma (Gemma 3) | all_rms (OLMo 2) | cohere
    rope: str = "half"  # half | interleaved (Cohere) | gemma3 (local/global thetas) | cohere2 (sliding layers only)
    rope_defaults: tuple = (1_000_000.0, 10_000.0)  # rope='gemma3': the full and sliding layers' default thetas
    default_theta: float = 10_000.0  # otherwise: the theta of a config.json that gives none
    nope: bool = False  # SmolLM3: no_rope_layers (1 = RoPE) per layer, default every no_rope_layer_interval-th NoPE
    gemma: bool = False  # embeddings x sqrt(d_model), query_pre_attn_scalar, soft-caps (Gemma 2/3)
    gemma_legacy_gelu: bool = False  # Gemma 1: hidden_act 'gelu' means the tanh approximation
    logit_scale: bool = False  # Cohere: logits * logit_scale
    clip_qkv: bool = False  # OLMo
    bidirectional_key: bool = False  # Gemma: use_bidirectional_attention (refused when true)
    ignored: frozenset = field(default_factory=frozenset)  # fields HF's modeling code never reads
    unread: tuple = ()  # common.Unread: legacy fields HF never reads, checked to describe this model, noted
    attn_softcap: bool = True  # the model applies attn_logit_softcapping (Gemma 2); False: HF ignores it (Gemma 3)
    moe: Optional[str] = None  # None | mixtral (every layer's MLP: block_sparse_moe, softmax top-k renormalised)
    #                            | qwen3 (mlp.experts on layers set by decoder_sparse_step and mlp_only_layers,
    #                              softmax top-k, renormalised when norm_topk_prob, experts moe_intermediate_size)
    notes: str = ""

    def handled(self) -> set:
        keys = {
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "tie_word_embeddings",
            "attention_dropout",
            self.act_key,
            "head_dim",
        }
        keys |= {"rms": {"rms_norm_eps"}, "gemma": {"rms_norm_eps"}, "olmo": set(), "cohere": {"layer_norm_eps"}}[
            self.norm
        ]
        keys |= {
            "attention_bias": {"attention_bias"},
            "llama": {"attention_bias", "mlp_bias"},
            "qkv": set(),
            "none": set(),
        }[self.bias]
        keys |= {
            "none": set(),
            "all": {"sliding_window"},
            "qwen": {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"},
            "types": {"sliding_window", "layer_types"},
            "flag": {"use_sliding_window", "sliding_window"},
        }[self.sliding]
        if self.sliding == "types" and self.pattern_key:
            keys |= {"sliding_window_pattern", "_sliding_window_pattern"}  # the latter: as transformers 5 saves it
        if self.qk_norm == "cohere":
            keys.add("use_qk_norm")
        if self.rope == "gemma3":
            keys.add("rope_local_base_freq")
        if self.gemma:
            keys |= {"query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"}
        if self.logit_scale:
            keys.add("logit_scale")
        if self.clip_qkv:
            keys.add("clip_qkv")
        if self.bidirectional_key:
            keys.add("use_bidirectional_attention")
        if self.nope:
            keys |= {"no_rope_layers", "no_rope_layer_interval", "use_sliding_window", "sliding_window", "layer_types"}
        if self.moe == "mixtral":
            keys |= {
                "num_local_experts",
                "num_experts_per_tok",
                "output_router_logits",
                "router_aux_loss_coef",
                "router_jitter_noise",
            }
        if self.moe == "qwen3":
            keys |= {
                "num_experts",
                "num_local_experts",
                "num_experts_per_tok",
                "norm_topk_prob",
                "moe_intermediate_size",
                "decoder_sparse_step",
                "mlp_only_layers",
                "output_router_logits",
                "router_aux_loss_coef",
            }
        return keys | set(self.ignored) | {u.key for u in self.unread}


# ------------------------------------------------------------------------------------------------
# config.json -> ModelConfig
# ------------------------------------------------------------------------------------------------


def config_to_lmlab(spec: Spec, hf: dict) -> ModelConfig:
    fam, d = spec.model_type, spec.defaults
    C.check_fields(hf, fam, spec.handled())
    C.check_unread(hf, fam, spec.unread, d)
    g = lambda key: C.get(hf, key, d)  # noqa: E731
    hidden, heads = g("hidden_size"), g("num_attention_heads")
    kv = g("num_key_value_heads") or heads
    head_dim = hidden // heads if spec.head_dim == "derived" else (g("head_dim") or hidden // heads)
    n_layers = g("num_hidden_layers")
    kw: dict = C.read_sizes(g, d_model=hidden, n_layers=n_layers, n_heads=heads, n_kv_heads=kv, head_dim=head_dim)
    act = g(spec.act_key)
    if spec.gemma_legacy_gelu and act == "gelu":  # GemmaConfig.__post_init__ maps the legacy value to tanh
        act = "gelu_pytorch_tanh"
    kw["activation"] = C.gated_activation(fam, spec.act_key, act)

    # norms and their placement
    if spec.norm == "rms":
        kw.update(norm_type="rmsnorm", norm_eps=float(g("rms_norm_eps")), norm_weight_fp32=spec.rms_weight_fp32)
    elif spec.norm == "gemma":
        kw.update(norm_type="gemma_rmsnorm", norm_eps=float(g("rms_norm_eps")))
    elif spec.norm == "olmo":
        kw.update(norm_type="layernorm", norm_affine=False, norm_bias=False, norm_eps=1e-5)
    else:
        kw.update(norm_type="layernorm", norm_bias=False, norm_eps=float(g("layer_norm_eps")))
    if spec.layout == "parallel":
        kw.update(norm_position="pre", parallel_block=True, parallel_shared_norm=True)
    else:
        kw["norm_position"] = spec.layout

    # linear biases
    if spec.bias == "llama":
        ab, mb = bool(g("attention_bias")), bool(g("mlp_bias"))
        kw["bias"] = {(True, True): "all", (True, False): "attention", (False, True): "mlp"}.get((ab, mb), "none")
    elif spec.bias == "attention_bias":  # q, k, v and o (the family's attention honours attention_bias)
        kw["bias"] = "attention" if bool(g("attention_bias")) else "none"
    else:
        kw["bias"] = spec.bias

    # sliding windows -> per-layer pattern
    window, types = None, None
    if spec.sliding == "all":
        window = g("sliding_window")
        types = ["sliding_attention"] * n_layers
    elif spec.sliding == "flag":
        window = g("sliding_window") if g("use_sliding_window") else None
        types = ["sliding_attention"] * n_layers
    elif spec.sliding == "qwen":
        window = g("sliding_window") if g("use_sliding_window") else None
        mwl = g("max_window_layers")
        types = hf.get("layer_types") or [
            "sliding_attention" if window is not None and i >= mwl else "full_attention" for i in range(n_layers)
        ]
    elif spec.sliding == "types":
        window = g("sliding_window")
        p = spec.default_pattern
        if spec.pattern_key:
            p = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", p))
        types = hf.get("layer_types") or [
            "sliding_attention" if (i + 1) % p else "full_attention" for i in range(n_layers)
        ]
    if types is not None and len(types) != n_layers:
        raise C.unsupported(fam, "layer_types", types, f"one entry per layer ({n_layers})")
    pattern = C.pattern_from_types(types, fam) if (types is not None and window is not None) else None
    if pattern is not None:
        kw.update(sliding_window=int(window), layer_pattern=None if pattern == "L" else pattern)

    # positions
    kw.update(position="rope", rope_style="interleaved" if spec.rope in ("interleaved", "cohere2") else "half")
    if spec.rope == "gemma3":
        theta, scaling, partial = C.read_rope(hf, fam, "full_attention", spec.rope_defaults[0])
        l_theta, l_scaling, l_partial = C.read_rope(
            hf, fam, "sliding_attention", spec.rope_defaults[1], "rope_local_base_freq"
        )
        if pattern is not None and (l_theta, l_scaling) != (theta, scaling):
            if l_scaling is not None:
                raise C.unsupported(
                    fam,
                    "rope_parameters.sliding_attention.rope_type",
                    l_scaling["type"],
                    "'default' on sliding layers when their RoPE differs from the full layers'",
                )
            kw["rope_local_theta"] = l_theta
        partial = partial if partial != 1.0 else l_partial
    else:
        theta, scaling, partial = C.read_rope(hf, fam, default_theta=spec.default_theta)
    if partial != 1.0:
        raise C.unsupported(fam, "partial_rotary_factor", partial, f"1.0 ({spec.hf_class} rotates the whole head)")
    kw.update(rope_theta=theta, rope_scaling=scaling)
    if spec.rope == "cohere2":  # RoPE on sliding layers only, none on full layers
        if pattern is None:
            kw.update(position="nope", rope_scaling=None)
        elif "G" in pattern:
            kw["nope_global_layers"] = True

    # attention extras
    if spec.qk_norm == "head_rms":
        kw["qk_norm"] = "rmsnorm"
    elif spec.qk_norm == "head_gemma":
        kw["qk_norm"] = "gemma_rmsnorm"
    elif spec.qk_norm == "all_rms":
        kw.update(qk_norm="rmsnorm", qk_norm_scope="all")
    elif spec.qk_norm == "cohere" and g("use_qk_norm"):
        kw.update(qk_norm="layernorm", qk_norm_scope="head_untied")
    if spec.gemma:
        kw.update(
            scale_embeddings=True,
            query_pre_attn_scalar=float(g("query_pre_attn_scalar")),
            attn_logit_softcap=g("attn_logit_softcapping") if spec.attn_softcap else None,
            final_logit_softcap=g("final_logit_softcapping"),
        )
    elif spec.norm == "gemma":
        kw["scale_embeddings"] = True
    if spec.bidirectional_key and g("use_bidirectional_attention"):
        raise C.unsupported(fam, "use_bidirectional_attention", True, "false (lmlab models are causal)")
    if spec.logit_scale:
        scale = g("logit_scale")
        if scale is None:
            raise C.unsupported(fam, "logit_scale", None, "a number")
        kw["logit_scale"] = float(scale)
    if spec.clip_qkv and g("clip_qkv") is not None:
        kw["clip_qkv"] = float(g("clip_qkv"))
    if spec.nope:  # SmolLM3Attention: RoPE only where no_rope_layers[i] is 1
        if g("use_sliding_window"):
            raise C.unsupported(
                fam, "use_sliding_window", True, "false (SmolLM3's sliding NoPE layers are not represented)"
            )
        flags = hf.get("no_rope_layers") or [int((i + 1) % g("no_rope_layer_interval") != 0) for i in range(n_layers)]
        if len(flags) != n_layers or any(f not in (0, 1) for f in flags):
            raise C.unsupported(fam, "no_rope_layers", flags, f"one 0 or 1 per layer ({n_layers})")
        pattern = C.shortest_period("".join("R" if f else "N" for f in flags))
        if "N" in pattern:
            kw["nope_layers"] = pattern
    if spec.moe == "mixtral":  # MixtralTopKRouter: softmax over the experts, top-k, renormalised
        C.refuse_router_noise(fam, g)
        kw.update(
            n_experts=g("num_local_experts"),
            experts_per_token=g("num_experts_per_tok"),
            router_score="softmax",
            router_renormalize=True,
            # HF adds the load-balancing loss only when output_router_logits is set
            moe_aux_loss=float(g("router_aux_loss_coef")) if g("output_router_logits") else 0.0,
        )
    if spec.moe == "qwen3":
        kw.update(_qwen3_moe_fields(hf, g, fam, n_layers))
    return C.lmlab_config(fam, kw)


# ------------------------------------------------------------------------------------------------
# ModelConfig -> config.json
# ------------------------------------------------------------------------------------------------


def config_to_hf(spec: Spec, cfg: ModelConfig) -> dict:
    """The family's config.json for ``cfg``; UnsupportedError naming what the family cannot represent."""
    rot = int(round(cfg.head_dim * cfg.rope_fraction))
    hf: dict = {
        **C.hf_sizes(spec.model_type, spec.hf_class, cfg),
        spec.act_key: C.GATED_ACT_TO_HF.get(cfg.activation, cfg.activation),
    }
    if spec.head_dim == "key":
        hf["head_dim"] = cfg.head_dim
    if spec.norm in ("rms", "gemma"):
        hf["rms_norm_eps"] = float(cfg.norm_eps)
    elif spec.norm == "cohere":
        hf["layer_norm_eps"] = float(cfg.norm_eps)
    if spec.bias == "llama":
        hf.update(attention_bias=cfg.bias in ("all", "attention"), mlp_bias=cfg.bias in ("all", "mlp"))
    elif spec.bias == "attention_bias":
        hf["attention_bias"] = cfg.bias == "attention"
    types = C.types_from_cfg(cfg)
    local = "sliding_attention" in types
    if spec.sliding == "all":
        hf["sliding_window"] = cfg.sliding_window if local else None
    elif spec.sliding == "qwen":
        hf.update(
            use_sliding_window=local,
            sliding_window=cfg.sliding_window if local else None,
            max_window_layers=types.index("sliding_attention") if local else cfg.n_layers,
            layer_types=types,
        )
    elif spec.sliding == "types":
        hf.update(sliding_window=cfg.sliding_window if local else cfg.context_length, layer_types=types)
    elif spec.sliding == "flag":
        hf.update(use_sliding_window=local, sliding_window=cfg.sliding_window if local else None)
    if spec.rope == "gemma3":
        local_rope = (cfg.rope_local_theta, None) if cfg.rope_local_theta else (cfg.rope_theta, cfg.rope_scaling)
        hf["rope_parameters"] = {
            "full_attention": C.rope_to_hf(cfg.rope_theta, cfg.rope_scaling, rot),
            "sliding_attention": C.rope_to_hf(local_rope[0], local_rope[1], rot),
        }
    else:
        hf["rope_parameters"] = C.rope_to_hf(cfg.rope_theta, cfg.rope_scaling, rot)
    if spec.qk_norm == "cohere":
        hf["use_qk_norm"] = cfg.qk_norm != "none"
    if spec.gemma:
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim
        if float(scalar) != int(scalar):  # transformers types the field as int
            raise C.unsupported(spec.model_type, "query_pre_attn_scalar", scalar, "a whole number")
        cap = lambda v: None if v is None else float(v)  # noqa: E731
        hf.update(
            query_pre_attn_scalar=int(scalar),
            final_logit_softcapping=cap(cfg.final_logit_softcap),
            attn_logit_softcapping=cap(cfg.attn_logit_softcap) if spec.attn_softcap else None,
        )
    if spec.bidirectional_key:
        hf["use_bidirectional_attention"] = False
    if spec.logit_scale:
        hf["logit_scale"] = float(cfg.logit_scale)
    if spec.clip_qkv:
        hf["clip_qkv"] = None if cfg.clip_qkv is None else float(cfg.clip_qkv)
    if spec.nope:
        hf.update(
            no_rope_layers=[int(cfg.layer_has_rope(i)) for i in range(cfg.n_layers)],
            no_rope_layer_interval=4,
            use_sliding_window=False,
            sliding_window=None,
        )
    if spec.moe == "mixtral":
        hf.update(
            num_local_experts=cfg.n_experts,
            num_experts_per_tok=cfg.experts_per_token,
            output_router_logits=cfg.moe_aux_loss > 0,
            router_jitter_noise=0.0,
            router_aux_loss_coef=cfg.moe_aux_loss or spec.defaults["router_aux_loss_coef"],
        )
        if cfg.expert_d_ff is not None:
            hf["intermediate_size"] = cfg.expert_d_ff
    if spec.moe == "qwen3":
        hf.update(_qwen3_moe_hf(cfg, spec.defaults))
    return verify_roundtrip(spec.model_type, cfg, hf, lambda h: config_to_lmlab(spec, h))


# ------------------------------------------------------------------------------------------------
# State dicts
# ------------------------------------------------------------------------------------------------


def tensor_maps(spec: Spec, cfg: ModelConfig) -> list[C.TensorMap]:
    layers = C.llama_layer_maps(cfg, NORM_LAYOUTS[spec.layout])
    if spec.moe == "mixtral":  # each layer's MLP: block_sparse_moe.gate (router), experts.E.{w1 gate, w3 up, w2 down}
        layers = [m for m in layers if ".mlp." not in m.lmlab]
        F = cfg.expert_d_ff or cfg.d_ff
        for i in range(cfg.n_layers):
            p, b = f"model.layers.{i}.block_sparse_moe", f"blocks.{i}.mlp"
            layers.append(C.TensorMap(f"{b}.router.weight", (f"{p}.gate.weight",), (cfg.n_experts,)))
            for e in range(cfg.n_experts):
                q = f"{p}.experts.{e}"
                layers.append(C.TensorMap(f"{b}.experts.{e}.w_in.weight", (f"{q}.w1.weight", f"{q}.w3.weight"), (F, F)))
                layers.append(C.TensorMap(f"{b}.experts.{e}.w_out.weight", (f"{q}.w2.weight",), (cfg.d_model,)))
    if spec.moe == "qwen3":  # MoE layers' MLP: mlp.gate (router), mlp.experts.E.{gate,up,down}_proj
        moe = [i for i in range(cfg.n_layers) if cfg.layer_is_moe(i)]
        layers = [m for m in layers if not any(m.lmlab.startswith(f"blocks.{i}.mlp.") for i in moe)]
        F = cfg.expert_d_ff or cfg.d_ff
        for i in moe:
            p, b = f"model.layers.{i}.mlp", f"blocks.{i}.mlp"
            layers.append(C.TensorMap(f"{b}.router.weight", (f"{p}.gate.weight",), (cfg.n_experts,)))
            for e in range(cfg.n_experts):
                q = f"{p}.experts.{e}"
                layers.append(
                    C.TensorMap(
                        f"{b}.experts.{e}.w_in.weight", (f"{q}.gate_proj.weight", f"{q}.up_proj.weight"), (F, F)
                    )
                )
                layers.append(C.TensorMap(f"{b}.experts.{e}.w_out.weight", (f"{q}.down_proj.weight",), (cfg.d_model,)))
    return C.model_maps(cfg, layers)


def _qwen3_moe_fields(hf: dict, g, fam: str, n_layers: int) -> dict:
    """Qwen3-MoE's expert fields -> lmlab's (HF ``Qwen3MoeDecoderLayer``: layer i is MoE when i is not in
    ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` == 0; ``Qwen3MoeTopKRouter``: softmax over the
    experts in fp32, top-k, divided by their sum when ``norm_topk_prob``)."""
    experts = hf.get("num_experts", hf.get("num_local_experts", g("num_experts")))
    step, only = g("decoder_sparse_step"), hf.get("mlp_only_layers") or []
    if not isinstance(step, int) or step < 1:
        raise C.unsupported(fam, "decoder_sparse_step", step, "an integer >= 1")
    if not isinstance(only, list) or any(not isinstance(i, int) or not 0 <= i < n_layers for i in only):
        raise C.unsupported(fam, "mlp_only_layers", only, f"a list of layer indices 0..{n_layers - 1}")
    flags = "".join("M" if experts and i not in only and (i + 1) % step == 0 else "D" for i in range(n_layers))
    if "M" not in flags:
        return {}
    return dict(
        n_experts=experts,
        experts_per_token=g("num_experts_per_tok"),
        expert_d_ff=g("moe_intermediate_size"),
        router_score="softmax",
        router_renormalize=bool(g("norm_topk_prob")),
        moe_pattern=C.shortest_period(flags),
        moe_aux_loss=float(g("router_aux_loss_coef")) if g("output_router_logits") else 0.0,
    )


def _qwen3_moe_hf(cfg: ModelConfig, defaults: dict) -> dict:
    """lmlab's expert fields -> Qwen3-MoE's: the decoder_sparse_step that covers every MoE layer with the
    fewest dense exceptions, listed in mlp_only_layers."""
    if not cfg.n_experts:
        return dict(num_experts=0, mlp_only_layers=[], decoder_sparse_step=1)
    moe = {i for i in range(cfg.n_layers) if cfg.layer_is_moe(i)}
    steps = [s for s in range(1, cfg.n_layers + 1) if all((i + 1) % s == 0 for i in moe)]
    step = min(steps, key=lambda s: sum(1 for i in range(cfg.n_layers) if (i + 1) % s == 0 and i not in moe))
    return dict(
        num_experts=cfg.n_experts,
        num_experts_per_tok=cfg.experts_per_token,
        decoder_sparse_step=step,
        mlp_only_layers=[i for i in range(cfg.n_layers) if (i + 1) % step == 0 and i not in moe],
        moe_intermediate_size=cfg.expert_d_ff or cfg.d_ff,
        norm_topk_prob=cfg.router_renormalize,
        output_router_logits=cfg.moe_aux_loss > 0,
        router_aux_loss_coef=cfg.moe_aux_loss or defaults["router_aux_loss_coef"],
    )


def build(spec: Spec) -> Family:
    """Register and return the Family described by ``spec``."""

    def to_lmlab_state(state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
        return C.state_to_lmlab(state, cfg, tensor_maps(spec, cfg), spec.model_type)

    def to_hf_state(state: StateDict, cfg: ModelConfig) -> StateDict:
        return C.state_to_hf(state, cfg, tensor_maps(spec, cfg))

    return register(
        Family(
            model_type=spec.model_type,
            hf_class=spec.hf_class,
            config_to_lmlab=lambda hf: config_to_lmlab(spec, hf),
            state_to_lmlab=to_lmlab_state,
            config_to_hf=lambda cfg: config_to_hf(spec, cfg),
            state_to_hf=to_hf_state,
            notes=spec.notes,
            unread_notes=lambda hf: C.check_unread(hf, spec.model_type, spec.unread, spec.defaults),
        )
    )
