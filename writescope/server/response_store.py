"""The responses ``/v1/responses`` keeps (``store``, OpenAI's default true): in memory, the
most recently used :data:`CAPACITY` of them, each with its conversation (the input's messages
after those of its ``previous_response_id``, and its answer as an assistant message), so that
``GET /v1/responses/{id}`` returns it and a request naming it as ``previous_response_id``
continues that conversation. Nothing outlives the server (vLLM's store is in memory too)."""
from __future__ import annotations

from collections import OrderedDict

CAPACITY = 1024


class ResponseStore:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, rid: str, response: dict, conversation: list[dict]) -> None:
        self._items[rid] = (response, conversation)
        self._items.move_to_end(rid)
        while len(self._items) > self.capacity:  # the least recently used go first
            self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[dict, list[dict]] | None:
        """The stored response and its conversation (None: never stored, or dropped)."""
        item = self._items.get(rid)
        if item is not None:
            self._items.move_to_end(rid)
        return item

    def __len__(self) -> int:
        return len(self._items)
