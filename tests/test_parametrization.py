"""The ``parametrization`` switch (sp | mup | completep, lmlab/model/parametrization.py) and ``lmlab
coordcheck`` (lmlab/lab/coordcheck.py): the coordinate check passes under mup and fails under sp at three
small widths on CPU; at width (and depth) multiplier 1 mup and completep build sp's model and optimiser
exactly; the rules' values by hand; the CLI's refusals; sp the default and the field kept by a run."""

import math

import pytest
import torch
import yaml

from lmlab.checkpoint import load_run
from lmlab.cli import main
from lmlab.config import ConfigError, ModelConfig
from lmlab.kernels.loss import lm_loss
from lmlab.lab.coordcheck import coord_check
from lmlab.model import TransformerLM
from lmlab.model import parametrization as P
from lmlab.optim import adamw, param_groups, set_lr
from lmlab.schedule import lr_at
from lmlab.train import TrainConfig, Trainer


def cfg_of(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=64, context_length=32, d_model=64, n_layers=2, n_heads=4), **kw})


def lr_by_param(model, tc, lr) -> dict:
    opt = adamw(param_groups(model, tc), tc, torch.device("cpu"))
    set_lr(opt, lr, tc)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr"], g["eps"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}


# --- (a) the coordinate check -----------------------------------------------------------------
def test_coordcheck_passes_under_mup_and_fails_under_sp():
    """Three widths (32, 64, 128), 2 layers, 5 AdamW steps at lr 0.01 on Zipf-distributed random tokens:
    under sp the blocks' outputs and the logits grow with the width (slopes > 0.5 at the last step), under
    mup (base 32) every recorded layer keeps its size (|slope| < 0.25)."""
    tc = TrainConfig(lr=0.01, batch_size=8, weight_decay=0.0, warmup_steps=0, schedule="constant")
    res = {}
    for name in ("sp", "mup"):
        cfg = ModelConfig(vocab_size=256, context_length=64, d_model=32, n_layers=2, n_heads=4, parametrization=name)
        res[name] = coord_check(cfg, tc, [32, 64, 128], steps=5, seeds=[1])
    mup, sp = res["mup"], res["sp"]
    assert mup["layers"] == sp["layers"] == ["embedding", "block 0", "block 1", "logits"]
    assert mup["passed"] and all(abs(s[-1]) < 0.25 for s in mup["slopes"].values()), mup["slopes"]
    assert not sp["passed"]
    assert sp["slopes"]["logits"][-1] > 0.5 and sp["slopes"]["block 1"][-1] > 1.0, sp["slopes"]
    # at the base width mup is sp: the same numbers there, at every step
    for layer in mup["layers"]:
        assert [s[0] for s in mup["scales"][layer]] == [s[0] for s in sp["scales"][layer]]


def test_depth_coordcheck_passes_under_completep_and_fails_under_mup():
    """Over depth (2, 4, 8 layers at d_model 64), 4 AdamW steps at lr 0.005 on Zipf-distributed tokens:
    without a depth rule (mup) every block adds its update to the residual stream, so the last block's
    output grows with depth (slope > 0.5; measured +0.77 over 2-16 layers in docs/bench/coordcheck.md);
    CompleteP's 1/d branch multiplier keeps it flat (|slope| < 0.25), as Dey et al. 2025 claim. At the
    base depth completep is mup: the same numbers at every step."""
    tc = TrainConfig(lr=0.005, batch_size=8, weight_decay=0.0, warmup_steps=0, schedule="constant")
    res = {}
    for name in ("mup", "completep"):
        cfg = ModelConfig(vocab_size=256, context_length=64, d_model=64, n_layers=2, n_heads=4, parametrization=name)
        res[name] = coord_check(cfg, tc, None, steps=4, seeds=[1], depths=[2, 4, 8])
    mup, cp = res["mup"], res["completep"]
    assert cp["axis"] == "depth" and cp["sizes"] == [2, 4, 8] and cp["base"] == 2 and mup["base"] is None
    assert cp["layers"] == mup["layers"] == ["embedding", "last block", "logits"]
    assert cp["passed"] and all(abs(s[-1]) < 0.25 for s in cp["slopes"].values()), cp["slopes"]
    assert not mup["passed"] and mup["slopes"]["last block"][-1] > 0.5, mup["slopes"]
    for layer in cp["layers"]:
        assert [s[0] for s in cp["scales"][layer]] == [s[0] for s in mup["scales"][layer]]


def test_depth_coordcheck_cli(capsys):
    args = [
        "coordcheck",
        "--data",
        "random",
        "--depths",
        "1,2",
        "--steps",
        "2",
        "--parametrization",
        "completep",
        "--set",
        "context_length=16",
        "--set",
        "d_model=32",
        "--batch-size",
        "2",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "depths 1, 2 layers (base_n_layers 1) at d_model 32" in out and "depth 2" in out and "last block" in out
    for bad, needle in (
        (["--depths", "2,4", "--widths", "32,64"], "drop --widths"),
        (["--depths", "2,2"], "--depths 2,2: give at least two different depths"),
        (["--base-depth", "2"], "--base-depth applies to a check over depth"),
        (
            ["--depths", "2,4", "--base-depth", "2", "--parametrization", "mup"],
            "--base-depth 2 applies to --parametrization completep",
        ),
    ):
        assert main(["coordcheck", "--data", "random", "--steps", "1"] + bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_coordcheck_cli_check_flag_sets_the_exit_status(capsys, tmp_path):
    args = [
        "coordcheck",
        "--data",
        "random",
        "--widths",
        "16,32",
        "--steps",
        "2",
        "--parametrization",
        "sp",
        "--set",
        "context_length=16",
        "--batch-size",
        "2",
    ]
    assert main(args) == 0  # FAIL is reported, exit 0 without --check
    out = capsys.readouterr().out
    assert "FAIL:" in out and "width 16" in out and "logits" in out
    assert main(args + ["--check", "--out", str(tmp_path / "cc.png")]) == 1
    assert (tmp_path / "cc.png").read_bytes().startswith(b"\x89PNG")


# --- (b) multiplier 1: mup and completep are sp -------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        dict(parametrization="mup"),
        dict(parametrization="mup", base_d_model=64),
        dict(parametrization="completep", base_d_model=64, base_n_layers=2),
    ],
)
def test_multiplier_one_equals_sp(kw):
    sp, other = cfg_of(), cfg_of(**kw)
    torch.manual_seed(3)
    a = TransformerLM(sp)
    torch.manual_seed(3)
    b = TransformerLM(other)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert b.logit_mult == a.logit_mult == 1.0
    assert [blk.attn.scale for blk in b.blocks] == [blk.attn.scale for blk in a.blocks] == [0.25, 0.25]
    assert all(blk.branch_mult == 1.0 for blk in b.blocks)
    tc = TrainConfig(lr=3e-3, weight_decay=0.1)
    assert lr_by_param(b, tc, 3e-3) == lr_by_param(a, tc, 3e-3)  # lr, eps and weight decay of every parameter
    x = torch.randint(0, 64, (2, 16))
    assert torch.equal(a(x), b(x))


# --- (c) the rules by hand ----------------------------------------------------------------------
def test_mup_rules_by_hand():
    """d_model 128 over base 32: m = 4."""
    cfg = cfg_of(d_model=128, parametrization="mup", base_d_model=32, init_std=0.02, n_layers=2)
    assert P.width_multiplier(cfg) == 4.0 and P.depth_multiplier(cfg) == 1.0
    assert P.init_std(cfg, "hidden") == pytest.approx(0.01)  # 0.02 / sqrt(4)
    assert P.init_std(cfg, "hidden", residual=True) == pytest.approx(0.01 / 2)  # and / sqrt(2 n_layers)
    assert P.init_std(cfg, "embedding") == P.init_std(cfg, "output") == 0.02
    assert P.output_multiplier(cfg) == 0.25
    assert P.attention_scale(cfg, 32) == pytest.approx(1 / 32 * math.sqrt(8))  # sqrt(base head_dim 8) / 32
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    assert model.logit_mult == 0.25 and model.blocks[0].attn.scale == pytest.approx(math.sqrt(8) / 32)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.01, rel=0.03)
    assert model.blocks[0].mlp.w_out.weight.std().item() == pytest.approx(0.005, rel=0.03)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.03)
    tc = TrainConfig(lr=1e-2, eps=1e-8, weight_decay=0.1)
    lrs = lr_by_param(model, tc, 1e-2)
    assert lrs["blocks.0.attn.qkv.weight"] == pytest.approx((2.5e-3, 2.5e-9, 0.1))  # Adam lr / m, eps / m
    assert lrs["blocks.1.mlp.w_out.weight"] == pytest.approx((2.5e-3, 2.5e-9, 0.1))
    assert lrs["embed.weight"] == pytest.approx((1e-2, 2.5e-9, 0.1))  # embeddings (and the tied head): lr kept
    assert lrs["final_norm.weight"] == pytest.approx((1e-2, 2.5e-9, 0.0))
    # the output multiplier on the logits, on both paths (logits and the training loss)
    h = torch.randn(2, 5, 128)
    sp = TransformerLM(cfg_of(d_model=128))
    sp.load_state_dict(model.state_dict())
    assert torch.allclose(model.logits(h), sp.logits(h) * 0.25)
    x = torch.randint(0, 64, (2, 16))
    loss, _ = model(x, targets=x)
    assert loss.item() == pytest.approx(lm_loss(model(x), x)[0].item(), rel=1e-5)


def test_untied_head_keeps_its_init_and_lr():
    cfg = cfg_of(d_model=128, parametrization="mup", base_d_model=32, tie_embeddings=False)
    model = TransformerLM(cfg)
    assert P.param_role("lm_head.weight") == "output"
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert lr_by_param(model, TrainConfig(), 1e-3)["lm_head.weight"][0] == pytest.approx(1e-3)


def test_completep_rules_by_hand():
    """8 layers over base 2 (d = 4), d_model 128 over base 32 (m = 4)."""
    cfg = cfg_of(
        d_model=128, n_layers=8, parametrization="completep", base_d_model=32, base_n_layers=2, parallel_block=True
    )
    assert P.branch_multiplier(cfg) == 0.25
    assert P.init_std(cfg, "hidden", residual=True) == pytest.approx(0.01 / 2)  # 1/sqrt(2 x base depth 2)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    assert all(b.branch_mult == 0.25 for b in model.blocks)
    # the branch multiplier: a parallel block's update of the stream is 1/4 of sp's with the same weights
    sp = TransformerLM(
        ModelConfig(**{**cfg.to_dict(), "parametrization": "sp", "base_d_model": None, "base_n_layers": None})
    )
    sp.load_state_dict(model.state_dict())
    for blk in sp.blocks:
        blk.attn.scale = model.blocks[0].attn.scale  # compare the branch multiplier alone
    x, pos = torch.randn(2, 6, 128), torch.arange(6)
    assert torch.allclose(model.blocks[0](x, pos) - x, (sp.blocks[0](x, pos) - x) * 0.25, atol=1e-6)
    tc = TrainConfig(lr=1e-2, eps=1e-8, weight_decay=0.1)
    lrs = lr_by_param(model, tc, 1e-2)
    # alpha = 1: no depth factor on the lr; eps / (m d) inside the blocks; hidden weight decay x m
    assert lrs["blocks.3.attn.qkv.weight"] == pytest.approx((2.5e-3, 1e-8 / 16, 0.4))
    assert lrs["blocks.3.attn_norm.weight"] == pytest.approx((1e-2, 1e-8 / 16, 0.0))
    assert lrs["embed.weight"] == pytest.approx((1e-2, 2.5e-9, 0.1))
    assert lrs["final_norm.weight"] == pytest.approx((1e-2, 2.5e-9, 0.0))


def test_lr_scale_survives_the_schedule_and_a_resume(tmp_path, byte_data):
    cfg = ModelConfig(
        vocab_size=257, context_length=32, d_model=64, n_layers=2, n_heads=4, parametrization="mup", base_d_model=16
    )
    tc = TrainConfig(
        batch_size=2,
        max_steps=3,
        warmup_steps=2,
        lr=4e-3,
        eval_interval=3,
        eval_windows=2,
        checkpoint_interval=2,
        device="cpu",
        tensorboard=False,
    )
    trainer = Trainer.create(tmp_path / "run", cfg, tc, byte_data, progress=False)
    trainer.train_step()
    trainer.train_step()
    want = {1.0: lr_at(1, tc), 0.25: lr_at(1, tc) / 4}
    assert {g["lr_scale"]: g["lr"] for g in trainer.opt.param_groups} == pytest.approx(want)
    trainer.save()
    trainer.release_lock()
    resumed = Trainer.resume(tmp_path / "run", progress=False)
    assert resumed.cfg == cfg and resumed.step == 2
    resumed.train_step()
    want = {1.0: lr_at(2, tc), 0.25: lr_at(2, tc) / 4}
    assert {g["lr_scale"]: g["lr"] for g in resumed.opt.param_groups} == pytest.approx(want)
    resumed.release_lock()


# --- (d) refusals -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--widths", "64"], "--widths"),
        (["--widths", "64,64"], "--widths"),
        (["--widths", "64,abc"], "--widths"),
        (["--widths", "30,60"], "--widths"),
        (["--widths", "0,64"], "--widths"),
        (["--steps", "0"], "--steps"),
        (["--parametrization", "ntk"], "--parametrization"),
        (["--seeds", "x"], "--seeds"),
        (["--lr", "-1"], "--lr"),
        (["--set", "parametrization=mu"], "parametrization="),
    ],
)
def test_coordcheck_refuses_bad_flags(flags, needle, capsys):
    """One line naming the flag and the value, exit 2 (from argparse or from the check), nothing trained."""
    try:
        rc = main(["coordcheck", "--data", "random", "--steps", "1"] + flags)
    except SystemExit as exc:  # argparse's refusal
        rc = exc.code
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2 and captured.out == ""
    assert len(err) == 1 and err[0].startswith("lmlab coordcheck: error:") and needle in err[0], err
    assert any(v in err[0] for v in flags[-1].split("=")[-1].split(","))  # the value (or the bad one in a list)


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(base_d_model=32), "base_d_model=32 applies to parametrization='mup' or 'completep'"),
        (dict(parametrization="mup", base_n_layers=2), "base_n_layers=2 applies to parametrization='completep'"),
        (dict(parametrization="muP"), "parametrization='muP' is not valid; choose one of 'sp', 'mup', 'completep'"),
        (dict(parametrization="mup", attention="mla"), "needs attention='mha'"),
        (dict(parametrization="mup", n_experts=4), "needs n_experts=0"),
        (dict(parametrization="completep", norm_position="post"), "needs norm_position="),
        (dict(parametrization="mup", base_d_model=0), "base_d_model=0 must be an integer >= 1"),
    ],
)
def test_config_refusals(kw, needle):
    with pytest.raises(ConfigError, match=None) as exc:
        cfg_of(**kw)
    assert needle in str(exc.value)


def test_muon_is_refused_under_mup(tmp_path, capsys, byte_data):
    rc = main(
        [
            "train",
            "--config",
            "demo",
            "--out",
            str(tmp_path / "run"),
            "--set",
            "parametrization=mup",
            "--set",
            "optimizer=muon",
            "--data",
            str(byte_data),
        ]
    )
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and "optimizer='muon' with parametrization='mup'" in line
    assert not (tmp_path / "run").exists()


# --- (e) the default, and a run keeps the field -------------------------------------------------
def test_sp_is_the_default_and_a_run_keeps_the_field(tmp_path, byte_data):
    assert ModelConfig().parametrization == "sp" and ModelConfig().base_d_model is None
    cfg = ModelConfig(
        vocab_size=257,
        context_length=32,
        d_model=64,
        n_layers=4,
        n_heads=4,
        parametrization="completep",
        base_d_model=32,
        base_n_layers=2,
    )
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    tc = TrainConfig(batch_size=2, max_steps=1, eval_interval=1, eval_windows=2, device="cpu", tensorboard=False)
    Trainer.create(tmp_path / "run", cfg, tc, byte_data, progress=False).fit()
    run = yaml.safe_load((tmp_path / "run" / "run.yaml").read_text())
    assert run["model"]["parametrization"] == "completep"
    assert (run["model"]["base_d_model"], run["model"]["base_n_layers"]) == (32, 2)
    model, loaded, _, _, _ = load_run(tmp_path / "run")
    assert loaded == cfg and model.logit_mult == 0.5 and model.blocks[0].branch_mult == 0.5


def test_export_refuses_a_mup_model():
    from lmlab.interop.hf import lmlab_to_hf_config
    from lmlab.interop.registry import UnsupportedError

    lmlab_to_hf_config(cfg_of())  # sp: a Llama
    with pytest.raises(UnsupportedError):
        lmlab_to_hf_config(cfg_of(parametrization="mup", base_d_model=32))


@pytest.mark.parametrize("parallel", [False, True])
def test_completep_kv_cache_decoding_equals_the_full_forward(parallel):
    """The branch multiplier on the lean one-token decode path too (Block.decode_one)."""
    from lmlab.kernels.decode_layout import decode_layout
    from lmlab.model import KVCache

    cfg = cfg_of(
        n_layers=4, parametrization="completep", base_d_model=16, base_n_layers=1, parallel_block=parallel, init_std=0.2
    )
    torch.manual_seed(0)
    m = TransformerLM(cfg).eval()
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        full = m(idx)
    with decode_layout(m, batch=2), torch.inference_mode():
        assert m.lean_decode
        cache = KVCache(cfg, batch=2, max_len=12)
        steps = [m(idx[:, :4], cache=cache)] + [m(idx[:, t : t + 1], cache=cache) for t in range(4, 12)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_coordcheck_refuses_a_base_width_under_sp(capsys):
    assert main(["coordcheck", "--data", "random", "--base-width", "32", "--parametrization", "sp"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert line.startswith("lmlab coordcheck: error: --base-width 32 applies to")
