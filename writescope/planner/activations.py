"""Device memory a step keeps beside the weights and the KV, estimated before a model is built.

The engine measures its activations once the model is built, as vLLM does (one warm-up forward
of ``max_num_batched_tokens`` prompt tokens on CUDA, ``LLMEngine._activation_bytes``), adds a
prefill chunk's gathered context (:func:`context_gather_bytes`) and, on CUDA, the T staging ring
and the C gather buffers, and with ``experts="auto"`` moves more MoE layers' routed experts to
the CPU where what is left no longer holds the KV asked for (``LLMEngine._fit_experts_around_kv``).
``writescope plan`` and the bench grid's host-memory plan choose splits before any model exists:
:func:`reserve_bytes` estimates that reserve so that the split they show is the one the engine
ends with (``auto``'s fixed margin, max(1 GiB, 5% of the budget), is what the engine places
with before it has measured).

The warm-up's peak on CUDA (:func:`warmup_peak_bytes`) is dominated by three tensors:

* the routed experts' grouped intermediate: each of the ``n`` tokens goes to ``k`` experts, and
  per token-expert pair the gathered input and output (``2 H``) and the gate/up product and its
  activation (``3 I``) exist at once -- or the dense MLP's ``2 H + 3 I`` per token where that is
  wider (DeepSeek's first layer);
* with routed experts on the CPU and ``n`` at least the uploader's step size
  (``layers/expert_upload.py``: prefill-sized steps run the CPU-placed experts on the GPU), the
  upload buffer: one layer's experts in their host format;
* the logits of the sampled rows (fp32) and the hidden states.

It adds 10% for the allocator's rounding and the smaller tensors. Measured on an H100 host
(Qwen3-30B-A3B bf16, 16384 batched tokens, four engines of 2026-12-05,
``bench/results/2026-12-05i-h100/call2``): 3.50 GB against 3.49 GB estimated.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..models.config import ModelConfig

__all__ = ["ALLOCATOR_SLACK", "warmup_peak_bytes", "context_gather_bytes", "reserve_bytes"]

#: the allocator's rounding and the tensors the estimate leaves out (norms, q/k/v, the router)
ALLOCATOR_SLACK = 1.1
#: the sampled rows whose logits a warm-up computes (``LLMEngine._measure_activation_bytes``)
LOGIT_ROWS = 256


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def warmup_peak_bytes(cfg: "ModelConfig", dtype: torch.dtype, n_tokens: int,
                      cpu_experts: bool) -> int:
    """The estimated peak of the engine's warm-up forward of ``n_tokens`` prompt tokens on CUDA
    (module docstring); ``cpu_experts``: whether any MoE layer's routed experts are on the
    CPU (the uploader's buffer then exists)."""
    from ..layers.expert_placement import cpu_layer_expert_bytes
    from ..layers.expert_upload import DEFAULT_UPLOAD_TOKENS
    from ..units import env_int
    n, h, item = int(n_tokens), cfg.hidden_size, _itemsize(dtype)
    widest = 0
    if cfg.moe_layers:
        widest = cfg.num_experts_per_tok * (2 * h + 3 * cfg.moe_intermediate_size)
    if cfg.dense_layers:
        widest = max(widest, 2 * h + 3 * cfg.intermediate_size)
    acts = n * (widest + 2 * h) * item
    logits = min(n, LOGIT_ROWS) * cfg.vocab_size * 4
    upload = 0
    min_upload = env_int("WRITESCOPE_EXPERT_UPLOAD_TOKENS", DEFAULT_UPLOAD_TOKENS)
    if cpu_experts and cfg.moe_layers and 0 < min_upload <= n:
        upload = int(cpu_layer_expert_bytes(cfg, dtype))
    return int(ALLOCATOR_SLACK * (acts + logits + upload))


def context_gather_bytes(cfg: "ModelConfig", dtype: torch.dtype, max_model_len: int) -> int:
    """What the engine keeps beside the measured activations for a prefill chunk's whole
    context: one layer of up to ``max_model_len`` tokens gathered for the dense prefill kernel,
    held twice (gathered, then joined with the chunk's records), and with MLA, the decompressed
    keys, values (padded to the keys' width) and ``kv_b_proj``'s output of that many tokens
    (``models/mla.py`` attends a prefill chunk's context per head)."""
    from ..models.mla import decompressed_prefill
    out = 2 * cfg.kv_spec(dtype).token_bytes(1) * max_model_len
    if cfg.is_mla and decompressed_prefill():
        dk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        per_token = cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim + 2 * dk)
        out += per_token * _itemsize(dtype) * max_model_len
    return out


def reserve_bytes(cfg: "ModelConfig", dtype: torch.dtype, max_num_batched_tokens: int,
                  max_model_len: int, cpu_experts: bool = True, cuda: bool = True) -> int:
    """The estimated device bytes an engine on CUDA keeps for its steps -- the margin
    ``layers/expert_placement`` and ``planner/expert_split`` take: the warm-up's peak for
    min(``max_num_batched_tokens``, ``max_model_len``) tokens, the gathered context, and the
    staging ring and gather buffers. ``cuda=False``: the warm-up and the buffers are not
    counted (off CUDA the engine plans its activations from the config instead)."""
    from ..attention.gather import DEFAULT_GATHER_BYTES
    from ..attention.hybrid import staging_bytes
    out = context_gather_bytes(cfg, dtype, max_model_len)
    if cuda:
        n = min(int(max_num_batched_tokens), int(max_model_len))
        out += warmup_peak_bytes(cfg, dtype, n, cpu_experts) + staging_bytes() \
            + DEFAULT_GATHER_BYTES
    return out
