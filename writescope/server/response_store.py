"""The responses ``/v1/responses`` keeps (``store``, OpenAI's default true; none with
``writescope serve --no-responses-store``): in memory, the most recently used :data:`CAPACITY`
of them, each with its conversation (the input's messages after those of its
``previous_response_id``, and its answer as an assistant message), its input items (as
``GET /v1/responses/{id}/input_items`` lists them) and, for a streamed background response, its
events (server/response_events.py: ``GET /v1/responses/{id}?stream=true`` replays them), so
that ``GET /v1/responses/{id}`` returns it and a request naming it as ``previous_response_id``
continues that conversation, until ``DELETE /v1/responses/{id}`` (or until it is dropped as the
least recently used finished one: its events go with it; a running background response is
never dropped). The events of finished responses are kept up to
:data:`EVENT_BYTES` in all (a streamed response's events are some 40 times its text: a delta
event a token, and its whole body twice); past it the least recently used finished responses
keep no events (:meth:`ResponseStore.events_dropped`), while the responses themselves stay.
Nothing outlives the server (vLLM's store is in memory too)."""
from __future__ import annotations

from collections import OrderedDict
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .response_events import EventLog

CAPACITY = 1024
#: a background response's statuses while it runs
RUNNING = ("queued", "in_progress")
#: the characters of finished responses' events kept in all (see the module docstring)
EVENT_BYTES = 64 << 20


class ResponseStore:
    def __init__(self, capacity: int = CAPACITY, event_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.event_bytes = EVENT_BYTES if event_bytes is None else event_bytes
        self._items: OrderedDict[str, tuple[dict, list[dict], list[dict], EventLog | None]] = \
            OrderedDict()
        self._dropped: set[str] = set()  # stored responses whose events were let go

    def put(self, rid: str, response: dict, conversation: list[dict],
            input_items: list[dict] = (), events: EventLog | None = None) -> None:
        self._items[rid] = (response, conversation, list(input_items), events)
        self._items.move_to_end(rid)
        self._dropped.discard(rid)
        if len(self._items) > self.capacity:
            self._evict()
        self._trim_events()

    def _evict(self) -> None:
        """Let the least recently used finished responses go while more than :attr:`capacity`
        are kept. A running background response (stored queued or in progress) is never let
        go: its GET and cancel would be a 404 while it runs on, out of reach, until it ends
        and is stored again (a streamed one's run does not touch it between its first tokens
        and its end, so it ages like a finished one)."""
        finished = (rid for rid, item in self._items.items()
                    if item[0].get("status") not in RUNNING)
        for rid in list(islice(finished, len(self._items) - self.capacity)):
            del self._items[rid]
            self._dropped.discard(rid)

    def _trim_events(self) -> None:
        """Let the least recently used finished responses' events go while those kept
        exceed :attr:`event_bytes` (a running response's are never let go)."""
        logs = [(rid, item[3]) for rid, item in self._items.items() if item[3] is not None]
        total = sum(log.nbytes for _, log in logs)
        for rid, log in logs:  # least recently used first
            if total <= self.event_bytes:
                break
            if log.closed:
                self._items[rid] = self._items[rid][:3] + (None,)
                self._dropped.add(rid)
                total -= log.nbytes

    def get(self, rid: str) -> tuple[dict, list[dict]] | None:
        """The stored response and its conversation (None: never stored, or dropped)."""
        item = self._items.get(rid)
        if item is None:
            return None
        self._items.move_to_end(rid)
        return item[0], item[1]

    def input_items(self, rid: str) -> list[dict] | None:
        """The stored response's input items (None: never stored, or dropped)."""
        item = self._items.get(rid)
        return None if item is None else item[2]

    def events(self, rid: str) -> EventLog | None:
        """The stored response's events (None: not a streamed background response, never
        stored, or dropped)."""
        item = self._items.get(rid)
        return None if item is None else item[3]

    def events_dropped(self, rid: str) -> bool:
        """Whether the stored response had events that were let go (:attr:`event_bytes`)."""
        return rid in self._dropped

    def delete(self, rid: str) -> bool:
        """Forget a response; False where none was kept."""
        self._dropped.discard(rid)
        return self._items.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._items)
