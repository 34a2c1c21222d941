"""Cohere Command R (transformers ``CohereForCausalLM``, model_type 'cohere').

A parallel block off one LayerNorm with a weight and no bias (x + attn(n(x)) + mlp(n(x))), RoPE with
interleaved pairs (2i, 2i+1; ``repeat_interleave`` in ``CohereRotaryEmbedding``), logits multiplied by
``logit_scale``, tied embeddings by default, optional ``use_qk_norm``: a bias-free LayerNorm over each
head with its own weights (shape (heads, head_dim); lmlab qk_norm='layernorm', qk_norm_scope='head_untied').
"""

from lmlab.interop.llama_like import Spec, build

FAMILY = build(Spec(
    model_type="cohere", hf_class="CohereForCausalLM", norm="cohere", layout="parallel", rope="interleaved",
    logit_scale=True, qk_norm="cohere",
    defaults=dict(vocab_size=256000, hidden_size=8192, intermediate_size=22528, logit_scale=0.0625,
                  num_hidden_layers=40, num_attention_heads=64, num_key_value_heads=None, hidden_act="silu",
                  max_position_embeddings=8192, layer_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False,
                  attention_dropout=0.0, use_qk_norm=False),
    notes="parallel block, bias-free LayerNorm, interleaved RoPE, logit_scale, optional per-head QK-norm",
))
