"""Gated DeltaNet (lmlab/model/deltanet.py): the chunked and recurrent forms of the gated delta rule against a
float64 loop written from the paper's update, for several chunk sizes and carried states; gradients by
gradcheck; the layer decoded with its state equal to its full forward; state bytes."""

import pytest
import torch

from lmlab.model.deltanet import GatedDeltaNet, gated_delta_chunked, gated_delta_recurrent


def inputs(B=2, H=3, T=11, dk=4, dv=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, H, T, dk, generator=g, dtype=dtype), dim=-1) * dk ** -0.5
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
    o, S = gated_delta_chunked(q, k, v, torch.zeros(1, 1, 3, dtype=torch.float64),
                               torch.ones(1, 1, 3, dtype=torch.float64), chunk=2)
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
    pieces = [layer(x[:, :6], state)] + [layer(x[:, t:t + 1], state) for t in range(6, 13)]
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
    cfg = Qwen3NextConfig(hidden_size=d, linear_num_key_heads=Hk, linear_num_value_heads=Hv, linear_key_head_dim=dk,
                          linear_value_head_dim=dv, linear_conv_kernel_dim=K, num_hidden_layers=1,
                          layer_types=["linear_attention"])
    torch.manual_seed(0)
    ref = qn.Qwen3NextGatedDeltaNet(cfg, 0).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.3)
        ref.A_log.copy_(torch.rand(Hv).mul(2).log())
    ours = GatedDeltaNet(d, Hk, Hv, dk, dv, K, chunk=5, norm_eps=cfg.rms_norm_eps).eval()
    W = ref.in_proj_qkvz.weight.view(Hk, 2 * dk + 2 * r * dv, d)
    ba = ref.in_proj_ba.weight.view(Hk, 2 * r, d)
    rows = [W[:, :dk], W[:, dk:2 * dk], W[:, 2 * dk:2 * dk + r * dv], W[:, 2 * dk + r * dv:], ba[:, :r], ba[:, r:]]
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([x.reshape(-1, d) for x in rows]))
        ours.conv_weight.copy_(ref.conv1d.weight[:, 0])
        ours.A_log.copy_(ref.A_log)
        ours.dt_bias.copy_(ref.dt_bias)
        ours.norm_weight.copy_(ref.norm.weight)
        ours.out.weight.copy_(ref.out_proj.weight)
    x = torch.randn(2, 19, d, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, mine = ref(x), ours(x)
    assert theirs.abs().max() > 0.05
    assert torch.allclose(mine, theirs, atol=1e-5), float((mine - theirs).abs().max())
