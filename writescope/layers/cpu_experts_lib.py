"""The CPU expert kernel's shared library and its settings: the thread count, the build
(``csrc/cpu_experts.cpp`` compiled on first use with the system C++ compiler into a per-user
cache, loaded with :mod:`ctypes`), the instruction sets it may use and the FP8 products' form.
:class:`~writescope.layers.cpu_experts.CpuExperts` calls it; see that module's docstring for the
environment variables."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["ISA_NAMES", "AMX_MIN_TOKENS", "set_num_threads", "get_num_threads",
           "num_threads_setting", "default_threads", "available_isas", "kernel_info", "get_lib",
           "lib_error", "detected_isa", "isa_cap", "amx_min_tokens", "fp8_products",
           "read_bandwidth_probe"]

ISA_NAMES = ("generic", "avx2", "avx512", "avx512bf16", "amx")
_SRC = Path(__file__).parent / "csrc" / "cpu_experts.cpp"

# ---------------------------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------------------------
_num_threads: int | None = None


def default_threads() -> int:
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
    return _num_threads if _num_threads is not None else default_threads()


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


def get_lib():
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


def detected_isa() -> int:
    global _detected_isa
    if _detected_isa is None:
        _detected_isa = get_lib().ws_detect_isa()
    return _detected_isa


def isa_cap() -> int:
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


def fp8_products() -> str:
    """``WRITESCOPE_CPU_FP8_PRODUCTS``: ``exact`` (default) or ``rounded`` (see
    :attr:`~writescope.layers.cpu_experts.CpuExperts.fp8_exact`)."""
    env = os.environ.get("WRITESCOPE_CPU_FP8_PRODUCTS", "exact").strip().lower()
    if env not in ("exact", "rounded"):
        raise ValueError(f"WRITESCOPE_CPU_FP8_PRODUCTS={env!r}: expected 'exact' or 'rounded'")
    return env


def amx_min_tokens() -> int:
    return int(os.environ.get("WRITESCOPE_CPU_EXPERT_AMX_MIN", AMX_MIN_TOKENS))


def available_isas() -> list[str]:
    """Kernel code paths this machine can run (empty when the C++ kernel is unavailable)."""
    lib = get_lib()
    return [] if lib is None else list(ISA_NAMES[: detected_isa() + 1])


def kernel_info() -> dict:
    lib = get_lib()
    info = {"backend": "cpp" if lib is not None else "torch", "threads": get_num_threads()}
    if lib is not None:
        info["isa_detected"] = ISA_NAMES[detected_isa()]
        info["isa_used"] = ISA_NAMES[min(detected_isa(), isa_cap())]
        info["amx_min_tokens"] = amx_min_tokens()
    else:
        info["error"] = _lib_error
    return info


def read_bandwidth_probe(buf: torch.Tensor, threads: int | None = None) -> float:
    """Read ``buf`` once with the kernel library's threads (for the benchmark); returns a checksum."""
    lib = get_lib()
    if lib is None:
        return float(buf.view(torch.float32).sum())
    return lib.ws_read_sum(buf.data_ptr(), buf.numel() * buf.element_size(),
                           threads or get_num_threads())



def lib_error() -> str | None:
    """Why the compiled kernel could not be built (None: built, or not tried yet)."""
    return _lib_error
