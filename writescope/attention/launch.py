"""Triton launches without the JIT's per-call Python.

A decode step launches a few Triton kernels per layer (the split-KV partials, per resident region
and staged piece, the merge, the wait for the CPU's flag). Through ``kernel[grid](...)`` each
launch binds its arguments, specialises every one of them, builds a cache key, asks torch for
the current stream and reads launch metadata: ~50-100 us of host time on the H200's Xeon
(``python -m writescope.bench.step_profile --cprofile``: 135 JIT launches took 13 of a 4 x 32K
DeepSeek-V2-Lite step's 55 host milliseconds, 2026-12-01d call 1). :class:`FastLaunch` compiles
and launches the first call of each specialisation through the JIT, keeps the compiled kernel it
returns, and calls that kernel's launcher directly afterwards.

The key is at least as fine as Triton's own specialisation: per positional argument, a tensor's
dtype and whether its address is 16-byte aligned, an int's being 1, divisible by 16 and its
width, a constexpr's exact value; every keyword argument's exact value (the call sites pass
constexprs, a few scalars and the compile options ``num_warps``/``num_stages`` by name; a tensor
by name is keyed like a positional one). So the kept
kernel is the one the JIT would have picked. Arguments are passed in the kernel's parameter
order, constexprs included, as ``CompiledKernel.__getitem__`` does. Should this Triton's
launcher not take them so (a ``TypeError``), the wrapper says so once and goes back to the JIT
path for good. ``WRITESCOPE_FAST_LAUNCH=0`` uses the JIT path always, to compare.

Also here: :func:`pdl_args`, the launches of the decode chain's kernels dependent on the one
before them (programmatic dependent launch, below).
"""
from __future__ import annotations

import inspect
import os
import warnings

import torch

_I32 = (-2**31, 2**31)


def arg_key(arg, constexpr: bool):
    """One argument's part of the key (:meth:`FastLaunch._key` inlines the same for the
    positional arguments, the hot path)."""
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


#: every FastLaunch made (the kernels are built once per process, lru-cached)
_ALL: list = []


def compiled_resources() -> list[dict]:
    """The compiled forms of every :class:`FastLaunch` kernel so far: name, warps, stages,
    registers a thread, bytes spilled, shared memory a program (what bounds the programs an SM
    holds; ``bench.step_profile`` prints them)."""
    rows = []
    for fl in _ALL:
        for k in fl._kernels.values():
            md = getattr(k, "metadata", None)
            rows.append({"kernel": getattr(fl.fn, "__name__", str(fl.fn)),
                         "warps": getattr(md, "num_warps", None),
                         "stages": getattr(md, "num_stages", None),
                         "registers": getattr(k, "n_regs", None),
                         "spilled": getattr(k, "n_spills", None),
                         "shared": getattr(md, "shared", None),
                         "dependent": bool(getattr(md, "launch_pdl", False))})
    return rows


class _Form:
    """One way of calling a kernel: how many arguments come by position and which by name."""

    __slots__ = ("pos_constexpr", "pull", "exact_names")

    def __init__(self, fl: "FastLaunch", nargs: int, names: tuple):
        self.pos_constexpr = fl.constexpr[:nargs]
        given = set(names)
        # the parameters after the positional ones, in order: from the keywords or defaults
        self.pull = [(n, n in given, fl.defaults.get(n)) for n in fl.names[nargs:]]
        #: keyword values go into the key as they are (ints, strings, flags: constexprs, options
        #: and scalars alike, so at least as fine as Triton's key); False once one was a tensor
        self.exact_names = True


class FastLaunch:
    """``FastLaunch(jit_fn)[grid](*args, **kwargs)`` launches like ``jit_fn[grid](...)``."""

    def __init__(self, fn):
        self.fn = fn
        self._kernels: dict = {}
        self._forms: dict = {}
        # under TRITON_INTERPRET=1 the kernel is an InterpretedFunction: nothing is compiled
        self.fast = enabled() and hasattr(fn, "params")
        params = list(inspect.signature(fn.fn).parameters.values())
        self.names = [p.name for p in params]
        self.constexpr = [bool(getattr(p, "is_constexpr", False))
                          for p in getattr(fn, "params", params)]
        self.defaults = {p.name: p.default for p in params
                         if p.default is not inspect.Parameter.empty}
        self._is_constexpr = dict(zip(self.names, self.constexpr))
        #: launches that went through the kept kernel / through the JIT (for tests and benches)
        self.direct = 0
        self.jit = 0
        _ALL.append(self)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    @staticmethod
    def _pos_key(pos_constexpr, args: tuple) -> list:
        """The positional arguments' part of the key."""
        key = []
        for a, c in zip(args, pos_constexpr):
            if c:
                key.append(a)
            elif isinstance(a, torch.Tensor):
                key.append((a.dtype, not a.data_ptr() & 15))
            elif type(a) is int:
                key.append((a == 1, not a & 15, _I32[0] <= a < _I32[1], a >= 2**63))
            else:  # float, bool, None: Triton does not specialise on their values
                key.append(type(a))
        return key

    def _key(self, form: _Form, args: tuple, kwargs: dict) -> tuple:
        key = self._pos_key(form.pos_constexpr, args)
        if form.exact_names:
            key.append(tuple(kwargs.items()))
        else:
            key.append(tuple((k, arg_key(v, self._is_constexpr.get(k, True)))
                             for k, v in kwargs.items()))
        return tuple(key)

    def bind(self, **kwargs) -> "Bound":
        """This kernel with its keyword arguments fixed (:class:`Bound`): constexprs, scalars and
        compile options, no tensors (a bound launch does not key them)."""
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise TypeError("bind() takes no tensors: pass them by position")
        return Bound(self, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        if not self.fast or callable(grid):  # a grid function needs the JIT's bound arguments
            self.jit += 1
            return self.fn[grid](*args, **kwargs)
        fk = (len(args), tuple(kwargs))
        form = self._forms.get(fk)
        if form is None:
            form = self._forms[fk] = _Form(self, len(args), fk[1])
        key = self._key(form, args, kwargs)
        kernel = self._kernels.get(key)
        if kernel is None:
            self.jit += 1
            kernel = self.fn[grid](*args, **kwargs)
            if form.exact_names and any(isinstance(v, torch.Tensor) for v in kwargs.values()):
                form.exact_names = False  # a tensor by name: key it by dtype and alignment
                key = self._key(form, args, kwargs)
            if kernel is not None:
                self._kernels[key] = kernel
            return kernel
        full = list(args)
        for n, given, default in form.pull:
            full.append(kwargs[n] if given else default)
        return self._run(kernel, grid, full, args, kwargs)

    def _run(self, kernel, grid, full: list, args: tuple, kwargs: dict):
        """Launch the kept ``kernel`` with every parameter's value ``full`` (positional
        arguments, then the named ones in parameter order)."""
        a0 = args[0] if args else None
        dev = a0.device if isinstance(a0, torch.Tensor) else \
            next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        stream = raw_stream(dev if dev is not None else torch.device("cuda"))
        g0 = int(grid[0])
        g1 = int(grid[1]) if len(grid) > 1 else 1
        g2 = int(grid[2]) if len(grid) > 2 else 1
        try:
            kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata,
                       None, None, None, *full)
        except TypeError as e:  # this Triton's launcher wants its arguments otherwise
            warnings.warn(f"direct Triton launch of {getattr(self.fn, '__name__', self.fn)} failed "
                          f"({e}); using the JIT's launch path", RuntimeWarning, stacklevel=4)
            self.fast = False
            self.jit += 1
            return self.fn[grid](*args, **kwargs)
        self.direct += 1
        return kernel


class Bound:
    """A :class:`FastLaunch` with its keyword arguments fixed: ``fl.bind(**kw)[grid](*args)``
    launches like ``fl[grid](*args, **kw)``. Made once per distinct keyword set and kept by the
    caller (a decode step's attention launches use a few such sets for all its layers), so a
    launch keys only its positional arguments and passes the named ones from a list built once.
    ``python -m writescope.bench.launch_host``: a bound partials or merge launch took 9-14 us
    of Python against 16-26 us unbound on the dev VM (AVX2 EPYC), 5.6-6.7 against 9.8-10.2 on
    an H200 host; a spilled Qwen3 4 x 8K step there was no faster (seventy-third session: the
    tensors' dtype and alignment key, :meth:`FastLaunch._pos_key`, remains the cost)."""

    __slots__ = ("fl", "kwargs", "nargs", "pos_constexpr", "tail", "kernels")

    def __init__(self, fl: FastLaunch, kwargs: dict):
        self.fl = fl
        self.kwargs = kwargs
        #: the positional count the tail was built for (set by the first launch)
        self.nargs = None
        self.pos_constexpr = ()
        self.tail: list = []
        self.kernels: dict = {}

    def __getitem__(self, grid):
        return lambda *args: self.launch(grid, args)

    def launch(self, grid, args: tuple):
        fl = self.fl
        if not fl.fast or callable(grid):
            return fl.launch(grid, args, self.kwargs)
        if self.nargs != len(args):  # the first launch, or another positional count
            self.nargs = len(args)
            self.pos_constexpr = fl.constexpr[:len(args)]
            given = self.kwargs
            self.tail = [given[n] if n in given else fl.defaults.get(n)
                         for n in fl.names[len(args):]]
            self.kernels = {}
        key = tuple(fl._pos_key(self.pos_constexpr, args))
        kernel = self.kernels.get(key)
        if kernel is None:  # through the FastLaunch: compiled (or found) and launched
            kernel = fl.launch(grid, args, self.kwargs)
            if kernel is not None and fl.fast:
                self.kernels[key] = kernel
            return kernel
        return fl._run(kernel, grid, [*args, *self.tail], args, self.kwargs)


# ----------------------------------------------------------------------------------------------
# programmatic dependent launch
# ----------------------------------------------------------------------------------------------
#
# A decode layer is a chain of short kernels (a few microseconds each); each waits for the whole
# of the one before it, and its programs are only placed on the SMs once that one is done. With
# programmatic dependent launch (Hopper on; CUDA's programmatic stream serialisation, kept in
# a CUDA graph's edges) a kernel may start while the one before it is still running: its
# programs are placed as soon as every program of the one before has signalled
# (``gdc_launch_dependents``), run what reads no output of that kernel (weights, the step's
# plan), and wait (``gdc_wait``) for it to finish, its memory visible, before the rest. The
# kernels here wait first (the norms after loading their weights, constants), and signal right
# after their wait, so that no program of a kernel runs before the kernel two back has
# finished: whatever a kernel would read before its wait was written before the kernel before
# it started. Triton's tutorial 11 (programmatic dependent launch) shows the two calls; CUTLASS's
# example 63 loads its weights before the wait the same way. ``WRITESCOPE_PDL=0`` launches as
# before.
#
# Early reads (``EARLY``, a second constexpr of the kernels that have it): by that rule a kernel
# may also read, before its wait, what the kernel two or more back wrote or the host copied
# before the step -- the step's plan (the partials' chunk bounds, the merge's rows: host
# copies), the router's expert ids and weights in the down kernel (the gate/up kernel is
# between them), the new token's query and record in the merge (the partials are between it
# and the heads kernel; the resident step always launches them), weights (the router's, the
# down kernel's first tile). Those reads then overlap the end of the kernel before instead of
# following it. Each such kernel loads the same values in the same order either way; only the wait moves
# (after those loads with ``EARLY``, first without). ``WRITESCOPE_PDL_EARLY=0`` waits first.

_PDL: dict = {}


def _pdl_triton() -> bool:
    try:
        import triton.language as tl
        from triton.backends.nvidia.compiler import CUDAOptions
        return (hasattr(tl.extra.cuda, "gdc_wait")
                and "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {}))
    except Exception:  # no CUDA backend, an older Triton
        return False


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` are launched dependent on the one before (CUDA, compute
    capability 9 or later, a Triton with grid dependency control, not interpreted,
    ``WRITESCOPE_PDL`` not 0)."""
    if device.type != "cuda" or os.environ.get("WRITESCOPE_PDL", "1") in ("0", "", "false", "no"):
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("0", ""):
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    ok = _PDL.get(idx)
    if ok is None:
        ok = _PDL[idx] = torch.cuda.get_device_capability(idx)[0] >= 9 and _pdl_triton()
    return ok


def early_reads() -> bool:
    """Whether kernels launched dependent read what the kernel before them cannot have written
    before their wait (``WRITESCOPE_PDL_EARLY``, on unless 0)."""
    return os.environ.get("WRITESCOPE_PDL_EARLY", "1") not in ("0", "", "false", "no")


def launch_flags(device: torch.device) -> tuple[bool, bool]:
    """``(dependent, early)``: whether kernels on ``device`` are launched dependent on the one
    before (:func:`pdl_enabled`) and read early before their wait (:func:`early_reads`). The
    hybrid step reads them once per step: three environment lookups a launch otherwise, most
    of the 732 a Qwen3 4 x 8K spilled step made (``bench.step_profile --cprofile``, seventy-first
    session)."""
    on = pdl_enabled(device)
    return on, on and early_reads()


def pdl_args(x: torch.Tensor, early: bool = False) -> dict:
    """The keyword arguments that launch a kernel with a ``PDL`` flag (constexpr) dependent on
    the one before it, on ``x``'s device: ``PDL`` and Triton's ``launch_pdl`` when
    :func:`pdl_enabled`, else ``PDL=False``. ``early``: the kernel also has an ``EARLY`` flag
    (its early reads before the wait, :func:`early_reads`; False when not launched dependent)."""
    on = pdl_enabled(x.device)
    args = {"PDL": True, "launch_pdl": True} if on else {"PDL": False}
    if early:
        args["EARLY"] = on and early_reads()
    return args
