"""Two or more builds of the CPU attention kernel timed call by call, in rotating order.

``python -m writescope.bench.cpu_ab --against REV | --csrc DIR | --defines "WS_A=1,WS_B=2;WS_C=1"
[--layouts C,T] [--isa avx512bf16] [--threads N] [--shapes ...] [--sizes 1x256K,8x32K,64x4K]
[--reps 7] [--json FILE]``

The dev VM's and the H200 host's DRAM reads move by 30% and more from one minute to the next
(a read probe of 26-66 GB/s within one run on the 2-core dev VM), so two kernels timed in
separate runs cannot be told apart by less than that. This bench builds the kernel library of
another revision's ``writescope/attention/csrc`` (``git show REV:...``; or any folder holding the
same files, ``--csrc``; or the working tree's own sources built with some of the kernel's
compile-time knobs set, ``--defines``, e.g. ``WS_QK_PF=0``, several builds at once when
``;``-separated) beside the working tree's, and times them on the same pools, each
repetition one call of each, the order rotated from one repetition to the next (two builds:
alternating). Per shape it prints every build's median (GB/s of KV read) and the median of the
per-repetition ratios (working tree / that build): the comparison least moved by the machine's
neighbours. ``--layouts C,T`` times every build on the C pool and on the same records in the
GPU layout (T blocks, read in place), each (build, layout) pair a column of its own; alone it
compares this tree's two layouts. ``--orders scattered,contiguous,lockstep`` times each on the
blocks laid out each way over the same pool (``cpu_attention.block_sets``), and
``--prefetch-blocks 1,2,3`` at each AMX software-prefetch distance: either alone compares this
tree's build that way.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..attention import cpu
from ..hostmem import pageable_empty
from ..kvcache.regions import from_cpu_layout, gpu_pool_shape
from ..units import parse_count
from .cpu_attention import (ORDERS, SHAPES, SIZES, _machine, block_sets, decode_case, decode_lens,
                            probe_bytes, shape_case)
from .cpu_phases import parse_variants
from .provenance import REPO, result_header, write_json

CSRC = "writescope/attention/csrc"


def revision_csrc(rev: str, dest: Path) -> Path:
    """The kernel sources of git revision ``rev`` written into ``dest``; SystemExit with git's
    reason when the revision or a source is missing (an optional source or a header the revision
    predates is left out: its own sources do not include it)."""
    for name in cpu._SOURCES + cpu._HEADERS:
        try:
            r = subprocess.run(["git", "show", f"{rev}:{CSRC}/{name}"], cwd=REPO,
                               capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            raise SystemExit(f"--against {rev}: git failed: {e}") from None
        if r.returncode:
            if name in cpu._OPTIONAL_SOURCES or name in cpu._HEADERS:  # a revision before that file
                continue
            raise SystemExit(f"--against {rev}: {r.stderr.decode(errors='replace').strip()}")
        (dest / name).write_bytes(r.stdout)
    return dest


#: --layouts letters -> attend_cpu's layout names (C: the CPU layout; T: the GPU layout, read in place)
LAYOUTS = {"C": "cpu", "T": "gpu"}


def variant_names(libs, layouts=("C",), orders=("scattered",), prefetch=()) -> dict:
    """name -> (library name, layout, block order, prefetch distance or None) for every
    combination; a name shows only the axes that have more than one value."""
    out = {}
    for n, lay, o, pf in itertools.product(libs, layouts, orders, prefetch or (None,)):
        name = n + (f" [{lay}]" if len(layouts) > 1 else "") + (f" [{o}]" if len(orders) > 1 else "")
        out[name + ("" if pf is None else f" [pf {pf}]")] = (n, lay, o, pf)
    return out


def compare(libs: dict[str, object], shape: str, batch: int, length: int, reps: int, bs: int,
            gen: torch.Generator, layouts: tuple[str, ...] = ("C",), cold_bytes: int = 0,
            orders: tuple[str, ...] = ("scattered",), prefetch: tuple[int, ...] = ()) -> dict:
    """One shape: every library on every layout's pool (the same KV), with its blocks laid out
    in every order and at every prefetch distance, ``reps`` rounds of one call each, the order
    rotated from round to round (two variants: alternating). The first combination is the
    reference of the ratios (the working tree's). Timed calls rotate through the KV sets of
    ``cold_bytes`` (``cpu_attention.decode_case``), every order's set k over the same blocks: a
    call never reads what the call before it (another variant's) left in the last-level
    cache."""
    spec, pool, bbs, q, scale, kv_bytes = decode_case(shape, batch, length, bs, gen, cold_bytes,
                                                      orders[0])
    nb_seq = -(-length // bs)
    by_order = {orders[0]: bbs}
    for o in orders[1:]:
        by_order[o] = block_sets(o, len(bbs), batch, nb_seq, decode_lens(batch, length, bs), gen)
    turn = itertools.count()  # the set of every timed call, whatever its variant
    pools = {"C": pool}
    if "T" in layouts:  # the same records, token-major (as T blocks lie in pinned memory)
        pools["T"] = pageable_empty(gpu_pool_shape(spec, pool.shape[0], bs)[1:], spec.dtype)
        pools["T"].copy_(from_cpu_layout(pool))
    runs = variant_names(libs, layouts, orders, prefetch)
    names = list(runs)
    gbps: dict[str, list[float]] = {n: [] for n in names}
    outs = {}
    prev_pf, pf_user = cpu.get_prefetch_blocks(), cpu.prefetch_chosen_by_user()

    def call(n, first=False):
        lib, lay, order, pf = runs[n]
        sets = by_order[order]
        if pf is not None:
            cpu.set_prefetch_blocks(pf)
        with cpu.use_library(libs[lib]):
            return cpu.attend_cpu(q, pools[lay], LAYOUTS[lay], spec,
                                  sets[0] if first else sets[next(turn) % len(sets)], scale)

    try:
        for n in names:  # warm-up (first touch, the team's start) and each variant's result
            outs[n] = call(n, first=True)
        for r in range(reps):
            k = r % len(names)
            for n in names[k:] + names[:k]:
                t0 = time.perf_counter()
                call(n)
                gbps[n].append(kv_bytes / (time.perf_counter() - t0) / 1e9)
    finally:
        cpu.set_prefetch_blocks(prev_pf, from_profile=not pf_user)
    ref, others = names[0], names[1:]
    ratios = {n: statistics.median(x / y for x, y in zip(gbps[ref], gbps[n])) for n in others}
    # each variant's output against the first variant's on the same blocks (its order's first):
    # a change meant to compute the same thing
    same = {n: next(m for m in names if runs[m][2] == runs[n][2]) for n in others}
    out_diff = {n: float((outs[same[n]][0] - outs[n][0]).abs().max()) for n in others}
    lse_diff = {n: float((outs[same[n]][1] - outs[n][1]).abs().max()) for n in others}
    return {"shape": shape, "batch": batch, "length": length, "kv_bytes": kv_bytes,
            "kv_sets": len(bbs), "isa": cpu.get_isa(spec.dtype), "threads": cpu.get_num_threads(),
            "variants": {n: {"build": b, "layout": lay, "order": o, "prefetch_blocks": pf}
                         for n, (b, lay, o, pf) in runs.items()},
            "gbps": gbps, "median_gbps": {n: statistics.median(v) for n, v in gbps.items()},
            "ratios": ratios, "ratio": ratios[others[0]],
            "max_abs_out_diff": max(out_diff.values()), "max_abs_lse_diff": max(lse_diff.values()),
            "out_diffs": out_diff}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    other = ap.add_mutually_exclusive_group()
    other.add_argument("--against", metavar="REV", help="git revision whose kernel to time against")
    other.add_argument("--csrc", metavar="DIR", help="a folder holding another copy of the kernel's sources")
    other.add_argument("--defines", metavar="WS_NAME=VALUE,...[;...]",
                       help="this tree's sources built with these compile-time knobs set; "
                            "';' separates builds, each timed against this tree's")
    ap.add_argument("--isa", default="auto", help="kernel variant for every build (default: this CPU's)")
    ap.add_argument("--threads", type=int, default=None, help="kernel threads (default: the kernel's)")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help="comma list of " + ", ".join(SHAPES) + " or gqa-HQ/H/D")
    ap.add_argument("--sizes", default=",".join(f"{b}x{l}" for b, l in SIZES), help="BATCHxLENGTH list")
    ap.add_argument("--reps", type=int, default=7, help="rounds of one call of each build")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--layouts", default="C",
                    help="comma list of C (the CPU layout, the default) and T (the GPU layout, "
                         "read in place): every build is timed on each; C,T alone compares "
                         "this tree's two")
    ap.add_argument("--cold-bytes", type=int, default=None,
                    help="calls rotate through copies of a shape's KV spanning this many bytes, "
                         "so that none reads what the last left in the last-level cache "
                         "(default: max(1 GiB, 6 x that cache), the read probe's array; 0: every "
                         "call on the same KV, the only way until 2026-12-04e)")
    ap.add_argument("--orders", default="scattered",
                    help="comma list of block orders (" + ", ".join(ORDERS) + "): every build is "
                         "timed on each; the first is the reference")
    ap.add_argument("--prefetch-blocks", default="",
                    help="comma list of AMX software-prefetch distances (blocks ahead; 0: none): "
                         "every build is timed at each (default: the kernel's current distance)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        try:
            shape_case(s)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    sizes = []
    for bl in args.sizes.split(","):
        try:
            b, l = (parse_count(x) for x in bl.lower().split("x"))
        except ValueError as e:
            raise SystemExit(f"--sizes: {bl!r} is not BATCHxLENGTH ({e})") from None
        sizes.append((b, l))
    if args.reps < 1:
        raise SystemExit("--reps must be at least 1")
    layouts = tuple(x.strip().upper() for x in args.layouts.split(",") if x.strip())
    if not layouts or any(x not in LAYOUTS for x in layouts) or len(set(layouts)) < len(layouts):
        raise SystemExit(f"--layouts {args.layouts!r}: a comma list of C and T")
    orders = tuple(x.strip() for x in args.orders.split(",") if x.strip())
    if not orders or any(x not in ORDERS for x in orders) or len(set(orders)) < len(orders):
        raise SystemExit(f"--orders {args.orders!r}: a comma list of {', '.join(ORDERS)}")
    try:
        prefetch = tuple(int(x) for x in args.prefetch_blocks.split(",") if x.strip())
    except ValueError:
        prefetch = (-1,)
    if any(n < 0 for n in prefetch) or len(set(prefetch)) < len(prefetch):
        raise SystemExit(f"--prefetch-blocks {args.prefetch_blocks!r}: a comma list of distinct "
                         "distances of 0 blocks (no software prefetch) or more")
    if (args.against is None and args.csrc is None and args.defines is None and len(layouts) < 2
            and len(orders) < 2 and len(prefetch) < 2):
        raise SystemExit("give --against, --csrc or --defines (or --layouts C,T, --orders or "
                         "--prefetch-blocks with two or more values)")
    if not cpu.available():
        raise SystemExit(f"the CPU kernel is not available: {cpu.load_error()}")
    if args.isa != "auto" and args.isa not in cpu.isas():
        raise SystemExit(f"--isa {args.isa}: this CPU runs {', '.join(cpu.isas())}")
    builds: list[tuple[str, ...]] = []  # --defines: the -D flags of each other build
    if args.defines is not None:
        variants = parse_variants(args.defines)
        if not variants or not all(variants):
            raise SystemExit("--defines: one or more builds, ';'-separated, each a comma list of WS_NAME=VALUE")
        builds = [tuple(f"-D{d}" for d in v) for v in variants]
    label = ("; ".join(" ".join(f) for f in builds) if builds else args.against or args.csrc
             or "this tree's T layout")
    other_libs: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if builds:  # name -> (flags, sources)
            sources = {" ".join(f): (f, cpu._CSRC) for f in builds}
        elif args.against:
            sources = {label: ((), revision_csrc(args.against, Path(tmp)))}
        elif args.csrc is None:  # --layouts alone: this tree on each layout
            sources = {}
        else:
            src = Path(args.csrc)
            missing = [n for n in cpu._SOURCES + cpu._HEADERS
                       if n not in cpu._OPTIONAL_SOURCES and not (src / n).is_file()]
            if missing:
                raise SystemExit(f"--csrc {src}: missing {', '.join(missing)}")
            sources = {label: ((), src)}
        for name, (flags, src) in sources.items():
            print(f"building the kernel of {name} ...", flush=True)
            try:
                other_libs[name] = cpu.build_test_variant(flags, csrc=src)
            except RuntimeError as e:
                raise SystemExit(f"the kernel of {name} does not build here: {e}") from None
    libs = {"this tree": cpu._load(), **other_libs}
    prev_isa, prev_threads = cpu.current_isa_setting(), cpu.num_threads_setting()
    cpu.set_isa(args.isa)
    cpu.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    variants = list(variant_names(libs, layouts, orders, prefetch))
    ref, others = variants[0], variants[1:]
    if len(others) > 1:  # the other variants' columns, numbered
        print(f"reference: {ref}")
        for i, n in enumerate(others, 1):
            print(f"build {i}: {n}")
    heads = [n[:12] for n in others] if len(others) == 1 else [f"build {i}" for i in range(1, len(others) + 1)]
    print(f"{'shape':14} {'BxL':>10} {'isa':>10} {ref[:13]:>13} " +
          " ".join(f"{h:>12} {'ratio':>6}" for h in heads), flush=True)
    try:
        for s in shapes:
            for b, l in sizes:
                r = compare(libs, s, b, l, args.reps, args.block_size, gen, layouts,
                            probe_bytes() if args.cold_bytes is None else args.cold_bytes,
                            orders, prefetch)
                rows.append(r)
                m = r["median_gbps"]
                print(f"{s:14} {f'{b}x{l}':>10} {r['isa']:>10} {m[ref]:13.1f} " +
                      " ".join(f"{m[n]:12.1f} {r['ratios'][n]:6.3f}" for n in others), flush=True)
    finally:
        cpu.set_isa(prev_isa)
        cpu.set_num_threads(prev_threads)
    out = {**result_header("cpu_ab", argv), "against": label, "machine": _machine(), "rows": rows}
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
