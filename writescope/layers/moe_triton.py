"""Routed experts of a decode-sized step in two Triton launches (GPU-resident experts).

A decode step routes a few tokens to a few experts each. Computed expert by expert
(:func:`writescope.layers.moe.run_experts`) that is ~11 framework ops per active expert -- about
260 per DeepSeek-V2-Lite layer at batch 4 -- and on the H200 machine such a step was bound by
launching them (104 ms measured against a 6 ms roofline bound, bench/results/2026-11-30-h200/).
Here every (token, slot) pair is one row of two GEMV launches that read the chosen experts'
weights in place from the stacked ``gate_up [E, 2I, H]`` / ``down [E, H, I]`` tensors:

1. ``h[s] = silu(W_gate[e_s] x[t_s]) * (W_up[e_s] x[t_s])``  -- grid (slots, I / BLOCK_I)
2. ``out[t] = sum_j w_j * W_down[e_j] h[t*k + j]``          -- grid (tokens, H / BLOCK_O)

Accumulation is fp32, per (row, column) across the loop and reduced once at its end; the
second kernel sums a token's experts in slot order and writes the model's dtype (until the
thirty-third session: one program per slot, an fp32 buffer of every slot's output, then a
sum and a cast, three more kernels a layer). Loop bounds are compile-time constants, so
Triton's CPU interpreter runs the kernels too (the tests do).

An FP8 checkpoint's experts kept FP8 on the device (``StackedExperts(fp8=...)``) are read as
their bytes, one float32 scale per block, and turned into bf16(q * scale) in registers before
the products (:func:`fused_experts`' ``fp8``): half the bytes of bf16 experts, the same results.

On by default on CUDA (``WRITESCOPE_FUSED_MOE=0`` turns it off): :class:`~writescope.layers.moe.
StackedExperts` uses it for steps of at most ``MAX_SLOTS`` (token, expert) pairs. On the H200
machine it took DeepSeek-V2-Lite's batch-4 decode from 32.8 to 41.7 tokens/s (8K context, GPU
experts; bench/results/2026-11-30b-h200/). The design follows the GEMV-style small-batch path of vLLM's fused MoE
(one program per routed row, weights read where they lie); the code is ours.
"""
from __future__ import annotations

import functools
import json
import os

import torch

from ..attention.launch import pdl_args

#: (token, slot) pairs up to which a step takes the fused path
MAX_SLOTS = 128
#: FP8 experts take the fused path up to this many pairs an expert of the layer (at least
#: MAX_SLOTS pairs): past it a step dequantizes the experts (groups of them, ~11 bytes of
#: traffic a weight) for the expert-by-expert GEMMs, where the fused kernels read each active
#: expert from DRAM about once (a launch's programs run slot-fastest, so the pairs of one
#: expert read the same rows together, from L2) and spend a few ALU operations a weight a
#: pair -- the cheaper path to several pairs an expert: 1,024 pairs for Qwen3-30B-A3B (a
#: decode batch of 128 tokens), 512 for DeepSeek-V2-Lite, 128 for Mixtral-8x7B
FP8_PAIRS_PER_EXPERT = 8


def available() -> bool:
    from ..attention.gpu import triton_available
    return triton_available()


def enabled() -> bool:
    return os.environ.get("WRITESCOPE_FUSED_MOE", "1") not in ("0", "", "false", "no") and available()


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    global fp8_weights  # where Triton's CPU interpreter looks a kernel's callees up

    @triton.jit
    def fp8_weights(q, scale, MODE: tl.constexpr):
        # float8_e4m3fn bytes (uint8) times their blocks' scales (broadcast to q's shape), as the
        # bf16 values bf16(q * scale) that the checkpoint dequantized at load gives, in float32.
        # MODE % 4 -- 1: the hardware's conversion (sm_89 and later, via half); 2: integer
        # operations -- the byte's sign, exponent and mantissa moved into a half's (exact,
        # subnormals too), times 2^8 for the bias (7 against 15); 3: integer operations into a
        # float's bits -- the byte sign-extended, shifted up by 20 and masked to the sign and the
        # 7 magnitude bits, a value 2^-120 times the byte's (exact, e4m3 subnormals on fp32
        # subnormals), the scale times 2^120 (the CPU kernel's conversion, csrc/cpu_experts.cpp:
        # two integer operations, no conversion instruction). The product q * scale is rounded
        # once either way. NaN codes (0x7f, 0xff) come out as 480 by MODES 2 and 3, and MODE 3
        # needs scales below 2^8: the loader refuses checkpoints otherwise
        # (QuantizedCheckpoint.get_fp8).
        # MODE & 4: the rounding to bf16 by integer operations, to nearest even (Triton's CPU
        # interpreter truncates in its casts; the GPU's cvt.rn rounds as torch does).
        # MODE & 8: no rounding to bf16 -- q * scale in float32 (not the dequantized
        # checkpoint's values: a measurement of what the rounding costs, bench.gpu_experts)
        if MODE % 4 == 1:
            f = q.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale
        elif MODE % 4 == 2:
            b = q.to(tl.uint16)
            b = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
            f = b.to(tl.float16, bitcast=True).to(tl.float32) * (scale * 256.0)
        else:
            b = (q.to(tl.int8, bitcast=True).to(tl.int32) << 20) & -2014314496  # 0x87F00000
            f = b.to(tl.float32, bitcast=True) * (scale * 1.329227995784916e36)  # 2^120
        if (MODE // 8) % 2 == 1:
            return f
        if (MODE // 4) % 2 == 1:
            r = f.to(tl.uint32, bitcast=True)
            r = (r + 0x7FFF + ((r >> 16) & 1)) & 0xFFFF0000
            return r.to(tl.float32, bitcast=True)
        return f.to(tl.bfloat16).to(tl.float32)

    @triton.jit
    def gate_up_kernel(X, IDX, W, HOUT, S, stride_we, stride_wr, stride_se, stride_sm, stride_sr,
                       K: tl.constexpr, HID: tl.constexpr, INTER: tl.constexpr,
                       BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
                       FP8: tl.constexpr, SBO: tl.constexpr, SBI: tl.constexpr):
        if PDL:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        s = tl.program_id(0)
        i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
        imask = i < INTER
        e = tl.load(IDX + s).to(tl.int64)
        t = (s // K).to(tl.int64)
        wg = W + e * stride_we + i.to(tl.int64)[:, None] * stride_wr
        wu = wg + INTER * stride_wr
        if FP8:  # each row's scales: gate's grid, then up's; BLOCK_H divides the column block
            sg = S + e * stride_se + (i // SBO).to(tl.int64) * stride_sr
            su = sg + stride_sm
        # products accumulate per (row, column) and each row is reduced once, after the loop:
        # no cross-lane reduction between the loads of one block and the next
        acc_g = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
        for h0 in range(0, HID, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            hmask = h < HID
            x = tl.load(X + t * HID + h, mask=hmask, other=0.0).to(tl.float32)
            m = imask[:, None] & hmask[None, :]
            g = tl.load(wg + h[None, :], mask=m, other=0)
            u = tl.load(wu + h[None, :], mask=m, other=0)
            if FP8:
                g = fp8_weights(g, tl.load(sg + h0 // SBI, mask=imask, other=0.0)[:, None], FP8)
                u = fp8_weights(u, tl.load(su + h0 // SBI, mask=imask, other=0.0)[:, None], FP8)
            acc_g += g.to(tl.float32) * x[None, :]
            acc_u += u.to(tl.float32) * x[None, :]
        sg = tl.sum(acc_g, axis=1)
        su = tl.sum(acc_u, axis=1)
        act = sg / (1.0 + tl.exp(-sg)) * su
        tl.store(HOUT + s.to(tl.int64) * INTER + i, act, mask=imask)

    @triton.jit
    def down_kernel(HIN, IDX, WTS, W, OUT, ADD, S, stride_we, stride_wr, stride_se, stride_sr,
                    K: tl.constexpr, KP: tl.constexpr, HID: tl.constexpr, INTER: tl.constexpr,
                    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, HAS_ADD: tl.constexpr,
                    PDL: tl.constexpr, EARLY: tl.constexpr,
                    FP8: tl.constexpr, SBO: tl.constexpr, SBI: tl.constexpr):
        # one program: BLOCK_O outputs of one token over all its K experts at once (a
        # [KP, BLOCK_O, BLOCK_I] tile a load, KP = K to the power of two, the padding masked),
        # each expert's rows summed over the intermediate size, then weighted and summed over
        # the experts in slot order (deterministic), written in the output's dtype: no per-slot
        # buffer, no separate sum over the slots
        if PDL and not EARLY:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        t = tl.program_id(0).to(tl.int64)
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        omask = o < HID
        j = tl.arange(0, KP)
        jmask = j < K
        s = t * K + j
        # EARLY (launch.py): the router's expert ids and weights (two launches back: the gate/up
        # kernel is between) and the first weight tile before the wait; the activations after
        e = tl.load(IDX + s, mask=jmask, other=0).to(tl.int64)
        wt = tl.load(WTS + s, mask=jmask, other=0.0).to(tl.float32)
        wrow = W + e[:, None, None] * stride_we + o.to(tl.int64)[None, :, None] * stride_wr
        hrow = HIN + s[:, None] * INTER
        rmask = jmask[:, None, None] & omask[None, :, None]
        i = tl.arange(0, BLOCK_I)
        imask = i < INTER
        d = tl.load(wrow + i[None, None, :], mask=rmask & imask[None, None, :], other=0)
        if FP8:  # the scales of each expert's BLOCK_O rows, [KP, BLOCK_O] a column block
            srow = S + e[:, None] * stride_se + (o // SBO).to(tl.int64)[None, :] * stride_sr
            smask = jmask[:, None] & omask[None, :]
            d = fp8_weights(d, tl.load(srow, mask=smask, other=0.0)[:, :, None], FP8)
        if PDL and EARLY:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        h = tl.load(hrow + i[None, :], mask=jmask[:, None] & imask[None, :], other=0.0)
        acc = d.to(tl.float32) * h[:, None, :]  # the first block's products, then the rest's
        for i0 in range(BLOCK_I, INTER, BLOCK_I):
            i = i0 + tl.arange(0, BLOCK_I)
            imask = i < INTER
            h = tl.load(hrow + i[None, :], mask=jmask[:, None] & imask[None, :], other=0.0)
            d = tl.load(wrow + i[None, None, :], mask=rmask & imask[None, None, :], other=0)
            if FP8:
                sc = tl.load(srow + i0 // SBI, mask=smask, other=0.0)
                d = fp8_weights(d, sc[:, :, None], FP8)
            acc += d.to(tl.float32) * h[:, None, :]
        y = tl.sum(tl.sum(acc, axis=2) * wt[:, None], axis=0).to(OUT.dtype.element_ty)
        if HAS_ADD:  # `y + add` as torch adds two tensors of the output's dtype
            a = tl.load(ADD + t * HID + o, mask=omask, other=0.0)
            y = (y.to(tl.float32) + a.to(tl.float32)).to(OUT.dtype.element_ty)
        tl.store(OUT + t * HID + o, y, mask=omask)

    from ..attention.launch import FastLaunch
    return FastLaunch(gate_up_kernel), FastLaunch(down_kernel)


def _pow2(n: int, cap: int, floor: int = 16) -> int:
    return min(cap, 1 << max(floor.bit_length() - 1, (int(n) - 1).bit_length()))


def gate_up_rows(slots: int, inter: int) -> int:
    """Rows of the intermediate size per gate/up program: :data:`GATE_UP_ROWS`, whatever the
    step's routed pairs (``slots``) and the intermediate size. Each row's sum runs over the same
    hidden blocks in the same order whatever the programs' rows, so the results do not change.

    Until the thirty-seventh session: 64 rows, halved down to 16 while a launch had fewer than
    ``TARGET_PROGRAMS`` programs (with 64 rows Qwen3-30B-A3B's 2-token step had launched 192
    programs, which read its gate/up weights at ~1.6 TB/s, bench/results/2026-12-03c-h200 call 3).
    The sweep of bench/results/2026-12-04b-h200 call 1 (``bench.gpu_experts --sweep``, CUDA-graph
    replays over 8 layers' experts) found 8 rows over 8 warps the fastest gate/up setting at both
    Qwen3-30B-A3B's 2 and DeepSeek-V2-Lite's 4 tokens: a layer's experts in 43.9 and 96.7 us
    against 46.1 and 99.1 with 16 / 64 rows over 4 warps (DeepSeek's 64 rows took 245 registers
    a thread, two programs an SM)."""
    return GATE_UP_ROWS


def down_rows(tokens: int, hid: int, k_pow2: int = 1) -> int:
    """Outputs per down program (each reads its token's K experts' rows, ``k_pow2`` = K to the
    power of two of them a load): at most 128 rows a tile and 64 outputs, halved (down to 8)
    while the launch has fewer than ``TARGET_PROGRAMS`` programs."""
    from ..attention.gpu import TARGET_PROGRAMS
    bo = _pow2(hid, max(8, min(64, 128 // k_pow2)), 8)
    while bo > 8 and tokens * -(-hid // bo) < TARGET_PROGRAMS:
        bo //= 2
    return bo


#: the gate/up kernel's block of the hidden size, and the down kernel's bytes of weights one
#: program loads per loop step. Measured in the engine's steps on the H200 (2026-12-03h calls 2
#: and 3, ``step_profile``): gate/up with 128 columns and 4 warps read Qwen3-30B-A3B's 2-token
#: and DeepSeek-V2-Lite's 4-token gate/up weights in 1.47 and 1.66 ms a step (256 and 64
#: columns over 8 warps: 1.68 and 2.25; the row-at-a-time form before: 1.71 and 2.00); the
#: down kernel over 16 KB tiles of a token's experts, 8 warps, in 0.77 and 0.91 ms (a 2-D tile
#: per expert: 0.91 and 1.03; one program per slot plus a sum: 0.65 + ~0.3 and 0.93 + ~0.15)
GATE_UP_BLOCK_H = 128
TILE_BYTES = 16384
#: rows a gate/up program and the two kernels' warps (:func:`gate_up_rows`; the down kernel's
#: 16 KB tiles over 4 warps instead of 8: a layer's experts in 44.5 / 95.4 us against 46.1 /
#: 99.1 at Qwen3's 2 and DeepSeek's 4 tokens, the same sweep)
GATE_UP_ROWS = 8
#: FP8 experts' gate/up rows a program: their tiles hold half the bytes of bf16's at the same
#: width, and more rows a program put more of them in flight. On the H200
#: (bench/results/2026-12-05f-h200/call1, ``bench.gpu_experts --fp8-variants``, CUDA-graph
#: replays) 32 rows over 8 warps read a layer's FP8 experts in 63.2 / 94.4 / 527.6 us at
#: Qwen3-30B-A3B's / DeepSeek-V2-Lite's / Mixtral-8x7B's 4 tokens against 76.1 / 112.5 / 632.2
#: with bf16's 8 rows, 203.5 against 222.8 at Mixtral's one token, and within 1% at Qwen3's and
#: DeepSeek's one token (30.3 / 38.8 against 30.1 / 38.4); on the H100 (call 3, 1-8 tokens, both
#: settings in one call) 1.00-1.32x less time in every row
FP8_GATE_UP_ROWS = 32
GATE_UP_WARPS = 8
DOWN_WARPS = 4

#: the launch settings :func:`fused_experts` takes from ``config`` and from
#: ``WRITESCOPE_MOE_LAUNCH`` (a JSON object of them, powers of two, and ``fp8_convert``, one of
#: :data:`FP8_CONVERT_MODES`: the engine's steps with other settings)
LAUNCH_KEYS = ("gate_up_rows", "gate_up_block_h", "gate_up_warps", "down_rows", "down_block_i",
               "down_warps")


@functools.lru_cache(maxsize=8)
def _overrides(raw: str) -> dict:
    if not raw.strip():
        return {}
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"WRITESCOPE_MOE_LAUNCH is not JSON ({e}): {raw!r}") from None
    bad = [k for k in d if k not in LAUNCH_KEYS + ("fp8_convert",)] if isinstance(d, dict) \
        else ["(not an object)"]
    vals = [v for k, v in d.items() if k != "fp8_convert"] if isinstance(d, dict) else []
    if bad or not all(type(v) is int and v > 0 and v & (v - 1) == 0 for v in vals):
        raise ValueError(f"WRITESCOPE_MOE_LAUNCH takes an object of {', '.join(LAUNCH_KEYS)} "
                         f"with powers of two (and fp8_convert): got {raw!r}")
    if "fp8_convert" in d and (type(d["fp8_convert"]) is not int
                               or d["fp8_convert"] not in FP8_CONVERT_MODES):
        raise ValueError(f"WRITESCOPE_MOE_LAUNCH: fp8_convert must be one of {FP8_CONVERT_MODES}, "
                         f"got {d['fp8_convert']!r}")
    return dict(d)


def launch_overrides() -> dict:
    """The launch settings ``WRITESCOPE_MOE_LAUNCH`` sets (empty when unset)."""
    return _overrides(os.environ.get("WRITESCOPE_MOE_LAUNCH", ""))


def _width(tile_rows: int, n: int, itemsize: int) -> int:
    """The loop's block width: ``TILE_BYTES`` over ``tile_rows`` rows, a power of two in
    [32, 512], no wider than ``n`` to the power of two."""
    w = 1 << max(5, (TILE_BYTES // max(1, tile_rows * itemsize)).bit_length() - 1)
    return max(32, min(512, w, _pow2(n, 512, 32)))


#: ``config["fp8_convert"]`` (``fp8_weights``): 1 the hardware's conversion, 2 and 3 integer
#: ones (through a half's bits, through a float's), 9 and 11 the same as 1 and 3 without the
#: rounding to bf16 (not the dequantized checkpoint's values: for timing what it costs)
FP8_CONVERT_MODES = (1, 2, 3, 9, 11)


def fp8_convert_mode(device: torch.device) -> int:
    """How the fused kernels turn FP8 bytes into floats on ``device``: 1, the hardware's
    conversion (CUDA compute capability 8.9 and later, and Triton's CPU interpreter); 2, integer
    operations (older GPUs)."""
    if device.type != "cuda":
        return 1
    return 1 if torch.cuda.get_device_capability(device) >= (8, 9) else 2


def _check_fp8(gate_up, down, fp8, x) -> None:
    gs, ds, scheme = fp8
    E, two_i, hid = gate_up.shape
    inter = two_i // 2
    if gate_up.dtype != torch.uint8 or down.dtype != torch.uint8:
        raise ValueError(f"FP8 experts are uint8 bytes, got {gate_up.dtype} / {down.dtype}")
    want_g = (E, 2, *scheme.scale_shape((inter, hid)))
    want_d = (E, *scheme.scale_shape((hid, inter)))
    if tuple(gs.shape) != want_g or tuple(ds.shape) != want_d:
        raise ValueError(f"FP8 scales {tuple(gs.shape)} / {tuple(ds.shape)}, expected {want_g} / "
                         f"{want_d} for {scheme.name}")
    if gs.dtype != torch.float32 or ds.dtype != torch.float32 or gs.stride(3) != 1 \
            or ds.stride(2) != 1:
        raise ValueError("FP8 scales must be float32 with contiguous rows")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"FP8 experts compute in bfloat16, not {x.dtype}")


def fused_experts(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor, config: dict | None = None,
                  add: torch.Tensor | None = None, fp8: tuple | None = None) -> torch.Tensor:
    """``sum_j w[t, j] * expert_{idx[t, j]}(x[t])`` for ``x [n, H]``, ``idx``/``w [n, k]``,
    ``gate_up [E, 2I, H]`` and ``down [E, H, I]`` (rows contiguous). Same contract as
    :func:`~writescope.layers.moe.run_experts`; with ``add [n, H]`` (``x``'s dtype) the bits of
    that result ``+ add``, in the down kernel (DeepSeek's shared experts' output: one kernel a
    layer less, ~1.5 us on the H200, bench/results/2026-12-03j-h200/call1/d4-32k.log).
    ``fp8 = (gate_up_scale, down_scale, scheme)``: ``gate_up``/``down`` hold float8_e4m3fn bytes
    (uint8) with the scales of :class:`~writescope.layers.moe.StackedExperts`; each weight is
    computed as bf16(q * scale), so the result equals, bit for bit, this function's over the
    experts dequantized to bfloat16 (``x`` must be bfloat16). The loops' widths are then at most
    the scale blocks' largest power-of-two divisor, so that a tile never straddles two blocks.
    ``config`` (benchmarks): ``gate_up_rows``, ``gate_up_block_h``, ``down_rows``,
    ``down_block_i``, ``gate_up_warps``, ``down_warps`` instead of the defaults (and of
    ``WRITESCOPE_MOE_LAUNCH``'s, :func:`launch_overrides`); ``fp8_convert`` instead of
    :func:`fp8_convert_mode`'s (:data:`FP8_CONVERT_MODES`)."""
    n, k = idx.shape
    E, two_i, hid = gate_up.shape
    inter = two_i // 2
    if tuple(down.shape) != (E, hid, inter) or x.shape[-1] != hid:
        raise ValueError(f"expert shapes {tuple(gate_up.shape)} / {tuple(down.shape)} do not fit "
                         f"hidden size {x.shape[-1]}")
    if gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("expert weights need contiguous rows")
    if add is not None and (add.shape != x.shape or add.dtype != x.dtype):
        raise ValueError(f"adding {add.dtype} {tuple(add.shape)} to {x.dtype} {tuple(x.shape)}")
    if fp8 is not None:
        _check_fp8(gate_up, down, fp8, x)
    slots = n * k
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # rows contiguous, as written
    if slots == 0:
        return out
    c = {**launch_overrides(), **(config or {})}
    gate_up_kernel, down_kernel = _kernels()
    xc = x.contiguous()
    ids = idx.reshape(-1).to(torch.int32).contiguous()
    wts = w.reshape(-1).to(torch.float32).contiguous()
    h = torch.empty(slots, inter, dtype=torch.float32, device=x.device)
    pdl = pdl_args(h)
    # the tiles' widths by the values they hold once loaded (registers), FP8 ones as bf16
    isz = 2 if fp8 is not None else gate_up.element_size()
    bi = c.get("gate_up_rows") or (FP8_GATE_UP_ROWS if fp8 is not None
                                   else gate_up_rows(slots, inter))
    bh = c.get("gate_up_block_h") or _pow2(hid, GATE_UP_BLOCK_H)
    if fp8 is None:
        mode, sbo, sbi, gs, ds = 0, 1, 1, gate_up, down  # (the scale pointers are not read)
        gstr, dstr = (0, 0, 0), (0, 0)
    else:
        gs, ds, scheme = fp8
        mode = c.get("fp8_convert") or fp8_convert_mode(x.device)
        if mode not in FP8_CONVERT_MODES:
            raise ValueError(f"fp8_convert must be one of {FP8_CONVERT_MODES}, got {mode!r}")
        if x.device.type != "cuda" and mode < 8:  # the interpreter: bf16 rounding by integers
            mode |= 4
        sbo, sbi = scheme.block
        bh = min(bh, sbi & -sbi)  # a tile's columns within one scale block
        gstr, dstr = (gs.stride(0), gs.stride(1), gs.stride(2)), (ds.stride(0), ds.stride(1))
    gate_up_kernel[(slots, -(-inter // bi))](xc, ids, gate_up, h, gs, gate_up.stride(0),
                                             gate_up.stride(1), *gstr, K=k, HID=hid, INTER=inter,
                                             BLOCK_I=bi, BLOCK_H=bh, FP8=mode, SBO=sbo, SBI=sbi,
                                             num_warps=c.get("gate_up_warps") or GATE_UP_WARPS,
                                             **pdl)
    kp = 1 << (k - 1).bit_length()
    bo = c.get("down_rows") or down_rows(n, hid, kp)
    bi2 = c.get("down_block_i") or _width(kp * bo, inter, isz)
    if fp8 is not None:
        bi2 = min(bi2, sbi & -sbi)
    extra = out if add is None else add.contiguous()  # (not read without HAS_ADD)
    down_kernel[(n, -(-hid // bo))](h, ids, wts, down, out, extra, ds, down.stride(0),
                                    down.stride(1), *dstr, K=k, KP=kp, HID=hid, INTER=inter,
                                    BLOCK_O=bo, BLOCK_I=bi2, HAS_ADD=add is not None,
                                    FP8=mode, SBO=sbo, SBI=sbi,
                                    num_warps=c.get("down_warps") or DOWN_WARPS,
                                    **pdl_args(h, early=True))
    return out
