"""Where one core's time goes in the AMX CPU attention kernel, phase by phase.

``python -m writescope.bench.cpu_phases [--shapes ...] [--pools 0.5,1536] [--threads 1,16]
[--prefetch-blocks 0,1] [--seconds 2] [--isa amx] [--json FILE]``

Builds the kernel library with ``-DWS_PHASES`` (time-stamp counter reads at the phase
boundaries of ``amx_item`` in ``csrc/attn_amx.cpp``; the production build has none) and runs one
sequence of 4096 blocks per thread (``--threads``, default one), over a pool that fits a core's
L2 (its blocks repeated) and over one far past the L3. Per 32-token group of one KV head
it prints nanoseconds in each phase:

* ``layout``: gathering the pass's blocks (partial groups copied and zero-padded);
* ``qk``: the Q.K tile products and the scores' unscrambling into ``S``;
* ``softmax``: the online softmax over the pass and P into the A operand's layout;
* ``pv``: the P.V tile products into O.

With ``--isa`` another of the kernel's variants runs instead (``avx512bf16``, the AVX-512 BF16
kernel of CPUs without AMX): it has no phase counters, so only its GB/s and time per group
over the two pools are printed. The L2 pool gives the kernel's work with its data next to the core; what the DRAM pool adds on
top is time spent waiting for DRAM. On the dev VM the two add up (the fifteenth session's
ablation), which is why the kernel reads DRAM at about 2 / (1/C + 1/M). With several threads
the phase times are each thread's, averaged (the counters add every thread's cycles).
"""
from __future__ import annotations

import argparse
import ctypes
import time

import torch

from ..attention import cpu
from ..attention.batch import BlockBatch
from ..hostmem import pageable_empty
from ..kvcache.regions import cpu_pool_shape
from .cpu_attention import SHAPES, _machine, fill_random
from .provenance import result_header, write_json

PHASES = ("gap", "layout", "qk", "softmax", "pv")  # the order of PH(0..4) in attn_amx.cpp
BLOCKS = 4096
BLOCK_SIZE = 64


def phase_library(defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The kernel library with the phase counters (emulated tiles where the CPU has no AMX),
    built with the extra preprocessor ``defines`` (``NAME=VALUE``: the kernel's compile-time
    knobs, e.g. ``WS_KSB=512`` token slots per online-softmax pass)."""
    flags = ("-DWS_PHASES",) if "amx" in cpu.isas() else ("-DWS_AMX_EMULATE", "-DWS_PHASES")
    return cpu.build_test_variant(flags + tuple(f"-D{d}" for d in defines))


def parse_variants(text: str) -> list[tuple[str, ...]]:
    """``"A=1,B=2;A=3"`` -> [("A=1", "B=2"), ("A=3",)]; an empty entry is the default build."""
    out = []
    for part in text.split(";"):
        ds = tuple(d.strip() for d in part.split(",") if d.strip())
        for d in ds:
            name = d.split("=", 1)[0]
            if not name.isidentifier() or not name.startswith("WS_"):
                raise SystemExit(f"--defines: {d!r} is not WS_NAME=VALUE")
        out.append(ds)
    return out


def measure(lib: ctypes.CDLL, shape: str, pool_mb: float, seconds: float, prefetch: int,
            blocks: int = BLOCKS, threads: int = 1, gen: torch.Generator | None = None,
            isa: str = "amx") -> dict:
    """One shape over a pool of ``pool_mb`` MiB, one sequence of ``blocks`` blocks per thread,
    calls repeated for ``seconds``. Phase times are per thread: cycles summed over the threads
    divided by the groups all of them attended."""
    gen = gen or torch.Generator().manual_seed(0)
    spec_fn, hq = SHAPES[shape]
    spec = spec_fn()
    bs = BLOCK_SIZE
    tok_bytes = spec.num_kv_heads * spec.rec_dim * spec.itemsize
    nblk = max(1, int(pool_mb * 2**20 / (tok_bytes * bs)))
    pool = fill_random(pageable_empty(cpu_pool_shape(spec, nblk, bs)[1:], spec.dtype), gen)
    if nblk < blocks:  # L2-sized: every sequence walks the pool's few blocks again and again
        ids = [[i % nblk for i in range(blocks)] for _ in range(threads)]
    else:  # past the L3: distinct blocks where the pool has enough, else random draws
        perm = torch.randperm(nblk, generator=gen).tolist()
        ids = [perm[t * blocks:(t + 1) * blocks] if (t + 1) * blocks <= nblk
               else torch.randint(0, nblk, (blocks,), generator=gen).tolist() for t in range(threads)]
    bb = BlockBatch.build([1] * threads, ids, [[bs] * blocks] * threads)
    q = torch.randn(threads, hq, spec.k_dim, generator=gen).to(torch.bfloat16)
    cyc = (ctypes.c_uint64 * 8).in_dll(lib, "ws_phase_cycles")
    lib.ws_phase_tsc.restype = ctypes.c_uint64
    prev_threads, prev_isa = cpu.num_threads_setting(), cpu.current_isa_setting()
    pf, pf_user = cpu.get_prefetch_blocks(), cpu.prefetch_chosen_by_user()
    cpu.set_num_threads(threads)
    try:
        with cpu.use_library(lib):
            cpu.set_prefetch_blocks(prefetch)
            cpu.set_isa(isa)
            cpu.attend_cpu(q, pool, "cpu", spec, bb, 0.1)  # warm-up (and first touch)
            for i in range(8):
                cyc[i] = 0
            calls, c0, t0 = 0, lib.ws_phase_tsc(), time.perf_counter()
            while calls == 0 or time.perf_counter() - t0 < seconds:
                cpu.attend_cpu(q, pool, "cpu", spec, bb, 0.1)
                calls += 1
            c1, dt = lib.ws_phase_tsc(), time.perf_counter() - t0
    finally:
        cpu.set_num_threads(prev_threads)
        cpu.set_prefetch_blocks(pf, from_profile=not pf_user)  # as it was, and whose choice it was
        cpu.set_isa(prev_isa)
    groups = calls * threads * blocks * bs / 32 * spec.num_kv_heads  # all threads' groups
    tsc_hz = (c1 - c0) / dt
    phase_ns = {nm: cyc[i] / tsc_hz / groups * 1e9 for i, nm in enumerate(PHASES)}
    per_group = dt * threads / groups * 1e9  # one thread's wall time per group
    return {"shape": shape, "pool_mib": pool_mb, "pool_blocks": nblk, "prefetch_blocks": prefetch,
            "threads": threads, "isa": isa, "calls": calls, "seconds": dt,
            "kernel_gbps": calls * threads * blocks * bs * tok_bytes / dt / 1e9,
            "ns_per_group": per_group, "tsc_ghz": tsc_hz / 1e9, "phase_ns_per_group": phase_ns,
            # the share of the calls' time inside the item loop (the rest: dispatch, threads
            # waiting for the last one, Python)
            "phases_frac_of_time": sum(phase_ns.values()) / per_group}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_phases", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ", ".join(SHAPES))
    ap.add_argument("--pools", default="0.5,1536", help="pool sizes in MiB (L2-resident, past the L3)")
    ap.add_argument("--prefetch-blocks", default="0,1", help="software prefetch distances to run")
    ap.add_argument("--seconds", type=float, default=2.0, help="per configuration")
    ap.add_argument("--threads", default="1", help="comma list of kernel thread counts")
    ap.add_argument("--defines", default="",
                    help="kernel builds to compare, ';'-separated, each a comma list of WS_NAME=VALUE "
                         "(an empty entry: the default build); run side by side per configuration")
    ap.add_argument("--isa", default="amx",
                    help="kernel variant (default amx, emulated where the CPU has no AMX; other "
                         "variants have no phase counters: GB/s and time per group only)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if not cpu.available():
        raise SystemExit(f"the CPU kernel is not available: {cpu.load_error()}")
    if args.isa == "amx" and not cpu.features()["avx512_bf16"]:
        raise SystemExit("the AMX kernel (or its emulation) needs AVX-512 BF16")
    if args.isa != "amx" and args.isa not in cpu.isas():
        raise SystemExit(f"--isa {args.isa}: this CPU runs {', '.join(cpu.isas())}")
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    pools = [float(x) for x in args.pools.split(",") if x]
    pfs = [int(x) for x in args.prefetch_blocks.split(",") if x]
    thread_counts = [int(x) for x in args.threads.split(",") if x]
    variants = parse_variants(args.defines)
    libs = [(v, phase_library(v)) for v in variants]
    rows = []
    print(f"{'shape':14} {'pool MiB':>9} {'thr':>3} {'pf':>3} {'GB/s':>6} {'ns/group':>9}  " +
          " ".join(f"{p:>8}" for p in PHASES[1:]) + "  in loop" + ("  build" if len(libs) > 1 else ""))
    for shape in shapes:
        for mb in pools:
            for th in thread_counts:
                for pf in pfs:
                    for defines, lib in libs:
                        r = measure(lib, shape, mb, args.seconds, pf, threads=th, isa=args.isa)
                        r["defines"] = list(defines)
                        rows.append(r)
                        ph = r["phase_ns_per_group"]
                        cols = (" ".join(f"{ph[p]:8.0f}" for p in PHASES[1:]) + f"  {r['phases_frac_of_time']:6.0%}"
                                if args.isa == "amx" else " ".join(f"{'-':>8}" for _ in PHASES[1:]) + f"  {'-':>6}")
                        print(f"{shape:14} {mb:9.1f} {th:3d} {pf:3d} {r['kernel_gbps']:6.1f} {r['ns_per_group']:9.0f}  " +
                              cols +
                              (f"  {','.join(defines) or 'default'}" if len(libs) > 1 else ""), flush=True)
    out = {**result_header("cpu_phases", argv), "machine": _machine(),
           "emulated_tiles": "amx" not in cpu.isas(), "rows": rows}
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
