"""Moving a built MoE layer's routed experts from the compute device to host memory.

``experts="auto"`` places the routed experts before the model is built, around the KV asked for
(``kv_cache_memory``, else one ``max_model_len`` sequence's) and a margin for the activations
(:func:`~writescope.layers.expert_placement.default_margin_bytes`). On CUDA the engine then
measures the activations of its largest step, which can exceed that margin (Qwen3-30B-A3B at
8K-16K batched tokens: 1.7-2.8 GiB against 1.6 GiB under a 32 GiB budget), so that KV would not
fit. Rather than load the checkpoint again, the engine
moves the next layers' experts to the CPU (:meth:`LLMEngine._fit_experts_around_kv`) -- the
same layers ``auto`` moves first, the same values: bf16/fp32 experts as they are, FP8 ones
kept FP8 where the CPU kernel computes with them (else dequantized, as the loader does).
"""
from __future__ import annotations

import torch

from .cpu_experts import CpuExperts
from .moe import MoE

__all__ = ["experts_to_cpu", "host_bytes"]


class _Dequantized:
    """One matrix of FP8 device experts, an expert at a time in bf16 (``CpuExperts.from_weights``
    indexes it; only one expert's dequantized copy exists at once)."""

    def __init__(self, experts, which: int):
        self.experts, self.which = experts, which
        self.inter = experts.gate_up.shape[1] // 2

    def __len__(self) -> int:
        return self.experts.gate_up.shape[0]

    def __getitem__(self, e: int) -> torch.Tensor:
        gu, dn = self.experts.dequantized(e, e + 1)
        if self.which == 2:
            return dn[0]
        return gu[0, :self.inter] if self.which == 0 else gu[0, self.inter:]


def _stays_fp8(ex, dtype: torch.dtype) -> bool:
    return ex.fp8 is not None and CpuExperts.fp8_unsupported(ex.fp8, dtype) is None


def host_bytes(moe: MoE, dtype: torch.dtype) -> int:
    """About the host bytes :func:`experts_to_cpu` would give ``moe``'s device experts: theirs
    where they stay as they are (bf16, fp32, FP8 with its scales), ``dtype``'s where FP8 ones
    are dequantized (tile padding aside)."""
    ex = moe.experts
    if ex.fp8 is None or _stays_fp8(ex, dtype):
        return ex.nbytes
    return (ex.gate_up.numel() + ex.down.numel()) * torch.empty(0, dtype=dtype).element_size()


def experts_to_cpu(moe: MoE, dtype: torch.dtype) -> int:
    """Replace ``moe``'s device experts (``StackedExperts``) by host-memory ``CpuExperts`` with
    the same weights; returns the device bytes they held (freed once nothing else refers to
    them)."""
    ex = moe.experts
    if ex is None or moe.cpu_experts is not None:
        raise ValueError("this MoE layer's routed experts are not on the compute device")
    freed = ex.nbytes
    inter = ex.gate_up.shape[1] // 2
    with torch.no_grad():
        if ex.fp8 is None:
            cpu = CpuExperts.from_weights(ex.gate_up[:, :inter], ex.gate_up[:, inter:], ex.down,
                                          dtype=dtype)
        elif _stays_fp8(ex, dtype):
            f8 = torch.float8_e4m3fn
            E = ex.gate_up.shape[0]
            gate = [(ex.gate_up[e, :inter].view(f8), ex.gate_up_scale[e, 0].cpu()) for e in range(E)]
            up = [(ex.gate_up[e, inter:].view(f8), ex.gate_up_scale[e, 1].cpu()) for e in range(E)]
            down = [(ex.down[e].view(f8), ex.down_scale[e].cpu()) for e in range(E)]
            cpu = CpuExperts.from_fp8(gate, up, down, fp8=ex.fp8)
        else:
            cpu = CpuExperts.from_weights(_Dequantized(ex, 0), _Dequantized(ex, 1),
                                          _Dequantized(ex, 2), dtype=dtype)
    moe.use_cpu_experts(cpu)
    return freed
