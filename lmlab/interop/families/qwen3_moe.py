"""Qwen3-MoE (transformers ``Qwen3MoeForCausalLM``, model_type 'qwen3_moe'; Qwen Team 2025, "Qwen3
Technical Report", arXiv 2505.09388: Qwen3-30B-A3B and Qwen3-235B-A22B).

Qwen3's attention (GQA, per-head QK RMSNorm, no biases) with a mixture of ``num_experts`` SwiGLU experts of
width ``moe_intermediate_size`` on every ``decoder_sparse_step``-th layer not listed in ``mlp_only_layers``
(those keep a dense SwiGLU of ``intermediate_size``; lmlab ``moe_pattern``). ``Qwen3MoeTopKRouter`` takes
the softmax of the router logits over all experts, keeps the top ``num_experts_per_tok`` and divides them
by their sum when ``norm_topk_prob`` (the released checkpoints: true; lmlab ``router_renormalize``). No
shared expert (Qwen2-MoE's). ``use_sliding_window`` puts ``sliding_window`` on every layer. Checkpoints name
the tensors ``mlp.gate`` and ``mlp.experts.E.{gate,up,down}_proj``.
"""

from lmlab.interop.llama_like import Spec, build

# fmt: off
FAMILY = build(Spec(
    model_type="qwen3_moe", hf_class="Qwen3MoeForCausalLM", sliding="flag", qk_norm="head_rms", moe="qwen3",
    defaults=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                  num_attention_heads=32, num_key_value_heads=4, head_dim=None, hidden_act="silu",
                  max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                  use_sliding_window=False, sliding_window=4096, attention_dropout=0.0, decoder_sparse_step=1,
                  moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128, norm_topk_prob=False,
                  output_router_logits=False, router_aux_loss_coef=0.001, mlp_only_layers=None),
    notes="Qwen3 attention, MoE SwiGLU experts (top-k softmax, renormalised when norm_topk_prob) on the "
          "decoder_sparse_step-th layers",
))
# fmt: on
