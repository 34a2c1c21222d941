"""Cohere Command R (transformers ``CohereForCausalLM``, model_type 'cohere').

A parallel block off one LayerNorm with a weight and no bias (x + attn(n(x)) + mlp(n(x))), RoPE with
interleaved pairs (2i, 2i+1; ``repeat_interleave`` in ``CohereRotaryEmbedding``), logits multiplied by
``logit_scale``, tied embeddings by default, optional ``use_qk_norm``: a bias-free LayerNorm over each
head with its own weights (shape (heads, head_dim); lmlab qk_norm='layernorm', qk_norm_scope='head_untied').

Published Cohere configs (Command R7B's, for one) keep keys of Cohere's own code base that transformers'
Cohere / Cohere2 classes never read (:data:`LEGACY`): accepted with a note when their value describes the
model transformers builds anyway, refused otherwise.
"""

from lmlab.interop.common import Unread
from lmlab.interop.llama_like import Spec, build

# config.json keys of Cohere's code base that transformers' Cohere and Cohere2 never read (checked in
# transformers 5: no reference in its source), with the values that describe the HF model
# fmt: off
LEGACY = (
    Unread("use_gated_activation", "gated SiLU MLP, which the HF model always is", accepted=(True,)),
    Unread("use_parallel_block", "attention and MLP in parallel off one norm, as the HF layer always is",
           accepted=(True,)),
    Unread("position_embedding_type", "interleaved (GPT-J) RoPE pairs, as the HF model always uses",
           accepted=("rope_gptj",)),
    Unread("rotary_pct", "the whole head rotated, as the HF model always does", accepted=(1.0,)),
    Unread("use_embedding_sharing", "the LM head shares the embedding; HF ties by tie_word_embeddings",
           same_as="tie_word_embeddings"),
    Unread("use_parallel_embedding", "a tensor-parallel layout of the embedding in Cohere's training code: "
           "no effect on the function"),
)
# fmt: on

# fmt: off
FAMILY = build(Spec(
    model_type="cohere", hf_class="CohereForCausalLM", norm="cohere", layout="parallel", rope="interleaved",
    logit_scale=True, qk_norm="cohere",
    defaults=dict(vocab_size=256000, hidden_size=8192, intermediate_size=22528, logit_scale=0.0625,
                  num_hidden_layers=40, num_attention_heads=64, num_key_value_heads=None, hidden_act="silu",
                  max_position_embeddings=8192, layer_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False,
                  attention_dropout=0.0, use_qk_norm=False),
    unread=LEGACY,
    notes="parallel block, bias-free LayerNorm, interleaved RoPE, logit_scale, optional per-head QK-norm",
))
# fmt: on
