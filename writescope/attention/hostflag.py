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

The other direction -- a host thread waiting for the device -- goes through :func:`host_event`
and :func:`wait_for_stream`: events created with ``cudaEventBlockingSync``, so the waiting thread
sleeps instead of spinning on a core. A spinning waiter takes a core from the CPU kernels' OpenMP
team, and one descheduled team member stalls the whole parallel region for a scheduler time
slice: on the 2-core dev machine one busy process took a 38 MB CPU attention call (one
DeepSeek-V2-Lite layer at batch 4 x 8K) from 3.9 ms to 7.5 ms at p50 and 27 ms at p90
(``python -m writescope.bench.cpu_contention``). ``WRITESCOPE_BLOCKING_SYNC=0`` restores CUDA's
default (spinning) waits.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import torch

#: spin iterations before the device gives up (one iteration is one PCIe read, ~1-2 us)
DEFAULT_MAX_SPINS = 20_000_000


#: how the device waits: a Triton spin reading the flag with ``ld.acquire.sys`` ("acquire",
#: inline PTX: a system-scope load that must observe the host's store), Triton's volatile load
#: ("volatile") or the ``.cv`` "fetch again" cache operator ("cv"); or "memop": the driver's
#: ``cuStreamWaitValue64`` (no SM spins, but no time-out either)
READ_MODES = ("acquire", "volatile", "cv", "memop")


@functools.lru_cache(maxsize=None)
def _wait_value64():
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1")
    fn = getattr(lib, "cuStreamWaitValue64_v2", None) or lib.cuStreamWaitValue64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


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

    @triton.jit
    def wait_kernel(FLAG, STATUS, expected, max_spins, MODE: tl.constexpr):
        v = _read(FLAG, MODE)
        i = 0
        while (v < expected) & (i < max_spins):
            v = _read(FLAG, MODE)
            i += 1
        if v < expected:
            tl.store(STATUS, 1)

    del triton
    return wait_kernel


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

    def signal(self, i: int, value: int) -> None:
        """From the CPU thread, after its results are written: flag ``i`` reaches ``value``."""
        np.copyto(self._view[i:i + 1], value)

    def wait(self, i: int, value: int) -> None:
        """Enqueue on the current stream: nothing after this runs before flag ``i >= value``."""
        if self.mode == 3:
            stream = torch.cuda.current_stream(self.device).cuda_stream
            rc = _wait_value64()(stream, self.flags.data_ptr() + 8 * i, int(value), 0)  # GEQ
            if rc != 0:
                raise RuntimeError(f"cuStreamWaitValue64 failed (CUresult {rc})")
            return
        _kernel()[(1,)](self.flags[i:], self.status, int(value), self.max_spins, MODE=self.mode,
                        num_warps=1)

    def check(self) -> None:
        """After the stream is synchronised: raise if a wait gave up."""
        if int(self.status.item()):
            self.status.zero_()
            raise RuntimeError("the GPU gave up waiting for the CPU attention result "
                               f"(spun {self.max_spins} times); the CPU worker stalled")
