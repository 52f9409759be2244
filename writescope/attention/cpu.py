"""CPU decode attention over C blocks (CPU layout) and T blocks (GPU layout), read in place.

:func:`attend_cpu` has the signature of :func:`~writescope.attention.torch_paged.attend_torch`
and returns ``(out, lse)`` in the convention of :mod:`writescope.attention.merge`.

The kernel (``csrc/``) is plain C++ with OpenMP, built on first use with the system compiler
and cached under the torch extensions directory, keyed by a hash of the sources and flags. It
is one shared library holding one translation unit per instruction set (AVX2, AVX-512, AMX;
each compiled for its ISA by a ``#pragma GCC target``), chosen at run time from cpuid, so the
same build runs on any x86-64 machine. Without a compiler (or on another architecture) the
module warns once and uses :func:`attend_torch`.

Work is split over (sequence, KV head, chunk of blocks); every query vector of a KV group (all
query heads, all query rows of the sequence) is computed from each K/V row read once; the
chunks are merged by log-sum-exp inside the kernel. A GQA block that several of a call's
sequences list (prefix caching) is read once for all of them (:mod:`.shared_reads`). See
``csrc/attn_impl.h`` (AVX2/AVX-512), ``csrc/attn_bf16.cpp`` (VDPBF16PS) and
``csrc/attn_amx.cpp`` (AMX tiles, bf16) for the arithmetic.

Threads: ``WRITESCOPE_CPU_ATTN_THREADS`` or :func:`set_num_threads`; by default every usable
core minus :func:`reserve_cores` (cores the engine keeps for its other CPU work).
ISA: ``WRITESCOPE_CPU_ATTN_ISA`` = ``auto`` (default) | ``amx`` | ``avx512bf16`` |
``avx512bf16-l2`` | ``avx512`` | ``avx2``, or :func:`set_isa`. ``auto`` picks, for bf16 KV, AMX,
else AVX-512 BF16 dot products (``csrc/attn_bf16.cpp``), else fp32 FMAs on widened bf16; fp32 KV
always takes the FMA path. ``avx512bf16-l2`` is the BF16 kernel prefetching into L2 instead of
L1 (``csrc/attn_bf16_l2.cpp``): faster on some cores (Zen 4), not on others (Zen 5), and
``auto``'s choice but on Zen 5 (:func:`l1_prefetch_core`); an engine runs the variant its
profile's calibration found fastest per attention family.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from ..kvcache.regions import KVSpec
from . import shared_reads
from .batch import BlockBatch
from .torch_paged import attend_torch

__all__ = ["attend_cpu", "CpuAttentionPlan", "CpuJobQueue", "current_isa_setting", "available",
           "set_num_threads", "get_num_threads", "num_threads_setting", "reserve_cores", "set_isa", "get_isa", "isas",
           "set_prefetch_blocks", "get_prefetch_blocks", "prefetch_chosen_by_user",
           "features", "read_bandwidth", "tile_read_bandwidth", "use_library"]

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = ("attn_ops.cpp", "attn_avx2.cpp", "attn_avx512.cpp", "attn_bf16.cpp", "attn_amx.cpp",
            "attn_bf16_l2.cpp")
#: sources an older revision's kernel (``bench.cpu_ab --against``) may lack: built when present
_OPTIONAL_SOURCES = ("attn_bf16_l2.cpp",)
_HEADERS = ("attn_common.h", "attn_impl.h", "attn_evenodd.h", "attn_v512.h", "attn_amx_emu.h",
            "attn_tiles.h")
_CFLAGS = ["-O3", "-fPIC", "-std=c++17", "-fopenmp", "-fno-math-errno"]
_ISA_CODE = {"avx2": 0, "avx512": 1, "amx": 2, "avx512bf16": 3, "avx512bf16-l2": 4}
_F_AVX2, _F_AVX512, _F_BF16, _F_AMX = 1, 2, 4, 8

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_load_tried = False
_load_error: str | None = None
_warned = False
_features = 0
_amx_ok = False
_threads: int | None = None
_reserved = 0
_isa = os.environ.get("WRITESCOPE_CPU_ATTN_ISA", "auto")
# 2: on the H200 host MLA ran 69.1 / 62.6 GB/s at 1x256K / 8x32K against 64.7 / 58.9 at 1 block
# (GQA within 3%; bench/results/2026-12-01b-h200 call 1)
# A profile may carry a better distance per attention family (calibration times 0, 1 and 2).
DEFAULT_PREFETCH_BLOCKS = 2
_prefetch_blocks = int(os.environ.get("WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS", DEFAULT_PREFETCH_BLOCKS))
_prefetch_user = "WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS" in os.environ  # not the default/profile
_isa_from_profile = False  # the setting is an engine's choice from its profile, not the user's


def _build_dir(extra_flags: tuple[str, ...] = (), csrc: Path = _CSRC) -> Path:
    from torch.utils.cpp_extension import get_default_build_root
    h = hashlib.sha256()
    # an earlier revision's csrc (bench.cpu_ab) may lack a header added since
    for name in _present(csrc) + tuple(n for n in _HEADERS if (csrc / n).is_file()):
        h.update(name.encode())
        h.update((csrc / name).read_bytes())
    h.update(" ".join(_CFLAGS + list(extra_flags)).encode())
    return Path(get_default_build_root()) / f"writescope_cpu_attn_{h.hexdigest()[:16]}"


def _present(csrc: Path) -> tuple[str, ...]:
    """The sources to build from ``csrc``: all, less the optional ones it lacks."""
    return tuple(n for n in _SOURCES if n not in _OPTIONAL_SOURCES or (csrc / n).is_file())


def _compile(out: Path, extra_flags: tuple[str, ...] = (), csrc: Path = _CSRC) -> None:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("no C++ compiler found (set CXX)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        procs, objs = [], []
        sources = _present(csrc)
        for src in sources:
            obj = Path(tmp) / (src + ".o")
            objs.append(str(obj))
            procs.append(subprocess.Popen([cxx, *_CFLAGS, *extra_flags, "-c", str(csrc / src),
                                           "-o", str(obj)],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        errs = []
        for src, p in zip(sources, procs):
            log = p.communicate()[0].decode(errors="replace")
            if p.returncode:
                errs.append(f"{src}:\n{log[-3000:]}")
        if errs:
            raise RuntimeError("compiling the CPU attention kernel failed:\n" + "\n".join(errs))
        so = Path(tmp) / "lib.so"
        subprocess.run([cxx, "-shared", "-fopenmp", *objs, "-o", str(so)], check=True,
                       capture_output=True)
        os.replace(so, out)  # atomic: concurrent builders each publish a complete library


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    f = ctypes.c_float
    i, i64, p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.ws_attend.restype = i
    lib.ws_attend.argtypes = [p, i, i, p, i, i, i64, i, i, i, i, i, i, i, p, p, p, p, i, f,
                              p, p, i, i, i]
    lib.ws_attend_ex.restype = i
    lib.ws_attend_ex.argtypes = [p, i, i, i, p, i, i, i64, i, i, i, i, i, i, i, p, p, p, p,
                                 i, f, p, p, i, i, i]
    d = ctypes.c_double
    lib.ws_attend_flagged.restype = i
    # a call's second pool (Src2; a null kv: none), then each pool's shared sets (WsShared*;
    # null: none)
    second = [p, i, i, i64, p, p, p, i, p, p]
    lib.ws_attend_flagged.argtypes = [p, i64, p, i64, d, d, p, *lib.ws_attend_ex.argtypes,
                                      *second]
    lib.ws_queue_new.restype = p
    lib.ws_queue_new.argtypes = []
    lib.ws_queue_submit.restype = i
    lib.ws_queue_submit.argtypes = [p, p, i64, p, i64, d, d, *lib.ws_attend_ex.argtypes,
                                    *second]
    lib.ws_queue_submit_fn.restype = i
    lib.ws_queue_submit_fn.argtypes = [p, p, i64, p, i64, d, d, p, p]
    lib.ws_queue_drain.restype = i
    lib.ws_queue_drain.argtypes = [p, d, p]
    try:  # (an earlier revision's library, bench.cpu_ab, lacks these)
        lib.ws_queue_submit_fn_ex.restype = i
        lib.ws_queue_submit_fn_ex.argtypes = [p, p, i64, p, i64, d, d, p, p, i]
        lib.ws_queue_drain_to.restype = i
        lib.ws_queue_drain_to.argtypes = [p, i64, d, p]
    except AttributeError:
        pass
    try:  # (likewise)
        lib.ws_set_team_lock.restype = i
        lib.ws_set_team_lock.argtypes = [i]
    except AttributeError:
        pass
    lib.ws_queue_times.restype = i
    lib.ws_queue_times.argtypes = [p, p, i]
    lib.ws_queue_free.restype = None
    lib.ws_queue_free.argtypes = [p]
    lib.ws_cpu_features.restype = i
    lib.ws_amx_request.restype = i
    lib.ws_default_threads.restype = i
    lib.ws_set_prefetch_blocks.restype = None
    lib.ws_set_prefetch_blocks.argtypes = [i]
    lib.ws_read_seconds.restype = ctypes.c_double
    lib.ws_read_seconds.argtypes = [p, i64, i, i, i64, ctypes.POINTER(ctypes.c_double)]
    lib.ws_tile_read_seconds.restype = ctypes.c_double
    lib.ws_tile_read_seconds.argtypes = [p, i64, i, i, i64, ctypes.POINTER(ctypes.c_double)]
    return lib


def build_test_variant(extra_flags: tuple[str, ...], csrc: Path | None = None) -> ctypes.CDLL:
    """Tests and diagnostics: the kernel library built with extra compiler flags (e.g.
    ``-DWS_AMX_EMULATE``, which runs the AMX variant on a portable tile emulation, or
    ``-DWS_PHASES``, which times the AMX kernel's phases), or from another copy of ``csrc/``
    (``csrc``: a folder with the same files, e.g. an earlier revision's, for
    ``writescope.bench.cpu_ab``), cached like the normal build but never used by
    :func:`attend_cpu` outside :func:`use_library`."""
    src = Path(csrc) if csrc is not None else _CSRC
    path = _build_dir(tuple(extra_flags), src) / "libwritescope_cpu_attn.so"
    if not path.exists():
        _compile(path, tuple(extra_flags), src)
    lib = _declare(ctypes.CDLL(str(path)))
    lib.ws_emulated_tiles = "-DWS_AMX_EMULATE" in extra_flags  # runs "amx" on any AVX-512 BF16 CPU
    return lib


@contextlib.contextmanager
def use_library(lib: ctypes.CDLL):
    """:func:`attend_cpu` runs ``lib`` (a :func:`build_test_variant`) inside the block; the
    normal build is loaded first, so the CPU's features and the AMX permission are known. An
    emulated-tile build (``-DWS_AMX_EMULATE``) makes ``"amx"`` one of :func:`isas` inside the
    block on a CPU whose AVX-512 BF16 runs its vector parts, as the tests' ``swap_in`` does."""
    global _lib, _features, _amx_ok
    if _load() is None:
        raise RuntimeError(f"the CPU kernel is not available: {_load_error}")
    prev, prev_features, prev_amx = _lib, _features, _amx_ok
    lib.ws_set_prefetch_blocks(_prefetch_blocks)
    if hasattr(lib, "ws_set_team_lock"):
        lib.ws_set_team_lock(int(_team_lock))
    _lib = lib
    if getattr(lib, "ws_emulated_tiles", False) and _features & _F_BF16:
        _features, _amx_ok = _features | _F_AMX, True
    try:
        yield lib
    finally:
        _lib, _features, _amx_ok = prev, prev_features, prev_amx


def _load() -> ctypes.CDLL | None:
    global _lib, _load_tried, _load_error, _features, _amx_ok
    if _load_tried:
        return _lib
    with _lock:
        if _load_tried:
            return _lib
        try:
            if platform.machine().lower() not in ("x86_64", "amd64"):
                raise RuntimeError(f"the kernel targets x86-64, this is {platform.machine()}")
            path = _build_dir() / "libwritescope_cpu_attn.so"
            if not path.exists():
                _compile(path)
            lib = _declare(ctypes.CDLL(str(path)))
            _features = lib.ws_cpu_features()
            if _features & _F_AMX:
                _amx_ok = lib.ws_amx_request() == 0
            if not _features & _F_AVX2:
                raise RuntimeError("the CPU lacks AVX2+FMA")
            lib.ws_set_prefetch_blocks(_prefetch_blocks)
            lib.ws_set_team_lock(int(_team_lock))
            _lib = lib
        except Exception as e:  # no compiler, failed build, unsupported CPU: torch fallback
            _load_error = f"{type(e).__name__}: {e}"
            _lib = None
        _load_tried = True
    return _lib


def available() -> bool:
    """True when the compiled kernel is loaded (building it on first call)."""
    return _load() is not None


def load_error() -> str | None:
    """Why :func:`available` is False (None when it is True or was not asked yet)."""
    _load()
    return _load_error


def features() -> dict[str, bool]:
    _load()
    return {"avx2": bool(_features & _F_AVX2), "avx512": bool(_features & _F_AVX512),
            "avx512_bf16": bool(_features & _F_BF16), "amx": bool(_features & _F_AMX) and _amx_ok}


def isas() -> list[str]:
    """Kernel variants this machine can run, slowest first."""
    f = features()
    have = {"avx2": f["avx2"], "avx512": f["avx512"], "avx512bf16": f["avx512_bf16"],
            "avx512bf16-l2": f["avx512_bf16"], "amx": f["amx"]}
    return [k for k in ("avx2", "avx512", "avx512bf16", "avx512bf16-l2", "amx")
            if have[k]] if available() else []


def set_isa(isa: str, *, from_profile: bool = False) -> None:
    """``auto``, or force one of :func:`isas` (tests and benchmarks). ``from_profile``: an
    engine applies its profile's measured fastest variant; a later engine may apply its own."""
    global _isa, _isa_from_profile
    if isa != "auto" and isa not in _ISA_CODE:
        raise ValueError(f"unknown ISA {isa!r}")
    _isa = isa
    _isa_from_profile = from_profile and isa != "auto"


def set_prefetch_blocks(n: int | None, *, from_profile: bool = False) -> None:
    """How many blocks ahead of its reads the AMX kernel's software prefetch into L2 may run
    (default 2, or ``WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS``): farther hides more DRAM latency
    when many cores stream at once, at the cost of L2 room; 0 issues no software prefetch and
    leaves the streams to the hardware prefetchers (on the 2-core dev VM the MLA kernel reads
    15-30% faster so; on the H200 host it is 10-25% slower). ``writescope calibrate`` measures
    the best per attention family into the profile.
    ``from_profile``: an engine applies its profile's measured best distance. ``None``: back to
    the default (or the environment's)."""
    global _prefetch_blocks, _prefetch_user
    if n is None:
        env = os.environ.get("WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS")
        n, from_profile = (DEFAULT_PREFETCH_BLOCKS, True) if env is None else (int(env), False)
    if int(n) < 0:
        raise ValueError("prefetch distance must be >= 0 blocks (0: no software prefetch)")
    _prefetch_user = not from_profile
    _prefetch_blocks = int(n)
    if _lib is not None:
        _lib.ws_set_prefetch_blocks(_prefetch_blocks)


def get_prefetch_blocks() -> int:
    return _prefetch_blocks


def _team_lock_env() -> bool:
    v = os.environ.get("WRITESCOPE_CPU_TEAM_LOCK", "1").strip().lower()
    return v not in ("0", "off", "false", "no")


#: whether the job queues' calls run one at a time on the CPU's cores (:func:`set_team_lock`)
_team_lock = _team_lock_env()


def set_team_lock(on: bool | None) -> bool:
    """Whether the native job queues' calls (:class:`CpuJobQueue`: CPU attention and the CPU
    routed experts' calls) take one process-wide lock for their kernels, so that two queues'
    thread teams never run at once on the same cores (``csrc/attn_ops.cpp``, ``g_team_mu``).
    A call takes it once its inputs are ready, never while it waits for them. On by default
    (``WRITESCOPE_CPU_TEAM_LOCK=0``: off); ``None``: back to the environment's setting. It
    matters where two queues have ready calls at once: a decode step split into two
    sub-batches with the experts on the CPU and CPU attention (``WRITESCOPE_PIPELINE_EXPERTS=
    all``). Returns the setting before."""
    global _team_lock
    before = _team_lock
    _team_lock = _team_lock_env() if on is None else bool(on)
    if _lib is not None and hasattr(_lib, "ws_set_team_lock"):
        _lib.ws_set_team_lock(int(_team_lock))
    return before


def team_lock() -> bool:
    """:func:`set_team_lock`'s setting."""
    return _team_lock


def prefetch_chosen_by_user() -> bool:
    """Whether the distance came from ``WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS`` or a
    :func:`set_prefetch_blocks` call (not from an engine's profile, nor the default)."""
    return _prefetch_user


def current_isa_setting() -> str:
    """What :func:`set_isa` last set (``auto`` by default)."""
    return _isa


def isa_chosen_by_user() -> bool:
    """Whether a variant was forced by ``WRITESCOPE_CPU_ATTN_ISA`` or :func:`set_isa` (not by an
    engine's profile): engines then leave it alone."""
    return _isa != "auto" and not _isa_from_profile


def get_isa(dtype: torch.dtype = torch.bfloat16) -> str:
    """The variant :func:`attend_cpu` uses for KV of ``dtype`` (AMX only runs bf16 KV)."""
    have = isas()
    if not have:
        return "torch"
    if _isa != "auto":
        if _isa not in have:
            raise RuntimeError(f"ISA {_isa!r} not available here (have {have})")
        return _isa
    if "amx" in have and dtype == torch.bfloat16:
        return "amx"
    if "avx512bf16" in have and dtype == torch.bfloat16:
        return "avx512bf16" if l1_prefetch_core() else "avx512bf16-l2"
    return "avx512" if "avx512" in have else "avx2"


@functools.lru_cache(maxsize=1)
def l1_prefetch_core() -> bool:
    """Whether ``auto``'s AVX-512 BF16 kernel prefetches into L1 (``avx512bf16``) rather than L2
    (``avx512bf16-l2``): on AMD family-26 cores (Zen 5), where L1 read 1.00-1.11x faster
    (eighteenth session, ``bench.cpu_ab``); everywhere else L2, as the other kernels prefetch
    (on the Zen 4 dev VMs L2 reads 1.2-1.5x faster: 24-26 against 16-18 GB/s in the eighty-second
    session's issue-8 table). A profile's calibrated variant overrides either."""
    try:
        return zen5_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


def zen5_cpuinfo(info: str) -> bool:
    """Whether /proc/cpuinfo's text names an AMD family-26 (Zen 5) processor."""
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)", info, re.M)
    return bool(vendor and family and vendor.group(1) == "AuthenticAMD" and int(family.group(1)) == 26)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def reserve_cores(n: int) -> None:
    """Keep ``n`` cores out of the default thread count (the engine's other CPU work)."""
    global _reserved
    _reserved = max(0, int(n))


def set_num_threads(n: int | None) -> None:
    """The kernel's own thread count (None: back to the default)."""
    global _threads
    _threads = None if n is None else max(1, int(n))


def num_threads_setting() -> int | None:
    """What :func:`set_num_threads` last set (None: the default, from the environment or the
    usable cores)."""
    return _threads


def get_num_threads() -> int:
    if _threads is not None:
        return _threads
    env = os.environ.get("WRITESCOPE_CPU_ATTN_THREADS")
    if env:
        return max(1, int(env))
    return max(1, _usable_cores() - _reserved)


def _warn_fallback() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"writescope: compiled CPU attention kernel unavailable ({_load_error}); "
                      "using the torch path", RuntimeWarning, stacklevel=3)


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def attend_cpu(q: torch.Tensor, kv: torch.Tensor, layout: str, spec: KVSpec, batch: BlockBatch,
               scale: float, *, chunk_blocks: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [nq, Hq, Dk]`` over one layer's pool ``kv``; returns float32 ``(out, lse)``.

    ``layout`` "cpu": ``kv`` is a C region layer ``[N, H, bs/2, R, 2]`` (see
    :func:`~writescope.kvcache.regions.cpu_pool_shape`); "gpu": a T/G region layer
    ``[N, bs, H, R]``. Falls back to :func:`attend_torch` (with one warning) when the kernel
    cannot run.
    """
    return CpuAttentionPlan(kv, layout, spec, batch, scale, q.shape[0], q.shape[1], q.dtype,
                            chunk_blocks=chunk_blocks)(q, kv)


class CpuAttentionPlan:
    """:func:`attend_cpu` for one step's batch, checked and converted once and then run per
    layer (plan once per step, run per layer): a call is one ``ctypes`` call with the layer's
    pool and this step's queries, writing into given buffers if any. The worker thread that runs
    the CPU side then holds the GIL only for a few microseconds around each kernel call.

    ``kv``: any layer of the pool (layers share shape and strides). ``threads``: the team's size
    for this plan's calls (default: :func:`get_num_threads` at each call), so that one engine's
    thread count does not become every later caller's."""

    def __init__(self, kv: torch.Tensor, layout: str, spec: KVSpec, batch: BlockBatch,
                 scale: float, nq: int, hq: int, q_dtype: torch.dtype = torch.float32, *,
                 chunk_blocks: int = 0, threads: int | None = None):
        self.layout, self.spec, self.batch, self.scale = layout, spec, batch, float(scale)
        self.nq, self.hq = int(nq), int(hq)
        #: blocks several sequences list, read once for all (``WsShared``; None: none)
        self.shared: shared_reads.SharedSplit | None = None
        self._shared_arg = None  # (its ctypes struct, the arrays it points into)
        self._paired: CpuAttentionPlan | None = None  # the last plan pairs_with accepted
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        self.threads = None if threads is None else int(threads)
        self.lib = _load()
        if self.lib is None:
            _warn_fallback()
            self.torch_path = True
            return
        H, R = spec.num_kv_heads, spec.rec_dim
        if layout == "cpu":
            bs = kv.shape[2] * 2
            inner_ok = kv.dim() == 5 and tuple(kv.shape[1:]) == (H, bs // 2, R, 2)
            inner = H * bs * R
        else:
            bs = kv.shape[1]
            inner_ok = kv.dim() == 4 and tuple(kv.shape[2:]) == (H, R)
            inner = bs * H * R
        self.torch_path = bool(
            kv.device.type != "cpu" or kv.dtype not in (torch.float32, torch.bfloat16)
            or not inner_ok or self.hq % H or spec.k_dim % 8 or spec.v_dim % 8
            or (kv.shape[0] > 1 and kv.stride(0) < inner) or not kv[:1].is_contiguous())
        if self.torch_path:
            return
        self.kv_shape, self.kv_stride, self.kv_dtype = tuple(kv.shape), kv.stride(0), kv.dtype
        self._ints = [t.to("cpu", torch.int32).contiguous() for t in
                      (batch.q_indptr, batch.kv_indptr, batch.kv_blocks, batch.kv_lens)]
        if batch.num_seqs > 1 and shared_reads.applies(spec.is_mla):
            self._share(shared_reads.split_shared(*(t.numpy() for t in self._ints)))
        self._const = (H, bs, R, spec.k_offset, spec.k_dim, spec.v_offset, spec.v_dim,
                       *(_ptr(t) for t in self._ints), batch.num_seqs, self.scale)
        self._isa = _ISA_CODE[get_isa(kv.dtype)]
        self._chunk = int(chunk_blocks)

    def _share(self, split: shared_reads.SharedSplit | None) -> None:
        """Read ``split``'s sets once for all their holders: the calls' own lists leave them
        out (``WsShared`` in ``csrc/attn_common.h``)."""
        if split is None:
            return
        arrays = [torch.from_numpy(a) for a in (split.set_indptr, split.set_seqs,
                                                split.set_kv_indptr, split.set_kv_blocks,
                                                split.set_kv_lens)]
        self._ints[1:] = [torch.from_numpy(a) for a in (split.kv_indptr, split.kv_blocks,
                                                        split.kv_lens)]
        self._shared_arg = (_WsShared(split.num_sets, *(_ptr(a) for a in arrays)), arrays)
        self.shared = split

    def _sh_ptr(self) -> int | None:
        return None if self._shared_arg is None else ctypes.addressof(self._shared_arg[0])

    @property
    def flagged(self) -> bool:
        """Whether calls may carry ``ready`` / ``done`` flag words (the compiled kernel)."""
        return not self.torch_path

    def pairs_with(self, other: CpuAttentionPlan) -> bool:
        """Whether one call can attend this plan's blocks and ``other``'s (another pool's
        blocks of the same sequences, e.g. C blocks and T blocks read in place): both compiled,
        the same queries, spec, scale, block size and KV dtype. (Checked once per pair: a
        step's calls ask again at every layer.)"""
        if other is self._paired:
            return True
        ok = (not self.torch_path and not other.torch_path and self.nq == other.nq
              and self.hq == other.hq and self.spec == other.spec and self.scale == other.scale
              and self.kv_dtype == other.kv_dtype and self._const[:7] == other._const[:7]
              and self.batch.num_seqs == other.batch.num_seqs
              and torch.equal(self._ints[0], other._ints[0]))
        if ok:
            self._paired = other
        return ok

    def _pair_args(self, second: tuple[CpuAttentionPlan, torch.Tensor] | None) -> tuple:
        """A call's second pool (``Src2`` in csrc/attn_ops.cpp): ``second``'s plan and layer,
        or none (a null pool); then both pools' shared sets (``WsShared*``, None: none)."""
        if second is None:
            return (None, 0, 0, 0, None, None, None, 0, self._sh_ptr(), None)
        other, kv = second
        if not self.pairs_with(other):
            raise ValueError("these two plans cannot share a call (see pairs_with)")
        if (tuple(kv.shape), kv.stride(0), kv.dtype) != (other.kv_shape, other.kv_stride,
                                                          other.kv_dtype):
            raise ValueError("pool layer differs from the one the plan was made for")
        return (_ptr(kv), 1 if kv.dtype == torch.bfloat16 else 0,
                0 if other.layout == "cpu" else 1, other.kv_stride,
                *(_ptr(t) for t in other._ints[1:]), other._isa, self._sh_ptr(), other._sh_ptr())

    def _native_args(self, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor | None,
                     lse: torch.Tensor | None) -> tuple | None:
        """The kernel's arguments for one call, with the tensors they point into; None when
        this call takes the torch path."""
        if q.shape[0] != self.nq or q.shape[1] != self.hq:
            raise ValueError(f"planned for {self.nq} x {self.hq} query vectors, got "
                             f"{tuple(q.shape[:2])}")
        if self.torch_path or q.device.type != "cpu" or q.shape[2] != self.spec.k_dim:
            return None
        if (tuple(kv.shape), kv.stride(0), kv.dtype) != (self.kv_shape, self.kv_stride,
                                                          self.kv_dtype):
            raise ValueError("pool layer differs from the one the plan was made for")
        # bf16 or fp32 queries go to the kernel as they are (it widens while packing): no
        # torch op here, whose intra-op team would wake up beside the kernel's
        if q.dtype in (torch.float32, torch.bfloat16) and q.is_contiguous():
            qf = q
        else:
            qf = q.detach().to(torch.float32).contiguous()
        o = out if out is not None else torch.empty(self.nq, self.hq, self.spec.v_dim,
                                                    dtype=torch.float32)
        l = lse if lse is not None else torch.empty(self.nq, self.hq, dtype=torch.float32)
        args = (_ptr(qf), 1 if qf.dtype == torch.bfloat16 else 0, self.nq, self.hq, _ptr(kv),
                1 if kv.dtype == torch.bfloat16 else 0, 0 if self.layout == "cpu" else 1,
                self.kv_stride, *self._const, _ptr(o), _ptr(l), self._isa,
                self.threads or get_num_threads(), self._chunk)
        return args, (qf, kv, o, l, self._ints)

    def __call__(self, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor | None = None,
                 lse: torch.Tensor | None = None, *, ready: tuple[int, int] | None = None,
                 done: tuple[int, int] | None = None, timeout_s: float = 60.0,
                 spin_s: float = 0.0, times: list | None = None,
                 second: tuple[CpuAttentionPlan, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ready`` / ``done``: ``(address, value)`` of pinned int64 words (:attr:`flagged`
        plans only). The call first waits until the ready word reaches its value, and stores the
        done value once the result is written (also when it fails), all in one native call: no
        Python, and so no interpreter lock, between the kernel's end and the store. ``spin_s``:
        start the kernel's threads before the wait, spinning on the ready word for up to this
        long (``flagged_call`` in ``csrc/attn_ops.cpp``). ``times`` (a list) receives
        ``[seconds waiting for ready, seconds in the kernel]``. ``second``: ``(plan, kv)`` of
        another pool's blocks of the same sequences (:meth:`pairs_with`), attended in the same
        call: one result over both pools' blocks."""
        if (ready is not None or done is not None) and not self.flagged:
            raise ValueError("ready/done flags need the compiled kernel")
        native = self._native_args(q, kv, out, lse)
        extra = self._pair_args(second)
        if native is None and second is not None:
            raise ValueError("these two plans cannot share a call (see pairs_with)")
        if native is None:
            o, l = attend_torch(q, kv, self.layout, self.spec, self.batch, self.scale)
            if out is not None:
                out.copy_(o)
                lse.copy_(l)
                return out, lse
            return o, l
        args, (_, _, o, l, _) = native
        if ready is None and done is None and second is None and self.shared is None:
            rc = self.lib.ws_attend_ex(*args)
        else:
            r_addr, r_val = ready if ready is not None else (None, 0)
            d_addr, d_val = done if done is not None else (None, 0)
            tw = (ctypes.c_double * 2)()
            rc = self.lib.ws_attend_flagged(r_addr, r_val, d_addr, d_val, float(timeout_s),
                                            float(spin_s), tw, *args, *extra)
            if times is not None:
                times[:] = [tw[0], tw[1]]
            if rc == -10:
                raise TimeoutError(f"the device did not raise the queries' ready flag in "
                                   f"{timeout_s:.0f} s")
        if rc != 0:
            raise RuntimeError(f"ws_attend_ex failed ({rc})")
        return o, l


class _WsShared(ctypes.Structure):
    """``WsShared`` of ``csrc/attn_common.h``."""
    _fields_ = [("nsets", ctypes.c_int32), ("set_indptr", ctypes.c_void_p),
                ("set_seqs", ctypes.c_void_p), ("kv_indptr", ctypes.c_void_p),
                ("kv_blocks", ctypes.c_void_p), ("kv_lens", ctypes.c_void_p)]


class _WsMergeJob(ctypes.Structure):
    """``WsMergeJob`` of ``csrc/attn_ops.cpp``."""
    _fields_ = [("o", ctypes.c_void_p), ("l", ctypes.c_void_p), ("o2", ctypes.c_void_p),
                ("l2", ctypes.c_void_p), ("rows", ctypes.c_int64), ("dv", ctypes.c_int32)]


class CpuJobQueue:
    """Runs flagged kernel calls (:class:`CpuAttentionPlan` with ``ready`` / ``done``) in order
    on one native thread of its own: between two calls that thread needs no interpreter lock,
    so a launching thread that holds it cannot delay the next layer's CPU side (a Python worker
    waits for it up to the interpreter's switch interval). :meth:`submit` returns at once;
    :meth:`drain` waits for every submitted call (or those before a :meth:`mark`) and reports
    their times and the first failure among them. The tensors of a submitted call are kept
    alive here until the drain that covers it."""

    def __init__(self):
        self.lib = _load()
        if self.lib is None:
            raise RuntimeError(f"the CPU job queue needs the compiled kernel ({_load_error})")
        from .hostflag import timer_slack_ns
        timer_slack_ns()  # a bad WRITESCOPE_TIMER_SLACK_NS fails here, not silently in the thread
        self._q = self.lib.ws_queue_new()
        #: (the call's number, what it points into), in submission order
        self._keep: collections.deque = collections.deque()
        self._submitted = 0

    def mark(self) -> int:
        """The calls submitted so far: :meth:`drain` ``(upto=mark)`` covers exactly them."""
        return self._submitted

    def _kept(self, keep) -> None:
        self._keep.append((self._submitted, keep))
        self._submitted += 1

    def submit(self, plan: CpuAttentionPlan, q: torch.Tensor, kv: torch.Tensor,
               out: torch.Tensor, lse: torch.Tensor, *, ready: tuple[int, int] | None,
               done: tuple[int, int] | None, timeout_s: float = 60.0,
               spin_s: float = 0.0,
               second: tuple[CpuAttentionPlan, torch.Tensor] | None = None) -> None:
        """Queue one call of ``plan`` (see :meth:`CpuAttentionPlan.__call__`, also for
        ``second``: another pool's blocks of the same sequences in the same call)."""
        if self._q is None:
            raise RuntimeError("the CPU job queue is closed")
        extra = plan._pair_args(second)
        native = plan._native_args(q, kv, out, lse) if plan.flagged else None
        if native is None:
            raise ValueError("this call cannot run natively (torch path)")
        args, keep = native
        if keep[0] is not q:  # converted now: would read the queries before they have landed
            raise ValueError("a queued call reads its queries when it runs: they must be "
                             "float32 or bfloat16 and contiguous")
        r_addr, r_val = ready if ready is not None else (None, 0)
        d_addr, d_val = done if done is not None else (None, 0)
        rc = self.lib.ws_queue_submit(self._q, r_addr, r_val, d_addr, d_val, float(timeout_s),
                                      float(spin_s), *args, *extra)
        if rc != 0:
            raise RuntimeError(f"ws_queue_submit failed ({rc})")
        self._kept((plan, keep, second))

    def submit_fn(self, fn: int, arg: int, keep, *, ready: tuple[int, int] | None,
                  done: tuple[int, int] | None, timeout_s: float = 60.0,
                  spin_s: float = 0.0, consume_ready: bool = False) -> None:
        """Queue a native job of another library: ``fn`` (the address of an ``int fn(void*)``)
        called with ``arg`` between the same ``ready`` / ``done`` words as an attention call.
        ``keep``: whatever ``arg`` points into (kept alive until the drain that covers it). A
        nonzero return of ``fn`` is reported by :meth:`drain`, as a failed kernel call is.
        ``spin_s``: how long the queue's thread spins on the ready word before it naps.
        ``consume_ready``: the job stores 0 into the ready word once it has seen it (a graphed
        call whose next replay raises the same word, ``layers/cpu_experts_graph.py``)."""
        if self._q is None:
            raise RuntimeError("the CPU job queue is closed")
        r_addr, r_val = ready if ready is not None else (None, 0)
        d_addr, d_val = done if done is not None else (None, 0)
        if consume_ready:
            rc = self.lib.ws_queue_submit_fn_ex(self._q, r_addr, r_val, d_addr, d_val,
                                                float(timeout_s), float(spin_s), fn, arg, 1)
        else:
            rc = self.lib.ws_queue_submit_fn(self._q, r_addr, r_val, d_addr, d_val,
                                             float(timeout_s), float(spin_s), fn, arg)
        if rc != 0:
            raise RuntimeError(f"ws_queue_submit_fn failed ({rc})")
        self._kept(keep)

    def submit_merge(self, out: torch.Tensor, lse: torch.Tensor, out2: torch.Tensor,
                     lse2: torch.Tensor, *, done: tuple[int, int] | None) -> None:
        """Queue the log-sum-exp merge of the partial ``(out2, lse2)`` into ``(out, lse)``, in
        place (``ws_merge_job``; the merge module's convention), then raise ``done``: the
        calls queued before it have written both. float32, contiguous, ``[rows, Hq(, Dv)]``."""
        for t in (out, lse, out2, lse2):
            if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError("a queued merge needs contiguous float32 host tensors")
        if out.shape != out2.shape or lse.shape != lse2.shape or out.shape[:-1] != lse.shape:
            raise ValueError(f"partials of different shapes: {tuple(out.shape)}, "
                             f"{tuple(lse.shape)}, {tuple(out2.shape)}, {tuple(lse2.shape)}")
        job = _WsMergeJob(out.data_ptr(), lse.data_ptr(), out2.data_ptr(), lse2.data_ptr(),
                          lse.numel(), out.shape[-1])
        fn = ctypes.cast(self.lib.ws_merge_job, ctypes.c_void_p).value
        self.submit_fn(fn, ctypes.addressof(job), (job, out, lse, out2, lse2), ready=None,
                       done=done)

    def drain(self, timeout_s: float = 300.0, upto: int | None = None
              ) -> tuple[int, float, float]:
        """Wait for every submitted call (``upto``: the calls before that :meth:`mark`; later
        ones are left running, for a later drain); returns ``(calls, seconds waiting for ready,
        kernel seconds)`` of the calls covered since the last drain. Raises the first failure
        among them."""
        if self._q is None:
            return 0, 0.0, 0.0
        st = (ctypes.c_double * 3)()
        mark = self._submitted if upto is None else min(int(upto), self._submitted)
        if upto is None and not hasattr(self.lib, "ws_queue_drain_to"):  # an older library
            rc = self.lib.ws_queue_drain(self._q, float(timeout_s), st)
        else:
            rc = self.lib.ws_queue_drain_to(self._q, mark, float(timeout_s), st)
        if rc == -12:
            raise TimeoutError(f"queued CPU jobs still running after {timeout_s:.0f} s")
        while self._keep and self._keep[0][0] < mark:
            self._keep.popleft()
        if rc == -10:
            raise TimeoutError("the device did not raise a layer's ready flag in time")
        if rc != 0:
            raise RuntimeError(f"a queued CPU job failed (code {rc})")
        return int(st[0]), float(st[1]), float(st[2])

    def times(self, max_calls: int = 4096) -> list[tuple[float, float, float]]:
        """The finished calls' host times since the last take, oldest first: ``(popped from the
        queue, the kernel starts -- its inputs ready and the cores taken (:func:`set_team_lock`)
        --, it ends -- its done word is stored right after)`` in seconds on the clock of
        :func:`time.perf_counter` (CLOCK_MONOTONIC, Linux)."""
        if self._q is None:
            return []
        buf = (ctypes.c_double * (3 * max_calls))()
        n = self.lib.ws_queue_times(self._q, buf, max_calls)
        return [(buf[3 * i], buf[3 * i + 1], buf[3 * i + 2]) for i in range(n)]

    def close(self) -> None:
        """Stop the thread (calls not started are not run; their done words are stored)."""
        if self._q is not None:
            self.lib.ws_queue_free(self._q)
            self._q = None
            self._keep.clear()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def probe_buffer(nbytes: int) -> torch.Tensor:
    """A float32 array of ``nbytes`` for :func:`read_bandwidth`, on the C pool's kind of pages
    (``hostmem.pageable_empty``), every page touched."""
    from ..hostmem import pageable_empty
    return pageable_empty(nbytes // 4, torch.float32).fill_(1.0)


def read_bandwidth(nbytes: int, threads: int | None = None, reps: int = 5,
                   buffer: torch.Tensor | None = None, prefetch_bytes: int = 0) -> float:
    """DRAM read bandwidth in GB/s: best of ``reps`` multi-threaded sums of an ``nbytes`` array
    (``buffer``, a contiguous float32 tensor from :func:`probe_buffer`, instead of a new one:
    repeated probes). ``prefetch_bytes`` > 0 adds a software prefetch into L2 that far ahead
    (``writescope.bench.read_probes`` compares the ways of reading); the probe is without."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"kernel unavailable: {_load_error}")
    x = buffer if buffer is not None else probe_buffer(nbytes)
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("buffer must be a contiguous float32 tensor")
    chk = ctypes.c_double()
    dt = lib.ws_read_seconds(_ptr(x), x.numel(), threads or get_num_threads(), reps,
                             max(0, int(prefetch_bytes)), ctypes.byref(chk))
    return x.numel() * 4 / dt / 1e9


def tile_read_bandwidth(nbytes: int, threads: int | None = None, reps: int = 5,
                        buffer: torch.Tensor | None = None, prefetch_bytes: int = 0) -> float | None:
    """GB/s the AMX tile unit streams from memory: the best of ``reps`` passes of contiguous
    1 KB tile loads, each consumed by one tile product, over ``nbytes`` (``buffer`` as for
    :func:`read_bandwidth`); with ``prefetch_bytes`` > 0, each tile's lines are first
    prefetched into L2 that far ahead (as the kernel's software prefetch does). The ceiling of a
    kernel that reads its KV with tile loads, to set beside :func:`read_bandwidth` (vector
    loads) of the same buffer. None where the CPU (or the OS) gives no AMX."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"kernel unavailable: {_load_error}")
    if "amx" not in isas():
        return None
    x = buffer if buffer is not None else probe_buffer(nbytes)
    if not x.is_contiguous():
        raise ValueError("buffer must be contiguous")
    n = x.numel() * x.element_size() // 1024 * 1024
    if n == 0:
        raise ValueError("buffer must hold at least 1 KB")
    chk = ctypes.c_double()
    dt = lib.ws_tile_read_seconds(_ptr(x), n, threads or get_num_threads(), reps,
                                  max(0, int(prefetch_bytes)), ctypes.byref(chk))
    return n / dt / 1e9
