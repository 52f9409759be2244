"""Multi-head latent attention (DeepSeek-V2), decoded with absorbed weights over the cached latent.

Each token caches one record per layer: ``[c_kv (kv_lora_rank) | k_pe (rope dim)]`` (576 values
for V2/V2-Lite). Keys are never decompressed per head: ``W_UK`` is folded into the query and
``W_UV`` applied after attention (DeepSeek-V2 paper, section 2.1.3; the same absorption vLLM and
SGLang use):

    score_h = (q_nope_h W_UK_h) . c_kv + q_pe_h . k_pe      -> MQA over the 576-value record
    out_h   = (sum_t p_t c_kv_t) W_UV_h^T                    -> values = the record's first 512

Prefill chunks are compute-bound, and there the absorbed form costs ~3x the FLOPs: the cache hands
each chunk's gathered context back to :meth:`MLAAttention.forward` (``dense=``), which decompresses
it with ``kv_b_proj`` and attends per head (``attention/prefill.mla_prefix_attention``, as
transformers computes it).

On CUDA, without a query LoRA, ``q_proj`` and ``kv_a_proj_with_mqa`` are one GEMM over their
weights stacked as rows of one tensor (``layers/stacked.py``), and the latent's norm, both
rotations and the record are one launch (``layers/mla_heads.py``); for decode-sized batches the
query's absorption and the values' are one launch each (``layers/mla_absorb.py``).
"""
from __future__ import annotations

import os

import torch
from torch import nn

from ..attention.prefill import mla_prefix_attention
from ..layers import gemv, mla_absorb, mla_heads
from ..layers.norm import RMSNorm
from ..layers.rotary import apply_rotary
from ..layers.stacked import share_rows, still_rows
from .config import ModelConfig


def decompressed_prefill() -> bool:
    """Prefill chunks attend their context per head (``WRITESCOPE_MLA_PREFILL=absorbed``: over the
    latent, as decode does)."""
    return os.environ.get("WRITESCOPE_MLA_PREFILL", "heads") != "absorbed"


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.nh = cfg.num_heads
        self.nope, self.rope, self.vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.lora = cfg.kv_lora_rank
        self.scale = cfg.softmax_scale
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
        #: q_proj's and kv_a_proj_with_mqa's weights as rows of one tensor
        self._q_kva: torch.Tensor | None = None

    def share_projection_storage(self) -> None:
        """Without a query LoRA (V2-Lite), give q_proj and kv_a_proj_with_mqa -- both read the
        layer's input -- weights that are rows of one tensor (the loader calls this before
        filling them): one GEMM for both on CUDA."""
        if not self.q_lora:
            self._q_kva = share_rows((self.q_proj, self.kv_a_proj_with_mqa))

    def _project(self, x: torch.Tensor, rope):
        """Queries ``q_nope [N, H, 128]``, ``q_pe [N, H, 64]`` (rope applied) and the new tokens'
        records ``[N, 1, 576]``."""
        n = x.shape[0]
        qk = self.nope + self.rope
        both = self._q_kva
        if (x.is_cuda and both is not None and both.dtype == x.dtype and both.device == x.device
                and still_rows(both, (self.q_proj, self.kv_a_proj_with_mqa))):
            y = gemv.linear(x, both)  # q and [c | k_pe] from one GEMM
            q, kva = y[:, :self.nh * qk], y[:, self.nh * qk:]
        else:
            q = (self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora
                 else self.q_proj(x))
            kva = self.kv_a_proj_with_mqa(x)
        q = q.view(n, self.nh, qk)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        cos, sin = rope
        if mla_heads.usable(q, kva, self.kv_a_layernorm):  # norm, rotations, record: one launch
            q_pe, rec = mla_heads.mla_heads_fused(q, kva, self.kv_a_layernorm, cos, sin,
                                                  self.lora)
            return q_nope, q_pe, rec
        c, k_pe = kva.split([self.lora, self.rope], dim=-1)
        c = self.kv_a_layernorm(c)
        q_pe = apply_rotary(q_pe, cos, sin, interleaved=True)
        k_pe = apply_rotary(k_pe.view(n, 1, self.rope), cos, sin, interleaved=True)
        return q_nope, q_pe, torch.cat((c.view(n, 1, self.lora), k_pe), dim=-1)

    def _absorb(self, q_nope: torch.Tensor, q_pe: torch.Tensor) -> torch.Tensor:
        w_uk = self.kv_b_proj.weight.view(self.nh, self.nope + self.vd, self.lora)[:, :self.nope]
        if mla_absorb.usable(q_nope, w_uk):  # the product and the concatenation: one launch
            return mla_absorb.absorb_fused(q_nope, q_pe, w_uk)
        return torch.cat((torch.einsum("nhd,hdc->nhc", q_nope, w_uk), q_pe), dim=-1)

    def pre(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything before attention: absorbed queries ``[N, H, 576]`` and the new tokens'
        records ``[N, 1, 576]``."""
        q_nope, q_pe, rec = self._project(x, rope)
        return self._absorb(q_nope, q_pe), rec

    def _values(self, out: torch.Tensor) -> torch.Tensor:
        """Attention over latents ``[N, H, 512]`` -> the heads' values ``[N, H, 128]``."""
        w_uv = self.kv_b_proj.weight.view(self.nh, self.nope + self.vd, self.lora)[:, self.nope:]
        if mla_absorb.usable(out, w_uv):  # one launch, rows laid out as o_proj reads them
            return mla_absorb.values_fused(out, w_uv).view(out.shape[0], self.nh, self.vd)
        return torch.einsum("nhc,hvc->nhv", out, w_uv)

    def post(self, out: torch.Tensor) -> torch.Tensor:
        """From the attention over latents ``[N, H, 512]`` to the layer's output ``[N, hidden]``."""
        o = self.o_proj
        return gemv.linear(self._values(out).reshape(out.shape[0], self.nh * self.vd), o.weight,
                           o.bias)

    def forward(self, x: torch.Tensor, rope, ctx, layer: int) -> torch.Tensor:
        q_nope, q_pe, rec = self._project(x, rope)
        q = self._absorb(q_nope, q_pe)
        if not decompressed_prefill():
            return self.post(ctx.attention(layer, q, rec))
        heads: list[tuple[int, torch.Tensor]] = []

        def dense(r0: int, n: int, latent: torch.Tensor) -> bool:
            # a prefill chunk over its context, per head (attention/prefill.py)
            rows = slice(r0, r0 + n)
            heads.append((r0, mla_prefix_attention(q_nope[rows], q_pe[rows], latent,
                                                   self.kv_b_proj.weight, self.scale)))
            return True

        vals = self._values(ctx.attention(layer, q, rec, dense=dense))
        for r0, o in heads:
            vals[r0:r0 + o.shape[0]] = o.to(vals.dtype)
        return self.o_proj(vals.reshape(x.shape[0], self.nh * self.vd))
