"""Qwen3 (transformers ``Qwen3ForCausalLM``, model_type 'qwen3'; Yang et al. 2025).

Qwen2 without the q/k/v biases, with QK-norm: one RMSNorm of width head_dim shared by the heads, on q and
k before RoPE (lmlab qk_norm='rmsnorm', qk_norm_scope='head'). ``attention_bias`` would bias q, k, v and
o (refused: no lmlab bias choice).
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="qwen3", hf_class="Qwen3ForCausalLM", sliding="qwen", qk_norm="head_rms",
    defaults=dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=128, hidden_act="silu",
                  max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28, attention_dropout=0.0),
    notes="per-head QK RMSNorm, optional sliding window on the upper layers",
))
# fmt: on
