"""Registry of Hugging Face model families lmlab converts to and from.

Each family module in ``lmlab/interop/families/`` defines one or more :class:`Family` records and
calls :func:`register`; :func:`families` imports every module there on first use. A family maps
- an HF ``config.json`` mapping to a :class:`~lmlab.config.ModelConfig` (``config_to_lmlab``), and back
  (``config_to_hf``);
- an HF state dict to lmlab's parameter names and layouts (``state_to_lmlab``), and back
  (``state_to_hf``).
Anything a family cannot represent exactly raises :class:`UnsupportedError` naming the field, its
value and what is supported: lmlab never approximates silently.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lmlab.config import ModelConfig

StateDict = dict[str, torch.Tensor]


class UnsupportedError(ValueError):
    """A model type, config field or value that no supported family represents exactly."""


@dataclass(frozen=True)
class Family:
    model_type: str  # HF config.json "model_type", e.g. "llama"
    hf_class: str  # the transformers class name, e.g. "LlamaForCausalLM"
    config_to_lmlab: Callable[[dict], ModelConfig]  # HF config.json mapping -> ModelConfig
    state_to_lmlab: Callable[[StateDict, ModelConfig, dict], StateDict]  # (hf_state, cfg, hf_config) -> lmlab state
    config_to_hf: Callable[[ModelConfig], dict]  # ModelConfig -> config.json mapping (incl. model_type)
    state_to_hf: Callable[[StateDict, ModelConfig], StateDict]  # lmlab state -> HF state
    notes: str = ""  # what is checked / what cannot match, for the support table of docs/hf-parity.md
    # config.json -> notes on the fields transformers never reads that the import accepted (common.check_unread)
    unread_notes: Optional[Callable[[dict], list]] = None


_FAMILIES: dict[str, Family] = {}
_loaded = False


def register(family: Family) -> Family:
    _FAMILIES[family.model_type] = family
    return family


def families() -> dict[str, Family]:
    """All registered families by model_type (imports every module of lmlab.interop.families)."""
    global _loaded
    if not _loaded:
        from lmlab.interop import families as pkg

        for mod in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{pkg.__name__}.{mod.name}")
        _loaded = True
    return dict(_FAMILIES)


def get_family(model_type: str) -> Family:
    """The family for ``model_type``; UnsupportedError listing the supported ones otherwise."""
    fams = families()
    if model_type not in fams:
        raise UnsupportedError(f"model_type={model_type!r} is not supported; supported: {', '.join(sorted(fams))}")
    return fams[model_type]
