"""The router's softmax, top-k, renormalisation and scaling as one Triton kernel (CUDA).

:class:`~writescope.layers.moe.Router` turns each token's router logits into ``k`` expert ids
and weights. In torch that is six kernels a layer (the softmax, the top-k's two, the sum, the
division, the cast); in Qwen3-30B-A3B's 2 x 32K decode step (one CUDA graph) the top-k's two
alone took 0.48 of its 9.9 device milliseconds (bench/results/2026-12-03c-h200, call 5). Here one
program per token computes the float32 softmax over the ``E`` logits, picks the ``k`` largest by
``k`` rounds of max / first index of the max (descending order, ties to the lower id), divides
by their sum (plus ``eps``) where the family renormalises, multiplies by ``scale`` and stores
the weights in ``out_dtype``. The same arithmetic as the torch form in float32, in another
summation order (the last bit may differ), and the ids always in descending order of weight
(DeepSeek's reference asks the top-k for no order; the expert sum's order follows the ids').
``WRITESCOPE_FUSED_ROUTER=0`` keeps the torch form, which is also the form on the CPU.
"""
from __future__ import annotations

import functools

import torch


def fused_enabled() -> bool:
    from ..attention.gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_ROUTER")


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def route_kernel(LOGITS, W, IDX, stride_l, E, eps, scale, K: tl.constexpr,
                     BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORM: tl.constexpr,
                     ROUND: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, BLOCK_E)
        me = e < E
        x = tl.load(LOGITS + row * stride_l + e, mask=me, other=float("-inf")).to(tl.float32)
        p = tl.exp(x - tl.max(x, axis=0))
        p = tl.where(me, p, 0.0)
        p = p / tl.sum(p, axis=0)
        kk = tl.arange(0, BLOCK_K)
        vals = tl.zeros([BLOCK_K], dtype=tl.float32)
        ids = tl.zeros([BLOCK_K], dtype=tl.int32)
        cand = tl.where(me, p, -1.0)  # probabilities are >= 0: -1 is never picked
        for j in tl.static_range(K):
            m = tl.max(cand, axis=0)
            i = tl.min(tl.where(cand == m, e, BLOCK_E), axis=0)
            vals = tl.where(kk == j, m, vals)
            ids = tl.where(kk == j, i, ids)
            cand = tl.where(e == i, -1.0, cand)
        if RENORM:
            vals = vals / (tl.sum(vals, axis=0) + eps)  # the slots past k hold 0
        vals = vals * scale
        if ROUND == 1:  # the weights' values in bf16 (fp16), stored wider for their consumer
            vals = vals.to(tl.bfloat16).to(tl.float32)
        elif ROUND == 2:
            vals = vals.to(tl.float16).to(tl.float32)
        mk = kk < K
        tl.store(W + row * K + kk, vals.to(W.dtype.element_ty), mask=mk)
        tl.store(IDX + row * K + kk, ids.to(IDX.dtype.element_ty), mask=mk)

    from ..attention.launch import FastLaunch
    return FastLaunch(route_kernel)


#: ``route_fused``'s ``round_to``: the dtypes its weights may be rounded to before stored wider
_ROUND = {None: 0, torch.bfloat16: 1, torch.float16: 2, torch.float32: 0}


def route_fused(logits: torch.Tensor, k: int, renorm: bool, eps: float = 0.0, scale: float = 1.0,
                out_dtype: torch.dtype = torch.float32, ids_dtype: torch.dtype = torch.long,
                round_to: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [N, E]`` -> ``(weights [N, k] out_dtype, ids [N, k] ids_dtype)``: the softmax's
    ``k`` largest probabilities in descending order, divided by their sum plus ``eps`` when
    ``renorm``, times ``scale`` (rounded to ``round_to`` first, when given: the values of
    ``out_dtype=round_to`` in a wider tensor, as the fused experts read them; int32 ids
    likewise spare their kernel a cast)."""
    n, e = logits.shape
    if not 0 < k <= e:
        raise ValueError(f"top-{k} of {e} experts")
    if round_to not in _ROUND or ids_dtype not in (torch.long, torch.int32):
        raise ValueError(f"weights rounded to {round_to}, ids as {ids_dtype}")
    rows = logits if logits.stride(-1) == 1 else logits.contiguous()
    w = torch.empty(n, k, dtype=out_dtype, device=logits.device)
    ids = torch.empty(n, k, dtype=ids_dtype, device=logits.device)
    if n:
        block_e = 1 << max(4, (e - 1).bit_length())
        _kernel()[(n,)](rows, w, ids, rows.stride(0), e, float(eps), float(scale), K=k,
                        BLOCK_E=block_e, BLOCK_K=1 << max(1, (k - 1).bit_length()),
                        RENORM=bool(renorm), ROUND=_ROUND[round_to],
                        num_warps=1 if block_e <= 256 else 4)
    return w, ids
