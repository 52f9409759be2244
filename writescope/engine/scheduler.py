"""Who runs this step: decodes first, then prefill chunks, within a token budget.

Pure bookkeeping over :class:`~writescope.core.Request` records. The scheduler asks the cache
whether a request's blocks can be reserved (admission control; with prefix caching, a
request starts from the cached blocks of its prompt's prefix and prefills the rest) and tells it
which waiting requests would be admitted next (the placement policy plans for the batch they make); it never
touches tensors. Continuous batching: requests join and leave the running set between steps, and
a long prompt is prefilled in chunks so the running requests keep decoding meanwhile.

Admission order (vLLM's ``scheduling_policy``): ``waiting`` is always kept in the order requests
are admitted, so that everything reading its head (:meth:`admit_next`, :meth:`queue_head`, the
placement policy's ``expect_waiting``, prefix caching's ``prefix_pending``) needs no policy of its
own. Under ``"fcfs"`` (the default) that is arrival order. Under ``"priority"`` a request is
inserted after every waiting request of a lower or equal ``priority`` value (lower value =
served earlier; ties by arrival). Either way the head blocks those behind it: a head that does
not fit the free KV blocks (or waits on a prompt prefix a running request is prefilling) keeps
every request behind it waiting, whatever their priority -- as vLLM's priority policy, a
lower-priority request never jumps ahead of a higher-priority one that does not fit.

Preemption (``"priority"`` only, vLLM's): each request's KV is reserved whole at admission, so a
running request never runs out of blocks; what preempts is a waiting head that does not fit
(too few free blocks for its reservation, or the batch at ``max_num_seqs``). Then the running
request of the lowest priority (the largest value; ties: the latest arrival) that is of strictly
lower priority than the head is preempted (:meth:`_preempt`): its blocks are released (with
prefix caching its full blocks stay cached, named by its prompt and outputs, and its partial
block is kept as a tail), and it waits again in its priority place. Repeated while the head
does not fit and such a request runs (as vLLM V0's ``_schedule_priority_preemption``: greedily,
even where the victims' blocks turn out too few). A preempted request is recomputed: its next
admission prefills its prompt and the outputs it had (``Request.num_prefill_tokens``; the
prefix cache usually holds most of them) and samples its next token from the last of them, so
it continues where it stopped -- its outputs, log-probabilities, detokenizer, grammar and seeded
generator (all keyed by the request, not by its KV) are kept as they were. It happens only in
:meth:`schedule`, between steps: the engine schedules only with no step in flight
(:meth:`followup` ends an overlapped run while a request waits). Under ``"fcfs"`` nothing is
preempted: a head that does not fit waits for a running request to finish.
"""
from __future__ import annotations

import time
from collections import deque

from ..core import Request, RequestStatus, ScheduledSeq, StepBatch


#: vLLM's ``scheduling_policy`` values
SCHEDULING_POLICIES = ("fcfs", "priority")


class Scheduler:
    def __init__(self, cache, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs"):
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {policy!r}")
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        #: the waiting requests in admission order (the module's docstring)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: the requests the last :meth:`schedule` preempted (the engine counts them)
        self.preempted: list[Request] = []

    def add(self, req: Request) -> None:
        """Queue ``req`` (added in arrival order): last under "fcfs"; under "priority" after
        every waiting request whose ``priority`` is lower or equal."""
        if self.policy == "fcfs":
            self.waiting.append(req)
            return
        i = len(self.waiting)
        while i and self.waiting[i - 1].priority > req.priority:
            i -= 1
        self.waiting.insert(i, req)

    def remove(self, req: Request) -> None:
        """Drop a request wherever it is and release its KV (finished or aborted)."""
        if req in self.running:
            self.running.remove(req)
            self.cache.free_sequence(req.seq_id, req.all_token_ids)
        elif req in self.waiting:
            self.waiting.remove(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepBatch:
        budget = self.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []
        # 0. the head's room first: running requests of lower priority would otherwise take
        # the step's budget (a long prefill's chunk) before it is looked at
        self.preempted = []
        self._make_room(seqs)
        # 1. every running sequence that is decoding gets one token
        for req in self.running:
            if not req.is_prefilling and budget > 0:
                seqs.append(ScheduledSeq(req, req.num_computed, 1, True))
                budget -= 1
        # 2. running prefills continue, chunked to the remaining budget
        for req in self.running:
            if req.is_prefilling and budget > 0:
                budget -= self._prefill_chunk(req, budget, seqs)
        # 3. admit waiting requests in queue order (FCFS or priority) while they fit the cache and
        # the batch; under "priority" a head that does not fit preempts lower priorities
        while self.waiting and budget > 0:
            req = self.admit_next()
            if req is None:
                n, given = self._make_room(seqs)
                if not n:
                    break
                budget += given
                continue
            budget -= self._prefill_chunk(req, budget, seqs)
        self.cache.expect_waiting(self.queue_head())
        return StepBatch(seqs)

    def followup(self, batch: StepBatch) -> tuple[StepBatch, list[int]] | None:
        """The decode step that follows ``batch`` (a decode step whose tokens are not known on
        the host yet), or None when the next step should be scheduled afresh: a request is
        waiting, or a running request is not in ``batch``. Each of ``batch``'s requests gets
        its next token unless the token still to come is its last (``max_tokens``). Returns the
        step and, per sequence, its row in ``batch`` (where its input token comes from).
        Requests that finish on the token still to come (EOS, a stop string) are in it: the
        engine drops what they produce. Requests of ``batch`` that have finished since (on an
        earlier token, or aborted) are left out."""
        if self.waiting or any(s.num_new != 1 or not s.sample for s in batch.seqs):
            return None
        going = [(i, s) for i, s in enumerate(batch.seqs) if not s.request.finished]
        if len(going) != len(self.running) or \
                {id(s.request) for _, s in going} != {id(r) for r in self.running}:
            return None
        seqs, rows = [], []
        for i, s in going:
            req = s.request
            if len(req.output_token_ids) + 1 >= req.max_tokens:
                continue
            seqs.append(ScheduledSeq(req, s.start + 1, 1, True))
            rows.append(i)
        if not seqs or len(seqs) > self.max_num_batched_tokens:
            return None
        self.cache.expect_waiting({})
        return StepBatch(seqs), rows

    def queue_head(self) -> dict[int, int]:
        """The waiting requests that would be admitted next if nothing left (in order, while
        their reservations fit the free blocks and the batch has room): ``seq_id -> prompt
        tokens``. The placement of a prompt prefilled now aims at the batch these join."""
        room = self.max_num_seqs - len(self.running)
        slots = self.cache.free_slots()
        free = self.cache.free_sealed() - self.cache.reserved
        head: dict[int, int] = {}
        for req in self.waiting:
            if len(head) >= min(room, slots):
                break
            need = self.cache.blocks_for(req.kv_tokens)
            prefix = self._cached_prefix(req)
            if prefix is not None:  # as can_admit counts it
                need += prefix.unused - len(prefix)
            if need > free:
                break
            head[req.seq_id] = req.num_prefill_tokens
            free -= need
        return head

    def admit_next(self) -> Request | None:
        """Move the first waiting request (the queue's head: the next in arrival or priority
        order) into the running set if it fits the cache and the batch (its blocks reserved);
        None when it does not (it keeps waiting, and so do those behind it)."""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return None
        req = self.waiting[0]
        n_prompt = req.num_prefill_tokens
        total = req.kv_tokens
        prefix = self._cached_prefix(req)
        if self._waits_on_prefix(req, prefix) or not self.cache.can_admit(total, prefix):
            return None
        self.waiting.popleft()
        cached = self.cache.add_sequence(req.seq_id, total, prompt_tokens=n_prompt, prefix=prefix,
                                         prompt_names=req.block_names,
                                         cache_salt=req.cache_salt)
        req.num_computed = cached
        if not req.num_preemptions:  # (vLLM's: the first admission's)
            req.num_cached_tokens = cached
        req.status = RequestStatus.RUNNING
        if req.queue_time_s is None:
            req.queue_time_s = time.monotonic() - req.arrival
        self.running.append(req)
        return req

    def _waits_on_prefix(self, req: Request, prefix) -> bool:
        """Whether a running request is prefilling more of ``req``'s prompt (admitted a step
        or so later, it starts from those blocks)."""
        return prefix is not None and self.cache.prefix_pending(req.block_names, prefix,
                                                                req.num_prefill_tokens)

    def _make_room(self, seqs: list[ScheduledSeq]) -> tuple[int, int]:
        """Under ``"priority"``, while the queue's head does not fit (no batch slot, or too
        few free KV blocks for its reservation), preempt the running request of the lowest
        priority (largest value; ties: the latest arrival) of those of strictly lower
        priority than the head. Not for a head that waits on a prompt prefix a running
        request is prefilling (room would not admit it). Returns the requests preempted and
        the step's tokens they had in ``seqs`` (given back to its budget)."""
        n = given = 0
        while self.policy == "priority" and self.waiting:
            head = self.waiting[0]
            lower = [r for r in self.running if r.priority > head.priority]
            if not lower:
                break
            prefix = self._cached_prefix(head)
            if self._waits_on_prefix(head, prefix) or (
                    len(self.running) < self.max_num_seqs
                    and self.cache.can_admit(head.kv_tokens, prefix)):
                break
            given += self._preempt(max(lower, key=lambda r: (r.priority, r.arrival)), seqs)
            n += 1
        return n, given

    def _preempt(self, req: Request, seqs: list[ScheduledSeq]) -> int:
        """Take running ``req`` out of the batch (the step being built, ``seqs``, included) and
        release its KV (its full blocks stay in the prefix cache, named by its prompt and
        outputs); it waits again, in its priority place, to be recomputed. Returns the
        step's tokens it had (given back to the step's budget)."""
        given = 0
        for i, s in enumerate(seqs):
            if s.request is req:
                given = s.num_new
                del seqs[i]
                break
        self.running.remove(req)
        self.cache.free_sequence(req.seq_id, req.all_token_ids)
        # the recompute prefills prompt + outputs (the last output's KV was never written: it
        # is fed now, and its logits sample the next token)
        req.recompute_outputs = len(req.output_token_ids)
        req.block_names = self.cache.extend_prefix_names(req.block_names, req.all_token_ids,
                                                         req.cache_salt)
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        i = len(self.waiting)  # before later arrivals of its priority (it came before them)
        while i and (self.waiting[i - 1].priority, self.waiting[i - 1].arrival) > \
                (req.priority, req.arrival):
            i -= 1
        self.waiting.insert(i, req)
        self.preempted.append(req)
        return given

    def _cached_prefix(self, req: Request):
        """The cached blocks a waiting request would start from now (``PrefixMatch``), or None
        (prefix caching off, nothing cached, or a request that asks for its prompt's
        log-probabilities and has not had them all: it computes every prompt token)."""
        ids = req.all_token_ids if req.recompute_outputs else req.prompt_token_ids
        if req.block_names is None:  # named once (prefix caching; None without it)
            req.block_names = self.cache.prefix_names(ids, req.cache_salt)
        if req.params.prompt_logprobs is not None and \
                len(req.prompt_logprobs) < len(req.prompt_token_ids):
            return None
        return self.cache.match_prefix(req.block_names, req.num_prefill_tokens, ids,
                                       req.cache_salt)

    @staticmethod
    def _prefill_chunk(req: Request, budget: int, seqs: list[ScheduledSeq]) -> int:
        left = req.num_prefill_tokens - req.num_computed
        n = min(left, budget)
        seqs.append(ScheduledSeq(req, req.num_computed, n, n == left))
        return n
