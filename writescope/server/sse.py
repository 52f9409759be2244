"""Server-sent events: the stream response (which aborts what still runs however it ends), one
event's text, and what each choice of a generation has to send as the engine advances. Shared
by the completions, chat and responses endpoints."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from . import protocol as P

if TYPE_CHECKING:
    from .generation import Choice, Generation


class SSEResponse(StreamingResponse):
    """A server-sent-events stream that runs ``on_close`` however it ends (done, error,
    client gone, task cancelled), so unfinished generations are aborted at once."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def sse(obj: Any, usage: bool = True) -> str:
    """One server-sent event. ``usage=False`` leaves a chunk's ``usage`` key out: OpenAI's
    chunks have it (null but on the last) only when ``stream_options.include_usage`` asks."""
    if hasattr(obj, "model_dump_json"):
        return f"data: {obj.model_dump_json(exclude=None if usage else {'usage'})}\n\n"
    return f"data: {json.dumps(obj)}\n\n"


DONE = "data: [DONE]\n\n"


async def deltas(gen: "Generation"):
    """What each choice has to send as the engine advances: ``(choice, new text, first new
    token, end)``, skipping updates with nothing new; marks what it yields as sent. (The
    engine's text of an unfinished output already keeps back what a stop string may cut.)"""
    while gen.unfinished():
        for idx in sorted(await gen.next_updates()):
            c = gen.choices[idx]
            piece = text_delta(c, 0)
            start, end = c.sent_tokens, len(c.token_ids)
            if not piece and not c.finished and end == start:
                continue
            c.sent_tokens = end
            yield c, piece, start, end


def text_delta(c: Choice, holdback: int) -> str:
    """New text to send for a choice. Until it finishes, the last ``holdback`` characters (a
    possible stop-string prefix) and a trailing replacement character (an incomplete UTF-8
    sequence) stay back."""
    text = c.text
    end = len(text)
    if not c.finished:
        end -= holdback
        while end > c.sent_text and text[end - 1] == "\ufffd":
            end -= 1
    if end <= c.sent_text:
        return ""
    piece = text[c.sent_text:end]
    c.sent_text = end
    return piece


def error_body(e: Exception) -> dict:
    if isinstance(e, P.APIError):
        return e.body()
    return P.APIError(str(e), status=500, type="server_error").body()
