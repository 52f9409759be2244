"""Gated SiLU MLP (dense layers and shared experts).

On CUDA the gate and up projections are one GEMM over their weights laid out as rows of one
tensor (``layers/stacked.py``) and ``silu(gate) * up`` one Triton kernel: three launches
instead of five (two GEMMs, the SiLU, the product, the down GEMM). DeepSeek-V2-Lite runs one
such MLP a layer (its shared experts; layer 0's dense MLP). The kernel rounds as the torch form
does: the SiLU in float32 rounded to the dtype, then the product rounded (its ``exp`` is
Triton's, so the last bit before the rounding may differ). ``WRITESCOPE_FUSED_MLP=0`` keeps the
torch form, which is also the form on the CPU.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import gemv
from ..attention.launch import pdl_args
from .stacked import share_rows, still_rows


def fused_enabled() -> bool:
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_MLP")


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_kernel(H, OUT, stride_h, stride_o, INTER, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        if PDL:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = i < INTER
        dt = OUT.dtype.element_ty
        g = tl.load(H + t * stride_h + i, mask=m, other=0.0).to(tl.float32)
        u = tl.load(H + t * stride_h + INTER + i, mask=m, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(OUT + t * stride_o + i, (s * u).to(dt), mask=m)

    from ..attention.launch import FastLaunch
    return FastLaunch(silu_mul_kernel)


def silu_mul_fused(h: torch.Tensor) -> torch.Tensor:
    """``silu(h[:, :I]) * h[:, I:]`` for ``h [N, 2I]`` (a stacked gate/up GEMM's output) in one
    launch, in ``h``'s dtype."""
    n, two_i = h.shape
    inter = two_i // 2
    if h.stride(-1) != 1:
        h = h.contiguous()
    out = torch.empty(n, inter, dtype=h.dtype, device=h.device)
    if n and inter:
        block = min(1024, 1 << max(4, (inter - 1).bit_length()))
        _kernel()[(n, -(-inter // block))](h, out, h.stride(0), out.stride(0), inter,
                                           BLOCK=block, num_warps=4, **pdl_args(out))
    return out


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, inter: int, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")):
        super().__init__()
        self.names = names
        for n, (i, o) in zip(names, ((hidden, inter), (hidden, inter), (inter, hidden))):
            self.add_module(n, nn.Linear(i, o, bias=False))
        #: gate's and up's weights as rows of one tensor (share_projection_storage)
        self._gate_up: torch.Tensor | None = None

    def share_projection_storage(self) -> None:
        """Give the gate and up projections weights that are rows of one tensor (the loader
        calls this before filling them)."""
        g, u, _ = (getattr(self, n) for n in self.names)
        self._gate_up = share_rows((g, u))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u, d = (getattr(self, n) for n in self.names)
        gu = self._gate_up
        if (x.is_cuda and gu is not None and gu.device == x.device and gu.dtype == x.dtype
                and x.dim() == 2 and fused_enabled() and still_rows(gu, (g, u))):
            return gemv.linear(silu_mul_fused(gemv.linear(x, gu)), d.weight, d.bias)
        return d(F.silu(g(x)) * u(x))
