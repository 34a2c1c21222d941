"""Which CPU kernels a model uses: one explicit record, decided once per process from the CPU and the
torch build (:func:`default_kernels`), passed at model build (``TransformerLM(cfg, kernels=...)``),
changed only through ``TransformerLM.set_kernels`` and printed at ``lmlab train``'s startup. No module
of :mod:`lmlab.kernels` reads a global switch.

The defaults follow the measurements in docs/bench/measured-choices.md (the vendor rule there is the
rule issue 42 replaces by a measurement on the machine at hand).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class KernelSettings:
    """``onednn_fp32``: fp32 CPU linears (and the chunked loss's head products) on oneDNN rather than
    MKL (:mod:`lmlab.kernels.linear`; used only where this torch build has oneDNN's op on x86-64);
    ``blocked_attention_fp32``: fp32 training attention on one thread through the blocked loops rather
    than SDPA (:mod:`lmlab.kernels.causal_attention`; bf16 always takes them); ``fused_loops``: inside a
    compiled model the blocked loops are traced into its graph (False: eager loops behind a graph break
    per layer, for comparisons)."""

    onednn_fp32: bool
    blocked_attention_fp32: bool
    fused_loops: bool = True

    def describe(self) -> str:
        """One line for the startup message, e.g. 'fp32 linears on oneDNN, blocked fp32 attention'."""
        from lmlab.kernels.linear import onednn_available

        parts = ["fp32 linears on " + ("oneDNN" if self.onednn_fp32 and onednn_available() else "MKL"),
                 "fp32 attention " + ("blocked on one thread" if self.blocked_attention_fp32 else "SDPA")]
        if not self.fused_loops:
            parts.append("unfused attention loops")
        return ", ".join(parts)


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The x86 CPU's vendor string ('GenuineIntel', 'AuthenticAMD', ...) from the ``vendor_id`` line of
    ``cpuinfo`` (Linux), else from ``platform.processor()`` (Windows names it there); '' where neither
    says."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    proc = platform.processor()
    return next((v for v in ("GenuineIntel", "AuthenticAMD") if v in proc), "")


def onednn_fp32_default(vendor: str) -> bool:
    """Whether fp32 linears take oneDNN by default on a CPU of this vendor: everywhere but on Intel's
    CPUs, where MKL's sgemm measured faster."""
    return vendor != "GenuineIntel"


@lru_cache(maxsize=None)
def default_kernels() -> KernelSettings:
    """This process's defaults (computed once: the CPU does not change under a running process)."""
    vendor = cpu_vendor()
    return KernelSettings(onednn_fp32=onednn_fp32_default(vendor), blocked_attention_fp32=vendor != "GenuineIntel")
