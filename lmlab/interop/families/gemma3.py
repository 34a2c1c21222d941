"""Gemma 3, text model (transformers ``Gemma3ForCausalLM``, model_type 'gemma3_text'; Gemma Team 2025).

Gemma 2's sandwich block with QK-norm ((1 + w) RMSNorm of width head_dim shared by the heads; lmlab
qk_norm='gemma_rmsnorm') and no soft-caps by default; 5 sliding-window layers to 1 full layer by default
(``layer_types`` / legacy ``sliding_window_pattern``), with their own RoPE: ``rope_parameters`` nested by
layer type (legacy: ``rope_theta`` + ``rope_scaling`` for full layers, ``rope_local_base_freq`` for
sliding ones) -> lmlab ``rope_theta`` + ``rope_scaling`` and ``rope_local_theta``. The multimodal
'gemma3' checkpoints (4B and up, with a vision tower) are not this model type.

``attn_logit_softcapping``: ``Gemma3TextConfig`` has the field, but transformers 5's ``Gemma3Attention``
never passes it to the attention function, so HF's Gemma 3 does not cap attention logits whatever its
value. lmlab follows HF: the field is accepted, not applied (``lmlab import`` prints a note), and
export writes null; a config with ``attn_logit_softcap`` set is refused for this family.
"""

from lmlab.interop.common import Unread
from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="gemma3_text", hf_class="Gemma3ForCausalLM", norm="gemma", layout="sandwich",
    act_key="hidden_activation", sliding="types", default_pattern=6, gemma=True, qk_norm="head_gemma", rope="gemma3",
    bidirectional_key=True,
    defaults=dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                  max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                  attention_dropout=0.0, query_pre_attn_scalar=256, sliding_window=4096,
                  final_logit_softcapping=None, attn_logit_softcapping=None, use_bidirectional_attention=False),
    ignored=frozenset({"hidden_act", "cache_implementation"}), attn_softcap=False,
    unread=(Unread("attn_logit_softcapping", "not applied: transformers' Gemma3Attention ignores it, and so "
                   "does lmlab (Gemma 3 has no attention soft-cap)"),),
    notes="sandwich norms, (1+w) QK-norm, 5:1 local/global with local RoPE theta",
))
# fmt: on
