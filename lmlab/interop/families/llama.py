"""Llama (transformers ``LlamaForCausalLM``, model_type 'llama'; Touvron et al. 2023, Llama 2 and 3).

Pre-norm RMSNorm, SwiGLU (``hidden_act``: any gated activation lmlab has), RoPE with HF's half pairing
and default / linear / yarn / llama3 scaling, GQA, ``head_dim`` possibly != hidden/heads, biases via
``attention_bias`` (q, k, v, o) + ``mlp_bias`` (lmlab 'all'), or ``mlp_bias`` alone ('mlp').
Refused: ``attention_bias`` without ``mlp_bias`` (no lmlab bias choice), dynamic/longrope RoPE, exact-GELU
gates. ``pretraining_tp`` is metadata (transformers 5 never reads it).
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="llama", hf_class="LlamaForCausalLM", bias="llama",
    defaults=dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
                  mlp_bias=False, head_dim=None),
    notes="pre-norm RMSNorm, gated MLP, RoPE (default/linear/yarn/llama3), GQA, optional biases",
))
# fmt: on
