"""``python -m writescope.bench.gpu_gemv [--json FILE] [--sweep]``: a decode step's dense
projections (a few rows times a weight) with cuBLAS (``F.linear``, what the engine runs) and
with ``layers/gemv.py``'s Triton kernel (``WRITESCOPE_GEMV=triton``), GB/s of weight read
against the HBM copy bandwidth measured in the same run.

For each reference model's projections (q/k/v or MLA's stacked q and kv_a, o_proj, the router,
DeepSeek's shared-expert gate/up and down) and a few row counts, ``--layers`` layers' weights
(random, each its own tensor: the L2 cache holds none of them across a pass) are multiplied
one after another in one CUDA graph, as a decode step's graph runs them; the time per
projection is the median over ``--reps`` replays. ``--sweep`` also times other launch settings
of the kernel (outputs a program, K block, K split, warps, stages) and prints the fastest.
"""
from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F

from ..layers import gemv
from ..models.config import ModelConfig
from .gpu_attention import _events_time, measure_hbm
from .graphed import add_common_args, graph_replay, write_json

MODELS = ("qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b")


def projections(name: str) -> list[tuple[str, int, int, torch.dtype]]:
    """``(what, outputs, inputs, dtype)`` of one decode layer's dense projections."""
    cfg = ModelConfig.from_hf(name)
    h, bf = cfg.hidden_size, torch.bfloat16
    out = []
    if cfg.kv_lora_rank:  # MLA: q_proj and kv_a_proj_with_mqa stacked (no query LoRA)
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        out.append(("q+kv_a", cfg.num_heads * qk + cfg.kv_lora_rank + cfg.qk_rope_head_dim, h, bf))
        out.append(("o_proj", h, cfg.num_heads * cfg.v_head_dim, bf))
    else:
        out.append(("qkv", (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, h, bf))
        out.append(("o_proj", h, cfg.num_heads * cfg.head_dim, bf))
    fp32_router = cfg.model_type == "deepseek_v2"
    out.append(("router", cfg.num_experts, h, torch.float32 if fp32_router else bf))
    if cfg.num_shared_experts:
        inter = cfg.shared_expert_intermediate_size
        out += [("shared gate/up", 2 * inter, h, bf), ("shared down", h, inter, bf)]
    return out


def sweep_configs() -> list[dict]:
    return [{"block_n": bn, "block_k": bk, "split_k": sk, "warps": w, "stages": st}
            for bn, bk, sk, w, st in itertools.product((16, 32, 64), (128, 256), (1, 2, 4),
                                                        (4,), (3, 4))]


def case(model: str, what: str, n: int, k: int, dt, rows: int, layers: int, reps: int, dev,
         configs: list[dict]) -> dict:
    ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
    x = torch.randn(rows, k, device=dev, dtype=dt)
    nbytes = n * k * ws[0].element_size()
    want = x.double() @ ws[0].double().t()

    def graphed(fn):
        def f():
            for w in ws:
                fn(x, w)
        return graph_replay(f, dev)

    def timed(fn) -> dict:
        got = fn(x, ws[0]).double()
        t = _events_time(graphed(fn), reps) / layers
        return {"us": t * 1e6, "gbps": nbytes / t / 1e9,
                "rel_err": ((got - want).norm() / want.norm()).item()}

    res = {"model": model, "what": what, "rows": rows, "outputs": n, "inputs": k,
           "dtype": str(dt).replace("torch.", ""), "bytes": nbytes,
           "cublas": timed(F.linear)}
    rows_ = []
    for config in [None] + configs:
        try:
            r = timed(lambda a, b, c=config: gemv.gemv(a, b, c))
        except Exception as e:  # noqa: BLE001 - a setting Triton cannot build: reported
            rows_.append({"config": config, "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        rows_.append(dict(r, config=config or gemv.default_config(rows, n, k)))
    res["triton"] = rows_[0]
    ok = [r for r in rows_ if "us" in r]
    res["triton_best"] = min(ok, key=lambda r: r["us"]) if ok else None
    res["variants"] = rows_[1:]
    del ws
    torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, MODELS)
    ap.add_argument("--rows", default="1,2,4,8", help="decode rows (tokens) per step, comma list")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_gemv: needs CUDA", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    hbm = measure_hbm(dev)
    configs = sweep_configs() if args.sweep else []
    results = []
    print(f"HBM copy bandwidth: {hbm:.0f} GB/s (read + write)")
    print(f"{'model':<18} {'projection':<15} {'rows':>4} {'MB':>6} {'cuBLAS us':>9} {'GB/s':>6} "
          f"{'triton us':>9} {'GB/s':>6} {'best us':>7} {'GB/s':>6}")
    for model in args.models.split(","):
        for what, n, k, dt in projections(model):
            for rows in (int(r) for r in args.rows.split(",")):
                r = case(model, what, n, k, dt, rows, args.layers, args.reps, dev, configs)
                results.append(r)
                c, t, b = r["cublas"], r["triton"], r["triton_best"] or {}
                print(f"{model:<18} {what:<15} {rows:>4} {r['bytes'] / 1e6:>6.1f} {c['us']:>9.1f} "
                      f"{c['gbps']:>6.0f} {t.get('us', float('nan')):>9.1f} "
                      f"{t.get('gbps', float('nan')):>6.0f} {b.get('us', float('nan')):>7.1f} "
                      f"{b.get('gbps', float('nan')):>6.0f}"
                      + (f"  best: {b.get('config')}" if args.sweep else ""), flush=True)
                if args.json:  # after every case: a run cut short keeps what it measured
                    write_json(args.json, "writescope.bench.gpu_gemv", argv, dev, hbm, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
