"""Decode attention over GPU-resident blocks through fixed buffers, so that a CUDA graph holds it.

A decode step whose cached KV is all on the GPU (G blocks and the W tails; nothing in C or T, no
CPU share) has nothing for the host to do per layer but launch the same kernels over the same
index arrays. Launched eagerly those cost the host ~0.15-0.3 ms a layer (``host_attend_s``:
7.4-11.3 ms of a 20 ms Qwen3-30B-A3B 2 x 32K step against a 3.9 ms bound, twenty-seventh
session), and the piecewise graphs (``engine/graphs.py``) break at every attention call.

:class:`ResidentAttention` plans such a step once on the host (chunks, merge rows, the new
tokens' W slots, as :class:`~writescope.attention.hybrid.HybridAttention` does) and copies the
plan into device buffers whose sizes and addresses stay fixed while the step's shape allows:
every launch then reads only those buffers, with a grid of the buffers' capacity, so the work of
a whole layer -- or of the whole step -- is captured once and replayed. Chunks past the step's
own are empty (no blocks, no query rows): their programs store nothing. Rows past the step's
tokens (a step padded to its graph size) have no partials, and their records are written to the
last real token's W slot together with that token's own, the same values: ``index_copy_``'s
order among duplicate indices does not matter then.

:attr:`key` names the capacities; a step that needs more grows the buffers (new addresses: the
caller captures anew, see ``graphs.DecodeGraphs``). Capacities are powers of two, so a run
captures again only when its context doubles. The same kernels as the eager path run
(``gpu.launch_partials``, ``gpu.launch_reduce``), so the results are the same bits. The new
records go to their W slots in one launch on CUDA (:func:`write_rows`;
``WRITESCOPE_FUSED_WRITE=0``: ``index_select`` and ``index_copy_``).
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np
import torch

from ..kvcache.regions import KVSpec, Region
from . import gpu as G
from .batch import BlockBatch

#: the regions a resident step reads, in launch order
RESIDENT_REGIONS = (Region.G, Region.W)


def _pow2(n: int, least: int = 16) -> int:
    n = max(int(n), least)
    return 1 << (n - 1).bit_length()


class _Buffers:
    """One step size's device buffers: block ids and lengths, chunks, merge rows (int32, one
    tensor), the new tokens' rows and W slots (int64), and the partials. Each array holds both
    regions, the first's capacity then the second's (``(name, i)``: region ``i``'s part); the
    chunks' block entries index the whole ``blocks``/``lens`` arrays, so one launch can read
    both regions' chunks."""

    def __init__(self, key: tuple, device: torch.device):
        rows, cap_b, cap_c = key
        self.key = key
        layout, off = {}, 0
        for name, caps in (("blocks", cap_b), ("lens", cap_b), ("kv0", cap_c), ("kv1", cap_c),
                           ("q0", cap_c), ("qn", cap_c)):
            layout[name] = (off, sum(caps))
            for i, size in enumerate(caps):
                layout[(name, i)] = (off, size)
                off += size
        layout["row_ptr"] = (off, rows + 1)
        off += rows + 1
        layout["row_idx"] = (off, sum(cap_c))
        off += sum(cap_c)
        self.layout = layout
        self.i32 = torch.zeros(off, dtype=torch.int32, device=device)
        self.t = {k: self.i32[o:o + s] for k, (o, s) in layout.items()}
        i64 = torch.zeros(2 * rows, dtype=torch.int64, device=device)
        self.w_src, self.w_dst = i64[:rows], i64[rows:]
        self.i64 = i64
        #: the partials per (query heads, value dim), made by the first attend of this size
        self.parts: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


class ResidentAttention:
    """Fixed-buffer decode attention over ``pools[G]`` and ``pools[W]`` (see the module
    docstring). :meth:`load` once per step, then :meth:`attend` and :meth:`write` per layer."""

    def __init__(self, pools: dict[Region, torch.Tensor], spec: KVSpec, scale: float,
                 device: torch.device, chunk_blocks: int | None = None):
        self.pools = pools
        self.spec = spec
        self.scale = float(scale)
        self.device = torch.device(device)
        if chunk_blocks is None:  # a fixed chunk size for experiments (else per step)
            env = os.environ.get("WRITESCOPE_RESIDENT_CHUNK_BLOCKS", "").strip()
            chunk_blocks = int(env) if env.isdigit() and int(env) > 0 else None
        self.chunk_blocks = chunk_blocks
        self._sets: dict[int, _Buffers] = {}  # per step size (rows)
        self._cur: _Buffers | None = None

    @property
    def key(self) -> tuple | None:
        """``(rows, block capacity per region, chunk capacity per region)`` of the loaded step's
        buffers: a graph captured over them is valid while this key comes back."""
        return None if self._cur is None else self._cur.key

    @staticmethod
    def eligible(plan, num_new: list[int]) -> bool:
        """Whether a step planned as ``plan`` with ``num_new`` tokens per sequence can run here:
        one new token per sequence, no CPU side, GPU sides in G and W only."""
        if not num_new or any(n != 1 for n in num_new):
            return False
        if any(b.num_blocks for _, b in plan.cpu):
            return False
        return all(r in RESIDENT_REGIONS for r, b in plan.gpu if b.num_blocks)

    # ------------------------------------------------------------------ per step
    def load(self, plan, rows: int, w_src: np.ndarray, w_dst: np.ndarray) -> tuple:
        """Copy one step's plan into its size's buffers (larger ones if it does not fit) and
        return :attr:`key`. ``rows``: the step's query rows as launched (its graph size, at
        least the plan's tokens); ``w_src``/``w_dst``: the new tokens' rows and flat W slots."""
        n = plan.num_q_rows
        if not 1 <= n <= rows:
            raise ValueError(f"{rows} rows for a step of {n} tokens")
        qi = plan.q_indptr
        batches = {r: b for r, b in plan.gpu if b.num_blocks}
        hosts = []
        for r in RESIDENT_REGIONS:
            b = batches.get(r)
            if b is None:  # no blocks in this region this step: an empty batch
                b = BlockBatch(qi.to("cpu", torch.int32), torch.zeros(n + 1, dtype=torch.int32),
                               torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
            hosts.append(b.host_view())
        cb = self.chunk_blocks or G.chunk_blocks_for(hosts, self.spec)
        chunks = [G.plan_chunks(b, cb) for b in hosts]
        if any(c.qmax != 1 for c in chunks if c.num_chunks):
            raise ValueError("a resident step has one query row per sequence")
        need_b = tuple(_pow2(b.num_blocks) for b in hosts)
        need_c = tuple(_pow2(c.num_chunks) for c in chunks)
        bufs = self._sets.get(rows)
        if bufs is None or any(a < b for a, b in zip(bufs.key[1] + bufs.key[2], need_b + need_c)):
            if bufs is not None:  # at least what was there: a shorter step keeps these
                need_b = tuple(max(a, b) for a, b in zip(bufs.key[1], need_b))
                need_c = tuple(max(a, b) for a, b in zip(bufs.key[2], need_c))
            bufs = self._sets[rows] = _Buffers((rows, need_b, need_c), self.device)
        self._cur = bufs
        _, _, cap_c = bufs.key
        # partial rows: the first region's chunks first, the second's after its capacity
        bases = (0, cap_c[0])
        plans = [G.ChunkPlan(c.kv0, c.kv1, c.q0, c.qn, base, 1) for c, base in zip(chunks, bases)]
        row_ptr, row_idx = G.plan_rows(plans, rows, 1)
        host32 = np.zeros(bufs.i32.numel(), dtype=np.int32)
        lay = bufs.layout
        for i, (b, c) in enumerate(zip(hosts, chunks)):
            first = sum(bufs.key[1][:i])  # the region's first entry in the blocks array
            for name, a in (("blocks", b.kv_blocks), ("lens", b.kv_lens), ("kv0", c.kv0 + first),
                            ("kv1", c.kv1 + first), ("q0", c.q0), ("qn", c.qn)):
                o = lay[(name, i)][0]
                host32[o:o + a.numel()] = a.numpy()
        o = lay["row_ptr"][0]
        host32[o:o + rows + 1] = row_ptr.numpy()
        o = lay["row_idx"][0]
        host32[o:o + row_idx.numel()] = row_idx.numpy()
        # the new tokens' records: padded rows repeat the last real token's row and slot
        ws = np.asarray(w_src, dtype=np.int64)
        wd = np.asarray(w_dst, dtype=np.int64)
        if ws.size != n or wd.size != n:
            raise ValueError(f"{ws.size} W slots for {n} new tokens")
        last = wd[np.flatnonzero(ws == n - 1)[0]]
        i64 = np.concatenate((ws, np.full(rows - n, n - 1), wd, np.full(rows - n, last)))
        bufs.i32.copy_(torch.from_numpy(host32), non_blocking=True)
        bufs.i64.copy_(torch.from_numpy(i64.astype(np.int64)), non_blocking=True)
        return bufs.key

    # ------------------------------------------------------------------ per layer
    def _partials(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The partials of ``q [rows, Hq, Dk]`` over the loaded step's G and W chunks: one
        launch over both pools (``WRITESCOPE_RESIDENT_ONE_LAUNCH=0``: one per region)."""
        bufs = self._cur
        if bufs is None:
            raise RuntimeError("ResidentAttention.attend before load")
        rows, _, cap_c = bufs.key
        if q.shape[0] != rows:
            raise ValueError(f"the loaded step has {rows} rows, got {q.shape[0]}")
        spec = self.spec
        hq, dv = q.shape[1], spec.v_dim
        parts = bufs.parts.get((hq, dv))
        if parts is None:
            parts = bufs.parts[(hq, dv)] = (
                torch.empty(sum(cap_c), hq, dv, dtype=torch.float32, device=self.device),
                torch.empty(sum(cap_c), hq, dtype=torch.float32, device=self.device))
        t = bufs.t
        g, w = (self.pools[r][layer] for r in RESIDENT_REGIONS)
        qk = q.to(g.dtype).contiguous()
        if G.triton_switch("WRITESCOPE_RESIDENT_ONE_LAUNCH"):
            plan = G.ChunkPlan(t["kv0"], t["kv1"], t["q0"], t["qn"], 0, 1)
            G.launch_partials(qk, g, spec, plan, t["blocks"], t["lens"], self.scale, parts[0],
                              parts[1], 1, second=(w, cap_c[0]))
            return parts
        base = 0
        for i, kv in enumerate((g, w)):
            plan = G.ChunkPlan(t[("kv0", i)], t[("kv1", i)], t[("q0", i)], t[("qn", i)], base, 1)
            G.launch_partials(qk, kv, spec, plan, t["blocks"], t["lens"], self.scale, parts[0],
                              parts[1], 1)
            base += cap_c[i]
        return parts

    def attend(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 ``(out, lse)`` of ``q [rows, Hq, Dk]`` over the loaded step's G and W blocks
        (rows without blocks: zeros and -inf)."""
        parts = self._partials(layer, q)
        rows, hq, dv = q.shape[0], q.shape[1], self.spec.v_dim
        out = torch.empty(rows, hq, dv, dtype=torch.float32, device=self.device)
        lse = torch.empty(rows, hq, dtype=torch.float32, device=self.device)
        t = self._cur.t
        G.launch_reduce(parts[0], parts[1], t["row_ptr"], t["row_idx"], out, lse)
        return out, lse

    def attend_merged(self, layer: int, q: torch.Tensor, records: torch.Tensor) -> torch.Tensor:
        """The layer's decode attention output ``[rows, Hq, Dv]`` in ``q``'s dtype, with the new
        records (``[rows, Hkv, R]``) written: the cached G and W blocks' partials, then one
        launch that merges them with each row's new token over itself and copies the records
        to their W slots -- :meth:`attend`, :func:`~.selfmerge.decode_self_merge` and
        :meth:`write` in two kernels (``WRITESCOPE_FUSED_WRITE=0``: the records by
        :meth:`write`)."""
        parts = self._partials(layer, q)
        bufs, spec = self._cur, self.spec
        rows, hq, dv = q.shape[0], q.shape[1], spec.v_dim
        out = torch.empty(rows, hq, dv, dtype=q.dtype, device=self.device)
        t = bufs.t
        rec = records if records.stride(-1) == 1 else records.contiguous()
        w_flat = self.pools[Region.W][layer].view(-1, spec.num_kv_heads, spec.rec_dim)
        fused_write = G.triton_switch("WRITESCOPE_FUSED_WRITE")
        # the partials' launch (the buffers hold at least 16 chunks, so there always is one) sits
        # between the kernel that wrote q and the records and this merge, which reads them before
        # its wait when launched dependent (attention/launch.py, early reads)
        G.launch_reduce(parts[0], parts[1], t["row_ptr"], t["row_idx"], out, None,
                        self_terms=(q if q.stride(-1) == 1 else q.contiguous(), rec, spec,
                                    self.scale),
                        write=(w_flat, bufs.w_src, bufs.w_dst) if fused_write else None)
        if not fused_write:
            self.write(layer, records)
        return out

    def write(self, layer: int, records: torch.Tensor) -> None:
        """The loaded step's new records (``[rows, H, R]``) into their W slots (one launch on
        CUDA: :func:`write_rows`)."""
        bufs = self._cur
        spec = self.spec
        w_flat = self.pools[Region.W][layer].view(-1, spec.num_kv_heads, spec.rec_dim)
        if w_flat.is_cuda and records.is_cuda and G.triton_switch("WRITESCOPE_FUSED_WRITE"):
            write_rows(records, bufs.w_src, bufs.w_dst, w_flat)
            return
        w_flat.index_copy_(0, bufs.w_dst, records.to(spec.dtype).index_select(0, bufs.w_src))


@functools.lru_cache(maxsize=None)
def _write_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def write_rows_kernel(REC, SRC, DST, OUT, ROW: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        src = tl.load(SRC + r).to(tl.int64)
        dst = tl.load(DST + r).to(tl.int64)
        for c0 in tl.static_range(0, ROW, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            m = c < ROW
            v = tl.load(REC + src * ROW + c, mask=m)
            tl.store(OUT + dst * ROW + c, v.to(OUT.dtype.element_ty), mask=m)

    from .launch import FastLaunch
    return FastLaunch(write_rows_kernel)


def write_rows(records: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, out: torch.Tensor
               ) -> None:
    """``out[dst[i]] = records[src[i]]`` (cast to ``out``'s dtype) for every ``i``, one program
    a row: the ``index_select`` and ``index_copy_`` of the torch form (two kernels a layer) in
    one. Rows that repeat a slot must carry the same values (a padded step's rows do)."""
    rec = records if records.is_contiguous() else records.contiguous()
    row = math.prod(rec.shape[1:])
    if math.prod(out.shape[1:]) != row or not out.is_contiguous():
        raise ValueError(f"records of {row} values for slots of {math.prod(out.shape[1:])}")
    if src.numel():
        block = min(1024, 1 << max(4, (row - 1).bit_length()))
        _write_kernel()[(src.numel(),)](rec, src, dst, out, ROW=row, BLOCK=block,
                                        num_warps=4 if block >= 512 else 1)
