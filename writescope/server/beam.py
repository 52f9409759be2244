"""The server's beam search (vLLM's ``use_beam_search``): one HTTP request's searches, one per
prompt (engine/beam.py), whose ``n`` best hypotheses are the prompt's ``n`` choices. Each step
runs every live beam as a one-token request through the engine loop; the choices get their
tokens when the searches end, so a stream sends each choice whole, in one chunk."""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING

from ..core import InvalidRequestError, Logprob
from ..engine.beam import BeamSearch, BeamSearchParams
from . import protocol as P
from .engine_loop import Delta
from .generation import Choice, Generation

if TYPE_CHECKING:
    from .api import OpenAIServer


def step_dict(d: Delta) -> dict[int, Logprob]:
    """A finished one-token request's ``{token id: Logprob}``: its token, then the
    alternatives, ranked."""
    tok = d.new_token_ids[0]
    out = {tok: Logprob(d.new_logprobs[0])}
    for r, (t, lp) in enumerate(sorted(d.new_top_logprobs[0].items(), key=lambda kv: -kv[1]), 1):
        if t == tok:
            out[t].rank = r
        else:
            out[t] = Logprob(lp, r)
    return out


class BeamGeneration(Generation):
    """A :class:`Generation` whose choices come from beam searches (``searches[i]`` gives
    choices ``i * n`` to ``i * n + n - 1``); ``logprobs``: the alternatives each choice reports
    per token (at most the ``2 * n`` a step asks for)."""

    def __init__(self, server: "OpenAIServer", choices: list[Choice], params: BeamSearchParams,
                 searches: list[BeamSearch], arrival: float, logprobs: int | None,
                 cache_salt: str | None = None, priority: int = 0) -> None:
        super().__init__(server, choices, [], arrival, n=params.beam_width, cache_salt=cache_salt,
                         priority=priority)
        self.beam = params
        self.searches = searches
        self.k = logprobs
        self._task: asyncio.Task | None = None
        self._step_ids = itertools.count()
        self._running: set[str] = set()

    async def submit(self) -> None:
        self._task = asyncio.ensure_future(self._search())
        self._open = True
        self.server.active += 1

    async def _search(self) -> None:
        loop, sp = self.server.loop, self.beam.step_params()
        base = self.choices[0].request_id.rsplit("-", 1)[0]
        first = True
        while True:
            live = [s for s in self.searches if not s.done]
            if not live:
                break
            rids = [f"{base}-beam{next(self._step_ids)}" for s in live for _ in s.live]
            prompts = [p for s in live for p in s.prompts()]  # each carries the salt
            self._running.update(rids)
            # each step's requests arrive when sent (vLLM's: their latencies are their own, not
            # the search's so far)
            try:  # admitted all or none
                await loop.add_all([(rid, p, sp, rid) for rid, p in zip(rids, prompts)],
                                   self.queue, time.monotonic(), priority=self.priority)
            except InvalidRequestError as e:
                raise P.invalid_request(e) from None
            done: dict[str, Delta] = {}
            while len(done) < len(rids):
                tag, item = await self.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finish_reason is not None:
                    if str(item.finish_reason) == "abort":
                        raise P.APIError("the request was cancelled", status=503,
                                         type="server_error", code="unavailable")
                    done[tag] = item
                    self._running.discard(tag)
            if first:  # one beam a prompt: its prompt tokens the prefix cache held (usage)
                for s, rid in zip(live, rids):
                    self.choices[self.searches.index(s) * self.n].cached_tokens = \
                        done[rid].cached_tokens
                first = False
            at = 0
            for s in live:
                k = len(s.live)
                s.advance([step_dict(done[r]) for r in rids[at:at + k]])
                at += k
        self._fill()

    def _fill(self) -> None:
        """The hypotheses into the choices (fewer than ``n`` where a search ended with
        fewer: the rest end with no tokens)."""
        tok = self.server.tokenizer
        decode = None if tok is None else (
            lambda ids, skip: tok.decode(ids, skip_special_tokens=skip))
        n = self.beam.beam_width
        for i, s in enumerate(self.searches):
            seqs = s.result(decode).sequences
            for j in range(n):
                c = self.choices[i * n + j]
                if j < len(seqs):
                    h = seqs[j]
                    c.token_ids = list(h.token_ids)
                    c.text = h.text or ""
                    c.logprobs = [d[t].logprob for d, t in zip(h.logprobs, h.token_ids)]
                    if self.k:
                        c.top_logprobs = [
                            {t: lp.logprob for t, lp in sorted(
                                d.items(), key=lambda kv: -kv[1].logprob)[:self.k]}
                            for d in h.logprobs]
                    c.finish_reason, c.stop_reason = h.finish_reason, h.stop_reason
                else:
                    c.finish_reason = "length"

    async def next_updates(self) -> set[int]:
        assert self._task is not None, "submit() first"
        await asyncio.shield(self._task)
        return {c.index for c in self.choices}

    def abort_unfinished(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        for rid in self._running:
            self.server.loop.abort(rid)
        self._running.clear()
        for c in self.choices:
            c.finish_reason = c.finish_reason or "abort"
