"""docs/switches.md is generated from the config dataclasses (lmlab/switches.py) and current; the values it
lists for a field are the ones validation accepts."""

from pathlib import Path

import pytest

from lmlab import switches
from lmlab.config import ConfigError, ModelConfig
from lmlab.train import TrainConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "switches.md"


def test_page_is_current():
    assert PAGE.read_text() == switches.markdown(), "regenerate: python -m lmlab.switches > docs/switches.md"


def test_every_field_is_listed_once_with_its_default():
    import dataclasses

    text = PAGE.read_text()
    for cls in (ModelConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            assert text.count(f"| `{f.name}` |") == 1, f.name
    row = next(r for r in switches.rows(ModelConfig) if r["name"] == "n_kv_heads")
    assert row["default"] is None and "GQA" in row["doc"] and row["type"] == "int or None"
    row = next(r for r in switches.rows(TrainConfig) if r["name"] == "diag_interval")  # a two-line comment
    assert row["doc"].endswith("per-layer gradient norms (0 = off)")
    row = next(r for r in switches.rows(TrainConfig) if r["name"] == "compile_scope")  # a block above it
    assert row["doc"].startswith("what compile compiles")


@pytest.mark.parametrize("field", sorted(switches.CHOICES))
def test_listed_values_are_what_validation_accepts(field):
    """A bad value is refused with a message naming every listed value."""
    with pytest.raises(ConfigError) as err:
        ModelConfig(**{field: "no-such-value"})
    row = next(r for r in switches.rows(ModelConfig) if r["name"] == field)
    for value in row["values"].split(", "):
        assert value.strip("`") in str(err.value), (field, value, str(err.value))
