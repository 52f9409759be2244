"""Where blocks are written and who attends them: the policy interface and the rule policies.

The cache asks its policy two questions, both pure data in, pure data out:

* :meth:`PlacementPolicy.place` -- when blocks of a sequence are about to be sealed (a prefill
  chunk's full blocks, or a full W tail), which region each goes to. Called once per sequence
  per step with all of that step's new blocks, in sequence order. The answer is final: the block
  is written there once and never moved.
* :meth:`PlacementPolicy.assign` -- each step, which of a sequence's sealed blocks the CPU attends
  (the rest, and the W tail, go to the GPU). Any answer is correct; it only changes speed.

:meth:`PlacementPolicy.observe` receives measured step timings (the planner's feedback hook).
:meth:`PlacementPolicy.migrations` exists for the ``migrate`` baseline only.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from .regions import Region


@dataclass(frozen=True)
class SeqKV:
    """A sequence's KV as the policy sees it."""

    seq_id: int
    num_tokens: int  # tokens in the cache once this step's writes are done
    regions: tuple[Region, ...]  # region of each sealed block so far, in order
    #: of its T blocks, how many other sequences hold too (prefix caching): they stream, once
    #: for all their holders (told in ``assign``; 0 elsewhere)
    shared_t: int = 0
    #: of its C blocks, how many other sequences hold too: the CPU reads each once for all its
    #: holders (``attention/shared_reads.py``; told in ``assign``; 0 elsewhere)
    shared_c: int = 0


@dataclass(frozen=True)
class CacheCapacity:
    """Free sealed-block slots per region at the time of the question."""

    free: dict[Region, int]
    block_size: int
    block_bytes: int


class PlacementPolicy(ABC):
    name: ClassVar[str] = ""

    @abstractmethod
    def place(self, seq: SeqKV, num_blocks: int, capacity: CacheCapacity) -> list[Region]:
        """Regions (G, T or C) for the next ``num_blocks`` sealed blocks of ``seq``."""

    def assign(self, seq: SeqKV) -> int | list[bool]:
        """Which sealed blocks the CPU attends this step. Either an int ``n``: the C blocks and the
        sequence's ``n`` oldest T blocks (read in place) -- the cheap form the cache applies with
        array operations; T blocks other sequences hold too (a prefix found by prefix caching)
        are left out of those ``n`` and streamed, once for all of them -- or one bool per sealed
        block (any assignment at all). Default: 0, exactly the C blocks."""
        return 0

    def observe(self, timing: dict[str, Any]) -> None:  # feedback hook; rule policies ignore it
        return None

    def note_shared(self, distinct_t_blocks: int, distinct_c_blocks: int = 0) -> None:
        """Told before each step's ``assign`` calls (policies with their own ``assign``): how
        many distinct T blocks, and C blocks, two or more of the step's sequences hold. The link
        moves each such T block once a step, and the CPU reads each such C block once, while
        every holder's ``SeqKV.shared_t`` / ``shared_c`` counts it."""
        return None

    def shared_t_to_cpu(self) -> int:
        """Asked after a step's ``assign`` calls where the CPU kernel reads a block several
        sequences hold once for all of them (``attention/shared_reads.py``): how many of the
        distinct T blocks two or more of the step's sequences hold (``note_shared``) the CPU
        reads in place, the oldest first, for every holder. Default 0: they stream."""
        return 0

    def admit(self, seq_id: int, prompt_tokens: int) -> None:
        """A sequence joined the cache, its prompt ``prompt_tokens`` long (0: not said); none of
        its blocks is placed yet. A planner may place the blocks of a prefill against the batch
        as it will be once every admitted prompt is in."""
        return None

    def release(self, seq_id: int) -> None:
        """A sequence left the cache (finished or aborted): its blocks are free again."""
        return None

    def expect(self, queued: dict[int, int]) -> None:
        """The waiting requests the scheduler would admit next, as ``seq_id -> prompt tokens``
        (those that fit the free blocks and the batch, in order), told before each step's
        placement; replaces the last call's. A prompt prefilled while the next one waits would
        otherwise be placed for a batch without it."""
        return None

    def migrations(self, seqs: list[SeqKV], capacity: CacheCapacity) -> list[tuple[int, int, Region]]:
        """Sealed blocks to move before this step, as ``(seq_id, block_index, new_region)``.

        Only the ``migrate`` baseline (a NEO-style one-state cache that rebalances by moving data)
        returns anything: every writescope policy and every rule policy leaves blocks where they
        were written. Moved bytes are counted in ``kv.bytes_moved_after_placement``."""
        return []

    @property
    def moves_blocks(self) -> bool:
        """Whether this policy overrides :meth:`migrations` (may move sealed blocks)."""
        return type(self).migrations is not PlacementPolicy.migrations

    def stats(self) -> dict[str, Any]:
        return {}


def cpu_mask(regions: tuple[Region, ...], assignment: int | list[bool]) -> list[bool]:
    """An :meth:`PlacementPolicy.assign` answer as one bool per sealed block (True = the CPU
    attends it). The cache does the same with array operations."""
    if not isinstance(assignment, int):
        return [bool(x) for x in assignment]
    out, left = [], assignment
    for r in regions:
        take = r is Region.C or (r is Region.T and left > 0)
        left -= r is Region.T and take
        out.append(take)
    return out


def fill_then_split(seq: SeqKV, num_blocks: int, capacity: CacheCapacity, cpu_share: float
                    ) -> list[Region]:
    """G while it has room; of the rest, C until the sequence's spilled blocks reach ``cpu_share``
    in C (so C holds a prefix of the spill), then T. Falls back to whichever host region has room."""
    free = dict(capacity.free)
    spilled = [r for r in seq.regions if r is not Region.G]
    n_c = sum(r is Region.C for r in spilled)
    n_spilled = len(spilled)
    g_take = min(num_blocks, free.get(Region.G, 0))
    out = [Region.G] * g_take
    rest = num_blocks - g_take
    total_spilled = n_spilled + rest
    want_c = max(0, math.floor(cpu_share * total_spilled + 1e-9) - n_c)
    if cpu_share >= 1.0:
        want_c = rest
    for _ in range(rest):
        prefer = Region.C if want_c > 0 else Region.T
        other = Region.T if prefer is Region.C else Region.C
        r = prefer if free.get(prefer, 0) > 0 else other
        if free.get(r, 0) <= 0:
            raise MemoryError("no free KV block in any region")  # the cache checks capacity first
        free[r] -= 1
        if r is Region.C:
            want_c -= 1
        out.append(r)
    return out


class StaticPolicy(PlacementPolicy):
    """A fixed CPU fraction of each sequence's spilled blocks, chosen once."""

    name = "static"

    def __init__(self, cpu_share: float = 0.5, **_: Any):
        if not 0.0 <= cpu_share <= 1.0:
            raise ValueError(f"cpu_share must be in [0, 1], got {cpu_share}")
        self.cpu_share = float(cpu_share)

    def place(self, seq: SeqKV, num_blocks: int, capacity: CacheCapacity) -> list[Region]:
        return fill_then_split(seq, num_blocks, capacity, self.cpu_share)

    def stats(self) -> dict[str, Any]:
        return {"planner.cpu_share": self.cpu_share}


class TransferPolicy(StaticPolicy):
    """Everything spilled goes to T and is streamed to the GPU."""

    name = "transfer"

    def __init__(self, **_: Any):
        super().__init__(0.0)


class CpuPolicy(StaticPolicy):
    """Everything spilled goes to C and is attended by the CPU."""

    name = "cpu"

    def __init__(self, **_: Any):
        super().__init__(1.0)


POLICIES: dict[str, type[PlacementPolicy]] = {}


def register_policy(cls: type[PlacementPolicy]) -> type[PlacementPolicy]:
    POLICIES[cls.name] = cls
    return cls


for _cls in (StaticPolicy, TransferPolicy, CpuPolicy):
    register_policy(_cls)


def check_policy_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a registered KV policy."""
    if name not in POLICIES:
        # policies that live elsewhere (the planner) register themselves on import
        try:
            from .. import planner  # noqa: F401
        except ImportError:
            pass
    if name not in POLICIES:
        raise ValueError(f"unknown kv_policy {name!r}; choose one of {sorted(POLICIES)}")


def make_policy(name: str, **options: Any) -> PlacementPolicy:
    check_policy_name(name)
    return POLICIES[name](**options)


from . import migrate  # noqa: E402,F401  (registers the "migrate" baseline policy)
