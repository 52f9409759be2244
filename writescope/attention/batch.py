"""What one attention side attends in one step, as pure data (CSR over sequences).

A :class:`BlockBatch` describes, for ``B`` sequences, which query rows belong to each sequence
and which blocks of *one pool* (one region, one layout) each sequence's queries attend. It is
built once per step by the plan and used for every layer (plan once, run per layer).

* ``q_indptr [B+1]``: query rows ``q_indptr[i]:q_indptr[i+1]`` belong to sequence ``i``;
* ``kv_indptr [B+1]``: blocks ``kv_blocks[kv_indptr[i]:kv_indptr[i+1]]`` are sequence ``i``'s;
* ``kv_blocks [nnz]``: block ids in the pool;
* ``kv_lens [nnz]``: valid tokens in each block (``1..block_size``).

There is no causal mask: the blocks are cached context, all older than every query row (the
step's own new tokens are attended separately, see ``attention/selfattn.py``).
All four tensors are int32 and live on the device that runs the kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class BlockBatch:
    q_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_blocks: torch.Tensor
    kv_lens: torch.Tensor
    #: the same batch in host memory, kept by :meth:`to` when this one was copied from it: the
    #: step's planning reads it there (:meth:`host_view`) without waiting for the device
    host: "BlockBatch | None" = field(default=None, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return self.q_indptr.numel() - 1

    @property
    def num_blocks(self) -> int:
        return self.kv_blocks.numel()

    def num_tokens(self) -> int:
        return int(self.kv_lens.sum()) if self.kv_lens.numel() else 0

    def to(self, device: torch.device | str) -> "BlockBatch":
        device = torch.device(device)
        on_host = self.kv_blocks.device.type == "cpu"
        if device.type == "cpu" and self.host is not None:
            return self.host
        # to a device: asynchronous (the driver stages a pageable source before returning); back
        # to the host: a waited copy, so that the values are there when this returns
        nb = device.type != "cpu"
        out = BlockBatch(*(t.to(device, non_blocking=nb) for t in
                           (self.q_indptr, self.kv_indptr, self.kv_blocks, self.kv_lens)))
        if device.type != "cpu":
            out.host = self if on_host else self.host
        return out

    def host_view(self) -> "BlockBatch":
        """This batch in host memory: itself, the host batch it was copied from, or a copy
        (the last one waits for the device)."""
        if self.kv_blocks.device.type == "cpu":
            return self
        return self.host if self.host is not None else self.to("cpu")

    @classmethod
    def build(cls, q_counts: list[int], blocks: list[list[int]], lens: list[list[int]],
              device: torch.device | str = "cpu") -> "BlockBatch":
        """From per-sequence query counts, block-id lists and valid-token lists."""
        import itertools
        qi = [0, *itertools.accumulate(q_counts)]
        ki = [0, *itertools.accumulate(len(b) for b in blocks)]
        flat_b = [b for bl in blocks for b in bl]
        flat_l = [n for nl in lens for n in nl]
        i32 = dict(dtype=torch.int32, device=device)
        return cls(torch.tensor(qi, **i32), torch.tensor(ki, **i32),
                   torch.tensor(flat_b, **i32), torch.tensor(flat_l, **i32))

    @classmethod
    def empty(cls, q_counts: list[int], device: torch.device | str = "cpu") -> "BlockBatch":
        return cls.build(q_counts, [[] for _ in q_counts], [[] for _ in q_counts], device)
