"""Mixtral (transformers ``MixtralForCausalLM``, model_type 'mixtral'; Jiang et al. 2024, "Mixtral of
Experts").

Mistral's attention (GQA, an optional sliding window on every layer) with every MLP a sparse mixture
of ``num_local_experts`` SwiGLU experts of width ``intermediate_size``: ``MixtralTopKRouter`` takes the
softmax of the router logits over all experts, keeps the top ``num_experts_per_tok`` and renormalises
them (lmlab: ``router_score='softmax'``, ``router_renormalize=True``). Checkpoints name the tensors
``block_sparse_moe.gate`` and ``block_sparse_moe.experts.E.{w1,w2,w3}`` (gate, down, up).
``router_jitter_noise`` other than 0 is refused.
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="mixtral", hf_class="MixtralForCausalLM", bias="none", sliding="all", moe="mixtral",
    defaults=dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=None, hidden_act="silu",
                  max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
                  attention_dropout=0.0, num_local_experts=8, num_experts_per_tok=2, output_router_logits=False,
                  router_aux_loss_coef=0.001, router_jitter_noise=0.0),
    notes="Mistral attention, every MLP a top-2 mixture of 8 SwiGLU experts",
))
# fmt: on
