"""Runs one step's attention plan: the CPU attends its blocks, the GPU attends the rest, one merge.

Plan once per step (:meth:`HybridAttention.begin_step`), run per layer (:meth:`attend`).
The plan is pure data built by the cache: per side, a list of ``(region, BlockBatch)`` over that
region's pool. Reading a T block from the GPU side stages it into HBM first (a read, never a
move); the CPU reads C blocks, and T blocks when assigned, in place.

Per layer, with CUDA and Triton (the fast path)::

    compute stream:  q -> pinned (D2H) | partials over G, W | wait T piece | partials | ...
                     ... | wait CPU flag | reduce
    copy stream:     ... T copies of this layer and of the next layers, as far as the ring allows
    CPU worker:                          wait q | attend C (and CPU-assigned T) | -> pinned | flag

* ``begin_step`` plans everything that is the same for every layer -- the staging pieces and
  their DMA copies first (kept from the last step while its T batches are the same: a decode
  step's most often are), then starts the copy stream on the first layers' T blocks; the chunk
  lists of the split-KV kernel and the row -> partials map of the merge are made at each group's
  first launch, after that layer's CPU side has its queries (the CPU starts sooner).
* ``attend`` enqueues the GPU side without waiting for anything, hands the CPU side to a worker
  (on CUDA the native job queue, ``cpu.CpuJobQueue``: a C++ thread that needs no GIL between
  layers; else a Python thread; the query arrives through a pinned buffer), and
  enqueues a device-side wait for the worker's flag (:mod:`.hostflag`) followed by one reduce
  kernel that merges every GPU partial with the CPU's result, read in place from pinned memory
  (no copy-engine transfer, so it never queues behind the T stream). The launching thread never
  waits for the CPU: it goes on enqueuing the next layers while the CPU attends this one, so
  launch time, GPU time and CPU time overlap instead of adding up (``cpu_wait="host"`` restores
  the older host-side wait, for comparison). There is no Python work per block on this path: per
  layer, one launch per resident region, one per staged piece, one wait, one reduce.
* The copy stream is gated only by device events (a slot is refilled once the kernel that read it
  has run), so while the compute stream waits on the CPU, PCIe keeps moving the next layers.

Without CUDA the same orchestration runs with the torch path (:func:`attend_torch`) on both
sides, the CPU side on its worker thread; ``stage_t=True`` runs the staging ring with synchronous
copies, so the ring logic is tested on CPU-only machines too.

The step plan and its sub-batches are in :mod:`.groups`; the CPU side's jobs (native queue,
Python worker, inline) in :mod:`.hybrid_cpu`.
"""
from __future__ import annotations

import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..kvcache.regions import KVSpec, Region
from .batch import BlockBatch
from .gather import DEFAULT_GATHER_BYTES, CGather
from .groups import (COMPACT_MIN_ROWS, MAX_GROUPS, AttentionStepPlan, Group, Source, clone_key,
                     compact_cpu_rows, same_key, split_groups)
from .hostflag import stream_ready, wait_for_stream
from .launch import launch_flags
from .hybrid_cpu import CpuSide, Signalled, cpu_kernel, region_layout
from .merge import merge_many
from .staging import StagingRing
from .torch_paged import attend_torch

#: default size of the T staging ring in device memory
DEFAULT_STAGING_BYTES = 512 * 2**20


def staging_bytes() -> int:
    """The engine's T staging ring: :data:`DEFAULT_STAGING_BYTES`, or ``WRITESCOPE_STAGING_BYTES``
    (a byte size such as ``1GiB``, for experiments: how far ahead of its consumer the link may
    run; the engine counts the ring against the VRAM budget)."""
    from ..units import parse_bytes
    v = os.environ.get("WRITESCOPE_STAGING_BYTES", "").strip()
    if not v:
        return DEFAULT_STAGING_BYTES
    try:
        n = parse_bytes(v)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"WRITESCOPE_STAGING_BYTES must be a positive byte size (e.g. 1GiB), "
                         f"got {v!r}")
    return n


def _empty_result(nq: int, hq: int, dv: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.zeros(nq, hq, dv, dtype=torch.float32, device=device),
            torch.full((nq, hq), float("-inf"), dtype=torch.float32, device=device))


class HybridAttention(CpuSide):
    """Attention over every cached block of a step, split between the CPU and the GPU.

    ``pools``: Region -> pool tensor ``[L, N, ...]`` (G/W on the device, T pinned host in the GPU
    layout, C pageable host in the CPU layout). ``staging_bytes``: size of the T staging ring in
    device memory (allocated here, once; :attr:`staging_bytes` is what the VRAM budget must count).
    ``cpu_threads``: threads the compiled CPU kernel's calls use (carried by this instance's
    kernel plans; the process-wide setting is left alone), and torch's intra-op count on the
    worker thread where the CPU side takes the torch path.

    Options (defaults are what the engine wants): ``backend`` ``"triton"`` / ``"torch"`` (default:
    Triton on CUDA when importable); ``stage_t`` stage GPU-side T blocks through the ring (default:
    when the T pool is not on the device); ``cpu_async`` run the CPU side on a worker thread;
    ``cpu_result`` ``"pinned"`` (the merge reads the CPU result in place) or ``"copy"`` (an H2D
    copy first); ``max_slot_blocks`` caps a staging piece (finer pipelining); ``cpu_wait``
    ``"device"`` (default with Triton and ``cpu_async``: the stream waits for the CPU's jobs on the
    native queue, this thread does not; given explicitly, also for jobs on the Python worker) or
    ``"host"`` (this thread waits for each layer's CPU result before the reduce).
    """

    def __init__(self, pools: dict[Region, torch.Tensor], spec: KVSpec, device: torch.device,
                 cpu_threads: int | None = None, staging_bytes: int | None = None, *,
                 backend: str | None = None, stage_t: bool | None = None, cpu_async: bool = True,
                 cpu_result: str = "pinned", max_slot_blocks: int | None = None,
                 chunk_blocks: int | None = None, cpu_attend=None, stage_c: bool | None = None,
                 gather_bytes: int | None = None, cpu_wait: str | None = None):
        self.pools = pools
        self.spec = spec
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cpu_threads = cpu_threads
        self._cpu_attend = cpu_attend or cpu_kernel()
        self.plan: AttentionStepPlan | None = None
        self.timings = {"cpu_s": 0.0, "gpu_s": 0.0, "pcie_s": 0.0}
        if backend is None:
            from .gpu import triton_available
            backend = "triton" if self.device.type == "cuda" and triton_available() else "torch"
        if backend not in ("triton", "torch"):
            raise ValueError(f"backend must be 'triton' or 'torch', got {backend!r}")
        self.backend = backend
        self.cpu_result = cpu_result
        self.max_slot_blocks = max_slot_blocks
        self.chunk_blocks = chunk_blocks
        self.cpu_async = cpu_async
        self.ring: StagingRing | None = self._reader(pools.get(Region.T), stage_t, StagingRing,
                                                     staging_bytes, DEFAULT_STAGING_BYTES)
        self.cgather: CGather | None = self._reader(pools.get(Region.C), stage_c, CGather,
                                                    gather_bytes, DEFAULT_GATHER_BYTES)
        self._worker: ThreadPoolExecutor | None = None
        self._pinned: dict = {}
        self._pinned_step: dict = {}  # this step's views of them, by what was asked
        self._retired: list = []  # pinned buffers replaced during this step (see _pinned_bufs)
        self._groups: list[Group] = []
        #: the last step's staging plan: [key (copied T batches), StagePlan, device batches]
        self._stage_reuse: list | None = None
        #: steps with T blocks to stream that made a new staging plan / kept the last one
        self.stage_plans = {"made": 0, "reused": 0}
        # the compiled kernel is planned once per step (CpuAttentionPlan) and run per layer
        self._cpu_compiled = self._cpu_attend is not attend_torch and self._cpu_attend is cpu_kernel()
        self._parts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per group, kept
        # the device (not this thread) waits for each layer's CPU result: see hostflag.py
        #: the device may also wait for a CPU job on the Python worker (when a layer cannot go
        #: to the native queue): only when asked for (``cpu_wait="device"`` given, or
        #: WRITESCOPE_CPU_QUEUE=python). By default such a layer is collected by the launching
        #: thread -- see _submit_cpu.
        self._python_device_wait = cpu_wait == "device" or \
            os.environ.get("WRITESCOPE_CPU_QUEUE", "native") == "python"
        if cpu_wait is None:  # WRITESCOPE_CPU_WAIT=host: the older blocking wait, to compare
            can = self.backend == "triton" and cpu_async
            env = os.environ.get("WRITESCOPE_CPU_WAIT", "device")
            cpu_wait = "device" if can and env != "host" else "host"
        if cpu_wait not in ("device", "host"):
            raise ValueError(f"cpu_wait must be 'device' or 'host', got {cpu_wait!r}")
        if cpu_wait == "device" and (self.backend != "triton" or not cpu_async):
            raise ValueError("cpu_wait='device' needs the Triton backend and cpu_async=True")
        self._device_wait = cpu_wait == "device"
        self._flags = None
        self._launch_flags = (False, False)  # set per step (begin_step)
        if self._device_wait:
            from .hostflag import HostFlags
            self._flags = HostFlags(spec.num_layers * MAX_GROUPS, self.device)
        self._step_id = 0
        self._jobs: list[Future] = []
        #: the device-waited CPU side runs on a native job queue (no GIL between layers);
        #: WRITESCOPE_CPU_QUEUE=python keeps it on the Python worker thread, to compare
        self._use_queue = os.environ.get("WRITESCOPE_CPU_QUEUE", "native") != "python"
        self._queue = None
        self._queued = 0
        #: seconds the CPU kernel's team may spin on a layer's ready word before it sleeps
        #: (``flagged_call`` in csrc/attn_ops.cpp); 0 starts the team only once the queries
        #: are there. The engine sets 0 when CPU experts share the cores.
        self.cpu_spin_s = float(os.environ.get("WRITESCOPE_CPU_SPIN_US", "2000")) * 1e-6
        #: GPU and copy-stream time is measured with device events on one step in this many:
        #: reading them back costs the host ~0.1 ms per event pair at the end of every step
        #: (~3 ms of a 29 ms step, H200), and the planner keeps its factors between samples
        self.timing_every = max(1, int(os.environ.get("WRITESCOPE_TIMING_EVERY", "4")))
        self._timed = True

    def _reader(self, pool, wanted, cls, nbytes, default):
        """The device buffers through which the GPU side reads a host pool (T: the staging
        ring, C: the gather buffers); None for a pool on the device, an empty one, or when not
        ``wanted`` (default: whenever the pool is not on the device)."""
        if wanted is None:
            wanted = pool is not None and pool.device != self.device
        if not wanted or pool is None or pool.shape[1] == 0:
            return None
        return cls(tuple(pool.shape[2:]), pool.dtype, self.device,
                   default if nbytes is None else int(nbytes))

    # ------------------------------------------------------------------------------------------
    @property
    def staging_bytes(self) -> int:
        """Device bytes held by the T staging ring and the C gather buffers (0 without them)."""
        return ((self.ring.staging_bytes if self.ring is not None else 0)
                + (self.cgather.device_bytes if self.cgather is not None else 0))

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------------------------------
    def begin_step(self, plan: AttentionStepPlan, layers: list[int] | None = None,
                   groups: list[int] | None = None) -> None:
        """Plan the step (same for every layer) and start streaming the first layers' T blocks.

        ``layers``: the order the layers will be attended in (default: all, ascending).
        ``groups``: sequences per sub-batch, in batch order (e.g. ``[2, 2]``), for a step whose
        model runs its sub-batches interleaved -- one sub-batch's CPU attention overlapping the
        other's GPU work (``engine/pipeline.py``); each is then attended with :meth:`launch` and
        :meth:`finish`, every group of a layer launched in order before the next layer's. Default:
        one group of every sequence (:meth:`attend`)."""
        self.plan = plan
        self._step_id += 1
        self._jobs = []
        self.timings = {"cpu_s": 0.0, "gpu_s": 0.0, "pcie_s": 0.0, "cpu_wait_s": 0.0,
                        "host_attend_s": 0.0}
        self._lag = {"handoff": 0.0, "q_wait": 0.0, "return": 0.0, "t_done": 0.0}
        self._t0 = time.perf_counter()
        self._events: list = []
        cuda = self.device.type == "cuda"
        self._timed = not cuda or (self._step_id - 1) % self.timing_every == 0
        if self.ring is not None and hasattr(self.ring.copier, "stream"):
            self.ring.copier.timed = self._timed
            # copies staged ahead during this step are the next step's (staging_ahead)
            self.ring.ahead_timed = self._step_id % self.timing_every == 0
        self._ev_start = self._tick() if cuda and self._timed else None
        self._launch_flags = launch_flags(self.device)  # the Triton launches' flags, for the step
        self._pinned_step = {}
        self._groups = split_groups(plan, groups)
        dev = self.device
        staged = []  # per group: its T batch (read through the ring), or None
        for g in self._groups:
            t = None
            for region, batch in g.gpu:
                pool = self.pools[region]
                if self.ring is not None and region is Region.T:
                    if t is not None:
                        raise ValueError("one T batch per side per step")
                    t = batch
                    continue
                if self.cgather is not None and region is Region.C:
                    for gp in self.cgather.plan(batch):
                        g.sources.append(Source(Region.C, gp.batch.to(dev), gather=gp,
                                                 host_batch=gp.batch))
                    continue
                if pool.device != dev:
                    raise ValueError(f"region {region} pool is on {pool.device}, not {dev}, and "
                                     "is not staged")
                g.sources.append(Source(region, batch.to(dev), host_batch=batch.host_view()))
            staged.append(t)
        self._stage_plan = None
        t_plan = time.perf_counter()
        if self.ring is not None and all(t is None for t in staged):
            self.ring.drop_ahead()  # (units staged ahead are for the step right after theirs)
        if any(t is not None for t in staged):
            sp, dev_batches = self._stage_planned(staged)
            self._stage_plan = sp
            # start the copy stream first, then plan the rest
            ly = list(range(self.spec.num_layers)) if layers is None else list(layers)
            self.ring.begin(self.pools[Region.T], sp, ly)
            if dev_batches is None:
                dev_batches = [piece.batch.to(dev) for piece in sp.pieces]
                self._stage_reuse[2] = dev_batches
            for i, piece in enumerate(sp.pieces):
                self._groups[piece.part].sources.append(
                    Source(Region.T, dev_batches[i], piece=i, host_batch=piece.batch))
        # only the rows of sequences with CPU blocks go to the CPU, when that leaves out at least
        # COMPACT_MIN_ROWS rows (WRITESCOPE_CPU_ROWS=all: never)
        compact = os.environ.get("WRITESCOPE_CPU_ROWS", "cpu") != "all"
        for g in self._groups:
            if g.cpu and compact:
                cpu, rows = compact_cpu_rows(g.cpu)
                if rows is not None and g.num_rows - rows.numel() >= COMPACT_MIN_ROWS:
                    g.cpu, g.cpu_rows = cpu, rows
                    g.cpu_rows_dev = rows.to(self.device, non_blocking=True)
            g.gpu_planned = self.backend != "triton"  # else at its first launch
        self.timings["host_begin_s"] = time.perf_counter() - self._t0
        self.timings["host_plan_s"] = time.perf_counter() - t_plan

    def _stage_planned(self, staged: list[BlockBatch | None]):
        """The staging ring's plan for this step's T batches (one per group, None for a group
        without), and its pieces' batches on the device, or None for those when they are still
        to be copied there. A decode step's T batches are most often the last step's (T blocks
        are sealed and never move; a sequence seals a block once every block-size tokens), so the last plan is kept with a copy of the batches it was made for and used
        again when they are equal (``WRITESCOPE_STAGE_PLAN_REUSE=0``: plan every step, to
        compare). Saves the host the ring's planning and the pieces' copies to the device
        before the step's first T copy can start."""
        hosts = [None if t is None else t.host_view() for t in staged]
        key = (self.max_slot_blocks, tuple(
            None if h is None else (h.q_indptr, h.kv_indptr, h.kv_blocks, h.kv_lens)
            for h in hosts))
        cached = self._stage_reuse
        if cached is not None and cached[2] is not None and same_key(cached[0], key):
            self.stage_plans["reused"] += 1
            return cached[1], cached[2]
        self.stage_plans["made"] += 1
        sp = self.ring.plan(hosts, self.max_slot_blocks)
        reuse = os.environ.get("WRITESCOPE_STAGE_PLAN_REUSE", "1") != "0"
        # the key's tensors are copied: a caller may refill its batch tensors in place
        self._stage_reuse = [clone_key(key), sp, None] if reuse else [None, sp, None]
        return sp, None

    def _plan_triton(self, g: Group) -> None:
        from . import gpu as G
        base = 0
        cpu_plans = []
        cpu_bs = [s.host_batch for s in g.sources]
        for cpu_b in cpu_bs:
            # each source is its own launch: its chunks aim at the launch's programs (a chunk
            # size from all the step's blocks left a G launch beside a large T share with a
            # fraction of them)
            cb = self.chunk_blocks or G.chunk_blocks_for([cpu_b], self.spec)
            cp = G.plan_chunks(cpu_b, cb, base)
            base += cp.num_chunks
            cpu_plans.append(cp)
        g.qmax = max([p.qmax for p in cpu_plans] + [1])
        g.num_chunks = base
        row_ptr, row_idx = G.plan_rows(cpu_plans, g.num_rows, g.qmax)
        dev = self.device
        for src, cp in zip(g.sources, cpu_plans):
            src.chunks = cp.to(dev)
        g.row_ptr = row_ptr.to(dev, non_blocking=True)  # (pageable: staged before it returns)
        g.row_idx = row_idx.to(dev, non_blocking=True)

    # ------------------------------------------------------------------------------------------
    def attend(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of this step's queries over every cached block in the plan, for one layer."""
        assert self.plan is not None, "begin_step first"
        if len(self._groups) != 1:
            raise RuntimeError("a step planned in groups is attended with launch() and finish()")
        self.launch(layer, q, 0)
        return self.finish(layer, 0)

    def launch(self, layer: int, q: torch.Tensor, group: int = 0) -> None:
        """Start one layer's attention for one group's query rows ``q``: the GPU side is enqueued
        and the CPU side handed to the worker; :meth:`finish` returns the merged result."""
        assert self.plan is not None, "begin_step first"
        g = self._groups[group]
        if g.pending is not None:
            raise RuntimeError(f"group {group}: layer {g.pending[0]} was launched and not finished")
        if q.shape[0] != g.num_rows:
            raise ValueError(f"group {group} has {g.num_rows} query rows, got {q.shape[0]}")
        t = time.perf_counter()
        if self.backend == "triton":
            self._launch_triton(layer, q, g)
        else:
            self._launch_torch(layer, q, g)
        self.timings["host_attend_s"] += time.perf_counter() - t

    def finish(self, layer: int, group: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The launched layer's ``(out, lse)`` for the group's rows (float32, on the device). With
        the device waiting for the CPU (the default on CUDA) this enqueues the wait and the merge
        and returns at once."""
        g = self._groups[group]
        if g.pending is None or g.pending[0] != layer:
            raise RuntimeError(f"group {group}: layer {layer} was not launched")
        t = time.perf_counter()
        pending, g.pending = g.pending, None
        if self.backend == "triton":
            out = self._finish_triton(g, layer, *pending[1:])
        else:
            out = self._finish_torch(g, layer, *pending[1:])
        self.timings["host_attend_s"] += time.perf_counter() - t
        return out

    def _pinned_bufs(self, key, shapes: list[tuple], dtypes: list, parity: int):
        """Views of page-locked buffers, one per (key, position, parity, dtype), grown (doubled)
        when a step needs more: the row count changes from step to step, and a buffer per shape
        would pile up. A replaced buffer is kept until the step ends (the device may still
        read it)."""
        memo = (key, parity, *shapes, *dtypes)
        out = self._pinned_step.get(memo)
        if out is not None:  # an earlier layer of this step asked for the same views
            return out
        pin = self.device.type == "cuda"
        out = self._pinned_step[memo] = []
        for j, (shape, dt) in enumerate(zip(shapes, dtypes)):
            k = (key, j, parity, dt)
            n = math.prod(shape)
            buf = self._pinned.get(k)
            if buf is None or buf.numel() < n:
                if buf is not None:
                    self._retired.append(buf)
                size = max(n, 2 * buf.numel()) if buf is not None else n
                buf = self._pinned[k] = torch.empty(size, dtype=dt, pin_memory=pin)
            out.append(buf[:n].view(shape))
        return out

    # ---- torch backend (any device; the CPU-only path) ----
    def _launch_torch(self, layer: int, q: torch.Tensor, g: Group) -> None:
        job = None
        if g.cpu:
            qc = q if g.cpu_rows is None else q.index_select(0, g.cpu_rows_dev)
            q_host = qc if qc.device.type == "cpu" else qc.to("cpu")
            job = self._submit_cpu(layer, g, q_host, None, None)
        if self.ring is not None:
            self.ring.top_up()
        sources, deferred = self._now_and_at_finish(g)
        parts = self._torch_partials(layer, q, sources)
        g.pending = (layer, job, parts, tuple(q.shape[:2]), q.device, deferred, q)

    def _now_and_at_finish(self, g: Group) -> tuple[list, list]:
        """The group's GPU-side sources to attend at launch() and those left for finish(). In a
        step of sub-batches the staged T pieces wait for finish(): the stream then waits for
        their copies after the other sub-batch's work enqueued in between (whose queries the CPU
        needs next), not before it. The ring is still consumed in (layer, piece) order."""
        if len(self._groups) == 1:
            return g.sources, []
        return ([s for s in g.sources if s.piece is None],
                [s for s in g.sources if s.piece is not None])

    def _torch_partials(self, layer: int, q: torch.Tensor, sources: list) -> list:
        plan = self.plan
        parts = []
        t0 = time.perf_counter()
        for src in sources:
            if src.gather is not None:
                kv = self.cgather.fetch(self.pools[Region.C][layer], src.gather)
                parts.append(attend_torch(q, kv, "gpu", plan.spec, src.batch, plan.scale))
            elif src.piece is None:
                kv = self.pools[src.region][layer]
                parts.append(attend_torch(q, kv, region_layout(src.region), plan.spec, src.batch,
                                          plan.scale))
            else:
                kv = self.ring.acquire(layer, src.piece)
                parts.append(attend_torch(q, kv, "gpu", plan.spec, src.batch, plan.scale))
                self.ring.release(layer, src.piece)
        self.timings["gpu_s"] += time.perf_counter() - t0
        return parts

    def _finish_torch(self, g: Group, layer: int, job, parts, shape, device, deferred=(),
                      q=None):
        if deferred:
            parts = parts + self._torch_partials(layer, q, deferred)
        if job is not None:
            o, l = self._collect_cpu(job)
            o, l = o.to(device), l.to(device)
            if g.cpu_rows is not None:  # back to every row: (0, -inf) where no CPU block
                o, l = self._scatter_rows(g, o, l, shape[0])
            parts.append((o, l))
        if not parts:
            return _empty_result(shape[0], shape[1], self.plan.spec.v_dim, device)
        return merge_many(parts)

    def _scatter_rows(self, g: Group, o: torch.Tensor, l: torch.Tensor, nq: int, out=None):
        """The CPU side's partial over its compacted rows, as one over all ``nq`` rows."""
        if out is None:
            out = (torch.zeros((nq,) + tuple(o.shape[1:]), dtype=o.dtype, device=o.device),
                   torch.full((nq,) + tuple(l.shape[1:]), float("-inf"), dtype=l.dtype,
                              device=l.device))
        rows = g.cpu_rows_dev if o.device == self.device else g.cpu_rows
        out[0].index_copy_(0, rows, o)
        out[1].index_copy_(0, rows, l)
        return out

    def _cpu_extra(self, g: Group, xo: torch.Tensor, xl: torch.Tensor, nq: int):
        """The CPU result as the reduce's extra partial: read in place from pinned memory, or,
        when it covers only some rows, copied and scattered into per-step device buffers whose
        other rows stay (0, -inf) for every layer."""
        if g.cpu_rows is None:
            if self.cpu_result == "copy":
                xo = xo.to(self.device, non_blocking=True)
                xl = xl.to(self.device, non_blocking=True)
            return xo, xl
        xo = xo.to(self.device, non_blocking=True)
        xl = xl.to(self.device, non_blocking=True)
        g.full_extra = self._scatter_rows(g, xo, xl, nq, g.full_extra)
        return g.full_extra

    # ---- Triton backend (CUDA) ----
    def _tick(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _launch_triton(self, layer: int, q: torch.Tensor, g: Group) -> None:
        plan = self.plan
        spec = plan.spec
        nq, hq, _ = q.shape
        dv = spec.v_dim
        parity = layer & 1
        job = res = None
        if g.cpu:
            qc = q if g.cpu_rows is None else q.index_select(0, g.cpu_rows_dev)
            (q_host,) = self._pinned_bufs(("q", g.index), [tuple(qc.shape)], [qc.dtype], parity)
            q_host.copy_(qc, non_blocking=True)
            # the worker polls a pinned word the stream raises after the copy (no CUDA call in
            # the worker: see hostflag.ReadyFlags), sleeping, leaving its core to the kernel
            ready = stream_ready(self.device)
            ncpu = qc.shape[0]
            res = self._pinned_bufs(("x", g.index), [(ncpu, hq, dv), (ncpu, hq)],
                                    [torch.float32, torch.float32], parity)
            job = self._submit_cpu(layer, g, q_host, ready, res)
        if self._stage_plan is not None:
            self.ring.top_up()  # the rest of the copy window, while the CPU side works
        if not g.gpu_planned:
            # the GPU side's chunks and merge rows, once per step: made here, after the first
            # layer's CPU side has its queries, so that the CPU starts without waiting for them
            self._plan_triton(g)
            g.gpu_planned = True
        dtype = None
        for src in g.sources:
            dtype = self.pools[src.region].dtype
            break
        qk = q.to(dtype).contiguous() if dtype is not None else q
        nparts = max(1, g.num_chunks * g.qmax)
        parts = self._parts.get(g.index)
        if parts is None or parts[0].shape[0] < nparts or parts[0].shape[1:] != (hq, dv):
            parts = self._parts[g.index] = (
                torch.empty(nparts, hq, dv, dtype=torch.float32, device=self.device),
                torch.empty(nparts, hq, dtype=torch.float32, device=self.device))
        sources, deferred = self._now_and_at_finish(g)
        self._launch_partials(layer, g, sources, qk, parts)
        g.pending = (layer, job, res, parts, nq, hq, deferred, qk)

    def _launch_partials(self, layer: int, g: Group, sources: list, qk: torch.Tensor,
                         parts: tuple[torch.Tensor, torch.Tensor]) -> None:
        """The GPU side's partial results over ``sources`` into ``parts``; a staged T piece
        makes the stream wait for its copy (the timing events leave that wait out)."""
        from . import gpu as G
        plan = self.plan
        p_out, p_lse = parts
        ev = self._events
        timed = self._timed
        open_ev = None
        for src in sources:
            if src.gather is not None:
                kv = self.cgather.fetch(self.pools[Region.C][layer], src.gather)
            elif src.piece is None:
                kv = self.pools[src.region][layer]
            else:
                if open_ev is not None:
                    ev.append((open_ev, self._tick()))
                    open_ev = None
                kv = self.ring.acquire(layer, src.piece)
            if open_ev is None and timed:
                open_ev = self._tick()
            G.launch_partials(qk, kv, plan.spec, src.chunks, src.batch.kv_blocks,
                              src.batch.kv_lens, plan.scale, p_out, p_lse, g.qmax,
                              flags=self._launch_flags)
            if src.piece is not None:
                self.ring.release(layer, src.piece)
        if open_ev is not None:
            ev.append((open_ev, self._tick()))

    def _finish_triton(self, g: Group, layer: int, job, res, parts, nq: int, hq: int,
                       deferred: list = (), qk: torch.Tensor | None = None):
        from . import gpu as G
        if deferred:
            self._launch_partials(layer, g, deferred, qk, parts)
        p_out, p_lse = parts
        dv = self.plan.spec.v_dim
        extra = None
        if res is not None and self._device_wait and (job is None or isinstance(job, Signalled)):
            # the stream waits for the CPU's flag; this thread goes on to the next layer
            if job is not None:
                self._jobs.append(job.future)
            self._flags.wait(layer * MAX_GROUPS + g.index, self._step_id)
            extra = self._cpu_extra(g, *res, nq)
        elif job is not None:
            extra = self._cpu_extra(g, *self._collect_cpu(job), nq)
        out = torch.empty(nq, hq, dv, dtype=torch.float32, device=self.device)
        lse = torch.empty(nq, hq, dtype=torch.float32, device=self.device)
        try:
            G.launch_reduce(p_out, p_lse, g.row_ptr, g.row_idx, out, lse, extra,
                            flags=self._launch_flags)
        except ValueError:  # this Triton/driver cannot read pinned host memory in place
            if extra is None or extra[0].device.type == "cuda":
                raise
            self.cpu_result = "copy"
            extra = (extra[0].to(self.device, non_blocking=True),
                     extra[1].to(self.device, non_blocking=True))
            G.launch_reduce(p_out, p_lse, g.row_ptr, g.row_idx, out, lse, extra,
                            flags=self._launch_flags)
        return out, lse

    # ------------------------------------------------------------------------------------------
    def end_step(self, wait: bool = True) -> dict[str, float]:
        """Finish the step (waits for the device); returns ``{cpu_s, gpu_s, pcie_s, ...}``:
        CPU kernel seconds, GPU attention seconds (kernel time, not waits), copy-stream busy
        seconds, host seconds spent waiting for the CPU side, and the step's wall seconds.

        ``wait=False``: a step with no CPU jobs and no copy-stream work whose device work may
        still be running (the engine's overlapped decode steps): nothing is waited for, its GPU
        seconds are not measured (None), and the buffers it retired stay held until a step
        that waits."""
        if self.plan is None:  # not in a step (e.g. an aborted step that never began)
            return dict(self.timings)
        if not wait:
            if self._jobs or self._queued or self._stage_plan is not None or \
                    any(g.pending is not None for g in self._groups):
                raise RuntimeError("end_step(wait=False) on a step with CPU or copy work")
            self._events = []
            self.timings["gpu_s"] = None
            self.timings["step_s"] = time.perf_counter() - self._t0
            self._groups = []
            self.plan = None
            return dict(self.timings)
        if self.device.type == "cuda":
            wait_for_stream(self.device)
            if self._timed:
                self.timings["gpu_s"] += sum(a.elapsed_time(b) for a, b in self._events) / 1e3
            else:  # not measured this step: the planner keeps its GPU factor
                self.timings["gpu_s"] = None
        self._events = []
        jobs, self._jobs = self._jobs, []
        for g in self._groups:  # launched, never finished (an aborted step): wait for them too
            if g.pending is not None and isinstance(g.pending[1], Future):
                jobs.append(g.pending[1])
            g.pending = None
        errors = []
        if self._queued:
            self._queued = 0
            try:
                _, waited, kernel = self._queue.drain()
                self.timings["cpu_s"] += kernel
                self._lag["q_wait"] += waited
            except Exception as e:  # noqa: BLE001 - re-raised below, after the step is closed
                errors.append(e)
        for job in jobs:  # device-waited CPU layers: every one has finished by now
            try:
                self.timings["cpu_s"] += job.result()[2]
            except Exception as e:  # noqa: BLE001 - re-raised below, after the step is closed
                errors.append(e)
        if (jobs or errors) and self._flags is not None:
            try:
                self._flags.check()
            except RuntimeError as e:
                errors.append(e)
        self.timings["cpu_handoff_s"] = self._lag["handoff"]
        self.timings["cpu_q_wait_s"] = self._lag["q_wait"]
        self.timings["cpu_return_s"] = self._lag["return"]
        if self.ring is not None and self._stage_plan is not None:
            tl_ = getattr(self.ring.copier, "_timing", None)
            if tl_ and self._ev_start is not None:
                end = self._tick()
                end.synchronize()
                self.ring.last_copy().synchronize()  # (not the next step's units staged ahead)
                self.timings["dev_first_copy_s"] = self._ev_start.elapsed_time(tl_[0][0]) / 1e3
                self.timings["dev_last_copy_s"] = self._ev_start.elapsed_time(tl_[-1][1]) / 1e3
                self.timings["dev_end_s"] = self._ev_start.elapsed_time(end) / 1e3
            busy = self.ring.finish()
            self.timings["pcie_s"] = None if busy is None else self.timings["pcie_s"] + busy
            self.timings["pcie_bytes"] = float(self.ring.copier.bytes)
            self.timings["pcie_copies"] = float(self.ring.copier.copies)
        self.timings["step_s"] = time.perf_counter() - self._t0
        self._retired = []  # the device is done with this step's buffers
        self._groups = []
        self.plan = None
        self._stage_plan = None
        if errors:
            raise errors[0]
        return dict(self.timings)
