"""How fast newly mapped memory reads, pass by pass, against memory that was read before.

``python -m writescope.bench.fresh_pages [--gib 2] [--passes 12] [--sleep 5] [--json FILE]``

Issue 8's table (``bench.cpu_attention``) times each shape's first calls on a KV pool it has
just allocated and written. On the lent GPU hosts (virtual machines) those calls have read at
24-45 GB/s where the same pool's later calls, in the same run, read 66-98 (2026-12-07c/d).
This bench separates what could make a new buffer slow:

* ``back-to-back``: a new buffer (``hostmem.pageable_empty``: huge pages advised before the
  first touch, as the engine's C pool), written once, then ``--passes`` read passes in a row
  (the vector probe, one pass each): each pass's GB/s and its seconds since the write. Slow
  first passes that speed up pass by pass: reading it is what settles it.
* ``after-sleep``: a new buffer, written, left idle ``--sleep`` seconds, then the passes. A fast
  first pass: time settles it (e.g. the hypervisor backing the guest's pages with huge pages
  some time after their first touch), not reads.
* ``kernel``: the CPU attention kernel on a new GQA 32/4/128 1 x 256K pool rotating through its
  KV sets as issue 8's table does (``cpu_attention.decode_case``): each call's GB/s, its set and
  whether it is that set's first read.
* ``reference``: the passes over the probe buffer, read many times before.

Each trial also gives the share of its buffer in transparent huge pages as it starts; the JSON
keeps the guest's THP settings.
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch

from ..attention import cpu
from ..hostmem import huge_page_fraction, pageable_empty
from .provenance import result_header, write_json


def _passes(buf: torch.Tensor, passes: int, t0: float) -> list[dict]:
    out = []
    for _ in range(passes):
        gbps = cpu.read_bandwidth(buf.numel() * 4, reps=1, buffer=buf)
        out.append({"t_s": time.perf_counter() - t0, "gbps": gbps})
    return out


def _new_buffer(nbytes: int) -> tuple[torch.Tensor, float]:
    buf = pageable_empty(nbytes // 4, torch.float32)
    buf.fill_(1.0)  # the first touch: every page written
    return buf, time.perf_counter()


def _thp_settings() -> dict:
    out = {}
    for p in ("enabled", "defrag", "khugepaged/defrag", "khugepaged/pages_to_scan",
              "khugepaged/scan_sleep_millisecs", "khugepaged/full_scans", "khugepaged/pages_collapsed"):
        try:
            out[p] = Path("/sys/kernel/mm/transparent_hugepage", p).read_text().strip()
        except OSError:
            pass
    return out


def kernel_trial(calls: int, length: int = 262144, cold_bytes: int = 0, bs: int = 64) -> list[dict]:
    """A new 1 x ``length`` GQA 32/4/128 pool, as issue 8's table builds it (sets spanning
    ``cold_bytes``, default the table's probe size), and ``calls`` kernel calls rotating through
    its sets."""
    from . import cpu_attention as ca
    gen = torch.Generator().manual_seed(0)
    spec, pool, bbs, q, scale, kv_bytes = ca.decode_case("gqa-32/4/128", 1, length, bs, gen,
                                                         cold_bytes=cold_bytes or ca.probe_bytes())
    t0 = time.perf_counter()
    seen, out = set(), []
    for i, (k, bb) in zip(range(calls), itertools.cycle(enumerate(bbs))):
        t = time.perf_counter()
        cpu.attend_cpu(q, pool, "cpu", spec, bb, scale)
        dt = time.perf_counter() - t
        out.append({"t_s": t - t0, "set": k, "first_read": k not in seen, "gbps": kv_bytes / dt / 1e9})
        seen.add(k)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.fresh_pages", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0, help="each new buffer's size")
    ap.add_argument("--passes", type=int, default=12)
    ap.add_argument("--sleep", type=float, default=5.0, help="the after-sleep trial's idle seconds")
    ap.add_argument("--kernel-calls", type=int, default=16, help="0 skips the kernel trial")
    ap.add_argument("--kernel-length", type=int, default=262144, help="the kernel trial's tokens")
    ap.add_argument("--kernel-bytes", type=int, default=0,
                    help="the kernel trial's KV sets span this many bytes (default: issue 8's "
                         "table's, max(1 GiB, 6 x the last-level cache))")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if not cpu.available():
        raise SystemExit(f"CPU attention kernel unavailable: {cpu.load_error()}")
    if args.gib <= 0 or args.passes < 1 or args.sleep < 0 or args.kernel_calls < 0 \
            or args.kernel_length < 1 or args.kernel_bytes < 0:
        raise SystemExit("--gib must be > 0, --passes and --kernel-length >= 1, --sleep, "
                         "--kernel-calls and --kernel-bytes >= 0")
    nbytes = int(args.gib * 2**30) // 64 * 64
    res = {**result_header("fresh_pages", argv), "threads": cpu.get_num_threads(),
           "buffer_bytes": nbytes, "thp": _thp_settings(), "trials": {}}

    def show(name: str, rows: list[dict], hp) -> None:
        res["trials"][name] = {"huge_page_frac_at_start": hp, "passes": rows}
        print(f"{name:13} huge pages {'-' if hp is None else f'{100 * hp:.0f}%'}: " + " ".join(
            f"{r['gbps']:.0f}{'*' if r.get('first_read') else ''}@{r['t_s']:.1f}s" for r in rows),
            flush=True)

    ref = cpu.probe_buffer(nbytes)
    for _ in range(3):  # read before: the reference's state
        cpu.read_bandwidth(nbytes, reps=1, buffer=ref)
    show("reference", _passes(ref, args.passes, time.perf_counter()), huge_page_fraction(ref))
    buf, t0 = _new_buffer(nbytes)
    hp = huge_page_fraction(buf)
    show("back-to-back", _passes(buf, args.passes, t0), hp)
    del buf
    buf, t0 = _new_buffer(nbytes)
    hp = huge_page_fraction(buf)
    time.sleep(args.sleep)
    show("after-sleep", _passes(buf, args.passes, t0), hp)
    del buf
    if args.kernel_calls:
        rows = kernel_trial(args.kernel_calls, args.kernel_length, args.kernel_bytes)
        show("kernel", rows, None)
        print("  (* a KV set's first read)", flush=True)
    show("reference-end", _passes(ref, args.passes, time.perf_counter()), huge_page_fraction(ref))
    res["thp_after"] = _thp_settings()
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
