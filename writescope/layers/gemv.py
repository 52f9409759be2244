"""Decode-sized linear layers (a few input rows) as one Triton launch: an opt-in alternative to
cuBLAS for the dense GEMVs of a decode step (CUDA).

A decode step's dense projections multiply 1-16 rows by a weight of a few to tens of MB. In
Qwen3-30B-A3B's graphed 2 x 32K step (bench/results/2026-12-03i-h200 call 4) cuBLAS read the
q/k/v weight at ~2.7 TB/s, o_proj (with its split-K reduction) at ~1.9 TB/s and the 0.5 MB
router in 5 us (0.1 TB/s), 0.95 ms a step against ~0.5 ms at the HBM copy rate, while the MoE
kernels' GEMV-style loops read at ~3.2 TB/s. Here each program computes ``BLOCK_N`` outputs of
every row over a ``1 / SPLIT_K`` share of the input size with tensor-core dots (rows padded to
16); with ``SPLIT_K > 1`` the shares' float32 partials are summed in order by a second kernel.
Accumulation is float32 (``ieee`` for float32 operands); the summation order differs from
cuBLAS's (the last bit may).

Off by default: ``WRITESCOPE_GEMV=triton`` routes :func:`linear` here for inputs of at most
``MAX_ROWS`` rows on CUDA (``python -m writescope.bench.gpu_gemv`` times it against cuBLAS at
the reference models' shapes). Elsewhere :func:`linear` is ``F.linear``. Measured on the H200
(bench/results/2026-12-03j-h200, call 1): at its best launch settings it beat cuBLAS only at
Qwen3-30B-A3B's o_proj (8.8 against 10.2 us), the bf16 routers (4.1 against 5.5 us) and
DeepSeek-V2-Lite's shared down (7.8 against 8.5 us); cuBLAS was faster at every q/k/v and
gate/up shape and at the float32 router (7.9 against 13.1 us), and with it on, the 32K decode
steps were 0.1-0.2 ms slower (Qwen3 2 x 32K 6.1 against 6.0 ms of device time, DeepSeek 4 x 32K
6.2 against 6.0), so it stays opt-in.

A form whose programs each loaded a 16 x 512 weight tile before waiting for the kernel before
(programmatic dependent launch, ``attention/launch.py``; its input size's shares summed by the
last share to finish) was slower again with the decode chain's dependent launches on: the 32K
steps took Qwen3-30B-A3B 6.0 against 5.7 ms, DeepSeek-V2-Lite 6.1 against 5.6, Mixtral-8x7B
14.2 against 13.8 (bench/results/2026-12-04-h200, call 3; the code is in commit 44ead49).
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

#: input rows up to which :func:`linear` takes the kernel (when enabled)
MAX_ROWS = 16


def enabled() -> bool:
    if os.environ.get("WRITESCOPE_GEMV", "cublas").strip().lower() != "triton":
        return False
    from ..attention.gpu import triton_available
    return triton_available()


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(X, W, OUT, M, N, stride_xm, stride_wn, stride_os, stride_om,
                    K: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
                    UPCAST: tl.constexpr):
        pn = tl.program_id(0)
        ps = tl.program_id(1)  # the share of K this program sums
        n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.arange(0, BLOCK_M)
        mm = m < M
        nm = n < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K_SPLIT, BLOCK_K):
            k = ps * K_SPLIT + k0 + tl.arange(0, BLOCK_K)
            km = (k < K) & (k0 + tl.arange(0, BLOCK_K) < K_SPLIT)
            x = tl.load(X + m[:, None] * stride_xm + k[None, :], mask=mm[:, None] & km[None, :],
                        other=0.0)
            w = tl.load(W + n[:, None].to(tl.int64) * stride_wn + k[None, :],
                        mask=nm[:, None] & km[None, :], other=0.0)
            if UPCAST:  # Triton's CPU interpreter: its dot of 16-bit floats is not one
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(x, tl.trans(w), input_precision=PREC)
        tl.store(OUT + ps * stride_os + m[:, None] * stride_om + n[None, :],
                 acc.to(OUT.dtype.element_ty), mask=mm[:, None] & nm[None, :])

    @triton.jit
    def split_sum_kernel(P, OUT, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        msk = i < MN
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(SPLIT):  # in order: deterministic
            acc += tl.load(P + s * MN + i, mask=msk, other=0.0)
        tl.store(OUT + i, acc.to(OUT.dtype.element_ty), mask=msk)

    from ..attention.launch import FastLaunch
    return FastLaunch(gemv_kernel), FastLaunch(split_sum_kernel)


@functools.lru_cache(maxsize=256)
def default_config(m: int, n: int, k: int) -> dict:
    """Launch settings for ``[m, k] x [n, k]^T``, the fastest of ``bench.gpu_gemv --sweep`` at
    the reference models' projections on the H200 (bench/results/2026-12-03j-h200, call 1):
    64 outputs a program and K in blocks of 256 for wide projections, split four ways when there
    are at most 2,048 outputs (o_proj, the shared experts' down); 16 outputs and K blocks of
    128 for a router's few outputs."""
    if n < 256:
        return {"block_n": 16, "block_k": 128, "split_k": 4 if k >= 2048 else 1, "warps": 4,
                "stages": 4}
    return {"block_n": 64, "block_k": 256, "split_k": 4 if n <= 2048 and k >= 2048 else 1,
            "warps": 4, "stages": 4}


def dot_options(*dtypes: torch.dtype) -> tuple[str, bool]:
    """``(input_precision, upcast)`` for a ``tl.dot`` over operands of ``dtypes``: float32
    exactly, as torch's default matmul (no TF32); under Triton's CPU interpreter, whose dot of
    16-bit floats is not one, everything upcast to float32 and exact."""
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    return ("ieee" if interp or torch.float32 in dtypes else "tf32"), interp


def gemv(x: torch.Tensor, w: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """``x [M, K] @ w[N, K]^T`` in ``x``'s dtype, ``M <= MAX_ROWS`` (rows of both contiguous)."""
    mrows, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or mrows > MAX_ROWS:
        raise ValueError(f"gemv of {tuple(x.shape)} by {tuple(w.shape)} (at most {MAX_ROWS} rows)")
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    out = torch.empty(mrows, n, dtype=x.dtype, device=x.device)
    if mrows == 0 or n == 0:
        return out
    c = dict(default_config(mrows, n, k))
    c.update(config or {})
    split = max(1, int(c["split_k"]))
    k_split = -(-k // split)
    k_split = -(-k_split // c["block_k"]) * c["block_k"] if split > 1 else k
    split = -(-k // k_split)
    gemv_kernel, split_sum_kernel = _kernels()
    dst = out if split == 1 else torch.empty(split, mrows, n, dtype=torch.float32,
                                             device=x.device)
    prec, upcast = dot_options(x.dtype, w.dtype)
    gemv_kernel[(-(-n // c["block_n"]), split)](
        x, w, dst, mrows, n, x.stride(0), w.stride(0), 0 if split == 1 else dst.stride(0),
        n, K=k, K_SPLIT=k_split, BLOCK_M=16, BLOCK_N=c["block_n"], BLOCK_K=c["block_k"],
        PREC=prec, UPCAST=upcast,
        num_warps=c["warps"], num_stages=c["stages"])
    if split > 1:
        mn = mrows * n
        split_sum_kernel[(-(-mn // 1024),)](dst, out, mn, SPLIT=split, BLOCK=1024, num_warps=4)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``F.linear``, or :func:`gemv` for a few rows on CUDA when ``WRITESCOPE_GEMV=triton``
    (same dtypes, no bias, 2-D input)."""
    if (bias is None and x.is_cuda and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and x.dtype == weight.dtype and enabled()):
        return gemv(x, weight)
    return F.linear(x, weight, bias)
