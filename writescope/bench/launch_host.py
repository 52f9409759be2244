"""Host time of the attention launches, without a GPU: the Python a decode step's partials and
merge launches cost up to Triton's launcher, per call -- the whole ``launch_partials`` /
``launch_reduce`` (the engine's path), their bound launch alone (``FastLaunch.bind``), and the
same launch unbound (``FastLaunch`` keying and ordering every named argument each call, as
before the seventy-second session).

``python -m writescope.bench.launch_host [--calls 20000] [--json FILE]`` (each way timed in
five interleaved rounds; the fastest round's time a call)

Triton's compiled launcher is replaced by a stand-in that does nothing (:class:`StandInJit`), so
the figures are the Python before it -- what ``bench.step_profile --cprofile`` attributes to
``launch_partials``/``launch_reduce`` and FastLaunch's key on the GPU machine, where the
launcher's own ~10 us a call comes on top. Shapes: Qwen3-30B-A3B's GQA (32 query heads over 4
KV heads of 128) and DeepSeek-V2-Lite's MLA, a decode step of 4 rows.
"""
from __future__ import annotations

import argparse
import inspect
import time

import torch

from ..attention import gpu as G
from ..attention import launch as L
from ..kvcache.regions import KVSpec


class _Param:
    def __init__(self, name: str, constexpr: bool):
        self.name, self.is_constexpr = name, constexpr


class _Kernel:
    """A compiled form whose launcher records its calls (or, ``calls`` None, does nothing)."""

    function = "fn"
    packed_metadata = "md"

    def __init__(self, key: int, calls: list | None):
        self.key, self.calls = key, calls

    def run(self, *args):
        if self.calls is not None:
            self.calls.append((self.key, args))


class StandInJit:
    """Triton's ``JITFunction`` as :class:`~writescope.attention.launch.FastLaunch` sees it:
    ``fn``, ``params`` (``constexprs`` named) and ``fn[grid](...)``, which "compiles" a new
    :class:`_Kernel` each call (kept in ``compiled``) and returns it."""

    def __init__(self, fn, constexprs, record: bool = True):
        self.fn = fn
        self.__name__ = fn.__name__
        self.params = [_Param(n, n in constexprs) for n in inspect.signature(fn).parameters]
        self.compiled: list = []
        self.calls: list | None = [] if record else None

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            k = _Kernel(len(self.compiled), self.calls)
            self.compiled.append((grid, args, kwargs))
            return k
        return jit


def stand_in_kernels() -> tuple[L.FastLaunch, L.FastLaunch]:
    """FastLaunch wrappers of stand-ins with the partials' and merge kernels' signatures (the
    real ones need Triton; their parameters are read from gpu.py's source)."""
    src = inspect.getsource(G._kernels)
    out = []
    for name in ("partial_kernel", "reduce_kernel"):
        head = src[src.index(f"def {name}("):]
        head = head[:head.index("):") + 2]
        params = [p.strip() for p in head[head.index("(") + 1:-2].replace("\n", " ").split(",")]
        names = [p.split(":")[0].strip() for p in params if p.strip()]
        consts = {p.split(":")[0].strip() for p in params if "constexpr" in p}
        ns: dict = {}
        exec(f"def {name}({', '.join(names)}):\n    pass", ns)
        out.append(L.FastLaunch(StandInJit(ns[name], consts, record=False)))
    return out[0], out[1]


def _time(fn, calls: int) -> float:
    for _ in range(min(100, calls)):
        fn()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def measure(calls: int = 20000, rounds: int = 5) -> list[dict]:
    """Per shape, the fastest round's microseconds a call of each way."""
    part, red = stand_in_kernels()
    saved = (G._kernels, L.raw_stream)
    G._kernels = lambda: (part, red)
    L.raw_stream = lambda device: 0
    G._partials_launch.cache_clear()
    G._reduce_launch.cache_clear()
    rows = []
    try:
        for shape, spec, hq in (("gqa", KVSpec.gqa(48, 4, 128, torch.bfloat16), 32),
                                ("mla", KVSpec.mla(27, 512, 64, torch.bfloat16), 16)):
            nq, bs, chunks = 4, 64, 40
            q = torch.zeros(nq, hq, spec.k_dim, dtype=torch.bfloat16)
            kv = torch.zeros(8, bs, spec.num_kv_heads, spec.rec_dim, dtype=torch.bfloat16)
            i32 = torch.zeros(64, dtype=torch.int32)
            plan = G.ChunkPlan(i32[:chunks], i32[:chunks], i32[:chunks], i32[:chunks], 0, 1)
            po = torch.zeros(chunks, hq, spec.v_dim)
            pl = torch.zeros(chunks, hq)
            out = torch.zeros(nq, hq, spec.v_dim)
            lse = torch.zeros(nq, hq)
            flags = (True, True)  # a Hopper step: dependent launches, early reads
            pargs = (q, kv, spec, plan, i32, i32, 0.088, po, pl, 1)
            # the same launches through FastLaunch with every named argument (before binding)
            bp = G._partials_launch(spec, bs, spec.num_kv_heads, spec.rec_dim, hq,
                                    hq // spec.num_kv_heads, 1, False, False,
                                    G.default_config(spec, hq // spec.num_kv_heads, 1), *flags)
            br = G._reduce_launch(hq, spec.v_dim, G.reduce_config(nq, hq, spec.v_dim), True,
                                  None, None, *flags)
            a_p = (q, kv, kv, i32, i32, plan.kv0, plan.kv1, plan.q0, plan.qn, po, pl, 0, 0,
                   q.stride(0), q.stride(1), 0.088)
            a_r = (po, pl, i32, i32, out, lse, out, lse, out, out, 0, 0, 0, 0, 1.0, out, out, out,
                   0, 0)
            ways = {
                "partials_call_us": lambda: G.launch_partials(*pargs, flags=flags),
                "partials_bound_us": lambda: bp.launch((chunks, 1, 1), a_p),
                "partials_unbound_us": lambda: part[(chunks, 1, 1)](*a_p, **bp.kwargs),
                "reduce_call_us": lambda: G.launch_reduce(po, pl, i32, i32, out, lse, (out, lse),
                                                          flags=flags),
                "reduce_bound_us": lambda: br.launch((nq, 8, 2), a_r),
                "reduce_unbound_us": lambda: red[(nq, 8, 2)](*a_r, **br.kwargs),
            }
            best = {k: float("inf") for k in ways}
            for _ in range(rounds):  # interleaved: the host's speed moves between rounds
                for k, fn in ways.items():
                    best[k] = min(best[k], _time(fn, max(1, calls // rounds)) * 1e6)
            rows.append({"shape": shape, **best})
    finally:
        G._kernels, L.raw_stream = saved
        G._partials_launch.cache_clear()
        G._reduce_launch.cache_clear()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = measure(args.calls)
    print("us a call, the Python before Triton's launcher: the whole launch function (the "
          "engine's path), its bound launch alone, and the same launch unbound")
    print("shape  launch     function  bound  unbound")
    for r in rows:
        for k in ("partials", "reduce"):
            print(f"{r['shape']:<6} {k:<9} {r[f'{k}_call_us']:9.2f} {r[f'{k}_bound_us']:6.2f} "
                  f"{r[f'{k}_unbound_us']:8.2f}")
    if args.json:
        from .provenance import result_header, write_json
        write_json(args.json, {**result_header("launch_host", argv), "calls": args.calls,
                               "rows": rows})


if __name__ == "__main__":
    main()
