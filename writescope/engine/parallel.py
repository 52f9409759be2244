"""A request's several completions (vLLM's parallel sampling: ``SamplingParams.n`` and
``best_of``). The scheduler and runner see one completion a request; :class:`Fanout` gives a
request with ``n`` > 1 (or ``best_of`` > ``n``) one child request per completion, ids
``"{j}_{request_id}"`` as vLLM's, each with a seed of its own, and folds the children's step
outputs into the parent's :class:`RequestOutput`, its ``outputs`` indexed by completion:

- ``CUMULATIVE``: each step that advances a child, every completion so far (an empty one for a
  child not yet started);
- ``DELTA``: each step's new tokens of the children it advanced, an empty delta for the others
  (carrying their finish reason, so that ``finished`` is the parent's);
- ``FINAL_ONLY``, and whenever ``best_of`` > ``n`` (the completions are ranked by cumulative
  log-probability once all are done, vLLM 0.6's): one output, when the last child finishes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..core import CompletionOutput, RequestOutput, RequestOutputKind, SamplingParams


def ranked(params: SamplingParams) -> bool:
    """Whether more completions are sampled than returned (``best_of`` > ``n``)."""
    return params.best_of is not None and params.best_of > params.n


def fans_out(params: SamplingParams) -> bool:
    """Whether a request with these parameters runs as several child requests."""
    return params.n != 1 or ranked(params)


def one_completion(params: SamplingParams, j: int) -> SamplingParams:
    """The engine request for completion ``j`` of ``params.best_of`` (or ``n``): n = 1, a seed
    of its own; ranked completions (``best_of`` > ``n``) carry their log-probabilities and are
    returned whole (they are ranked at the end)."""
    if not fans_out(params):
        return params if params.best_of is None else dataclasses.replace(params, best_of=None)
    seed = None if params.seed is None else (params.seed + j) % (2 ** 63)
    extra = {}
    if ranked(params):
        extra["logprobs"] = 0 if params.logprobs is None else params.logprobs
        extra["output_kind"] = RequestOutputKind.FINAL_ONLY
    return dataclasses.replace(params, n=1, best_of=None, seed=seed, **extra)


def merge_completions(outs: list[RequestOutput], params: SamplingParams) -> RequestOutput:
    """One prompt's finished requests as one :class:`RequestOutput`: the first's fields, all
    of them in ``outputs``; with ``best_of`` > ``n``, the ``n`` of highest cumulative
    log-probability, highest first (vLLM 0.6's), their log-probabilities dropped again where
    none were asked for."""
    if ranked(params):
        outs = sorted(outs, key=lambda o: sum(o.logprobs), reverse=True)[:params.n]
        if params.logprobs is None:
            outs = [dataclasses.replace(o, logprobs=None, top_logprobs=None, ranks=None)
                    for o in outs]
    if len(outs) == 1:
        return outs[0]
    first = dataclasses.replace(outs[0])
    first.completions = [o.as_completion(i) for i, o in enumerate(outs)]
    return first


def child_id(request_id: str, j: int) -> str:
    return f"{j}_{request_id}"


@dataclass
class _Parent:
    request_id: str
    params: SamplingParams
    children: list[str]
    #: per completion index, its child's latest output (the last delta under DELTA)
    latest: dict[int, RequestOutput] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)


class Fanout:
    """The engine's parents of several completions and their children."""

    def __init__(self):
        self.parents: dict[str, _Parent] = {}
        #: child request id -> (parent id, completion index)
        self.child_of: dict[str, tuple[str, int]] = {}

    def split(self, request_id: str, params: SamplingParams) -> list[tuple[str, SamplingParams]]:
        """The child requests (id, parameters) of a request that :func:`fans_out`."""
        return [(child_id(request_id, j), one_completion(params, j))
                for j in range(params.best_of or params.n)]

    def add(self, request_id: str, params: SamplingParams, children: list[str]) -> None:
        self.parents[request_id] = _Parent(request_id, params, children)
        for j, cid in enumerate(children):
            self.child_of[cid] = (request_id, j)

    def parent_of(self, request_id: str) -> str | None:
        hit = self.child_of.get(request_id)
        return None if hit is None else hit[0]

    def drop(self, request_id: str) -> list[str]:
        """Forget a parent (aborted); its children's ids."""
        p = self.parents.pop(request_id)
        for cid in p.children:
            self.child_of.pop(cid, None)
        return p.children

    def fold(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        """A step's outputs with the children's replaced by their parents' (at the place of
        each parent's first child there)."""
        if not self.child_of:
            return outs
        res: list = []
        stepped: dict[str, dict[int, RequestOutput]] = {}
        for o in outs:
            hit = self.child_of.get(o.request_id)
            if hit is None:
                res.append(o)
                continue
            pid, j = hit
            if pid not in stepped:
                stepped[pid] = {}
                res.append(pid)  # the parent's place
            stepped[pid][j] = o
            p = self.parents[pid]
            p.latest[j] = o
            if o.finished:
                p.done.add(j)
        folded = {}
        for pid, now in stepped.items():
            p = self.parents[pid]
            out = self._parent_output(p, now)
            if out is not None:
                folded[pid] = out
            if len(p.done) == len(p.children):
                self.drop(pid)
        return [folded[x] if isinstance(x, str) else x for x in res
                if not isinstance(x, str) or x in folded]

    @staticmethod
    def _parent_output(p: _Parent, now: dict[int, RequestOutput]) -> RequestOutput | None:
        n = len(p.children)
        if ranked(p.params) or p.params.output_kind is RequestOutputKind.FINAL_ONLY:
            if len(p.done) < n:
                return None
            out = merge_completions([p.latest[j] for j in range(n)], p.params)
            return dataclasses.replace(out, request_id=p.request_id)
        delta = p.params.output_kind is RequestOutputKind.DELTA
        comps = []
        for j in range(n):
            if j in now:
                comps.append(now[j].as_completion(j))
            elif not delta and j in p.latest:
                comps.append(p.latest[j].as_completion(j))
            else:  # not started, or nothing new this step
                prev = p.latest.get(j)
                lps = [] if p.params.logprobs is not None else None
                comps.append(CompletionOutput(
                    j, "", [], None, lps, [] if p.params.logprobs else None,
                    prev.finish_reason if prev else None, prev.stop_reason if prev else None))
        # its own fields are the first completion's, as a single request's are
        base = now.get(0) if delta else p.latest.get(0)
        if base is None:  # the first has nothing (new) here: another's, emptied
            first, lps = comps[0], p.params.logprobs is not None
            base = dataclasses.replace(
                next(iter(now.values())), text="", token_ids=[], logprobs=[] if lps else None,
                top_logprobs=[] if p.params.logprobs else None, ranks=[] if lps else None,
                finish_reason=first.finish_reason, stop_reason=first.stop_reason)
        out = dataclasses.replace(base, request_id=p.request_id)
        out.completions = comps
        return out
