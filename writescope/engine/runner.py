"""Runs a scheduled step: inputs, the forward pass over the KV cache, logits, sampling."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..core import StepBatch
from ..hostmem import h2d
from ..kvcache.cache import InplaceKVCache
from ..kvcache.subbatches import expert_pipeline_mode, pipeline_mode
from ..layers import cpu_experts, cpu_experts_graph
from ..layers.cpu_experts import raise_pending_errors, take_routed_bytes
from ..layers.sampler import PendingTokens, Sampler
from ..models.base import CausalLM
from . import prompt_logprobs
from .stepform import StepForms


@dataclass
class Launched:
    """A step the runner has launched: its tokens (a step that completed), or the device tokens
    still being copied back (a deferred step, :attr:`pending`)."""

    batch: StepBatch
    tokens: list[int] | None = None
    logprobs: list[float] | None = None
    top_logprobs: list | None = None  # per sampled row None or {token id: log-probability}
    ranks: list[int] | None = None  # per sampled row its token's rank (None: no row asks)
    pending: PendingTokens | None = None
    #: {seq id: prompt log-probabilities of this step's rows} (requests that ask for them)
    prompt_logprobs: dict | None = None
    #: a deferred step with graphed CPU expert calls: the calls made by the end of its launch
    #: (:func:`cpu_experts.settle` closes them once its tokens are back)
    expert_mark: cpu_experts.ExpertsMark | None = None

    @property
    def deferred(self) -> bool:
        return self.pending is not None


def step_form_key(batch: StepBatch, halves: int = 0) -> str:
    """The chooser's key for a decode step (stepform.py): its sequences, and its total context
    to the power of two below it, so that short warm-up steps and a long run's steps are told
    apart and the choice is looked at anew each time the batch's context doubles. ``halves``:
    the key of the same batch at its context halved so many times (the chooser's related key,
    which a new key starts from)."""
    total = sum(s.start + s.num_new for s in batch.seqs)
    return f"{len(batch.seqs)} seqs, {1 << max(0, total.bit_length() - 1 - halves)}+ tokens"


class ModelRunner:
    def __init__(self, model: CausalLM, cache: InplaceKVCache, device: torch.device,
                 eager: bool = False):
        self.model = model
        self.cache = cache
        self.device = device
        self.sampler = Sampler()
        #: the last step's host timeline: ``forward_host_s`` (until the forward pass is enqueued;
        #: on CUDA the device may still be running it) and ``device_tail_s`` (then until the
        #: step's work is done). A tail near 0 means the step waits on the host (launch-bound).
        self.last_times: dict[str, float] = {}
        from . import graphs
        #: decode steps as piecewise CUDA graphs (None where the model cannot be split);
        #: ``eager``: never (the engine's enforce_eager)
        self.graphs = graphs.DecodeGraphs(model, device, cache, "off" if eager else None) \
            if graphs.supported(model) else None
        #: decode steps with CPU attention may run as two interleaved sub-batches (the cache
        #: decides per step; graphs.pipelined_pieces). The engine turns it off when routed
        #: experts run on the CPU: both sub-batches' experts would then queue on the same cores.
        mode = pipeline_mode()
        self.pipeline = mode != "off"
        #: with routed experts on the CPU, decode steps of two or more sequences may run as two
        #: sub-batches whose CPU expert calls overlap the other's GPU work
        #: (WRITESCOPE_PIPELINE_EXPERTS, :func:`expert_pipeline_mode`)
        self.expert_pipeline = expert_pipeline_mode()
        #: with WRITESCOPE_PIPELINE=auto (or WRITESCOPE_PIPELINE_EXPERTS=auto), which form each
        #: decode step runs in is chosen from measured step times, per batch size and context
        #: (stepform.py); None: always split when it can
        self.step_forms = StepForms() if "auto" in (mode, self.expert_pipeline) else None
        #: WRITESCOPE_PIPELINE=auto: steps with CPU attention split where measured faster
        self.pipeline_auto = mode == "auto"
        #: routed experts run on the CPU in some layer (the engine sets it): a step whose calls
        #: were all graphed may still be deferred, one with an eager call is not
        self.experts_on_cpu = False
        #: the link's share of those experts in small decode steps (layers/expert_link.py; the
        #: engine sets it), told per step whether the step streams KV
        self.expert_link = None
        #: ``form_prior(batch)``: whether the planner predicts a decode step of ``batch`` with
        #: its experts split faster than as one batch (the engine sets it): the incumbent of the
        #: step-form chooser's first choice for such steps (stepform.py)
        self.form_prior = None

    @property
    def pipelines(self) -> bool:
        """Whether decode steps may run as two interleaved sub-batches here."""
        g = self.graphs
        return bool(self.pipeline and g is not None and g.mode != "off"
                    and (g.mode == "pieces" or self.device.type == "cuda"))

    @torch.no_grad()  # not inference_mode: the CPU worker thread writes pinned buffers
    def run(self, batch: StepBatch) -> tuple[list[int], list[float], list | None]:
        """One step; returns the sampled token, its log-probability and the alternatives asked
        for (:meth:`collect`) for each sequence with ``sample=True``, in batch order."""
        return self.collect(self.launch(batch))

    @torch.no_grad()
    def launch(self, batch: StepBatch, input_ids: torch.Tensor | None = None,
               defer: bool = False) -> Launched:
        """Run one step up to its tokens. ``input_ids``: the step's tokens already on the device
        (an overlapped step's, taken from the previous step's :class:`PendingTokens`) instead of
        the requests' token lists.

        ``defer``: the caller can take this step's tokens later (:meth:`collect`). Where the
        step allows it -- a decode step with no seeded sampling whose cache step is deferrable
        (``cache.step_deferrable``), no CUDA graph waiting to be captured, no CPU expert call
        outside its graphs, and not a step the step-form chooser must time
        (:meth:`wants_timing`) -- it is then closed without waiting for the device, and its
        tokens come back through page-locked memory (:attr:`Launched.pending`). Otherwise the
        step completes here, as :meth:`run`'s does."""
        ids, pos, last_rows = [], [], []
        row = 0
        for s in batch.seqs:
            if input_ids is None:
                ids.extend(s.request.token_ids_at(s.start, s.num_new))
            pos.extend(range(s.start, s.start + s.num_new))
            row += s.num_new
            if s.sample:
                last_rows.append(row - 1)
        if input_ids is None:
            input_ids = h2d(ids, self.device, torch.long)
        elif input_ids.shape[0] != row:
            raise ValueError(f"{input_ids.shape[0]} input ids for a step of {row} tokens")
        positions = h2d(pos, self.device, torch.long)
        t0 = time.perf_counter()
        decode = all(s.num_new == 1 for s in batch.seqs)
        graphed = decode and self.graphs is not None and self.graphs.wants(row)
        policy = self.cache.policy
        split_experts = (graphed and self.experts_on_cpu and self.expert_pipeline != "off"
                         and len(batch.seqs) >= 2)
        if split_experts:
            split, auto = True, self.expert_pipeline == "auto"
        else:
            split, auto = graphed and self.pipeline, self.pipeline_auto
        forms = self.step_forms if split and auto else None
        if forms is not None:
            form_key = step_form_key(batch)
            prior = self.form_prior if split_experts else None
            split = forms.choose(form_key, None if prior is None else (lambda: prior(batch)),
                                 related=step_form_key(batch, halves=1))
        if split_experts or forms is not None:
            if hasattr(policy, "pipelined"):  # the planner models the form the step runs in
                policy.pipelined = split
        # a graphed step may attend through the cache's fixed buffers, when all its cached KV
        # is on the GPU (the cache decides; cache.step_resident) and the rest of the step is
        # graph-safe (graphs.resident_rows); a pipelined step's sub-batches each through their
        # own
        rows = self.graphs.resident_rows(row) if graphed and (split_experts or not split) \
            else None
        group_rows = self.graphs.resident_rows if split_experts else None
        self.cache.begin_step([(s.request.seq_id, s.start, s.num_new) for s in batch.seqs],
                              pipeline=split, resident_rows=rows,
                              split_experts=split_experts, group_rows=group_rows,
                              split_spilled=self.expert_pipeline == "all")
        if split_experts and split and hasattr(policy, "pipelined"):
            policy.pipelined = self.cache.step_groups is not None  # the cache may keep it whole
        if forms is not None and not self.cache.step_splittable:
            forms = None  # nothing to overlap: both forms are the same step, nothing to learn
            split = False
            if hasattr(policy, "pipelined"):
                policy.pipelined = False
        sampled = [s for s in batch.seqs if s.sample]
        link = self.expert_link
        eager0 = cpu_experts.eager_calls()
        linked0 = link.calls if link is not None else 0
        # a step in flight with graphed CPU expert calls: this step's own figures start after
        # them (their kernel seconds and routing are not this step's)
        before = cpu_experts.mark() if self.experts_on_cpu and cpu_experts_graph.overlapping() \
            else None
        try:
            if link is not None:
                link.begin_step(decode, self.cache.step_streams)
            try:
                if graphed:
                    hidden = self.graphs.run(input_ids, positions, self.cache,
                                             groups=self.cache.step_groups,
                                             resident=self.cache.step_resident,
                                             split_experts=split_experts)
                else:
                    hidden = self.model(input_ids, positions, self.cache)
            finally:
                if link is not None:
                    link.end_step()
            logits = None
            prompt_lps = None
            if any(s.request.params.prompt_logprobs is not None and s.request.is_prefilling
                   for s in batch.seqs):
                prompt_lps = prompt_logprobs.compute(self.model, hidden, batch)
            if sampled:
                hidden = hidden[h2d(last_rows, self.device, torch.long)]
                logits = self.model.compute_logits(hidden)
            t1 = time.perf_counter()
            if (defer and decode and sampled and len(sampled) == len(batch.seqs)
                    and self.cache.step_deferrable
                    and (not self.experts_on_cpu or (cpu_experts.eager_calls() == eager0 and
                                                     (link is None or link.calls == linked0)))
                    and (forms is None or not forms.needs_timing(form_key))
                    and (self.graphs is None or not self.graphs.has_pending)
                    and self.sampler.can_defer([s.request.params for s in sampled])):
                pending = self.sampler.sample_pending(logits, [s.request.params for s in sampled],
                                                      [s.request for s in sampled])
                self.cache.end_step({"host_s": t1 - t0}, wait=False)
                if forms is not None:
                    forms.observe(form_key, split, None)
                self.last_times = {"forward_host_s": t1 - t0, "device_tail_s": 0.0,
                                   "cpu_expert_s": None}
                mark = None
                if self.experts_on_cpu:  # its graphed calls: closed when its tokens are back
                    mark = cpu_experts.mark()
                    cpu_experts_graph.overlapping(+1)
                return Launched(batch, pending=pending, prompt_logprobs=prompt_lps,
                                expert_mark=mark)
            # the CPU expert calls the device waits for (their kernel seconds go to the planner
            # with the step's timing), then the step's end, which waits for the device
            if before is not None:
                cpu_experts.settle(before)
            expert_s = raise_pending_errors()
            extra = {"cpu_expert_s": expert_s, "cpu_expert_bytes": take_routed_bytes(),
                     "host_s": t1 - t0,  # the planner tells host-bound steps apart by it
                     # a step size's first, eager run (its graphs are captured after it; its
                     # kernels may have compiled): not a steady step's time
                     "new_shape": self.graphs is not None and self.graphs.has_pending}
            timing = self.cache.end_step({k: v for k, v in extra.items() if v is not None})
            if self.experts_on_cpu:  # the device is done with every step launched so far
                cpu_experts_graph.settled()
            if forms is not None:
                forms.observe(form_key, split, timing["step_s"])
            self.last_times = {"forward_host_s": t1 - t0,
                               "device_tail_s": time.perf_counter() - t1,
                               "cpu_expert_s": expert_s,
                               "cpu_expert_bytes": extra["cpu_expert_bytes"]}
            if self.graphs is not None:
                self.graphs.capture_pending()  # a new decode size ran eagerly: capture it now
            if not sampled:
                return Launched(batch, tokens=[], logprobs=[], prompt_logprobs=prompt_lps)
        except BaseException:
            self.cache.abort_step()
            if self.graphs is not None:
                self.graphs.drop_pending()
            try:
                raise_pending_errors()
            except Exception:  # noqa: BLE001 - the step's own error is the one to report
                pass
            take_routed_bytes()  # this step's routing does not go into the next step's figure
            raise
        tokens, logprobs, top, ranks = self.sampler.sample(
            logits, [s.request.params for s in sampled], [s.request.seq_id for s in sampled],
            [s.request for s in sampled])
        return Launched(batch, tokens=tokens, logprobs=logprobs, top_logprobs=top, ranks=ranks,
                        prompt_logprobs=prompt_lps)

    def collect(self, launched: Launched
                ) -> tuple[list[int], list[float], list | None, list[int] | None]:
        """A launched step's tokens, their log-probabilities, per sampled row None or the most
        likely tokens {id: log-probability} its request asked for (None: no row asked) and the
        tokens' ranks (None: no row asks for log-probabilities). Waits for a deferred step's
        copies; its ``device_tail_s`` is then the wait."""
        if launched.pending is None:
            return launched.tokens, launched.logprobs, launched.top_logprobs, launched.ranks
        t = time.perf_counter()
        mark, launched.expert_mark = launched.expert_mark, None
        try:
            out = launched.pending.result()
            if mark is not None:  # its CPU expert calls are done: a failed one fails the step
                cpu_experts.settle(mark)
        finally:
            if mark is not None:
                cpu_experts_graph.overlapping(-1)
        self.last_times["device_tail_s"] = time.perf_counter() - t
        return out

    def wants_timing(self, batch: StepBatch) -> bool:
        """Whether a decode step of ``batch`` is one the step-form chooser must time (see
        :meth:`StepForms.needs_timing`): the engine then launches it only once the step in
        flight is done, so that its time is its own."""
        forms = self.step_forms
        return (forms is not None and self.experts_on_cpu and self.expert_pipeline == "auto"
                and len(batch.seqs) >= 2 and forms.needs_timing(step_form_key(batch)))
