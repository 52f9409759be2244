"""Causal attention of a step's new tokens over themselves (one segment per sequence).

The cached context of every sequence is older than all of the step's new tokens, so a step's
attention is ``merge(cached-context partial, this partial)``; only this part needs a causal mask.
Single-token segments (decode) are computed for all rows at once; longer segments (prefill chunks)
one at a time, in query tiles with a dense causal mask (memory bounded by ``SCORE_ELEMS``).
"""
from __future__ import annotations

import torch

from ..kvcache.regions import KVSpec

#: score elements (per query-tile, all heads) a prefill chunk's self-attention holds at once
SCORE_ELEMS = 1 << 25


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
            # query tiles, each over the keys up to its last row: scores stay near
            # SCORE_ELEMS floats whatever the chunk length, and future keys are never computed
            tile = max(16, min(length, SCORE_ELEMS // (hq * length)))
            for a in range(0, length, tile):
                b = min(length, a + tile)
                qs = slice(start + a, start + b)
                ks = slice(start, start + b)
                s = torch.einsum("qhgd,khd->hgqk", qf[qs], k[ks]) * scale
                mask = torch.ones(b - a, b, dtype=torch.bool, device=q.device).tril(diagonal=a)
                s = s.masked_fill(~mask, float("-inf"))
                m = torch.logsumexp(s, dim=-1, keepdim=True)
                o = torch.einsum("hgqk,khd->qhgd", torch.exp(s - m), v[ks])
                out[qs] = o.reshape(b - a, hq, -1)
                lse[qs] = m.squeeze(-1).permute(2, 0, 1).reshape(b - a, hq)
        start += length
    return out, lse
