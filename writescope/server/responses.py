"""``POST /v1/responses``: OpenAI's Responses API, as vLLM serves it, run as the chat request it
amounts to (``ResponsesRequest.as_chat``, server/responses_protocol.py) through the chat
endpoint's machinery (``OpenAIServer.prepare_chat``: the template, the sampling parameters, a
``text.format`` constraint, the reasoning split of server/chat_output.py). The one choice
becomes a response object: a ``reasoning`` item (with ``--reasoning-parser``, where the model
thought), a ``message`` item with one ``output_text`` part (where there is text, or nothing
else), then a ``function_call`` item per tool call (``call_id``, ``name``, ``arguments``);
``status`` "incomplete" with ``incomplete_details.reason`` "max_output_tokens" where the token
budget cut it short; with ``include: ["message.output_text.logprobs"]`` the output text's
log-probabilities (server/response_logprobs.py). ``store`` keeps it (server/response_store.py) for
``GET /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` and ``previous_response_id``,
until ``DELETE /v1/responses/{id}``; ``background`` answers at once and generates in the server,
``POST /v1/responses/{id}/cancel`` stops it (server/response_background.py); with ``stream`` too,
the answer is its stream of events, which ``GET /v1/responses/{id}?stream=true`` (from
``starting_after``) replays and follows, whoever left.

Streamed (``stream: true``), the same response is sent as OpenAI's typed server-sent events
(``event: <type>`` and ``data: {"type", "sequence_number", ...}``): ``response.created``,
``response.in_progress``; per item ``response.output_item.added``,
``response.content_part.added``, its text's deltas (``response.reasoning_text.delta`` /
``response.output_text.delta``), ``.done``, ``response.content_part.done``,
``response.output_item.done`` (a function call's: ``response.output_item.added``,
``response.function_call_arguments.delta``/``.done``, ``response.output_item.done``); then
``response.completed`` (``response.incomplete`` where it did not complete, as OpenAI's) with
the whole response. An engine failure mid-stream is an ``error``
event. A background response's stream starts ``response.created`` and ``response.queued`` (its
status "queued") before ``response.in_progress``, as OpenAI's."""
from __future__ import annotations

import itertools
import json
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from . import protocol as P
from . import responses_protocol as R
from .chat_output import ChatOutput
from .engine_loop import EngineFailure
from .generation import Generation
from .response_background import id_taken
from .response_events import EventLog
from .response_logprobs import TextLogprobs
from .sse import deltas, error_body

log = logging.getLogger("writescope.server")

if TYPE_CHECKING:
    from .api import OpenAIServer


async def create(server: "OpenAIServer", request: Request) -> Response:
    arrival = time.monotonic()
    server.check_auth(request)
    req = P.parse_request(R.ResponsesRequest, await server.read_body(request))
    if req.background and not server.store_responses:
        raise P.APIError("background responses need the response store, which this server "
                         "keeps off (writescope serve --no-responses-store)", param="background",
                         code="unsupported_parameter")
    refused = req.refused()
    if refused is not None:
        raise refused
    if not server.store_responses:  # answered, not kept (vLLM's, store disabled)
        req.store = False
    server.check_priority(req.priority)
    model = server.check_model(req.model)
    earlier: list[dict] = []
    if req.previous_response_id is not None:
        prev, earlier = _stored(server, req.previous_response_id, "previous_response_id")
        if prev.get("status") in ("queued", "in_progress"):  # its turns are not stored yet
            raise P.APIError(f"Previous response with id '{req.previous_response_id}' is still "
                             f"{prev['status'].replace('_', ' ')}: continue from it once it has "
                             "finished (poll GET /v1/responses/{id}).",
                             param="previous_response_id", code="invalid_request_error")
    chat = req.as_chat(earlier)
    given = request.headers.get("x-request-id") or req.request_id
    rid = f"resp_{given}" if given else R.new_id("resp")
    if server.background.busy(rid):  # it would take a running response's place in the store
        raise id_taken(rid)
    gen, out = await server.prepare_chat(chat, arrival, P.new_id(rid), "max_output_tokens",
                                         "input")
    view = ResponseView(server, req, gen, out, rid, model, earlier)
    if req.background:
        body = await server.background.start(server, view)
        if req.stream:
            return server.background.follow(server, rid, body)
        return JSONResponse(body)
    return await server.respond(request, gen, bool(req.stream), view.events, view.final)


def retrieve(server: "OpenAIServer", request: Request, rid: str) -> Response:
    """``GET /v1/responses/{id}``: a stored response; with ``stream=true``, a streamed
    background response's events after ``starting_after`` (all without it), then those to
    come (server/response_background.py)."""
    server.check_auth(request)
    response = _stored(server, rid, "response_id")[0]
    q = request.query_params
    stream = q.get("stream", "false").lower()
    if stream not in ("true", "false", "1", "0"):
        raise P.APIError(f"stream must be true or false (got {q.get('stream')!r})",
                         param="stream")
    if stream in ("false", "0"):
        return JSONResponse(response)
    after = q.get("starting_after")
    try:
        after = None if after is None else int(after)
    except ValueError:
        raise P.APIError(f"starting_after must be an integer, an event's sequence_number "
                         f"(got {after!r})", param="starting_after") from None
    return server.background.follow(server, rid, response, after)


async def cancel(server: "OpenAIServer", request: Request, rid: str) -> dict:
    """``POST /v1/responses/{id}/cancel``: a background response cancelled
    (server/response_background.py)."""
    server.check_auth(request)
    return await server.background.cancel(server, rid, _stored(server, rid, "response_id")[0])


async def delete(server: "OpenAIServer", request: Request, rid: str) -> dict:
    """``DELETE /v1/responses/{id}``: a stored response forgotten (OpenAI's answer)."""
    server.check_auth(request)
    _stored(server, rid, "response_id")
    # still running: stopped first as a cancel does (its KV freed, its streams ended)
    await server.background.end(rid)
    server.response_store.delete(rid)
    return {"id": rid, "object": "response", "deleted": True}


def input_items(server: "OpenAIServer", request: Request, rid: str) -> dict:
    """``GET /v1/responses/{id}/input_items``: a stored response's input items, a page of
    them as OpenAI's cursor pagination gives it (``order`` "desc", the last first, by
    default; ``after`` an item's id; ``limit`` 1 to 100, 20 by default)."""
    server.check_auth(request)
    _stored(server, rid, "response_id")
    items = server.response_store.input_items(rid)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise P.APIError(f"order must be 'asc' or 'desc' (got {order!r})", param="order")
    try:
        limit = int(q.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise P.APIError(f"limit must be an integer from 1 to 100 (got {q.get('limit')!r})",
                         param="limit")
    items = items if order == "asc" else items[::-1]
    after = q.get("after")
    if after is not None:
        ids = [it["id"] for it in items]
        if after not in ids:
            raise P.APIError(f"after: no input item '{after}' in response '{rid}'",
                             param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


def _stored(server: "OpenAIServer", rid: str, param: str) -> tuple[dict, list[dict]]:
    item = server.response_store.get(rid)
    if item is None:
        raise P.APIError(f"Response with id '{rid}' not found (never stored, stored with "
                         "store false, or dropped from this server's memory).", status=404,
                         param=param, code="not_found")
    return item


class ResponseView:
    """One request's generation as a response object, whole or as a stream of events (the
    same items, ids and text either way)."""

    def __init__(self, server: "OpenAIServer", req: R.ResponsesRequest, gen: Generation,
                 out: ChatOutput, rid: str, model: str, earlier: list[dict] = ()) -> None:
        self.server, self.req, self.gen, self.out = server, req, gen, out
        self.rid, self.model = rid, model
        self.earlier = list(earlier)  # the turns of previous_response_id
        self.created_at = P.now_s()
        #: a streamed background response's events, kept with it (server/response_events.py)
        self.event_log: EventLog | None = None
        #: what ended the stream early (an engine failure, written as its ``error`` event)
        self.failure: Exception | None = None
        self.msg_id, self.rs_id = R.new_id("msg"), R.new_id("rs")
        #: per tool call (its index): the output item's id and the call's id
        self.fc_ids: dict[int, tuple[str, str]] = {}
        #: the output text's log-probabilities, where ``include`` asks for them
        self.logprobs = (TextLogprobs(server, gen.choices[0], req.top_logprobs or 0,
                                      req.skip_special_tokens is not False)
                         if req.logprobs() else None)

    # -- the whole response ----------------------------------------------------------------------
    def parts(self) -> tuple[str, str, list[P.ToolCall]]:
        """(reasoning, content, tool calls) of the finished choice ('' where there is none)."""
        msg, _ = self.out.message(self.gen.choices[0], echo=False)
        return msg.reasoning_content or "", msg.content or "", msg.tool_calls

    def call_ids(self, k: int) -> tuple[str, str]:
        """Call ``k``'s output item id and call id (the same streamed and whole)."""
        return self.fc_ids.setdefault(k, (R.new_id("fc"), R.new_id("call")))

    def response(self, in_progress: bool = False) -> R.ResponsesResponse:
        c = self.gen.choices[0]
        req = self.req
        params = self.gen.params[0]
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        body = R.ResponsesResponse(
            id=self.rid, created_at=self.created_at, status="in_progress", model=self.model,
            instructions=req.instructions, max_output_tokens=req.max_output_tokens,
            metadata=req.metadata, parallel_tool_calls=bool(req.parallel_tool_calls),
            reasoning=req.reasoning.model_dump() if req.reasoning is not None else None,
            temperature=getattr(params, "temperature", req.temperature),
            top_p=getattr(params, "top_p", req.top_p),
            text={"format": fmt.model_dump(by_alias=True, exclude_none=True)
                  if fmt is not None else {"type": "text"}},
            tool_choice=req.tool_choice or "auto", truncation=req.truncation or "disabled",
            user=req.user, store=req.store is not False, tools=list(req.tools or []),
            background=bool(req.background),
            previous_response_id=req.previous_response_id, top_logprobs=req.top_logprobs or 0)
        if in_progress:
            return body
        reasoning, content, calls = self.parts()
        cut = c.finish_reason == "length"
        # the items' status: incomplete where the budget or a cancel cut them short
        status = "incomplete" if cut or c.finish_reason == "abort" else "completed"
        if reasoning:
            body.output.append(R.ReasoningItem(
                id=self.rs_id, content=[R.ReasoningText(text=reasoning)],
                status="incomplete" if cut and not content and not calls else "completed"))
        if content or not (reasoning or calls):
            body.output.append(self._message(content, "completed" if calls else status,
                                             self._text_logprobs(reasoning, content)))
        for k, call in enumerate(calls):
            fid, cid = self.call_ids(k)
            body.output.append(R.FunctionCallItem(
                id=fid, call_id=cid, name=call.function.name, arguments=call.function.arguments,
                status=status if k == len(calls) - 1 else "completed"))
        body.status = "incomplete" if cut else "cancelled" if c.finish_reason == "abort" \
            else "completed"
        if cut:
            body.incomplete_details = R.IncompleteDetails(reason="max_output_tokens")
        body.usage = self.usage(reasoning)
        return body

    def final(self) -> R.ResponsesResponse:
        """The finished response, kept (with its conversation) where ``store`` asks -- but a
        foreground one not where a background response took its id while it ran (a reused
        ``request_id``): that one's place it must not take (``id_taken``, the other way
        round), or the background response would be out of reach while it runs."""
        body = self.response()
        taken = not self.req.background and self.server.background.busy(self.rid)
        if body.store and not taken:
            answer: dict[str, Any] = {"role": "assistant", "content": None}
            for item in body.output:
                if item.type == "message":
                    answer["content"] = item.content[0].text
                elif item.type == "function_call":
                    answer.setdefault("tool_calls", []).append(
                        {"id": item.call_id, "type": "function",
                         "function": {"name": item.name, "arguments": item.arguments}})
            turns = self.earlier + self.req.turns() + [answer]
            self.server.response_store.put(self.rid, body.model_dump(), turns,
                                           self.req.input_items(), self.event_log)
        return body

    def _message(self, text: str, status: str, logprobs: list[dict]) -> R.MessageItem:
        return R.MessageItem(id=self.msg_id, status=status,
                             content=[R.OutputText(text=text, logprobs=logprobs)])

    def _text_logprobs(self, reasoning: str, content: str, with_bytes: bool = True
                       ) -> list[dict]:
        """The message's log-probabilities ([] where ``include`` does not ask for them)."""
        if self.logprobs is None:
            return []
        return self.logprobs.whole(reasoning, content, with_bytes)

    def usage(self, reasoning: str) -> R.ResponseUsage:
        u = self.gen.usage()
        details = u.prompt_tokens_details
        return R.ResponseUsage(
            input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
            total_tokens=u.total_tokens,
            input_tokens_details=R.InputTokensDetails(
                cached_tokens=details.cached_tokens if details is not None else 0),
            output_tokens_details=R.OutputTokensDetails(
                reasoning_tokens=self.reasoning_tokens(reasoning)))

    def reasoning_tokens(self, reasoning: str) -> int:
        """The output tokens up to the end of the reasoning (its closing tag included): all of
        them where it never closed."""
        c = self.gen.choices[0]
        if not reasoning:
            return 0
        ids, end = c.token_ids, self.out.parser.end
        skip = self.req.skip_special_tokens is not False

        def closed(k: int) -> bool:
            return end in self.server.tokenizer.decode(ids[:k], skip_special_tokens=skip)
        if not closed(len(ids)):
            return len(ids)
        lo, hi = 1, len(ids)  # the fewest tokens whose text holds the closing tag
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if closed(mid) else (mid + 1, hi)
        return lo

    # -- the stream ------------------------------------------------------------------------------
    async def events(self, queued: bool = False) -> AsyncIterator[str]:
        """The response as OpenAI's stream events; ``queued``: a background response's, which
        is ``queued`` until its first tokens come (``response.in_progress`` then; none where
        it is cancelled before it starts). Whatever ends it early -- an engine failure, or
        a bug -- is its last event, an ``error``, and ``failure``."""
        seq = itertools.count()

        def event(kind: str, **fields: Any) -> str:
            data = {"type": kind, "sequence_number": next(seq), **fields}
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

        start = self.response(in_progress=True).model_dump()
        started = not queued
        if queued:
            waiting = dict(start, status="queued")
            yield event("response.created", response=waiting)
            yield event("response.queued", response=waiting)
        else:
            yield event("response.created", response=start)
            yield event("response.in_progress", response=start)
        items: list[dict] = []  # the items opened: {"kind", "id", "text", "open"}

        def opened(kind: str, call: int = -1, name: str = "") -> list[str]:
            index = len(items)
            items.append({"kind": kind, "text": "", "open": True, "call": call, "name": name})
            if kind == "function_call":
                fid, cid = self.call_ids(call)
                item = R.FunctionCallItem(id=fid, call_id=cid, name=name, status="in_progress")
                return [event("response.output_item.added", output_index=index,
                              item=item.model_dump())]
            if kind == "reasoning":
                item = R.ReasoningItem(id=self.rs_id, status="in_progress")
                part = R.ReasoningText()
            else:
                item = R.MessageItem(id=self.msg_id, status="in_progress")
                part = R.OutputText()
            return [event("response.output_item.added", output_index=index,
                          item=item.model_dump()),
                    event("response.content_part.added", output_index=index,
                          item_id=item.id, content_index=0, part=part.model_dump())]

        def delta(kind: str, piece: str) -> str:
            index = len(items) - 1
            items[index]["text"] += piece
            if kind == "function_call":
                return event("response.function_call_arguments.delta", output_index=index,
                             item_id=self.call_ids(items[index]["call"])[0], delta=piece)
            if kind == "reasoning":
                return event("response.reasoning_text.delta", output_index=index,
                             item_id=self.rs_id, content_index=0, delta=piece)
            lps = (self.logprobs.delta(reasoning(), items[index]["text"])
                   if self.logprobs is not None else [])
            return event("response.output_text.delta", output_index=index,
                         item_id=self.msg_id, content_index=0, delta=piece, logprobs=lps)

        def reasoning() -> str:  # the reasoning streamed so far
            return "".join(it["text"] for it in items if it["kind"] == "reasoning")

        def closed(status: str) -> list[str]:
            index = len(items) - 1
            it = items[index]
            it["open"] = False
            if it["kind"] == "function_call":
                fid, cid = self.call_ids(it["call"])
                item = R.FunctionCallItem(id=fid, call_id=cid, name=it["name"],
                                          arguments=it["text"], status=status)
                return [event("response.function_call_arguments.done", output_index=index,
                              item_id=fid, name=it["name"], arguments=it["text"]),
                        event("response.output_item.done", output_index=index,
                              item=item.model_dump())]
            if it["kind"] == "reasoning":
                part = R.ReasoningText(text=it["text"])
                item: Any = R.ReasoningItem(id=self.rs_id, content=[part], status=status)
                done = event("response.reasoning_text.done", output_index=index,
                             item_id=item.id, content_index=0, text=it["text"])
            else:
                part = R.OutputText(text=it["text"],
                                    logprobs=self._text_logprobs(reasoning(), it["text"]))
                item = R.MessageItem(id=self.msg_id, content=[part], status=status)
                done = event("response.output_text.done", output_index=index,
                             item_id=item.id, content_index=0, text=it["text"],
                             logprobs=self._text_logprobs(reasoning(), it["text"], False))
            return [done, event("response.content_part.done", output_index=index,
                                item_id=item.id, content_index=0, part=part.model_dump()),
                    event("response.output_item.done", output_index=index,
                          item=item.model_dump())]

        def current() -> str | None:
            return items[-1]["kind"] if items and items[-1]["open"] else None

        try:
            async for c, _piece, _start, end in deltas(self.gen):
                if not started and (end or c.finish_reason != "abort"):
                    started = True  # its first tokens (or its end, with none)
                    yield event("response.in_progress", response=start)
                d, _reason = self.out.delta(c)
                if d is None:
                    continue
                if d.reasoning_content:
                    if current() != "reasoning":
                        for e in opened("reasoning"):
                            yield e
                    yield delta("reasoning", d.reasoning_content)
                if d.content:
                    if current() not in (None, "message"):
                        for e in closed("completed"):
                            yield e
                    if current() != "message":
                        for e in opened("message"):
                            yield e
                    yield delta("message", d.content)
                for call in d.tool_calls or []:
                    fn = call.function
                    if current() != "function_call" or items[-1]["call"] != call.index:
                        if current() is not None:
                            for e in closed("completed"):
                                yield e
                        for e in opened("function_call", call.index, fn.name or ""):
                            yield e
                    if fn.arguments:
                        yield delta("function_call", fn.arguments)
            final = self.final()
            if not items:  # nothing was written: an empty message, as the response has
                for e in opened("message"):
                    yield e
            if current() is not None:
                for e in closed(final.output[-1].status):
                    yield e
            kind = "response.completed" if final.status == "completed" else "response.incomplete"
            yield event(kind, response=final.model_dump())
        except Exception as e:  # noqa: BLE001 -- the stream ends with an error event
            if not isinstance(e, (EngineFailure, P.APIError)):
                log.exception("the stream of response %s failed", self.rid)
            self.failure = e
            err = error_body(e)["error"]
            yield event("error", code=err["code"] or err["type"], message=err["message"],
                        param=err["param"])
