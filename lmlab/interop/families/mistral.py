"""Mistral (transformers ``MistralForCausalLM``, model_type 'mistral'; Jiang et al. 2023).

The Llama block without biases, with one ``sliding_window`` (tokens visible counting the current one,
HF's ``kv_idx > q_idx - sliding_window``) on every layer, or none when it is null.
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="mistral", hf_class="MistralForCausalLM", bias="none", sliding="all",
    defaults=dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=None, hidden_act="silu",
                  max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=False, sliding_window=4096,
                  attention_dropout=0.0),
    notes="Llama block, sliding window on every layer",
))
# fmt: on
