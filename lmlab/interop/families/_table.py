"""Weight-name tables: a family converter's state dicts as one list of rows, read in both directions.

A row names one lmlab tensor and the HF tensor (or tensors) it comes from; ``{i}`` in both names stands
for the layer index and expands over ``cfg.n_layers``. :func:`to_lmlab` takes every row's HF tensor(s)
out of a :class:`~lmlab.interop.families._tools.StateReader` (which then fails on anything left over) and
:func:`to_hf` writes them back, so one table serves import and export and the two cannot drift apart.

A row may

- hold only for some configs (``when``: a predicate on the ModelConfig; skipped otherwise, so a tensor the
  checkpoint holds anyway is left over and refused);
- fuse several HF tensors into lmlab's one, concatenated along dim 0 (``hf`` a tuple; ``sizes`` gives the
  rows of each for the split back, e.g. :func:`qkv_sizes`);
- stack per-head HF tensors (``{j}`` in the HF name, ``stack(cfg)`` of them) into one lmlab tensor;
- reshape on the way (``transform``: a :class:`Transform` pair, e.g. :data:`CONV1D` for GPT-2's
  (in, out) Conv1D weights, :data:`PER_HEAD_QKV` for a qkv fused head by head, or a family's own layout);
- live outside the model's module prefix (``prefixed=False``: an LM-head bias beside ``lm_head.weight``).

The output head is not a row: :func:`to_lmlab` checks a tied checkpoint's stored head against the
embedding (``StateReader.tied_head``) and :func:`to_hf` leaves a tied head out, as ``save_pretrained`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from lmlab.config import ModelConfig
from lmlab.interop.families._tools import (
    StateReader,
    check_expressible,
    deinterleave_heads,
    interleave_heads,
    lm_key,
    put,
)
from lmlab.interop.registry import Family, StateDict, register

Predicate = Callable[[ModelConfig], bool]


@dataclass(frozen=True)
class Transform:
    """``to_lmlab(tensor, cfg)`` and its inverse ``to_hf(tensor, cfg)``."""

    to_lmlab: Callable[[torch.Tensor, ModelConfig], torch.Tensor]
    to_hf: Callable[[torch.Tensor, ModelConfig], torch.Tensor]


CONV1D = Transform(lambda w, cfg: w.t(), lambda w, cfg: w.t())  # GPT-2's Conv1D stores (in, out)
# [q_h k_h v_h for each head h] (GPT-NeoX, Falcon MHA) <-> lmlab's [q heads | k heads | v heads]
# fmt: off
PER_HEAD_QKV = Transform(lambda w, cfg: deinterleave_heads(w, cfg.n_heads, cfg.head_dim),
                         lambda w, cfg: interleave_heads(w, cfg.n_heads, cfg.head_dim))
# fmt: on


@dataclass(frozen=True)
class Row:
    """HF name(s) <-> one lmlab name. ``hf``: a name, or a tuple fused along dim 0 into lmlab's tensor
    (then ``sizes(cfg)`` gives each part's rows), or a name with ``{j}`` stacked over ``stack(cfg)``
    indices; ``when``: the configs that have the tensor (None: all); ``transform``: applied after fusing
    on import, before splitting on export; ``prefixed``: the HF name lies under the model's prefix."""

    hf: Union[str, tuple]
    lm: str
    when: Optional[Predicate] = None
    sizes: Optional[Callable[[ModelConfig], list]] = None
    transform: Optional[Transform] = None
    stack: Optional[Callable[[ModelConfig], int]] = None
    prefixed: bool = True


def linear(hf: str, lm: str, bias: Union[bool, Predicate] = False, transform: Optional[Transform] = None) -> list:
    """Rows of a linear layer: ``hf.weight`` <-> ``lm.weight`` and, where ``bias`` holds, the biases."""
    rows = [Row(hf + ".weight", lm + ".weight", transform=transform)]
    if bias:
        rows.append(Row(hf + ".bias", lm + ".bias", when=None if bias is True else bias, transform=transform))
    return rows


def layer_norm(hf: str, lm: str, when: Optional[Predicate] = None) -> list:
    """Rows of a LayerNorm with weight and bias (both present where ``when`` holds)."""
    return [Row(hf + ".weight", lm + ".weight", when=when), Row(hf + ".bias", lm + ".bias", when=when)]


def qkv_sizes(cfg: ModelConfig) -> list:
    """Rows of q, k and v in lmlab's fused [q heads | k heads | v heads]."""
    return [cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim]


def separate_qkv(hf: str, lm: str, bias: Union[bool, Predicate] = False) -> list:
    """Rows of separate HF projections (``hf`` with ``{p}`` for q, k, v) fused into lmlab's ``lm`` qkv."""
    names = lambda part: tuple(hf.replace("{p}", p) + part for p in "qkv")
    rows = [Row(names(".weight"), lm + ".weight", sizes=qkv_sizes)]
    if bias:
        rows.append(Row(names(".bias"), lm + ".bias", when=None if bias is True else bias, sizes=qkv_sizes))
    return rows


def _layers(row: Row, cfg: ModelConfig):
    """(hf names, lm name) of ``row`` for each layer it stands for (one pair when it has no ``{i}``)."""
    names = row.hf if isinstance(row.hf, tuple) else (row.hf,)
    if row.stack is not None:
        names = tuple(n.replace("{j}", str(j)) for n in names for j in range(row.stack(cfg)))
    per_layer = "{i}" in row.lm
    for i in range(cfg.n_layers) if per_layer else [None]:
        sub = (lambda s: s.replace("{i}", str(i))) if per_layer else (lambda s: s)
        yield tuple(sub(n) for n in names), sub(row.lm)


def to_lmlab(r: StateReader, rows: list, cfg: ModelConfig, head: Optional[str] = "lm_head.weight") -> StateDict:
    """lmlab's state dict from the HF tensors ``r`` holds, by ``rows``; then the output head from HF
    ``head`` (checked against the embedding when tied; None: no head row). Raises UnsupportedError (through
    ``r``) for a missing tensor, one left over, or a result that does not fit ``cfg``'s model."""
    out: StateDict = {}
    for row in rows:
        if row.when is not None and not row.when(cfg):
            continue
        for hf_names, lm_name in _layers(row, cfg):
            parts = [r.take(n) for n in hf_names]
            w = torch.stack(parts) if row.stack else torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
            put(out, lm_name, row.transform.to_lmlab(w, cfg) if row.transform else w)
    if head is not None:
        if cfg.tie_embeddings:
            r.tied_head(head, out["embed.weight"])
        else:
            put(out, "lm_head.weight", r.take(head))
    return r.finish(out, cfg)


def to_hf(
    state: StateDict, rows: list, cfg: ModelConfig, prefix: str = "", head: Optional[str] = "lm_head.weight"
) -> StateDict:
    """The HF state dict of lmlab's ``state`` by ``rows``, each HF name under ``prefix`` (the module
    prefix :class:`StateReader` strips on import), and the untied head as ``head`` (no prefix).
    Raises UnsupportedError naming an lmlab tensor the config implies but ``state`` lacks."""
    out: StateDict = {}
    for row in rows:
        if row.when is not None and not row.when(cfg):
            continue
        for hf_names, lm_name in _layers(row, cfg):
            w = lm_key(state, lm_name)
            w = row.transform.to_hf(w, cfg) if row.transform else w
            parts = w.unbind(0) if row.stack else w.split(row.sizes(cfg), dim=0) if len(hf_names) > 1 else (w,)
            for name, part in zip(hf_names, parts, strict=True):
                put(out, (prefix if row.prefixed else "") + name, part)
    if head is not None and not cfg.tie_embeddings:
        put(out, head, lm_key(state, "lm_head.weight"))
    return out


def converters(
    family: str,
    rows: list,
    prefix: str,
    read_prefixes: Optional[tuple] = None,
    ignore: tuple = (),
    head: str = "lm_head.weight",
    head_aliases: tuple = (),
) -> tuple:
    """``(state_to_lmlab, state_to_hf)`` of a family whose state dicts are ``rows``: HF names under
    ``prefix`` (on import any of ``read_prefixes``, default ``(prefix,)``, is stripped; names matching an
    ``ignore`` regex, e.g. causal-mask buffers, are dropped); the untied head is written as ``head`` and
    read from ``head`` or the first of ``head_aliases`` the checkpoint holds."""
    read_prefixes = (prefix,) if read_prefixes is None else read_prefixes

    def state_to_lmlab(hf_state: StateDict, cfg: ModelConfig, hf: dict) -> StateDict:
        r = StateReader(family, hf_state, prefixes=read_prefixes, ignore=ignore)
        return to_lmlab(r, rows, cfg, head=next((h for h in head_aliases if r.has(h) and not r.has(head)), head))

    def state_to_hf(state: StateDict, cfg: ModelConfig) -> StateDict:
        return to_hf(state, rows, cfg, prefix=prefix, head=head)

    return state_to_lmlab, state_to_hf


def register_family(
    name: str, hf_class: str, config_to_lmlab: Callable, config_to_hf: Callable, state: tuple, notes: str, **extra
) -> Family:
    """Register a hand-written family: its config converters (each export checked by reading it back,
    :func:`~lmlab.interop.families._tools.check_expressible`, which raises UnsupportedError for a config the
    family cannot represent exactly) and its state-dict converters ``state``, ``(state_to_lmlab, state_to_hf)``
    (e.g. :func:`converters` of its rows);
    ``extra``: further :class:`~lmlab.interop.registry.Family` fields (e.g. ``unread_notes``)."""

    def checked_to_hf(cfg: ModelConfig) -> dict:
        return check_expressible(name, cfg, config_to_hf(cfg), config_to_lmlab)

    return register(
        Family(
            model_type=name,
            hf_class=hf_class,
            config_to_lmlab=config_to_lmlab,
            state_to_lmlab=state[0],
            config_to_hf=checked_to_hf,
            state_to_hf=state[1],
            notes=notes,
            **extra,
        )
    )
