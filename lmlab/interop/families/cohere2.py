"""Cohere Command R7B / Command A (transformers ``Cohere2ForCausalLM``, model_type 'cohere2').

Cohere's parallel block (bias-free LayerNorm, interleaved RoPE, ``logit_scale``) with sliding-window
layers that carry RoPE and full-attention layers that carry none (lmlab nope_global_layers), by default 3
sliding : 1 full (``layer_types`` / legacy ``sliding_window_pattern``). ``head_dim`` is always
hidden_size / num_attention_heads (``Cohere2Config`` overwrites the field). Command R7B's legacy keys
(``use_gated_activation`` and others transformers never reads) are accepted as for Cohere
(:data:`lmlab.interop.families.cohere.LEGACY`), plus ``order_of_interleaved_layers``.
"""

from lmlab.interop.common import Unread
from lmlab.interop.families.cohere import LEGACY
from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="cohere2", hf_class="Cohere2ForCausalLM", norm="cohere", layout="parallel", rope="cohere2",
    logit_scale=True, head_dim="derived", sliding="types", default_pattern=4,
    defaults=dict(vocab_size=256000, hidden_size=8192, intermediate_size=22528, logit_scale=0.0625,
                  num_hidden_layers=40, num_attention_heads=64, num_key_value_heads=None, hidden_act="silu",
                  max_position_embeddings=8192, layer_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False,
                  attention_dropout=0.0, sliding_window=4096),
    unread=LEGACY + (Unread("order_of_interleaved_layers", "sliding layers first in each group, as "
                            "HF's layer_types / sliding_window_pattern place them",
                            accepted=("local_attn_first",)),),
    notes="parallel block, interleaved RoPE on sliding layers only (NoPE full layers), logit_scale",
))
# fmt: on
