"""The events of a streamed background response (``background`` and ``stream`` true, OpenAI's):
each server-sent event as its generation wrote it, the event of ``sequence_number`` k at index
k, kept with the response in the store (server/response_store.py) and dropped with it; any
number of streams follow it (server/response_background.py): the ``POST /v1/responses`` that
created it and each ``GET /v1/responses/{id}?stream=true&starting_after=N``, which replay what
was written after N and then what comes, until the response ends. A reader that leaves ends
only its own stream."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator


class EventLog:
    def __init__(self) -> None:
        self.events: list[str] = []  # the SSE text of each event, by sequence number
        self.closed = False  # no event comes after the last
        self.nbytes = 0  # the events' characters (the store keeps a budget of them)
        self._changed = asyncio.Event()

    def append(self, event: str) -> None:
        self.events.append(event)
        self.nbytes += len(event)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        # the readers waiting wake; the next wait is on a fresh event
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, after: int | None = None) -> AsyncIterator[str]:
        """The events whose sequence number is above ``after`` (None: all), those written and
        those to come, until the log closes."""
        k = 0 if after is None else max(after + 1, 0)
        while True:
            while k < len(self.events):
                yield self.events[k]
                k += 1
            if self.closed:
                return
            await self._changed.wait()
