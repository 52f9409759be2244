"""Routed experts against KV in HBM: how many MoE layers' experts go to the CPU.

Under a VRAM budget every MoE layer whose routed experts stay on the GPU takes HBM that the G
region could give to KV. A step reads only the few experts its tokens route to, but every
cached token's KV, so once a workload's KV spills, a layer's bytes as G blocks can be worth
more than its experts on the GPU; while the KV fits, each layer kept on the GPU saves CPU
time. This module weighs the two with the roofline model (:mod:`.roofline`): for each count
``k`` of MoE layers whose experts go to the CPU (the first ``k``, as ``experts="auto"`` moves
them), writescope's predicted step for a batch, and the engine option that gives that split:
``experts="cpu"`` for all of them, else the ``kv_cache_memory`` with which ``experts="auto"``
chooses exactly ``k`` (:func:`kv_memory_for_split`) -- the G region then holds that many bytes.

Used by ``writescope plan --experts auto`` (its table) and by ``kv_cache_memory="auto"`` (the
engine sizes its KV for ``max_num_seqs`` sequences of ``max_model_len`` tokens).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Union

import torch

from ..layers.expert_placement import cpu_layer_order
from . import roofline as rl

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from .profile import HardwareProfile

__all__ = ["kv_memory_for_split", "split_options", "split_step", "best_split", "Margin",
           "estimated_margin"]

#: the device bytes a split keeps for activations and staging: None (``auto``'s default margin),
#: a byte count, or one per CPU layer count (the upload buffer exists only with CPU experts)
Margin = Union[int, None, Callable[[int], int]]


def kv_memory_for_split(cfg: "ModelConfig", vram_budget: int, n_cpu: int,
                        dtype: torch.dtype = torch.bfloat16, device=None,
                        margin_bytes: int | None = None) -> int | None:
    """The ``kv_cache_memory`` with which ``experts="auto"`` puts the routed experts of exactly
    ``n_cpu`` MoE layers on the CPU (``layers/expert_placement.kv_bytes_for_split``), with
    ``margin_bytes`` of the budget kept for activations and staging (None: ``auto``'s default
    margin)."""
    from ..layers.expert_placement import kv_bytes_for_split
    return kv_bytes_for_split(cfg, vram_budget, n_cpu, dtype, device, margin_bytes)


def estimated_margin(cfg: "ModelConfig", vram_budget: int, max_num_batched_tokens: int,
                     max_model_len: int, dtype: torch.dtype = torch.bfloat16
                     ) -> Callable[[int], int]:
    """The margin per CPU layer count that an engine on CUDA measures and keeps
    (``planner/activations.reserve_bytes``), never below ``auto``'s default margin: what
    ``writescope plan`` and the bench grid plan with, so that their split is the engine's."""
    from ..layers.expert_placement import default_margin_bytes
    from .activations import reserve_bytes
    est = {c: reserve_bytes(cfg, dtype, max_num_batched_tokens, max_model_len, cpu_experts=c)
           for c in (False, True)}
    floor = default_margin_bytes(vram_budget)
    return lambda k: max(est[k > 0], floor)


def _margin_at(margin_bytes: Margin, k: int) -> int | None:
    return int(margin_bytes(k)) if callable(margin_bytes) else margin_bytes


def split_options(cfg: "ModelConfig", vram_budget: int, min_kv_bytes: int = 0,
                  dtype: torch.dtype = torch.bfloat16, device=None,
                  margin_bytes: Margin = None) -> dict[int, int | None]:
    """Every split the engine can be given: CPU layer count -> its ``kv_cache_memory`` (None:
    all of them, ``experts="cpu"``). A count whose value is below ``min_kv_bytes`` (the KV of
    one ``max_model_len`` sequence, which ``auto`` always sets aside) cannot be had."""
    n_moe = len(cfg.moe_layers)
    out: dict[int, int | None] = {n_moe: None}
    for k in range(n_moe):
        x = kv_memory_for_split(cfg, vram_budget, k, dtype, device,
                                _margin_at(margin_bytes, k))
        if x is not None and x >= min_kv_bytes:
            out[k] = x
    return out


def split_step(profile: "HardwareProfile", cfg: "ModelConfig", lengths: list[int],
               vram_budget: int, n_cpu: int, kv_cache_memory: int | None = None,
               reserve_bytes: int | None = None, pipelined: rl.Pipelined = False) -> float | None:
    """writescope's predicted step for ``lengths`` with ``n_cpu`` MoE layers' experts (those
    ``auto`` places first, ``expert_placement.cpu_layer_order``)
    on the CPU and the G region capped at ``kv_cache_memory`` (None: what the weights and
    ``reserve_bytes`` leave -- by default the roofline's 1 GiB reserve); None where the weights
    alone exceed the budget or no KV fits beside them. ``pipelined``: the form of the decode
    steps (``roofline.Pipelined``: ``"on"``, steps with CPU experts and all KV in HBM as two
    sub-batches, ``WRITESCOPE_PIPELINE_EXPERTS=1``; ``"auto"``, those in the faster form)."""
    flags = frozenset(cpu_layer_order(cfg.moe_layers)[:n_cpu])
    g = rl.gpu_kv_capacity_tokens(cfg, vram_budget, flags) if reserve_bytes is None else \
        rl.gpu_kv_capacity_tokens(cfg, vram_budget, flags, reserve_bytes)
    if kv_cache_memory is not None:
        g = min(g, kv_cache_memory / (rl.kv_bytes_per_token_layer(cfg) * cfg.num_layers))
    if rl.gpu_weight_bytes(cfg, flags) > vram_budget or g <= 0:
        return None
    return rl.plan_for_lengths(profile, cfg, lengths, g, flags, "writescope",
                               pipelined=pipelined).prediction.step_s


def best_split(profile: "HardwareProfile", cfg: "ModelConfig", lengths: list[int],
               vram_budget: int, min_kv_bytes: int = 0, dtype: torch.dtype = torch.bfloat16,
               device=None, margin_bytes: Margin = None, min_cpu_layers: int = 0,
               pipelined: rl.Pipelined = False) -> dict | None:
    """The split of the fastest predicted step for a batch of ``lengths``, as the engine would
    run it: ``{"cpu_layers", "kv_cache_memory" (None: experts="cpu"), "step_s"}``, the fewest
    CPU layers among equal predictions; None where no split fits. ``margin_bytes``: the budget
    kept for activations and staging, beside each split's experts and beside its G region
    (None: ``auto``'s default margin, and the roofline's 1 GiB reserve for G; the engine
    passes what it measured once the model is built; ``writescope plan``,
    :func:`estimated_margin`); ``min_cpu_layers``: the fewest CPU layers to consider (a built
    engine can move experts to the CPU, not back); ``pipelined``: as :func:`split_step`."""
    best = None
    for k, x in sorted(split_options(cfg, vram_budget, min_kv_bytes, dtype, device,
                                     margin_bytes).items()):
        if k < min_cpu_layers:
            continue
        s = split_step(profile, cfg, lengths, vram_budget, k, x, _margin_at(margin_bytes, k),
                       pipelined)
        if s is not None and (best is None or s < best["step_s"]):
            best = {"cpu_layers": k, "kv_cache_memory": x, "step_s": s}
    return best
