"""A two-level merge of attention partials: the resident sweep's alternative to the engine's
one-level merge (``bench.gpu_attention``; the engine merges in one level, ``attention/gpu.py``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class TreePlan:
    """The resident sweep's alternative to the engine's one-level merge (measured slower on the
    H200: 2970-3060 GB/s against 3082 at MLA 1 x 256K, 2026-12-01h call 3). A two-level merge for rows of many partials (one long sequence: hundreds per row). Level 1
    merges runs of at most ``fanin`` consecutive entries of the row CSR's ``row_idx`` (the
    groups, ``group_ptr``), level 2 each row's groups (``row_ptr`` over ``row_idx =
    arange(num_groups)``). Both levels are ``gpu.launch_reduce``; the groups are slices of the
    same CSR, so planning is a finer index pointer, no new kernel."""

    group_ptr: torch.Tensor
    row_ptr: torch.Tensor
    row_idx: torch.Tensor
    num_groups: int

    def to(self, device) -> "TreePlan":
        return TreePlan(*(t.to(device, non_blocking=True) for t in
                          (self.group_ptr, self.row_ptr, self.row_idx)), self.num_groups)


def plan_tree(row_ptr: torch.Tensor, fanin: int) -> TreePlan | None:
    """Groups of at most ``fanin`` partials per row of the CSR ``row_ptr`` (host tensor); None
    when no row has more than ``fanin`` partials (one level does it)."""
    if fanin < 2:
        raise ValueError(f"a merge tree's fan-in must be at least 2, not {fanin}")
    rp = row_ptr.to("cpu").numpy().astype(np.int64)
    counts = rp[1:] - rp[:-1]
    if counts.size == 0 or counts.max() <= fanin:
        return None
    ng = (counts + fanin - 1) // fanin
    total = int(ng.sum())
    first = np.repeat(np.cumsum(ng) - ng, ng)
    starts = np.repeat(rp[:-1], ng) + (np.arange(total) - first) * fanin
    # a row's groups tile its entries and rows follow each other: group g ends where g+1 starts
    group_ptr = np.append(starts, rp[-1])
    rows = np.zeros(counts.size + 1, dtype=np.int64)
    rows[1:] = np.cumsum(ng)
    t = lambda a, dt=np.int32: torch.from_numpy(np.ascontiguousarray(a, dtype=dt))  # noqa: E731
    return TreePlan(t(group_ptr), t(rows), t(np.arange(total), np.int64), total)


def launch_reduce_tree(part_out: torch.Tensor, part_lse: torch.Tensor, row_idx: torch.Tensor,
                       tree: TreePlan, out: torch.Tensor, lse: torch.Tensor,
                       extra: tuple[torch.Tensor, torch.Tensor] | None = None,
                       mid: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """``gpu.launch_reduce`` in two levels over ``tree`` (device tensors); ``mid`` the level-1
    results ``([num_groups, Hq, Dv], [num_groups, Hq])`` fp32, allocated when not given."""
    nq, hq, dv = out.shape
    if mid is None:
        mid = (torch.empty(tree.num_groups, hq, dv, dtype=torch.float32, device=out.device),
               torch.empty(tree.num_groups, hq, dtype=torch.float32, device=out.device))
    from ..attention.gpu import launch_reduce
    launch_reduce(part_out, part_lse, tree.group_ptr, row_idx, mid[0], mid[1])
    launch_reduce(mid[0], mid[1], tree.row_ptr, tree.row_idx, out, lse, extra)
