"""``python -m writescope.bench.cpu_shared [--batch 8] [--prefix 32k] [--own 1k] [--json F]``:
the CPU attention kernel over a batch whose sequences share a prefix of blocks (prefix caching:
one document, many questions), with shared reads (``attention/shared_reads.py``: a shared block
read once for all its holders; ``WRITESCOPE_CPU_SHARED_READS=all``, so that MLA shapes, which the
engine reads once per holder, are measured too) and without (``=0``: once per holder).

Per shape (GQA 32/4/128, Qwen3's; MLA 16/1/576, DeepSeek-V2-Lite's; any ``gqa-HQ/H/D``, e.g.
Mixtral's ``gqa-32/8/128``), one layer of a C-layout bf16 pool, decode (one query row per
sequence), the kernel variant the engine would run (``--isa``, default ``auto``), alternating the two forms ``--reps`` times each: the median call
time, the KV bytes the sequences list (``listed_gb``: the work as the step plan used to count
it) and those each form reads (``read_gb``), ``listed_gbps`` (listed bytes / time: the rate at
which the batch's attention is served) and ``read_gbps`` (read bytes / time), beside the
machine's DRAM read probe (``read_bw_gbps``, as in ``bench.cpu_attention``). Prints a table and
writes JSON.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ..attention import cpu
from ..attention.batch import BlockBatch
from ..hostmem import pageable_empty
from ..kvcache.regions import cpu_pool_shape
from ..units import parse_count
from .cpu_attention import SHAPES, _machine, fill_random, probe_bytes, shape_case
from .provenance import result_header, write_json


def case(name: str, batch: int, prefix: int, own: int, bs: int, gen: torch.Generator):
    """(spec, query heads, pool, batch, queries): ``batch`` sequences listing the same
    ``prefix`` tokens' blocks, then ``own`` tokens of their own each."""
    spec_fn, hq = shape_case(name)
    spec = spec_fn()
    n_pre, n_own = -(-prefix // bs), -(-own // bs)
    n = n_pre + batch * n_own
    pool = pageable_empty(int(torch.Size(cpu_pool_shape(spec, n, bs)[1:]).numel()), spec.dtype)
    pool = fill_random(pool.view(cpu_pool_shape(spec, n, bs)[1:]), gen)
    blocks = [list(range(n_pre)) + list(range(n_pre + i * n_own, n_pre + (i + 1) * n_own))
              for i in range(batch)]
    lens = [[bs] * len(b) for b in blocks]
    bb = BlockBatch.build([1] * batch, blocks, lens)
    q = torch.randn(batch, hq, spec.k_dim, generator=gen).to(torch.bfloat16)
    return spec, hq, pool, bb, q, n


def bench_shape(name: str, batch: int, prefix: int, own: int, bs: int, reps: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    spec, hq, pool, bb, q, n_blocks = case(name, batch, prefix, own, bs, gen)
    block_bytes = bs * spec.token_bytes()
    listed = bb.num_blocks * block_bytes
    plans, times = {}, {"shared": [], "each": []}
    before = os.environ.get("WRITESCOPE_CPU_SHARED_READS")
    try:
        for form, env in (("shared", "all"), ("each", "0")):  # (all: MLA too)
            os.environ["WRITESCOPE_CPU_SHARED_READS"] = env
            plans[form] = cpu.CpuAttentionPlan(pool, "cpu", spec, bb, 0.1, batch, hq, q.dtype)
            plans[form](q, pool)  # warm-up
    finally:  # (the plans are made: the setting is read when a plan is)
        if before is None:
            os.environ.pop("WRITESCOPE_CPU_SHARED_READS", None)
        else:
            os.environ["WRITESCOPE_CPU_SHARED_READS"] = before
    if plans["shared"].shared is None:
        raise SystemExit("the kernel found nothing to share (is the compiled kernel loaded?)")
    for _ in range(reps):  # alternating: both forms see the same moments of the machine
        for form, plan in plans.items():
            t0 = time.perf_counter()
            plan(q, pool)
            times[form].append(time.perf_counter() - t0)
    out = {"shape": name, "batch": batch, "prefix_tokens": prefix, "own_tokens": own,
           "block_size": bs, "listed_gb": listed / 1e9}
    for form, ts in times.items():
        read = (n_blocks if form == "shared" else bb.num_blocks) * block_bytes
        t = statistics.median(ts)
        out[form] = {"median_ms": 1e3 * t, "best_ms": 1e3 * min(ts), "read_gb": read / 1e9,
                     "listed_gbps": listed / t / 1e9, "read_gbps": read / t / 1e9}
    out["speedup"] = out["each"]["median_ms"] / out["shared"]["median_ms"]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_shared",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help="of: " + ", ".join(SHAPES) + ", or gqa-HQ/H/D (e.g. gqa-32/8/128)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefix", default="32k", help="shared tokens (e.g. 32k)")
    ap.add_argument("--own", default="1k", help="each sequence's own tokens")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None, help="kernel threads (default: all)")
    ap.add_argument("--isa", default="auto", help="kernel variant (cpu.isas(), or auto)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not cpu.available():
        raise SystemExit(f"the compiled CPU kernel is not available: {cpu.load_error()}")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        try:
            shape_case(s)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    if args.batch < 2:
        raise SystemExit("--batch must be at least 2 (one sequence shares nothing)")
    prefix, own = parse_count(args.prefix), parse_count(args.own)
    if args.threads:
        cpu.set_num_threads(args.threads)
    cpu.set_isa(args.isa)
    probe = cpu.probe_buffer(probe_bytes())
    read_bw = cpu.read_bandwidth(probe.numel() * 4, buffer=probe)
    del probe
    rows = []
    print(f"{args.batch} sequences sharing {prefix} tokens, {own} own each; DRAM read probe "
          f"{read_bw:.1f} GB/s; kernel {cpu.get_isa()}, {cpu.get_num_threads()} threads")
    print(f"{'shape':>14} {'form':>7} {'ms':>8} {'read GB':>8} {'read GB/s':>10} "
          f"{'listed GB/s':>12}")
    for s in shapes:
        r = bench_shape(s, args.batch, prefix, own, args.block_size, args.reps)
        rows.append(r)
        for form in ("shared", "each"):
            f = r[form]
            print(f"{s:>14} {form:>7} {f['median_ms']:8.2f} {f['read_gb']:8.3f} "
                  f"{f['read_gbps']:10.1f} {f['listed_gbps']:12.1f}")
        print(f"{s:>14} shared reads: {r['speedup']:.2f}x")
    res = {**result_header("cpu_shared", argv), "machine": _machine(), "read_bw_gbps": read_bw,
           "kernel_isa": cpu.get_isa(), "threads": cpu.get_num_threads(), "rows": rows}
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
