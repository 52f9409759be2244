"""Causal attention of a step's new tokens over themselves (one segment per sequence).

The cached context of every sequence is older than all of the step's new tokens, so a step's
attention is ``merge(cached-context partial, this partial)``; only this part needs a causal mask.
Single-token segments (decode) are computed for all rows at once; longer segments (prefill chunks)
one at a time with a dense causal mask.
"""
from __future__ import annotations

import torch

from ..kvcache.regions import KVSpec


def causal_self_attention(q: torch.Tensor, records: torch.Tensor, spec: KVSpec,
                          seg_lens: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [N, Hq, Dk]``, ``records [N, Hkv, R]``; returns float32 ``(out [N, Hq, Dv], lse [N, Hq])``."""
    n, hq, _ = q.shape
    hkv = spec.num_kv_heads
    g = hq // hkv
    k = spec.k(records).float()
    v = spec.v(records).float()
    qf = q.float().view(n, hkv, g, -1)
    # every row attending only to itself: exact for single-token segments
    lse = (torch.einsum("nhgd,nhd->nhg", qf, k) * scale).reshape(n, hq)
    out = v.unsqueeze(2).expand(n, hkv, g, v.shape[-1]).reshape(n, hq, -1).clone()
    start = 0
    for length in seg_lens:
        if length > 1:
            sl = slice(start, start + length)
            s = torch.einsum("qhgd,khd->hgqk", qf[sl], k[sl]) * scale
            mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~mask, float("-inf"))
            m = torch.logsumexp(s, dim=-1, keepdim=True)
            o = torch.einsum("hgqk,khd->qhgd", torch.exp(s - m), v[sl])
            out[sl] = o.reshape(length, hq, -1)
            lse[sl] = m.squeeze(-1).permute(2, 0, 1).reshape(length, hq)
        start += length
    return out, lse
