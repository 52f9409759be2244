"""Flags in page-locked host memory that the GPU waits on: a CPU thread hands work to the device
stream without the launching thread ever blocking.

The hybrid step's CPU side finishes a layer while the launching thread is already enqueuing later
layers. Instead of that thread waiting for the CPU (which also makes it wait for the GPU to reach
the layer, so launch time and device time add up), the stream runs a one-program Triton kernel
that spins on a pinned host word until the CPU thread has written the layer's step number into
it; the kernels after it (the merge reading the CPU's result in place) then run in stream order.
This is the device-side wait of CUDA's ``cuStreamWaitValue64``, written as a kernel so that it
can time out (the driver call itself, reached through ctypes, is the ``"memop"`` mode).

* Values only grow (the caller's step counter), so a flag never needs resetting.
* The spin gives up after ``max_spins`` reads and records that in a device word; :meth:`check` (after
  the stream has been synchronised) raises then, so a lost CPU result is an error, never a hang.
* The CPU side must :meth:`signal` even when its work failed (the caller then raises the error).
* ``WRITESCOPE_HOSTFLAG_READ`` picks how the spin reads the flag (:data:`READ_MODES`; measured
  on the H200 by ``python -m writescope.bench.hostflag``), ``WRITESCOPE_HOSTFLAG_MAX_SPINS`` its
  time-out in spins.

The other direction -- a host thread waiting for the device -- never spins either. A CPU job's
worker waits for its inputs with :func:`stream_ready`: the stream raises a pinned word once the
inputs are copied (:class:`ReadyFlags`) and the worker polls it, sleeping, with no CUDA call of its
own (a CUDA call there could queue behind a driver call of the launching thread that waits for
the device, which waits for this worker: a deadlock until the time-out, seen once in the GPU
tests). The launching thread waits for the end of a step with :func:`wait_for_stream`, an event
created with ``cudaEventBlockingSync``. A spinning waiter takes a core from the CPU kernels'
OpenMP team, and one descheduled team member stalls the whole parallel region for a scheduler
time slice: on the 2-core dev machine one busy process took a 38 MB CPU attention call (one
DeepSeek-V2-Lite layer at batch 4 x 8K) from 3.9 ms to 7.5 ms at p50 and 27 ms at p90
(``python -m writescope.bench.cpu_contention``). ``WRITESCOPE_BLOCKING_SYNC=0`` restores CUDA's
default (spinning) waits; ``WRITESCOPE_READY=event`` makes workers wait on events again.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import warnings

import numpy as np
import torch

from .launch import raw_stream


def timer_slack_ns() -> int | None:
    """``WRITESCOPE_TIMER_SLACK_NS``: the timer slack of the threads that wait for the device in
    naps (default 1000 ns; ``default``: None, Linux's own 50 us stays)."""
    v = os.environ.get("WRITESCOPE_TIMER_SLACK_NS", "1000").strip()
    if v == "default":
        return None
    try:
        ns = int(v)
    except ValueError:
        ns = 0
    if ns <= 0:
        raise ValueError(f"WRITESCOPE_TIMER_SLACK_NS must be a positive number of nanoseconds "
                         f"or 'default', got {v!r}")
    return ns


def precise_naps() -> None:
    """Give the calling thread :func:`timer_slack_ns` of timer slack (Linux; elsewhere nothing).

    Linux lets a sleep end late by up to its thread's slack, 50 us by default: a 20 us nap took
    93 us on the dev VM, 47 us with 1 us of slack. The threads that poll a ready word in naps --
    the native job queue's (which sets it itself, ``precise_naps`` in csrc/attn_ops.cpp) and the
    Python CPU workers', which call this when they start -- otherwise begin a layer's CPU work
    up to ~70 us after the device raised the word. Threads take their creator's slack."""
    ns = timer_slack_ns()
    if ns is None or not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, ctypes.c_ulong(ns), 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


#: spin iterations before the device gives up (one iteration is one PCIe read, ~1-2 us)
DEFAULT_MAX_SPINS = 20_000_000


#: how the device waits: a Triton spin reading the flag with ``ld.acquire.sys`` ("acquire",
#: inline PTX: a system-scope load that must observe the host's store), Triton's volatile load
#: ("volatile") or the ``.cv`` "fetch again" cache operator ("cv"); or "memop": the driver's
#: ``cuStreamWaitValue64`` (no SM spins, but no time-out either)
READ_MODES = ("acquire", "volatile", "cv", "memop")


@functools.lru_cache(maxsize=None)
def _stream_memop(name: str):
    """The driver's ``cuStream{Wait,Write}Value64`` (``name``: "Wait" or "Write"), through ctypes:
    ``(stream, address, value, flags) -> CUresult``."""
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1")
    fn = getattr(lib, f"cuStream{name}Value64_v2", None) or getattr(lib, f"cuStream{name}Value64")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


@functools.lru_cache(maxsize=None)
def _store_kernel():
    import triton
    import triton.language as tl

    # one compilation for every slot and value (no specialisation on 16-byte alignment or on 1)
    @triton.jit(do_not_specialize=["FLAG", "value"])
    def store_kernel(FLAG, value):
        tl.store(FLAG, value)

    del triton
    from .launch import FastLaunch
    return FastLaunch(store_kernel)


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _read(FLAG, MODE: tl.constexpr):
        if MODE == 0:
            v = tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [FLAG],
                                          dtype=tl.int64, is_pure=False, pack=1)
        elif MODE == 1:
            v = tl.load(FLAG, volatile=True)
        else:
            v = tl.load(FLAG, cache_modifier=".cv")
        return v

    # one compilation for every slot and value, as the store kernel: ``expected`` is the step's
    # number (hybrid.py) or a call's sequence number (cpu_experts.py), and a specialisation on
    # 16 | value compiled a second kernel at the 16th step of every process -- one decode step
    # of ~60 ms among steps of ~20 (DeepSeek-V2-Lite shared-prefix rows, 2026-12-06h calls 1
    # and 2); a flag slot's address is 16-byte aligned for every other slot
    @triton.jit(do_not_specialize=["FLAG", "expected"])
    def wait_kernel(FLAG, STATUS, expected, max_spins, MODE: tl.constexpr, RESET: tl.constexpr):
        v = _read(FLAG, MODE)
        i = 0
        while (v < expected) & (i < max_spins):
            v = _read(FLAG, MODE)
            i += 1
        if v < expected:
            tl.store(STATUS, 1)
        elif RESET:  # seen: back to 0 for the next round (a graphed call's done word)
            tl.store(FLAG, 0)

    del triton
    from .launch import FastLaunch
    return FastLaunch(wait_kernel)


def blocking_sync() -> bool:
    return os.environ.get("WRITESCOPE_BLOCKING_SYNC", "1") not in ("0", "false", "no", "off")


def host_event() -> "torch.cuda.Event":
    """An event a host thread will wait on (sleeping, see the module docstring)."""
    return torch.cuda.Event(blocking=blocking_sync())


def wait_for_stream(device: torch.device) -> None:
    """Wait (sleeping) until the work queued so far on ``device``'s current stream is done."""
    if not blocking_sync():
        torch.cuda.current_stream(device).synchronize()
        return
    ev = host_event()
    ev.record(torch.cuda.current_stream(device))
    ev.synchronize()


#: how a host thread learns that the stream has reached a point (the inputs of a CPU job are in
#: pinned memory): "flag" (default) -- the stream writes a pinned word (``cuStreamWriteValue64``)
#: that the thread polls with no CUDA call of its own; "event" -- a blocking-sync CUDA event
READY_MODES = ("flag", "event")

#: seconds a host thread polls a ready flag before it gives up (the device never got there)
READY_TIMEOUT_S = 120.0


class Ready:
    """Waits, in a host thread, for the stream to have passed one :meth:`ReadyFlags.post`."""

    __slots__ = ("_view", "_i", "_value", "_addr")

    def __init__(self, view, i: int, value: int, addr: int | None = None):
        self._view, self._i, self._value, self._addr = view, i, value, addr

    @property
    def address(self) -> tuple[int, int] | None:
        """``(address of the word, value to reach)``, for a native waiter (None if unknown)."""
        return None if self._addr is None else (self._addr, self._value)

    def query(self) -> bool:
        return int(self._view[self._i]) >= self._value

    def synchronize(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll the flag: a short spin, then 20 us sleeps (the core stays free for the kernels)."""
        view, i, value = self._view, self._i, self._value
        for _ in range(64):
            if view[i] >= value:
                return
        deadline = time.monotonic() + timeout
        while view[i] < value:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the device did not reach ready flag {i} (value {value}) in "
                                   f"{timeout:.0f} s")
            time.sleep(2e-5)


class ReadyFlags:
    """Pinned int64 words the device stream writes and host threads poll (device -> host).

    Why not a CUDA event: a host thread that calls into CUDA (``cudaEventSynchronize``) while the
    stream is held by a device-side wait for that same thread's result can deadlock: when the
    launching thread meanwhile makes a driver call that needs the device idle (a lazily loaded
    module -- CUDA's default ``CUDA_MODULE_LOADING=LAZY`` -- or a synchronising free), the
    waiting thread's CUDA call queues behind it and never returns. Polling a word needs no CUDA
    call. Slots are used round-robin; values per slot only grow, so a reused slot can never
    satisfy a wait early (all posts of one device go through one stream order)."""

    def __init__(self, device: torch.device, n: int = 4096):
        self.device = torch.device(device)
        self.flags = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self._view = self.flags.numpy()
        self._values = [0] * n
        self._next = 0
        self._memop = True

    def post(self) -> Ready:
        """Enqueue on the current stream: the next slot's word is raised once the work queued so
        far is done. Returns what a host thread waits on."""
        i = self._next
        self._next = (i + 1) % len(self._values)
        self._values[i] += 1
        value = self._values[i]
        ptr = self.flags.data_ptr() + 8 * i
        if self._memop:
            stream = raw_stream(self.device)
            try:
                rc = _stream_memop("Write")(stream, ptr, value, 0)
            except (OSError, AttributeError):
                rc = -1
            if rc != 0:  # no stream memory operations here: a one-thread store kernel instead
                self._memop = False
        if not self._memop:
            _store_kernel()[(1,)](self.flags[i:], value, num_warps=1)
        return Ready(self._view, i, value, ptr)


_ready_flags: dict = {}


def ready_mode() -> str:
    mode = os.environ.get("WRITESCOPE_READY", "flag")
    if mode not in READY_MODES:
        raise ValueError(f"WRITESCOPE_READY must be one of {READY_MODES}, got {mode!r}")
    return mode


def stream_ready(device: torch.device):
    """Something with ``synchronize()`` that returns in a host thread once the work queued so far
    on ``device``'s current stream is done (see :class:`ReadyFlags`)."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    flags = _ready_flags.get(device)
    if ready_mode() != "event" and flags is not False:
        try:
            if flags is None:
                flags = _ready_flags[device] = ReadyFlags(device)
            return flags.post()
        except Exception as e:  # noqa: BLE001 - no memops and no Triton here: events then
            _ready_flags[device] = False
            warnings.warn(f"ready flags unavailable on {device} ({type(e).__name__}: {e}); CPU "
                          "workers wait on CUDA events instead", RuntimeWarning, stacklevel=2)
    ev = host_event()
    ev.record()
    return ev


class HostFlags:
    """``n`` int64 flags in pinned host memory, waited on by ``device``'s current stream."""

    def __init__(self, n: int, device: torch.device, max_spins: int | None = None,
                 read: str | None = None):
        read = read or os.environ.get("WRITESCOPE_HOSTFLAG_READ", "acquire")
        if read not in READ_MODES:
            raise ValueError(f"read must be one of {READ_MODES}, got {read!r}")
        self.mode = READ_MODES.index(read)
        if max_spins is None:
            max_spins = int(os.environ.get("WRITESCOPE_HOSTFLAG_MAX_SPINS", DEFAULT_MAX_SPINS))
        self.device = torch.device(device)
        self.flags = torch.zeros(max(1, n), dtype=torch.int64, pin_memory=True)
        self._view = self.flags.numpy()  # writes from the CPU thread go straight to the page
        self.status = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.max_spins = int(max_spins)
        self._views: dict = {}  # flag i's view, made once: a wait a layer slices no tensor
        self._bound: dict = {}  # the wait kernel bound per reset (launch.FastLaunch.bind)

    def address(self, i: int) -> int:
        """Host address of flag ``i`` (a native caller may store into it, see ``signal``)."""
        return self.flags.data_ptr() + 8 * i

    def signal(self, i: int, value: int) -> None:
        """From the CPU thread, after its results are written: flag ``i`` reaches ``value``."""
        np.copyto(self._view[i:i + 1], value)

    def wait(self, i: int, value: int, reset: bool = False) -> None:
        """Enqueue on the current stream: nothing after this runs before flag ``i >= value``.
        ``reset``: the device then stores 0 into the flag (not with the driver's memop)."""
        if self.mode == 3:
            if reset:
                raise ValueError("a reset after the wait needs the wait kernel, not the memop")
            stream = raw_stream(self.device)
            rc = _stream_memop("Wait")(stream, self.flags.data_ptr() + 8 * i, int(value), 0)  # GEQ
            if rc != 0:
                raise RuntimeError(f"cuStreamWaitValue64 failed (CUresult {rc})")
            return
        view = self._views.get(i)
        if view is None:
            view = self._views[i] = self.flags[i:]
        bound = self._bound.get(bool(reset))
        if bound is None:
            bound = self._bound[bool(reset)] = _kernel().bind(MODE=self.mode, RESET=bool(reset),
                                                              num_warps=1)
        bound[(1,)](view, self.status, int(value), self.max_spins)

    def check(self) -> None:
        """After the stream is synchronised: raise if a wait gave up."""
        if int(self.status.item()):
            self.status.zero_()
            raise RuntimeError("the GPU gave up waiting for the CPU attention result "
                               f"(spun {self.max_spins} times); the CPU worker stalled")
