"""Multi-head latent attention (DeepSeek-V2), decoded with absorbed weights over the cached latent.

Each token caches one record per layer: ``[c_kv (kv_lora_rank) | k_pe (rope dim)]`` (576 values
for V2/V2-Lite). Keys are never decompressed per head: ``W_UK`` is folded into the query and
``W_UV`` applied after attention (DeepSeek-V2 paper, section 2.1.3; the same absorption vLLM and
SGLang use):

    score_h = (q_nope_h W_UK_h) . c_kv + q_pe_h . k_pe      -> MQA over the 576-value record
    out_h   = (sum_t p_t c_kv_t) W_UV_h^T                    -> values = the record's first 512
"""
from __future__ import annotations

import torch
from torch import nn

from ..layers.norm import RMSNorm
from ..layers.rotary import apply_rotary
from .config import ModelConfig


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.nh = cfg.num_heads
        self.nope, self.rope, self.vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.lora = cfg.kv_lora_rank
        qk = self.nope + self.rope
        bias = cfg.attention_bias
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(h, self.nh * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, self.nh * qk, bias=False)
        self.q_lora = cfg.q_lora_rank is not None
        self.kv_a_proj_with_mqa = nn.Linear(h, self.lora + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.lora, 1e-6)
        self.kv_b_proj = nn.Linear(self.lora, self.nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(self.nh * self.vd, h, bias=bias)

    def pre(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything before attention: absorbed queries ``[N, H, 576]`` and the new tokens'
        records ``[N, 1, 576]``."""
        n = x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        q = q.view(n, self.nh, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.lora, self.rope], dim=-1)
        c = self.kv_a_layernorm(c)
        cos, sin = rope
        q_pe = apply_rotary(q_pe, cos, sin, interleaved=True)
        k_pe = apply_rotary(k_pe.view(n, 1, self.rope), cos, sin, interleaved=True)
        w_uk = self.kv_b_proj.weight.view(self.nh, self.nope + self.vd, self.lora)[:, :self.nope]
        q_abs = torch.einsum("nhd,hdc->nhc", q_nope, w_uk)
        return torch.cat((q_abs, q_pe), dim=-1), torch.cat((c.view(n, 1, self.lora), k_pe), dim=-1)

    def post(self, out: torch.Tensor) -> torch.Tensor:
        """From the attention over latents ``[N, H, 512]`` to the layer's output ``[N, hidden]``."""
        n = out.shape[0]
        w_uv = self.kv_b_proj.weight.view(self.nh, self.nope + self.vd, self.lora)[:, self.nope:]
        out = torch.einsum("nhc,hvc->nhv", out, w_uv)
        return self.o_proj(out.reshape(n, self.nh * self.vd))

    def forward(self, x: torch.Tensor, rope, ctx, layer: int) -> torch.Tensor:
        return self.post(ctx.attention(layer, *self.pre(x, rope)))
