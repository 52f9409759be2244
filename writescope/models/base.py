"""The decoder every supported family shares; each family file supplies its attention and MLP.

Parameter names equal the hub's tensor names (``model.layers.3.self_attn.q_proj.weight``), except
the routed experts, which are held stacked (see ``layers/moe.py``; the loader maps the hub's
per-expert tensors into them).

The forward pass works on a flat batch: ``input_ids [N]`` and ``positions [N]`` hold every new
token of every scheduled sequence, one after another. Attention goes through a per-step context
(:class:`AttentionContext`) that owns the KV cache's step plan, so model code never sees blocks.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from ..layers.mlp import GatedMLP
from ..layers.moe import MoE
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from .config import ModelConfig


class AttentionContext(Protocol):
    def attention(self, layer: int, q: torch.Tensor, records: torch.Tensor,
                  dense=None) -> torch.Tensor:
        """Attention of this step's queries ``q [N, Hq, Dk]`` over each sequence's cached context
        and its own new tokens (causally); ``records [N, Hkv, R]`` are the new tokens' KV records,
        which the context also writes to the cache. Returns ``[N, Hq, Dv]`` in ``q``'s dtype.
        ``dense(r0, n, kv)``, if given, is offered each prefill chunk that attends its context
        densely (rows ``r0 .. r0 + n``, ``kv [T, Hkv, R]`` the context and the chunk's own
        records): when it returns True it has computed those rows itself, and their rows of the
        result are left to the caller."""


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, idx: int, attn: nn.Module, mlp_name: str,
                 expert_names: tuple[str, str, str]):
        super().__init__()
        self.idx = idx
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp_name = mlp_name
        if idx in cfg.dense_layers:
            mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        else:
            mlp = MoE(cfg, expert_names)
        self.add_module(mlp_name, mlp)

    @property
    def ffn(self) -> nn.Module:
        return getattr(self, self.mlp_name)

    def forward(self, carry: list, rope: tuple[torch.Tensor, torch.Tensor],
                ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``carry = [x, dx]``: the residual stream and the previous layer's MLP output (None
        before the first layer); returns them for the next layer (or the final norm), which
        adds ``dx`` as it normalises. Each add and the norm after it are one kernel on CUDA
        (``RMSNorm.add_forward``); the values are those of ``x + f(norm(x))`` layer by layer.
        ``carry`` is emptied here, so that the old residual and ``dx`` are freed once their sum
        exists (the caller keeps no reference: a long prefill chunk's peak activation memory,
        which sizes the KV pools on CUDA, holds one hidden-sized tensor fewer)."""
        x, dx = carry
        carry.clear()
        x, h = self.input_layernorm.add_forward(x, dx)
        del dx
        x, h = self.post_attention_layernorm.add_forward(x, self.self_attn(h, rope, ctx, self.idx))
        return x, self.ffn(h)


class CausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head."""

    #: hub names of (gate, up, down) inside each routed expert; the MLP module's name
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    mlp_name: str = "mlp"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        # no initialisation: the loader fills every weight (models/loader.py builds on the meta
        # device, where nn.Embedding's normal_ imports torch._dynamo: 1.5-2.6 s of each start)
        self.model.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.model.layers = nn.ModuleList(
            DecoderLayer(cfg, i, self.make_attention(cfg, i), self.mlp_name, self.expert_names)
            for i in range(cfg.num_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = self.make_rotary(cfg)

    def make_attention(self, cfg: ModelConfig, idx: int) -> nn.Module:
        raise NotImplementedError

    def make_rotary(self, cfg: ModelConfig) -> Rotary:
        return Rotary(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext
                ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        rope = self.rotary.cos_sin(positions)
        dx = None
        for layer in self.model.layers:
            carry = [x, dx]
            del x, dx  # the layer holds the only references (DecoderLayer.forward)
            x, dx = layer(carry, rope, ctx)
        return self.model.norm.add_forward(x, dx)[1]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def moe_blocks(self) -> list[tuple[int, MoE]]:
        return [(i, l.ffn) for i, l in enumerate(self.model.layers) if isinstance(l.ffn, MoE)]

    def host_experts(self) -> list:
        """The host-memory routed experts (``CpuExperts``) of the layers that have them."""
        return [m.cpu_experts for _, m in self.moe_blocks()
                if getattr(m, "cpu_experts", None) is not None]

    def device_experts(self) -> list:
        """The routed experts on the compute device (``StackedExperts``) of the layers that
        have them."""
        return [m.experts for _, m in self.moe_blocks() if getattr(m, "experts", None) is not None]
