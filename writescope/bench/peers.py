"""External peers for ``writescope bench``, run unchanged on the same weights and prompts.

``transformers``: Hugging Face transformers' ``generate`` with its offloaded KV cache
(``cache_implementation="offloaded"``: each layer's KV lives in host memory and is copied to the
GPU, one layer ahead, on a side stream -- ``DynamicCache(offloading=True)`` in transformers 5).
This stands for the "keep everything spilled in one state and stream it" family at the library
level. The offloaded cache needs CUDA; on a machine without it the peer runs with the default
dynamic cache and says so in its rows (``peer_cache``).

Same weights: the transformers model is built from the engine's model config on the meta device
and its parameters are then *assigned* the engine's tensors by name (dense tensors are shared,
no copy; routed experts the engine keeps on the CPU in its packed kernel layout are unpacked into
transformers' fused ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]``). So a
``--random-weights`` reference model needs no checkpoint and the peer computes with exactly the
numbers writescope computes with; the greedy tokens of both are compared in each peer row.

Where it fits: transformers keeps every weight on the GPU. When the weights do not fit the VRAM
budget the peer is a failed row with that reason, unless ``offload_weights`` is set and
``accelerate`` is installed, in which case accelerate's ``dispatch_model`` keeps what does not fit
in host memory (its hooks copy those weights in for every forward -- the way transformers runs
an oversized model). With ``offload_weights`` the weights beyond ``PEER_GPU_WEIGHT_SHARE`` of
the budget are offloaded that way even where they would fit, leaving the rest for activations.
During the peer's run the CUDA caching allocator is capped at the budget
(``torch.cuda.set_per_process_memory_fraction``), so going over it is an out-of-memory failure,
reported as such.
"""
from __future__ import annotations

import gc
import time
from typing import Any

import torch

PEERS = ("transformers",)
#: with ``offload_weights``: the share of the VRAM budget the peer's weights may take on the GPU
PEER_GPU_WEIGHT_SHARE = 0.6


class PeerUnavailable(RuntimeError):
    """The peer cannot run this configuration (the row's ``error``)."""


# ------------------------------------------------------------------------------ weights
def _hf_name(name: str) -> str:
    """writescope parameter name -> transformers 5 parameter name."""
    name = name.replace(".block_sparse_moe.", ".mlp.")
    if name.endswith(".experts.gate_up"):
        return name + "_proj"
    if name.endswith(".experts.down"):
        return name + "_proj"
    return name


def engine_state_dict(model, consume_cpu_experts: bool = False) -> dict[str, torch.Tensor]:
    """The engine model's weights under transformers' names (shared storage where possible).

    ``consume_cpu_experts``: drop each layer's host-memory experts from the engine's model once
    unpacked, so a model whose experts fill host memory is not held twice (the engine cannot
    run afterwards)."""
    sd = {_hf_name(n): p.detach() for n, p in model.named_parameters()
          if not n.endswith(("experts.gate_up_scale", "experts.down_scale"))}
    for i, moe in model.moe_blocks():
        cpu = getattr(moe, "cpu_experts", None)
        stacked = getattr(moe, "experts", None)
        if cpu is None and getattr(stacked, "fp8", None) is not None:  # FP8 on the device
            prefix = f"model.layers.{i}.mlp.experts."
            pairs = [stacked.weights(e) for e in range(stacked.gate_up.shape[0])]
            sd[prefix + "gate_up_proj"] = torch.stack([gu for gu, _ in pairs])
            sd[prefix + "down_proj"] = torch.stack([dn for _, dn in pairs])
            continue
        if cpu is None:
            continue
        if consume_cpu_experts:
            moe.cpu_experts = None
        prefix = f"model.layers.{i}.mlp.experts."
        gate_up, down = [], []
        for e in range(cpu.num_experts):
            g, u, d = cpu.expert_weights(e)
            gate_up.append(torch.cat((g, u), dim=0))
            down.append(d)
        sd[prefix + "gate_up_proj"] = torch.stack(gate_up)
        sd[prefix + "down_proj"] = torch.stack(down)
    return sd


def hf_model_from_engine(engine, consume_cpu_experts: bool = False) -> torch.nn.Module:
    """A transformers ``AutoModelForCausalLM`` holding the engine's weights (see module doc)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = {k: v for k, v in engine.config.raw.items() if not k.startswith("_")}
    model_type = raw.pop("model_type")
    hf_cfg = AutoConfig.for_model(model_type, **raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=engine.dtype)
    sd = engine_state_dict(engine.model, consume_cpu_experts)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(hf_cfg, "tie_word_embeddings", False) else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise PeerUnavailable(f"cannot map the engine's weights onto transformers' "
                              f"{type(model).__name__}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if tied:
        model.tie_weights()
    # non-persistent buffers (rotary inv_freq) are still on the meta device: rebuild their modules
    for name, mod in list(model.named_modules()):
        if any(b.is_meta for b in mod.buffers(recurse=False)):
            parent, _, attr = name.rpartition(".")
            with torch.device("cpu"):
                fresh = type(mod)(config=mod.config)
            setattr(model.get_submodule(parent) if parent else model, attr, fresh)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise PeerUnavailable(f"transformers model still has meta tensors: {left[:3]}")
    return model.eval()


def engine_weight_bytes(model) -> int:
    """Bytes of all the engine model's weights, wherever they live (device and host experts)."""
    total = model_bytes(model)
    for _, moe in model.moe_blocks():
        cpu = getattr(moe, "cpu_experts", None)
        if cpu is not None:
            total += cpu.num_experts * 3 * cpu.hidden * cpu.inter * torch.tensor(
                [], dtype=cpu.dtype).element_size()
    return total


def model_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


# ------------------------------------------------------------------------------ agreement
def first_divergence(ref: list[list[int]], peer: list[list[int]],
                     logprobs: list[torch.Tensor]) -> list[dict[str, Any] | None]:
    """Per sequence, where the peer's greedy tokens first leave writescope's (``ref``), and by how
    much the peer preferred its own token there: ``gap_nats`` = its log-probability of its token
    minus that of writescope's. Up to that position both decoded the same prefix, so the gap is
    a like-for-like reading of the peer's logits: a few hundredths of a nat is a near-tie that
    bf16 rounding can decide (random weights give near-flat logits); whole nats point at a real
    difference in the computation. None for a sequence whose tokens all agree."""
    out: list[dict[str, Any] | None] = []
    for i, (a, b) in enumerate(zip(ref, peer)):
        k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is None or k >= len(logprobs):
            out.append(None)
            continue
        lp = logprobs[k][i]
        top2 = torch.topk(lp, 2).values
        out.append({"step": k, "peer_token": b[k], "writescope_token": a[k],
                    "gap_nats": float(lp[b[k]] - lp[a[k]]),
                    "peer_top2_margin_nats": float(top2[0] - top2[1]),
                    "writescope_token_rank": int((lp > lp[a[k]]).sum())})
    return out


# ------------------------------------------------------------------------------ timing
class _TimingStreamer:
    """transformers streamer that timestamps every generated token batch (``put`` receives CPU
    tensors, so the device has finished the step when it is called)."""

    def __init__(self):
        self.times: list[float] = []
        self.tokens: list[torch.Tensor] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate first puts the prompt
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.tokens.append(value.reshape(-1).clone())

    def end(self) -> None:
        return None


class TransformersPeer:
    """One transformers model on the engine's weights, run over (batch, context) rows."""

    name = "transformers"

    def __init__(self, engine, vram_budget: int, offload_weights: bool = False,
                 consume_engine: bool = False):
        dev = torch.device(engine.device)
        if dev.type == "cuda" and dev.index is None:  # the allocator cap wants an index
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.vram_budget = int(vram_budget)
        self.cache_impl = "offloaded" if self.device.type == "cuda" else "dynamic"
        self.note = ("" if self.device.type == "cuda" else
                     "transformers' offloaded cache needs CUDA: ran with the dynamic cache")
        self.weights_placement = "device"
        nbytes = engine_weight_bytes(engine.model)
        self.weight_bytes = nbytes
        cuda = self.device.type == "cuda"
        # (KV in flight and activations need room too: the run's allocator cap catches that)
        fits = not cuda or nbytes < self.vram_budget
        # asked to offload: what is over PEER_GPU_WEIGHT_SHARE of the budget stays in host memory
        # (weights that "fit" can still leave no room for the peer's activations: DeepSeek-V2-Lite's
        # 31.3 GiB under 32 GiB ran out of memory in its prefill, 2026-12-01c-h200/call4)
        offload = cuda and offload_weights and nbytes > PEER_GPU_WEIGHT_SHARE * self.vram_budget
        if not fits or offload:  # decided before anything is built or unpacked
            if not offload_weights:
                raise PeerUnavailable(
                    f"transformers keeps all weights on the GPU: {nbytes / 2**30:.1f} GiB do not "
                    f"fit the {self.vram_budget / 2**30:.1f} GiB VRAM budget "
                    "(--peer-offload-weights lets accelerate keep some in host memory)")
            try:
                from accelerate import dispatch_model, infer_auto_device_map
            except ImportError:
                raise PeerUnavailable("the weights do not fit the VRAM budget and accelerate "
                                      "(needed to offload them) is not installed") from None
        model = hf_model_from_engine(engine, consume_cpu_experts=consume_engine)
        if cuda:
            if offload:
                dmap = infer_auto_device_map(
                    model, max_memory={self.device.index or 0:
                                       int(self.vram_budget * PEER_GPU_WEIGHT_SHARE),
                                       "cpu": 10 ** 15},
                    no_split_module_classes=getattr(model, "_no_split_modules", None))
                model = dispatch_model(model, device_map=dmap)
                self.weights_placement = "accelerate-offload"
            else:
                model = model.to(self.device)
        self.model = model

    @torch.inference_mode()
    def run(self, prompts: list[list[int]], decode_steps: int) -> dict[str, Any]:
        from transformers import GenerationConfig

        ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        gen = GenerationConfig(max_new_tokens=decode_steps + 1, min_new_tokens=decode_steps + 1,
                               do_sample=False, cache_implementation=self.cache_impl,
                               pad_token_id=0, eos_token_id=None, output_logits=True,
                               return_dict_in_generate=True)
        cuda = self.device.type == "cuda"
        frac = None
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            total = torch.cuda.get_device_properties(self.device).total_memory
            frac = min(1.0, self.vram_budget / total)
            torch.cuda.set_per_process_memory_fraction(frac, self.device)
        streamer = _TimingStreamer()
        try:
            t0 = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen,
                                      streamer=streamer)
            if cuda:
                torch.cuda.synchronize(self.device)
            t_end = time.perf_counter()
        finally:
            if cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, self.device)
        peak = torch.cuda.max_memory_allocated(self.device) if cuda else None
        times = streamer.times
        if len(times) != decode_steps + 1:
            raise RuntimeError(f"transformers generated {len(times)} tokens, expected {decode_steps + 1}")
        steps = [b - a for a, b in zip(times, times[1:])]
        new = out.sequences[:, ids.shape[1]:].tolist()
        # per generated position, the log-probabilities (fp32) of the vocabulary, kept on the host
        # only as far as :func:`first_divergence` needs them: the caller passes writescope's tokens
        logp = [torch.log_softmax(x.float(), dim=-1).cpu() for x in out.logits]
        del out
        gc.collect()
        return {"ttft_s": times[0] - t0, "step_times_s": steps, "total_s": t_end - t0,
                "peak_vram_bytes": peak, "output_token_ids": new, "logprobs": logp}

    def close(self) -> None:
        self.model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def make_peer(name: str, engine, vram_budget: int, offload_weights: bool = False,
              consume_engine: bool = False):
    if name != "transformers":
        raise ValueError(f"unknown peer {name!r}; choose one of {', '.join(PEERS)}")
    return TransformersPeer(engine, vram_budget, offload_weights, consume_engine)
