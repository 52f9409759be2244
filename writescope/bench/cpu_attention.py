"""CPU decode-attention benchmark: the kernel against DRAM read bandwidth and the torch path.

``python -m writescope.bench.cpu_attention [--json FILE]`` measures, in one run:

* the machine's DRAM read bandwidth (a multi-threaded sum over an array several times the
  last-level cache, the kernel's thread count);
* the same array read every other way ``writescope.bench.read_probes`` knows (the sum with a
  software prefetch, torch's sum, and with AMX the tile unit's 1 KB tile loads with and without
  prefetch): ``read_bw_by_method_gbps``. On the H200 host torch's sum and prefetched tile loads
  read up to 1.5x and 1.6x the vector probe at the same moment, so ``best_read_bw_gbps``, the best of every method
  over the run, is the demanding denominator (``kernel_frac_of_best_read_bw``, and paired,
  ``paired_frac_of_best_read_bw``: each call right after one pass of every method);
* the kernel's achieved GB/s of KV read (bytes of the valid records / time), C layout, bf16,
  for the default variant and every other variant this CPU runs, and the T (GPU) layout; its
  calls rotate through copies of the shape's KV that together span the probe's array, so that
  no call reads what the last ones left in the last-level cache (``kv_sets``; ``--warm``: one
  copy, the bench's way until 2026-12-04e);
* with ``--isa profile``, each shape on the kernel variant (and AMX prefetch distance) that
  ``writescope calibrate`` chose for its attention family on this machine -- what the engine
  runs -- instead of the kernel's own default (``auto``: on CPUs without AMX the AVX-512 BF16
  kernel prefetching into L2, or into L1 on Zen 5 cores, ``cpu.l1_prefetch_core``; until the
  eighty-second session into L1 everywhere, which the 2-core Zen 4 dev VM reads 1.2-1.5x
  slower; a machine without a profile runs ``auto``);
* the torch-matmul path: bf16 matmuls + fp32 softmax over the same KV held dense and
  head-major (``torch_gbps``, the best torch can do), and the engine's portable paged path
  :func:`attend_torch` on the pool (``torch_paged_gbps``),

for GQA 32/4/128 and MLA 16/1/576 at batch x length 1x256K, 8x32K and 64x4K. Prints a table
and writes JSON with, per shape, ``kernel_gbps``, ``torch_gbps``, ``read_bw_gbps``.
``kernel_gbps`` is the median of ``--reps`` calls; the read probe is the best of its reps, and
``kernel_best_gbps`` (the table's ``best%``) the kernel's best call, the like-for-like figure on
a shared, noisy machine. The probe runs again before every shape; the final fractions use the
best probe of the run. ``paired_frac_of_read_bw`` (``paired%``): ``--reps`` more calls, each
right after a one-pass probe, and the median of the call-to-probe ratios -- on a machine whose
neighbours come and go, the estimate least moved by them.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from ..attention import cpu
from ..attention.batch import BlockBatch
from ..attention.torch_paged import attend_torch
from ..hostmem import huge_page_fraction, pageable_empty
from ..kvcache.regions import KVSpec, cpu_pool_shape, gpu_pool_shape
from ..units import parse_count
from .provenance import result_header, write_json

SHAPES = {
    "gqa-32/4/128": (lambda: KVSpec.gqa(1, 4, 128, torch.bfloat16), 32),
    "mla-16/1/576": (lambda: KVSpec.mla(1, 512, 64, torch.bfloat16), 16),
}
SIZES = [(1, 262144), (8, 32768), (64, 4096)]


def shape_case(name: str):
    """(KVSpec factory, query heads) of a shape: one of SHAPES, or any GQA shape written
    ``gqa-HQ/H/D`` (query heads / KV heads / head dim, e.g. ``gqa-32/8/128``, Mixtral-8x7B's)."""
    if name in SHAPES:
        return SHAPES[name]
    parts = name[4:].split("/") if name.startswith("gqa-") else []
    if len(parts) == 3 and all(x.isdigit() and int(x) > 0 for x in parts):
        hq, h, d = map(int, parts)
        if hq % h == 0:
            return (lambda: KVSpec.gqa(1, h, d, torch.bfloat16)), hq
    raise ValueError(f"unknown shape {name!r}: one of {', '.join(SHAPES)} or gqa-HQ/H/D "
                     "(HQ a multiple of H)")


def shape_family(name: str) -> str:
    """The profile's attention-family key of a shape (``planner.roofline.attn_family``'s):
    what a calibration chose the kernel variant for."""
    from ..planner.roofline import family_key
    spec_fn, hq = shape_case(name)
    spec = spec_fn()
    return family_key(spec.is_mla, hq, spec.num_kv_heads, spec.rec_dim if spec.is_mla else spec.k_dim)


def profile_variants(path: str | None) -> tuple[dict[str, str], dict[str, int], str | None]:
    """The kernel variant and the AMX kernel's prefetch distance per attention family that
    ``writescope calibrate`` chose on this machine -- what the engine runs -- from the profile at
    ``path``, else ``$WRITESCOPE_PROFILE``, else this machine's cached profile (none: ``{}``);
    and where they came from. Nothing is calibrated here."""
    from ..planner.profile import HardwareProfile, default_cache_path
    src = path or os.environ.get("WRITESCOPE_PROFILE") or default_cache_path()
    if not Path(src).exists():
        if path:
            raise SystemExit(f"--profile {path}: no such file")
        return {}, {}, None
    try:
        prof = HardwareProfile.load(src)
    except (OSError, ValueError) as e:
        raise SystemExit(f"profile {src}: {e}") from None
    return (dict(getattr(prof, "cpu_attn_isa", None) or {}),
            dict(getattr(prof, "cpu_attn_prefetch_blocks", None) or {}), str(src))


def _llc_bytes() -> int:
    best = 0
    for p in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            s = (p / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
            best = max(best, int(s.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            pass
    return best or 32 << 20


def _machine() -> dict:
    model = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "llc_bytes": _llc_bytes(), "features": cpu.features(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version()}


def _times(fn, reps: int) -> list[float]:
    fn()  # warm-up (first touch, thread pool start)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def _time(fn, reps: int) -> float:
    return statistics.median(_times(fn, reps))


def torch_matmul_attention(q: torch.Tensor, dense: torch.Tensor, spec: KVSpec, scale: float,
                           dtype: torch.dtype = torch.bfloat16):
    """Decode attention with torch matmuls over dense ``[B, H, T, R]`` KV (operands in
    ``dtype``, fp32 softmax): what the torch path could do with no paging at all."""
    b, h, t, _ = dense.shape
    g = q.shape[1] // h
    x = dense if dense.dtype == dtype else dense.to(dtype)
    k = spec.k(x)  # [B, H, T, Dk]
    v = spec.v(x)
    qs = q.view(b, h, g, -1).to(dtype)
    s = torch.matmul(qs, k.transpose(-1, -2)).float() * scale  # [B, H, G, T]
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - lse).to(dtype)
    out = torch.matmul(p, v).float()  # [B, H, G, Dv]
    return out.reshape(b, h * g, -1), lse.reshape(b, h * g)


def _reads(probe: torch.Tensor, reps: int) -> dict[str, float]:
    """The probe array read every other way (``read_probes.methods`` but the vector probe,
    which the bench times on its own), each the best of ``reps``."""
    from .read_probes import methods
    t = cpu.get_num_threads()
    return {m: max(fn(probe, t) for _ in range(reps)) for m, fn in methods().items() if m != "vector"}


def fill_random(pool: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``pool`` filled with standard-normal values, 16M elements at a time (no pool-sized fp32
    temporary); returns it."""
    flat = pool.view(-1)
    step = 1 << 24
    for i in range(0, flat.numel(), step):
        flat[i:i + step] = torch.randn(min(step, flat.numel() - i), generator=gen)
    return pool


def decode_lens(batch: int, length: int, bs: int) -> list[list[int]]:
    """Each sequence's valid tokens per block: ``length`` tokens in blocks of ``bs``."""
    nb_seq = math.ceil(length / bs)
    return [[bs] * (nb_seq - 1) + [length - bs * (nb_seq - 1)] for _ in range(batch)]


def probe_bytes() -> int:
    """The read probe's array: max(1 GiB, 6 x the last-level cache)."""
    return max(1 << 30, 6 * _llc_bytes())


#: how a decode case's blocks lie in its pool (``decode_case``'s ``order``): each sequence's blocks
#: scattered over its set's ids at random; each sequence's blocks one contiguous run (as a
#: sequence prefilled alone gets them from the C region's lowest-free-first list); the sequences'
#: blocks interleaved block by block (as a batch decoding in lockstep gets them).
ORDERS = ("scattered", "contiguous", "lockstep")


def block_sets(order: str, sets: int, batch: int, nb_seq: int, lens: list[list[int]],
               gen: torch.Generator) -> list[BlockBatch]:
    """One block batch per KV set: set k owns the ids ``k * batch * nb_seq ...`` of the pool, laid
    out as ``order`` (:data:`ORDERS`) says; every order's set k covers the same ids, so calls of
    any order that rotate through the sets never read the same memory twice in a row."""
    if order not in ORDERS:
        raise ValueError(f"block order {order!r}: one of {', '.join(ORDERS)}")
    nblocks = batch * nb_seq
    out = []
    for k in range(sets):
        base = k * nblocks
        if order == "scattered":
            ids = (torch.randperm(nblocks, generator=gen) + base).tolist()
            blocks = [ids[i * nb_seq:(i + 1) * nb_seq] for i in range(batch)]
        elif order == "contiguous":
            blocks = [list(range(base + i * nb_seq, base + (i + 1) * nb_seq)) for i in range(batch)]
        else:
            blocks = [list(range(base + i, base + nblocks, batch)) for i in range(batch)]
        out.append(BlockBatch.build([1] * batch, blocks, lens))
    return out


def case_bytes(name: str, batch: int, length: int, bs: int, cold_bytes: int = 0) -> int:
    """The bytes of :func:`decode_case`'s pool (every KV set) for these arguments."""
    spec = shape_case(name)[0]()
    nblocks = batch * math.ceil(length / bs)
    kv_bytes = batch * length * spec.num_kv_heads * spec.rec_dim * spec.itemsize
    sets = max(1, math.ceil(cold_bytes / kv_bytes))
    return math.prod(cpu_pool_shape(spec, sets * nblocks, bs)[1:]) * spec.itemsize


def decode_case(name: str, batch: int, length: int, bs: int, gen: torch.Generator,
                cold_bytes: int = 0, order: str = "scattered", arena: torch.Tensor | None = None):
    """One shape's decode step on the CPU: ``batch`` sequences of ``length`` tokens in a C pool of
    random contents (any values do: the rate is what counts), allocated as the engine allocates
    its C pool (huge pages advised before the first touch), their blocks laid out as ``order``
    says (:func:`block_sets`; until 2026-12-04f scattered over the whole pool rather than over
    their set's ids).

    ``cold_bytes``: the pool holds as many disjoint sets of the step's blocks as it takes to span
    that many bytes (at least one), each set a batch of its own, so that calls rotating through
    the sets never find the last calls' KV in the last-level cache -- as an engine step, which
    reads every layer's KV once, never does. One call's KV is 0.3-0.5 GB here, and the H200
    host's last-level cache 300 MB: timed back to back on one set, calls read partly from it
    (the bench's medians ran 4-22 points of the probe above its paired calls, each made after
    a probe had evicted it, and up to 128% of the probe; 2026-12-04e-h200 call 3). Set i's blocks hold a copy of set 0's contents.

    ``arena``: a flat byte tensor of at least :func:`case_bytes` whose first bytes become the
    pool (:func:`settled_arena`), instead of a newly allocated pool.

    Returns (spec, pool, block batches (one per set), bf16 queries, scale, KV bytes one call
    reads)."""
    spec_fn, hq = shape_case(name)
    spec = spec_fn()
    nb_seq = math.ceil(length / bs)
    nblocks = batch * nb_seq
    kv_bytes = batch * length * spec.num_kv_heads * spec.rec_dim * spec.itemsize
    sets = max(1, math.ceil(cold_bytes / kv_bytes))
    total = sets * nblocks
    pool_shape = cpu_pool_shape(spec, total, bs)[1:]
    if arena is None:
        pool = pageable_empty(pool_shape, spec.dtype)
    else:
        pool = arena[:math.prod(pool_shape) * spec.itemsize].view(spec.dtype).view(pool_shape)
    fill_random(pool[:nblocks], gen)
    for k in range(1, sets):  # (a copy: random numbers for every set would take seconds each)
        pool[k * nblocks:(k + 1) * nblocks].copy_(pool[:nblocks])
    bbs = block_sets(order, sets, batch, nb_seq, decode_lens(batch, length, bs), gen)
    q = torch.randn(batch, hq, spec.k_dim, generator=gen).to(torch.bfloat16)
    return spec, pool, bbs, q, 1.0 / math.sqrt(spec.k_dim), kv_bytes


def settled_arena(nbytes: int, probe: torch.Tensor | None, max_s: float = 60.0,
                  frac: float = 0.95) -> tuple[torch.Tensor, list[dict]]:
    """A byte buffer of ``nbytes`` (rounded up to 64) on the C pool's kind of pages, to carve
    every shape's KV pool from (:func:`decode_case`'s ``arena``): written, then read until it
    reads as fast as ``probe`` (a DRAM-sized buffer read many times before) -- pairs of one
    vector pass over each, until two pairs in a row give the arena at least ``frac`` of the
    probe's rate, or ``max_s`` seconds have passed (``probe`` None: two passes over the arena).
    Returns the arena and each pair's (seconds since the write, arena GB/s, probe GB/s or None).

    Why: an engine's C pool is allocated once and then read every step. On the lent GPU hosts
    (virtual machines) a newly allocated and written pool read at a third to half the rate of the
    same pool seconds later (``bench.fresh_pages``; issue 8's table, 2026-12-07c/d): timing each
    shape's first calls on a pool of its own measured the new memory, not the kernel."""
    nbytes = -(-nbytes // 64) * 64
    arena = pageable_empty(nbytes, torch.uint8)
    floats = arena.view(torch.float32)
    floats.fill_(1.0)
    t0 = time.perf_counter()
    trace: list[dict] = []
    ok = 0
    while ok < 2 and (not trace or time.perf_counter() - t0 < max_s):
        a = cpu.read_bandwidth(nbytes, reps=1, buffer=floats)
        p = None if probe is None else cpu.read_bandwidth(probe.numel() * 4, reps=1, buffer=probe)
        trace.append({"t_s": time.perf_counter() - t0, "arena_gbps": a, "probe_gbps": p})
        ok = ok + 1 if p is None or a >= frac * p else 0
    return arena, trace


def bench_shape(name: str, batch: int, length: int, reps: int, torch_reps: int, bs: int,
                variants: bool, gpu_layout: bool, gen: torch.Generator,
                prefetch: tuple[int, ...] = (), probe: torch.Tensor | None = None,
                cold_bytes: int = 0, order: str = "scattered",
                arena: torch.Tensor | None = None) -> dict:
    """One shape's row; the kernel's calls rotate through the KV sets of ``cold_bytes`` (see
    :func:`decode_case`; 0: every call on the same KV), the blocks laid out as ``order`` says,
    the pool carved from ``arena`` if given (else allocated for the shape)."""
    spec, pool, bbs, q, scale, kv_bytes = decode_case(name, batch, length, bs, gen, cold_bytes, order,
                                                      arena)
    bb = bbs[0]
    sets = itertools.cycle(bbs)
    row = {"shape": name, "batch": batch, "length": length, "block_size": bs,
           "kv_bytes": kv_bytes, "kv_sets": len(bbs), "block_order": order,
           "pool_memory": "new" if arena is None else "arena",
           "threads": cpu.get_num_threads()}

    def kernel(kv, layout="cpu"):
        return lambda: cpu.attend_cpu(q, kv, layout, spec, next(sets), scale)

    isa = cpu.get_isa(spec.dtype)
    row["kernel_isa"] = isa
    # how much of the KV the kernel reads sits in huge pages as its timed calls start (the
    # pool was just allocated and filled; 4 KiB pages wait for the kernel's background collapse)
    row["pool_huge_page_frac_at_start"] = huge_page_fraction(pool)
    ts = _times(kernel(pool), reps)
    t = statistics.median(ts)
    row["kernel_s"] = t
    row["kernel_gbps"] = kv_bytes / t / 1e9
    # best of the reps: the like-for-like figure for the read probe (also a best of its reps)
    row["kernel_best_gbps"] = kv_bytes / min(ts) / 1e9
    if probe is not None:  # paired: probes right before each call, the median of the ratios
        ratios, best_ratios = [], []
        for _ in range(reps):
            reads = _reads(probe, 1)  # every other way of reading, then the vector probe
            bw = cpu.read_bandwidth(probe.numel() * 4, reps=1, buffer=probe)
            call = kernel(pool)
            t0 = time.perf_counter()
            call()
            gbps = kv_bytes / (time.perf_counter() - t0) / 1e9
            ratios.append(gbps / bw)
            best_ratios.append(gbps / max(bw, *reads.values()))
        row["paired_frac_of_read_bw"] = statistics.median(ratios)
        row["paired_frac_of_best_read_bw"] = statistics.median(best_ratios)
    if variants:
        by = {}
        prev = cpu.current_isa_setting()
        for v in cpu.isas():
            cpu.set_isa(v)
            by[v] = kv_bytes / _time(kernel(pool), reps) / 1e9
        cpu.set_isa(prev)
        row["kernel_gbps_by_isa"] = by
    if prefetch:  # the AMX kernel's prefetch distance (blocks ahead), the default variant
        by = {}
        prev = cpu.get_prefetch_blocks()
        for n in prefetch:
            cpu.set_prefetch_blocks(n)
            by[str(n)] = kv_bytes / _time(kernel(pool), reps) / 1e9
        cpu.set_prefetch_blocks(prev)
        row["kernel_gbps_by_prefetch_blocks"] = by
    row["pool_huge_page_frac_at_end"] = huge_page_fraction(pool)
    ref = attend_torch(q, pool, "cpu", spec, bb, scale)
    out = cpu.attend_cpu(q, pool, "cpu", spec, bb, scale)
    row["max_abs_diff_vs_torch"] = float((out[0] - ref[0]).abs().max())
    del ref, out
    if torch_reps > 0:
        t = _time(lambda: attend_torch(q, pool, "cpu", spec, bb, scale), torch_reps)
        row["torch_paged_gbps"] = kv_bytes / t / 1e9
        # the torch-matmul path at its best: KV already dense and head-major per sequence
        dense = torch.empty(batch, spec.num_kv_heads, length, spec.rec_dim, dtype=spec.dtype)
        dense.view(-1)[: min(dense.numel(), pool.numel())].copy_(pool.view(-1)[: dense.numel()])
        by = {}
        for dt in (torch.bfloat16, torch.float32):  # bf16 operands, or KV upcast per call
            t = _time(lambda: torch_matmul_attention(q, dense, spec, scale, dt), torch_reps)
            by[str(dt).replace("torch.", "")] = kv_bytes / t / 1e9
        row["torch_gbps_by_dtype"] = by
        row["torch_gbps"] = max(by.values())
        del dense
    if gpu_layout:  # T blocks read in place (GPU layout, token-major)
        gshape = gpu_pool_shape(spec, pool.shape[0], bs)[1:]
        if arena is None:
            gp = pageable_empty(gshape, spec.dtype)
            gp.view(-1).copy_(pool.view(-1))  # contents do not matter for the rate
        else:  # the same bytes read as T blocks (the contents do not matter for the rate)
            gp = pool.view(-1).view(gshape)
        del pool
        t = _time(kernel(gp, "gpu"), reps)
        row["kernel_gbps_gpu_layout"] = kv_bytes / t / 1e9
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--threads", type=int, help="kernel threads (default: cpu.get_num_threads())")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--torch-reps", type=int, default=2, help="0 skips the torch path")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ", ".join(SHAPES))
    ap.add_argument("--sizes", default=",".join(f"{b}x{l}" for b, l in SIZES),
                    help="comma list of BATCHxLENGTH")
    ap.add_argument("--no-variants", action="store_true", help="time only the default ISA")
    ap.add_argument("--no-gpu-layout", action="store_true", help="skip the T-layout timing")
    ap.add_argument("--prefetch-blocks", default="",
                    help="comma list of AMX prefetch distances (blocks ahead; 0: no software "
                         "prefetch) to time as well")
    ap.add_argument("--read-bytes", type=int, default=0,
                    help="bandwidth probe array (default: max(1 GiB, 6 x last-level cache)); the "
                         "kernel's calls rotate through as many copies of a shape's KV as span it")
    ap.add_argument("--isa", default="auto",
                    help="the kernel variant: auto (the kernel's own choice), profile (the one "
                         "`writescope calibrate` chose for the shape's family, as the engine runs "
                         "it: --profile, else $WRITESCOPE_PROFILE, else this machine's cached "
                         "profile; auto for a family it does not name), or a variant name")
    ap.add_argument("--profile", help="the profile --isa profile reads")
    ap.add_argument("--order", default="scattered", choices=ORDERS,
                    help="how each sequence's blocks lie in the pool (default: scattered at random)")
    ap.add_argument("--pool-memory", default="arena", choices=("arena", "new"),
                    help="arena (default): every shape's KV pool is carved from one buffer allocated "
                         "at the start and read until it reads as fast as the probe's buffer, as an "
                         "engine's pool, allocated once, is in its steady state; new: a pool "
                         "allocated for each shape and timed at once (the bench's way until "
                         "2026-12-07e: on virtual machines its first calls read new memory)")
    ap.add_argument("--settle-s", type=float, default=60.0,
                    help="the arena's reads stop settling after this many seconds")
    ap.add_argument("--warm", action="store_true",
                    help="time every call on the same KV (until 2026-12-04e the bench's only "
                         "way: part of it is then read from the last-level cache)")
    args = ap.parse_args(argv)
    shapes = []
    for name in filter(None, args.shapes.split(",")):  # a full name, or its family: "mla", "gqa"
        match = [k for k in SHAPES if k == name or k.split("-")[0] == name]
        if not match:
            raise SystemExit(f"--shapes: unknown shape {name!r} (known: {', '.join(SHAPES)}, "
                             f"or a family: {', '.join(sorted({k.split('-')[0] for k in SHAPES}))})")
        shapes += [k for k in match if k not in shapes]
    try:
        pf = tuple(int(x) for x in args.prefetch_blocks.split(",") if x.strip())
    except ValueError:
        pf = (-1,)
    if any(n < 0 for n in pf):
        raise SystemExit(f"--prefetch-blocks: {args.prefetch_blocks!r} is not a comma list of "
                         "distances of 0 blocks (no software prefetch) or more")
    if not cpu.available():
        raise SystemExit(f"CPU attention kernel unavailable: {cpu.load_error()}")
    if args.threads:
        cpu.set_num_threads(args.threads)
    chosen, chosen_pf, chosen_from = ({}, {}, None)
    if args.isa == "profile":
        chosen, chosen_pf, chosen_from = profile_variants(args.profile)
        if pf and any(shape_family(n) in chosen_pf for n in shapes):
            raise SystemExit("--prefetch-blocks: --isa profile sets the profile's distances")
    elif args.isa != "auto" and args.isa not in cpu.isas():
        raise SystemExit(f"--isa {args.isa}: this CPU runs {', '.join(cpu.isas())} (or auto, profile)")
    elif args.profile:
        raise SystemExit("--profile goes with --isa profile")
    sizes = []
    for bl in args.sizes.split(","):
        try:  # "8x32K" or "8x32768", as the table prints them
            sizes.append(tuple(parse_count(x) for x in bl.lower().split("x")))
        except ValueError as e:
            raise SystemExit(f"--sizes: {bl!r} is not BATCHxLENGTH ({e})") from None
        if len(sizes[-1]) != 2 or min(sizes[-1]) < 1:
            raise SystemExit(f"--sizes: {bl!r} is not BATCHxLENGTH")
    if args.settle_s < 0:
        raise SystemExit("--settle-s must be >= 0")
    gen = torch.Generator().manual_seed(0)
    nbytes = args.read_bytes or probe_bytes()
    probe = cpu.probe_buffer(nbytes)
    read_bw = cpu.read_bandwidth(nbytes, reps=5, buffer=probe)
    probes = [read_bw]
    res = {**result_header("cpu_attention", argv), "machine": _machine(),
           "threads": cpu.get_num_threads(), "read_bw_array_bytes": nbytes, "read_bw_gbps": read_bw,
           "isa_setting": args.isa, "profile": chosen_from, "rows": []}
    print(f"DRAM read bandwidth ({nbytes / 2**30:.2f} GiB array, {cpu.get_num_threads()} threads): "
          f"{read_bw:.1f} GB/s", flush=True)
    cold = 0 if args.warm else nbytes
    arena = None
    if args.pool_memory == "arena":
        need = max(case_bytes(n, b, l, args.block_size, cold) for n in shapes for b, l in sizes)
        # settled against the probe where the probe reads DRAM (a small --read-bytes probe is
        # read from cache: no memory reads that fast)
        ref = probe if nbytes >= 4 * _llc_bytes() else None
        arena, trace = settled_arena(need, ref, args.settle_s)
        res["arena_bytes"], res["arena_settle"] = arena.numel(), trace
        settled = ref is None or (len(trace) >= 2 and all(
            t["arena_gbps"] >= 0.95 * t["probe_gbps"] for t in trace[-2:]))
        res["arena_settled"] = settled
        print(f"KV arena ({arena.numel() / 2**30:.2f} GiB, every shape's pool): read "
              + " ".join(f"{t['arena_gbps']:.0f}" + ("" if ref is None else f"/{t['probe_gbps']:.0f}")
                         for t in trace)
              + " GB/s" + ("" if ref is None else " (arena/probe)")
              + f" over {trace[-1]['t_s']:.1f} s"
              + ("" if settled else " -- not settled: it still reads slower than the probe's buffer"),
              flush=True)
    # the same array read every other way: the vector probe is not always the fastest reader
    by_method = [_reads(probe, 3)]
    print("the same array read other ways: " + ", ".join(
        f"{m} {v:.1f}" for m, v in by_method[0].items()) + " GB/s", flush=True)
    hdr = f"{'shape':14} {'BxL':>9} {'isa':>6} {'kernel':>8} {'%read':>6} {'best%':>6} {'paired%':>7} {'torch':>7} {'x torch':>7} {'paged':>6} {'T-layout':>8}  variants"
    print(hdr, flush=True)
    for name in shapes:
        for b, l in sizes:
            # the read probe again beside every shape: on a shared machine the denominator moves
            probes.append(cpu.read_bandwidth(nbytes, reps=3, buffer=probe))
            by_method.append(_reads(probe, 2))
            read_bw = max(probes)
            # the variant: --isa's, or the profile's for this family (one this CPU runs); else the
            # current setting (auto, or $WRITESCOPE_CPU_ATTN_ISA's) stays
            fam = shape_family(name)
            isa = chosen.get(fam) if args.isa == "profile" else args.isa
            prev_isa, isa_user = cpu.current_isa_setting(), cpu.isa_chosen_by_user()
            prev_pf, pf_user = cpu.get_prefetch_blocks(), cpu.prefetch_chosen_by_user()
            if isa in cpu.isas():
                cpu.set_isa(isa)
            if fam in chosen_pf:  # the AMX kernel's distance, as the engine sets it
                cpu.set_prefetch_blocks(chosen_pf[fam], from_profile=True)
            pf_used = cpu.get_prefetch_blocks()
            try:
                row = bench_shape(name, b, l, args.reps, args.torch_reps, args.block_size,
                                  not args.no_variants, not args.no_gpu_layout, gen, pf, probe,
                                  cold_bytes=cold, order=args.order, arena=arena)
            finally:
                cpu.set_isa(prev_isa, from_profile=not isa_user)
                cpu.set_prefetch_blocks(prev_pf, from_profile=not pf_user)
            row["prefetch_blocks"] = pf_used
            row["read_bw_probe_gbps"] = probes[-1]
            row["read_bw_gbps"] = read_bw
            row["kernel_frac_of_read_bw"] = row["kernel_gbps"] / read_bw
            row["kernel_best_frac_of_read_bw"] = row["kernel_best_gbps"] / read_bw
            if "torch_gbps" in row:
                row["speedup_vs_torch"] = row["kernel_gbps"] / row["torch_gbps"]
                row["speedup_vs_torch_paged"] = row["kernel_gbps"] / row["torch_paged_gbps"]
            res["rows"].append(row)
            var = " ".join(f"{k}={v:.1f}" for k, v in row.get("kernel_gbps_by_isa", {}).items())
            var += "".join(f" pf{k}={v:.1f}"
                           for k, v in row.get("kernel_gbps_by_prefetch_blocks", {}).items())
            print(f"{name:14} {b}x{l // 1024}K".ljust(25) + f" {row['kernel_isa']:>6} {row['kernel_gbps']:8.1f} "
                  f"{100 * row['kernel_frac_of_read_bw']:5.0f}% {100 * row['kernel_best_frac_of_read_bw']:5.0f}% "
                  f"{100 * row['paired_frac_of_read_bw']:6.0f}% "
                  f"{row.get('torch_gbps', float('nan')):7.1f} "
                  f"{row.get('speedup_vs_torch', float('nan')):7.1f} {row.get('torch_paged_gbps', float('nan')):6.1f} {row.get('kernel_gbps_gpu_layout', float('nan')):8.1f}  {var}",
                  flush=True)
    # every row against the best read probe of the whole run (the most demanding denominator)
    read_bw = max(probes)
    res["read_bw_gbps"] = read_bw
    res["read_bw_probes_gbps"] = probes
    by_method.append(_reads(probe, 3))
    res["read_bw_by_method_gbps"] = by_method  # at the start, beside every shape, at the end
    best = max([read_bw] + [v for d in by_method for v in d.values()])
    res["best_read_bw_gbps"] = best
    res["best_read_method"] = "vector" if best == read_bw else next(
        m for d in by_method for m, v in d.items() if v == best)
    for row in res["rows"]:
        row["read_bw_gbps"] = read_bw
        row["kernel_frac_of_read_bw"] = row["kernel_gbps"] / read_bw
        row["kernel_best_frac_of_read_bw"] = row["kernel_best_gbps"] / read_bw
        row["kernel_frac_of_best_read_bw"] = row["kernel_gbps"] / best
    print(f"read probes {', '.join(f'{p:.1f}' for p in probes)} GB/s; median/best against the "
          f"best ({read_bw:.1f}), and paired: " + ", ".join(
              f"{r['shape'].split('/')[0]} {r['batch']}x{r['length'] // 1024}K "
              f"{100 * r['kernel_frac_of_read_bw']:.0f}%/{100 * r['kernel_best_frac_of_read_bw']:.0f}%"
              f"/{100 * r['paired_frac_of_read_bw']:.0f}%"
              for r in res["rows"]), flush=True)
    print(f"best read of any method over the run: {best:.1f} GB/s ({res['best_read_method']}); "
          f"median and paired against it: " + ", ".join(
              f"{r['shape'].split('/')[0]} {r['batch']}x{r['length'] // 1024}K "
              f"{100 * r['kernel_frac_of_best_read_bw']:.0f}%/{100 * r['paired_frac_of_best_read_bw']:.0f}%"
              for r in res["rows"]), flush=True)
    if any(r.get("pool_huge_page_frac_at_start") is not None for r in res["rows"]):
        print("huge pages over each shape's KV (when its timed calls start / after its variants): "
              + ", ".join(f"{r['shape'].split('/')[0]} {r['batch']}x{r['length'] // 1024}K "
                          f"{_pct(r.get('pool_huge_page_frac_at_start'))}/"
                          f"{_pct(r.get('pool_huge_page_frac_at_end'))}" for r in res["rows"]),
              flush=True)
    if args.json:
        write_json(args.json, res)
    return res


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


if __name__ == "__main__":
    main()
