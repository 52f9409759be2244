"""Memory for the regions, within their budgets, and the block-id allocators.

* :func:`allocate_pool` -- one tensor per region: HBM for G and W, pinned host memory for T (when
  CUDA is present; page-locked at its exact size, ``writescope/hostmem.py``), pageable 64-byte-aligned host memory for C (advised for huge pages).
* :class:`BlockAllocator` -- free-list ids for G and C; W slots.
* :class:`ExtentAllocator` -- T ids as contiguous runs: a sequence's next T block is taken right
  after its previous one when free, and a new run starts in the middle of the largest free gap
  (leaving room on both sides), so a layer's T blocks of one sequence form few extents and move
  to the GPU in few DMA copies.
"""
from __future__ import annotations

import numpy as np
import torch

from .regions import C_ALIGN, KVSpec, Region, pool_shape


class KVCacheError(RuntimeError):
    """Misuse of the cache: double free, write to a sealed block, read of a freed block."""


def allocate_pool(region: Region, spec: KVSpec, num_blocks: int, block_size: int,
                  device: torch.device) -> torch.Tensor:
    shape = pool_shape(region, spec, num_blocks, block_size)
    if region in (Region.G, Region.W):
        return torch.empty(shape, dtype=spec.dtype, device=device)
    if region is Region.T:
        if device.type == "cuda" and torch.cuda.is_available():
            # page-locked at its exact size (torch's pinned allocator would round it up to the
            # next power of two: a 16.06 GiB pool would lock 32 GiB; ../hostmem.py)
            from ..hostmem import pinned_empty
            return pinned_empty(shape, spec.dtype)
        return torch.empty(shape, dtype=spec.dtype)
    # C: pageable, 64-byte aligned, huge pages advised
    from ..hostmem import pageable_empty
    pool = pageable_empty(shape, spec.dtype, C_ALIGN)
    assert pool.data_ptr() % C_ALIGN == 0
    return pool


class BlockAllocator:
    """Free-list of block ids ``0..n-1`` (lowest ids first)."""

    def __init__(self, n: int, name: str):
        self.n = n
        self.name = name
        self.used = np.zeros(n, dtype=bool)
        self._free: list[int] = list(range(n - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, k: int, after: int | None = None) -> list[int]:
        if k > len(self._free):
            raise KVCacheError(f"region {self.name}: asked for {k} blocks, {len(self._free)} free")
        ids = [self._free.pop() for _ in range(k)]
        self.used[ids] = True
        return ids

    def free(self, ids) -> None:
        ids = list(ids)
        if not ids:
            return
        if not self.used[ids].all():
            raise KVCacheError(f"region {self.name}: freeing a block that is not allocated")
        self.used[ids] = False
        self._free.extend(ids)
        self._free.sort(reverse=True)  # lowest ids are handed out first


class ExtentAllocator(BlockAllocator):
    """Allocates ids as contiguous runs, extending a sequence's last run when possible."""

    def alloc(self, k: int, after: int | None = None) -> list[int]:
        if k > self.num_free:
            raise KVCacheError(f"region {self.name}: asked for {k} blocks, {self.num_free} free")
        out: list[int] = []
        # 1. extend the run that ends at `after`
        nxt = -1 if after is None else after + 1
        while len(out) < k and 0 <= nxt < self.n and not self.used[nxt]:
            out.append(nxt)
            nxt += 1
        # 2. a new run in the middle of the largest free gap, so that both this sequence and
        #    the one before the gap have room to grow contiguously
        while len(out) < k:
            need = k - len(out)
            free = ~self.used
            free[out] = False
            start, length = _largest_run(free)
            take = min(length, need)
            if start > 0:  # a neighbour ends just before the gap: leave it half the slack
                start += (length - take) // 2
            out.extend(range(start, start + take))
        self.used[out] = True
        taken = set(out)
        self._free = [i for i in self._free if i not in taken]
        return out


def _largest_run(free: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of free ids (the first of equals)."""
    padded = np.concatenate(([False], free, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    starts, ends = edges[::2], edges[1::2]
    i = int(np.argmax(ends - starts))
    return int(starts[i]), int(ends[i] - starts[i])
