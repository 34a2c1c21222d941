"""OLMo 3 (transformers ``Olmo3ForCausalLM``, model_type 'olmo3'; OLMo Team 2025, "OLMo 3").

OLMo 2's block (RMSNorm on each sublayer's output, QK RMSNorm across heads, the weight applied in fp32
before the cast) with sliding-window attention: ``layer_types`` (by default 3 sliding : 1 full, layer i
full when (i + 1) % 4 == 0) and ``sliding_window`` (default 4096), and RoPE parameters per layer type
(``rope_parameters.full_attention`` / ``.sliding_attention``, both theta 500,000 by default; a
``rope_scaling`` applies to the full layers only).
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="olmo3", hf_class="Olmo3ForCausalLM", layout="reordered", qk_norm="all_rms",
    rms_weight_fp32=True, sliding="types", default_pattern=4, pattern_key=False, rope="gemma3",
    rope_defaults=(500_000.0, 500_000.0),
    defaults=dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                  tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, rms_norm_eps=1e-5,
                  sliding_window=4096),
    notes="OLMo 2's block with 3 sliding : 1 full layers",
))
# fmt: on
