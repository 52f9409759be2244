"""Background responses (``POST /v1/responses`` with ``background: true``, OpenAI's): the
request is admitted, stored ``queued`` and answered at once; its generation goes on in a task
of the server's event loop, which stores it ``in_progress`` from its first tokens and, once it
ends, as the finished response (``GET /v1/responses/{id}`` polls it). ``POST
/v1/responses/{id}/cancel`` cancels the task: the engine request is aborted (its KV freed
before the engine's next step) and the response stored ``cancelled`` with what it wrote."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from . import protocol as P
from .engine_loop import EngineFailure

if TYPE_CHECKING:
    from .api import OpenAIServer
    from .responses import ResponseView


class BackgroundResponses:
    """The background responses still running, by id."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task] = {}

    async def start(self, server: "OpenAIServer", view: "ResponseView") -> dict:
        """Admit the generation (a 400 where it cannot run, as in the foreground), store it
        queued, and leave it running; the queued response."""
        await view.gen.submit()
        body = view.response(in_progress=True)
        body.status = "queued"
        server.response_store.put(view.rid, body.model_dump(), [], view.req.input_items())
        self.running[view.rid] = asyncio.ensure_future(self._run(server, view))
        return body.model_dump()

    async def _run(self, server: "OpenAIServer", view: "ResponseView") -> None:
        gen, store = view.gen, server.response_store
        failure = None
        try:
            while gen.unfinished():
                await gen.next_updates()
                stored = store.get(view.rid)
                if stored is not None and stored[0]["status"] == "queued":
                    stored[0]["status"] = "in_progress"
        except asyncio.CancelledError:  # cancelled (or the server stops): aborted below
            pass
        except EngineFailure as e:
            failure = e
        finally:
            gen.close()  # aborts what still runs: the choice ends "abort", the response cancelled
            self.running.pop(view.rid, None)
        if failure is None:
            view.final()
            return
        body = view.response()
        body.status, body.usage = "failed", view.usage("")
        body.error = {"code": "server_error", "message": str(failure)}
        store.put(view.rid, body.model_dump(), [], view.req.input_items())

    async def cancel(self, server: "OpenAIServer", rid: str, response: dict) -> dict:
        """Cancel a background response (``response``, as stored): the cancelled response. One
        cancelled already comes back as it is (OpenAI's cancel is idempotent); one that is not
        a background response, or that ended otherwise, is a 400."""
        if not response.get("background"):
            raise P.APIError(f"Response '{rid}' is not a background response: only responses "
                             "created with background true can be cancelled",
                             param="response_id")
        task = self.running.get(rid)
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            return server.response_store.get(rid)[0]
        if response["status"] == "cancelled":
            return response
        raise P.APIError(f"Cannot cancel response '{rid}': its status is "
                         f"'{response['status']}' (only a queued or in-progress background "
                         "response can be cancelled)", param="response_id")

    def stop(self) -> None:
        """The server stops: cancel what still runs."""
        for task in list(self.running.values()):
            task.cancel()
