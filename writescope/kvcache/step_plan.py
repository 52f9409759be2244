"""A decode or prefill step's attention plan, built from the sequences' block tables: which
sealed blocks each side (CPU, GPU) attends, as one CSR :class:`BlockBatch` per (side, region),
and each sequence's W tail (:func:`build_step_plan`; the cache calls it in ``begin_step``)."""
from __future__ import annotations

import numpy as np
import torch

from ..attention import shared_reads
from ..attention.batch import BlockBatch
from ..attention.groups import AttentionStepPlan
from ..attention.staging import distinct_count
from .context import ContextPlan
from .placement import PlacementPolicy, SeqKV
from .pools import KVCacheError
from .regions import KVSpec, Region
from .table import CODE_REGIONS, REGION_CODES, SeqTable


def build_step_plan(work: list[tuple[int, int, int]], seqs: dict[int, SeqTable],
                    policy: PlacementPolicy, spec: KVSpec, scale: float, bs: int,
                    device: torch.device, dense_prefill: bool, prefill_gpu_rows: int | None,
                    shared_t: np.ndarray | None = None, shared_c: np.ndarray | None = None
                    ) -> tuple[AttentionStepPlan, dict[str, int], list]:
    """Which cached blocks each side attends, as one BlockBatch per (side, region); and the
    sequences whose prefill chunk attends its context densely instead (no blocks in the plan).

    One pass over the sequences gathers their tables (and asks a policy with its own
    ``assign`` which T blocks its CPU side reads); the per-(side, region) selections are then
    array work over the whole batch (a per-sequence loop of them cost ~45 us a sequence on
    the dev VM, 2.9 ms a step at batch 64).

    ``shared_t``: the T blocks two or more sequences hold now (prefix caching), or None. They
    stay on the GPU side: the staging ring moves a shared block once a piece
    (``attention/staging.py``), where the CPU would read it once per sequence; so a policy's
    ``n`` oldest T blocks for the CPU are its oldest *unshared* ones. The streamed count
    (``t_gpu``) is then of distinct T blocks, while ``gpu`` counts every sequence's read. A
    policy with its own ``assign`` is told, before its calls, how many distinct shared T blocks
    the step holds (``note_shared``) and each sequence how many of its own are among them
    (``SeqKV.shared_t``), so that its model can count them once.

    Where the CPU kernel reads a shared block once for all its holders
    (``attention/shared_reads.py``, :func:`~writescope.attention.shared_reads.active`: GQA by
    default), a policy may also give the CPU the oldest of the step's distinct shared T blocks,
    for every holder (``PlacementPolicy.shared_t_to_cpu``, asked after the ``assign`` calls);
    the rest stream. The CPU side's bytes (``read["cpu"]``, ``read["cpu_t"]``) then count each
    block it reads once.

    ``shared_c``: the C blocks two or more sequences hold now, or None. The policy is told their
    distinct count and each sequence its own (``SeqKV.shared_c``): where the kernel reads them
    once, its model counts them once."""
    n_seqs = len(work)
    q_counts = np.empty(n_seqs, np.int64)
    tails = np.zeros(n_seqs, np.int64)     # W tokens each attends (0: none, or dense prefill)
    w_slots = np.zeros(n_seqs, np.int32)
    sizes = np.zeros(n_seqs, np.int64)     # sealed blocks each reads through the plan
    codes_l, ids_l = [], []
    cpu_t = np.zeros(n_seqs, np.int64)     # the policy's: its oldest T blocks the CPU reads
    masks: list[tuple[int, np.ndarray]] = []  # (sequence, its blocks the CPU reads)
    gpu_only = np.zeros(n_seqs, bool)      # rows past prefill_gpu_rows: all on the GPU
    # "spilled": tokens of T and C blocks read by either side (a deferrable step has none)
    read = {"cpu": 0, "gpu": 0, "t_gpu": 0, "cpu_t": 0, "spilled": 0}
    prefill = []
    custom = type(policy).assign is not PlacementPolicy.assign
    t_code, c_code = REGION_CODES[Region.T], REGION_CODES[Region.C]
    row0 = 0
    asks = []  # (batch index, SeqKV without shared_t) of the sequences the policy assigns
    for i, (seq_id, start, n) in enumerate(work):
        t = seqs[seq_id]
        q_counts[i] = n
        row0 += n
        codes, ids = t.sealed_codes, t.sealed_ids
        tail = start - t.num_sealed * bs
        if dense_prefill and n > prefill_gpu_rows:
            prefill.append((row0 - n, n, ContextPlan.build(codes, ids, t.w_slot, tail, bs,
                                                           device)))
            read["gpu"] += codes.size * bs + tail
            continue
        if custom:
            asks.append((i, SeqKV(seq_id, start, t.regions())))
        if prefill_gpu_rows is not None and n > prefill_gpu_rows:
            gpu_only[i] = True
        codes_l.append(codes)
        ids_l.append(ids)
        sizes[i] = codes.size
        tails[i] = tail
        w_slots[i] = t.w_slot
    if codes_l:
        codes = np.concatenate(codes_l)
        ids = np.concatenate(ids_l)
        owner = np.repeat(np.arange(n_seqs), sizes)  # the sequence of each block
    else:
        codes = ids = owner = np.zeros(0, np.int32)
    sharing = shared_t is not None and shared_t.size > 0
    # T blocks other sequences hold too: they stream once, the CPU takes private ones
    shared = _flagged(codes, ids, t_code, shared_t) if sharing else None
    sharing_c = shared_c is not None and shared_c.size > 0
    # C blocks other sequences hold too: the CPU reads each once for all of them
    shared_cm = _flagged(codes, ids, c_code, shared_c) if sharing_c else None
    if custom:
        per_seq = np.zeros(n_seqs, np.int64)
        per_seq_c = np.zeros(n_seqs, np.int64)
        if sharing:
            per_seq = np.bincount(owner[shared], minlength=n_seqs)
        if sharing_c:
            per_seq_c = np.bincount(owner[shared_cm], minlength=n_seqs)
        policy.note_shared(distinct_count(ids[shared]) if sharing else 0,
                           distinct_count(ids[shared_cm]) if sharing_c else 0)
        for i, s in asks:
            a = policy.assign(SeqKV(s.seq_id, s.num_tokens, s.regions, int(per_seq[i]),
                                    int(per_seq_c[i])))
            if isinstance(a, (int, np.integer)):  # the n oldest T blocks too
                if a < 0:
                    raise KVCacheError(f"policy {policy.name!r} assigned {a} T blocks "
                                       f"to the CPU")
                cpu_t[i] = a
            else:
                mask = np.asarray(a, dtype=bool)
                if mask.shape != (len(s.regions),):
                    raise KVCacheError(f"policy {policy.name!r} assigned {mask.size} "
                                       f"blocks, sequence has {len(s.regions)}")
                masks.append((i, mask))
    # the CPU reads shared T blocks in place too, once for all holders, where the policy says
    n_shared_cpu = policy.shared_t_to_cpu() if custom and sharing and shared.any() and \
        shared_reads.active(spec.is_mla) else 0
    qi = np.zeros(n_seqs + 1, np.int32)
    np.cumsum(q_counts, out=qi[1:])
    plan = AttentionStepPlan(spec, scale, int(qi[-1]), q_indptr=torch.as_tensor(qi))
    # the CPU side reads the C blocks and each sequence's oldest cpu_t T blocks (or the
    # blocks its policy's mask says), none where its rows are too many (gpu_only)
    on_cpu = codes == c_code
    if cpu_t.any():
        is_t = codes == t_code
        if sharing:  # shared T blocks stream (once), the CPU takes private ones
            is_t &= ~shared
        seen = np.cumsum(is_t)  # T blocks up to and including each block, batch-wide
        first = np.cumsum(sizes) - sizes  # each sequence's first block
        before = np.concatenate(([0], seen))[first]  # T blocks of the sequences before
        on_cpu |= is_t & (seen - before[owner] <= cpu_t[owner])
    if n_shared_cpu > 0:  # the oldest distinct shared T blocks (first listed), for all holders
        at = np.flatnonzero(shared)
        uid, first = np.unique(ids[at], return_index=True)
        take = np.zeros(int(ids.max()) + 1, np.bool_)
        take[uid[np.argsort(first, kind="stable")][:int(n_shared_cpu)]] = True
        on_cpu |= shared & take[ids]
    if masks:
        first = np.cumsum(sizes) - sizes
        for i, mask in masks:
            on_cpu[first[i]:first[i] + sizes[i]] = mask
    if gpu_only.any():
        on_cpu &= ~gpu_only[owner]
    parts = {"cpu": [], "gpu": []}
    # the CPU kernel reads a block its call's sequences share once (attention/shared_reads.py)
    cpu_once = (sharing or sharing_c) and shared_reads.active(spec.is_mla)
    for side, mask in (("cpu", on_cpu), ("gpu", ~on_cpu)):
        for code, r in CODE_REGIONS.items():
            sel = mask & (codes == code)
            count = int(np.count_nonzero(sel))
            if side == "cpu" and cpu_once and count:
                n_read = distinct_count(ids[sel])
            else:
                n_read = count
            read[side] += n_read * bs
            if side == "gpu" and r is Region.T:
                read["t_gpu"] += (distinct_count(ids[sel]) if sharing else count) * bs
            elif r is Region.T:  # T blocks the CPU side reads in place
                read["cpu_t"] += n_read * bs
            if r is Region.T or r is Region.C:
                read["spilled"] += count * bs
            if count:
                per_seq = np.bincount(owner[sel], minlength=n_seqs)
                parts[side].append((r, per_seq, ids[sel].astype(np.int32, copy=False),
                                    np.full(count, bs, np.int32)))
    read["gpu"] += int(tails.sum())
    has_tail = tails > 0
    if has_tail.any():  # the GPU side attends each sequence's W tail
        parts["gpu"].append((Region.W, has_tail.astype(np.int64), w_slots[has_tail],
                             tails[has_tail].astype(np.int32)))
    for side, items in parts.items():
        for r, per_seq, blocks, lens in items:
            ki = np.zeros(n_seqs + 1, np.int32)
            np.cumsum(per_seq, out=ki[1:])
            batch = BlockBatch(*(torch.from_numpy(a) for a in (qi, ki, blocks, lens)))
            if side == "gpu":  # (the device batch keeps this host one for the step's planning)
                batch = batch.to(device)
            getattr(plan, side).append((r, batch))
    return plan, read, prefill


def _flagged(codes: np.ndarray, ids: np.ndarray, code: int, shared: np.ndarray) -> np.ndarray:
    """Which of the listed blocks are of region ``code`` and among ``shared``'s ids: a flag per
    id (linear; np.isin sorts)."""
    if not ids.size:
        return np.zeros(0, np.bool_)
    mark = np.zeros(int(max(ids.max(), shared.max())) + 1, np.bool_)
    mark[shared] = True
    return (codes == code) & mark[ids]
