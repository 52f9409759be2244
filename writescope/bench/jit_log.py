"""What stalls a timed step besides its own work: the Triton kernels compiled while a block
runs (``with jit_compiles() as log: ...``) and the garbage collections (``gc_clock``).

A kernel specialisation seen for the first time in a process is compiled (or loaded from
Triton's disk cache) by the launching thread, tens of milliseconds or more; a decode step that
meets one stalls for as long. :func:`jit_compiles` records each such event through Triton's
``knobs.runtime.jit_cache_hook`` (called before every in-process cache miss) as ``(seconds
since the block began, the kernel's name and signature)``; the bench that uses it says which of
its steps each one fell in. Without Triton (or a Triton without the hook) the list stays empty
and ``log.available`` is False.
"""
from __future__ import annotations

import contextlib
import gc
import time


class CompileLog(list):
    """``(t, repr)`` per compile since the block began; ``available``: the hook was set."""

    available: bool = False


@contextlib.contextmanager
def jit_compiles():
    log = CompileLog()
    try:
        from triton import knobs
        runtime = knobs.runtime
        old = runtime.jit_cache_hook
    except (ImportError, AttributeError):
        yield log
        return
    t0 = time.perf_counter()

    def hook(*, repr: str = "", **_kw):  # noqa: A002 - Triton's keyword
        log.append((time.perf_counter() - t0, repr))
        return old(repr=repr, **_kw) if old is not None else False

    runtime.jit_cache_hook = hook
    log.available = True
    try:
        yield log
    finally:
        runtime.jit_cache_hook = old


@contextlib.contextmanager
def gc_clock():
    """Yields a list that gets the seconds of every garbage collection run inside the block
    (``gc.callbacks``): a step much slower than its neighbours may be one that collected."""
    spans: list[float] = []
    t0 = [0.0]

    def cb(phase: str, _info: dict) -> None:
        if phase == "start":
            t0[0] = time.perf_counter()
        else:
            spans.append(time.perf_counter() - t0[0])
    gc.callbacks.append(cb)
    try:
        yield spans
    finally:
        gc.callbacks.remove(cb)
