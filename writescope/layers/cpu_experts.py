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

Around this module's :class:`CpuExperts`: ``cpu_experts_lib.py`` builds and loads the kernel and
holds its settings (threads, instruction sets), ``expert_tiles.py`` is the weights' tile layout,
``cpu_experts_calls.py`` runs the calls (worker, native queue, flags) and keeps their books (the
step-end checks, marks, timelines), ``cpu_experts_graph.py`` puts a call inside a CUDA graph.
This module re-exports the names the engine uses from the first and third.

References (ideas, not code): KTransformers kt-kernel's AMX/AVX-512 MoE operators (packed
per-expert tiles, tokens grouped by expert, gate/up then down phases over a CPU thread pool while
the GPU runs the rest of the layer) and llama.cpp's ggml-cpu ``MUL_MAT_ID`` (counting-sort of
(token, slot) rows by expert, ``--cpu-moe``).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from . import cpu_experts_calls as calls
from . import pinned_read
from .cpu_experts_calls import (ExpertsMark, eager_calls, mark, raise_pending_errors, settle,
                                take_host_timeline, take_routed_bytes, take_timeline, timeline_on)
from .cpu_experts_lib import (AMX_MIN_TOKENS, ISA_NAMES, amx_min_tokens, available_isas,
                              detected_isa, fp8_products, get_lib, get_num_threads, isa_cap,
                              kernel_info, lib_error, num_threads_setting, set_num_threads)
from .expert_tiles import KPAD, TILE, pack_into, round_up, unpack

__all__ = ["CpuExperts", "CpuExpertsHandle", "set_num_threads", "get_num_threads",
           "num_threads_setting", "kernel_info", "available_isas", "ISA_NAMES", "AMX_MIN_TOKENS",
           "ExpertsMark", "mark", "settle", "eager_calls", "raise_pending_errors",
           "take_routed_bytes", "take_timeline", "take_host_timeline", "timeline_on"]

#: values per chunk of a random draw (CpuExperts.random): one generator each, drawn in parallel
_RANDOM_CHUNK_VALUES = 1 << 21


def _chunk_seed(seed: int, *keys: int) -> int:
    """A 63-bit generator seed from ``seed`` and the chunk's keys (stable across runs)."""
    data = b"".join(int(x).to_bytes(8, "little", signed=True) for x in (seed, *keys))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


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
    if bo % TILE or bi % 2:
        return (f"FP8 blocks of {bo}x{bi}: the kernel needs row blocks of a multiple of "
                f"{TILE} and column blocks of a multiple of 2")
    if get_lib() is None:
        return f"the CPU expert C++ kernel is unavailable ({lib_error()})"
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
            lib = get_lib()
            if lib is None and backend == "cpp":
                raise RuntimeError(f"CPU expert C++ kernel unavailable: {lib_error()}")
            backend = "cpp" if lib is not None else "torch"
        if fp8 is not None and backend != "cpp":
            raise ValueError("FP8 experts need the compiled kernel: backend torch")
        self.backend = backend
        self._slot = calls.new_flag_slot()  # this layer's flag (see calls.host_flags)
        self.num_experts, self.hidden, self.inter, self.dtype = num_experts, hidden, inter, dtype
        #: why this layer's calls may not be graphed (a capture holding them failed), or None
        self.graph_disabled: str | None = None
        self.hp, self.ip = round_up(hidden, KPAD), round_up(inter, KPAD)
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
        self.fp8_exact = fp8_products() == "exact"
        if backend == "cpp":
            # [E][I_p/16][gate|up][tile of 16 x H_p], [E][H_p/16][tile of 16 x I_p]
            store = torch.uint8 if fp8 is not None else dtype
            self.gate_up = pageable_empty((E, self.ip // TILE, 2, TILE * self.hp), store)
            self.down = pageable_empty((E, self.hp // TILE, TILE * self.ip), store)
            if fp8 is not None:
                self.gate_up_scale = torch.ones((E, 2, *fp8.scale_shape((inter, hidden))))
                self.down_scale = torch.ones((E, *fp8.scale_shape((hidden, inter))))
                # which lines of each tile hold e4m3 subnormal codes (ws_fp8_line_masks)
                self.gate_up_masks = torch.zeros((E, self.ip // TILE, 2, round_up(self.hp // 2, 64)
                                                  // 64), dtype=torch.int64)
                self.down_masks = torch.zeros((E, self.hp // TILE, round_up(self.ip // 2, 64) // 64),
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
            pack_into(self.gate_up[e, :, 0], gate, self.ip, self.hp)
            pack_into(self.gate_up[e, :, 1], up, self.ip, self.hp)
            pack_into(self.down[e], down, self.hp, self.ip)
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
        pack_into(self.gate_up[e, :, 0], qg.to("cpu").view(torch.uint8), self.ip, self.hp)
        pack_into(self.gate_up[e, :, 1], qu.to("cpu").view(torch.uint8), self.ip, self.hp)
        pack_into(self.down[e], qd.to("cpu").view(torch.uint8), self.hp, self.ip)
        self.gate_up_scale[e, 0] = sg
        self.gate_up_scale[e, 1] = su
        self.down_scale[e] = sd
        self._mark_subnormal_lines(e, e + 1)

    def _mark_subnormal_lines(self, a: int, b: int) -> int:
        """The line masks of experts ``a..b-1`` from their FP8 codes (after every write of them);
        returns the lines flagged."""
        lib = get_lib()
        n = 0
        for w, m, kp in ((self.gate_up, self.gate_up_masks, self.hp),
                         (self.down, self.down_masks, self.ip)):
            tiles = w[a:b].numel() // (TILE * kp)
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
                rows = max(KPAD, _RANDOM_CHUNK_VALUES // k // KPAD * KPAD)  # tile-aligned starts
                for c, r0 in enumerate(range(0, o, rows)):
                    tasks.append((e, j, r0, min(o, r0 + rows), c))

        # bf16 values come from the compiled kernel's counter-based generator when it builds
        # (ws_random_normal_bf16: approximately normal, ~20x torch's rate a core), whatever the
        # backend, so both layouts hold the same logical weights; else from torch's normal_
        lib = get_lib() if self.dtype == torch.bfloat16 else None

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
            pack_into(dst[r0 // TILE:(r0 + rows) // TILE], w, rows, kp)
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
            gate = unpack(self.gate_up[e, :, 0], I, H, self.ip, self.hp)
            up = unpack(self.gate_up[e, :, 1], I, H, self.ip, self.hp)
            down = unpack(self.down[e], H, I, self.hp, self.ip)
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
        gate = unpack(gate_up[a:b, :, 0], I, H, self.ip, self.hp, n)
        up = unpack(gate_up[a:b, :, 1], I, H, self.ip, self.hp, n)
        dn = unpack(down[a:b], H, I, self.hp, self.ip, n)
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
        timeline = timeline_on()
        entered = time.perf_counter() if timeline else 0.0
        self._check(hidden, topk_ids, topk_weights)
        calls.count_eager_call()
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
        calls.route(ids if routed is None else routed, self.expert_bytes)
        pin = dev.type == "cuda"
        if calls.device_wait_enabled(dev):
            ready = getattr(event, "address", None)
            queue = calls.get_native_queue() if (self.backend == "cpp" and ready is not None and
                                            dtype in (torch.bfloat16, torch.float32)) else None
            python = os.environ.get("WRITESCOPE_CPU_EXPERT_QUEUE") == "python"
            # the device waits only for a native job, or for the Python worker when asked to
            # (see calls.get_native_queue); otherwise the launching thread waits in wait()
            if queue is not None or python:
                res = torch.empty(n, self.hidden, dtype=dtype, pin_memory=True)
                seq = calls.next_flag_value(self._slot)
                flags = calls.host_flags(dev)
                if queue is not None:
                    self._submit_native(queue, x, ids, w, res, ready,
                                        (flags.address(self._slot), seq))
                    host = None if mark is None else (entered, time.perf_counter())
                    return CpuExpertsHandle(None, dev, dtype, n, res, seq, mark, host)
                fut = calls.get_executor().submit(self._compute_signalled, x, ids, w, event, res,
                                             flags, seq)
                return CpuExpertsHandle(fut, dev, dtype, n, res, seq, mark)
        fut = calls.get_executor().submit(self._compute, x, ids, w, dtype, pin, event)
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
                or not calls.device_wait_enabled(device)):
            return False
        if os.environ.get("WRITESCOPE_HOSTFLAG_READ", "acquire") == "memop":
            return False
        return calls.get_native_queue() is not None

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
        queue = calls.get_native_queue()
        if queue is None:
            raise RuntimeError(f"graphed CPU expert calls need the native queue "
                               f"({calls.native_queue_error()})")
        calls.route(ids, self.expert_bytes)
        self._submit_native(queue, x, ids, w, res, ready, done, out, consume_ready=True)

    def _submit_native(self, queue, x, ids, w, res: torch.Tensor, ready: tuple[int, int],
                       done: tuple[int, int], out: torch.Tensor | None = None,
                       consume_ready: bool = False) -> None:
        """Queue the kernel and the result's conversion into ``res`` between the ``ready`` word
        (the inputs have landed) and the ``done`` word (the device may read ``res``). ``out``:
        the kernel's float32 accumulator (``[n, H_p]`` or more rows; a new one if None).
        ``consume_ready``: the job takes the ready word back to 0 once it has seen it (a graphed
        call, whose graph's next replay raises it again)."""
        n, k = ids.shape
        if out is None:
            out = torch.empty(n, self.hp, dtype=torch.float32)
        job = calls.WsMoeJob(self.gate_up.data_ptr(), self.down.data_ptr(), self._wdtype,
                        self.num_experts, self.hidden,
                        self.inter, self.hp, self.ip, x.data_ptr(), n, ids.data_ptr(),
                        w.data_ptr(), k, out.data_ptr(), res.data_ptr(),
                        0 if res.dtype == torch.bfloat16 else 1, min(detected_isa(), isa_cap()),
                        amx_min_tokens(), get_num_threads(), *self._fp8_args())
        fn = ctypes.cast(get_lib().ws_moe_job, ctypes.c_void_p).value
        queue.submit_fn(fn, ctypes.addressof(job), (job, x, ids, w, out, res, self),
                        ready=ready, done=done, spin_s=calls.ready_spin_s(),
                        consume_ready=consume_ready)
        calls.count_native_call()

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
            if handle.host is not None:
                calls.note_wait_entered(handle.host)
            flags = calls.host_flags(torch.device(handle.device))
            flags.wait(self._slot, handle.seq)
            entry = calls.note_result_seen(handle.mark) if handle.mark is not None else None
            if handle.future is not None:  # (the native queue's calls: drained at the step's end)
                calls.defer_result(handle.future)
            if pinned_read.in_place(handle.device):  # read by the device's cores, in place
                calls.keep_until_read(handle.result)
                out = pinned_read.to_device(handle.result, handle.device)
            else:
                out = handle.result.to(handle.device, non_blocking=True)
            calls.note_result_landed(entry)
            return out
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
        if hidden.device.type != "cpu":
            return self.wait(self.submit(hidden, topk_ids, topk_weights, routed, out_dtype))
        self._check(hidden, topk_ids, topk_weights)
        calls.count_eager_call()
        out_dtype = out_dtype or hidden.dtype
        if hidden.shape[0] == 0:
            return torch.zeros(0, self.hidden, dtype=out_dtype)
        x = hidden.detach().to(self.dtype).contiguous()
        ids = topk_ids.detach().to("cpu", torch.int32).contiguous()
        w = topk_weights.detach().to("cpu", torch.float32).contiguous()
        calls.route(ids if routed is None else routed.detach().to("cpu", torch.int32),
               self.expert_bytes)
        return self._compute(x, ids, w, out_dtype, False, None)

    __call__ = forward

    def _compute(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype,
                 pin: bool, event) -> torch.Tensor:
        if event is not None:
            event.synchronize()
        t = time.perf_counter()
        if self.backend == "cpp":
            out = self._compute_cpp(x, ids, w)
        else:
            out = self._compute_torch(x, ids, w)
        calls.add_inline_seconds(time.perf_counter() - t)
        if pin:
            res = torch.empty(out.shape, dtype=out_dtype, pin_memory=True)
            res.copy_(out)
            return res
        return out.to(out_dtype)

    def _compute_cpp(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        lib = get_lib()
        n, k = ids.shape
        out = torch.empty(n, self.hp, dtype=torch.float32)
        isa = min(detected_isa(), isa_cap())
        amx_min = amx_min_tokens()
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
