"""Two builds of the CPU attention kernel timed call by call, in alternating order.

``python -m writescope.bench.cpu_ab --against REV | --csrc DIR | --defines WS_NAME=VALUE,...
[--isa avx512bf16] [--threads N] [--shapes ...] [--sizes 1x256K,8x32K,64x4K] [--reps 7]
[--json FILE]``

The dev VM's and the H200 host's DRAM reads move by 30% and more from one minute to the next
(a read probe of 26-66 GB/s within one run on the 2-core dev VM), so two kernels timed in
separate runs cannot be told apart by less than that. This bench builds the kernel library of
another revision's ``writescope/attention/csrc`` (``git show REV:...``; or any folder holding the
same files, ``--csrc``; or the working tree's own sources built with some of the kernel's
compile-time knobs set, ``--defines``, e.g. ``WS_QK_PIPE=1``) beside the working tree's, and
times both on the same pools, each
repetition one call of each, the first of the two alternating. Per shape it prints both medians
(GB/s of KV read) and the median of the per-repetition ratios (working tree / other): the
comparison least moved by the machine's neighbours.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..attention import cpu
from ..units import parse_count
from .cpu_attention import SHAPES, SIZES, _machine, decode_case
from .cpu_phases import parse_variants
from .provenance import REPO, result_header, write_json

CSRC = "writescope/attention/csrc"


def revision_csrc(rev: str, dest: Path) -> Path:
    """The kernel sources of git revision ``rev`` written into ``dest``; SystemExit with git's
    reason when the revision or a file is missing."""
    for name in cpu._SOURCES + cpu._HEADERS:
        try:
            r = subprocess.run(["git", "show", f"{rev}:{CSRC}/{name}"], cwd=REPO,
                               capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            raise SystemExit(f"--against {rev}: git failed: {e}") from None
        if r.returncode:
            raise SystemExit(f"--against {rev}: {r.stderr.decode(errors='replace').strip()}")
        (dest / name).write_bytes(r.stdout)
    return dest


def compare(libs: dict[str, object], shape: str, batch: int, length: int, reps: int, bs: int,
            gen: torch.Generator) -> dict:
    """One shape: both libraries on one pool, ``reps`` rounds of one call each."""
    spec, pool, bb, q, scale, kv_bytes = decode_case(shape, batch, length, bs, gen)
    names = list(libs)
    gbps: dict[str, list[float]] = {n: [] for n in names}
    outs = {}
    for n in names:  # warm-up (first touch, the team's start) and each build's result
        with cpu.use_library(libs[n]):
            outs[n] = cpu.attend_cpu(q, pool, "cpu", spec, bb, scale)
    for r in range(reps):
        for n in (names if r % 2 == 0 else names[::-1]):
            with cpu.use_library(libs[n]):
                t0 = time.perf_counter()
                cpu.attend_cpu(q, pool, "cpu", spec, bb, scale)
                gbps[n].append(kv_bytes / (time.perf_counter() - t0) / 1e9)
    a, b = names
    o_a, l_a = outs[a]
    o_b, l_b = outs[b]
    return {"shape": shape, "batch": batch, "length": length, "kv_bytes": kv_bytes,
            "isa": cpu.get_isa(spec.dtype), "threads": cpu.get_num_threads(),
            "gbps": gbps, "median_gbps": {n: statistics.median(v) for n, v in gbps.items()},
            "ratio": statistics.median(x / y for x, y in zip(gbps[a], gbps[b])),
            # the two builds' outputs: a kernel change that is meant to compute the same thing
            "max_abs_out_diff": float((o_a - o_b).abs().max()),
            "max_abs_lse_diff": float((l_a - l_b).abs().max())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    other = ap.add_mutually_exclusive_group(required=True)
    other.add_argument("--against", metavar="REV", help="git revision whose kernel to time against")
    other.add_argument("--csrc", metavar="DIR", help="a folder holding another copy of the kernel's sources")
    other.add_argument("--defines", metavar="WS_NAME=VALUE,...",
                       help="this tree's sources built with these compile-time knobs set")
    ap.add_argument("--isa", default="auto", help="kernel variant for both builds (default: this CPU's)")
    ap.add_argument("--threads", type=int, default=None, help="kernel threads (default: the kernel's)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ", ".join(SHAPES))
    ap.add_argument("--sizes", default=",".join(f"{b}x{l}" for b, l in SIZES), help="BATCHxLENGTH list")
    ap.add_argument("--reps", type=int, default=7, help="rounds of one call of each build")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    sizes = []
    for bl in args.sizes.split(","):
        try:
            b, l = (parse_count(x) for x in bl.lower().split("x"))
        except ValueError as e:
            raise SystemExit(f"--sizes: {bl!r} is not BATCHxLENGTH ({e})") from None
        sizes.append((b, l))
    if args.reps < 1:
        raise SystemExit("--reps must be at least 1")
    if not cpu.available():
        raise SystemExit(f"the CPU kernel is not available: {cpu.load_error()}")
    if args.isa != "auto" and args.isa not in cpu.isas():
        raise SystemExit(f"--isa {args.isa}: this CPU runs {', '.join(cpu.isas())}")
    flags: tuple[str, ...] = ()
    if args.defines is not None:
        variants = parse_variants(args.defines)
        if len(variants) != 1 or not variants[0]:
            raise SystemExit("--defines: one build, a comma list of WS_NAME=VALUE")
        flags = tuple(f"-D{d}" for d in variants[0])
    label = args.against or (str(args.csrc) if args.csrc else " ".join(flags))
    with tempfile.TemporaryDirectory() as tmp:
        if flags:
            src = cpu._CSRC
        elif args.against:
            src = revision_csrc(args.against, Path(tmp))
        else:
            src = Path(args.csrc)
            missing = [n for n in cpu._SOURCES + cpu._HEADERS if not (src / n).is_file()]
            if missing:
                raise SystemExit(f"--csrc {src}: missing {', '.join(missing)}")
        print(f"building the kernel of {label} ...", flush=True)
        try:
            other_lib = cpu.build_test_variant(flags, csrc=src)
        except RuntimeError as e:
            raise SystemExit(f"the kernel of {label} does not build here: {e}") from None
    libs = {"this tree": cpu._load(), label: other_lib}
    prev_isa, prev_threads = cpu.current_isa_setting(), cpu.num_threads_setting()
    cpu.set_isa(args.isa)
    cpu.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'shape':14} {'BxL':>10} {'isa':>10} {'this tree':>10} {label[:12]:>12} {'ratio':>6}", flush=True)
    try:
        for s in shapes:
            for b, l in sizes:
                r = compare(libs, s, b, l, args.reps, args.block_size, gen)
                rows.append(r)
                m = r["median_gbps"]
                print(f"{s:14} {f'{b}x{l}':>10} {r['isa']:>10} {m['this tree']:10.1f} {m[label]:12.1f} "
                      f"{r['ratio']:6.3f}", flush=True)
    finally:
        cpu.set_isa(prev_isa)
        cpu.set_num_threads(prev_threads)
    out = {**result_header("cpu_ab", argv), "against": label, "machine": _machine(), "rows": rows}
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
