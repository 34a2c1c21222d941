"""Qwen2 (transformers ``Qwen2ForCausalLM``, model_type 'qwen2'; Yang et al. 2024).

The Llama block with biases on q, k and v only (always; lmlab bias='qkv'). Sliding windows when
``use_sliding_window``: on the layers of type 'sliding_attention' in ``layer_types``, by default layers
i >= ``max_window_layers`` (an lmlab ``layer_pattern`` spelled out per layer). Qwen2.5's published
configs carry ``use_mrope: false`` (Qwen2-VL's multimodal RoPE, off), which transformers' Qwen2 never
reads: accepted with a note when false, refused when true.
"""

from lmlab.interop.common import Unread
from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="qwen2", hf_class="Qwen2ForCausalLM", bias="qkv", sliding="qwen",
    defaults=dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, hidden_act="silu", max_position_embeddings=32768,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096,
                  max_window_layers=28, attention_dropout=0.0),
    unread=(Unread("use_mrope", "Qwen2-VL's multimodal RoPE, off: plain RoPE, as Qwen2ForCausalLM "
                   "computes it", accepted=(False,)),),
    notes="q/k/v biases, optional sliding window on the upper layers",
))
# fmt: on
