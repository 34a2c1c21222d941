"""Model-family presets (lmlab/presets.yaml, read by lmlab/presets.py): the real configs are the published
shapes (parameter counts on the meta device within 1% of the published counts), the tiny configs keep that
shape, and every tiny preset learns: 30 AdamW steps on real text lower its loss.

The text is the Shakespeare corpus beside the project (../shared/data/shakespeare, or
$LMLAB_CORPUS_DIR) read as raw UTF-8 bytes (vocabulary 256, no tokenizer).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from lmlab.config import ConfigError, ModelConfig
from lmlab.model import TransformerLM, lm_loss
from lmlab.presets import PRESETS, TABLE, format_presets, get_preset, load_presets, preset_config, real_param_count

NAMES = list(PRESETS)
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------------


def test_every_family_of_the_lecture_has_a_preset():
    families = {p.family for p in PRESETS.values()}
    for family in (
        "Original Transformer",
        "GPT-2",
        "GPT-3",
        "GPT-J",
        "GPT-NeoX / Pythia",
        "OPT",
        "T5 (relative position bias)",
        "PaLM",
        "LLaMA",
        "Llama 2",
        "Llama 3",
        "Llama 4",
        "Mistral",
        "Qwen2",
        "Qwen3",
        "Gemma",
        "Gemma 2",
        "Gemma 3",
        "OLMo",
        "OLMo 2",
        "Nemotron-4",
        "Cohere Command R7B",
        "Phi-2",
        "SmolLM3",
        "InternLM2",
        "Marin",
        "T5 v1.1",
    ):
        assert family in families


@pytest.mark.parametrize("name", NAMES)
def test_preset_record_is_complete(name):
    p = PRESETS[name]
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9.]+)*", p.name), "names are lowercase-hyphen"
    assert "https://" in p.source, "every preset cites a URL"
    assert p.summary and "\n" not in p.summary
    assert set(p.tiny) <= set(ModelConfig.__dataclass_fields__)


_RECORD = """presets:
  - name: toy
    family: Toy
    source: https://example.org
    summary: a toy
    real: {vocab_size: 100, context_length: 64, d_model: 64, n_layers: 2, n_heads: 8, n_kv_heads: 2, d_ff: 128}
    tiny: {n_heads: 4}
"""


def test_load_presets_reads_the_table_and_derives_tiny(tmp_path):
    path = tmp_path / "presets.yaml"
    path.write_text(_RECORD)
    toy = load_presets(path)["toy"]
    assert toy.real["n_heads"] == 8 and toy.published_params is None and toy.notes == ""
    # tiny keeps the GQA ratio 4 (8:2 -> 4:1) and d_ff / d_model = 2 at the default d_model 128
    assert (toy.tiny["n_heads"], toy.tiny["n_kv_heads"], toy.tiny["d_model"], toy.tiny["d_ff"]) == (4, 1, 128, 256)
    assert load_presets() == PRESETS and TABLE.name == "presets.yaml"


@pytest.mark.parametrize(
    "change, message",
    [
        (("    tiny: {n_heads: 4}", "    tiny: {n_heads: 4}\n    size: 7b"), r"unknown keys \['size'\]"),
        (("    summary: a toy\n", ""), r"missing keys \['summary'\]"),
        (
            ("    tiny: {n_heads: 4}", "    tiny: {n_heads: 4}\n    published_params: 1000"),
            "published_params and params_source go together",
        ),
        (("    tiny: {n_heads: 4}", "    tiny: {n_heads: 3}"), "does not keep the GQA ratio 4"),
        (
            ("    tiny: {n_heads: 4}", "    tiny: {heads: 4}"),
            r"tiny: unknown ModelConfig key 'heads'; did you mean 'n_heads'\?",
        ),
        (("d_ff: 128}", "d_ff: 128, norm: rms}"), r"real: unknown ModelConfig key 'norm'"),
        (("d_ff: 128}", "d_ff: 128, norm_type: rms}"), r"presets\[0\] \('toy'\): norm_type"),
        # a tiny value ModelConfig refuses is caught when the table loads, not when the preset trains
        (("    tiny: {n_heads: 4}", "    tiny: {n_heads: 4, norm_type: foo}"), r"\('toy'\) tiny: norm_type='foo'"),
        (("    tiny: {n_heads: 4}", "    tiny: {n_heads: 4, d_model: abc}"), r"tiny: d_model='abc' must be an integer"),
        (("    tiny: {n_heads: 4}", "    tiny: {n_heads: 4, n_layers: -1}"), r"tiny: n_layers=-1 must be an integer"),
        (("  - name: toy", "  - name: 42"), r"presets\[0\] \(42\): name must be a lowercase-hyphen string"),
    ],
)
def test_load_presets_refuses_a_bad_record_naming_file_and_record(tmp_path, change, message):
    path = tmp_path / "presets.yaml"
    path.write_text(_RECORD.replace(*change))
    with pytest.raises(ConfigError, match=message) as err:
        load_presets(path)
    assert f"{path}: presets[0] (" in str(err.value)  # the file and the record


@pytest.mark.parametrize(
    "text, message",
    [
        ("presets:\n  - name: [toy\n", "not valid YAML"),
        ("", "expected a mapping with a 'presets' list of records, got NoneType"),
        (_RECORD.replace("presets:", "presetz:"), "expected a mapping with a 'presets' list"),
        ("presets:\n  - toy\n", r"presets\[0\] is a str, not a mapping of keys"),
    ],
)
def test_load_presets_refuses_a_file_that_is_not_a_table(tmp_path, text, message):
    path = tmp_path / "presets.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_presets(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_load_presets_refuses_a_name_given_twice(tmp_path):
    path = tmp_path / "presets.yaml"
    path.write_text(_RECORD + _RECORD.split("presets:\n", 1)[1])
    with pytest.raises(ConfigError, match=r"presets\[1\] \('toy'\): the name 'toy' appears twice"):
        load_presets(path)


def test_get_preset_unknown_name_lists_valid_names_and_nearest():
    with pytest.raises(ConfigError) as err:
        get_preset("lama-2-7b")
    message = str(err.value)
    assert "did you mean 'llama-2-7b'?" in message
    assert all(name in message for name in NAMES)
    assert get_preset("Gemma_2_9B").name == "gemma-2-9b"  # case and underscores forgiven


def test_preset_config_scales_and_overrides():
    tiny, real = preset_config("llama-3-8b"), preset_config("llama-3-8b", scale="real")
    assert (real.d_model, real.n_layers, real.d_ff, real.vocab_size) == (4096, 32, 14336, 128256)
    assert tiny.d_model == 128 and tiny.context_length == 256
    assert preset_config("llama-3-8b", vocab_size=256, n_layers=4).vocab_size == 256
    with pytest.raises(ConfigError, match="did you mean 'd_model'"):
        preset_config("llama-3-8b", d_modle=64)
    with pytest.raises(ConfigError, match="scale"):
        preset_config("llama-3-8b", scale="huge")
    assert get_preset("phi-2").config("real").rope_fraction == 0.4


def test_format_presets_has_a_line_per_preset():
    lines = format_presets().splitlines()
    assert len(lines) == len(PRESETS)
    for line, p in zip(lines, PRESETS.values()):
        assert line.startswith(p.name) and p.family in line and p.params_label in line and p.summary in line
    assert "124M" in lines[NAMES.index("gpt2-124m")]


# ------------------------------------------------------------------------------------------------
# Real scale: builds on the meta device, parameter count as published
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_real_config_builds_on_meta_with_published_count(name):
    cfg = preset_config(name, "real")
    with torch.device("meta"):
        model = TransformerLM(cfg)
    assert all(p.is_meta for p in model.parameters()), "real scale must not allocate memory"
    n = model.num_params()
    assert n == real_param_count(name)
    published = PRESETS[name].published_params
    if published is not None:
        assert abs(n / published - 1) < 0.005, f"{name}: {n:,} parameters vs published {published:,.0f}"


def test_real_configs_spot_checks():
    """Values that are easy to get wrong, from the cited config.json files and papers."""
    g2 = preset_config("gemma-2-9b", "real")
    assert g2.layer_window(0) == 4096 and g2.layer_window(1) is None  # even layers local (HF is_sliding)
    g3 = preset_config("gemma-3-12b", "real")
    assert [g3.layer_window(i) for i in range(6)] == [1024] * 5 + [None]
    scout = preset_config("llama-4-scout", "real")
    assert [scout.layer_is_local(i) for i in range(4)] == [True, True, True, False]  # every 4th layer NoPE
    gpt3 = preset_config("gpt3-175b", "real")
    assert gpt3.n_heads * gpt3.head_dim == gpt3.d_model == 12288 and gpt3.d_ff == 4 * 12288
    palm = preset_config("palm-540b", "real")
    assert (palm.n_kv_heads, palm.head_dim, palm.z_loss, palm.tie_embeddings) == (1, 256, 1e-4, True)
    neox = preset_config("gpt-neox-20b", "real")
    assert int(neox.head_dim * neox.rope_fraction) == 24  # 25% of head_dim 96
    assert preset_config("gpt-j-6b", "real").head_dim * 0.25 == 64  # rotary_dim 64
    from lmlab.param_counts import param_counts

    n340 = param_counts(preset_config("nemotron-4-340b", "real"))  # the report: 9.4B embedding + 331.6B
    embedding = n340["embedding"] + n340["head"]
    assert abs(embedding / 9.4e9 - 1) < 0.005 and abs(n340["layers"] / 331.6e9 - 1) < 0.005
    smol = preset_config("smollm3-3b", "real")  # HF no_rope_layers: 0 at every 4th layer (3, 7, ..., 35)
    assert [i for i in range(smol.n_layers) if not smol.layer_has_rope(i)] == list(range(3, 36, 4))
    marin, llama3 = preset_config("marin-8b", "real"), preset_config("llama-3-8b", "real")
    assert real_param_count("marin-8b") == real_param_count("llama-3-8b") == 8_030_261_248
    assert marin.context_length == 4096 and llama3.context_length == 8192
    olmo3 = preset_config("olmo-3-7b", "real")  # HF's default layer_types: full where (i + 1) % 4 == 0
    assert [i for i in range(olmo3.n_layers) if olmo3.layer_window(i) is None] == list(range(3, 32, 4))
    assert olmo3.layer_window(0) == 4096 and real_param_count("olmo-3-7b") == 7_298_011_136  # HF Olmo3, meta
    t5 = preset_config("t5-v1.1-base-decoder", "real")
    assert (t5.activation, t5.tie_embeddings, t5.d_ff, t5.resid_dropout) == ("geglu", False, 2048, 0.0)


# ------------------------------------------------------------------------------------------------
# Tiny scale: same shape, CPU sized
# ------------------------------------------------------------------------------------------------

_SAME = (
    "norm_type",
    "norm_position",
    "norm_bias",
    "final_norm",
    "bias",
    "lm_head_bias",
    "activation",
    "parallel_block",
    "parallel_shared_norm",
    "position",
    "rope_style",
    "rope_fraction",
    "rope_theta",
    "rope_local_theta",
    "nope_global_layers",
    "qk_norm",
    "attn_logit_softcap",
    "layer_pattern",
    "tie_embeddings",
    "scale_embeddings",
    "final_logit_softcap",
    "z_loss",
    "t5_num_buckets",
    "t5_max_distance",
    "norm_eps",
    "v_norm",
    "layer_scalar",
    "global_k_eq_v",
    "kv_shared_wide_ffn",
)


@pytest.mark.parametrize("name", NAMES)
def test_tiny_keeps_the_shape(name):
    real, tiny = preset_config(name, "real"), preset_config(name, "tiny")
    for f in _SAME:
        assert getattr(tiny, f) == getattr(real, f), f
    # KV sharing (Gemma 4 E2B/E4B) needs a whole layer pattern before the shared layers: up to 12 layers
    assert 128 <= tiny.d_model <= 256 and 2 <= tiny.n_layers <= (12 if real.kv_shared_layers else 6)
    assert tiny.context_length == 256
    for f in ("kv_shared_layers", "ple_dim", "global_head_dim", "global_n_kv_heads", "global_rope_proportion"):
        assert bool(getattr(tiny, f)) == bool(getattr(real, f)), f  # a Gemma 4 switch kept on (or off)
    assert tiny.n_heads // tiny.n_kv_heads == real.n_heads // real.n_kv_heads or real.n_kv_heads == 1 == tiny.n_kv_heads
    assert abs(tiny.d_ff / tiny.d_model - real.d_ff / real.d_model) <= 0.1 * real.d_ff / real.d_model
    if real.sliding_window is not None:
        assert tiny.sliding_window < tiny.context_length, "the window must matter at the tiny context"
    if real.query_pre_attn_scalar == 1.0:  # T5: no 1/sqrt(head_dim) at any size
        assert tiny.query_pre_attn_scalar == 1.0
    elif real.query_pre_attn_scalar is not None:  # Gemma: a multiple of head_dim
        assert tiny.query_pre_attn_scalar / tiny.head_dim == real.query_pre_attn_scalar / real.head_dim


# ------------------------------------------------------------------------------------------------
# Tiny scale trains: 30 AdamW steps on real text lower the loss
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def byte_tokens(shakespeare) -> torch.Tensor:
    folder = shakespeare  # conftest: LMLAB_CORPUS_DIR, the shared mirror, or the downloaded cache
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if not files:
        pytest.skip(f"Shakespeare corpus not found at {folder} (set LMLAB_CORPUS_DIR): no text to train on")
    data = b"".join(f.read_bytes()[20_000:60_000] for f in files[:4])  # skip the Gutenberg headers
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def _batch(tokens: torch.Tensor, gen: torch.Generator, batch: int = 4, context: int = 64):
    starts = torch.randint(0, len(tokens) - context - 1, (batch,), generator=gen)
    chunk = torch.stack([tokens[s : s + context + 1] for s in starts.tolist()])
    return chunk[:, :-1], chunk[:, 1:]


@pytest.fixture
def one_thread():
    """Tiny models step faster on one thread than on two contended ones (conftest allows two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", NAMES)
def test_tiny_preset_learns(name, byte_tokens, one_thread):
    torch.manual_seed(0)
    cfg = preset_config(name, vocab_size=256)
    model = TransformerLM(cfg)
    held_out = _batch(byte_tokens, torch.Generator().manual_seed(1), batch=8)

    def eval_ce() -> float:
        model.eval()
        with torch.no_grad():
            return float(lm_loss(model(held_out[0]), held_out[1])[1])

    before = eval_ce()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(2)
    model.train()
    for _ in range(30):
        x, y = _batch(byte_tokens, gen)
        loss, _ = lm_loss(model(x), y, z_loss=cfg.z_loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    after = eval_ce()
    assert after < before - 1.5, f"{name}: held-out loss {before:.3f} -> {after:.3f} nats"
