"""lmlab.kernels.linear: fp32 CPU linears on oneDNN, against fp64 references and F.linear."""

import dataclasses
import json
from functools import partial

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lmlab.kernels.linear as L
import lmlab.kernels.settings as S
from lmlab.config import ModelConfig
from lmlab.kernels.settings import KernelSettings
from lmlab.model import TransformerLM

pytestmark = pytest.mark.skipif(not L.onednn_available(), reason="no oneDNN linear op in this build")


ON = KernelSettings(onednn_fp32=True, blocked_attention_fp32=True)  # the path under test, on any CPU


def lin(*args, **kwargs) -> L.Linear:
    """An L.Linear set to take oneDNN (whatever this CPU's default: off on Intel's)."""
    m = L.Linear(*args, **kwargs)
    m.kernels = ON
    return m


def _ref(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(L.MIN_ROWS + 16,), (3, L.MIN_ROWS // 2 - 1)])
@pytest.mark.parametrize("d_in,d_out", [(24, 56), (56, 24)])  # both ways of weight_grad
def test_forward_and_gradients_match_fp64(bias, lead, d_in, d_out):
    torch.manual_seed(0)
    m = lin(d_in, d_out, bias=bias)
    x = torch.randn(*lead, d_in, requires_grad=True)
    assert L.uses_onednn(x, m.weight, True)
    y = m(x)
    assert y.shape == (*lead, d_out) and y.dtype == torch.float32
    g = torch.randn_like(y)
    y.backward(g)
    xd = x.detach().double().requires_grad_()
    wd = m.weight.detach().double().requires_grad_()
    bd = m.bias.detach().double().requires_grad_() if bias else None
    yd = F.linear(xd, wd, bd)
    yd.backward(g.double())
    torch.testing.assert_close(y.double(), yd, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), xd.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.weight.grad.double(), wd.grad, rtol=1e-5, atol=1e-5)
    assert m.weight.grad.is_contiguous()
    if bias:
        torch.testing.assert_close(m.bias.grad.double(), bd.grad, rtol=1e-5, atol=1e-5)


def test_op_passes_torch_library_checks():
    """Schema, fake (meta) implementation, autograd registration and dispatch, as torch checks them."""
    torch.manual_seed(0)
    x = torch.randn(32, 8, requires_grad=True)
    w = torch.randn(12, 8, requires_grad=True)
    b = torch.randn(12, requires_grad=True)
    torch.library.opcheck(L.onednn_linear, (x, w, b))
    torch.library.opcheck(L.onednn_linear, (x, w, None))
    g = torch.randn(32, 12)
    torch.library.opcheck(L.onednn_grad_input, (g, w.detach()))
    for d_out in (12, 4):  # both orders of onednn_grad_weight's product
        torch.library.opcheck(L.onednn_grad_weight, (torch.randn(32, d_out), x.detach()))
        torch.testing.assert_close(
            L.onednn_grad_weight(torch.ones(32, d_out), x.detach()), torch.ones(32, d_out).t() @ x.detach()
        )


def test_runs_the_onednn_op(monkeypatch):
    """The path is really taken (the op is called) for a large fp32 input, and not for one row."""
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def __getattr__(self, name):
            return getattr(torch.ops.mkldnn, name)

        def _linear_pointwise(self, *args):
            calls.append(tuple(args[0].shape))
            return real(*args)

    monkeypatch.setattr(L.torch.ops, "mkldnn", Spy(), raising=False)
    m = lin(8, 4)
    m(torch.randn(L.MIN_ROWS, 8))
    assert calls == [(L.MIN_ROWS, 8)]
    m(torch.randn(1, 8))
    assert calls == [(L.MIN_ROWS, 8)]


def test_when_it_applies():
    w = torch.randn(4, 8)
    big = torch.randn(L.MIN_ROWS, 8)
    assert L.uses_onednn(big, w, True)
    assert not L.uses_onednn(torch.randn(L.MIN_ROWS - 1, 8), w, True)  # matrix-vector sizes stay on MKL
    assert not L.uses_onednn(big.bfloat16(), w.bfloat16(), True)
    assert not L.uses_onednn(big.double(), w.double(), True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not L.uses_onednn(big, w, True)  # autocast's bf16 matmul (already oneDNN)
    assert not L.uses_onednn(big, w, False)  # the model's settings turn it off


def test_autocast_output_dtype_unchanged():
    m = lin(8, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(torch.randn(32, 8)).dtype == torch.bfloat16


def test_is_an_nn_linear_with_the_same_state_dict():
    torch.manual_seed(1)
    a = nn.Linear(8, 4)
    torch.manual_seed(1)
    b = lin(8, 4)
    assert isinstance(b, nn.Linear)
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_compiled_in_one_graph_and_gradients_match():
    torch.manual_seed(0)
    m = lin(16, 32)
    x = torch.randn(4, L.MIN_ROWS, 16, requires_grad=True)
    assert L.uses_onednn(x, m.weight, True)
    f = torch.compile(lambda x: torch.relu(m(x)).square().sum(), fullgraph=True)  # fails on a graph break
    f(x).backward()
    got = (x.grad.clone(), m.weight.grad.clone(), m.bias.grad.clone())
    x.grad = m.weight.grad = m.bias.grad = None
    torch.relu(F.linear(x, m.weight, m.bias)).square().sum().backward()
    for a, b in zip(got, (x.grad, m.weight.grad, m.bias.grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_vmap_over_inputs_and_stacked_weights():
    from torch.func import vmap

    torch.manual_seed(0)
    xs = torch.randn(3, L.MIN_ROWS + 6, 16)
    assert L.uses_onednn(xs[0], torch.randn(32, 16), True)  # each member's product is one for the op
    ws, bs = torch.randn(3, 32, 16), torch.randn(3, 32)
    want = xs @ ws.transpose(1, 2) + bs[:, None]
    torch.testing.assert_close(vmap(partial(L.linear, onednn=True))(xs, ws, bs), want)
    torch.testing.assert_close(
        vmap(partial(L.linear, onednn=True), in_dims=(0, None, None))(xs, ws[0], bs[0]), xs @ ws[0].t() + bs[0]
    )


def test_training_steps_agree_with_the_mkl_path():
    """Four AdamW steps of a small model with oneDNN linears and with F.linear: the same losses to
    fp32 rounding (the two differ only in summation order)."""
    cfg = ModelConfig(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4)
    x = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(0))

    def losses(flag):
        torch.manual_seed(0)
        model = TransformerLM(cfg, kernels=KernelSettings(onednn_fp32=flag, blocked_attention_fp32=True))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        out = []
        for _ in range(4):
            loss, _ = model(x[:, :-1], targets=x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    a, b = losses(True), losses(False)
    assert a[-1] < a[0] - 0.1  # it trains
    assert a == pytest.approx(b, rel=1e-5)


def test_strided_bias_is_read_as_its_values():
    """oneDNN reads a bias as contiguous: a strided view (a vmap member's slice, a loaded view) must
    be made contiguous first, or [0, 2, 4, 6] would be read as [0, 1, 2, 3]."""
    torch.manual_seed(0)
    x, w = torch.randn(L.MIN_ROWS, 8), torch.randn(4, 8)
    bias = torch.arange(8.0)[::2]
    assert L.uses_onednn(x, w, True)
    torch.testing.assert_close(L.linear(x, w, bias, onednn=True), F.linear(x, w, bias))


def test_gradients_of_gradients():
    """create_graph=True through both gradient ops, against the same in float64 with F.linear."""
    torch.manual_seed(0)
    m = lin(8, 6)
    x = torch.randn(L.MIN_ROWS, 8)

    def second(fn, x, w):
        xg = x.clone().requires_grad_()
        gx, gw = torch.autograd.grad(fn(xg).square().sum(), (xg, w), create_graph=True)
        return (
            *torch.autograd.grad(gx.square().sum(), (xg, w), retain_graph=True),  # grad_input
            *torch.autograd.grad(gw.square().sum(), (xg, w)),
        )  # grad_weight

    w64 = m.weight.detach().double().requires_grad_()
    got = second(m, x, m.weight)
    want = second(lambda t: F.linear(t, w64, m.bias.detach().double()), x.double(), w64)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_forward_mode_and_func_transforms_fall_back():
    """Forward-mode AD and torch.func.grad have no rule for the custom ops: F.linear is used (a zero
    tangent or an error otherwise)."""
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(0)
    m = lin(8, 4)
    x = torch.randn(L.MIN_ROWS, 8)
    want = F.linear(torch.ones_like(x), m.weight)
    torch.testing.assert_close(torch.func.jvp(m, (x,), (torch.ones_like(x),))[1], want)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(m(fwAD.make_dual(x, torch.ones_like(x)))).tangent
    torch.testing.assert_close(tangent, want)
    xr = x.clone().requires_grad_()
    (want_grad,) = torch.autograd.grad(F.linear(xr, m.weight, m.bias).square().sum(), xr)
    torch.testing.assert_close(torch.func.grad(lambda t: m(t).square().sum())(x), want_grad)


def _calibration(
    onednn: bool, blocked: bool, identity: dict, decode=(), reductions=(), threads=(), apart=False, frozen=()
) -> dict:
    """A calibration record; ``decode`` None: one measured before the decode layout was calibrated,
    ``reductions`` None: before the compiled step's reductions were, ``threads`` None: before the decode
    threads were, ``frozen`` None: before the compiled step's freezing was; ``apart``: threads measured
    apart from the layout (no 'one row' cells)."""
    choices = {"onednn_fp32": onednn, "blocked_attention_fp32": blocked}
    if decode is not None:
        choices["decode_layout"] = list(decode)
    if reductions is not None:
        choices["decode_reductions"] = list(reductions)
    if threads is not None:
        choices["decode_threads"] = list(threads)
    if frozen is not None and decode is not None:
        choices["decode_frozen"] = list(frozen)
    return {
        "version": S.CALIBRATION_VERSION,
        "identity": identity,
        "date": "2026-12-05T01:00:00+00:00",
        "choices": choices,
        "cells": [] if apart or threads is None else [{"decision": "one row eager batch 1", "shape": "demo d256"}],
    }


def test_the_defaults_are_this_machines_calibration_or_torchs(tmp_path, monkeypatch, capsys):
    """No vendor rule: default_kernels reads the calibration measured on this CPU model and torch
    version; without one (or with one from another CPU, or a damaged one, each said on stderr) it
    takes torch's own kernels (MKL linears, SDPA attention)."""
    from lmlab.kernels.calibrate import cache_path

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "model name\t: AMD EPYC 9R14\n\nprocessor\t: 1\nmodel name\t: other\n"
    )
    ident = S.cpu_identity(str(info))
    assert (ident["cpu"], ident["family"], ident["model"], ident["torch"]) == (
        "AMD EPYC 9R14",
        "25",
        "17",
        torch.__version__,
    )
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
    here = S.cpu_identity()
    path = cache_path(here)
    assert path.parent == tmp_path / "cache" / "kernels" and here["family"] in path.name
    S.default_kernels.cache_clear()
    try:
        assert S.default_kernels() == KernelSettings(False, False) and "uncalibrated" in S.default_kernels().source
        path.parent.mkdir(parents=True)
        for onednn, blocked in ((True, False), (False, True)):
            path.write_text(json.dumps(_calibration(onednn, blocked, here)))
            S.default_kernels.cache_clear()
            assert S.default_kernels() == KernelSettings(onednn, blocked)
            assert "calibrated on this CPU 2026-12-05" in S.default_kernels().describe()
        measured = [
            {"cell": "bf16 batch 1", "weights": 4_000_000, "packed": True},
            {"cell": "fp32 batch 2+", "weights": 4_000_000, "packed": False},
            {"cell": "fp32 batch 2+", "weights": 20_000_000, "packed": True},
        ]
        path.write_text(json.dumps(_calibration(False, True, here, decode=measured)))
        S.default_kernels.cache_clear()
        assert S.default_kernels().decode_layout == (
            ("bf16 batch 1", 4_000_000, True),
            ("fp32 batch 2+", 4_000_000, False),
            ("fp32 batch 2+", 20_000_000, True),
        )
        assert "oneDNN-packed for fp32 batch 2+ at 20.0M, bf16 batch 1 at 4.0M weights, transposed otherwise" in (
            S.default_kernels().describe_decode()
        )
        record = _calibration(False, True, here, decode=measured)
        record["choices"]["decode_reductions"] = [{"cell": "fp32 batch 1", "weights": 4_000_000, "on": True}]
        path.write_text(json.dumps(record))
        S.default_kernels.cache_clear()
        assert S.default_kernels().decode_reductions == (("fp32 batch 1", 4_000_000, True),)
        assert "the compiled step by fused reductions for fp32 batch 1 at 4.0M weights" in (
            S.default_kernels().describe_decode()
        )
        record["choices"]["decode_threads"] = [
            {"cell": "compiled batch 1", "weights": 4_000_000, "threads": 2},
            {"cell": "eager batch 1", "weights": 4_000_000, "threads": 1},
        ]
        path.write_text(json.dumps(record))
        S.default_kernels.cache_clear()
        assert S.default_kernels().decode_threads == (
            ("compiled batch 1", 4_000_000, 2),
            ("eager batch 1", 4_000_000, 1),
        )
        assert "one prompt decoded on 2 threads for compiled batch 1 at 4.0M weights, one thread otherwise" in (
            S.default_kernels().describe_decode()
        )
        for bad in (
            [{"cell": "fp32 batch 1", "weights": 10, "threads": 2}],  # a layout cell, not a threads one
            [{"cell": "eager batch 1", "weights": 10, "on": True}],
            [{"cell": "eager batch 1", "weights": 10, "threads": True}],  # a choice, not a thread count
            [{"cell": "eager batch 1", "weights": 10, "threads": 0}],
            [
                {"cell": "eager batch 1", "weights": 10, "threads": 2},
                {"cell": "eager batch 1", "weights": 10, "threads": 1},
            ],
        ):
            record["choices"]["decode_threads"] = bad
            path.write_text(json.dumps(record))
            S.default_kernels.cache_clear()
            assert S.default_kernels() == KernelSettings(False, False), bad
            assert f"{path} is not a kernel calibration" in capsys.readouterr().err
        # threads measured apart from the layout (a calibration of before 2026-12-07, no 'one row' cells): not
        # used, and said
        record["choices"]["decode_threads"] = [{"cell": "eager batch 1", "weights": 4_000_000, "threads": 2}]
        path.write_text(json.dumps({**record, "cells": [{"decision": "decode_threads eager batch 1"}]}))
        S.default_kernels.cache_clear()
        assert not S.default_kernels().decode_threads and S.default_kernels().decode_reductions
        assert "decode threads measured apart from the layout, not used" in S.default_kernels().describe_decode()
        del record["choices"]["decode_threads"]  # an older calibration: said, and the fixed rule
        path.write_text(json.dumps(record))
        S.default_kernels.cache_clear()
        assert not S.default_kernels().decode_threads
        assert "decode threads not calibrated" in S.default_kernels().describe_decode()
        for bad in (
            [{"cell": "fp32 batch 2+", "weights": 10, "on": True}],
            [{"cell": "fp32 batch 1", "weights": 10}],
            [{"cell": "fp32 batch 1", "weights": 10**320, "on": True}],  # beyond a float: a damaged file
        ):
            record["choices"]["decode_reductions"] = bad
            path.write_text(json.dumps(record))
            S.default_kernels.cache_clear()
            assert S.default_kernels() == KernelSettings(False, False), bad
            assert f"{path} is not a kernel calibration" in capsys.readouterr().err
        path.write_text(json.dumps(_calibration(False, True, here, decode=None, reductions=None)))  # older
        S.default_kernels.cache_clear()
        assert S.default_kernels() == KernelSettings(False, True) and not S.default_kernels().decode_layout
        assert "decode not calibrated (`lmlab bench calibrate` measures it)" in S.default_kernels().describe_decode()
        for bad in (
            {"cell": "fp16 batch 1", "weights": 10, "packed": True},  # no such cell
            {"cell": "fp32 batch 1", "weights": 0, "packed": True},
            {"cell": "fp32 batch 1", "weights": 10, "packed": "yes"},
            {"cell": "fp32 batch 1", "weights": 10},
        ):
            path.write_text(json.dumps(_calibration(False, True, here, decode=[bad])))
            S.default_kernels.cache_clear()
            assert S.default_kernels() == KernelSettings(False, False), bad
            assert f"{path} is not a kernel calibration" in capsys.readouterr().err
        path.write_text(json.dumps(_calibration(True, True, {**here, "model": "other"})))
        S.default_kernels.cache_clear()
        assert S.default_kernels() == KernelSettings(False, False)
        assert "was measured on" in capsys.readouterr().err
        path.write_text('{"version": 1, "choices": {"onednn_fp32": "yes"')
        S.default_kernels.cache_clear()
        assert S.default_kernels() == KernelSettings(False, False)
        assert f"{path} is not a kernel calibration" in capsys.readouterr().err
    finally:
        S.default_kernels.cache_clear()


def test_calibration_takes_a_kernel_when_its_cells_measure_faster(monkeypatch, tmp_path):
    """The decision rule on given cell ratios (on / off): the geometric mean below 1 turns a kernel on;
    the record names every cell and is written atomically where it is asked to be."""
    from lmlab.kernels import calibrate as C

    # geometric means 0.938 (on: more than MIN_GAIN faster), 1.020 (off); then 0.990 (a tie: off)
    ratios = {"onednn_fp32": [0.8, 1.1], "blocked_attention_fp32": [1.3, 0.8]}
    calls = []

    def fake(fields, batch, threads, on, off, rounds):
        decision = "onednn_fp32" if on.onednn_fp32 != off.onednn_fp32 else "blocked_attention_fp32"
        calls.append((decision, threads, on))
        r = ratios[decision][sum(c[0] == decision for c in calls) - 1]
        return {"ratio": r, "q1": r, "q3": r, "rounds": rounds, "steps": 1, "on_ms": r, "off_ms": 1.0}

    # decode: packed/transposed per cell, at the demo shape then the d768 one (each decided alone); the fp32
    # batch-1 cells are measured with the threads (below), never here
    decode = {"fp32 batch 2+": [1.3, 0.87], "bf16 batch 1": [0.949, 0.951], "bf16 batch 2+": [1.2, 1.2]}
    decode_calls = []

    def fake_decode(fields, batch, threads, dtype, rounds, base):
        name = S.decode_cell(dtype, batch)
        decode_calls.append((name, threads, fields["d_model"], base))
        r = decode[name][len([c for c in decode_calls if c[0] == name]) - 1]
        w = fields["d_model"] * 1000
        return {"ratio": r, "q1": r, "q3": r, "rounds": rounds, "steps": 1, "on_ms": r, "off_ms": 1.0, "weights": w}

    # the compiled step's reductions/transposed at batch 1: bf16 here, the demo shape then the d768 one
    reduction = {"bf16 batch 1": [0.6, 0.96]}
    reduction_calls = []

    def fake_reduction(fields, dtype, rounds, base, threads=1):
        name = S.decode_cell(dtype, 1)
        reduction_calls.append((name, fields["d_model"], base, threads))
        r = reduction[name][len([c for c in reduction_calls if c[0] == name]) - 1]
        w = fields["d_model"] * 1000
        return {"ratio": r, "q1": r, "q3": r, "rounds": rounds, "steps": 1, "on_ms": r, "off_ms": 1.0, "weights": w}

    # the frozen compiled step against the compiled step just chosen, bf16 batch 1: no gain at d256, 0.8 at d768
    frozen = [0.99, 0.8]
    frozen_calls = []

    def fake_frozen(fields, rounds, off, threads=1):
        frozen_calls.append((fields["d_model"], off, threads))
        r = frozen[len(frozen_calls) - 1]
        w = fields["d_model"] * 1000
        return {"ratio": r, "q1": r, "q3": r, "rounds": rounds, "steps": 1, "on_ms": r, "off_ms": 1.0, "weights": w}

    # one prompt, fp32: (threads, alternative) settings' ratios to (1 thread, transposed), eager at the decode
    # shapes (alternative: packed), compiled at the reduction ones (alternative: reductions)
    one_row = {
        # d256: packed alone 0.9 wins; the second thread gains 2% over transposed and 4% over packed: not taken
        ("eager batch 1", 256): {(1, False): 1.0, (3, False): 0.98, (1, True): 0.9, (3, True): 0.864},
        # d768: a second thread gains nothing over transposed (1.0) but 30% over packed (0.95 -> 0.665)
        ("eager batch 1", 768): {(1, False): 1.0, (3, False): 1.0, (1, True): 0.95, (3, True): 0.665},
        # d256: reductions on one thread, 0.87; every core with them 0.8 (8% more): both changes
        ("compiled batch 1", 256): {(1, False): 1.0, (3, False): 0.96, (1, True): 0.87, (3, True): 0.8},
        # d768: the second thread 0.7 over transposed, the reductions lose: every core, transposed
        ("compiled batch 1", 768): {(1, False): 1.0, (3, False): 0.7, (1, True): 1.4, (3, True): 0.9},
    }
    one_row_calls = []

    def fake_one_row(fields, compile, cores, rounds, base, alternative=True):
        name = "compiled batch 1" if compile else "eager batch 1"
        one_row_calls.append((name, cores, fields, base, alternative))
        ratios = {k: r for k, r in one_row[name, fields["d_model"]].items() if (k[0] == 1 or cores > 1)}
        variants = {k: {"ratio": r, "q1": r, "q3": r, "ms": r} for k, r in ratios.items() if alternative or not k[1]}
        return {"variants": variants, "rounds": rounds, "steps": 1, "weights": fields["d_model"] * 1000}

    monkeypatch.setattr(C, "measure_cell", fake)
    monkeypatch.setattr(C, "measure_decode_cell", fake_decode)
    monkeypatch.setattr(C, "measure_reduction_cell", fake_reduction)
    monkeypatch.setattr(C, "measure_one_row_cell", fake_one_row)
    monkeypatch.setattr(C, "measure_frozen_cell", fake_frozen)
    monkeypatch.setattr(C, "physical_cores", lambda: 3)
    monkeypatch.setattr(C, "packed_decode_available", lambda: True)
    monkeypatch.setattr(L, "_AVAILABLE", True)
    record = C.calibrate(rounds=3, log=lambda s: None)
    packed = {("fp32 batch 1", 256), ("fp32 batch 1", 768), ("fp32 batch 2+", 768), ("bf16 batch 1", 256)}
    assert record["choices"] == {
        "onednn_fp32": True,
        "blocked_attention_fp32": False,
        "decode_layout": [
            {"cell": c, "weights": d * 1000, "packed": (c, d) in packed} for c in S.DECODE_CELLS for d in (256, 768)
        ],
        "decode_reductions": [  # on below 0.95
            {"cell": "fp32 batch 1", "weights": 256_000, "on": True},
            {"cell": "fp32 batch 1", "weights": 768_000, "on": False},
            {"cell": "bf16 batch 1", "weights": 256_000, "on": True},
            {"cell": "bf16 batch 1", "weights": 768_000, "on": False},
        ],
        "decode_threads": [
            {"cell": "eager batch 1", "weights": 256_000, "threads": 1},
            {"cell": "eager batch 1", "weights": 768_000, "threads": 3},
            {"cell": "compiled batch 1", "weights": 256_000, "threads": 3},
            {"cell": "compiled batch 1", "weights": 768_000, "threads": 3},
        ],
        "decode_frozen": [  # on below 0.95
            {"cell": "bf16 batch 1", "weights": 256_000, "on": False},
            {"cell": "bf16 batch 1", "weights": 768_000, "on": True},
        ],
    }
    # against the compiled step as the reductions decision chose it, on the compiled threads chosen (3)
    reduced = tuple((e["cell"], e["weights"], e["on"]) for e in record["choices"]["decode_reductions"])
    assert frozen_calls == [(d, KernelSettings(True, False, decode_reductions=reduced), 3) for d in (256, 768)]
    assert [(c["decision"], c["threads"]) for c in record["cells"][-2:]] == [("decode_frozen bf16 batch 1", 3)] * 2
    # measured first: every physical core against one thread with both layouts, at the shapes of the eager
    # and the compiled decode decisions, with the training kernels chosen
    assert [(c[0], c[1], c[2], c[4]) for c in one_row_calls] == [
        ("eager batch 1", 3, C.DECODE_SHAPES[0][1], True),
        ("eager batch 1", 3, C.DECODE_SHAPES[1][1], True),
        ("compiled batch 1", 3, C.REDUCTION_SHAPES[0][1], True),
        ("compiled batch 1", 3, C.REDUCTION_SHAPES[1][1], True),
    ]
    assert all(c[3] == KernelSettings(True, False) for c in one_row_calls)
    # each setting's figures recorded, four per shape
    assert [(c["decision"], c["threads"], c["setting"]) for c in record["cells"][4:8]] == [
        ("one row eager batch 1", t, f"{t} thread(s), {a}") for a in ("transposed", "packed") for t in (1, 3)
    ]
    assert [c["ratio"] for c in record["cells"][4:20]] == [r for v in one_row.values() for r in v.values()]
    # the bf16 reductions on the compiled threads chosen for each shape (3 at both)
    assert [(c[0], c[1], c[3]) for c in reduction_calls] == [("bf16 batch 1", d, 3) for d in (256, 768)]
    assert all(c[2] == KernelSettings(True, False) for c in reduction_calls)  # with the training kernels chosen
    assert [(c["decision"], c["threads"]) for c in record["cells"][-4:-2]] == [
        ("decode_reductions bf16 batch 1", 3)
    ] * 2
    # bf16 batch 1 on the eager threads chosen per shape (1 at d256, 3 at d768), batch 8 on every core; both
    # shapes per cell; fp32 batch 1 not measured again; with the training kernels chosen
    assert [(c[0], c[1], c[2]) for c in decode_calls] == [
        (name, (1 if d == 256 else 3) if "batch 1" in name else 3, d)
        for name in S.DECODE_CELLS
        if name != "fp32 batch 1"
        for d in (256, 768)
    ]
    assert all(c[3] == KernelSettings(True, False) for c in decode_calls)
    assert [c["decision"] for c in record["cells"][20:-4]] == [
        f"decode_layout {n}" for n in S.DECODE_CELLS if n != "fp32 batch 1" for _ in "ab"
    ]
    record = {**record, "cells": record["cells"][:4]}
    assert [c[1] for c in calls if c[0] == "blocked_attention_fp32"] == [1, 1]  # a one-thread path
    assert all(c[2].onednn_fp32 for c in calls if c[0] == "blocked_attention_fp32")  # with the linears chosen
    assert [(c["decision"], c["ratio"]) for c in record["cells"]] == [
        ("onednn_fp32", 0.8),
        ("onednn_fp32", 1.1),
        ("blocked_attention_fp32", 1.3),
        ("blocked_attention_fp32", 0.8),
    ]
    ratios["onednn_fp32"] = [0.98, 1.0]
    calls.clear()
    decode_calls.clear()
    reduction_calls.clear()
    one_row_calls.clear()
    frozen_calls.clear()
    frozen[:] = [0.99, 0.8, 0.99, 0.8]
    monkeypatch.setattr(C, "physical_cores", lambda: 1)
    one_core = C.calibrate(rounds=3, log=lambda s: None)
    assert one_core["choices"]["onednn_fp32"] is False and one_core["choices"]["decode_threads"] == []
    # one core: the fp32 batch-1 cells time the two layouts on one thread, and every batch-1 cell runs there
    assert [c[1] for c in one_row_calls] == [1] * 4
    assert [e["packed"] for e in one_core["choices"]["decode_layout"][:2]] == [True, False]  # 0.9; 0.95 is no gain
    assert {c[3] for c in reduction_calls} == {1} and {c[1] for c in decode_calls} == {1}
    calls.clear()
    decode_calls.clear()
    reduction_calls.clear()
    one_row_calls.clear()
    training_only = C.calibrate(rounds=3, log=lambda s: None, decode=False)  # make demo's: no decode step timed
    assert set(training_only["choices"]) == {"onednn_fp32", "blocked_attention_fp32"}
    assert not (decode_calls or reduction_calls or one_row_calls) and len(training_only["cells"]) == 4
    out = C.write_calibration(record, tmp_path / "k" / "cal.json")
    assert json.loads(out.read_text())["choices"] == record["choices"] and len(list(out.parent.iterdir())) == 1
    # without oneDNN packing the eager cells time the thread counts over transposed weights only
    monkeypatch.setattr(C, "packed_decode_available", lambda: False)
    monkeypatch.setattr(C, "physical_cores", lambda: 3)
    for seen in (calls, decode_calls, reduction_calls, one_row_calls):
        seen.clear()
    no_packing = C.calibrate(rounds=3, log=lambda s: None)
    assert [c[4] for c in one_row_calls] == [False, False, True, True] and no_packing["choices"]["decode_layout"] == []
    assert no_packing["choices"]["decode_threads"][:2] == [  # d256 0.98: one thread; d768 1.0: one thread
        {"cell": "eager batch 1", "weights": w, "threads": 1} for w in (256_000, 768_000)
    ]
    with pytest.raises(ValueError, match="rounds=2"):
        C.calibrate(rounds=2)


def test_a_calibration_cell_measures_real_steps():
    """One real cell at the lab's shape, two rounds of the smallest measurement: both settings train
    (finite step times) and the ratio is their per-round median."""
    from lmlab.kernels import calibrate as C

    fields = dict(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=2)
    cell = C.measure_cell(fields, 2, 1, KernelSettings(True, True), KernelSettings(False, False), rounds=3)
    assert cell["on_ms"] > 0 and cell["off_ms"] > 0 and cell["q1"] <= cell["ratio"] <= cell["q3"]


def test_the_nearest_measured_size_decides_the_decode_layout():
    """KernelSettings.decode_packs: the choice measured at the size nearest the model's, on a log scale
    (transposed on a tie and in a cell not measured); bad entries are refused naming the field."""
    k = KernelSettings(
        False, False, decode_layout=[("fp32 batch 2+", 4_000_000, False), ("fp32 batch 2+", 25_000_000, True)]
    )
    # the log midpoint of 4M and 25M is 10M
    assert [k.decode_packs("fp32 batch 2+", w) for w in (1, 3_000_000, 9_900_000, 10_100_000, 10**9)] == [
        False,
        False,
        False,
        True,
        True,
    ]
    assert not k.decode_packs("fp32 batch 2+", 10_000_000)  # a tie: transposed
    assert not k.decode_packs("fp32 batch 1", 10**9) and not k.decode_packs(None, 10**9)
    assert KernelSettings(False, False, decode_layout=[("bf16 batch 1", 7, True)]).decode_packs("bf16 batch 1", 10**9)
    for bad in ([("fp32 batch 3", 7, True)], [("fp32 batch 1", 0, True)], [("fp32 batch 1", 10**400, True)]):
        with pytest.raises(ValueError, match="decode_layout"):
            KernelSettings(False, False, decode_layout=bad)
    assert S.decode_cell(torch.float32, 1) == "fp32 batch 1" and S.decode_cell(torch.bfloat16, 5) == "bf16 batch 2+"
    # the compiled step's reductions: the same rule, batch-1 cells only
    k = KernelSettings(
        False, False, decode_reductions=[("fp32 batch 1", 4_000_000, True), ("fp32 batch 1", 25_000_000, False)]
    )
    assert [k.decode_reduces("fp32 batch 1", w) for w in (1, 9_900_000, 10_100_000)] == [True, True, False]
    assert not k.decode_reduces("bf16 batch 1", 1) and not k.decode_packs("fp32 batch 1", 1)
    with pytest.raises(ValueError, match="decode_reductions"):
        KernelSettings(False, False, decode_reductions=[("fp32 batch 2+", 7, True)])
    assert S.decode_cell(torch.float16, 1) is None
    # the frozen compiled step: the same rule, batch-1 cells only, named in the decode line
    k = KernelSettings(
        False, False, decode_frozen=[("bf16 batch 1", 4_000_000, False), ("bf16 batch 1", 50_000_000, True)]
    )
    assert [k.decode_freezes("bf16 batch 1", w) for w in (1, 14_000_000, 15_000_000, 10**9)] == [
        False,
        False,
        True,
        True,
    ]
    assert not k.decode_freezes("fp32 batch 1", 10**9) and not k.decode_reduces("bf16 batch 1", 10**9)
    assert "the compiled step frozen for bf16 batch 1 at 50.0M weights" in k.describe_decode()
    with pytest.raises(ValueError, match="decode_frozen"):
        KernelSettings(False, False, decode_frozen=[("bf16 batch 2+", 7, True)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_calibration_cell_decodes_packed_against_transposed(dtype, monkeypatch):
    """One real decode cell: 'on' decodes through oneDNN-packed copies of the weights (packed for the
    cell's batch), 'off' through transposed ones, both in the dtype asked; the ratio is their
    per-round median."""
    import lmlab.kernels.decode_layout as dl
    from lmlab.kernels import calibrate as C

    if not dl.packed_decode_available():
        pytest.skip("this PyTorch cannot pack for oneDNN")
    made = []
    real = dl._make_decode_copy
    monkeypatch.setattr(dl, "_make_decode_copy", lambda w, what: made.append((what, w.dtype)) or real(w, what))
    fields = dict(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=2)
    cell = C.measure_decode_cell(fields, 3, 1, dtype, 3, KernelSettings(False, False))
    assert cell["on_ms"] > 0 and cell["off_ms"] > 0 and cell["q1"] <= cell["ratio"] <= cell["q3"]
    assert {what for what, _ in made} == {("packed", 3), ("transposed",)} and {d for _, d in made} == {dtype}
    assert cell["weights"] == 32 * 96 + 32 * 32 + 3 * 32 * 128 + 64 * 32  # q|k|v, out, gate|up and down, LM head


def test_a_reduction_calibration_cell_times_both_compiled_steps(monkeypatch):
    """One real cell of the compiled step at batch 1: 'on' traces the products as reductions
    (decode_layout's ``_reduction_forward``), 'off' does not; both time finite steps and the ratio is their
    per-round median."""
    import lmlab.kernels.decode_layout as dl
    from lmlab.kernels import calibrate as C

    traced = []
    real = dl._reduction_forward
    monkeypatch.setattr(dl, "_reduction_forward", lambda self, x: traced.append(self) or real(self, x))
    fields = dict(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=2)
    cell = C.measure_reduction_cell(fields, torch.float32, 3, KernelSettings(False, False))
    assert cell["on_ms"] > 0 and cell["off_ms"] > 0 and cell["q1"] <= cell["ratio"] <= cell["q3"]
    assert cell["weights"] == 32 * 96 + 32 * 32 + 3 * 32 * 128 + 64 * 32
    assert len({id(m) for m in traced}) == 5  # q|k|v, out, gate|up, down, LM head: traced once each (one graph)


@pytest.mark.parametrize("compile", [False, True])
def test_a_one_row_calibration_cell_times_threads_and_layouts_together(compile, monkeypatch):
    """One real cell of one prompt's fp32 batch-1 decode: each of the four settings (one thread or two) x
    (transposed weights or the alternative: packed eager, reductions compiled) is built with its own kernels
    on its own thread count and steps there, in rounds whose order rotates; torch's thread count comes back
    after; every ratio is to (1 thread, transposed), which is exactly 1."""
    from lmlab.kernels import calibrate as C

    built, stepped = [], []
    real = C._decode_timer

    def recording(fields, batch, dtype, kernels, compile=False):
        built.append((torch.get_num_threads(), batch, dtype, kernels, compile))
        run = real(fields, batch, dtype, kernels, compile)
        return lambda n: stepped.append((torch.get_num_threads(), kernels)) or run(n)

    monkeypatch.setattr(C, "_decode_timer", recording)
    before = torch.get_num_threads()
    fields = dict(vocab_size=64, context_length=32, d_model=32, n_layers=1, n_heads=2)
    base = KernelSettings(False, False)
    cell = C.measure_one_row_cell(fields, compile, 2, 3, base)
    assert torch.get_num_threads() == before
    w = 32 * 96 + 32 * 32 + 3 * 32 * 128 + 64 * 32
    assert cell["weights"] == w and cell["rounds"] == 3
    keys = [(1, False), (2, False), (1, True), (2, True)]
    assert list(cell["variants"]) == keys and cell["variants"][1, False]["ratio"] == 1.0
    assert all(v["ms"] > 0 and v["q1"] <= v["ratio"] <= v["q3"] for v in cell["variants"].values())
    field = "decode_reductions" if compile else "decode_layout"
    settings = [dataclasses.replace(base, **{field: (("fp32 batch 1", w, a),)}) for _, a in keys]
    assert built == [(t, 1, torch.float32, k, compile) for (t, _), k in zip(keys, settings)]
    # warm-up in order, then 3 rounds, each starting one setting later
    order = [0, 1, 2, 3] + [0, 1, 2, 3] + [1, 2, 3, 0] + [2, 3, 0, 1]
    assert stepped == [(keys[i][0], settings[i]) for i in order]
    # without the alternative: the two thread counts over transposed weights
    assert list(C.measure_one_row_cell(fields, compile, 2, 3, base, alternative=False)["variants"]) == keys[:2]


def test_one_row_picks_a_change_only_where_it_gains_over_every_smaller_one():
    """pick_one_row: a setting needs MIN_GAIN over (1, False) and over each setting with a subset of its
    changes; the fastest such setting wins; none: (1, False)."""
    from lmlab.kernels import calibrate as C

    def v(**r):
        names = {"base": (1, False), "t": (2, False), "a": (1, True), "both": (2, True)}
        return {names[k]: {"ratio": x} for k, x in r.items()}

    assert C.pick_one_row(v(base=1.0, t=0.97, a=0.96, both=0.94)) == (1, False)  # no change gains 5%
    assert C.pick_one_row(v(base=1.0, t=1.0, a=0.95 * 0.99, both=0.93)) == (1, True)  # both: 2% over a
    assert C.pick_one_row(v(base=1.0, t=1.02, a=0.95, both=0.66)) == (2, True)  # the Zen 5 case
    assert C.pick_one_row(v(base=1.0, t=0.7, a=1.4, both=0.9)) == (2, False)
    assert C.pick_one_row(v(base=1.0, t=0.5, a=0.6, both=0.55)) == (2, False)  # the fastest qualifying
    assert C.pick_one_row(v(base=1.0, a=0.9)) == (1, True) and C.pick_one_row(v(base=1.0, t=0.96)) == (1, False)


def test_bench_calibrate_if_missing_keeps_a_valid_calibration(tmp_path, monkeypatch, capsys):
    """`lmlab bench calibrate --if-missing` with this machine's calibration present measures nothing
    and prints the kernels it names; --rounds below 3 is refused by argparse, naming the flag."""
    from lmlab.cli import main
    from lmlab.kernels import calibrate as C

    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    path = C.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_calibration(False, True, S.cpu_identity())))
    monkeypatch.setattr(C, "calibrate", lambda *a, **k: pytest.fail("measured although calibrated"))
    S.default_kernels.cache_clear()
    try:
        assert main(["bench", "calibrate", "--if-missing"]) == 0
        assert "fp32 attention blocked on one thread (calibrated on this CPU 2026-12-05)" in capsys.readouterr().out
        # a calibration from before the decode layout (or the compiled step's reductions) was measured is
        # measured again
        measured = [{"cell": "fp32 batch 2+", "weights": 5, "packed": True}]
        fresh = _calibration(True, False, S.cpu_identity(), decode=measured)
        monkeypatch.setattr(C, "calibrate", lambda *a, **k: fresh)
        olders = (
            dict(decode=None, reductions=None, threads=None),
            dict(reductions=None),
            dict(threads=None),
            dict(frozen=None),
        )
        for older in olders + (dict(apart=True),):
            path.write_text(json.dumps(_calibration(False, True, S.cpu_identity(), **older)))
            assert main(["bench", "calibrate", "--if-missing"]) == 0
            assert json.loads(path.read_text())["choices"]["decode_layout"] == measured
            assert S.default_kernels().decode_layout == (("fp32 batch 2+", 5, True),)
        # make demo's --training-only: a training-only calibration (or any valid one) is kept; without one,
        # only the training decisions are measured; a full --if-missing measures everything again
        asked = []
        trained = _calibration(True, True, S.cpu_identity(), decode=None, reductions=None, threads=None)
        monkeypatch.setattr(C, "calibrate", lambda rounds, log, decode=True: asked.append(decode) or trained)
        path.unlink()
        assert main(["bench", "calibrate", "--if-missing", "--training-only"]) == 0 and asked == [False]
        assert json.loads(path.read_text())["choices"] == {"onednn_fp32": True, "blocked_attention_fp32": True}
        assert main(["bench", "calibrate", "--if-missing", "--training-only"]) == 0 and asked == [False]  # kept
        assert "decode not calibrated (`lmlab bench calibrate` measures it)" in capsys.readouterr().out
        assert main(["bench", "calibrate", "--if-missing"]) == 0 and asked == [False, True]
    finally:
        S.default_kernels.cache_clear()
    with pytest.raises(SystemExit) as exc:
        main(["bench", "calibrate", "--rounds", "2"])
    assert exc.value.code == 2 and "argument --rounds: 2 must be >= 3" in capsys.readouterr().err


def test_calibrate_checks_its_destination_before_measuring(tmp_path, monkeypatch, capsys):
    """--out is checked before any step is timed: a folder, a file under a file, or an existing file that
    is not a calibration is refused in one line and left as it was; a missing date or a hand-edited torch
    version makes a cache file unusable (a warning naming it), never a traceback."""
    from lmlab.cli import main
    from lmlab.kernels import calibrate as C

    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(C, "calibrate", lambda *a, **k: pytest.fail("measured before checking --out"))
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for out, why in (
        (tmp_path, "is a folder"),
        (notes, "is not a kernel calibration"),
        (notes / "x.json", "is a file, not a folder"),
    ):
        assert main(["bench", "calibrate", "--out", str(out)]) == 2
        assert why in capsys.readouterr().err
    assert notes.read_text() == "mine"
    here = S.cpu_identity()
    path = C.cache_path(here)
    path.parent.mkdir(parents=True)
    S.default_kernels.cache_clear()
    try:
        for bad in ({"date": None}, {"identity": {**here, "torch": here["torch"].upper()}}, {"version": True}):
            path.write_text(json.dumps({**_calibration(True, True, here), **bad}))
            S.default_kernels.cache_clear()
            assert S.default_kernels() == KernelSettings(False, False)
            assert str(path) in capsys.readouterr().err
        # bytes that are not UTF-8, JSON nested past the parser's depth, a JSON list: a warning naming the
        # file and what is wrong, torch's defaults; and `bench calibrate` refuses to overwrite such a file at
        # the default path too, saying so without an --out the user did not give
        for raw, why in (
            (b"\xff\xfe\x00garbage", "cannot read the kernel calibration"),
            (b"[" * 100_000 + b"]" * 100_000, "(not JSON"),
            (b"[1, 2]", "(a JSON array, not an object)"),
            (json.dumps({**_calibration(True, True, here), "version": 7}).encode(), "(version 7)"),
        ):
            path.write_bytes(raw)
            S.default_kernels.cache_clear()
            assert S.default_kernels() == KernelSettings(False, False)
            err = capsys.readouterr().err
            assert str(path) in err and why in err and err.count("\n") == 1, err
            # at the default path (lmlab's own cache) `bench calibrate` measures anew, setting the damaged
            # file aside (kept); a calibration of another format (version 7) is ours and simply replaced
            assert C.check_destination() == (path, why != "(version 7)") and path.read_bytes() == raw
        monkeypatch.setattr(C, "calibrate", lambda *a, **k: _calibration(True, False, here))
        path.write_bytes(b"[1, 2]")
        assert main(["bench", "calibrate", "--if-missing", "--training-only"]) == 0
        out = capsys.readouterr()
        aside = list(path.parent.glob(path.name + ".damaged-*"))
        assert len(aside) == 1 and aside[0].read_bytes() == b"[1, 2]" and f"set aside as {aside[0]}" in out.out
        assert json.loads(path.read_text())["choices"]["onednn_fp32"] is True
        assert path.stat().st_mode & 0o644 == 0o644  # readable by a shared cache's users, as a plain file
        # nothing can be written where the cache is: refused before any measuring, naming LMLAB_CACHE
        monkeypatch.setattr(C, "calibrate", lambda *a, **k: pytest.fail("measured before checking the folder"))
        monkeypatch.setenv("LMLAB_CACHE", "/proc/lmlab-cache")
        assert main(["bench", "calibrate", "--training-only"]) == 2
        err = capsys.readouterr().err
        assert "cannot write in" in err and "LMLAB_CACHE" in err and "/proc/lmlab-cache" in err
        monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
        path.write_text(json.dumps(_calibration(True, False, here)))
        assert main(["bench", "calibrate", "--if-missing", "--json"]) == 0  # kept: its record on stdout
        kept = json.loads(capsys.readouterr().out)["choices"]
        assert kept == {
            "onednn_fp32": True,
            "blocked_attention_fp32": False,
            "decode_layout": [],
            "decode_reductions": [],
            "decode_threads": [],
            "decode_frozen": [],
        }
    finally:
        S.default_kernels.cache_clear()
