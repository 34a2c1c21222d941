"""lmlab.analysis against hand calculations and instantiated modules: parameter counts, FLOPs per token,
KV-cache bytes, arithmetic intensity; the `analyze`, `survey` and `bench decode` commands."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
import torch

from lmlab.analysis import (
    DEVICES,
    Device,
    analyze,
    flops_per_token,
    format_analysis,
    intensity,
    kv_cache_bytes,
    mean_keys,
)
from lmlab.cli import main
from lmlab.config import ModelConfig
from lmlab.model import KVCache, TransformerLM
from lmlab.param_counts import instantiated_params, param_counts
from lmlab.presets import PRESETS, preset_config
from lmlab.survey import format_survey, survey_rows


def small(**kw) -> ModelConfig:
    base = dict(vocab_size=100, context_length=8, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
    base.update(kw)
    return ModelConfig(**base)


# --- parameters ---------------------------------------------------------------------------------------


def test_param_counts_by_hand_llama_style():
    # vocab 100, d 64, 2 layers, 4 heads of 16, 2 KV heads, SwiGLU d_ff 128, RMSNorm pre, no biases, tied
    p = param_counts(small())
    qkv = 64 * (4 + 2 * 2) * 16  # 8192: q 4 heads, k and v 2 heads each, of 16
    out = (4 * 16) * 64  # 4096
    mlp = 2 * 64 * 128 + 128 * 64  # 24576: gate and up, then down
    norms = 2 * 64  # attention and MLP RMSNorm weights
    assert p["per_layer"]["total"] == qkv + out + mlp + norms == 36992
    assert p["total"] == 100 * 64 + 2 * 36992 + 64 == 80448  # embedding (tied head) + layers + final norm
    assert p["non_embedding"] == 80448 - 6400
    assert p["matmul"] == 2 * (qkv + out + mlp) + 6400  # the tied LM head is still a matmul


def test_param_counts_by_hand_gated_attention_with_sinks():
    # small() + an elementwise output gate (W_g: 64 -> 4 heads x 16, biased as q with bias='attention') and
    # a sink logit per head; headwise: one gate per head
    p = param_counts(small(attn_output_gate="elementwise", attn_sinks=True, bias="attention"))
    qkv, out, gate = 64 * 128 + 128, 64 * 64 + 64, 64 * 64 + 64
    assert p["per_layer"]["attention"] == qkv + out + gate + 4
    assert p["per_layer"]["attention_matmul"] == 64 * 128 + 64 * 64 + 64 * 64
    assert param_counts(small(attn_output_gate="headwise"))["per_layer"]["attention"] == 64 * 128 + 64 * 64 + 64 * 4


def test_param_counts_by_hand_gpt2_style():
    # LayerNorm with bias, biases on every linear, GELU 4x, learned positions, untied head with a bias
    cfg = small(
        n_kv_heads=4,
        d_ff=256,
        activation="gelu",
        norm_type="layernorm",
        norm_bias=True,
        bias="all",
        position="learned",
        tie_embeddings=False,
        lm_head_bias=True,
        n_layers=1,
    )
    p = param_counts(cfg)
    layer = (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64) + 2 * (64 + 64)
    assert p["per_layer"]["total"] == layer == 49984
    total = 100 * 64 + 8 * 64 + layer + (64 + 64) + (100 * 64 + 100)
    assert p["total"] == total
    assert p["non_embedding"] == total - 100 * 64 - 8 * 64  # the untied head stays in Kaplan's N


EXTRA_CONFIGS = {
    "parallel_shared": dict(parallel_block=True, norm_type="layernorm", norm_bias=True, bias="mlp", lm_head_bias=True),
    "parallel_two_norms": dict(parallel_block=True, parallel_shared_norm=False, tie_embeddings=False),
    "sandwich_qknorm": dict(norm_position="sandwich", qk_norm="rmsnorm", norm_type="gemma_rmsnorm"),
    "reordered_qknorm_all": dict(norm_position="reordered", qk_norm="rmsnorm", qk_norm_scope="all"),
    "qknorm_untied": dict(qk_norm="layernorm", qk_norm_scope="head_untied"),
    "mqa_head_dim": dict(n_kv_heads=1, head_dim=32, bias="qkv"),
    "window_pattern": dict(sliding_window=3, layer_pattern="LG"),
    "t5": dict(position="t5", t5_num_buckets=8, t5_max_distance=16),
    "alibi_nonaffine": dict(position="alibi", norm_type="layernorm", norm_affine=False),
    "opt_like": dict(
        embed_dim=32,
        position="learned",
        learned_pos_offset=2,
        norm_type="layernorm",
        norm_bias=True,
        norm_position="post",
        final_norm=False,
        activation="relu",
    ),
    "layernorm1p": dict(norm_type="layernorm1p", norm_bias=True, activation="relu2"),
    "gate_elementwise_sinks": dict(attn_output_gate="elementwise", attn_sinks=True, bias="attention"),
    "gate_headwise_gqa": dict(attn_output_gate="headwise", head_dim=24, bias="qkv"),
}


@pytest.mark.parametrize("name", list(EXTRA_CONFIGS))
def test_param_formula_equals_instantiated_module(name):
    cfg = small(**EXTRA_CONFIGS[name])
    p, model = param_counts(cfg), TransformerLM(cfg)
    assert p["total"] == model.num_params()
    assert p["non_embedding"] == model.num_params(non_embedding=True)
    # and the matmul weights are exactly the nn.Linear weights (the LM head counted even when tied)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert p["matmul"] == linear


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_formula_equals_every_preset_on_meta(name):
    for scale in ("tiny", "real"):
        cfg = preset_config(name, scale)
        p = param_counts(cfg)
        assert (p["total"], p["non_embedding"]) == instantiated_params(cfg), scale


# --- FLOPs --------------------------------------------------------------------------------------------


def test_flops_per_token_hand_worked_example():
    """small(): matmul weights N = 2 x (8192 + 4096 + 24576) + 6400 (LM head) = 80128, so 2N = 160256.
    Context 8, layer 0 windowed (W = 3), layer 1 global; attention width n_heads x head_dim = 64.
    Global: positions 1..8 see 1..8 keys, mean 4.5: 4 x 64 x 4.5 = 1152 (QK^T and AV, 2 FLOPs per MAC).
    Window 3: they see 1, 2, 3, 3, 3, 3, 3, 3 keys = 21, mean 2.625: 4 x 64 x 2.625 = 672.
    Forward = 160256 + 1152 + 672 = 162080; training = 3 x forward = 486240."""
    cfg = small(sliding_window=3, layer_pattern="LG")
    assert mean_keys(8, None) == 4.5 and mean_keys(8, 3) == 21 / 8 and mean_keys(8, 8) == 4.5
    assert flops_per_token(cfg, 8, training=False) == 162080
    assert flops_per_token(cfg, 8) == 486240
    assert flops_per_token(cfg) == flops_per_token(cfg, cfg.context_length)
    # GQA changes N (fewer K/V weights), not the attention term: QK^T and AV use all n_heads
    mha = small(n_kv_heads=4, sliding_window=3, layer_pattern="LG")
    n_mha = 2 * (64 * 192 + 4096 + 24576) + 6400
    assert flops_per_token(mha, 8, training=False) == 2 * n_mha + 1152 + 672
    # head_dim != d_model / n_heads: the attention width is n_heads x head_dim = 128
    wide = small(head_dim=32)
    n_wide = 2 * (64 * 256 + 128 * 64 + 24576) + 6400
    assert flops_per_token(wide, 8, training=False) == 2 * n_wide + 2 * 4 * 128 * 4.5


def test_flops_match_kaplan_for_long_full_attention():
    """Without windows, 3 x the causal attention term is 6 L (n + 1) d_attn ~ Kaplan's 6 n_layer n_ctx d_attn."""
    cfg = preset_config("gpt2-124m", "real")
    n = cfg.context_length
    attn = flops_per_token(cfg, n) - 6 * param_counts(cfg)["matmul"]
    assert attn == pytest.approx(6 * cfg.n_layers * (n + 1) * cfg.d_model)
    assert attn == pytest.approx(6 * cfg.n_layers * n * cfg.d_model, rel=1e-3)


# --- KV cache -----------------------------------------------------------------------------------------


def test_kv_cache_bytes_formula_and_real_cache():
    cfg = small(n_layers=4, sliding_window=3, layer_pattern="LG")  # 2 KV heads x 16, windows on layers 0, 2
    kv = kv_cache_bytes(cfg, context=8, batch=3, dtype="bf16")
    per_layer_token = 2 * 2 * 16 * 2  # K and V, 2 heads, head_dim 16, 2 bytes
    assert kv["per_token"] == 4 * per_layer_token
    assert kv["total"] == 3 * per_layer_token * (3 + 8 + 3 + 8)
    assert kv["mha_total"] == 3 * 2 * 4 * 16 * 2 * 8 * 4  # 4 KV heads, every layer holds 8
    assert kv["gqa_saving"] == 2 and kv["window_saving"] == pytest.approx(32 / 22)
    assert kv["saving"] == pytest.approx(kv["mha_total"] / kv["total"])
    for dtype, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        cache = KVCache(cfg, batch=3, max_len=8, dtype=torch_dtype)
        assert kv_cache_bytes(cfg, 8, 3, dtype)["total"] == cache.nbytes
    assert kv_cache_bytes(cfg, 8, 3, "fp8")["total"] == kv["total"] // 2


# --- arithmetic intensity -----------------------------------------------------------------------------


def test_intensity_hand_worked_example():
    """One layer: d 64, 4 heads of 16, MQA, ReLU d_ff 128, RMSNorm; bf16; context 100, batch 2.
    Weights: qkv 64 x 96 = 6144, out 4096, MLP 2 x 64 x 128 = 16384, norms 128 -> 26752 params, 53504 bytes.
    Decode, per sequence: FLOPs 2 x 26624 (matmul weights) + 4 x 64 x 100 = 78848; bytes: read 100 KV
    entries of 2 x 1 x 16 x 2 = 64 B, write one, activations in and out 2 x 64 x 2 -> 6400 + 64 + 256 = 6720.
    Batch 2: 157696 FLOPs / (53504 + 13440) bytes = 2.3556 FLOP/byte."""
    cfg = ModelConfig(
        vocab_size=10, context_length=100, d_model=64, n_layers=1, n_heads=4, n_kv_heads=1, activation="relu", d_ff=128
    )
    dev = Device("toy", peak_flops=50.0, bandwidth=10.0, dtype="bf16", source="test")  # ridge 5 FLOP/byte
    res = intensity(cfg, context=100, batch=2, device=dev)
    dec = res["kinds"]["global"]["decode"]
    assert dec["flops"] == 2 * 78848 and dec["bytes"] == 53504 + 2 * 6720
    assert dec["intensity"] == pytest.approx(157696 / 66944)
    assert not dec["compute_bound"]
    # compute-bound from B = ceil(5 x 53504 / (78848 - 5 x 6720)) = ceil(5.91) = 6
    assert dec["compute_bound_from_batch"] == 6
    assert 6 * 78848 / (53504 + 6 * 6720) >= 5 > 5 * 78848 / (53504 + 5 * 6720)
    assert dec["limit"] == pytest.approx(78848 / 6720)
    # prefill: 100 tokens x 53248 + 4 x 64 x (1 + ... + 100 = 5050) per sequence; KV writes and activations
    pre = res["kinds"]["global"]["prefill"]
    assert pre["flops"] == 2 * (100 * 53248 + 4 * 64 * 5050)
    assert pre["bytes"] == 53504 + 2 * 100 * (64 + 256)
    assert pre["compute_bound"]
    # a ridge above the KV limit: decode never turns compute-bound at this context
    hi = intensity(cfg, 100, 2, Device("toy", 200.0, 10.0, "bf16", "test"))
    assert hi["kinds"]["global"]["decode"]["compute_bound_from_batch"] is None


def test_intensity_layer_kinds_and_devices():
    cfg = preset_config("gemma-2-9b", "real")
    res = intensity(cfg, context=8192, batch=1, device="h100")
    assert set(res["kinds"]) == {"local", "global"}
    assert res["kinds"]["local"]["layers"] == res["kinds"]["global"]["layers"] == 21
    # the window caps what a local layer reads per sequence: a higher KV-bound limit, and at a large batch
    # (weights amortised) a more intense decode than the global layer's
    local, glob = res["kinds"]["local"]["decode"], res["kinds"]["global"]["decode"]
    assert local["bytes"] < glob["bytes"] and local["limit"] > glob["limit"]
    big = intensity(cfg, context=8192, batch=256, device="h100")["kinds"]
    assert big["local"]["decode"]["intensity"] > big["global"]["decode"]["intensity"]
    assert DEVICES["h100"].ridge == pytest.approx(989.4e12 / 3.35e12)
    assert DEVICES["h200"].ridge < DEVICES["h100"].ridge  # same FLOPs, more bandwidth
    # short-context decode of a GQA model turns compute-bound at some batch; at batch 1 it is memory-bound
    short = intensity(preset_config("llama-3-8b", "real"), context=128, batch=1, device="a100")["model"]["decode"]
    assert not short["compute_bound"] and short["compute_bound_from_batch"] > 1


def test_analyze_report_and_json():
    res = analyze(
        preset_config("mistral-7b", "real"),
        context=4096,
        batch=2,
        device="h200",
        published_params=PRESETS["mistral-7b"].published_params,
    )
    assert res["instantiated"]["equal"]
    assert res["flops"]["training"] == flops_per_token(preset_config("mistral-7b", "real"), 4096)
    text = format_analysis(res, "mistral-7b")
    for needle in (
        "Parameters",
        "published 7,241,732,096",
        "FLOPs per token",
        "KV cache",
        "Arithmetic intensity",
        "memory-bound",
        "compute-bound",
        "H200",
    ):
        assert needle in text
    json.dumps(res)  # serialisable for --json


# --- commands -----------------------------------------------------------------------------------------


def test_cli_analyze_survey_and_bench(capsys, tmp_path, monkeypatch, request):
    from lmlab.kernels.settings import cache_path, cpu_identity, default_kernels

    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))  # this machine uncalibrated
    default_kernels.cache_clear()
    request.addfinalizer(default_kernels.cache_clear)
    assert main(["analyze", "--preset", "llama-3-8b", "--context", "2048", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["params"]["total"] == 8_030_261_248 and res["context"] == 2048
    cfg_file = tmp_path / "m.yaml"
    cfg_file.write_text("model:\n  d_model: 64\n  n_layers: 2\n  n_heads: 4\n")
    assert main(["analyze", "--config", str(cfg_file), "--device", "cpu"]) == 0
    assert "2 CPU cores" in capsys.readouterr().out
    assert main(["analyze", "--preset", "llama-3-8b", "--config", str(cfg_file)]) == 2
    assert "not several" in capsys.readouterr().err
    assert main(["survey", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["model"] for r in rows] == list(PRESETS)
    by = {r["model"]: r for r in rows}
    assert by["llama-3-8b"]["heads/kv"] == "32/8" and by["gemma-2-9b"]["windows"] == "LG 4096"
    assert by["gemma-7b"]["H*hd/d"] == "1.33" and by["palm-540b"]["heads/kv"] == "48/1"
    assert "z-loss" in by["palm-540b"]["stability"] and "QK-norm" in by["qwen3-8b"]["stability"]
    ds = by["deepseek-v2"]  # MLA: value heads 128 x 128 / 5120; experts' width 1536 / 5120
    assert (ds["heads/kv"], ds["H*hd/d"], ds["d_ff/d"]) == ("128 MLA r512", "3.2", "0.3")
    assert "MoE 160 top-6 +2 shared" in ds["activation"] and "21.4B active" in ds["params"]
    assert "MoE 8 top-2" in by["mixtral-8x7b"]["activation"] and "attn temperature" in by["llama-4-scout"]["stability"]
    assert main(["survey", "--format", "markdown"]) == 0
    assert capsys.readouterr().out.count("\n") == len(PRESETS) + 2
    assert (
        main(
            [
                "bench",
                "decode",
                "--preset",
                "mistral-7b",
                "--batch",
                "2",
                "--prompt-len",
                "4",
                "--new-tokens",
                "3",
                "--repeats",
                "1",
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["batch"] == 2 and res["decode_tokens_per_s"] > 0 and res["prefill_tokens_per_s"] > 0
    assert res["lean_decode"] is True  # pre-norm, GQA, windows: the lean one-token path
    assert res["decode_layout"] == "transposed"  # uncalibrated (LMLAB_CACHE above): no packed weights
    from lmlab.kernels.decode_layout import packed_decode_available

    if packed_decode_available():  # a calibration that measured packed fp32 batches faster: they decode packed
        cache_path().parent.mkdir(parents=True)
        choices = {
            "onednn_fp32": False,
            "blocked_attention_fp32": False,
            "decode_layout": [{"cell": "fp32 batch 2+", "weights": 1, "packed": True}],
        }
        record = {"version": 1, "identity": cpu_identity(), "date": "2026-12-06T08:00:00", "choices": choices}
        cache_path().write_text(json.dumps({**record, "cells": []}))
        default_kernels.cache_clear()
        assert main(["bench", "decode", "--batch", "2", "--prompt-len", "4", "--new-tokens", "3", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["decode_layout"] == "onednn-packed"
    assert (
        main(["bench", "decode", "--preset", "qwen3-8b", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1"])
        == 0
    )
    assert "ordinary block path" in capsys.readouterr().out  # QK-norm: no lean one-token path
    with pytest.raises(SystemExit) as exc:  # argparse refuses it, naming the flag
        main(["bench", "decode", "--new-tokens", "1", "--repeats", "1"])
    assert exc.value.code == 2 and "--new-tokens: 1 must be >= 2" in capsys.readouterr().err


def test_survey_rows_and_formats():
    rows = survey_rows()
    assert len(rows) == len(PRESETS)
    table = format_survey(rows, "table").splitlines()
    assert len(table) == len(PRESETS) + 2 and table[0].startswith("model")
    with pytest.raises(ValueError, match="format"):
        format_survey(rows, "html")
    assert math.isclose(next(r for r in rows if r["model"] == "llama-3-8b")["d_ff/d"], 3.5)
