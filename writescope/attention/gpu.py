"""Paged decode attention with LSE on the GPU (Triton): GQA and MLA over GPU-layout pools.

Split-KV ("flash-decoding") in two launches, planned once per step and run per layer:

1. :func:`launch_partials` -- one program per (chunk, KV head, row tile). A *chunk* is a run of
   at most ``chunk_blocks`` consecutive entries of one sequence's block list. The program's rows
   are that sequence's query rows times the query heads of its KV-head group (GQA: the group
   shares every K/V tile it loads; MLA: one "KV head", all 16 query heads share each latent
   row, and V is the first ``v_dim`` values of the same tile, loaded once). It streams the
   chunk's tokens through an online softmax and writes a partial ``(out, lse)`` per row.
2. :func:`launch_reduce` -- one program per (query row, head tile, value tile): merges every
   partial of that row (from any number of launches: G, W, staged T pieces) plus, optionally,
   one extra partial that is already merged (the CPU side's, read in place from pinned host
   memory), by the log-sum-exp rule of :mod:`writescope.attention.merge`, in one online pass.
   Narrower tiles when the batch has few rows (:func:`reduce_config`): a 256K-token sequence
   leaves hundreds of partials per row.

No causal mask (the blocks are cached context) and small query counts per sequence (decode,
speculative rows: up to a few tens) are the target; larger counts tile over rows.

Design learned from the split-KV decode kernels of lightllm/SGLang
(``triton_ops/decode_attention.py``: grouped heads per program, MLA with a shared latent tile,
a second stage that merges splits) and FlashInfer's ``merge_states``; written anew for
writescope's CSR :class:`BlockBatch` over token-major paged pools ``[N, bs, H, R]`` with
per-block valid lengths, and for merging partials from several launches in one pass.

Triton is imported lazily: this module imports on machines without it (``triton_available()``
says whether the kernels can run).
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..kvcache.regions import KVSpec
from .batch import BlockBatch
from .launch import launch_flags

LOG2E = 1.4426950408889634

#: programs to aim for per launch (H200: 132 SMs, a few resident programs each)
TARGET_PROGRAMS = 132 * 4


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401  (the kernels need both)
    except Exception:
        return False
    return True


def triton_switch(env: str) -> bool:
    """A Triton path that an environment variable can turn off: on where Triton imports, unless
    ``env`` is 0, false, no or off."""
    if os.environ.get(env, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return triton_available()


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# ----------------------------------------------------------------------------------------------
# planning (pure torch on the CPU; once per step)
# ----------------------------------------------------------------------------------------------

@dataclass
class ChunkPlan:
    """Chunks of one BlockBatch: chunk ``c`` covers entries ``kv0[c]:kv1[c]`` of ``kv_blocks``,
    the query rows ``q0[c] : q0[c] + qn[c]``, and writes partial rows ``(base + c) * qmax + j``."""

    kv0: torch.Tensor
    kv1: torch.Tensor
    q0: torch.Tensor
    qn: torch.Tensor
    base: int
    qmax: int

    @property
    def num_chunks(self) -> int:
        return self.kv0.numel()

    def to(self, device) -> "ChunkPlan":
        return ChunkPlan(*(t.to(device, non_blocking=True) for t in
                           (self.kv0, self.kv1, self.q0, self.qn)), self.base, self.qmax)


def target_programs(spec: KVSpec) -> int:
    """Programs a decode launch over ``spec``'s cache aims for. GQA: :data:`TARGET_PROGRAMS`
    (four a streaming multiprocessor). MLA: half that -- a program's two stages of [64, 576]
    tiles fill an SM's shared memory, so one runs per SM, and two waves of them read fastest.
    Measured on the H200 as CUDA-graph replays of one layer (bench/results/2026-12-03i-h200
    call 3, ``gpu_attention --skip spilled``): the best chunk was the one closest to these
    targets at every batch (GQA 2 / 4 / 8 x 32K: 8 / 16 / 32 blocks, 3368 / 3745 / 4089 GB/s;
    MLA: 4 / 8 / 16 blocks, 2109 / 2772 / 3270 GB/s, against 1182 and 2198 GB/s with the
    16-block floor this replaced at 2 and 4 x 32K)."""
    return TARGET_PROGRAMS // 2 if spec.is_mla else TARGET_PROGRAMS


def choose_chunk_blocks(num_blocks: int, spec: KVSpec, min_blocks: int = 4,
                        max_blocks: int = 512, target: int | None = None) -> int:
    """Blocks per chunk so that one launch has about ``target`` programs (default
    :func:`target_programs`): ``num_blocks`` over ``spec``'s KV heads."""
    if num_blocks <= 0:
        return min_blocks
    want = math.ceil(num_blocks * spec.num_kv_heads / (target or target_programs(spec)))
    return int(min(max_blocks, max(min_blocks, want)))


#: above this many query rows per sequence (prefill chunks), a sequence's blocks form one chunk:
#: the row tiles give the parallelism, and the partials stay the size of the output
MAX_SPLIT_ROWS = 16


def chunk_blocks_for(batches: list[BlockBatch], spec: KVSpec) -> int:
    """Chunk size for one step's launches (host-side index arrays): split-KV for decode-sized
    query counts, whole sequences for long query chunks."""
    qmax, total, longest = 0, 0, 1
    for b in batches:
        qi = b.q_indptr.to("cpu").numpy()
        ki = b.kv_indptr.to("cpu").numpy()
        if qi.size > 1:
            kn = ki[1:] - ki[:-1]
            if kn.max() > 0:  # sequences with no blocks here (dense prefill) do not count
                qmax = max(qmax, int((qi[1:] - qi[:-1])[kn > 0].max()))
            longest = max(longest, int(kn.max()))
        total += int(ki[-1]) if ki.size else 0
    if qmax > MAX_SPLIT_ROWS:
        return longest
    return choose_chunk_blocks(total, spec)


def plan_chunks(batch: BlockBatch, chunk_blocks: int, base: int = 0) -> ChunkPlan:
    """Split every sequence's block list into chunks of at most ``chunk_blocks`` (CPU tensors).

    numpy, not torch: this runs once per step on the host, on small arrays, where torch's
    per-op overhead (and a slow CPU ``repeat_interleave``) would dominate."""
    qi = batch.q_indptr.to("cpu").numpy().astype(np.int64)
    ki = batch.kv_indptr.to("cpu").numpy().astype(np.int64)
    qn_seq = qi[1:] - qi[:-1]
    kn_seq = ki[1:] - ki[:-1]
    nch = np.where(qn_seq > 0, (kn_seq + chunk_blocks - 1) // chunk_blocks, 0)
    seq = np.repeat(np.arange(nch.size), nch)
    first = np.cumsum(nch) - nch
    within = np.arange(seq.size) - first[seq]
    kv0 = ki[seq] + within * chunk_blocks
    kv1 = np.minimum(kv0 + chunk_blocks, ki[seq + 1])
    qmax = int(qn_seq[nch > 0].max()) if (nch > 0).any() else 0  # rows of chunked sequences
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
    return ChunkPlan(t(kv0), t(kv1), t(qi[seq]), t(qn_seq[seq]), base, max(qmax, 1))


def plan_rows(plans: list[ChunkPlan], num_rows: int, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR from each query row to its partial rows (``chunk * qmax + j``) over all ``plans``."""
    rows, idx = [], []
    for p in plans:
        if p.num_chunks == 0:
            continue
        qn = p.qn.numpy().astype(np.int64)
        c = np.repeat(np.arange(p.num_chunks), qn)
        j = np.arange(c.size) - (np.cumsum(qn) - qn)[c]
        rows.append(p.q0.numpy().astype(np.int64)[c] + j)
        idx.append((c + p.base) * qmax + j)
    if rows:
        r = np.concatenate(rows)
        e = np.concatenate(idx)
        order = np.argsort(r, kind="stable")
        e = e[order]
        counts = np.bincount(r, minlength=num_rows)
    else:
        e = np.zeros(0, dtype=np.int64)
        counts = np.zeros(num_rows, dtype=np.int64)
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(counts)
    return (torch.from_numpy(indptr.astype(np.int32)),
            torch.from_numpy(np.ascontiguousarray(e, dtype=np.int64)))


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def partial_kernel(Q, KV, KV2, BLOCKS, LENS, C_KV0, C_KV1, C_Q0, C_QN, P_OUT, P_LSE,
                       chunk_base, second_from, stride_qt, stride_qh, qk_scale,
                       BS: tl.constexpr, TOK_STRIDE: tl.constexpr, REC: tl.constexpr,
                       HQ: tl.constexpr, GROUP: tl.constexpr, QMAX,
                       K_OFF: tl.constexpr, DA: tl.constexpr, BLOCK_DA: tl.constexpr,
                       DB: tl.constexpr, BLOCK_DB: tl.constexpr,
                       V_OFF: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
                       SHARE_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       PREC: tl.constexpr, TWO_POOLS: tl.constexpr, PDL: tl.constexpr,
                       EARLY: tl.constexpr):
        if PDL and not EARLY:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        c = tl.program_id(0)
        h = tl.program_id(1)
        mt = tl.program_id(2)
        if TWO_POOLS:  # chunks from second_from on read the second pool (one launch for both)
            kvp = tl.where(c >= second_from, KV2, KV)
        else:
            kvp = KV
        # EARLY (launch.py): the chunk's bounds, the host's copies, before the wait; the queries
        # (the kernel before writes them) after
        kv0 = tl.load(C_KV0 + c)
        kv1 = tl.load(C_KV1 + c)
        q0 = tl.load(C_Q0 + c)
        qn = tl.load(C_QN + c)
        if PDL and EARLY:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        r = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        qrow = r // GROUP
        head = h * GROUP + r % GROUP
        rmask = qrow < qn
        qoff = (q0 + qrow).to(tl.int64) * stride_qt + head * stride_qh
        da = tl.arange(0, BLOCK_DA)
        if BLOCK_DA == DA:
            q_a = tl.load(Q + qoff[:, None] + da[None, :], mask=rmask[:, None], other=0.0)
        else:
            q_a = tl.load(Q + qoff[:, None] + da[None, :],
                          mask=rmask[:, None] & (da < DA)[None, :], other=0.0)
        if DB > 0:
            db = tl.arange(0, BLOCK_DB)
            q_b = tl.load(Q + qoff[:, None] + DA + db[None, :],
                          mask=rmask[:, None] & (db < DB)[None, :], other=0.0)
        dv = tl.arange(0, BLOCK_DV)
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        total = (kv1 - kv0) * BS
        for p in range(0, total, BLOCK_N):
            pos = p + tl.arange(0, BLOCK_N)
            inr = pos < total
            ent = kv0 + pos // BS
            off = pos % BS
            blk = tl.load(BLOCKS + ent, mask=inr, other=0)
            ln = tl.load(LENS + ent, mask=inr, other=0)
            valid = inr & (off < ln)
            tok = (blk.to(tl.int64) * BS + off) * TOK_STRIDE + h * REC
            if BLOCK_DA == DA:
                k_a = tl.load(kvp + tok[:, None] + K_OFF + da[None, :], mask=valid[:, None],
                              other=0.0)
            else:
                k_a = tl.load(kvp + tok[:, None] + K_OFF + da[None, :],
                              mask=valid[:, None] & (da < DA)[None, :], other=0.0)
            s = tl.dot(q_a, tl.trans(k_a), input_precision=PREC)
            if DB > 0:
                if BLOCK_DB == DB:
                    k_b = tl.load(kvp + tok[:, None] + K_OFF + DA + db[None, :],
                                  mask=valid[:, None], other=0.0)
                else:
                    k_b = tl.load(kvp + tok[:, None] + K_OFF + DA + db[None, :],
                                  mask=valid[:, None] & (db < DB)[None, :], other=0.0)
                s += tl.dot(q_b, tl.trans(k_b), input_precision=PREC)
            s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            pr = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(pr, 1)
            if SHARE_V:
                v = k_a
            else:
                if BLOCK_DV == DV:
                    v = tl.load(kvp + tok[:, None] + V_OFF + dv[None, :], mask=valid[:, None],
                                other=0.0)
                else:
                    v = tl.load(kvp + tok[:, None] + V_OFF + dv[None, :],
                                mask=valid[:, None] & (dv < DV)[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        prow = ((chunk_base + c).to(tl.int64) * QMAX + qrow) * HQ + head
        tl.store(P_LSE + prow, lse, mask=rmask)
        tl.store(P_OUT + prow[:, None] * DV + dv[None, :], out,
                 mask=rmask[:, None] & (dv < DV)[None, :])

    @triton.jit
    def reduce_kernel(P_OUT, P_LSE, ROW_PTR, ROW_IDX, X_OUT, X_LSE, OUT, LSE,
                      Q, REC, s_qn, s_qh, s_rn, s_rh, s_scale, W_OUT, W_SRC, W_DST, s_wn, s_wh,
                      HQ: tl.constexpr, DV: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_DV: tl.constexpr, BLOCK_E: tl.constexpr, HAS_X: tl.constexpr,
                      SELF: tl.constexpr, GROUP: tl.constexpr, K_OFF: tl.constexpr,
                      DK: tl.constexpr, BLOCK_DK: tl.constexpr, V_OFF: tl.constexpr,
                      WRITE: tl.constexpr, R: tl.constexpr, BLOCK_R: tl.constexpr,
                      PDL: tl.constexpr, EARLY: tl.constexpr):
        # one program per (query row, head tile, value tile); one pass over the row's partials,
        # BLOCK_E at a time, with a running maximum (online log-sum-exp): the partial loads of
        # one step do not wait for a previous pass over the LSEs. SELF (a decode step): the
        # row's new token over itself is one more term (the score of q with the token's own
        # record, its value), and OUT is the model's dtype, LSE not written. WRITE: the first
        # value tile's programs also copy their KV heads' records, row W_SRC[row], to their
        # slots W_DST[row] (the W tails; never a slot the partials read)
        if PDL and not EARLY:  # launched dependent on the kernel before (attention/launch.py)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        row = tl.program_id(0)
        hh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
        hm = hh < HQ
        dm = dv < DV
        # EARLY (launch.py): the merge rows (host copies) and the self terms' query and record
        # (the heads kernel's, two launches back: the partials are between) before the wait
        e0 = tl.load(ROW_PTR + row)
        e1 = tl.load(ROW_PTR + row + 1)
        if SELF:
            dk = tl.arange(0, BLOCK_DK)
            km = hm[:, None] & (dk < DK)[None, :]
            r64 = row.to(tl.int64)
            rrow = REC + r64 * s_rn + (hh // GROUP)[:, None] * s_rh
            qh = tl.load(Q + r64 * s_qn + hh[:, None] * s_qh + dk[None, :], mask=km, other=0.0)
            kh = tl.load(rrow + K_OFF + dk[None, :], mask=km, other=0.0)
            vh = tl.load(rrow + V_OFF + dv[None, :], mask=hm[:, None] & dm[None, :], other=0.0)
        if PDL and EARLY:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        xr = row.to(tl.int64) * HQ + hh
        m = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
        ssum = tl.zeros([BLOCK_H], dtype=tl.float32)
        for e in range(e0, e1, BLOCK_E):
            ee = e + tl.arange(0, BLOCK_E)
            em = ee < e1
            pr = tl.load(ROW_IDX + ee, mask=em, other=0)
            prh = pr[:, None] * HQ + hh[None, :]
            mk = em[:, None] & hm[None, :]
            lp = tl.load(P_LSE + prh, mask=mk, other=float("-inf"))
            op = tl.load(P_OUT + prh[:, :, None] * DV + dv[None, None, :],
                         mask=mk[:, :, None] & dm[None, None, :], other=0.0)
            m_new = tl.maximum(m, tl.max(lp, 0))
            a = tl.exp(m - m_new)
            w = tl.exp(lp - m_new[None, :])
            acc = acc * a[:, None] + tl.sum(op * w[:, :, None], 0)
            ssum = ssum * a + tl.sum(w, 0)
            m = m_new
        if HAS_X:
            lx = tl.load(X_LSE + xr, mask=hm, other=float("-inf"))
            op = tl.load(X_OUT + xr[:, None] * DV + dv[None, :], mask=hm[:, None] & dm[None, :],
                         other=0.0)
            m_new = tl.maximum(m, lx)
            a = tl.exp(m - m_new)
            w = tl.exp(lx - m_new)
            acc = acc * a[:, None] + op * w[:, None]
            ssum = ssum * a + w
            m = m_new
        if SELF:
            sc = tl.sum(qh.to(tl.float32) * kh.to(tl.float32), 1) * s_scale
            m_new = tl.maximum(m, sc)
            a = tl.exp(m - m_new)
            w = tl.exp(sc - m_new)
            acc = acc * a[:, None] + vh.to(tl.float32) * w[:, None]
            ssum = ssum * a + w
            m = m_new
        if WRITE:
            if tl.program_id(2) == 0:
                rr = tl.arange(0, BLOCK_R)
                wm = hm[:, None] & (rr < R)[None, :]
                kvh = (hh // GROUP)[:, None]
                src = tl.load(W_SRC + row)
                val = tl.load(REC + src * s_rn + kvh * s_rh + rr[None, :], mask=wm, other=0.0)
                tl.store(W_OUT + tl.load(W_DST + row) * s_wn + kvh * s_wh + rr[None, :],
                         val.to(W_OUT.dtype.element_ty), mask=wm)
        has = ssum > 0
        out = acc / tl.where(has, ssum, 1.0)[:, None]
        if not SELF:
            lse = tl.where(has, m + tl.log(tl.where(has, ssum, 1.0)), float("-inf"))
            if tl.program_id(2) == 0:
                tl.store(LSE + xr, lse, mask=hm)
        tl.store(OUT + xr[:, None] * DV + dv[None, :], out.to(OUT.dtype.element_ty),
                 mask=hm[:, None] & dm[None, :])

    from .launch import FastLaunch
    return FastLaunch(partial_kernel), FastLaunch(reduce_kernel)


# ----------------------------------------------------------------------------------------------
# launch configuration
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=256)  # per layer launch, with a step's few shapes
def default_config(spec: KVSpec, group: int, qmax: int) -> KernelConfig:
    rows = max(16, _next_pow2(qmax * group))
    # measured on the H200 (bench/results/gpu_attention.md): 2 stages beat 3-4 for GQA (more
    # programs per SM); for MLA decode (16 rows) 64-token tiles with 4 warps, 16-block chunks
    # (73-77% of HBM at 1 x 256K and 8 x 32K against 65-67% with 32-token tiles, timed with
    # queued launches: bench/results/2026-12-01b-h200 call 3)
    if spec.is_mla:  # [BLOCK_M, 512] fp32 accumulator, [BLOCK_N, 576] bf16 tile per stage
        if rows <= 16:
            return KernelConfig(16, 64, 4, 2)
        return KernelConfig(min(rows, 32), 32, 8, 2)
    wide = max(spec.k_dim, spec.v_dim) > 128
    return KernelConfig(min(rows, 64), 32 if wide else 64, 4, 2)


@functools.lru_cache(maxsize=256)  # per layer launch, with a step's few shapes
def _split_k(spec: KVSpec) -> tuple[int, int, bool]:
    """(DA, DB, SHARE_V): K is loaded as a power-of-two piece DA and a rest DB; for MLA the first
    piece is exactly V, shared."""
    if spec.is_mla and spec.v_offset == spec.k_offset and spec.v_dim < spec.k_dim \
            and spec.v_dim == _next_pow2(spec.v_dim):
        return spec.v_dim, spec.k_dim - spec.v_dim, True
    return spec.k_dim, 0, False


def launch_partials(q: torch.Tensor, kv: torch.Tensor, spec: KVSpec, plan: ChunkPlan,
                    kv_blocks: torch.Tensor, kv_lens: torch.Tensor, scale: float,
                    part_out: torch.Tensor, part_lse: torch.Tensor, qmax: int,
                    config: KernelConfig | None = None,
                    second: tuple[torch.Tensor, int] | None = None,
                    flags: tuple[bool, bool] | None = None) -> None:
    """Write the partials of ``plan``'s chunks. ``q [nq, Hq, Dk]`` in the pool's dtype;
    ``kv`` one layer of a GPU-layout pool ``[N, bs, H, R]`` (contiguous); ``part_out
    [P, Hq, Dv]`` / ``part_lse [P, Hq]`` fp32 with ``P >= (plan.base + chunks) * qmax``.
    ``second = (kv2, c)``: chunks ``c`` and later read ``kv2`` (another pool's layer of the same
    record layout) instead, in the same launch; ``kv_blocks`` then holds both pools' ids.
    ``flags``: :func:`~.launch.launch_flags` of the device, read once per step by the caller
    (default: read now)."""
    if plan.num_chunks == 0:
        return
    nq, hq, dk = q.shape
    n, bs, hkv, rec = kv.shape
    assert kv.is_contiguous() and q.stride(-1) == 1 and dk == spec.k_dim
    kv2, second_from = second if second is not None else (kv, 0)
    assert kv2.is_contiguous() and kv2.shape[1:] == kv.shape[1:] and kv2.dtype == kv.dtype
    group = hq // hkv
    cfg = config or default_config(spec, group, qmax)
    on, early = flags if flags is not None else launch_flags(part_out.device)
    launch = _partials_launch(spec, bs, hkv, rec, hq, group, qmax, kv.dtype == torch.float32,
                              second is not None, cfg, on, early)
    grid = (plan.num_chunks, hkv, triton_cdiv(qmax * group, cfg.block_m))
    launch.launch(grid, (q, kv, kv2, kv_blocks, kv_lens, plan.kv0, plan.kv1, plan.q0, plan.qn,
                         part_out, part_lse, plan.base, second_from, q.stride(0), q.stride(1),
                         scale * LOG2E))


@functools.lru_cache(maxsize=256)  # a step's few shapes, for every layer
def _partials_launch(spec: KVSpec, bs: int, hkv: int, rec: int, hq: int, group: int, qmax: int,
                     fp32: bool, two_pools: bool, cfg: KernelConfig, pdl: bool, early: bool):
    """The partials kernel with its named arguments bound (``launch.Bound``)."""
    partial_kernel, _ = _kernels()
    da, db, share = _split_k(spec)
    extra = {"PDL": True, "launch_pdl": True, "EARLY": early} if pdl else \
        {"PDL": False, "EARLY": False}
    return partial_kernel.bind(
        BS=bs, TOK_STRIDE=hkv * rec, REC=rec, HQ=hq, GROUP=group, QMAX=qmax,
        K_OFF=spec.k_offset, DA=da, BLOCK_DA=max(16, _next_pow2(da)),
        DB=db, BLOCK_DB=max(16, _next_pow2(db)) if db else 16,
        V_OFF=spec.v_offset, DV=spec.v_dim, BLOCK_DV=max(16, _next_pow2(spec.v_dim)),
        SHARE_V=share, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        # fp32 KV (the exact-parity runs) must not be rounded to TF32 inside tl.dot
        PREC="ieee" if fp32 else "tf32", TWO_POOLS=two_pools,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra)


@dataclass(frozen=True)
class ReduceConfig:
    block_h: int
    block_dv: int
    block_e: int


@functools.lru_cache(maxsize=256)  # called per layer launch with a step's few shapes
def reduce_config(nq: int, hq: int, dv: int, target_programs: int = TARGET_PROGRAMS) -> ReduceConfig:
    """Tiles for the merge: 4 heads x 64 values when the batch has rows enough to fill the GPU;
    for a few rows (one long sequence: hundreds of partials per row) narrower tiles, so that
    more programs share the partials' reads, each loading more partials per step: at the
    narrowest tile (one head x 32 values) 128 partials a step, 4K values (H200, resident sweep,
    bench/results/2026-12-01h-h200 call 3: MLA 1 x 256K 3196 GB/s against 3082 with 32-partial
    steps; GQA 1 x 256K 4020 against 3956; a two-level merge,
    ``bench.merge_tree.plan_tree``, was slower, 2970-3060)."""
    bh, bd = min(4, _next_pow2(hq)), min(64, max(16, _next_pow2(dv)))

    def programs(h: int, d: int) -> int:
        return nq * triton_cdiv(hq, h) * triton_cdiv(dv, d)
    while programs(bh, bd) < target_programs and bd > 32:
        bd //= 2
    while programs(bh, bd) < target_programs and bh > 1:
        bh //= 2
    if bh * bd <= 32:
        be = min(128, 4096 // (bh * bd))
    else:
        be = max(8, min(32, 2048 // (bh * bd)))
    return ReduceConfig(bh, bd, be)


def launch_reduce(part_out: torch.Tensor, part_lse: torch.Tensor, row_indptr: torch.Tensor,
                  row_idx: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
                  extra: tuple[torch.Tensor, torch.Tensor] | None = None,
                  config: ReduceConfig | None = None,
                  self_terms: tuple[torch.Tensor, torch.Tensor, KVSpec, float] | None = None,
                  write: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                  flags: tuple[bool, bool] | None = None) -> None:
    """Merge every row's partials (and ``extra``, a merged partial per row) into ``out``/``lse``.

    ``self_terms = (q, records, spec, scale)`` (a decode step: one new token a row): each row's
    token over itself is merged too -- what :func:`~.selfmerge.decode_self_merge` does after a
    float32 merge, in the same launch -- and ``out`` is the layer's attention output in its own
    dtype (``q``'s); no LSE is written (``lse`` may be None). With them, ``write = (rows,
    src, dst)`` also copies ``records[src[i]]`` to ``rows[dst[i]]`` for every row ``i``
    (``rows [slots, Hkv, R]``, ``src``/``dst`` int64): the W tails' new records, as
    :func:`~.resident.write_rows` does, in the same launch. ``flags`` as for
    :func:`launch_partials`."""
    nq, hq, dv = out.shape
    if nq == 0:
        return
    c = config or reduce_config(nq, hq, dv)
    sspec = wr = None
    if self_terms is not None:
        sq, srec, sspec, sscale = self_terms
        if sq.stride(-1) != 1 or srec.stride(-1) != 1 or hq % sspec.num_kv_heads:
            raise ValueError("self terms need rows of contiguous heads and whole KV groups")
        sargs = (sq, srec, sq.stride(0), sq.stride(1), srec.stride(0), srec.stride(1),
                 float(sscale))
        lse = out if lse is None else lse  # never written
        if write is not None:
            wrows, wsrc, wdst = write
            if wrows.stride(-1) != 1 or wrows.shape[1:] != srec.shape[1:]:
                raise ValueError("records go to rows of the records' layout")
            sargs += (wrows, wsrc, wdst, wrows.stride(0), wrows.stride(1))
            wr = srec.shape[-1]
        else:
            sargs += (out, out, out, 0, 0)
    elif write is not None:
        raise ValueError("records are written with the self terms only")
    else:
        sargs = (out, out, 0, 0, 0, 0, 1.0, out, out, out, 0, 0)
    xo, xl = extra if extra is not None else (out, lse)
    on, early = flags if flags is not None else launch_flags(out.device)
    launch = _reduce_launch(hq, dv, c, extra is not None, sspec, wr, on, early)
    launch.launch((nq, triton_cdiv(hq, c.block_h), triton_cdiv(dv, c.block_dv)),
                  (part_out, part_lse, row_indptr, row_idx, xo, xl, out, lse, *sargs))


@functools.lru_cache(maxsize=256)  # a step's few shapes, for every layer
def _reduce_launch(hq: int, dv: int, c: ReduceConfig, has_x: bool, sspec: KVSpec | None,
                   write_r: int | None, pdl: bool, early: bool):
    """The merge kernel with its named arguments bound (``launch.Bound``): ``sspec`` the self
    terms' cache (None: none), ``write_r`` the written records' width (None: none written)."""
    _, reduce_kernel = _kernels()
    if sspec is not None:
        skw = dict(SELF=True, GROUP=hq // sspec.num_kv_heads, K_OFF=sspec.k_offset,
                   DK=sspec.k_dim, BLOCK_DK=max(16, _next_pow2(sspec.k_dim)),
                   V_OFF=sspec.v_offset)
        if write_r is not None:
            skw.update(WRITE=True, R=write_r, BLOCK_R=max(16, _next_pow2(write_r)))
        else:
            skw.update(WRITE=False, R=1, BLOCK_R=16)
    else:
        skw = dict(SELF=False, GROUP=1, K_OFF=0, DK=1, BLOCK_DK=16, V_OFF=0, WRITE=False, R=1,
                   BLOCK_R=16)
    extra = {"PDL": True, "launch_pdl": True, "EARLY": early} if pdl else \
        {"PDL": False, "EARLY": False}
    return reduce_kernel.bind(HQ=hq, DV=dv, BLOCK_H=c.block_h, BLOCK_DV=c.block_dv,
                              BLOCK_E=c.block_e, HAS_X=has_x, num_warps=4, **skw, **extra)


def triton_cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# ----------------------------------------------------------------------------------------------
# one-call form (the signature every attention kernel shares)
# ----------------------------------------------------------------------------------------------

def attend_gpu(q: torch.Tensor, kv: torch.Tensor, layout: str, spec: KVSpec, batch: BlockBatch,
               scale: float, chunk_blocks: int | None = None,
               config: KernelConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [nq, Hq, Dk]`` over one layer's GPU-layout pool ``kv``; float32 ``(out, lse)``.

    Plans on the host (one small device-to-host read of the batch's index arrays); the hybrid
    runner plans once per step instead and calls :func:`launch_partials` per layer.
    """
    return planned_attend_gpu(q, kv, layout, spec, batch, scale, chunk_blocks, config)()


def planned_attend_gpu(q: torch.Tensor, kv: torch.Tensor, layout: str, spec: KVSpec,
                       batch: BlockBatch, scale: float, chunk_blocks: int | None = None,
                       config: KernelConfig | None = None):
    """:func:`attend_gpu` split at its plan: plans now (host work, buffers) and returns a
    function that launches the two kernels and returns ``(out, lse)`` -- what a decode step
    pays per layer once the step is planned (``writescope calibrate`` times that)."""
    if layout != "gpu":
        raise ValueError("attend_gpu reads GPU-layout pools ([N, bs, H, R]) only")
    nq, hq, _ = q.shape
    dev = q.device
    cpu_batch = BlockBatch(batch.q_indptr.cpu(), batch.kv_indptr.cpu(), batch.kv_blocks,
                           batch.kv_lens)
    if chunk_blocks is None:
        chunk_blocks = chunk_blocks_for([cpu_batch], spec)
    plan = plan_chunks(cpu_batch, chunk_blocks)
    qmax = plan.qmax
    row_ptr, row_idx = plan_rows([plan], nq, qmax)
    nparts = max(1, plan.num_chunks * qmax)
    part_out = torch.empty(nparts, hq, spec.v_dim, dtype=torch.float32, device=dev)
    part_lse = torch.empty(nparts, hq, dtype=torch.float32, device=dev)
    out = torch.empty(nq, hq, spec.v_dim, dtype=torch.float32, device=dev)
    lse = torch.empty(nq, hq, dtype=torch.float32, device=dev)
    qk = q.to(kv.dtype).contiguous()
    dplan = plan.to(dev)
    blocks = batch.kv_blocks.to(dev, torch.int32)
    lens = batch.kv_lens.to(dev, torch.int32)
    row_ptr, row_idx = row_ptr.to(dev), row_idx.to(dev)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        launch_partials(qk, kv, spec, dplan, blocks, lens, scale, part_out, part_lse, qmax,
                        config)
        launch_reduce(part_out, part_lse, row_ptr, row_idx, out, lse)
        return out, lse
    return run
