"""SmolLM3 (transformers ``SmolLM3ForCausalLM``, model_type 'smollm3'; Hugging Face 2025, "SmolLM3").

The Llama block (GQA, SwiGLU, RMSNorm, optional attention / MLP biases, tied embeddings by default) with
RoPE on some layers only: ``no_rope_layers`` (1 = RoPE, 0 = NoPE) per layer, by default every
``no_rope_layer_interval``-th (4th) layer without positions; lmlab ``nope_layers`` ('RRRN'). SmolLM3's
optional sliding window on NoPE layers (``use_sliding_window``) is refused.
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="smollm3", hf_class="SmolLM3ForCausalLM", bias="llama", nope=True, default_theta=2_000_000.0,
    defaults=dict(vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                  num_attention_heads=16, num_key_value_heads=4, head_dim=None, hidden_act="silu",
                  max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                  mlp_bias=False, attention_dropout=0.0, use_sliding_window=False, sliding_window=None,
                  no_rope_layers=None, no_rope_layer_interval=4, layer_types=None),
    notes="Llama block, NoPE on every 4th layer",
))
# fmt: on
