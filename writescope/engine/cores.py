"""Cores the CPU kernels' thread teams leave to the thread that launches GPU work and to the
driver's threads, on a GPU host."""
from __future__ import annotations

import os


def reserved_launch_cores(n: int) -> int:
    """Cores a GPU host with ``n`` usable cores keeps out of the CPU attention team: one from 8
    up, none below (see :func:`reserve_launch_core`)."""
    return 0 if n < 8 else 1


def reserved_expert_cores(n: int) -> int:
    """Cores a GPU host with ``n`` usable cores keeps out of the CPU experts' team: one from 8
    up, none below -- the attention team's rule (until the sixty-sixth session two from 12).
    On a 16-core H100 host, 15 threads against 14 on issue 6's Qwen3-30B-A3B 1 x 1K batch-1 row
    (every routed expert on the CPU): 35.93 / 34.27 ms a step against 38.28 / 35.35 in two
    rounds of alternating order, 16 threads in between (bench/results/2026-12-06f-h100 call 2);
    on the H200 host the same at 4 x 128K (310.6 / 314.4 ms at 15 against 310.4 / 314.6 at 14,
    bench/results/2026-12-04f-h200 call 2)."""
    return reserved_launch_cores(n)


def reserve_launch_core() -> None:
    """On a GPU host, the CPU kernels (attention, experts) leave cores to the thread that
    launches GPU work and to the driver's threads: an OpenMP team spread over every core makes
    that thread, and with it the team's own barrier, wait on a shared core (one descheduled team
    member stalls the whole parallel region for a scheduler time slice, see
    ``attention/hostflag.py``). The attention team leaves one core where there are 8 or more
    (the H200 host has 16: 15 threads), and so does the experts' team; none below 8. Explicit
    thread counts (``cpu_threads``, the environment variables) win.
    (The attention team's size in the hybrid decode steps, bench/results/2026-12-04d-h200 calls
    1 and 3, DeepSeek-V2-Lite 4 x 128K and Qwen3-30B-A3B 2 x 128K with the experts on the GPU,
    15 threads against 14 in rounds of alternating order: 0.939-0.973x the step in all four
    DeepSeek pairs, 0.949-0.986x in three Qwen3 pairs and 1.093x in one; the CPU side attended
    69-72 GB/s against 62-69 in call 3. All 16 cores: 0.967-0.975x in call 1's two DeepSeek pairs;
    126.8-129.1 ms against 125.9-132.5 in bench/results/2026-12-02h-h200 call 1.)"""
    from ..attention import cpu as cpu_attn
    from ..layers import cpu_experts
    n = cpu_attn._usable_cores()
    k = reserved_launch_cores(n)
    if k == 0:
        return
    cpu_attn.reserve_cores(k)
    if not os.environ.get("WRITESCOPE_CPU_EXPERT_THREADS"):
        cpu_experts.set_num_threads(n - reserved_expert_cores(n))
