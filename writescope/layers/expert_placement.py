"""Where each MoE layer's routed experts live: ``experts="gpu" | "cpu" | "auto"``.

``choose_expert_layers`` returns, per layer, whether that layer's routed experts run on the CPU
(:class:`~writescope.layers.cpu_experts.CpuExperts`). Dense layers and everything that is not a
routed expert (attention, norms, router, shared experts, embeddings) always stay on the GPU.

* ``gpu``  — every routed expert on the GPU (raises if a VRAM budget is given and it cannot hold
  them with the margin; the KV takes what is left and spills to the host past it -- a run with
  "8 GB of KV in HBM" at 128K tokens per sequence is one whose sequence does not fit there);
* ``cpu``  — every MoE layer's routed experts on the CPU (as llama.cpp ``--cpu-moe``);
* ``auto`` — everything on the GPU when all weights + the KV the workload needs + an
  activation/staging margin fit the budget; otherwise as many MoE layers as fit keep their experts
  on the GPU and the others go to the CPU. The KV the workload needs is the engine's: one sequence
  of ``max_model_len`` tokens, or ``kv_cache_memory`` when that asks for more (the engine's
  option: experts placed around the KV asked for). The layers that go to the CPU are spread
  over the model (:func:`cpu_layer_order`), not the first ones as llama.cpp's ``--n-cpu-moe N``
  takes: in a one-batch step which layers move does not change the step time, only how many,
  but a pipelined step (``WRITESCOPE_PIPELINE_EXPERTS``) overlaps one sub-batch's CPU experts
  with the other's GPU layers up to the next CPU layer, which contiguous CPU layers leave
  nearly empty.
  No budget (``None``: no GPU limit, e.g. a CPU-only machine where "GPU" is the in-process device)
  means everything stays on the "GPU" path.
"""
from __future__ import annotations

import torch

from ..models.config import ModelConfig

__all__ = ["choose_expert_layers", "cpu_layer_order", "default_margin_bytes",
           "expert_placement_summary", "cpu_layer_expert_bytes", "EXPERT_MODES"]

EXPERT_MODES = ("gpu", "cpu", "auto")
GiB = 2**30


def default_margin_bytes(vram_budget_bytes: int) -> int:
    """Activation / staging / allocator-fragmentation margin kept free inside the budget:
    1 GiB or 5 % of the budget, whichever is larger."""
    return max(GiB, vram_budget_bytes // 20)


def _validate(cfg, experts, vram_budget_bytes, kv_bytes_needed, dtype, margin_bytes) -> str:
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    if not isinstance(experts, str) or experts.lower() not in EXPERT_MODES:
        raise ValueError(f"experts must be one of {', '.join(map(repr, EXPERT_MODES))}, got {experts!r}")
    if vram_budget_bytes is not None and (isinstance(vram_budget_bytes, bool)
                                          or not isinstance(vram_budget_bytes, int)
                                          or vram_budget_bytes <= 0):
        raise ValueError(f"vram_budget_bytes must be a positive int or None, got {vram_budget_bytes!r}")
    if isinstance(kv_bytes_needed, bool) or not isinstance(kv_bytes_needed, int) or kv_bytes_needed < 0:
        raise ValueError(f"kv_bytes_needed must be an int >= 0, got {kv_bytes_needed!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if margin_bytes is not None and (not isinstance(margin_bytes, int) or margin_bytes < 0):
        raise ValueError(f"margin_bytes must be an int >= 0 or None, got {margin_bytes!r}")
    return experts.lower()


def _gb(b: int) -> str:
    """In the units the budgets are given and reported in (``32 GiB``), not decimal GB."""
    from ..units import format_bytes
    return format_bytes(b)


def choose_expert_layers(cfg: ModelConfig, experts: str, vram_budget_bytes: int | None,
                         kv_bytes_needed: int, dtype: torch.dtype,
                         margin_bytes: int | None = None, device=None) -> list[bool]:
    """Per layer: are this layer's routed experts on the CPU? (see the module docstring)

    ``kv_bytes_needed``: GPU bytes the KV cache of the workload needs (its G/W regions and staging);
    ``margin_bytes``: activation/staging margin (default :func:`default_margin_bytes`);
    ``device``: the compute device (None: a CUDA device), which decides whether an FP8
    checkpoint's experts stay FP8 there (``moe.StackedExperts.fp8_unsupported``).
    Raises ``ValueError`` on bad values and when the budget cannot hold what must stay on the GPU.
    """
    mode = _validate(cfg, experts, vram_budget_bytes, kv_bytes_needed, dtype, margin_bytes)
    n = cfg.num_layers
    moe = list(cfg.moe_layers)
    if mode == "cpu":
        s = set(moe)
        flags = [i in s for i in range(n)]
        if vram_budget_bytes is not None:
            _check_fits(cfg, flags, vram_budget_bytes, kv_bytes_needed, dtype, margin_bytes, mode,
                        device)
        return flags
    if vram_budget_bytes is None:
        return [False] * n
    all_gpu = [False] * n
    if mode == "gpu":  # the placement was asked for: the KV fits around it (the engine checks)
        _check_fits(cfg, all_gpu, vram_budget_bytes, 0, dtype, margin_bytes, mode, device)
        return all_gpu
    # auto
    pc = cfg.param_counts()
    base, per_layer = _auto_sizes(cfg, vram_budget_bytes, dtype, margin_bytes, device)
    fixed = base + kv_bytes_needed
    if fixed + pc["routed_experts"] * _device_expert_itemsize(cfg, dtype, device) \
            <= vram_budget_bytes:
        return all_gpu
    free = vram_budget_bytes - fixed
    if free < 0:
        _check_fits(cfg, [i in set(moe) for i in range(n)], vram_budget_bytes, kv_bytes_needed,
                    dtype, margin_bytes, mode, device)
    keep = min(len(moe), max(0, free) // per_layer) if per_layer else len(moe)
    on_cpu = set(cpu_layer_order(moe)[: len(moe) - keep])
    return [i in on_cpu for i in range(n)]


def cpu_layer_order(moe_layers, on_cpu=()) -> list[int]:
    """The MoE layers not in ``on_cpu``, in the order their routed experts go to the CPU: each
    next one the farthest from the CPU layers before it, the model's ends counting as mirror
    images (a half gap there is as good as a whole one between two CPU layers), the lower of
    two equally far. Any first ``k`` of them are spread over the model; ``auto`` places the
    first ``k``, and the engine's later moves (``LLMEngine._fit_experts_around_kv``) take the
    next ones, so the layers stay spread and a moved placement equals the one placed at
    once."""
    moe = sorted(int(i) for i in moe_layers)
    m = len(moe)
    pos = {layer: p for p, layer in enumerate(moe)}
    placed = [pos[i] for i in on_cpu if i in pos]
    free = [p for p in range(m) if p not in set(placed)]
    out: list[int] = []

    def gap(p: int) -> float:
        return min([2 * p + 1, 2 * (m - p) - 1] + [abs(p - q) for q in placed])

    while free:
        best = max(free, key=lambda p: (gap(p), -p))
        free.remove(best)
        placed.append(best)
        out.append(moe[best])
    return out


def _auto_sizes(cfg, budget, dtype, margin_bytes=None, device=None) -> tuple[int, int]:
    """``auto``'s arithmetic: (the bytes that stay on the GPU whatever the split -- the weights
    that are not routed experts and the margin --, one MoE layer's routed experts on the GPU)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    pc = cfg.param_counts()
    margin = default_margin_bytes(budget) if margin_bytes is None else margin_bytes
    per_layer = int(cfg.num_experts * pc["expert"] * _device_expert_itemsize(cfg, dtype, device))
    return pc["other"] * itemsize + margin, per_layer


def kv_bytes_for_split(cfg: ModelConfig, vram_budget_bytes: int, n_cpu: int,
                       dtype: torch.dtype = torch.bfloat16, device=None,
                       margin_bytes: int | None = None) -> int | None:
    """The inverse of ``auto``: the KV need (``kv_cache_memory``) with which
    :func:`choose_expert_layers` puts exactly ``n_cpu`` MoE layers' routed experts on the CPU
    under ``vram_budget_bytes`` -- the most KV that split leaves room for, rounded down to a
    MiB --, or None where no value gives that split. ``margin_bytes`` as in
    :func:`choose_expert_layers` (the engine passes the activations it measured)."""
    n_moe = len(cfg.moe_layers)
    if not 0 <= n_cpu <= n_moe:
        return None
    base, per_layer = _auto_sizes(cfg, vram_budget_bytes, dtype, margin_bytes, device)
    x = (vram_budget_bytes - base - (n_moe - n_cpu) * per_layer) // 2**20 * 2**20
    if x <= 0:
        return None
    try:  # the rounding, and "everything fits" past the top, can give another split
        got = sum(choose_expert_layers(cfg, "auto", vram_budget_bytes, x, dtype,
                                       margin_bytes=margin_bytes, device=device))
    except ValueError:
        return None
    return x if got == n_cpu else None


def _check_fits(cfg, flags, budget, kv, dtype, margin_bytes, mode, device=None) -> None:
    s = expert_placement_summary(cfg, flags, dtype, device)
    margin = default_margin_bytes(budget) if margin_bytes is None else margin_bytes
    need = s["gpu_weight_bytes"] + kv + margin
    if need > budget:
        hint = ("use experts='auto' or 'cpu'" if mode == "gpu" else
                "even with every routed expert on the CPU; lower the KV need or raise the budget")
        raise ValueError(
            f"experts={mode!r}: GPU weights {_gb(s['gpu_weight_bytes'])} + KV {_gb(kv)} + margin "
            f"{_gb(margin)} = {_gb(need)} exceed the VRAM budget of {_gb(budget)} ({hint})")


def _expert_itemsize(cfg: ModelConfig, dtype: torch.dtype, fp8_unsupported) -> float:
    """Bytes a routed-expert weight takes: the run's dtype, or the FP8 scheme's bytes a weight
    where ``fp8_unsupported(scheme)`` says an FP8 checkpoint's experts stay FP8 there."""
    q = cfg.quantization
    if q is not None and fp8_unsupported(q) is None:
        return q.bytes_per_weight
    return torch.empty(0, dtype=dtype).element_size()


def _cpu_expert_itemsize(cfg: ModelConfig, dtype: torch.dtype) -> float:
    """Host bytes a routed-expert weight takes on the CPU (``cpu_experts.py``)."""
    from .cpu_experts import CpuExperts
    return _expert_itemsize(cfg, dtype, lambda q: CpuExperts.fp8_unsupported(q, dtype))


def _device_expert_itemsize(cfg: ModelConfig, dtype: torch.dtype, device=None) -> float:
    """Device bytes a routed-expert weight takes on the GPU (``moe.py``)."""
    from .moe import StackedExperts
    return _expert_itemsize(cfg, dtype,
                            lambda q: StackedExperts.fp8_unsupported(q, dtype, device))


def cpu_layer_expert_bytes(cfg: ModelConfig, dtype: torch.dtype) -> float:
    """Host bytes one MoE layer's routed experts take on the CPU (``cpu_experts.py``'s format:
    ``dtype``, or FP8 codes and scales where the CPU keeps them)."""
    return cfg.num_experts * cfg.param_counts()["expert"] * _cpu_expert_itemsize(cfg, dtype)


def expert_placement_summary(cfg: ModelConfig, flags: list[bool], dtype: torch.dtype,
                             device=None) -> dict:
    """Bytes on each side for a placement (for logs, the planner and the CLI) on the compute
    ``device`` (None: a CUDA device)."""
    if len(flags) != cfg.num_layers:
        raise ValueError(f"flags has {len(flags)} entries, the model has {cfg.num_layers} layers")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    pc = cfg.param_counts()
    per_layer = cpu_layer_expert_bytes(cfg, dtype)
    moe = set(cfg.moe_layers)
    cpu_layers = [i for i, f in enumerate(flags) if f]
    bad = [i for i in cpu_layers if i not in moe]
    if bad:
        raise ValueError(f"layers {bad} are dense: they have no routed experts to put on the CPU")
    cpu_bytes = int(len(cpu_layers) * per_layer)
    gpu_experts = int((len(moe) - len(cpu_layers)) * cfg.num_experts * pc["expert"]
                      * _device_expert_itemsize(cfg, dtype, device))
    return {"cpu_expert_layers": len(cpu_layers), "moe_layers": len(moe),
            "cpu_expert_bytes": cpu_bytes,
            "gpu_expert_bytes": gpu_experts,
            "gpu_weight_bytes": (pc["total"] - pc["routed_experts"]) * itemsize + gpu_experts,
            "expert_bytes": pc["expert"] * itemsize}
