"""Rotary position embeddings: default and YaRN frequencies, half-split and interleaved rotation.

Mixtral and Qwen3 rotate the two halves of each head (``rotate_half``); transformers' DeepSeek-V2
rotates interleaved pairs (a complex multiply). YaRN follows the paper (arXiv 2309.00071) as
DeepSeek configures it: ``factor``, ``original_max_position_embeddings``, ``beta_fast``/``beta_slow``
and an attention factor from ``mscale``/``mscale_all_dim``.

On CUDA each rotation is one Triton kernel. The half-split one replaces the torch form's nine
(two cats and two casts of cos/sin, a negation, a cat, two products, a sum), twice a layer: a
decode step of Qwen3-30B-A3B spent most of its device time in ~4,300 such small kernels and copies
(bench/results/2026-12-03c-h200, call 3). It rounds each product and sum to x's dtype as the
torch form does; on the H200 the results were still not all the same bits, but within one unit
in the last place (call 5; ``WRITESCOPE_FUSED_ROPE=0``: the torch form). The interleaved one
(DeepSeek-V2) replaces a cast, four products, a difference, a sum, a stack and the cast back, twice
a layer; its arithmetic is the torch form's float32, rounded once.
"""
from __future__ import annotations

import functools
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
        # on the host, also inside the loader's meta-device build: a meta tensor's arithmetic
        # goes through torch._refs, whose first call imports torch._dynamo (~1.5-2.6 s a start)
        with torch.device("cpu"):
            inv, self.attention_scaling = rope_frequencies(dim, theta, scaling)
        self.register_buffer("inv_freq", inv, persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)  # [N, dim/2]
        return f.cos() * self.attention_scaling, f.sin() * self.attention_scaling



@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rope_kernel(X, COS, SIN, OUT, heads, stride_t, stride_h, stride_c, stride_o,
                    HALF: tl.constexpr, BLOCK: tl.constexpr, PAIRS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # (token, head) = divmod(row, heads)
        tok = row // heads
        X = X + tok * stride_t + (row % heads) * stride_h
        OUT = OUT + row * stride_o
        j = tl.arange(0, BLOCK)
        m = j < HALF
        dt = OUT.dtype.element_ty
        c = tl.load(COS + tok * stride_c + j, mask=m, other=0.0)
        s = tl.load(SIN + tok * stride_c + j, mask=m, other=0.0)
        if PAIRS:
            # interleaved pairs, the torch form: x in float32, cos/sin as they are (float32),
            # one rounding at the end
            a = tl.load(X + 2 * j, mask=m, other=0.0).to(tl.float32)
            b = tl.load(X + 2 * j + 1, mask=m, other=0.0).to(tl.float32)
            c = c.to(tl.float32)
            s = s.to(tl.float32)
            tl.store(OUT + 2 * j, (a * c - b * s).to(dt), mask=m)
            tl.store(OUT + 2 * j + 1, (a * s + b * c).to(dt), mask=m)
        else:
            # halves: cos/sin in x's dtype, and every product and sum rounded to it, as the
            # torch form's separate kernels round them
            x1 = tl.load(X + j, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(X + HALF + j, mask=m, other=0.0).to(tl.float32)
            c = c.to(dt).to(tl.float32)
            s = s.to(dt).to(tl.float32)
            a1 = (x1 * c).to(dt).to(tl.float32)
            b1 = (x2 * s).to(dt).to(tl.float32)
            a2 = (x2 * c).to(dt).to(tl.float32)
            b2 = (x1 * s).to(dt).to(tl.float32)
            tl.store(OUT + j, (a1 - b1).to(dt), mask=m)
            tl.store(OUT + HALF + j, (a2 + b2).to(dt), mask=m)

    from ..attention.launch import FastLaunch
    return FastLaunch(rope_kernel)


def fused_enabled() -> bool:
    """Each rotation in one Triton kernel on CUDA (``WRITESCOPE_FUSED_ROPE=0``: the torch
    forms, as on the CPU)."""
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_ROPE")


def rotate_half_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rotary`'s half-split form in one launch: ``x [N, heads, dim]`` (bf16, fp16
    or fp32), ``cos/sin [N, dim/2]``. The torch form's roundings: the products and sums rounded
    to x's dtype one by one (within one unit of the torch form's results on the H200)."""
    return _rotate_fused(x, cos, sin, pairs=False)


def rotate_pairs_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rotary`'s interleaved form (DeepSeek-V2: each pair of values rotated as a
    complex number) in one launch instead of the torch form's ~9 kernels: ``x [N, heads, dim]``,
    ``cos/sin [N, dim/2]``; float32 arithmetic, rounded to x's dtype once, as the torch form."""
    return _rotate_fused(x, cos, sin, pairs=True)


def _rotate_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairs: bool
                  ) -> torch.Tensor:
    n, heads, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    c = cos if cos.stride(-1) == 1 else cos.contiguous()
    s_ = sin if sin.stride(-1) == 1 else sin.contiguous()
    if c.stride(0) != s_.stride(0):
        c, s_ = c.contiguous(), s_.contiguous()
    out = torch.empty(n, heads, d, dtype=x.dtype, device=x.device)
    if n * heads:
        half = d // 2
        _kernel()[(n * heads,)](x, c, s_, out, heads, x.stride(0), x.stride(1), c.stride(0), d,
                                HALF=half, BLOCK=1 << max(4, (half - 1).bit_length()),
                                PAIRS=pairs, num_warps=1 if half <= 128 else 4)
    return out


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
                 ) -> torch.Tensor:
    """Rotate ``x [N, heads, dim]`` by per-token ``cos/sin [N, dim/2]``."""
    if (x.is_cuda and x.dim() == 3 and x.shape[-1] % 2 == 0
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and fused_enabled()):
        return rotate_pairs_fused(x, cos, sin) if interleaved else rotate_half_fused(x, cos, sin)
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
