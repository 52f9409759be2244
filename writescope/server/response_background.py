"""Background responses (``POST /v1/responses`` with ``background: true``, OpenAI's): the
request is admitted, stored ``queued`` and answered at once; its generation goes on in a task
of the server's event loop, which stores it ``in_progress`` from its first tokens and, once it
ends, as the finished response (``GET /v1/responses/{id}`` polls it). ``POST
/v1/responses/{id}/cancel`` ends the generation as an abort (the engine request aborted, its KV
freed before the engine's next step) and the response is stored ``cancelled`` with what it
wrote.

With ``stream: true`` too, the task writes the response's stream events -- a foreground
stream's (``ResponseView.events``), starting ``response.created`` and ``response.queued`` --
into an :class:`~.response_events.EventLog` kept with the stored response; the ``POST``'s
answer follows that log, and so does each ``GET /v1/responses/{id}?stream=true`` (from
``starting_after``). A reader that leaves ends its own stream only: the generation goes on. A
cancel ends the streams with the response's last events, its status "cancelled"."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from . import protocol as P
from .engine_loop import EngineFailure
from .response_events import EventLog
from .sse import SSEResponse

log = logging.getLogger("writescope.server")

if TYPE_CHECKING:
    from .api import OpenAIServer
    from .generation import Generation
    from .response_store import ResponseStore
    from .responses import ResponseView


class BackgroundResponses:
    """The background responses still running, by id."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task] = {}
        self._gens: dict[str, "Generation"] = {}

    async def start(self, server: "OpenAIServer", view: "ResponseView") -> dict:
        """Admit the generation (a 400 where it cannot run, as in the foreground), store it
        queued (a streamed one with its event log), and leave it running; the queued
        response."""
        if self.busy(view.rid):
            raise id_taken(view.rid)
        self._gens[view.rid] = view.gen  # the id reserved while it is admitted
        try:
            await view.gen.submit()
        except BaseException:
            self._gens.pop(view.rid, None)
            raise
        if view.req.stream:
            view.event_log = EventLog()
        body = view.response(in_progress=True)
        body.status = "queued"
        server.response_store.put(view.rid, body.model_dump(), [], view.req.input_items(),
                                  view.event_log)
        self.running[view.rid] = asyncio.ensure_future(self._run(server, view))
        return body.model_dump()

    def busy(self, rid: str) -> bool:
        """Whether a background response of id ``rid`` is being admitted or still runs."""
        return rid in self._gens

    async def _run(self, server: "OpenAIServer", view: "ResponseView") -> dict:
        """Generate the response to its end and store it; the response as stored (what a
        cancel answers, even where a DELETE has forgotten it by the time the cancel wakes)."""
        gen, store, events = view.gen, server.response_store, view.event_log
        failure = None
        stored_end = False  # whether the stream stored the finished response itself
        try:
            if events is None:
                while gen.unfinished():
                    await gen.next_updates()
                    _started(store, view.rid)
            else:
                async for event in view.events(queued=True):
                    events.append(event)
                    if event.startswith("event: response.in_progress\n"):
                        _started(store, view.rid)
                failure = view.failure  # written as the stream's error event
                stored_end = failure is None
        except asyncio.CancelledError:  # the server stops, or the response is deleted
            pass
        except Exception as e:  # noqa: BLE001 -- an engine failure (or a bug): it failed
            if not isinstance(e, EngineFailure):
                log.exception("background response %s failed", view.rid)
            failure = e
        finally:
            gen.close()  # aborts what still runs: the choice ends "abort", the response cancelled
            self.running.pop(view.rid, None)
            self._gens.pop(view.rid, None)
        try:
            if failure is not None:
                body = view.response()
                body.status, body.usage = "failed", view.usage("")
                body.error = {"code": "server_error", "message": str(failure)}
                # its turns without an answer: a request continuing from it keeps the history
                store.put(view.rid, body.model_dump(), view.earlier + view.req.turns(),
                          view.req.input_items(), events)
            elif not stored_end:
                body = view.final()
            else:  # the stream stored it as it ended (the same response)
                body = view.response()
        finally:
            if events is not None:
                events.close()  # its readers' streams end
        return body.model_dump()

    def follow(self, server: "OpenAIServer", rid: str, response: dict,
               after: int | None = None) -> SSEResponse:
        """A streamed background response's events after sequence number ``after`` (None:
        all), then those to come until it ends; one that is not a background response, was
        not streamed (it keeps no events) or whose events the store let go, is a 400."""
        store = server.response_store
        events = store.events(rid)
        if events is None and store.events_dropped(rid):
            raise P.APIError(f"Response '{rid}' cannot be streamed: it has finished and its "
                             "events are no longer kept (the server keeps the latest "
                             f"{store.event_bytes / 2**20:g} MiB of finished responses' "
                             "events). Retrieve it without stream.", param="stream")
        if events is None:
            why = ("was not created with background true" if not response.get("background")
                   else "was created with background true but without stream true")
            raise P.APIError(f"Response '{rid}' cannot be streamed: it {why}, and only a "
                             "background response created with stream true keeps its events. "
                             "Retrieve it without stream.", param="stream")
        return SSEResponse(events.follow(after), on_close=lambda: None)  # the generation goes on

    async def cancel(self, server: "OpenAIServer", rid: str, response: dict) -> dict:
        """Cancel a background response (``response``, as stored): the cancelled response. One
        cancelled already comes back as it is (OpenAI's cancel is idempotent); one that is not
        a background response, or that ended otherwise, is a 400."""
        if not response.get("background"):
            raise P.APIError(f"Response '{rid}' is not a background response: only responses "
                             "created with background true can be cancelled",
                             param="response_id")
        # (one still running may end by itself -- its last token, its length -- before the
        # abort reaches it: that is a response that had ended, not a cancelled one)
        ended = await self.end(rid)
        now = ended if ended is not None else response
        if now["status"] == "cancelled":
            return now
        raise P.APIError(f"Cannot cancel response '{rid}': its status is "
                         f"'{now['status']}' (only a queued or in-progress background "
                         "response can be cancelled)", param="response_id")

    async def end(self, rid: str) -> dict | None:
        """Abort response ``rid`` if it still runs and wait for its end, written as an abort's
        (stored cancelled, a stream's last events: its readers' streams end with them); the
        response as it ended (a cancel and a DELETE may both wait: the store may have
        forgotten it by the time the other wakes), None where it was not running."""
        task = self.running.get(rid)
        if task is None:
            return None
        self._gens[rid].cancel()
        await asyncio.wait({task})
        return task.result()

    def stop(self) -> None:
        """The server stops: cancel what still runs (their streams end)."""
        for task in list(self.running.values()):
            task.cancel()


def id_taken(rid: str) -> P.APIError:
    """A request naming a running background response's id (``request_id`` or X-Request-Id):
    it may not take that response's place in the store, whose run would be out of reach."""
    return P.APIError(f"A background response with id '{rid}' is still running: a request "
                      "may not reuse its id until it has ended (use another request_id or "
                      "X-Request-Id, or cancel it first).", param="request_id")


def _started(store: "ResponseStore", rid: str) -> None:
    """The stored response is in progress (no longer queued)."""
    stored = store.get(rid)
    if stored is not None and stored[0]["status"] == "queued":
        stored[0]["status"] = "in_progress"
