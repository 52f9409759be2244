"""MLA decode's weight absorption around the attention, one Triton launch each side (CUDA).

DeepSeek-V2's decode (``models/mla.py``) folds ``W_UK`` into the query and applies ``W_UV`` after
the attention over latents. In torch each side is a cuBLAS bmm plus a copy: before the attention
the bmm ``q_nope @ W_UK`` (``nvjet_..._2x1_v_bz_NNT``) and ``torch.cat`` with ``q_pe``
(``CatArrayBatchedCopy``); after it the bmm ``out @ W_UV^T`` (``nvjet_..._2x1_v_bz_TNT``) and
the strided copy (``elementwise_kernel<128, 4>``) that lays its permuted ``[H, N, 128]`` result
out as o_proj's ``[N, H * 128]`` rows. In DeepSeek-V2-Lite's graphed 4 x 32K decode step
(bench/results/2026-12-03j-h200/call1/d4-32k.log, 27 layers) those four were 0.09 + 0.05 +
0.10 + 0.06 ms of its 6.0 device milliseconds. Over 27 layers' weights on the H200 (4 tokens),
the torch forms' kernels took 3.1 + 1.8 us a layer before the attention and 3.4 + 2.0 us after
it, the kernels here 2.9 and 3.1 us (each reads its 2 MB of weights once; at this size both
they and cuBLAS's bmm are bound by latency, not bandwidth); replayed in a graph, 5.6 and 6.3 us
a layer against 3.3 and 3.6 us.

:func:`absorb_fused` -- one program per (head, block of latent columns), every token in it, so
each byte of ``W_UK`` is read once: ``q[n, h, :C] = q_nope[n, h] @ W_UK[h]`` (float32
accumulation, rounded once to the dtype, as the bf16 bmm) and ``q[n, h, C:] = q_pe[n, h]``.
:func:`values_fused` -- one program per (head, block of value columns): ``out[n, h] @ W_UV[h]^T``
straight into o_proj's input ``[N, H * V]``. Operands are rounded to the weight's dtype first (a
float32 attention output as ``.to(dtype)`` would round it), the sums are float32, the result is
rounded once. Both are tensor-core dots over rows padded to 16, for up to :data:`MAX_TOKENS`
tokens (prefill keeps torch's bmm). ``WRITESCOPE_FUSED_MLA_ABSORB=0`` keeps the torch forms,
which are also the forms on the CPU.
"""
from __future__ import annotations

import functools

import torch

from .gemv import dot_options
from ..attention.launch import pdl_args

#: tokens up to which the fused forms run (all of them in each program, padded to 16 rows)
MAX_TOKENS = 16
#: latent columns per absorb program, value columns per values program (DeepSeek-V2-Lite: 256
#: programs of 8 KB of weight, 128 of 16 KB; on the H200 at 1-16 tokens the fastest of 32, 64
#: and 128 latent columns, and within 0.1 us of 32 value columns)
ABSORB_BLOCK_C = 32
VALUES_BLOCK_V = 16


def enabled() -> bool:
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_MLA_ABSORB")


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def absorb_kernel(QN, QPE, W, OUT, N, stride_qn, stride_qh, stride_pn, stride_ph,
                      stride_wh, stride_wd, stride_on, stride_oh, D: tl.constexpr,
                      C: tl.constexpr, R: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
                      PREC: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
        h = tl.program_id(0)
        pc = tl.program_id(1)
        if PDL:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        dt = OUT.dtype.element_ty
        n = tl.arange(0, BLOCK_N)
        mn = n < N
        c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
        mc = c < C
        acc = tl.zeros([BLOCK_N, BLOCK_C], dtype=tl.float32)
        for d0 in tl.static_range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            md = d < D
            q = tl.load(QN + n[:, None] * stride_qn + h * stride_qh + d[None, :],
                        mask=mn[:, None] & md[None, :], other=0.0).to(dt)
            w = tl.load(W + h * stride_wh + d[:, None] * stride_wd + c[None, :],
                        mask=md[:, None] & mc[None, :], other=0.0)
            if UPCAST:  # Triton's CPU interpreter: its dot of 16-bit floats is not one
                q = q.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(q, w, input_precision=PREC)
        row = OUT + n[:, None] * stride_on + h * stride_oh
        tl.store(row + c[None, :], acc.to(dt), mask=mn[:, None] & mc[None, :])
        if pc == 0:  # the rotary part, as it is
            r = tl.arange(0, BLOCK_R)
            mr = mn[:, None] & (r < R)[None, :]
            p = tl.load(QPE + n[:, None] * stride_pn + h * stride_ph + r[None, :], mask=mr,
                        other=0.0)
            tl.store(row + C + r[None, :], p.to(dt), mask=mr)

    @triton.jit
    def values_kernel(A, W, OUT, N, stride_an, stride_ah, stride_wh, stride_wv, stride_on,
                      C: tl.constexpr, V: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr, PREC: tl.constexpr,
                      UPCAST: tl.constexpr, PDL: tl.constexpr):
        h = tl.program_id(0)
        pv = tl.program_id(1)
        if PDL:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        dt = OUT.dtype.element_ty
        n = tl.arange(0, BLOCK_N)
        mn = n < N
        v = pv * BLOCK_V + tl.arange(0, BLOCK_V)
        mv = v < V
        acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            mc = c < C
            a = tl.load(A + n[:, None] * stride_an + h * stride_ah + c[None, :],
                        mask=mn[:, None] & mc[None, :], other=0.0).to(dt)
            w = tl.load(W + h * stride_wh + v[:, None] * stride_wv + c[None, :],
                        mask=mv[:, None] & mc[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(a, tl.trans(w), input_precision=PREC)
        tl.store(OUT + n[:, None] * stride_on + h * V + v[None, :], acc.to(dt),
                 mask=mn[:, None] & mv[None, :])

    from ..attention.launch import FastLaunch
    return FastLaunch(absorb_kernel), FastLaunch(values_kernel)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (int(n) - 1).bit_length()))


def absorb_fused(q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """``torch.cat((einsum("nhd,hdc->nhc", q_nope, w_uk), q_pe), -1)`` in ``w_uk``'s dtype:
    ``q_nope [N, H, D]``, ``q_pe [N, H, R]`` (any strides, rows contiguous), ``w_uk [H, D, C]``
    (rows contiguous) -> ``[N, H, C + R]``."""
    n, nh, d = q_nope.shape
    c, r = w_uk.shape[2], q_pe.shape[2]
    if w_uk.shape[:2] != (nh, d) or q_pe.shape[:2] != (n, nh) or n > MAX_TOKENS:
        raise ValueError(f"absorb of {tuple(q_nope.shape)}, {tuple(q_pe.shape)} by "
                         f"{tuple(w_uk.shape)} (at most {MAX_TOKENS} tokens)")
    q_nope = q_nope if q_nope.stride(-1) == 1 else q_nope.contiguous()
    q_pe = q_pe if q_pe.stride(-1) == 1 else q_pe.contiguous()
    w_uk = w_uk if w_uk.stride(-1) == 1 else w_uk.contiguous()
    out = torch.empty(n, nh, c + r, dtype=w_uk.dtype, device=w_uk.device)
    if n:
        prec, upcast = dot_options(w_uk.dtype)
        _kernels()[0][(nh, -(-c // ABSORB_BLOCK_C))](
            q_nope, q_pe, w_uk, out, n, q_nope.stride(0), q_nope.stride(1), q_pe.stride(0),
            q_pe.stride(1), w_uk.stride(0), w_uk.stride(1), out.stride(0), out.stride(1),
            D=d, C=c, R=r, BLOCK_N=_pow2(n), BLOCK_D=min(_pow2(d), 128),
            BLOCK_C=ABSORB_BLOCK_C, BLOCK_R=_pow2(r), PREC=prec, UPCAST=upcast, num_warps=4,
            **pdl_args(out))
    return out


def values_fused(out: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """``einsum("nhc,hvc->nhv", out.to(w_uv.dtype), w_uv)`` as o_proj's input rows: ``out
    [N, H, C]`` (float32 or the weight's dtype, rows contiguous), ``w_uv [H, V, C]`` (rows
    contiguous) -> ``[N, H * V]`` in ``w_uv``'s dtype."""
    n, nh, c = out.shape
    v = w_uv.shape[1]
    if w_uv.shape[0] != nh or w_uv.shape[2] != c or n > MAX_TOKENS:
        raise ValueError(f"values of {tuple(out.shape)} by {tuple(w_uv.shape)} "
                         f"(at most {MAX_TOKENS} tokens)")
    out = out if out.stride(-1) == 1 else out.contiguous()
    w_uv = w_uv if w_uv.stride(-1) == 1 else w_uv.contiguous()
    vals = torch.empty(n, nh * v, dtype=w_uv.dtype, device=w_uv.device)
    if n:
        prec, upcast = dot_options(w_uv.dtype)
        _kernels()[1][(nh, -(-v // VALUES_BLOCK_V))](
            out, w_uv, vals, n, out.stride(0), out.stride(1), w_uv.stride(0), w_uv.stride(1),
            vals.stride(0), C=c, V=v, BLOCK_N=_pow2(n), BLOCK_C=min(_pow2(c), 128),
            BLOCK_V=VALUES_BLOCK_V, PREC=prec, UPCAST=upcast, num_warps=4, num_stages=3,
            **pdl_args(vals))
    return vals


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`absorb_fused` / :func:`values_fused` take activations ``x [N, H, *]``
    times ``weight`` here: CUDA, at most :data:`MAX_TOKENS` tokens, a float weight and ``x`` in
    its dtype or float32."""
    return (x.is_cuda and x.shape[0] <= MAX_TOKENS
            and weight.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and x.dtype in (weight.dtype, torch.float32) and enabled())
