"""The ways this host reads DRAM, side by side: the denominator of the CPU kernels' targets.

``python -m writescope.bench.read_probes [--threads 16,14] [--rounds 3] [--json FILE]``

Issue 8 measures the CPU attention kernel against "the machine's DRAM read bandwidth", and the
hybrid step (issue 9) against H2D plus a CPU read measured beside it. Each benchmark takes that
read from one probe. On the H200 host the AMX tile unit with a software prefetch once streamed
124-130 GB/s, and torch's sum 90-108 GB/s, where the kernel library's vector-load probe read
79-89 GB/s (2026-12-01i-h200 calls 1 and 2); on the 2-core dev VM tile loads stream at ~85% of
vector loads. This bench times every way of reading the same array, in interleaved rounds (the
host's bandwidth moves between minutes; every thread count and method once per round), alone
and, with a GPU, beside a sustained pinned H2D copy:

* ``vector``: the kernel library's multi-threaded integer sum (``cpu.read_bandwidth``: the
  probe of ``bench.cpu_attention``), and ``vector+pf``: the same with a software prefetch into
  L2 ahead of the sum;
* ``torch.sum``: torch's sum, the calibration's ``cpu_read_Bps`` and, beside the link, its
  ``concurrent_cpu_read_Bps`` (the hybrid bench's combined ceiling);
* ``tile`` and ``tile+pf`` (AMX only): 1 KB tile loads, one tile product each
  (``cpu.tile_read_bandwidth``), without and with software prefetch.

Per thread count and method it prints the best and median over rounds, alone and beside H2D,
and writes JSON with every round's rate.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ..attention import cpu
from .provenance import result_header, write_json

PREFETCH_BYTES = 64 * 1024


def methods() -> dict:
    """name -> one read of the whole array (a float32 tensor from ``cpu.probe_buffer``) with
    ``threads`` threads, returning its GB/s."""
    def vector(pf):
        return lambda a, t: cpu.read_bandwidth(0, threads=t, reps=1, buffer=a, prefetch_bytes=pf)

    def tile(pf):
        return lambda a, t: cpu.tile_read_bandwidth(0, threads=t, reps=1, buffer=a,
                                                    prefetch_bytes=pf)

    def torch_sum(a, t):
        old = torch.get_num_threads()
        torch.set_num_threads(t)
        try:
            t0 = time.perf_counter()
            a.sum()
            return a.numel() * 4 / (time.perf_counter() - t0) / 1e9
        finally:
            torch.set_num_threads(old)

    out = {"vector": vector(0), "vector+pf": vector(PREFETCH_BYTES), "torch.sum": torch_sum}
    if "amx" in cpu.isas():
        out.update({"tile": tile(0), "tile+pf": tile(PREFETCH_BYTES)})
    return out


def beside_h2d(fn, threads: int, nbytes: int) -> dict:
    """One method's rate while a pinned H2D copy stream runs (and the link's rate beside it)."""
    from ..planner.calibrate import concurrent_rates
    r = concurrent_rates(1 << 30, nbytes, 12, lambda _msg: None, cpu_pass=lambda a: fn(a, threads))
    return {"cpu_GBps": (r["concurrent_cpu_read_Bps"] or 0.0) / 1e9,
            "h2d_GBps": r["concurrent_h2d_Bps"] / 1e9}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.read_probes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="", help="comma list (default: the kernel's threads)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--read-bytes", type=int, default=0,
                    help="array size (default: max(1 GiB, 6 x last-level cache))")
    ap.add_argument("--no-h2d", action="store_true", help="skip the runs beside the H2D copy")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    from .cpu_attention import _machine, probe_bytes
    if not cpu.available():
        raise SystemExit(f"CPU kernel library unavailable: {cpu.load_error()}")
    try:
        threads = [int(x) for x in args.threads.split(",") if x.strip()] or [cpu.get_num_threads()]
    except ValueError:
        threads = [0]
    if any(t < 1 for t in threads) or args.rounds < 1:
        raise SystemExit("--threads takes a comma list of counts >= 1 and --rounds a count >= 1")
    nbytes = args.read_bytes or probe_bytes()
    h2d = torch.cuda.is_available() and not args.no_h2d
    ms = methods()
    a = cpu.probe_buffer(nbytes)
    res = {**result_header("read_probes", argv), "machine": _machine(), "array_bytes": nbytes,
           "prefetch_bytes": PREFETCH_BYTES, "rows": []}
    print(f"{nbytes / 2**30:.2f} GiB array; GB/s, best / median of {args.rounds} interleaved "
          f"rounds" + ("; beside a pinned H2D copy: CPU read (H2D)" if h2d else ""), flush=True)
    alone = {(t, m): [] for t in threads for m in ms}
    side = {(t, m): [] for t in threads for m in ms}
    for _ in range(args.rounds):  # every thread count and method once per round: they share
        for t in threads:         # the host's states
            for m, fn in ms.items():
                fn(a, t)  # warm-up pass: the pages, the thread team
                alone[t, m].append(max(fn(a, t) for _ in range(2)))
                if h2d:
                    side[t, m].append(beside_h2d(fn, t, nbytes))
    for t in threads:
        for m in ms:
            row = {"threads": t, "method": m, "alone_GBps": alone[t, m],
                   "alone_best_GBps": max(alone[t, m]),
                   "alone_median_GBps": statistics.median(alone[t, m])}
            line = f"{t:3d} threads  {m:10s} {row['alone_best_GBps']:7.1f} / {row['alone_median_GBps']:7.1f}"
            if h2d:
                row["beside_h2d"] = side[t, m]
                cpu_r = [s["cpu_GBps"] for s in side[t, m]]
                h2d_r = [s["h2d_GBps"] for s in side[t, m]]
                row["beside_h2d_best_cpu_GBps"] = max(cpu_r)
                row["beside_h2d_median_cpu_GBps"] = statistics.median(cpu_r)
                row["beside_h2d_median_h2d_GBps"] = statistics.median(h2d_r)
                line += (f"   beside H2D {max(cpu_r):7.1f} / {statistics.median(cpu_r):7.1f}"
                         f" ({statistics.median(h2d_r):.1f})")
            res["rows"].append(row)
            print(line, flush=True)
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
