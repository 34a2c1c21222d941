"""Gemma (transformers ``GemmaForCausalLM``, model_type 'gemma'; Gemma Team 2024).

RMSNorm storing its weight as an offset from one, x / rms(x) * (1 + w) (lmlab 'gemma_rmsnorm'), GeGLU
with the tanh GELU (the legacy ``hidden_act='gelu'`` of the released configs means tanh, as
``GemmaConfig`` decides), embeddings multiplied by sqrt(hidden_size), tied LM head by default.
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="gemma", hf_class="GemmaForCausalLM", norm="gemma", gemma_legacy_gelu=True, bidirectional_key=True,
    defaults=dict(vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=16, head_dim=256, hidden_act="gelu_pytorch_tanh",
                  max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                  attention_dropout=0.0, use_bidirectional_attention=None),
    ignored=frozenset({"hidden_activation"}),  # a 4.x field; GemmaMLP reads hidden_act only
    notes="(1+w) RMSNorm, GeGLU, embeddings x sqrt(d), tied",
))
# fmt: on
