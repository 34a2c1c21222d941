"""DeepSeek-V3 (transformers ``DeepseekV3ForCausalLM``, model_type 'deepseek_v3'; DeepSeek-AI 2024,
"DeepSeek-V3 Technical Report", arXiv 2412.19437).

DeepSeek-V2's layout (multi-head latent attention, shared plus routed SwiGLU experts after the first
``first_k_dense_replace`` dense layers; :mod:`lmlab.interop.families.deepseek_v2` holds the tables) with
V3's router, read off ``DeepseekV3TopkRouter`` (transformers 5): sigmoid scores; for the choice only, the
scores plus ``e_score_correction_bias`` (the auxiliary-loss-free balancing bias: lmlab
``moe_balance='aux_free'``, its ``expert_bias`` buffer); groups scored by the sum of their two best
biased scores, the ``topk_group`` best of ``n_group`` kept; top ``num_experts_per_tok`` of those; the
weights the unbiased scores, divided by their sum when ``norm_topk_prob``, times ``routed_scaling_factor``.
``rope_interleave`` (default true) rotates adjacent pairs (lmlab ``rope_style='interleaved'``), false the
two halves. The multi-token prediction layers of the released checkpoint (``num_nextn_predict_layers``,
``model.layers.61``) are not read, as transformers does not read them: the import notes it.
"""

from __future__ import annotations

from lmlab.config import ModelConfig
from lmlab.interop import common as C
from lmlab.interop.families import deepseek_v2 as V2
from lmlab.interop.registry import Family, StateDict, register


def to_lmlab_state(state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
    mtp = tuple(
        f"model.layers.{i}." for i in range(cfg.n_layers, cfg.n_layers + int(hf.get("num_nextn_predict_layers") or 0))
    )
    kept = {k: v for k, v in state.items() if not k.startswith(mtp)} if mtp else state
    return C.state_to_lmlab(V2._split_experts(kept, cfg, V2.FAM_V3), cfg, V2.tensor_maps(cfg), V2.FAM_V3)


def to_hf_state(state: StateDict, cfg: ModelConfig) -> StateDict:
    return {k: v.contiguous() for k, v in C.state_to_hf(state, cfg, V2.tensor_maps(cfg)).items()}


def _notes(hf: dict) -> list:
    n = int(hf.get("num_nextn_predict_layers") or 0)
    return (
        [
            f"deepseek_v3: the {n} multi-token prediction layer(s) of the checkpoint are not read (transformers "
            f"does not read them either)"
        ]
        if n
        else []
    )


# fmt: off
FAMILY = register(Family(model_type=V2.FAM_V3, hf_class=V2.HF_CLASS_V3,
                         config_to_lmlab=lambda hf: V2.config_to_lmlab(hf, v3=True), state_to_lmlab=to_lmlab_state,
                         config_to_hf=lambda cfg: V2.config_to_hf(cfg, v3=True), state_to_hf=to_hf_state,
                         notes="DeepSeek-V3: multi-head latent attention, sigmoid-routed experts with the "
                               "auxiliary-loss-free bias (groups by their best two), shared experts, the first "
                               "layers dense",
                         unread_notes=_notes))
# fmt: on
