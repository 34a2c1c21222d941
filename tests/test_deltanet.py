"""Gated DeltaNet (lmlab/model/deltanet.py): the chunked and recurrent forms of the gated delta rule against a
float64 loop written from the paper's update, for several chunk sizes and carried states; gradients by
gradcheck; the layer decoded with its state equal to its full forward; state bytes."""

import pytest
import torch

from lmlab.model.deltanet import GatedDeltaNet, gated_delta_chunked, gated_delta_recurrent


def inputs(B=2, H=3, T=11, dk=4, dv=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, H, T, dk, generator=g, dtype=dtype), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(B, H, T, dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, H, T, dv, generator=g, dtype=dtype)
    decay = -torch.rand(B, H, T, generator=g, dtype=dtype) * 0.5  # log decay <= 0
    beta = torch.rand(B, H, T, generator=g, dtype=dtype)
    return q, k, v, decay, beta


def naive(q, k, v, g, beta, S=None):
    """S_t = e^{g_t} S_{t-1} + k_t (beta_t (v_t - e^{g_t} S_{t-1}^T k_t))^T; o_t = S_t^T q_t, per (b, h),
    with explicit matrices (the paper's eq. for the gated delta rule)."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    out = torch.zeros(B, H, T, dv, dtype=q.dtype)
    final = torch.zeros(B, H, dk, dv, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            St = torch.zeros(dk, dv, dtype=q.dtype) if S is None else S[b, h].clone()
            for t in range(T):
                kt, vt = k[b, h, t], v[b, h, t]
                decayed = torch.exp(g[b, h, t]) * St
                St = decayed + torch.outer(kt, beta[b, h, t] * (vt - decayed.T @ kt))
                out[b, h, t] = St.T @ q[b, h, t]
            final[b, h] = St
    return out, final


@pytest.mark.parametrize("chunk", [1, 3, 4, 16])
def test_chunked_equals_recurrent_equals_the_loop(chunk):
    q, k, v, g, beta = inputs()
    want, want_S = naive(q, k, v, g, beta)
    o, S = gated_delta_recurrent(q, k, v, g, beta)
    assert torch.allclose(o, want, atol=1e-12) and torch.allclose(S, want_S, atol=1e-12)
    o, S = gated_delta_chunked(q, k, v, g, beta, chunk=chunk)
    assert torch.allclose(o, want, atol=1e-10) and torch.allclose(S, want_S, atol=1e-10)


def test_a_carried_state_continues_the_sequence():
    q, k, v, g, beta = inputs(T=12)
    whole, S_whole = gated_delta_chunked(q, k, v, g, beta, chunk=5)
    first, S1 = gated_delta_chunked(q[:, :, :7], k[:, :, :7], v[:, :, :7], g[:, :, :7], beta[:, :, :7], chunk=4)
    second, S2 = gated_delta_recurrent(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], g[:, :, 7:], beta[:, :, 7:], S1)
    assert torch.allclose(torch.cat([first, second], 2), whole, atol=1e-10) and torch.allclose(S2, S_whole, atol=1e-10)
    want, _ = naive(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], g[:, :, 7:], beta[:, :, 7:], S1)
    assert torch.allclose(second, want, atol=1e-10)


def test_no_decay_and_beta_one_by_hand():
    """g = 0, beta = 1, orthonormal keys: the state stores v_t under k_t exactly (the delta rule writes what
    is missing), so a query equal to a key recalls its value; writing the same key again replaces it."""
    dk = dv = 2
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)[None, None]
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.float64)[None, None]
    q = k.clone()
    o, S = gated_delta_chunked(
        q, k, v, torch.zeros(1, 1, 3, dtype=torch.float64), torch.ones(1, 1, 3, dtype=torch.float64), chunk=2
    )
    assert o[0, 0].tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert S[0, 0].tolist() == [[5.0, 6.0], [3.0, 4.0]] and (dk, dv) == S.shape[-2:]


def test_gradients_by_gradcheck():
    q, k, v, g, beta = inputs(B=1, H=1, T=5, dk=3, dv=2)
    args = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
    assert torch.autograd.gradcheck(lambda *a: gated_delta_chunked(*a, chunk=2)[0], args)


def test_layer_decoded_with_its_state_equals_its_forward():
    torch.manual_seed(0)
    layer = GatedDeltaNet(d_model=16, n_k_heads=2, n_v_heads=4, d_k=4, d_v=3, conv_kernel=4, chunk=4).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    full = layer(x)
    state: dict = {}
    pieces = [layer(x[:, :6], state)] + [layer(x[:, t : t + 1], state) for t in range(6, 13)]
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)
    assert state["S"].shape == (2, 4, 4, 3) and state["conv"].shape == (2, 2 * 2 * 4 + 4 * 3, 3)
    assert layer.state_bytes() == 4 * ((16 + 12) * 3 + 4 * 4 * 3)
    assert full.abs().max() > 1e-3  # not a comparison of zeros
    # causal: changing a later token leaves the earlier outputs alone
    x2 = x.clone()
    x2[:, 9] += 1.0
    assert torch.equal(layer(x2)[:, :9], full[:, :9]) or torch.allclose(layer(x2)[:, :9], full[:, :9], atol=1e-12)
    assert not torch.allclose(layer(x2)[:, 9:], full[:, 9:], atol=1e-6)


def test_layer_refuses_heads_that_do_not_group():
    with pytest.raises(ValueError, match="n_v_heads=3 must be a multiple of n_k_heads=2"):
        GatedDeltaNet(16, 2, 3, 4, 4)
    with pytest.raises(ValueError, match="chunk=0"):
        gated_delta_chunked(*inputs(), chunk=0)


def test_layer_equals_hugging_face_qwen3_next_gated_deltanet():
    """The layer against transformers' ``Qwen3NextGatedDeltaNet`` (its torch chunked path) with the same
    weights: HF's in_proj_qkvz holds each key head's group [q; k; v of its value heads; z of them] and
    in_proj_ba [b; a] per group, regrouped here into lmlab's [q | k | v | z | b | a] rows."""
    qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    Hk, Hv, dk, dv, d, K = 2, 4, 8, 6, 32, 4
    r = Hv // Hk
    cfg = Qwen3NextConfig(
        hidden_size=d,
        linear_num_key_heads=Hk,
        linear_num_value_heads=Hv,
        linear_key_head_dim=dk,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=K,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
    )
    torch.manual_seed(0)
    ref = qn.Qwen3NextGatedDeltaNet(cfg, 0).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.3)
        ref.A_log.copy_(torch.rand(Hv).mul(2).log())
    ours = GatedDeltaNet(d, Hk, Hv, dk, dv, K, chunk=5, norm_eps=cfg.rms_norm_eps).eval()
    W = ref.in_proj_qkvz.weight.view(Hk, 2 * dk + 2 * r * dv, d)
    ba = ref.in_proj_ba.weight.view(Hk, 2 * r, d)
    rows = [W[:, :dk], W[:, dk : 2 * dk], W[:, 2 * dk : 2 * dk + r * dv], W[:, 2 * dk + r * dv :], ba[:, :r], ba[:, r:]]
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([x.reshape(-1, d) for x in rows]))
        ours.conv_weight.copy_(ref.conv1d.weight)
        ours.A_log.copy_(ref.A_log)
        ours.dt_bias.copy_(ref.dt_bias)
        ours.norm.weight.copy_(ref.norm.weight)
        ours.out.weight.copy_(ref.out_proj.weight)
    x = torch.randn(2, 19, d, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, mine = ref(x), ours(x)
    assert theirs.abs().max() > 0.05
    assert torch.allclose(mine, theirs, atol=1e-5), float((mine - theirs).abs().max())


# --- the layer in a model: layer_pattern 'D' (lmlab.config, lmlab.model.transformer, KVCache, analysis) ------

from lmlab.analysis import analyze, kv_cache_bytes  # noqa: E402
from lmlab.config import ConfigError, ModelConfig  # noqa: E402
from lmlab.generate import generate, generate_batch  # noqa: E402
from lmlab.model import TransformerLM  # noqa: E402
from lmlab.model.attention import KVCache  # noqa: E402
from lmlab.param_counts import linear_layer_params, param_counts  # noqa: E402


def hybrid(pattern="DDDG", **kw):
    base = dict(
        vocab_size=61,
        context_length=40,
        d_model=32,
        n_layers=4,
        n_heads=4,
        layer_pattern=pattern,
        linear_n_k_heads=2,
        linear_n_v_heads=4,
        linear_k_head_dim=8,
        linear_v_head_dim=6,
        linear_chunk=5,
    )
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("pattern,window", [("DDDG", None), ("LDG", 6), ("D", None)])
def test_hybrid_model_prefill_then_decode_equals_its_forward(pattern, window):
    """Prefill 9 tokens, then 12 one-token steps with the cache: the hidden states equal one forward over the
    21 tokens (a float64 model), for Qwen3-Next's 3:1 hybrid, a windowed + linear + full mix, and linear layers only."""
    torch.manual_seed(0)
    cfg = hybrid(pattern, n_layers=5, sliding_window=window)
    model = TransformerLM(cfg).double().eval()
    assert [b.linear for b in model.blocks] == [cfg.layer_pattern[i % len(pattern)] == "D" for i in range(5)]
    x = torch.randint(0, cfg.vocab_size, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model.hidden(x)
        cache = KVCache(cfg, 2, 21, dtype=torch.float64)
        steps = [model.hidden(x[:, :9], cache)] + [model.hidden(x[:, t : t + 1], cache) for t in range(9, 21)]
    # the norms compute in fp32 whatever the model's dtype (as Meta's and HF's do), so last-bit differences of
    # the two fp64 paths can round to neighbouring fp32 values there: equal to fp32 resolution (2.4e-7 seen
    # on a Zen 4 EPYC, 0 on a Xeon); a wrong cache is off by orders of magnitude more
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-6), float((torch.cat(steps, 1) - full).abs().max())
    assert full.abs().max() > 0.1
    S = cache.linear_state(next(i for i in range(5) if cfg.layer_is_linear(i)))["S"]
    assert S.shape == (2, 4, 8, 6) and S.dtype == torch.float64 and S.abs().max() > 0


def test_left_padded_batch_and_generation_equal_each_prompt_alone():
    torch.manual_seed(0)
    model = TransformerLM(hybrid()).eval()
    prompts = [[5, 9, 2, 7, 7, 1, 30, 4, 8, 8, 3], [11, 3, 60], [42]]
    with torch.no_grad():
        from lmlab.generate import left_pad_batch

        ids, pad = left_pad_batch(prompts)
        batched = model(ids, left_pad=pad)
        for row, p in enumerate(prompts):
            alone = model(torch.tensor([p]))
            assert torch.allclose(batched[row, -len(p) :], alone[0], atol=1e-5)
    greedy = generate_batch(model, prompts, 8, temperature=0.0)
    assert greedy == [list(generate(model, p, 8, temperature=0.0)) for p in prompts]


def test_hybrid_trains_every_linear_parameter_and_bf16_autocast_stays_close():
    torch.manual_seed(0)
    model = TransformerLM(hybrid())
    x = torch.randint(0, 61, (3, 23), generator=torch.Generator().manual_seed(2))
    loss, _ = model(x, targets=x)
    loss.backward()
    for name, p in model.blocks[0].attn.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(x)
    with torch.no_grad():
        high = model(x)
    assert (low - high).abs().max() < 0.05 * high.abs().max()


def test_linear_layer_parameters_are_grouped_as_their_reference_does():
    """A_log and dt_bias carry no weight decay (flash-linear-attention marks them _no_weight_decay), the gated
    norm's weight is a norm; the 3-D depthwise convolution is not a matrix for Muon."""
    from lmlab.optim import muon_parameters, param_kind

    model = TransformerLM(hybrid())
    kinds = {n: param_kind(n) for n, _ in model.blocks[0].named_parameters(prefix="blocks.0")}
    assert kinds["blocks.0.attn.A_log"] == kinds["blocks.0.attn.dt_bias"] == "bias"
    assert kinds["blocks.0.attn.norm.weight"] == "norm"
    assert kinds["blocks.0.attn.conv_weight"] == kinds["blocks.0.attn.in_proj.weight"] == "weight"
    muon = {id(p) for p in muon_parameters(model)}
    assert id(model.blocks[0].attn.in_proj.weight) in muon and id(model.blocks[0].attn.conv_weight) not in muon


@pytest.mark.parametrize("pattern", ["DDDG", "D", "GD", "LDDG"])
def test_analysis_counts_equal_the_model_and_the_cache(pattern):
    """Parameters by formula = the instantiated model's; state + KV bytes by formula = a real cache's bytes
    after decoding ``context`` tokens (fp32 cache: S is fp32 either way)."""
    cfg = hybrid(pattern, n_layers=6, sliding_window=5 if "L" in pattern else None)
    res = analyze(cfg)
    assert res["instantiated"]["equal"], (res["instantiated"], res["params"]["total"])
    model = TransformerLM(cfg).eval()
    cache = KVCache(cfg, 2, 12)
    with torch.no_grad():
        model(torch.randint(0, 61, (2, 12)), cache)
    kv = kv_cache_bytes(cfg, 12, batch=2, dtype="fp32")
    assert kv["total"] == cache.nbytes
    n_linear = sum(cfg.layer_is_linear(i) for i in range(6))
    assert kv["state_total"] == 2 * n_linear * (4 * (2 * 2 * 8 + 4 * 6) * 3 + 4 * 4 * 8 * 6)  # by hand


def test_linear_layer_flops_match_torch_flop_counter():
    """The layer's matmul FLOPs (projections + depthwise convolution) and its recurrence's two matrix-vector
    products (recall, read: 4 d_k d_v per value head) as torch's FlopCounterMode counts one decoded token;
    the analysis adds the state's decay and rank-1 write (3 d_k d_v), which are elementwise."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = hybrid("D")
    layer = TransformerLM(cfg).blocks[0].attn.eval()
    state: dict = {}
    with torch.no_grad():
        layer(torch.randn(1, 3, 32), state)
        with FlopCounterMode(display=False) as counter:
            layer(torch.randn(1, 1, 32), state)
    lin = linear_layer_params(cfg)
    assert counter.get_total_flops() == 2 * lin["attention_matmul"] + 4 * 4 * 8 * 6
    assert lin["recurrence_flops"] == 7 * 4 * 8 * 6
    # by hand: in_proj 32 -> (q 16 + k 16 + v 24 + z 24 + b 4 + a 4), out 24 -> 32, convolution 56 x 4
    assert lin["attention_matmul"] == 32 * 88 + 24 * 32 + 56 * 4
    assert param_counts(cfg)["matmul"] == 4 * (lin["attention_matmul"] + 3 * 32 * cfg.d_ff) + 61 * 32


def test_config_refuses_what_linear_layers_do_not_go_with():
    with pytest.raises(ConfigError, match="'D' \\(linear attention\\)"):
        hybrid("DXG")
    with pytest.raises(ConfigError, match="linear_n_v_heads=3 must be a multiple of linear_n_k_heads=2"):
        hybrid(linear_n_v_heads=3)
    with pytest.raises(ConfigError, match="kv_shared_layers=1"):
        hybrid(kv_shared_layers=1)
    with pytest.raises(ConfigError, match="attention='mla'"):
        hybrid(attention="mla", kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
    with pytest.raises(ConfigError, match="linear_attention"):
        hybrid(linear_attention="mamba2")


def test_compiled_layer_under_bf16_autocast_equals_the_eager_layer():
    """torch.compile of the layer in bf16 autocast (spec 16's training: its layer shapes, two chunks) gives
    the eager layer's outputs and gradients. Inductor (torch 2.13, CPU) compiled the whole layer here to NaN
    from the first step, so the recurrence is compiled apart (a graph break around it: lmlab.model.deltanet):
    three graphs, the one in the middle the recurrence alone (its triangular solve, none of the projections)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    layer = GatedDeltaNet(64, 2, 4, 32, 16, conv_kernel=4, chunk=64)
    x = torch.randn(2, 128, 64, generator=torch.Generator().manual_seed(1))
    outs, grads = [], []
    counter = CompileCounterWithBackend("inductor")
    for f in (layer, torch.compile(layer, backend=counter)):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = f(xi)
        y.float().square().mean().backward()
        outs.append(y.float())
        grads.append(xi.grad)
        layer.zero_grad()
    targets = [{str(n.target) for n in g.graph.nodes if n.op == "call_function"} for g in counter.graphs]
    assert counter.frame_count == 3, targets
    assert [any("solve_triangular" in s for s in ts) for ts in targets] == [False, True, False], targets
    assert not any("linear" in s for s in targets[1]), targets[1]
    assert torch.isfinite(outs[1]).all() and torch.isfinite(grads[1]).all()
    assert (outs[1] - outs[0]).abs().max() < 0.02 * outs[0].abs().max()  # bf16 products fused differently
    assert (grads[1] - grads[0]).abs().max() < 0.02 * grads[0].abs().max()
