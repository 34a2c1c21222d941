"""Sampling rules and KV-cache generation, including past context_length."""

import pytest
import torch

from lmlab.config import ModelConfig
from lmlab.generate import TextStream, generate, generate_batch, sample_next
from lmlab.kernels.decode_layout import decode_layout, decode_layout_kind
from lmlab.kernels.settings import KernelSettings
from lmlab.model import TransformerLM


def test_greedy_and_top_k_one_are_argmax():
    logits = torch.randn(4, 50)
    assert torch.equal(sample_next(logits, 0.0), logits.argmax(-1))
    assert torch.equal(sample_next(logits, 1.3, top_k=1), logits.argmax(-1))


def test_top_p_keeps_the_nucleus():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws = {int(sample_next(logits, 1.0, top_p=0.7, generator=g)) for _ in range(300)}
    assert draws == {0, 1}
    # one token holding all the mass: always chosen, for any top_p
    peaked = torch.tensor([[0.0, 200.0, 0.0]])
    assert {int(sample_next(peaked, 1.0, top_p=p, generator=g)) for p in (0.01, 0.5, 1.0)} == {1}
    # ties at the boundary: two tokens of equal top probability and top_p 0.5 keeps one of them
    tied = torch.log(torch.tensor([[0.4, 0.4, 0.2]]))
    assert {int(sample_next(tied, 1.0, top_p=0.3, generator=g)) for _ in range(100)} <= {0, 1}


def test_sampling_argument_errors():
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.zeros(1, 3), -1)
    with pytest.raises(ValueError, match="top_p"):
        sample_next(torch.zeros(1, 3), 1.0, top_p=0)


def test_greedy_generation_matches_full_forward_and_runs_past_context():
    """Cached greedy decoding equals recomputing the documented context without a cache at every step:
    the whole sequence while it fits in context_length, then the last context_length // 2 tokens."""
    T = 16
    cfg = ModelConfig(vocab_size=40, context_length=T, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, init_std=0.5)
    model = TransformerLM(cfg).eval()
    prompt = [1, 2, 3, 4, 5]
    out = list(generate(model, prompt, 40, temperature=0))  # runs well past context_length
    ctx, expected = list(prompt), []
    for _ in range(40):
        nxt = int(model(torch.tensor([ctx]))[0, -1].argmax())
        expected.append(nxt)
        ctx = (ctx + [nxt])[-(T // 2) :] if len(ctx) == T else ctx + [nxt]
    assert out == expected
    assert len(set(out)) > 5  # a non-degenerate sequence, so the comparison can fail


def test_seeded_sampling_reproducible_and_prompt_checks():
    cfg = ModelConfig(vocab_size=40, context_length=16, d_model=32, n_layers=1, n_heads=4)
    model = TransformerLM(cfg).eval()
    a = list(generate(model, [1, 2], 20, temperature=1.0, top_k=10, seed=7))
    b = list(generate(model, [1, 2], 20, temperature=1.0, top_k=10, seed=7))
    assert a == b
    with pytest.raises(ValueError, match="more than context_length=16"):
        list(generate(model, list(range(17)), 3))
    with pytest.raises(ValueError, match="empty"):
        list(generate(model, [], 3))


# --- ties, peaked distributions, tiny temperatures ---------------------------------------------------


def test_ties_and_all_mass_in_one_token():
    g = torch.Generator().manual_seed(0)
    # exact ties: top_p keeps the lower id of two equally likely tokens, always (stable ranking)
    tied = torch.log(torch.tensor([[0.1, 0.4, 0.4, 0.1]]))
    assert {int(sample_next(tied, 1.0, top_p=0.3, generator=g)) for _ in range(50)} == {1}
    assert int(sample_next(tied, 0.0)) == 1  # greedy: the lowest id among equal maxima
    # top_k keeps every logit tied with the k-th
    assert {int(sample_next(tied, 1.0, top_k=1, generator=g)) for _ in range(200)} == {1, 2}
    # one token with all the mass (the others -inf or far below), with every rule
    peaked = torch.tensor([[float("-inf"), 3.0, float("-inf")], [-1e4, 0.0, -1e4]])
    for kw in (dict(), dict(top_k=2), dict(top_p=0.5), dict(top_p=1.0), dict(top_k=3, top_p=0.9)):
        assert sample_next(peaked, 1.0, generator=g, **kw).tolist() == [1, 1]
    # a tiny temperature approaches greedy instead of overflowing into NaN
    logits = torch.tensor([[5.0, 4.0, -3.0]])
    assert int(sample_next(logits, 1e-30, top_p=0.9, generator=g)) == 0
    # ... also below float32's smallest positive value (1.4e-45), where the temperature as a float32 is 0:
    # the maxima only, each tied maximum drawn (the limit of the softmax), with every rule
    tied_max = torch.tensor([[1.0, 3.0, 3.0, 2.0], [7.0, 0.0, -1.0, 6.9]])
    for t in (1e-46, 1e-300, 5e-324):
        for kw in (dict(), dict(top_k=3), dict(top_p=0.5)):
            drawn = [sample_next(tied_max, t, generator=g, **kw).tolist() for _ in range(40)]
            assert {row[0] for row in drawn} == ({1, 2} if "top_p" not in kw else {1}) and {
                row[1] for row in drawn
            } == {0}


# --- batched prompts ----------------------------------------------------------------------------------

BATCH_CONFIGS = [
    dict(n_kv_heads=2),
    dict(n_kv_heads=1, sliding_window=3, layer_pattern="LG", position="learned"),
    dict(position="alibi", sliding_window=4),
]


@pytest.mark.parametrize("kw", BATCH_CONFIGS)
def test_batched_greedy_equals_each_prompt_alone(kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=32, d_model=32, n_layers=2, n_heads=4, init_std=0.5, **kw)
    model = TransformerLM(cfg).eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12]]
    batched = generate_batch(model, prompts, 20, temperature=0)
    alone = [list(generate(model, p, 20, temperature=0)) for p in prompts]
    assert batched == alone
    assert len({tuple(r) for r in alone}) == 3 and len(set(sum(alone, []))) > 5  # the check can fail


def test_batch_eos_seed_and_limits():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=16, d_model=32, n_layers=1, n_heads=4, init_std=0.5)
    model = TransformerLM(cfg).eval()
    prompts = [[1, 2], [3, 4, 5]]
    greedy = generate_batch(model, prompts, 10, temperature=0)
    eos = greedy[0][2]  # row 0 ends at its third token; row 1 goes on unless it also meets that id
    out = generate_batch(model, prompts, 10, temperature=0, eos_id=eos)
    assert out[0] == greedy[0][:3]
    cut = greedy[1].index(eos) + 1 if eos in greedy[1] else 10
    assert out[1] == greedy[1][:cut]
    a = generate_batch(model, prompts, 8, temperature=1.0, top_p=0.9, seed=3)
    assert a == generate_batch(model, prompts, 8, temperature=1.0, top_p=0.9, seed=3)
    assert a != generate_batch(model, prompts, 8, temperature=1.0, top_p=0.9, seed=4)
    with pytest.raises(ValueError, match="does not fit in context_length=16"):
        generate_batch(model, [[1] * 10], 8)
    with pytest.raises(ValueError, match="empty"):
        generate_batch(model, [[1], []], 2)


# the layout a calibration chose where oneDNN-packed weights decoded fp32 batches faster (not batch 1)
PACKED_BATCHES = KernelSettings(False, False, decode_layout=[("fp32 batch 2+", 1, True)])


@pytest.mark.parametrize("kind", ["onednn-packed", "transposed"])
def test_decode_layout_is_transparent_and_restored(kind, monkeypatch):
    import lmlab.kernels.decode_layout as dl

    if kind == "onednn-packed" and not dl.packed_decode_available():
        pytest.skip("this PyTorch has no oneDNN")
    if kind == "transposed":
        monkeypatch.setattr(dl, "PACK_LIMIT_BYTES", 0)  # weights "too large" to copy
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40, context_length=16, d_model=32, n_layers=1, n_heads=4, tie_embeddings=True, bias="all"
    )
    model = TransformerLM(cfg, kernels=PACKED_BATCHES).eval()
    assert decode_layout_kind(model, batch=2) == kind
    assert decode_layout_kind(model, batch=1) == "transposed"
    assert decode_layout_kind(model, batch=2, compiled=True) == "transposed"  # Inductor: no packed weights
    assert decode_layout_kind(TransformerLM(cfg, kernels=KernelSettings(False, False)), batch=2) == "transposed"
    x = torch.randint(0, 40, (2, 7))
    ref = model(x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with decode_layout(model, batch=2):
        qkv = model.blocks[0].attn.qkv
        if kind == "transposed":
            assert not qkv.weight.is_contiguous()  # (out, in) held as (in, out): more outputs than inputs
            assert model.blocks[0].mlp.w_out.weight.is_contiguous()  # fewer outputs (d_ff -> d_model): kept
        else:
            assert "forward" in qkv.__dict__  # multiplies by its packed copy
        assert model.lm_head.weight is model.embed.weight  # still tied
        with decode_layout(model, batch=5):  # nested: left alone
            pass
        with torch.inference_mode():
            out = model(x)
        assert torch.allclose(out, ref, atol=1e-5) and not torch.equal(out, torch.zeros_like(out))
    assert all(p.is_contiguous() for p in model.parameters())
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    model.train()
    model(x).sum().backward()  # still trainable: no inference tensors left behind
    assert model.blocks[0].attn.qkv.weight.grad is not None


# --- stop strings and streaming text ------------------------------------------------------------------


def test_text_stream_stop_strings_and_utf8():
    ts = TextStream(["END!", "\n\n"])
    shown = ""
    for piece in [b"Hello E", b"N", b"D?", b" no"]:  # "EN" is held back until it is known not to stop
        shown += ts.push(piece)
    assert shown == "Hello END? no" and not ts.stopped
    ts = TextStream(["END"])
    shown = "".join(ts.push(p) for p in [b"abc E", b"NDxyz", b"more"])
    assert shown == "abc " and ts.stopped and ts.flush() == ""
    # a multi-byte character split across tokens is held until complete; a trailing tail is flushed
    ts = TextStream(["stop"])
    euro = "€".encode()
    assert ts.push(b"a" + euro[:1]) == "a"
    assert ts.push(euro[1:] + b" st") == "€ "
    assert ts.flush() == "st"
    ts = TextStream()
    assert ts.push(b"\xff") == "\ufffd"  # invalid bytes are replaced, not dropped


# --- the command line: stop strings, a batch of prompts, `bench decode` on a run ----------------------


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    """A run folder written by hand: raw-bytes tokenizer, a random 1-layer model, one checkpoint."""
    import yaml

    from lmlab.checkpoint import save_checkpoint
    from lmlab.data.tokenizer import Tokenizer

    run = tmp_path_factory.mktemp("gen") / "run"
    run.mkdir()
    tok = Tokenizer.bytes_tokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, context_length=32, d_model=32, n_layers=1, n_heads=4)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    tok.save(run / "tokenizer.json")
    (run / "run.yaml").write_text(yaml.safe_dump({"model": cfg.to_dict(), "train": {}, "data": "none"}))
    save_checkpoint(run, 1, model, None, {"step": 1, "tokens_seen": 0})
    return run


def test_cli_generate_stop_and_batch(byte_run, capsys):
    from lmlab.cli import main

    args = ["generate", str(byte_run), "--max-new-tokens", "12", "--temperature", "0"]
    assert main(args + ["--prompt", "ab"]) == 0
    full = capsys.readouterr().out.rstrip("\n")
    assert full.startswith("ab") and len(full) > 4
    stop = full[4:6]  # cut where this text first appears in the continuation
    assert main(args + ["--prompt", "ab", "--stop", stop]) == 0
    assert capsys.readouterr().out.rstrip("\n") == "ab" + full[2:][: full[2:].find(stop)]
    assert main(args + ["--prompt", "ab", "--prompt", "xyz"]) == 0
    out = capsys.readouterr().out
    assert "--- [0] ---\n" + full + "\n" in out and "--- [1] ---\nxyz" in out
    assert main(["bench", "decode", str(byte_run), "--prompt-len", "3", "--new-tokens", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "decode" in out and "tokens/s" in out


@pytest.mark.parametrize("large", [False, True])
def test_suspended_generator_holds_the_decode_layout_until_closed(large, monkeypatch):
    """A small model decodes through cached copies (its own weights stay contiguous throughout); one
    over ``PACK_LIMIT_BYTES`` is re-laid out in place while a generator is suspended, as documented."""
    import lmlab.kernels.decode_layout as dl

    if large:
        monkeypatch.setattr(dl, "PACK_LIMIT_BYTES", 0)
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=40, context_length=16, d_model=32, n_layers=1, n_heads=4)).eval()
    tokens = generate(model, [1, 2, 3], 8, temperature=0)
    next(tokens)
    qkv = model.blocks[0].attn.qkv
    assert model.lean_decode and qkv.weight.is_contiguous() != large
    assert ("forward" in qkv.__dict__) != large  # small: multiplies by its copy
    tokens.close()
    assert not model.lean_decode and all(p.is_contiguous() for p in model.parameters())
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("cell", ["bf16 batch 1", "bf16 batch 2+", "fp32 batch 1"])
def test_packed_decode_in_each_calibrated_cell_matches_the_plain_forward(cell):
    """Where a calibration chose oneDNN-packed weights for a cell (a dtype and batch class), decoding in it
    multiplies by packed copies (of that dtype, for that batch) and gives the plain layout's results: the
    logits of a forward inside decode_layout, to the dtype's rounding (bf16: the same products summed in
    another order), and greedy ids for the fp32 cell; the other cells stay transposed."""
    import lmlab.generate as gen
    import lmlab.kernels.decode_layout as dl

    if not dl.packed_decode_available():
        pytest.skip("this PyTorch has no oneDNN")
    dtype = torch.bfloat16 if cell.startswith("bf16") else torch.float32
    batch = 1 if cell.endswith("batch 1") else 3
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=32, d_model=32, n_layers=2, n_heads=4, init_std=0.3)
    plain = TransformerLM(cfg, kernels=KernelSettings(False, False)).eval().to(dtype)
    model = TransformerLM(cfg, kernels=KernelSettings(False, False, decode_layout=[(cell, 1, True)])).eval()
    model.load_state_dict(plain.state_dict())
    model.to(dtype)
    assert decode_layout_kind(model, batch) == "onednn-packed"
    other_dtype, other_batch = (torch.float32 if dtype == torch.bfloat16 else torch.bfloat16), 4 - batch
    assert decode_layout_kind(model, other_batch) == "transposed"
    assert decode_layout_kind(TransformerLM(cfg, kernels=model.kernels).to(other_dtype), batch) == "transposed"
    x = torch.randint(0, 40, (batch, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = plain(x).float()
        with decode_layout(model, batch):
            assert "forward" in model.blocks[0].attn.qkv.__dict__  # multiplies by its packed copy
            copy = model.blocks[0].attn.qkv._decode_copy
            assert copy.packed and copy.copy.dtype == dtype
            out = model(x).float()
    tol = 0.05 if dtype == torch.bfloat16 else 1e-5  # bf16: an ulp of logits of size ~2
    assert (out - ref).abs().max() <= tol and ref.abs().max() > 0.5
    if dtype == torch.float32:
        prompts = x[:, :3].tolist()
        ids = torch.stack(list(gen.stream_batch(model, prompts, 6, temperature=0)))
        assert torch.equal(ids, torch.stack(list(gen.stream_batch(plain, prompts, 6, temperature=0))))


@pytest.mark.parametrize("batch", [1, 3])
def test_decode_copies_are_cached_and_remade_when_the_weights_change(batch):
    """The decode copies of the weights (transposed at batch 1, oneDNN-packed at batch >= 2) are made
    once and reused by the next call; a training step (fused AdamW, which bumps no version counter),
    load_state_dict, or a new tensor assigned to .data makes the next call use the new weights: its
    outputs equal those of a fresh copy of the model that never decoded (a stale copy would not)."""
    import copy

    import lmlab.generate as gen
    import lmlab.kernels.decode_layout as dl

    if batch > 1 and not dl.packed_decode_available():
        pytest.skip("this PyTorch has no oneDNN")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=32, d_model=32, n_layers=2, n_heads=4, init_std=0.3)
    model = TransformerLM(cfg, kernels=PACKED_BATCHES)
    prompts = [[1, 2, 3]] * batch
    made = []
    real = dl._make_decode_copy
    spy = lambda w, what: made.append(what) or real(w, what)  # noqa: E731

    x = torch.randint(0, 40, (batch, 9), generator=torch.Generator().manual_seed(1))

    def decode(m):  # greedy ids, and logits of a forward through the decode layout's copies
        out = torch.stack(list(gen.stream_batch(m, prompts, 6, temperature=0)))
        with dl.decode_layout(m, batch), torch.inference_mode():
            return out, m(x)

    import unittest.mock as mock

    with mock.patch.object(dl, "_make_decode_copy", spy):
        first = decode(model)
        n = len(made)
        assert n > 0 and all(w[0] == ("packed" if batch > 1 else "transposed") for w in made)
        again = decode(model)
        assert len(made) == n and all(torch.equal(a, b) for a, b in zip(first, again))  # nothing remade
    entries = {id(m): dl._DECODE_COPIES[m][-1] for m in model.modules() if m in dl._DECODE_COPIES}
    assert entries  # cached: the second call reused the same copy tensors
    decode(model)
    assert all(dl._DECODE_COPIES[m][-1] is entries[id(m)] for m in model.modules() if id(m) in entries)

    def changed_by_training(m):
        opt = torch.optim.AdamW(m.parameters(), lr=0.05, fused=True)
        m.train()
        loss, _ = m(torch.randint(0, 40, (2, 12)), targets=torch.randint(0, 40, (2, 12)))
        loss.backward()
        opt.step()
        m.eval()

    def changed_by_load(m):
        other = TransformerLM(cfg)
        m.load_state_dict(other.state_dict())

    def changed_by_data(m):
        for p in m.parameters():
            p.data = p.data * 1.5

    for change in (changed_by_training, changed_by_load, changed_by_data):
        change(model)
        fresh = copy.deepcopy(model)
        dl.release_decode_copies(fresh)
        after, ref = decode(model), decode(fresh)
        # 1e-4: fp32 summation order (a weight still holding training's gradient is multiplied directly, the
        # fresh model's through its decode copy); a stale copy is off by far more (asserted below)
        assert torch.allclose(after[1], ref[1], atol=1e-4) and torch.equal(after[0], ref[0]), change.__name__
        assert not torch.allclose(after[1], first[1], atol=1e-3), change.__name__  # the weights did change
    freed = dl.release_decode_copies(model)
    assert freed > 0 and not any(m in dl._DECODE_COPIES for m in model.modules())


def test_several_eos_ids_and_logprobs():
    """eos_id may be several ids (each ends a row or the stream); generate_logprobs yields each token's
    log-probability under the model, checked against a full forward pass by hand; a bad eos_id is refused."""
    from lmlab.generate import eos_set, generate_logprobs

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=32, d_model=32, n_layers=1, n_heads=4, init_std=0.5)
    model = TransformerLM(cfg).eval()
    greedy = list(generate(model, [1, 2], 12, temperature=0))
    new = [i for i in range(1, 12) if greedy[i] not in greedy[:i]]  # positions of first occurrences
    assert len(new) >= 2, greedy  # two distinct ids that first appear after the start
    a, b = new[0], new[1]
    first, second = greedy[a], greedy[b]
    assert list(generate(model, [1, 2], 12, temperature=0, eos_id=[second, first])) == greedy[: a + 1]
    assert list(generate(model, [1, 2], 12, temperature=0, eos_id=[second])) == greedy[: b + 1]
    unused = next(i for i in range(40) if i not in greedy)  # an eos id that never comes
    rows = generate_batch(model, [[1, 2], [1, 2]], 12, temperature=0, eos_id=(first, unused))
    assert rows == [greedy[: a + 1], greedy[: a + 1]]
    steps = list(generate_logprobs(model, [1, 2], 6, temperature=1.0, seed=5))
    ctx = [1, 2]
    for token, lp in steps:
        want = torch.log_softmax(model(torch.tensor([ctx]))[0, -1].double(), -1)[token].item()
        assert lp == pytest.approx(want, abs=1e-5)
        ctx.append(token)
    assert [t for t, _ in steps] == list(generate(model, [1, 2], 6, temperature=1.0, seed=5))
    assert eos_set(None) == frozenset() and eos_set(3) == {3}
    with pytest.raises(ValueError, match="eos_id"):
        eos_set(["a"])


def test_cli_logprobs(byte_run, capsys):
    from lmlab.cli import main

    args = ["generate", str(byte_run), "--max-new-tokens", "5", "--temperature", "0", "--prompt", "ab"]
    assert main(args + ["--logprobs"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split("\t") for line in out[2:7]]
    assert out[1].startswith("token id\tlog-probability") and len(rows) == 5
    assert all(float(r[1]) <= 0 for r in rows)
    total = out[7].split("\t")
    assert total[0] == "total" and float(total[1]) == pytest.approx(sum(float(r[1]) for r in rows), abs=1e-3)
    assert main(args + ["--prompt", "cd", "--logprobs"]) == 2
    assert "--logprobs takes one --prompt" in capsys.readouterr().err
    # refused before any run folder is read (a missing one would be reported otherwise)
    assert main(["generate", str(byte_run) + "-missing", "--prompt", "a", "--prompt", "b", "--logprobs"]) == 2
    assert "--logprobs takes one --prompt" in capsys.readouterr().err


def test_decode_threads_follow_the_calibration_else_the_model_size():
    """Uncalibrated: one thread per DECODE_WEIGHTS_PER_THREAD linear weights (rounded up), within [1,
    available]. Calibrated: the thread count the cell (eager or compiled) measured faster at the size
    nearest the model's, at most the available threads (never more than were measured); a cell not
    measured keeps the fixed rule."""
    import math

    from lmlab.config import ModelConfig
    from lmlab.kernels.decode_layout import DECODE_WEIGHTS_PER_THREAD, decode_threads, linear_weight_count
    from lmlab.kernels.settings import KernelSettings
    from lmlab.model import TransformerLM

    uncalibrated = KernelSettings(False, False)
    small = TransformerLM(
        ModelConfig(vocab_size=256, context_length=32, d_model=64, n_layers=2, n_heads=4), kernels=uncalibrated
    )
    assert decode_threads(small, 8) == 1 and decode_threads(small, 8, compiled=True) == 1
    with torch.device("meta"):
        big = TransformerLM(
            ModelConfig(vocab_size=32000, context_length=64, d_model=2048, n_layers=8, n_heads=16),
            kernels=uncalibrated,
        )
    weights = 2048 * (3 * 2048 + 2048 + 3 * 5504) * 8 + 2048 * 32000  # q|k|v, out, gate|up and down; the head
    assert linear_weight_count(big) == weights  # (the head tied to the embedding: one tensor, counted once)
    want = math.ceil(weights / DECODE_WEIGHTS_PER_THREAD)
    assert 2 <= want < 64 and decode_threads(big, 64) == want and decode_threads(big, 2) == 2
    # calibrated: eager gains at 20M and not at 4M (the log midpoint is ~8.9M); compiled gains at 4M
    measured = KernelSettings(
        False,
        False,
        decode_threads=[
            ("eager batch 1", 4_000_000, 1),
            ("eager batch 1", 20_000_000, 2),
            ("compiled batch 1", 4_000_000, 2),
        ],
    )
    small.set_kernels(measured)
    big.set_kernels(measured)
    assert linear_weight_count(small) == 64 * (3 * 64 + 64 + 3 * 192) * 2 + 64 * 256 < 8_900_000 < weights
    # measured on 2 threads: a 64-core machine of the same CPU model still takes 2, a 1-core one 1
    assert decode_threads(small, 8) == 1 and decode_threads(small, 8, compiled=True) == 2
    assert decode_threads(big, 64) == 2 and decode_threads(big, 2, compiled=True) == 2
    assert decode_threads(big, 1) == 1
    only_compiled = KernelSettings(False, False, decode_threads=[("compiled batch 1", 4_000_000, 1)])
    big.set_kernels(only_compiled)
    assert decode_threads(big, 64, compiled=True) == 1 and decode_threads(big, 64) == want  # eager: the fixed rule


def test_a_suspended_generator_never_serves_stale_or_foreign_weights():
    """While a generator holds the decode layout (left suspended), a training step (fused AdamW) on the
    model and a later generation must use the new weights; a deep copy made meanwhile computes with its
    own weights and sends its gradients to itself; a square weight transposed through .data (same
    storage and version) is noticed by its strides."""
    import copy

    from lmlab.generate import generate_logprobs, stream_batch
    from lmlab.kernels.decode_layout import decode_layout

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, init_std=0.3)
    model = TransformerLM(cfg)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]

    def logprobs(m):
        return torch.tensor([lp for _, lp in generate_logprobs(m, prompts[0], 5, temperature=0)])

    held = stream_batch(model, prompts, 20, temperature=0)
    next(held)  # suspended inside decode_layout: packed copies patched in
    clone = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2, fused=True)
    model.train()
    model(torch.tensor(prompts)).logsumexp(-1).mean().backward()
    opt.step()
    clean = TransformerLM(cfg)
    clean.load_state_dict(model.state_dict())
    assert torch.allclose(logprobs(model), logprobs(clean), atol=1e-5)
    with torch.no_grad():
        x = torch.tensor(prompts)
        assert torch.allclose(model.eval()(x), clean.eval()(x), atol=1e-5)
        for p in clone.parameters():  # the clone follows its own weights, not the model's
            p.normal_(0, 0.3)
        fresh = TransformerLM(cfg)
        fresh.load_state_dict(clone.state_dict())
        assert torch.allclose(clone.eval()(x), fresh.eval()(x), atol=1e-5)
    clone.train()
    clone(x).sum().backward()
    assert clone.blocks[0].attn.qkv.weight.grad is not None
    held.close()
    assert all("forward" not in m.__dict__ for m in model.modules())
    with decode_layout(model, batch=2), torch.inference_mode():
        w = model.blocks[0].attn.out.weight  # square (d_model x d_model)
        before = model(x)
        with torch.inference_mode(False), torch.no_grad():
            w.data = w.data.t()
        ref = TransformerLM(cfg)
        ref.load_state_dict(model.state_dict())
        assert not torch.allclose(model(x), before, atol=1e-3)
        assert torch.allclose(model(x), ref.eval()(x), atol=1e-5)


def test_generation_restores_the_train_or_eval_mode():
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=40, context_length=16, d_model=32, n_layers=1, n_heads=4))
    model.train()
    assert len(list(generate(model, [1, 2], 3, temperature=0))) == 3 and model.training
    assert len(generate_batch(model, [[1], [2, 3]], 3, temperature=0)[0]) == 3 and model.training
    model.eval()
    list(generate(model, [1, 2], 3, temperature=0))
    assert not model.training
    model.blocks[0].train()  # one module training: eval for the call, then the model's own mode for all
    list(generate(model, [1, 2], 3, temperature=0))
    assert not any(m.training for m in model.modules())


def test_generation_leaves_a_model_in_eval_mode_untouched():
    """No module training: no ``train()`` walk of the modules before and after the call, and every
    module still in eval mode after it."""
    from unittest import mock

    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=40, context_length=16, d_model=32, n_layers=1, n_heads=4)).eval()
    with mock.patch.object(torch.nn.Module, "train", autospec=True, side_effect=torch.nn.Module.train) as train:
        assert len(generate_batch(model, [[1], [2, 3]], 3, temperature=0)[0]) == 3
        assert train.call_count == 0
        model.blocks[0].train()
        generate_batch(model, [[1]], 2, temperature=0)
        assert train.call_count > 0  # once something trains, eval() for the call and train(False) after
    assert not any(m.training for m in model.modules())


def test_decode_copies_are_invalidated_by_gradients_not_by_a_process_wide_optimizer_hook():
    """The decode copies watch their own weights (a post-accumulate-grad hook on each, removed by
    release_decode_copies) instead of hooking every torch.optim step in the process: generating installs
    no global optimizer hook; a weight holding a gradient is never multiplied through its copy (a fused
    step may follow without bumping a version counter); a gradient arriving after the copy was made (the
    backward before any step) makes the next call remake it, and with grads cleared an untouched copy is
    reused."""
    import copy
    import unittest.mock as mock

    from torch.optim import optimizer as torch_optimizer

    import lmlab.kernels.decode_layout as dl

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=32, d_model=32, n_layers=2, n_heads=4, init_std=0.3)
    model = TransformerLM(cfg)
    hooks_before = dict(torch_optimizer._global_optimizer_post_hooks)
    made = []
    real = dl._make_decode_copy
    spy = lambda w, what: made.append(what) or real(w, what)  # noqa: E731

    def greedy(m):
        return list(generate(m, [1, 2, 3], 6, temperature=0))

    def fresh_of(m):
        other = copy.deepcopy(m)
        dl.release_decode_copies(other)
        other.zero_grad(set_to_none=True)
        return other

    with mock.patch.object(dl, "_make_decode_copy", spy):
        greedy(model)
        n = len(made)
        assert n > 0 and dict(torch_optimizer._global_optimizer_post_hooks) == hooks_before
        greedy(model)
        assert len(made) == n  # reused: nothing changed
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
        loss, _ = model.train()(torch.randint(0, 40, (2, 12)), targets=torch.randint(0, 40, (2, 12)))
        loss.backward()  # gradients arrive: the copies are stale from here on
        opt.step()  # fused: no version counter moves
        model.eval()
        expected = greedy(fresh_of(model))
        n = len(made)
        assert greedy(model) == expected and len(made) == n  # grads held: no copy used or made
        opt.zero_grad(set_to_none=True)
        assert greedy(model) == expected and len(made) > n  # remade after the gradient's arrival
        n = len(made)
        greedy(model)
        assert len(made) == n  # and reused again while nothing changes
    watched = [m.weight for m in model.modules() if m in dl._DECODE_COPIES]
    assert watched and all(w in dl._GRAD_EVENTS for w in watched)
    dl.release_decode_copies(model)
    assert not any(w in dl._GRAD_EVENTS for w in watched)
    assert not any(w._post_accumulate_grad_hooks for w in watched)  # the hooks went with the copies


def test_the_python_api_refuses_ids_outside_the_vocabulary_and_unknown_keywords():
    """generate / generate_batch check what the CLI checks: a prompt or eos id outside the vocabulary is a
    ValueError naming it (not torch's IndexError from the embedding), and a misspelled sampling keyword is a
    TypeError naming the function the user called and the valid keywords."""
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=40, context_length=16, d_model=32, n_layers=1, n_heads=4))
    for prompt in ([99999], [-1], [1, 40]):
        with pytest.raises(ValueError, match=f"prompt id {prompt[-1]} is outside the model's vocabulary 0..39"):
            list(generate(model, prompt, 2))
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            generate_batch(model, [[1, 2], prompt], 2)
    with pytest.raises(ValueError, match="eos_id id 99999 is outside"):
        list(generate(model, [1, 2], 2, eos_id=99999))
    with pytest.raises(ValueError, match="eos_id id 40 is outside"):
        generate_batch(model, [[1, 2]], 2, eos_id=[3, 40])
    with pytest.raises(TypeError, match=r"generate\(\) got unexpected keyword\(s\) temprature; valid: temperature"):
        list(generate(model, [1, 2], 2, temprature=0.5))
    with pytest.raises(TypeError, match=r"generate_batch\(\) got unexpected keyword\(s\) topk"):
        generate_batch(model, [[1, 2]], 2, topk=3)
    import numpy as np

    assert list(generate(model, list(np.array([1, 2])), 3, temperature=0)) == list(
        generate(model, [1, 2], 3, temperature=0)
    )
