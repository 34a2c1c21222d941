"""Every Llama-layout family against Hugging Face transformers: a small random HF model of the family
(GQA, sliding windows shorter than the sequence, soft-caps, QK-norm, RoPE scaling where the family has
them) is saved, imported with ``lmlab.interop.hf.import_hf`` and compared in fp32:

- logits on a batch of 2 random sequences (longer than any window): max |diff| <= 1e-4;
- a left-padded batch through HF with an attention mask vs lmlab on each sequence alone (lmlab's forward
  has no padding mask), on the non-pad positions;
- 32 greedy tokens from lmlab's KV-cache generation equal HF ``generate(do_sample=False)``;
- export back to HF: transformers loads it and reproduces the logits; importing the export reproduces
  lmlab's logits exactly.

The measured max |diff| per family is printed at the end of the module (``pytest -s``) and written as
JSON to $LMLAB_PARITY_REPORT when set.
"""

import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lmlab.cli import main  # noqa: E402
from lmlab.generate import generate  # noqa: E402
from lmlab.interop import hf as hfio  # noqa: E402
from lmlab.interop.registry import UnsupportedError  # noqa: E402

V, T, PAD = 128, 40, 7  # vocabulary, sequence length, left padding of the second padded row
TOL = 1e-4
BASE = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# model_type -> (config class, overrides, what the case exercises)
CASES = {
    "llama": (
        "LlamaConfig",
        dict(
            attention_bias=True,
            mlp_bias=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
        "GQA 4:2, q/k/v/o + MLP biases, Llama 3 RoPE scaling",
    ),
    "mistral": (
        "MistralConfig",
        dict(head_dim=32, sliding_window=8),
        "GQA, head_dim 32 != 64/4, window 8 on all layers",
    ),
    "qwen2": (
        "Qwen2Config",
        dict(
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=1,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=32),
        ),
        "q/k/v biases, window 8 on layer 1 only, YaRN, tied",
    ),
    "qwen3": (
        "Qwen3Config",
        dict(
            head_dim=32,
            num_hidden_layers=3,
            use_sliding_window=True,
            sliding_window=8,
            attention_bias=True,
            max_window_layers=2,
            rope_parameters=dict(rope_type="linear", rope_theta=1e6, factor=2.0),
        ),
        "per-head QK RMSNorm, q/k/v/o biases, head_dim 32, window on layer 2, linear RoPE scaling",
    ),
    "gemma": (
        "GemmaConfig",
        dict(head_dim=32, num_key_value_heads=1, hidden_act="gelu"),
        "(1+w) RMSNorm, GeGLU (legacy 'gelu' = tanh), MQA, embeddings x sqrt(d), tied",
    ),
    "gemma2": (
        "Gemma2Config",
        dict(
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=4.0,
        ),
        "sandwich norms, attention soft-cap 2 and final soft-cap 4, local(8)/global, query scale 24^-0.5",
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            num_hidden_layers=3,
            sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
            rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                full_attention=dict(rope_type="linear", rope_theta=1e6, factor=8.0),
            ),
        ),
        "(1+w) QK-norm, 2 local(8) : 1 global, local theta 1e4, global 1e6 linear x8",
    ),
    "gemma4_text": (
        "Gemma4TextConfig",
        dict(
            head_dim=16,
            num_hidden_layers=6,
            sliding_window=8,
            attention_bias=True,
            layer_types=["sliding_attention", "full_attention"] * 3,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=V,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=16,
            final_logit_softcapping=4.0,
            rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                full_attention=dict(rope_type="proportional", rope_theta=1e6, partial_rotary_factor=0.25, factor=2.0),
            ),
        ),
        "V-norm, query scale 1, local(8)/global with global head_dim 32, 1 KV head, keys as values and "
        "proportional RoPE (1/4 of the pairs, factor 2), q/k/v/o biases, layer scalars, final soft-cap 4, "
        "per-layer input embeddings (8), last 2 layers KV-shared with double-wide MLPs, MoE block "
        "beside each MLP (4 experts, top-2, router norm and scales perturbed)",
    ),
    "mixtral": (
        "MixtralConfig",
        dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
        "mixture of 4 SwiGLU experts, top-2 softmax renormalised, sliding window 8, GQA",
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            head_dim=32,
            num_hidden_layers=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
            norm_topk_prob=True,
            use_sliding_window=True,
            sliding_window=8,
            attention_bias=True,
        ),
        "Qwen3 attention (per-head QK RMSNorm, q/k/v/o biases, window 8 on every layer) with 4 SwiGLU "
        "experts (width 32, top-2 renormalised) on layer 1 only (decoder_sparse_step 2, layer 3 in "
        "mlp_only_layers), dense SwiGLU (96) on layers 0, 2, 3",
    ),
    "smollm3": (
        "SmolLM3Config",
        dict(num_hidden_layers=5, no_rope_layer_interval=2, tie_word_embeddings=False),
        "RoPE on layers 1, 3, 5 and NoPE on 2 and 4 (no_rope_layer_interval 2), GQA, untied",
    ),
    "llama4_text": (
        "Llama4TextConfig",
        dict(
            num_hidden_layers=4,
            head_dim=16,
            intermediate_size=48,
            intermediate_size_mlp=96,
            num_local_experts=4,
            num_experts_per_tok=2,
            interleave_moe_layer_step=2,
            attention_chunk_size=8,
            floor_scale=4,
            attn_scale=0.5,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        "chunked(8) RoPE layers 0-2 with L2 QK-norm, NoPE layer 3 with temperature (floor 4), "
        "MoE on layers 1 and 3 (4 sigmoid-scored experts fed the scaled token, top-2, shared expert)",
    ),
    "deepseek_v2": (
        "DeepseekV2Config",
        dict(
            num_hidden_layers=3,
            num_key_value_heads=4,
            rms_norm_eps=1e-6,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=1,
            routed_scaling_factor=2.0,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale=0.707,
                mscale_all_dim=0.707,
            ),
        ),
        "MLA (query bottleneck 24, KV latent 16 + RoPE key 8), YaRN x4 with mscale_all_dim, layer 0 "
        "dense, then 8 softmax experts routed group-limited (top-2 within the best of 4 groups) x 2.0 + a shared one",
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(
            num_hidden_layers=3,
            num_key_value_heads=4,
            rms_norm_eps=1e-6,
            kv_lora_rank=16,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale=1.0,
                mscale_all_dim=1.0,
            ),
        ),
        "MLA (no query bottleneck, KV latent 16 + RoPE key 8, interleaved RoPE), YaRN x4, layer 0 dense, "
        "then 8 sigmoid-scored experts with the routing bias (perturbed) choosing among the best 2 of 4 "
        "groups by their top-2 sums, top-2 renormalised x 2.5, plus a shared expert",
    ),
    "gpt_oss": (
        "GptOssConfig",
        dict(
            num_hidden_layers=2,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=32,
            sliding_window=8,
            swiglu_limit=1.5,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=4.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=32,
            ),
        ),
        "q/k/v/o biases, sinks (perturbed), local(8)/global, YaRN x4 untruncated, 4 experts with biases, "
        "router with a bias, top-2 softmax, clamped SwiGLU (limit 1.5, so the clamp acts)",
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        dict(
            num_hidden_layers=4,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=6,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            mlp_only_layers=[2],
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
        ),
        "3 Gated DeltaNet (2 key heads x 8, 4 value heads x 6) : 1 full-attention layer with the "
        "elementwise output gate, (1 + w) QK-norm and RoPE on half of each head; 4 experts (top-2 "
        "renormalised) + a shared expert of twice their width behind its sigmoid gate on layers 0, 1, "
        "3, a dense SwiGLU on layer 2",
    ),
    "olmo": ("OlmoConfig", dict(clip_qkv=1.0), "LayerNorm without parameters, clip_qkv 1.0, GQA"),
    "olmo2": ("Olmo2Config", dict(), "reordered norms, QK RMSNorm across heads, GQA"),
    "olmo3": (
        "Olmo3Config",
        dict(
            num_hidden_layers=4,
            sliding_window=8,
            rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                full_attention=dict(rope_type="linear", rope_theta=500000.0, factor=4.0),
            ),
        ),
        "OLMo 2's block, 3 local(8) : 1 global layers, local theta 1e4, global 5e5 linear x4",
    ),
    "cohere": (
        "CohereConfig",
        dict(use_qk_norm=True, logit_scale=0.25),
        "parallel block, bias-free LayerNorm, interleaved RoPE, per-head QK LayerNorm, logit_scale 0.25",
    ),
    "cohere2": (
        "Cohere2Config",
        dict(sliding_window=8, logit_scale=0.5, layer_types=["sliding_attention", "full_attention"]),
        "parallel block, interleaved RoPE on the local(8) layer, NoPE global layer, logit_scale 0.5",
    ),
}

# the padded row of the padded-batch check is left out where HF's output depends on the row's padding:
# Llama 4's chunks and attention temperature follow the cache index (padding included), lmlab's the
# token's position (test_llama4_padded_batch checks the padded row where the two agree)
PADDED_ROWS = {"llama4_text": (0,)}
RESULTS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if not RESULTS:
        return
    print("\nHugging Face parity (fp32, max |logit diff| vs transformers):")
    for name, r in RESULTS.items():
        print(
            f"  {name:12s} logits {r.get('logits', float('nan')):.1e}  padded {r.get('padded', float('nan')):.1e}  "
            f"export {r.get('export', float('nan')):.1e}  greedy32 {r.get('greedy', '-')}  ({CASES[name][2]})"
        )
    if os.environ.get("LMLAB_PARITY_REPORT"):
        with open(os.environ["LMLAB_PARITY_REPORT"], "w") as f:
            json.dump({k: dict(v, checked=CASES[k][2]) for k, v in RESULTS.items()}, f, indent=1)


def hf_model(name: str, path):
    cls, over, _ = CASES[name]
    cfg = getattr(transformers, cls)(**{**BASE, **over})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # norm weights away from their init, so a misplaced norm shows
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(
                ("router.scale", "per_expert_scale", "sinks")
            ):  # Gemma 4's router scales, sinks
                p.add_(0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.normal_(0.0, 0.1)
        for n, b in model.named_buffers():  # Gemma 4's stored per-layer output scalars (1 at init)
            if n.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
            if n.endswith("e_score_correction_bias"):  # DeepSeek-V3's routing bias (0 at init)
                b.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return model


def hf_logits(model, x, mask=None):
    kw = {}
    if mask is not None:
        kw = dict(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    with torch.no_grad():
        return model(input_ids=x, **kw).logits.float()


def padded_batch(x):
    """(row 1 without its first PAD tokens, [row 0; that row left-padded back to T], the padding mask)."""
    short = x[1, PAD:]
    padded = torch.stack([x[0], torch.cat([torch.zeros(PAD, dtype=torch.long), short])])
    mask = torch.ones_like(padded)
    mask[1, :PAD] = 0
    return short, padded, mask


@pytest.mark.parametrize("name", list(CASES))
def test_family_parity(name, tmp_path):
    ref = hf_model(name, tmp_path / "hf")
    info = hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    assert info["model_type"] == name and not info["tokenizer"]
    model, cfg, run, _ = hfio.load_run_model(tmp_path / "run")
    res = RESULTS.setdefault(name, {})

    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, V, (2, T), generator=g)
    with torch.no_grad():
        ours = model(x)
    theirs = hf_logits(ref, x)
    assert theirs.abs().max() > 0.5  # the comparison is not between near-zero logits
    res["logits"] = float((ours - theirs).abs().max())
    assert res["logits"] <= TOL, f"{name}: max |diff| {res['logits']:.2e}"

    # left-padded batch: HF with an attention mask vs lmlab on each sequence alone
    short, padded, mask = padded_batch(x)
    theirs_pad = hf_logits(ref, padded, mask)
    with torch.no_grad():
        alone = model(short[None])[0]
    diffs = [float((theirs_pad[0] - ours[0]).abs().max()), float((theirs_pad[1, PAD:] - alone).abs().max())]
    res["padded"] = max(diffs[r] for r in PADDED_ROWS.get(name, (0, 1)))
    assert res["padded"] <= TOL, f"{name}: padded max |diff| {res['padded']:.2e}"

    # greedy decoding with lmlab's KV cache vs HF generate
    prompt = x[0, :8]
    ours_gen = list(generate(model, prompt.tolist(), 32, temperature=0.0))
    with torch.no_grad():
        out = ref.generate(
            prompt[None],
            attention_mask=torch.ones_like(prompt[None]),
            do_sample=False,
            max_new_tokens=32,
            min_new_tokens=32,
            pad_token_id=0,
        )
    theirs_gen = out[0, 8:].tolist()
    res["greedy"] = "equal" if ours_gen == theirs_gen else "DIFFERENT"
    assert ours_gen == theirs_gen, f"{name}: greedy tokens differ\n{ours_gen}\n{theirs_gen}"

    # export, load with transformers, import again
    exp = hfio.export_hf(tmp_path / "run", tmp_path / "exp")
    assert exp["model_type"] == name
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exp", attn_implementation="eager").eval()
    res["export"] = float((hf_logits(back, x) - ours).abs().max())
    assert res["export"] <= TOL
    hfio.import_hf(tmp_path / "exp", tmp_path / "run2")
    model2, cfg2, _, _ = hfio.load_run_model(tmp_path / "run2")
    assert cfg2 == cfg
    with torch.no_grad():
        assert torch.equal(model2(x), ours)


def test_llama4_padded_batch(tmp_path, capsys):
    """Llama 4 with chunks longer than the padded sequence and the temperature floor past it: HF's padded
    row equals lmlab on the sequence alone (the case above leaves that row out, see PADDED_ROWS)."""
    cls, over, _ = CASES["llama4_text"]
    cfg = transformers.Llama4TextConfig(**{**BASE, **over, "attention_chunk_size": 64, "floor_scale": 8192})
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.save_pretrained(tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    model, _, _, _ = hfio.load_run_model(tmp_path / "run")
    short, padded, mask = padded_batch(torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(1)))
    theirs = hf_logits(ref, padded, mask)
    with torch.no_grad():
        alone = model(short[None])[0]
    assert float((theirs[1, PAD:] - alone).abs().max()) <= TOL
    # an import without tokenizer.json: the CLI generates from token ids
    assert main(["generate", str(tmp_path / "run"), "--prompt", "hi"]) == 2
    assert (
        main(
            ["generate", str(tmp_path / "run"), "--prompt-ids", "5 6 7", "--max-new-tokens", "4", "--temperature", "0"]
        )
        == 0
    )
    assert capsys.readouterr().out.split() == [str(i) for i in generate(model, [5, 6, 7], 4, temperature=0)]


# --- refusals ----------------------------------------------------------------------------------


def save_llama(path, **over):
    cfg = transformers.LlamaConfig(**{**BASE, **over})
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "hf"
    save_llama(path)
    return path


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)), ["'dynamic'", "llama3"]),
        (
            dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)),
            ["partial_rotary_factor=0.5"],
        ),
        (dict(num_experts=8), ["num_experts=8", "not handled"]),
        (dict(hidden_act="gelu"), ["hidden_act='gelu'", "silu"]),
        (dict(model_type="mamba"), ["model_type='mamba'", "llama"]),
    ],
)
def test_import_refuses_what_it_cannot_represent(llama_dir, tmp_path, changes, words):
    import shutil

    src = tmp_path / "hf"
    shutil.copytree(llama_dir, src)
    edit_config(src, **changes)
    with pytest.raises(UnsupportedError) as err:
        hfio.import_hf(src, tmp_path / "run")
    for w in words:
        assert w in str(err.value), str(err.value)
    assert not (tmp_path / "run").exists()


def test_tied_checkpoint_with_a_different_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    save_llama(tmp_path / "hf", tie_word_embeddings=True)
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    state["lm_head.weight"] = torch.randn_like(state["model.embed_tokens.weight"])
    save_file(state, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(UnsupportedError, match="tie_word_embeddings"):
        hfio.import_hf(tmp_path / "hf", tmp_path / "run")


def test_export_refuses_configs_no_family_represents(tmp_path, llama_dir):
    from lmlab.config import ModelConfig

    alibi = ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, position="alibi")
    with pytest.raises(UnsupportedError, match="no Hugging Face family") as err:
        hfio.lmlab_to_hf_config(alibi)
    assert "llama: " in str(err.value) and "position='alibi'" in str(err.value)
    # one line per family tried, each naming it (not one line of every family's reason)
    lines = str(err.value).splitlines()[1:]
    assert sorted(line.split(":")[0].strip() for line in lines) == sorted(hfio.families())
    # a family forced by name names the field it lacks
    hfio.import_hf(llama_dir, tmp_path / "run")
    with pytest.raises(UnsupportedError, match="norm_type='rmsnorm'"):
        hfio.export_hf(tmp_path / "run", tmp_path / "exp", family="cohere")
    assert not (tmp_path / "exp").exists()


def test_cli_import_export_and_errors(llama_dir, tmp_path, capsys):
    run, exp = tmp_path / "run", tmp_path / "exp"
    assert main(["import", str(llama_dir), "--out", str(run)]) == 0
    assert (run / "run.yaml").is_file() and (run / "checkpoints" / "step_0000000" / "model.safetensors").is_file()
    assert main(["import", str(llama_dir), "--out", str(run)]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main(["export", str(run), "--format", "hf", "--out", str(exp)]) == 0
    assert json.loads((exp / "config.json").read_text())["model_type"] == "llama"
    modes = {f.name: f.stat().st_mode & 0o777 for f in exp.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"]  # not 0600 (safetensors' own default)
    capsys.readouterr()
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "e2"), "--family", "gemma2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lmlab export: error: gemma2")
    assert main(["generate", str(run), "--prompt", "hi"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering "
    "a neighbourhood, this truth is so well fixed in the minds of the surrounding families. "
)


def test_imported_run_with_tokenizer_evaluates_generates_and_fine_tunes(tmp_path, capsys):
    import yaml

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(4):
        (docs / f"d{i}.txt").write_text(TEXT * (6 + i))
    data = tmp_path / "data"
    assert (
        main(["prepare", "--data", str(docs), "--out", str(data), "--vocab-size", "300", "--val-docs", "d0.txt"]) == 0
    )
    vocab = json.loads((data / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    save_llama(tmp_path / "hf", vocab_size=vocab, max_position_embeddings=64)
    (tmp_path / "hf" / "tokenizer.json").write_bytes((data / "tokenizer.json").read_bytes())
    run = tmp_path / "run"
    assert main(["import", str(tmp_path / "hf"), "--out", str(run)]) == 0
    assert (run / "tokenizer.json").read_bytes() == (data / "tokenizer.json").read_bytes()
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2  # no data folder of its own
    assert "--data" in capsys.readouterr().err
    assert main(["eval", str(run), "--data", str(data), "--json", "--batch-size", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["bits_per_byte"] > 0
    assert main(["generate", str(run), "--prompt", "It is", "--max-new-tokens", "4", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("It is")
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                "--resume",
                "--data",
                str(data),
                "--set",
                "max_steps=2",
                "--set",
                "batch_size=2",
                "--set",
                "eval_interval=2",
                "--set",
                "eval_windows=1",
                "--set",
                "device=cpu",
                "--set",
                "warmup_steps=1",
                "--no-progress",
            ]
        )
        == 0
    )
    assert yaml.safe_load((run / "run.yaml").read_text())["data"] == str(data.resolve())
    assert (run / "checkpoints" / "step_0000002").is_dir()
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "exp")]) == 0
    assert (tmp_path / "exp" / "tokenizer.json").is_file()


def test_hf_tokenizer_of_another_kind(tmp_path):
    """A SentencePiece-style tokenizer.json (Metaspace, a post-processor adding <s>) loads as kind 'hf'."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    from lmlab.data.tokenizer import Tokenizer

    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    hf.train_from_iterator(
        [TEXT] * 4, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    )
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path / "tokenizer.json")
    assert tok.kind == "hf" and tok.eot_id == 1  # <s>: the token before each document
    ids = tok.encode("a single man")
    assert 1 not in ids  # no BOS from the post-processor
    assert tok.decode(ids).strip() == "a single man"
    assert tok.decode_bytes([tok.eot_id]) == b""


PRESET_FAMILIES = {
    "llama-2-7b": "llama",
    "llama-3-8b": "llama",
    "mistral-7b": "mistral",
    "qwen2-7b": "qwen2",
    "qwen3-8b": "qwen3",
    "gemma-2b": "gemma",
    "gemma-2-9b": "gemma2",
    "gemma-3-12b": "gemma3_text",
    "gemma-3-1b": "gemma3_text",
    "gemma-4-31b": "gemma4_text",
    "gemma-4-e2b": "gemma4_text",
    "gemma-4-e4b": "gemma4_text",
    "gemma-4-26b-a4b": "gemma4_text",
    "gemma-3-4b": "gemma3_text",
    "gemma-3-27b": "gemma3_text",
    "mixtral-8x7b": "mixtral",
    "llama-2-70b": "llama",
    "llama-3-70b": "llama",
    "olmo-7b": "olmo",
    "olmo-2-7b": "olmo2",
    "olmo-3-7b": "olmo3",
    "command-r7b": "cohere2",
    "smollm3-3b": "smollm3",
    "marin-8b": "llama",
    "internlm2-7b": "llama",
    "llama-4-scout": "llama4_text",
    "deepseek-v2": "deepseek_v2",
    "deepseek-v2-lite": "deepseek_v2",
    "qwen3-30b-a3b": "qwen3_moe",
    "qwen3-235b-a22b": "qwen3_moe",
    "deepseek-v3": "deepseek_v3",
    "gpt-oss-20b": "gpt_oss",
    "gpt-oss-120b": "gpt_oss",
    "qwen3-next-80b-a3b": "qwen3_next",
}


@pytest.mark.parametrize("preset", list(PRESET_FAMILIES))
def test_presets_are_models_of_their_family(preset):
    """Each preset of these families (real and tiny scale) is exactly a model of its HF family (the
    export's config converts back to the same function: ``roundtrip.verify_roundtrip``); the families
    themselves are proven against transformers above."""
    from lmlab.presets import preset_config

    for scale in ("tiny", "real"):
        fam, hf = hfio.lmlab_to_hf_config(preset_config(preset, scale))
        assert fam.model_type == PRESET_FAMILIES[preset], scale


def test_sharded_bin_and_v4_config_spellings(tmp_path):
    """Sharded safetensors, pytorch_model.bin (weights_only), and a transformers-4 config.json (rope_theta +
    rope_scaling with 'type') import to the same model."""
    cfg = transformers.LlamaConfig(**{**BASE, "tie_word_embeddings": False})
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_bytes((tmp_path / "sharded" / "config.json").read_bytes())
    torch.save(ref.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    v4 = json.loads((tmp_path / "bin" / "config.json").read_text())
    v4.pop("rope_parameters")
    v4.update(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0})
    (tmp_path / "v4").mkdir()
    (tmp_path / "v4" / "config.json").write_text(json.dumps(v4))
    (tmp_path / "v4" / "pytorch_model.bin").write_bytes((tmp_path / "bin" / "pytorch_model.bin").read_bytes())
    x = torch.randint(0, V, (1, 24), generator=torch.Generator().manual_seed(3))
    outs = {}
    for name in ("sharded", "bin", "v4"):
        model, cfg_l, _, _ = hfio.hf_to_lmlab(tmp_path / name)
        with torch.no_grad():
            outs[name] = model(x)
    assert torch.equal(outs["sharded"], outs["bin"])
    assert cfg_l.rope_theta == 500000.0 and cfg_l.rope_scaling == {"type": "linear", "factor": 2.0}
    v4_ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "v4", attn_implementation="eager").eval()
    assert float((hf_logits(v4_ref, x) - outs["v4"]).abs().max()) <= TOL
    assert float((hf_logits(ref, x) - outs["bin"]).abs().max()) <= TOL


def test_gpt2_style_tokenizer_imported_and_generates_as_hf(tmp_path, capsys):
    """An HF folder with vocab.json + merges.txt (no tokenizer.json): `lmlab import` builds the
    tokenizer into the run, and `lmlab generate` (greedy) prints what HF's GPT2TokenizerFast + generate
    produce from the same prompt; `lmlab prepare --tokenizer-file FOLDER` takes the same folder."""
    from lmlab.data.tokenizer import Tokenizer

    texts = [TEXT * 4, "the cat sat on the mat and the dog sat on the log " * 20]
    ours = Tokenizer.train_bpe(texts, 320)
    hf_dir = tmp_path / "gpt2"
    hf_dir.mkdir()
    ours.hf.model.save(str(hf_dir))  # vocab.json + merges.txt, as a GPT-2 folder holds them
    vocab = json.loads((hf_dir / "vocab.json").read_text())
    cfg = transformers.GPT2Config(
        vocab_size=len(vocab),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        eos_token_id=vocab["<|endoftext|>"],
        bos_token_id=vocab["<|endoftext|>"],
    )
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(hf_dir)
    assert not (hf_dir / "tokenizer.json").exists()
    run = tmp_path / "run"
    assert main(["import", str(hf_dir), "--out", str(run)]) == 0
    assert (run / "tokenizer.json").is_file()
    capsys.readouterr()
    prompt = "It is a truth"
    assert main(["generate", str(run), "--prompt", prompt, "--max-new-tokens", "12", "--temperature", "0"]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    hf_tok = transformers.GPT2TokenizerFast(vocab=str(hf_dir / "vocab.json"), merges=str(hf_dir / "merges.txt"))
    ids = hf_tok(prompt, return_tensors="pt").input_ids
    assert ids[0].tolist() == Tokenizer.load(run / "tokenizer.json").encode(prompt)
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=cfg.eos_token_id)
    assert printed == hf_tok.decode(out[0], skip_special_tokens=True)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(TEXT * 3)
    (docs / "b.txt").write_text(TEXT)
    assert (
        main(
            [
                "prepare",
                "--data",
                str(docs),
                "--out",
                str(tmp_path / "data"),
                "--tokenizer-file",
                str(hf_dir),
                "--val-docs",
                "b.txt",
            ]
        )
        == 0
    )
    data_tok = Tokenizer.load(tmp_path / "data" / "tokenizer.json")
    assert data_tok.encode(TEXT) == hf_tok(TEXT).input_ids


def test_llama_attention_bias_without_mlp_bias(tmp_path):
    """Llama with attention_bias=True and mlp_bias=False (q, k, v and o biases only) imports as
    bias='attention', gives HF's logits and exports back to the same flags."""
    save_llama(tmp_path / "hf", attention_bias=True, mlp_bias=False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n.endswith("bias"):
                p.normal_(0.0, 0.1)
    ref.save_pretrained(tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    assert cfg.bias == "attention" and model.blocks[0].attn.out.bias is not None
    assert model.blocks[0].mlp.w_in.bias is None
    x = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert float((model(x) - hf_logits(ref, x)).abs().max()) <= TOL
    hfio.export_hf(tmp_path / "run", tmp_path / "exp")
    exported = json.loads((tmp_path / "exp" / "config.json").read_text())
    assert exported["attention_bias"] is True and exported["mlp_bias"] is False


def test_layer_pattern_that_ends_mid_pattern(tmp_path):
    """Gemma 3 1B/4B/27B (26, 34, 62 layers) end mid-pattern. The presets put local and global layers
    exactly where HF's default ``layer_types`` does; a 5-layer Gemma 3 (S S F S S) imports as 'LLG'
    cut at the depth, with the same logits and greedy tokens, and exports the same layer_types."""
    from lmlab.presets import preset_config

    for preset, n in (("gemma-3-1b", 26), ("gemma-3-4b", 34), ("gemma-3-27b", 62)):
        cfg = preset_config(preset, "real")
        hf_types = transformers.Gemma3TextConfig(num_hidden_layers=n).layer_types
        assert cfg.n_layers == n and len(hf_types) == n and hf_types[-1] == "sliding_attention"
        assert [cfg.layer_is_local(i) for i in range(n)] == [t == "sliding_attention" for t in hf_types]
    types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    cls, over, _ = CASES["gemma3_text"]
    hf_cfg = getattr(transformers, cls)(
        **{**BASE, **over, "num_hidden_layers": 5, "layer_types": types, "eos_token_id": None}
    )  # min_new_tokens would mask token 2
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").eval()
    ref.save_pretrained(tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    assert cfg.layer_pattern == "LLG" and cfg.n_layers == 5
    x = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert float((model(x) - hf_logits(ref, x)).abs().max()) <= TOL
    prompt = x[0, :8]
    with torch.no_grad():
        out = ref.generate(
            prompt[None],
            attention_mask=torch.ones_like(prompt[None]),
            do_sample=False,
            max_new_tokens=32,
            min_new_tokens=32,
            pad_token_id=0,
        )
    assert list(generate(model, prompt.tolist(), 32, temperature=0.0)) == out[0, 8:].tolist()
    hfio.export_hf(tmp_path / "run", tmp_path / "exp")
    assert json.loads((tmp_path / "exp" / "config.json").read_text())["layer_types"] == types


def test_deepseek_v2_stacked_experts_read_as_the_published_layout(tmp_path):
    """A DeepSeek-V2 checkpoint holding its experts stacked (transformers' in-memory gate_up_proj /
    down_proj) imports to the same model as the per-expert layout transformers saves."""
    from safetensors.torch import load_file, save_file

    ref = hf_model("deepseek_v2", tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    n = ref.config.n_routed_experts
    for i in range(1, ref.config.num_hidden_layers):  # layer 0 is dense
        p = f"model.layers.{i}.mlp.experts"
        gate_up = [
            torch.cat([state.pop(f"{p}.{e}.gate_proj.weight"), state.pop(f"{p}.{e}.up_proj.weight")]) for e in range(n)
        ]
        state[f"{p}.gate_up_proj"] = torch.stack(gate_up)
        state[f"{p}.down_proj"] = torch.stack([state.pop(f"{p}.{e}.down_proj.weight") for e in range(n)])
    save_file(state, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    hfio.import_hf(tmp_path / "hf", tmp_path / "run2")
    a, b = hfio.load_run_model(tmp_path / "run")[0], hfio.load_run_model(tmp_path / "run2")[0]
    x = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
    state["model.layers.1.mlp.experts.down_proj"] = state["model.layers.1.mlp.experts.down_proj"][:3]
    save_file(state, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnsupportedError, match="hold 8 / 3 experts, the config 8"):
        hfio.import_hf(tmp_path / "hf", tmp_path / "run3")
    assert not (tmp_path / "run3").exists()


def test_yarn_mscale_zero_means_off():
    """transformers reads mscale / mscale_all_dim 0 as "off": the import drops them (not refused)."""
    from lmlab.interop import common as C

    params = dict(
        rope_type="yarn",
        rope_theta=1e4,
        factor=4.0,
        original_max_position_embeddings=32,
        mscale=0.0,
        mscale_all_dim=0.0,
    )
    theta, scaling, _ = C.read_rope({"rope_parameters": params}, "deepseek_v2")
    assert theta == 1e4 and "mscale" not in scaling and "mscale_all_dim" not in scaling
    assert scaling["factor"] == 4.0


def test_llama4_scout_card_count_is_the_text_model_plus_the_vision_tower():
    """The card's 109B total counts the multimodal checkpoint: lmlab's text model (equal to HF's text
    model) plus the vision tower of the published vision_config (HF Llama4ForConditionalGeneration on the
    meta device) is within 0.5% of 109B, the text model alone is not."""
    from lmlab.param_counts import param_counts
    from lmlab.presets import preset_config

    cfg = preset_config("llama-4-scout", "real")
    _, hf = hfio.lmlab_to_hf_config(cfg)
    text = transformers.Llama4TextConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
    vision = dict(
        hidden_size=1408,
        image_size=336,
        intermediate_size=5632,
        num_attention_heads=16,
        num_hidden_layers=34,
        patch_size=14,
        pixel_shuffle_ratio=0.5,
        projector_input_dim=4096,
        projector_output_dim=4096,
        vision_output_dim=4096,
        multi_modal_projector_bias=False,
    )
    with torch.device("meta"):
        full = transformers.Llama4ForConditionalGeneration(
            transformers.Llama4Config(text_config=text.to_dict(), vision_config=vision)
        )
    total = sum(p.numel() for p in full.parameters())
    text_only = sum(p.numel() for n, p in full.named_parameters() if "language_model" in n)
    assert text_only == param_counts(cfg)["total"] == 107_769_861_120
    assert abs(total / 109e9 - 1) < 0.005 < abs(text_only / 109e9 - 1)


def test_qwen3_moe_each_feature_is_what_matches(tmp_path):
    """The qwen3_moe case reads its experts as HF places them (MoE on layer 1 only: decoder_sparse_step 2
    with layer 3 in mlp_only_layers; experts of moe_intermediate_size; renormalised top-2), and each of those
    readings is needed: switched the other way, lmlab's logits leave HF's."""
    import dataclasses

    from lmlab.model import TransformerLM

    ref = hf_model("qwen3_moe", tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_d_ff, cfg.d_ff) == (4, 2, 32, 96)
    assert [cfg.layer_is_moe(i) for i in range(4)] == [False, True, False, False]
    assert cfg.router_renormalize and cfg.sliding_window == 8 and cfg.layer_pattern is None
    x = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(1))
    theirs = hf_logits(ref, x)
    state = model.state_dict()
    for change in (dict(router_renormalize=False), dict(sliding_window=None)):
        other = TransformerLM(dataclasses.replace(cfg, **change)).eval()
        other.load_state_dict(state)
        with torch.no_grad():
            assert (other(x) - theirs).abs().max() > 1e-2, change
    # the export writes the same layout back: step 2 with layer 3 listed as dense
    fam, hf = hfio.lmlab_to_hf_config(cfg)
    assert fam.model_type == "qwen3_moe" and (hf["decoder_sparse_step"], hf["mlp_only_layers"]) == (2, [3])
    assert (hf["num_experts"], hf["moe_intermediate_size"], hf["intermediate_size"], hf["norm_topk_prob"]) == (
        4,
        32,
        96,
        True,
    )


def test_deepseek_v3_router_readings_each_matter(tmp_path):
    """The deepseek_v3 case imports V3's router (sigmoid scores, the routing bias for the choice only,
    groups by their top-2 sums, renormalised), and each reading is needed: switched, the logits leave HF's."""
    import dataclasses

    from lmlab.model import TransformerLM

    ref = hf_model("deepseek_v3", tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    assert (cfg.router_score, cfg.router_group_score, cfg.moe_balance, cfg.router_renormalize) == (
        "sigmoid",
        "top2_sum",
        "aux_free",
        True,
    )
    assert (cfg.router_groups, cfg.router_topk_groups, cfg.routed_scaling_factor) == (4, 2, 2.5)
    x = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(1))
    theirs = hf_logits(ref, x)
    state = model.state_dict()
    assert state["blocks.1.mlp.expert_bias"].abs().max() > 0.1  # the perturbed bias was read
    for change in (dict(router_group_score="max"), dict(router_renormalize=False), dict(router_score="softmax")):
        other = TransformerLM(dataclasses.replace(cfg, **change)).eval()
        other.load_state_dict(state)
        with torch.no_grad():
            assert (other(x) - theirs).abs().max() > 1e-3, change
    zeroed = {k: (torch.zeros_like(v) if k.endswith("expert_bias") else v) for k, v in state.items()}
    model.load_state_dict(zeroed)
    with torch.no_grad():
        assert (model(x) - theirs).abs().max() > 1e-3  # without the bias the choice differs


def test_gpt_oss_readings_each_matter(tmp_path):
    """The gpt_oss case reads sinks, the router's bias and the clamped SwiGLU, and each is needed: with
    plain SwiGLU, with the clamp out of reach, without the router bias or with sinks of -inf, lmlab's logits
    leave HF's."""
    import dataclasses

    from lmlab.model import TransformerLM

    ref = hf_model("gpt_oss", tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    assert (cfg.activation, cfg.swiglu_limit, cfg.attn_sinks, cfg.router_bias, cfg.bias) == (
        "swiglu_clamped",
        1.5,
        True,
        True,
        "all",
    )
    assert cfg.layer_pattern == "LG" and cfg.rope_scaling["truncate"] is False
    x = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(1))
    theirs = hf_logits(ref, x)
    state = model.state_dict()
    for change in (dict(activation="swiglu"), dict(swiglu_limit=1e6)):
        other = TransformerLM(dataclasses.replace(cfg, **change)).eval()
        other.load_state_dict(state)
        with torch.no_grad():
            assert (other(x) - theirs).abs().max() > 1e-3, change
    for key, value in (("mlp.router.bias", 0.0), ("attn.sinks", float("-inf"))):
        changed = {k: (torch.full_like(v, value) if k.endswith(key) else v) for k, v in state.items()}
        model.load_state_dict(changed)
        with torch.no_grad():
            assert (model(x) - theirs).abs().max() > 1e-3, key


def test_qwen3_next_readings_each_matter(tmp_path):
    """The qwen3_next case reads the output gate, the (1 + w) norms, partial RoPE, the shared expert's gate and
    the Gated DeltaNet layers, and each is needed: switched off (or the norms read as plain RMSNorm, RoPE over
    the whole head), lmlab's logits leave HF's; the chunk size of the chunked form does not matter."""
    import dataclasses

    from lmlab.model import TransformerLM

    ref = hf_model("qwen3_next", tmp_path / "hf")
    hfio.import_hf(tmp_path / "hf", tmp_path / "run")
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    assert (
        cfg.layer_pattern,
        cfg.attn_output_gate,
        cfg.rope_fraction,
        cfg.n_shared_experts,
        cfg.shared_expert_gate,
        cfg.moe_pattern,
        cfg.norm_type,
        cfg.qk_norm,
    ) == ("DDDG", "elementwise", 0.5, 2, True, "MMD", "gemma_rmsnorm", "gemma_rmsnorm")
    x = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(1))
    theirs = hf_logits(ref, x)
    state = model.state_dict()
    for change, drop, off in (
        (dict(linear_chunk=3), None, False),
        (dict(attn_output_gate="none"), ".attn.gate.", True),
        (dict(shared_expert_gate=False), ".shared_gate.", True),
        (dict(norm_type="rmsnorm", qk_norm="rmsnorm"), None, True),
        (dict(rope_fraction=1.0), None, True),
        (dict(layer_pattern=None), ".attn.", True),
    ):
        other = TransformerLM(dataclasses.replace(cfg, **change)).eval()
        kept = {k: v for k, v in state.items() if drop is None or drop not in k}
        other.load_state_dict(kept, strict=drop is None)
        with torch.no_grad():
            diff = float((other(x) - theirs).abs().max())
        assert (diff > 1e-3) if off else (diff <= TOL), (change, diff)
