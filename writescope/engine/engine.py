"""LLMEngine: the loop that owns the model, the KV cache, the scheduler and the runner.

``add_request`` validates and queues; ``step`` schedules, runs one forward pass, and turns sampled
tokens into :class:`~writescope.core.RequestOutput` records; finished and aborted requests give
their KV blocks back at once. Not thread-safe: the server runs it on one thread.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import weakref
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..core import (FinishReason, InvalidRequestError, Request, RequestOutput,
                    RequestOutputKind, RequestStatus, RequestTooLargeError, SamplingParams, as_int,
                    cache_salt_of, kv_tokens, prompt_of)
from ..kvcache.cache import InplaceKVCache, plan_layout
from ..kvcache.placement import make_policy
from ..layers.grammar import Grammars
from ..attention.hybrid import staging_bytes
from ..attention.gather import DEFAULT_GATHER_BYTES
from ..kvcache.regions import DEFAULT_BLOCK_SIZE, Region
from ..models.loader import build_model
from .. import hostmem
from .cores import reserve_launch_core
from . import parallel
from .beam import BeamPrompt, BeamSearch, BeamSearchParams
from .generation_config import sampling_defaults
from .inflight import next_input_ids, overlap_enabled
from .model_source import parse_dtype, resolve_model
from .runner import Launched, ModelRunner
from .scheduler import SCHEDULING_POLICIES, Scheduler
from .sizing import EngineSizing

def _bytes(v) -> int | None:
    if v is None:
        return None
    from ..units import parse_bytes
    return parse_bytes(v)


def _weak_prior(engine: "LLMEngine"):
    """The step-form chooser's prior (``LLMEngine._split_experts_predicted_faster``) through a
    weak reference to the engine: None once the engine is gone."""
    method = weakref.WeakMethod(engine._split_experts_predicted_faster)

    def prior(batch):
        m = method()
        return None if m is None else m(batch)
    return prior


def freeze_gc() -> None:
    """Move every object alive now (the model, its modules and parameters, the tokenizer: a few
    hundred thousand objects) out of the garbage collector's reach, as vLLM does after start-up.
    A full collection otherwise scans them all. On the embedded default model, 64 decode steps
    of the ``writescope`` policy (whose planner allocates small objects every step) set off one
    that took ~150 ms in the middle of a step; with the objects frozen, all 18 collections of
    the run took 2.5 ms. ``WRITESCOPE_GC_FREEZE=0`` turns this off."""
    if os.environ.get("WRITESCOPE_GC_FREEZE", "1") == "0":
        return
    import gc
    gc.collect()
    gc.freeze()


class LLMEngine(EngineSizing):
    def __init__(self, model: str | os.PathLike | None = None, dtype: str | torch.dtype = "bfloat16",
                 device: str | torch.device | None = None, random_weights: bool = False,
                 seed: int = 0, *, max_num_seqs: int = 64, max_model_len: int | None = None,
                 max_num_batched_tokens: int = 2048, block_size: int = DEFAULT_BLOCK_SIZE,
                 vram_budget: int | str | None = None, pinned_budget: int | str | None = None,
                 host_budget: int | str | None = None, num_gpu_blocks: int | None = None,
                 kv_policy: str = "writescope", cpu_share: float = 0.5, experts: str = "auto",
                 cpu_threads: int | None = None, profile: str | os.PathLike | None = None,
                 show_progress: bool = False, config_overrides: dict | None = None,
                 enable_prefix_caching: bool = True, kv_cache_memory: int | str | None = None,
                 gpu_memory_utilization: float | None = None, enforce_eager: bool = False,
                 generation_config: str | os.PathLike | None = "auto",
                 tokenizer: str | os.PathLike | None = None, scheduling_policy: str = "fcfs"):
        if scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {scheduling_policy!r}")
        #: vLLM's: "fcfs" (admission in arrival order) or "priority" (by each request's
        #: ``priority``, lower first, ties by arrival; a waiting request that does not fit
        #: preempts running requests of lower priority: engine/scheduler.py)
        self.scheduling_policy = scheduling_policy
        self.dtype = parse_dtype(dtype, {})  # checked now; "auto" is resolved with the config
        try:
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        except RuntimeError:  # torch's message lists every device type it knows
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}") from None
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but CUDA is not available")
        for name, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens),
                        ("block_size", block_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name, v, least in (("num_gpu_blocks", num_gpu_blocks, 0), ("cpu_threads", cpu_threads, 1)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
                raise ValueError(f"{name} must be an integer of at least {least}, got {v!r}")
        if gpu_memory_utilization is not None:
            if isinstance(gpu_memory_utilization, bool) or not isinstance(
                    gpu_memory_utilization, (int, float)) or not 0 < gpu_memory_utilization <= 1:
                raise ValueError("gpu_memory_utilization must be a fraction in (0, 1], got "
                                 f"{gpu_memory_utilization!r}")
            if vram_budget is not None:
                raise ValueError("give vram_budget or gpu_memory_utilization, not both")
        self.config, ckpt, self.model_name = resolve_model(model, random_weights, config_overrides)
        self.dtype = parse_dtype(dtype, self.config.raw)
        self.config_overrides = dict(config_overrides or {})
        if self.device.type == "cuda":
            # the CPU kernels' worker threads need the GIL around each call while this thread
            # holds it launching GPU work; with the default 5 ms switch interval a worker may
            # wait that long per hand-over. On the H200 machine the in-engine CPU attention cost
            # ~1.5 ms per layer call beyond its bytes (bench/results/2026-11-30-h200/); this is
            # the suspected cause, not yet measured.
            sys.setswitchinterval(min(sys.getswitchinterval(), 2e-4))
            if cpu_threads is None:
                reserve_launch_core()
        cfg = self.config
        if max_model_len is not None:  # (0 is refused below, not taken for "the default")
            max_model_len = as_int(max_model_len)
            if not isinstance(max_model_len, int) or isinstance(max_model_len, bool):
                raise ValueError(f"max_model_len must be an integer, got {max_model_len!r}")
        # vLLM's derived default when not given
        self.max_model_len = cfg.max_positions if max_model_len is None else max_model_len
        win = cfg.sliding_window
        if win is not None and self.max_model_len > win and not random_weights:
            # full attention is sliding-window attention up to the window, and only there
            if max_model_len is not None:
                raise ValueError(f"max_model_len {self.max_model_len} is longer than the model's "
                                 f"sliding window ({win} tokens), which writescope does not "
                                 f"implement: set max_model_len to at most {win}")
            warnings.warn(f"this model attends over a sliding window of {win} tokens, which "
                          f"writescope does not implement: max_model_len is {win}, where full "
                          "attention is the same", RuntimeWarning, stacklevel=2)
            self.max_model_len = win
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if (self.max_model_len > cfg.max_positions and not random_weights
                and os.environ.get("WRITESCOPE_ALLOW_LONG_MAX_MODEL_LEN", "0") != "1"):
            # as vLLM: past its trained positions a checkpoint's outputs are not to be trusted
            # (random weights run at any length: benchmarks measure speed, not text)
            raise ValueError(f"max_model_len {self.max_model_len} is more than the model's "
                             f"{cfg.max_positions} positions; set "
                             "WRITESCOPE_ALLOW_LONG_MAX_MODEL_LEN=1 to run it anyway")
        self.tokenizer = None
        tok_dir = Path(model) if (model is not None and ckpt is None and Path(str(model)).exists()) else ckpt
        model_dir = tok_dir
        if tokenizer is not None:  # vLLM's tokenizer=: another folder's tokenizer
            tok_dir = Path(tokenizer)
            if not tok_dir.is_dir():
                raise ValueError(f"tokenizer must be a folder holding a tokenizer, got {tokenizer!r}")
        if tok_dir is not None and any((tok_dir / f).exists() for f in (
                "tokenizer_config.json", "tokenizer.json", "tokenizer.model")):
            from ..models.tokenizer import Tokenizer
            self.tokenizer = Tokenizer.from_pretrained(tok_dir, checkpoint=model_dir)
        elif tokenizer is not None:
            raise ValueError(f"no tokenizer in {tok_dir} (tokenizer_config.json, tokenizer.json "
                             "or tokenizer.model)")
        #: token ids -> text for the outputs' Logprob.decoded_token (the tokenizer's own method:
        #: an output kept after the engine is gone holds the tokenizer, not the engine)
        self._decode_tokens = None if self.tokenizer is None else functools.partial(
            self.tokenizer.decode, skip_special_tokens=False)
        #: the model's sampling defaults (vLLM's generation_config="auto": its
        #: generation_config.json's temperature, top_p, ...; engine/generation_config.py), for
        #: requests that leave them out: ``default_sampling_params()``, the server
        self.default_sampling = sampling_defaults(generation_config, model_dir)
        if self.default_sampling:
            try:
                SamplingParams(**self.default_sampling)
            except InvalidRequestError as e:
                raise ValueError(f"the generation config's sampling defaults "
                                 f"{self.default_sampling} are invalid: {e}") from None

        vram = _bytes(vram_budget)
        if vram is None and self.device.type == "cuda":
            vram = int(torch.cuda.get_device_properties(self.device).total_memory
                       * (0.9 if gpu_memory_utilization is None else gpu_memory_utilization))
        if vram is None:  # CPU-only: "device" memory is host memory
            vram = hostmem.ram_bytes() // 4 if gpu_memory_utilization is None else \
                int(hostmem.ram_bytes() * gpu_memory_utilization)
        self.vram_budget = vram
        spec = cfg.kv_spec(self.dtype)
        from ..layers.expert_placement import choose_expert_layers
        #: kv_cache_memory="auto": the split of routed experts against KV in HBM the roofline
        #: predicts fastest for max_num_seqs sequences of max_model_len tokens
        #: (planner/expert_split.py): {"cpu_layers", "kv_cache_memory", "step_s"}
        self.kv_split = None
        early_profile = None
        from ..units import is_auto
        if is_auto(kv_cache_memory):
            if not isinstance(experts, str) or experts.lower() != "auto":
                raise ValueError("kv_cache_memory='auto' chooses where the routed experts run: "
                                 f"it needs experts='auto', got experts={experts!r}")
            early_profile = self._load_profile(profile, cfg, enforce_eager)
            if cfg.quantization is not None and early_profile.lacks_fp8_expert_rates:
                warnings.warn("kv_cache_memory='auto': the profile has no FP8 CPU expert rates, "
                              "so the split is chosen with FP8 experts charged bf16's bytes/s "
                              "(optimistic); run `writescope calibrate`", RuntimeWarning,
                              stacklevel=2)
            self.kv_split = self._best_split(early_profile, vram, spec, max_num_seqs)
            kv_cache_memory = None  # no split fits: choose_expert_layers says why
            if self.kv_split is not None and self.kv_split["kv_cache_memory"] is None:
                experts = "cpu"
            elif self.kv_split is not None:
                kv_cache_memory = self.kv_split["kv_cache_memory"]
        #: device bytes asked for the KV cache's G and W regions (vLLM's kv_cache_memory_bytes):
        #: experts='auto' places the routed experts around it, and the regions take no more
        self.kv_cache_memory = _bytes(kv_cache_memory)
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {kv_cache_memory!r}")
        if self.kv_cache_memory is not None and \
                self.kv_cache_memory < max_num_seqs * spec.block_bytes(block_size):
            raise ValueError(f"kv_cache_memory {self.kv_cache_memory} bytes cannot hold one write "
                             f"tail per sequence ({max_num_seqs} x {spec.block_bytes(block_size)} "
                             "bytes): raise it or lower max_num_seqs")
        kv_need = max(spec.token_bytes() * self.max_model_len, self.kv_cache_memory or 0)
        self.cpu_expert_layers = choose_expert_layers(cfg, experts, vram, kv_need, self.dtype,
                                                      device=self.device)

        self._check_host_memory()
        t0 = time.perf_counter()
        bars: list = []  # the loader opens the bar once it knows how many tensor groups

        def open_bar(total: int):
            bars.append(tqdm(total=total, desc=f"loading {self.model_name}", unit="tensor",
                             disable=not show_progress))
            return bars[-1]
        try:
            self.model = build_model(cfg, dtype=self.dtype, device=self.device, checkpoint=ckpt,
                                     random_weights=random_weights, seed=seed,
                                     cpu_expert_layers=self.cpu_expert_layers, progress=open_bar)
        finally:
            for bar in bars:
                bar.close()
        weights_on_device = sum(p.numel() * p.element_size() for p in self.model.parameters()
                                if p.device.type == self.device.type)
        t1 = time.perf_counter()
        self.expert_uploader = self._attach_expert_uploader()
        t2 = time.perf_counter()
        # a prefill chunk's whole context, gathered for the dense prefill kernel: one layer of
        # up to max_model_len tokens, held twice (gathered, then joined with the chunk's records)
        act = self._step_activation_bytes(max_num_batched_tokens)
        #: where start-up time went (seconds): weights, page-locking CPU experts, activations
        self.build_times = {"weights_s": t1 - t0, "pin_experts_s": t2 - t1,
                            "activations_s": time.perf_counter() - t2}
        # the T staging ring and the C gather buffers live in HBM too (only on CUDA; elsewhere
        # T and C are read in place)
        staging = staging_bytes() if self.device.type == "cuda" else 0
        gather = DEFAULT_GATHER_BYTES if self.device.type == "cuda" else 0
        #: MoE layers whose routed experts were moved to the CPU once the activations were known
        #: (:meth:`_fit_experts_around_kv`)
        self.experts_moved_layers = 0
        if isinstance(experts, str) and experts.lower() == "auto":
            t3 = time.perf_counter()
            if num_gpu_blocks is not None:  # G holds no more than that: room for more is wasted
                kv_need = min(kv_need, (num_gpu_blocks + max_num_seqs) * spec.block_bytes(block_size))
            weights_on_device, act = self._fit_experts_around_kv(
                vram, weights_on_device, act, staging + gather, kv_need, spec, max_num_seqs,
                max_num_batched_tokens, early_profile)
            if self.experts_moved_layers:
                self.build_times["move_experts_s"] = time.perf_counter() - t3
        self.weights_bytes = weights_on_device
        #: device bytes kept for the largest step's activations (measured on CUDA, with 10%
        #: headroom; planned elsewhere) and for the staging and gather buffers
        self.activation_bytes, self.buffer_bytes = act, staging + gather
        kv_device = vram - weights_on_device - act - staging - gather
        if kv_device <= 0:
            raise ValueError(
                f"vram_budget {vram / 2**30:.2f} GiB leaves no room for KV: weights placed on the "
                f"{self.device.type} take {weights_on_device / 2**30:.2f} GiB, activations "
                f"{act / 2**30:.2f} GiB and the staging buffers {(staging + gather) / 2**30:.2f} GiB "
                "(try experts='cpu' or a larger budget)")
        if self.kv_cache_memory is not None:
            # (kv_cache_memory="auto" asked for no number: its split's G region is what is left)
            if kv_device < self.kv_cache_memory and self.kv_split is None:
                warnings.warn(
                    f"kv_cache_memory asks for {self.kv_cache_memory / 2**30:.2f} GiB of device "
                    f"memory for the KV cache; the budget leaves {kv_device / 2**30:.2f} GiB (weights "
                    f"{weights_on_device / 2**30:.2f}, activations {act / 2**30:.2f}, staging "
                    f"{(staging + gather) / 2**30:.2f} GiB): the cache takes that",
                    RuntimeWarning, stacklevel=2)
            kv_device = min(kv_device, self.kv_cache_memory)
        max_total = max_num_seqs * self.max_model_len
        bb = spec.block_bytes(block_size)
        host_default = min(max_total // block_size + 1, hostmem.ram_bytes() // 2 // bb) * bb
        pinned = _bytes(pinned_budget)
        host = _bytes(host_budget)
        layout = plan_layout(spec, block_size, device_bytes=kv_device,
                             pinned_bytes=pinned if pinned is not None else host_default // 2,
                             host_bytes=host if host is not None else host_default,
                             max_tokens_total=max_total, max_num_seqs=max_num_seqs,
                             num_gpu_blocks=num_gpu_blocks)
        self._check_kv_host_memory(layout, spec, pinned, host)
        self.profile = early_profile or self._load_profile(profile, cfg, enforce_eager)
        self.expert_link = self._attach_expert_link()
        self.cpu_attn_isa = self._use_calibrated_cpu_variant()
        self._kv_args = dict(spec=spec, layout=layout, cpu_threads=cpu_threads,
                             staging=staging if layout.num_blocks[Region.T] else 0,
                             max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
        self.cache = None
        #: automatic prefix caching (kvcache/prefix.py): on unless asked off, and never under
        #: the migrate baseline (it moves blocks that sequences would share)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        #: decode steps never replayed as CUDA graphs (vLLM's enforce_eager;
        #: WRITESCOPE_CUDA_GRAPHS=0 does the same for every engine)
        self.enforce_eager = bool(enforce_eager)
        self.eos_ids = set(self.tokenizer.eos_token_ids if self.tokenizer is not None
                           else self.config.eos_token_id)
        #: the tokenizer's own EOS (else config.json's first): an output it ends has no
        #: ``stop_reason``; the other EOS ids (generation_config.json's) end outputs as vLLM's
        #: stop_token_ids, named by ``stop_reason``
        self.model_eos_id = (self.tokenizer.hf.eos_token_id if self.tokenizer is not None
                             else next(iter(self.config.eos_token_id), None))
        #: the constrained requests' matchers (structured outputs; layers/grammar.py)
        self.grammars = Grammars(self.tokenizer, cfg.vocab_size)
        self.set_kv_policy(kv_policy, cpu_share=cpu_share)
        self._fit_max_model_len(given=max_model_len is not None)
        self.requests: dict[str, Request] = {}
        #: requests of several completions and their child requests (engine/parallel.py)
        self.fanout = parallel.Fanout()
        self._detok: dict[str, object] = {}
        #: overlapped decode steps (engine/inflight.py): whether they run, the step in flight,
        #: and outputs of a step completed outside ``step`` (returned by the next call)
        self.overlap = overlap_enabled(self.device)
        self._inflight: Launched | None = None
        self._held: list[RequestOutput] = []
        self.counters = {"engine.steps": 0, "engine.prompt_tokens": 0, "engine.generated_tokens": 0,
                         "engine.requests_finished": 0, "engine.requests_aborted": 0,
                         "engine.step_time_s": 0.0, "engine.synthetic_prefill_tokens": 0,
                         "engine.overlapped_steps": 0,
                         # running requests preempted for higher priorities (vLLM's
                         # num_preemptions; scheduling_policy="priority")
                         "engine.preemptions": 0}
        freeze_gc()

    def _fit_max_model_len(self, given: bool) -> None:
        """Where the KV budgets cannot hold one sequence of ``max_model_len`` tokens: the
        derived default comes down to what they hold, as vLLM's ``--max-model-len auto`` does (a
        request without ``max_tokens`` then gets the room they leave, instead of being refused);
        a length that was asked for stays, with a warning (vLLM refuses to start): the budgets
        are the user's, and a request that can never fit is refused by name."""
        cache = self.cache
        fit = (cache.sealed_capacity + 1) * cache.bs  # its last block stays in the W tail
        if self.max_model_len <= fit or cache.layout.num_blocks[Region.W] == 0:
            return
        if given:
            warnings.warn(f"the KV budgets hold at most {fit} tokens of one sequence, fewer than "
                          f"max_model_len {self.max_model_len}: longer requests are refused",
                          RuntimeWarning, stacklevel=3)
            return
        warnings.warn(f"the KV budgets hold at most {fit} tokens of one sequence: max_model_len "
                      f"is {fit} (not the model's {self.max_model_len})", RuntimeWarning,
                      stacklevel=3)
        self.max_model_len = fit

    def set_kv_policy(self, kv_policy: str, cpu_share: float = 0.5,
                      cpu_threads: int | None = None) -> None:
        """(Re)build an empty KV cache of the same layout under ``kv_policy``, over the same
        weights (the bench compares policies this way). Only between requests. ``cpu_threads``:
        the new cache's CPU attention team size (default: the engine's ``cpu_threads``)."""
        if self.cache is not None:
            if self.has_unfinished_requests():
                raise RuntimeError("cannot change the KV policy while requests are running")
            self._drain()  # a step of finished requests still in flight
            self.cache.hybrid.close()
            old = weakref.ref(self.cache)
            self.cache = self.scheduler = self.runner = None
            if old() is not None:
                # held by a reference cycle (or frozen out of the collector's reach at start-up):
                # its pools must go before the new ones are allocated, or the host holds two
                # T pools (page-locked) and two C pools at once
                import gc
                gc.unfreeze()
                gc.collect()
                freeze_gc()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        a = self._kv_args
        policy = make_policy(kv_policy, cpu_share=cpu_share, profile=self.profile,
                             model_config=self.config,
                             experts_on_cpu=tuple(self.cpu_expert_layers),
                             block_size=a["layout"].block_size)
        self.kv_policy = kv_policy
        self.cache = InplaceKVCache(a["spec"], a["layout"], policy, self.device,
                                    self.config.softmax_scale,
                                    a["cpu_threads"] if cpu_threads is None else cpu_threads,
                                    staging_bytes=a["staging"],
                                    prefix_caching=self.enable_prefix_caching
                                    and not policy.moves_blocks)
        self.scheduler = Scheduler(self.cache, a["max_num_seqs"], a["max_num_batched_tokens"],
                                   self.scheduling_policy)
        # the CPU workers (attention, experts) need the GIL for a few microseconds between
        # native calls; a launching thread holding it makes them wait up to the interpreter's
        # switch interval (5 ms by default). WRITESCOPE_SWITCH_INTERVAL (seconds) shortens it.
        if os.environ.get("WRITESCOPE_SWITCH_INTERVAL"):
            sys.setswitchinterval(float(os.environ["WRITESCOPE_SWITCH_INTERVAL"]))
        self.runner = ModelRunner(self.model, self.cache, self.device, eager=self.enforce_eager)
        self.runner.sampler.processors.eos_ids = self.eos_ids  # what min_tokens holds back
        self.runner.sampler.grammars = self.grammars
        self.runner.expert_link = self.expert_link
        if any(self.cpu_expert_layers):
            self.runner.experts_on_cpu = True
            self.runner.pipeline = False
            # (weakly: a bound method would make engine -> runner -> engine a cycle, which
            # freeze_gc puts out of the collector's reach, so the engine and its GPU memory
            # would outlive its last reference)
            self.runner.form_prior = _weak_prior(self)
            # the attention team must not spin on the next layer's queries while the experts'
            # team computes this layer's experts on the same cores
            if not os.environ.get("WRITESCOPE_CPU_SPIN_US"):
                self.cache.hybrid.cpu_spin_s = 0.0
        elif not self.runner.pipeline_auto:
            self.runner.step_forms = None  # (made for WRITESCOPE_PIPELINE_EXPERTS=auto)
        if hasattr(self.cache.policy, "pipelined"):  # the planner models what the runner does
            # (with WRITESCOPE_PIPELINE=auto, or experts split, the runner sets it step by step;
            # one batch until a decode step has run split)
            self.cache.policy.pipelined = self.runner.pipelines and not self.runner.pipeline_auto

    def _split_experts_predicted_faster(self, batch) -> bool | None:
        """Whether the planner predicts a decode step of ``batch`` faster with its CPU experts
        split into two sub-batches than as one batch (the step-form chooser's prior): the
        roofline model of both forms (``roofline.predict_step``, uncorrected) at the batch's
        context, all of it in HBM -- the only steps the runner splits. None without a profile
        of a GPU machine."""
        from ..planner import roofline as rl
        if self.profile is None or not self.profile.has_gpu:
            return None
        lengths = [s.start + s.num_new for s in batch.seqs]
        load = rl.StepLoad(len(lengths), float(sum(lengths)), 0.0, 0.0, 0.0)
        layers = tuple(self.cpu_expert_layers)
        split, whole = (rl.predict_step(self.profile, self.config, load, layers, pipelined=p).step_s
                        for p in (True, False))
        return split < whole

    # ------------------------------------------------------------------ requests
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None, priority: int = 0) -> None:
        """Queue a request (refused, and nothing kept, where it is malformed or can never fit).
        ``priority`` (vLLM's): under ``scheduling_policy="priority"`` the waiting requests are
        admitted by it, lower first, ties by arrival (every completion of an ``n`` > 1 request
        has its priority); under "fcfs" only 0 is accepted."""
        priority = self.check_priority(priority)
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams")
        params.validate()
        if request_id in self.requests or request_id in self.fanout.parents:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        for name, ids in (("logit_bias", params.logit_bias or {}),
                          ("allowed_token_ids", params.allowed_token_ids or [])):
            bad = [t for t in ids if t >= self.config.vocab_size]
            if bad:
                raise InvalidRequestError(f"{name}: token id {bad[0]} is out of range "
                                          f"(vocabulary size {self.config.vocab_size})")
        ids, text, salt = self._prompt_ids(prompt, params)
        # a beam's prompt comes named (unless truncated: then named at admission)
        names = prompt.block_names if isinstance(prompt, BeamPrompt) and \
            len(ids) == len(prompt.tokens) else None
        if not parallel.fans_out(params):
            self._queue(request_id, ids, text, salt, params, priority, names)
            return
        # one child request per completion, over the prompt tokenised once
        children = self.fanout.split(request_id, params)
        for cid, _ in children:
            if cid in self.requests or cid in self.fanout.parents:
                raise InvalidRequestError(f"request id {cid!r} (completion {cid.split('_')[0]} "
                                          f"of {request_id!r}) is already in use")
        added = []
        try:
            for cid, cp in children:
                self._queue(cid, ids, text, salt, cp, priority, names)
                added.append(cid)
        except BaseException:
            for cid in added:  # none of them stays: the request is refused whole
                self._finish(self.requests[cid], FinishReason.ABORT)
            raise
        self.fanout.add(request_id, params, added)

    def check_priority(self, priority) -> int:
        """A request's ``priority`` checked: an integer (not a bool), and 0 unless the engine
        schedules by priority (vLLM refuses any other then)."""
        v = as_int(priority)
        if not isinstance(v, int) or isinstance(v, bool):
            raise InvalidRequestError(f"priority must be an integer, got {priority!r}")
        if v and self.scheduling_policy != "priority":
            raise InvalidRequestError(
                f"priority {v}: this engine does not use priority scheduling (scheduling_policy "
                f"{self.scheduling_policy!r}); leave priority 0, or build the engine with "
                "scheduling_policy='priority'")
        return v

    def beam_search(self, prompt, params: BeamSearchParams) -> BeamSearch:
        """A beam search over ``prompt`` (a string, token ids or a prompt dict), checked as a
        request's prompt is; the caller runs its steps (``LLM.beam_search``, the server)."""
        ids, _, salt = self._prompt_ids(prompt, params.step_params())
        self.check_beams_fit(len(ids), params.max_tokens)
        return BeamSearch(ids, params, self.eos_ids, self.max_model_len,
                          model_eos_id=self.model_eos_id, cache_salt=salt, checked=True,
                          namer=functools.partial(self.cache.extend_prefix_names,
                                                  cache_salt=salt))

    def check_beams_fit(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse, before any step, a beam search whose beams can never fit the KV budgets
        (its last step's request holds what one request of the prompt and ``max_tokens`` does:
        it would be refused there, every earlier step's work lost)."""
        self._check_fits(prompt_len, min(max_tokens, max(1, self.max_model_len - prompt_len)))

    def _check_fits(self, prompt_len: int, max_tokens: int) -> None:
        if not self.cache.can_ever_fit(kv_tokens(prompt_len, max_tokens)):
            raise RequestTooLargeError(
                f"{prompt_len} prompt + {max_tokens} new tokens can never fit the KV budgets "
                f"({self.cache.sealed_capacity} blocks of {self.cache.bs} tokens)")

    def _prompt_ids(self, prompt, params: SamplingParams) -> tuple[list[int], str | None,
                                                                    str | None]:
        """A request's prompt as checked token ids (``truncate_prompt_tokens`` applied), its
        text (None for ids, or once truncated) and its ``cache_salt``. A beam's prompt
        (:class:`BeamPrompt`) has only the tokens after its ``checked`` ones checked."""
        salt, ids, text = None, None, None
        if isinstance(prompt, BeamPrompt):
            done = min(max(prompt.checked, 0), len(prompt.tokens))
            if done:  # the tokens the search generated are checked as a prompt's are
                tail = prompt.tokens[done:]
                ids = prompt.tokens[:done] + (self._token_ids(tail) if tail else [])
            prompt, salt = prompt.tokens, prompt.cache_salt
        elif isinstance(prompt, dict):  # vLLM's TextPrompt / TokensPrompt
            try:
                prompt, salt = prompt_of(prompt), cache_salt_of(prompt)
            except ValueError as e:
                raise InvalidRequestError(str(e)) from None
        if ids is None and isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError(f"model {self.model_name} has no tokenizer: pass token ids")
            ids, text = self.tokenizer.encode(prompt), prompt
            top = max(ids, default=-1)
            if top >= self.config.vocab_size:  # a tokenizer larger than the model's embeddings
                raise InvalidRequestError(
                    f"the prompt's token id {top} is outside model {self.model_name}'s vocabulary "
                    f"(vocab_size {self.config.vocab_size} in config.json; its tokenizer has "
                    f"{len(self.tokenizer.hf)} tokens)")
        elif ids is None:
            ids = self._token_ids(prompt)
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        keep = params.truncate_prompt_tokens
        if keep is not None:  # the prompt's last tokens only (vLLM's truncate_prompt_tokens)
            keep = self.max_model_len - 1 if keep == -1 else keep
            if len(ids) > keep:
                ids, text = ids[-keep:], None
        if len(ids) > self.max_model_len:
            raise RequestTooLargeError(f"the prompt has {len(ids)} tokens; this model's context "
                                       f"(max_model_len) is {self.max_model_len}")
        return ids, text, salt

    def _token_ids(self, prompt) -> list[int]:
        """A prompt of token ids (a list, tuple, tensor or array) as a list of ints, each
        checked to be in the vocabulary."""
        if hasattr(prompt, "tolist") and not isinstance(prompt, (list, tuple)):
            prompt = prompt.tolist()  # a torch tensor or numpy array of ids
        if not isinstance(prompt, (list, tuple)):
            raise InvalidRequestError("a prompt is a string, a list of token ids or a prompt "
                                      f"dict, got {type(prompt).__name__}")
        if prompt and all(type(t) is int for t in prompt) and \
                0 <= min(prompt) and max(prompt) < self.config.vocab_size:
            return list(prompt)  # plain ints in range: checked at C speed
        ids = [as_int(t) for t in prompt]
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool)
               or not 0 <= t < self.config.vocab_size][:1]
        if bad:
            raise InvalidRequestError(f"token ids must be integers in [0, "
                                      f"{self.config.vocab_size}) (vocab_size of model "
                                      f"{self.model_name}); got {bad[0]!r}")
        return ids

    def _queue(self, request_id: str, ids: list[int], text: str | None, salt: str | None,
               params: SamplingParams, priority: int = 0,
               block_names: list[bytes] | None = None) -> None:
        """One completion's request into the scheduler's queue (refused, and nothing kept,
        where it can never fit or its constraint does not compile); ``block_names``: its
        prompt's prefix-cache names where they are known (a beam's)."""
        # a prompt of the whole context still gets its one token, as under vLLM: it is sampled
        # and never written (the server's echo without generation scores such a prompt)
        room = max(1, self.max_model_len - len(ids))
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        self._check_fits(len(ids), max_tokens)
        req = Request(request_id, ids, params, prompt=text, arrival=time.monotonic(),
                      max_tokens=max_tokens, cache_salt=salt, priority=priority,
                      block_names=block_names)
        if params.bad_words:
            req.bad_words_ids = self._bad_words_ids(params.bad_words)
        if params.structured_outputs is not None:  # compiled now: a bad grammar is refused here
            self.grammars.admit(req.seq_id, params.structured_outputs)
        if params.prompt_logprobs is not None:  # the first token has none (nothing before it)
            req.prompt_logprobs.append(None)
            req.prompt_ranks.append(None)
            if params.prompt_logprobs:
                req.prompt_top_logprobs.append(None)
        self.requests[request_id] = req
        if self.tokenizer is not None and (params.detokenize or params.structured_outputs):
            from ..models.tokenizer import IncrementalDetokenizer
            self._detok[request_id] = IncrementalDetokenizer(
                self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens)
        self.scheduler.add(req)
        self.counters["engine.prompt_tokens"] += len(ids)

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word's tokens as a word of its own and, where that makes other tokens of
        the same count, after a space (vLLM's rule: a word is banned at the start of the text
        and in its middle)."""
        if self.tokenizer is None:
            raise InvalidRequestError(f"model {self.model_name} has no tokenizer: bad_words "
                                      "cannot be tokenized")
        out: list[list[int]] = []
        for word in words:
            alone = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            out.append(alone)
            if spaced and spaced[0] != alone[0] and len(spaced) == len(alone):
                out.append(spaced)
        return [ids for ids in out if ids]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt block (vLLM's): the next prompts compute all their
        tokens. Only while no request is running or waiting (False, and nothing changes,
        otherwise); True without prefix caching."""
        if self.has_unfinished_requests():
            return False
        return self.cache.reset_prefix_cache()

    def abort_request(self, request_id: str | list[str]) -> None:
        """End a request (or several: vLLM's takes a list of ids); unknown or finished ids are
        ignored. A request of several completions ends whole, also by one child's id."""
        if isinstance(request_id, (list, tuple, set, frozenset)):
            for rid in list(request_id):
                self.abort_request(rid)
            return
        parent = self.fanout.parent_of(request_id) or request_id
        if parent in self.fanout.parents:
            self.abort_request(self.fanout.drop(parent))
            return
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return
        self._finish(req, FinishReason.ABORT)
        self.counters["engine.requests_aborted"] += 1

    def _finish(self, req: Request, reason: FinishReason) -> None:
        self.scheduler.remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.runner.sampler.forget(req.seq_id)
        self.requests.pop(req.request_id, None)
        self._detok.pop(req.request_id, None)

    def prefill_synthetic(self, seed: int = 0) -> int:
        """Benchmarks only: prefill the waiting requests with random KV instead of the model.

        The scheduler chunks and admits exactly as for real steps; each prefill chunk, cut short
        of its prompt's last token, is written by :meth:`InplaceKVCache.fill_step`, so the
        placement policy chooses every block's home as in a real prefill. (Differences: the KV
        values, and no sequence decodes while the others are still prefilling.) The next
        :meth:`step` then runs each prompt's last token and samples its first output token.
        Returns the tokens filled."""
        self._drain()  # the running requests' tokens first: the scheduler starts from them
        cache, spec = self.cache, self.cache.spec
        gen = torch.Generator(device=self.device).manual_seed(seed)
        filled = 0
        while True:
            work, advance = [], []
            for s in self._schedule().seqs:
                req = s.request
                n = min(s.num_new, req.num_prefill_tokens - 1 - s.start) \
                    if req.is_prefilling else 0
                if n > 0:
                    work.append((req.seq_id, s.start, n))
                    advance.append((req, s.start + n))
            if not work:
                break
            total = sum(n for _, _, n in work)
            rec = torch.randn(total, spec.num_kv_heads, spec.rec_dim, generator=gen,
                              device=self.device, dtype=torch.float32).to(spec.dtype)
            cache.fill_step(work, rec)
            for req, done in advance:
                req.num_computed = done
            filled += total
        self.counters["engine.synthetic_prefill_tokens"] += filled
        return filled

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput]:
        """Advance the running requests by one step; the outputs of the requests it advanced
        (a request of several completions as one output, engine/parallel.py).
        With overlapped decode steps (engine/inflight.py) the step whose outputs are returned
        may have been launched by the previous call, and the step that follows it is already
        on the device when this returns."""
        return self.fanout.fold(self._step())

    def _step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        outs, self._held = self._held, []
        h, self._inflight = self._inflight, None
        try:
            if h is None:
                batch = self._schedule()
                if not batch:
                    return outs
                h = self.runner.launch(batch, defer=self.overlap)
                self.counters["engine.steps"] += 1
            if h.deferred:  # in flight: launch the step that follows it before waiting for it
                nxt = self.scheduler.followup(h.batch)
                if nxt is not None and not self.runner.wants_timing(nxt[0]):
                    try:
                        self._inflight = self.runner.launch(
                            nxt[0], input_ids=next_input_ids(h.pending.tokens, nxt[1]),
                            defer=True)
                        self.counters["engine.steps"] += 1
                        self.counters["engine.overlapped_steps"] += 1
                    except BaseException:
                        self._apply(h)  # its tokens are good: the requests keep them
                        raise
            return outs + self._apply(h)
        finally:
            self.counters["engine.step_time_s"] += time.perf_counter() - t0

    def _schedule(self):
        """The scheduler's next step (only with no step in flight: a preemption releases the
        KV of a request the step in flight would write), its preemptions counted."""
        batch = self.scheduler.schedule()
        self.counters["engine.preemptions"] += len(self.scheduler.preempted)
        return batch

    def _drain(self) -> None:
        """Complete the step in flight, if any; its outputs go to the next :meth:`step`."""
        h, self._inflight = getattr(self, "_inflight", None), None
        if h is not None:
            self._held += self._apply(h)

    def _apply(self, h: Launched) -> list[RequestOutput]:
        """A launched step's tokens into its requests (waiting for them if they are still on
        their way); the outputs of the requests it advanced. Requests that finished while it
        was in flight get nothing from it."""
        tokens, logprobs, top, ranks = self.runner.collect(h)
        outputs = []
        sampled = iter(zip(tokens, logprobs, top or [None] * len(tokens),
                           ranks or [None] * len(tokens)))
        now = time.monotonic()
        for s in h.batch.seqs:
            req = s.request
            tok_lp = next(sampled) if s.sample else None
            if req.finished:
                continue
            req.num_computed = s.start + s.num_new
            plp = h.prompt_logprobs.get(req.seq_id) if h.prompt_logprobs else None
            if plp is not None and plp.first == len(req.prompt_logprobs):
                req.prompt_logprobs.extend(plp.logprobs)
                req.prompt_ranks.extend(plp.ranks)
                if plp.top is not None:
                    req.prompt_top_logprobs.extend(plp.top)
            if tok_lp is None:
                continue
            tok, lp, alternatives, rank = tok_lp
            req.output_token_ids.append(tok)
            req.logprobs.append(lp)
            req.ranks.append(rank)
            if alternatives is not None:
                req.top_logprobs.append(alternatives)
            if req.first_token_time is None:
                req.first_token_time = now
            self.counters["engine.generated_tokens"] += 1
            reason = self._check_stop(req, tok)
            if reason is not None:
                self._finish(req, reason)
                self.counters["engine.requests_finished"] += 1
            if req.finished or req.params.output_kind is not RequestOutputKind.FINAL_ONLY:
                outputs.append(self._output(req))
        return outputs

    def _check_stop(self, req: Request, tok: int) -> FinishReason | None:
        p = req.params
        detok = self._detok.get(req.request_id)
        early = len(req.output_token_ids) < p.min_tokens  # no stop before min_tokens (vLLM)
        stop_tok = not early and ((not p.ignore_eos and tok in self.eos_ids)
                                  or tok in p.stop_token_ids)
        # the stop token's own text (kept special tokens: "</s>") is not output: as in vLLM it
        # is not detokenised, so what is held back before it (part of a character) is flushed
        # below as the decode of the tokens before it reads
        new = detok.add(tok) if detok is not None and not (
            stop_tok and not p.include_stop_str_in_output) else ""
        req.text += new
        if p.structured_outputs is not None and new:
            self.grammars.text_grew(req.seq_id, req.text, len(new))
        # stop strings count from the token after the first min_tokens (vLLM's: those tokens
        # are output whatever they hold); one that begins in them and ends after them counts
        if p.stop and new and len(req.output_token_ids) > p.min_tokens:
            for s in p.stop:  # only where this token's text can have completed a stop string
                i = req.text.find(s, max(0, len(req.text) - len(new) - len(s) + 1))
                if i >= 0:
                    req.text = req.text[:i + (len(s) if p.include_stop_str_in_output else 0)]
                    req.stop_reason = s
                    return FinishReason.STOP
        reason = None
        if stop_tok:
            reason = FinishReason.STOP
            # as vLLM: the model's EOS has no stop reason; a stop_token_ids token, or another
            # EOS id of generation_config.json (which vLLM adds to stop_token_ids), is named
            req.stop_reason = None if not p.ignore_eos and tok == self.model_eos_id else tok
        elif p.structured_outputs is not None and self.grammars.done(req.seq_id):
            reason = FinishReason.STOP  # the text matches and nothing more can follow
        elif len(req.output_token_ids) >= req.max_tokens:
            reason = FinishReason.LENGTH
        if reason is not None and detok is not None:
            req.text += detok.flush()  # text held back waiting for the rest of a UTF-8 character
        return reason


    def _output(self, req: Request) -> RequestOutput:
        text = req.text if req.params.detokenize else ""
        hold = req.params.stop_holdback
        if hold and req.finish_reason is None:  # a stop string may be starting (vLLM's)
            text = text[:max(0, len(text) - hold)]
        first, prompt = 0, req.params.prompt_logprobs is not None
        if req.params.output_kind is RequestOutputKind.DELTA:  # what is new since the last
            first, prompt = req.sent_tokens, prompt and req.sent_tokens == 0
            req.sent_tokens = len(req.output_token_ids)
            text, req.sent_chars = text[req.sent_chars:], len(text)
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids,
                             req.output_token_ids[first:], text,
                             None if req.finish_reason is None else str(req.finish_reason),
                             req.logprobs[first:] if req.params.logprobs is not None else None,
                             req.top_logprobs[first:] if req.params.logprobs else None,
                             # complete once the request samples; the same lists each step
                             req.prompt_logprobs if prompt else None,
                             req.prompt_top_logprobs if prompt and req.params.prompt_logprobs
                             else None,
                             prompt_ranks=req.prompt_ranks if prompt else None,
                             ranks=req.ranks[first:] if req.params.logprobs is not None
                             else None,
                             num_cached_tokens=req.num_cached_tokens,
                             queue_time_s=req.queue_time_s,
                             stop_reason=req.stop_reason,
                             decode=self._decode_tokens if req.params.detokenize else None)

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation-config defaults (vLLM's
        ``get_default_sampling_params``); plain SamplingParams() where it sets none."""
        return SamplingParams(**self.default_sampling)

    # ------------------------------------------------------------------ statistics
    def stats(self) -> dict:
        s = dict(self.cache.stats())
        s.update(self.counters)
        s["engine.running"] = self.num_running
        s["engine.waiting"] = self.num_waiting
        t = self.counters["engine.step_time_s"]
        s["engine.tokens_per_s"] = self.counters["engine.generated_tokens"] / t if t else 0.0
        s["engine.weights_device_bytes"] = self.weights_bytes
        s["engine.activation_bytes"] = self.activation_bytes
        s["engine.vram_budget"] = self.vram_budget
        s["engine.experts_on_cpu_layers"] = sum(self.cpu_expert_layers)
        if self.kv_cache_memory is not None:
            s["engine.kv_cache_memory"] = self.kv_cache_memory
        if self.kv_split is not None:  # kv_cache_memory="auto": the split's predicted step
            s["engine.kv_split_predicted_step_s"] = self.kv_split["step_s"]
        if self.experts_moved_layers:
            s["engine.experts_moved_layers"] = self.experts_moved_layers
        held = self.model.host_experts()
        if held:  # how the CPU experts' weights are stored, and their host bytes
            s["engine.cpu_expert_format"] = held[0].weight_format
            s["engine.cpu_expert_bytes"] = sum(x.nbytes for x in held)
        dev = self.model.device_experts()
        if dev:  # how the routed experts on the compute device are stored, and their bytes
            s["engine.gpu_expert_format"] = dev[0].weight_format
            s["engine.gpu_expert_bytes"] = sum(x.nbytes for x in dev)
        up = self.expert_uploader
        if up is not None:  # prefill steps that ran the CPU experts on the GPU
            s["experts.uploads"] = up.uploads
            s["experts.upload_bytes"] = up.bytes
            s["experts.pinned_bytes"] = up.pinned_bytes
        link = self.expert_link
        if link is not None:  # layer calls whose experts the link shared (expert_link.py)
            s["experts.link_share"] = link.share
            s["experts.link_calls"] = link.calls
            if up is not None:
                s["experts.link_copied_bytes"] = up.link_bytes
        if self.grammars.rows_masked:  # structured outputs: rows masked, host time on masks
            s["structured.rows_masked"] = self.grammars.rows_masked
            s["structured.mask_s"] = self.grammars.mask_s
        if self.device.type == "cuda":
            s["engine.cuda_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        graphs = getattr(getattr(self, "runner", None), "graphs", None)
        if graphs is not None:
            s.update(graphs.stats())
        forms = getattr(getattr(self, "runner", None), "step_forms", None)
        if forms is not None:  # WRITESCOPE_PIPELINE=auto: per batch and context, the form chosen
            s["engine.step_forms"] = forms.stats()
        return s
