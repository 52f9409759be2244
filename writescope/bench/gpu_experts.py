"""``python -m writescope.bench.gpu_experts [--json FILE] [--sweep]``: the decode step's routed
experts on the GPU (``layers/moe_triton.py``), GB/s of expert weights read against the HBM
copy bandwidth measured in the same run.

For each reference model's expert shape and a few decode batch sizes (tokens per step), a
stack of ``--layers`` layers' experts (random bf16, far larger than the L2 cache) is run layer
after layer, as a decode step runs them, with random top-k routing; the time per layer is the
median over ``--reps`` passes (device events around a pass, captured as one CUDA graph as the
engine's decode steps are). Bytes are the distinct experts'
gate/up and down weights a layer reads. ``torch`` is the expert-by-expert path
(``moe.run_experts``) on the same routing, for scale. ``--sweep`` also times other launch
settings (rows per program, block widths, warps) of one kernel at a time, prints each as it is
timed and the fastest (``--sweep-kernel`` picks the kernel). The committed defaults come from
its sweep at Qwen3-30B-A3B's 2 and DeepSeek-V2-Lite's 4 tokens, confirmed in the engine's steps
(``step_profile``), bench/results/2026-12-04b-h200 calls 1 and 2. ``--weights bf16,fp8`` also
times block-wise FP8 experts (128 x 128 blocks, one byte a weight and a float32 scale a block,
converted in the kernels: ``StackedExperts(fp8=...)``), their bytes counted as stored;
``--fp8-variants`` times their conversions and a few launch settings too.
"""
from __future__ import annotations

import argparse
import itertools
import sys

import torch

from ..layers import moe_triton
from ..layers.moe import StackedExperts, run_experts
from ..models.config import ModelConfig
from ..models.quantization import Fp8Blocks
from .gpu_attention import _events_time, measure_hbm
from .graphed import add_common_args, graph_replay, write_json

MODELS = ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b")


def sweep_configs(which: str = "all") -> list[dict]:
    """Launch settings of one kernel at a time (the other at its default): ``which`` is
    ``gate_up``, ``down`` or ``all``."""
    out = []
    if which in ("all", "gate_up"):
        for gr, gh, gw in itertools.product((8, 16, 32, 64), (128, 256, 512), (4, 8)):
            out.append({"gate_up_rows": gr, "gate_up_block_h": gh, "gate_up_warps": gw})
    if which in ("all", "down"):
        for dr, di, dw in itertools.product((4, 8, 16), (128, 256, 512), (4, 8)):
            out.append({"down_rows": dr, "down_block_i": di, "down_warps": dw})
    return out


def fp8_variant_configs() -> list[dict]:
    """FP8 experts' variants: each conversion of ``moe_triton.FP8_CONVERT_MODES`` (the
    unrounded ones for what the rounding to bf16 costs), and with the hardware's and the
    float-bits conversion more rows or other warps a gate/up program, wider tiles (more bytes a
    load: the default widths are bf16's, so FP8 tiles hold half the bytes) or more warps or
    outputs a down program (one kernel at a time)."""
    out = [{"fp8_convert": m} for m in moe_triton.FP8_CONVERT_MODES]
    for m in (1, 3):
        out += [{"fp8_convert": m, "gate_up_rows": r, "gate_up_warps": w}
                for r, w in itertools.product((16, 32), (4, 8))]
        out += [{"fp8_convert": m, "down_block_i": 128},
                {"fp8_convert": m, "down_block_i": 128, "down_warps": 8},
                {"fp8_convert": m, "down_block_i": 128, "down_rows": 16}]
    return out


def _routing(n: int, e: int, k: int, gen: torch.Generator, dev) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.rand(n, e, generator=gen).topk(k, dim=-1).indices
    w = torch.rand(n, k, generator=gen).softmax(-1)
    return idx.to(dev), w.to(dev)


def _fp8_layer(E: int, H: int, I: int, dev) -> StackedExperts:
    """One layer's random experts, FP8 with 128 x 128 blocks, quantized expert by expert."""
    with torch.device(dev):
        st = StackedExperts(E, H, I, fp8=Fp8Blocks())
    for e in range(E):
        mats = [torch.randn(*shape, device=dev) * 0.02 for shape in ((I, H), (I, H), (H, I))]
        st.set_expert_fp8(e, *[st.fp8.quantize(m) for m in mats])
    return st


def case(name: str, n: int, layers: int, reps: int, dev, configs: list[dict], torch_ref: bool,
         gen: torch.Generator, weights: str = "bf16") -> dict:
    cfg = ModelConfig.from_hf(name)
    E, k, H, I = cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size
    dt = torch.bfloat16
    if weights == "fp8":
        stacks = [_fp8_layer(E, H, I, dev) for _ in range(layers)]
        gu, dn = [s.gate_up for s in stacks], [s.down for s in stacks]
        scales = [(s.gate_up_scale, s.down_scale, s.fp8) for s in stacks]
        per_weight = stacks[0].fp8.bytes_per_weight
        expert = stacks[0].weights
    else:
        gu = [torch.randn(E, 2 * I, H, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
        dn = [torch.randn(E, H, I, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
        scales = [None] * layers
        per_weight = 2

        def expert(e):
            return gu[0][e], dn[0][e]
    x = torch.randn(n, H, device=dev, dtype=dt)
    routes = [_routing(n, E, k, gen, dev) for _ in range(layers)]
    distinct = sum(len(set(r[0].reshape(-1).tolist())) for r in routes) / layers
    layer_bytes = distinct * 3 * I * H * per_weight

    def pass_(config):
        """The layers' calls as one CUDA graph's replay, as the engine's decode steps run them:
        the device time, without the host's per-call launches (a few tens of microseconds of
        Python a call, more than a small layer's kernels take)."""
        def f():
            for li in range(layers):
                moe_triton.fused_experts(x, *routes[li], gu[li], dn[li], config=config,
                                         fp8=scales[li])
        return graph_replay(f, dev)

    res = {"model": name, "weights": weights, "tokens": n, "experts_per_token": k, "hidden": H,
           "inter": I, "distinct_experts": distinct, "layer_bytes": layer_bytes,
           "default_rows": {"gate_up": (moe_triton.FP8_GATE_UP_ROWS if weights == "fp8"
                                        else moe_triton.gate_up_rows(n * k, I)),
                            "down": moe_triton.down_rows(n, H, 1 << (k - 1).bit_length())}}
    want = run_experts(x.float(), routes[0][0], routes[0][1].float(),
                       lambda e: tuple(t.float() for t in expert(e)))
    rows = []
    for config in [None] + configs:
        try:
            got = moe_triton.fused_experts(x, *routes[0], gu[0], dn[0], config=config,
                                           fp8=scales[0]).float()
            err = ((got - want).norm() / want.norm()).item()
            t = _events_time(pass_(config), reps) / layers
        except Exception as e:  # noqa: BLE001 - a setting Triton cannot build: reported, skipped
            rows.append({"config": config, "error": f"{type(e).__name__}: {e}"})
            continue
        rows.append({"config": config, "us": t * 1e6, "gbps": layer_bytes / t / 1e9, "rel_err": err})
        if configs:  # a sweep: each setting as it is timed (a run cut short keeps them)
            print(f"  {name} {n} tokens {config or 'default'}: {t * 1e6:.1f} us, "
                  f"{layer_bytes / t / 1e9:.0f} GB/s", flush=True)
    res["default"] = rows[0]
    ok = [r for r in rows if "us" in r]
    res["best"] = min(ok, key=lambda r: r["us"]) if ok else None
    res["variants"] = rows[1:]
    if torch_ref and weights == "bf16":
        def torch_pass():
            for li in range(layers):
                run_experts(x, *routes[li], lambda e, li=li: (gu[li][e], dn[li][e]))
        torch_pass()
        res["torch_gbps"] = layer_bytes / (_events_time(torch_pass, max(1, reps // 3)) / layers) / 1e9
    del gu, dn
    torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, MODELS)
    ap.add_argument("--tokens", default="1,2,4,8", help="decode tokens per step (comma list)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--weights", default="bf16",
                    help="comma list of bf16 and fp8 (block-wise FP8 experts, 128 x 128 blocks)")
    ap.add_argument("--sweep-kernel", choices=("all", "gate_up", "down"), default="all",
                    help="with --sweep: whose launch settings to vary")
    ap.add_argument("--fp8-variants", action="store_true",
                    help="FP8 rows: also time each conversion and a few launch settings "
                         "(fp8_variant_configs), printing each")
    args = ap.parse_args(argv)
    kinds = args.weights.split(",")
    if not kinds or any(w not in ("bf16", "fp8") for w in kinds):
        ap.error(f"--weights takes bf16 and/or fp8, got {args.weights!r}")
    if not torch.cuda.is_available():
        print("gpu_experts: needs CUDA", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    hbm = measure_hbm(dev)
    gen = torch.Generator().manual_seed(0)
    configs = sweep_configs(args.sweep_kernel) if args.sweep else []
    results = []
    print(f"HBM copy bandwidth: {hbm:.0f} GB/s (read + write)")
    print(f"{'model':<18} {'wt':>4} {'tok':>3} {'experts':>7} {'MB/layer':>8} {'us':>7} {'GB/s':>6} "
          f"{'of HBM':>6} {'best us':>7} {'best GB/s':>9} {'torch GB/s':>10}")
    for name, wt, n in itertools.product(args.models.split(","), kinds,
                                         (int(t) for t in args.tokens.split(","))):
        variants = fp8_variant_configs() if args.fp8_variants and wt == "fp8" else []
        r = case(name, n, args.layers, args.reps, dev, configs + variants, not args.no_torch,
                 gen, wt)
        results.append(r)
        d, b = r["default"], r["best"]
        print(f"{name:<18} {wt:>4} {n:>3} {r['distinct_experts']:>7.1f} {r['layer_bytes'] / 1e6:>8.1f} "
              f"{d.get('us', float('nan')):>7.1f} {d.get('gbps', float('nan')):>6.0f} "
              f"{d.get('gbps', 0) / hbm:>6.0%} {b['us']:>7.1f} {b['gbps']:>9.0f} "
              f"{r.get('torch_gbps', float('nan')):>10.0f}"
              + (f"  best: {b['config']}" if args.sweep or variants else ""))
    if args.json:
        write_json(args.json, "writescope.bench.gpu_experts", argv, dev, hbm, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
