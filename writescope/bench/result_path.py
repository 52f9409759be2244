"""``python -m writescope.bench.result_path [--busy-mb 138,268] [--reps 40] [--json FILE]``: how
long a small result takes to reach the device from pinned host memory while the staging ring's
copies keep the host-to-device link busy.

A CPU expert call's result (a few KB a decode step) returns to the device on the compute stream.
In a step that streams T blocks, a copy stream moves pieces of 138-268 MB at the same time. This
times, with device events around it on the compute stream, the result's transfer by a copy
engine (``Tensor.to``, ``WRITESCOPE_CPU_EXPERT_RESULT=copy``) and by a kernel that reads it in
place (``layers/pinned_read.py``, ``kernel``, the default since 2026-12-08): alone, and with
another stream copying pieces of each ``--busy-mb`` size back to back. If the copy waits behind a piece, its latency
grows toward a piece's time (~2.6-5 ms at ~53 GB/s); the kernel's should not."""
from __future__ import annotations

import argparse
import json
import statistics

import torch


def _latencies(mode: str, src: torch.Tensor, reps: int, busy: torch.Tensor | None,
               busy_dst: torch.Tensor | None) -> list[float]:
    """Microseconds per transfer of ``src`` on the current stream, ``reps`` times, each after
    a short spin so that a busy link's copy is in flight."""
    from ..layers import pinned_read
    dev = torch.device("cuda")
    side = torch.cuda.Stream()
    out = []
    for _ in range(reps):
        if busy is not None:
            with torch.cuda.stream(side):
                for _ in range(3):  # a queue of pieces: the transfer lands behind one or more
                    busy_dst.copy_(busy, non_blocking=True)
        torch.cuda._sleep(200_000)  # let the side stream's first piece start
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y = pinned_read.to_device(src, dev) if mode == "kernel" else src.to(dev, non_blocking=True)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
        del y
        side.synchronize()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.result_path",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy-mb", default="138,268",
                    help="sizes of the copy stream's pieces, MB (comma-separated)")
    ap.add_argument("--result-kb", type=float, default=16.0,
                    help="the result's size, KB (4 rows of 2048 bf16: 16)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("result_path needs a CUDA device")
    try:
        busy_sizes = [float(x) for x in args.busy_mb.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--busy-mb takes sizes in MB, got {args.busy_mb!r}")
    if args.reps < 1 or args.result_kb <= 0 or any(s <= 0 for s in busy_sizes):
        raise SystemExit("--reps, --result-kb and --busy-mb must be > 0")
    src = torch.randn(max(1, int(args.result_kb * 512)), dtype=torch.float32).to(
        torch.bfloat16).pin_memory()
    rows = []
    for mb in [0.0] + busy_sizes:
        busy = busy_dst = None
        if mb:
            busy = torch.empty(int(mb * 2**20), dtype=torch.uint8, pin_memory=True)
            busy_dst = torch.empty_like(busy, device="cuda")
        for mode in ("copy", "kernel"):
            _latencies(mode, src, 2, busy, busy_dst)  # (warm-up: the kernel's first compile)
            lat = sorted(_latencies(mode, src, args.reps, busy, busy_dst))
            rows.append({"busy_mb": mb, "mode": mode, "median_us": statistics.median(lat),
                         "p90_us": lat[int(0.9 * (len(lat) - 1))], "max_us": lat[-1]})
            r = rows[-1]
            print(f"link busy with {mb:6.0f} MB pieces  {mode:6s}  median {r['median_us']:8.1f} "
                  f"us  p90 {r['p90_us']:8.1f} us  max {r['max_us']:8.1f} us")
        del busy, busy_dst
    res = {"result_bytes": src.numel() * src.element_size(), "reps": args.reps, "rows": rows,
           "device": torch.cuda.get_device_name()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
