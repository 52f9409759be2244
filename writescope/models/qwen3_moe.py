"""Qwen3-MoE: GQA attention with per-head q/k RMSNorm before RoPE; ``mlp`` with gate/up/down experts."""
from __future__ import annotations

from .base import CausalLM
from .gqa import GQAAttention


class Qwen3MoeForCausalLM(CausalLM):
    def make_attention(self, cfg, idx):
        return GQAAttention(cfg)
