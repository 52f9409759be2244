"""Partial last blocks kept after their sequences end: prefix caching below a block's size.

Prefix caching (``prefix.py``) finds sealed blocks only: a prompt that extends a finished
sequence recomputes that sequence's last, partial block -- up to ``block_size - 1`` tokens. A
beam search step re-adds every beam as a request whose prompt is its parent's tokens and one
more (engine/beam.py), and the next turn of a conversation extends the last one's tokens, so
both would recompute that partial block every time: with 64-token blocks, 32 tokens a beam a
step on average where a decode step computes one.

So when a sequence whose tokens are known leaves the cache with a partial tail in its W slot
(the GPU write tail), the slot is kept, named by the name of the sealed block before it (its
chain's root for a tail that is the whole sequence) and the tail's tokens. A sequence admitted
with a prompt that continues that block with those tokens, or with the first few of them (a
next turn whose template drops the last answer's thinking; a prompt equal to what a request
showed after it stopped, which must leave its last token to compute), copies those records
into its own W slot (``InplaceKVCache.add_sequence``: one copy over every layer, on the device)
and prefills only what follows. Only those first records are its: where it takes the kept slot
itself over, the tail's later records stay in it until its own overwrite them, never read (a
sequence's token count bounds what is read of its slot). Kept tails are free slots to
everything else: the least recently used one is given back whenever a sequence needs a W slot
and none is free, so keeping them never refuses or delays a request. Nothing here touches
tensors.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

TailKey = tuple[bytes | None, tuple[int, ...]]  # (the name of the block before it, its tokens)


@dataclass(frozen=True)
class TailMatch:
    """A kept tail a prompt starts from: its W slot, and how many of its records (its first
    ``tokens``) the prompt shares."""

    key: TailKey
    slot: int
    tokens: int


class TailCache:
    """Kept tails by key, least recently used first; at most one slot per key."""

    def __init__(self) -> None:
        self._slots: OrderedDict[TailKey, int] = OrderedDict()
        self._by_parent: dict[bytes | None, set[tuple[int, ...]]] = {}
        self.counters = {"prefix.tail_hit_tokens": 0, "prefix.tails_kept": 0}

    def __len__(self) -> int:
        return len(self._slots)

    def keep(self, parent: bytes | None, tokens: list[int], slot: int) -> int | None:
        """Keep ``slot`` as the tail ``tokens`` after block ``parent``; returns the slot to free
        instead (the same tail is kept already: the slot it has stays)."""
        key = (parent, tuple(tokens))
        if key in self._slots:
            self._slots.move_to_end(key)
            return slot
        self._slots[key] = slot
        self._by_parent.setdefault(parent, set()).add(key[1])
        self.counters["prefix.tails_kept"] += 1
        return None

    def find(self, parent: bytes | None, following: list[int], most: int) -> TailMatch | None:
        """The kept tail after block ``parent`` that shares the longest start with
        ``following``, and how many of its records that start is (at most ``most``: a prompt
        leaves its last token to compute). A prompt that goes another way after some of a
        tail's tokens -- the next turn of a conversation whose template drops the last answer's
        thinking -- still starts from the records before that."""
        best, best_n = None, 0
        for toks in self._by_parent.get(parent, ()):
            n = 0
            for a, b in zip(toks, following[:most]):
                if a != b:
                    break
                n += 1
            if n > best_n:
                best, best_n = toks, n
        if best is None:
            return None
        key = (parent, best)
        self._slots.move_to_end(key)
        return TailMatch(key, self._slots[key], best_n)

    def take(self, key: TailKey) -> int:
        """Stop keeping ``key``'s tail; its slot (now the caller's)."""
        slot = self._slots.pop(key)
        toks = self._by_parent[key[0]]
        toks.discard(key[1])
        if not toks:
            del self._by_parent[key[0]]
        return slot

    def evict(self, spare: TailKey | None = None) -> int | None:
        """Give back the least recently used tail's slot (not ``spare``'s); None if none."""
        for key in self._slots:
            if key != spare:
                return self.take(key)
        return None

    def clear(self) -> list[int]:
        """Give back every kept slot."""
        slots = list(self._slots.values())
        self._slots.clear()
        self._by_parent.clear()
        return slots
