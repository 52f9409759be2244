"""``python -m writescope.bench.h2d_copies [--json FILE]``: how fast the staging ring's copies move
T blocks to the GPU, by the shape of the copies, alone and beside a CPU read of DRAM.

One layer's T blocks of a step are ``runs`` runs of consecutive blocks in the pinned pool (one
per sequence, at a fixed spacing: each sequence's extent less its CPU share). They reach the
GPU as

* ``one``: a single copy of the same number of bytes (the rate the link gives one big copy);
* ``runs``: one ``cuMemcpyHtoDAsync`` per run (``WRITESCOPE_COPY_2D=0``);
* ``strided``: one ``cuMemcpy2DAsync`` per layer (the ring's default, :func:`strided_copies`);

each through :class:`~writescope.attention.staging.CudaCopier`, the ring's own copier, ``--layers``
layers back to back on its stream, timed by device events. ``--cpu-read-threads N`` (default 15)
repeats every case beside ``N`` CPU threads summing an array several times the last-level cache
(the CPU side of a hybrid step reads DRAM while the link does). Patterns (``--patterns``): the
spilled bench's 64 x 4K GQA and MLA steps at a CPU share of 0.55 (64 runs of 29 blocks), and a
decode-like pattern of single blocks (``singles``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch

from ..attention.cpu import probe_buffer
from ..attention.staging import CudaCopier, strided_copies
from .provenance import result_header, write_json

BLOCK_TOKENS = 64
#: name: (runs per layer, blocks per run, spacing in blocks, bytes per token)
PATTERNS = {
    "gqa-64x4K": (64, 29, 64, 2 * 4 * 128 * 2),
    "mla-64x4K": (64, 29, 64, 576 * 2),
    "singles": (512, 1, 4, 2 * 4 * 128 * 2),
}


class CpuReader:
    """``threads`` torch threads summing ``buf`` (:func:`~writescope.attention.cpu.probe_buffer`,
    the read probes' array) in a loop, on a Python thread (torch releases the interpreter lock
    inside the sum); the rate is over the whole window, its 0.3 s lead-in included."""

    def __init__(self, threads: int, buf: torch.Tensor):
        self.threads = threads
        self.x = buf
        self.stop = threading.Event()
        self.bytes = 0
        self.t: threading.Thread | None = None

    def _loop(self) -> None:
        torch.set_num_threads(self.threads)
        while not self.stop.is_set():
            self.x.sum()
            self.bytes += self.x.numel() * 4

    def __enter__(self):
        self.old_threads = torch.get_num_threads()
        self.t0 = time.perf_counter()
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()
        self.gbps = self.bytes / (time.perf_counter() - self.t0) / 1e9
        torch.set_num_threads(self.old_threads)  # (the loop set the process-wide count)


def time_copies(copier: CudaCopier, dst: torch.Tensor, pool: torch.Tensor, copies: list,
                layers: int, reps: int) -> float:
    """Median seconds to move ``copies`` for ``layers`` layers (device events on the stream)."""
    out = []
    for _ in range(reps + 1):
        copier.reset()
        start = torch.cuda.Event(enable_timing=True)
        start.record(copier.stream)
        for layer in range(layers):
            copier.copy_unit(dst, pool[layer], copies, None)
        end = torch.cuda.Event(enable_timing=True)
        end.record(copier.stream)
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return statistics.median(out[1:])


def run_pattern(name: str, layers: int, reps: int) -> dict:
    runs_n, per_run, spacing, tok_bytes = PATTERNS[name]
    block = BLOCK_TOKENS * tok_bytes
    nblocks = runs_n * spacing
    pool = torch.empty(layers, nblocks, block, dtype=torch.uint8, pin_memory=True)
    pool.fill_(1)
    moved = runs_n * per_run
    dst = torch.empty(moved, block, dtype=torch.uint8, device="cuda")
    runs = [(i * spacing + spacing - per_run, i * per_run, per_run) for i in range(runs_n)]
    cases = {"one": [(0, 0, moved, 1, moved)],
             "runs": strided_copies(runs, strided=False),
             "strided": strided_copies(runs)}
    copier = CudaCopier(torch.device("cuda"))
    copier.timed = False
    nbytes = layers * moved * block
    row = {"pattern": name, "runs_per_layer": runs_n, "run_bytes": per_run * block,
           "layers": layers, "bytes": nbytes}
    for case, copies in cases.items():
        s = time_copies(copier, dst, pool, copies, layers, reps)
        row[case] = {"GBps": nbytes / s / 1e9, "dma_calls_per_layer": copier.copies // layers}
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.h2d_copies",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu-read-threads", type=int, default=15,
                    help="CPU threads reading DRAM beside the copies (0: alone only)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("h2d_copies: needs CUDA (the copies are host-to-device DMA)", file=sys.stderr)
        return {}
    names = [p for p in args.patterns.split(",") if p]
    bad = [p for p in names if p not in PATTERNS]
    if bad:
        ap.error(f"unknown pattern(s) {bad}; known: {sorted(PATTERNS)}")
    out = {**result_header("h2d_copies", argv), "rows": []}
    beside = [0] + ([args.cpu_read_threads] if args.cpu_read_threads > 0 else [])
    buf = probe_buffer(8 << 30) if args.cpu_read_threads > 0 else None  # once, for every row
    print(f"{'pattern':11s} {'runs':>5s} {'run MB':>7s} {'CPU rd':>7s} | "
          f"{'one':>6s} {'runs':>6s} {'strided':>7s} GB/s | CPU GB/s")
    for name in names:
        for threads in beside:
            if threads:
                with CpuReader(threads, buf) as rd:
                    row = run_pattern(name, args.layers, args.reps)
                row["cpu_read_GBps"] = rd.gbps
            else:
                row = run_pattern(name, args.layers, args.reps)
                row["cpu_read_GBps"] = 0.0
            row["cpu_read_threads"] = threads
            out["rows"].append(row)
            print(f"{name:11s} {row['runs_per_layer']:5d} {row['run_bytes'] / 1e6:7.2f} "
                  f"{threads:7d} | {row['one']['GBps']:6.1f} {row['runs']['GBps']:6.1f} "
                  f"{row['strided']['GBps']:7.1f}      | {row['cpu_read_GBps']:.1f}",
                  flush=True)
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
