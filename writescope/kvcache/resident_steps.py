"""Decode steps whose attention runs through resident buffers (``attention/resident.py``).

A decode step whose cached KV is all on the GPU (G and W blocks, one new token a sequence,
blocks completed in G only) attends through fixed device buffers, so a CUDA graph can hold its
attention and the whole forward pass replays as one graph. :class:`ResidentSteps` is the part of
:class:`~writescope.kvcache.cache.InplaceKVCache` that loads such a step into those buffers
(one set per sub-batch of a pipelined step), attends and writes through them, and copies the
blocks a step completes from their W slots to G at its end.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import torch

from ..attention.groups import AttentionStepPlan, slice_batch
from ..attention.resident import ResidentAttention
from ..hostmem import h2d
from .pools import KVCacheError
from .regions import Region


def resident_mode() -> str:
    """``WRITESCOPE_RESIDENT_ATTENTION``: ``on`` (the default; 1) -- a graphed decode step whose
    cached KV is all on the GPU attends through fixed buffers on CUDA (attention/resident.py),
    so its whole forward pass is one graph; ``off`` (0) -- through the hybrid side, eagerly, as
    every step did before; ``force`` -- also where the hybrid side runs the torch backend and
    where other pieces of the step are not graph-safe (the CPU tests, with Triton's interpreter
    running the kernels; ``graphs.DecodeGraphs.resident_rows``)."""
    v = os.environ.get("WRITESCOPE_RESIDENT_ATTENTION", "1").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    return "force" if v == "force" else "on"


class ResidentSteps:
    """The resident-step methods of :class:`~writescope.kvcache.cache.InplaceKVCache` (a mixin;
    the cache's ``__init__`` sets ``resident``, ``resident_groups``, ``pools``, ``hybrid`` and
    the counters they use)."""

    def _load_resident(self, step: dict, plan: AttentionStepPlan, rows: int) -> tuple | None:
        """The step's key in :attr:`resident`'s buffers, or None when it cannot run there (see
        :meth:`begin_step`; ``WRITESCOPE_RESIDENT_ATTENTION=0`` never, ``=force`` also off CUDA,
        where Triton's interpreter runs the kernels)."""
        if not self._resident_possible(step, plan):
            return None
        if self.resident is None:
            self.resident = self._new_resident()
        return self.resident.load(plan, rows, *self._resident_w(step))

    def _resident_possible(self, step: dict, plan: AttentionStepPlan) -> bool:
        """Whether the step may attend through resident buffers: the mode allows it and the
        step reads G and W blocks only, one new token a sequence, and completes blocks in G
        only (each from its W slot, :meth:`_seal_from_w`)."""
        mode = resident_mode()
        if mode == "off" or (mode == "on" and self.hybrid.backend != "triton"):
            return False
        return len(step["seal_w"]) == len(step["new_blocks"]) and ResidentAttention.eligible(
            plan, [n for _, _, n in step["work"]])

    @staticmethod
    def _resident_w(step: dict) -> tuple[np.ndarray, np.ndarray]:
        """The W slots a resident step writes its new tokens to: each row's (``w_host``), and
        the last slot of a W tail for a row whose token completes its block (``seal_w``)."""
        w_src, w_dst = step["w_host"]
        seal = step["seal_w"]
        if not seal:
            return w_src, w_dst
        return (np.concatenate((np.asarray(w_src, np.int64), [s[0] for s in seal])),
                np.concatenate((np.asarray(w_dst, np.int64), [s[1] for s in seal])))

    def _seal_from_w(self, step: dict) -> None:
        """A resident step's completed blocks, whole in their W slots once its layers have
        run, copied to their homes in G for every layer (two launches, queued behind the step's
        work on its stream)."""
        seal = step["seal_w"]
        g, w = self.pools[Region.G], self.pools[Region.W]  # both in the GPU layout, on one device
        slots = h2d([s[2] for s in seal], w.device, torch.long)
        ids = h2d([s[3] for s in seal], g.device, torch.long)
        g.index_copy_(1, ids, w.index_select(1, slots))
        self.counters["kv.bytes_written.G"] += len(seal) * self.block_bytes
        self.counters["kv.blocks_sealed_from_w"] += len(seal)

    def _new_resident(self) -> ResidentAttention:
        return ResidentAttention(self.pools, self.spec, self.scale, self.device,
                                 self.hybrid.chunk_blocks)

    def _load_resident_groups(self, step: dict, plan: AttentionStepPlan,
                              group_rows: Callable[[int], int | None]) -> tuple | None:
        """:meth:`_load_resident` for each sub-batch of a pipelined step, into buffers of its
        own (:attr:`resident_groups`): the tuple of their keys, or None when the step (or a
        sub-batch's size) cannot run there."""
        if not self._resident_possible(step, plan):
            return None
        counts = step["groups"]
        rows = [group_rows(c) for c in counts]
        if any(r is None for r in rows):
            return None
        while len(self.resident_groups) < len(counts):
            self.resident_groups.append(self._new_resident())
        w_src, w_dst = self._resident_w(step)
        keys, s0 = [], 0
        for g, (c, r) in enumerate(zip(counts, rows)):
            s1 = s0 + c  # one row per sequence (eligible): rows s0:s1 are the group's
            sub = AttentionStepPlan(
                self.spec, self.scale, c, q_indptr=torch.arange(c + 1, dtype=torch.int32),
                gpu=[(reg, slice_batch(b, s0, s1)) for reg, b in plan.gpu if b.num_blocks])
            sel = (w_src >= s0) & (w_src < s1)
            keys.append(self.resident_groups[g].load(sub, r, w_src[sel] - s0, w_dst[sel]))
            s0 = s1
        return tuple(keys)

    @property
    def step_resident(self) -> tuple | None:
        """The open step's key in the resident buffers (part of its graph's key), or None when
        its attention runs through the hybrid side. A pipelined step's: one key per sub-batch."""
        return None if self._step is None else self._step["resident"]

    def _resident_for(self, group: int | None) -> ResidentAttention:
        r = self.resident if group is None else (
            self.resident_groups[group] if group < len(self.resident_groups) else None)
        if r is None or r.key is None:
            raise KVCacheError("attend_resident without a resident step loaded")
        return r

    def attend_resident(self, layer: int, q: torch.Tensor, records: torch.Tensor,
                        group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`attend_cached` for a resident step, over its padded rows (``group``: one
        sub-batch's, of a pipelined step): reads and writes only fixed buffers, so a CUDA graph
        may hold it (also between steps, when the graph is captured from the step that just
        ran)."""
        r = self._resident_for(group)
        out, lse = r.attend(layer, q)
        r.write(layer, records)
        return out, lse

    def attend_resident_merged(self, layer: int, q: torch.Tensor, records: torch.Tensor,
                               group: int | None = None) -> torch.Tensor:
        """:meth:`attend_resident` and the self merge (``decode_self_merge``) in one: the
        layer's attention output in ``q``'s dtype, the new tokens over themselves merged (and
        their records written) in the launch that merges the cached partials
        (``ResidentAttention.attend_merged``)."""
        return self._resident_for(group).attend_merged(layer, q, records)
