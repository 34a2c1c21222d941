"""Config tables: the ``config.json`` fields a hand-written family converter reads and writes as one table,
read in both directions (the configuration's counterpart of the weight-name tables in ``_table.py``).

A :class:`ConfigTable` maps ModelConfig fields to the family's config.json names and to the defaults of
its transformers config class; :meth:`ConfigTable.read` takes them out of a config.json (a missing or null
field takes the default, as transformers does) and :meth:`ConfigTable.write` puts them back, so import and
export cannot name or cast a field differently. What is not a plain rename (layouts, bias flags, RoPE,
fields a family refuses) stays in the family's own code beside the table.

Names: :data:`STANDARD` (the names of transformers' Llama-era configs) and :data:`GPT2_NAMES` (GPT-2's
``n_embd`` style, with the standard name accepted as an alias); a family overrides single names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

from lmlab.config import ModelConfig
from lmlab.interop.families._tools import hf_act_name, hf_activation, hf_get

Names = Union[str, tuple]  # a config.json name, or names read in order (written under the first)

# fmt: off
STANDARD: dict[str, Names] = {  # ModelConfig field -> config.json name
    "vocab_size": "vocab_size", "context_length": "max_position_embeddings", "d_model": "hidden_size",
    "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim", "d_ff": "intermediate_size", "norm_eps": "layer_norm_eps", "activation": "hidden_act",
    "tie_embeddings": "tie_word_embeddings", "embd_dropout": "embd_pdrop", "attn_dropout": "attention_dropout",
    "resid_dropout": "hidden_dropout", "init_std": "initializer_range",
}
GPT2_NAMES: dict[str, Names] = {  # GPT-2 / GPT-J: the old names first, the standard ones their aliases
    **STANDARD, "context_length": ("n_positions", "max_position_embeddings"), "d_model": ("n_embd", "hidden_size"),
    "n_layers": ("n_layer", "num_hidden_layers"), "n_heads": ("n_head", "num_attention_heads"), "d_ff": "n_inner",
    "norm_eps": "layer_norm_epsilon", "activation": "activation_function", "attn_dropout": "attn_pdrop",
    "resid_dropout": "resid_pdrop",
}
_CASTS: dict[str, Callable] = {"norm_eps": float, "tie_embeddings": bool, "embd_dropout": float,
                               "attn_dropout": float, "resid_dropout": float, "init_std": float}
# fmt: on


@dataclass(frozen=True)
class ConfigTable:
    """``defaults``: ModelConfig field -> the transformers config class's default, in reading order; a
    callable default takes the fields read before it (``lambda v: 4 * v["d_model"]``). ``names``: field ->
    config.json name(s) (only the fields in ``defaults`` are read). ``activation`` is read through
    :func:`hf_activation` (``gated``: the MLP is gated) and written through :func:`hf_act_name`
    (``tanh_name`` spells the tanh GELU). ``optional``: fields written only where they differ from their
    default; ``write_as``: field -> the name written where it is not the first of ``names``; ``hf_class``: the
    transformers model class :meth:`write` names (``architectures``, beside ``model_type``). ``fixed``:
    ModelConfig fields every model of the family has (its norm, biases, positions...), returned by
    :meth:`read` beside the fields read; an export is checked against them by reading it back
    (``check_expressible``)."""

    family: str
    defaults: dict
    hf_class: str = ""
    names: dict = field(default_factory=lambda: dict(STANDARD))
    gated: bool = False
    tanh_name: str = "gelu_new"
    optional: tuple = ()
    write_as: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)

    def _names(self, lm: str) -> tuple:
        names = self.names[lm]
        return names if isinstance(names, tuple) else (names,)

    def keys(self) -> frozenset:
        """Every config.json name the table reads (for ``check_fields``)."""
        return frozenset(n for lm in self.defaults for n in self._names(lm))

    def read(self, hf: dict) -> dict:
        """ModelConfig fields from config.json ``hf`` (``fixed`` first); UnsupportedError for an activation
        the family's MLP does not have."""
        out: dict = dict(self.fixed)
        for lm, default in self.defaults.items():
            names = self._names(lm)
            value = hf_get(hf, *names, default=default(out) if callable(default) else default)
            if lm == "activation":
                value = hf_activation(self.family, names[0], value, gated=self.gated)
            out[lm] = _CASTS.get(lm, lambda x: x)(value)
        return out

    def write(self, cfg: ModelConfig) -> dict:
        """config.json fields for ``cfg`` (``model_type`` and ``architectures`` first); UnsupportedError for an
        activation the family cannot express."""
        out: dict = {"model_type": self.family, "architectures": [self.hf_class]}
        read: dict = {}
        for lm, default in self.defaults.items():
            value = read[lm] = getattr(cfg, lm)
            if lm in self.optional and value == (default(read) if callable(default) else default):
                continue
            if lm == "activation":
                value = hf_act_name(self.family, value, gated=self.gated, tanh_name=self.tanh_name)
            out[self.write_as.get(lm, self._names(lm)[0])] = value
        return out
