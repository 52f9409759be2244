"""Blocks several sequences of one CPU call list, read once for all of them.

With prefix caching (one document, many questions; a request sampled ``n`` times) the
sequences of a step list the same sealed blocks. The CPU kernel reads a block's K/V rows once
for every query vector of a group (``csrc/attn_ops.cpp``); this extends that across sequences:
:func:`split_shared` takes the blocks that two or more of a call's sequences list out of their
own lists and into *sets* by holders, and the kernel attends each set's blocks for the queries
of all its holders at once, merging that partial into each holder's by log-sum-exp (``WsShared``
in ``csrc/attn_common.h``). The bytes read fall by the number of holders; the products are the
same. (FlashInfer's cascade attention does the like on the GPU: a shared prefix's KV attended
for the whole batch, merged with each request's own.)

Where it pays: a GQA block's K/V rows serve a few query heads each (Qwen3: 8), so the kernel is
bound by reading them, and 8 sequences sharing 32K tokens of 1K each ran 2.43x faster on an
H100 host's 16 AMX cores (bench/results/2026-12-06i-h100, call 2: 1.68 against 4.10 ms a
layer; ``python -m writescope.bench.cpu_shared``). An MLA record serves 16 query heads over 576
values (~30 FLOP a byte): the kernel is bound by its products, which are per listing, and the
same batch ran 1.00x (3.02 against 3.03 ms), while a decode step with a few shared blocks ran
its larger groups on fewer cores (DeepSeek-V2-Lite, 8 prompts sharing 32K: the CPU's time 8.7
ms a step against 1.3). So by default only GQA calls read shared blocks once.

``WRITESCOPE_CPU_SHARED_READS``: ``auto`` (default: GQA calls), ``all`` (MLA too), ``0`` (none;
for A/B runs). It is read when a step's calls are planned
(:class:`~writescope.attention.cpu.CpuAttentionPlan`), by the step plan, which counts the CPU
side's bytes as the kernel reads them and may give the CPU T blocks several sequences hold
(read in place, once), and by the planner, which then counts such blocks once on whichever side
reads them (:func:`active`). A step split into sub-batches (``attention/groups.py``) reads a
shared block once per sub-batch that lists it; the step plan and the planner count it once.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


def setting() -> str:
    """``WRITESCOPE_CPU_SHARED_READS``: ``auto`` (the default; ``1``, ``on`` too), ``all`` or
    ``off`` (``0``, ``false``, ``no``)."""
    value = os.environ.get("WRITESCOPE_CPU_SHARED_READS", "auto").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    if value in ("auto", "1", "on", "true", "yes", ""):
        return "auto"
    if value == "all":
        return "all"
    raise ValueError(f"WRITESCOPE_CPU_SHARED_READS={value!r}: auto, all or 0")


def applies(mla: bool) -> bool:
    """Whether a CPU call over KV of this family reads a shared block once: GQA by default, MLA
    with ``all`` (see the module docstring)."""
    s = setting()
    return s == "all" or (s == "auto" and not mla)


def active(mla: bool) -> bool:
    """Whether a step's CPU side reads a shared block of this family once: :func:`applies` and
    the compiled kernel loaded (the torch path reads every listing). What the step plan and the
    planner count by."""
    if not applies(mla):
        return False
    from . import cpu
    return cpu.available()


@dataclass
class SharedSplit:
    """A call's blocks split into the sequences' own and the shared sets (int32 CSR arrays).

    * ``kv_indptr [B+1]``, ``kv_blocks``, ``kv_lens``: each sequence's blocks less the shared;
    * ``set_indptr [S+1]``, ``set_seqs``: set ``k``'s holders (sequence indices, ascending);
    * ``set_kv_indptr [S+1]``, ``set_kv_blocks``, ``set_kv_lens``: set ``k``'s blocks.
    """
    kv_indptr: np.ndarray
    kv_blocks: np.ndarray
    kv_lens: np.ndarray
    set_indptr: np.ndarray
    set_seqs: np.ndarray
    set_kv_indptr: np.ndarray
    set_kv_blocks: np.ndarray
    set_kv_lens: np.ndarray

    @property
    def num_sets(self) -> int:
        return self.set_indptr.size - 1

    def listings_saved(self) -> int:
        """Block reads the sets save: every holder's listing of a set's block but one."""
        holders = np.diff(self.set_indptr)
        blocks = np.diff(self.set_kv_indptr)
        return int(((holders - 1) * blocks).sum())


#: the last splits and the arrays each was made from, newest first: a decode step's batches are
#: the last step's until a block seals (63 of 64 steps at 64 tokens a block), and a split costs
#: ~0.2-0.4 ms of the launching thread's time with 8 sequences sharing 500 blocks (dev VM). A
#: step plans up to four calls (C, and T read in place, for each of two sub-batches), so one
#: kept split would be replaced by the next call's every step.
_recent: tuple[tuple[tuple[np.ndarray, ...], SharedSplit | None], ...] = ()
_KEEP = 4


def split_shared(q_indptr: np.ndarray, kv_indptr: np.ndarray, kv_blocks: np.ndarray,
                 kv_lens: np.ndarray) -> SharedSplit | None:
    """:func:`_split`, or an earlier call's result for the same arrays (:data:`_recent`; the
    result is shared: not to be modified)."""
    global _recent
    arrays = tuple(np.asarray(a) for a in (q_indptr, kv_indptr, kv_blocks, kv_lens))
    recent = _recent  # (one read: another thread may replace it)
    for key, out in recent:
        if all(a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
               for a, b in zip(arrays, key)):
            return out
    out = _split(*arrays)
    _recent = ((tuple(a.copy() for a in arrays), out),) + recent[:_KEEP - 1]
    return out


def _split(q_indptr: np.ndarray, kv_indptr: np.ndarray, kv_blocks: np.ndarray,
           kv_lens: np.ndarray) -> SharedSplit | None:
    """The blocks that two or more sequences with query rows list with the same valid length,
    in sets by their holders; None when there are none (or a sequence lists a block twice:
    then the call attends each listing, as the torch path does).

    A block's holders are the sequences that list it; blocks with the same holders form one
    set, in the order its first holder lists them. A sequence without query rows keeps its
    listings (the kernel skips it)."""
    qi = np.asarray(q_indptr, np.int64)
    ki = np.asarray(kv_indptr, np.int64)
    ids = np.asarray(kv_blocks, np.int64)
    lens = np.asarray(kv_lens, np.int64)
    nseq = ki.size - 1
    if nseq < 2 or ids.size < 2:
        return None
    seen = np.zeros(int(ids.max()) + 1, np.bool_)  # (linear: most calls share nothing)
    seen[ids] = True
    if np.count_nonzero(seen) == ids.size:
        return None
    owner = np.repeat(np.arange(nseq), np.diff(ki))
    asks = (np.diff(qi) > 0)[owner]  # a listing of a sequence with query rows
    # a block listed with another valid length is another block to the kernel
    key = ids * (int(lens.max()) + 1) + lens
    pos = np.flatnonzero(asks)
    if pos.size < 2:
        return None
    order = pos[np.lexsort((owner[pos], key[pos]))]  # by key, then holder
    k_s, o_s = key[order], owner[order]
    same_key = k_s[1:] == k_s[:-1]
    if np.any(same_key & (o_s[1:] == o_s[:-1])):
        return None  # a sequence lists a block twice
    if not same_key.any():
        return None
    # runs of one key: [starts[i], starts[i + 1]), its listings by holder
    starts = np.flatnonzero(np.concatenate(([True], ~same_key)))
    counts = np.diff(np.append(starts, k_s.size))
    multi = counts >= 2
    run_of = np.repeat(np.arange(starts.size), counts)
    keep = np.ones(ids.size, np.bool_)
    keep[order[multi[run_of]]] = False
    # each run's holders as a bit mask (64 sequences a word): the sum of distinct bits
    words = (nseq + 63) // 64
    bits = np.empty((starts.size, words), np.uint64)
    one = np.uint64(1)
    for w in range(words):
        inword = (o_s >> 6) == w
        vals = np.where(inword, np.left_shift(one, (o_s & 63).astype(np.uint64)), np.uint64(0))
        bits[:, w] = np.add.reduceat(vals, starts)
    bits = bits[multi]
    first = order[starts[multi]]  # a run's first listing: its lowest holder's
    if words == 1:  # (np.unique over rows is ~10x slower)
        masks, inv = np.unique(bits[:, 0], return_inverse=True)
        masks = masks[:, None]
    else:
        masks, inv = np.unique(bits, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    by_set = np.lexsort((first, inv))  # sets in mask order, each in its first holder's order
    first = first[by_set]
    held = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")[:, :nseq]
    set_rows, set_seqs = np.nonzero(held)
    own_ki = np.zeros(nseq + 1, np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=nseq), out=own_ki[1:])
    set_ip = np.zeros(masks.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(set_rows, minlength=masks.shape[0]), out=set_ip[1:])
    set_kip = np.zeros(masks.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(inv, minlength=masks.shape[0]), out=set_kip[1:])
    i32 = np.int32
    return SharedSplit(own_ki.astype(i32), ids[keep].astype(i32), lens[keep].astype(i32),
                       set_ip.astype(i32), set_seqs.astype(i32), set_kip.astype(i32),
                       ids[first].astype(i32), lens[first].astype(i32))
