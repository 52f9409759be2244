"""``python -m writescope.bench.shared_prefix [--model M] [--prefix 32k] [--batch 8] [--json F]``:
decode steps of a batch whose prompts share a long prefix (one document, many questions).

Request 0 is prefilled alone; once its prompt's blocks are sealed (its first token is out), the
other ``--batch - 1`` requests arrive with the same ``--prefix`` tokens and a ``--suffix`` of
their own, and prefix caching starts them from request 0's blocks. The KV policy places the
spilled prefix once; every sequence then lists those blocks. Timed over ``--decode-steps`` decode
steps of the whole batch, in two modes on the same engine (the cache rebuilt between them):

* ``once``: the staging ring moves a T block that several sequences list once a piece
  (``attention/staging.py``, the default);
* ``each``: once per listing, and a policy's oldest T blocks for the CPU may be shared ones,
  as before (``WRITESCOPE_STAGE_SHARED=0``).

Prints and writes per mode the mean and median step, decode tokens/s, the KV the step attends
(every sequence's whole context), the bytes the link moved a step and its rate beside the pinned
H2D ceiling of ``--profile`` when given. On a machine without CUDA no block is staged (the T
pool is the device's memory) and both modes do the same work.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ..units import parse_count
from .engine_args import add_engine_args, build_engine
from .jit_log import gc_clock, jit_compiles
from .provenance import result_header, write_json

MODES = {"once": "1", "each": "0"}


def measure(engine, policy: str, mode: str, prefix: int, suffix: int, batch: int, steps: int,
            seed: int) -> dict:
    """One row: ``policy``'s cache built afresh, the batch admitted around one shared prefix,
    ``steps`` decode steps timed with shared blocks staged as ``mode`` says."""
    from ..core import SamplingParams
    os.environ["WRITESCOPE_STAGE_SHARED"] = MODES[mode]
    engine.set_kv_policy(policy)  # a fresh cache: nothing cached from the last row
    vocab = engine.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    doc = torch.randint(3, vocab, (prefix,), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=steps + 64, ignore_eos=True)
    ids = [f"{policy}-{mode}-{i}" for i in range(batch)]

    def prompt() -> list[int]:
        return doc + torch.randint(3, vocab, (suffix,), generator=gen).tolist()

    outs: dict[str, object] = {}

    def step() -> None:
        for o in engine.step():
            outs[o.request_id] = o
    engine.add_request(ids[0], prompt(), params)
    while not getattr(outs.get(ids[0]), "token_ids", None):
        step()  # request 0's prompt prefilled, its blocks sealed and named
    for rid in ids[1:]:
        engine.add_request(rid, prompt(), params)
    while any(not getattr(outs.get(r), "token_ids", None) for r in ids):
        step()
    cached = [outs[r].num_cached_tokens for r in ids[1:]]
    for _ in range(2):  # untimed: the batch's first decode steps at this shape
        step()
    cache = engine.cache
    times, link, attended, gc_s, compiles = [], [], [], [], []
    parts: dict[str, list[float]] = {}  # the cache's timing of each step, where numeric
    slowest: dict = {}
    for i in range(steps):
        with gc_clock() as spans, jit_compiles() as jit:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        gc_s.append(sum(spans))
        compiles += [{"step": i, "at_ms": round(1e3 * t, 3), "kernel": k} for t, k in jit]
        tm = cache.last_timing or {}
        if times[-1] == max(times):
            slowest = {k: v for k, v in tm.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
        link.append(float(tm.get("pcie_bytes") or 0.0))
        attended.append(float(tm.get("gpu_bytes", 0)) + float(tm.get("cpu_bytes", 0)))
        for k, v in tm.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                parts.setdefault(k, []).append(float(v))
    shared = cache.prefix.shared if cache.prefix is not None else 0
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    mean = statistics.fmean(times)
    return {"kv_policy": policy, "mode": mode, "batch": batch, "prefix": prefix,
            "suffix": suffix, "steps": steps,
            "cached_tokens_min": min(cached) if cached else 0, "shared_blocks": shared,
            "mean_step_ms": 1e3 * mean, "p50_step_ms": 1e3 * statistics.median(times),
            "decode_tok_s": batch / mean,
            "attended_gb_per_step": statistics.fmean(attended) / 1e9,
            "link_gb_per_step": statistics.fmean(link) / 1e9,
            "link_gbps": statistics.fmean(link) / mean / 1e9,
            # the mean of each timing field the cache reported (seconds, bytes, counts: the
            # CPU side's time, its waits, the link's busy time, the host's planning...)
            "timing_means": {k: statistics.fmean(v) for k, v in sorted(parts.items())},
            "step_ms": [round(1e3 * t, 3) for t in times],
            # each step's time in garbage collections, and the cache's timing of the slowest
            "gc_ms": [round(1e3 * t, 3) for t in gc_s],
            # Triton kernels compiled (or loaded from disk) during a timed step (jit_log.py)
            "jit_compiles": compiles,
            "host_attend_ms": [round(1e3 * t, 3) for t in parts.get("host_attend_s", [])],
            "slowest_step_timing": slowest,
            "stats": {k: v for k, v in cache.stats().items()
                      if k.startswith(("prefix.", "kv.blocks.", "planner."))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.shared_prefix",
                                 description=__doc__.split("\n\n")[1])
    add_engine_args(ap)
    ap.add_argument("--num-gpu-blocks", type=int, default=None,
                    help="cap the G region (so the shared prefix spills at small sizes)")
    ap.add_argument("--kv-policies", default="transfer",
                    help="comma-separated; each policy's rows in both modes, on one engine")
    ap.add_argument("--prefix", type=parse_count, default=8192, help="shared prompt tokens")
    ap.add_argument("--suffix", type=parse_count, default=64, help="each request's own tokens")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--modes", default="once,each")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every (policy, mode) row this many times, in turn (default 1)")
    ap.add_argument("--profile", default=None, help="a calibration, for the H2D ceiling")
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    from ..kvcache.placement import check_policy_name
    policies = [p.strip() for p in args.kv_policies.split(",") if p.strip()]
    try:
        if not policies:
            raise ValueError("no policy named")
        for p in policies:
            check_policy_name(p)
    except ValueError as e:
        ap.error(f"--kv-policies: {e}")
    if args.prefix < 1 or args.suffix < 1 or args.batch < 2 or args.decode_steps < 1 or \
            args.rounds < 1:
        ap.error("--prefix, --suffix, --decode-steps and --rounds must be positive, --batch at "
                 "least 2")
    ceiling = None
    if args.profile:
        from ..planner.profile import HardwareProfile
        bps = HardwareProfile.load(args.profile).h2d_pinned_Bps
        ceiling = bps / 1e9 if bps else None
    engine = build_engine(args, num_gpu_blocks=args.num_gpu_blocks, kv_policy=policies[0],
                          max_num_seqs=args.batch,
                          max_model_len=args.prefix + args.suffix + args.decode_steps + 80,
                          max_num_batched_tokens=args.max_num_batched_tokens)
    print(f"{engine.model_name} on {engine.device}, block size "
          f"{engine.cache.bs}: {args.batch} prompts of {args.prefix} shared + {args.suffix} own "
          f"tokens, {args.decode_steps} decode steps")
    print(f"{'policy':>10} {'mode':>5} {'cached':>8} {'mean ms':>9} {'p50 ms':>8} {'tok/s':>8} "
          f"{'KV GB':>7} {'link GB':>8} {'link GB/s':>10}" + ("" if ceiling is None else
                                                             f"  (H2D ceiling {ceiling:.1f})"))
    rows = []
    old = os.environ.get("WRITESCOPE_STAGE_SHARED")
    try:
        for rnd, policy, mode in ((k, p, m) for k in range(args.rounds) for p in policies
                                  for m in modes):
            r = measure(engine, policy, mode, args.prefix, args.suffix, args.batch,
                        args.decode_steps, args.seed)
            r["round"] = rnd
            rows.append(r)
            print(f"{policy:>10} {mode:>5} {r['cached_tokens_min']:>8} {r['mean_step_ms']:>9.2f} "
                  f"{r['p50_step_ms']:>8.2f} {r['decode_tok_s']:>8.1f} "
                  f"{r['attended_gb_per_step']:>7.3f} {r['link_gb_per_step']:>8.3f} "
                  f"{r['link_gbps']:>10.1f}", flush=True)
    finally:
        if old is None:
            os.environ.pop("WRITESCOPE_STAGE_SHARED", None)
        else:
            os.environ["WRITESCOPE_STAGE_SHARED"] = old
    def over_rounds(policy: str, mode: str, key: str) -> float | None:
        vals = [r[key] for r in rows if r["kv_policy"] == policy and r["mode"] == mode]
        return statistics.fmean(vals) if vals else None
    for policy in policies:
        once, each = (over_rounds(policy, m, "mean_step_ms") for m in ("once", "each"))
        if once and each:
            lo, le = (over_rounds(policy, m, "link_gb_per_step") for m in ("once", "each"))
            moved = f", {lo / le:.3f} of the link's bytes" if le else " (nothing staged)"
            print(f"{policy}: once / each {each / once:.2f}x the decode rate{moved}")
    if len(policies) > 1:  # each policy against the first, mode by mode (means over rounds)
        for mode in modes:
            base = policies[0]
            for policy in policies[1:]:
                ratios = [f"{k.split('_')[0]} {over_rounds(policy, mode, k) / v:.3f}"
                          for k in ("mean_step_ms", "p50_step_ms")
                          if (v := over_rounds(base, mode, k))]
                print(f"{mode}: {policy} / {base} step time, " + ", ".join(ratios))
    if args.json:
        write_json(args.json, {**result_header("shared_prefix", argv),
                               "device": str(engine.device), "model": engine.model_name,
                               "h2d_ceiling_gbps": ceiling,
                               "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
