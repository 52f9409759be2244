"""Streaming T blocks into HBM: a staging ring filled on a copy stream, layers ahead.

The T region is pinned host memory in the GPU layout, ``[L, N, bs, H, R]``; for one layer,
consecutive block ids are contiguous bytes, and a sequence's T blocks are allocated as runs of
consecutive ids. Per step the GPU side's T work (one :class:`BlockBatch` over the T pool, the
same for every layer) is cut into *pieces* of at most ``slot_blocks`` blocks; each piece's
source ids are coalesced into runs, and equal runs at equal spacing into strided copies (one DMA
call per copy, per layer: :func:`strided_copies`). A *unit* is
``(layer, piece)``, and units are staged in order into ``num_slots`` slots of one ring buffer
allocated once, at construction (its bytes, :attr:`StagingRing.staging_bytes`, count against the
VRAM budget).

Flow control uses device events only, so the host never waits on the ring: the copy of unit
``u`` goes into slot ``u % num_slots`` after the consumer kernel of unit ``u - num_slots``
*released* that slot (an event recorded on the compute stream right after the kernel was
enqueued); the consumer stream waits for the unit's *filled* event before its kernel. The copy
stream therefore runs as far ahead as the ring allows -- several layers when a layer's T bytes
are small against the ring, a fraction of a layer when they are large -- which keeps PCIe busy
across layer boundaries while the compute stream waits for the CPU side.

Without CUDA (or for tests) :class:`SyncCopier` does the same steps as plain synchronous copies,
so the whole orchestration runs and is checked on a CPU-only machine.

What was learned from: FlexGen's overlapped weight/KV prefetch on separate CUDA streams (one
layer ahead), and NEO's swap-in pipeline; the ring with per-slot release events is ours.
"""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from .batch import BlockBatch


# ----------------------------------------------------------------------------------------------
# planning (pure torch on the CPU, once per step)
# ----------------------------------------------------------------------------------------------

def coalesce_runs(ids: torch.Tensor) -> torch.Tensor:
    """Runs of consecutive ids as an int64 ``[n_runs, 3]`` tensor of ``(src, dst, count)``,
    where ``dst`` is the position of the run's first id in ``ids``."""
    ids = ids.to("cpu", torch.int64).reshape(-1)
    if ids.numel() == 0:
        return torch.zeros(0, 3, dtype=torch.int64)
    brk = torch.ones(ids.numel(), dtype=torch.bool)
    brk[1:] = ids[1:] != ids[:-1] + 1
    starts = torch.nonzero(brk).reshape(-1)
    ends = torch.cat([starts[1:], torch.tensor([ids.numel()])])
    return torch.stack([ids[starts], starts, ends - starts], dim=1)


def strided_copies(runs: list[tuple[int, int, int]], strided: bool = True
                   ) -> list[tuple[int, int, int, int, int]]:
    """The copies that move ``runs`` (``(src, dst, count)``, dst in increasing order): one
    ``(src, dst, count, rows, pitch)`` per copy, where a copy moves ``rows`` runs of ``count``
    blocks each, the k-th from ``src + k * pitch`` to ``dst + k * count``.

    Consecutive runs of equal length, back to back in the slot, whose sources are equally spaced
    (the same position of every sequence's extent, or a decode step's block of each sequence)
    become one strided (2D) copy: a step of 64 sequences then costs one DMA call per layer
    instead of 64. ``strided=False`` gives one copy per run (``rows == 1``)."""
    out: list[list[int]] = []
    for s, d, n in runs:
        if strided and out:
            c = out[-1]
            s0, d0, n0, rows, pitch = c
            if n == n0 and d == d0 + rows * n0:
                if rows == 1 and s > s0 + n0:
                    c[3], c[4] = 2, s - s0
                    continue
                if rows > 1 and s == s0 + rows * pitch:
                    c[3] += 1
                    continue
        out.append([s, d, n, 1, n])
    return [tuple(c) for c in out]


def copies_strided_default() -> bool:
    """Strided copies unless ``WRITESCOPE_COPY_2D=0`` (one copy per run, for comparison)."""
    return os.environ.get("WRITESCOPE_COPY_2D", "1") != "0"


@dataclass
class StagedPiece:
    """One piece of a step's T work: ``batch`` addresses slot positions ``0..num_blocks-1``
    (CPU tensors); ``runs`` are the runs of consecutive blocks that fill the slot from the pool,
    and ``copies`` the DMA calls that move them (:func:`strided_copies`), per layer."""

    batch: BlockBatch
    runs: torch.Tensor  # [n_runs, 3] int64: (src block id, dst slot position, count)
    num_blocks: int
    copies: list = field(default_factory=list)
    part: int = 0  # which of the planned batches (sub-batches of a step) the piece belongs to
    strided: bool = True

    def __post_init__(self):
        self.copies = strided_copies([tuple(r) for r in self.runs.tolist()], self.strided)


def equal_pieces() -> bool:
    """Whether a layer cut into pieces is cut into pieces of equal size (default) or into pieces
    of half the ring and a remainder, as before (``WRITESCOPE_STAGING_EQUAL_PIECES=0``, to
    compare). The ring holds ``capacity // slot`` pieces in flight: a layer of 276 MB in the
    default 536 MB ring was a 268 MB and an 8 MB piece in 2 slots (the next layer's big piece
    waited for this layer's to be consumed: one layer of lookahead); as two of 138 MB it has 3
    slots (1.5 layers), with the same number of copies and kernels."""
    return os.environ.get("WRITESCOPE_STAGING_EQUAL_PIECES", "1") != "0"


def staging_ahead() -> bool:
    """Whether the ring stages the next step's first units during this step's last layers
    (``WRITESCOPE_STAGING_AHEAD=1``; off by default until measured): the link otherwise waits
    from the step's last copy to the next step's first -- the last layers, the head, sampling
    and the host's work between steps -- in a step whose length the link may set."""
    return os.environ.get("WRITESCOPE_STAGING_AHEAD", "0") == "1"


def stage_shared() -> bool:
    """Whether a block that several sequences list is moved once a piece (default) or once per
    listing, as before (``WRITESCOPE_STAGE_SHARED=0``, to compare: ``bench.shared_prefix``; the
    cache's step plan then also lets a policy give shared T blocks to the CPU, as before)."""
    return os.environ.get("WRITESCOPE_STAGE_SHARED", "1") != "0"


def distinct_count(ids: np.ndarray) -> int:
    """How many distinct values ``ids`` (non-negative block ids, below a pool's size) holds: a
    flag per id up to the largest, set and counted. Linear: a sort (``np.unique``) of a step's
    16K block ids took ~0.4 ms of the dev VM's host time, this ~20x less."""
    if ids.size <= 1:
        return int(ids.size)
    seen = np.zeros(int(ids.max()) + 1, np.bool_)
    seen[ids] = True
    return int(np.count_nonzero(seen))


def shared_positions(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` (int64, a piece's pool ids in CSR order) without repeats, in the order each first
    appears, and each entry's position in that list (int32). Sequences that share blocks (a
    prefix found by prefix caching, the prompt of a request sampled ``n`` times) list them once
    each; the piece moves each block once and every sequence reads it from the same position.
    Without repeats the positions are ``0..n-1`` and the ids unchanged."""
    n = ids.numel()
    if n < 2:
        return ids, torch.arange(n, dtype=torch.int32)
    uniq, first, inv = np.unique(ids.numpy(), return_index=True, return_inverse=True)
    if uniq.size == n:
        return ids, torch.arange(n, dtype=torch.int32)
    order = np.argsort(first, kind="stable")  # the unique ids in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return (torch.from_numpy(uniq[order].astype(np.int64)),
            torch.from_numpy(rank[inv.reshape(-1)].astype(np.int32)))


def piece_bounds(blocks: np.ndarray, piece_blocks: int) -> tuple[list[int], bool]:
    """Where to cut a flat block list into pieces of at most ``piece_blocks`` distinct ids: the
    entries' start offsets and the end. Without repeats, every ``piece_blocks`` entries; with
    them (sequences sharing blocks), greedily, so a piece takes entries until one more new id
    would not fit -- a shared prefix then costs one slot position however many sequences read
    it, where cutting by entries would move it again in every piece. Also whether there are
    repeats (never with :func:`stage_shared` off)."""
    nnz = int(blocks.size)
    distinct = distinct_count(blocks) if nnz > 1 and stage_shared() else nnz
    if distinct == nnz:
        return list(range(0, nnz, piece_blocks)) + [nnz], False
    if distinct <= piece_blocks:  # one piece (the ring's slot holds a layer's distinct blocks)
        return [0, nnz], True
    bounds, seen = [0], set()  # a layer cut into pieces: entry by entry
    for e, b in enumerate(blocks.tolist()):
        if b not in seen:
            if len(seen) == piece_blocks:
                bounds.append(e)
                seen = set()
            seen.add(b)
    bounds.append(nnz)
    return bounds, True


def distinct_blocks(batch: BlockBatch) -> int:
    """How many distinct pool ids ``batch`` lists (its entries, without repeats; every entry
    with :func:`stage_shared` off)."""
    ids = batch.host_view().kv_blocks
    if ids.numel() <= 1 or not stage_shared():
        return int(ids.numel())
    return distinct_count(ids.numpy())


def split_batch(batch: BlockBatch, piece_blocks: int) -> list[tuple[BlockBatch, torch.Tensor]]:
    """Cut the flat (CSR-order) block list into pieces of at most ``piece_blocks`` distinct
    blocks (:func:`piece_bounds`): per piece, a BlockBatch over positions ``0..n-1`` and the
    int64 pool ids those positions hold (CPU tensors), each id once (:func:`shared_positions`:
    a block several sequences list is moved once a piece). Used for staged T pieces and for
    gathered C pieces."""
    batch = batch.host_view()
    qi = batch.q_indptr.to(torch.int32)
    ki = batch.kv_indptr.to(torch.int64)
    blocks = batch.kv_blocks.to(torch.int64)
    lens = batch.kv_lens.to(torch.int32)
    bounds, repeats = piece_bounds(blocks.numpy(), piece_blocks)
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        kip = (ki.clamp(lo, hi) - lo).to(torch.int32)
        ids = blocks[lo:hi].clone()
        ids, pos = shared_positions(ids) if repeats else \
            (ids, torch.arange(hi - lo, dtype=torch.int32))
        pieces.append((BlockBatch(qi.clone(), kip, pos, lens[lo:hi].clone()), ids))
    return pieces


def split_pieces(batch: BlockBatch, piece_blocks: int, strided: bool | None = None
                 ) -> list[StagedPiece]:
    """:func:`split_batch` with each piece's coalesced copy runs (the staging ring's pieces)."""
    if strided is None:
        strided = copies_strided_default()
    return [StagedPiece(b, coalesce_runs(ids), ids.numel(), strided=strided)
            for b, ids in split_batch(batch, piece_blocks)]


@dataclass
class StagePlan:
    pieces: list[StagedPiece]
    slot_blocks: int
    num_slots: int

    @property
    def num_blocks(self) -> int:
        return sum(p.num_blocks for p in self.pieces)


# ----------------------------------------------------------------------------------------------
# copy engines
# ----------------------------------------------------------------------------------------------

class CopyCounts:
    """A copier's counts for the current step: DMA calls, bytes and (timed copiers) each copy's
    pair of timing events. Copies staged ahead for the next step are split off and counted in
    that step (:meth:`StagingRing.begin`)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.copies = 0
        self.bytes = 0
        self._timing: list = []

    def mark(self) -> tuple:
        return (self.copies, self.bytes, len(self._timing))

    def split_since(self, mark: tuple) -> tuple:
        """What was counted since ``mark`` (copies, bytes, timing pairs), taken off this step's
        counts."""
        out = (self.copies - mark[0], self.bytes - mark[1], self._timing[mark[2]:])
        self.copies, self.bytes = mark[0], mark[1]
        del self._timing[mark[2]:]
        return out

    def restore(self, stash: tuple) -> None:
        """Count ``stash`` (from :meth:`split_since`) in this step, its copies first."""
        self.copies += stash[0]
        self.bytes += stash[1]
        self._timing[:0] = stash[2]


class SyncCopier(CopyCounts):
    """Synchronous stand-in for the copy stream (CPU-only machines and tests)."""

    timed = False

    def copy_unit(self, dst: torch.Tensor, src_layer: torch.Tensor, copies: list, wait_free,
                  timed: bool | None = None) -> object:
        rec = src_layer[0].numel() * src_layer.element_size()
        for s, d, n, rows, pitch in copies:
            if rows == 1:
                dst[d:d + n].copy_(src_layer[s:s + n])
            else:  # the strided copy's rows, as one view of the source
                src = src_layer.as_strided((rows, n, *src_layer.shape[1:]),
                                           (pitch * src_layer.stride(0), *src_layer.stride()),
                                           src_layer.storage_offset() + s * src_layer.stride(0))
                dst[d:d + rows * n].view(rows, n, *dst.shape[1:]).copy_(src)
            self.copies += 1
            self.bytes += rows * n * rec
        return None

    def fence(self) -> None:
        pass

    def wait_filled(self, token) -> None:
        pass

    def release(self) -> object:
        return None

    def elapsed_s(self, until=None) -> float:
        return 0.0


@functools.lru_cache(maxsize=None)
def driver_htod():
    """The driver's ``cuMemcpyHtoDAsync_v2`` through ctypes, ``(dst, src, bytes, stream) ->
    CUresult``, or None where there is no driver library."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuMemcpyHtoDAsync_v2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


class _Memcpy2D(ctypes.Structure):
    """The driver's ``CUDA_MEMCPY2D``."""
    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
                ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
                ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t),
                ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
                ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
                ("dstPitch", ctypes.c_size_t),
                ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]


_MEMORYTYPE_HOST, _MEMORYTYPE_DEVICE = 1, 2
#: the largest pitch a strided copy may have (the driver's CU_DEVICE_ATTRIBUTE_MAX_PITCH)
MAX_PITCH_BYTES = 2**31 - 1


@functools.lru_cache(maxsize=None)
def driver_htod_2d():
    """The driver's ``cuMemcpy2DAsync_v2`` through ctypes, ``(CUDA_MEMCPY2D*, stream) ->
    CUresult``, or None."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuMemcpy2DAsync_v2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


class CudaCopier(CopyCounts):
    """H2D copies on a dedicated stream; device events for flow control and timing.

    Each copy is one ``cuMemcpyHtoDAsync`` on the copy stream, called through ctypes (~2 us of
    host time, against ~20 us for ``Tensor.copy_`` of two slices: a 4 x 128K DeepSeek-V2-Lite
    step issues ~500 runs, 2026-12-01d call 1); ``WRITESCOPE_DRIVER_COPY=0`` uses ``copy_``.
    A strided copy (equal runs at equal spacing, :func:`strided_copies`) is one
    ``cuMemcpy2DAsync``. The consumer is the stream that was current at :meth:`fence` (the
    step's compute stream).

    One stream moves the copies one after the other, with a gap between them (a step of 64
    sequences x 8 layers, 512 runs of ~2 MB, moved its T bytes at 48 GB/s in the hybrid where
    one run a layer moved them at 51): hence the strided copies. Dealing a unit's runs over two
    streams was measured and removed: 45-46 GB/s on the same step (twenty-first session)."""

    timed = True

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self._consumer = None
        self._htod = driver_htod() if os.environ.get("WRITESCOPE_DRIVER_COPY", "1") != "0" \
            else None
        self._htod_2d = driver_htod_2d() if self._htod is not None else None
        self._desc = _Memcpy2D()
        self._desc.srcMemoryType = _MEMORYTYPE_HOST
        self._desc.dstMemoryType = _MEMORYTYPE_DEVICE

    def _copy_2d(self, dst_ptr: int, src_ptr: int, width: int, rows: int, pitch: int,
                 stream: int) -> bool:
        """One strided copy; False (nothing enqueued) when the driver refuses it."""
        if self._htod_2d is None or pitch > MAX_PITCH_BYTES:
            return False
        c = self._desc
        c.srcHost, c.srcPitch = src_ptr, pitch
        c.dstDevice, c.dstPitch = dst_ptr, width
        c.WidthInBytes, c.Height = width, rows
        if self._htod_2d(ctypes.byref(c), stream) != 0:
            self._htod_2d = None  # once refused, plain copies from then on
            return False
        return True

    def copy_unit(self, dst, src_layer, copies, wait_free, timed: bool | None = None):
        """One unit's copies after ``wait_free``; the event after them. Timed as the copier is,
        or as ``timed`` says (copies staged ahead are timed as the next step is)."""
        timed = self.timed if timed is None else timed
        s0 = torch.cuda.Event(enable_timing=True) if timed else None
        s1 = torch.cuda.Event(enable_timing=timed)
        st = self.stream
        if wait_free is not None:
            st.wait_event(wait_free)
        if timed:
            s0.record(st)
        block = src_layer.stride(0) * src_layer.element_size()
        htod = self._htod
        if htod is not None and dst.is_contiguous() and src_layer.is_contiguous() \
                and dst.stride(0) == src_layer.stride(0) and dst.dtype == src_layer.dtype:
            dbase, sbase, h = dst.data_ptr(), src_layer.data_ptr(), st.cuda_stream
            for s, d, n, rows, pitch in copies:
                if rows > 1 and self._copy_2d(dbase + d * block, sbase + s * block, n * block,
                                              rows, pitch * block, h):
                    self.copies += 1
                    self.bytes += rows * n * block
                    continue
                for k in range(rows):
                    rc = htod(dbase + (d + k * n) * block, sbase + (s + k * pitch) * block,
                              n * block, h)
                    if rc != 0:
                        raise RuntimeError(f"cuMemcpyHtoDAsync failed (CUresult {rc})")
                    self.copies += 1
                    self.bytes += n * block
        else:
            rec = src_layer[0].numel() * src_layer.element_size()
            with torch.cuda.stream(st):
                for s, d, n, rows, pitch in copies:
                    for k in range(rows):
                        a, b = d + k * n, s + k * pitch
                        dst[a:a + n].copy_(src_layer[b:b + n], non_blocking=True)
                        self.copies += 1
                        self.bytes += n * rec
        s1.record(st)
        if timed:
            self._timing.append((s0, s1))
        return s1

    def fence(self) -> None:
        """Copies issued from now on start after the work already on the current stream."""
        self._consumer = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(self._consumer)

    def _current(self):
        return self._consumer if self._consumer is not None else \
            torch.cuda.current_stream(self.device)

    def wait_filled(self, token) -> None:
        self._current().wait_event(token)

    def release(self):
        ev = torch.cuda.Event()
        ev.record(self._current())
        return ev

    def elapsed_s(self, until=None) -> float | None:
        """Busy seconds of this step's copies (None when the step was not timed). Waits for the
        copy stream, or only until the event ``until`` (the step's last copy: copies staged
        ahead for the next step may still run)."""
        if until is not None:
            until.synchronize()
        else:
            self.stream.synchronize()
        if not self.timed:
            return None
        return sum(a.elapsed_time(b) for a, b in self._timing) / 1e3


# ----------------------------------------------------------------------------------------------
# the ring
# ----------------------------------------------------------------------------------------------

class StagingRing:
    """A ring of staging slots in device memory for one pool's blocks (see module docstring).

    ``block_shape`` is one layer's block, ``(bs, H, R)``. The buffer is ``staging_bytes`` rounded
    down to whole blocks, allocated here once.
    """

    def __init__(self, block_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
                 staging_bytes: int, copier=None):
        self.device = torch.device(device)
        self.block_shape = tuple(block_shape)
        self.dtype = dtype
        itemsize = torch.tensor([], dtype=dtype).element_size()
        self.block_elems = 1
        for s in block_shape:
            self.block_elems *= int(s)
        self.block_bytes = self.block_elems * itemsize
        self.capacity_blocks = int(staging_bytes) // self.block_bytes
        if self.capacity_blocks < 1:
            raise ValueError(f"staging ring of {staging_bytes} bytes holds no block "
                             f"({self.block_bytes} bytes per block and layer)")
        self.buffer = torch.empty(self.capacity_blocks * self.block_elems, dtype=dtype,
                                  device=self.device)
        if copier is None:
            copier = CudaCopier(self.device) if self.device.type == "cuda" else SyncCopier()
        self.copier = copier
        self._plan: StagePlan | None = None
        self._units: list[tuple[int, int]] = []
        #: stage the next step's first units during this step's last layers
        #: (:func:`staging_ahead`); ``ahead_timed`` says whether those copies are timed (the
        #: next step's timing, set by the caller each step)
        self.ahead = staging_ahead()
        self.ahead_timed = True
        self._slot_base = 0  # the slot of this step's unit u is (base + u) % num_slots
        self._ahead: dict | None = None  # units staged ahead: the plan, layers, pool, events
        #: units staged ahead and then used by the next step, or dropped (its plan differed)
        self.ahead_units = {"used": 0, "dropped": 0}

    @property
    def staging_bytes(self) -> int:
        return self.capacity_blocks * self.block_bytes

    # ---- per step ----
    def plan(self, batch: BlockBatch | list[BlockBatch | None],
             max_slot_blocks: int | None = None) -> StagePlan:
        """Pieces and slots for one step's T batch: a piece is a whole layer if two fit in the
        ring (then as many layers are in flight as fit), else a layer is cut into the fewest
        pieces of at most half the ring, of equal size (:func:`equal_pieces`). ``batch`` may be
        a list (a step's sub-batches, None for one without T blocks): no piece then spans two of
        them, each piece's ``part`` says whose it is, and a layer's pieces follow list order."""
        parts = batch if isinstance(batch, (list, tuple)) else [batch]
        nnz = sum(distinct_blocks(b) for b in parts if b is not None)  # (a shared block once)
        cap = self.capacity_blocks
        slot = max(1, min(nnz, cap // 2 if cap >= 2 else cap))
        if max_slot_blocks:
            slot = max(1, min(slot, max_slot_blocks))
        if nnz > slot and equal_pieces():
            k = -(-nnz // slot)  # the fewest pieces a layer needs ...
            slot = -(-nnz // k)  # ... each as large as the others
        pieces = []
        for k, b in enumerate(parts):
            if b is None or b.num_blocks == 0:
                continue
            for piece in split_pieces(b, slot):
                piece.part = k
                pieces.append(piece)
        return StagePlan(pieces, slot, max(1, cap // slot))

    def slot_view(self, slot: int, n: int) -> torch.Tensor:
        p = self._plan
        off = slot * p.slot_blocks * self.block_elems
        return self.buffer[off:off + n * self.block_elems].view(n, *self.block_shape)

    def _slot(self, u: int) -> int:
        return (self._slot_base + u) % self._plan.num_slots

    def begin(self, pool: torch.Tensor, plan: StagePlan, layers: list[int],
              issue_now: int = 1) -> None:
        """Start a step: ``pool [L, N, bs, H, R]`` (pinned host); units are staged for
        ``layers`` in that order, every piece of a layer before the next layer's.

        Only ``issue_now`` units are issued here (enough to start PCIe); the rest of the window
        is issued by :meth:`top_up` / :meth:`release`, i.e. while the host would otherwise wait
        for the CPU side -- each DMA run costs the host a driver call, and a layer of many
        sequences has many runs.

        Units the last step staged ahead (:func:`staging_ahead`) are this step's first when it
        has the same plan (the same object: the hybrid attention keeps a step's plan while its T
        batch is unchanged, and T blocks never change once written), layers and pool; else they
        are dropped (their slots are written again after them, on the same stream)."""
        ahead, self._ahead = self._ahead, None
        self._pool = pool
        self._plan = plan
        self._layers = tuple(layers)
        self._units = [(l, i) for l in layers for i in range(len(plan.pieces))]
        self._unit_of = {u: k for k, u in enumerate(self._units)}
        self._filled: list = [None] * len(self._units)
        self._free: list = [None] * plan.num_slots
        self._issued = 0
        self._released = 0
        self.copier.reset()
        if ahead is not None and ahead["plan"] is plan and ahead["layers"] == tuple(layers) \
                and ahead["pool"] is pool:
            k = len(ahead["filled"])
            self._slot_base = ahead["base"]
            self._filled[:k] = ahead["filled"]
            self._issued = k
            self.copier.restore(ahead["counts"])
            self.ahead_units["used"] += k
        else:
            self._slot_base = 0
            if ahead is not None:
                self.ahead_units["dropped"] += len(ahead["filled"])
        self.copier.fence()
        self._issue(limit=issue_now)

    def drop_ahead(self) -> None:
        """Forget the units staged ahead (a step without T blocks to stream came between)."""
        if self._ahead is not None:
            self.ahead_units["dropped"] += len(self._ahead["filled"])
            self._ahead = None

    def top_up(self) -> None:
        """Issue every unit the ring has room for."""
        if self._plan is not None:
            self._issue()

    def _issue(self, limit: int | None = None) -> None:
        p = self._plan
        window = p.num_slots if limit is None else min(p.num_slots, max(1, limit))
        n = len(self._units)
        while self._issued < n and self._issued < self._released + window:
            u = self._issued
            layer, i = self._units[u]
            self._filled[u] = self._copy(u, layer, i)
            self._issued += 1
        if limit is None and self.ahead and self._issued == n:
            self._issue_ahead(window)

    def _copy(self, u: int, layer: int, piece: int, timed: bool | None = None):
        slot = self._slot(u)
        p = self._plan.pieces[piece]
        return self.copier.copy_unit(self.slot_view(slot, p.num_blocks), self._pool[layer],
                                     p.copies, self._free[slot], timed)

    def _issue_ahead(self, window: int) -> None:
        """The next step's first units, as this step's units ``n, n + 1, ...``, as far as the
        window allows (at most one step's units): into the slots this step's last units free,
        after their consumers, while the link would otherwise wait for the step's end."""
        n = len(self._units)
        a = self._ahead
        if a is None:
            a = self._ahead = {
                "plan": self._plan, "layers": self._layers, "pool": self._pool, "filled": [],
                "base": (self._slot_base + n) % self._plan.num_slots, "counts": (0, 0, [])}
        copier = self.copier
        while len(a["filled"]) < n and n + len(a["filled"]) < self._released + window:
            j = len(a["filled"])
            layer, i = self._units[j]
            mark = copier.mark()
            a["filled"].append(self._copy(n + j, layer, i, timed=self.ahead_timed))
            c = copier.split_since(mark)
            a["counts"] = (a["counts"][0] + c[0], a["counts"][1] + c[1], a["counts"][2] + c[2])

    def acquire(self, layer: int, piece: int) -> torch.Tensor:
        """The slot holding ``(layer, piece)``; the current stream waits until it is filled."""
        u = self._unit_of[(layer, piece)]
        if u != self._released:
            raise RuntimeError(f"staged units must be consumed in order: asked for unit {u} "
                               f"(layer {layer}, piece {piece}), next is {self._released}")
        if u >= self._issued:  # cannot happen while consumption is in order
            self._issue()
        self.copier.wait_filled(self._filled[u])
        return self.slot_view(self._slot(u), self._plan.pieces[piece].num_blocks)

    def release(self, layer: int, piece: int) -> None:
        """The consumer of ``(layer, piece)`` is enqueued: its slot may be refilled after it."""
        u = self._unit_of[(layer, piece)]
        self._free[self._slot(u)] = self.copier.release()
        self._released = u + 1
        self._issue()

    def last_copy(self):
        """The event after this step's last issued copy (None when there is none): what to wait
        for instead of the copy stream, which may be moving the next step's units."""
        if self._plan is None or self._issued == 0:
            return None
        return self._filled[min(self._issued, len(self._units)) - 1]

    def finish(self) -> float | None:
        """End the step; returns the copy stream's busy seconds (0 for the synchronous copier,
        None for a step the copier did not time). Units staged ahead stay in flight."""
        if self._plan is None:
            t = 0.0
        else:
            t = self.copier.elapsed_s(self.last_copy() if self._ahead is not None else None)
        self._plan = None
        self._pool = None
        return t
