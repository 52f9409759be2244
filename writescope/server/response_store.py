"""The responses ``/v1/responses`` keeps (``store``, OpenAI's default true; none with
``writescope serve --no-responses-store``): in memory, the most recently used :data:`CAPACITY`
of them, each with its conversation (the input's messages after those of its
``previous_response_id``, and its answer as an assistant message), its input items (as
``GET /v1/responses/{id}/input_items`` lists them) and, for a streamed background response, its
events (server/response_events.py: ``GET /v1/responses/{id}?stream=true`` replays them), so
that ``GET /v1/responses/{id}`` returns it and a request naming it as ``previous_response_id``
continues that conversation, until ``DELETE /v1/responses/{id}`` (or until it is dropped as the
least recently used: its events go with it). Nothing outlives the server (vLLM's store is in
memory too)."""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .response_events import EventLog

CAPACITY = 1024


class ResponseStore:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict, list[dict], list[dict], EventLog | None]] = \
            OrderedDict()

    def put(self, rid: str, response: dict, conversation: list[dict],
            input_items: list[dict] = (), events: EventLog | None = None) -> None:
        self._items[rid] = (response, conversation, list(input_items), events)
        self._items.move_to_end(rid)
        while len(self._items) > self.capacity:  # the least recently used go first
            self._items.popitem(last=False)

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

    def delete(self, rid: str) -> bool:
        """Forget a response; False where none was kept."""
        return self._items.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._items)
