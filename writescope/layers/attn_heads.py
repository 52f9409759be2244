"""A GQA layer's projected heads made ready for attention in one Triton launch (CUDA).

After the one q/k/v GEMM (``models/gqa.py``) a decode step's heads go through Qwen3's q and k
RMSNorms, the half-split rotation of q and k, and the concatenation of each KV head's ``[k | v]``
record: five kernels a layer in the separate forms (two norms, two rotations, the cat), each a
few microseconds over a few kilobytes. In Qwen3-30B-A3B's graphed 2 x 32K decode
step they were ~0.35 of its 6.85 device milliseconds (bench/results/2026-12-03h-h200 call 4).

Here one program per (token, head) of the projection's output ``y [N, Hq + 2 Hkv, D]``: a query
head is normalised (``q_norm``) and rotated into ``q [N, Hq, D]``; a key head is normalised
(``k_norm``) and rotated into the first half of its record in ``records [N, Hkv, 2D]`` and the
matching value head copied into the second. The arithmetic is the separate kernels': the norm's
sum of squares in float32 (over the two halves: its order differs, the last bit may), the
normalised head rounded to the dtype, the weight's product rounded, then the rotation's
products and sums each rounded to the dtype as ``layers/rotary.py`` rounds them. Families
without the head norms (Mixtral) skip them. ``WRITESCOPE_FUSED_HEADS=0`` keeps the separate
forms, which are also the forms on the CPU.
"""
from __future__ import annotations

import functools

import torch

from ..attention.launch import pdl_args


def fused_enabled() -> bool:
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_HEADS")


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def attn_heads_kernel(Y, QW, KW, COS, SIN, QOUT, ROUT, stride_y, stride_c, eps,
                          HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                          HALF: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr,
                          PDL: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)  # a query head (h < HQ) or key head h - HQ
        dt = QOUT.dtype.element_ty
        j = tl.arange(0, BLOCK)
        m = j < HALF
        hv = tl.zeros([BLOCK], dtype=tl.int32) + h  # (as vectors: the interpreter's masks)
        is_q = hv < HQ
        is_k = hv >= HQ
        src = Y + t * stride_y + h * D
        if PDL:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        x1 = tl.load(src + j, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF + j, mask=m, other=0.0).to(tl.float32)
        if NORM:  # RMSNorm (layers/norm.py): normalised, rounded, times the weight, rounded
            r = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
            w1 = tl.where(is_q, tl.load(QW + j, mask=m & is_q, other=0.0),
                          tl.load(KW + j, mask=m & is_k, other=0.0)).to(tl.float32)
            w2 = tl.where(is_q, tl.load(QW + HALF + j, mask=m & is_q, other=0.0),
                          tl.load(KW + HALF + j, mask=m & is_k, other=0.0)).to(tl.float32)
            x1 = (w1 * (x1 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            x2 = (w2 * (x2 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        # the half-split rotation, every product and sum rounded to the dtype (rotary.py)
        c = tl.load(COS + t * stride_c + j, mask=m, other=0.0).to(dt).to(tl.float32)
        s = tl.load(SIN + t * stride_c + j, mask=m, other=0.0).to(dt).to(tl.float32)
        a1 = (x1 * c).to(dt).to(tl.float32)
        b1 = (x2 * s).to(dt).to(tl.float32)
        a2 = (x2 * c).to(dt).to(tl.float32)
        b2 = (x1 * s).to(dt).to(tl.float32)
        o1 = (a1 - b1).to(dt)
        o2 = (a2 + b2).to(dt)
        qdst = QOUT + (t * HQ + h) * D
        tl.store(qdst + j, o1, mask=m & is_q)
        tl.store(qdst + HALF + j, o2, mask=m & is_q)
        rdst = ROUT + (t * HKV + (h - HQ)) * (2 * D)
        tl.store(rdst + j, o1, mask=m & is_k)
        tl.store(rdst + HALF + j, o2, mask=m & is_k)
        # the key head's value head, as it is
        vsrc = src + HKV * D
        v1 = tl.load(vsrc + j, mask=m & is_k, other=0.0)
        v2 = tl.load(vsrc + HALF + j, mask=m & is_k, other=0.0)
        tl.store(rdst + D + j, v1, mask=m & is_k)
        tl.store(rdst + D + HALF + j, v2, mask=m & is_k)

    from ..attention.launch import FastLaunch
    return FastLaunch(attn_heads_kernel)


def attn_heads_fused(y: torch.Tensor, hq: int, hkv: int, q_norm, k_norm, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``y [N, Hq + 2 Hkv, D]`` (q, k and v heads, one token's heads contiguous) ->
    ``(q [N, Hq, D], records [N, Hkv, 2D])``, both in ``y``'s dtype: the heads normalised by
    ``q_norm``/``k_norm`` (``RMSNorm`` modules of ``y``'s dtype, or both None) and rotated by
    ``cos/sin [N, D/2]`` (the half-split form)."""
    n, heads, d = y.shape
    if heads != hq + 2 * hkv or d % 2:
        raise ValueError(f"{heads} heads of {d} are not {hq} + 2 x {hkv} of an even size")
    if y.stride(2) != 1 or y.stride(1) != d:
        y = y.contiguous()
    c = cos if cos.stride(-1) == 1 else cos.contiguous()
    s = sin if sin.stride(-1) == 1 else sin.contiguous()
    if c.stride(0) != s.stride(0):
        c, s = c.contiguous(), s.contiguous()
    q = torch.empty(n, hq, d, dtype=y.dtype, device=y.device)
    rec = torch.empty(n, hkv, 2 * d, dtype=y.dtype, device=y.device)
    norm = q_norm is not None
    qw = q_norm.weight if norm else y
    kw = k_norm.weight if norm else y
    eps = float(q_norm.eps) if norm else 0.0
    if norm and (k_norm is None or float(k_norm.eps) != eps):
        raise ValueError("q_norm and k_norm need the same epsilon")
    if n:
        half = d // 2
        _kernel()[(n, hq + hkv)](
            y, qw, kw, c, s, q, rec, y.stride(0), c.stride(0), eps, HQ=hq, HKV=hkv, D=d,
            HALF=half, BLOCK=1 << max(4, (half - 1).bit_length()), NORM=norm,
            num_warps=1 if half <= 128 else 4, **pdl_args(q))
    return q, rec


def usable(y: torch.Tensor, q_norm, k_norm) -> bool:
    """Whether :func:`attn_heads_fused` computes what the separate forms would: CUDA, a float
    dtype the rotation kernel takes, head norms (if any) with ``y``'s dtype and one epsilon."""
    if not (y.is_cuda and y.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and y.shape[-1] % 2 == 0 and fused_enabled()):
        return False
    if (q_norm is None) != (k_norm is None):
        return False
    if q_norm is None:
        return True
    return (q_norm.weight.dtype == y.dtype and k_norm.weight.dtype == y.dtype
            and float(q_norm.eps) == float(k_norm.eps))
