"""The compiled decode step (lmlab.kernels.compiled_decode, ``compile=True`` in lmlab.generate) against the
eager step it replaces: the same tokens and log-probabilities, one graph for every call length, weights
changed between tokens used at once, and the models it cannot run refused by name. Each compile takes a
few seconds on a CPU: the models are module-scoped and shared by the tests."""

from __future__ import annotations

import re

import pytest
import torch

from lmlab.config import ModelConfig
from lmlab.generate import generate_batch, generate_logprobs
from lmlab.kernels.compiled_decode import _COMPILED, compiled_decode_unsupported
from lmlab.model import TransformerLM

# Llama-style (RoPE, GQA, SwiGLU, RMSNorm) and GPT-2-style (learned positions, LayerNorm, biases, GELU)
LLAMA = dict(vocab_size=64, context_length=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
GPT2 = dict(
    LLAMA,
    n_kv_heads=None,
    norm_type="layernorm",
    norm_bias=True,
    bias="all",
    activation="gelu_tanh",
    position="learned",
)


def _model(kw: dict, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(ModelConfig(**kw)).eval()


@pytest.fixture(scope="module")
def llama():
    return _model(LLAMA)


@pytest.fixture(scope="module")
def gpt2():
    return _model(GPT2, seed=1)


def _same_continuations(ours: list, theirs: list) -> None:
    """Two lists of (token id, log-probability): the same ids, log-probabilities within fp32 summation
    order (1e-4 nats)."""
    assert [t for t, _ in ours] == [t for t, _ in theirs]
    assert max(abs(a - b) for (_, a), (_, b) in zip(ours, theirs)) < 1e-4


def _compiled_graphs(model: TransformerLM) -> int:
    """How many graphs torch.compile holds for ``model``'s compiled steps (its cache entries)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return sum(
        len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__)) for fn in _COMPILED[model].values()
    )


def test_one_sequence_equals_the_eager_step_and_one_graph_serves_every_length(llama):
    """Greedy ids equal, log-probabilities within fp32 summation order (1e-4 nats), for prompts and
    new-token counts that give the preallocated cache three different lengths; and past the window
    (generate's re-encoding from the last half, then more compiled steps); one compiled graph for all."""
    for prompt, new in (([1, 2, 3], 12), (list(range(5, 25)), 9), ([7], 30), ([4, 5], 60)):
        eager = list(generate_logprobs(llama, prompt, new, temperature=0))
        compiled = list(generate_logprobs(llama, prompt, new, temperature=0, compile=True))
        assert [t for t, _ in compiled] == [t for t, _ in eager], (prompt, new)
        assert max(abs(a - b) for (_, a), (_, b) in zip(compiled, eager)) < 1e-4
    assert _compiled_graphs(llama) == 1
    # sampled (temperature, top-k, top-p): the same seed draws the same tokens from the same logits
    kw = dict(temperature=0.9, top_k=20, top_p=0.9, seed=3)
    assert (
        list(generate_logprobs(llama, [1, 2], 15, compile=True, **kw))[-1][0]
        == (list(generate_logprobs(llama, [1, 2], 15, **kw))[-1][0])
    )


def test_a_left_padded_batch_equals_the_eager_batch(gpt2):
    """Prompts of different lengths (left padding: each row's own positions, padding masked) through a
    learned-position, LayerNorm, biased model: each row's ids equal the eager batch's, which equal each
    prompt decoded alone; batch 1 without padding and batch 3 with it are graphs of their own."""
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5, 8]]
    compiled = generate_batch(gpt2, prompts, 14, temperature=0, compile=True)
    assert compiled == generate_batch(gpt2, prompts, 14, temperature=0)
    alone = [[t for t, _ in generate_logprobs(gpt2, p, 14, temperature=0, compile=True)] for p in prompts]
    assert compiled == alone
    assert len(_COMPILED[gpt2]) == 2  # padded and unpadded


def test_weights_changed_between_tokens_take_effect_at_once(llama):
    """A suspended compiled generator, then the weights change (an in-place write, as an optimizer step
    makes): the next tokens are those of a model that had the new weights from that point on, whose
    eager decoding gives the reference; a stale decode copy would give the old model's."""
    import copy

    model = copy.deepcopy(llama)
    reference = copy.deepcopy(llama)
    prompt = [2, 7, 1, 8]
    ours = generate_logprobs(model, prompt, 10, temperature=0, compile=True)
    theirs = generate_logprobs(reference, prompt, 10, temperature=0)
    head, head_ref = [next(ours) for _ in range(4)], [next(theirs) for _ in range(4)]
    assert [t for t, _ in head] == [t for t, _ in head_ref]
    assert [lp for _, lp in head] == pytest.approx([lp for _, lp in head_ref], abs=1e-4)
    with torch.no_grad():
        for m in (model, reference):
            m.blocks[0].mlp.w_in.weight.mul_(-3.0)
            m.lm_head.weight.add_(0.5)
    _same_continuations(list(ours), list(theirs))


@pytest.mark.parametrize("reductions", [True, False], ids=["row-reductions", "transposed"])
def test_later_steps_of_a_call_skip_dynamo_and_storage_changes_go_back_through_it(reductions):
    """A call's first compiled step goes through Dynamo (torch.compile's function), its later steps call the
    Inductor graph it ran directly (lmlab.kernels.compiled_decode._DirectStep): for 12 tokens Dynamo's
    function runs once, and the tokens and log-probabilities are the eager step's (the cache written, the
    position advanced). A weight given new storage during the call (``.data =``, which keeps the Parameter)
    sends the next steps back through Dynamo (or, where the step multiplies by a decode copy of it, now
    stale, through the eager step), and they use the new values."""
    import copy

    from lmlab.kernels.settings import KernelSettings

    torch.manual_seed(4)
    cells = [("fp32 batch 1", 1, reductions)]
    model = TransformerLM(ModelConfig(**LLAMA), kernels=KernelSettings(False, False, decode_reductions=cells)).eval()
    plain = copy.deepcopy(model)
    plain.set_kernels(KernelSettings(False, False))
    prompt = [5, 9, 2, 6]
    list(generate_logprobs(model, prompt, 2, temperature=0, compile=True))  # compiles
    calls = []
    (key, fn) = next(iter(_COMPILED[model].items()))

    def counted(*args):
        calls.append(1)
        return fn(*args)

    _COMPILED[model][key] = counted
    _same_continuations(
        list(generate_logprobs(model, prompt, 12, temperature=0, compile=True)),
        list(generate_logprobs(plain, prompt, 12, temperature=0)),
    )
    assert len(calls) == 1  # the first of 11 decode steps; the other 10 called the graph directly
    ours = generate_logprobs(model, prompt, 10, temperature=0, compile=True)
    theirs = generate_logprobs(plain, prompt, 10, temperature=0)
    assert [next(ours)[0] for _ in range(4)] == [next(theirs)[0] for _ in range(4)]
    assert len(calls) == 2
    with torch.no_grad():
        for m in (model, plain):
            w = m.blocks[1].mlp.w_in.weight
            w.data = w.data * -3.0  # new storage, same Parameter object
    _same_continuations(list(ours), list(theirs))
    # the reductions read the weights themselves: every later step through Dynamo again; the transposed
    # layout's decode copy of that weight is stale: the eager step
    assert len(calls) == (2 + 6 if reductions else 2)


def _generated_code(run) -> str:
    """``run()``'s result and the Python Inductor generated for the graphs it compiled (the FX graph cache
    off, so each is generated here)."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    codes = []
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        mock.patch.object(GraphLowering, "save_output_code", codes.append),
    ):
        out = run()
    return out, "\n".join(codes)


@pytest.mark.parametrize("kw", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_row_reductions_equal_the_eager_step_and_call_no_matrix_kernel(kw):
    """The 'row-reductions' layout (the compiled batch-1 step where the calibration measured it faster):
    greedy ids equal the eager step's and log-probabilities are within fp32 summation order; its
    generated code calls no matrix kernel (every product and the attention are Inductor's own loops),
    where the transposed layout's calls MKL's; a weight changed between tokens takes effect at once."""
    from lmlab.kernels.decode_layout import decode_layout_kind
    from lmlab.kernels.settings import KernelSettings

    torch.manual_seed(3)
    plain = TransformerLM(ModelConfig(**kw), kernels=KernelSettings(False, False)).eval()
    reduced = TransformerLM(
        ModelConfig(**kw), kernels=KernelSettings(False, False, decode_reductions=[("fp32 batch 1", 1, True)])
    ).eval()
    reduced.load_state_dict(plain.state_dict())
    assert decode_layout_kind(reduced, 1, compiled=True) == "row-reductions"
    assert decode_layout_kind(reduced, 2, compiled=True) == decode_layout_kind(reduced, 1) == "transposed"
    assert decode_layout_kind(plain, 1, compiled=True) == "transposed"
    prompt = [5, 9, 2, 6]
    eager = list(generate_logprobs(plain, prompt, 12, temperature=0))
    ours, code = _generated_code(lambda: list(generate_logprobs(reduced, prompt, 12, temperature=0, compile=True)))
    _same_continuations(ours, eager)
    assert "cpp_fused" in code and not re.findall(r"extern_kernels\.\w+\(", code)
    assert "assert_size_stride(" not in code  # the inputs' sizes are the tensor guards' to check, not Python's
    _, code = _generated_code(lambda: list(generate_logprobs(plain, prompt, 3, temperature=0, compile=True)))
    assert "extern_kernels.mm(" in code or "extern_kernels.addmm(" in code
    assert "assert_size_stride(" not in code
    # the graph reads the weights at each call: a write between tokens is used by the next step
    ours, theirs = (
        generate_logprobs(reduced, prompt, 8, temperature=0, compile=True),
        generate_logprobs(plain, prompt, 8, temperature=0),
    )
    assert [next(ours)[0] for _ in range(3)] == [next(theirs)[0] for _ in range(3)]
    with torch.no_grad():
        for m in (reduced, plain):
            m.blocks[1].mlp.w_in.weight.mul_(-3.0)
            m.lm_head.weight.add_(0.5)
    _same_continuations(list(ours), list(theirs))
    assert all(not hasattr(m, "forward") or "forward" not in vars(m) for m in reduced.modules())  # undone


def test_row_reductions_see_a_tie_undone_and_deep_copies_multiply_plainly():
    """A graph traced with the LM head tied to the embedding reads the embedding for both: untying the
    head after a compiled call, or within a suspended one, gives the eager step's tokens (a graph for the
    new pattern, or the eager path for the rest of that call), not the tied model's. A deep copy made
    while a generator holds the model in the layout keeps plain products: under torch.compile its linears
    call MKL, not the reductions."""
    import copy

    from lmlab.kernels.settings import KernelSettings

    kernels = KernelSettings(False, False, decode_reductions=[("fp32 batch 1", 1, True)])
    torch.manual_seed(5)
    model = TransformerLM(ModelConfig(**LLAMA), kernels=kernels).eval()
    assert model.lm_head.weight is model.embed.weight
    list(generate_logprobs(model, [1, 2, 3], 5, temperature=0, compile=True))  # compiled with the tie
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * -2 + 0.3)
    eager = list(generate_logprobs(model, [1, 2, 3], 12, temperature=0))
    ours = list(generate_logprobs(model, [1, 2, 3], 12, temperature=0, compile=True))
    _same_continuations(ours, eager)
    reference = copy.deepcopy(model)
    ours, theirs = (generate_logprobs(m, [4, 5], 10, temperature=0, compile=m is model) for m in (model, reference))
    assert [next(ours)[0] for _ in range(3)] == [next(theirs)[0] for _ in range(3)]
    for m in (model, reference):  # tied again within the call
        m.lm_head.weight = m.embed.weight
    _same_continuations(list(ours), list(theirs))

    held = generate_logprobs(model, [1, 2], 6, temperature=0, compile=True)
    next(held)
    clone = copy.deepcopy(model)
    held.close()
    w_out = clone.blocks[0].mlp.w_out
    assert "forward" in vars(w_out)  # the copy carries the bound forward, its mark unset
    x = torch.randn(1, w_out.in_features)
    y, code = _generated_code(lambda: torch.compile(w_out)(x))
    assert "extern_kernels.mm(" in code and torch.allclose(y, torch.nn.functional.linear(x, w_out.weight))


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(LLAMA, sliding_window=8), "sliding-window"),
        (dict(LLAMA, n_experts=4), "mixture-of-experts"),
        (dict(LLAMA, qk_norm="rmsnorm"), "QK-norm"),
        (dict(LLAMA, position="alibi"), "alibi position biases"),
        (dict(LLAMA, norm_position="post"), "norm_position 'post'"),
        (dict(LLAMA, attention="mla", kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8), "LatentAttention"),
        (LLAMA, "forward hooks"),  # a hook on the LM head (outside the blocks): a graph would call it once
    ],
)
def test_models_the_compiled_step_cannot_run_are_refused_by_name(kw, words):
    """compile=True on a model outside the compiled step's reach raises ValueError naming why (the
    first feature in the way), before any token; without compile the same model decodes (the eager step)."""
    model = _model(kw)
    if words == "forward hooks":
        model.lm_head.register_forward_hook(lambda module, args, out: out)
    assert words in compiled_decode_unsupported(model)
    with pytest.raises(ValueError, match=words):
        next(generate_logprobs(model, [1, 2], 3, temperature=0, compile=True))
    assert len(list(generate_logprobs(model, [1, 2], 3, temperature=0))) == 3
    assert model not in _COMPILED


def test_compile_must_be_a_bool(llama):
    """compile='no' is a mistake, not a true value: refused before any token, naming the value."""
    with pytest.raises(ValueError, match="compile='no' must be True or False"):
        next(generate_logprobs(llama, [1, 2], 3, temperature=0, compile="no"))


def test_cli_generate_compile(tmp_path, capsys):
    """`lmlab generate --compile` prints what it prints without; on a model it cannot run it exits 2 with
    one line naming the flag, the run and the reason."""
    import yaml

    from lmlab.checkpoint import save_checkpoint
    from lmlab.cli import main

    for name, kw in (("ok", LLAMA), ("windowed", dict(LLAMA, sliding_window=8))):
        run = tmp_path / name
        run.mkdir()
        (run / "run.yaml").write_text(
            yaml.safe_dump({"model": ModelConfig(**kw).to_dict(), "train": {}, "data": "none"})
        )
        save_checkpoint(run, 1, _model(kw), None, {"step": 1, "tokens_seen": 0})
    args = ["generate", str(tmp_path / "ok"), "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--temperature", "0"]
    assert main(args) == 0
    eager = capsys.readouterr().out
    assert main(args + ["--compile"]) == 0
    assert capsys.readouterr().out == eager and len(eager.split()) == 8
    assert main(["generate", str(tmp_path / "windowed"), "--prompt-ids", "1", "--compile"]) == 2
    err = capsys.readouterr().err
    assert "--compile" in err and "windowed" in err and "sliding-window" in err


def test_a_frozen_step_equals_the_eager_step_holds_its_weights_as_constants_and_sees_them_change():
    """The 'frozen' layout (the compiled batch-1 step compiled with Inductor's freezing, where the calibration
    measured it faster): greedy ids and log-probabilities as the eager step's (fp32); its generated code takes
    no weight as an input (they are constants: freezing took effect, which it does not when passed in
    torch.compile's options); weights written between tokens send the call's remaining steps down the eager
    path, and the next call compiles a graph for the new weights (and only then)."""
    import copy

    from lmlab.kernels.compiled_decode import frozen_state
    from lmlab.kernels.decode_layout import decode_layout_kind, release_decode_copies
    from lmlab.kernels.settings import KernelSettings

    torch.manual_seed(4)
    plain = TransformerLM(ModelConfig(**LLAMA), kernels=KernelSettings(False, False)).eval()
    frozen = copy.deepcopy(plain)
    frozen.set_kernels(KernelSettings(False, False, decode_frozen=[("fp32 batch 1", 1, True)]))
    assert decode_layout_kind(frozen, 1, compiled=True) == "frozen"
    assert decode_layout_kind(frozen, 2, compiled=True) == decode_layout_kind(frozen, 1) == "transposed"
    prompt = [5, 9, 2, 6]
    eager = list(generate_logprobs(plain, prompt, 12, temperature=0))
    ours, code = _generated_code(lambda: list(generate_logprobs(frozen, prompt, 12, temperature=0, compile=True)))
    _same_continuations(ours, eager)
    (fn,) = _COMPILED[frozen].values()
    assert fn.state == frozen_state(frozen)
    n_weights = len(list(frozen.parameters()))
    # the graph's inputs: the cache buffers, ids, position and the model's tensors unless they were frozen
    call = re.search(r"def call\(self, args\):\n\s+(.*?) = args", code) or re.search(
        r"def call\(args\):\n\s+(.*?) = args", code
    )
    assert call is not None and len(call[1].split(",")) < n_weights, call
    assert "assert_size_stride(" not in code
    ours = generate_logprobs(frozen, prompt, 8, temperature=0, compile=True)
    theirs = generate_logprobs(plain, prompt, 8, temperature=0)
    assert [next(ours)[0] for _ in range(3)] == [next(theirs)[0] for _ in range(3)]
    with torch.no_grad():
        for m in (frozen, plain):
            m.blocks[1].mlp.w_in.weight.mul_(-3.0)
            m.lm_head.weight.add_(0.5)
    _same_continuations(list(ours), list(theirs))  # the rest of the call: eager, with the new weights
    _same_continuations(
        list(generate_logprobs(frozen, prompt, 12, temperature=0, compile=True)),
        list(generate_logprobs(plain, prompt, 12, temperature=0)),
    )
    (fn2,) = _COMPILED[frozen].values()
    assert fn2 is not fn and fn2.state == frozen_state(frozen) != fn.state
    release_decode_copies(frozen)  # frees decode copies (it has none); the graph stays: no compile again
    list(generate_logprobs(frozen, prompt, 3, temperature=0, compile=True))
    assert list(_COMPILED[frozen].values()) == [fn2]
