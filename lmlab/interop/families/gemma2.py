"""Gemma 2 (transformers ``Gemma2ForCausalLM``, model_type 'gemma2'; Gemma Team 2024).

Gemma's block with sandwich norms (input, post-attention, pre- and post-feedforward (1 + w) RMSNorms),
query scale ``query_pre_attn_scalar``**-0.5, attention-logit soft-cap (``attn_logit_softcapping``) and
final-logit soft-cap (``final_logit_softcapping``), sliding windows on the 'sliding_attention' layers of
``layer_types`` (by default every other layer, starting with the first).
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="gemma2", hf_class="Gemma2ForCausalLM", norm="gemma", layout="sandwich", act_key="hidden_activation",
    sliding="types", default_pattern=2, pattern_key=False, gemma=True, bidirectional_key=True,
    defaults=dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                  max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                  attention_dropout=0.0, query_pre_attn_scalar=256, sliding_window=4096,
                  final_logit_softcapping=30.0, attn_logit_softcapping=50.0, use_bidirectional_attention=None),
    # 4.x leftovers Gemma2's modeling code does not read (it uses hidden_activation and sliding_window)
    ignored=frozenset({"hidden_act", "sliding_window_size"}),
    notes="sandwich norms, soft-caps, alternating local/global attention",
))
# fmt: on
