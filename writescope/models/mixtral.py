"""Mixtral: GQA attention with half-split RoPE; ``block_sparse_moe`` with experts w1/w3/w2."""
from __future__ import annotations

from .base import CausalLM
from .gqa import GQAAttention


class MixtralForCausalLM(CausalLM):
    expert_names = ("w1", "w3", "w2")
    mlp_name = "block_sparse_moe"

    def make_attention(self, cfg, idx):
        return GQAAttention(cfg)
