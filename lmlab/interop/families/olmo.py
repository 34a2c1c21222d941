"""OLMo (transformers ``OlmoForCausalLM``, model_type 'olmo'; Groeneveld et al. 2024).

The Llama block with a non-parametric LayerNorm (no weight, no bias, eps 1e-5: lmlab norm_type='layernorm',
norm_affine=False) before attention, before the MLP and at the end, and optional ``clip_qkv`` (q, k, v
clamped to [-c, c]; OLMo 1.7). ``attention_bias`` would bias q, k, v and o (refused).
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="olmo", hf_class="OlmoForCausalLM", norm="olmo", clip_qkv=True,
    defaults=dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                  tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, clip_qkv=None),
    notes="LayerNorm without parameters, optional clip_qkv",
))
# fmt: on
