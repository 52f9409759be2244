"""Where CPU expert calls run and how their results are accounted for.

A call waited for by the launching thread runs on one Python worker (:func:`get_executor`); a
call the device waits for runs on the native job queue (:func:`get_native_queue`: no Python
between its inputs landing and its result) and raises a pinned flag (:func:`host_flags`, a slot
per :class:`~writescope.layers.cpu_experts.CpuExperts`). This module keeps the calls' books
for the engine: the experts they read (:func:`take_routed_bytes`), the marks that delimit a
deferred step's calls (:func:`mark`, :func:`settle`), their failures and kernel seconds at the
step's end (:func:`raise_pending_errors`) and, with ``WRITESCOPE_EXPERT_TIMELINE=1``, their
timing events (:func:`take_timeline`, :func:`take_host_timeline`)."""
from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import os
import threading
import time
from dataclasses import dataclass

import torch

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def get_executor() -> concurrent.futures.ThreadPoolExecutor:
    # one worker for all layers: layers run in order, and the kernel's OpenMP team is reused
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                from ..attention.hostflag import precise_naps, timer_slack_ns
                timer_slack_ns()  # a bad setting fails here, not in the worker's initializer
                _executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="writescope-cpu-experts",
                    initializer=precise_naps)
    return _executor


# The device, not the launching thread, waits for the CPU's result (attention/hostflag.py): one
# pinned flag array shared by every CpuExperts, a slot each; failures surface at the step's end
# through raise_pending_errors().
_flags = None
_flag_slots = 0
_MAX_LAYERS = 1024
# the last value raised per slot: it only grows, whichever CpuExperts holds the slot (slots are
# reused after _MAX_LAYERS instances), so a wait can never be met by an older instance's value
_flag_seq = [0] * _MAX_LAYERS
_pending: list[concurrent.futures.Future] = []
# pinned results the device reads in place (layers/pinned_read.py), kept from their step's end
# (raise_pending_errors) until the next step's: the engine's step end waits for the device
_kept: list[torch.Tensor] = []
_kept_prev: list[torch.Tensor] = []


class WsMoeJob(ctypes.Structure):
    """``WsMoeJob`` of ``csrc/cpu_experts.cpp``: one call's arguments for the native queue."""
    _fields_ = [("gu", ctypes.c_void_p), ("down", ctypes.c_void_p), ("wdtype", ctypes.c_int32),
                ("E", ctypes.c_int32), ("H", ctypes.c_int32), ("I", ctypes.c_int32),
                ("Hp", ctypes.c_int32), ("Ip", ctypes.c_int32), ("x", ctypes.c_void_p),
                ("N", ctypes.c_int32), ("ids", ctypes.c_void_p), ("tw", ctypes.c_void_p),
                ("k", ctypes.c_int32), ("out", ctypes.c_void_p), ("res", ctypes.c_void_p),
                ("res_dtype", ctypes.c_int32), ("isa", ctypes.c_int32),
                ("amx_min", ctypes.c_int32), ("nthreads", ctypes.c_int32),
                ("gus", ctypes.c_void_p), ("dns", ctypes.c_void_p), ("bo", ctypes.c_int32),
                ("bi", ctypes.c_int32), ("gum", ctypes.c_void_p), ("dnm", ctypes.c_void_p)]


# The device-waited calls run on a native job queue (attention/cpu.py's CpuJobQueue, a C++
# thread of its own): from the ready word to the done word no Python runs, so the worker never
# needs the interpreter lock. A Python worker does need it (to poll, to copy the result, to
# raise the flag), and a launching thread that holds it inside a blocking driver call (a lazy
# module load, a synchronising free: calls that wait for the device, which waits for this very
# result) deadlocks the step until the device's wait times out, layer after layer. Suspected
# cause of Qwen3-30B-A3B bench rows that never finished on the H200 (2026-12-01-h200, call 2).
# WRITESCOPE_CPU_EXPERT_QUEUE=python keeps the device waiting on the Python worker (to compare);
# a call that cannot go to the queue (no compiled kernel, float16) is waited for by the
# launching thread instead.
_native_queue = None
_native_queue_error: str | None = None
_native_pending = 0


def get_native_queue():
    global _native_queue, _native_queue_error
    if os.environ.get("WRITESCOPE_CPU_EXPERT_QUEUE", "native") == "python":
        return None
    if _native_queue is None and _native_queue_error is None:
        with _executor_lock:
            if _native_queue is None and _native_queue_error is None:
                try:
                    from ..attention.cpu import CpuJobQueue
                    _native_queue = CpuJobQueue()
                except Exception as e:  # noqa: BLE001 - no compiled queue: the Python worker
                    _native_queue_error = str(e)
    return _native_queue


def native_queue_error() -> str | None:
    """Why the native queue could not be made (None: made, or not tried yet)."""
    return _native_queue_error


def ready_spin_s() -> float:
    """``WRITESCOPE_CPU_EXPERT_SPIN_US``: how long the native queue's thread spins on a call's
    ready word before it naps 20 us at a time (default 0: 256 pauses, then naps)."""
    v = os.environ.get("WRITESCOPE_CPU_EXPERT_SPIN_US", "0")
    try:
        us = float(v)
    except ValueError:
        raise ValueError(f"WRITESCOPE_CPU_EXPERT_SPIN_US must be a number of microseconds, "
                         f"got {v!r}") from None
    if us < 0:
        raise ValueError(f"WRITESCOPE_CPU_EXPERT_SPIN_US must be >= 0, got {v!r}")
    return us * 1e-6


def device_wait_enabled(device: torch.device) -> bool:
    if device.type != "cuda" or os.environ.get("WRITESCOPE_CPU_WAIT", "device") == "host":
        return False
    from ..attention.gpu import triton_available
    return triton_available()


def host_flags(device: torch.device):
    global _flags
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    if _flags is None or _flags.device != device:
        from ..attention.hostflag import HostFlags
        _flags = HostFlags(_MAX_LAYERS, device)
    return _flags


#: the host routing ids of recent calls, with one expert's bytes: :func:`take_routed_bytes`
#: counts the experts they read (bounded: a caller that never takes keeps only the latest)
_routed: collections.deque = collections.deque(maxlen=4096)
#: kernel seconds of the calls that ran in Python threads (not on the native queue) since the
#: last :func:`raise_pending_errors`
_inline_s = 0.0
_inline_lock = threading.Lock()


#: calls appended to :data:`_routed` ever (those taken, or pushed out by its bound, are this
#: less its length)
_routed_total = 0
#: calls that did not go through a CUDA graph (:meth:`CpuExperts.submit`, host ``forward``)
_eager_calls = 0


def route(ids: torch.Tensor, per_expert: int) -> None:
    global _routed_total
    _routed.append((ids, per_expert))
    _routed_total += 1


def take_routed_bytes() -> int | None:
    """Expert weight bytes the calls since the last take read: per call, its distinct experts
    times one expert's bytes (what uniform routing only estimates). Call it once the calls are
    done (after :func:`raise_pending_errors`): their host copies of the ids have landed. None
    when no call ran."""
    if not _routed:
        return None
    total = 0
    while _routed:
        ids, per_expert = _routed.popleft()
        total += len(set(ids.view(-1).tolist()) - {-1}) * per_expert  # ~3 us a decode call
    return total


@dataclass(frozen=True)
class ExpertsMark:
    """The CPU expert calls made so far (:func:`mark`): a deferred step's calls are those
    between the marks around its launch; :func:`settle` closes them."""
    native: int  # calls submitted to the native queue
    routed: int  # calls whose routing :data:`_routed` holds


def mark() -> ExpertsMark:
    q = _native_queue
    return ExpertsMark(q.mark() if q is not None else 0, _routed_total)


def eager_calls() -> int:
    """Calls made outside a CUDA graph so far (a step that made one cannot be deferred)."""
    return _eager_calls


def settle(upto: ExpertsMark) -> float | None:
    """A deferred decode step's CPU expert calls (all graphed: ``upto`` is the mark at the end of
    its launch), once its tokens have come back: wait for the calls before ``upto`` on the
    native queue and re-raise the first failure among them, leaving the calls of the step
    launched since (in flight) running. Returns their kernel seconds (None: none ran). Their
    routing is dropped, not counted: the next step's replay may already have overwritten the
    pinned ids it points into. The device's own give-up status is not read here (reading it
    would wait for the step in flight); the next full :func:`raise_pending_errors` reads it."""
    global _native_pending, last_queue_stats
    while _routed and _routed_total - len(_routed) < upto.routed:
        _routed.popleft()
    q = _native_queue
    if q is None or _native_pending == 0:
        return None
    try:
        st = q.drain(upto=upto.native)
    except Exception as e:  # noqa: BLE001 - re-raised as the step's failure (the count is
        # left as it was: the next full drain covers whatever is still queued)
        raise RuntimeError(f"CPU expert call failed: {e} (-1: an expert id out of range, -2: a "
                           "bad argument, -10: the inputs never came)") from e
    _native_pending = max(0, _native_pending - st[0])
    last_queue_stats = st
    return st[2] if st[0] else None


#: ``WRITESCOPE_EXPERT_TIMELINE=1``: each device-waited call records two timing events on the
#: stream -- its inputs copied (just before its ready word is raised) and the device past its
#: wait for the result -- that :func:`take_timeline` hands out (``bench.step_profile
#: --timeline`` splits a step with them); off by default (no events recorded)
_timeline: list = []
_TIMELINE_MAX = 1 << 16  # calls kept until a take (a run nobody takes from keeps no more)
#: the native queue's figures at the last drain: (calls, seconds waiting for inputs, kernel s)
last_queue_stats: tuple[int, float, float] | None = None


def timeline_on() -> bool:
    return os.environ.get("WRITESCOPE_EXPERT_TIMELINE", "0") == "1"


#: per device-waited native call (timeline on): the launching thread's (submit entered, job
#: pushed, wait entered) on time.perf_counter's clock
_host_marks: list = []


def take_host_timeline() -> list[dict]:
    """The native calls since the last take (``WRITESCOPE_EXPERT_TIMELINE`` on), oldest first,
    each with the launching thread's times (``enter``: submit called, ``pushed``: the job queued,
    ``wait``: wait called) and the queue thread's (``popped``, ``ready``: the inputs seen, the
    kernel starts, ``done``), all seconds on :func:`time.perf_counter`'s clock. Empty when the
    queue ran other calls too (graphed calls' host halves have no launching-thread times)."""
    global _host_marks
    marks, _host_marks = _host_marks, []
    q = _native_queue.times() if _native_queue is not None else []
    if len(q) != len(marks):
        return []
    return [dict(enter=m[0], pushed=m[1], wait=m[2], popped=t[0], ready=t[1], done=t[2])
            for m, t in zip(marks, q)]


#: per call of the last :func:`take_timeline`: milliseconds from the result seen to the result
#: on the device (its copy or in-place read), or None where that was not marked
last_result_ms: list = []


def take_timeline() -> list[tuple[float, float]]:
    """The device-waited calls since the last take, in order, as ``(ready, seen)`` milliseconds
    on the device's clock relative to the first call's ready event (``WRITESCOPE_EXPERT_TIMELINE``
    on; synchronises with the last event). Empty when off or when no call ran. Each call's time
    from its result seen to its result on the device goes to :data:`last_result_ms`."""
    global _timeline, last_result_ms
    marks, _timeline = _timeline, []
    if not marks:
        last_result_ms = []
        return []
    last = marks[-1]
    (last[2] if last[2] is not None else last[1]).synchronize()
    t0 = marks[0][0]
    last_result_ms = [b.elapsed_time(c) if c is not None else None for _, b, c in marks]
    return [(t0.elapsed_time(a), t0.elapsed_time(b)) for a, b, _ in marks]


def raise_pending_errors() -> float | None:
    """Once the step is enqueued: wait for the CPU expert calls the device waits for, re-raise
    the first failure among them (and a device wait that gave up), clear the pending list.
    Returns the kernel seconds of the calls that ran on the native queue or inline (the planner
    corrects its experts' rate with them), or None when none did."""
    global _pending, _native_pending, _inline_s, last_queue_stats, _kept, _kept_prev
    jobs, _pending = _pending, []
    _kept_prev, _kept = _kept, []  # the step before's are read by now; this step's not yet
    native, _native_pending = _native_pending, 0
    errors = []
    for f in jobs:
        try:
            f.result()
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    with _inline_lock:
        kernel_s, _inline_s = _inline_s or None, 0.0
    if native and _native_queue is not None:
        try:
            last_queue_stats = _native_queue.drain()
            kernel_s = (kernel_s or 0.0) + last_queue_stats[2]
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(RuntimeError(f"CPU expert call failed: {e} (-1: an expert id out of "
                                       f"range, -2: a bad argument, -10: the inputs never came)"))
    if (jobs or native) and _flags is not None:
        try:
            _flags.check()
        except RuntimeError as e:
            errors.append(e)
    if native:
        from . import cpu_experts_graph
        try:
            cpu_experts_graph.check()
        except RuntimeError as e:
            errors.append(e)
    if errors:
        raise errors[0]
    return kernel_s


# ---------------------------------------------------------------------------------------------
# the books kept for CpuExperts' calls
# ---------------------------------------------------------------------------------------------
def new_flag_slot() -> int:
    """A new CpuExperts' slot in the flag array (slots are reused after ``_MAX_LAYERS``)."""
    global _flag_slots
    slot = _flag_slots % _MAX_LAYERS
    _flag_slots += 1
    return slot


def next_flag_value(slot: int) -> int:
    """The value the next device-waited call of ``slot`` raises its flag to."""
    _flag_seq[slot] += 1
    return _flag_seq[slot]


def count_eager_call() -> None:
    """A call made outside a CUDA graph (see :func:`eager_calls`)."""
    global _eager_calls
    _eager_calls += 1


def count_native_call() -> None:
    """A call queued on the native queue (drained by :func:`settle` or
    :func:`raise_pending_errors`)."""
    global _native_pending
    _native_pending += 1


def add_inline_seconds(s: float) -> None:
    """Kernel seconds of a call that ran in a Python thread (worker or launching thread)."""
    global _inline_s
    with _inline_lock:
        _inline_s += s


def note_wait_entered(host: tuple) -> None:
    """Timeline on: the launching thread's (submit entered, job pushed) times of a native call,
    with the time its wait was entered (:func:`take_host_timeline`)."""
    if len(_host_marks) < _TIMELINE_MAX:
        _host_marks.append((*host, time.perf_counter()))


def note_result_seen(inputs_event) -> list | None:
    """Timeline on: a timing event on the stream past the device's wait for a call whose inputs
    were marked by ``inputs_event`` (:func:`take_timeline`); returns the call's entry for
    :func:`note_result_landed` (None past the timeline's cap)."""
    if len(_timeline) < _TIMELINE_MAX:
        seen = torch.cuda.Event(enable_timing=True)
        seen.record()
        entry = [inputs_event, seen, None]
        _timeline.append(entry)
        return entry
    return None


def note_result_landed(entry: list | None) -> None:
    """Timeline on: a timing event on the stream once the call of ``entry`` (from
    :func:`note_result_seen`) has its result on the device."""
    if entry is not None:
        landed = torch.cuda.Event(enable_timing=True)
        landed.record()
        entry[2] = landed


def keep_until_read(t: torch.Tensor) -> None:
    """A pinned result the device reads in place, in stream order: kept alive until the end of
    the step after this one's (see ``_kept``), so that torch's pinned allocator cannot hand its
    memory to a later call before the device has read it."""
    _kept.append(t)


def defer_result(future: concurrent.futures.Future) -> None:
    """A Python worker's call the device waits for: its failure is raised at the step's end."""
    _pending.append(future)
