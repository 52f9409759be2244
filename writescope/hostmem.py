"""Host memory for the engine's large buffers: page-locked without torch's caching host allocator
(:func:`pinned_empty`), and pageable memory the CPU reads at DRAM speed (:func:`pageable_empty`).

``torch.empty(..., pin_memory=True)`` goes through torch's caching host allocator, which rounds
every request up to the next power of two (``CachingHostAllocator``: "Round up the allocation to
the nearest power of two to improve reuse") and keeps freed blocks cached. For the large
host-side buffers of this engine that wastes up to half of what is page-locked: a T pool of
16.06 GiB (Mixtral-8x7B, 4 x 32K tokens) takes 32 GiB of pinned memory, next to 84 GiB of
routed experts on a 128 GiB host. :func:`pinned_empty` allocates ordinary pageable memory and
page-locks exactly that (``cudaHostRegister``), as :func:`pin_tensor` does for the CPU experts'
weights; the memory is unregistered when the tensor is freed.
"""
from __future__ import annotations

import ctypes
import math
import os
import weakref

import torch

#: below this many bytes the caching allocator's rounding costs little; keep its fast reuse
REGISTER_MIN_BYTES = 64 << 20


#: pageable buffers of at least this many bytes are advised huge pages
HUGE_PAGE_MIN_BYTES = 64 << 20
_MADV_HUGEPAGE = 14


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask for transparent huge pages over ``t``'s memory (``madvise(MADV_HUGEPAGE)``; Linux, best
    effort). Call it before the memory is first touched: pages faulted in before stay 4 KiB until
    the kernel's background collapse gets to them. Returns whether the call succeeded."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False
    page = 4096
    start = t.data_ptr() // page * page
    length = t.data_ptr() + t.numel() * t.element_size() - start
    try:
        return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_HUGEPAGE) == 0
    except AttributeError:
        return False


def huge_page_fraction(t: torch.Tensor) -> float | None:
    """The share of ``t``'s memory mapped by transparent huge pages now (``AnonHugePages`` over
    ``Rss`` of the mappings ``t``'s bytes lie in, ``/proc/self/smaps``); None where that cannot
    be read. Pages faulted in as 4 KiB ones (no huge page free at the first touch) stay so
    until the kernel's background collapse (khugepaged) gets to them, and the CPU's hardware
    prefetchers stop at each 4 KiB page's end."""
    lo = t.data_ptr()
    hi = lo + t.numel() * t.element_size()
    rss = huge = 0
    inside = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    a, b = (int(x, 16) for x in head.split("-"))
                    inside = a < hi and lo < b
                elif inside and head == "Rss:":
                    rss += int(line.split()[1])
                elif inside and head == "AnonHugePages:":
                    huge += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return huge / rss if rss else None


def pageable_empty(shape, dtype: torch.dtype, align: int = 64) -> torch.Tensor:
    """An uninitialised pageable host tensor whose data is ``align``-byte aligned and, from
    :data:`HUGE_PAGE_MIN_BYTES` up, advised huge pages before its first touch: the C region's pool,
    and every buffer a benchmark or calibration reads to stand for it (a KV pool, the DRAM read
    probe), so that they are measured with the engine's page size. With 4 KiB pages the MLA
    kernel read ~5% slower on the dev machine, the read probe ~4% (2026-12-01)."""
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    numel = math.prod(shape)
    item = torch.empty(0, dtype=dtype).element_size()
    raw = torch.empty(numel + align // item, dtype=dtype)
    off = (-raw.data_ptr() % align) // item
    out = raw[off:off + numel].view(shape)
    if numel * item >= HUGE_PAGE_MIN_BYTES:
        advise_huge_pages(out)
    return out


def pin_tensor(t: torch.Tensor) -> bool:
    """Page-lock ``t``'s memory in place (cudaHostRegister); unregistered when ``t`` is freed.
    Returns False (and leaves ``t`` pageable) where that fails."""
    if not torch.cuda.is_available() or t.device.type != "cpu" or t.is_pinned() or t.numel() == 0:
        return t.is_pinned()
    cudart = torch.cuda.cudart()
    ptr, size = t.data_ptr(), t.numel() * t.element_size()
    if int(cudart.cudaHostRegister(ptr, size, 0)) != 0:
        return False
    weakref.finalize(t, cudart.cudaHostUnregister, ptr)
    return True


def pinned_empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised page-locked host tensor of exactly its size (see the module docstring).
    Small ones, and any that ``cudaHostRegister`` refuses, come from torch's pinned allocator.
    Keep the returned tensor itself alive while any view of it is in use: the memory is
    unregistered when this tensor object is freed. Without CUDA: ordinary pageable memory.
    (Only allocations of at least :data:`REGISTER_MIN_BYTES` are registered: those are mappings
    of their own, so two registrations never share a page.)"""
    t = torch.empty(shape, dtype=dtype)
    if not torch.cuda.is_available():
        return t
    if t.numel() * t.element_size() >= REGISTER_MIN_BYTES and pin_tensor(t):
        return t
    del t
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def h2d(data, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host array (list, numpy array, CPU tensor) as a tensor on ``device``, without a
    stream synchronisation. ``torch.tensor(x, device="cuda")`` and ``.to("cuda")`` synchronise the
    stream after the copy (31 times a decode step on Qwen3-30B-A3B, 6 ms on the H200:
    bench/results/2026-11-30e-h200); an asynchronous copy from pageable memory is safe as it is,
    because the driver stages the source before the call returns."""
    t = torch.as_tensor(data, dtype=dtype)
    device = torch.device(device)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def ram_bytes() -> int:
    """The host's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_ram_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
