"""Routed experts of a decode-sized step in two Triton launches (GPU-resident experts).

A decode step routes a few tokens to a few experts each. Computed expert by expert
(:func:`writescope.layers.moe.run_experts`) that is ~11 framework ops per active expert -- about
260 per DeepSeek-V2-Lite layer at batch 4 -- and on the H200 machine such a step was bound by
launching them (104 ms measured against a 6 ms roofline bound, bench/results/2026-11-30-h200/).
Here every (token, slot) pair is one row of two GEMV launches that read the chosen experts'
weights in place from the stacked ``gate_up [E, 2I, H]`` / ``down [E, H, I]`` tensors:

1. ``h[s] = silu(W_gate[e_s] x[t_s]) * (W_up[e_s] x[t_s])``  -- grid (slots, I / BLOCK_I)
2. ``y[s] = w_s * W_down[e_s] h[s]``                         -- grid (slots, H / BLOCK_O)

and ``out[t] = sum_j y[t*k + j]`` (one reduction). Accumulation is fp32; loop bounds are
compile-time constants, so Triton's CPU interpreter runs the kernels too (the tests do).

On by default on CUDA (``WRITESCOPE_FUSED_MOE=0`` turns it off): :class:`~writescope.layers.moe.
StackedExperts` uses it for steps of at most ``MAX_SLOTS`` (token, expert) pairs. On the H200
machine it took DeepSeek-V2-Lite's batch-4 decode from 32.8 to 41.7 tokens/s (8K context, GPU
experts; bench/results/2026-11-30b-h200/). The design follows the GEMV-style small-batch path of vLLM's fused MoE
(one program per routed row, weights read where they lie); the code is ours.
"""
from __future__ import annotations

import functools
import os

import torch

#: (token, slot) pairs up to which a step takes the fused path
MAX_SLOTS = 128


def available() -> bool:
    from ..attention.gpu import triton_available
    return triton_available()


def enabled() -> bool:
    return os.environ.get("WRITESCOPE_FUSED_MOE", "1") not in ("0", "", "false", "no") and available()


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def gate_up_kernel(X, IDX, W, HOUT, stride_we, stride_wr,
                       K: tl.constexpr, HID: tl.constexpr, INTER: tl.constexpr,
                       BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr):
        s = tl.program_id(0)
        i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
        imask = i < INTER
        e = tl.load(IDX + s).to(tl.int64)
        t = (s // K).to(tl.int64)
        wg = W + e * stride_we + i.to(tl.int64)[:, None] * stride_wr
        wu = wg + INTER * stride_wr
        acc_g = tl.zeros([BLOCK_I], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_I], dtype=tl.float32)
        for h0 in range(0, HID, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            hmask = h < HID
            x = tl.load(X + t * HID + h, mask=hmask, other=0.0).to(tl.float32)
            m = imask[:, None] & hmask[None, :]
            g = tl.load(wg + h[None, :], mask=m, other=0.0).to(tl.float32)
            u = tl.load(wu + h[None, :], mask=m, other=0.0).to(tl.float32)
            acc_g += tl.sum(g * x[None, :], axis=1)
            acc_u += tl.sum(u * x[None, :], axis=1)
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(HOUT + s.to(tl.int64) * INTER + i, act, mask=imask)

    @triton.jit
    def down_kernel(HIN, IDX, WTS, W, Y, stride_we, stride_wr,
                    HID: tl.constexpr, INTER: tl.constexpr,
                    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr):
        s = tl.program_id(0)
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        omask = o < HID
        e = tl.load(IDX + s).to(tl.int64)
        wd = W + e * stride_we + o.to(tl.int64)[:, None] * stride_wr
        acc = tl.zeros([BLOCK_O], dtype=tl.float32)
        for i0 in range(0, INTER, BLOCK_I):
            i = i0 + tl.arange(0, BLOCK_I)
            imask = i < INTER
            h = tl.load(HIN + s.to(tl.int64) * INTER + i, mask=imask, other=0.0)
            d = tl.load(wd + i[None, :], mask=omask[:, None] & imask[None, :], other=0.0)
            acc += tl.sum(d.to(tl.float32) * h[None, :], axis=1)
        wt = tl.load(WTS + s).to(tl.float32)
        tl.store(Y + s.to(tl.int64) * HID + o, acc * wt, mask=omask)

    from ..attention.launch import FastLaunch
    return FastLaunch(gate_up_kernel), FastLaunch(down_kernel)


def _pow2(n: int, cap: int) -> int:
    return min(cap, 1 << max(4, (int(n) - 1).bit_length()))


def gate_up_rows(slots: int, inter: int) -> int:
    """Rows of the intermediate size per gate/up program: 64, halved (down to 16) while the
    launch has fewer than ``TARGET_PROGRAMS`` programs. A decode step routes few (token, expert)
    pairs; with 64 rows Qwen3-30B-A3B's 2-token step launched 16 x 12 = 192 programs on the
    H200's 132 SMs, which read its ~100 MB of gate/up weights a layer at ~1.6 TB/s (3.06 ms of
    a 14.7 ms step, bench/results/2026-12-03c-h200, call 3) while the down kernel's 512 programs
    read at 3.6 TB/s. Each row's sum runs over the same hidden blocks in the same order whatever
    the programs' rows, so the results do not change."""
    from ..attention.gpu import TARGET_PROGRAMS
    bi = _pow2(inter, 64)
    while bi > 16 and slots * -(-inter // bi) < TARGET_PROGRAMS:
        bi //= 2
    return bi


def fused_experts(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor) -> torch.Tensor:
    """``sum_j w[t, j] * expert_{idx[t, j]}(x[t])`` for ``x [n, H]``, ``idx``/``w [n, k]``,
    ``gate_up [E, 2I, H]`` and ``down [E, H, I]`` (rows contiguous). Same contract as
    :func:`~writescope.layers.moe.run_experts`."""
    n, k = idx.shape
    E, two_i, hid = gate_up.shape
    inter = two_i // 2
    if tuple(down.shape) != (E, hid, inter) or x.shape[-1] != hid:
        raise ValueError(f"expert shapes {tuple(gate_up.shape)} / {tuple(down.shape)} do not fit "
                         f"hidden size {x.shape[-1]}")
    if gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("expert weights need contiguous rows")
    slots = n * k
    out = torch.zeros_like(x)
    if slots == 0:
        return out
    gate_up_kernel, down_kernel = _kernels()
    xc = x.contiguous()
    ids = idx.reshape(-1).to(torch.int32).contiguous()
    wts = w.reshape(-1).to(torch.float32).contiguous()
    h = torch.empty(slots, inter, dtype=torch.float32, device=x.device)
    y = torch.empty(slots, hid, dtype=torch.float32, device=x.device)
    bi, bh = gate_up_rows(slots, inter), _pow2(hid, 128)
    gate_up_kernel[(slots, -(-inter // bi))](xc, ids, gate_up, h, gate_up.stride(0),
                                             gate_up.stride(1), K=k, HID=hid, INTER=inter,
                                             BLOCK_I=bi, BLOCK_H=bh)
    bo, bi2 = _pow2(hid, 64), _pow2(inter, 128)
    down_kernel[(slots, -(-hid // bo))](h, ids, wts, down, y, down.stride(0), down.stride(1),
                                        HID=hid, INTER=inter, BLOCK_O=bo, BLOCK_I=bi2)
    out.copy_(y.view(n, k, hid).sum(1))
    return out
