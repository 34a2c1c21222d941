"""OLMo 2 (transformers ``Olmo2ForCausalLM``, model_type 'olmo2'; OLMo Team 2024, "2 OLMo 2 Furious").

Reordered norms: RMSNorm on each sublayer's output, none on its input (lmlab norm_position='reordered'),
and QK-norm over the whole q and k projections (widths n_heads*head_dim and n_kv_heads*head_dim, across
heads: lmlab qk_norm_scope='all'). ``Olmo2RMSNorm`` multiplies by its weight in fp32 and then casts
(``(w * x).to(dtype)``; Llama casts first): lmlab norm_weight_fp32=True, which matters below fp32 only.
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="olmo2", hf_class="Olmo2ForCausalLM", layout="reordered", qk_norm="all_rms",
    rms_weight_fp32=True,
    defaults=dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                  tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, rms_norm_eps=1e-5),
    notes="norms on sublayer outputs, QK-norm across heads",
))
# fmt: on
