"""Per-sequence block tables: each sealed block's region and id, in sequence order, plus the tail.

Kept as growing numpy arrays so that building a step's plan is array work, not a Python loop over
blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .regions import Region

REGION_CODES = {Region.G: 0, Region.T: 1, Region.C: 2}
CODE_REGIONS = {v: k for k, v in REGION_CODES.items()}


@dataclass
class SeqTable:
    seq_id: int
    w_slot: int
    reserved_blocks: int  # admission reservation (blocks this sequence may still need)
    num_tokens: int = 0  # tokens whose KV is in the cache (sealed blocks + tail)
    codes: np.ndarray = field(default_factory=lambda: np.zeros(16, dtype=np.uint8))
    ids: np.ndarray = field(default_factory=lambda: np.zeros(16, dtype=np.int32))
    num_sealed: int = 0
    freed: bool = False
    #: prefix caching (``prefix.py``): the names of the sealed blocks so far (a prefix of the
    #: table; the chain stops where a block's tokens were not known), the names of the prompt's
    #: full blocks, and whether the records are the tokens' own (not a benchmark's random fill)
    names: list = field(default_factory=list)
    prompt_names: list = field(default_factory=list)
    #: the name the chain starts from (a cache salt's, ``prefix.salt_root``; None: unsalted)
    root: bytes | None = None
    cacheable: bool = True
    #: prompt blocks from here on are still to be sealed by this sequence (counted in the
    #: cache's pending names, so that a prompt that shares them waits for them)
    pending_from: int = 0
    _regions: tuple[Region, ...] = ()  # kept in step with codes, for the policies' SeqKV views

    def append(self, region: Region, block_id: int) -> None:
        if self.num_sealed == self.codes.size:
            self.codes = np.resize(self.codes, 2 * self.codes.size)
            self.ids = np.resize(self.ids, 2 * self.ids.size)
        self.codes[self.num_sealed] = REGION_CODES[region]
        self.ids[self.num_sealed] = block_id
        self.num_sealed += 1
        self._regions += (region,)

    def extend(self, blocks: list[tuple[Region, int]]) -> None:
        """:meth:`append` of several blocks at once (a cached prefix's), in one array write."""
        if not blocks:
            return
        end = self.num_sealed + len(blocks)
        if end > self.codes.size:
            size = max(end, 2 * self.codes.size)
            self.codes, self.ids = np.resize(self.codes, size), np.resize(self.ids, size)
        regions = tuple(r for r, _ in blocks)
        self.codes[self.num_sealed:end] = [REGION_CODES[r] for r in regions]
        self.ids[self.num_sealed:end] = [b for _, b in blocks]
        self.num_sealed = end
        self._regions += regions

    @property
    def sealed_codes(self) -> np.ndarray:
        return self.codes[:self.num_sealed]

    @property
    def sealed_ids(self) -> np.ndarray:
        return self.ids[:self.num_sealed]

    def regions(self) -> tuple[Region, ...]:
        return self._regions

    def set_region(self, index: int, region: Region, block_id: int) -> None:
        """Re-home one sealed block (the ``migrate`` baseline only)."""
        self.codes[index] = REGION_CODES[region]
        self.ids[index] = block_id
        self._regions = self._regions[:index] + (region,) + self._regions[index + 1:]

    def last_id(self, region: Region) -> int | None:
        sel = np.flatnonzero(self.sealed_codes == REGION_CODES[region])
        return int(self.sealed_ids[sel[-1]]) if sel.size else None

    def count(self, region: Region) -> int:
        return int((self.sealed_codes == REGION_CODES[region]).sum())
