"""The bench's host memory: the pinned (T) and host (C) budgets a grid gives its engines by
default, the weight bytes an engine will keep in host memory, and what an engine holds there
once built."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from .row import _region

if TYPE_CHECKING:
    from .grid import GridSpec


#: host memory the grid's default T/C budgets leave to the OS, torch, CUDA and the rest
HOST_RESERVE_BYTES = 10 * 2**30


def host_weight_bytes(cfg, spec: GridSpec, max_model_len: int) -> int:
    """Weight bytes the engine will keep in host memory: the routed experts it places on the CPU
    (the same choice as the engine's, ``layers/expert_placement.py``, with the activations it
    will measure, estimated: ``planner/activations.py``), every weight when the device is the
    CPU."""
    from ..engine.model_source import parse_dtype
    from ..layers.expert_placement import choose_expert_layers, expert_placement_summary
    from ..units import is_auto, parse_bytes
    dtype = parse_dtype(spec.dtype)
    cuda = (spec.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if not cuda:
        return cfg.param_counts()["total"] * torch.empty(0, dtype=dtype).element_size()
    vram = parse_bytes(spec.vram_budget) if spec.vram_budget is not None else None
    try:
        auto_kv = is_auto(spec.kv_cache_memory)
        kv_floor = (parse_bytes(spec.kv_cache_memory)
                    if spec.kv_cache_memory is not None and not auto_kv else 0)
        # --kv-cache-memory auto may put every layer's experts on the CPU: plan host memory so
        margin = None  # auto's split: the margin with CPU experts (the upload buffer's too)
        if vram is not None and not auto_kv and str(spec.experts).lower() == "auto":
            from ..planner.expert_split import estimated_margin
            margin = estimated_margin(cfg, vram, spec.max_num_batched_tokens, max_model_len,
                                      dtype)(1)
        flags = choose_expert_layers(cfg, "cpu" if auto_kv else spec.experts, vram,
                                     max(cfg.kv_bytes_per_token(dtype) * max_model_len, kv_floor),
                                     dtype, margin_bytes=margin)
    except ValueError:  # the engine will say why; nothing to plan for
        return 0
    return expert_placement_summary(cfg, flags, dtype)["cpu_expert_bytes"]


def default_host_budgets(cfg, spec: GridSpec, max_model_len: int | None = None) -> tuple[Any, Any]:
    """Pinned (T) and host (C) budgets: as given, else each large enough for the largest row's
    spilled KV (its whole KV less the G blocks ``--num-gpu-blocks`` asks for) -- so that
    ``transfer`` (all spilled KV in T) and ``cpu`` (all in C) can run every row -- capped at a
    quarter (pinned) and half (host) of this machine's memory, and together at what host memory
    has left beside the weights kept there (host-resident experts) and
    :data:`HOST_RESERVE_BYTES`. A row over a capped budget fails with that reason; without the
    cap, the T pool (page-locked) and the C pages it touches could exhaust host memory and
    take the whole run down."""
    from ..engine.model_source import parse_dtype
    from ..hostmem import available_ram_bytes, ram_bytes
    from ..kvcache.regions import DEFAULT_BLOCK_SIZE
    bs = spec.block_size or DEFAULT_BLOCK_SIZE
    bb = cfg.kv_spec(parse_dtype(spec.dtype)).block_bytes(bs)
    from .row import UNTIMED_DECODE_STEPS
    need = max(b * (math.ceil((n + spec.decode_steps + UNTIMED_DECODE_STEPS + 2) / bs) + 1) * bb
               for b in spec.batches for n in spec.context_lengths)
    if spec.num_gpu_blocks is not None:
        need = max(bb, need - spec.num_gpu_blocks * bb)
    ram = ram_bytes()
    pinned_cap, host_cap = ram // 4, ram // 2
    avail = available_ram_bytes()
    if avail is not None and max_model_len is not None:
        room = max(0, avail - host_weight_bytes(cfg, spec, max_model_len) - HOST_RESERVE_BYTES)
        if spec.pinned_budget is None and spec.host_budget is None:
            pinned_cap, host_cap = min(pinned_cap, room // 2), min(host_cap, room // 2)
        elif spec.pinned_budget is None:
            from ..units import parse_bytes
            pinned_cap = min(pinned_cap, max(0, room - parse_bytes(spec.host_budget)))
        elif spec.host_budget is None:
            from ..units import parse_bytes
            host_cap = min(host_cap, max(0, room - parse_bytes(spec.pinned_budget)))
    pinned = spec.pinned_budget if spec.pinned_budget is not None else min(need, pinned_cap)
    host = spec.host_budget if spec.host_budget is not None else min(need, host_cap)
    return pinned, host


def host_memory_summary(engine) -> dict[str, int | None]:
    """Host bytes the engine holds after its build: routed experts kept there, the T pool
    (page-locked on CUDA), the C pool (pageable: resident only where written), and what the
    kernel reports available now."""
    from ..hostmem import available_ram_bytes
    experts = sum(x.nbytes for x in engine.model.host_experts())
    pools = engine.cache.pools
    nbytes = {r: pools[_region(r)].numel() * pools[_region(r)].element_size() for r in "TC"}
    return {"experts": experts, "T pool": nbytes["T"], "C pool": nbytes["C"],
            "MemAvailable": available_ram_bytes()}
