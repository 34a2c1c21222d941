"""ModelConfig validation, files and overrides."""

import pytest

from lmlab.config import ConfigError, ModelConfig, apply_overrides, load_mapping


@pytest.mark.parametrize("kw,message", [
    (dict(n_heads=6, n_kv_heads=4, d_model=48), "n_heads=6 is not a multiple of n_kv_heads=4"),
    (dict(d_model=100, n_heads=8), "d_model=100 is not divisible by n_heads=8"),
    (dict(d_model=0), "d_model=0 must be an integer >= 1"),
    (dict(norm_type="batchnorm"), "norm_type='batchnorm' is not valid"),
    (dict(activation="swish"), "activation='swish' is not valid"),
    (dict(sliding_window=0), "sliding_window=0 must be an integer >= 1"),
    (dict(rope_fraction=0.3, d_model=64, n_heads=4), "rope_fraction=0.3 of head_dim=16 rotates 5 dims"),
    (dict(layer_pattern="LLX", n_layers=4, sliding_window=8), "must be a non-empty string of 'L' (local) and 'G'"),
    (dict(layer_pattern="LG"), "has local layers but sliding_window is not set"),
    (dict(attn_dropout=1.0), "attn_dropout=1.0 must be in [0, 1)"),
    (dict(norm_bias=True), "norm_bias=True needs norm_type='layernorm'"),
    (dict(parallel_block=True, norm_position="post"), "parallel_block=True needs norm_position='pre'"),
])
def test_invalid_values_name_the_field(kw, message):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**kw)
    assert message in str(err.value)


def test_derived_fields_and_round_trip(tmp_path):
    cfg = ModelConfig(d_model=256, n_heads=8)
    assert (cfg.n_kv_heads, cfg.head_dim, cfg.d_ff) == (8, 32, 704)  # 8/3*256 = 682.7 -> multiple of 64
    assert ModelConfig(d_model=256, activation="gelu").d_ff == 1024  # non-gated: 4x
    assert ModelConfig(d_model=256, ffn_ratio=2.5).d_ff == 640
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    (tmp_path / "c.yaml").write_text("d_model: 384\nn_heads: 6\n")
    assert ModelConfig.from_dict(load_mapping(tmp_path / "c.yaml")).head_dim == 64


def test_unknown_keys_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="unknown ModelConfig key 'n_head'; did you mean 'n_heads'"):
        ModelConfig.from_dict({"n_head": 4})
    data = apply_overrides({}, ["d_model=384", "rope_theta=5e5", "tie_embeddings=false", "sliding_window=null",
                                "norm_type=layernorm"], ModelConfig)
    assert data == {"d_model": 384, "rope_theta": 5e5, "tie_embeddings": False, "sliding_window": None,
                    "norm_type": "layernorm"}
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["d_model"], ModelConfig)
    (tmp_path / "bad.yaml").write_text("d_model: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_mapping(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_mapping(tmp_path / "missing.yaml")


def test_layer_pattern_repeats_and_may_end_mid_pattern():
    """Gemma 3 1B: 'LLLLLG' over 26 layers; layer i is local unless (i + 1) % 6 == 0 (HF's rule)."""
    cfg = ModelConfig(n_layers=26, sliding_window=8, layer_pattern="LLLLLG")
    assert [cfg.layer_window(i) for i in range(26)] == [None if (i + 1) % 6 == 0 else 8 for i in range(26)]
    assert ModelConfig(n_layers=2, sliding_window=8, layer_pattern="GLL").layer_window(1) == 8
