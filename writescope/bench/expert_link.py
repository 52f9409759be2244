"""Benchmark: a decode layer's CPU experts read by the CPU alone, by the link alone, and by both.

    python -m writescope.bench.expert_link [--models ...] [--tokens 1 4] [--shares 0 profile 1]
                                           [--profile FILE] [--json FILE]

For each reference model's expert shape it builds full-size random layers in host memory (enough
that they are several times the last-level cache; visited round-robin, as a decode step visits
its layers), page-locks them as the engine does, and times layer calls through the MoE layer's
path (``layers/expert_link.submit`` / ``finish``: the CPU's part on the native queue, the link's
experts copied into a device buffer (``--reads copy``, the engine's default) or read by the
kernels where they lie (``mapped``), the device waiting for the CPU) with the link
taking each share: ``0`` (the CPU alone: today's engine without the link), ``profile`` (the
engine's default, from the profile's concurrent rates), fixed shares, ``1`` (the link alone).
Each row prints the routed experts' bytes per second next to the ceilings they aim at: the
profile's CPU read, its pinned H2D rate and their concurrent sum. Every share's output is
checked first against the CPU-alone call's.

Calls run back to back with no host synchronisation between them (the device waits for the
CPU's results on page-locked flags), so a row's time per call is a layer's experts as a decode
step sees them, round trip included.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from ..layers import cpu_experts as ce
from ..layers import expert_link as el
from ..models.config import ModelConfig
from .cpu_experts import machine, round_robin
from .provenance import git_commit, source_digest

MODELS = ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b")


def _shares(raw: list[str], profile) -> list[tuple[str, float]]:
    out = []
    for s in raw:
        if s == "profile":
            out.append((f"profile ({el.profile_share(profile):.3f})", el.profile_share(profile)))
        else:
            v = float(s)
            if not 0.0 <= v <= 1.0:
                raise SystemExit(f"--shares: {s} is not in [0, 1]")
            out.append((s, v))
    return out


def bench_model(name: str, args, shares, profile, log) -> list[dict]:
    from ..hostmem import pin_tensor
    cfg = ModelConfig.from_hf(name)
    E, H, I, k = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    dev = torch.device("cuda")
    expert_bytes = 3 * H * I * 2
    n_layers = max(2, math.ceil(args.footprint_gb * 1e9 / (E * expert_bytes)))
    t0 = time.perf_counter()
    layers = [ce.CpuExperts.random(E, H, I, torch.bfloat16, seed=i, unique_experts=2)
              for i in range(n_layers)]
    pinned = all(pin_tensor(t) for ly in layers for t in (ly.gate_up, ly.down))
    from ..layers.expert_upload import ExpertUploader
    buffer = ExpertUploader(dev, min_tokens=1, pin=False)  # the device buffer of the copy reads
    for ly in layers:
        buffer.register(ly)
    log(f"[{name}] {n_layers} layers x {E * expert_bytes / 1e9:.2f} GB built and "
        f"{'page-locked' if pinned else 'NOT page-locked'} in {time.perf_counter() - t0:.1f} s")
    gen = torch.Generator().manual_seed(1)
    rows = []
    for n in args.tokens:
        x = (torch.randn(n, H, generator=gen) * 0.5).to(dev, torch.bfloat16)
        routes = []
        for _ in range(args.routings):
            ids = torch.rand(n, E, generator=gen).topk(k, dim=-1).indices
            routes.append((ids.to(dev), torch.rand(n, k, generator=gen).softmax(-1).to(dev)))
        active = [len(ids.unique()) for ids, _ in routes]
        ref = el.finish(layers[0], el.submit(layers[0], x, *routes[0], 0.0), x.dtype).float()
        for (label, share), read in ((sh, rd) for sh in shares for rd in
                                     (args.reads if sh[1] > 0 else args.reads[:1])):
            os.environ["WRITESCOPE_EXPERT_LINK_READ"] = read
            label = f"{label} {read}" if share > 0 else label

            def call(layer, ids, w):
                return el.finish(layer, el.submit(layer, x, ids, w, share, buffer), x.dtype)
            got = call(layers[0], *routes[0]).float()
            err = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
            ok = err < 1e-2
            for li, layer in enumerate(layers):  # warm-up (kernels compiled, pages touched)
                call(layer, *routes[li % len(routes)])
            torch.cuda.synchronize()
            ce.raise_pending_errors()
            ce.take_routed_bytes()
            calls, nbytes, dt = round_robin(layers, routes, active, expert_bytes, call,
                                            args.min_seconds, torch.cuda.synchronize)
            cpu_s = ce.raise_pending_errors() or 0.0
            ce.take_routed_bytes()
            gbps = nbytes / dt / 1e9
            row = {"model": name, "experts": E, "hidden": H, "inter": I, "topk": k, "tokens": n,
                   "share": share, "share_label": label, "read": read if share > 0 else None,
                   "layers": n_layers, "calls": calls,
                   "mean_active_experts": round(sum(active) / len(active), 2),
                   "us_per_call": round(dt / calls * 1e6, 1), "GBps": round(gbps, 1),
                   "cpu_kernel_us_per_call": round(cpu_s / calls * 1e6, 1),
                   "rel_err_vs_cpu_alone": float(f"{err:.3g}"), "correct": ok}
            rows.append(row)
            log(f"  {name:17s} N={n:3d} share {label:24s} {row['us_per_call']:8.1f} us/call "
                f"{gbps:6.1f} GB/s (CPU kernel {row['cpu_kernel_us_per_call']:7.1f} us/call) "
                f"err {err:.1e}{'' if ok else ' WRONG'}")
    del layers
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.expert_link", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--models", nargs="+", default=list(MODELS[:2]))
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--shares", nargs="+", default=["0", "profile", "0.25", "0.5", "1"],
                    help="the link's shares to time: numbers in [0, 1] or 'profile'")
    ap.add_argument("--reads", nargs="+", default=["copy", "mapped"], choices=["copy", "mapped"],
                    help="how the GPU reads the link's experts (WRITESCOPE_EXPERT_LINK_READ)")
    ap.add_argument("--profile", help="hardware profile (default: the engine's)")
    ap.add_argument("--footprint-gb", type=float, default=6.0,
                    help="expert weights allocated per model (>> last-level cache)")
    ap.add_argument("--routings", type=int, default=8, help="distinct routings per token count")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per row")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("expert_link: needs CUDA (the link is the host-to-GPU bus)", file=sys.stderr)
        return 2
    if any(not 0 < n <= el.MAX_TOKENS for n in args.tokens):
        print(f"expert_link: --tokens must be in 1..{el.MAX_TOKENS}", file=sys.stderr)
        return 2
    from ..planner.profile import load_or_default
    profile = load_or_default(args.profile)

    def log(s):
        print(s, flush=True)

    info = machine()
    log(f"machine: {info}")
    ceil = {"cpu_read_GBps": profile.cpu_read_Bps / 1e9, "h2d_pinned_GBps": profile.h2d_pinned_Bps / 1e9,
            "concurrent_GBps": ((profile.concurrent_cpu_read_Bps or 0) +
                                (profile.concurrent_h2d_Bps or 0)) / 1e9}
    log("ceilings (profile): " + ", ".join(f"{k} {v:.1f}" for k, v in ceil.items()))
    shares = _shares(args.shares, profile)
    rows = []
    for name in args.models:
        rows += bench_model(name, args, shares, profile, log)
    result = {"bench": "expert_link", "commit": git_commit(), "source_digest": source_digest(),
              "machine": info, "ceilings": ceil, "threads": ce.get_num_threads(),
              "command": "python -m writescope.bench.expert_link " + " ".join(argv or sys.argv[1:]),
              "rows": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        log(f"wrote {args.json}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
