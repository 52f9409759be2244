"""The OpenAI-compatible HTTP server: a FastAPI app around one engine loop thread.

Threads and ownership
    The engine is not thread-safe, so exactly one thread -- :class:`EngineLoop`
    (server/engine_loop.py) -- calls it. HTTP handlers run on the asyncio event loop and talk to
    the engine only through its command queue; each step's outputs come back as deltas onto
    per-HTTP-request asyncio queues (the engine's scheduler chunks long prefills so decodes keep
    going).

Admission
    ``engine.add_request`` runs on the engine thread and either accepts the request (it then runs
    or waits for KV room) or raises ``InvalidRequestError``/``RequestTooLargeError`` before it
    writes anything; the handler awaits that answer before it sends a status line, so a request
    that can never fit gets a 400 and a streaming request is only answered ``200`` once admitted.

Cancellation
    A client that disconnects (streaming: Starlette's disconnect listener cancels the response;
    non-streaming: a watcher on ``http.disconnect`` races the wait), a cancelled handler, or a
    server shutdown all end in ``abort`` commands, which the engine thread applies before its
    next step, freeing the request's KV at once.

Patterns learned from vLLM's OpenAI server (``vllm/entrypoints/openai/api_server.py``,
``serving_completion.py``, ``serving_chat.py``, ``entrypoints/utils.py: with_cancellation``):
racing the handler against ``http.disconnect``, holding back the last ``len(stop) - 1``
characters while streaming so a stop string is never half-sent, the ``stream_options``
usage chunk, and the ``context_length_exceeded`` wording. The code here is our own.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import logging
import time
import traceback
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Sequence

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..core import InvalidRequestError, SamplingParams, StructuredOutputsParams
from ..layers.grammar import MayThinkFirst
from . import protocol as P
from . import conversation, reasoning, responses, tokenize, tool_parsers, tools
from .beam import BeamGeneration
from .chat_output import ChatOutput
from .engine_loop import EngineFailure, EngineLoop
from .generation import Choice, Generation
from .metrics import CONTENT_TYPE, ServerMetrics
from .response_background import BackgroundResponses
from .response_store import ResponseStore
from .sse import DONE as _DONE
from .sse import SSEResponse as _SSEResponse
from .sse import deltas as _deltas
from .sse import error_body as _error_body
from .sse import sse as _sse
from .token_bytes import CharOffsets, TokenBytes

log = logging.getLogger("writescope.server")

MAX_BODY_BYTES = 64 * 2 ** 20  # 64 MiB of JSON: far above any context this engine serves
INLINE_TOKENIZE_CHARS = 4096   # shorter prompts are tokenised on the event loop, longer off it


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# ---------------------------------------------------------------------------------------------
# the server


class OpenAIServer:
    def __init__(self, engine: Any, served_model_names: Sequence[str] | None = None,
                 api_key: str | None = None, metrics: ServerMetrics | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES, engine_thread: Any = None,
                 tool_call_parser: str | None = None, reasoning_parser: str | None = None,
                 trust_request_chat_template: bool = False,
                 return_tokens_as_token_ids: bool = False,
                 responses_store: bool = True) -> None:
        #: reads tool calls out of the model's text for tool_choice 'auto'
        #: (server/tool_parsers.py)
        self.tool_call_parser = tool_parsers.get(tool_call_parser)
        #: splits a thinking model's reasoning from its answer (server/reasoning.py)
        self.reasoning_parser = reasoning.get(reasoning_parser)
        self.engine = engine
        self.tokenizer = engine.tokenizer
        #: each token's own bytes and text, for log-probabilities (server/token_bytes.py)
        self.token_bytes = TokenBytes(self.tokenizer)
        self.model_names = list(served_model_names or [engine.model_name])
        self.max_model_len = int(engine.max_model_len)
        #: the model's sampling defaults for what a request leaves out (vLLM's
        #: generation_config="auto"; LLMEngine.default_sampling)
        self.sampling_defaults = dict(getattr(engine, "default_sampling", None) or {})
        self.api_key = api_key or None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics or ServerMetrics(self.model_names[0])
        self.loop = EngineLoop(engine, self.metrics, engine_thread=engine_thread)
        self.vocab_size = _vocab_size(engine)
        #: vLLM's --scheduling-policy: "priority" admits the waiting requests by their
        #: ``priority``; under "fcfs" a non-zero one is refused
        self.scheduling_policy = getattr(engine, "scheduling_policy", "fcfs")
        self._tok_pool = concurrent.futures.ThreadPoolExecutor(1, "writescope-tokenize")
        self.active = 0  # HTTP requests holding admitted generations
        #: whether a request's own ``chat_template`` is rendered (vLLM's
        #: --trust-request-chat-template: a template is code the server runs)
        self.trust_request_chat_template = trust_request_chat_template
        #: log-probabilities' tokens as "token_id:N" for every request (vLLM's flag)
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        #: the stored responses of /v1/responses (server/response_store.py)
        self.response_store = ResponseStore()
        #: whether /v1/responses keeps responses (``--responses-store``, default on): off, a
        #: request's ``store: true`` is answered as ``store: false`` (vLLM's, with its
        #: VLLM_ENABLE_RESPONSES_API_STORE off) and ``background`` is refused
        self.store_responses = responses_store
        #: the background responses of /v1/responses still running
        #: (server/response_background.py)
        self.background = BackgroundResponses()

    # -- helpers --------------------------------------------------------------------------------
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.api_key.encode()):
            raise P.APIError("Incorrect API key provided.", status=401,
                             code="invalid_api_key")

    def check_priority(self, priority: int | None) -> None:
        """vLLM's ``priority``: any integer under ``--scheduling-policy priority``; otherwise
        only 0 (or left out), as vLLM refuses a priority its scheduler would not honour."""
        if priority and self.scheduling_policy != "priority":
            raise P.APIError(f"priority {priority}: this server does not use priority scheduling "
                             "(--scheduling-policy fcfs); leave priority out or 0, or start the "
                             "server with --scheduling-policy priority", param="priority",
                             code="invalid_value")

    def check_model(self, model: str | None) -> str:
        if model is None or model in self.model_names:
            return self.model_names[0] if model is None else model
        raise P.APIError(f"The model `{model}` does not exist.", status=404,
                         type="invalid_request_error", param="model", code="model_not_found")

    async def read_body(self, request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise P.APIError(f"request body larger than {self.max_body_bytes} bytes",
                             status=413, code="request_too_large")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise P.APIError(f"request body larger than {self.max_body_bytes} bytes",
                                     status=413, code="request_too_large")
                chunks.append(chunk)
        except ClientDisconnect:  # gone before its body arrived: an answer no one reads
            raise P.APIError("the client disconnected while sending the request body") from None
        return b"".join(chunks)

    async def off_loop(self, fn: Callable[[], Any], heavy: bool) -> Any:
        if not heavy:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._tok_pool, fn)

    def check_ids(self, ids: list[int], what: str) -> None:
        if self.vocab_size is not None:
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise P.APIError(f"{what}: token id {bad[0]} is out of range "
                                 f"(vocabulary size {self.vocab_size})", param=what)
        if any(t < 0 for t in ids):
            raise P.APIError(f"{what}: token ids must be non-negative", param=what)

    def truncated(self, ids: list[int], keep: int | None) -> list[int]:
        """The prompt's last ``keep`` tokens (vLLM's ``truncate_prompt_tokens``; -1: as many as
        the context takes with room for one new token; None: all)."""
        if keep is None:
            return ids
        if keep == 0:
            raise P.APIError("truncate_prompt_tokens must be -1 or a positive integer",
                             param="truncate_prompt_tokens")
        keep = self.max_model_len - 1 if keep == -1 else keep
        return ids[-keep:] if len(ids) > keep else ids

    def resolve_max_tokens(self, prompt_len: int, requested: int | None, noun: str,
                           param: str = "max_tokens") -> int:
        """The completion's token budget; ``param`` names the field that asked for it in the
        error of a request that does not fit."""
        L = self.max_model_len
        if prompt_len == 0:
            raise P.APIError("the prompt is empty", param="prompt")
        if prompt_len >= L:
            raise P.APIError(
                f"This model's maximum context length is {L} tokens. However, your {noun} "
                f"has {prompt_len} tokens, which leaves no room for the completion. Please "
                f"reduce the length of the {noun}.", code="context_length_exceeded")
        if requested is None:  # the room left, or less where the model's defaults say
            return min(L - prompt_len, self.sampling_defaults.get("max_tokens") or L)
        if prompt_len + requested > L:
            raise P.APIError(
                f"This model's maximum context length is {L} tokens. However, you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the {noun}, {requested} in "
                f"the completion). Please reduce the length of the {noun} or completion.",
                param=param, code="context_length_exceeded")
        return requested

    def token_str(self, tid: int) -> str:
        return self.tokenizer.decode([tid])

    def check_chat_template(self, req: P.ChatTemplateFields) -> None:
        """A request's own chat template only where the server trusts them (vLLM's check)."""
        if req.chat_template is not None and not self.trust_request_chat_template:
            raise P.APIError("Chat template is passed with request, but "
                             "--trust-request-chat-template is not set. Refused request with "
                             "untrusted chat template.", param="chat_template")

    @staticmethod
    def ids(request: Request, req, prefix: str) -> tuple[str, str]:
        """The response's id and the base of its engine requests' ids: vLLM's
        ``<prefix>-<id>``, the id an ``X-Request-Id`` header or the body's ``request_id``
        gives (else a random one); the engine's ids stay distinct when a client reuses one."""
        given = request.headers.get("x-request-id") or req.request_id
        if not given:
            rid = P.new_id(prefix)
            return rid, rid
        return f"{prefix}-{given}", P.new_id(f"{prefix}-{given}")

    def as_token_ids(self, req) -> bool:
        """Whether the request's log-probabilities name tokens "token_id:N" (vLLM's)."""
        v = req.return_tokens_as_token_ids
        return self.return_tokens_as_token_ids if v is None else bool(v)

    def log_ignored(self, req) -> None:
        ignored = req.ignored_fields()
        if ignored:
            log.warning("the request's fields %s are accepted and ignored", ", ".join(ignored))

    # -- /v1/completions --------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        arrival = time.monotonic()
        self.check_auth(request)
        req = P.parse_request(P.CompletionRequest, await self.read_body(request))
        self.check_priority(req.priority)
        model = self.check_model(req.model)
        self.log_ignored(req)
        prompts = req.prompts()
        heavy = sum(len(p) for p in prompts if isinstance(p, str)) > INLINE_TOKENIZE_CHARS

        def tokenize() -> list[tuple[list[int], str | None]]:
            out = []
            for p in prompts:
                if isinstance(p, str):
                    out.append((list(self.tokenizer.encode(
                        p, add_special_tokens=bool(req.add_special_tokens))), p))
                else:
                    out.append((list(p), None))
            return out

        encoded = await self.off_loop(tokenize, heavy)
        choices, params = [], []
        base, engine_base = self.ids(request, req, "cmpl")
        lp = req.logprobs  # None, or the alternatives per token (0: the sampled token's only)
        # the prompt tokens' too: for echo with logprobs (each choice streams its own), and for
        # prompt_logprobs (the same for every choice of a prompt: its first choice computes them)
        echo_lp = lp if req.echo else None
        asked = [k for k in (echo_lp, req.prompt_logprobs) if k is not None]
        first_lp = max(asked) if asked else None
        for pi, (ids, text) in enumerate(encoded):
            if text is None:
                self.check_ids(ids, "prompt")
            short = self.truncated(ids, req.truncate_prompt_tokens)
            if len(short) < len(ids):
                ids, text = short, None
            # echo without generation (vLLM's): the engine generates one token, never shown
            echo_only = bool(req.echo) and req.max_tokens == 0
            if echo_only and 0 < len(ids) <= self.max_model_len:  # the whole context may be scored
                max_tokens = 1
            else:
                max_tokens = self.resolve_max_tokens(len(ids), req.max_tokens, "prompt")
            if req.echo and text is None:
                # the prompt as it is, special tokens' text included (the prompt's logprobs
                # count them)
                text = self.tokenizer.decode(ids, skip_special_tokens=False)
            for j in range(req.num_choices):
                idx = pi * req.num_choices + j
                choices.append(Choice(idx, f"{engine_base}-{idx}", ids, text, max_tokens,
                                      echo_only=echo_only))
                params.append(self._params(req, max_tokens, lp, j,
                                           first_lp if j == 0 else echo_lp))
        if req.use_beam_search:
            gen = self._beams(req, choices, [c.max_tokens for c in choices[::req.num_choices]],
                              arrival, req.logprobs)
        else:
            gen = Generation(self, choices, params, arrival, req.num_choices, req.cache_salt,
                             req.priority or 0)
        return await self.respond(
            request, gen, req.stream, lambda: self._completion_stream(gen, req, base, model),
            lambda: P.CompletionResponse(
                id=base, model=model, usage=gen.usage(),
                choices=[P.CompletionChoice(
                    index=c.index,
                    text=(c.prompt_text or "") + c.text if req.echo else c.text,
                    logprobs=self._full_logprobs(c, req) if req.logprobs is not None else None,
                    finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                    prompt_logprobs=self._prompt_logprob_dicts(
                        gen.choices[c.index - c.index % req.num_choices], req.prompt_logprobs)
                    if req.prompt_logprobs is not None else None) for c in gen.choices]))

    def _beams(self, req, choices: list[Choice], max_tokens: list[int], arrival: float,
               logprobs: int | None) -> BeamGeneration:
        """``use_beam_search``: one search of width ``n`` per prompt (``max_tokens[i]`` steps
        for prompt ``i``, whose choices are ``i * n`` to ``i * n + n - 1``)."""
        n = req.num_choices
        try:
            params = [req.beam_search_params(m, self.sampling_defaults) for m in max_tokens]
        except InvalidRequestError as e:
            raise P.APIError(f"use_beam_search: {e}", param="n") from None
        if logprobs is not None and logprobs > 2 * n:
            raise P.APIError(f"use_beam_search with n={n} reports at most {2 * n} log-probability "
                             f"alternatives a token (the ones each step sees), not {logprobs}",
                             param="logprobs")
        salt = {} if req.cache_salt is None else {"cache_salt": req.cache_salt}
        try:  # checked (also that the beams can fit) before any step, and named by the engine
            searches = [self.engine.beam_search({"prompt_token_ids": c.prompt_ids, **salt}, p)
                        for c, p in zip(choices[::n], params)]
        except InvalidRequestError as e:
            raise P.invalid_request(e) from None
        return BeamGeneration(self, choices, params[0], searches, arrival, logprobs,
                              req.cache_salt, req.priority or 0)

    async def respond(self, request, gen: "Generation", stream: bool, make_stream, make_response):
        """Submit the generation, then stream it (SSE) or wait for the whole answer (499 when the
        client left first)."""
        await gen.submit()
        if stream:
            return _SSEResponse(make_stream(), gen.close)
        if not await self._until_done_or_disconnect(request, gen):
            return Response(status_code=499)
        return JSONResponse(make_response().model_dump())

    def _params(self, req, max_tokens: int, lp: int | None, j: int,
                prompt_lp: int | None = None) -> SamplingParams:
        try:
            return req.sampling_params(max_tokens, lp, seed_offset=j, prompt_logprobs=prompt_lp,
                                       defaults=self.sampling_defaults)
        except InvalidRequestError as e:
            raise P.invalid_request(e) from None

    def _completion_logprobs(self, c: Choice, start: int, end: int, k: int,
                             at: CharOffsets, skip: bool, as_ids: bool = False
                             ) -> P.CompletionLogprobs:
        ids = c.token_ids[start:end]
        alts = [dict(self._alternatives(c, i)) for i in range(start, end)]
        return self._logprob_entries(ids, c.logprobs[start:end], alts, k, at, skip, as_ids)

    def _token_text(self, tid: int, skip: bool, as_ids: bool) -> str:
        """A token as log-probabilities name it: its own text (server/token_bytes.py), or
        "token_id:N" (``return_tokens_as_token_ids``, vLLM's)."""
        return f"token_id:{tid}" if as_ids else self.token_bytes.text(tid, skip)

    def _prompt_logprobs(self, c: Choice, k: int, at: CharOffsets,
                         as_ids: bool = False) -> P.CompletionLogprobs:
        """Echo with logprobs: the prompt's tokens, each one's log-probability given those
        before it (None for the first, and for all where the request ended before its prefill
        did) and, for k >= 1, the k most likely tokens there and the prompt's own."""
        n = len(c.prompt_ids)
        lps = list(c.prompt_logprobs) if c.prompt_logprobs is not None else [None] * n
        return self._logprob_entries(c.prompt_ids, lps, c.prompt_top_logprobs or [None] * n,
                                     k, at, False, as_ids)

    def _logprob_entries(self, ids: list[int], lps: list[float | None],
                         alts: list[dict[int, float] | None], k: int,
                         at: CharOffsets, skip: bool, as_ids: bool = False
                         ) -> P.CompletionLogprobs:
        """The completions endpoint's logprobs for tokens ``ids``: their text (a token's own
        bytes, server/token_bytes.py; a special token's none with ``skip``, as the text leaves
        it out), character offsets (``at`` counts on from the tokens before) and log-probabilities and, for k >= 1, per token the k most likely tokens'
        text and the token's own (where it is not among them; None where the token has no
        log-probability). Two ids of one text keep the likelier value."""
        tb = self.token_bytes
        toks = [self._token_text(t, skip, as_ids) for t in ids]
        offsets = [at.add(tb.bytes(t, skip)) for t in ids]
        top = None
        if k >= 1:
            top = []
            for t, v, a in zip(toks, lps, alts):
                if v is None:
                    top.append(None)
                    continue
                d: dict[str, float] = {}
                for tid, alt in list((a or {}).items())[:k]:
                    d.setdefault(self._token_text(tid, skip, as_ids), alt)
                d.setdefault(t, v)
                top.append(d)
        return P.CompletionLogprobs(tokens=toks, token_logprobs=list(lps), text_offset=offsets,
                                    top_logprobs=top)

    def _prompt_logprob_dicts(self, c: Choice, k: int) -> P.PromptLogprobs:
        """``prompt_logprobs`` (vLLM's shape): per prompt token, None for the first (and for all
        where the request ended before its prefill did), else {token id: log-probability, rank,
        text} for the prompt's own token and the k most likely ones there."""
        n = len(c.prompt_ids)
        if c.prompt_logprobs is None:
            return [None] * n
        tops = c.prompt_top_logprobs or [None] * n
        out: P.PromptLogprobs = []
        for tid, lp, rank, top in zip(c.prompt_ids, c.prompt_logprobs, c.prompt_ranks or [None] * n,
                                      tops):
            if lp is None:
                out.append(None)
                continue
            d = {tid: P.PromptLogprob(logprob=lp, rank=rank, decoded_token=self.token_str(tid))}
            for r, (alt_id, alt) in enumerate(list((top or {}).items())[:k], start=1):
                d.setdefault(alt_id, P.PromptLogprob(logprob=alt, rank=r,
                                                     decoded_token=self.token_str(alt_id)))
            out.append(d)
        return out + [None] * (n - len(out))

    def _full_logprobs(self, c: Choice, req: P.CompletionRequest) -> P.CompletionLogprobs:
        """A whole completion's logprobs: with echo the prompt's first, then the generated
        tokens' (their text offsets after the prompt's)."""
        at = CharOffsets()
        as_ids = self.as_token_ids(req)
        if not req.echo:
            return self._completion_logprobs(c, 0, len(c.token_ids), req.logprobs, at,
                                             _skips(req), as_ids)
        head = self._prompt_logprobs(c, req.logprobs, at, as_ids)
        tail = self._completion_logprobs(c, 0, len(c.token_ids), req.logprobs, at, _skips(req),
                                         as_ids)
        return P.CompletionLogprobs(
            tokens=head.tokens + tail.tokens, token_logprobs=head.token_logprobs + tail.token_logprobs,
            text_offset=head.text_offset + tail.text_offset,
            top_logprobs=None if head.top_logprobs is None
            else head.top_logprobs + tail.top_logprobs)

    @staticmethod
    def _alternatives(c: Choice, i: int) -> list[tuple[int, float]]:
        """Token ``i``'s most likely alternatives (id, log-probability), most likely first."""
        return list(c.top_logprobs[i].items()) if i < len(c.top_logprobs) else []

    async def _completion_stream(self, gen: Generation, req: P.CompletionRequest, rid: str,
                                 model: str) -> AsyncIterator[str]:
        usage_every = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        with_usage = _streams_usage(req)
        created = P.now_s()
        text_offsets = {c.index: CharOffsets() for c in gen.choices}
        try:
            echo_later: set[int] = set()  # echo with logprobs: sent once the prompt's are known
            if req.echo:
                for c in gen.choices:
                    if req.logprobs is not None:
                        echo_later.add(c.index)
                        continue
                    yield _sse(P.CompletionResponse(id=rid, created=created, model=model, choices=[
                        P.CompletionChoice(index=c.index, text=c.prompt_text or "")]), with_usage)
            async for c, piece, start, end in _deltas(gen):
                if c.index in echo_later:
                    echo_later.discard(c.index)
                    head = self._prompt_logprobs(c, req.logprobs, text_offsets[c.index],
                                                 self.as_token_ids(req))
                    yield _sse(P.CompletionResponse(id=rid, created=created, model=model, choices=[
                        P.CompletionChoice(index=c.index, text=c.prompt_text or "",
                                           logprobs=head)]), with_usage)
                logprobs = None
                if req.logprobs is not None:
                    logprobs = self._completion_logprobs(c, start, end, req.logprobs,
                                                         text_offsets[c.index], _skips(req),
                                                         self.as_token_ids(req))
                chunk = P.CompletionResponse(
                    id=rid, created=created, model=model,
                    choices=[P.CompletionChoice(index=c.index, text=piece, logprobs=logprobs,
                                                finish_reason=c.finish_reason,
                                                stop_reason=c.stop_reason)])
                if usage_every:
                    chunk.usage = gen.usage()
                yield _sse(chunk, with_usage)
            if req.stream_options and req.stream_options.include_usage:
                yield _sse(P.CompletionResponse(id=rid, created=created, model=model, choices=[],
                                                usage=gen.usage()))
            yield _DONE
        except (EngineFailure, P.APIError) as e:
            yield _sse(_error_body(e))
            yield _DONE

    # -- /v1/chat/completions ---------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        arrival = time.monotonic()
        self.check_auth(request)
        req = P.parse_request(P.ChatCompletionRequest, await self.read_body(request))
        self.check_priority(req.priority)
        model = self.check_model(req.model)
        self.log_ignored(req)
        base, engine_base = self.ids(request, req, "chatcmpl")
        gen, out = await self.prepare_chat(
            req, arrival, engine_base,
            "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens")
        return await self.respond(
            request, gen, req.stream, lambda: self._chat_stream(gen, req, base, model, out),
            lambda: P.ChatCompletionResponse(
                id=base, model=model, usage=gen.usage(),
                choices=[P.ChatChoice(
                    index=c.index, message=message, finish_reason=reason,
                    stop_reason=c.stop_reason,
                    logprobs=self._chat_logprobs(c, 0, len(c.token_ids), req.top_logprobs,
                                                 _skips(req), self.as_token_ids(req))
                    if req.logprobs else None)
                    for c in gen.choices
                    for message, reason in [out.message(c)]],
                prompt_logprobs=self._prompt_logprob_dicts(gen.choices[0], req.prompt_logprobs)
                if req.prompt_logprobs is not None else None))

    async def prepare_chat(self, req: P.ChatCompletionRequest, arrival: float,
                           engine_base: str, max_param: str, noun: str = "messages"
                           ) -> tuple[Generation, ChatOutput]:
        """A chat request's generation, not yet submitted, and how its choices become messages:
        the conversation rendered, the sampling parameters (a forced tool call's or the
        response format's constraint, after the reasoning where the model may think first),
        beam search. ``max_param`` names the field that set the token budget, and ``noun``
        the prompt, in the errors. Shared by ``/v1/chat/completions`` and
        ``/v1/responses`` (server/responses.py)."""
        self.check_chat_template(req)
        mode = self._tool_mode(req)
        heavy = conversation.text_size(req) > INLINE_TOKENIZE_CHARS
        ids = await self.off_loop(lambda: conversation.prompt_ids(self.tokenizer, req), heavy)
        ids = self.truncated(ids, req.truncate_prompt_tokens)
        max_tokens = self.resolve_max_tokens(len(ids), req.requested_max_tokens, noun,
                                             max_param)
        lp = (req.top_logprobs or 0) if req.logprobs else None
        choices = [Choice(j, f"{engine_base}-{j}", ids, None, max_tokens)
                   for j in range(req.num_choices)]
        # the prompt's log-probabilities are the response's, once: the first choice computes them
        params = [self._params(req, max_tokens, lp, j, req.prompt_logprobs if j == 0 else None)
                  for j in range(req.num_choices)]
        forced = tools.constraint(req)
        if forced is not None:
            params = [dataclasses.replace(p, structured_outputs=forced) for p in params]
        out = self._chat_output(req, mode, ids)
        if out.may_reason:  # the model may think first: the format holds after its thinking
            params = [p if p.structured_outputs is None else dataclasses.replace(
                p, structured_outputs=self._after_reasoning(p.structured_outputs, out))
                for p in params]
        if req.use_beam_search:
            if forced is not None:  # tool_choice "required" or a named function
                tc = req.tool_choice
                what = repr(tc) if isinstance(tc, str) else f"naming function {tc.function.name!r}"
                raise P.APIError(f"use_beam_search does not apply tool_choice {what}: leave it "
                                 "out, or sample without beam search", param="tool_choice")
            gen = self._beams(req, choices, [max_tokens], arrival, lp)
        else:
            gen = Generation(self, choices, params, arrival, req.num_choices, req.cache_salt,
                             req.priority or 0)
        return gen, out

    @staticmethod
    def _after_reasoning(so, out: ChatOutput):
        """A constraint on an output that may hold reasoning: after the reasoning's end where
        the output is reasoning from its start (the prompt opened it; ``deepseek_r1``); else
        (``qwen3``, whose output is reasoning only where it opens ``<think>``, all content
        otherwise) the output's first text decides, ``MayThinkFirst``."""
        fields = {f.name: getattr(so, f.name) for f in dataclasses.fields(so)}
        fields["starts_after"] = out.parser.end
        if out.opened:
            return StructuredOutputsParams(**fields)
        return MayThinkFirst(**fields, opens_with=out.parser.start)

    def _chat_output(self, req: P.ChatCompletionRequest, mode: str | None,
                     ids: list[int]) -> ChatOutput:
        """How the request's choices become messages: tools (``mode``) and, with a reasoning
        parser, whether the prompt opened the model's thinking or closed it (the template's
        last characters)."""
        parser = self.reasoning_parser
        tool_parser = self.tool_call_parser if mode == "auto" else None
        # calls' ids of the form the server's tool-call parser's model takes back, forced too
        new_id = self.tool_call_parser.new_call_id if self.tool_call_parser else None
        if parser is None:
            return ChatOutput(req, mode, tool_parser=tool_parser, new_call_id=new_id)
        return ChatOutput(req, mode, parser,
                          self.tokenizer.decode(ids[-16:], skip_special_tokens=False),
                          tool_parser=tool_parser, new_call_id=new_id)

    def _tool_mode(self, req: P.ChatCompletionRequest) -> str | None:
        """How the chat's output relates to tools (server/tools.py): ``"forced"`` (a named
        function or 'required'), ``"auto"`` (the parser reads the text; it may first change
        the request, ``ToolParser.adjust_request``: ``mistral`` keeps special tokens) or None
        (plain text)."""
        if req.calls_tools:
            return "forced"
        if req.tools and req.tool_choice in (None, "auto"):
            if self.tool_call_parser is None:
                raise P.APIError(
                    "tool_choice 'auto' (the default when tools are given) needs a tool-call "
                    "parser: start the server with --tool-call-parser "
                    f"{'|'.join(tool_parsers.PARSERS)}, or ask for tool_choice 'required', a "
                    "named function or 'none'", param="tool_choice")
            self.tool_call_parser.adjust_request(req)
            return "auto"
        return None

    def _chat_logprobs(self, c: Choice, start: int, end: int, top: int | None, skip: bool,
                       as_ids: bool = False) -> P.ChatChoiceLogprobs:
        items = []
        for i, (tid, lp) in enumerate(zip(c.token_ids[start:end], c.logprobs[start:end])):
            alts = []
            if top:
                for alt_id, alt in self._alternatives(c, start + i):
                    alts.append(P.ChatTopLogprob(logprob=alt,
                                                 **self._chat_token(alt_id, skip, as_ids)))
            items.append(P.ChatLogprob(logprob=lp, top_logprobs=alts,
                                       **self._chat_token(tid, skip, as_ids)))
        return P.ChatChoiceLogprobs(content=items)

    def _chat_token(self, tid: int, skip: bool, as_ids: bool) -> dict:
        """A chat log-probability's ``token`` and ``bytes``: the token's text with the bytes
        that are no character alone as \\xNN and its own bytes (joined, the content's UTF-8),
        as OpenAI's (server/token_bytes.py); with ``as_ids`` "token_id:N" and that name's bytes
        (vLLM's)."""
        if as_ids:
            name = f"token_id:{tid}"
            return {"token": name, "bytes": list(name.encode())}
        return {"token": self.token_bytes.text(tid, skip),
                "bytes": list(self.token_bytes.bytes(tid, skip))}

    async def _chat_stream(self, gen: Generation, req: P.ChatCompletionRequest, rid: str,
                           model: str, out: ChatOutput) -> AsyncIterator[str]:
        usage_every = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        with_usage = _streams_usage(req)
        created = P.now_s()

        def chunk(choices: list[P.ChatStreamChoice]) -> str:
            c = P.ChatCompletionChunk(id=rid, created=created, model=model, choices=choices)
            if usage_every:
                c.usage = gen.usage()
            return _sse(c, with_usage)

        try:
            echoed = req.echoed()
            for c in gen.choices:
                yield chunk([P.ChatStreamChoice(index=c.index,
                                                delta=P.ChatDelta(role="assistant", content=""))])
                if echoed:
                    yield chunk([P.ChatStreamChoice(index=c.index,
                                                    delta=P.ChatDelta(content=echoed))])
            async for c, _piece, start, end in _deltas(gen):
                logprobs = (self._chat_logprobs(c, start, end, req.top_logprobs, _skips(req),
                                                self.as_token_ids(req))
                            if req.logprobs else None)
                delta, reason = out.delta(c)
                if delta is None and logprobs is None and reason is None:
                    continue
                yield chunk([P.ChatStreamChoice(index=c.index, delta=delta or P.ChatDelta(),
                                                logprobs=logprobs, finish_reason=reason,
                                                stop_reason=c.stop_reason if reason else None)])
            if req.stream_options and req.stream_options.include_usage:
                yield _sse(P.ChatCompletionChunk(id=rid, created=created, model=model, choices=[],
                                                 usage=gen.usage()))
            yield _DONE
        except (EngineFailure, P.APIError) as e:
            yield _sse(_error_body(e))
            yield _DONE

    async def _until_done_or_disconnect(self, request: Request, gen: Generation) -> bool:
        """Wait for every choice to finish; False (and all aborted) if the client left first."""
        work = asyncio.ensure_future(gen.run_to_end())
        watch = asyncio.ensure_future(_until_disconnect(request))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (work, watch):
                if not t.done():
                    t.cancel()
            gen.close()
        if work not in done:
            return False
        e = work.exception()
        if isinstance(e, EngineFailure):
            raise P.APIError(str(e), status=500, type="server_error") from None
        if e is not None:
            raise e
        if self.loop.stopping and any(c.finish_reason == "abort" for c in gen.choices):
            raise P.APIError("the server is shutting down; the request was cancelled",
                             status=503, type="server_error", code="unavailable")
        return True

    # -- the rest ---------------------------------------------------------------------------------
    def models(self) -> P.ModelList:
        return P.ModelList(data=[P.ModelCard(id=n, root=getattr(self.engine, "model_name", n),
                                             max_model_len=self.max_model_len)
                                 for n in self.model_names])


def _skips(req) -> bool:
    """Whether the request's text leaves special tokens out (its ``skip_special_tokens``)."""
    return req.skip_special_tokens is not False


def _streams_usage(req) -> bool:
    """Whether the request's stream chunks carry a ``usage`` key (``stream_options``)."""
    so = req.stream_options
    return bool(so and (so.include_usage or so.continuous_usage_stats))


def _vocab_size(engine: Any) -> int | None:
    tok = engine.tokenizer
    for obj, attr in ((tok, "vocab_size"), (getattr(engine, "model_config", None), "vocab_size"),
                      (getattr(engine, "config", None), "vocab_size")):
        v = getattr(obj, attr, None) if obj is not None else None
        if isinstance(v, int) and v > 0:
            return v
    try:
        return len(tok) or None
    except TypeError:
        return None


@dataclasses.dataclass(frozen=True)
class CORS:
    """Cross-origin resource sharing for browsers (Starlette's CORSMiddleware), with vLLM's
    flags and defaults: ``--allowed-origins``, ``--allow-credentials``, ``--allowed-methods``,
    ``--allowed-headers``."""

    allowed_origins: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)


class GracefulServer(uvicorn.Server):
    """uvicorn's server with a shutdown that suits a generation server: stop accepting and close
    idle connections, give running requests ``grace_s`` to finish, then cancel the rest through
    the engine (streams end with ``finish_reason: "abort"`` and ``[DONE]``, waiting non-streaming
    requests get a 503; a beam search, whose hypotheses are not done, ends its stream with an
    ``error`` event of code "unavailable" and ``[DONE]``, as its unstreamed form's 503) instead
    of killing their tasks mid-write, then uvicorn's own shutdown
    (its ``timeout_graceful_shutdown`` is the backstop) and the app's lifespan shutdown."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_s: float) -> None:
        super().__init__(config)
        self.app_server: OpenAIServer = app.state.server
        self.grace_s = grace_s
        #: the signals that stopped it, in order (``writescope serve`` exits 130 after a
        #: SIGINT even where uvicorn's re-raise of it is ignored: a server started with SIGINT
        #: ignored, as a shell's background job is)
        self.stop_signals: list[int] = []

    def handle_exit(self, sig: int, frame) -> None:
        self.stop_signals.append(sig)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive: closed; busy: closed after its response
        srv = self.app_server
        srv.loop.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        if srv.active:
            log.info("waiting up to %.0f s for %d running request(s)", self.grace_s, srv.active)
        while srv.active and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if srv.active:
            log.warning("cancelling %d running request(s)", srv.active)
            srv.loop.cancel_all()
        await super().shutdown(sockets)
        if self.force_exit and getattr(self, "lifespan", None) is not None:
            # a second Ctrl-C: uvicorn skips the app's lifespan shutdown, whose task is then
            # cancelled at exit with a traceback and the engine loop left running; run it, bounded
            try:
                await asyncio.wait_for(self.lifespan.shutdown(), timeout=5.0)
            except asyncio.TimeoutError:
                log.warning("the engine loop did not stop within 5 s")


def create_app(engine: Any, *, served_model_names: Sequence[str] | None = None,
               api_key: str | None = None, on_ready: Callable[[], None] | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, engine_thread: Any = None,
               tool_call_parser: str | None = None,
               reasoning_parser: str | None = None,
               trust_request_chat_template: bool = False,
               return_tokens_as_token_ids: bool = False,
               cors: CORS | None = None, responses_store: bool = True) -> FastAPI:
    """The FastAPI app serving ``engine`` (an :class:`~writescope.engine.engine.LLMEngine` or
    anything with its interface). The engine loop starts and stops with the app's lifespan.
    ``engine_thread``: the :class:`~writescope.server.owner.EngineThread` that built the engine,
    which then steps it (else the loop starts a thread of its own). ``cors``: the browsers'
    cross-origin rules (vLLM's defaults: any origin, method and header, no credentials).
    ``responses_store``: whether /v1/responses keeps responses (``store``, server/responses.py)."""
    server = OpenAIServer(engine, served_model_names, api_key, max_body_bytes=max_body_bytes,
                          engine_thread=engine_thread, tool_call_parser=tool_call_parser,
                          reasoning_parser=reasoning_parser,
                          trust_request_chat_template=trust_request_chat_template,
                          return_tokens_as_token_ids=return_tokens_as_token_ids,
                          responses_store=responses_store)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.loop.start(asyncio.get_running_loop())
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            server.background.stop()
            server.loop.stop()
            server._tok_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="writescope", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.server = server
    cors = cors or CORS()
    app.add_middleware(CORSMiddleware, allow_origins=list(cors.allowed_origins),
                       allow_credentials=cors.allow_credentials,
                       allow_methods=list(cors.allowed_methods),
                       allow_headers=list(cors.allowed_headers))

    @app.exception_handler(P.APIError)
    async def _api_error(request: Request, e: P.APIError):
        if 400 <= e.status < 500:
            server.metrics.requests_rejected.inc(labels={"status": str(e.status)})
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        if 400 <= e.status_code < 500:
            server.metrics.requests_rejected.inc(labels={"status": str(e.status_code)})
        return JSONResponse(P.APIError(str(e.detail), status=e.status_code, code=code).body(),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        return JSONResponse(P.APIError(str(e)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.error("unhandled error on %s:\n%s", request.url.path, traceback.format_exc())
        return JSONResponse(P.APIError(f"internal error: {type(e).__name__}: {e}", status=500,
                                       type="server_error").body(), status_code=500)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.chat(request)

    @app.post("/v1/responses")
    async def responses_(request: Request):
        return await responses.create(server, request)

    @app.get("/v1/responses/{response_id}")
    async def response_(request: Request, response_id: str):
        return responses.retrieve(server, request, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str):
        return JSONResponse(await responses.delete(server, request, response_id))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str):
        return JSONResponse(await responses.cancel(server, request, response_id))

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(request: Request, response_id: str):
        return JSONResponse(responses.input_items(server, request, response_id))

    @app.post("/tokenize")
    async def tokenize_(request: Request):
        return JSONResponse(await tokenize.tokenize(server, request))

    @app.post("/detokenize")
    async def detokenize_(request: Request):
        return JSONResponse(await tokenize.detokenize(server, request))

    @app.get("/v1/models")
    async def models(request: Request):
        server.check_auth(request)
        return JSONResponse(server.models().model_dump())

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        server.check_auth(request)
        card = next((c for c in server.models().data if c.id == model_id), None)
        if card is None:
            server.check_model(model_id)  # OpenAI's 404 model_not_found
        return JSONResponse(card.model_dump())

    @app.get("/health")
    async def health():
        if server.loop.alive and not server.loop.stopping:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request):
        server.check_auth(request)
        if not await server.loop.reset_prefix_cache():
            raise P.APIError("the prefix cache can be reset only while no request is running "
                             "or waiting", status=409, type="conflict_error")
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version():
        from .. import __version__
        return JSONResponse({"version": __version__})

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.metrics.render(), media_type=CONTENT_TYPE)

    return app
