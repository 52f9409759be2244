"""RMSNorm, computed in float32 as the reference models do.

On CUDA (with Triton) the norm is one kernel per call instead of the eight that its torch form
launches (the cast to float32, the square, the mean, the epsilon, the rsqrt, the product, the
cast back, the weight). A Qwen3-30B-A3B decode step calls it four times a layer; in its 2 x 32K
step with the experts on the GPU, once the whole step is one CUDA graph, the device itself took
14.7 ms against a 3.9 ms bound, spread over ~4,500 kernels and copies, ~1,500 of them the
norms' (bench/results/2026-12-03c-h200, call 3; call 5: 193 norm kernels, 0.30 ms a step). The
kernel computes what the torch form does in the same precision: the sum of squares in float32
(in another order: the last bit may differ), the normalised row rounded to the input's dtype,
then the weight's product rounded to the promoted dtype. ``WRITESCOPE_FUSED_NORM=0`` keeps the
torch form everywhere.

:meth:`RMSNorm.add_forward` adds the residual and normalises the sum in one kernel (vLLM's fused
add-RMSNorm; the residual's add was two more kernels a layer, ~1.4 us each in Qwen3-30B-A3B's
graphed 2 x 32K step, bench/results/2026-12-03h-h200 call 4).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from ..attention.launch import pdl_args


def fused_enabled() -> bool:
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_NORM")


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_kernel(X, W, OUT, heads, stride_t, stride_h, stride_o, D, eps,
                        BLOCK: tl.constexpr, PDL: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # (token, head) = divmod(row, heads)
        d = tl.arange(0, BLOCK)
        m = d < D
        w = tl.load(W + d, mask=m, other=0.0).to(tl.float32)  # a constant: before the wait
        if PDL:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        x = tl.load(X + (row // heads) * stride_t + (row % heads) * stride_h + d, mask=m,
                    other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        y = (x * r).to(X.dtype.element_ty).to(tl.float32)
        tl.store(OUT + row * stride_o + d, (w * y).to(OUT.dtype.element_ty), mask=m)

    @triton.jit
    def add_rms_norm_kernel(X, DX, W, SUM, OUT, stride_x, stride_d, stride_s, stride_o, D, eps,
                            BLOCK: tl.constexpr, PDL: tl.constexpr):
        # the residual's sum rounded to its dtype (torch's add), then rms_norm_kernel's
        # arithmetic on it, in the same order
        row = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, BLOCK)
        m = d < D
        w = tl.load(W + d, mask=m, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        a = tl.load(X + row * stride_x + d, mask=m, other=0.0).to(tl.float32)
        b = tl.load(DX + row * stride_d + d, mask=m, other=0.0).to(tl.float32)
        s = (a + b).to(SUM.dtype.element_ty)
        tl.store(SUM + row * stride_s + d, s, mask=m)
        x = s.to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        y = (x * r).to(SUM.dtype.element_ty).to(tl.float32)
        tl.store(OUT + row * stride_o + d, (w * y).to(OUT.dtype.element_ty), mask=m)

    from ..attention.launch import FastLaunch
    return FastLaunch(rms_norm_kernel), FastLaunch(add_rms_norm_kernel)


#: the input dtypes the kernel takes
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`RMSNorm`'s forward in one Triton launch (``x`` on the device, any leading shape;
    a 3-D ``x`` is read through its strides, e.g. the heads of a fused projection's output)."""
    d = x.shape[-1]
    if x.dim() == 3 and x.stride(-1) == 1:
        rows, heads, st, sh = x, x.shape[1], x.stride(0), x.stride(1)
    else:
        rows = x.reshape(-1, d)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        heads, st, sh = 1, rows.stride(0), 0
    n = x.numel() // d if d else 0
    out = torch.empty(n, d, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if n:
        block = _block(d)
        _kernel()[0][(n,)](
            rows, weight, out, heads, st, sh, out.stride(0), d, float(eps),
            BLOCK=block, num_warps=_warps(block), **pdl_args(out))
    return out.view(x.shape)


def _block(d: int) -> int:
    return 1 << max(4, (d - 1).bit_length())


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8


def add_rms_norm_fused(x: torch.Tensor, dx: torch.Tensor, weight: torch.Tensor, eps: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + dx`` and ``rms_norm(s)`` in one Triton launch: :meth:`RMSNorm.add_forward` on
    the device (``x`` and ``dx`` of one dtype and shape, rows contiguous)."""
    d = x.shape[-1]
    xs, ds = x.reshape(-1, d), dx.reshape(-1, d)
    n = xs.shape[0]
    s = torch.empty(n, d, dtype=x.dtype, device=x.device)
    out = torch.empty(n, d, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if n:
        block = _block(d)
        _kernel()[1][(n,)](
            xs, ds, weight, s, out, xs.stride(0), ds.stride(0), s.stride(0), out.stride(0), d,
            float(eps), BLOCK=block, num_warps=_warps(block), **pdl_args(out))
    return s.view(x.shape), out.view(x.shape)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype in FUSED_DTYPES and fused_enabled():
            return rms_norm_fused(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_forward(self, x: torch.Tensor, dx: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream's next value ``s = x + dx`` (``x`` when ``dx`` is None) and its
        norm ``self(s)``: one kernel on CUDA instead of the add's and the norm's (the same
        roundings: the sum in ``x``'s dtype, then the norm of it)."""
        if dx is None:
            return x, self(x)
        if (x.is_cuda and x.dtype in FUSED_DTYPES and dx.dtype == x.dtype
                and dx.shape == x.shape and x.stride(-1) == 1 and dx.stride(-1) == 1
                and x.dim() == 2 and fused_enabled()):
            return add_rms_norm_fused(x, dx, self.weight, self.eps)
        s = x + dx
        return s, self(s)
