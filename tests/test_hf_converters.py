"""Parity of the GPT-2, GPT-J, GPT-NeoX, OPT, Phi, Nemotron, StableLM and Falcon converters with Hugging
Face transformers.

For each case a small random HF model (every parameter perturbed, so norms and biases matter) is saved
with ``save_pretrained`` and imported with ``lmlab.interop.hf.import_hf`` into a run folder, then checked:
- fp32 logits within 1e-4 of HF on a batch of two random sequences;
- a left-padded batch through HF (attention_mask, position_ids) against lmlab on each sequence alone;
- greedy generation of 32 tokens with lmlab's KV cache equals HF ``generate`` token for token;
- ``export_hf`` (the family's config_to_hf + state_to_hf) writes a folder that
  ``AutoModelForCausalLM.from_pretrained`` loads with no missing or unexpected tensors and that reproduces
  the logits; re-importing the export reproduces lmlab's logits exactly.
The measured maximum absolute logit differences are printed (``pytest -s``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lmlab.config import ModelConfig  # noqa: E402
from lmlab.generate import generate  # noqa: E402
from lmlab.interop.hf import export_hf, import_hf, load_run_model  # noqa: E402
from lmlab.interop.registry import UnsupportedError, get_family  # noqa: E402
from lmlab.model import KVCache, TransformerLM  # noqa: E402

TOL = 1e-4
VOCAB = 128
SEQ = 20
NEW_TOKENS = 32
MAX_DIFF: dict[str, float] = {}  # case -> max |logit diff| over the checks (reported at the end)

# model_type, HF config kwargs (tiny: hidden 32-64, 2 layers, vocabulary 128)
CASES = {
    "gpt2": ("gpt2", dict(n_embd=48, n_layer=2, n_head=4, n_positions=96, activation_function="gelu_new")),
    "gpt2-untied-unscaled": (
        "gpt2",
        dict(
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=96,
            n_inner=80,
            activation_function="relu",
            tie_word_embeddings=False,
            scale_attn_weights=False,
        ),
    ),
    "gptj": ("gptj", dict(n_embd=64, n_layer=2, n_head=4, n_positions=96, rotary_dim=8)),
    "gpt_neox": (
        "gpt_neox",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=160,
            max_position_embeddings=96,
            rotary_pct=0.25,
            rotary_emb_base=500.0,
        ),
    ),
    "gpt_neox-sequential": (
        "gpt_neox",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=96,
            rotary_pct=0.5,
            use_parallel_residual=False,
            hidden_act="gelu_fast",
            tie_word_embeddings=True,
        ),
    ),
    "opt": (
        "opt",
        dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, ffn_dim=96, max_position_embeddings=96),
    ),
    "opt-350m-style": (
        "opt",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=128,
            max_position_embeddings=96,
            do_layer_norm_before=False,
            word_embed_proj_dim=32,
        ),
    ),
    "opt-bare": (
        "opt",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            ffn_dim=64,
            max_position_embeddings=96,
            enable_bias=False,
            layer_norm_elementwise_affine=False,
            _remove_final_layer_norm=True,
            activation_function="gelu",
        ),
    ),
    "phi": (
        "phi",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=96,
            partial_rotary_factor=0.5,
        ),
    ),
    "nemotron": (
        "nemotron",
        dict(
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            max_position_embeddings=96,
            partial_rotary_factor=0.5,
            mlp_bias=True,
        ),
    ),
    "stablelm": (
        "stablelm",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=96,
            max_position_embeddings=96,
            partial_rotary_factor=0.25,
            use_qkv_bias=True,
            qk_layernorm=True,
        ),
    ),
    "stablelm-parallel": (
        "stablelm",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=96,
            partial_rotary_factor=0.5,
            use_parallel_residual=True,
        ),
    ),
    "falcon-mqa": (
        "falcon",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            multi_query=True,
            parallel_attn=True,
            bias=False,
            max_position_embeddings=96,
        ),
    ),
    "falcon-new-arch": (
        "falcon",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            bias=True,
            max_position_embeddings=96,
            ffn_hidden_size=96,
        ),
    ),
    "falcon-mha-sequential": (
        "falcon",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            multi_query=False,
            parallel_attn=False,
            bias=True,
            max_position_embeddings=96,
            tie_word_embeddings=False,
        ),
    ),
}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _hf_model(model_type: str, kwargs: dict):
    """A random HF model with every parameter perturbed (norm weights and biases no longer 1 / 0)."""
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, pad_token_id=None, **kwargs
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.15)
    return model


def _import(hf_dir: Path, run_dir: Path) -> tuple[TransformerLM, ModelConfig]:
    """HF folder -> lmlab run folder (``import_hf``: family mapping, strict load) -> the run's model."""
    summary = import_hf(hf_dir, run_dir)
    assert summary["model_type"] == json.loads((hf_dir / "config.json").read_text())["model_type"]
    model, cfg, _, _ = load_run_model(run_dir)
    return model, cfg


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@pytest.mark.parametrize("case", list(CASES))
def test_family_parity(case, tmp_path):
    model_type, kwargs = CASES[case]
    hf_model = _hf_model(model_type, kwargs)
    hf_model.save_pretrained(tmp_path / "hf")
    model, cfg = _import(tmp_path / "hf", tmp_path / "run")
    diffs = {}

    def check(name: str, value: float) -> None:
        diffs[name] = value
        assert value <= TOL, f"{case}: {name} max abs logit diff {value:.3e} > {TOL}"

    # 1. logits on a batch of two random sequences
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    with torch.no_grad():
        check("logits", _diff(hf_model(ids).logits, model(ids)))

    # 2. left-padded batch: HF with attention_mask and position_ids vs lmlab on each sequence alone
    lengths = [SEQ, SEQ - 7]
    mask = torch.zeros(2, SEQ, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, SEQ - n :] = 1
    padded = torch.where(mask.bool(), ids, torch.zeros_like(ids))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf_model(padded, attention_mask=mask, position_ids=positions).logits
        check(
            "padded",
            max(
                _diff(ref[row : row + 1, SEQ - n :], model(ids[row : row + 1, SEQ - n :]))
                for row, n in enumerate(lengths)
            ),
        )

    # 3. greedy generation with lmlab's KV cache vs HF generate, token for token; and lmlab's cached
    #    one-token steps along HF's sequence against HF's per-step logits (a check even where a random
    #    model repeats one token)
    prompt = ids[0, :8]
    with torch.no_grad():
        hf_out = hf_model.generate(
            prompt[None],
            attention_mask=torch.ones(1, 8, dtype=torch.long),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        hf_tokens = hf_out.sequences[0, 8:].tolist()
        cache = KVCache(cfg, 1, cfg.context_length)
        step_logits = [model(prompt[None], cache)[:, -1]]
        for tok in hf_tokens[:-1]:
            step_logits.append(model(torch.tensor([[tok]]), cache)[:, -1])
        check("cached", _diff(torch.cat(hf_out.logits), torch.cat(step_logits)))
    assert list(generate(model, prompt.tolist(), NEW_TOKENS, temperature=0)) == hf_tokens, (
        f"{case}: greedy generations differ"
    )

    # 4. export_hf -> transformers reproduces the logits; re-importing the export reproduces lmlab's logits
    summary = export_hf(tmp_path / "run", tmp_path / "export")
    assert summary["model_type"] == model_type
    back_hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    back_lm, _ = _import(tmp_path / "export", tmp_path / "run2")
    with torch.no_grad():
        ours = model(ids)
        check("export", _diff(back_hf.eval()(ids).logits, ours))
        assert torch.equal(back_lm(ids), ours), f"{case}: re-import does not reproduce lmlab's logits exactly"

    MAX_DIFF[case] = max(diffs.values())
    print(f"\n{case}: max |logit diff| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))


@pytest.mark.parametrize(
    "model_type, field, value",
    [
        ("gpt2", "scale_attn_by_inverse_layer_idx", True),
        ("gpt_neox", "attention_bias", False),
        ("phi", "qk_layernorm", True),
        ("falcon", "alibi", True),
        ("opt", "some_future_switch", 3),
    ],
)
def test_unsupported_fields_raise(model_type, field, value):
    hf = {"model_type": model_type, field: value}
    with pytest.raises(UnsupportedError, match=field):
        get_family(model_type).config_to_lmlab(hf)


def test_export_refuses_what_a_family_lacks():
    cfg = ModelConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_layers=2,
        n_heads=2,
        norm_type="layernorm",
        norm_bias=True,
        bias="all",
        activation="swiglu",
        position="learned",
    )
    with pytest.raises(UnsupportedError, match="activation"):
        get_family("gpt2").config_to_hf(cfg)
    cfg = ModelConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_layers=2,
        n_heads=2,
        norm_type="layernorm",
        norm_bias=True,
        bias="all",
        activation="gelu_tanh",
        position="learned",
        qk_norm="rmsnorm",
    )
    with pytest.raises(UnsupportedError, match="qk_norm"):
        get_family("gpt2").config_to_hf(cfg)


@pytest.mark.parametrize(
    "model_type, fields",
    [
        ("gpt_neox", dict(hidden_size=64, num_attention_heads=4, rotary_pct=0.5, rotary_emb_base=500)),
        ("gpt_neox", dict(hidden_size=64, num_attention_heads=4)),
        ("phi", dict(hidden_size=80, num_attention_heads=4, partial_rotary_factor=0.4, rope_theta=500.0)),
        ("phi", dict(hidden_size=64, num_attention_heads=4, rope_scaling={"type": "linear", "factor": 2.0})),
        ("phi", dict(hidden_size=64, num_attention_heads=4)),
        (
            "stablelm",
            dict(
                hidden_size=64, num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.5, rope_theta=1000
            ),
        ),
        ("stablelm", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4)),
        ("nemotron", dict(hidden_size=64, num_attention_heads=4, head_dim=32, partial_rotary_factor=0.25)),
        ("nemotron", dict(hidden_size=64, num_attention_heads=4)),
        ("falcon", dict(n_embed=64, num_attention_heads=4, rope_theta=5000.0)),
    ],
)
def test_config_spellings_read_as_transformers_does(model_type, fields):
    """Older config.json spellings (rotary_pct, top-level rope_theta / partial_rotary_factor, rope_scaling,
    n_embed) and absent fields (each family's defaults) resolve to the RoPE transformers uses."""
    ours = get_family(model_type).config_to_lmlab({"model_type": model_type, **fields})
    theirs = transformers.AutoConfig.for_model(model_type, **fields)
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    params = theirs.rope_parameters
    fraction = 1.0 if model_type == "falcon" else params.get("partial_rotary_factor", 1.0)
    assert (ours.d_model, ours.head_dim) == (theirs.hidden_size, head_dim)
    assert ours.rope_theta == params["rope_theta"]
    assert round(ours.head_dim * ours.rope_fraction) == int(head_dim * fraction)
    kind = params.get("rope_type", "default")
    assert (ours.rope_scaling or {}).get("type", "default") == kind


@pytest.mark.parametrize(
    "preset, model_type",
    [
        ("gpt2-124m", "gpt2"),
        ("gpt-j-6b", "gptj"),
        ("gpt-neox-20b", "gpt_neox"),
        ("pythia-160m", "gpt_neox"),
        ("opt-350m", "opt"),
        ("nemotron-4-15b", "nemotron"),
        ("nemotron-4-340b", "nemotron"),
        ("phi-2", "phi"),
        ("llama-4-scout", "llama4_text"),
        ("deepseek-v2-lite", "deepseek_v2"),
        ("deepseek-v2", "deepseek_v2"),
    ],
)
def test_tiny_preset_exports_to_transformers(preset, model_type, tmp_path):
    """Every preset of these families (tiny scale, random weights, norms and biases perturbed) exports to
    its HF family and transformers reproduces lmlab's logits."""
    from safetensors.torch import save_file

    from lmlab.presets import preset_config

    cfg = preset_config(preset, "tiny", vocab_size=VOCAB, n_layers=2, context_length=64)
    torch.manual_seed(0)
    model = TransformerLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    family = get_family(model_type)
    (tmp_path / "config.json").write_text(json.dumps(family.config_to_hf(cfg)))
    state = family.state_to_hf({k: v.detach() for k, v in model.state_dict().items()}, cfg)
    save_file(
        {k: v.clone().contiguous() for k, v in state.items()},
        str(tmp_path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    hf_model, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = _diff(hf_model.eval()(ids).logits, model(ids))
    print(f"\n{preset} (tiny) -> {model_type}: max |logit diff| {diff:.2e}")
    assert diff <= TOL


def test_falcon_num_key_value_heads_is_checked_against_the_layout():
    """transformers >= 5.25 writes num_key_value_heads into a Falcon config.json (derived: num_kv_heads
    for the new architecture and MHA, 1 for multi-query); read as a check, a contradicting value refused."""
    base = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4}
    new = {**base, "new_decoder_architecture": True, "num_kv_heads": 2}
    assert get_family("falcon").config_to_lmlab({**new, "num_key_value_heads": 2}).n_kv_heads == 2
    assert get_family("falcon").config_to_lmlab({**base, "num_key_value_heads": 1}).n_kv_heads == 1  # MQA
    for hf in ({**new, "num_key_value_heads": 4}, {**base, "num_key_value_heads": 4}):
        with pytest.raises(UnsupportedError, match="num_key_value_heads=4"):
            get_family("falcon").config_to_lmlab(hf)


def test_config_table_reads_aliases_and_defaults_and_writes_them_back():
    """The config table of the hand-written families (lmlab/interop/families/_config_table.py): a null field
    falls to the next alias, then to the default (a callable one follows the fields read before it); casts
    on reading, beside the family's fixed fields; on writing, the model type and class come first, an optional
    field equal to its default is left out, write_as renames."""
    from lmlab.interop.families._config_table import STANDARD, ConfigTable

    table = ConfigTable(
        "toy",
        dict(
            d_model=64,
            n_heads=4,
            d_ff=lambda v: 4 * v["d_model"],
            head_dim=lambda v: v["d_model"] // v["n_heads"],
            norm_eps=1e-5,
            activation="gelu",
        ),
        names={**STANDARD, "d_model": ("n_embd", "hidden_size")},
        optional=("head_dim",),
        write_as={"d_model": "hidden_size"},
        hf_class="ToyForCausalLM",
        fixed=dict(norm_type="layernorm", bias="all"),
    )
    assert table.keys() == {
        "n_embd",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "head_dim",
        "layer_norm_eps",
        "hidden_act",
    }
    fields = table.read({"n_embd": None, "hidden_size": 32, "layer_norm_eps": 1})
    assert fields == {"norm_type": "layernorm", "bias": "all", "d_model": 32, "n_heads": 4, "d_ff": 128, "head_dim": 8,
                      "norm_eps": 1.0, "activation": "gelu"}  # fmt: skip
    assert isinstance(fields["norm_eps"], float)
    cfg = ModelConfig(vocab_size=16, context_length=8, d_model=32, n_heads=4, d_ff=128, activation="gelu_tanh")
    assert table.write(cfg) == {
        "model_type": "toy",
        "architectures": ["ToyForCausalLM"],
        "hidden_size": 32,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "layer_norm_eps": 1e-5,
        "hidden_act": "gelu_new",
    }
    wide = ModelConfig(vocab_size=16, context_length=8, d_model=32, n_heads=4, head_dim=16, d_ff=128)
    with pytest.raises(UnsupportedError, match="activation='swiglu' cannot be exported"):
        table.write(wide)  # the table's MLP is plain
    assert table.write(ModelConfig(**{**wide.to_dict(), "activation": "relu"}))["head_dim"] == 16
    with pytest.raises(UnsupportedError, match="hidden_act"):
        table.read({"hidden_act": "tanh"})
