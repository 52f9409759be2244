"""Runs one step's attention plan: the CPU attends its blocks, the GPU attends the rest, one merge.

Plan once per step (:meth:`HybridAttention.begin_step`), run per layer (:meth:`attend`).
The plan is pure data built by the cache: per side, a list of ``(region, BlockBatch)`` over that
region's pool. Reading a T block from the GPU side stages it into HBM first (a read, never a
move); the CPU reads C blocks, and T blocks when assigned, in place.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..kvcache.regions import KVSpec, Region
from .batch import BlockBatch
from .merge import merge_many
from .torch_paged import attend_torch


@dataclass
class AttentionStepPlan:
    spec: KVSpec
    scale: float
    num_q_rows: int
    gpu: list[tuple[Region, BlockBatch]] = field(default_factory=list)
    cpu: list[tuple[Region, BlockBatch]] = field(default_factory=list)


def _layout(region: Region) -> str:
    return "cpu" if region is Region.C else "gpu"


def cpu_kernel():
    """The CPU attention kernel (compiled when possible), or the torch path."""
    try:
        from .cpu import attend_cpu
        return attend_cpu
    except ImportError:
        return attend_torch


class HybridAttention:
    def __init__(self, pools: dict[Region, torch.Tensor], spec: KVSpec, device: torch.device,
                 cpu_threads: int | None = None):
        self.pools = pools
        self.spec = spec
        self.device = torch.device(device)
        self.cpu_threads = cpu_threads
        self._cpu_attend = cpu_kernel()
        self.plan: AttentionStepPlan | None = None
        self.timings = {"cpu_s": 0.0, "gpu_s": 0.0, "pcie_s": 0.0}

    def begin_step(self, plan: AttentionStepPlan) -> None:
        self.plan = plan
        self.timings = {"cpu_s": 0.0, "gpu_s": 0.0, "pcie_s": 0.0}
        self._gpu = [(r, b.to(self.device)) for r, b in plan.gpu]
        self._cpu = [(r, b.to("cpu")) for r, b in plan.cpu]

    def attend(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of this step's queries over every cached block in the plan, for one layer."""
        plan = self.plan
        assert plan is not None, "begin_step first"
        parts = []
        t0 = time.perf_counter()
        for region, batch in self._gpu:
            kv = self.pools[region][layer]
            if kv.device != self.device:  # T on a CUDA machine: stage the listed blocks
                kv, batch = self._stage(kv, batch)
            parts.append(attend_torch(q, kv, _layout(region), plan.spec, batch, plan.scale))
        t1 = time.perf_counter()
        if self._cpu:
            q_cpu = q.to("cpu")
            for region, batch in self._cpu:
                kv = self.pools[region][layer]
                o, l = self._cpu_attend(q_cpu, kv, _layout(region), plan.spec, batch, plan.scale)
                parts.append((o.to(self.device), l.to(self.device)))
        t2 = time.perf_counter()
        self.timings["gpu_s"] += t1 - t0
        self.timings["cpu_s"] += t2 - t1
        if not parts:
            nq, hq = q.shape[0], q.shape[1]
            return (torch.zeros(nq, hq, plan.spec.v_dim, dtype=torch.float32, device=q.device),
                    torch.full((nq, hq), float("-inf"), dtype=torch.float32, device=q.device))
        return merge_many(parts)

    def _stage(self, kv: torch.Tensor, batch: BlockBatch) -> tuple[torch.Tensor, BlockBatch]:
        ids = batch.kv_blocks.to("cpu").long()
        staged = kv.index_select(0, ids).to(self.device, non_blocking=True)
        remap = torch.arange(ids.numel(), dtype=torch.int32, device=self.device)
        return staged, BlockBatch(batch.q_indptr, batch.kv_indptr, remap, batch.kv_lens)

    def end_step(self) -> dict[str, float]:
        self.plan = None
        return dict(self.timings)
