"""The one place partial attention results are merged.

Convention (used by every attention path in writescope):

* a partial result over a subset of a query's keys is ``(out, lse)`` with
  ``out = softmax(s)[subset] @ V[subset]`` normalised *within the subset* and
  ``lse = log(sum(exp(s[subset])))``, where ``s = scale * q . k`` -- natural log;
* both are float32; ``out`` has shape ``[..., Hq, Dv]`` and ``lse`` ``[..., Hq]``;
* an empty subset is ``out = 0``, ``lse = -inf`` and merges as the identity.

Merging two partials over disjoint subsets gives the partial over their union:
``lse = logaddexp(lse_a, lse_b)``, ``out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)``.
"""
from __future__ import annotations

import torch


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial results (see the module docstring). Returns new float32 tensors."""
    lse_a = lse_a.float()
    lse_b = lse_b.float()
    lse = torch.logaddexp(lse_a, lse_b)
    # where both are -inf, logaddexp is -inf and the weights would be nan: use 0 instead
    safe = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).unsqueeze(-1)
    out = out_a.float() * wa + out_b.float() * wb
    return out, lse


def merge_many(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge any number of partial results over disjoint key subsets."""
    if not parts:
        raise ValueError("merge_many needs at least one partial result")
    out, lse = parts[0][0].float(), parts[0][1].float()
    for o, l in parts[1:]:
        out, lse = merge(out, lse, o, l)
    return out, lse
