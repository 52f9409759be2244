"""Grouped-query attention (Mixtral, Qwen3-MoE). Cache record per KV head: ``[K | V]``.

The q, k and v projections keep their hub names and weights, but the loader lays the three
weights out as consecutive rows of one tensor (``layers/stacked.py``,
before they are filled), so that on CUDA one GEMM computes all three: a decode step's GEMVs
read the rows in one pass, and two launches a layer fewer. Elsewhere (and if anything moved
the weights apart) the three projections run as before: the CPU's numbers stay the ones the
parity tests pin. ``WRITESCOPE_FUSED_QKV=0`` keeps the three GEMMs on CUDA too.

After the one GEMM, the head norms (Qwen3), the rotation and the records are one more launch on
CUDA (``layers/attn_heads.py``; ``WRITESCOPE_FUSED_HEADS=0``: the separate kernels).
"""
from __future__ import annotations

import os

import torch
from torch import nn

from ..layers import attn_heads, gemv
from ..layers.norm import RMSNorm
from ..layers.rotary import apply_rotary
from ..layers.stacked import share_rows, still_rows
from .config import ModelConfig


class GQAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.hq, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, d
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(h, self.hq * d, bias=bias)
        self.k_proj = nn.Linear(h, self.hkv * d, bias=bias)
        self.v_proj = nn.Linear(h, self.hkv * d, bias=bias)
        self.o_proj = nn.Linear(self.hq * d, h, bias=bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        #: the three projections' weights as rows of one tensor (share_projection_storage)
        self._qkv: torch.Tensor | None = None

    def share_projection_storage(self) -> None:
        """Give q_proj, k_proj and v_proj weights that are consecutive rows of one tensor (call
        before they are filled; without biases only)."""
        self._qkv = share_rows((self.q_proj, self.k_proj, self.v_proj))

    def _fused_qkv(self, x: torch.Tensor) -> torch.Tensor | None:
        """The shared weight, where one GEMM should compute the three projections: on CUDA, and
        while the three weights still are its rows."""
        qkv = self._qkv
        if qkv is None or not x.is_cuda or qkv.device != x.device or qkv.dtype != x.dtype \
                or os.environ.get("WRITESCOPE_FUSED_QKV", "1") == "0":
            return None
        return qkv if still_rows(qkv, (self.q_proj, self.k_proj, self.v_proj)) else None

    def pre(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything before attention: rotated queries ``[N, Hq, D]`` and the new tokens'
        records ``[N, Hkv, 2D]``."""
        n = x.shape[0]
        qkv = self._fused_qkv(x)
        cos, sin = rope
        if qkv is not None:  # one GEMM; q, k, v are head slices of its rows
            y = gemv.linear(x, qkv).view(n, self.hq + 2 * self.hkv, self.d)
            if cos.shape[-1] * 2 == self.d and attn_heads.usable(y, self.q_norm, self.k_norm):
                # norms, rotations and records in one launch (layers/attn_heads.py)
                return attn_heads.attn_heads_fused(y, self.hq, self.hkv, self.q_norm,
                                                   self.k_norm, cos, sin)
            q, k, v = y.split([self.hq, self.hkv, self.hkv], dim=1)
        else:
            q = self.q_proj(x).view(n, self.hq, self.d)
            k = self.k_proj(x).view(n, self.hkv, self.d)
            v = self.v_proj(x).view(n, self.hkv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, torch.cat((k, v), dim=-1)

    def post(self, out: torch.Tensor) -> torch.Tensor:
        o = self.o_proj
        return gemv.linear(out.reshape(out.shape[0], self.hq * self.d), o.weight, o.bias)

    def forward(self, x: torch.Tensor, rope, ctx, layer: int) -> torch.Tensor:
        return self.post(ctx.attention(layer, *self.pre(x, rope)))
