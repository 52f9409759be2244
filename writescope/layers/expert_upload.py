"""Routed experts placed on the CPU, run on the GPU for prefill-sized steps.

Decode steps activate a few experts per token and are bound by reading their weights: the CPU
kernel reads them in place at DRAM speed. A prefill chunk of thousands of tokens activates every
expert of every layer and is bound by FLOPs, where the CPU is ~100x slower than the GPU. For such
steps it is faster to copy the layer's expert weights over PCIe and compute there -- llama.cpp
does the same for host-resident weights when a batch is large (``GGML_OP_MUL_MAT_ID`` offload at
batch >= 32), KTransformers' prefill likewise leans on the GPU for long prompts.

:class:`ExpertUploader` (one per model, shared by its CPU-expert layers) holds one device buffer
the size of the largest layer's packed weights, copies a layer's packed tensors into it (one
copy each, from page-locked memory when pinning worked), unpacks a range of experts at a time
on the GPU (:meth:`CpuExperts.unpack_experts`, :func:`~writescope.layers.moe.grouped_weights`;
FP8 ones dequantized) and computes with the same routing as the GPU experts
(:func:`writescope.layers.moe.run_experts`). The host weights are only read; nothing moves.
The buffer is allocated on first use, i.e. during the engine's warm-up forward, so the activation
measurement counts it against the VRAM budget.

``WRITESCOPE_EXPERT_UPLOAD_TOKENS`` (default 1024; 0 disables) sets the step size from which a
layer goes to the GPU; ``WRITESCOPE_PIN_EXPERTS=0`` keeps the host weights pageable (copies then
run at the pageable H2D rate, ~6 GB/s instead of ~54 GB/s on the H200 machine).
"""
from __future__ import annotations

import os
import warnings

import torch

from ..hostmem import pin_tensor  # noqa: F401 (re-exported)
from ..units import env_int
from .cpu_experts import CpuExperts
from .moe import grouped_weights, run_experts

#: tokens in one step from which CPU-placed experts run on the GPU
DEFAULT_UPLOAD_TOKENS = 1024


class ExpertUploader:
    """Runs CPU-placed experts on ``device`` for steps of at least ``min_tokens`` tokens."""

    def __init__(self, device: torch.device | str, min_tokens: int | None = None,
                 pin: bool | None = None):
        self.device = torch.device(device)
        self.min_tokens = env_int("WRITESCOPE_EXPERT_UPLOAD_TOKENS", DEFAULT_UPLOAD_TOKENS) \
            if min_tokens is None else int(min_tokens)
        if pin is None:
            pin = os.environ.get("WRITESCOPE_PIN_EXPERTS", "1") not in ("0", "false", "no")
        self.pin = pin and self.device.type == "cuda"
        self.max_bytes = 0
        self.pinned_bytes = 0
        self.pageable_bytes = 0
        self._buf: torch.Tensor | None = None
        self.uploads = 0
        self.bytes = 0
        #: bytes the link's share of decode steps' experts copied into the buffer
        #: (layers/expert_link.py)
        self.link_bytes = 0

    def register(self, experts: CpuExperts) -> None:
        """One layer's experts: sizes the buffer, pins the host weights when asked."""
        if experts.gate_up.dtype != experts.down.dtype:
            raise ValueError("gate_up and down must share a dtype")
        n = experts.gate_up.numel() * experts.gate_up.element_size() + \
            experts.down.numel() * experts.down.element_size()
        self.max_bytes = max(self.max_bytes, n)
        ok = self.pin and all(pin_tensor(t) for t in (experts.gate_up, experts.down))
        if ok:
            self.pinned_bytes += n
        else:
            self.pageable_bytes += n
            if self.pin and self.pageable_bytes == n:
                warnings.warn("could not page-lock the CPU experts' weights; prefill copies them "
                              "at the pageable H2D rate", RuntimeWarning, stacklevel=2)

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0 and self.max_bytes > 0

    def wants(self, num_tokens: int) -> bool:
        return self.enabled and num_tokens >= self.min_tokens

    @property
    def device_bytes(self) -> int:
        """Device bytes of the buffer once allocated."""
        return 0 if self._buf is None else self._buf.numel() * self._buf.element_size()

    def device_views(self, experts: CpuExperts) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffer as device tensors shaped like ``experts``' ``gate_up`` and ``down`` (what
        a prefill step uploads whole; the link's decode share copies single experts into it,
        ``expert_link.copy_experts``). Allocated on first use."""
        return self._views(experts)

    def _views(self, experts: CpuExperts) -> tuple[torch.Tensor, torch.Tensor]:
        dt = experts.gate_up.dtype
        item = experts.gate_up.element_size()
        if self._buf is None or self._buf.dtype != dt:
            self._buf = torch.empty(-(-self.max_bytes // item), dtype=dt, device=self.device)
        a = experts.gate_up.numel()
        gu = self._buf[:a].view(experts.gate_up.shape)
        dn = self._buf[a:a + experts.down.numel()].view(experts.down.shape)
        return gu, dn

    def forward(self, experts: CpuExperts, x: torch.Tensor, idx: torch.Tensor,
                w: torch.Tensor) -> torch.Tensor:
        """The layer's routed-expert output for ``x [n, H]`` on its device (same contract as
        :meth:`CpuExperts.forward`)."""
        gu, dn = self._views(experts)
        nb = self.device.type == "cuda"
        gu.copy_(experts.gate_up, non_blocking=nb and experts.gate_up.is_pinned())
        dn.copy_(experts.down, non_blocking=nb and experts.down.is_pinned())
        self.uploads += 1
        self.bytes += (gu.numel() + dn.numel()) * gu.element_size()
        scales = None
        if experts.fp8 is not None:  # (the scale grids: ~1/4000 of the FP8 bytes)
            scales = (experts.gate_up_scale.to(self.device), experts.down_scale.to(self.device))
        xw = x.to(experts.dtype)
        weights = grouped_weights(lambda a, b: experts.unpack_experts(gu, dn, a, b, scales),
                                  experts.num_experts, 3 * experts.hidden * experts.inter)
        out = run_experts(xw, idx, w, weights)
        return out.to(x.dtype)
