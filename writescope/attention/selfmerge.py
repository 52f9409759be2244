"""A decode step's attention output: the cached context's partial merged with each new token's
attention over itself, in the model's dtype.

In a decode step (one new token per sequence) the token's own key is the only key the cached
partial ``(o_kv, lse_kv)`` lacks, so the layer's output is::

    s   = scale * q_h . k_new           (the token over itself: lse = s, out = v_new)
    lse = logaddexp(lse_kv, s)
    out = o_kv * exp(lse_kv - lse) + v_new * exp(s - lse)      rounded to q's dtype

which is :func:`~.selfattn.causal_self_attention` for single-token segments, then
:func:`~.merge.merge`, then the cast. In torch that is ~20 small kernels a layer (casts, the
score, the expanded copy of V, logaddexp, the -inf guard, two exps, products, the sum, the
cast): in Qwen3-30B-A3B's 2 x 32K decode step, one CUDA graph of ~2,450 small kernels besides
attention and experts, they were ~960 of them (bench/results/2026-12-03c-h200, call 5). On CUDA
it is one Triton kernel, one program per (row, query head); ``WRITESCOPE_FUSED_SELF_MERGE=0``
keeps the torch form, which is also the form on the CPU. Both compute in float32 and round once
at the end; the dot product's summation order differs (the last bit of the output may too).
"""
from __future__ import annotations

import functools

import torch

from ..kvcache.regions import KVSpec
from .merge import merge
from .selfattn import causal_self_attention


def fused_enabled() -> bool:
    from .gpu import triton_switch
    return triton_switch("WRITESCOPE_FUSED_SELF_MERGE")


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def self_merge_kernel(O, L, Q, R, OUT, s_on, s_oh, s_ln, s_lh, s_qn, s_qh, s_rn, s_rh,
                          s_outn, s_outh, scale, GROUP: tl.constexpr, K_OFF: tl.constexpr,
                          DK: tl.constexpr, V_OFF: tl.constexpr, DV: tl.constexpr,
                          BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        kvh = h // GROUP
        dk = tl.arange(0, BLOCK_DK)
        mk = dk < DK
        q = tl.load(Q + row * s_qn + h * s_qh + dk, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(R + row * s_rn + kvh * s_rh + K_OFF + dk, mask=mk, other=0.0).to(tl.float32)
        s = tl.sum(q * k, axis=0) * scale
        lkv = tl.load(L + row * s_ln + h * s_lh).to(tl.float32)
        # logaddexp; lse_kv = -inf (no cached context) gives lse = s, weights 0 and 1
        m = tl.maximum(lkv, s)
        lse = m + tl.log(1.0 + tl.exp(-tl.abs(lkv - s)))
        wa = tl.exp(lkv - lse)
        wb = tl.exp(s - lse)
        dv = tl.arange(0, BLOCK_DV)
        mv = dv < DV
        o = tl.load(O + row * s_on + h * s_oh + dv, mask=mv, other=0.0).to(tl.float32)
        v = tl.load(R + row * s_rn + kvh * s_rh + V_OFF + dv, mask=mv, other=0.0).to(tl.float32)
        tl.store(OUT + row * s_outn + h * s_outh + dv,
                 (o * wa + v * wb).to(OUT.dtype.element_ty), mask=mv)

    from .launch import FastLaunch
    return FastLaunch(self_merge_kernel)


def _pow2(n: int) -> int:
    return 1 << max(4, (int(n) - 1).bit_length())


def self_merge_fused(o_kv: torch.Tensor, lse_kv: torch.Tensor, q: torch.Tensor,
                     records: torch.Tensor, spec: KVSpec, scale: float) -> torch.Tensor:
    """:func:`decode_self_merge` in one Triton launch (any device Triton runs on)."""
    n, hq, _ = q.shape
    hkv = spec.num_kv_heads
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not split into {hkv} KV heads")
    q_, r_, o_ = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, records, o_kv))
    out = torch.empty(n, hq, spec.v_dim, dtype=q.dtype, device=q.device)
    if n:
        bk, bv = _pow2(spec.k_dim), _pow2(spec.v_dim)
        _kernel()[(n, hq)](
            o_, lse_kv, q_, r_, out, o_.stride(0), o_.stride(1), lse_kv.stride(0),
            lse_kv.stride(1), q_.stride(0), q_.stride(1), r_.stride(0), r_.stride(1),
            out.stride(0), out.stride(1), float(scale), GROUP=hq // hkv, K_OFF=spec.k_offset,
            DK=spec.k_dim, V_OFF=spec.v_offset, DV=spec.v_dim, BLOCK_DK=bk, BLOCK_DV=bv,
            num_warps=1 if max(bk, bv) <= 256 else 4)
    return out


def self_merge_torch(o_kv: torch.Tensor, lse_kv: torch.Tensor, q: torch.Tensor,
                     records: torch.Tensor, spec: KVSpec, scale: float) -> torch.Tensor:
    """:func:`decode_self_merge` in torch: the self partial, the merge, the cast."""
    o_s, l_s = causal_self_attention(q, records, spec, [1] * q.shape[0], scale)
    out, _ = merge(o_kv, lse_kv, o_s, l_s)
    return out.to(q.dtype)


def decode_self_merge(o_kv: torch.Tensor, lse_kv: torch.Tensor, q: torch.Tensor,
                      records: torch.Tensor, spec: KVSpec, scale: float) -> torch.Tensor:
    """Decode attention's output ``[N, Hq, Dv]`` in ``q``'s dtype: the cached partial
    ``(o_kv [N, Hq, Dv], lse_kv [N, Hq])`` (float32) merged with each row's token over itself
    (``q [N, Hq, Dk]``, the new records ``[N, Hkv, R]``). One kernel on CUDA (see the module
    docstring), the torch form elsewhere."""
    if q.is_cuda and fused_enabled():
        return self_merge_fused(o_kv, lse_kv, q, records, spec, scale)
    return self_merge_torch(o_kv, lse_kv, q, records, spec, scale)
