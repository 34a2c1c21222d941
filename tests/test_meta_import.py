"""Meta's original Llama layout (params.json + consolidated.NN.pth) imports as the model Meta's
reference code computes: a small random checkpoint, written as Meta's code stores it (interleaved
RoPE pairs, one or two model-parallel shards), scored by a forward pass written here the way
meta-llama/llama's model.py does it (complex-number rotation), equals the imported run's logits; the
run then exports to Hugging Face Llama with the same logits."""

import json
import math

import pytest
import torch

from lmlab.cli import main
from lmlab.interop import hf as hfio
from lmlab.interop.meta import MetaFormatError, ffn_width, read_meta

PARAMS = {
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "vocab_size": -1,
    "multiple_of": 32,
    "ffn_dim_multiplier": 1.3,
    "norm_eps": 1e-5,
    "rope_theta": 500000.0,
}
V = 96


def meta_state(params: dict, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    dim, hd = params["dim"], params["dim"] // params["n_heads"]
    kv = params.get("n_kv_heads") or params["n_heads"]
    f = ffn_width(dim, params["multiple_of"], params.get("ffn_dim_multiplier"))
    r = lambda *s: 0.1 * torch.randn(*s, generator=g)  # noqa: E731
    state = {"tok_embeddings.weight": r(V, dim), "norm.weight": 1 + r(dim), "output.weight": r(V, dim)}
    for i in range(params["n_layers"]):
        a, m = f"layers.{i}.attention.", f"layers.{i}.feed_forward."
        state.update(
            {
                a + "wq.weight": r(params["n_heads"] * hd, dim),
                a + "wk.weight": r(kv * hd, dim),
                a + "wv.weight": r(kv * hd, dim),
                a + "wo.weight": r(dim, params["n_heads"] * hd),
                m + "w1.weight": r(f, dim),
                m + "w2.weight": r(dim, f),
                m + "w3.weight": r(f, dim),
                f"layers.{i}.attention_norm.weight": 1 + r(dim),
                f"layers.{i}.ffn_norm.weight": 1 + r(dim),
            }
        )
    return state


def write_meta(folder, params, state, shards: int = 1, embed_dim: int = 1):
    """Meta's files; with ``shards`` > 1 each tensor split as its model-parallel layer is (the embedding
    on ``embed_dim``: 1 in Llama 2, 0 in Llama 3)."""
    folder.mkdir()
    (folder / "params.json").write_text(json.dumps(params))
    for k in range(shards):
        part = {}
        for name, t in state.items():
            if t.ndim == 1 or shards == 1:
                part[name] = t.clone()
                continue
            dim = (
                embed_dim
                if name == "tok_embeddings.weight"
                else (1 if name.endswith(("wo.weight", "w2.weight")) else 0)
            )
            part[name] = t.chunk(shards, dim=dim)[k].clone()
        if shards > 1 and k == 0:
            part["rope.freqs"] = torch.zeros(8)  # Llama 2 stores its frequencies; recomputed, not read
        torch.save(part, folder / f"consolidated.{k:02d}.pth")


def meta_forward(params: dict, state: dict, tokens: torch.Tensor) -> torch.Tensor:
    """Logits as meta-llama/llama's model.py computes them: RMSNorm, attention with RoPE applied to
    adjacent pairs as complex numbers, KV heads repeated, SwiGLU w2(silu(w1 x) * w3 x)."""
    dim, H = params["dim"], params["n_heads"]
    KV, hd, eps = params.get("n_kv_heads") or H, dim // H, params["norm_eps"]
    B, T = tokens.shape
    freqs = 1.0 / (params.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2)[: hd // 2].double() / hd))
    cis = torch.polar(torch.ones(T, hd // 2, dtype=torch.float64), torch.outer(torch.arange(T).double(), freqs))

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x):  # (B, T, heads, hd)
        xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * cis[None, :, None, :]).flatten(3).float()

    h = state["tok_embeddings.weight"][tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(params["n_layers"]):
        a, m = f"layers.{i}.attention.", f"layers.{i}.feed_forward."
        x = norm(h, state[f"layers.{i}.attention_norm.weight"])
        q = rope((x @ state[a + "wq.weight"].T).view(B, T, H, hd))
        k = rope((x @ state[a + "wk.weight"].T).view(B, T, KV, hd))
        v = (x @ state[a + "wv.weight"].T).view(B, T, KV, hd)
        k, v = (t.repeat_interleave(H // KV, dim=2) for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, -1)
        h = h + (att @ v).transpose(1, 2).reshape(B, T, dim) @ state[a + "wo.weight"].T
        x = norm(h, state[f"layers.{i}.ffn_norm.weight"])
        gate = torch.nn.functional.silu(x @ state[m + "w1.weight"].T)
        h = h + (gate * (x @ state[m + "w3.weight"].T)) @ state[m + "w2.weight"].T
    return norm(h, state["norm.weight"]) @ state["output.weight"].T


def test_ffn_width_matches_the_released_models():
    assert ffn_width(4096, 256, None) == 11008  # Llama 2 7B
    assert ffn_width(4096, 1024, 1.3) == 14336  # Llama 3 8B
    assert ffn_width(8192, 4096, 1.3) == 28672  # Llama 2 70B / Llama 3 70B


@pytest.mark.parametrize("shards, embed_dim", [(1, 1), (2, 1), (2, 0)])
def test_meta_checkpoint_imports_as_meta_computes_it(tmp_path, capsys, shards, embed_dim):
    state = meta_state(PARAMS)
    write_meta(tmp_path / "meta", PARAMS, state, shards, embed_dim)
    assert main(["import", str(tmp_path / "meta"), "--out", str(tmp_path / "run"), "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "converted from Meta's layout" in out and "context_length set to 8,192" in out
    model, cfg, _, _ = hfio.load_run_model(tmp_path / "run")
    # d_ff: int(int(2 * 4 * 64 / 3) * 1.3) = 221, rounded up to a multiple of 32
    assert (cfg.d_ff, cfg.n_kv_heads, cfg.rope_style, cfg.context_length) == (224, 2, "half", 8192)
    x = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(1))
    want = meta_forward(PARAMS, state, x)
    with torch.no_grad():
        got = model(x)
    assert want.abs().max() > 0.3 and float((got - want).abs().max()) < 1e-5
    transformers = pytest.importorskip("transformers")
    hfio.export_hf(tmp_path / "run", tmp_path / "hf")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    with torch.no_grad():
        assert float((ref(input_ids=x).logits - want).abs().max()) < 1e-5


def test_llama_3_1_scaled_rope_and_refusals(tmp_path):
    params = dict(PARAMS, use_scaled_rope=True)
    write_meta(tmp_path / "m31", params, meta_state(params))
    hf, _, notes = read_meta(tmp_path / "m31")
    assert hf["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert hf["max_position_embeddings"] == 131072 and any("3.1" in n for n in notes)
    write_meta(tmp_path / "odd", dict(PARAMS, moe_experts=8), meta_state(PARAMS))
    with pytest.raises(MetaFormatError, match=r"key\(s\) \['moe_experts'\] are not part of the Llama"):
        read_meta(tmp_path / "odd")
    wrong = dict(PARAMS, multiple_of=64)  # d_ff 256 by the formula, 224 in the weights
    write_meta(tmp_path / "wrong", wrong, meta_state(PARAMS))
    with pytest.raises(MetaFormatError, match=r"'layers.0.feed_forward.w1.weight' has shape \(224, 64\)"):
        read_meta(tmp_path / "wrong")
    (tmp_path / "pickle").mkdir()
    (tmp_path / "pickle" / "params.json").write_text(json.dumps(PARAMS))
    torch.save({"x": object()}, tmp_path / "pickle" / "consolidated.00.pth")  # not tensors: never unpickled
    with pytest.raises(MetaFormatError, match="weights-only"):
        read_meta(tmp_path / "pickle")


def test_a_shard_without_the_lm_head_is_named(tmp_path):
    state = meta_state(PARAMS)
    del state["output.weight"]
    write_meta(tmp_path / "m", PARAMS, state)
    with pytest.raises(MetaFormatError, match=r"consolidated.00.pth' has no tensor 'output.weight'"):
        read_meta(tmp_path / "m")
