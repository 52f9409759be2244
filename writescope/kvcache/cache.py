"""InplaceKVCache: every block gets its home once, when it is written, and is never moved.

Life of a step (the runner drives it; the model only calls :meth:`attention`):

1. :meth:`begin_step` with each scheduled sequence's new-token range. For every block that becomes
   full this step the placement policy picks G, T or C and an id is allocated (T ids as
   contiguous runs). The policy's :meth:`assign` decides which sealed blocks the CPU attends; the
   cache turns that into an :class:`AttentionStepPlan` (per side, per region, a CSR
   :class:`BlockBatch`) and precomputes every index the layer writes need. All of this is array
   work over sequences; nothing here loops over blocks in Python.
2. :meth:`attention` per layer: the plan's partial over cached blocks (CPU and GPU sides, see
   ``attention/hybrid.py``), the causal partial over the step's own tokens, one LSE merge (a
   prefill chunk of more than ``PREFILL_GPU_ROWS`` tokens is not in the plan: its context is
   gathered, ``kvcache/context.py``, and attended in one fused causal kernel,
   ``attention/prefill.py``); then
   the layer's new records are written: blocks completed this step straight to their region
   (C re-laid-out for the CPU on arrival), the rest appended to the sequence's W tail.
3. :meth:`end_step`: blocks written this step become sealed; counters and timings are updated
   and the policy observes the step.

Invariants (checked in tests, visible in :meth:`stats`): ``kv.bytes_moved_after_placement`` stays
0 (there is no code path that copies a sealed block); device bytes <= the VRAM share given to the
cache, pinned bytes <= pinned budget; any CPU/GPU assignment gives the same attention output.
"""
from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..attention.groups import AttentionStepPlan
from ..attention.hybrid import HybridAttention
from ..attention.merge import merge
from ..attention.prefill import causal_prefix_attention
from ..attention.resident import ResidentAttention
from ..attention.selfattn import causal_self_attention
from ..attention.selfmerge import decode_self_merge
from ..attention.staging import stage_shared
from ..core import RequestTooLargeError
from ..hostmem import h2d
from .context import gather_context
from .placement import CacheCapacity, PlacementPolicy, SeqKV
from .pools import BlockAllocator, ExtentAllocator, KVCacheError, allocate_pool
from .prefix import PrefixCache, PrefixMatch, block_hashes, salt_root
from .tails import TailCache
from .step_plan import build_step_plan
from .subbatches import step_groups
from .regions import DEVICE_REGIONS, KVSpec, Region, block_records, to_cpu_layout
from .resident_steps import ResidentSteps
from .table import CODE_REGIONS, SeqTable

#: ``_release_blocks``: a sequence whose tokens do not name all its sealed blocks
_UNNAMED = object()


@dataclass
class CacheLayout:
    """How many blocks each region holds (sized by the engine from the budgets)."""

    block_size: int
    num_blocks: dict[Region, int]  # G, T, C sealed blocks; W = number of tail slots

    def bytes(self, spec: KVSpec) -> dict[Region, int]:
        bb = spec.block_bytes(self.block_size)
        return {r: n * bb for r, n in self.num_blocks.items()}


#: a sequence with more new tokens than this in a step (a prefill chunk) has every cached block
#: attended by the GPU: many query rows per cached byte make that attention compute-bound, where
#: the GPU is two orders of magnitude faster than the CPU (C blocks reach it through
#: ``attention/gather.py``, a read). Decode-sized rows follow the policy's CPU/GPU assignment.
PREFILL_GPU_ROWS = 16


def dense_prefill_default() -> bool:
    """Prefill chunks attend their context with the fused dense kernel (``attention/prefill.py``)
    unless ``WRITESCOPE_DENSE_PREFILL=0`` (then the paged kernels run them like decode rows)."""
    return os.environ.get("WRITESCOPE_DENSE_PREFILL", "1") != "0"


def g_blocks_on_device() -> bool:
    """``WRITESCOPE_G_BLOCKS_ON_DEVICE``: ``1`` (the default) -- a decode step whose new blocks
    all go to G may be resident (the token to its W slot, the slot copied to the block at the
    step's end) and deferred; ``0`` -- a step that completes any block is neither, as before
    the sixty-fourth session (for A/B runs)."""
    return os.environ.get("WRITESCOPE_G_BLOCKS_ON_DEVICE", "1").strip().lower() not in (
        "0", "off", "false", "no")


def _self_segments(seg_lens: list[int], prefill: list) -> list[int]:
    """The self partial's segments: dense-prefill chunks become single-token segments."""
    if not prefill:
        return seg_lens
    dense = {r0 for r0, _, _ in prefill}
    out, row = [], 0
    for n in seg_lens:
        out.extend([1] * n if row in dense else [n])
        row += n
    return out


def _w_positions(runs: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The step's rows and W slots (flat token indices) of the tokens written to W: ``runs`` has
    per sequence ``(first position, count, slot offset, row offset)``, each token's slot being
    its position plus the slot offset and its row its position plus the row offset."""
    if not runs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    first, count, slot_off, row_off = np.array(runs, np.int64).T
    if (count == 1).all():  # a decode step: one token each
        return first + row_off, first + slot_off
    run_start = np.cumsum(count) - count  # each run's first index in the flat result
    pos = np.arange(int(count.sum()), dtype=np.int64) + np.repeat(first - run_start, count)
    return pos + np.repeat(row_off, count), pos + np.repeat(slot_off, count)


class InplaceKVCache(ResidentSteps):
    def __init__(self, spec: KVSpec, layout: CacheLayout, policy: PlacementPolicy,
                 device: torch.device | str, scale: float, cpu_threads: int | None = None,
                 staging_bytes: int | None = None, prefill_gpu_rows: int | None = PREFILL_GPU_ROWS,
                 dense_prefill: bool | None = None, prefix_caching: bool = False):
        if prefix_caching and policy.moves_blocks:
            raise ValueError(f"prefix caching cannot run with the {policy.name!r} policy: it moves "
                             "sealed blocks, which other sequences may share")
        self.spec = spec
        self.bs = layout.block_size
        self.layout = layout
        self.policy = policy
        self.device = torch.device(device)
        self.scale = scale
        self.block_bytes = spec.block_bytes(self.bs)
        self.pools: dict[Region, torch.Tensor] = {
            r: allocate_pool(r, spec, max(n, 0), self.bs, self.device)
            for r, n in layout.num_blocks.items()}
        self.alloc: dict[Region, BlockAllocator] = {
            Region.G: BlockAllocator(layout.num_blocks[Region.G], "G"),
            Region.T: ExtentAllocator(layout.num_blocks[Region.T], "T"),
            Region.C: BlockAllocator(layout.num_blocks[Region.C], "C"),
            Region.W: BlockAllocator(layout.num_blocks[Region.W], "W"),
        }
        # On a CPU-only device both sides are CPU work on the same cores: the CPU side runs on
        # the calling thread. A worker thread would run the kernel in a second OpenMP team, and
        # libgomp, once its teams hold more threads than there are cores, makes every team's
        # idle members sleep after ~100 spins instead of ~300,000: each of the forward's
        # parallel ops then waits for its members to be woken. On the 2-core dev VM that gave
        # writescope 23-28 decode tok/s against transfer's 44-46 with the same placement and
        # CPU share 0 (the team, made by the warm-up, stays; bench/results/2026-12-04c-devbox).
        self.hybrid = HybridAttention(self.pools, spec, self.device, cpu_threads, staging_bytes,
                                      cpu_async=self.device.type != "cpu")
        #: decode steps whose cached KV is all on the GPU, through fixed buffers that a CUDA
        #: graph holds (attention/resident.py); made with the first such step
        self.resident: ResidentAttention | None = None
        #: the same per sub-batch of a pipelined step (:meth:`attend_resident` with a group)
        self.resident_groups: list[ResidentAttention] = []
        self.prefill_gpu_rows = prefill_gpu_rows  # None: the policy assigns prefill rows too
        #: prefill chunks (more than ``prefill_gpu_rows`` new tokens) attend their whole context
        #: in one fused causal kernel instead of the paged path
        self.dense_prefill = (dense_prefill_default() if dense_prefill is None else dense_prefill) \
            and prefill_gpu_rows is not None
        self.seqs: dict[int, SeqTable] = {}
        #: automatic prefix caching (``prefix.py``); None when off
        self.prefix = PrefixCache(self.bs) if prefix_caching else None
        #: partial last blocks of sequences gone, kept in their W slots (``tails.py``)
        self.tails = TailCache() if prefix_caching else None
        #: names of prompt blocks that running sequences will seal (and register)
        self._pending: Counter = Counter()
        self.reserved = 0  # blocks promised to admitted sequences, not yet sealed
        self.counters = {f"kv.bytes_written.{r}": 0 for r in Region}
        self.counters["kv.pipelined_steps"] = 0
        self.counters["kv.resident_steps"] = 0
        self.counters["kv.blocks_sealed_from_w"] = 0
        self.counters.update({"kv.bytes_read.gpu": 0, "kv.bytes_read.cpu": 0,
                              "kv.bytes_moved_after_placement": 0, "kv.steps": 0,
                              "kv.dense_prefill_rows": 0, "kv.filled_tokens": 0})
        self._step = None
        self.last_timing: dict = {}

    # ------------------------------------------------------------------ capacity and admission
    @property
    def sealed_capacity(self) -> int:
        return sum(self.layout.num_blocks[r] for r in (Region.G, Region.T, Region.C))

    def blocks_for(self, num_tokens: int) -> int:
        """Sealed blocks a sequence of ``num_tokens`` tokens can need (its tail stays in W)."""
        return num_tokens // self.bs

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) <= self.sealed_capacity and self.layout.num_blocks[Region.W] > 0

    def free_sealed(self) -> int:
        """Sealed-block slots that can be taken now (with prefix caching, also the registered
        blocks no sequence uses: they are reclaimed when needed)."""
        return sum(self._free(r) for r in (Region.G, Region.T, Region.C))

    def _free(self, region: Region) -> int:
        n = self.alloc[region].num_free
        return n + self.prefix.num_unused(region) if self.prefix is not None else n

    def _reclaim(self, region: Region, want: int) -> None:
        """Make ``want`` ids of ``region`` free, forgetting unused cached blocks if needed."""
        short = want - self.alloc[region].num_free
        if short > 0 and self.prefix is not None:
            self.alloc[region].free(self.prefix.reclaim(region, short))

    def free_slots(self) -> int:
        """Sequences that can still join (each holds one W tail slot; the slots of kept tails
        are given back when needed)."""
        return self.alloc[Region.W].num_free + (len(self.tails) if self.tails is not None else 0)

    def can_admit(self, num_tokens: int, prefix: PrefixMatch | None = None) -> bool:
        """Whether a sequence of up to ``num_tokens`` tokens fits now; ``prefix``: the cached
        blocks it would start from (:meth:`match_prefix`), which it does not need anew."""
        need = self.blocks_for(num_tokens)
        if prefix is not None:  # unused cached blocks it takes leave the free pool
            need += prefix.unused - len(prefix)
        return self.free_slots() > 0 and need <= self.free_sealed() - self.reserved

    def prefix_names(self, token_ids, cache_salt: str | None = None) -> list[bytes] | None:
        """The names of a prompt's full blocks (``prefix.py``; chained from its
        ``cache_salt``'s root, if any); None without prefix caching."""
        return None if self.prefix is None else block_hashes(token_ids, self.bs,
                                                             parent=salt_root(cache_salt))

    def extend_prefix_names(self, names: list[bytes] | None, token_ids,
                            cache_salt: str | None = None) -> list[bytes] | None:
        """:meth:`prefix_names` of ``token_ids`` given ``names``, those of a prefix of them
        (None or []: none): only the blocks after those are hashed (a beam's, a step after
        its parent's). None without prefix caching."""
        if self.prefix is None:
            return None
        names = names or []
        full = len(token_ids) // self.bs
        if full == len(names):  # no block completed: the same names (never changed in place)
            return names
        if full < len(names):
            return names[:full]
        parent = names[-1] if names else salt_root(cache_salt)
        return names + block_hashes(token_ids[len(names) * self.bs:full * self.bs], self.bs,
                                    parent=parent)

    def match_prefix(self, names: list[bytes] | None, prompt_tokens: int, token_ids=None,
                     cache_salt: str | None = None) -> PrefixMatch | None:
        """The cached blocks a prompt of ``prompt_tokens`` tokens with block names ``names``
        can start from: its longest registered prefix, leaving at least its last token to be
        computed (its logits sample the first output token). With the prompt's ``token_ids``
        (and ``cache_salt``), also a kept partial block that continues that prefix
        (``tails.py``). None without prefix caching, or for a prompt with neither full blocks
        nor a kept tail to start from."""
        if self.prefix is None:
            return None
        m = self.prefix.match(names or [], (prompt_tokens - 1) // self.bs)
        if token_ids is not None and len(self.tails):
            start = len(m) * self.bs
            most = min(self.bs - 1, prompt_tokens - 1 - start)
            parent = names[len(m) - 1] if len(m) else salt_root(cache_salt)
            if most > 0:
                m.tail = self.tails.find(parent, token_ids[start:start + most], most)
        return m if names or m.tail is not None else None

    def prefix_pending(self, names: list[bytes] | None, prefix: PrefixMatch | None,
                       prompt_tokens: int) -> bool:
        """Whether the block after a prompt's cached prefix is being prefilled by a running
        sequence (the same tokens): admitted a step or so later, the prompt would start from it
        too. (Sequences admitted in one step share nothing: each attends its cached blocks
        before the step writes its own.)"""
        k = len(prefix) if prefix is not None else 0
        return (self.prefix is not None and bool(names) and k < (prompt_tokens - 1) // self.bs
                and self._pending[names[k]] > 0)

    def _unpend(self, t: SeqTable, upto: int | None = None) -> None:
        """``t``'s prompt blocks before ``upto`` (default: all) are no longer to be sealed."""
        end = len(t.prompt_names) if upto is None else min(upto, len(t.prompt_names))
        for name in t.prompt_names[t.pending_from:end]:
            self._pending[name] -= 1
            if self._pending[name] <= 0:
                del self._pending[name]
        t.pending_from = max(t.pending_from, end)

    def add_sequence(self, seq_id: int, max_tokens: int, prompt_tokens: int | None = None,
                     prefix: PrefixMatch | None = None, prompt_names: list[bytes] | None = None,
                     cache_salt: str | None = None) -> int:
        """Admit a sequence that may grow to ``max_tokens`` tokens; reserves its blocks.
        ``prompt_tokens``: its prompt's length, told to the placement policy
        (:meth:`PlacementPolicy.admit`). With prefix caching, ``prefix``: cached blocks it starts
        from (they join its table, shared), and ``prompt_names``: its prompt's block names (its
        own prompt blocks are registered under them as they are sealed; ``cache_salt``: the
        salt they were named with, which its later blocks' names chain from too); a kept
        tail the prefix match found (``prefix.tail``) is copied into its W slot.

        Returns the tokens already in the cache (``len(prefix) * block_size``, and the kept
        tail's): its prefill starts there. Raises :class:`RequestTooLargeError` if it can never fit and
        :class:`KVCacheError` if it does not fit now (the scheduler checks :meth:`can_admit`
        first and keeps it waiting)."""
        if seq_id in self.seqs:
            raise KVCacheError(f"sequence {seq_id} is already in the cache")
        if not self.can_ever_fit(max_tokens):
            raise RequestTooLargeError(
                f"a sequence of {max_tokens} tokens needs {self.blocks_for(max_tokens)} KV blocks of "
                f"{self.bs} tokens; the budgets hold {self.sealed_capacity}")
        if prefix is not None and (self.prefix is None or len(prefix) * self.bs >= max_tokens):
            raise KVCacheError("a cached prefix given without prefix caching, or as long as the "
                               "sequence")
        if not self.can_admit(max_tokens, prefix):
            raise KVCacheError("not enough free KV blocks now; admit it later")
        need = self.blocks_for(max_tokens) - (len(prefix) if prefix else 0)
        tail = prefix.tail if prefix is not None else None
        slot = self._w_slot(tail)
        self.reserved += need
        t = SeqTable(seq_id, slot, need)
        if self.prefix is not None:
            t.root = salt_root(cache_salt)
            t.prompt_names = list(prompt_names or ())
            if prompt_names is not None:
                self.prefix.counters["prefix.queried_tokens"] += int(prompt_tokens or 0)
            if prefix:
                self.prefix.acquire(prefix)
                t.extend(prefix.blocks)
                t.names = t.prompt_names[:len(prefix)]
                t.num_tokens = len(prefix) * self.bs
            if tail is not None:  # the kept tail's records start this sequence's W slot
                if slot != tail.slot:
                    w = self.pools[Region.W]
                    w[:, slot, :tail.tokens].copy_(w[:, tail.slot, :tail.tokens])
                t.num_tokens += tail.tokens
                self.prefix.counters["prefix.hit_tokens"] += tail.tokens
                self.tails.counters["prefix.tail_hit_tokens"] += tail.tokens
            t.pending_from = len(t.names)
            self._pending.update(t.prompt_names[t.pending_from:])
        self.seqs[seq_id] = t
        self.policy.admit(seq_id, int(prompt_tokens or 0))
        return t.num_tokens

    def _w_slot(self, tail) -> int:
        """A W slot for a new sequence: a free one, else a kept tail's (the least recently
        used other than ``tail``, the one it starts from; that one itself, taken over, when it
        is the only one: then nothing needs copying)."""
        if self.alloc[Region.W].num_free == 0 and self.tails is not None:
            spare = tail.key if tail is not None else None
            freed = self.tails.evict(spare)
            if freed is None and tail is not None:
                return self.tails.take(tail.key)
            if freed is not None:
                self.alloc[Region.W].free([freed])
        (slot,) = self.alloc[Region.W].alloc(1)
        return slot

    def expect_waiting(self, queued: dict[int, int]) -> None:
        """The scheduler's queue head that fits (``seq_id -> prompt tokens``), for the
        placement policy (:meth:`PlacementPolicy.expect`)."""
        self.policy.expect(dict(queued))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``), returning them to the free
        pools; only while no sequence is in the cache (a sequence's blocks may be shared), else
        False and nothing changes. True without prefix caching (nothing is cached)."""
        if self.prefix is None:
            return True
        if self.seqs:
            return False
        for r in CODE_REGIONS.values():
            self.alloc[r].free(self.prefix.reclaim(r, self.prefix.num_unused(r)))
        self.alloc[Region.W].free(self.tails.clear())
        return True

    def free_sequence(self, seq_id: int, token_ids=None) -> None:
        """The sequence leaves the cache; its blocks are free again. With prefix caching,
        ``token_ids``: the tokens whose records it holds (prompt then output tokens, at least up
        to its last sealed block): its sealed blocks not yet registered are registered under
        their names, and its registered blocks stay cached while no one needs their room."""
        t = self.seqs.pop(seq_id, None)
        if t is None:
            raise KVCacheError(f"sequence {seq_id} is not in the cache (freed twice?)")
        t.freed = True
        self._unpend(t)
        if self.prefix is None:
            for code, region in CODE_REGIONS.items():
                ids = t.sealed_ids[t.sealed_codes == code]
                self.alloc[region].free(ids.tolist())
            self.alloc[Region.W].free([t.w_slot])
        else:
            parent = self._release_blocks(t, token_ids)
            k = t.num_tokens - t.num_sealed * self.bs
            kept = parent is not _UNNAMED and 0 < k and len(token_ids) >= t.num_tokens
            if not kept or self.tails.keep(parent, token_ids[t.num_sealed * self.bs:
                                                              t.num_tokens], t.w_slot) is not None:
                self.alloc[Region.W].free([t.w_slot])
        self.reserved -= t.reserved_blocks
        self.policy.release(seq_id)

    def _release_blocks(self, t: SeqTable, token_ids):
        """Prefix caching's half of :meth:`free_sequence`: register the sequence's remaining
        sealed blocks by its tokens, then leave every block, the last first (so that unused
        blocks are reclaimed from the ends of prefixes, keeping their starts longest).
        Returns the name of its last sealed block (its chain's root when it has none), or
        ``_UNNAMED`` where its tokens do not name every sealed block."""
        k0 = len(t.names)
        last = _UNNAMED
        if t.cacheable and token_ids is not None:
            n = min(t.num_sealed, len(token_ids) // self.bs)
            last = t.names[-1] if k0 else t.root
            if n > k0:
                new = block_hashes(token_ids[k0 * self.bs:n * self.bs], self.bs, parent=last)
                for b, name in enumerate(new, start=k0):
                    self.prefix.register(name, (CODE_REGIONS[int(t.codes[b])], int(t.ids[b])))
                last = new[-1]
            if n < t.num_sealed:
                last = _UNNAMED
        free: dict[Region, list[int]] = {r: [] for r in CODE_REGIONS.values()}
        release, regions = self.prefix.release, CODE_REGIONS
        for code, bid in zip(reversed(t.sealed_codes.tolist()), reversed(t.sealed_ids.tolist())):
            region = regions[code]
            if release((region, bid)):
                free[region].append(bid)
        for r, ids in free.items():
            self.alloc[r].free(ids)
        return last

    def num_tokens(self, seq_id: int) -> int:
        return self._table(seq_id).num_tokens

    def _table(self, seq_id: int) -> SeqTable:
        t = self.seqs.get(seq_id)
        if t is None:
            raise KVCacheError(f"sequence {seq_id} is not in the cache (freed or never added)")
        return t

    # ------------------------------------------------------------------ the step
    def begin_step(self, work: list[tuple[int, int, int]], pipeline: bool = False,
                   resident_rows: int | None = None, split_experts: bool = False,
                   group_rows: Callable[[int], int | None] | None = None,
                   split_spilled: bool = False) -> None:
        """``work``: per scheduled sequence ``(seq_id, start, num_new)``, in batch order.

        ``pipeline``: the caller can run a decode step as two interleaved sub-batches
        (``engine/graphs.pipelined_pieces``); the step is then planned in two groups when that
        pays (:attr:`step_groups`), attended with :meth:`attend_launch` / :meth:`attend_finish`.
        ``split_experts``: the caller's routed experts run on the CPU in some layer, which is
        CPU work to overlap too: a pipelined decode step of two or more sequences is then split
        (evenly) even where its attention has no CPU side -- but only where each sub-batch can
        attend through resident buffers (``group_rows``), so that the split step runs as CUDA
        graphs, unless ``split_spilled``; otherwise it runs as one batch
        (:attr:`step_splittable` says whether a step that was not asked to split could have).
        Split steps that attend eagerly were slower: on an H100 host, FP8 Qwen3-30B-A3B 4 x 32K
        with some KV streamed, 52.0 ms against 42.3 one batch, the launching thread busy 43 ms
        (bench/results/2026-12-05j-h100, call 1).

        ``resident_rows``: the caller runs a decode step as ``resident_rows`` padded rows in a
        CUDA graph (``engine/graphs.py``). A step that attends GPU-resident blocks only and
        completes blocks in G only (from their W slots at its end) is then loaded into fixed
        buffers (:attr:`step_resident`), and its layers are attended with
        :meth:`attend_resident`. ``group_rows``: the same for the
        sub-batches of a pipelined step, the padded rows of a sub-batch of so many tokens (None:
        it cannot run so); each is then loaded into buffers of its own."""
        if self._step is not None:
            raise KVCacheError("begin_step called twice without end_step")
        step = self._place(work)
        try:
            plan, read_tokens, prefill = build_step_plan(
                work, self.seqs, self.policy, self.spec, self.scale, self.bs, self.device,
                self.dense_prefill, self.prefill_gpu_rows,
                shared_t=self.prefix.shared_in(Region.T) if self.prefix is not None and
                stage_shared() else None,
                shared_c=self.prefix.shared_in(Region.C) if self.prefix is not None else None)
        except BaseException:
            for _, _, r, bid in step["new_blocks"]:
                self.alloc[r].free([bid])
            raise
        self_segs = _self_segments(step["seg_lens"], prefill)
        step.update(
            read_tokens=read_tokens, t0=time.perf_counter(),
            # (first row, rows, context) of each sequence attended by the dense prefill kernel;
            # the self partial then treats its rows as single tokens (they are overwritten)
            prefill=prefill, self_seg_lens=self_segs,
            self_single=all(n == 1 for n in self_segs),  # every layer's attention asks
            plan=plan, groups=step_groups(work, plan, split_experts) if pipeline else None,
            split_experts=split_experts, split_spilled=split_spilled, group_rows=group_rows,
            group_records={})
        step["resident"] = None
        if step["groups"] and group_rows is not None:
            step["resident"] = self._load_resident_groups(step, plan, group_rows)
        if step["groups"] and split_experts and step["resident"] is None and not split_spilled:
            step["groups"] = None  # (see above: a split step with CPU experts wants its graphs)
        if resident_rows is not None and not step["groups"]:
            step["resident"] = self._load_resident(step, plan, resident_rows)
        self._step = step
        if step["resident"] is not None:  # the hybrid side only closes the step (end_step)
            plan = AttentionStepPlan(self.spec, self.scale, plan.num_q_rows,
                                     q_indptr=plan.q_indptr)
        self.hybrid.begin_step(plan, groups=None if step["resident"] is not None
                               else step["groups"])
        if step["groups"]:
            self.counters["kv.pipelined_steps"] += 1

    def fill_step(self, work: list[tuple[int, int, int]], records: torch.Tensor) -> None:
        """Write ``records`` (``[sum of n, H, R]``, batch order) as the next tokens of each
        ``(seq_id, start, n)`` in ``work`` without attending anything: the placement policy puts
        the blocks completed here exactly as a step would, and the tokens are written to those
        homes for every layer (the same records in each). For benchmarks that need long cached
        contexts and not their prefill (``writescope bench --prefill synthetic``)."""
        if self._step is not None:
            raise KVCacheError("fill_step inside an open step")
        n_total = sum(n for _, _, n in work)
        if records.shape[0] != n_total:
            raise KVCacheError(f"fill_step: {records.shape[0]} records for {n_total} tokens")
        step = self._place(work)
        self._step = step
        for seq_id, _, _ in work:  # random records: no block of these is ever found by its tokens
            self.seqs[seq_id].cacheable = False
            self._unpend(self.seqs[seq_id])
        try:
            for layer in range(self.spec.num_layers):
                self._write(layer, records)
        except BaseException:
            self.abort_step()
            raise
        self._seal(step)
        self._count_peaks()
        self.counters["kv.filled_tokens"] += n_total
        self._step = None
        # close the step for the policy as a real one would be closed (no timings: a planner
        # learns nothing from it, as from any step with prefill rows)
        self.policy.observe({"batch_lengths": [s + n for _, s, n in work], "synthetic_fill": True})

    def _place(self, work: list[tuple[int, int, int]]) -> dict:
        """The placement half of a step: the homes of the blocks ``work`` completes (chosen by
        the policy, allocated) and where each of its tokens' records goes."""
        bs = self.bs
        if self.policy.moves_blocks:
            self._migrate(work)
        cap = CacheCapacity({r: self._free(r) for r in (Region.G, Region.T, Region.C)},
                            bs, self.block_bytes)
        # ---- placement of the blocks completed this step
        new_blocks: list[tuple[int, int, Region, int]] = []  # (row in batch, block index, region, id)
        seg_lens, row0 = [], 0
        tail_src: list[int] = []  # flat W token index of old tail tokens of completing blocks
        # blocks a one-token row completes in G: (row, its token's flat W slot, the sequence's W
        # slot, the block's id in G) -- a resident step writes the token to W and copies the
        # whole W slot to the block at its end (:meth:`_seal_from_w`)
        seal_w: list[tuple[int, int, int, int]] = []
        seal_ok = g_blocks_on_device()
        block_src: list[np.ndarray] = []  # per new block: source row per token (>=N: tail)
        # per sequence with tokens for W: (first position, count, W slot's first flat token
        # minus the position of its block's start, this step's row minus the position)
        w_runs: list[tuple[int, int, int, int]] = []
        n_total = sum(n for _, _, n in work)
        try:  # a sequence that cannot take its blocks gives back those the earlier ones took
            for seq_id, start, n in work:
                t = self._table(seq_id)
                if start != t.num_tokens:
                    raise KVCacheError(f"sequence {seq_id}: step starts at token {start} but the cache "
                                       f"holds {t.num_tokens}")
                if n <= 0:
                    raise KVCacheError(f"sequence {seq_id}: a step must add at least one token")
                end = start + n
                first_new_block, n_full_after = t.num_sealed, end // bs
                k = n_full_after - first_new_block
                if k > 0:
                    if k > t.reserved_blocks:
                        raise KVCacheError(f"sequence {seq_id} grew past its reservation")
                    regions = self.policy.place(SeqKV(seq_id, end, t.regions()), k, cap)
                    if len(regions) != k or any(r not in (Region.G, Region.T, Region.C)
                                                for r in regions):
                        raise KVCacheError(f"placement policy {self.policy.name!r} returned "
                                           f"{regions}")
                    for r in (Region.G, Region.T, Region.C):
                        want = sum(x is r for x in regions)
                        if want > cap.free[r]:
                            raise KVCacheError(f"placement put {want} blocks in {r}, {cap.free[r]} free")
                    ids = {}
                    for r in (Region.G, Region.T, Region.C):
                        want = sum(x is r for x in regions)
                        if want:
                            self._reclaim(r, want)
                            ids[r] = iter(self.alloc[r].alloc(want, after=t.last_id(r)))
                            cap.free[r] -= want
                    tail = start - first_new_block * bs  # old tail tokens in W (0..bs-1)
                    for j, r in enumerate(regions):
                        b = first_new_block + j
                        bid = next(ids[r])
                        new_blocks.append((seq_id, b, r, bid))
                        if seal_ok and n == 1 and k == 1 and r is Region.G:  # token ends b
                            seal_w.append((row0, t.w_slot * bs + bs - 1, t.w_slot, bid))
                        pos = np.arange(b * bs, (b + 1) * bs)
                        src = pos - start + row0  # rows of this step's records
                        if j == 0 and tail > 0:
                            old = np.arange(tail)
                            src[:tail] = n_total + len(tail_src) + old
                            tail_src.extend((t.w_slot * bs + old).tolist())
                        block_src.append(src)
                # tokens of the (incomplete) last block go to W (positions w_from..end-1,
                # gathered below as array work over the batch)
                w_from = max(start, n_full_after * bs)
                if end > w_from:
                    w_runs.append((w_from, end - w_from, t.w_slot * bs - n_full_after * bs,
                                   row0 - start))
                seg_lens.append(n)
                row0 += n
        except BaseException:
            for _, _, r, bid in new_blocks:
                self.alloc[r].free([bid])
            raise
        dev = self.device
        as_idx = lambda a: h2d(np.concatenate(a) if a else np.zeros(0, np.int64), dev,  # noqa: E731
                               torch.long)
        w_src, w_dst = _w_positions(w_runs)
        step = {
            "work": work, "seg_lens": seg_lens, "new_blocks": new_blocks,
            "tail_src": h2d(tail_src, dev, torch.long),
            "block_src": as_idx(block_src), "w_dst": h2d(w_dst, dev, torch.long),
            "w_src": h2d(w_src, dev, torch.long), "w_host": (w_src, w_dst), "seal_w": seal_w,
        }
        by_region = {}
        for r in (Region.G, Region.T, Region.C):
            sel = [i for i, nb in enumerate(new_blocks) if nb[2] is r]
            if sel:
                by_region[r] = (h2d(sel, dev, torch.long),
                                h2d([new_blocks[i][3] for i in sel], self.pools[r].device,
                                    torch.long))
        step["by_region"] = by_region
        return step

    @property
    def step_splittable(self) -> bool:
        """Whether the open step could run as two sub-batches (a decode step of two or more
        sequences with CPU work to overlap), whether or not it was asked to."""
        step = self._step
        if step is None:
            return False
        if step["groups"] is not None:
            return True
        groups = step_groups(step["work"], step["plan"], step["split_experts"])
        if groups is None or not step["split_experts"] or step["split_spilled"]:
            return groups is not None
        rows = step["group_rows"]  # split only where each sub-batch would be resident
        return (rows is not None and self._resident_possible(step, step["plan"])
                and all(rows(c) is not None for c in groups))

    @property
    def step_deferrable(self) -> bool:
        """Whether the open step may be closed before its device work is done
        (``end_step(wait=False)``): a step with no prefill rows that completes blocks in G only
        (device copies on the step's stream) and reads no T or C block on either side (only G
        and W, on the GPU), so that nothing on the host or on another stream depends on its
        work (the engine's overlapped decode steps, ``engine/inflight.py``). A step planned in
        sub-batches qualifies only where they attend through resident buffers (a split step
        with CPU experts, whose attention is all in its graphs)."""
        step = self._step
        if step is None or step["prefill"]:
            return False
        if step["new_blocks"] and (not g_blocks_on_device() or any(
                r is not Region.G for _, _, r, _ in step["new_blocks"])):
            return False
        if step["groups"] and step["resident"] is None:
            return False
        rt = step["read_tokens"]
        return not rt["cpu"] and not rt["spilled"]

    @property
    def step_streams(self) -> bool:
        """Whether the open step's GPU side reads T blocks (streamed over the link), i.e. the
        link is busy through its attention (``layers/expert_link.py`` then leaves it alone)."""
        step = self._step
        return step is not None and step["read_tokens"]["t_gpu"] > 0

    @property
    def step_groups(self) -> list[int] | None:
        """Sequences per sub-batch of the open step, when it was planned pipelined."""
        return None if self._step is None else self._step["groups"]

    def _migrate(self, work) -> None:
        """Apply the policy's block moves (the ``migrate`` baseline only): copy each block to its
        new region, re-laid-out for it, free the old slot, count the bytes moved."""
        cap = CacheCapacity({r: self.alloc[r].num_free for r in (Region.G, Region.T, Region.C)},
                            self.bs, self.block_bytes)
        views = [SeqKV(sid, self.seqs[sid].num_tokens, self.seqs[sid].regions()) for sid, _, _ in work]
        for seq_id, idx, dst in self.policy.migrations(views, cap):
            t = self._table(seq_id)
            src = CODE_REGIONS[int(t.codes[idx])]
            if src is dst or self.alloc[dst].num_free == 0:
                continue
            old = int(t.ids[idx])
            (new,) = self.alloc[dst].alloc(1)
            for layer in range(self.spec.num_layers):
                rec = block_records(src, self.pools[src], layer, old)  # [bs, H, R]
                if dst is Region.C:
                    self.pools[dst][layer, new].copy_(to_cpu_layout(rec.to("cpu")))
                else:
                    self.pools[dst][layer, new].copy_(rec.to(self.pools[dst].device))
            self.alloc[src].free([old])
            t.set_region(idx, dst, new)
            self.counters["kv.bytes_moved_after_placement"] += self.block_bytes

    def attention(self, layer: int, q: torch.Tensor, records: torch.Tensor,
                  dense=None) -> torch.Tensor:
        """The model's attention entry point (see ``models/base.AttentionContext``)."""
        step = self._step
        if step is None:
            raise KVCacheError("attention called outside a step")
        # dense prefill: each chunk's context, read before this layer's records are written
        ctx = [gather_context(p, self.pools, layer, self.bs, self.device, self.hybrid.cgather)
               for _, _, p in step["prefill"]]
        out_c, lse_c = self.attend_cached(layer, q, records)
        if step["self_single"]:
            # single-token segments (decode rows; dense-prefill rows are replaced below): each
            # token over itself, merged and cast (one kernel on CUDA)
            out = decode_self_merge(out_c, lse_c, q, records, self.spec, self.scale)
        else:
            out_s, lse_s = causal_self_attention(q, records, self.spec, step["self_seg_lens"],
                                                 self.scale)
            out, _ = merge(out_c, lse_c, out_s, lse_s)
            out = out.to(q.dtype)
        spec = self.spec
        for (r0, n, _), c in zip(step["prefill"], ctx):
            kv = torch.cat((c, records[r0:r0 + n].to(c.dtype)), dim=0)
            if dense is not None and dense(r0, n, kv):
                continue  # the model attended these rows in its own form (MLA: per head)
            out[r0:r0 + n] = causal_prefix_attention(q[r0:r0 + n], spec.k(kv), spec.v(kv),
                                                     self.scale).to(out.dtype)
        return out

    def attend_cached(self, layer: int, q: torch.Tensor, records: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The plan's part of :meth:`attention`: float32 ``(out, lse)`` over every cached block
        (CPU and GPU sides); then the new tokens' records are written to their homes."""
        if self._step is None:
            raise KVCacheError("attention called outside a step")
        out_c, lse_c = self.hybrid.attend(layer, q)
        self._write(layer, records)
        return out_c, lse_c

    def attend_launch(self, layer: int, q: torch.Tensor, records: torch.Tensor, group: int
                      ) -> None:
        """One sub-batch's part of :meth:`attend_cached` in a pipelined step: start the layer's
        attention over its cached blocks (the result comes from :meth:`attend_finish`). Once
        every group of the layer is launched, the layer's new records are written."""
        step = self._step
        if step is None or not step["groups"]:
            raise KVCacheError("attend_launch outside a pipelined step")
        self.hybrid.launch(layer, q, group)
        recs = step["group_records"]
        recs[group] = records
        if len(recs) == len(step["groups"]):
            self._write(layer, torch.cat([recs[g] for g in range(len(recs))]))
            recs.clear()

    def attend_finish(self, layer: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 ``(out, lse)`` of a launched sub-batch over its cached blocks."""
        if self._step is None:
            raise KVCacheError("attend_finish outside a step")
        return self.hybrid.finish(layer, group)

    def _write(self, layer: int, records: torch.Tensor) -> None:
        step = self._step
        spec = self.spec
        records = records.to(spec.dtype)
        w = self.pools[Region.W][layer]  # [slots, bs, H, R]
        w_flat = w.view(-1, spec.num_kv_heads, spec.rec_dim)
        tok_bytes = spec.num_kv_heads * spec.rec_dim * spec.itemsize
        if step["new_blocks"]:
            src = torch.cat((records, w_flat.index_select(0, step["tail_src"])), dim=0)
            blocks = src.index_select(0, step["block_src"]).view(-1, self.bs, spec.num_kv_heads,
                                                                 spec.rec_dim)
            for r, (sel, ids) in step["by_region"].items():
                data = blocks.index_select(0, sel)
                pool = self.pools[r][layer]
                if r is Region.C:
                    data = to_cpu_layout(data.to("cpu"))
                elif pool.device != data.device:
                    data = data.to(pool.device)
                pool.index_copy_(0, ids, data.contiguous())
                self.counters[f"kv.bytes_written.{r}"] += data.numel() * spec.itemsize
        if step["w_dst"].numel():
            w_flat.index_copy_(0, step["w_dst"], records.index_select(0, step["w_src"]))
            self.counters["kv.bytes_written.W"] += step["w_dst"].numel() * tok_bytes

    def end_step(self, extra_timing: dict | None = None, wait: bool = True) -> dict:
        """Close the step: seal its blocks, count, and show the placement policy the step's
        timing (the attention side's, plus ``extra_timing``: the runner's CPU experts'
        ``cpu_expert_s``).

        ``wait=False`` (only where :attr:`step_deferrable`): close it while its device work may
        still run. Its timing is then ``untimed``: the policy closes the step's bookkeeping but
        learns no rates from it."""
        step = self._step
        if step is None:
            raise KVCacheError("end_step without begin_step")
        if not wait and not self.step_deferrable:
            raise KVCacheError("end_step(wait=False) on a step that is not deferrable")
        # first: the attention side may report a failed CPU job here; the step is then still
        # open, so abort_step can give its blocks back
        timing = self.hybrid.end_step() if wait else self.hybrid.end_step(wait=False)
        if step["resident"] is not None:  # no GPU timing events in a resident step
            timing["gpu_s"] = None
            self.counters["kv.resident_steps"] += 1
            if step["new_blocks"]:
                self._seal_from_w(step)
            n = step["w_host"][0].size + len(step["seal_w"])  # the rows _resident_w wrote
            self.counters["kv.bytes_written.W"] += \
                n * self.spec.num_kv_heads * self.spec.rec_dim * self.spec.itemsize * \
                self.spec.num_layers
        self._seal(step)
        self.counters["kv.dense_prefill_rows"] += sum(n for _, n, _ in step["prefill"])
        tb = self.spec.token_bytes()
        for side in ("cpu", "gpu"):
            self.counters[f"kv.bytes_read.{side}"] += step["read_tokens"][side] * tb
        self.counters["kv.steps"] += 1
        self._count_peaks()
        timing.update(step_s=time.perf_counter() - step["t0"],
                      cpu_bytes=step["read_tokens"]["cpu"] * tb,
                      gpu_bytes=step["read_tokens"]["gpu"] * tb,
                      t_bytes=step["read_tokens"]["t_gpu"] * tb,
                      cpu_t_bytes=step["read_tokens"]["cpu_t"] * tb,
                      batch_lengths=[s + n for _, s, n in step["work"]])
        timing.update(extra_timing or {})
        if not wait:
            timing["untimed"] = True
        self.last_timing = timing
        self.policy.observe(timing)
        self._step = None
        return timing

    def _count_peaks(self) -> None:
        for r, n in self.live_blocks().items():
            key = f"kv.peak_blocks.{r}"
            self.counters[key] = max(self.counters.get(key, 0), n)

    def _seal(self, step: dict) -> None:
        """The step's completed blocks join their sequences' tables; token counts advance."""
        for seq_id, b, r, bid in step["new_blocks"]:
            t = self.seqs[seq_id]
            assert b == t.num_sealed, "blocks are sealed in order"
            t.append(r, bid)
            if self.prefix is not None and t.cacheable and b == len(t.names) \
                    and b < len(t.prompt_names):  # a prompt block: its tokens are known
                self.prefix.register(t.prompt_names[b], (r, bid))
                t.names.append(t.prompt_names[b])
                self._unpend(t, b + 1)
            t.reserved_blocks -= 1
            self.reserved -= 1
        for seq_id, start, n in step["work"]:
            self.seqs[seq_id].num_tokens = start + n

    def abort_step(self) -> None:
        """Undo a step that failed before end_step: release the blocks allocated for it."""
        step = self._step
        if step is None:
            return
        for _, _, r, bid in step["new_blocks"]:
            self.alloc[r].free([bid])
        self._step = None
        try:
            self.hybrid.end_step()
        except Exception:  # noqa: BLE001 - the step is being abandoned for its own error
            pass

    # ------------------------------------------------------------------ statistics
    def live_blocks(self) -> dict[Region, int]:
        """Blocks in use per region (unused cached blocks, free to reclaim, are not)."""
        return {r: a.n - (self.free_slots() if r is Region.W else self._free(r))
                for r, a in self.alloc.items()}

    def stats(self) -> dict:
        s = {f"kv.blocks.{r}": n for r, n in self.live_blocks().items()}
        s.update({f"kv.capacity_blocks.{r}": n for r, n in self.layout.num_blocks.items()})
        s.update(self.counters)
        nbytes = {r: p.numel() * p.element_size() for r, p in self.pools.items()}
        s["kv.vram_bytes"] = sum(nbytes[r] for r in DEVICE_REGIONS) + self.hybrid_staging_bytes()
        s["kv.pinned_bytes"] = nbytes[Region.T]
        s["kv.host_bytes"] = nbytes[Region.C]
        s["kv.block_size"] = self.bs
        s["kv.sequences"] = len(self.seqs)
        read = s["kv.bytes_read.cpu"] + s["kv.bytes_read.gpu"]
        s["kv.cpu_share_of_reads"] = s["kv.bytes_read.cpu"] / read if read else 0.0
        if self.prefix is not None:
            s.update(self.prefix.stats())
            s.update(self.tails.counters)
            s["prefix.tails"] = len(self.tails)
        s.update(self.policy.stats())
        return s

    def hybrid_staging_bytes(self) -> int:
        return int(getattr(self.hybrid, "staging_bytes", 0))


def plan_layout(spec: KVSpec, block_size: int, *, device_bytes: int | None, pinned_bytes: int,
                host_bytes: int, max_tokens_total: int, max_num_seqs: int,
                num_gpu_blocks: int | None = None) -> CacheLayout:
    """Split the byte budgets into block counts. Never more blocks than ``max_tokens_total`` needs
    in any one region; W has one tail slot per sequence (its bytes come out of ``device_bytes``)."""
    bb = spec.block_bytes(block_size)
    cap = math.ceil(max_tokens_total / block_size)
    w = max_num_seqs
    if device_bytes is None:
        g = cap
    else:
        g = max(0, device_bytes // bb - w)
        if device_bytes < w * bb:
            raise ValueError(f"the VRAM left for KV ({device_bytes} bytes) cannot hold one write "
                             f"tail per sequence ({w} x {bb} bytes)")
    if num_gpu_blocks is not None:
        g = min(g, num_gpu_blocks)
    g = min(g, cap)
    t = min(pinned_bytes // bb, cap)
    c = min(host_bytes // bb, cap)
    return CacheLayout(block_size, {Region.G: g, Region.T: t, Region.C: c, Region.W: w})
