"""The device reading a page-locked host tensor in place: a copy made by the GPU's own cores
through the tensor's unified address, never by a copy engine.

A decode step that streams T blocks keeps the host-to-device copy engine busy with the staging
ring's copies (``attention/staging.py``: hundreds of MB a layer at 4 x 128K), and a small
host-to-device copy enqueued on the compute stream may wait for an engine behind them. The CPU
attention's result never goes that way: the merge kernel reads it in place from pinned memory
(``attention/hybrid.py``). :func:`to_device` does the same for the CPU experts' result
(``layers/cpu_experts.py``): one Triton kernel reads the pinned buffer and writes a device
tensor, in stream order after the device's wait for the CPU's done word.

``WRITESCOPE_CPU_EXPERT_RESULT`` chooses: ``kernel`` (this, the default on CUDA with Triton) or
``copy`` (``Tensor.to``, a copy-engine transfer). On an H100 host (2026-12-08, ``python -m
writescope.bench.result_path``) a 48 KB result took 68 us in place and 7,678 us by copy beside
138 MB staging copies (8 and 5 us alone); in issue 6's Qwen3-30B-A3B 4 x 128K step with the
experts on the CPU (``bench.step_profile --timeline``) the waits from each layer's experts to
the next layer's attention fell from 930 to 83 us a layer (43.7 to 3.9 ms a step), and the link
became the step's limit (busy 331.6 of its 338.7 ms).

Whoever reads in place must keep the host tensor alive until the kernel has run, since the
launching thread runs ahead of the device and torch's pinned allocator knows nothing of the
read (``cpu_experts_calls.keep_until_read``)."""
from __future__ import annotations

import functools
import os

import torch

MODES = ("copy", "kernel")
#: elements a program reads (its loads are all in flight at once: one round trip over the link)
BLOCK = 1024


def result_mode() -> str:
    """``WRITESCOPE_CPU_EXPERT_RESULT``: how a CPU expert result reaches the device."""
    v = os.environ.get("WRITESCOPE_CPU_EXPERT_RESULT", "kernel").strip().lower() or "kernel"
    if v not in MODES:
        raise ValueError(f"WRITESCOPE_CPU_EXPERT_RESULT must be one of {', '.join(MODES)}, "
                         f"got {v!r}")
    return v


def in_place(device: torch.device) -> bool:
    """Whether results for ``device`` are read in place (``kernel`` mode, CUDA with Triton)."""
    if torch.device(device).type != "cuda" or result_mode() != "kernel":
        return False
    from ..attention.gpu import triton_available
    return triton_available()


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def read_kernel(SRC, DST, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        # ".cv": fetched again, never an earlier read's cached line (a pinned buffer's address is
        # reused by later calls)
        tl.store(DST + offs, tl.load(SRC + offs, mask=m, cache_modifier=".cv"), mask=m)

    del triton
    from ..attention.launch import FastLaunch
    return FastLaunch(read_kernel).bind(BLOCK=BLOCK, num_warps=4)


def to_device(src: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A new tensor on ``device`` (CUDA) holding pinned, contiguous ``src``, written in stream
    order on the current stream by a kernel that reads ``src`` in place."""
    if not src.is_pinned() or not src.is_contiguous():
        raise ValueError("to_device reads a pinned, contiguous host tensor")
    out = torch.empty(src.shape, dtype=src.dtype, device=device)
    n = src.numel()
    if n:
        _kernel()[(-(-n // BLOCK),)](src, out, n)
    return out
