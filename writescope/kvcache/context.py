"""One sequence's cached context as contiguous records on the compute device (a read).

Prefill chunks attend their whole context with a fused dense kernel
(``attention/prefill.py``), which wants keys and values as one ``[P, H, R]`` tensor rather than
paged blocks. :class:`ContextPlan` is built once per step from the sequence's block table;
:func:`gather_context` then assembles one layer's context per call, every region read where it
lives and nothing written back:

* G blocks: one ``index_select`` from the device pool;
* T blocks: one host-to-device copy per run of consecutive ids at consecutive positions (T ids
  are allocated as contiguous runs, so a sequence's T blocks are usually one or a few DMAs from
  pinned memory);
* C blocks: through the C gather's pinned bounce buffers and re-laid-out on the device
  (``attention/gather.py``), or, without one, re-laid-out on the host and copied;
* the W tail: its valid tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..attention.batch import BlockBatch
from ..hostmem import h2d
from .regions import Region, from_cpu_layout
from .table import REGION_CODES


@dataclass
class ContextPlan:
    """Where each cached token of one sequence lives: ``blocks`` sealed blocks then ``tail``
    tokens of W slot ``w_slot``."""

    num_tokens: int
    g: tuple[torch.Tensor, torch.Tensor] | None   # (positions, ids) on the device
    t_runs: list[tuple[int, int, int]]            # (first position, first id, count)
    c: tuple[torch.Tensor, BlockBatch, torch.Tensor] | None  # (positions, batch, ids)
    w_slot: int
    tail: int

    @classmethod
    def build(cls, codes: np.ndarray, ids: np.ndarray, w_slot: int, tail: int, bs: int,
              device: torch.device) -> "ContextPlan":
        g = t_runs = c = None
        sel = np.flatnonzero(codes == REGION_CODES[Region.G])
        if sel.size:
            g = (h2d(sel, device, torch.long), h2d(ids[sel], device, torch.long))
        sel = np.flatnonzero(codes == REGION_CODES[Region.T])
        t_runs = []
        if sel.size:
            tid = ids[sel].astype(np.int64)
            # a run continues while both the position and the id go up by one
            brk = np.flatnonzero((np.diff(sel) != 1) | (np.diff(tid) != 1)) + 1
            starts = np.concatenate(([0], brk))
            ends = np.concatenate((brk, [sel.size]))
            t_runs = [(int(sel[a]), int(tid[a]), int(b - a)) for a, b in zip(starts, ends)]
        sel = np.flatnonzero(codes == REGION_CODES[Region.C])
        if sel.size:
            cid = ids[sel].astype(np.int32)
            batch = BlockBatch.build([1], [cid.tolist()], [[bs] * sel.size])
            c = (h2d(sel, device, torch.long), batch,
                 torch.as_tensor(cid, dtype=torch.long))
        return cls(int(codes.size) * bs + tail, g, t_runs, c, w_slot, tail)


def gather_context(plan: ContextPlan, pools: dict[Region, torch.Tensor], layer: int, bs: int,
                   device: torch.device, cgather=None) -> torch.Tensor:
    """One layer's cached context of the planned sequence, ``[P, H, R]`` on ``device``."""
    w = pools[Region.W][layer]  # [slots, bs, H, R]
    h, r = w.shape[-2:]
    out = torch.empty(plan.num_tokens, h, r, dtype=w.dtype, device=device)
    sealed = (plan.num_tokens - plan.tail) // bs
    blocks = out[:sealed * bs].view(sealed, bs, h, r)
    if plan.g is not None:
        pos, ids = plan.g
        blocks.index_copy_(0, pos, pools[Region.G][layer].index_select(0, ids))
    if plan.t_runs:
        tpool = pools[Region.T][layer]
        for p0, i0, n in plan.t_runs:
            blocks[p0:p0 + n].copy_(tpool[i0:i0 + n], non_blocking=True)
    if plan.c is not None:
        pos, batch, ids = plan.c
        cpool = pools[Region.C][layer]
        if cgather is not None:
            done = 0
            for gp in cgather.plan(batch):
                conv = cgather.fetch(cpool, gp)
                k = gp.num_blocks
                blocks.index_copy_(0, pos[done:done + k], conv[:k])
                done += k
        else:
            data = from_cpu_layout(cpool.index_select(0, ids))
            blocks.index_copy_(0, pos, data.to(device))
    if plan.tail:
        out[sealed * bs:].copy_(w[plan.w_slot, :plan.tail])
    return out
