"""The decoder-only Transformer LM: embeddings -> n_layers blocks -> final norm -> LM head.

Block layouts (lecture 3, "pre-norm vs post-norm", "serial vs parallel"):
- pre (GPT-2 onward; Xiong et al. 2020):   x = x + f(norm(x))
- post (Vaswani et al. 2017; OPT-350M):    x = norm(x + f(x))
- sandwich (Gemma 2/3):                    x = x + norm_out(f(norm_in(x)))
- reordered (OLMo 2):                      x = x + norm(f(x))
- parallel (GPT-J, PaLM):                  x = x + attn(norm(x)) + mlp(norm(x))  (one norm or two)

Initialisation (GPT-2, Radford et al. 2019, section 2.3; nanoGPT): every weight ~ N(0, init_std),
biases zero, the projections that write into the residual stream scaled by 1/sqrt(2 n_layers);
norm weights one (Gemma's offset form zero). The token embedding (and so a tied LM head) may have its own
std, ``embed_init_std`` (Vaswani et al. 2017's reference code: d_model^-0.5, with ``scale_embeddings``).
``parametrization`` mup / completep change the init of the hidden weights, scale the logits by 1/m and
(completep) each residual branch by base_n_layers / n_layers: :mod:`lmlab.model.parametrization`.

``embed_dim`` != d_model (OPT-350M, HF ``word_embed_proj_dim``): embeddings of width embed_dim, projected
in to d_model (``proj_in``, no bias) before the learned positions are added, and the final hidden state
projected out to embed_dim (``proj_out``, no bias) before the LM head.
"""

from __future__ import annotations

import contextlib
import gc
import math
from typing import Optional

import torch
import torch.nn as nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks
from torch.utils.checkpoint import checkpoint

from lmlab.config import ModelConfig
from lmlab.kernels.embedding import Embedding
from lmlab.kernels.linear import Linear
from lmlab.kernels.loss import linear_cross_entropy, lm_loss  # noqa: F401 (lm_loss re-exported)
from lmlab.kernels.settings import KernelSettings, default_kernels
from lmlab.model.attention import Attention, KVCache, softcap
from lmlab.model.deltanet import GatedDeltaNet
from lmlab.model.ffn import ACTIVATION_FNS, FeedForward
from lmlab.model.mla import MultiHeadLatentAttention
from lmlab.model.moe import MoEFeedForward
from lmlab.model.mtp import MTPModule, mtp_losses
from lmlab.model.norms import model_norm
from lmlab.model.parametrization import branch_multiplier, init_std, output_multiplier
from lmlab.model.positions import AbsolutePositions, alibi_slopes


class Block(nn.Module):
    """One Transformer layer: (batch, seq, d_model) -> (batch, seq, d_model)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.position_kind = cfg.norm_position
        self.parallel = cfg.parallel_block
        norm = lambda: model_norm(cfg)
        self.layer = layer
        self.linear = cfg.layer_is_linear(layer)  # a Gated DeltaNet layer in attention's place ('D')
        if self.linear:
            self.attn = GatedDeltaNet(
                cfg.d_model,
                cfg.linear_n_k_heads,
                cfg.linear_n_v_heads,
                cfg.linear_k_head_dim,
                cfg.linear_v_head_dim,
                cfg.linear_conv_kernel,
                cfg.linear_chunk,
                cfg.norm_eps,
            )
        else:
            self.attn = MultiHeadLatentAttention(cfg, layer) if cfg.attention == "mla" else Attention(cfg, layer)
        moe = cfg.layer_is_moe(layer)
        self.mlp = MoEFeedForward(cfg) if moe and not cfg.moe_beside_dense else FeedForward(cfg, cfg.layer_d_ff(layer))
        self.moe = None
        if moe and cfg.moe_beside_dense:  # Gemma 4: dense FFN and MoE side by side, each with its own norms
            self.moe = MoEFeedForward(cfg)
            self.dense_out_norm, self.moe_norm, self.moe_out_norm = norm(), norm(), norm()
        self.attn_norm = norm()
        self.mlp_norm = None if (self.parallel and cfg.parallel_shared_norm) else norm()
        if cfg.norm_position == "sandwich":
            self.attn_out_norm, self.mlp_out_norm = norm(), norm()
        self.drop = nn.Dropout(cfg.resid_dropout)
        self.branch_mult = branch_multiplier(cfg)  # completep: each branch's output x base_n_layers / n_layers
        self.ple = None
        if cfg.ple_dim:  # per-layer input embeddings (Gemma 4 E2B/E4B): gate d -> P, out P -> d, a norm
            self.ple = nn.ModuleDict(
                dict(
                    gate=Linear(cfg.d_model, cfg.ple_dim, bias=False),
                    out=Linear(cfg.ple_dim, cfg.d_model, bias=False),
                    norm=norm(),
                )
            )
            self.ple_act = ACTIVATION_FNS[cfg.activation]  # the FFN's (gate) nonlinearity (HF hidden_activation)
        if cfg.layer_scalar:  # Gemma 4: the block's output x s, a stored (persistent) buffer, not a parameter
            self.register_buffer("layer_scalar", torch.ones(1))
        else:
            self.layer_scalar = None

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: Optional[KVCache] = None,
        bias_fn=None,
        left_pad: Optional[torch.Tensor] = None,
        layer_input: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """x: (batch, seq, d_model); ``layer_input``: this layer's per-layer input embedding (batch, seq,
        ple_dim) when ``ple_dim`` is set (see :meth:`TransformerLM.per_layer_inputs`)."""
        y = self._forward(x, positions, cache, bias_fn, left_pad)
        if self.ple is not None:  # Gemma 4: y + norm(W_out(act(W_gate y) * e_i))
            y = y + self.ple.norm(self.ple.out(self.ple_act(self.ple.gate(y)) * layer_input))
        return y if self.layer_scalar is None else y * self.layer_scalar

    def _linear(self, h: torch.Tensor, cache: Optional[KVCache], left_pad: Optional[torch.Tensor]) -> torch.Tensor:
        """The Gated DeltaNet layer on h (batch, seq, d_model), its state in ``cache`` (when given) and the
        left padding's inputs zeroed (see ``GatedDeltaNet.forward``)."""
        real = None
        if left_pad is not None:
            start = cache.length if cache is not None else 0
            if cache is None or start < cache.pad_max:
                real = torch.arange(start, start + h.shape[1], device=h.device)[None, :] >= left_pad[:, None]
        return self.attn(h, cache.linear_state(self.layer) if cache is not None else None, real)

    def _forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: Optional[KVCache],
        bias_fn,
        left_pad: Optional[torch.Tensor],
    ) -> torch.Tensor:
        if self.linear:
            mixer = lambda h: self._linear(h, cache, left_pad)  # noqa: E731
        else:
            mixer = lambda h: self.attn(h, positions, cache, bias_fn, left_pad)  # noqa: E731
        if self.training and self.drop.p > 0:
            attn = lambda h: self.drop(mixer(h))  # noqa: E731
            mlp = lambda h: self.drop(self.mlp(h))  # noqa: E731
        else:  # dropout is the identity: skip its call (decode speed)
            attn = mixer
            mlp = self.mlp
        kind = self.position_kind
        s = self.branch_mult  # r(y): a branch's output as added to the stream (completep: x s; else y itself)
        r = (lambda y: y) if s == 1.0 else (lambda y: y * s)  # noqa: E731
        if self.parallel:
            h = self.attn_norm(x)
            return x + r(attn(h)) + r(mlp(h if self.mlp_norm is None else self.mlp_norm(x)))
        if kind == "pre":
            x = x + r(attn(self.attn_norm(x)))
            return x + r(mlp(self.mlp_norm(x)))
        if kind == "post":  # no branch multiplier: completep refuses post-norm
            x = self.attn_norm(x + attn(x))
            return self.mlp_norm(x + mlp(x))
        if kind == "sandwich":
            x = x + r(self.attn_out_norm(attn(self.attn_norm(x))))
            if self.moe is not None:  # Gemma 4 26B-A4B: norm(norm1(FFN(n(x))) + norm2(MoE(n2(x); router reads x)))
                both = self.dense_out_norm(mlp(self.mlp_norm(x))) + self.moe_out_norm(self.moe(self.moe_norm(x), x))
                return x + r(self.mlp_out_norm(both))
            return x + r(self.mlp_out_norm(mlp(self.mlp_norm(x))))
        # reordered (OLMo 2): normalise the sublayer output, no input norm
        x = x + r(self.attn_norm(attn(x)))
        return x + r(self.mlp_norm(mlp(x)))

    def decode_one_obstacle(self) -> Optional[str]:
        """What keeps :meth:`decode_one` from running this block, as a phrase, or None when it can: it
        needs pre-norm (serial or parallel), plain attention (``Attention.decode_one_obstacle``; not MLA
        or linear attention), no per-layer scalar or per-layer inputs (Gemma 4)."""
        if self.position_kind != "pre":
            return f"norm_position {self.position_kind!r} (the lean path is pre-norm)"
        if not hasattr(self.attn, "decode_one_obstacle"):
            return f"{type(self.attn).__name__} layers"
        if self.layer_scalar is not None or self.ple is not None:
            return "Gemma 4's per-layer scalar or inputs"
        return self.attn.decode_one_obstacle()

    @property
    def supports_decode_one(self) -> bool:
        """Whether :meth:`decode_one` can run this block (:meth:`decode_one_obstacle` is None)."""
        return self.decode_one_obstacle() is None

    def decode_one(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One new token per row, inference only: x (batch, d_model) -> (batch, d_model), equal to
        :meth:`forward` (on (batch, 1, d_model)) for a block with :attr:`supports_decode_one`, with the
        sub-modules' ``forward`` called directly (no ``nn.Module.__call__``: at one token a step its overhead
        rivals the arithmetic)."""
        mlp = self.mlp

        def ffn(h: torch.Tensor) -> torch.Tensor:
            if isinstance(mlp, MoEFeedForward):
                return mlp.forward(h)
            return mlp.w_out.forward(mlp.hidden(mlp.w_in.forward(h)))

        h = self.attn_norm.forward(x)
        s = self.branch_mult
        if s != 1.0:  # completep's branch multiplier (see _forward)
            if self.parallel:
                return (
                    x
                    + s * self.attn.decode_one(h, positions, cache)
                    + s * ffn(h if self.mlp_norm is None else self.mlp_norm.forward(x))
                )
            x = x + s * self.attn.decode_one(h, positions, cache)
            return x + s * ffn(self.mlp_norm.forward(x))
        if self.parallel:
            return (
                x
                + self.attn.decode_one(h, positions, cache)
                + ffn(h if self.mlp_norm is None else self.mlp_norm.forward(x))
            )
        x = x + self.attn.decode_one(h, positions, cache)
        return x + ffn(self.mlp_norm.forward(x))


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic garbage collector paused (as it was before, after): building a model's blocks makes no
    garbage cycles, yet the objects it allocates (hundreds of thousands for a real-size MoE sized on the
    meta device) trigger collections, each of which walks every live object of the process
    (docs/bench/model_build.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class TransformerLM(nn.Module):
    """Decoder-only LM: token ids (batch, seq) -> logits (batch, seq, vocab_size), fp32. ``kernels``: the
    CPU kernels it uses (:class:`lmlab.kernels.settings.KernelSettings`; None: this process's defaults);
    :meth:`set_kernels` changes them."""

    def __init__(self, cfg: ModelConfig, kernels: Optional[KernelSettings] = None):
        super().__init__()
        self.cfg = cfg
        embed_dim = cfg.embed_dim or cfg.d_model  # OPT-350M: narrower embeddings projected in and out
        self.embed = Embedding(cfg.vocab_size, embed_dim)  # deterministic gradient when compiled
        self.proj_in = Linear(embed_dim, cfg.d_model, bias=False) if embed_dim != cfg.d_model else None
        self.proj_out = Linear(cfg.d_model, embed_dim, bias=False) if embed_dim != cfg.d_model else None
        self.abs_pos = AbsolutePositions(cfg) if cfg.position in ("learned", "sinusoidal") else None
        self.embd_drop = nn.Dropout(cfg.embd_dropout)
        with _gc_paused():
            self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
            # multi-token prediction (lmlab.model.mtp): training-only modules, each a block like the last layer
            self.mtp = (
                nn.ModuleList(MTPModule(cfg, Block(cfg, cfg.n_layers - 1)) for _ in range(cfg.mtp_depth))
                if cfg.mtp_depth
                else None
            )
        self.mtp_last: Optional[list] = None  # the last training forward's MTP losses (detached), for the log
        self.final_norm = model_norm(cfg) if cfg.final_norm else None
        self.lm_head = Linear(embed_dim, cfg.vocab_size, bias=cfg.lm_head_bias)
        # what the logits are multiplied by: logit_scale, x 1/m under mup / completep (their output multiplier)
        self.logit_mult = cfg.logit_scale * output_multiplier(cfg)
        if cfg.position == "alibi":
            self.register_buffer("alibi", alibi_slopes(cfg.n_heads), persistent=False)
        self.rel_bias = None
        if cfg.position == "t5":
            from lmlab.model.t5_bias import T5RelativeBias  # T5 relative position buckets

            self.rel_bias = T5RelativeBias(cfg)
        self.ple_embed = self.ple_proj = self.ple_norm = None
        if cfg.ple_dim:  # per-layer input embeddings (Gemma 4 E2B/E4B; HF embed_tokens_per_layer)
            width = cfg.n_layers * cfg.ple_dim
            self.ple_embed = Embedding(cfg.ple_vocab_size or cfg.vocab_size, width)
            self.ple_proj = Linear(cfg.d_model, width, bias=False)
            self.ple_norm = model_norm(cfg, cfg.ple_dim)
        for block in self.blocks:  # KV sharing: each consumer reads its source layer's keys and values
            src = block.attn.kv_source_layer if isinstance(block.attn, Attention) else None
            if src is not None:
                object.__setattr__(block.attn, "_kv_source", self.blocks[src].attn)  # not a submodule
                self.blocks[src].attn.kv_store = True
        ropes: dict = {}  # layers with the same RoPE share one module: one table, gathered once per forward
        for block in [*self.blocks, *(m.block for m in self.mtp or [])]:
            if block.attn.rope is not None:
                block.attn.rope = ropes.setdefault(block.attn.rope.key, block.attn.rope)
        self._position_tables = [m for m in self.modules() if hasattr(type(m), "ensure")]
        self.lean_decode = False  # set by lmlab.kernels.decode_layout.decode_layout while generating (see hidden)
        self.decode_reductions = False  # decode_layout's 'row-reductions' (the compiled step's attention too)
        self.decode_frozen = False  # decode_layout's 'frozen': the compiled step compiles with Inductor's freezing
        # activation checkpointing (TrainConfig.activation_checkpointing): in training, each block's
        # activations are recomputed in backward (torch.utils.checkpoint, non-reentrant) instead of kept
        self.checkpoint_blocks = False
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.set_kernels(kernels or default_kernels())

    def set_kernels(self, kernels: KernelSettings) -> None:
        """Use ``kernels`` from now on, in every layer (its linears, attention and loss). A compiled model
        recompiles for new settings (they are constants to torch.compile)."""
        self.kernels = kernels
        for m in self.modules():
            if m is not self and "kernels" in vars(m):  # not hasattr: a miss costs nn.Module.__getattr__
                m.kernels = kernels

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module._apply`` (behind ``to``, ``to_empty``, ``cuda``, ``float``, ...), then two repairs for
        a model leaving the meta device (``with torch.device('meta'): TransformerLM(cfg)``, then
        ``model.to_empty(device=...)``, then ``load_state_dict``): a tied LM head is tied again (``_apply``
        gives each of the two names its own new Parameter when the device type changes), and the
        non-persistent tables (RoPE cos/sin, ALiBi slopes, sinusoidal positions), which no state dict
        carries and ``to_empty`` leaves uninitialised, are recomputed (see :meth:`reset_tables`)."""
        was_meta = any(b.is_meta for b in self.buffers())
        super()._apply(fn, recurse)
        if self.cfg.tie_embeddings and self.lm_head.weight is not self.embed.weight:
            self.lm_head.weight = self.embed.weight
        if was_meta and not any(b.is_meta for b in self.buffers()):
            self.reset_tables()
        return self

    def reset_tables(self) -> None:
        """Recompute the non-persistent buffers from the config, on their devices: RoPE tables, ALiBi
        slopes, the sinusoidal position table. Called by :meth:`_apply` after materialisation from the
        meta device; parameters and persistent buffers come from ``load_state_dict`` (or
        :meth:`reset_parameters`)."""
        for module in self.modules():
            if module is not self and hasattr(type(module), "reset_tables"):
                module.reset_tables()
        if self.cfg.position == "alibi":
            with torch.device("cpu"):
                slopes = alibi_slopes(self.cfg.n_heads)
            self.alibi = slopes.to(device=self.alibi.device, dtype=self.alibi.dtype)

    def reset_parameters(self) -> None:
        if self.embed.weight.is_meta:  # built on the meta device (sizing a real config): no values to draw
            return
        std = self.cfg.init_std
        # the token embedding's std (cfg.embed_init_std, e.g. d_model^-0.5 as Vaswani et al.'s reference code):
        # a tied LM head is the same matrix (when this runs after tying), so it is drawn at that std too
        embed_std = std if self.cfg.embed_init_std is None else self.cfg.embed_init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                # sp: std, x 1/sqrt(2 n_layers) on residual projections; mup / completep: lmlab.model.parametrization
                role = "output" if module is self.lm_head else "hidden"
                own = init_std(self.cfg, role, getattr(module, "is_residual_projection", False))
                tied = module.weight is self.embed.weight
                nn.init.normal_(module.weight, 0.0, embed_std if tied else own)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, embed_std if module is self.embed else std)
        if self.abs_pos is not None and self.cfg.position == "learned":
            nn.init.normal_(self.abs_pos.weight, 0.0, std)
        for block in self.blocks:
            if block.layer_scalar is not None:
                nn.init.ones_(block.layer_scalar)
            if block.linear:  # its convolution, decay and norm (its projections are Linears, drawn above)
                block.attn.reset_gdn_parameters()
            if getattr(block.attn, "sinks", None) is not None:  # a sink logit of 0: one blank key's worth
                nn.init.zeros_(block.attn.sinks)

    def _bias_fn(self):
        if self.cfg.position == "alibi":

            def alibi(q_pos, k_pos, layer):
                dist = (q_pos[:, None] - k_pos[None, :]).float()  # (T, S), >= 0 where attended
                return -self.alibi[:, None, None] * dist[None]

            return alibi
        if self.rel_bias is not None:
            return lambda q_pos, k_pos, layer: self.rel_bias(q_pos, k_pos)
        return None

    def forward(
        self,
        idx: torch.Tensor,
        cache: Optional[KVCache] = None,
        left_pad: Optional[torch.Tensor] = None,
        targets: Optional[torch.Tensor] = None,
        reduction: str = "mean",
    ):
        """idx: (batch, seq) token ids. With ``cache``, idx continues the cached positions and the
        cache is advanced by seq. ``left_pad`` (batch,): leading padding tokens of each row (batched
        prompts of different lengths): row b's token i sits at position i - left_pad[b] and padding is
        never attended to; with a cache it is stored there (set it with the first tokens) and applies to
        every later call. Returns logits (batch, seq, vocab_size) in fp32.

        With ``targets`` (batch, seq) ids (-100 not scored) it returns the training loss instead:
        (cross-entropy + ``cfg.z_loss`` z-loss + the MoE auxiliary losses (:meth:`moe_aux_loss`),
        cross-entropy alone, detached) in nats, summed or
        averaged over the scored tokens (``reduction``), from :func:`lmlab.kernels.loss.linear_cross_entropy`
        (chunked; the logits are never materialised). This is the call ``lmlab train`` makes, through
        DDP/FSDP wrappers too."""
        if targets is not None and self.mtp is not None and self.training:  # + multi-token prediction
            raw = self.hidden(idx, cache, left_pad, final=False)
            losses = mtp_losses(self, raw, idx, targets)  # first: the MoE losses below include the modules' MoE
            loss, ce = self.loss_from_hidden(
                self.final_norm(raw) if self.final_norm is not None else raw, targets, reduction, mtp=True
            )
            self.mtp_last = [x.detach() for x in losses]
            if losses:  # per token, like the cross-entropy: times the scored tokens for 'sum'
                n = int((targets != -100).sum()) if reduction == "sum" else 1
                loss = loss + self.cfg.mtp_weight / len(self.mtp) * torch.stack(losses).sum() * n
            return loss, ce
        h = self.hidden(idx, cache, left_pad)
        if targets is None:
            return self.logits(h)
        return self.loss_from_hidden(h, targets, reduction)

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        """What the LM head's weight multiplies: h (batch, seq, d_model) after ``proj_out`` and x the logit
        multiplier (s (h W^T + b) = (s h) W^T + s b)."""
        if self.proj_out is not None:
            h = self.proj_out(h)
        return h * self.logit_mult if self.logit_mult != 1.0 else h

    def head_bias(self) -> Optional[torch.Tensor]:
        """The LM head's bias x the logit multiplier (None without a bias)."""
        bias = self.lm_head.bias
        return bias * self.logit_mult if (bias is not None and self.logit_mult != 1.0) else bias

    def loss_from_hidden(self, h: torch.Tensor, targets: torch.Tensor, reduction: str = "mean", mtp: bool = False):
        """The LM head and loss of :meth:`forward` with ``targets``, from final hidden states
        (batch, seq, d_model): the same numbers as ``lm_loss(self.logits(h), targets, cfg.z_loss)``, plus the
        MoE losses (:meth:`moe_aux_loss`; with ``mtp`` over the multi-token modules' MoE layers too, whose
        forward must have run first)."""
        loss, ce = linear_cross_entropy(
            self.head_input(h),
            self.lm_head.weight,
            targets,
            self.head_bias(),
            self.cfg.z_loss,
            self.cfg.final_logit_softcap,
            reduction,
            onednn=self.kernels.onednn_fp32,
        )
        aux = self.moe_aux_loss(mtp)
        if aux is not None:  # per token, like the cross-entropy: times the scored tokens for 'sum'
            loss = loss + aux * (int((targets != -100).sum()) if reduction == "sum" else 1)
        return loss, ce

    def moe_layers(self, mtp: bool = False) -> list[MoEFeedForward]:
        """The mixture-of-experts FFNs, in layer order (none for a dense model); with ``mtp`` then those of the
        multi-token-prediction modules' blocks (DeepSeek-V3's MTP module is an MoE layer)."""
        blocks = [*self.blocks, *(m.block for m in (self.mtp or []) if mtp)]
        return [m for b in blocks for m in (b.mlp, b.moe) if isinstance(m, MoEFeedForward)]

    def moe_aux_loss(self, mtp: bool = False) -> Optional[torch.Tensor]:
        """``moe_aux_loss`` x the load-balancing loss + ``moe_router_z_loss`` x the router z-loss +
        ``moe_seq_aux_loss`` x the sequence-wise balance loss, each averaged over the MoE layers' last forward
        (:mod:`lmlab.model.moe`; with ``mtp`` the modules' too); None for a dense model or when every weight
        is 0."""
        layers = self.moe_layers(mtp)
        weights = (self.cfg.moe_aux_loss, self.cfg.moe_router_z_loss, self.cfg.moe_seq_aux_loss)
        if not layers or not any(weights) or any(m.aux is None for m in layers):
            return None
        return sum(w * torch.stack([m.aux[i] for m in layers]).mean() for i, w in enumerate(weights) if w)

    def update_moe_bias(self, apply: bool = True, reduce=None) -> None:
        """After an optimizer step (``apply``; False after a skipped one): each MoE layer's auxiliary-loss-free
        bias update (:meth:`lmlab.model.moe.MoEFeedForward.update_bias`); nothing without ``moe_balance``
        'aux_free' / 'both'."""
        for m in self.moe_layers(mtp=self.mtp is not None):  # the modules' experts train, so their bias moves
            m.update_bias(apply, reduce)

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """Token embeddings (batch, seq, d_model) of ids (batch, seq): the table, x sqrt(d_model) with
        ``scale_embeddings``, then ``proj_in`` (no positions)."""
        x = self.embed(idx)
        if self.cfg.scale_embeddings:
            x = x * torch.tensor(math.sqrt(self.cfg.d_model), dtype=x.dtype)
        return self.proj_in(x) if self.proj_in is not None else x

    def hidden(
        self,
        idx: torch.Tensor,
        cache: Optional[KVCache] = None,
        left_pad: Optional[torch.Tensor] = None,
        final: bool = True,
    ) -> torch.Tensor:
        """Final hidden states (batch, seq, d_model), after the final norm (``final``; False: the last
        block's output, as multi-token prediction reads it)."""
        T = idx.shape[1]
        start, pad_min = 0, 0
        if cache is not None:
            start = cache.length
            if left_pad is not None:
                cache.set_left_pad(left_pad)
            left_pad, pad_min = cache.left_pad, cache.pad_min
        elif left_pad is not None:
            left_pad = torch.as_tensor(left_pad, dtype=torch.long, device=idx.device)
            pad_min = int(left_pad.min())
            left_pad = left_pad if int(left_pad.max()) else None
        lean = T == 1 and cache is not None and self.lean_decode and not (torch.is_grad_enabled() or self.training)
        if lean and left_pad is None and self.abs_pos is None:
            positions = slice(start, start + 1)  # RoPE then reads a view of its tables, no gather
        else:
            positions = torch.arange(start, start + T, device=idx.device)
            if left_pad is not None:  # per row: cache index minus the row's padding (padding itself at 0)
                positions = (positions[None, :] - left_pad[:, None]).clamp(min=0)
        for module in self._position_tables:
            module.ensure(start + T - pad_min)
        if lean:
            h = self.decode_hidden(idx, positions, cache, final)
            cache.length += T
            return h
        x = self.embed_tokens(idx)
        if self.abs_pos is not None:
            x = x + self.abs_pos(positions).to(x.dtype)
        ple = self.per_layer_inputs(idx, x) if self.ple_embed is not None else None
        if self.training and self.embd_drop.p > 0:
            x = self.embd_drop(x)
        bias_fn = self._bias_fn()
        if self.checkpoint_blocks and cache is None and self.training and torch.is_grad_enabled():
            for i, block in enumerate(self.blocks):  # activations recomputed in backward, block by block
                x = checkpoint(
                    block,
                    x,
                    positions,
                    cache,
                    bias_fn,
                    left_pad,
                    None if ple is None else ple[:, :, i],
                    use_reentrant=False,
                )
        else:
            for i, block in enumerate(self.blocks):
                x = block(x, positions, cache, bias_fn, left_pad, None if ple is None else ple[:, :, i])
        if not (self.checkpoint_blocks and self.training):  # checkpointed consumers read them again in backward
            for block in self.blocks:  # drop the shared keys and values of this forward (KV sharing)
                if getattr(block.attn, "kv_store", False):
                    block.attn._kv = None
        if cache is not None:
            cache.length += T
        return self.final_norm(x) if (self.final_norm is not None and final) else x

    def decode_hidden(self, idx: torch.Tensor, positions, cache, final: bool = True) -> torch.Tensor:
        """The lean one-token step of :meth:`hidden` (inference, ``lean_decode_possible()``): ids (batch, 1)
        at ``positions`` ((1,) or per row (batch, 1) long, or a ``slice`` of one position) through every
        block's ``decode_one`` over ``cache`` (which the caller advances) -> (batch, 1, d_model), after the
        final norm (``final``). Also the body of the compiled decode step (:mod:`lmlab.kernels.compiled_decode`)."""
        x = self.embed_tokens(idx)
        if self.abs_pos is not None:
            x = x + self.abs_pos(positions).to(x.dtype)
        x = x.view(x.shape[0], x.shape[2])  # the blocks' one-token path works on (batch, d_model)
        for block in self.blocks:
            x = block.decode_one(x, positions, cache)
        x = x.unsqueeze(1)
        return self.final_norm(x) if (self.final_norm is not None and final) else x

    def per_layer_inputs(self, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Gemma 4's per-layer input embeddings (HF ``get_per_layer_inputs`` + ``project_per_layer_inputs``):
        idx (batch, seq) ids and x (batch, seq, d_model) the (scaled) token embeddings -> (batch, seq,
        n_layers, ple_dim) = (norm(W x / sqrt(d_model)) + E[idx] sqrt(ple_dim)) / sqrt(2)."""
        cfg = self.cfg
        shape = (*idx.shape, cfg.n_layers, cfg.ple_dim)
        tok = self.ple_embed(idx) * torch.tensor(math.sqrt(cfg.ple_dim), dtype=self.ple_embed.weight.dtype)
        proj = self.ple_norm((self.ple_proj(x) * cfg.d_model**-0.5).view(shape))
        return (proj + tok.view(shape)) * 2**-0.5

    def lean_decode_possible(self) -> bool:
        """Whether one-token cached steps may take the blocks' lean ``decode_one`` path: no ALiBi/T5 bias,
        every block eligible (``Block.supports_decode_one``), and no forward hooks on the blocks or inside them,
        nor global ones (hooks, e.g. FSDP's, must see every call, so they keep the ordinary path).
        :func:`lmlab.kernels.decode_layout.decode_layout` checks this once when generation starts and sets
        ``lean_decode`` for its duration; ``hidden`` then takes the lean path for steps of one token under
        inference (no autograd, eval mode)."""
        return self.lean_decode_obstacle() is None

    def lean_decode_obstacle(self) -> Optional[str]:
        """What keeps one-token steps off the lean path (see :meth:`lean_decode_possible`), as a phrase,
        or None."""
        if self.cfg.position in ("alibi", "t5"):
            return f"{self.cfg.position} position biases"
        if _global_forward_hooks or _global_forward_pre_hooks:
            return "global forward hooks"
        if any(m._forward_hooks or m._forward_pre_hooks for m in self.blocks.modules()):
            return "forward hooks on the blocks"
        return next((why for why in (b.decode_one_obstacle() for b in self.blocks) if why), None)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM head with the optional final-logit soft-cap: (batch, seq, d_model) -> fp32 logits. With
        ``embed_dim`` != d_model the states are first projected out to embed_dim (``proj_out``)."""
        if self.proj_out is not None:  # embed_dim != d_model: back to the embedding width (OPT-350M)
            h = self.proj_out(h)
        logits = self.lm_head(h)
        if logits.dtype != torch.float32:
            logits = logits.float()
        if self.logit_mult != 1.0:  # Cohere: logits * logit_scale, before any soft-cap (and mup's 1/m)
            logits = logits * self.logit_mult
        return softcap(logits, self.cfg.final_logit_softcap)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once); ``non_embedding`` drops the token embedding, the
        per-layer input embedding table (``ple_dim``) and learned positions (Kaplan et al. 2020's N), keeping
        an untied LM head."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed.weight.numel()
            if self.ple_embed is not None:  # the per-layer input embedding table is an embedding too
                n -= self.ple_embed.weight.numel()
            if self.abs_pos is not None and self.cfg.position == "learned":
                n -= self.abs_pos.weight.numel()
        return n
