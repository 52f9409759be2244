"""One HTTP request's generations: its n choices per prompt (:class:`Choice`, what each has
received and sent), submitted together to the engine loop and followed to their end
(:class:`Generation`: admission all or nothing, the deltas applied as they come, the aborts of
what still runs when the response is over, the usage counts)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core import InvalidRequestError, SamplingParams
from . import protocol as P
from .engine_loop import Delta

if TYPE_CHECKING:
    from .api import OpenAIServer


@dataclass
class Choice:
    index: int
    request_id: str
    prompt_ids: list[int]
    prompt_text: str | None
    max_tokens: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # echo with logprobs, prompt_logprobs: once prefilled
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[dict[int, float] | None] | None = None
    prompt_ranks: list[int | None] | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    #: echo without generation (completions, ``max_tokens`` 0): the engine's one token (its
    #: prefill computes the prompt's log-probabilities) is dropped, and the choice ends
    #: "length" with none
    echo_only: bool = False
    # streaming cursors
    sent_text: int = 0
    sent_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Generation:
    def __init__(self, server: "OpenAIServer", choices: list[Choice],
                 params: list[SamplingParams], arrival: float, n: int = 1,
                 cache_salt: str | None = None, priority: int = 0) -> None:
        self.server = server
        self.cache_salt = cache_salt  # vLLM's: the prefix cache shared only within a salt
        self.priority = priority  # vLLM's: admission order under --scheduling-policy priority
        self.n = n  # choices per prompt: prompt tokens count once per prompt, as OpenAI does
        self.choices = choices
        self.params = params
        self.arrival = arrival
        self.queue: asyncio.Queue = asyncio.Queue()
        self._submitted: list[str] = []
        self._open = False

    async def submit(self) -> None:
        loop = self.server.loop
        await self._compile_constraints()
        # admitted all or none (a refused one takes its siblings back before any step)
        fut = loop.add_all([(c.request_id, c.prompt_ids, p, c.index)
                            for c, p in zip(self.choices, self.params)],
                           self.queue, self.arrival, cache_salt=self.cache_salt,
                           priority=self.priority)
        self._submitted.extend(c.request_id for c in self.choices)
        try:
            await fut
        except asyncio.CancelledError:  # cancelled while waiting for admission: take it back
            self.abort_unfinished()
            raise
        except BaseException as e:  # noqa: BLE001 -- refused: none of them was admitted
            self._submitted.clear()
            if isinstance(e, InvalidRequestError):
                raise P.invalid_request(e) from None
            if isinstance(e, P.APIError):
                raise e
            raise P.APIError(f"could not start the request: {type(e).__name__}: {e}",
                             status=500, type="server_error") from None
        self._open = True
        self.server.active += 1

    async def _compile_constraints(self) -> None:
        """Compile the request's structured-output constraint on a worker thread (the first one
        also converts the tokenizer, about a second for a large vocabulary), so that the
        engine's thread finds it compiled and its steps do not wait for it."""
        grammars = getattr(self.server.engine, "grammars", None)
        so = next((p.structured_outputs for p in self.params if p.structured_outputs), None)
        if grammars is None or so is None:
            return
        try:
            await asyncio.to_thread(grammars.prepare, so)
        except InvalidRequestError as e:
            raise P.invalid_request(e) from None

    def close(self) -> None:
        """The response is over (sent, failed or abandoned): abort what still runs."""
        self.abort_unfinished()
        if self._open:
            self._open = False
            self.server.active -= 1

    def cancel(self) -> None:
        """Abort what still runs and wake whoever waits for its next update (the engine sends
        nothing for an abort): each unfinished choice ends "abort" as if the engine had said
        so, and what follows the generation to its end (a stream's events) writes that end."""
        for c in self.choices:
            if not c.finished:
                self.queue.put_nowait((c.index, Delta([], None, None, None, "abort")))
        self.abort_unfinished()

    def abort_unfinished(self) -> None:
        for c in self.choices:
            if not c.finished and c.request_id in self._submitted:
                self.server.loop.abort(c.request_id)
                c.finish_reason = c.finish_reason or "abort"

    def unfinished(self) -> bool:
        return any(not c.finished for c in self.choices)

    async def next_updates(self) -> set[int]:
        """Wait for at least one delta, apply every queued one; the indices that changed."""
        items = [await self.queue.get()]
        while True:
            try:
                items.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        changed: set[int] = set()
        for tag, item in items:
            c = self.choices[tag]
            if isinstance(item, BaseException):
                for other in self.choices:
                    other.finish_reason = other.finish_reason or "abort"
                raise item
            if c.echo_only:
                if item.prompt is not None:
                    c.prompt_logprobs, c.prompt_top_logprobs, c.prompt_ranks = item.prompt
                if item.cached_tokens:
                    c.cached_tokens = item.cached_tokens
                if item.finish_reason is not None:
                    reason = str(item.finish_reason)
                    c.finish_reason = reason if reason == "abort" else "length"
                changed.add(tag)
                continue
            c.token_ids.extend(item.new_token_ids)
            if item.new_logprobs:
                c.logprobs.extend(item.new_logprobs)
            if item.new_top_logprobs:
                c.top_logprobs.extend(item.new_top_logprobs)
            if item.prompt is not None:
                c.prompt_logprobs, c.prompt_top_logprobs, c.prompt_ranks = item.prompt
            if item.text is not None:
                c.text = item.text
            if item.cached_tokens:
                c.cached_tokens = item.cached_tokens
            if item.finish_reason is not None:
                c.finish_reason = str(item.finish_reason)
                c.stop_reason = item.stop_reason
            changed.add(tag)
        return changed

    async def run_to_end(self) -> None:
        try:
            while self.unfinished():
                await self.next_updates()
        finally:
            self.abort_unfinished()  # no-op when all finished; frees KV when cancelled

    def usage(self) -> P.UsageInfo:
        prompt = sum(len(c.prompt_ids) for c in self.choices[::self.n])
        completion = sum(len(c.token_ids) for c in self.choices)
        cached = sum(c.cached_tokens for c in self.choices[::self.n])
        return P.UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion,
                           prompt_tokens_details=P.PromptTokensDetails(cached_tokens=cached))
