"""The sub-batches of a pipelined decode step: when a step is split, and where.

A decode step of two or more sequences may run as two interleaved sub-batches
(``engine/graphs.pipelined_pieces``), so that one's CPU work -- attention over the KV it reads in
place, routed experts placed on the CPU -- overlaps the other's GPU work. ``WRITESCOPE_PIPELINE``
(:func:`pipeline_mode`) asks for it where attention has a CPU side; ``WRITESCOPE_PIPELINE_EXPERTS``
(:func:`expert_pipeline_mode`) where routed experts run on the CPU. The cut evens the sub-batches'
CPU attention tokens (:func:`cpu_balanced_groups`), or, with only experts to overlap, their
sequences (:func:`step_groups`).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from ..attention.groups import AttentionStepPlan


#: a decode step is split into sub-batches only with at least this many sequences
PIPELINE_MIN_SEQS = 2


def pipeline_mode() -> str:
    """``WRITESCOPE_PIPELINE``: ``off`` (the default; also 0), ``on`` (1: every decode step with
    CPU work split into two interleaved sub-batches) or ``auto`` (each batch's form chosen from
    measured step times, ``engine/stepform.py``).

    Off by default: on the H200 (DeepSeek-V2-Lite, 4 x 32K) the split step was slower than the
    plain one (53.5-55.5 against 45.8 ms): the CPU kernel read 36 GB/s over twice the calls of
    half the size, against 56 GB/s (bench/results/2026-11-30d-h200). At 4 x 128K it was no
    faster either: 137-147 ms against 126-133 (bench/results/2026-12-02h-h200, call 1; the
    CPU's wait for its queries was hidden in one round of four). With the staged T pieces
    attended at each sub-batch's finish (2026-12-02i-h200): DeepSeek 4 x 128K still slower
    (124-130 ms p50 against 122-123, call 3); Qwen3-30B-A3B 2 x 128K 138.7 against 150.6 ms on
    one host (call 3, the CPU's wait 2 ms a step instead of 16) but 164.8-177.5 against 158.1 on
    the next (call 4). ``auto`` on Qwen3 2 x 128K chose the split form, within the host's drift
    of the plain rows (2026-12-03-h200, call 1)."""
    return _mode("WRITESCOPE_PIPELINE")


def expert_pipeline_mode() -> str:
    """``WRITESCOPE_PIPELINE_EXPERTS``: with routed experts on the CPU, ``auto`` (the default:
    as ``on``, each batch's form chosen from measured step times, ``stepform.py``), ``on`` (1:
    every decode step of two or more sequences whose KV is all in HBM runs as two interleaved
    sub-batches, each one's CPU expert calls overlapping the other's GPU work,
    ``graphs.pipelined_pieces``, each sub-batch attending through resident buffers so that the
    step stays CUDA graphs), ``all`` (every graphed decode step of two or more sequences, also
    those whose attention runs eagerly: measured slower -- Qwen3-30B-A3B 4 x 128K with spilled KV
    on an H200 host 344.5 ms against 333.7 one batch, bench/results/2026-12-07f-h200) or
    ``off`` (0).

    On an H100 host (bench/results/2026-12-05j-h100, call 2; Qwen3-30B-A3B, 32 GiB, batch 4,
    kv auto): FP8 4 x 8K 16.1 ms one batch against 12.6 split (``auto``: 11.8, split chosen),
    FP8 4 x 32K 41.4 against 31.9, bf16 4 x 8K 60.4 against 58.4. The planner predicts the
    split slower where the CPU's work dwarfs the GPU's (every expert on the CPU, short
    contexts), hence ``auto``."""
    v = os.environ.get("WRITESCOPE_PIPELINE_EXPERTS", "auto").strip().lower()
    return "all" if v == "all" else _mode("WRITESCOPE_PIPELINE_EXPERTS", "auto")


def _mode(var: str, default: str = "0") -> str:
    v = os.environ.get(var, default).strip().lower() or default
    if v in ("1", "on", "true", "yes"):
        return "on"
    if v == "auto":
        return "auto"
    if v in ("0", "off", "false", "no"):
        return "off"
    also = ", all" if var == "WRITESCOPE_PIPELINE_EXPERTS" else ""
    raise ValueError(f"{var} must be 0/off, 1/on{also} or auto, got {v!r}")


def cpu_balanced_groups(work, plan: AttentionStepPlan) -> list[int] | None:
    """Two sub-batches of a decode step (sequences in batch order) whose CPU tokens are as
    even as a cut allows, or None when the step is not worth splitting: not a pure decode step,
    fewer than ``PIPELINE_MIN_SEQS`` sequences, or no CPU work to overlap."""
    n = len(work)
    if n < PIPELINE_MIN_SEQS or any(k != 1 for _, _, k in work) or not plan.cpu:
        return None
    cpu = np.zeros(n)
    for _, b in plan.cpu:
        ki = b.kv_indptr.to("cpu").numpy().astype(np.int64)
        cs = np.concatenate(([0], np.cumsum(b.kv_lens.to("cpu").numpy().astype(np.int64))))
        cpu += cs[ki[1:]] - cs[ki[:-1]]
    total = cpu.sum()
    if total <= 0:
        return None
    a = np.cumsum(cpu)[:-1]  # CPU tokens of the first sub-batch, cut after 1 .. n-1 sequences
    k = np.arange(1, n)
    cost = np.abs(2 * a - total) + 1e-6 * total * np.abs(2 * k - n)  # ties: the even cut
    cut = int(k[int(np.argmin(cost))])
    return [cut, n - cut]


def step_groups(work, plan: AttentionStepPlan, split_experts: bool) -> list[int] | None:
    """The sub-batches of a pipelined decode step: balanced by CPU attention tokens
    (:func:`cpu_balanced_groups`), or, where attention has no CPU side but routed experts run on
    the CPU (``split_experts``), by sequences (the first sub-batch takes the odd one)."""
    groups = cpu_balanced_groups(work, plan)
    n = len(work)
    if groups is None and split_experts and n >= PIPELINE_MIN_SEQS and \
            all(k == 1 for _, _, k in work):
        groups = [n - n // 2, n // 2]
    return groups
