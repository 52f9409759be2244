"""DeepSeek-V2 / V2-Lite: MLA attention (absorbed), interleaved RoPE with YaRN, dense first layers,
shared + routed experts with greedy or group-limited top-k."""
from __future__ import annotations

from .base import CausalLM
from .mla import MLAAttention


class DeepseekV2ForCausalLM(CausalLM):
    def make_attention(self, cfg, idx):
        return MLAAttention(cfg)
