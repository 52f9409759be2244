"""The CPU side of hybrid attention: one layer's CPU job, where it runs, and how it is collected.

:class:`CpuSide` is the part of :class:`~writescope.attention.hybrid.HybridAttention` that hands
a layer's CPU blocks to the CPU: to the native job queue (``cpu.CpuJobQueue``, a C++ thread that
needs no GIL between layers; the device waits for its flag), to a Python worker thread, or
inline, and collects the result. The compiled kernel's calls are planned once per step per
group (:meth:`CpuSide._make_cpu_plans`) and run per layer.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..kvcache.regions import Region
from .groups import MAX_GROUPS, Group
from .hostflag import precise_naps, timer_slack_ns
from .merge import merge_many
from .torch_paged import attend_torch


def pair_calls() -> bool:
    """``WRITESCOPE_CPU_PAIR_CALLS`` (default on; ``0`` off): a layer whose CPU side reads two
    regions (C blocks, and T blocks read in place) runs them as one kernel call
    (``CpuAttentionPlan(second=...)``) rather than two calls and a merge job, so a layer pays
    one team start, tail and join. On the H200 the two forms measured the same (DeepSeek-V2-Lite
    4 x 128K, 2026-12-03f call 3). The switch is for A/B runs."""
    value = os.environ.get("WRITESCOPE_CPU_PAIR_CALLS", "1").strip().lower()
    return value not in ("0", "off", "false", "no")


@dataclass
class Signalled:
    """A CPU job on the Python worker that raises the layer's flag itself (the device waits)."""
    future: Future


def region_layout(region: Region) -> str:
    """The layout a region's pool is in: ``"cpu"`` (C, token pairs interleaved) or ``"gpu"``."""
    return "cpu" if region is Region.C else "gpu"


def cpu_kernel():
    """The CPU attention kernel (compiled when possible), or the torch path."""
    try:
        from .cpu import attend_cpu
        return attend_cpu
    except ImportError:
        return attend_torch


def ready_address(ready) -> tuple[int, int] | None:
    """A ready flag's ``(address, value)`` for a native waiter, or None (e.g. a CUDA event)."""
    return getattr(ready, "address", None)


class CpuSide:
    """The CPU-side methods of :class:`~writescope.attention.hybrid.HybridAttention` (whose
    ``__init__`` sets the state they use: ``pools``, ``plan``, ``cpu_threads``, the worker, the
    queue, the flags, ``timings`` and the step's lags)."""

    def _pool_worker(self) -> ThreadPoolExecutor:
        if self._worker is None:
            n = int(self.cpu_threads) if self.cpu_threads else 0
            before = torch.get_num_threads()
            timer_slack_ns()  # a bad setting fails here, not in the worker's initializer

            def init():
                precise_naps()
                if n:
                    torch.set_num_threads(n)
                    # a thread takes torch's process default at its first parallel op: take
                    # it now, while the default is n
                    torch.ones(1 << 17).sum()
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="ws-cpu-attn",
                                              initializer=init)
            if n and n != before:
                # torch.set_num_threads sets the calling thread's OpenMP team size and also
                # the process's default, which every thread that starts parallel work later
                # takes: start the worker now, then put the default back from this thread.
                # The worker keeps its own team size.
                self._worker.submit(int).result()
                torch.set_num_threads(before)
        return self._worker

    def _cpu_job_signalled(self, step_id: int, layer: int, g: Group, q_host, ready, out_bufs,
                           t_submit):
        """The CPU side of one layer when the device waits for it: the flag is raised whatever
        happens (a failure is re-raised at :meth:`end_step`, after the device has gone on). With
        the compiled kernel the ready wait, the kernel and the flag's store are one native call
        (``CpuAttentionPlan(..., ready=, done=)``): the GIL this thread would otherwise need
        between them may be held by the launching thread."""
        slot = layer * MAX_GROUPS + g.index
        try:
            return self._cpu_job(layer, g, q_host, ready, out_bufs, t_submit,
                                 done=(self._flags.address(slot), step_id))
        finally:
            self._flags.signal(slot, step_id)

    def _cpu_job(self, layer: int, g: Group, q_host: torch.Tensor, ready, out_bufs,
                 t_submit=None, done=None):
        t_in = time.perf_counter()
        self._lag["handoff"] += t_in - (t_submit or t_in)
        plan = self.plan
        if self._cpu_compiled:
            self._make_cpu_plans(g, q_host)
        native = (self._cpu_compiled and len(g.cpu_plans) == 1 and out_bufs is not None
                  and g.cpu_plans[0][1].flagged)
        if native and done is not None and (ready is None or ready_address(ready) is not None):
            # wait for the queries, attend into the pinned buffers, raise the flag: one call
            r, pl = g.cpu_plans[0]
            times = [0.0, 0.0]
            o, l = pl(q_host, self.pools[r][layer], out_bufs[0], out_bufs[1],
                      ready=ready_address(ready), done=done, times=times)
            self._lag["q_wait"] += times[0]
            self._lag["t_done"] = time.perf_counter()
            return o, l, times[1]
        if ready is not None:
            ready.synchronize()
        t0 = time.perf_counter()
        self._lag["q_wait"] += t0 - t_in
        if native:  # straight into pinned
            r, pl = g.cpu_plans[0]
            o, l = pl(q_host, self.pools[r][layer], out_bufs[0], out_bufs[1])
            t1 = time.perf_counter()
            self._lag["t_done"] = t1
            return o, l, t1 - t0
        if self._cpu_compiled and g.cpu_paired:
            (r, pl), (r2, pl2) = g.cpu_plans
            parts = [pl(q_host, self.pools[r][layer], second=(pl2, self.pools[r2][layer]))]
        elif self._cpu_compiled:
            parts = [pl(q_host, self.pools[r][layer]) for r, pl in g.cpu_plans]
        else:
            parts = [self._cpu_attend(q_host, self.pools[r][layer], region_layout(r), plan.spec, b,
                                      plan.scale) for r, b in g.cpu]
        o, l = parts[0] if len(parts) == 1 else merge_many(parts)
        if out_bufs is not None:
            out_bufs[0].copy_(o)
            out_bufs[1].copy_(l)
            o, l = out_bufs
        t1 = time.perf_counter()
        self._lag["t_done"] = t1
        return o, l, t1 - t0

    def _make_cpu_plans(self, g: Group, q_host: torch.Tensor) -> None:
        """The group's compiled-kernel calls, checked and converted once per step (on whichever
        thread attends its first layer)."""
        if g.cpu_plans is None:
            from .cpu import CpuAttentionPlan
            plan = self.plan
            g.cpu_plans = [(r, CpuAttentionPlan(self.pools[r][0], region_layout(r), plan.spec, b,
                                                plan.scale, q_host.shape[0], q_host.shape[1],
                                                q_host.dtype, threads=self.cpu_threads or None))
                           for r, b in g.cpu]
            g.cpu_paired = (len(g.cpu_plans) == 2 and pair_calls()
                            and g.cpu_plans[0][1].pairs_with(g.cpu_plans[1][1]))

    def queue_times(self) -> list[tuple[float, float]]:
        """The native job queue's kernel intervals ``(start, end)`` since the last take (its
        ``CpuJobQueue.times``), on :func:`time.perf_counter`'s clock; none before the queue's
        first use or where the CPU side runs otherwise."""
        return [(t[1], t[2]) for t in self._queue.times()] if self._queue is not None else []

    def _native_submit(self, layer: int, g: Group, q_host, ready, out_bufs) -> bool:
        """Hand one layer's CPU side to the native job queue (``cpu.CpuJobQueue``) when it can
        run there: the device waits for it, the compiled kernel attends one region straight
        into the pinned buffers, the ready flag is a pinned word. The step's plans are made here,
        on the launching thread, at the group's first layer."""
        if not (self._device_wait and self._cpu_compiled and self._use_queue
                and out_bufs is not None and ready_address(ready) is not None
                and q_host.dtype in (torch.float32, torch.bfloat16) and q_host.is_contiguous()):
            return False
        self._make_cpu_plans(g, q_host)
        if len(g.cpu_plans) not in (1, 2) or not all(pl.flagged for _, pl in g.cpu_plans):
            return False
        if self._queue is None:
            from .cpu import CpuJobQueue
            self._queue = CpuJobQueue()
        slot = layer * MAX_GROUPS + g.index
        done = (self._flags.address(slot), self._step_id)
        (r, pl), *second = g.cpu_plans
        # C blocks and T blocks read in place, paired: one call over both pools
        paired = (second[0][1], self.pools[second[0][0]][layer]) if g.cpu_paired else None
        self._queue.submit(pl, q_host, self.pools[r][layer], out_bufs[0], out_bufs[1],
                           ready=ready_address(ready), done=done if paired or not second else None,
                           spin_s=self.cpu_spin_s, second=paired)
        if second and paired is None:
            # C blocks and T blocks read in place: two calls on the queue's thread, the second
            # into host scratch, merged into the pinned result before the flag goes up (with a
            # Python worker instead, this step ran its CPU side at half the rate: 2026-12-01-h200)
            (r2, pl2), = second
            o2, l2 = torch.empty_like(out_bufs[0]), torch.empty_like(out_bufs[1])
            self._queue.submit(pl2, q_host, self.pools[r2][layer], o2, l2, ready=None, done=None)
            self._queue.submit_merge(out_bufs[0], out_bufs[1], o2, l2, done=done)
        self._queued += 1
        return True

    def _submit_cpu(self, layer: int, g: Group, q_host, ready, out_bufs
                    ) -> Signalled | Future | tuple | None:
        """Start one layer's CPU side: None when it went to the native queue (the device waits
        for its flag; :meth:`end_step` collects its times), a :class:`Signalled` job the device
        also waits for, else a Future or, run inline, its ``(out, lse, seconds)`` -- collected
        by the launching thread."""
        if self._native_submit(layer, g, q_host, ready, out_bufs):
            return None
        if self._device_wait and self._python_device_wait:
            return Signalled(self._pool_worker().submit(
                self._cpu_job_signalled, self._step_id, layer, g, q_host, ready, out_bufs,
                time.perf_counter()))
        # No native path for this layer (no compiled kernel, queries to convert, ...): the
        # launching thread collects the result itself. A device wait on a Python worker can
        # deadlock: the worker needs the GIL, which the launching thread may hold inside a
        # driver call that waits for the device (seen with CPU experts: 2026-12-01-h200).
        if self.cpu_async or self._device_wait:
            return self._pool_worker().submit(self._cpu_job, layer, g, q_host, ready, out_bufs,
                                              time.perf_counter())
        return self._cpu_job(layer, g, q_host, ready, out_bufs)

    def _collect_cpu(self, job) -> tuple[torch.Tensor, torch.Tensor]:
        t = time.perf_counter()
        o, l, dt = job.result() if isinstance(job, Future) else job
        t1 = time.perf_counter()
        self.timings["cpu_wait_s"] += t1 - t
        self._lag["return"] += t1 - self._lag["t_done"]
        self.timings["cpu_s"] += dt
        return o, l
