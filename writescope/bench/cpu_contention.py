"""``python -m writescope.bench.cpu_contention [--json FILE]``: the CPU attention kernel at the size
of one in-engine layer call, alone and with busy threads competing for its cores.

Inside the engine the kernel runs once per layer on a batch's spilled blocks (tens of MB at
batch 4) with the GPU working in between, and other threads share the machine: the launching
thread, the CUDA driver's threads, and any thread spinning while it waits for the device. The
kernel's OpenMP team needs all of its threads at once: one team member that the scheduler has
descheduled stalls the whole parallel region for a time slice. This measures that effect: p50
and p90 of planned calls (``CpuAttentionPlan``) separated by short gaps, first alone, then with
``--spinners`` processes busy-looping.

Default shape: MLA 16/1/576, batch 4 x 8K tokens, block 64 (one DeepSeek-V2-Lite layer call
at batch 4 in the spilled-KV bench rows).
"""
from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time

import torch

from ..attention import cpu
from ..attention.batch import BlockBatch
from ..kvcache.regions import KVSpec, cpu_pool_shape
from ..units import parse_count
from .provenance import git_commit, source_digest, write_json

SPECS = {"mla-16/1/576": (lambda: KVSpec.mla(1, 512, 64, torch.bfloat16), 16),
         "gqa-32/4/128": (lambda: KVSpec.gqa(1, 4, 128, torch.bfloat16), 32)}


def timed_calls(plan, q, pool, reps: int, gap_s: float) -> list[float]:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        plan(q, pool)
        ts.append(time.perf_counter() - t0)
        time.sleep(gap_s)
    return sorted(ts)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_contention",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="mla-16/1/576", choices=list(SPECS))
    ap.add_argument("--size", default="4x8K", help="BATCHxLENGTH (default 4x8K)")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--gap-ms", type=float, default=0.5, help="pause between calls")
    ap.add_argument("--spinners", type=int, default=1, help="busy processes in the second run")
    ap.add_argument("--threads", type=int, help="kernel threads (default: the kernel's default)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not cpu.available():
        raise SystemExit(f"CPU attention kernel unavailable: {cpu.load_error()}")
    if args.threads:
        cpu.set_num_threads(args.threads)
    try:
        batch, length = (parse_count(x) for x in args.size.lower().split("x"))
    except ValueError as e:
        raise SystemExit(f"--size: {args.size!r} is not BATCHxLENGTH ({e})") from None
    spec_fn, hq = SPECS[args.shape]
    spec, bs = spec_fn(), args.block_size
    nb = math.ceil(length / bs)
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(cpu_pool_shape(spec, batch * nb, bs)[1:], generator=g).to(spec.dtype)
    perm = torch.randperm(batch * nb, generator=g)
    lens = [[bs] * (nb - 1) + [length - bs * (nb - 1)]] * batch
    bb = BlockBatch.build([1] * batch, [perm[i * nb:(i + 1) * nb].tolist() for i in range(batch)],
                          lens)
    q = torch.randn(batch, hq, spec.k_dim, generator=g).to(spec.dtype)
    plan = cpu.CpuAttentionPlan(pool, "cpu", spec, bb, 1 / math.sqrt(spec.k_dim), batch, hq,
                                q.dtype)
    kv_bytes = batch * length * spec.num_kv_heads * spec.rec_dim * spec.itemsize
    timed_calls(plan, q, pool, 5, 0.0)  # warm-up
    rows = []
    for label, spinners in (("alone", 0), (f"{args.spinners} busy process(es)", args.spinners)):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                 for _ in range(spinners)]
        try:
            time.sleep(0.2 if spinners else 0.0)
            ts = timed_calls(plan, q, pool, args.reps, args.gap_ms / 1e3)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        p50, p90 = statistics.median(ts), ts[int(0.9 * (len(ts) - 1))]
        row = {"run": label, "spinners": spinners, "p50_ms": p50 * 1e3, "p90_ms": p90 * 1e3,
               "max_ms": ts[-1] * 1e3, "gbps_p50": kv_bytes / p50 / 1e9}
        rows.append(row)
        print(f"{label:24s} p50 {row['p50_ms']:7.2f} ms  p90 {row['p90_ms']:7.2f} ms  "
              f"max {row['max_ms']:7.2f} ms  {row['gbps_p50']:6.1f} GB/s at p50", flush=True)
    res = {"bench": "cpu_contention", "git_commit": git_commit(), "source_digest": source_digest(),
           "command": "python -m writescope.bench.cpu_contention " + " ".join(
               argv if argv is not None else sys.argv[1:]),
           "shape": args.shape, "batch": batch, "length": length, "kv_bytes": kv_bytes,
           "threads": cpu.get_num_threads(), "isa": cpu.get_isa(spec.dtype), "rows": rows}
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
