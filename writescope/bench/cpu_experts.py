"""Benchmark: CPU routed-expert throughput vs the machine's DRAM read bandwidth.

    python -m writescope.bench.cpu_experts [--json FILE] [--models ...] [--tokens 1 8 32 128]
    python -m writescope.bench.cpu_experts --render a.json [b.json ...]   # markdown table

For each reference model's expert shape (DeepSeek-V2-Lite, Qwen3-30B-A3B, Mixtral-8x7B) it builds
full-size random layers (enough of them that the weights are many times the last-level cache;
layers are visited round-robin, as in a decode step), routes N tokens per layer with uniformly
random top-k, and reports GB/s of expert weights read (activated experts x 3·H·I·2 bytes per call)
next to the DRAM read bandwidth measured in the same process (multi-threaded read of a buffer far
larger than the cache). Variants: the C++ kernel at each instruction-set level the machine has,
and the pure-torch path (``F.linear`` per expert, oneDNN) as the baseline. Every variant's output
on the real shapes is checked against a float32 torch computation before it is timed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..layers import cpu_experts as ce
from ..layers import cpu_experts_lib as ce_lib
from ..models.config import ModelConfig
from ..models.quantization import Fp8Blocks
from .provenance import git_commit, source_digest

MODELS = ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b")


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count()}
    try:
        txt = Path("/proc/cpuinfo").read_text()
        for line in txt.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = next((ln.split(":", 1)[1].split() for ln in txt.splitlines()
                      if ln.startswith("flags")), [])
        info["flags"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                         if f in flags]
        mem = Path("/proc/meminfo").read_text().split("\n")[0]
        info["mem_total_GiB"] = round(int(mem.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        info["gpu"] = None
    return info


def dram_read_bw(gib: float, threads: int, reps: int = 5) -> dict:
    """GB/s reading a ``gib`` GiB buffer with ``threads`` threads (C++ probe), and torch.sum's."""
    buf = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    nbytes = buf.numel() * 4
    ce_lib.read_bandwidth_probe(buf, threads)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        ce_lib.read_bandwidth_probe(buf, threads)
        rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    buf.sum()
    t = time.perf_counter()
    for _ in range(3):
        buf.sum()
    torch_rate = 3 * nbytes / (time.perf_counter() - t) / 1e9
    torch.set_num_threads(prev)
    del buf
    rates.sort()
    return {"buffer_GiB": gib, "threads": threads, "best_GBps": round(rates[-1], 1),
            "median_GBps": round(rates[len(rates) // 2], 1), "torch_sum_GBps": round(torch_rate, 1),
            "ref_GBps": round(max(rates[-1], torch_rate), 1)}


def _dram_ref(dram: dict) -> float:
    """The DRAM read rate the kernel is compared with: the best of the C++ probe and torch.sum
    (the first H200 run's C++ probe under-read: 67 vs 112 GB/s for torch.sum)."""
    return dram.get("ref_GBps") or max(dram["best_GBps"], dram["torch_sum_GBps"])


def _reference(layer: ce.CpuExperts, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor):
    """float32 torch computation from the layer's own (unpacked) weights (FP8: q * scale in
    float32, the values both FP8 product forms approximate)."""
    out = torch.zeros(x.shape[0], layer.hidden, dtype=torch.float32)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        g, u, d = (t.float() for t in layer.expert_weights(e, fp8_dtype=torch.float32))
        xe = x[tok].float()
        h = (F.silu(xe @ g.T) * (xe @ u.T)).to(layer.dtype).float()
        out.index_add_(0, tok, (h @ d.T) * w[tok, slot, None])
    return out


def _variants(args) -> list[dict]:
    out = []
    isas = ce.available_isas()
    want = args.isas or list(reversed(isas))
    for isa in want:
        if isa not in isas:
            continue
        if isa == "amx":
            for m in args.amx_min:
                out.append({"name": f"cpp-amx(min{m})", "backend": "cpp", "isa": isa, "amx_min": m})
        else:
            out.append({"name": f"cpp-{isa}", "backend": "cpp", "isa": isa, "amx_min": 1})
    if "torch" in args.backends:
        out.append({"name": "torch", "backend": "torch", "isa": None, "amx_min": 1})
    if "cpp" not in args.backends:
        out = [v for v in out if v["backend"] != "cpp"]
    full = []
    for v in out:
        for mode in args.modes:
            for th in args.threads or [None]:
                name = v["name"] + ("" if mode == "async" else "-inline") + ("" if th is None else f"-t{th}")
                full.append(dict(v, name=name, mode=mode, threads=th))
    return full


def _apply(v: dict, default_threads: int) -> None:
    ce.set_num_threads(v["threads"] or default_threads)
    torch.set_num_threads(v["threads"] or default_threads)
    if v["isa"]:
        os.environ["WRITESCOPE_CPU_EXPERT_ISA"] = v["isa"]
    else:
        os.environ.pop("WRITESCOPE_CPU_EXPERT_ISA", None)
    os.environ["WRITESCOPE_CPU_EXPERT_AMX_MIN"] = str(v["amx_min"])


def round_robin(layers, routes, active, expert_bytes: int, call, min_seconds: float,
                sync=None) -> tuple[int, int, float]:
    """Layer calls round-robin over ``layers`` (call ``c`` on layer ``l`` takes routing
    ``(c + l) mod len(routes)``, ``active[r]`` of its experts distinct) until ``min_seconds``
    and at least two passes; ``sync`` (if any) ends each pass. Returns (calls, routed expert
    bytes, seconds)."""
    calls, nbytes = 0, 0
    t = time.perf_counter()
    while True:
        for li, layer in enumerate(layers):
            r = (calls + li) % len(routes)
            call(layer, *routes[r])
            nbytes += active[r] * expert_bytes
            calls += 1
        if sync is not None:
            sync()
        dt = time.perf_counter() - t
        if dt >= min_seconds and calls >= 2 * len(layers):
            return calls, nbytes, dt


def bench_model(name: str, args, variants: list[dict], log) -> list[dict]:
    cfg = ModelConfig.from_hf(name)
    E, H, I, k = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    dtype = torch.bfloat16
    rows = []
    refs: dict[tuple[str, int], torch.Tensor] = {}
    backends = sorted({v["backend"] for v in variants})
    # (backend, weight format): FP8 experts (block-wise, as the -FP8 checkpoints') in the
    # compiled kernel only
    runs = [(b, wf) for wf in args.weights for b in backends if wf == "bf16" or b == "cpp"]
    for backend, wf in runs:
        fp8 = Fp8Blocks() if wf.startswith("fp8") else None
        expert_bytes = 3 * H * I * 2 if fp8 is None else None
        t0 = time.perf_counter()
        layers = []
        n_layers = args.min_layers
        while len(layers) < n_layers:
            layers.append(ce.CpuExperts.random(E, H, I, dtype, seed=len(layers), unique_experts=2,
                                               backend=backend, fp8=fp8))
            layers[-1].fp8_exact = wf == "fp8"  # (fp8-rounded: bf16(q * scale) products)
            expert_bytes = layers[0].expert_bytes  # (FP8: one byte a weight, and the scales)
            n_layers = max(args.min_layers,
                           math.ceil(args.footprint_gb * 1e9 / (E * expert_bytes)))
        layer_bytes = E * expert_bytes
        log(f"[{name}] {backend} {wf}: {n_layers} layers x {layer_bytes / 1e9:.2f} GB built in "
            f"{time.perf_counter() - t0:.1f} s")
        gen = torch.Generator().manual_seed(1)
        for n in args.tokens:
            ref = None
            routes = []
            for _ in range(args.routings):
                ids = torch.rand(n, E, generator=gen).topk(k, dim=-1).indices
                w = torch.rand(n, k, generator=gen).softmax(-1)
                routes.append((ids, w))
            x = (torch.randn(n, H, generator=gen) * 0.5).to(dtype)
            active = [len(ids.unique()) for ids, _ in routes]
            for v in variants:
                if v["backend"] != backend:
                    continue
                v = dict(v, name=v["name"] + {"fp8": "-fp8", "fp8-rounded": "-fp8r"}.get(wf, ""))
                _apply(v, args.default_threads)
                if v["mode"] == "inline":  # forward() on host tensors: the calling thread
                    def call(layer, ids, w):
                        return layer.forward(x, ids, w)
                else:  # through the worker thread, as the model's submit/wait
                    def call(layer, ids, w):
                        return layer.wait(layer.submit(x, ids, w))
                ids0, w0 = routes[0]
                y = call(layers[0], ids0, w0).float()
                if ref is None:  # same weights in every backend (same seed), so computed once
                    ref = refs.get((wf, n))
                    if ref is None:
                        ref = refs[(wf, n)] = _reference(layers[0], x, ids0, w0)
                err = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                ok = err < 2e-2
                # warm-up pass over every layer, then round-robin until min_seconds
                for li, layer in enumerate(layers):
                    call(layer, *routes[li % len(routes)])
                calls, nbytes, dt = round_robin(layers, routes, active, expert_bytes, call,
                                                args.min_seconds)
                gbps = nbytes / dt / 1e9
                row = {"model": name, "experts": E, "hidden": H, "inter": I, "topk": k,
                       "tokens": n, "variant": v["name"], "weights": wf, "layers": n_layers,
                       "threads": v["threads"] or args.default_threads, "mode": v["mode"],
                       "mean_active_experts": round(sum(active) / len(active), 2),
                       "calls": calls, "us_per_call": round(dt / calls * 1e6, 1),
                       "us_per_active_expert": round(dt / calls * 1e6 * len(active) / sum(active), 1),
                       "GBps": round(gbps, 1), "rel_err_vs_fp32_torch": float(f"{err:.3g}"),
                       "correct": ok}
                if args.dram_GBps:  # share of the best DRAM read rate measured in this run
                    row["frac_of_dram"] = round(gbps / args.dram_GBps, 3)
                rows.append(row)
                log(f"  {name:17s} N={n:4d} {v['name']:16s} {gbps:6.1f} GB/s "
                    f"({row.get('frac_of_dram', 0) * 100:4.0f}% DRAM) {row['us_per_call']:9.1f} us/call "
                    f"{row['us_per_active_expert']:7.1f} us/expert err {err:.2e}{'' if ok else ' WRONG'}")
        del layers
    return rows


def render(paths: list[str]) -> str:
    """Markdown: one table per result file (machine), models x tokens, GB/s and % of DRAM."""
    out = ["# CPU routed experts: GB/s of expert weights read (bf16; -fp8 variants: FP8 bytes)",
           "",
           "Produced by `python -m writescope.bench.cpu_experts` (per-file command below); "
           "rendered with `--render`. % = share of the DRAM read bandwidth measured in the same "
           "run. N = tokens per layer (uniform random top-k routing).", ""]
    for p in paths:
        d = json.loads(Path(p).read_text())
        m = d["machine"]
        ref = _dram_ref(d["dram"])
        out.append(f"## {m.get('cpu', '?')}, {d['threads']} threads"
                   f"{' (' + m['gpu'] + ' host)' if m.get('gpu') else ''}")
        out.append("")
        out.append(f"- file `{Path(p).name}`, commit `{(d.get('commit') or '?')[:12]}`, "
                   f"command `{d['command']}`")
        out.append(f"- ISA flags: {', '.join(m.get('flags', []))}; kernel: {d['kernel']}")
        out.append(f"- DRAM read ({d['dram']['buffer_GiB']} GiB buffer, {d['dram']['threads']} threads): "
                   f"C++ probe {d['dram']['best_GBps']} GB/s, torch.sum {d['dram']['torch_sum_GBps']} GB/s; "
                   f"% below = share of {ref} GB/s")
        out.append("")
        variants = list(dict.fromkeys(r["variant"] for r in d["rows"]))
        out.append("| model | N | active experts | " + " | ".join(variants) + " |")
        out.append("|---|---:|---:|" + "---:|" * len(variants))
        keys = list(dict.fromkeys((r["model"], r["tokens"]) for r in d["rows"]))
        for model, n in keys:
            cells = []
            act = None
            for v in variants:
                r = next((r for r in d["rows"] if r["model"] == model and r["tokens"] == n
                          and r["variant"] == v), None)
                if r is None:
                    cells.append("–")
                    continue
                act = r["mean_active_experts"]
                pct = f" ({r['GBps'] / ref * 100:.0f}%)"
                cells.append(f"{r['GBps']}{pct}{'' if r['correct'] else ' WRONG'}")
            out.append(f"| {model} | {n} | {act} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.cpu_experts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--render", nargs="+", metavar="JSON", help="print a markdown table of result files")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 32, 128])
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="kernel thread counts to time (default: the kernel's default)")
    ap.add_argument("--modes", nargs="+", default=["async"], choices=["async", "inline"],
                    help="async: wait(submit()) through the worker thread, as the model calls it; "
                         "inline: forward() on host tensors, in the benchmark's own thread")
    ap.add_argument("--footprint-gb", type=float, default=4.0,
                    help="expert weights allocated per model (>> last-level cache)")
    ap.add_argument("--min-layers", type=int, default=2)
    ap.add_argument("--routings", type=int, default=4, help="distinct routings per token count")
    ap.add_argument("--min-seconds", type=float, default=0.4, help="timed seconds per row")
    ap.add_argument("--dram-gib", type=float, default=4.0, help="buffer for the DRAM probe")
    ap.add_argument("--backends", nargs="+", default=["cpp", "torch"], choices=["cpp", "torch"])
    ap.add_argument("--weights", nargs="+", default=["bf16"],
                    choices=["bf16", "fp8", "fp8-rounded"],
                    help="expert weight formats: bf16, and block-wise FP8 (128x128 scales, as "
                         "the -FP8 checkpoints; the C++ kernel only) with the decode calls' "
                         "exact products (fp8, the default) or bf16(q * scale) ones "
                         "(fp8-rounded: WRITESCOPE_CPU_FP8_PRODUCTS=rounded). GB/s counts the "
                         "bytes stored: one a weight for FP8")
    ap.add_argument("--isas", nargs="+", default=None, choices=list(ce.ISA_NAMES),
                    help="C++ code paths to time (default: every one this CPU has)")
    ap.add_argument("--amx-min", nargs="+", type=int, default=[ce.AMX_MIN_TOKENS],
                    help="AMX variants: use AMX for experts with at least this many tokens")
    args = ap.parse_args(argv)
    if args.render:
        sys.stdout.write(render(args.render))
        return 0

    def log(s):
        print(s, flush=True)

    threads = ce.get_num_threads()
    args.default_threads = threads
    torch.set_num_threads(threads)  # the torch baseline uses torch's own pool
    info = machine()
    log(f"machine: {info}")
    kinfo = ce.kernel_info()
    log(f"kernel: {kinfo}")
    dram = dram_read_bw(args.dram_gib, max(args.threads or [threads]))
    log(f"DRAM read: {dram}")
    args.dram_GBps = _dram_ref(dram)
    variants = _variants(args)
    rows = []
    for name in args.models:
        rows += bench_model(name, args, variants, log)
    result = {"bench": "cpu_experts", "commit": git_commit(), "source_digest": source_digest(),
              "machine": info, "threads": threads,
              "kernel": kinfo, "dram": dram,
              "command": "python -m writescope.bench.cpu_experts " + " ".join(argv or sys.argv[1:]),
              "variants": variants, "rows": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
