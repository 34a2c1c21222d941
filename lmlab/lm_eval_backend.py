"""An EleutherAI lm-evaluation-harness model backend for lmlab runs (the ``eval`` extra: ``lm-eval``).

``LmlabLM`` is an ``lm_eval.api.model.TemplateLM`` registered as ``lmlab``: the harness's three request
types answered with a run's model and tokenizer.

- ``loglikelihood``: log P(continuation | context) in nats and whether greedy decoding would produce the
  continuation; the context is cut from the left to fit ``context_length`` (the harness's own rule);
  requests are batched, right-padded (a causal model's earlier positions do not see the padding).
- ``loglikelihood_rolling``: the total log-likelihood of a text in disjoint windows of
  ``context_length`` tokens (``lm_eval.utils.get_rolling_token_windows``), for perplexity tasks.
- ``generate_until``: greedy or sampled continuation with the KV cache (:func:`lmlab.generate.generate`)
  up to ``max_gen_toks`` tokens (or until a stop string appears), decoded (invalid UTF-8 as U+FFFD)
  and cut before the first ``until`` string, as the harness's ``hf`` backend does.

Use: ``lmlab eval RUN --tasks NAMES`` (:func:`run_tasks`), or the harness's own CLI with lmlab
registered: ``python -m lmlab.lm_eval_backend run --model lmlab --model_args run=RUN --tasks ...``
(lm-eval 0.4 has no hook for out-of-tree models, so ``lm_eval --model lmlab`` itself cannot find it;
EleutherAI/lm-evaluation-harness issues 1621 and 3282). Tested against the harness's ``hf`` backend on
an imported model with the same weights: equal per-request log-likelihoods and accuracy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

try:
    import lm_eval.models  # noqa: F401  (the harness's own backends stay registered beside ours)
except ImportError as exc:
    if __name__ == "__main__":  # python -m lmlab.lm_eval_backend: one line, not a traceback
        sys.exit(
            f"python -m lmlab.lm_eval_backend: needs lm-evaluation-harness ({exc}); install the "
            f"extra: pip install 'lmlab[eval]'"
        )
    raise
import difflib

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from lmlab.checkpoint import load_run
from lmlab.config import ConfigError
from lmlab.generate import TextStream, generate


@register_model("lmlab")
class LmlabLM(TemplateLM):
    """lm-eval backend over a run folder (``run=RUN``): the latest checkpoint (or ``step``) and the
    run's tokenizer, on ``device`` (default cpu), ``batch_size`` requests per forward pass."""

    def __init__(
        self,
        run: str,
        step: Optional[int] = None,
        device: str = "cpu",
        batch_size: int | str = 8,
        max_batch_size: Optional[int] = None,
        **kwargs,
    ) -> None:
        super().__init__()
        self.model, self.cfg, self.tok, _, _ = load_run(
            Path(run), step=None if step is None else int(step), device=device
        )
        self._device = torch.device(device)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8

    @property
    def eot_token_id(self) -> int:
        return self.tok.eot_id

    @property
    def max_length(self) -> int:
        return self.cfg.context_length

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.tok.decode(tokens)

    @torch.no_grad()
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log P(cont | ctx) in nats, cont is the greedy continuation) per (ctx, cont) token pair,
        the inputs cut from the left to context_length."""
        T = self.cfg.context_length
        out: list[tuple[float, bool]] = []
        for i in range(0, len(pairs), self.batch_size):
            chunk = pairs[i : i + self.batch_size]
            inputs = [(ctx + cont)[-(T + 1) :][:-1] for ctx, cont in chunk]
            width = max(len(x) for x in inputs)
            batch = torch.zeros(len(chunk), width, dtype=torch.long)
            for row, x in enumerate(inputs):
                batch[row, : len(x)] = torch.tensor(x)
            logp = torch.log_softmax(self.model(batch.to(self._device)).double(), dim=-1)
            for row, ((_, cont), x) in enumerate(zip(chunk, inputs)):
                n = len(cont)
                lp = logp[row, len(x) - n : len(x)]  # the positions that predict the continuation
                target = torch.tensor(cont, device=lp.device)
                total = float(lp.gather(-1, target[:, None]).sum())
                out.append((total, bool((lp.argmax(-1) == target).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self._score([(ctx, cont) for _, ctx, cont in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (text,) in [r.args for r in requests]:
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(self.tok_encode(text), self.eot_token_id, self.max_length, 1)
            ]
            out.append(sum(lp for lp, _ in self._score(windows)))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, kwargs in [r.args for r in requests]:
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            n = int(kwargs.pop("max_gen_toks", 256))
            temperature = float(kwargs.pop("temperature", 1.0)) if kwargs.pop("do_sample", False) else 0.0
            ids = self.tok_encode(context)[-(self.max_length - 1) :] or [self.eot_token_id]
            n = max(1, min(n, self.max_length - len(ids) + 1))
            stream, new = TextStream(until), []
            for token in generate(self.model, ids, n, temperature=temperature, seed=0, device=self._device):
                new.append(token)
                stream.push(self.tok.token_bytes(token))
                if stream.stopped:  # a stop string appeared: no need to decode further
                    break
            text = self.tok.decode(new)  # as the harness's hf backend: decode, then cut at each stop string
            for term in until:
                text = text.split(term)[0]
            out.append(text)
        return out


def run_tasks(
    run: str | Path,
    tasks: list[str],
    include_path: Optional[str | Path] = None,
    num_fewshot: Optional[int] = None,
    limit: Optional[int] = None,
    batch_size: int = 8,
    device: str = "cpu",
) -> dict:
    """Score run ``run`` on lm-eval ``tasks`` (names of tasks, groups or tags, task YAML files, or task
    YAMLs found in the folder ``include_path``); returns lm-eval's results mapping (per task its
    metrics, e.g. ``acc,none``). Raises ConfigError, before the run is loaded, for no task, an unknown
    one (with the nearest names) or an ``include_path`` that is not a folder."""

    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = [t.strip() for t in tasks if t.strip()]
    if not tasks:
        raise ConfigError("--tasks names no task; give lm-eval task names, e.g. hellaswag,arc_easy")
    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path {str(include_path)!r} is not a folder (of task YAMLs)")
    manager = TaskManager(include_path=str(include_path)) if include_path else TaskManager()
    known = set(manager.all_tasks)
    for name in tasks:
        if name not in known and not Path(name).is_file():
            near = difflib.get_close_matches(name, sorted(known), n=3)
            raise ConfigError(
                f"--tasks: {name!r} is not an lm-eval task, group or tag, nor a task YAML file"
                + (f"; did you mean {', '.join(map(repr, near))}?" if near else "")
                + " (`python -m lmlab.lm_eval_backend ls tasks` lists them)"
            )
    return lm_eval.simple_evaluate(
        model=LmlabLM(str(run), device=device, batch_size=batch_size),
        tasks=list(tasks),
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=manager,
        bootstrap_iters=0,
    )


if __name__ == "__main__":  # lm-eval's CLI with the lmlab backend registered
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
