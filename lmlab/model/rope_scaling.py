"""RoPE context extension (lecture 3, "position embeddings" / long context): change the rotary
frequencies so a model trained at ``original_max_position_embeddings`` tokens works at ``factor`` times
that length.

- "linear": position interpolation (Chen et al. 2023, "Extending Context Window of Large Language
  Models via Positional Interpolation"): every frequency divided by ``factor``.
- "ntk": NTK-aware scaling (bloc97 2023, "NTK-Aware Scaled RoPE"; described in Peng et al. 2023):
  a larger base theta' = theta * factor^(rot_dim / (rot_dim - 2)), which leaves the fastest pair as it is and
  interpolates the slowest one by exactly ``factor``.
- "yarn": YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
  Models"): "NTK-by-parts" frequencies plus an attention temperature.
- "llama3": Llama 3.1's scaling (Meta, Llama 3.1 model card / reference code, 2024): low frequencies
  divided by ``factor``, high ones kept, a linear blend between.

The formulas follow Hugging Face transformers' ``modeling_rope_utils.py`` (``ROPE_INIT_FUNCTIONS``:
linear, dynamic at its full factor for ntk, yarn, llama3), so configs carry over; the code is ours.
All frequencies are in radians per token, fp32.

Keys of the ``rope_scaling`` mapping: ``type`` plus the per-type required and optional keys of
``lmlab.config_checks.ROPE_SCALING_KEYS`` (checked by ``ModelConfig``, which raises ConfigError).
"""

from __future__ import annotations

import math

import torch

from lmlab.config_checks import ROPE_SCALING_KEYS, ROPE_SCALINGS  # noqa: F401  (key tables live with the config's rules)


def _base_inv_freq(rot_dim: int, theta: float) -> torch.Tensor:
    """theta^(-2i/rot_dim) for i < rot_dim/2, fp32 (computed in fp64)."""
    return (1.0 / theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)).float()


def linear_inv_freq(inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
    """Position interpolation (Chen et al. 2023, arXiv:2306.15595): position p is read as p / factor,
    i.e. every inverse frequency is divided by ``factor``. (rot_dim/2,) -> (rot_dim/2,)."""
    return inv_freq / factor


def ntk_inv_freq(rot_dim: int, theta: float, factor: float) -> torch.Tensor:
    """NTK-aware scaling (bloc97 2023, "NTK-Aware Scaled RoPE"; described in Peng et al. 2023):
    theta' = theta * factor^(rot_dim / (rot_dim - 2)), then theta'^(-2i/rot_dim).

    Equals Hugging Face's "dynamic" RoPE evaluated at the length where its effective factor is
    ``factor``. Raises ValueError for rot_dim < 4 (the exponent's denominator would be 0)."""
    if rot_dim <= 2:
        raise ValueError(f"ntk RoPE scaling needs a rotated width > 2, got rot_dim={rot_dim}")
    return _base_inv_freq(rot_dim, theta * factor ** (rot_dim / (rot_dim - 2)))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor sqrt(1/t) = 0.1 * mscale * ln(scale) + 1 (Peng et al. 2023, the fitted
    softmax temperature); 1 for scale <= 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(
    inv_freq: torch.Tensor,
    rot_dim: int,
    theta: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN's "NTK-by-parts" frequencies (Peng et al. 2023, arXiv:2309.00071).

    A pair whose wavelength fits more than ``beta_fast`` rotations in the original context
    (high frequency) is kept (extrapolated); one with fewer than ``beta_slow`` rotations is
    interpolated (divided by ``factor``); pair indices between blend linearly. The boundary pair index
    for r rotations is rot_dim * ln(L / (2 pi r)) / (2 ln theta), L = original_max_position_embeddings;
    ``truncate`` floors/ceils the two boundaries (Hugging Face's default).
    """

    def boundary(rotations: float) -> float:
        return rot_dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = boundary(beta_fast), boundary(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (original frequency); 0: interpolate (divided by factor)
    return (inv_freq / factor) * (1 - keep) + inv_freq * keep


def llama3_inv_freq(
    inv_freq: torch.Tensor,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> torch.Tensor:
    """Llama 3.1's frequency scaling (Meta's ``apply_scaling`` in the Llama 3.1 reference code; Llama 3
    herd paper, Dubey et al. 2024): with L = original_max_position_embeddings and wavelength
    2 pi / inv_freq, wavelengths above L / low_freq_factor are divided by ``factor``, those below
    L / high_freq_factor kept, and between them s = (L / wavelength - low_freq_factor) /
    (high_freq_factor - low_freq_factor) blends: (1 - s) inv_freq / factor + s inv_freq."""
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    out = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    if high_freq_factor == low_freq_factor:  # no blending band (Llama 4 Scout: both 1.0)
        return out
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, out)


def scale_inv_freq(inv_freq: torch.Tensor, rot_dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """Apply the RoPE context extension ``scaling`` (``ModelConfig.rope_scaling``) to the inverse
    frequencies ``inv_freq`` (rot_dim/2,) of base ``theta``.

    Returns (scaled inv_freq (rot_dim/2,) fp32, attention_factor). The attention factor multiplies RoPE's
    cos and sin tables, hence both q and k, so logits are scaled by its square (YaRN's 1/t, as Hugging Face
    applies it); it is 1.0 for every type but yarn. Raises ValueError for an unknown ``type`` (ModelConfig
    validates the keys first).
    """
    kind = scaling["type"]
    factor = float(scaling["factor"])
    inv_freq = inv_freq.float()
    if kind == "linear":
        return linear_inv_freq(inv_freq, factor), 1.0
    if kind == "ntk":
        return ntk_inv_freq(rot_dim, theta, factor).to(inv_freq.device), 1.0
    if kind == "yarn":
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
            if mscale and mscale_all_dim:  # DeepSeek-V2/V3 variant
                attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
            else:
                attention_factor = yarn_mscale(factor)
        new = yarn_inv_freq(
            inv_freq,
            rot_dim,
            theta,
            factor,
            scaling["original_max_position_embeddings"],
            scaling.get("beta_fast") or 32.0,
            scaling.get("beta_slow") or 1.0,
            scaling.get("truncate", True),
        )
        return new, float(attention_factor)
    if kind == "llama3":
        return llama3_inv_freq(
            inv_freq,
            factor,
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
            scaling["original_max_position_embeddings"],
        ), 1.0
    raise ValueError(f"rope_scaling.type={kind!r} is not one of {', '.join(map(repr, ROPE_SCALINGS))}")
