"""Triton launches without the JIT's per-call Python.

A decode step launches a few Triton kernels per layer (the split-KV partials, per resident region
and staged piece, the merge, the wait for the CPU's flag). Through ``kernel[grid](...)`` each
launch binds its arguments, specialises every one of them, builds a cache key, asks torch for
the current stream and reads launch metadata: ~50-100 us of host time on the H200's Xeon
(``python -m writescope.bench.step_profile --cprofile``: 135 JIT launches took 13 of a 4 x 32K
DeepSeek-V2-Lite step's 55 host milliseconds, 2026-12-01d call 1). :class:`FastLaunch` compiles
and launches the first call of each specialisation through the JIT, keeps the compiled kernel it
returns, and calls that kernel's launcher directly afterwards.

The key is at least as fine as Triton's own specialisation: per argument, a tensor's dtype and
whether its address is 16-byte aligned; an int's being 1, divisible by 16 and its width; a
constexpr's exact value; plus the compile options (``num_warps``, ``num_stages``). So the kept
kernel is the one the JIT would have picked. Arguments are passed in the kernel's parameter
order, constexprs included, as ``CompiledKernel.__getitem__`` does. Should this Triton's
launcher not take them so (a ``TypeError``), the wrapper says so once and goes back to the JIT
path for good. ``WRITESCOPE_FAST_LAUNCH=0`` uses the JIT path always, to compare.
"""
from __future__ import annotations

import inspect
import os
import warnings

import torch

_I32 = (-2**31, 2**31)


def _key(arg, constexpr: bool):
    if constexpr:
        return ("c", arg)
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("b",)
    if isinstance(arg, int):
        return ("i", arg == 1, arg % 16 == 0, _I32[0] <= arg < _I32[1], arg >= 2**63)
    if isinstance(arg, float):
        return ("f",)
    if arg is None:
        return None
    return ("o", arg)


def raw_stream(device: torch.device) -> int:
    """The handle of ``device``'s current CUDA stream, without building a ``torch.cuda.Stream``
    (``torch.cuda.current_stream`` costs ~20 us of host time per call)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(idx)


def enabled() -> bool:
    return os.environ.get("WRITESCOPE_FAST_LAUNCH", "1") != "0"


class FastLaunch:
    """``FastLaunch(jit_fn)[grid](*args, **kwargs)`` launches like ``jit_fn[grid](...)``."""

    def __init__(self, fn):
        self.fn = fn
        self._kernels: dict = {}
        # under TRITON_INTERPRET=1 the kernel is an InterpretedFunction: nothing is compiled
        self.fast = enabled() and hasattr(fn, "params")
        params = list(inspect.signature(fn.fn).parameters.values())
        self.names = [p.name for p in params]
        self.constexpr = [bool(getattr(p, "is_constexpr", False))
                          for p in getattr(fn, "params", params)]
        self.defaults = {p.name: p.default for p in params
                         if p.default is not inspect.Parameter.empty}
        self._index = {n: i for i, n in enumerate(self.names)}
        #: launches that went through the kept kernel / through the JIT (for tests and benches)
        self.direct = 0
        self.jit = 0

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        if not self.fast:
            self.jit += 1
            return self.fn[grid](*args, **kwargs)
        full = list(args)
        options = []
        named = {}
        for k, v in kwargs.items():
            if k in self._index:
                named[k] = v
            else:
                options.append((k, v))
        for n in self.names[len(args):]:
            full.append(named[n] if n in named else self.defaults[n])
        key = (tuple(_key(a, c) for a, c in zip(full, self.constexpr)), tuple(sorted(options)))
        kernel = self._kernels.get(key)
        if kernel is None:
            self.jit += 1
            kernel = self.fn[grid](*args, **kwargs)
            if kernel is not None:
                self._kernels[key] = kernel
            return kernel
        dev = next((a.device for a in full if isinstance(a, torch.Tensor)), None)
        stream = raw_stream(dev if dev is not None else torch.device("cuda"))
        g = tuple(int(x) for x in grid) + (1, 1)
        try:
            kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata,
                       None, None, None, *full)
        except TypeError as e:  # this Triton's launcher wants its arguments otherwise
            warnings.warn(f"direct Triton launch of {getattr(self.fn, '__name__', self.fn)} failed "
                          f"({e}); using the JIT's launch path", RuntimeWarning, stacklevel=3)
            self.fast = False
            self.jit += 1
            return self.fn[grid](*args, **kwargs)
        self.direct += 1
        return kernel
