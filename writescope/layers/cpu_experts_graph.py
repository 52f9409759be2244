"""CPU expert calls inside a CUDA graph: the device's half captured, the host's half per replay.

An eager CPU expert call (:meth:`CpuExperts.submit` / :meth:`CpuExperts.wait`) costs the launching
thread ~0.3 ms a layer: pinned buffers, casts, copies, a ready word, a native job, a wait kernel,
the result's copy back. At batch 1 the decode step with the experts on the CPU can wait on that
thread (Qwen3-30B-A3B 1 x 1K on the H200: 62-69 ms a step with 38-39 ms of expert kernels and
~7 ms of other device work on one host, 2026-12-03d calls 1 and 3; 49 ms on another, call 4),
and it breaks the step's graph at every layer.

A graphed call splits the work:

* **Captured** (while the stream is being captured): :func:`capture_launch` records the
  routing's casts and the copies of the hidden rows, ids and weights into fixed pinned buffers
  and a one-thread kernel raising the call's *ready* word to 1; :func:`capture_finish`, right
  after it or in a later graph (a pipelined step), the device's wait until its *done* word is 1
  (the wait kernel then stores 0 there) and the result's copy from a fixed pinned buffer back
  to the device. Every value is fixed, so the graph replays it as it is.
* **Per replay** (:meth:`GraphedCall.submit`, by the thread that replays the graph, before the
  replay): the native job queued: wait for ready and take it back to 0, run the kernel over the
  step's real rows, write the result, raise done. With the device taking done back to 0 after
  its wait, a call's words are 0 again by the time its graph's next replay reaches it, so that
  replay may be queued while this one is still on the device (an overlapped decode step,
  ``engine/inflight.py``): its job waits behind this one on the queue's thread, and its ready
  word is raised only after this replay's device wait. Where no replay is in flight
  (:func:`overlapping`), the submit also sets both words to 0 first, so that a replay that
  never ran (a step that failed after its submits) leaves nothing behind.

Every captured call has buffers and words of its own, set aside by the capture's warm-up run
(:func:`reserving`), so that nothing is allocated while capturing. Rows past the step's real
ones (a padded graph size) are never computed; their result rows stay zero. The kernel, its
inputs and its rows are the eager call's, so the results are the same bits.

Status: ``WRITESCOPE_CPU_EXPERTS_GRAPHED`` = ``auto`` (the default since 2026-12-04i: graphed in
*resident* steps, whose cached KV is all on the GPU, so that the whole step is graphs; eager
calls in the others, whose graphs break at attention anyway), ``1`` (graphed in every graphed
step) or ``0`` (always eager: the step's graph breaks at each call). The first version, with its
buffers page-locked by ``cudaHostRegister``, never captured on the H200 (torch refused the
copies: 2026-12-03d call 4); the buffers now come from torch's pinned allocator, outside the
capture: that version captures, replays and gives the eager tokens there (2026-12-03e call 1).
It was then not faster (Qwen3-30B-A3B x 1K: 57.1 against 55.1 ms a step at batch 1, the whole
step one graph whose launch came before any of its work). Since resident steps are cut into
several graphs, it is: with eager calls the launching thread is the batch-1 step's critical path
(DeepSeek-V2-Lite 1 x 8K: it queued a call every 1.55 ms against the CPU kernel's 1.1 ms,
``bench.step_profile --timeline``, 2026-12-04i call 2), and graphed resident steps ran 0.76-0.97x
the eager ones in five pairs of processes (DeepSeek 1 x 8K 34.2 / 36.6 against 35.2 / 47.9 ms,
Qwen3 1 x 1K 58.8 / 55.8 against 68.5 / 62.2, DeepSeek 4 x 8K 105.7 against 113.4; call 3). A
spilled step (DeepSeek 2 x 16K over 64 GPU blocks, CPU attention beside the experts) took 85.4
graphed against 82.5 eager in the one pair run, hence ``auto``. A capture that fails with
graphed calls in it turns them off for that model's layers (``CpuExperts.graph_disabled``, one
warning) and the step is captured again around eager calls.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

#: the calls captured since the last :func:`take_captured` (the capturing thread's segment)
_captured: list["GraphedCall"] = []
_flags = None       # HostFlags: two words per call (ready, done) and the device's wait status
_next_word = 0
_reserved: list["GraphedCall"] = []  # set aside by the warm-up run, taken by the capture
_reserving = False
_MAX_WORDS = 1 << 14
#: deferred decode steps with graphed calls whose tokens have not been collected yet
_in_flight = 0


MODES = ("auto", "on", "off")


def mode() -> str:
    """``WRITESCOPE_CPU_EXPERTS_GRAPHED``: ``auto`` (default: graphed in resident steps), ``on``
    (``1``: in every graphed step) or ``off`` (``0``: never); see the module docstring."""
    v = os.environ.get("WRITESCOPE_CPU_EXPERTS_GRAPHED", "auto").strip().lower()
    if v in ("1", "on", "true", "yes"):
        return "on"
    if v in ("0", "off", "false", "no"):
        return "off"
    if v in ("", "auto"):
        return "auto"
    raise ValueError(f"WRITESCOPE_CPU_EXPERTS_GRAPHED must be auto, 1 or 0, got {v!r}")


def enabled(resident: bool = True) -> bool:
    """Whether CPU expert calls are graphed in a step that is ``resident`` (all its cached KV on
    the GPU, its attention in the graph too) or not."""
    m = mode()
    return m == "on" or (m == "auto" and resident)


def overlapping(delta: int = 0) -> int:
    """Deferred steps with graphed calls still in flight, after adding ``delta`` (the runner:
    +1 when it closes such a step without waiting, -1 when it has its tokens)."""
    global _in_flight
    _in_flight = max(0, _in_flight + delta)
    return _in_flight


def settled() -> None:
    """The device has finished every step launched so far (a step that was waited for): none
    is in flight, whatever the count said (an engine dropped with a step in flight)."""
    global _in_flight
    _in_flight = 0


def take_captured() -> list["GraphedCall"]:
    """The calls captured since the last take (call before and after capturing a segment)."""
    global _captured
    out, _captured = _captured, []
    return out


def _words(device: torch.device, n: int):
    """The flags (made for ``device`` on first use), with ``n`` more words handed out."""
    global _flags, _next_word
    from ..attention.hostflag import HostFlags
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    if _flags is None:
        _flags = HostFlags(_MAX_WORDS, device)
    elif _flags.device != device:
        raise RuntimeError(f"graphed CPU expert calls on {device} and {_flags.device}")
    if _next_word + n > _MAX_WORDS - 2:
        raise RuntimeError(f"more than {_MAX_WORDS // 2 - 1} graphed CPU expert calls captured "
                           "(WRITESCOPE_CPU_EXPERTS_GRAPHED=0 keeps them eager)")
    _next_word += n
    return _flags


def check() -> None:
    """After the stream is synchronised: raise if a graphed call's device wait gave up."""
    if _flags is not None:
        _flags.check()


@dataclass
class GraphedCall:
    """One captured call: its layer's experts and the fixed buffers of one graph size."""
    experts: object            # CpuExperts
    rows: int
    xs: torch.Tensor           # pinned [rows, H], the experts' dtype
    ids: torch.Tensor          # pinned [rows, k] int32
    w: torch.Tensor            # pinned [rows, k] float32
    res: torch.Tensor          # pinned [rows, H], the hidden states' dtype
    out: torch.Tensor          # host [rows, H_p] float32 (the kernel's accumulator)
    flags: object              # HostFlags
    word: int                  # ready = word, done = word + 1

    def submit(self, n: int) -> None:
        """Before the replay: queue the kernel over the first ``n`` rows (with no replay in
        flight, the words set to 0 first; see the module docstring)."""
        if not 0 < n <= self.rows:
            raise ValueError(f"a graphed CPU expert call of {self.rows} rows asked for {n}")
        if _in_flight == 0:
            view = self.flags._view
            view[self.word] = 0
            view[self.word + 1] = 0
        x, ids, w = self.xs[:n], self.ids[:n], self.w[:n]
        self.experts.submit_graphed(x, ids, w, self.out, self.res,
                                    (self.flags.address(self.word), 1),
                                    (self.flags.address(self.word + 1), 1))


def prepare(device: torch.device) -> None:
    """Before a capture: the words exist and the two kernels a capture records are compiled
    (a first launch inside a capture would compile and load a module there)."""
    from ..attention.hostflag import _store_kernel
    flags = _words(device, 0)
    for scratch in (_MAX_WORDS - 2, _MAX_WORDS - 1):  # never handed out; both alignments
        flags._view[scratch] = 0
        for reset in (False, True):  # (captures wait with the reset)
            _store_kernel()[(1,)](flags.flags[scratch:], 1, num_warps=1)
            flags.wait(scratch, 1, reset=reset)
    torch.cuda.synchronize(device)


def _pinned_buffers(shapes: list[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor]:
    """Zeroed page-locked tensors of these shapes from torch's pinned allocator (pageable
    without CUDA). Called outside the capture (:func:`reserve`): the copies a capture records
    must be between the device and memory that allocator owns. (Memory page-locked with
    ``cudaHostRegister`` was refused there: "Cannot copy between CPU and CUDA tensors during
    CUDA graph capture unless the CPU tensor is pinned", torch 2.11, 2026-12-03d call 4.)"""
    pin = torch.cuda.is_available()
    return [torch.zeros(shape, dtype=dtype, pin_memory=pin) for shape, dtype in shapes]


def _new_call(experts, rows: int, k: int, dtype: torch.dtype, device: torch.device) -> "GraphedCall":
    flags = _words(device, 2)
    xs, ids, w, res = _pinned_buffers([((rows, experts.hidden), experts.dtype),
                                       ((rows, k), torch.int32), ((rows, k), torch.float32),
                                       ((rows, experts.hidden), dtype)])
    return GraphedCall(experts, rows, xs, ids, w, res,
                       torch.empty(rows, experts.hp, dtype=torch.float32), flags, _next_word - 2)


@contextlib.contextmanager
def reserving():
    """Around a segment's warm-up run (graphs.DecodeGraphs): each CPU expert call it makes
    (:func:`reserve`) sets aside the buffers and words its capture will use, so that nothing
    is allocated while the stream is being captured."""
    global _reserving
    _reserved.clear()
    _reserving = True
    try:
        yield
    finally:
        _reserving = False


def reserve(experts, hidden: torch.Tensor, ids: torch.Tensor) -> None:
    """Called by an eager CPU expert call: inside :func:`reserving`, make its capture's call."""
    if _reserving and hidden.is_cuda:
        _reserved.append(_new_call(experts, ids.shape[0], ids.shape[1], hidden.dtype,
                                   hidden.device))


def capture_launch(experts, hidden: torch.Tensor, ids: torch.Tensor, w: torch.Tensor
                   ) -> "GraphedCall":
    """Record the first half of a call's device side on the capturing stream: the inputs'
    copies and the ready word. The call is queued at each replay of the graph that holds this
    half (the capturing segment's ``host_calls``); :func:`capture_finish`, the second half, may
    be captured in a later graph (a pipelined step runs the other sub-batch's work between
    them, ``engine/graphs.py``). Every capture gets buffers and words of its own (a pipelined
    step calls a layer's experts once per sub-batch: those calls must not share them), set
    aside by the warm-up (:func:`reserve`)."""
    from ..attention.hostflag import _store_kernel
    rows, k = ids.shape
    dev = hidden.device
    call = None
    for j, c in enumerate(_reserved):
        if (c.experts is experts and c.rows == rows and c.ids.shape[1] == k
                and c.res.dtype == hidden.dtype):
            call = _reserved.pop(j)
            break
    if call is None:  # not warmed up: allocate now (a failure turns the graphed calls off)
        call = _new_call(experts, rows, k, hidden.dtype, dev)
    flags, word = call.flags, call.word
    call.xs.copy_(hidden.detach().to(experts.dtype), non_blocking=True)
    call.ids.copy_(ids.detach().to(torch.int32), non_blocking=True)
    call.w.copy_(w.detach().to(torch.float32), non_blocking=True)
    _store_kernel()[(1,)](flags.flags[word:], 1, num_warps=1)
    _captured.append(call)
    return call


def capture_finish(call: "GraphedCall", device: torch.device) -> torch.Tensor:
    """The second half of a captured call: the device waits for its done word and takes it back
    to 0, then copies its result back; returns the result."""
    call.flags.wait(call.word + 1, 1, reset=True)
    return call.res.to(device, non_blocking=True)
