"""What the planner's model says about a bench row: the ``static`` policy's share, chosen once,
the roofline model's step and bound for the row (:func:`model_terms`), and where its routed
experts run."""
from __future__ import annotations

from typing import Any

import torch

from .row import _region


def _cpu_expert_item(engine) -> float:
    """Bytes a CPU expert weight takes in ``engine`` (FP8 experts: one, and their scales)."""
    held = engine.model.host_experts()
    if held:
        x = held[0]
        return x.expert_bytes / (3 * x.hidden * x.inter)
    return torch.empty(0, dtype=engine.dtype).element_size()


def static_share_from_profile(profile, cfg, engine, ref_length: int, batch: int = 1
                              ) -> tuple[float, str]:
    """The ``static`` policy's CPU share, chosen once: the roofline's best share for ``batch``
    sequences of ``ref_length`` tokens with this engine's G capacity (the bench passes its
    largest batch: at batch 1 a 32K sequence spills too little for the CPU to pay off, and a
    static split chosen there is ``transfer``)."""
    if profile is None:
        return 0.5, "no hardware profile: the default 0.5"
    from ..planner import roofline as rl
    g_tokens = engine.cache.layout.num_blocks[_region("G")] * engine.cache.bs
    total = float(ref_length) * batch
    resident = min(total, float(g_tokens))
    plan = rl.target_share(profile, cfg, batch, resident, total - resident,
                           tuple(engine.cpu_expert_layers))
    return (float(plan.cpu_share),
            f"roofline target share at {ref_length} tokens, batch {batch}")


def experts_where(engine) -> str:
    """``"cpu"`` when any layer's routed experts run on the CPU (the engine's placement, which
    the row's peer shares), else ``"gpu"``."""
    return "cpu" if any(engine.cpu_expert_layers) else "gpu"


def model_terms(profile, cfg, engine, policy: str, batch: int, ctx: int, decode_steps: int,
                static_share: float, cpu_expert_bytes: float | None = None,
                prompt_lengths: list[int] | None = None) -> dict[str, Any]:
    """The roofline model's step time for this policy and the roofline bound (mid-decode); and
    the two byte counts issue 6's experts-on-CPU target compares: the KV that spills past G per
    decode step, and the routed-expert weights the CPU reads per step (uniform routing). With
    ``cpu_expert_bytes`` (the row's measured mean) the bound charges the experts actually read.
    ``prompt_lengths``: the row's prompts (default: ``batch`` of ``ctx`` tokens)."""
    from ..planner import roofline as rl
    lengths = [n + decode_steps // 2 for n in (prompt_lengths or [ctx] * batch)]
    g_tokens = float(engine.cache.layout.num_blocks[_region("G")] * engine.cache.bs)
    on_cpu = tuple(engine.cpu_expert_layers)  # per layer: experts="auto" may split them
    spilled = sum(lengths) - sum(rl.resident_tokens(lengths, g_tokens))
    expert_params = rl.layer_param_counts(cfg, min(cfg.moe_layers))["expert"] \
        if cfg.moe_layers else 0
    out: dict[str, Any] = {
        "spilled_kv_bytes_per_step": spilled * cfg.kv_bytes_per_token(engine.dtype),
        "cpu_expert_bytes_per_step": (
            rl.active_experts(cfg.num_experts, cfg.num_experts_per_tok, batch) * expert_params
            * _cpu_expert_item(engine) * sum(engine.cpu_expert_layers))}
    if profile is None:
        out.update(model_step_s=None, roofline_bound_s=None)
        return out
    pol = {"migrate": "writescope"}.get(policy, policy)
    try:
        sp = rl.plan_for_lengths(profile, cfg, lengths, g_tokens, on_cpu, pol, static_share=static_share)
        out["model_step_s"], out["model_cpu_share"] = sp.prediction.step_s, sp.cpu_share
    except ValueError:
        out["model_step_s"] = None
    out["roofline_bound_s"] = rl.roofline_bound_s(profile, cfg, lengths, g_tokens, on_cpu,
                                                  cpu_expert_bytes)
    return out
