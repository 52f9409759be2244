"""A step's attention plan and its sub-batches (groups): pure data over the cache's block batches.

:class:`AttentionStepPlan` is what the cache builds once per step (``kvcache/step_plan.py``):
per side, a list of ``(region, BlockBatch)``. :func:`split_groups` cuts it into the sub-batches
:class:`~writescope.attention.hybrid.HybridAttention` attends, each a :class:`Group` with its
query rows, its share of the plan and its per-step state; :func:`compact_cpu_rows` leaves the
CPU side only the rows of sequences that have CPU blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kvcache.regions import KVSpec, Region
from .batch import BlockBatch

#: sub-batches a step may be split into (``HybridAttention.begin_step(groups=...)``)
MAX_GROUPS = 2
#: the CPU side gets only the query rows of sequences with CPU blocks when that leaves out at
#: least this many rows (a prefill chunk's): a decode step's few rows cost the CPU nothing (the
#: kernel writes (0, -inf) for them), while compacting costs every layer a gather, two copies
#: and two scatters on the launching thread (~5 % of a 48-layer decode step's host time)
COMPACT_MIN_ROWS = 16


@dataclass
class AttentionStepPlan:
    """One step's attention work, the same for every layer: per side (``gpu``, ``cpu``) the
    ``(region, BlockBatch)`` pairs of the blocks that side attends, ``num_q_rows`` query rows
    scaled by ``scale``."""
    spec: KVSpec
    scale: float
    num_q_rows: int
    gpu: list[tuple[Region, BlockBatch]] = field(default_factory=list)
    cpu: list[tuple[Region, BlockBatch]] = field(default_factory=list)
    #: query rows per sequence (CSR, CPU int tensor): which rows each sequence owns, also when
    #: no batch has a block (optional: taken from any batch otherwise)
    q_indptr: torch.Tensor | None = None


@dataclass
class Source:
    """One GPU-side launch per layer: a resident pool region, one staged T piece, or one
    gathered C piece."""
    region: Region
    batch: BlockBatch                 # on the device
    piece: int | None = None          # index into the ring's pieces (staged T), else None
    gather: object = None             # gather.GatherPiece (C read by the GPU), else None
    chunks: object = None             # gpu.ChunkPlan on the device (Triton backend)
    host_batch: BlockBatch | None = None  # ``batch`` as planned, on the CPU (for planning)


def slice_batch(b: BlockBatch, s0: int, s1: int) -> BlockBatch:
    """Sequences ``s0:s1`` of a batch, rebased (CPU tensors): a sub-batch's share of a plan."""
    b = b.host_view()
    qi = b.q_indptr.to(torch.int64)
    ki = b.kv_indptr.to(torch.int64)
    k0, k1 = int(ki[s0]), int(ki[s1])
    return BlockBatch((qi[s0:s1 + 1] - qi[s0]).to(torch.int32),
                      (ki[s0:s1 + 1] - k0).to(torch.int32),
                      b.kv_blocks[k0:k1].clone(), b.kv_lens[k0:k1].clone())


@dataclass
class Group:
    """One sub-batch of a step: its query rows, its share of the plan, its per-step state."""
    index: int
    rows: tuple[int, int]                    # [first, end) rows of the step's queries
    gpu: list[tuple[Region, BlockBatch]]
    cpu: list[tuple[Region, BlockBatch]]     # CPU tensors
    sources: list[Source] = field(default_factory=list)
    cpu_rows: torch.Tensor | None = None     # compacted CPU rows (group-local), None = all
    cpu_rows_dev: torch.Tensor | None = None
    cpu_plans: list | None = None            # compiled-kernel calls, made on the first layer
    cpu_paired: bool = False                 # its two cpu_plans run as one call (pair_calls)
    full_extra: tuple | None = None
    qmax: int = 1
    num_chunks: int = 0
    row_ptr: torch.Tensor | None = None
    row_idx: torch.Tensor | None = None
    gpu_planned: bool = False                # chunks and merge rows made (Triton backend)
    pending: tuple | None = None             # between launch() and finish()

    @property
    def num_rows(self) -> int:
        return self.rows[1] - self.rows[0]


def clone_key(key):
    """A plan key (nested tuples of tensors and plain values) with its tensors copied."""
    if isinstance(key, torch.Tensor):
        return key.clone()
    if isinstance(key, tuple):
        return tuple(clone_key(k) for k in key)
    return key


def same_key(a, b) -> bool:
    """Whether two plan keys hold the same values (tensors compared by shape, dtype and
    contents)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(same_key(x, y) for x, y in zip(a, b)))
    return a == b


def compact_cpu_rows(batches: list[tuple[Region, BlockBatch]]
                     ) -> tuple[list[tuple[Region, BlockBatch]], torch.Tensor | None]:
    """The CPU side's batches over only the sequences that have a CPU block, and the query rows
    of those sequences (None when that is every sequence). In a step that mixes decoding
    sequences (with CPU blocks) and prefill chunks (none: the GPU attends a chunk's context), the
    chunk's thousands of query rows then never cross PCIe to the CPU and back. All batches of
    one step share ``q_indptr``; a sequence without CPU blocks has no entries in any of them."""
    if not batches:
        return batches, None
    has = None  # (numpy: this runs on every step, mostly to find that every sequence has one)
    for _, b in batches:
        ki = b.kv_indptr.to("cpu").numpy()
        h = ki[1:] != ki[:-1]
        has = h if has is None else has | h
    if has.all():
        return batches, None
    has = torch.from_numpy(has)
    qi = batches[0][1].q_indptr.to("cpu", torch.int64)
    qn = qi[1:] - qi[:-1]
    rows = torch.cat([torch.arange(int(qi[i]), int(qi[i + 1])) for i in
                      torch.nonzero(has).flatten().tolist()] or [torch.zeros(0, dtype=torch.int64)])
    zero = torch.zeros(1, dtype=torch.int64)
    new_qi = torch.cat((zero, torch.cumsum(qn[has], 0))).to(torch.int32)
    out = []
    for r, b in batches:
        ki = b.kv_indptr.to("cpu", torch.int64)
        new_ki = torch.cat((zero, torch.cumsum((ki[1:] - ki[:-1])[has], 0))).to(torch.int32)
        out.append((r, BlockBatch(new_qi.clone(), new_ki, b.kv_blocks, b.kv_lens)))
    return out, rows



def split_groups(plan: AttentionStepPlan, groups: list[int] | None) -> list[Group]:
    """The step's sub-batches: ``groups`` sequences each, in batch order (None: one group of
    every sequence), each with its rows and its share of the plan."""
    qi = plan.q_indptr
    if qi is None:
        qi = next((b.q_indptr for _, b in plan.gpu + plan.cpu), None)
    if qi is None:  # no cached block at all: one row per sequence is all a group needs
        qi = torch.arange(plan.num_q_rows + 1)
    qi = qi.to("cpu", torch.int64)
    nseq = qi.numel() - 1
    counts = [nseq] if groups is None else [int(c) for c in groups]
    if sum(counts) != nseq or any(c <= 0 for c in counts) or len(counts) > MAX_GROUPS:
        raise ValueError(f"groups {groups} do not split {nseq} sequences into at most "
                         f"{MAX_GROUPS} non-empty sub-batches")
    out, s0 = [], 0
    for c in counts:
        s1 = s0 + c
        if len(counts) == 1:
            gpu = [(r, b) for r, b in plan.gpu if b.num_blocks > 0]
            cpu = [(r, b.to("cpu")) for r, b in plan.cpu if b.num_blocks > 0]
        else:
            gpu = [(r, slice_batch(b, s0, s1)) for r, b in plan.gpu]
            cpu = [(r, slice_batch(b, s0, s1)) for r, b in plan.cpu]
            gpu = [(r, b) for r, b in gpu if b.num_blocks > 0]
            cpu = [(r, b) for r, b in cpu if b.num_blocks > 0]
        out.append(Group(len(out), (int(qi[s0]), int(qi[s1])), gpu, cpu))
        s0 = s1
    return out
