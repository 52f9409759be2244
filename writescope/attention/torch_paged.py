"""Paged attention in plain torch ops: the portable path (any device, any dtype).

Used where no faster kernel applies (CPU without the compiled kernel, GPU without Triton) and as
a readable statement of what the kernels compute. Python loops over sequences, not blocks:
each sequence's blocks are gathered with one index operation.
"""
from __future__ import annotations

import torch

from ..kvcache.regions import KVSpec, from_cpu_layout
from .batch import BlockBatch


def gather_records(kv: torch.Tensor, layout: str, blocks: torch.Tensor, lens: torch.Tensor
                   ) -> torch.Tensor:
    """Records of the listed blocks of one layer's pool as ``[tokens, H, R]`` (a copy)."""
    g = kv.index_select(0, blocks.long())  # [n, bs, H, R], or the CPU layout
    if layout == "cpu":
        g = from_cpu_layout(g)
    n, bs = g.shape[0], g.shape[1]
    if n and bool((lens == bs).all()):
        return g.reshape(n * bs, *g.shape[2:])
    keep = torch.arange(bs, device=g.device).view(1, bs) < lens.to(g.device).view(n, 1)
    return g[keep]


def attend_torch(q: torch.Tensor, kv: torch.Tensor, layout: str, spec: KVSpec, batch: BlockBatch,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [nq, Hq, Dk]`` over one layer's pool ``kv``; returns float32 ``(out, lse)``."""
    nq, hq, _ = q.shape
    hkv = spec.num_kv_heads
    group = hq // hkv
    out = torch.zeros(nq, hq, spec.v_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((nq, hq), float("-inf"), dtype=torch.float32, device=q.device)
    qi = batch.q_indptr.tolist()
    ki = batch.kv_indptr.tolist()
    for i in range(batch.num_seqs):
        q0, q1, k0, k1 = qi[i], qi[i + 1], ki[i], ki[i + 1]
        if q1 == q0 or k1 == k0:
            continue
        rec = gather_records(kv, layout, batch.kv_blocks[k0:k1], batch.kv_lens[k0:k1])
        rec = rec.to(q.device, torch.float32)
        k = spec.k(rec)  # [T, Hkv, Dk]
        v = spec.v(rec)
        qs = q[q0:q1].float().view(q1 - q0, hkv, group, -1)
        s = torch.einsum("qhgd,khd->hgqk", qs, k) * scale
        m = torch.logsumexp(s, dim=-1, keepdim=True)
        p = torch.exp(s - m)
        o = torch.einsum("hgqk,khd->qhgd", p, v)
        out[q0:q1] = o.reshape(q1 - q0, hq, -1)
        lse[q0:q1] = m.squeeze(-1).permute(2, 0, 1).reshape(q1 - q0, hq)
    return out, lse
