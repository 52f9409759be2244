"""A Triton kernel for the tests of the fused FP8 experts' conversions (``layers/moe_triton.py``):
the same bytes through ``fp8_byte`` (four a 32-bit word) and through ``fp8_weights`` (a byte at a
time), so that the two can be compared value for value. A module of its own because Triton reads
a kernel's source from its file."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from writescope.layers import moe_triton

moe_triton._kernels()  # defines the module's jit helpers
# Triton's interpreter wants triton.language among the module globals of a device function it
# calls from another module's kernel; moe_triton imports it inside _kernels (lazily, so that
# the module loads without Triton)
vars(moe_triton).setdefault("tl", tl)
fp8_byte, fp8_weights = moe_triton.fp8_byte, moe_triton.fp8_weights


@triton.jit
def _both(WORDS, BYTES, SCALE, OUT_W, OUT_B, N: tl.constexpr, MODE: tl.constexpr,
          BYTE_MODE: tl.constexpr):
    c = tl.arange(0, N)
    w = tl.load(WORDS + c)
    s = tl.load(SCALE)
    for b in tl.static_range(4):
        tl.store(OUT_W + 4 * c + b, fp8_byte(w, b, s, MODE))
    q = tl.load(BYTES + tl.arange(0, 4 * N))
    tl.store(OUT_B + tl.arange(0, 4 * N), fp8_weights(q, s, BYTE_MODE))


def convert_both(codes: torch.Tensor, scale: float, mode: int, byte_mode: int):
    """float32 values of the uint8 ``codes`` (a multiple of 4 of them) times ``scale``: by
    ``fp8_byte`` under ``mode`` and by ``fp8_weights`` under ``byte_mode``."""
    n = codes.numel() // 4
    sc = torch.tensor([scale], dtype=torch.float32, device=codes.device)
    ow = torch.empty(4 * n, dtype=torch.float32, device=codes.device)
    ob = torch.empty_like(ow)
    _both[(1,)](codes.view(torch.int32), codes, sc, ow, ob, N=n, MODE=mode, BYTE_MODE=byte_mode)
    return ow, ob
