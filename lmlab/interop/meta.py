"""Meta's original Llama checkpoint layout (``params.json`` + ``consolidated.NN.pth``), as released for
Llama 2 and Llama 3 / 3.1 (github.com/meta-llama/llama ``model.py``, meta-llama/llama-models), read
into the Hugging Face Llama form that :mod:`lmlab.interop.hf` imports.

- ``params.json``: ``dim``, ``n_layers``, ``n_heads``, ``n_kv_heads`` (default ``n_heads``),
  ``vocab_size`` (-1 in Llama 2: taken from the weights), ``multiple_of`` and ``ffn_dim_multiplier``
  (the FFN width: 2/3 of 4 x dim, times the multiplier, rounded up to a multiple of ``multiple_of``;
  checked against the weights), ``norm_eps``, ``rope_theta`` (default 10,000), ``use_scaled_rope``
  (Llama 3.1's frequency scaling: factor 8, low / high frequency factors 1 / 4, original context 8,192,
  unless ``rope_scaling_factor`` etc. say otherwise). Any other key is refused, naming it.
- Weights: ``tok_embeddings``, ``layers.N.attention.{wq,wk,wv,wo}``, ``layers.N.feed_forward.{w1,w2,w3}``
  (gate, down, up), ``layers.N.{attention_norm,ffn_norm}``, ``norm``, ``output``; several
  ``consolidated.NN.pth`` are model-parallel shards, joined along the dimension each was split on
  (column-parallel wq/wk/wv/w1/w3/output on rows, row-parallel wo/w2 on columns, the embedding on
  columns in Llama 2 and rows in Llama 3; norms replicated). Files are read with
  ``torch.load(weights_only=True)``: tensors only, never arbitrary pickled objects.
- RoPE: Meta rotates adjacent pairs (x0, x1), (x2, x3), ... as complex numbers; Hugging Face (and an
  lmlab ``rope_style='half'`` model) rotates (x_i, x_{i + d/2}). The rows of wq and wk are permuted
  per head so the half rotation computes exactly the same attention (the permutation transformers'
  conversion script applies); no value is changed.
- The context length is not in ``params.json`` (a runtime setting of Meta's code): ``max_seq_len``
  when present, else 131,072 with ``use_scaled_rope``, 8,192 for ``rope_theta`` 500,000 (Llama 3),
  4,096 otherwise (Llama 2), said in a note. ``tokenizer.model`` (SentencePiece / tiktoken) is not read.
"""

from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path

import torch

PARAM_KEYS = {
    "dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "vocab_size",
    "multiple_of",
    "ffn_dim_multiplier",
    "norm_eps",
    "rope_theta",
    "use_scaled_rope",
    "rope_scaling_factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "max_seq_len",
    "max_batch_size",
}
SHARD = re.compile(r"consolidated\.(\d+)\.pth$")


class MetaFormatError(ValueError):
    """A Meta checkpoint folder that is incomplete, unreadable or not the Llama layout."""


def is_meta_folder(path: str | Path) -> bool:
    """True when ``path`` holds ``params.json`` and at least one ``consolidated.NN.pth``."""
    path = Path(path)
    return (path / "params.json").is_file() and any(SHARD.search(p.name) for p in path.iterdir())


def _shards(path: Path) -> list[Path]:
    found = sorted((int(m.group(1)), p) for p in path.iterdir() if (m := SHARD.search(p.name)))
    if [i for i, _ in found] != list(range(len(found))):
        raise MetaFormatError(
            f"{str(path)!r}: shards {[p.name for _, p in found]} are not consolidated.00 .. "
            f"consolidated.{len(found) - 1:02d}; a shard is missing"
        )
    return [p for _, p in found]


def _load(file: Path) -> dict:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as exc:
        raise MetaFormatError(f"{str(file)!r} could not be read as a weights-only checkpoint: {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise MetaFormatError(f"{str(file)!r} is not a mapping of names to tensors")
    return state


def _join(name: str, parts: list[torch.Tensor], dim_model: int) -> torch.Tensor:
    """One tensor from its model-parallel pieces (see the module docstring)."""
    if len(parts) == 1:
        return parts[0]
    if parts[0].ndim == 1:  # norms: replicated
        return parts[0]
    if name == "tok_embeddings.weight":  # Llama 2: split on the model dim; Llama 3: on the vocabulary
        dim = 1 if parts[0].shape[1] * len(parts) == dim_model else 0
    elif re.search(r"(wo|w2)\.weight$", name):
        dim = 1
    else:
        dim = 0
    return torch.cat(parts, dim=dim)


def ffn_width(dim: int, multiple_of: int, ffn_dim_multiplier) -> int:
    """Meta's FeedForward hidden size: int(2/3 x 4 x dim), times ``ffn_dim_multiplier`` (int), rounded up
    to a multiple of ``multiple_of``. Llama 2 7B: 11,008; Llama 3 8B (x1.3, multiple 1024): 14,336."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def half_rotation_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q or k projection (heads x head_dim, d) reordered per head from Meta's interleaved pairs
    (0, 1), (2, 3), ... to the half layout (i, i + head_dim/2): row 2i goes to i, row 2i + 1 to
    i + head_dim/2."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def read_meta(path: str | Path) -> tuple[dict, dict, list[str]]:
    """(an HF Llama ``config.json`` mapping, its state dict, notes) for Meta checkpoint folder ``path``.
    Raises MetaFormatError naming the file and key for an unknown ``params.json`` key, a missing or
    mis-shaped tensor, or an unreadable shard."""
    path = Path(path)
    try:
        from lmlab.json_checks import check_nesting

        params = json.loads(
            check_nesting((path / "params.json").read_text(), repr(str(path / "params.json")), MetaFormatError)
        )
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MetaFormatError(f"{str(path / 'params.json')!r} could not be read: {exc}") from None
    if not isinstance(params, dict):
        raise MetaFormatError(f"{str(path / 'params.json')!r} is not a JSON object")
    unknown = sorted(set(params) - PARAM_KEYS)
    if unknown:
        raise MetaFormatError(
            f"{str(path / 'params.json')!r}: key(s) {unknown} are not part of the Llama 2 / 3 "
            f"layout lmlab reads ({', '.join(sorted(PARAM_KEYS))}); refused rather than ignored"
        )
    try:
        dim, n_layers, n_heads = int(params["dim"]), int(params["n_layers"]), int(params["n_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise MetaFormatError(
            f"{str(path / 'params.json')!r} lacks a valid {exc}; it needs dim, n_layers, n_heads"
        ) from None
    n_kv = int(params.get("n_kv_heads") or n_heads)
    shard_files = _shards(path)
    pieces = [_load(f) for f in shard_files]
    names = [n for n in pieces[0] if n != "rope.freqs"]  # Llama 2 stores its RoPE frequencies: recomputed
    for f, p in zip(shard_files, pieces):
        if sorted(n for n in p if n != "rope.freqs") != sorted(names):
            raise MetaFormatError(f"{str(f)!r} holds other tensors than {shard_files[0].name}")
    state = {n: _join(n, [p[n] for p in pieces], dim) for n in names}
    if "output.weight" not in state:
        raise MetaFormatError(
            f"{str(shard_files[0])!r} has no tensor 'output.weight' (the LM head); not a complete Llama checkpoint"
        )
    vocab = state["output.weight"].shape[0]
    if params.get("vocab_size", -1) not in (-1, None, vocab):
        raise MetaFormatError(f"params.json vocab_size {params['vocab_size']} but output.weight has {vocab} rows")
    head_dim = dim // n_heads
    d_ff = ffn_width(dim, int(params.get("multiple_of", 256)), params.get("ffn_dim_multiplier"))
    want = {"tok_embeddings.weight": (vocab, dim), "norm.weight": (dim,), "output.weight": (vocab, dim)}
    for i in range(n_layers):
        a, f = f"layers.{i}.attention.", f"layers.{i}.feed_forward."
        want.update(
            {
                a + "wq.weight": (n_heads * head_dim, dim),
                a + "wk.weight": (n_kv * head_dim, dim),
                a + "wv.weight": (n_kv * head_dim, dim),
                a + "wo.weight": (dim, n_heads * head_dim),
                f + "w1.weight": (d_ff, dim),
                f + "w2.weight": (dim, d_ff),
                f + "w3.weight": (d_ff, dim),
                f"layers.{i}.attention_norm.weight": (dim,),
                f"layers.{i}.ffn_norm.weight": (dim,),
            }
        )
    extra = sorted(set(state) - set(want))
    if extra:
        raise MetaFormatError(f"{str(path)!r}: tensor(s) {extra[:4]} are not part of the Llama layout")
    for name, shape in want.items():
        if name not in state:
            raise MetaFormatError(f"{str(path)!r} has no tensor {name!r}")
        if tuple(state[name].shape) != shape:
            raise MetaFormatError(
                f"{str(path)!r}: {name!r} has shape {tuple(state[name].shape)}, the params.json "
                f"layout gives {shape} (d_ff {d_ff} from multiple_of / ffn_dim_multiplier)"
            )
    hf_state = {
        "model.embed_tokens.weight": state["tok_embeddings.weight"],
        "model.norm.weight": state["norm.weight"],
        "lm_head.weight": state["output.weight"],
    }
    for i in range(n_layers):
        a, f, o = f"layers.{i}.attention.", f"layers.{i}.feed_forward.", f"model.layers.{i}."
        hf_state.update(
            {
                o + "self_attn.q_proj.weight": half_rotation_rows(state[a + "wq.weight"], n_heads),
                o + "self_attn.k_proj.weight": half_rotation_rows(state[a + "wk.weight"], n_kv),
                o + "self_attn.v_proj.weight": state[a + "wv.weight"],
                o + "self_attn.o_proj.weight": state[a + "wo.weight"],
                o + "mlp.gate_proj.weight": state[f + "w1.weight"],
                o + "mlp.down_proj.weight": state[f + "w2.weight"],
                o + "mlp.up_proj.weight": state[f + "w3.weight"],
                o + "input_layernorm.weight": state[f"layers.{i}.attention_norm.weight"],
                o + "post_attention_layernorm.weight": state[f"layers.{i}.ffn_norm.weight"],
            }
        )
    theta = float(params.get("rope_theta", 10000.0))
    scaled = bool(params.get("use_scaled_rope", False))
    notes = [
        f"converted from Meta's layout ({len(shard_files)} shard(s)); q/k rows reordered from interleaved "
        f"to half rotation (the same attention)"
    ]
    if "max_seq_len" in params:
        context = int(params["max_seq_len"])
    else:
        context = 131072 if scaled else (8192 if math.isclose(theta, 500000.0) else 4096)
        notes.append(
            f"params.json has no max_seq_len; context_length set to {context:,} (Llama "
            f"{'3.1' if scaled else '3' if context == 8192 else '2'}'s)"
        )
    if (path / "tokenizer.model").is_file():
        notes.append(
            "tokenizer.model (SentencePiece / tiktoken) is not read: the run has no tokenizer; prepare "
            "data with the model's HF tokenizer.json (`lmlab prepare --tokenizer-file`)"
        )
    hf = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": dim,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "intermediate_size": d_ff,
        "vocab_size": vocab,
        "rms_norm_eps": float(params.get("norm_eps", 1e-5)),
        "hidden_act": "silu",
        "max_position_embeddings": context,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_theta": theta,
    }
    if scaled:
        hf["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": float(params.get("rope_scaling_factor", 8.0)),
            "low_freq_factor": float(params.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(params.get("high_freq_factor", 4.0)),
            "original_max_position_embeddings": int(params.get("original_max_position_embeddings", 8192)),
        }
    return hf, hf_state, notes
