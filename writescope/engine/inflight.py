"""Overlapped decode steps: the next step's host work runs while this step's device work does.

A short decode step with all its KV on the GPU spends ~2.5 ms of its ~10 ms on the host with
the device idle: scheduling, the step's index arrays, the cache's bookkeeping, sampling, the
requests' outputs (Qwen3-30B-A3B 2 x 32K on the H200: 10.15 ms a step, 7.26 ms of kernels;
thirty-second session). vLLM v1's asynchronous scheduling hides that time; this is the same idea
in writescope's terms (on the H200: Qwen3-30B-A3B 2 x 32K 9.28 -> 7.75 ms a step, DeepSeek-V2-Lite
4 x 32K 9.52 -> 7.93; bench/results/2026-12-03h-h200, call 1):

1. ``LLMEngine.step`` launches a step (``ModelRunner.launch(defer=True)``). When the step is
   deferrable -- decode tokens only, none of them with penalties, ``min_tokens`` or a grammar
   (``Sampler.can_defer``: those need their last token on the host first; a seeded row's
   number is drawn from its own host generator as the step is launched), the cache step
   reads only G and W on the GPU and completes blocks in G only, copied on the device
   (``InplaceKVCache.step_deferrable``), no CUDA graph waits to be captured, routed experts
   on the CPU only in calls its graphs hold (``layers/cpu_experts_graph.py``: their jobs wait
   on the native queue for words the replay raises, and each call's words come back to 0 by
   the time its next replay reaches it), and
   the step-form chooser does not need its time (``StepForms.needs_timing``) -- the runner
   closes it without waiting for the device, and its tokens, chosen on the device
   (``Sampler.sample_pending``: greedy rows as before, sampled rows as ``Sampler.sample``
   draws them), are copied into page-locked memory behind its work. Its CPU expert calls are
   closed (``cpu_experts.settle``: their failures raised, the queue drained up to them, not
   past them) when its tokens are read.
2. Before waiting for those tokens, the engine launches the step that follows
   (``Scheduler.followup``: the same requests, one token further), its input ids taken on the
   device from the first step's tokens. Then it waits for the first step's tokens, which the
   device has copied while the host prepared the second, and applies them to the requests.
   It waits sleeping (a blocking-sync event, ``attention/hostflag.host_event``): a spinning
   wait took a core from the CPU experts' team while the step ran them, and made batch-1
   steps with every routed expert on the CPU 1.6-1.7x slower than synchronous ones
   (bench/results/2026-12-06d-h100, call 2; 1.05-1.10x faster since, call 6).
3. The next ``step()`` call does the same with the step in flight. A request that finished on
   a token of the first step (EOS, a stop string) was still in the second: what the second
   produces for it is dropped. One that reaches ``max_tokens`` is not put in the second.
   A waiting request, a request still prefilling, or a step that cannot be deferred ends the
   overlap: that step completes before ``step()`` returns, as without overlap.

Every ``step()`` returns one step's outputs (the first call of an overlapped run returns the
first step's; the step it launched is returned by the next call), so callers that count
tokens per call see what they saw before. Every device operation stays on one stream, so the
second step's work follows the first's; the cache's blocks of a request finished while the
second step is in flight may be handed out again only to work queued after it.

``WRITESCOPE_ASYNC_DECODE``: ``auto`` (default) overlaps on CUDA; ``1`` also on the CPU (the
tests: the same code paths, with nothing to overlap); ``0`` never.
"""
from __future__ import annotations

import os

import torch


def overlap_enabled(device: torch.device) -> bool:
    v = os.environ.get("WRITESCOPE_ASYNC_DECODE", "auto").strip().lower()
    if v in ("0", "off", "false", "no"):
        return False
    if v in ("1", "on", "true", "yes"):
        return True
    if v != "auto":
        raise ValueError(f"WRITESCOPE_ASYNC_DECODE={v!r}: use auto, 1 or 0")
    return torch.device(device).type == "cuda"


def next_input_ids(tokens: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The follow-up step's input ids: ``tokens`` (the step in flight's, on the device) at
    ``rows``, without a copy when every row continues."""
    if rows == list(range(tokens.shape[0])):
        return tokens
    from ..hostmem import h2d
    return tokens[h2d(rows, tokens.device, torch.long)]
