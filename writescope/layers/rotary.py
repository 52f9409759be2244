"""Rotary position embeddings: default and YaRN frequencies, half-split and interleaved rotation.

Mixtral and Qwen3 rotate the two halves of each head (``rotate_half``); transformers' DeepSeek-V2
rotates interleaved pairs (a complex multiply). YaRN follows the paper (arXiv 2309.00071) as
DeepSeek configures it: ``factor``, ``original_max_position_embeddings``, ``beta_fast``/``beta_slow``
and an attention factor from ``mscale``/``mscale_all_dim``.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_frequencies(dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[dim // 2]`` (float32) and the cos/sin scaling factor."""
    exps = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    pos_freqs = theta ** exps
    rtype = (scaling or {}).get("rope_type", "default")
    if rtype == "default":
        return 1.0 / pos_freqs, 1.0
    if rtype == "linear":
        return 1.0 / (pos_freqs * float(scaling["factor"])), 1.0
    if rtype != "yarn":
        raise ValueError(f"rope scaling type {rtype!r} is not supported (default, linear, yarn)")
    factor = float(scaling["factor"])
    orig = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1
    attn = scaling.get("attention_factor")
    if attn is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attn = _mscale(factor, m) / _mscale(factor, m_all) if (m and m_all) else _mscale(factor)

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extra = 1 - ramp  # weight of the un-interpolated frequency
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, float(attn)


class Rotary(nn.Module):
    """Per-token cos/sin tables for a batch of positions (the rotation itself: ``apply_rotary``)."""

    def __init__(self, dim: int, theta: float, scaling: dict | None):
        super().__init__()
        inv, self.attention_scaling = rope_frequencies(dim, theta, scaling)
        self.register_buffer("inv_freq", inv, persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)  # [N, dim/2]
        return f.cos() * self.attention_scaling, f.sin() * self.attention_scaling



def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
                 ) -> torch.Tensor:
    """Rotate ``x [N, heads, dim]`` by per-token ``cos/sin [N, dim/2]``."""
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    if interleaved:
        xf = x.float().unflatten(-1, (-1, 2))
        a, b = xf[..., 0], xf[..., 1]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)
    dtype = x.dtype
    c2 = torch.cat((c, c), dim=-1).to(dtype)
    s2 = torch.cat((s, s), dim=-1).to(dtype)
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * c2 + rot * s2
