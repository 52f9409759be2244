"""How an engine sizes itself at start-up: device bytes for activations, where the routed
experts go around the KV asked for, the host memory check, and the hardware profile.

:class:`EngineSizing` holds the methods :class:`~writescope.engine.engine.LLMEngine` calls while
it is built (its ``__init__`` sets the state they read: ``config``, ``dtype``, ``device``,
``model``, ``max_model_len``, ``cpu_expert_layers``, ``kv_split``, ``profile``, ...), so that
``engine.py`` keeps the request loop.
"""
from __future__ import annotations

import dataclasses
import os
import warnings

import torch

from .. import hostmem
from ..kvcache.regions import Region


def _gib(n: int | None) -> str:
    return "default" if n is None else f"{n / 2**30:.1f} GiB"


class EngineSizing:
    """Start-up sizing of :class:`~writescope.engine.engine.LLMEngine` (a mixin)."""

    def _step_activation_bytes(self, max_tokens: int) -> int:
        """Device bytes kept for the largest step: its activations (:meth:`_activation_bytes`)
        and a prefill chunk's whole context, gathered for the dense prefill kernel
        (``planner.activations.context_gather_bytes``: one layer of up to max_model_len tokens,
        held twice, and MLA's decompressed keys and values)."""
        from ..planner.activations import context_gather_bytes
        return self._activation_bytes(max_tokens) + \
            context_gather_bytes(self.config, self.dtype, self.max_model_len)

    def _best_split(self, profile, vram: int, spec, max_num_seqs: int, **kw) -> dict | None:
        """kv_cache_memory="auto": the split the roofline predicts fastest for ``max_num_seqs``
        sequences of ``max_model_len`` tokens, keeping at least one such sequence's KV
        (``planner.expert_split.best_split``; ``kw``: its margin and fewest CPU layers), with
        decode steps in the form the runner gives them (``WRITESCOPE_PIPELINE_EXPERTS``: with
        ``1`` the steps with CPU experts and all KV in HBM as two sub-batches, with ``auto``,
        the default, in the faster form, ``roofline.expert_form``)."""
        from ..kvcache.subbatches import expert_pipeline_mode
        from ..planner.expert_split import best_split
        from ..planner.roofline import expert_form
        return best_split(profile, self.config, [self.max_model_len] * max_num_seqs, vram,
                          min_kv_bytes=spec.token_bytes() * self.max_model_len, dtype=self.dtype,
                          device=self.device, pipelined=expert_form(expert_pipeline_mode()), **kw)

    def _fit_experts_around_kv(self, vram: int, weights: int, act: int, buffers: int,
                               kv_need: int, spec, max_num_seqs: int, max_tokens: int,
                               profile) -> tuple[int, int]:
        """With ``experts="auto"`` the experts were placed before the model was built, around
        ``kv_need`` (``kv_cache_memory``, else one ``max_model_len`` sequence's KV) and a default
        margin for the activations. Where the activations measured since leave the KV less than
        that, move more MoE layers' routed experts to the CPU (spread among those already
        there, ``expert_placement.cpu_layer_order``; ``layers/expert_move.py``) until it fits.
        Under ``kv_cache_memory="auto"`` the split is chosen again with the measured
        activations, among the splits with at least the layers already on the CPU. Returns the
        device weight bytes and activation bytes after the moves."""
        from ..layers.expert_move import experts_to_cpu, host_bytes

        def left() -> int:
            return vram - weights - act - buffers

        if left() >= kv_need:
            return weights, act
        want = None  # under "auto": how many MoE layers' experts the new split puts on the CPU
        if self.kv_split is not None:
            new = self._best_split(profile, vram, spec, max_num_seqs, margin_bytes=act + buffers,
                                   min_cpu_layers=sum(self.cpu_expert_layers))
            if new is not None:
                want = new["cpu_layers"]
                self.kv_split = new
                self.kv_cache_memory = new["kv_cache_memory"]  # None: every layer's experts
        from ..layers.expert_placement import cpu_layer_order
        for _ in range(2):  # a second pass when the first CPU layers' upload buffer was measured
            moved = []
            blocks = dict(self.model.moe_blocks())
            on_cpu = [i for i, m in blocks.items() if m.cpu_experts is not None]
            for i in cpu_layer_order(blocks, on_cpu):  # the next ones spread among them
                m = blocks[i]
                if (sum(self.cpu_expert_layers) >= want if want is not None
                        else left() >= kv_need):
                    break
                avail, need = hostmem.available_ram_bytes(), host_bytes(m, self.dtype)
                if avail is not None and need > avail:
                    warnings.warn(f"experts='auto': MoE layer {i}'s routed experts "
                                  f"({need / 2**30:.2f} GiB) do not fit in the host "
                                  f"memory available ({avail / 2**30:.2f} GiB); they stay on "
                                  f"the {self.device.type}", RuntimeWarning, stacklevel=3)
                    break
                weights -= experts_to_cpu(m, self.dtype)
                self.cpu_expert_layers[i] = True
                moved.append(m)
            if not moved:
                break
            self.experts_moved_layers += len(moved)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self.expert_uploader is not None:
                for m in moved:
                    self.expert_uploader.register(m.cpu_experts)
                    m.uploader = self.expert_uploader
                break
            self.expert_uploader = self._attach_expert_uploader()
            if self.expert_uploader is None:
                break
            # the first CPU layers: prefill chunks now run them through the upload buffer,
            # which the measured activations did not hold yet
            act = self._step_activation_bytes(max_tokens)
        return weights, act

    def _attach_expert_uploader(self):
        """On CUDA, let prefill-sized steps run the CPU-placed experts on the GPU
        (``layers/expert_upload.py``); the host weights are page-locked for fast copies."""
        if self.device.type != "cuda" or not any(self.cpu_expert_layers):
            return None
        from ..layers.expert_upload import ExpertUploader
        from ..layers.moe import MoE
        up = ExpertUploader(self.device)
        if up.min_tokens <= 0:
            return None
        layers = [m for m in self.model.modules() if isinstance(m, MoE) and m.cpu_experts is not None]
        for m in layers:
            up.register(m.cpu_experts)
            m.uploader = up
        return up

    def _attach_expert_link(self):
        """With routed experts on the CPU: the link's share of small decode steps' experts
        (``layers/expert_link.py``), given to the runner and to every CPU-expert layer."""
        if not any(self.cpu_expert_layers):
            return None
        from ..layers.expert_link import ExpertLink
        from ..layers.moe import MoE
        link = ExpertLink(self.device, self.profile, buffer=self.expert_uploader)
        for m in self.model.modules():
            if isinstance(m, MoE) and m.cpu_experts is not None:
                m.link = link
        return link

    def _check_host_memory(self) -> None:
        """Refuse, before allocating anything, a model whose host-resident weights (routed experts
        on the CPU; every weight when the device is the CPU) exceed the memory available now."""
        from ..layers.expert_placement import expert_placement_summary
        summary = expert_placement_summary(self.config, self.cpu_expert_layers, self.dtype,
                                           self.device)
        host = summary["cpu_expert_bytes"]
        if self.device.type == "cpu":
            host += summary["gpu_weight_bytes"]
        avail = hostmem.available_ram_bytes()
        if avail is not None and host > avail:
            raise MemoryError(
                f"{self.model_name} needs {host / 2**30:.1f} GiB of weights in host memory "
                f"({summary['cpu_expert_layers']} layers of routed experts on the CPU"
                f"{', all weights on the CPU device' if self.device.type == 'cpu' else ''}); "
                f"{avail / 2**30:.1f} GiB is available")

    def _check_kv_host_memory(self, layout, spec, pinned_budget, host_budget) -> None:
        """Refuse, before the pools are allocated, host KV budgets (``pinned_budget``,
        ``host_budget``; the defaults stay under half the host's memory) whose T and C regions
        exceed the memory available now: else the allocation fails with the allocator's error,
        or pageable pages fail later, mid-run."""
        if pinned_budget is None and host_budget is None:
            return
        by = layout.bytes(spec)
        need = by[Region.T] + by[Region.C]
        avail = hostmem.available_ram_bytes()
        if avail is not None and need > avail:
            raise MemoryError(
                f"the KV cache's host regions (T + C) would take {need / 2**30:.1f} GiB of host "
                f"memory (pinned_budget {_gib(pinned_budget)}, host_budget "
                f"{_gib(host_budget)}); {avail / 2**30:.1f} GiB is available")

    def _activation_bytes(self, max_tokens: int) -> int:
        """Activation memory of the largest step. On CUDA it is measured, as vLLM does: one
        warm-up forward of ``max_tokens`` prompt tokens (attention over themselves only), peak
        allocation minus what was allocated before. Elsewhere it is planned from the widest
        tensors of a step: hidden states, the MLP/expert intermediate, q/k/v, a prefill chunk's
        attention scores and the logits of the sampled rows."""
        if self.device.type == "cuda":
            return self._measure_activation_bytes(max_tokens)
        cfg = self.config
        item = torch.tensor([], dtype=self.dtype).element_size()
        width = max(cfg.hidden_size * 4, cfg.intermediate_size * 2,
                    cfg.moe_intermediate_size * 2 * cfg.num_experts_per_tok,
                    cfg.num_heads * (cfg.head_dim + cfg.kv_lora_rank + 64) * 2)
        from ..attention.selfattn import SCORE_ELEMS
        scores = min(cfg.num_heads * max_tokens * max_tokens, SCORE_ELEMS) * 4 * 3
        logits = 256 * cfg.vocab_size * 4
        return max_tokens * width * item * 2 + scores + logits

    @torch.no_grad()  # not inference_mode: the CPU worker thread writes pinned buffers
    def _measure_activation_bytes(self, max_tokens: int) -> int:
        from ..attention.selfattn import causal_self_attention
        spec, scale = self.config.kv_spec(self.dtype), self.config.softmax_scale

        class WarmupContext:  # attention of one long segment over itself; no cache writes
            def attention(self, layer, q, records, dense=None):
                n = q.shape[0]
                if dense is not None and dense(0, n, records):  # MLA: per head, as in prefill
                    return q.new_zeros(n, q.shape[1], spec.v_dim)
                return causal_self_attention(q, records, spec, [n], scale)[0].to(q.dtype)

        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        n = min(max_tokens, self.max_model_len)
        ids = torch.randint(0, self.config.vocab_size, (n,), device=self.device)
        hidden = self.model(ids, torch.arange(n, device=self.device), WarmupContext())
        self.model.compute_logits(hidden[-min(n, 256):])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del hidden
        torch.cuda.empty_cache()
        return int(peak * 1.1)  # 10% headroom for allocator fragmentation

    def _use_calibrated_cpu_variant(self) -> str | None:
        """Run the CPU attention kernel variant the profile measured fastest for this model's
        attention family (unless ``WRITESCOPE_CPU_ATTN_ISA`` chose one, or this CPU lacks it),
        and the AMX prefetch distance it measured fastest (unless
        ``WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS`` or a call chose one)."""
        from ..attention import cpu as cpu_attn
        from ..planner.roofline import attn_family
        fam = attn_family(self.config)
        pf = (getattr(self.profile, "cpu_attn_prefetch_blocks", None) or {}).get(fam)
        if not cpu_attn.prefetch_chosen_by_user():  # (an earlier engine's profile's, else)
            cpu_attn.set_prefetch_blocks(cpu_attn.DEFAULT_PREFETCH_BLOCKS if pf is None else pf,
                                         from_profile=True)
        isa = (getattr(self.profile, "cpu_attn_isa", None) or {}).get(fam)
        if (not isa or cpu_attn.isa_chosen_by_user()
                or os.environ.get("WRITESCOPE_CPU_ATTN_ISA", "auto") != "auto"
                or not cpu_attn.available() or isa not in cpu_attn.isas()):
            return None
        cpu_attn.set_isa(isa, from_profile=True)
        return isa

    @staticmethod
    def _load_profile(profile, cfg, eager: bool = False):
        """The hardware profile the planner plans with: the given file, ``$WRITESCOPE_PROFILE``,
        this machine's cached profile, or a quick calibration (cached). Where this engine
        replays no decode step as a CUDA graph (``eager``: enforce_eager, or
        ``WRITESCOPE_CUDA_GRAPHS`` other than on), the profile's graph kernel cost is dropped,
        so the roofline charges every kernel an eager launch (``planner.roofline.launch_cost_s``)."""
        from ..planner.profile import load_or_default
        from . import graphs
        prof = load_or_default(profile, model_config=cfg)
        other = _measured_elsewhere(prof)
        if other:
            warnings.warn(f"the hardware profile was measured on another machine ({other}): the "
                          "planner starts from that machine's ceilings until its step times "
                          "correct them (`writescope calibrate` measures this one)", stacklevel=2)
        if (eager or graphs.mode() != "on") and prof.graph_launch_s is not None:
            prof = dataclasses.replace(prof, graph_launch_s=None)
        return prof


def _measured_elsewhere(prof) -> str:
    """How the machine ``prof`` was measured on differs from this one (its CPU's or GPU's
    name), or "" where it does not or the profile does not say."""
    from ..planner.profile import machine_description
    theirs = prof.machine or {}
    if "cpu" not in theirs:
        return ""
    ours = machine_description()
    diffs = [f"{what} {theirs.get(k) or 'none'!r}, this one {ours.get(k) or 'none'!r}"
             for k, what in (("cpu", "CPU"), ("gpu", "GPU")) if theirs.get(k) != ours.get(k)]
    return "; ".join(diffs)
