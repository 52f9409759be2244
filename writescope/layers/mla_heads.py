"""An MLA layer's new record and rotated query parts in one Triton launch (CUDA).

DeepSeek-V2's attention (``models/mla.py``) turns ``kv_a_proj_with_mqa``'s output ``[c | k_pe]``
into the token's cache record ``[kv_a_layernorm(c) | rope(k_pe)]`` and rotates each head's
``q_pe``: in the separate forms that is an RMSNorm, two rotations and a concatenation, four
kernels a layer of a few kilobytes each (DeepSeek-V2-Lite's graphed 4 x 32K decode step,
bench/results/2026-12-03i-h200 call 3: 0.16 of its 6.4 device milliseconds).

Here one program per (token, head) rotates that head's ``q_pe`` (interleaved pairs, float32,
one rounding: ``layers/rotary.py``'s arithmetic) into ``q_pe [N, H, R]``, and one more program
per token writes the record ``[N, 1, C + R]``: ``c`` normalised as ``layers/norm.py`` computes
it (its sum of squares in another order: the last bit may differ) and ``k_pe`` rotated.
``WRITESCOPE_FUSED_HEADS=0`` keeps the separate forms, which are also the forms on the CPU.
"""
from __future__ import annotations

import functools

import torch

from .attn_heads import fused_enabled
from ..attention.launch import pdl_args


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def mla_heads_kernel(Q, KVA, NW, COS, SIN, QPE, REC, stride_qt, stride_qh, stride_kt,
                         stride_c, eps, NH: tl.constexpr, NOPE: tl.constexpr,
                         LORA: tl.constexpr, ROPE: tl.constexpr, BLOCK_C: tl.constexpr,
                         BLOCK_R: tl.constexpr, PDL: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        if PDL:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        j = tl.arange(0, BLOCK_R)  # rotated pairs
        mj = j < ROPE // 2
        c = tl.load(COS + t * stride_c + j, mask=mj, other=0.0).to(tl.float32)
        s = tl.load(SIN + t * stride_c + j, mask=mj, other=0.0).to(tl.float32)
        dt = REC.dtype.element_ty
        if h < NH:  # this head's q_pe
            src = Q + t * stride_qt + h * stride_qh + NOPE
            dst = QPE + (t * NH + h) * ROPE
        else:  # the record: the normalised latent, then k_pe
            src = KVA + t * stride_kt + LORA
            dst = REC + t * (LORA + ROPE) + LORA
            i = tl.arange(0, BLOCK_C)
            mi = i < LORA
            x = tl.load(KVA + t * stride_kt + i, mask=mi, other=0.0).to(tl.float32)
            r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / LORA + eps)
            y = (x * r).to(dt).to(tl.float32)
            w = tl.load(NW + i, mask=mi, other=0.0).to(tl.float32)
            tl.store(REC + t * (LORA + ROPE) + i, (w * y).to(dt), mask=mi)
        a = tl.load(src + 2 * j, mask=mj, other=0.0).to(tl.float32)
        b = tl.load(src + 2 * j + 1, mask=mj, other=0.0).to(tl.float32)
        tl.store(dst + 2 * j, (a * c - b * s).to(dt), mask=mj)
        tl.store(dst + 2 * j + 1, (a * s + b * c).to(dt), mask=mj)

    from ..attention.launch import FastLaunch
    return FastLaunch(mla_heads_kernel)


def mla_heads_fused(q: torch.Tensor, kva: torch.Tensor, norm, cos: torch.Tensor,
                    sin: torch.Tensor, lora: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [N, H, nope + R]`` (any strides, rows of one head contiguous) and ``kva [N, lora + R]``
    (``[c | k_pe]``, rows contiguous) -> ``(q_pe [N, H, R], record [N, 1, lora + R])`` in
    ``kva``'s dtype: ``q_pe`` rotated by ``cos/sin [N, R/2]`` (interleaved pairs); the record
    ``[norm(c) | rotated k_pe]`` (``norm``: an ``RMSNorm`` of that dtype)."""
    n, nh, qk = q.shape
    rope = kva.shape[1] - lora
    nope = qk - rope
    if rope <= 0 or rope % 2 or nope < 0 or cos.shape[-1] * 2 != rope:
        raise ValueError(f"no rotary part of {rope} values in records of {kva.shape[1]}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if kva.stride(-1) != 1:
        kva = kva.contiguous()
    c = cos if cos.stride(-1) == 1 else cos.contiguous()
    s = sin if sin.stride(-1) == 1 else sin.contiguous()
    if c.stride(0) != s.stride(0):
        c, s = c.contiguous(), s.contiguous()
    q_pe = torch.empty(n, nh, rope, dtype=kva.dtype, device=kva.device)
    rec = torch.empty(n, 1, lora + rope, dtype=kva.dtype, device=kva.device)
    if n:
        _kernel()[(n, nh + 1)](
            q, kva, norm.weight, c, s, q_pe, rec, q.stride(0), q.stride(1), kva.stride(0),
            c.stride(0), float(norm.eps), NH=nh, NOPE=nope, LORA=lora, ROPE=rope,
            BLOCK_C=1 << max(4, (lora - 1).bit_length()),
            BLOCK_R=1 << max(4, (rope // 2 - 1).bit_length()), num_warps=4, **pdl_args(rec))
    return q_pe, rec


def usable(q: torch.Tensor, kva: torch.Tensor, norm) -> bool:
    """Whether :func:`mla_heads_fused` computes the separate forms' values here: CUDA, one float
    dtype for the queries, the latent and the norm's weight."""
    return (kva.is_cuda and q.dtype == kva.dtype == norm.weight.dtype
            and kva.dtype in (torch.bfloat16, torch.float16, torch.float32) and fused_enabled())
