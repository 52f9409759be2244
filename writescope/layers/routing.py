"""The router as one Triton kernel (CUDA): its softmax, top-k, renormalisation and scaling,
for decode-sized steps its logits too.

:class:`~writescope.layers.moe.Router` turns each token's router logits into ``k`` expert ids
and weights. In torch that is six kernels a layer (the softmax, the top-k's two, the sum, the
division, the cast); in Qwen3-30B-A3B's 2 x 32K decode step (one CUDA graph) the top-k's two
alone took 0.48 of its 9.9 device milliseconds (bench/results/2026-12-03c-h200, call 5).
:func:`route_fused` is one program per token: the float32 softmax over the ``E`` logits, the
``k`` largest by ``k`` rounds of one max over keys that hold a probability's bits above its
id's complement (descending order, ties to the lower id), the division by their sum (plus
``eps``) where the family renormalises, times ``scale``, stored in ``out_dtype``. The same
arithmetic as the torch form in float32, in another summation order (the last bit may differ),
and the ids always in descending order of weight (DeepSeek's reference asks the top-k for no
order; the expert sum's order follows the ids').

The logits' GEMM before it cost more than the routing: per layer of a graphed decode step a
cuBLAS GEMV of ~5 us for Qwen3-30B-A3B's 2 tokens (bf16 weight 128 x 2048) and 6.4 us for
Mixtral's (8 x 4096); for DeepSeek-V2-Lite's 4 tokens, whose float32 router multiplies
``x.float()``, a copy of ~3 us, a SIMT sgemm of 5.4 us and a split-K reduction of 2.3 us
(bench/results/2026-12-03j-h200/call1/q2-32k.log and d4-32k.log), against 2-2.3 us for the
routing; a Triton GEMV on tensor cores was no faster (13 us for the float32 router,
gemv.log there). :func:`router_fused` does both in one launch for up to ``MAX_TOKENS`` tokens:
one program per expert (:func:`router_blocks`) sums every token's products with its weight row
in float32 on the CUDA cores (reading ``x`` and the weight where they lie, whatever their
dtypes: no copy), stores the logits rounded as ``F.linear`` would return them, then takes a
ticket from a counter; the program with the last ticket reads all the logits back, routes every
token with :func:`route_fused`'s code (``route_rows``, one [tokens, experts] tile) and zeroes
the counter for the next launch, a CUDA graph's replay too. Deterministic: every sum runs in a
fixed order. On the H200 (graphed launches over 160 layers' routers, each weight read from HBM;
bench/results/2026-12-03j-h200/router-sweep, a one-off script there; in the engine's graphed
2 x 32K step, call 2 there: 0.24 ms for Qwen3's 48 layers against 0.35 for GEMV + routing) a
layer took, for 2 / 4 / 8 / 16 tokens:
Qwen3-30B-A3B 7.8-8.1 us before, 5.9 / 5.3 / 6.0 / 8.1 after; DeepSeek-V2-Lite 13.7-14.4 us
before, 5.0 / 4.7 / 5.3 / 7.0 after; Mixtral 7.0-7.9 before, 3.1 / 3.6 / 4.7 / 7.1 after (2.9
for one token). The logits may differ from cuBLAS's by a unit where the summation order moves
one across a rounding boundary (the experts then only where two logits all but tie).

``WRITESCOPE_FUSED_ROUTER=0`` keeps the torch form, which is also the form on the CPU;
``WRITESCOPE_FUSED_ROUTER_LOGITS=0`` keeps the logits' GEMM before :func:`route_fused`.
"""
from __future__ import annotations

import functools

import torch

from ..attention.launch import pdl_args


def fused_enabled() -> bool:
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_ROUTER")


def logits_enabled() -> bool:
    """Whether the router's logits join its routing in one launch (:func:`router_fused`)."""
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_ROUTER_LOGITS")


#: tokens up to which :class:`~writescope.layers.moe.Router` takes :func:`router_fused`
MAX_TOKENS = 16


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    global route_rows  # where Triton's CPU interpreter looks a kernel's callees up

    @triton.jit
    def route_rows(x, me, e, eps, scale, ROWS: tl.constexpr, K: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORM: tl.constexpr,
                   ROUND: tl.constexpr):
        # x [ROWS, BLOCK_E] float32 logits, -inf past the E experts; e [1, BLOCK_E] the expert
        # ids, me (e < E): the k largest probabilities of each row and their ids, [ROWS, BLOCK_K]
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        p = tl.where(me, p, 0.0)
        p = p / tl.sum(p, axis=1)[:, None]
        kk = tl.arange(0, BLOCK_K)[None, :]
        vals = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
        ids = tl.zeros([ROWS, BLOCK_K], dtype=tl.int32)
        # one max a round: a probability's bits (>= 0: ordered as the values) over the
        # complement of its id (the lower id wins a tie); -1 below every key
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - e)
        key = tl.where(me, key, -1)
        for j in tl.static_range(K):
            best = tl.max(key, axis=1)[:, None]
            vals = tl.where(kk == j, (best >> 32).to(tl.int32).to(tl.float32, bitcast=True), vals)
            ids = tl.where(kk == j, BLOCK_E - 1 - (best & (BLOCK_E - 1)).to(tl.int32), ids)
            key = tl.where(key == best, -1, key)
        if RENORM:
            vals = vals / (tl.sum(vals, axis=1)[:, None] + eps)  # the slots past k hold 0
        vals = vals * scale
        if ROUND == 1:  # the weights' values in bf16 (fp16), stored wider for their consumer
            vals = vals.to(tl.bfloat16).to(tl.float32)
        elif ROUND == 2:
            vals = vals.to(tl.float16).to(tl.float32)
        return vals, ids

    @triton.jit
    def route_kernel(LOGITS, W, IDX, stride_l, E, eps, scale, K: tl.constexpr,
                     BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORM: tl.constexpr,
                     ROUND: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, BLOCK_E)[None, :]
        me = e < E
        x = tl.load(LOGITS + row * stride_l + e, mask=me, other=float("-inf")).to(tl.float32)
        vals, ids = route_rows(x, me, e, eps, scale, 1, K, BLOCK_E, BLOCK_K, RENORM, ROUND)
        kk = tl.arange(0, BLOCK_K)[None, :]
        mk = kk < K
        tl.store(W + row * K + kk, vals.to(W.dtype.element_ty), mask=mk)
        tl.store(IDX + row * K + kk, ids.to(IDX.dtype.element_ty), mask=mk)

    @triton.jit
    def router_kernel(X, WR, LOGITS, COUNTER, W, IDX, n, stride_x, stride_w, E, eps, scale,
                      HID: tl.constexpr, ROWS: tl.constexpr, BLOCK_X: tl.constexpr,
                      BLOCK_H: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr,
                      BLOCK_K: tl.constexpr, RENORM: tl.constexpr, ROUND: tl.constexpr,
                      PDL: tl.constexpr, EARLY: tl.constexpr):
        if PDL and not EARLY:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        # 1. this program's BLOCK_X experts' logits of every token: float32 products summed per
        # (token, expert, column) over the hidden blocks in order, then over the columns
        t = tl.arange(0, ROWS)
        mt = t < n
        f = tl.program_id(0) * BLOCK_X + tl.arange(0, BLOCK_X)
        mf = f < E
        # EARLY (launch.py): the first hidden block's weights (a decode step's tokens take the
        # whole hidden size in one block) before the wait; the normed tokens after
        h = tl.arange(0, BLOCK_H)
        w_first = tl.load(WR + f[:, None] * stride_w + h[None, :],
                          mask=mf[:, None] & (h < HID)[None, :], other=0.0)
        if PDL and EARLY:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        acc = tl.zeros([ROWS, BLOCK_X, BLOCK_H], dtype=tl.float32)
        for h0 in tl.static_range(0, HID, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            mh = h < HID
            xv = tl.load(X + t[:, None] * stride_x + h[None, :], mask=mt[:, None] & mh[None, :],
                         other=0.0).to(tl.float32)
            if h0 == 0:
                wv = w_first.to(tl.float32)
            else:
                wv = tl.load(WR + f[:, None] * stride_w + h[None, :],
                             mask=mf[:, None] & mh[None, :], other=0.0).to(tl.float32)
            acc += xv[:, None, :] * wv[None, :, :]
        lg = tl.sum(acc, axis=2)
        tl.store(LOGITS + t[:, None] * E + f[None, :], lg.to(LOGITS.dtype.element_ty),
                 mask=mt[:, None] & mf[None, :])
        # 2. the last program to finish routes every token: the barrier orders this program's
        # stores before its counter's release (a scalar atomic runs in one thread); the
        # acquire, then loads past L1, see every program's
        tl.debug_barrier()
        done = tl.atomic_add(COUNTER, 1, sem="acq_rel", scope="gpu")
        if done == tl.num_programs(0) - 1:
            e = tl.arange(0, BLOCK_E)[None, :]
            me = e < E
            x = tl.load(LOGITS + t[:, None] * E + e, mask=mt[:, None] & me, other=0.0,
                        cache_modifier=".cg").to(tl.float32)
            x = tl.where(me, x, float("-inf"))  # the padding rows stay finite
            vals, ids = route_rows(x, me, e, eps, scale, ROWS, K, BLOCK_E, BLOCK_K, RENORM,
                                   ROUND)
            kk = tl.arange(0, BLOCK_K)[None, :]
            mk = mt[:, None] & (kk < K)
            tl.store(W + t[:, None] * K + kk, vals.to(W.dtype.element_ty), mask=mk)
            tl.store(IDX + t[:, None] * K + kk, ids.to(IDX.dtype.element_ty), mask=mk)
            tl.store(COUNTER, 0)  # for the next launch (a CUDA graph's replay too)

    from ..attention.launch import FastLaunch
    return FastLaunch(route_kernel), FastLaunch(router_kernel)


#: ``route_fused``'s ``round_to``: the dtypes its weights may be rounded to before stored wider
_ROUND = {None: 0, torch.bfloat16: 1, torch.float16: 2, torch.float32: 0}


def _outputs(n: int, e: int, k: int, out_dtype, ids_dtype, round_to, device):
    if not 0 < k <= e:
        raise ValueError(f"top-{k} of {e} experts")
    if round_to not in _ROUND or ids_dtype not in (torch.long, torch.int32):
        raise ValueError(f"weights rounded to {round_to}, ids as {ids_dtype}")
    return (torch.empty(n, k, dtype=out_dtype, device=device),
            torch.empty(n, k, dtype=ids_dtype, device=device))


def _blocks(e: int, k: int) -> dict:
    return dict(K=k, BLOCK_E=1 << max(4, (e - 1).bit_length()),
                BLOCK_K=1 << max(1, (k - 1).bit_length()))


def route_fused(logits: torch.Tensor, k: int, renorm: bool, eps: float = 0.0, scale: float = 1.0,
                out_dtype: torch.dtype = torch.float32, ids_dtype: torch.dtype = torch.long,
                round_to: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [N, E]`` -> ``(weights [N, k] out_dtype, ids [N, k] ids_dtype)``: the softmax's
    ``k`` largest probabilities in descending order, divided by their sum plus ``eps`` when
    ``renorm``, times ``scale`` (rounded to ``round_to`` first, when given: the values of
    ``out_dtype=round_to`` in a wider tensor, as the fused experts read them; int32 ids
    likewise spare their kernel a cast)."""
    n, e = logits.shape
    w, ids = _outputs(n, e, k, out_dtype, ids_dtype, round_to, logits.device)
    rows = logits if logits.stride(-1) == 1 else logits.contiguous()
    if n:
        b = _blocks(e, k)
        _kernels()[0][(n,)](rows, w, ids, rows.stride(0), e, float(eps), float(scale),
                            RENORM=bool(renorm), ROUND=_ROUND[round_to],
                            num_warps=1 if b["BLOCK_E"] <= 256 else 4, **b)
    return w, ids


#: :func:`router_fused`'s float32 product tile (tokens x hidden block, one expert a program)
TILE = 16384


def router_blocks(n: int, hid: int) -> tuple[int, int, int]:
    """``(experts a program, hidden block, warps)`` of :func:`router_fused` for ``n`` tokens:
    one expert a program and the hidden size in blocks of ``TILE`` over the tokens (to the power
    of two), over 8 warps past 8192 values: the best of the H200 sweep in the module's
    docstring nearly everywhere (two experts a program took 0.3 us less for Qwen3's 2 tokens,
    0.8 us more for its 4; tiles of 4096 values or fewer than a whole hidden size, more)."""
    rows = 1 << max(0, (n - 1).bit_length())
    bh = min(1 << (hid - 1).bit_length(), TILE // rows)
    return 1, bh, 8 if rows * bh > 8192 else 4


def router_fused(x: torch.Tensor, weight: torch.Tensor, counter: torch.Tensor, k: int,
                 renorm: bool, eps: float = 0.0, scale: float = 1.0,
                 out_dtype: torch.dtype = torch.float32, ids_dtype: torch.dtype = torch.long,
                 round_to: torch.dtype | None = None, logits_dtype: torch.dtype | None = None,
                 config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`route_fused` of the logits ``x [N, H] @ weight [E, H]^T`` (float32 products,
    rounded to ``logits_dtype``, ``x``'s by default, as ``F.linear`` rounds them) in one launch
    for ``N <= MAX_TOKENS``. ``counter``: a zero int32 word on ``x``'s device, which the launch
    uses and leaves zero (one per caller: launches that share one must not overlap).
    ``config`` (benchmarks): ``experts``, ``block_h``, ``warps`` instead of the defaults."""
    n, hid = x.shape
    e = weight.shape[0]
    if n > MAX_TOKENS or weight.shape[1] != hid:
        raise ValueError(f"router of {tuple(x.shape)} by {tuple(weight.shape)} "
                         f"(at most {MAX_TOKENS} tokens)")
    w, ids = _outputs(n, e, k, out_dtype, ids_dtype, round_to, x.device)
    if n:
        x = x if x.stride(-1) == 1 else x.contiguous()
        weight = weight if weight.stride(-1) == 1 else weight.contiguous()
        logits = torch.empty(n, e, dtype=logits_dtype or x.dtype, device=x.device)
        bx, bh, warps = router_blocks(n, hid)
        c = config or {}
        bx, bh, warps = c.get("experts", bx), c.get("block_h", bh), c.get("warps", warps)
        _kernels()[1][(-(-e // bx),)](
            x, weight, logits, counter, w, ids, n, x.stride(0), weight.stride(0), e, float(eps),
            float(scale), HID=hid, ROWS=1 << max(0, (n - 1).bit_length()), BLOCK_X=bx,
            BLOCK_H=bh, RENORM=bool(renorm), ROUND=_ROUND[round_to], num_warps=warps,
            **_blocks(e, k), **pdl_args(x, early=True))
    return w, ids
