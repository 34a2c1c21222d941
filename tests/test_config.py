"""ModelConfig validation, files and overrides."""

import pytest

from lmlab.config import ConfigError, ModelConfig
from lmlab.config_files import apply_overrides, load_mapping


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(n_heads=6, n_kv_heads=4, d_model=48), "n_heads=6 is not a multiple of n_kv_heads=4"),
        (dict(d_model=100, n_heads=8), "d_model=100 is not divisible by n_heads=8"),
        (dict(d_model=0), "d_model=0 must be an integer >= 1"),
        (dict(norm_type="batchnorm"), "norm_type='batchnorm' is not valid"),
        (dict(activation="swish"), "activation='swish' is not valid"),
        (dict(sliding_window=0), "sliding_window=0 must be an integer >= 1"),
        (dict(rope_fraction=0.3, d_model=64, n_heads=4), "rope_fraction=0.3 of head_dim=16 rotates 5 dims"),
        (
            dict(layer_pattern="LLX", n_layers=4, sliding_window=8),
            "must be a non-empty string of 'L' (local), 'G' (global) and 'D'",
        ),
        (dict(layer_pattern="LG"), "has local layers but sliding_window is not set"),
        (dict(attn_dropout=1.0), "attn_dropout=1.0 must be in [0, 1)"),
        (dict(norm_bias=True), "norm_bias=True needs norm_type='layernorm'"),
        (dict(parallel_block=True, norm_position="post"), "parallel_block=True needs norm_position='pre'"),
    ],
)
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
    data = apply_overrides(
        {},
        ["d_model=384", "rope_theta=5e5", "tie_embeddings=false", "sliding_window=null", "norm_type=layernorm"],
        ModelConfig,
    )
    assert data == {
        "d_model": 384,
        "rope_theta": 5e5,
        "tie_embeddings": False,
        "sliding_window": None,
        "norm_type": "layernorm",
    }
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["d_model"], ModelConfig)
    # an empty value (an empty shell variable in --set budget_seconds=$B) is refused, not read as null
    with pytest.raises(ConfigError, match=r"'sliding_window= ': no value after '='; .*sliding_window=null"):
        apply_overrides({}, ["sliding_window= "], ModelConfig)
    (tmp_path / "bad.yaml").write_text("d_model: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_mapping(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_mapping(tmp_path / "missing.yaml")


def test_scientific_notation_reads_as_numbers(tmp_path):
    """YAML 1.1 (PyYAML's default) reads 4e-3, 1e5 and 1.5e3 as strings; config files and --set read
    them as the floats YAML 1.2 makes of them, and leave look-alikes as strings."""
    (tmp_path / "t.yaml").write_text(
        "lr: 4e-3\nmuon_lr: 1.5e3\nrope_theta: 1e5\nneg: -2E+2\nplain: 1.0e-05\nname: 4e\nother: e3\ntag: 3e-3x\n"
    )
    data = load_mapping(tmp_path / "t.yaml")
    assert data == {
        "lr": 0.004,
        "muon_lr": 1500.0,
        "rope_theta": 100000.0,
        "neg": -200.0,
        "plain": 1e-05,
        "name": "4e",
        "other": "e3",
        "tag": "3e-3x",
    }
    assert all(type(data[k]) is float for k in ("lr", "muon_lr", "rope_theta", "neg", "plain"))
    assert apply_overrides({}, ["rope_theta=1e6", "d_model=384"], ModelConfig) == {"rope_theta": 1e6, "d_model": 384}
    (tmp_path / "m.yaml").write_text("rope_theta: 5e5\n")
    assert ModelConfig.from_dict(load_mapping(tmp_path / "m.yaml")).rope_theta == 5e5


def test_layer_pattern_repeats_and_may_end_mid_pattern():
    """Gemma 3 1B: 'LLLLLG' over 26 layers; layer i is local unless (i + 1) % 6 == 0 (HF's rule)."""
    cfg = ModelConfig(n_layers=26, sliding_window=8, layer_pattern="LLLLLG")
    assert [cfg.layer_window(i) for i in range(26)] == [None if (i + 1) % 6 == 0 else 8 for i in range(26)]
    assert ModelConfig(n_layers=2, sliding_window=8, layer_pattern="GLL").layer_window(1) == 8
