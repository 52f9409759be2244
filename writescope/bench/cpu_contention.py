"""``python -m writescope.bench.cpu_contention [--json FILE]``: the CPU attention kernel at the size
of one in-engine layer call, alone and with busy threads competing for its cores.

Inside the engine the kernel runs once per layer on a batch's spilled blocks (tens of MB at
batch 4) with the GPU working in between, and other threads share the machine: the launching
thread, the CUDA driver's threads, and any thread spinning while it waits for the device. A
kernel whose threads must all run at once (barriers, static shares of work) is stalled for a
time slice by one thread that the scheduler has descheduled. This measures that effect: p50, p90
and max of planned calls (``CpuAttentionPlan``) separated by short gaps, for every combination of

* ``--threads``: kernel thread counts (comma list; default: the kernel's default count);
* ``--spinners``: busy-looping processes beside it (comma list, default ``0,1``; 0 = alone);
* ``--layout``: the blocks read in the C (CPU) layout, the GPU layout (T blocks, most of the
  spilled KV in the engine), or both;
* ``--spin-us``: flagged calls as the engine makes them, the ready word raised ``--gap-ms``
  after the call starts; the team spins on it for up to this long (0: starts after it);
* ``--dma``: with CUDA, each case also beside a thread that keeps pinned-host -> GPU copies of a
  large buffer (``--dma-bytes``, 1 GiB) running on their own stream during the timed calls
  (PCIe DMA reading DRAM beside the kernel); the copies' GB/s during the calls is reported next
  to the kernel's (and their rate alone, just before). Without CUDA the DMA rows are skipped.

One table, one JSON row per combination. Default shape: MLA 16/1/576, batch 4 x 8K tokens,
block 64 (one DeepSeek-V2-Lite layer call at batch 4 in the spilled-KV bench rows).
"""
from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import threading
import time

import torch

from ..attention import cpu
from ..attention.batch import BlockBatch
from ..kvcache.regions import KVSpec, cpu_pool_shape, gpu_pool_shape
from ..units import parse_bytes, parse_count
from .provenance import result_header, write_json

SPECS = {"mla-16/1/576": (lambda: KVSpec.mla(1, 512, 64, torch.bfloat16), 16),
         "gqa-32/4/128": (lambda: KVSpec.gqa(1, 4, 128, torch.bfloat16), 32)}


def timed_calls(plan, q, pool, reps: int, gap_s: float, spin_s: float | None = None
                ) -> list[float]:
    """Sorted seconds per call. ``spin_s`` None: plain calls ``gap_s`` apart. Otherwise each call
    is a flagged one, made at once, whose ready word a timer raises ``gap_s`` later (as the
    device raises it once a layer's queries have landed); its time is the kernel's after the
    word, and ``spin_s`` is how long the team may spin on the word (0: the team starts after)."""
    ts = []
    if spin_s is None:
        for _ in range(reps):
            t0 = time.perf_counter()
            plan(q, pool)
            ts.append(time.perf_counter() - t0)
            time.sleep(gap_s)
        return sorted(ts)
    word = torch.zeros(1, dtype=torch.int64)
    for i in range(1, reps + 1):
        timer = threading.Timer(gap_s, word.fill_, (i,))
        timer.start()
        times: list = []
        plan(q, pool, ready=(word.data_ptr(), i), spin_s=spin_s, times=times)
        timer.join()
        ts.append(times[1])
    return sorted(ts)


def _int_list(text: str, name: str, minimum: int) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{name}: {text!r} is not a comma list of integers") from None
    if not vals or min(vals) < minimum:
        raise SystemExit(f"{name}: {text!r} needs integers >= {minimum}")
    return vals


class HostToDevice:
    """Pinned-host -> GPU copies of one buffer, kept running on their own stream by a thread.

    The buffer is copied in ``piece``-sized slices, two in flight, so the copy engine never idles
    between slices; :meth:`mark` / :meth:`gbps` give the rate over a window. The thread waits on
    blocking-sync events (it sleeps, it does not take a core from the kernel)."""

    def __init__(self, nbytes: int, piece: int = 64 << 20):
        self.src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.src.fill_(1)
        self.dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.piece = min(piece, nbytes)
        self.stream = torch.cuda.Stream()
        self.lock = threading.Lock()
        self.done_bytes = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _loop(self) -> None:
        try:
            n, off, inflight = self.src.numel(), 0, []
            with torch.cuda.stream(self.stream):
                while not self.stop.is_set():
                    k = min(self.piece, n - off)
                    self.dst[off:off + k].copy_(self.src[off:off + k], non_blocking=True)
                    ev = torch.cuda.Event(blocking=True)
                    ev.record(self.stream)
                    inflight.append((ev, k))
                    off = 0 if off + k >= n else off + k
                    if len(inflight) > 1:
                        ev0, k0 = inflight.pop(0)
                        ev0.synchronize()
                        with self.lock:
                            self.done_bytes += k0
                self.stream.synchronize()
        except BaseException as e:  # reported by stop()
            self.error = e

    def start(self) -> float:
        """Start the copies; returns their rate alone (GB/s over 0.3 s, the kernel idle)."""
        self.stop.clear()
        self.thread = threading.Thread(target=self._loop, name="ws-bench-dma", daemon=True)
        self.thread.start()
        time.sleep(0.2)  # let the copies reach their steady rate
        m0 = self.mark()
        time.sleep(0.3)
        return self.gbps(m0, self.mark())

    def mark(self) -> tuple[int, float]:
        with self.lock:
            return self.done_bytes, time.perf_counter()

    @staticmethod
    def gbps(a: tuple[int, float], b: tuple[int, float]) -> float:
        return (b[0] - a[0]) / max(b[1] - a[1], 1e-9) / 1e9

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"host-to-device copy thread failed: {self.error}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_contention",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="mla-16/1/576", choices=list(SPECS))
    ap.add_argument("--size", default="4x8K", help="BATCHxLENGTH (default 4x8K)")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=60, help="timed calls per row")
    ap.add_argument("--gap-ms", type=float, default=0.5, help="pause between calls")
    ap.add_argument("--spinners", default="0,1",
                    help="comma list of busy-process counts (default 0,1; 0 = alone)")
    ap.add_argument("--threads",
                    help="comma list of kernel thread counts (default: the kernel's default)")
    ap.add_argument("--layout", default="cpu", choices=["cpu", "gpu", "both"],
                    help="blocks in the C (cpu) layout, the GPU layout (T blocks), or both")
    ap.add_argument("--dma", action="store_true",
                    help="also time each case beside pinned-host -> GPU copies (CUDA only)")
    ap.add_argument("--dma-bytes", default="1GiB", help="buffer the copies cycle over")
    ap.add_argument("--q-dtype", default="model", choices=["model", "fp32"],
                    help="queries in the model dtype (bf16, as the engine passes them: the plan "
                         "converts them with a torch op first) or already fp32 (the kernel alone)")
    ap.add_argument("--chunk-blocks", default="0",
                    help="blocks per work item, comma list (0: the kernel's own sizing, >= 8 items "
                         "a thread); compares item sizes, e.g. 0,4,16")
    ap.add_argument("--spin-us", default=None,
                    help="comma list: time flagged calls instead, whose ready word is raised "
                         "--gap-ms after the call starts, the team spinning on it for up to "
                         "this many microseconds (0: it starts after the word); the time is "
                         "the kernel's after the word")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not cpu.available():
        raise SystemExit(f"CPU attention kernel unavailable: {cpu.load_error()}")
    spinner_counts = _int_list(args.spinners, "--spinners", 0)
    thread_counts = (_int_list(args.threads, "--threads", 1) if args.threads
                     else [cpu.get_num_threads()])
    layouts = ["cpu", "gpu"] if args.layout == "both" else [args.layout]
    dma_modes = [False]
    if args.dma:
        if torch.cuda.is_available():
            dma_modes.append(True)
        else:
            print("--dma: CUDA is not available here, the DMA rows are skipped", flush=True)
    try:
        batch, length = (parse_count(x) for x in args.size.lower().split("x"))
    except ValueError as e:
        raise SystemExit(f"--size: {args.size!r} is not BATCHxLENGTH ({e})") from None
    spec_fn, hq = SPECS[args.shape]
    spec, bs = spec_fn(), args.block_size
    nb = math.ceil(length / bs)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(batch * nb, generator=g)
    lens = [[bs] * (nb - 1) + [length - bs * (nb - 1)]] * batch
    bb = BlockBatch.build([1] * batch, [perm[i * nb:(i + 1) * nb].tolist() for i in range(batch)],
                          lens)
    q = torch.randn(batch, hq, spec.k_dim, generator=g)
    q = q if args.q_dtype == "fp32" else q.to(spec.dtype)
    scale = 1 / math.sqrt(spec.k_dim)
    chunks = [int(c) for c in str(args.chunk_blocks).split(",") if c.strip()]
    if not chunks or any(c < 0 for c in chunks):
        raise SystemExit(f"--chunk-blocks: {args.chunk_blocks!r} is not a list of counts >= 0")
    spins = [None] if args.spin_us is None else [
        float(x) * 1e-6 for x in str(args.spin_us).split(",") if x.strip()]
    if not spins or any(x is not None and x < 0 for x in spins):
        raise SystemExit(f"--spin-us: {args.spin_us!r} is not a list of times >= 0")
    pools, plans = {}, {}
    for layout in layouts:  # random contents (the rate is what counts)
        shape = (cpu_pool_shape if layout == "cpu" else gpu_pool_shape)(spec, batch * nb, bs)[1:]
        # T blocks are pinned in the engine (the GPU streams them too)
        pin = layout == "gpu" and torch.cuda.is_available()
        pools[layout] = torch.empty(shape, dtype=spec.dtype, pin_memory=pin)
        pools[layout].copy_(torch.randn(shape, generator=g))
        for c in chunks:
            plans[(layout, c)] = cpu.CpuAttentionPlan(pools[layout], layout, spec, bb, scale,
                                                      batch, hq, q.dtype, chunk_blocks=c)
    kv_bytes = batch * length * spec.num_kv_heads * spec.rec_dim * spec.itemsize
    dma = HostToDevice(parse_bytes(args.dma_bytes)) if True in dma_modes else None

    print(f"{args.shape} {batch}x{length}, {kv_bytes / 1e6:.1f} MB per call, "
          f"isa {cpu.get_isa(spec.dtype)}, q {str(q.dtype).replace('torch.', '')}, "
          f"{args.reps} calls per row, gap {args.gap_ms} ms",
          flush=True)
    print(f"{'threads':>7} {'spinners':>8} {'layout':>6} {'chunk':>5} {'spin us':>7} {'dma':>4} "
          f"{'p50 ms':>8} "
          f"{'p90 ms':>8} {'max ms':>8} {'GB/s p50':>9} {'dma GB/s':>9}", flush=True)
    rows = []
    for spinners in spinner_counts:
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                 for _ in range(spinners)]
        try:
            time.sleep(0.2 if spinners else 0.0)
            for with_dma in dma_modes:
                dma_alone = None
                if with_dma:
                    dma_alone = dma.start()
                    print(f"host-to-device copies alone ({spinners} busy process(es)): "
                          f"{dma_alone:.1f} GB/s", flush=True)
                try:
                    for threads in thread_counts:
                        if args.threads:
                            cpu.set_num_threads(threads)
                        for layout, chunk, spin in [(l, c, x) for l in layouts for c in chunks
                                                    for x in spins]:
                            plan, pool = plans[(layout, chunk)], pools[layout]
                            timed_calls(plan, q, pool, 3, 0.0)  # warm-up (threads start)
                            m0 = dma.mark() if with_dma else None
                            ts = timed_calls(plan, q, pool, args.reps, args.gap_ms / 1e3, spin)
                            dma_gbps = dma.gbps(m0, dma.mark()) if with_dma else None
                            p50, p90 = statistics.median(ts), ts[math.ceil(0.9 * len(ts)) - 1]
                            label = "alone" if spinners == 0 else f"{spinners} busy process(es)"
                            row = {"run": label + (" + dma" if with_dma else ""),
                                   "threads": threads, "spinners": spinners, "layout": layout,
                                   "chunk_blocks": chunk,
                                   "spin_us": None if spin is None else spin * 1e6,
                                   "dma": with_dma, "p50_ms": p50 * 1e3, "p90_ms": p90 * 1e3,
                                   "max_ms": ts[-1] * 1e3, "gbps_p50": kv_bytes / p50 / 1e9,
                                   "dma_gbps": dma_gbps, "dma_alone_gbps": dma_alone}
                            rows.append(row)
                            spin_txt = "-" if spin is None else f"{spin * 1e6:.0f}"
                            print(f"{threads:7d} {spinners:8d} {layout:>6} {chunk:5d} "
                                  f"{spin_txt:>7} "
                                  f"{'yes' if with_dma else 'no':>4} {row['p50_ms']:8.2f} "
                                  f"{row['p90_ms']:8.2f} {row['max_ms']:8.2f} "
                                  f"{row['gbps_p50']:9.1f} "
                                  f"{dma_gbps if with_dma else float('nan'):9.1f}", flush=True)
                finally:
                    if with_dma:
                        dma.finish()
        finally:
            for p in procs:
                p.kill()
                p.wait()
            if args.threads:
                cpu.set_num_threads(None)
    res = {**result_header("cpu_contention", argv),
           "shape": args.shape, "batch": batch, "length": length, "kv_bytes": kv_bytes,
           "threads": thread_counts[0], "thread_counts": thread_counts,
           "spinner_counts": spinner_counts, "layouts": layouts,
           "dma": "on" if True in dma_modes else ("skipped (no CUDA)" if args.dma else "off"),
           "dma_bytes": dma.src.numel() if dma else None,
           "q_dtype": str(q.dtype).replace("torch.", ""), "isa": cpu.get_isa(spec.dtype),
           "rows": rows}
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
