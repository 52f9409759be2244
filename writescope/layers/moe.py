"""Mixture-of-experts block: router, routed experts (GPU in-process or CPU), shared experts.

Routed-expert weights are held stacked (``gate_up [E, 2I, H]``, ``down [E, H, I]``) when they run
on the accelerator, or by :class:`~writescope.layers.cpu_experts.CpuExperts` in host memory when the
layer's experts were placed on the CPU. The router follows each family's reference exactly:

* mixtral: softmax over experts, top-k, renormalise;
* qwen3_moe: softmax, top-k, renormalise if ``norm_topk_prob``;
* deepseek_v2: float32 router, softmax, top-k (``greedy`` or ``group_limited_greedy`` over
  ``n_group`` groups keeping ``topk_group``), times ``routed_scaling_factor``, never renormalised:
  transformers does not read ``norm_topk_prob`` there (``ModelConfig`` sets it false; DeepSeek's
  own V2 code renormalises instead of scaling when it is set, and the released checkpoints set it
  false, where all agree).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models.config import ModelConfig
from . import cpu_experts_graph, expert_link, gemv, moe_triton, routing
from .mlp import GatedMLP


class Router(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        fp32 = cfg.model_type == "deepseek_v2"
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size,
                                               dtype=torch.float32 if fp32 else None))
        self.fp32 = fp32
        self._counters: dict[torch.device, torch.Tensor] = {}

    def forward(self, x: torch.Tensor, compact: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [N, k], ids [N, k])``. ``compact``: where the router is one kernel, the
        weights' values as the family rounds them but stored as float32, and int32 ids -- what
        the fused experts read (``moe_triton``), so they need no casts of their own."""
        cfg = self.cfg
        k = cfg.num_experts_per_tok
        deepseek = cfg.model_type == "deepseek_v2"
        grouped = deepseek and cfg.topk_method == "group_limited_greedy"
        ldt = torch.float32 if self.fp32 else x.dtype  # the logits' dtype, as F.linear gives it
        if x.is_cuda and not grouped and routing.fused_enabled():  # one kernel (routing.py)
            wdt = ldt if cfg.model_type == "qwen3_moe" else torch.float32
            how = dict(k=k, renorm=cfg.norm_topk_prob, eps=0.0,
                       scale=cfg.routed_scaling_factor if deepseek else 1.0,
                       out_dtype=torch.float32 if compact else wdt,
                       ids_dtype=torch.int32 if compact else torch.long,
                       round_to=wdt if compact else None)
            if (x.dim() == 2 and x.shape[0] <= routing.MAX_TOKENS and routing.logits_enabled()
                    and (self.fp32 or x.dtype == self.weight.dtype)):  # the logits too
                return routing.router_fused(x, self.weight, self._counter(x.device),
                                            logits_dtype=ldt, **how)
            return routing.route_fused(self._logits(x), **how)
        logits = self._logits(x)
        scores = logits.softmax(dim=-1, dtype=torch.float32)
        if grouped:
            n, g = scores.shape[0], cfg.n_group
            group_scores = scores.view(n, g, -1).max(dim=-1).values
            group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
            mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            mask = mask.unsqueeze(-1).expand(n, g, cfg.num_experts // g).reshape(n, -1)
            scores = scores.masked_fill(~mask.bool(), 0.0)
        sorted_ = cfg.model_type != "deepseek_v2"
        w, idx = torch.topk(scores, k=k, dim=-1, sorted=sorted_)
        if cfg.norm_topk_prob:  # mixtral, qwen3_moe (never deepseek_v2: ModelConfig)
            w = w / w.sum(dim=-1, keepdim=True)
        if cfg.model_type == "deepseek_v2":
            w = w * cfg.routed_scaling_factor
        elif cfg.model_type == "qwen3_moe":
            w = w.to(logits.dtype)
        return w, idx

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp32:
            return gemv.linear(x.float(), self.weight.float())
        return gemv.linear(x, self.weight)

    def _counter(self, device: torch.device) -> torch.Tensor:
        """The fused router's zero int32 word on ``device`` (kept: a CUDA graph holds its
        address; each launch leaves it zero)."""
        c = self._counters.get(device)
        if c is None:
            c = self._counters[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return c


#: weights of experts materialized at once for the expert-by-expert GEMMs of prefill-sized
#: steps (FP8 experts dequantized, CPU experts' uploads unpacked: :func:`grouped_weights`):
#: 32 M, ~200 MB of transient bf16 and float32 copies
GROUP_WEIGHTS = 32 * 2 ** 20


def grouped_weights(fetch, num_experts: int, expert_weights: int):
    """``run_experts``' ``weights(e)`` over ranges of experts materialized together:
    ``fetch(a, b)`` gives experts ``a..b-1`` as stacks ``(gate_up [n, 2I, H], down [n, H, I])``,
    ``expert_weights`` is one expert's weight count, a range holds up to :data:`GROUP_WEIGHTS`
    of them. ``run_experts`` asks for the active experts in increasing order, so each range is
    fetched once (and freed before the next) -- a few kernels a range instead of a few an
    expert: prefill chunks, where most experts are active, launch fewer and larger kernels."""
    group = max(1, GROUP_WEIGHTS // max(1, expert_weights))
    held: list = [None, None]

    def weights(e: int):
        g0 = e - e % group
        if held[0] != g0:
            held[0], held[1] = g0, None
            held[1] = fetch(g0, min(num_experts, g0 + group))
        gu, dn = held[1]
        return gu[e - g0], dn[e - g0]

    return weights


class StackedExperts(nn.Module):
    """Routed experts as stacked tensors on the compute device (the ``experts="gpu"`` path).

    ``fp8`` (a :class:`~writescope.models.quantization.Fp8Blocks`): an FP8 checkpoint's experts
    kept FP8 on the device -- ``gate_up``/``down`` hold the float8_e4m3fn bytes (dtype uint8,
    which ``Module.to(dtype)`` leaves alone), ``gate_up_scale [E, 2, ceil(I/bo), ceil(H/bi)]``
    (gate's grid, then up's) and ``down_scale [E, ceil(H/bo), ceil(I/bi)]`` their float32
    scales. Half the VRAM and half the bytes a decode step reads; every path computes with
    bf16(q * scale), the values of the checkpoint dequantized at load (the fused kernels convert
    in registers, the others dequantize one expert at a time)."""

    def __init__(self, num_experts: int, hidden: int, inter: int, fp8=None):
        super().__init__()
        self.fp8 = fp8
        if fp8 is None:
            self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
            self.down = nn.Parameter(torch.empty(num_experts, hidden, inter))
            self.gate_up_scale = self.down_scale = None
            return

        def param(*shape, dtype):
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        self.gate_up = param(num_experts, 2 * inter, hidden, dtype=torch.uint8)
        self.down = param(num_experts, hidden, inter, dtype=torch.uint8)
        self.gate_up_scale = param(num_experts, 2, *fp8.scale_shape((inter, hidden)),
                                   dtype=torch.float32)
        self.down_scale = param(num_experts, *fp8.scale_shape((hidden, inter)),
                                dtype=torch.float32)

    @staticmethod
    def fp8_unsupported(fp8, dtype: torch.dtype, device: torch.device | str | None = None
                        ) -> str | None:
        """Why an FP8 checkpoint's experts would not stay FP8 on the compute ``device`` (they
        are then dequantized at load), or None when they do: bfloat16 runs on CUDA
        (``WRITESCOPE_FP8_DEVICE_EXPERTS=auto``, the default; ``None`` stands for a CUDA
        device); ``=1`` on any device (on the CPU device every call then dequantizes its
        experts with torch, ~40x slower than computing with bf16 ones: for tests of the same
        code paths); ``=0`` never."""
        if dtype != torch.bfloat16:
            return f"FP8 experts compute in bfloat16; this run's dtype is {dtype}"
        how = os.environ.get("WRITESCOPE_FP8_DEVICE_EXPERTS", "auto").lower()
        if how in ("0", "false", "no"):
            return "WRITESCOPE_FP8_DEVICE_EXPERTS=0"
        if how not in ("1", "true", "yes") and device is not None \
                and torch.device(device).type != "cuda":
            return "FP8 experts stay FP8 on CUDA devices (WRITESCOPE_FP8_DEVICE_EXPERTS=1: any)"
        return None

    def set_expert_fp8(self, e: int, gate: tuple, up: tuple, down: tuple) -> None:
        """Expert ``e`` from a checkpoint's ``(q, scale)`` pairs (float8_e4m3fn ``q``): gate and
        up ``[I, H]``, down ``[H, I]``."""
        inter = self.gate_up.shape[1] // 2
        for j, (q, sc), want in ((0, gate, (inter, self.gate_up.shape[2])),
                                 (1, up, (inter, self.gate_up.shape[2])),
                                 (2, down, tuple(self.down.shape[1:]))):
            if q.dtype != torch.float8_e4m3fn or tuple(q.shape) != want \
                    or tuple(sc.shape) != self.fp8.scale_shape(want):
                raise ValueError(f"expert {e}: matrix {j} is {q.dtype} {tuple(q.shape)} with "
                                 f"scales {tuple(sc.shape)}, expected float8_e4m3fn {want} with "
                                 f"{self.fp8.scale_shape(want)}")
        self.gate_up[e, :inter].copy_(gate[0].view(torch.uint8))
        self.gate_up[e, inter:].copy_(up[0].view(torch.uint8))
        self.gate_up_scale[e, 0].copy_(gate[1])
        self.gate_up_scale[e, 1].copy_(up[1])
        self.down[e].copy_(down[0].view(torch.uint8))
        self.down_scale[e].copy_(down[1])

    def weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e`` as HF-layout ``gate_up [2I, H]`` and ``down [H, I]`` in the compute dtype
        (FP8 experts dequantized to bf16(q * scale), on their device)."""
        if self.fp8 is None:
            return self.gate_up[e], self.down[e]
        gu, dn = self.dequantized(e, e + 1)
        return gu[0], dn[0]

    def dequantized(self, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """FP8 experts ``a..b-1`` as bf16(q * scale) stacks ``gate_up [b-a, 2I, H]`` and
        ``down [b-a, H, I]`` (a few kernels for the range, whatever its length)."""
        n, two_i, hid = b - a, self.gate_up.shape[1], self.gate_up.shape[2]
        fp8 = torch.float8_e4m3fn
        gq = self.gate_up[a:b].view(fp8).view(n, 2, two_i // 2, hid)
        gu = self.fp8.dequantize(gq, self.gate_up_scale[a:b]).to(torch.bfloat16)
        dn = self.fp8.dequantize(self.down[a:b].view(fp8), self.down_scale[a:b])
        return gu.view(n, two_i, hid), dn.to(torch.bfloat16)

    def _weights_for(self, slots: int):
        """``run_experts``' weights for a step of ``slots`` (token, expert) pairs: bf16 experts
        as they are; FP8 ones dequantized one at a time in small steps, and in groups
        (:func:`grouped_weights`) in steps with more pairs than experts."""
        E = self.gate_up.shape[0]
        if self.fp8 is None or slots < E:
            return self.weights
        return grouped_weights(self.dequantized, E,
                               self.gate_up[0].numel() + self.down[0].numel())

    @property
    def weight_format(self) -> str:
        """How the weights are stored: their dtype's name, or the FP8 scheme's."""
        return str(self.gate_up.dtype).removeprefix("torch.") if self.fp8 is None \
            else self.fp8.name

    @property
    def nbytes(self) -> int:
        """Device bytes of the weights (and FP8 scales)."""
        ts = [self.gate_up, self.down] + ([] if self.fp8 is None else
                                          [self.gate_up_scale, self.down_scale])
        return sum(t.numel() * t.element_size() for t in ts)

    def fused_for(self, slots: int) -> bool:
        """Whether a step of ``slots`` (token, expert) pairs takes the fused path (which never
        synchronises with the host, so it can be captured in a CUDA graph)."""
        most = moe_triton.MAX_SLOTS
        if self.fp8 is not None:
            most = max(most, moe_triton.FP8_PAIRS_PER_EXPERT * self.gate_up.shape[0])
        return self.gate_up.is_cuda and slots <= most and moe_triton.enabled()

    def fused(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor,
              add: torch.Tensor | None = None) -> torch.Tensor:
        """The decode-sized path (:func:`moe_triton.fused_experts`) over these weights."""
        scales = None if self.fp8 is None else (self.gate_up_scale, self.down_scale, self.fp8)
        return moe_triton.fused_experts(x, idx, w, self.gate_up, self.down, add=add,
                                        fp8=scales)

    def forward(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.fused_for(idx.numel()):
            return self.fused(x, idx, w)  # decode-sized
        if self.fp8 is not None and x.dtype != torch.bfloat16:
            raise ValueError(f"FP8 experts compute in bfloat16, not {x.dtype}")
        return run_experts(x, idx, w, self._weights_for(idx.numel()))


def run_experts(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, weights) -> torch.Tensor:
    """``sum_j w[t, j] * expert_{idx[t, j]}(x[t])``; ``weights(e)`` gives expert ``e``'s HF-layout
    ``gate_up [2I, H]`` and ``down [H, I]`` (on ``x``'s device).

    The (token, slot) rows are sorted by expert once; each active expert then costs two matmuls
    and one activation over a contiguous slice (few launches: decode steps are launch-bound), and
    one scatter-add at the end combines the rows."""
    n, k = idx.shape
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat).tolist()  # the one host sync of the layer
    tok = order // k
    xs = x[tok]                                   # rows grouped by expert
    ws = w.reshape(-1)[order].unsqueeze(-1)
    ys = torch.empty_like(xs)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        gate_up, down = weights(e)
        h = F.linear(xs[start:start + c], gate_up)
        inter = h.shape[-1] // 2
        torch.matmul(F.silu(h[:, :inter]) * h[:, inter:], down.t(), out=ys[start:start + c])
        start += c
    out = torch.zeros_like(x)
    out.index_add_(0, tok, (ys * ws).to(x.dtype))
    return out


class MoE(nn.Module):
    """Router + routed experts (+ shared experts for DeepSeek)."""

    def __init__(self, cfg: ModelConfig, expert_names: tuple[str, str, str]):
        super().__init__()
        self.cfg = cfg
        self.expert_names = expert_names  # hub names of gate, up, down
        self.gate = Router(cfg)
        self.experts = StackedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.cpu_experts = None  # set by the loader when this layer's experts live on the CPU
        self.uploader = None  # set by the engine: runs CPU experts on the GPU for prefill chunks
        self.link = None  # set by the engine: the link's share of small decode steps' experts
        self._dtype: torch.dtype | None = None
        if cfg.num_shared_experts:
            self.shared_experts = GatedMLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        else:
            self.shared_experts = None

    def graph_safe(self, n: int, resident: bool = True) -> bool:
        """Whether a CUDA graph may capture this block's forward over ``n`` tokens in a
        ``resident`` step or another: it runs on the device alone (no host synchronisation), or
        its CPU experts' calls can be graphed in such a step (their device half captured, the
        host half queued at each replay: cpu_experts_graph)."""
        if self.uploader is not None and self.uploader.wants(n):
            return False
        if self.cpu_experts is not None:  # its device half captured (cpu_experts_graph)
            return self._dtype is not None and self.cpu_experts.graphable(
                self.gate.weight.device, self._dtype, resident)
        if self.experts is None:
            return False
        return self.experts.fused_for(n * self.cfg.num_experts_per_tok)

    def use_cpu_experts(self, cpu_experts) -> None:
        self.cpu_experts = cpu_experts
        self.experts = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_experts is not None:
            return self.finish(self.launch(x))
        self._dtype = x.dtype
        fused = (self.uploader is None and self.experts is not None
                 and self.experts.fused_for(x.shape[0] * self.cfg.num_experts_per_tok))
        w, idx = self.gate(x, compact=fused)
        shared = self.shared_experts(x) if self.shared_experts is not None else None
        if fused:  # the shared output added in the down kernel, rounded as `out + shared` is
            return self.experts.fused(x, idx, w, add=shared)
        out = self.experts(x, idx, w)
        return out if shared is None else out + shared

    # -------------------------------------------------- experts on the CPU: a call in two halves
    def launch(self, x: torch.Tensor) -> "_ExpertCall":
        """A CPU-expert layer's first half: the router, the CPU's call queued (or, captured, its
        device half up to the ready word) and the shared experts. :meth:`finish` waits for the
        CPU and adds. Between the two the device may run other work -- the other sub-batch's,
        in a pipelined step (``engine/graphs.pipelined_pieces``)."""
        self._dtype = x.dtype  # the hidden states' (graph_safe asks whether a call could be captured)
        w, idx = self.gate(x, compact=False)
        if self.uploader is not None and self.uploader.wants(x.shape[0]):
            out = self.uploader.forward(self.cpu_experts, x, idx, w)
            return _ExpertCall("done", out, self._shared(x), x.dtype, x.device)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            call = self.cpu_experts.captured_launch(x, idx, w)  # the host's half at each replay
            return _ExpertCall("graphed", call, self._shared(x), x.dtype, x.device)
        cpu_experts_graph.reserve(self.cpu_experts, x, idx)  # a capture's warm-up: set aside
        # the CPU works while the GPU does the rest; in small decode steps the GPU reads
        # some of the experts over the link meanwhile (expert_link.py)
        share = self.link.share_for(x.shape[0]) if self.link is not None else 0.0
        call = expert_link.submit(self.cpu_experts, x, idx, w, share,
                                  None if self.link is None else self.link.buffer)
        return _ExpertCall("eager", call, self._shared(x), x.dtype, x.device)

    def finish(self, call: "_ExpertCall") -> torch.Tensor:
        """The layer's output of a :meth:`launch`: the routed experts' result plus the shared
        experts'."""
        if call.kind == "graphed":
            out = cpu_experts_graph.capture_finish(call.call, call.device)
        elif call.kind == "eager":
            out = expert_link.finish(self.cpu_experts, call.call, call.dtype)
        else:
            out = call.call
        return out if call.shared is None else out + call.shared

    def _shared(self, x: torch.Tensor) -> torch.Tensor | None:
        return self.shared_experts(x) if self.shared_experts is not None else None


@dataclass
class _ExpertCall:
    """A launched CPU-expert layer call (:meth:`MoE.launch`)."""
    kind: str                     # "eager", "graphed" (captured halves) or "done" (uploaded)
    call: object                  # expert_link's call, the GraphedCall, or the output
    shared: torch.Tensor | None   # the shared experts' output
    dtype: torch.dtype
    device: torch.device
