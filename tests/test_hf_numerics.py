"""Numerics and import details, each checked against an independent reference (Hugging Face
transformers' implementation, or the model built the ordinary way).

- RMSNorm in bf16 rounds as the family's reference does: Llama / Qwen / Meta cast the normalised value
  to the input dtype before the weight, OLMo 2 and Gemma's (1 + w) multiply in fp32 and cast after;
- a TransformerLM built on the meta device, then ``to_empty`` and ``load_state_dict``, is the original
  model (tied head, RoPE / ALiBi / sinusoidal tables), also sharded by FSDP on 2 ranks;
- config.json fields transformers never reads: Gemma 3's attn_logit_softcapping (not applied, as in HF),
  the published legacy keys of Qwen2.5, GPT-J-6B and Command R7B (accepted with a note, logits equal
  HF's; values that would describe another model refused);
- ``--dtype`` on import and export keeps a bf16 checkpoint bf16, bitwise;
- a pytorch_model.bin that needs full unpickling is refused in one line naming the file.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lmlab.config import ModelConfig  # noqa: E402
from lmlab.interop import hf as hfio  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402
from lmlab.model.norms import RMSNorm  # noqa: E402

V = 128
BASE = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _bf16_input(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# 1. RMSNorm rounding order in bf16
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hf_class, kwargs",
    [
        ("transformers.models.llama.modeling_llama.LlamaRMSNorm", dict()),
        ("transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm", dict()),
        ("transformers.models.olmo2.modeling_olmo2.Olmo2RMSNorm", dict(weight_fp32=True)),
        ("transformers.models.gemma.modeling_gemma.GemmaRMSNorm", dict(offset=1.0)),
        ("transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm", dict(offset=1.0)),
    ],
)
def test_rmsnorm_bf16_bitwise_equals_hf(hf_class, kwargs):
    """An lmlab RMSNorm cast to bf16 equals the family's HF norm bitwise on random input, and the other
    rounding order would not (so the comparison can tell the two apart)."""
    import importlib

    module, name = hf_class.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    d, eps = 256, 1e-6
    ours = RMSNorm(d, eps, **kwargs)
    with torch.no_grad():
        ours.weight.copy_(
            torch.randn(d, generator=torch.Generator().manual_seed(1)) * 0.5 + (0.0 if kwargs.get("offset") else 1.0)
        )
    ref = cls(d, eps=eps)
    ref.load_state_dict(ours.state_dict())
    ours, ref = ours.to(torch.bfloat16), ref.to(torch.bfloat16)
    x = _bf16_input((8, 64, d))
    with torch.no_grad():
        y, y_ref = ours(x), ref(x)
        assert y.dtype == y_ref.dtype == torch.bfloat16
        assert torch.equal(y, y_ref)
        if not kwargs.get("offset"):  # the other order differs in many places (one bf16 ulp)
            other = RMSNorm(d, eps, weight_fp32=not kwargs.get("weight_fp32", False)).to(torch.bfloat16)
            other.load_state_dict(ours.state_dict())
            assert (other(x) != y_ref).sum() > 1000


def test_rmsnorm_fp32_orders_agree():
    """In fp32 the two orders are the same computation (bitwise), so fp32 parity is unchanged."""
    x = torch.randn(4, 16, 64)
    a, b = RMSNorm(64), RMSNorm(64, weight_fp32=True)
    with torch.no_grad():
        a.weight.normal_()
        b.weight.copy_(a.weight)
        assert torch.equal(a(x), b(x))


def test_bf16_lean_decode_uses_the_same_norm_order():
    """The one-token decode path (Block.decode_one, which calls the norms' forward directly) gives the
    ordinary path's logits bitwise in bf16, with non-trivial norm weights."""
    from lmlab.model import KVCache

    cfg = ModelConfig(vocab_size=V, context_length=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2)
    model = TransformerLM(cfg).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.add_(torch.randn_like(module.weight) * 0.5)
    model = model.to(torch.bfloat16)
    assert model.lean_decode_possible()
    idx = torch.randint(0, V, (2, 10))
    out = []
    for lean in (False, True):
        model.lean_decode = lean
        cache = KVCache(cfg, 2, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            model(idx[:, :9], cache)
            out.append(model(idx[:, 9:], cache))
    assert torch.equal(out[0], out[1])


# lmlab module -> HF module of the same norm, per family (the families whose HF norm classes differ)
NORM_PAIRS = {
    "llama": (
        "LlamaConfig",
        {},
        [("blocks.0.attn_norm", "model.layers.0.input_layernorm"), ("final_norm", "model.norm")],
    ),
    "qwen3": (
        "Qwen3Config",
        dict(head_dim=32),
        [
            ("blocks.1.mlp_norm", "model.layers.1.post_attention_layernorm"),
            ("blocks.0.attn.q_norm", "model.layers.0.self_attn.q_norm"),
        ],
    ),
    "olmo2": (
        "Olmo2Config",
        {},
        [
            ("blocks.0.attn_norm", "model.layers.0.post_attention_layernorm"),
            ("blocks.0.attn.k_norm", "model.layers.0.self_attn.k_norm"),
            ("final_norm", "model.norm"),
        ],
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        dict(head_dim=16),
        [
            ("blocks.0.attn_out_norm", "model.layers.0.post_attention_layernorm"),
            ("blocks.0.attn.q_norm", "model.layers.0.self_attn.q_norm"),
            ("final_norm", "model.norm"),
        ],
    ),
}


@pytest.mark.parametrize("family", list(NORM_PAIRS))
def test_imported_model_in_bf16_norms_equal_hf(tmp_path, family):
    """A random HF model of the family (norm weights randomised), imported and cast to bf16 with its HF
    original: each of its RMSNorms (block, final, QK) gives bitwise the HF module's output."""
    cls, extra, pairs = NORM_PAIRS[family]
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**BASE, **extra))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.5)
    ref.save_pretrained(tmp_path / "hf")
    model, cfg, _, _ = hfio.hf_to_lmlab(tmp_path / "hf")
    assert cfg.norm_weight_fp32 is (family == "olmo2")
    model, ref = model.to(torch.bfloat16), ref.to(torch.bfloat16)
    ours, theirs = dict(model.named_modules()), dict(ref.named_modules())
    for a, b in pairs:
        width = theirs[b].weight.shape[-1]
        x = _bf16_input((2, 8, width), seed=len(a))
        with torch.no_grad():
            assert torch.equal(ours[a](x), theirs[b](x)), (family, a)


# ------------------------------------------------------------------------------------------------
# 2. Meta-device construction, then to_empty and load_state_dict
# ------------------------------------------------------------------------------------------------

META_CASES = {
    "rope_tied": dict(position="rope"),
    "rope_scaled_untied": dict(
        position="rope",
        tie_embeddings=False,
        rope_fraction=0.5,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    ),
    "alibi": dict(position="alibi", n_kv_heads=3, n_heads=6, d_model=48),
    "sinusoidal": dict(position="sinusoidal", tie_embeddings=False),
    "learned_tied": dict(position="learned"),
    "t5_untied": dict(position="t5", tie_embeddings=False),
}


@pytest.mark.parametrize("case", list(META_CASES))
def test_meta_to_empty_load_gives_the_same_model(case):
    """TransformerLM built on the meta device, ``to_empty(device='cpu')``, ``load_state_dict`` of an
    ordinary model's state: the same logits (exactly) as that model, with and without a KV cache past the
    initial table length, and a tied LM head is the embedding's Parameter (one storage, trained as one)."""
    cfg = ModelConfig(
        **{**dict(vocab_size=V, context_length=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2), **META_CASES[case]}
    )
    torch.manual_seed(0)
    ref = TransformerLM(cfg).eval()
    with torch.device("meta"):
        model = TransformerLM(cfg)
    assert model.embed.weight.is_meta
    model.to_empty(device="cpu")
    model.load_state_dict(ref.state_dict())
    model.eval()
    if cfg.tie_embeddings:
        assert model.lm_head.weight is model.embed.weight
        assert model.lm_head.weight.data_ptr() == model.embed.weight.data_ptr()
        assert sum(1 for _ in model.parameters()) == sum(1 for _ in ref.parameters())
    else:
        assert model.lm_head.weight is not model.embed.weight
    for name, buf in ref.named_buffers():  # every table recomputed, none left as uninitialised memory
        assert torch.equal(dict(model.named_buffers())[name], buf), name
    idx = torch.randint(0, V, (2, 48))
    with torch.no_grad():
        assert torch.equal(model(idx), ref(idx))
        assert torch.isfinite(model(idx)).all()
    if cfg.tie_embeddings:  # one Parameter: an update to the embedding moves the head too
        with torch.no_grad():
            model.embed.weight[3] += 1.0
        assert torch.equal(model.lm_head.weight[3], model.embed.weight[3])


def test_meta_materialised_model_trains_like_the_original():
    """One optimizer step on the materialised tied model equals one on the original (the tie matters:
    two separate copies would receive separate gradients)."""
    cfg = ModelConfig(vocab_size=V, context_length=32, d_model=32, n_layers=1, n_heads=4)
    torch.manual_seed(0)
    ref = TransformerLM(cfg)
    with torch.device("meta"):
        model = TransformerLM(cfg)
    model.to_empty(device="cpu").load_state_dict(ref.state_dict())
    idx = torch.randint(0, V, (2, 16))
    from lmlab.model import lm_loss

    for m in (ref, model):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        lm_loss(m(idx[:, :-1]), idx[:, 1:])[0].backward()
        opt.step()
    assert torch.equal(model.embed.weight, ref.embed.weight)
    assert torch.equal(model(idx), ref(idx))


FSDP_META_SCRIPT = """
import json, sys, torch, torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from lmlab.config import ModelConfig
from lmlab.model import TransformerLM
from lmlab.parallel import init_distributed, wrap_model
info = init_distributed("cpu")
out = {}
for position in ("rope", "alibi", "sinusoidal", "learned"):
    cfg = ModelConfig(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      position=position)
    torch.manual_seed(0)
    ref = TransformerLM(cfg).eval()
    with torch.device("meta"):
        model = TransformerLM(cfg)
    model = wrap_model(model, "fsdp", info, torch.device("cpu"))
    model.to_empty(device="cpu")
    set_model_state_dict(model, ref.state_dict(), options=StateDictOptions(full_state_dict=True))
    model.eval()
    idx = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out[position] = [float((model(idx) - ref(idx)).abs().max()), model.lm_head.weight is model.embed.weight]
if info.is_main:
    open(sys.argv[1], "w").write(json.dumps(out))
dist.destroy_process_group()
sys.stdout.flush()
import os
os._exit(0)  # skip interpreter teardown: gloo's threads sometimes abort there ("terminate called ...")
"""


def test_meta_fsdp_two_ranks_materialise(tmp_path):
    """The FSDP path (lmlab.parallel.wrap_model, 2 gloo ranks): a meta-device model sharded, then
    ``to_empty`` and a full state dict loaded, computes the original logits (RoPE, ALiBi, sinusoidal,
    learned) and keeps its LM head tied."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    script = tmp_path / "meta_fsdp.py"
    script.write_text(FSDP_META_SCRIPT)
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node=2", str(script), str(tmp_path / "out.json")],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out.json").read_text())
    for position, (diff, tied) in result.items():
        assert diff <= 1e-6 and tied, (position, diff, tied)


# ------------------------------------------------------------------------------------------------
# 3-4. Config fields transformers never reads: Gemma 3's attention soft-cap, published legacy keys
# ------------------------------------------------------------------------------------------------


def _hf_folder(tmp_path, cls: str, overrides: dict, extra_json: dict, name: str = "hf"):
    """A random HF model of config class ``cls`` saved to ``tmp_path/name``, with ``extra_json`` written
    into its config.json; returns (folder, the HF model reloaded from that folder, eval, eager attention)."""
    import json

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**overrides))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "ln" in pname:
                p.add_(torch.randn_like(p) * 0.3)
    folder = tmp_path / name
    model.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(extra_json)
    (folder / "config.json").write_text(json.dumps(cfg))
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    for key, value in extra_json.items():  # transformers keeps the field, and (the point) ignores it
        assert getattr(ref.config, key) == value
    return folder, ref


def _import(folder, out, capsys):
    """``lmlab import`` through the CLI: (exit status, stdout, model of the run)."""
    from lmlab.cli import main

    capsys.readouterr()
    rc = main(["import", str(folder), "--out", str(out)])
    text = capsys.readouterr().out
    model = hfio.load_run_model(out)[0] if rc == 0 else None
    return rc, text, model


def _logits_diff(model, ref, seq=40) -> float:
    idx = torch.randint(0, V, (2, seq), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return float((model(idx) - ref(idx).logits.float()).abs().max())


GEMMA3 = dict(
    BASE,
    head_dim=16,
    num_hidden_layers=3,
    sliding_window=8,
    query_pre_attn_scalar=16,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
)


def test_gemma3_attn_logit_softcapping_follows_hf(tmp_path, capsys):
    """transformers' Gemma 3 ignores attn_logit_softcapping; lmlab imports such a config without the cap
    (the logits equal HF's), says so in a note, and would differ from HF had it applied the cap."""
    from dataclasses import replace

    folder, ref = _hf_folder(tmp_path, "Gemma3TextConfig", dict(GEMMA3, attn_logit_softcapping=0.5), {})
    rc, text, model = _import(folder, tmp_path / "run", capsys)
    assert rc == 0
    assert model.cfg.attn_logit_softcap is None
    assert "note: config.json attn_logit_softcapping=0.5: not applied" in text
    assert _logits_diff(model, ref) <= 1e-4
    capped = TransformerLM(replace(model.cfg, attn_logit_softcap=0.5)).eval()
    capped.load_state_dict(model.state_dict())
    assert _logits_diff(capped, ref) > 1e-2  # applying the cap is not what HF computes
    with pytest.raises(hfio.UnsupportedError, match="attn_logit_softcap"):  # cannot be written as Gemma 3
        hfio.lmlab_to_hf_config(capped.cfg, family="gemma3_text")


COHERE2 = dict(BASE, num_hidden_layers=4, sliding_window=8, logit_scale=0.25)
R7B_LEGACY = {
    "order_of_interleaved_layers": "local_attn_first",
    "position_embedding_type": "rope_gptj",
    "rotary_pct": 1.0,
    "use_embedding_sharing": True,
    "use_gated_activation": True,
    "use_parallel_block": True,
    "use_parallel_embedding": True,
}
GPTJ = dict(vocab_size=V, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128, initializer_range=0.1)
PUBLISHED = {  # case -> (config class, tiny config, the published keys transformers never reads)
    "qwen2.5": ("Qwen2Config", dict(BASE, use_sliding_window=False), {"use_mrope": False}),
    "gpt-j-6b": ("GPTJConfig", GPTJ, {"rotary": True}),
    "command-r7b": ("Cohere2Config", COHERE2, R7B_LEGACY),
    "command-r": (
        "CohereConfig",
        dict(BASE, logit_scale=0.25),
        {k: v for k, v in R7B_LEGACY.items() if k != "order_of_interleaved_layers"},
    ),
}


@pytest.mark.parametrize("case", list(PUBLISHED))
def test_published_unread_keys_import_with_a_note(tmp_path, capsys, case):
    """A tiny random model of the family with the published config's unread keys (Qwen2.5 use_mrope:
    false, GPT-J-6B rotary: true, Command R7B's legacy Cohere keys): imports, lists each key in a note,
    and gives HF's logits."""
    cls, overrides, extra = PUBLISHED[case]
    folder, ref = _hf_folder(tmp_path, cls, overrides, extra)
    rc, text, model = _import(folder, tmp_path / "run", capsys)
    assert rc == 0, text
    for key, value in extra.items():
        assert f"note: config.json {key}={value!r}: " in text
    assert _logits_diff(model, ref) <= 1e-4


REFUSED = {  # a value of an unread key that would describe another model than transformers builds
    "use_mrope=true": ("Qwen2Config", dict(BASE), {"use_mrope": True}, "use_mrope=True"),
    "rotary=false": ("GPTJConfig", GPTJ, {"rotary": False}, "rotary=False"),
    "ungated": ("Cohere2Config", COHERE2, dict(R7B_LEGACY, use_gated_activation=False), "use_gated_activation=False"),
    "untied sharing": ("Cohere2Config", COHERE2, {"use_embedding_sharing": False}, "use_embedding_sharing=False"),
    "rotary_pct": ("CohereConfig", dict(BASE), {"rotary_pct": 0.5}, "rotary_pct=0.5"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unread_keys_that_would_change_the_model_are_refused(tmp_path, capsys, case):
    """The same keys with a value that describes another model stay refused: exit 2, one line naming the
    field and value, no run folder."""
    from lmlab.cli import main

    cls, overrides, extra, named = REFUSED[case]
    folder, _ = _hf_folder(tmp_path, cls, overrides, extra)
    capsys.readouterr()  # transformers' own output while saving
    rc = main(["import", str(folder), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2
    assert named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------
# 5. dtype on import and export
# ------------------------------------------------------------------------------------------------


def _safetensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _bf16_llama(tmp_path):
    """A random Llama saved by transformers in bf16: (folder, its tensors)."""
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**BASE, tie_word_embeddings=False))
    ref.to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    tensors = _safetensors(tmp_path / "hf")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    return tmp_path / "hf", tensors


def test_bf16_round_trip_keeps_dtype_and_values(tmp_path, capsys):
    """A bf16 HF checkpoint imported with the default --dtype auto is stored in bf16 (half the bytes of
    fp32) and exported in bf16: every tensor comes back bitwise equal, config.json says bfloat16, and
    transformers loads it in bf16 with the original's logits."""
    import json

    from lmlab.cli import main

    folder, original = _bf16_llama(tmp_path)
    capsys.readouterr()
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 0
    assert "parameters, bf16) into" in capsys.readouterr().out
    ckpt = _safetensors(tmp_path / "run" / "checkpoints" / "step_0000000")
    assert {t.dtype for t in ckpt.values()} == {torch.bfloat16}
    assert torch.equal(ckpt["embed.weight"], original["model.embed_tokens.weight"])
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 0
    assert "(model_type llama, bf16) to" in capsys.readouterr().out
    back = _safetensors(tmp_path / "exp")
    assert set(back) == set(original)
    for name, tensor in original.items():
        assert back[name].dtype == torch.bfloat16 and torch.equal(back[name], tensor), name
    assert json.loads((tmp_path / "exp" / "config.json").read_text())["dtype"] == "bfloat16"
    a = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    b = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exp").eval()
    assert next(b.parameters()).dtype == torch.bfloat16
    idx = torch.randint(0, V, (1, 16))
    with torch.no_grad():
        assert torch.equal(a(idx).logits, b(idx).logits)


def test_dtype_flags_convert_as_asked(tmp_path, capsys):
    """--dtype fp32 on import of a bf16 checkpoint widens exactly; --dtype bf16 on export of that run
    rounds back to the same bf16 tensors; --dtype bf16 on import of an fp32 checkpoint rounds to nearest."""
    from lmlab.cli import main

    folder, original = _bf16_llama(tmp_path)
    assert main(["import", str(folder), "--out", str(tmp_path / "run32"), "--dtype", "fp32"]) == 0
    ckpt = _safetensors(tmp_path / "run32" / "checkpoints" / "step_0000000")
    assert ckpt["embed.weight"].dtype == torch.float32
    assert torch.equal(ckpt["embed.weight"], original["model.embed_tokens.weight"].float())
    assert main(["export", str(tmp_path / "run32"), "--out", str(tmp_path / "exp32")]) == 0  # auto: fp32
    assert _safetensors(tmp_path / "exp32")["lm_head.weight"].dtype == torch.float32
    assert main(["export", str(tmp_path / "run32"), "--out", str(tmp_path / "exp16"), "--dtype", "bf16"]) == 0
    back = _safetensors(tmp_path / "exp16")
    assert all(torch.equal(back[k], v) for k, v in original.items())
    # an fp32 checkpoint asked for in bf16
    fp32 = _safetensors(tmp_path / "exp32")
    assert main(["import", str(tmp_path / "exp32"), "--out", str(tmp_path / "run16"), "--dtype", "bf16"]) == 0
    ckpt16 = _safetensors(tmp_path / "run16" / "checkpoints" / "step_0000000")
    assert torch.equal(ckpt16["lm_head.weight"], fp32["lm_head.weight"].to(torch.bfloat16))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # argparse: one line naming the flag, exit 2
        main(["import", str(folder), "--out", str(tmp_path / "bad"), "--dtype", "fp16"])
    assert exit_info.value.code == 2
    assert "--dtype" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="dtype='fp16'"):  # the library names it too
        hfio.import_hf(folder, tmp_path / "bad", dtype="fp16")
    assert not (tmp_path / "bad").exists()


def test_bf16_import_evaluates_in_fp32_like_the_original(tmp_path):
    """The run of a bf16 import loads into lmlab's usual fp32 model with exactly the bf16 values: its
    logits equal those of the HF bf16 weights widened to fp32."""
    folder, _ = _bf16_llama(tmp_path)
    hfio.import_hf(folder, tmp_path / "run")
    model = hfio.load_run_model(tmp_path / "run")[0]
    assert next(model.parameters()).dtype == torch.float32
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert _logits_diff(model, ref) <= 1e-4


# ------------------------------------------------------------------------------------------------
# 6. The pickle refusal: one line naming the file
# ------------------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this runs os.system (writes a marker file): what weights_only must refuse."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("damage", ["pickle", "truncated"])
def test_bin_refusal_is_one_line_naming_the_file(tmp_path, capsys, damage):
    """pytorch_model.bin with a Python object beyond tensors (a code-running pickle), or truncated: lmlab
    import exits 2 with exactly one line naming the file (and, for the pickle, the global it would call),
    nothing is executed and no run folder appears."""
    import json

    from lmlab.cli import main

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(BASE, model_type="llama")))
    marker = tmp_path / "executed"
    torch.save({"model.embed_tokens.weight": torch.zeros(V, 64), "x": _Payload(marker)}, folder / "pytorch_model.bin")
    if damage == "truncated":
        data = (folder / "pytorch_model.bin").read_bytes()
        (folder / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    rc = main(["import", str(folder), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert str(folder / "pytorch_model.bin") in err
    if damage == "pickle":
        assert "system" in err and "never unpickles" in err
    else:
        assert "truncated or corrupt" in err
    assert not marker.exists() and not (tmp_path / "run").exists()
