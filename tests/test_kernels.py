"""The training step's own kernels against independent references: the chunked linear cross-entropy
(lmlab.kernels.loss) against logits + F.cross_entropy, and the blocked causal attention
(lmlab.kernels.causal_attention) against SDPA and float64 gradcheck."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from lmlab.config import ModelConfig
from lmlab.kernels.causal_attention import BLOCK, blocked_causal_attention, use_blocked
from lmlab.kernels.linear import Linear
from lmlab.kernels.loss import chunk_rows, linear_cross_entropy
from lmlab.kernels.settings import KernelSettings, default_kernels
from lmlab.model import TransformerLM, lm_loss


def _reference(h, w, y, b=None, z=0.0, cap=None, reduction="mean"):
    logits = h @ w.t()  # in the inputs' dtype (float64 in the exactness test)
    if b is not None:
        logits = logits + b
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    keep = y != -100
    ce = F.cross_entropy(logits, y, ignore_index=-100, reduction="sum")
    zl = z * torch.logsumexp(logits[keep], -1).pow(2).sum()
    n = keep.sum() if reduction == "mean" else 1
    return (ce + zl) / n, ce / n


@pytest.mark.parametrize("z,cap,bias", [(0.0, None, False), (1e-2, None, False), (0.0, 3.0, False), (1e-3, 5.0, True)])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_linear_cross_entropy_matches_materialised_logits(z, cap, bias, reduction):
    g = torch.Generator().manual_seed(0)
    N, d, V = 70, 16, 53  # 70 rows in chunks of 16: a ragged last chunk
    h = torch.randn(N, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, d, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    y[[0, 17, 69]] = -100
    ref, ref_ce = _reference(h, w, y, b, z, cap, reduction)
    ref.backward()
    want = [t.grad.clone() for t in (h, w, b) if t is not None]
    for t in (h, w, b):
        if t is not None:
            t.grad = None
    got, got_ce = linear_cross_entropy(h, w, y, b, z, cap, reduction, chunk=16)
    got.backward()
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)
    assert got_ce.item() == pytest.approx(ref_ce.item(), rel=1e-6)
    assert not got_ce.requires_grad
    for a, e in zip([t.grad for t in (h, w, b) if t is not None], want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-7)


def test_linear_cross_entropy_scales_with_the_incoming_gradient_and_ignores_all_masked():
    h = torch.randn(8, 4, requires_grad=True)
    w = torch.randn(11, 4, requires_grad=True)
    y = torch.randint(0, 11, (8,))
    loss, _ = linear_cross_entropy(h, w, y, reduction="sum", chunk=3)
    (loss * 3.0).backward()
    g3 = h.grad.clone()
    h.grad = None
    ref, _ = _reference(h, w, y, reduction="sum")
    ref.backward()
    torch.testing.assert_close(g3, 3.0 * h.grad, rtol=1e-5, atol=1e-6)
    none, ce = linear_cross_entropy(h, w, torch.full((8,), -100), reduction="mean")
    assert none.item() == 0.0 and ce.item() == 0.0


def test_linear_cross_entropy_rejects_bad_arguments():
    h, w = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(h, w, torch.zeros(4, dtype=torch.long), reduction="max")
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(h, w, torch.zeros(5, dtype=torch.long))
    assert chunk_rows(4096, torch.device("cpu")) == 256 and chunk_rows(10**7, torch.device("cpu")) == 16


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(z_loss=1e-3, final_logit_softcap=8.0),
        dict(logit_scale=0.5, lm_head_bias=True, tie_embeddings=False),
        dict(embed_dim=24, tie_embeddings=True),
    ],
)
def test_model_training_loss_is_lm_loss_of_its_logits(kw):
    cfg = ModelConfig(vocab_size=61, context_length=12, d_model=32, n_layers=2, n_heads=4, **kw)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    x = torch.randint(0, 61, (3, 12))
    y = torch.randint(0, 61, (3, 12))
    y[1, :4] = -100
    ref, ref_ce = lm_loss(model(x), y, cfg.z_loss, "sum")
    ref.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got, got_ce = model(x, targets=y, reduction="sum")
    got.backward()
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)
    assert got_ce.item() == pytest.approx(ref_ce.item(), rel=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-6, msg=n)


def test_linear_cross_entropy_under_bf16_autocast_is_close_to_fp32():
    torch.manual_seed(0)
    h = torch.randn(64, 32, requires_grad=True)
    w = (torch.randn(100, 32) * 0.3).requires_grad_()
    y = torch.randint(0, 100, (64,))
    ref, _ = _reference(h, w, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = linear_cross_entropy(h, w, y, chunk=16)
    got.backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.float32
    assert got.item() == pytest.approx(ref.item(), rel=2e-2)


def test_blocked_attention_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 37, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda q, k, v: blocked_causal_attention(q, k, v, 0.3, block=16), (q, k, v))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("T", [1 + BLOCK, 2 * BLOCK, 7])
def test_blocked_attention_matches_sdpa(kv_heads, T):
    torch.manual_seed(0)
    q = torch.randn(2, 4, T, 16, requires_grad=True)
    k = torch.randn(2, kv_heads, T, 16, requires_grad=True)
    v = torch.randn(2, kv_heads, T, 16, requires_grad=True)
    do = torch.randn(2, 4, T, 16)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=kv_heads != 4)
    ref.backward(do)
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    got = blocked_causal_attention(q, k, v, 0.2)
    got.backward(do)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, e in zip([q.grad, k.grad, v.grad], want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_blocked_attention_bf16_close_to_fp32_and_rejects_bad_shapes():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 100, 16) for _ in range(3))
    ref = blocked_causal_attention(q, k, v, 0.25)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = blocked_causal_attention(q, k, v, 0.25)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=0.05, atol=0.05)
    with pytest.raises(ValueError, match="kv_heads"):
        blocked_causal_attention(q, torch.randn(1, 3, 100, 16), torch.randn(1, 3, 100, 16), 0.25)


# The model-level tests here read the rule as on a CPU whose calibration took the blocked loops for fp32
# on one thread (the defaults have their own test in test_linear.py).
BLOCKED = KernelSettings(onednn_fp32=default_kernels().onednn_fp32, blocked_attention_fp32=True)


def test_fp32_on_one_thread_takes_sdpa_where_blocked_fp32_is_off():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert not use_blocked(torch.empty(8, 8, 256, 32), blocked_fp32=False)  # fp32: SDPA
        assert use_blocked(torch.empty(8, 8, 256, 32, dtype=torch.bfloat16), blocked_fp32=False)  # bf16: loops
        assert use_blocked(torch.empty(8, 8, 256, 32), blocked_fp32=True)
    finally:
        torch.set_num_threads(threads)
    cfg = ModelConfig(vocab_size=50, context_length=16, d_model=32, n_layers=2, n_heads=2)
    model = TransformerLM(cfg)
    assert model.kernels == default_kernels()
    model.set_kernels(BLOCKED)  # reaches every attention layer and linear
    assert all(m.kernels is BLOCKED for m in model.modules() if hasattr(m, "kernels"))
    assert sum(isinstance(m, Linear) for m in model.modules()) >= 4 * 2 + 1  # q, k, v, o per layer; the head


def test_use_blocked_rule_and_the_model_takes_it_only_in_training():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert not use_blocked(torch.empty(8, 8, 256, 32), True)  # fp32 on 2 threads: SDPA
        assert use_blocked(torch.empty(8, 8, 256, 32, dtype=torch.bfloat16), True)
    finally:
        torch.set_num_threads(threads)
    torch.set_num_threads(1)
    try:
        _blocked_rule_and_dispatch()
    finally:
        torch.set_num_threads(threads)


def _blocked_rule_and_dispatch():
    assert use_blocked(torch.empty(8, 8, 256, 32), True)
    assert not use_blocked(torch.empty(8, 8, 4096, 32), True)  # context over MAX_CONTEXT
    assert not use_blocked(torch.empty(512, 32, 1024, 32), True)  # saved probabilities over the budget
    cfg = ModelConfig(vocab_size=50, context_length=16, d_model=32, n_layers=1, n_heads=4)
    torch.manual_seed(0)
    model = TransformerLM(cfg, kernels=BLOCKED)
    x = torch.randint(0, 50, (2, 16))
    import lmlab.model.attention as attention

    calls = []
    real = attention.blocked_causal_attention
    attention.blocked_causal_attention = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        blocked = model(x)
        with torch.no_grad():
            model(x)  # inference: SDPA
        assert len(calls) == 1
        model.blocks[0].attn.blocked_kernel = False
        sdpa = model(x)
        assert len(calls) == 1
    finally:
        attention.blocked_causal_attention = real
    torch.testing.assert_close(blocked, sdpa, rtol=1e-5, atol=1e-5)
    assert math.isfinite(float(blocked.detach().sum()))


def _fused(q, k, v, scale, block=BLOCK):
    """The fused loops (what a compiled model traces), run eagerly: the same code, op by op."""
    from lmlab.kernels.causal_attention import _BlockedCausal

    return _BlockedCausal.apply(q, k, v, scale, block, True)


def test_fused_loops_gradcheck_float64_and_match_sdpa_with_gqa_and_a_ragged_block():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 37, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda q, k, v: _fused(q, k, v, 0.3, block=16), (q, k, v))
    q = torch.randn(2, 4, 37, 16, requires_grad=True)  # 37 rows in blocks of 16: a ragged last block
    k, v = (torch.randn(2, 2, 37, 16, requires_grad=True) for _ in range(2))  # GQA: 2 KV heads
    do = torch.randn(2, 4, 37, 16)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True)
    ref.backward(do)
    want = [ref.detach()] + [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    got = _fused(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), 0.2, block=16)
    got.backward(do)
    for name, a, e in zip("y dq dk dv".split(), [got.detach(), q.grad, k.grad, v.grad], want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=name)


def _tiny_model():
    cfg = ModelConfig(vocab_size=50, context_length=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    torch.manual_seed(0)
    return TransformerLM(cfg, kernels=BLOCKED), torch.randint(0, 50, (2, 16))


def test_compiled_model_is_one_graph_with_the_attention_in_it(monkeypatch):
    """torch.compile traces the blocked attention (forward and its own backward) into the model's
    graph: no graph break in bf16, nor in fp32 at one thread (blocked) or two (SDPA; the thread count
    is read without a break); fused_loops=False puts the eager loops behind a break per layer."""
    import lmlab.model.attention as attention

    model, x = _tiny_model()
    threads = torch.get_num_threads()
    calls = []
    real = attention.blocked_causal_attention
    monkeypatch.setattr(attention, "blocked_causal_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    try:
        for n, dtype in ((1, torch.bfloat16), (2, torch.bfloat16), (1, None), (2, None)):
            torch.set_num_threads(n)
            torch._dynamo.reset()
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                explained = torch._dynamo.explain(model)(x, targets=x)
            assert (explained.graph_count, explained.graph_break_count) == (1, 0), (n, dtype)
        assert len(calls) == 2 * 3  # the blocked attention in both layers, except fp32 on 2 threads
        model.set_kernels(dataclasses.replace(BLOCKED, fused_loops=False))
        torch._dynamo.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch._dynamo.explain(model)(x, targets=x).graph_break_count >= 2
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()


def test_compiled_model_matches_the_eager_model_in_bf16():
    model, x = _tiny_model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = model(x, targets=x)[0]
        got = torch.compile(model, fullgraph=True)(x, targets=x)[0]  # fullgraph: raises on a break
    eager.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got.backward()
    torch.testing.assert_close(got.float(), eager.float(), rtol=1e-2, atol=1e-2)
    for p, e in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, e, rtol=5e-2, atol=5e-3)


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="oneDNN's bf16 batched product is what copies operands it cannot take as they are",
)
def test_compiled_bf16_attention_hands_bmm_operands_it_takes_without_a_copy():
    """oneDNN's bf16 bmm copies a 3-D operand that is neither contiguous nor the transpose of a contiguous
    tensor (a row slice of (batch*heads, T, head_dim) is neither); the traced loops give it block copies
    of their own (causal_attention._rows), so no aten::contiguous runs inside a bmm of the compiled step.
    Before, 112 did in a GPT-2-recipe step. T = 2 * BLOCK + 5: query blocks, key prefixes and a ragged block."""
    from torch.profiler import ProfilerActivity, profile

    cfg = ModelConfig(vocab_size=64, context_length=2 * BLOCK + 5, d_model=32, n_layers=1, n_heads=2)
    torch.manual_seed(0)
    model = TransformerLM(cfg, kernels=BLOCKED)
    f = torch.compile(model, fullgraph=True)
    x = torch.randint(0, 64, (2, cfg.context_length))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            f(x, targets=x)[0].backward()

    try:
        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
    finally:
        torch._dynamo.reset()
    bmms, copies = 0, []
    for e in prof.events():
        if e.name == "aten::bmm":
            bmms += 1
        parent = e.cpu_parent
        while parent is not None and e.name in ("aten::contiguous", "aten::clone"):
            if parent.name == "aten::bmm":
                copies.append(e.input_shapes)
                break
            parent = parent.cpu_parent
    assert bmms == 3 * 2 + 3 * 4  # 3 query blocks: 2 products each forward, 4 backward
    assert copies == []


def test_compiled_training_gradients_are_the_same_every_call():
    """Inductor compiled the embedding's scatter-add with atomic float adds on 2 threads: the same
    step's embedding gradient changed between calls (up to 2e-9) and exact resume failed
    (lmlab.kernels.embedding). Learned positions: their table's gather is differentiated too."""
    cfg = ModelConfig(
        vocab_size=512, context_length=64, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, position="learned"
    )
    torch.manual_seed(0)
    model = TransformerLM(cfg, kernels=BLOCKED)
    f = torch.compile(model)
    x = torch.randint(0, 64, (16, 64))  # 64 distinct ids in 1,024 positions: many repeats per row
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = []
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                f(x, targets=x)[0].backward()
            grads.append([p.grad.clone() for p in model.parameters()])
    finally:
        torch.set_num_threads(threads)
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            assert torch.equal(a, b)
