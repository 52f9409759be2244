"""Routed experts computed on the CPU, at DRAM bandwidth (issue 5).

One :class:`CpuExperts` per MoE layer holds that layer's routed-expert weights in host memory and
computes ``y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` for each token's
top-k experts ``e = ids[t, j]``. ``submit`` starts the work on a background thread and returns at
once, so the GPU computes shared experts / the next ops meanwhile; ``wait`` returns the result on
the hidden states' device and dtype. On CUDA with Triton, ``wait`` does not block: the call runs
on a native job queue (no Python between its inputs landing and its result) that raises a pinned
flag the stream waits on (``attention/hostflag.py``), so the launching thread goes on enqueuing
the next layers (``WRITESCOPE_CPU_WAIT=host`` restores the blocking wait, which is also taken
when a call cannot go to the queue).

Backends
--------
``cpp``   (default) ``csrc/cpu_experts.cpp``, compiled on first use with the system C++ compiler
          (``g++ -O3 -fopenmp -shared``) into a per-user cache and loaded with :mod:`ctypes`; one
          .so holds generic / AVX2+FMA / AVX-512F / AVX-512 BF16 / AMX-BF16 code paths chosen at
          run time. Weights are repacked once into 16-row VNNI tiles so every activated expert's
          weights are streamed exactly once per call. (We build with a plain compiler call rather
          than ``torch.utils.cpp_extension``: the kernel needs no torch headers, so it compiles in
          ~5 s instead of ~60 s and needs no ninja; ctypes releases the GIL during the call.)
``torch`` pure torch (``F.linear`` per activated expert, oneDNN underneath); used when no compiler
          is found (one warning) or when ``WRITESCOPE_CPU_EXPERT_BACKEND=torch``.

Environment: ``WRITESCOPE_CPU_EXPERT_THREADS`` (default: the CPUs this process may run on),
``WRITESCOPE_CPU_EXPERT_BACKEND`` (``auto``/``cpp``/``torch``), ``WRITESCOPE_CPU_EXPERT_ISA``
(cap: ``generic``/``avx2``/``avx512``/``avx512bf16``/``amx``), ``WRITESCOPE_CPU_FP8_PRODUCTS``
(FP8 experts' decode calls: ``exact``, the default, or ``rounded``; :attr:`CpuExperts.fp8_exact`),
``WRITESCOPE_KERNEL_CACHE`` (build folder, default ``~/.cache/writescope/kernels``), ``CXX``
(compiler).

References (ideas, not code): KTransformers kt-kernel's AMX/AVX-512 MoE operators (packed
per-expert tiles, tokens grouped by expert, gate/up then down phases over a CPU thread pool while
the GPU runs the rest of the layer) and llama.cpp's ggml-cpu ``MUL_MAT_ID`` (counting-sort of
(token, slot) rows by expert, ``--cpu-moe``).
"""
from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["CpuExperts", "CpuExpertsHandle", "set_num_threads", "get_num_threads",
           "num_threads_setting", "kernel_info",
           "available_isas", "ISA_NAMES"]

ISA_NAMES = ("generic", "avx2", "avx512", "avx512bf16", "amx")
_SRC = Path(__file__).parent / "csrc" / "cpu_experts.cpp"
_TILE = 16   # output rows per packed tile
_KPAD = 32   # K (input) dims padded to a multiple of this (one AMX B tile)

# ---------------------------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------------------------
_num_threads: int | None = None


def _default_threads() -> int:
    env = os.environ.get("WRITESCOPE_CPU_EXPERT_THREADS")
    if env:
        n = int(env)
        if n < 1:
            raise ValueError(f"WRITESCOPE_CPU_EXPERT_THREADS must be >= 1, got {env!r}")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def set_num_threads(n: int | None) -> None:
    """Threads used by the CPU expert kernel (None: back to the default / the env variable)."""
    global _num_threads
    if n is not None and int(n) < 1:
        raise ValueError(f"number of threads must be >= 1, got {n}")
    _num_threads = None if n is None else int(n)


def get_num_threads() -> int:
    return _num_threads if _num_threads is not None else _default_threads()


def num_threads_setting() -> int | None:
    """What :func:`set_num_threads` last set (None: the default / the env variable)."""
    return _num_threads


# ---------------------------------------------------------------------------------------------
# the compiled kernel
# ---------------------------------------------------------------------------------------------
_lib = None
_lib_error: str | None = None
_lib_lock = threading.Lock()
_warned = False


def _compiler() -> str | None:
    for c in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if c and shutil.which(c):
            return c
    return None


def _build() -> ctypes.CDLL:
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    flags = ["-O3", "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-w"]
    src = _SRC.read_bytes()
    try:
        ver = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"C++ compiler {cxx!r} does not run: {e}") from e
    key = hashlib.sha1(src + " ".join([cxx, ver] + flags).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("WRITESCOPE_KERNEL_CACHE",
                                Path.home() / ".cache" / "writescope" / "kernels"))
    so = cache / f"cpu_experts-{key}.so"
    if not so.exists():
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        cmd = [cxx, *flags, str(_SRC), "-o", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"building the CPU expert kernel failed ({' '.join(cmd)}):\n"
                               f"{r.stderr[-4000:]}")
        os.replace(tmp, so)  # atomic: concurrent builders never see a half-written .so
    lib = ctypes.CDLL(str(so))  # CDLL (not PyDLL): the GIL is released during calls
    vp, i32, f32p = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)
    lib.ws_moe_forward.argtypes = [vp, vp, i32, i32, i32, i32, i32, i32, vp, i32, vp, vp, i32, vp,
                                   i32, i32, i32, vp, vp, i32, i32, vp, vp]
    lib.ws_moe_forward.restype = i32
    lib.ws_fp8_tile_to_bf16.argtypes = [vp, i32, vp, i32, i32, vp, i32]
    lib.ws_fp8_tile_to_bf16.restype = i32
    lib.ws_fp8_line_masks.argtypes = [vp, ctypes.c_long, i32, vp, i32]
    lib.ws_fp8_line_masks.restype = ctypes.c_long
    lib.ws_detect_isa.argtypes = []
    lib.ws_detect_isa.restype = i32
    lib.ws_read_sum.argtypes = [vp, ctypes.c_long, i32]
    lib.ws_read_sum.restype = ctypes.c_double
    lib.ws_random_normal_bf16.argtypes = [vp, ctypes.c_long, ctypes.c_ulonglong, ctypes.c_float]
    lib.ws_random_normal_bf16.restype = None
    del f32p
    return lib


def _get_lib():
    """The compiled kernel, or None (with one warning) when it cannot be built."""
    global _lib, _lib_error, _warned
    if _lib is not None or _lib_error is not None:
        return _lib
    with _lib_lock:
        if _lib is None and _lib_error is None:
            try:
                _lib = _build()
            except Exception as e:  # noqa: BLE001 - any build failure means: use the torch path
                _lib_error = str(e)
                if not _warned:
                    _warned = True
                    warnings.warn(f"writescope: CPU expert C++ kernel unavailable, using the slower "
                                  f"pure-torch path ({e})", RuntimeWarning, stacklevel=3)
    return _lib


_detected_isa: int | None = None


def _detected() -> int:
    global _detected_isa
    if _detected_isa is None:
        _detected_isa = _get_lib().ws_detect_isa()
    return _detected_isa


def _isa_cap() -> int:
    env = os.environ.get("WRITESCOPE_CPU_EXPERT_ISA", "").strip().lower()
    if not env:
        return len(ISA_NAMES) - 1
    if env not in ISA_NAMES:
        raise ValueError(f"WRITESCOPE_CPU_EXPERT_ISA={env!r}: expected one of {', '.join(ISA_NAMES)}")
    return ISA_NAMES.index(env)


#: AMX tiles are used for an expert once it has this many tokens in the call (fewer: AVX-512 BF16).
#: Measured on the H200 host (bench/results/cpu_experts-h200.json): AMX for every expert loses up
#: to 25 % at 1-2 tokens per expert, ties at ~8 and wins at >= 12 (3x at 32 tokens per expert).
AMX_MIN_TOKENS = 8


def _fp8_products() -> str:
    """``WRITESCOPE_CPU_FP8_PRODUCTS``: ``exact`` (default) or ``rounded`` (see
    :attr:`CpuExperts.fp8_exact`)."""
    env = os.environ.get("WRITESCOPE_CPU_FP8_PRODUCTS", "exact").strip().lower()
    if env not in ("exact", "rounded"):
        raise ValueError(f"WRITESCOPE_CPU_FP8_PRODUCTS={env!r}: expected 'exact' or 'rounded'")
    return env


def _amx_min() -> int:
    return int(os.environ.get("WRITESCOPE_CPU_EXPERT_AMX_MIN", AMX_MIN_TOKENS))


def available_isas() -> list[str]:
    """Kernel code paths this machine can run (empty when the C++ kernel is unavailable)."""
    lib = _get_lib()
    return [] if lib is None else list(ISA_NAMES[: _detected() + 1])


def kernel_info() -> dict:
    lib = _get_lib()
    info = {"backend": "cpp" if lib is not None else "torch", "threads": get_num_threads()}
    if lib is not None:
        info["isa_detected"] = ISA_NAMES[_detected()]
        info["isa_used"] = ISA_NAMES[min(_detected(), _isa_cap())]
        info["amx_min_tokens"] = _amx_min()
    else:
        info["error"] = _lib_error
    return info


def _read_bandwidth_probe(buf: torch.Tensor, threads: int | None = None) -> float:
    """Read ``buf`` once with the kernel library's threads (for the benchmark); returns a checksum."""
    lib = _get_lib()
    if lib is None:
        return float(buf.view(torch.float32).sum())
    return lib.ws_read_sum(buf.data_ptr(), buf.numel() * buf.element_size(),
                           threads or get_num_threads())


# ---------------------------------------------------------------------------------------------
# packing (HF layout <-> 16-row VNNI tiles)
# ---------------------------------------------------------------------------------------------
#: values per chunk of a random draw (CpuExperts.random): one generator each, drawn in parallel
_RANDOM_CHUNK_VALUES = 1 << 21


def _chunk_seed(seed: int, *keys: int) -> int:
    """A 63-bit generator seed from ``seed`` and the chunk's keys (stable across runs)."""
    data = b"".join(int(x).to_bytes(8, "little", signed=True) for x in (seed, *keys))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b * b


#: dtypes packed in k-pairs (the VNNI order): bf16, and FP8 bytes (stored as uint8)
_PAIRED = (torch.bfloat16, torch.uint8)


def _tiles_view(w: torch.Tensor, op: int, kp: int) -> torch.Tensor:
    """``[O, K]`` weights (zero padded to ``[op, kp]``) as a view in the packed tiles' order:
    bf16 and FP8 bytes ``[op/16, kp/2, 16, 2]``, fp32 ``[op/16, kp, 16]``."""
    o, k = w.shape
    if (o, k) != (op, kp):
        w = F.pad(w, (0, kp - k, 0, op - o))
    if w.dtype in _PAIRED:
        return w.reshape(op // _TILE, _TILE, kp // 2, 2).permute(0, 2, 1, 3)
    return w.reshape(op // _TILE, _TILE, kp).permute(0, 2, 1)


def _pack(w: torch.Tensor, op: int, kp: int) -> torch.Tensor:
    """[O, K] -> tiles [O_p/16, ...]: bf16 [K_p/2][16][2], fp32 [K_p][16]; zero padded."""
    return _tiles_view(w, op, kp).reshape(op // _TILE, -1)


def _pack_into(dst: torch.Tensor, w: torch.Tensor, op: int, kp: int) -> None:
    """``_pack(w)`` written straight into ``dst [op/16, 16*kp]`` (rows may be strided): one copy."""
    v = _tiles_view(w, op, kp)
    dst.view(v.shape).copy_(v)


def _unpack(t: torch.Tensor, o: int, k: int, op: int, kp: int, lead: tuple = ()) -> torch.Tensor:
    """Tiles back to ``[*lead, o, k]`` rows (``lead``: leading dims, e.g. a range of experts)."""
    if t.dtype in _PAIRED:
        w = t.reshape(*lead, op // _TILE, kp // 2, _TILE, 2).transpose(-3, -2)
    else:
        w = t.reshape(*lead, op // _TILE, kp, _TILE).transpose(-2, -1)
    return w.reshape(*lead, op, kp)[..., :o, :k]


# ---------------------------------------------------------------------------------------------
# async execution
# ---------------------------------------------------------------------------------------------
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _get_executor() -> concurrent.futures.ThreadPoolExecutor:
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


class _WsMoeJob(ctypes.Structure):
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


def _get_native_queue():
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


def _ready_spin_s() -> float:
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


def _device_wait_enabled(device: torch.device) -> bool:
    if device.type != "cuda" or os.environ.get("WRITESCOPE_CPU_WAIT", "device") == "host":
        return False
    from ..attention.gpu import triton_available
    return triton_available()


def _host_flags(device: torch.device):
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


def _route(ids: torch.Tensor, per_expert: int) -> None:
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


def take_timeline() -> list[tuple[float, float]]:
    """The device-waited calls since the last take, in order, as ``(ready, seen)`` milliseconds
    on the device's clock relative to the first call's ready event (``WRITESCOPE_EXPERT_TIMELINE``
    on; synchronises with the last event). Empty when off or when no call ran."""
    global _timeline
    marks, _timeline = _timeline, []
    if not marks:
        return []
    marks[-1][1].synchronize()
    t0 = marks[0][0]
    return [(t0.elapsed_time(a), t0.elapsed_time(b)) for a, b in marks]


def raise_pending_errors() -> float | None:
    """Once the step is enqueued: wait for the CPU expert calls the device waits for, re-raise
    the first failure among them (and a device wait that gave up), clear the pending list.
    Returns the kernel seconds of the calls that ran on the native queue or inline (the planner
    corrects its experts' rate with them), or None when none did."""
    global _pending, _native_pending, _inline_s, last_queue_stats
    jobs, _pending = _pending, []
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


@dataclass
class CpuExpertsHandle:
    future: concurrent.futures.Future | None  # None: on the native queue
    device: torch.device
    dtype: torch.dtype
    n: int
    result: torch.Tensor | None = None  # pinned: filled by the worker when the device waits
    seq: int = 0                        # the flag value that says ``result`` is there
    mark: object = None                 # the inputs' timing event (WRITESCOPE_EXPERT_TIMELINE)
    host: tuple | None = None           # (submit entered, job pushed) host times (the same)


def _fp8_scheme_ok(fp8) -> str | None:
    """Why block-wise FP8 weights of ``fp8`` (a ``models.quantization.Fp8Blocks``) cannot stay
    FP8 in the compiled kernel, or None when they can."""
    bo, bi = fp8.block
    if bo % _TILE or bi % 2:
        return (f"FP8 blocks of {bo}x{bi}: the kernel needs row blocks of a multiple of "
                f"{_TILE} and column blocks of a multiple of 2")
    if _get_lib() is None:
        return f"the CPU expert C++ kernel is unavailable ({_lib_error})"
    return None


class CpuExperts:
    """One MoE layer's routed experts in host memory (see the module docstring).

    ``fp8`` (a :class:`~writescope.models.quantization.Fp8Blocks`): the weights are stored as
    block-wise FP8 (one byte each, ``gate_up``/``down`` of dtype uint8 in the bf16 tile order,
    float32 scales in ``gate_up_scale [E, 2, ceil(I/bo), ceil(H/bi)]`` and ``down_scale [E,
    ceil(H/bo), ceil(I/bi)]``) and computed in bfloat16 (``dtype``) from bf16(q * scale), the
    values of the same checkpoint dequantized at load; the compiled kernel only."""

    def __init__(self, num_experts: int, hidden: int, inter: int, dtype: torch.dtype,
                 backend: str | None = None, fp8=None):
        if dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"CpuExperts weights must be bfloat16 or float32, got {dtype}")
        if fp8 is not None:
            if dtype != torch.bfloat16:
                raise ValueError(f"FP8 experts compute in bfloat16, got dtype {dtype}")
            why = _fp8_scheme_ok(fp8)
            if why is not None:
                raise ValueError(f"FP8 experts need the compiled kernel: {why}")
        if min(num_experts, hidden, inter) < 1:
            raise ValueError(f"bad expert shape: {num_experts} experts, hidden {hidden}, "
                             f"intermediate {inter}")
        backend = (backend or os.environ.get("WRITESCOPE_CPU_EXPERT_BACKEND", "auto")).lower()
        if backend not in ("auto", "cpp", "torch"):
            raise ValueError(f"CpuExperts backend must be 'auto', 'cpp' or 'torch', got {backend!r}")
        if backend in ("auto", "cpp"):
            lib = _get_lib()
            if lib is None and backend == "cpp":
                raise RuntimeError(f"CPU expert C++ kernel unavailable: {_lib_error}")
            backend = "cpp" if lib is not None else "torch"
        if fp8 is not None and backend != "cpp":
            raise ValueError("FP8 experts need the compiled kernel: backend torch")
        self.backend = backend
        global _flag_slots
        self._slot = _flag_slots % _MAX_LAYERS  # this layer's flag (see _host_flags)
        _flag_slots += 1
        self.num_experts, self.hidden, self.inter, self.dtype = num_experts, hidden, inter, dtype
        #: why this layer's calls may not be graphed (a capture holding them failed), or None
        self.graph_disabled: str | None = None
        self.hp, self.ip = _ceil(hidden, _KPAD), _ceil(inter, _KPAD)
        E = num_experts
        # read at DRAM speed every step: huge pages (a 4 KiB page per 4 KiB read otherwise, and
        # page tables of ~0.2% of the weights, 110 MB for Qwen3's 54 GiB, past every cache)
        from ..hostmem import pageable_empty
        self.fp8 = fp8
        self.gate_up_scale = self.down_scale = None
        self.gate_up_masks = self.down_masks = None
        #: FP8 decode calls (up to 16 tokens an expert) on the codes as they are, each scale block's
        #: sum of q * x in fp32 times its scale (True, the default), or on the bf16(q * scale)
        #: weights a checkpoint dequantized at load holds (False: bit for bit the bf16 kernel's
        #: results over those weights, ~0.8x the speed). See csrc/cpu_experts.cpp, k_fp8x.
        self.fp8_exact = _fp8_products() == "exact"
        if backend == "cpp":
            # [E][I_p/16][gate|up][tile of 16 x H_p], [E][H_p/16][tile of 16 x I_p]
            store = torch.uint8 if fp8 is not None else dtype
            self.gate_up = pageable_empty((E, self.ip // _TILE, 2, _TILE * self.hp), store)
            self.down = pageable_empty((E, self.hp // _TILE, _TILE * self.ip), store)
            if fp8 is not None:
                self.gate_up_scale = torch.ones((E, 2, *fp8.scale_shape((inter, hidden))))
                self.down_scale = torch.ones((E, *fp8.scale_shape((hidden, inter))))
                # which lines of each tile hold e4m3 subnormal codes (ws_fp8_line_masks)
                self.gate_up_masks = torch.zeros((E, self.ip // _TILE, 2, _ceil(self.hp // 2, 64)
                                                  // 64), dtype=torch.int64)
                self.down_masks = torch.zeros((E, self.hp // _TILE, _ceil(self.ip // 2, 64) // 64),
                                              dtype=torch.int64)
        else:
            self.gate_up = pageable_empty((E, 2 * inter, hidden), dtype)
            self.down = pageable_empty((E, hidden, inter), dtype)

    # ------------------------------------------------------------------ construction
    def _set_expert(self, e: int, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> None:
        H, I = self.hidden, self.inter
        if tuple(gate.shape) != (I, H) or tuple(up.shape) != (I, H) or tuple(down.shape) != (H, I):
            raise ValueError(f"expert {e}: expected gate/up [{I}, {H}] and down [{H}, {I}], got "
                             f"{tuple(gate.shape)}, {tuple(up.shape)}, {tuple(down.shape)}")
        if self.fp8 is not None:  # quantized here, block by block (amax / 448)
            self._set_expert_fp8(e, *(self.fp8.quantize(t.detach().to("cpu"))
                                      for t in (gate, up, down)))
            return
        gate, up, down = (t.detach().to("cpu", self.dtype) for t in (gate, up, down))
        if self.backend == "cpp":
            _pack_into(self.gate_up[e, :, 0], gate, self.ip, self.hp)
            _pack_into(self.gate_up[e, :, 1], up, self.ip, self.hp)
            _pack_into(self.down[e], down, self.hp, self.ip)
        else:
            self.gate_up[e, :I] = gate
            self.gate_up[e, I:] = up
            self.down[e] = down

    def _set_expert_fp8(self, e: int, gate: tuple, up: tuple, down: tuple) -> None:
        """Expert ``e`` from FP8 ``(q, scale)`` pairs: gate/up ``q [I, H]``, down ``q [H, I]``
        (float8_e4m3fn), each with its scale grid."""
        H, I = self.hidden, self.inter
        want = {0: (I, H), 1: (I, H), 2: (H, I)}
        for j, (q, sc) in enumerate((gate, up, down)):
            if tuple(q.shape) != want[j] or q.dtype != torch.float8_e4m3fn:
                raise ValueError(f"expert {e}: expected float8_e4m3fn gate/up [{I}, {H}] and down "
                                 f"[{H}, {I}], got {q.dtype} {tuple(q.shape)} for matrix {j}")
            if tuple(sc.shape) != self.fp8.scale_shape(want[j]):
                raise ValueError(f"expert {e}: scale of shape {tuple(sc.shape)} for a weight of "
                                 f"{want[j]}, expected {self.fp8.scale_shape(want[j])}")
        (qg, sg), (qu, su), (qd, sd) = gate, up, down
        _pack_into(self.gate_up[e, :, 0], qg.to("cpu").view(torch.uint8), self.ip, self.hp)
        _pack_into(self.gate_up[e, :, 1], qu.to("cpu").view(torch.uint8), self.ip, self.hp)
        _pack_into(self.down[e], qd.to("cpu").view(torch.uint8), self.hp, self.ip)
        self.gate_up_scale[e, 0] = sg
        self.gate_up_scale[e, 1] = su
        self.down_scale[e] = sd
        self._mark_subnormal_lines(e, e + 1)

    def _mark_subnormal_lines(self, a: int, b: int) -> int:
        """The line masks of experts ``a..b-1`` from their FP8 codes (after every write of them);
        returns the lines flagged."""
        lib = _get_lib()
        n = 0
        for w, m, kp in ((self.gate_up, self.gate_up_masks, self.hp),
                         (self.down, self.down_masks, self.ip)):
            tiles = w[a:b].numel() // (_TILE * kp)
            r = lib.ws_fp8_line_masks(w[a:b].data_ptr(), tiles, kp, m[a:b].data_ptr(),
                                      get_num_threads())
            if r < 0:
                raise RuntimeError(f"ws_fp8_line_masks failed (code {r})")
            n += r
        return n

    @classmethod
    def from_fp8(cls, gate: Sequence[tuple], up: Sequence[tuple], down: Sequence[tuple],
                 fp8, backend: str | None = None) -> "CpuExperts":
        """From a checkpoint's block-wise FP8 experts: per expert ``(q, scale)`` pairs of gate and
        up (``q [I, H]``) and down (``q [H, I]``), float8_e4m3fn with their scale grids."""
        E = len(gate)
        if len(up) != E or len(down) != E or E == 0:
            raise ValueError(f"gate, up and down must hold the same (non-zero) number of experts, "
                             f"got {len(gate)}, {len(up)}, {len(down)}")
        inter, hidden = gate[0][0].shape
        self = cls(E, hidden, inter, torch.bfloat16, backend, fp8=fp8)
        for e in range(E):
            self._set_expert_fp8(e, gate[e], up[e], down[e])
        return self

    @staticmethod
    def fp8_unsupported(fp8, dtype: torch.dtype, backend: str | None = None) -> str | None:
        """Why experts of the FP8 scheme ``fp8`` would not stay FP8 here (they are then
        dequantized at load), or None when they do: bfloat16 runs with the compiled kernel."""
        if dtype != torch.bfloat16:
            return f"FP8 experts compute in bfloat16; this run's dtype is {dtype}"
        backend = (backend or os.environ.get("WRITESCOPE_CPU_EXPERT_BACKEND", "auto")).lower()
        if backend == "torch":
            return "the torch backend computes in the weights' dtype"
        return _fp8_scheme_ok(fp8)

    @classmethod
    def from_weights(cls, gate: torch.Tensor | Sequence[torch.Tensor],
                     up: torch.Tensor | Sequence[torch.Tensor],
                     down: torch.Tensor | Sequence[torch.Tensor],
                     dtype: torch.dtype = torch.bfloat16, backend: str | None = None) -> "CpuExperts":
        """From HF-layout weights: gate/up ``[E, I, H]`` (or E tensors ``[I, H]``), down ``[E, H, I]``.

        Tensors may live on any device; they are copied (one expert at a time) into host memory.
        """
        E = len(gate)
        if len(up) != E or len(down) != E or E == 0:
            raise ValueError(f"gate, up and down must hold the same (non-zero) number of experts, "
                             f"got {len(gate)}, {len(up)}, {len(down)}")
        inter, hidden = gate[0].shape
        self = cls(E, hidden, inter, dtype, backend)
        for e in range(E):
            self._set_expert(e, gate[e], up[e], down[e])
        return self

    @classmethod
    def random(cls, num_experts: int, hidden: int, inter: int, dtype: torch.dtype = torch.bfloat16,
               generator: torch.Generator | None = None, seed: int | None = None,
               std: float = 0.02, unique_experts: int | None = None,
               backend: str | None = None, threads: int | None = None,
               fp8=None) -> "CpuExperts":
        """Full-size random experts without a checkpoint, N(0, std), drawn straight in ``dtype``.

        With ``seed`` (default 0): each expert's gate, up and down matrices are drawn in chunks
        of rows, each chunk from its own generator seeded from (seed, expert, matrix, chunk), on
        ``threads`` threads (default: the kernel's, :func:`get_num_threads`). The values depend
        on the seed and the shapes only, not on the thread count. bf16 values come from the
        compiled kernel's counter-based generator where it builds (an Irwin-Hall approximation
        of N(0, std), bounded at 3.46 std; ~1 G values/s a core against torch's ~0.2: on the
        H200 torch's draw took 64 s for Qwen3-30B-A3B and 107 s for Mixtral-8x7B).
        With ``generator``: expert by expert in the order gate, up, down from that one
        generator, on the calling thread.
        ``unique_experts=n`` draws only n experts and repeats them cyclically (separate memory,
        same values): benchmarks use it to fill tens of GB fast.
        ``fp8``: FP8 experts; with ``seed`` every block has the scale ``3.47 std / 448`` (the
        draw's bound maps to the largest FP8 value) and the values are the draw's, rounded."""
        self = cls(num_experts, hidden, inter, dtype, backend, fp8=fp8)
        if fp8 is not None and generator is None:
            self.gate_up_scale.fill_(self._random_fp8_scale(std))
            self.down_scale.fill_(self._random_fp8_scale(std))
        n = num_experts if unique_experts is None else max(1, min(unique_experts, num_experts))
        if generator is not None:
            def draw(*shape):
                return torch.empty(*shape, dtype=dtype).normal_(0.0, std, generator=generator)

            for e in range(n):
                self._set_expert(e, draw(inter, hidden), draw(inter, hidden), draw(hidden, inter))
        else:
            self._draw_parallel(n, 0 if seed is None else int(seed), std, threads)
        for e in range(n, num_experts):
            self.gate_up[e].copy_(self.gate_up[e % n])
            self.down[e].copy_(self.down[e % n])
            if fp8 is not None:
                self.gate_up_scale[e].copy_(self.gate_up_scale[e % n])
                self.down_scale[e].copy_(self.down_scale[e % n])
        if fp8 is not None:  # (_set_expert marked the generator's n experts already)
            self._mark_subnormal_lines(0 if generator is None else n, num_experts)
        return self

    @staticmethod
    def _random_fp8_scale(std: float) -> float:
        from ..models.quantization import Fp8Blocks
        return Fp8Blocks.random_scale(std)

    def _draw_parallel(self, n: int, seed: int, std: float, threads: int | None) -> None:
        """Experts ``0..n-1`` drawn in row chunks (see :meth:`random`), written in place."""
        H, I = self.hidden, self.inter
        shapes = ((I, H), (I, H), (H, I))  # gate, up, down
        tasks = []
        for e in range(n):
            for j, (o, k) in enumerate(shapes):
                rows = max(_KPAD, _RANDOM_CHUNK_VALUES // k // _KPAD * _KPAD)  # tile-aligned starts
                for c, r0 in enumerate(range(0, o, rows)):
                    tasks.append((e, j, r0, min(o, r0 + rows), c))

        # bf16 values come from the compiled kernel's counter-based generator when it builds
        # (ws_random_normal_bf16: approximately normal, ~20x torch's rate a core), whatever the
        # backend, so both layouts hold the same logical weights; else from torch's normal_
        lib = _get_lib() if self.dtype == torch.bfloat16 else None

        def run(task) -> None:
            e, j, r0, r1, c = task
            w = torch.empty(r1 - r0, shapes[j][1], dtype=self.dtype)
            if lib is not None:
                lib.ws_random_normal_bf16(w.data_ptr(), w.numel(), _chunk_seed(seed, e, j, c),
                                          float(std))
            else:
                w.normal_(0.0, std, generator=torch.Generator().manual_seed(
                    _chunk_seed(seed, e, j, c)))
            self._set_rows(e, j, r0, w)

        workers = max(1, min(len(tasks), threads or get_num_threads()))
        if workers == 1:
            for t in tasks:
                run(t)
            return
        # each worker's torch ops on one intra-op thread (a worker thread reads torch's thread
        # count when it first runs an op): the parallelism is the workers
        prev = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with concurrent.futures.ThreadPoolExecutor(workers, "writescope-random") as pool:
                for f in [pool.submit(run, t) for t in tasks]:
                    f.result()
        finally:
            torch.set_num_threads(prev)

    def _set_rows(self, e: int, j: int, r0: int, w: torch.Tensor) -> None:
        """Rows ``r0:r0+len(w)`` of expert ``e``'s matrix ``j`` (0 gate, 1 up, 2 down; HF layout)
        written into this object's layout. ``r0`` is a multiple of the packing tile; the chunk
        that ends the matrix also writes its padding."""
        H, I = self.hidden, self.inter
        o, r1 = (I if j < 2 else H), r0 + w.shape[0]
        if self.fp8 is not None:  # (random draws: one scale for every block, see random)
            sc = float(self.gate_up_scale.view(-1)[0])
            w = (w.to(torch.float32) / sc).to(torch.float8_e4m3fn).view(torch.uint8)
        if self.backend == "cpp":
            dst = self.gate_up[e, :, j] if j < 2 else self.down[e]
            op, kp = (self.ip, self.hp) if j < 2 else (self.hp, self.ip)
            rows = op - r0 if r1 >= o else r1 - r0
            _pack_into(dst[r0 // _TILE:(r0 + rows) // _TILE], w, rows, kp)
        elif j < 2:
            self.gate_up[e, j * I + r0:j * I + r1] = w
        else:
            self.down[e, r0:r1] = w

    def expert_weights(self, e: int, fp8_dtype: torch.dtype | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expert ``e``'s (gate [I, H], up [I, H], down [H, I]) in the HF layout (copies). FP8
        experts come out as q * scale in ``fp8_dtype`` (default: the layer's dtype)."""
        H, I = self.hidden, self.inter
        if self.fp8 is not None:
            gate_up, down = self.unpack_expert(self.gate_up, self.down, e,
                                               (self.gate_up_scale, self.down_scale), fp8_dtype)
            return gate_up[:I].contiguous(), gate_up[I:].contiguous(), down.contiguous()
        if self.backend == "cpp":
            gate = _unpack(self.gate_up[e, :, 0], I, H, self.ip, self.hp)
            up = _unpack(self.gate_up[e, :, 1], I, H, self.ip, self.hp)
            down = _unpack(self.down[e], H, I, self.hp, self.ip)
            return gate.contiguous(), up.contiguous(), down.contiguous()
        return (self.gate_up[e, :I].clone(), self.gate_up[e, I:].clone(), self.down[e].clone())

    # ------------------------------------------------------------------ facts
    def unpack_expert(self, gate_up: torch.Tensor, down: torch.Tensor, e: int,
                      scales: tuple[torch.Tensor, torch.Tensor] | None = None,
                      fp8_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e`` as HF-layout ``gate_up [2I, H]`` and ``down [H, I]``, read from copies of
        this object's ``gate_up`` / ``down`` tensors on any device (the GPU prefill path). FP8
        experts need copies of ``(gate_up_scale, down_scale)`` on that device too, and come out
        in bfloat16 as bf16(q * scale) (or q * scale in ``fp8_dtype``)."""
        gu, dn = self.unpack_experts(gate_up, down, e, e + 1, scales, fp8_dtype)
        return gu[0], dn[0]

    def unpack_experts(self, gate_up: torch.Tensor, down: torch.Tensor, a: int, b: int,
                       scales: tuple[torch.Tensor, torch.Tensor] | None = None,
                       fp8_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Experts ``a..b-1`` as :meth:`unpack_expert` gives each, stacked: ``gate_up [b-a, 2I,
        H]``, ``down [b-a, H, I]`` (a few kernels for the range, whatever its length)."""
        H, I = self.hidden, self.inter
        if self.backend != "cpp":
            return gate_up[a:b], down[a:b]
        n = (b - a,)
        gate = _unpack(gate_up[a:b, :, 0], I, H, self.ip, self.hp, n)
        up = _unpack(gate_up[a:b, :, 1], I, H, self.ip, self.hp, n)
        dn = _unpack(down[a:b], H, I, self.hp, self.ip, n)
        if self.fp8 is not None:
            if scales is None:
                raise ValueError("FP8 experts are unpacked with their scales")
            gs, ds = scales

            def deq(q, sc):
                return self.fp8.dequantize(q.contiguous().view(torch.float8_e4m3fn),
                                           sc).to(fp8_dtype or self.dtype)

            return (torch.cat([deq(gate, gs[a:b, 0]), deq(up, gs[a:b, 1])], dim=1),
                    deq(dn, ds[a:b]))
        return torch.cat([gate, up], dim=1), dn

    @property
    def nbytes(self) -> int:
        """Host bytes held by the weights (including tile padding, FP8 scales and line masks)."""
        n = (self.gate_up.numel() + self.down.numel()) * self.gate_up.element_size()
        if self.fp8 is not None:
            n += (self.gate_up_scale.numel() + self.down_scale.numel()) * 4
            n += (self.gate_up_masks.numel() + self.down_masks.numel()) * 8
        return n

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's weights (unpadded, FP8 scales included): what a call reads per
        activated expert."""
        if self.fp8 is not None:
            return 3 * self.hidden * self.inter + (
                self.gate_up_scale[0].numel() + self.down_scale[0].numel()) * 4
        return 3 * self.hidden * self.inter * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def weight_format(self) -> str:
        """How the weights are stored: ``bfloat16``, ``float32`` or the FP8 scheme's name."""
        return self.fp8.name if self.fp8 is not None else str(self.dtype).replace("torch.", "")

    def __repr__(self) -> str:
        return (f"CpuExperts({self.num_experts} experts, hidden={self.hidden}, "
                f"inter={self.inter}, {self.weight_format}, backend={self.backend}, "
                f"{self.nbytes / 2**30:.2f} GiB)")

    # ------------------------------------------------------------------ compute
    def _check(self, hidden: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> None:
        if hidden.dim() != 2 or hidden.shape[1] != self.hidden:
            raise ValueError(f"hidden must be [N, {self.hidden}], got {tuple(hidden.shape)}")
        if ids.dim() != 2 or ids.shape[0] != hidden.shape[0] or tuple(w.shape) != tuple(ids.shape):
            raise ValueError(f"topk_ids and topk_weights must both be [N={hidden.shape[0]}, k], got "
                             f"{tuple(ids.shape)} and {tuple(w.shape)}")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"topk_ids must be an integer tensor, got {ids.dtype}")
        if not hidden.dtype.is_floating_point:
            raise ValueError(f"hidden must be floating point, got {hidden.dtype}")

    def submit(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
               topk_weights: torch.Tensor, routed: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> CpuExpertsHandle:
        """Start the computation and return at once (see :meth:`wait`). An id of -1 in
        ``topk_ids`` is a slot left out (another reader computes it: ``expert_link.py``); then
        ``routed`` is the step's whole routing, whose distinct experts :func:`take_routed_bytes`
        counts. ``out_dtype``: the result's dtype (default the hidden states')."""
        global _eager_calls
        timeline = timeline_on()
        entered = time.perf_counter() if timeline else 0.0
        self._check(hidden, topk_ids, topk_weights)
        _eager_calls += 1
        n = hidden.shape[0]
        dev, dtype = hidden.device, (out_dtype or hidden.dtype)
        if n == 0:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.set_result(torch.zeros(0, self.hidden, dtype=dtype))
            return CpuExpertsHandle(fut, dev, dtype, 0)
        x = hidden.detach().to(self.dtype)
        ids = topk_ids.detach().to(torch.int32)
        w = topk_weights.detach().to(torch.float32)
        event = mark = None
        if dev.type == "cuda":
            # async D2H into pinned buffers; the worker waits on the event before reading them
            xs = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            ids_h = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            w_h = torch.empty(w.shape, dtype=w.dtype, pin_memory=True)
            xs.copy_(x, non_blocking=True)
            ids_h.copy_(ids, non_blocking=True)
            w_h.copy_(w, non_blocking=True)
            if routed is not None:
                routed_h = torch.empty(routed.shape, dtype=torch.int32, pin_memory=True)
                routed_h.copy_(routed.detach().to(torch.int32), non_blocking=True)
                routed = routed_h
            from ..attention.hostflag import stream_ready
            if timeline:
                mark = torch.cuda.Event(enable_timing=True)
                mark.record()
            event = stream_ready(dev)  # the worker polls it (sleeping, no CUDA call)
            x, ids, w = xs, ids_h, w_h
        else:
            x, ids, w = (t.to("cpu").contiguous() for t in (x, ids, w))
            if x.data_ptr() == hidden.data_ptr():  # the caller may overwrite hidden meanwhile
                x = x.clone()
            if routed is not None:
                routed = routed.detach().to("cpu", torch.int32)
        _route(ids if routed is None else routed, self.expert_bytes)
        pin = dev.type == "cuda"
        if _device_wait_enabled(dev):
            ready = getattr(event, "address", None)
            queue = _get_native_queue() if (self.backend == "cpp" and ready is not None and
                                            dtype in (torch.bfloat16, torch.float32)) else None
            python = os.environ.get("WRITESCOPE_CPU_EXPERT_QUEUE") == "python"
            # the device waits only for a native job, or for the Python worker when asked to
            # (see _get_native_queue); otherwise the launching thread waits in wait()
            if queue is not None or python:
                res = torch.empty(n, self.hidden, dtype=dtype, pin_memory=True)
                _flag_seq[self._slot] += 1
                seq = _flag_seq[self._slot]
                flags = _host_flags(dev)
                if queue is not None:
                    self._submit_native(queue, x, ids, w, res, ready,
                                        (flags.address(self._slot), seq))
                    host = None if mark is None else (entered, time.perf_counter())
                    return CpuExpertsHandle(None, dev, dtype, n, res, seq, mark, host)
                fut = _get_executor().submit(self._compute_signalled, x, ids, w, event, res,
                                             flags, seq)
                return CpuExpertsHandle(fut, dev, dtype, n, res, seq, mark)
        fut = _get_executor().submit(self._compute, x, ids, w, dtype, pin, event)
        return CpuExpertsHandle(fut, dev, dtype, n)

    def graphable(self, device: torch.device, dtype: torch.dtype, resident: bool = True) -> bool:
        """Whether a call on ``device`` with hidden states of ``dtype`` may be captured in a CUDA
        graph of a ``resident`` step or another (``cpu_experts_graph``): the compiled kernel on
        the native queue, the device waiting on a kernel (not the driver's memop, which a graph
        may not hold)."""
        from . import cpu_experts_graph
        if (device.type != "cuda" or self.backend != "cpp"
                or not cpu_experts_graph.enabled(resident)
                or self.graph_disabled is not None
                or dtype not in (torch.bfloat16, torch.float32)
                or not _device_wait_enabled(device)):
            return False
        if os.environ.get("WRITESCOPE_HOSTFLAG_READ", "acquire") == "memop":
            return False
        return _get_native_queue() is not None

    def captured_launch(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                        topk_weights: torch.Tensor):
        """The first half of a call's device side, recorded while the stream is being captured
        (inputs out, ready word); the result comes from ``cpu_experts_graph.capture_finish``,
        which may be captured in a later graph; the host's half is queued before each replay
        (see ``cpu_experts_graph``)."""
        self._check(hidden, topk_ids, topk_weights)
        from . import cpu_experts_graph
        return cpu_experts_graph.capture_launch(self, hidden, topk_ids, topk_weights)

    def submit_graphed(self, x, ids, w, out: torch.Tensor, res: torch.Tensor,
                       ready: tuple[int, int], done: tuple[int, int]) -> None:
        """A graphed call's host half: the kernel over the pinned ``x, ids, w`` (filled by the
        replay) into ``res`` between the ``ready`` and ``done`` words."""
        queue = _get_native_queue()
        if queue is None:
            raise RuntimeError(f"graphed CPU expert calls need the native queue "
                               f"({_native_queue_error})")
        _route(ids, self.expert_bytes)
        self._submit_native(queue, x, ids, w, res, ready, done, out, consume_ready=True)

    def _submit_native(self, queue, x, ids, w, res: torch.Tensor, ready: tuple[int, int],
                       done: tuple[int, int], out: torch.Tensor | None = None,
                       consume_ready: bool = False) -> None:
        """Queue the kernel and the result's conversion into ``res`` between the ``ready`` word
        (the inputs have landed) and the ``done`` word (the device may read ``res``). ``out``:
        the kernel's float32 accumulator (``[n, H_p]`` or more rows; a new one if None).
        ``consume_ready``: the job takes the ready word back to 0 once it has seen it (a graphed
        call, whose graph's next replay raises it again)."""
        global _native_pending
        n, k = ids.shape
        if out is None:
            out = torch.empty(n, self.hp, dtype=torch.float32)
        job = _WsMoeJob(self.gate_up.data_ptr(), self.down.data_ptr(), self._wdtype,
                        self.num_experts, self.hidden,
                        self.inter, self.hp, self.ip, x.data_ptr(), n, ids.data_ptr(),
                        w.data_ptr(), k, out.data_ptr(), res.data_ptr(),
                        0 if res.dtype == torch.bfloat16 else 1, min(_detected(), _isa_cap()),
                        _amx_min(), get_num_threads(), *self._fp8_args())
        fn = ctypes.cast(_get_lib().ws_moe_job, ctypes.c_void_p).value
        queue.submit_fn(fn, ctypes.addressof(job), (job, x, ids, w, out, res, self),
                        ready=ready, done=done, spin_s=_ready_spin_s(),
                        consume_ready=consume_ready)
        _native_pending += 1

    def _compute_signalled(self, x, ids, w, event, res: torch.Tensor, flags, seq: int) -> None:
        """Worker side when the device waits: the result goes into ``res``; the flag is raised
        whatever happens (a failure is re-raised by :func:`raise_pending_errors`)."""
        try:
            res.copy_(self._compute(x, ids, w, res.dtype, False, event))
        finally:
            flags.signal(self._slot, seq)

    def wait(self, handle: CpuExpertsHandle) -> torch.Tensor:
        """``[N, H]`` on the device and dtype of the submitted hidden states. On CUDA (with Triton)
        the returned tensor is filled in stream order once the CPU is done: the device waits, this
        thread goes on."""
        if handle.result is not None:
            if handle.host is not None and len(_host_marks) < _TIMELINE_MAX:
                _host_marks.append((*handle.host, time.perf_counter()))
            flags = _host_flags(torch.device(handle.device))
            flags.wait(self._slot, handle.seq)
            if handle.mark is not None and len(_timeline) < _TIMELINE_MAX:
                seen = torch.cuda.Event(enable_timing=True)
                seen.record()
                _timeline.append((handle.mark, seen))
            if handle.future is not None:  # (the native queue's calls: drained at the step's end)
                _pending.append(handle.future)
            return handle.result.to(handle.device, non_blocking=True)
        out = handle.future.result()
        if handle.device.type != "cpu":
            out = out.to(handle.device, non_blocking=True)
        return out

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor, routed: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``wait(submit(...))``. With host tensors there is nothing to overlap, so the kernel runs
        in the calling thread: the hop to the worker thread costs ~0.2 ms a call (H200 host,
        bench/results/cpu_experts-h200-threads.json, async vs inline rows)."""
        global _eager_calls
        if hidden.device.type != "cpu":
            return self.wait(self.submit(hidden, topk_ids, topk_weights, routed, out_dtype))
        self._check(hidden, topk_ids, topk_weights)
        _eager_calls += 1
        out_dtype = out_dtype or hidden.dtype
        if hidden.shape[0] == 0:
            return torch.zeros(0, self.hidden, dtype=out_dtype)
        x = hidden.detach().to(self.dtype).contiguous()
        ids = topk_ids.detach().to("cpu", torch.int32).contiguous()
        w = topk_weights.detach().to("cpu", torch.float32).contiguous()
        _route(ids if routed is None else routed.detach().to("cpu", torch.int32),
               self.expert_bytes)
        return self._compute(x, ids, w, out_dtype, False, None)

    __call__ = forward

    def _compute(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype,
                 pin: bool, event) -> torch.Tensor:
        global _inline_s
        if event is not None:
            event.synchronize()
        t = time.perf_counter()
        if self.backend == "cpp":
            out = self._compute_cpp(x, ids, w)
        else:
            out = self._compute_torch(x, ids, w)
        with _inline_lock:
            _inline_s += time.perf_counter() - t
        if pin:
            res = torch.empty(out.shape, dtype=out_dtype, pin_memory=True)
            res.copy_(out)
            return res
        return out.to(out_dtype)

    def _compute_cpp(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        lib = _get_lib()
        n, k = ids.shape
        out = torch.empty(n, self.hp, dtype=torch.float32)
        isa = min(_detected(), _isa_cap())
        amx_min = _amx_min()
        rc = lib.ws_moe_forward(
            self.gate_up.data_ptr(), self.down.data_ptr(), self._wdtype,
            self.num_experts, self.hidden, self.inter, self.hp, self.ip,
            x.data_ptr(), n, ids.data_ptr(), w.data_ptr(), k, out.data_ptr(),
            isa, amx_min, get_num_threads(), *self._fp8_args())
        if rc == -1:
            bad = ids[(ids < -1) | (ids >= self.num_experts)]
            raise IndexError(f"topk_ids out of range [0, {self.num_experts}): {bad[:8].tolist()}")
        if rc != 0:
            raise RuntimeError(f"CPU expert kernel failed (code {rc})")
        return out[:, :self.hidden]

    @property
    def _wdtype(self) -> int:
        """The kernel's weight format code (csrc/cpu_experts.cpp: W_BF16, W_F32, W_FP8)."""
        if self.fp8 is not None:
            return 2
        return 0 if self.dtype == torch.bfloat16 else 1

    def _fp8_args(self) -> tuple[int, int, int, int, int, int]:
        """The kernel's FP8 arguments: the scale grids' addresses, the block and the line masks'
        addresses (null: the bf16(q * scale) products, :attr:`fp8_exact` False; zeros
        otherwise)."""
        if self.fp8 is None:
            return 0, 0, 0, 0, 0, 0
        masks = ((self.gate_up_masks.data_ptr(), self.down_masks.data_ptr()) if self.fp8_exact
                 else (0, 0))
        return (self.gate_up_scale.data_ptr(), self.down_scale.data_ptr(), *self.fp8.block,
                *masks)

    def _compute_torch(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        n, k = ids.shape
        E, I = self.num_experts, self.inter
        flat = ids.reshape(-1).long()
        if flat.numel() and (int(flat.min()) < -1 or int(flat.max()) >= E):
            bad = flat[(flat < -1) | (flat >= E)]
            raise IndexError(f"topk_ids out of range [0, {E}): {bad[:8].tolist()}")
        order = torch.argsort(flat, stable=True)
        order = order[flat[order] >= 0]  # -1: a slot another reader takes (expert_link.py)
        counts = torch.bincount(flat[order], minlength=E).tolist()
        tok, wflat = order // k, w.reshape(-1)[order]
        out = torch.zeros(n, self.hidden, dtype=torch.float32)
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            t = tok[start:start + c]
            we = wflat[start:start + c]
            start += c
            gu = F.linear(x[t], self.gate_up[e])
            h = F.silu(gu[:, :I]) * gu[:, I:]
            y = F.linear(h, self.down[e])
            out.index_add_(0, t, y.float() * we[:, None])
        return out
