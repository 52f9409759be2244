"""Prefill attention benchmark: a chunk of new tokens over its cached context, dense and paged.

``python -m writescope.bench.prefill [--json FILE] [--chunk 4096] [--contexts 0,28K]``

For GQA (Qwen3-30B-A3B: 32 query heads over 4 KV heads of 128) and MLA (DeepSeek-V2-Lite: 16
heads over the 576-value latent, V its first 512), one sequence's prefill chunk of ``--chunk``
tokens after ``P`` cached tokens, bf16, one layer:

* **dense**: :func:`writescope.attention.prefill.causal_prefix_attention` (SDPA's fused
  kernels, or the tiled fallback where none runs), with the backend it took;
* **paged**: the split-KV decode kernel over the cached blocks plus the float32 self-attention
  of the chunk and the merge -- the path prefill took before (``WRITESCOPE_DENSE_PREFILL=0``);
* **per head** (MLA): :func:`writescope.attention.prefill.mla_prefix_attention`, the context
  decompressed with a ``kv_b_proj`` and attended per head -- what the engine's MLA prefill runs
  (the dense column is then ``WRITESCOPE_MLA_PREFILL=absorbed``).

Prints ms per layer and achieved TFLOP/s (causal pairs x heads x 2 x (Dk + Dv)), and checks the
two against each other.
"""
from __future__ import annotations

import argparse
import math

import torch

from ..attention import prefill
from ..attention.batch import BlockBatch
from ..attention.merge import merge
from ..attention.selfattn import causal_self_attention
from ..kvcache.regions import KVSpec
from ..planner.calibrate import _median_time
from .cpu_attention import parse_count
from .provenance import result_header, write_json

SHAPES = {
    "gqa-32/4/128": (lambda: KVSpec.gqa(1, 4, 128, torch.bfloat16), 32),
    "mla-16/1/576": (lambda: KVSpec.mla(1, 512, 64, torch.bfloat16), 16),
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.prefill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--chunk", default="4096", help="new tokens in the chunk")
    ap.add_argument("--contexts", default="0,28K", help="cached tokens before the chunk")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-paged", action="store_true", help="skip the paged (old) path")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    n = parse_count(args.chunk)
    rows = []
    for name in args.shapes.split(","):
        spec_fn, hq = SHAPES[name]
        spec = spec_fn()
        scale = 1 / math.sqrt(192 if spec.is_mla else spec.k_dim)
        for p in (parse_count(x) for x in args.contexts.split(",")):
            g = torch.Generator(device=dev).manual_seed(0)
            t = p + n
            rec = torch.randn(t, spec.num_kv_heads, spec.rec_dim, generator=g, device=dev,
                              dtype=spec.dtype)
            q = torch.randn(n, hq, spec.k_dim, generator=g, device=dev, dtype=spec.dtype)
            heads = None
            if spec.is_mla:  # the absorbed queries of per-head ones, so both forms compare
                lora, dn, dv = spec.v_dim, 128, 128
                q_nope = torch.randn(n, hq, dn, generator=g, device=dev, dtype=spec.dtype)
                q_pe = q[..., lora:].contiguous()
                w = torch.randn(hq * (dn + dv), lora, generator=g, device=dev,
                                dtype=spec.dtype) / lora ** 0.5
                wv = w.view(hq, dn + dv, lora)
                q = torch.cat((torch.einsum("nhd,hdc->nhc", q_nope, wv[:, :dn]), q_pe), dim=-1)
                heads = lambda: prefill.mla_prefix_attention(q_nope, q_pe, rec, w, scale)  # noqa: E731
            k, v = spec.k(rec), spec.v(rec)
            prefill._sdpa_failed.clear()
            dense = lambda: prefill.causal_prefix_attention(q, k, v, scale)  # noqa: E731
            try:
                t_dense = _median_time(dense, args.reps, sync)
                backend = "tiled" if prefill._sdpa_failed else "sdpa"
                out_d = dense().float()
                err = None
            except torch.OutOfMemoryError as e:
                t_dense, backend, out_d, err = None, "oom", None, str(e)[:200]
            pairs = n * p + n * (n + 1) / 2
            flops = 2 * pairs * hq * (spec.k_dim + spec.v_dim)
            row = {"shape": name, "chunk": n, "context": p, "dense_backend": backend,
                   "dense_ms": None if t_dense is None else t_dense * 1e3,
                   "dense_tflops": None if t_dense is None else flops / t_dense / 1e12,
                   "error": err}
            if heads is not None:  # MLA per head (what the engine's prefill runs), with kv_b_proj
                try:
                    t_heads = _median_time(heads, args.reps, sync)
                    row["heads_ms"] = t_heads * 1e3
                    row["heads_tflops"] = 2 * pairs * hq * (192 + 192) / t_heads / 1e12
                    if out_d is not None:
                        ref = torch.einsum("nhc,hvc->nhv", out_d, wv[:, dn:].float())
                        got = heads().float()
                        row["heads_rel_diff"] = ((got - ref).norm() / ref.norm()).item()
                except torch.OutOfMemoryError as e:
                    row["heads_ms"], row["heads_error"] = None, str(e)[:200]
            if not args.no_paged and p > 0 and dev.type == "cuda":
                from ..attention.gpu import attend_gpu
                bs = args.block_size
                nb = p // bs
                pool = rec[:nb * bs].view(nb, bs, spec.num_kv_heads, spec.rec_dim)
                batch = BlockBatch.build([n], [list(range(nb))], [[bs] * nb], dev)
                new = rec[nb * bs:]

                def paged():
                    oc, lc = attend_gpu(q, pool, "gpu", spec, batch, scale)
                    os_, ls = causal_self_attention(q, new, spec, [n], scale)
                    return merge(oc, lc, os_, ls)[0]
                try:
                    t_paged = _median_time(paged, 1, sync)
                    row["paged_ms"] = t_paged * 1e3
                    if out_d is not None and p == nb * bs:
                        ref = paged().float()
                        row["max_rel_diff"] = ((out_d - ref).norm() / ref.norm()).item()
                except torch.OutOfMemoryError as e:
                    row["paged_ms"], row["paged_error"] = None, str(e)[:200]
            rows.append(row)
            print(f"{name:14s} chunk {n:6d} ctx {p:7d}  dense {row['dense_ms'] or float('nan'):9.2f} ms "
                  f"({row['dense_tflops'] or float('nan'):6.1f} TFLOP/s, {backend})"
                  + (f"  paged {row['paged_ms']:9.2f} ms" if row.get("paged_ms") else "")
                  + (f"  rel diff {row['max_rel_diff']:.2e}" if "max_rel_diff" in row else "")
                  + (f"  per head {row['heads_ms']:9.2f} ms ({row['heads_tflops']:6.1f} TFLOP/s "
                     f"padded, rel diff {row.get('heads_rel_diff', float('nan')):.2e})"
                     if row.get("heads_ms") else ""),
                  flush=True)
            del rec, q, k, v, out_d, heads
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    res = {**result_header("prefill", argv),
           "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
           "torch": torch.__version__, "rows": rows}
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
