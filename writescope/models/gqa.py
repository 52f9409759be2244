"""Grouped-query attention (Mixtral, Qwen3-MoE). Cache record per KV head: ``[K | V]``."""
from __future__ import annotations

import torch
from torch import nn

from ..layers.norm import RMSNorm
from ..layers.rotary import apply_rotary
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

    def pre(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything before attention: rotated queries ``[N, Hq, D]`` and the new tokens'
        records ``[N, Hkv, 2D]``."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.hq, self.d)
        k = self.k_proj(x).view(n, self.hkv, self.d)
        v = self.v_proj(x).view(n, self.hkv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, torch.cat((k, v), dim=-1)

    def post(self, out: torch.Tensor) -> torch.Tensor:
        return self.o_proj(out.reshape(out.shape[0], self.hq * self.d))

    def forward(self, x: torch.Tensor, rope, ctx, layer: int) -> torch.Tensor:
        return self.post(ctx.attention(layer, *self.pre(x, rope)))
