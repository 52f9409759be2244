"""Automatic prefix caching: a sealed block found again by the tokens that made it.

A sealed block's records depend only on its tokens and the tokens before it (the same weights,
the same positions), so a block is named by a hash chained over its sequence: the hash of its
predecessor's name and its own token ids. A sequence that is admitted with a prompt whose
leading blocks have names the cache knows starts with those blocks in its table and prefills
only the rest (vLLM's automatic prefix caching, one full block at a time).

This fits the InplaceKVCache without moving a byte: a block keeps the home it was written to, in
whichever region, and a second sequence only reads it there (its own new blocks are placed by
the policy as usual). What this module keeps:

* the names of registered blocks, and how many sequences use each;
* registered blocks no sequence uses any more, per region, oldest first: they still count as
  free (the cache reclaims them, oldest first, when a region runs out of free ids) until then a
  prompt that starts with them reuses them.

Blocks are registered when sealed if all their tokens are prompt tokens (known when the request
arrives), and when their sequence leaves the cache for the rest (decode blocks: their tokens
are then all known on the host, also after overlapped decode steps). A block whose name is
already registered (two sequences prefilled the same prompt at once) stays private and is
freed with its sequence. A sequence's partial last block is kept apart, in its W slot
(``tails.py``).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .regions import Region, SEALED_REGIONS
from .tails import TailMatch

BlockRef = tuple[Region, int]  # (region, block id)


def salt_root(cache_salt: str | None) -> bytes | None:
    """The name a salted sequence's block chain starts from (vLLM's ``cache_salt``: prompts
    with different salts share no cached block, the same salt shares as unsalted ones do);
    None: unsalted."""
    if cache_salt is None:
        return None
    return hashlib.blake2b(b"cache_salt\0" + cache_salt.encode(), digest_size=16).digest()


def block_hashes(token_ids, block_size: int, parent: bytes | None = None,
                 limit: int | None = None) -> list[bytes]:
    """Names of the full blocks of ``token_ids`` (at most ``limit``), chained from ``parent``
    (the name of the block before the first one; None: the first block of a sequence)."""
    n = len(token_ids) // block_size
    if limit is not None:
        n = min(n, limit)
    if n <= 0:
        return []
    toks = np.asarray(token_ids[:n * block_size], dtype=np.int64).reshape(n, block_size)
    out, prev = [], parent or b""
    for row in toks:
        prev = hashlib.blake2b(prev + row.tobytes(), digest_size=16).digest()
        out.append(prev)
    return out


@dataclass
class PrefixMatch:
    """The cached blocks a prompt can start from (its longest registered prefix)."""

    blocks: list[BlockRef] = field(default_factory=list)
    #: how many of them no sequence uses now: taking them removes them from the free pool
    unused: int = 0
    #: a kept partial block that continues them (``tails.py``), or None
    tail: TailMatch | None = None

    def __len__(self) -> int:
        return len(self.blocks)


class PrefixCache:
    """Registered blocks by name, their users, and the unused ones in reclaim order."""

    def __init__(self, block_size: int):
        self.bs = block_size
        self.by_name: dict[bytes, BlockRef] = {}
        self.name_of: dict[BlockRef, bytes] = {}
        self.users: dict[BlockRef, int] = {}
        #: registered blocks with no user, per region, oldest first (reclaimed in this order)
        self.unused: dict[Region, OrderedDict[int, None]] = {r: OrderedDict() for r in SEALED_REGIONS}
        self.counters = {"prefix.queried_tokens": 0, "prefix.hit_tokens": 0,
                         "prefix.reclaimed_blocks": 0}
        #: per region, the ids of registered blocks two or more sequences hold now: a step's
        #: plan streams such T blocks (``attention/staging.py`` moves a shared block once) and
        #: counts them once on the link
        self.shared_ids: dict[Region, set[int]] = {r: set() for r in SEALED_REGIONS}

    @property
    def shared(self) -> int:
        """How many registered blocks two or more sequences hold now."""
        return sum(len(v) for v in self.shared_ids.values())

    def shared_in(self, region: Region) -> np.ndarray | None:
        """The ids of ``region``'s blocks two or more sequences hold now (int64, in no order:
        the step plan flags them per id), or None when there are none."""
        ids = self.shared_ids[region]
        return np.fromiter(ids, np.int64, len(ids)) if ids else None

    # ------------------------------------------------------------------ lookup
    def match(self, names: list[bytes], max_blocks: int) -> PrefixMatch:
        """The longest run of ``names`` (from the first) that is registered, at most
        ``max_blocks`` long. Changes nothing."""
        m = PrefixMatch()
        find, users, blocks = self.by_name.get, self.users, m.blocks
        for name in names[:max(0, max_blocks)]:
            ref = find(name)
            if ref is None:
                break
            blocks.append(ref)
        m.unused = sum(users[ref] == 0 for ref in blocks)
        return m

    def acquire(self, match: PrefixMatch) -> None:
        """A sequence starts from ``match``'s blocks: each gets one more user."""
        self.counters["prefix.hit_tokens"] += len(match) * self.bs
        users, unused, shared = self.users, self.unused, self.shared_ids
        for ref in match.blocks:
            n = users[ref]
            if n == 0:
                del unused[ref[0]][ref[1]]
            elif n == 1:
                shared[ref[0]].add(ref[1])
            users[ref] = n + 1

    # ------------------------------------------------------------------ registration
    def register(self, name: bytes, ref: BlockRef) -> bool:
        """Name a block its sequence holds (one user). False when the name is taken (another
        block has the same tokens) or the block is registered already: it stays as it was."""
        if name in self.by_name or ref in self.name_of:
            return False
        self.by_name[name] = ref
        self.name_of[ref] = name
        self.users[ref] = 1
        return True

    def registered(self, ref: BlockRef) -> bool:
        return ref in self.name_of

    def release(self, ref: BlockRef) -> bool:
        """A sequence leaves a block. True: the block is not registered, the caller frees it;
        False: it stays registered (used by others, or unused and reclaimable)."""
        n = self.users.get(ref)
        if n is None:
            return True
        if n <= 0:
            raise RuntimeError(f"prefix cache: block {ref} released more often than used")
        self.users[ref] = n - 1
        if n == 2:
            self.shared_ids[ref[0]].discard(ref[1])
        if n == 1:
            self.unused[ref[0]][ref[1]] = None
        return False

    # ------------------------------------------------------------------ reclaiming
    def num_unused(self, region: Region) -> int:
        return len(self.unused[region])

    def reclaim(self, region: Region, k: int) -> list[int]:
        """Forget up to ``k`` unused blocks of ``region``, oldest first; their ids, for the
        caller to free."""
        out = []
        pool = self.unused[region]
        while pool and len(out) < k:
            bid, _ = pool.popitem(last=False)
            ref = (region, bid)
            del self.by_name[self.name_of.pop(ref)]
            del self.users[ref]
            out.append(bid)
        self.counters["prefix.reclaimed_blocks"] += len(out)
        return out

    def stats(self) -> dict:
        s = dict(self.counters)
        q = s["prefix.queried_tokens"]
        s["prefix.hit_rate"] = s["prefix.hit_tokens"] / q if q else 0.0
        s["prefix.registered_blocks"] = len(self.name_of)
        s["prefix.shared_blocks"] = self.shared
        s.update({f"prefix.unused_blocks.{r}": len(p) for r, p in self.unused.items()})
        return s
