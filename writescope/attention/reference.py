"""Dense attention oracle: float64, whole sequence, the ground truth every path is tested against."""
from __future__ import annotations

import torch


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    q_positions: torch.Tensor | None = None,
                    k_positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [Tq, Hq, Dk]`` over ``k [Tk, Hkv, Dk]``, ``v [Tk, Hkv, Dv]`` in float64.

    Query heads are grouped over KV heads (GQA: head ``h`` reads KV head ``h // (Hq // Hkv)``).
    With positions given, query ``i`` sees key ``j`` only if ``k_positions[j] <= q_positions[i]``.
    Returns ``(out [Tq, Hq, Dv], lse [Tq, Hq])`` in float64 (natural log; empty rows: 0, -inf).
    """
    tq, hq, _ = q.shape
    tk, hkv, _ = k.shape
    group = hq // hkv
    qd = q.double().view(tq, hkv, group, -1)
    s = torch.einsum("qhgd,khd->hgqk", qd, k.double()) * scale
    if q_positions is not None and k_positions is not None:
        mask = k_positions.view(1, -1) <= q_positions.view(-1, 1)
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [hkv, g, tq]
    finite = torch.isfinite(lse)
    p = torch.exp(s - torch.where(finite, lse, torch.zeros_like(lse)).unsqueeze(-1))
    p = torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))
    out = torch.einsum("hgqk,khd->qhgd", p, v.double()).reshape(tq, hq, -1)
    return out, lse.permute(2, 0, 1).reshape(tq, hq)
