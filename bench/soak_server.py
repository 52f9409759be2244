"""Soak test of ``writescope serve``: every endpoint and feature at once, concurrently, for
minutes -- looking for hangs, lost requests, leaked KV, crashes and tracebacks.

It starts a real server (a subprocess on a free port; by default the embedded default model on
the CPU, ``--max-model-len 1024 --max-num-seqs 4 --scheduling-policy priority`` so that requests
queue and higher priorities preempt lower ones, ``--tool-call-parser hermes``; more ``serve``
arguments after ``--``, e.g. ``-- --num-gpu-blocks 12 --pinned-budget 1MiB --host-budget 2MiB``
to make KV room scarce), then runs ``--concurrency`` client tasks (httpx, asyncio) for
``--duration`` seconds, each picking at random (``--seed``) one scenario after another, while a
scraper reads /metrics, /health and /tokenize throughout:

- /v1/completions and /v1/chat/completions, streamed and not, with n>1, several prompts,
  logprobs, prompt_logprobs, stop strings, small and large max_tokens, echo, usage chunks,
  priority, use_beam_search, structured outputs (guided_json/choice/regex, response_format),
  tools (named, required, auto, none) and a dozen other sampling fields;
- /v1/responses: foreground (streamed and not), background (polled; streamed, with
  ``GET ?stream=true&starting_after=N`` readers joining mid-way), cancel, DELETE,
  previous_response_id chains, reused request ids; two clients at once on one running
  background response (cancel+DELETE, two cancels, two DELETEs, a reader and a cancel);
- clients that leave mid-stream or mid-wait, invalid requests (bad JSON, over-long prompts,
  unknown fields, bad ids, bad values), /tokenize and /detokenize.

Every scenario's outcome is recorded: an answer checked (status code; a stream's proper end,
``data: [DONE]`` for completions/chat with a finish reason for every choice and nothing after
it, a last ``response.completed``/``response.incomplete``/``error`` event and consecutive
sequence numbers for responses; each choice within its max_tokens, all of them where it ended
"length", and the tokens its log-probabilities name equal to the usage's) or a cancellation the
client caused. A scenario over ``--timeout`` counts as hung. After the load stops it checks:
no unexpected status (5xx or otherwise); every background response created reached an end
(or was deleted); /metrics shows no request running or waiting and no KV sequence (waiting
while the engine still steps; ``--drain`` s without a step is stuck) and no KV block held
after ``POST /reset_prefix_cache``; the server is alive and answers; its stderr has no
traceback or ERROR line; SIGTERM ends it with exit code 0 within its grace period (and without
"waiting for N running request(s)": a leaked count). ``--sigterm-under-load`` sends SIGTERM
with the load still on instead: requests under way must end properly (a stream its last
event, a wait a 503), later ones may be refused, and the server must exit 0 in time.

Run (a few minutes on 2 cores; a busy machine makes everything slower, not wrong):

    python3 bench/soak_server.py --duration 180 --seed 1
    python3 bench/soak_server.py --duration 180 --seed 2 --concurrency 16 --max-num-seqs 2 \
        -- --num-gpu-blocks 12 --pinned-budget 1MiB --host-budget 2MiB
    python3 bench/soak_server.py --duration 60 --seed 4 --sigterm-under-load

Exit code 0 when no check failed; the report counts outcomes per scenario and lists each
anomaly (up to ``--show`` alike).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TERMINAL = {"completed", "incomplete", "cancelled", "failed"}
RESP_ENDS = ("response.completed", "response.incomplete", "response.failed", "error")

WORDS = ("river mountain cloud engine lamp story window garden silver paper quiet orange "
         "machine ocean forest winter number letter bridge signal").split()

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"]}}}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather",
               "parameters": TOOLS[0]["function"]["parameters"]}]


@dataclass
class Outcome:
    kind: str
    outcome: str  # ok | expected_error | client_cancel | timeout | bad
    status: int | None = None
    detail: str = ""
    seconds: float = 0.0


@dataclass
class State:
    rng: random.Random
    base: str
    outcomes: list[Outcome] = field(default_factory=list)
    background: dict[str, str] = field(default_factory=dict)  # id -> "live" | "deleted"
    finished_ids: list[str] = field(default_factory=list)  # stored, finished responses
    scrapes: collections.Counter = field(default_factory=collections.Counter)
    max_running: float = 0.0
    max_waiting: float = 0.0
    pid: int | None = None  # the server's, for its memory (RSS) over time
    rss_mib: list[float] = field(default_factory=list)
    stop: bool = False
    timeout: float = 300.0  # --timeout
    sigterm_at: float | None = None  # --sigterm-under-load: when it was sent


class Bad(Exception):
    """The server's answer broke a promise (the detail says which)."""


class ClientCancel(Exception):
    """The client left on purpose."""


# ------------------------------------------------------------------------------------------ SSE
async def sse_events(resp: httpx.Response, leave_after: int | None = None):
    """(event name or None, data text) per server-sent event; ``leave_after``: raise
    :class:`ClientCancel` after that many events (the caller's ``async with`` closes it)."""
    n = 0
    buf = ""
    async for chunk in resp.aiter_text():
        buf += chunk
        while "\n\n" in buf:
            block, buf = buf.split("\n\n", 1)
            name, data = None, []
            for line in block.split("\n"):
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
            yield name, "\n".join(data)
            n += 1
            if leave_after is not None and n >= leave_after:
                raise ClientCancel(f"left after {n} events")
    if buf.strip():
        raise Bad(f"stream ended inside an event: {buf[:120]!r}")


async def read_openai_stream(resp: httpx.Response, leave_after: int | None) -> dict:
    """A completions/chat stream: ends ``[DONE]``, no error event; per choice its tokens
    (those its log-probabilities name), its finish reason, and the usage chunk's usage."""
    last, errors, chunks = None, [], 0
    tokens: dict[int, int] = collections.Counter()
    finish: dict[int, str] = {}
    usage = None
    async for _name, data in sse_events(resp, leave_after):
        if last == "[DONE]":
            raise Bad("an event after [DONE]")
        last = data
        if data == "[DONE]":
            continue
        obj = json.loads(data)
        if "error" in obj:
            errors.append(obj["error"])
            continue
        chunks += 1
        if obj.get("usage") and not obj["choices"]:
            usage = obj["usage"]
        for c in obj["choices"]:
            i = c["index"]
            if i in finish:
                raise Bad(f"choice {i} streamed on after its finish_reason {finish[i]}")
            lp = c.get("logprobs") or {}
            tokens[i] += len(lp.get("content") or lp.get("tokens") or [])
            if c.get("finish_reason"):
                finish[i] = c["finish_reason"]
    if last != "[DONE]":
        raise Bad(f"stream did not end with [DONE] (last {str(last)[:120]!r})")
    return {"chunks": chunks, "tokens": tokens, "finish": finish, "usage": usage,
            "errors": errors}


def check_choices(body: dict, tokens: dict[int, int] | None, finish: dict[int, str],
                  usage: dict | None, stopping: bool = False) -> None:
    """Every choice finished, each within its token budget (all of it where it ended
    "length"); the tokens counted (``tokens``: from log-probabilities) are the usage's.
    ``stopping``: after SIGTERM, when a choice may also end "abort" (the grace ran out)."""
    prompts = body["prompt"] if isinstance(body.get("prompt"), list) else [None]
    want = body.get("n", 1) * len(prompts)
    if sorted(finish) != list(range(want)):
        raise Bad(f"finish reasons for choices {sorted(finish)}, {want} choices due")
    for i, reason in finish.items():
        if reason not in ("stop", "length", "tool_calls") and not (stopping and
                                                                  reason == "abort"):
            raise Bad(f"choice {i}: finish_reason {reason}")
    if tokens is None or body.get("echo") or body.get("use_beam_search") or body.get("tools"):
        return
    budget = body["max_tokens"]
    for i in range(want):
        if tokens[i] > budget or finish[i] == "length" and tokens[i] != budget:
            raise Bad(f"choice {i}: {tokens[i]} tokens, finish {finish[i]}, max_tokens "
                      f"{budget}")
    if usage is not None and sum(tokens.values()) != usage["completion_tokens"]:
        raise Bad(f"{sum(tokens.values())} tokens streamed/returned, usage says "
                  f"{usage['completion_tokens']}")


async def read_responses_stream(resp: httpx.Response, leave_after: int | None,
                                first_seq: int = 0, allow_empty: bool = False) -> dict:
    """A Responses stream: sequence numbers consecutive from ``first_seq``, its last event an
    end (completed/incomplete/failed/error) and nothing after it; ``allow_empty``: or no
    event at all (a reader that joined after the last)."""
    seq, last, final, obj = first_seq, None, None, {}
    async for name, data in sse_events(resp, leave_after):
        obj = json.loads(data)
        if final is not None:
            raise Bad(f"event {name} after the final {final}")
        if obj.get("sequence_number") != seq:
            raise Bad(f"sequence_number {obj.get('sequence_number')} where {seq} was due "
                      f"({name})")
        if obj.get("type") != name:
            raise Bad(f"event name {name} vs type {obj.get('type')}")
        seq += 1
        last = name
        if name in RESP_ENDS:
            final = name
            if name == "error":
                raise Bad(f"responses stream error event: {obj}")
    if final is None and not (allow_empty and last is None):
        raise Bad(f"responses stream ended without a final event (last {last}, seq {seq})")
    return {"final": final, "events": seq - first_seq,
            "status": (obj.get("response") or {}).get("status")}


# ------------------------------------------------------------------------------------ requests
def prompt(rng: random.Random, lo: int = 3, hi: int = 40) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def messages(rng: random.Random) -> list[dict]:
    msgs = []
    if rng.random() < 0.3:
        msgs.append({"role": "system", "content": "Be brief. " + prompt(rng, 1, 5)})
    msgs.append({"role": "user", "content": prompt(rng)})
    if rng.random() < 0.2:
        msgs += [{"role": "assistant", "content": prompt(rng, 2, 10)},
                 {"role": "user", "content": prompt(rng, 2, 10)}]
    return msgs


def max_tokens(rng: random.Random) -> int:
    return rng.choice([1, 2, 5, 8, 16, 32, 64]) if rng.random() < 0.85 else rng.randint(80, 160)


def sampling(rng: random.Random, st: State, chat: bool) -> dict:
    body: dict = {"max_tokens": max_tokens(rng)}
    r = rng.random()
    if r < 0.35:
        body["temperature"] = 0
    elif r < 0.7:
        body.update(temperature=rng.choice([0.5, 1.0]), seed=rng.randint(0, 1000))
    if rng.random() < 0.3:
        body["n"] = rng.randint(2, 3)
    if rng.random() < 0.3:
        body["stop"] = rng.sample(WORDS, rng.randint(1, 3))
    if rng.random() < 0.3:
        if chat:
            body.update(logprobs=True, top_logprobs=rng.randint(0, 3))
        else:
            body["logprobs"] = rng.randint(0, 3)
    if rng.random() < 0.4:
        body["priority"] = rng.randint(-3, 3)
    if rng.random() < 0.3:
        body["ignore_eos"] = True
    if rng.random() < 0.1:
        body["unknown_field_xyz"] = 1  # accepted and ignored
    if rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True,
                                  "continuous_usage_stats": rng.random() < 0.3}
    extras = [("prompt_logprobs", rng.randint(0, 2)), ("min_tokens", rng.randint(1, 4)),
              ("presence_penalty", 0.5), ("repetition_penalty", 1.2),
              ("logit_bias", {"100": 5.0, "200": -5.0}), ("bad_words", ["river"]),
              ("stop_token_ids", [rng.randint(100, 1000)]), ("top_k", 5), ("min_p", 0.05),
              ("cache_salt", rng.choice(["a", "b"])), ("truncate_prompt_tokens", 20),
              ("include_stop_str_in_output", True), ("return_tokens_as_token_ids", True)]
    for k, v in rng.sample(extras, rng.choice([0, 0, 1, 2, 3])):
        body[k] = v
    if body.get("min_tokens", 0) > body["max_tokens"]:
        body["min_tokens"] = body["max_tokens"]
    return body


async def post_json(st: State, client: httpx.AsyncClient, path: str, body, expect=(200,),
                    raw: bytes | None = None):
    if raw is not None:
        r = await client.post(path, content=raw, headers={"content-type": "application/json"})
    else:
        r = await client.post(path, json=body)
    if r.status_code not in expect:
        raise Bad(f"POST {path}: status {r.status_code} (expected {expect}): {r.text[:200]}")
    return r


async def plain(st: State, client: httpx.AsyncClient, path: str, body: dict, stream: bool,
                leave_after: int | None, responses: bool = False) -> str:
    """One generation request, streamed or not; an answer checked, or the client's leave."""
    if not stream:
        body.pop("stream_options", None)  # (only with stream)
        r = await post_json(st, client, path, body)
        obj = r.json()
        if responses:
            if obj.get("status") not in ("completed", "incomplete"):
                raise Bad(f"response status {obj.get('status')}")
        else:
            finish = {c["index"]: c["finish_reason"] for c in obj["choices"]}
            tokens = None
            if body.get("logprobs"):
                tokens = collections.Counter()
                for c in obj["choices"]:
                    lp = c.get("logprobs") or {}
                    tokens[c["index"]] = len(lp.get("content") or lp.get("tokens") or [])
            check_choices(body, tokens, finish, obj["usage"], st.sigterm_at is not None)
        return "ok"
    body.pop("prompt_logprobs", None)  # (not with stream, as vLLM's)
    async with client.stream("POST", path, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            raise Bad(f"stream POST {path}: status {r.status_code}: {r.text[:200]}")
        if responses:
            await read_responses_stream(r, leave_after)
        else:
            got = await read_openai_stream(r, leave_after)
            if got["errors"]:  # after SIGTERM a beam search's stream ends so (503's code)
                if st.sigterm_at is not None and all(e.get("code") == "unavailable"
                                                     for e in got["errors"]):
                    return "refused_at_shutdown"
                raise Bad(f"stream error event: {got['errors'][0]}")
            check_choices(body, got["tokens"] if body.get("logprobs") else None,
                          got["finish"], got["usage"], st.sigterm_at is not None)
    return "ok"


def leave(rng: random.Random) -> int | None:
    return rng.randint(1, 6) if rng.random() < 0.15 else None


async def s_completions(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    body = {"prompt": prompt(rng), **sampling(rng, st, chat=False)}
    if rng.random() < 0.15:
        body["prompt"] = [prompt(rng), prompt(rng)]
    if rng.random() < 0.1:
        body["echo"] = True
    if rng.random() < 0.1:
        body["guided_choice"] = ["yes", "no", "maybe"]
    elif rng.random() < 0.1:
        body["guided_regex"] = "[a-z]{2,8}( [a-z]{2,8}){0,3}"
    return await plain(st, client, "/v1/completions", body, rng.random() < 0.5, leave(rng))


async def s_chat(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    body = {"messages": messages(rng), **sampling(rng, st, chat=True)}
    r = rng.random()
    if r < 0.12:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "person", "schema": SCHEMA}}
    elif r < 0.2:
        body["guided_json"] = SCHEMA
    elif r < 0.25:
        body["response_format"] = {"type": "json_object"}
    elif r < 0.4:
        body["tools"] = TOOLS
        body["tool_choice"] = rng.choice(["auto", "required", "none",
                                          {"type": "function",
                                           "function": {"name": "get_weather"}}])
    if body.get("response_format") or body.get("guided_json") or body.get("tools"):
        body["max_tokens"] = max(body["max_tokens"], 40)
    return await plain(st, client, "/v1/chat/completions", body, rng.random() < 0.5, leave(rng))


async def s_beam(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    n = rng.randint(2, 3)
    common = {"use_beam_search": True, "n": n, "max_tokens": rng.choice([2, 4, 8, 16])}
    if rng.random() < 0.3:
        common["priority"] = rng.randint(-3, 3)
    if rng.random() < 0.5:
        path, body = "/v1/completions", {"prompt": prompt(rng), **common}
    else:
        path, body = "/v1/chat/completions", {"messages": messages(rng), **common}
    return await plain(st, client, path, body, rng.random() < 0.4, leave(rng))


def resp_body(rng: random.Random, st: State) -> dict:
    body: dict = {"input": prompt(rng), "max_output_tokens": max_tokens(rng)}
    if rng.random() < 0.3:
        body["instructions"] = "Be brief."
    if rng.random() < 0.4:
        body["temperature"] = 0
    if rng.random() < 0.3:
        body["priority"] = rng.randint(-3, 3)
    if rng.random() < 0.1:
        body["text"] = {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA}}
        body["max_output_tokens"] = max(body["max_output_tokens"], 40)
    elif rng.random() < 0.1:
        body["tools"] = RESP_TOOLS
        body["tool_choice"] = rng.choice(["auto", "required"])
        body["max_output_tokens"] = max(body["max_output_tokens"], 40)
    if rng.random() < 0.15:
        body["include"] = ["message.output_text.logprobs"]
        body["top_logprobs"] = rng.randint(0, 2)
    if rng.random() < 0.2:
        body["ignore_eos"] = True
    if st.finished_ids and rng.random() < 0.25:
        body["previous_response_id"] = rng.choice(st.finished_ids)
    if rng.random() < 0.1:  # ids reused (a client's retries): a running background one's refused
        body["request_id"] = f"soak-{rng.randint(0, 2)}"
    return body


def pooled(rid: str) -> bool:
    """Whether the id is one of those requests reuse (``resp_body``): others may have taken
    it since, so its answers are those of whichever response holds it now."""
    return rid.startswith("resp_soak-")


def refused_ok(r: httpx.Response, body: dict) -> bool:
    """An expected refusal of a Responses request: a 404 or a 400 "context length exceeded"
    for a ``previous_response_id`` (deleted meanwhile; the chain grown too long), a 400 for
    reusing a running background response's id (a pooled ``request_id``)."""
    prev = "previous_response_id" in body
    return (r.status_code == 404 and prev
            or r.status_code == 400 and prev and "context_length_exceeded" in r.text
            or r.status_code == 400 and "request_id" in body and "is still running" in r.text)


async def post_response(client: httpx.AsyncClient, body: dict, what: str) -> dict | None:
    """``POST /v1/responses`` answered 200: its body; None for a refusal the body asked for
    (:func:`refused_ok`); any other answer is :class:`Bad`."""
    r = await client.post("/v1/responses", json=body)
    if refused_ok(r, body):
        return None
    if r.status_code != 200:
        raise Bad(f"{what}: {r.status_code}: {r.text[:200]}")
    return r.json()


async def s_responses(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    body = resp_body(rng, st)
    stream = rng.random() < 0.5
    if not stream:
        obj = await post_response(client, body, "POST /v1/responses")
        if obj is None:
            return "expected_error"
        if obj["status"] not in ("completed", "incomplete"):
            raise Bad(f"response status {obj['status']}")
        if not pooled(obj["id"]):
            st.finished_ids.append(obj["id"])
        return "ok"
    async with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            if refused_ok(r, body):
                return "expected_error"
            raise Bad(f"stream POST /v1/responses: {r.status_code}: {r.text[:200]}")
        await read_responses_stream(r, leave(rng))
    return "ok"


async def poll(st: State, client: httpx.AsyncClient, rid: str, deadline: float) -> dict:
    while True:
        r = await client.get(f"/v1/responses/{rid}")
        if r.status_code == 404 and (st.background.get(rid) == "deleted" or pooled(rid)):
            return {"status": "deleted"}
        if r.status_code != 200:
            raise Bad(f"GET /v1/responses/{rid}: {r.status_code}: {r.text[:200]}")
        obj = r.json()
        if obj["status"] in TERMINAL:
            return obj
        if obj["status"] not in ("queued", "in_progress"):
            raise Bad(f"status {obj['status']}")
        if time.monotonic() > deadline:
            raise asyncio.TimeoutError(f"background {rid} still {obj['status']}")
        await asyncio.sleep(st.rng.uniform(0.05, 0.5))


async def cancel_or_delete(st: State, client: httpx.AsyncClient, rid: str) -> None:
    rng = st.rng
    await asyncio.sleep(rng.uniform(0, 1.5))
    if rng.random() < 0.6:
        r = await client.post(f"/v1/responses/{rid}/cancel")
        if r.status_code == 200:
            if r.json()["status"] not in ("cancelled",):
                raise Bad(f"cancel answered status {r.json()['status']}")
        elif r.status_code == 400 and "Cannot cancel" in r.text:
            pass  # it had ended first
        elif r.status_code == 404 and (st.background.get(rid) == "deleted" or pooled(rid)):
            pass
        elif r.status_code == 400 and pooled(rid) and "not a background" in r.text:
            pass  # a foreground response took the id once it had ended
        else:
            raise Bad(f"cancel {rid}: {r.status_code}: {r.text[:200]}")
    else:
        st.background[rid] = "deleted"
        r = await client.delete(f"/v1/responses/{rid}")
        if r.status_code not in (200, 404):
            raise Bad(f"DELETE {rid}: {r.status_code}: {r.text[:200]}")


async def s_background(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    body = {**resp_body(rng, st), "background": True}
    if rng.random() < 0.4:
        body["max_output_tokens"] = rng.randint(60, 160)
    obj = await post_response(client, body, "background POST")
    if obj is None:
        return "expected_error"
    rid = obj["id"]
    if obj["status"] != "queued":
        raise Bad(f"background answered status {obj['status']}")
    st.background[rid] = "live"
    deadline = time.monotonic() + st.timeout
    if rng.random() < 0.35:
        await cancel_or_delete(st, client, rid)
    final = await poll(st, client, rid, deadline)
    if final["status"] == "failed":
        raise Bad(f"background {rid} failed: {final.get('error')}")
    if final["status"] in ("completed", "incomplete") and st.background.get(rid) == "live":
        if not pooled(rid):
            st.finished_ids.append(rid)
    return "ok"


async def follow(st: State, client: httpx.AsyncClient, rid: str, after: int | None,
                 leave_after: int | None) -> None:
    url = f"/v1/responses/{rid}?stream=true" + (f"&starting_after={after}" if after is not None
                                                else "")
    async with client.stream("GET", url) as r:
        if r.status_code == 404 and st.background.get(rid) == "deleted" or (
                r.status_code in (400, 404) and pooled(rid)):  # (taken by another since)
            await r.aread()
            return
        if r.status_code != 200:
            await r.aread()
            raise Bad(f"GET {url}: {r.status_code}: {r.text[:200]}")
        got = await read_responses_stream(r, leave_after, 0 if after is None else after + 1,
                                          allow_empty=True)
    if got["events"] == 0:  # nothing after ``after``: then the response has ended
        r = await client.get(f"/v1/responses/{rid}")
        if r.status_code == 200 and r.json()["status"] not in TERMINAL:
            raise Bad(f"GET {url}: no event, the response still {r.json()['status']}")


async def s_background_stream(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    body = {**resp_body(rng, st), "background": True, "stream": True}
    if rng.random() < 0.5:
        body["max_output_tokens"] = rng.randint(40, 120)
    rid_box: dict = {}
    extra: list[asyncio.Task] = []

    async def reader() -> str:
        async with client.stream("POST", "/v1/responses", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                if refused_ok(r, body):
                    return "expected_error"
                raise Bad(f"background stream POST: {r.status_code}: {r.text[:200]}")
            seq = 0
            leave_after = leave(rng)
            async for name, data in sse_events(r):
                obj = json.loads(data)
                if obj.get("sequence_number") != seq:
                    raise Bad(f"sequence_number {obj.get('sequence_number')} where {seq} due")
                seq += 1
                if name == "response.created":
                    rid = obj["response"]["id"]
                    rid_box["id"] = rid
                    st.background[rid] = "live"
                    for _ in range(rng.choice([0, 0, 1, 2])):  # readers joining mid-way
                        after = rng.choice([None, -1, 0, 2, 5, 20])
                        extra.append(asyncio.ensure_future(follow(
                            st, client, rid, after, leave(rng))))
                    if rng.random() < 0.3:
                        extra.append(asyncio.ensure_future(cancel_or_delete(st, client, rid)))
                if name in RESP_ENDS:
                    if name == "error":
                        raise Bad(f"background stream error event: {obj}")
                    return "ok"
                if leave_after is not None and seq >= leave_after:
                    raise ClientCancel("left the background stream")
            raise Bad(f"background stream ended without a final event (seq {seq})")

    try:
        try:
            out = await reader()
        except ClientCancel:
            out = "client_cancel"
        if rid_box:
            final = await poll(st, client, rid_box["id"], time.monotonic() + st.timeout)
            if final["status"] == "failed":
                raise Bad(f"background {rid_box['id']} failed: {final.get('error')}")
    finally:  # the other readers and the canceller must end too
        errors = []
        for t in extra:
            try:
                await asyncio.wait_for(t, st.timeout)
            except ClientCancel:
                pass
            except Exception as e:  # noqa: BLE001 -- reported after the others ended
                errors.append(e)
        if errors:
            raise errors[0]
    return out


async def s_races(st: State, client: httpx.AsyncClient) -> str:
    """Two clients acting on one running background response at once: cancel and DELETE,
    two cancels, two DELETEs, or a cancel while a reader follows its stream."""
    rng = st.rng
    stream = rng.random() < 0.5
    body = {"input": prompt(rng), "max_output_tokens": rng.randint(20, 120), "background": True,
            "ignore_eos": True}
    if not stream:
        r = await post_json(st, client, "/v1/responses", body)
        rid = r.json()["id"]
    else:
        async with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
            if r.status_code != 200:
                await r.aread()
                raise Bad(f"background stream POST: {r.status_code}: {r.text[:200]}")
            async for _name, data in sse_events(r, None):
                rid = json.loads(data)["response"]["id"]
                break  # the POST's reader leaves at once; the response goes on
    st.background[rid] = "live"
    await asyncio.sleep(rng.uniform(0, 1.0))
    pair = rng.choice(["cancel+delete", "cancel+cancel", "delete+delete", "follow+cancel"])
    if "delete" in pair:
        st.background[rid] = "deleted"

    async def act(what: str) -> None:
        if what == "cancel":
            r = await client.post(f"/v1/responses/{rid}/cancel")
            ok = (r.status_code == 200 and r.json()["status"] == "cancelled"
                  or r.status_code == 400 and "Cannot cancel" in r.text
                  or r.status_code == 404 and "delete" in pair)
        elif what == "delete":
            r = await client.delete(f"/v1/responses/{rid}")
            ok = r.status_code in (200, 404)
        else:
            if not stream:
                return
            await follow(st, client, rid, rng.choice([None, 1, 3]), None)
            return
        if not ok:
            raise Bad(f"{pair}: {what} answered {r.status_code}: {r.text[:200]}")
    await asyncio.gather(*(act(w) for w in pair.split("+")))
    final = await poll(st, client, rid, time.monotonic() + st.timeout)
    if final["status"] not in ("deleted", "cancelled", "completed", "incomplete"):
        raise Bad(f"{pair}: ended {final['status']}")
    return "ok"


async def s_disconnect_wait(st: State, client: httpx.AsyncClient) -> str:
    """A non-streamed request whose client gives up before the answer."""
    rng = st.rng
    r = rng.random()
    if r < 0.35:
        path, body = "/v1/completions", {"prompt": prompt(rng), "max_tokens": 200,
                                         "ignore_eos": True}
    elif r < 0.7:
        path, body = "/v1/chat/completions", {"messages": messages(rng), "max_tokens": 200,
                                              "ignore_eos": True, "n": rng.randint(1, 2)}
    elif r < 0.85:
        path, body = "/v1/responses", {"input": prompt(rng), "max_output_tokens": 200,
                                       "ignore_eos": True}
    else:
        path, body = "/v1/completions", {"prompt": prompt(rng), "max_tokens": 16,
                                         "use_beam_search": True, "n": 3}
    if rng.random() < 0.4:
        body["priority"] = rng.randint(-3, 3)
    try:
        await asyncio.wait_for(client.post(path, json=body), rng.uniform(0.05, 1.5))
    except asyncio.TimeoutError:
        return "client_cancel"
    return "ok"


INVALID = [
    ("bad json", "/v1/chat/completions", None, b'{"messages": [', (400,)),
    ("bad json responses", "/v1/responses", None, b'{"input": ', (400,)),
    ("not an object", "/v1/completions", None, b'[1, 2]', (400,)),
    ("no messages", "/v1/chat/completions", {"messages": []}, None, (400,)),
    ("negative max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, None, (400,)),
    ("huge n", "/v1/completions", {"prompt": "hi", "n": 10000}, None, (400,)),
    ("bad temperature", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "temperature": 9}, None, (400,)),
    ("over-long prompt", "/v1/completions", {"prompt": "river " * 1500}, None, (400,)),
    ("over-long max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": 5000}, None,
     (400,)),
    ("over-long chat", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "ocean " * 1500}], "stream": True}, None, (400,)),
    ("over-long responses", "/v1/responses", {"input": "lamp " * 1500, "background": True},
     None, (400,)),
    ("bad token id", "/v1/completions", {"prompt": [10 ** 9]}, None, (400,)),
    ("bad model", "/v1/completions", {"prompt": "hi", "model": "nope"}, None, (404,)),
    ("bad schema", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "guided_json": {"type": "nonsense"}},
     None, (400,)),
    ("bad regex", "/v1/completions", {"prompt": "x", "guided_regex": "(["}, None, (400,)),
    ("tool auto needs tools? none given", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, None, (400,)),
    ("beam + tool", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "use_beam_search": True, "n": 2,
      "tools": TOOLS, "tool_choice": "required"}, None, (400,)),
    ("bad previous id", "/v1/responses", {"input": "x", "previous_response_id": "resp_nope"},
     None, (404,)),
    ("background without store", "/v1/responses",
     {"input": "x", "background": True, "store": False}, None, (400,)),
    ("bad include", "/v1/responses", {"input": "x", "include": ["file_search_call.results"]},
     None, (400,)),
    ("tokenize bad", "/tokenize", {"nothing": 1}, None, (400,)),
]


async def s_invalid(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    r = rng.random()
    if r < 0.75:
        name, path, body, raw, expect = rng.choice(INVALID)
        await post_json(st, client, path, body, expect, raw)
        return "expected_error"
    ops = [("GET", "/v1/responses/resp_doesnotexist", (404,)),
           ("GET", "/v1/responses/resp_doesnotexist?stream=true", (404,)),
           ("POST", "/v1/responses/resp_doesnotexist/cancel", (404,)),
           ("DELETE", "/v1/responses/resp_doesnotexist", (404,)),
           ("GET", "/v1/responses/resp_doesnotexist/input_items", (404,)),
           ("GET", "/v1/nothing", (404,)),
           ("PUT", "/v1/completions", (405,))]
    if st.finished_ids:
        rid = rng.choice(st.finished_ids)
        ops += [("GET", f"/v1/responses/{rid}?stream=maybe", (400, 404)),
                ("POST", f"/v1/responses/{rid}/cancel", (400, 404)),  # not running
                ("GET", f"/v1/responses/{rid}?stream=true&starting_after=x", (400, 404)),
                ("GET", f"/v1/responses/{rid}/input_items?limit=0", (400, 404)),
                ("GET", f"/v1/responses/{rid}/input_items", (200, 404))]
    method, url, expect = rng.choice(ops)
    resp = await client.request(method, url)
    if resp.status_code not in expect:
        raise Bad(f"{method} {url}: {resp.status_code} (expected {expect}): {resp.text[:200]}")
    return "expected_error" if resp.status_code >= 400 else "ok"


async def s_tokenize(st: State, client: httpx.AsyncClient) -> str:
    rng = st.rng
    if rng.random() < 0.5:
        r = await post_json(st, client, "/tokenize", {"prompt": prompt(rng)})
        ids = r.json()["tokens"]
        await post_json(st, client, "/detokenize", {"tokens": ids})
    else:
        await post_json(st, client, "/tokenize", {"messages": messages(rng)})
    return "ok"


SCENARIOS = [  # (name, weight, coroutine)
    ("completions", 16, s_completions),
    ("chat", 18, s_chat),
    ("beam", 4, s_beam),
    ("responses", 12, s_responses),
    ("background", 8, s_background),
    ("background_stream", 8, s_background_stream),
    ("races", 4, s_races),
    ("disconnect_wait", 5, s_disconnect_wait),
    ("invalid", 10, s_invalid),
    ("tokenize", 4, s_tokenize),
]


async def one(st: State, client: httpx.AsyncClient, name: str, fn, timeout: float) -> None:
    t0 = time.monotonic()
    try:
        try:
            out = await asyncio.wait_for(fn(st, client), timeout)
        except (Bad, httpx.HTTPError) as e:
            out = at_shutdown(st, e, t0)
            if out is None:
                raise
        st.outcomes.append(Outcome(name, out, seconds=time.monotonic() - t0))
    except ClientCancel as e:
        st.outcomes.append(Outcome(name, "client_cancel", detail=str(e),
                                   seconds=time.monotonic() - t0))
    except asyncio.TimeoutError as e:
        st.outcomes.append(Outcome(name, "timeout", detail=str(e) or f"over {timeout} s",
                                   seconds=time.monotonic() - t0))
    except Bad as e:
        st.outcomes.append(Outcome(name, "bad", detail=str(e), seconds=time.monotonic() - t0))
    except httpx.HTTPError as e:
        st.outcomes.append(Outcome(name, "bad", detail=f"{type(e).__name__}: {e}",
                                   seconds=time.monotonic() - t0))
    except Exception as e:  # noqa: BLE001 -- the driver's own bug or a malformed answer
        st.outcomes.append(Outcome(name, "bad", detail=f"{type(e).__name__}: {e}",
                                   seconds=time.monotonic() - t0))


def at_shutdown(st: State, e: Exception, t0: float) -> str | None:
    """After SIGTERM (``--sigterm-under-load``): "refused_at_shutdown" for what a stopping
    server may answer -- a 503, a refused connection, or a connection closed before a request
    sent after SIGTERM was answered (a keep-alive connection closed as it was used); None for
    the rest (a request under way at SIGTERM must end properly, not be cut off)."""
    if st.sigterm_at is None:
        return None
    if isinstance(e, httpx.ConnectError) or isinstance(e, Bad) and " 503" in str(e):
        return "refused_at_shutdown"
    if (isinstance(e, httpx.TransportError) and not isinstance(e, httpx.TimeoutException)
            and t0 >= st.sigterm_at):  # a closed connection: RemoteProtocolError, ReadError
        return "refused_at_shutdown"
    return None


async def worker(st: State, timeout: float, only: list[str] | None) -> None:
    chosen = [s for s in SCENARIOS if only is None or s[0] in only]
    names = [s[0] for s in chosen]
    weights = [s[1] for s in chosen]
    fns = {s[0]: s[2] for s in chosen}
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=4)
    async with httpx.AsyncClient(base_url=st.base, timeout=httpx.Timeout(timeout),
                                 limits=limits) as client:
        while not st.stop:
            name = st.rng.choices(names, weights)[0]
            await one(st, client, name, fns[name], timeout)
            if st.outcomes[-1].outcome == "refused_at_shutdown":
                await asyncio.sleep(0.5)  # the server is going: no busy loop of refusals


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:  # it has exited
        pass
    return 0.0


def metric(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def regions(samples: dict[str, float]) -> dict[str, float]:
    """``writescope_kv_blocks`` samples by region."""
    return {re.sub(r'.*region="([^"]+)".*', r"\1", k): v for k, v in samples.items()}


def gauge(text: str, name: str) -> float:
    vals = metric(text, name + "{")
    return sum(vals.values())


async def scraper(st: State) -> None:
    async with httpx.AsyncClient(base_url=st.base, timeout=30) as client:
        while not st.stop:
            try:
                r = await client.get("/metrics")
                st.scrapes[f"metrics {r.status_code}"] += 1
                st.max_running = max(st.max_running,
                                     gauge(r.text, "writescope_num_requests_running"))
                st.max_waiting = max(st.max_waiting,
                                     gauge(r.text, "writescope_num_requests_waiting"))
                r = await client.get("/health")
                st.scrapes[f"health {r.status_code}"] += 1
                r = await client.post("/tokenize", json={"prompt": "hello there"})
                st.scrapes[f"tokenize {r.status_code}"] += 1
                if st.pid is not None and st.sigterm_at is None:
                    st.rss_mib.append(rss_mib(st.pid))
            except httpx.HTTPError as e:
                st.scrapes[f"error {type(e).__name__}"] += 1
            await asyncio.sleep(0.3)


# -------------------------------------------------------------------------------------- server
def start_server(args) -> tuple[subprocess.Popen, str, str]:
    errpath = args.stderr or f"/tmp/soak_server_{os.getpid()}.err"
    cmd = [sys.executable, "-m", "writescope", "serve", "--port", "0",
           "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
           "--scheduling-policy", "priority", "--tool-call-parser", "hermes",
           "--shutdown-timeout", str(args.grace), "--no-access-log", "--seed", str(args.seed)]
    cmd += args.server_args
    err = open(errpath, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the server exited before it was ready; see {errpath}")
        m = re.search(r"ready on (http://\S+)", line)
        if m:
            print(line.strip(), flush=True)
            return proc, m.group(1), errpath
    raise SystemExit("the server was not ready within 300 s")


async def final_checks(st: State, args, problems: list[str]) -> dict:
    async with httpx.AsyncClient(base_url=st.base, timeout=30) as client:
        # the background responses created: each reached an end (or was deleted)
        t_end = time.monotonic() + args.timeout
        live = {rid for rid, s in st.background.items() if s == "live"}
        unfinished: dict[str, str] = {}
        while True:
            unfinished = {}
            for rid in sorted(live):
                r = await client.get(f"/v1/responses/{rid}")
                if r.status_code == 200 and r.json()["status"] not in TERMINAL:
                    unfinished[rid] = r.json()["status"]
                elif r.status_code == 200 and r.json()["status"] == "failed":
                    problems.append(f"background {rid} failed: {r.json().get('error')}")
                    live.discard(rid)
                elif r.status_code == 404:
                    live.discard(rid)  # deleted by a reader racing the mark, or dropped
            if not unfinished or time.monotonic() > t_end:
                break
            await asyncio.sleep(0.5)
        for rid, status in unfinished.items():
            problems.append(f"background {rid} still {status} after the drain")
        # running/waiting back to 0 (waiting on while the engine still steps: a slow machine)
        text, steps, still = "", -1.0, time.monotonic()
        while True:
            text = (await client.get("/metrics")).text
            running = gauge(text, "writescope_num_requests_running")
            waiting = gauge(text, "writescope_num_requests_waiting")
            seqs = gauge(text, "writescope_engine_kv_sequences")
            if (running, waiting, seqs) == (0, 0, 0):
                break
            now_steps = gauge(text, "writescope_engine_step_seconds_count")
            if now_steps != steps:
                steps, still = now_steps, time.monotonic()
            if time.monotonic() - still > args.drain or time.monotonic() > t_end:
                break  # no step for that long (stuck), or generating on past any request
            await asyncio.sleep(0.5)
        if running or waiting or seqs:
            problems.append(f"after the drain: running {running}, waiting {waiting}, "
                            f"kv sequences {seqs}")
        blocks_before = metric(text, "writescope_kv_blocks{")
        r = await client.post("/reset_prefix_cache")
        if r.status_code != 200:
            problems.append(f"reset_prefix_cache after the drain: {r.status_code} {r.text[:200]}")
        await asyncio.sleep(0.3)
        text = (await client.get("/metrics")).text
        blocks = metric(text, "writescope_kv_blocks{")
        if any(blocks.values()):
            problems.append(f"KV blocks held after the drain and a prefix-cache reset: {blocks}")
        usage = gauge(text, "writescope_kv_cache_usage_perc")
        if usage:
            problems.append(f"kv_cache_usage_perc {usage} after the drain")
        r = await client.get("/health")
        if r.status_code != 200:
            problems.append(f"/health after the drain: {r.status_code}")
        r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        if r.status_code != 200:
            problems.append(f"a request after the drain: {r.status_code} {r.text[:200]}")
        totals = metric(text, "writescope_request_success_total")
        return {"kv_blocks_before_reset": regions(blocks_before),
                "kv_blocks_after_reset": regions(blocks),
                "preemptions": gauge(text, "writescope_num_preemptions_total"),
                "finished_by_reason": {re.sub(r'.*finished_reason="([^"]+)".*', r"\1", k): v
                                       for k, v in totals.items()},
                "max_running": st.max_running, "max_waiting": st.max_waiting}


async def run_load(st: State, args, proc: subprocess.Popen | None) -> dict | None:
    """The load for ``args.duration`` s; with ``--sigterm-under-load``, then SIGTERM while it
    goes on, until the server has exited: how it exited."""
    tasks = [asyncio.ensure_future(worker(st, args.timeout, args.scenarios))
             for _ in range(args.concurrency)]
    scrape = asyncio.ensure_future(scraper(st))
    await asyncio.sleep(args.duration)
    exit_info = None
    if args.sigterm_under_load and proc is not None:
        st.sigterm_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.monotonic() - st.sigterm_at < args.grace + 15:
            await asyncio.sleep(0.1)
        exit_info = {"rc": proc.poll(), "seconds": round(time.monotonic() - st.sigterm_at, 2)}
    st.stop = True
    # the workers finish the request in hand (each bounded by its timeout)
    await asyncio.wait(tasks + [scrape], timeout=args.timeout + 30)
    for t in tasks + [scrape]:
        if not t.done():
            t.cancel()
    return exit_info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=180, help="seconds of load (default 180)")
    ap.add_argument("--seed", type=int, default=0, help="the random mix's seed (default 0)")
    ap.add_argument("--concurrency", type=int, default=8, help="client tasks (default 8)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds one scenario may take before it counts as hung (default 300)")
    ap.add_argument("--drain", type=float, default=30,
                    help="after the load, seconds without an engine step with requests still "
                    "running or waiting that count as stuck (default 30)")
    ap.add_argument("--grace", type=float, default=10, help="--shutdown-timeout (default 10)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--scenarios", type=lambda v: v.split(","), metavar="NAME,...",
                    help="only these scenarios (default all: " +
                    ",".join(s[0] for s in SCENARIOS) + ")")
    ap.add_argument("--sigterm-under-load", action="store_true",
                    help="send SIGTERM at the end of --duration with the load still on, "
                    "instead of the drain and its checks: every request under way must end "
                    "properly (a stream its last event, a wait a 503), the server exit 0 "
                    "within --grace (plus a margin)")
    ap.add_argument("--url", help="soak a running server instead of starting one (no stderr "
                    "or SIGTERM checks)")
    ap.add_argument("--stderr", help="where the server's stderr goes (default /tmp/...)")
    ap.add_argument("--json", help="write the outcomes and checks here")
    ap.add_argument("--show", type=int, default=5, help="anomalies shown per kind (default 5)")
    ap.add_argument("server_args", nargs="*", help="more `writescope serve` arguments (after --)")
    args = ap.parse_args(argv)

    proc = errpath = None
    if args.url:
        base = args.url
    else:
        proc, base, errpath = start_server(args)
    st = State(random.Random(args.seed), base, pid=proc.pid if proc is not None else None,
               timeout=args.timeout)
    problems: list[str] = []
    checks: dict = {}
    load_s = 0.0
    t0 = time.monotonic()
    exit_info = None
    try:
        exit_info = asyncio.run(run_load(st, args, proc))
        load_s = time.monotonic() - t0
        if exit_info is not None:  # SIGTERM under load: how it went
            if exit_info["rc"] is None:
                problems.append(f"SIGTERM under load: still running after "
                                f"{exit_info['seconds']} s")
            elif exit_info["rc"] != 0:
                problems.append(f"SIGTERM under load: exit code {exit_info['rc']}")
        else:
            checks = asyncio.run(final_checks(st, args, problems))
    finally:
        if proc is not None and exit_info is not None and proc.poll() is None:
            proc.kill()  # SIGTERM under load did not end it
            proc.wait()
        if proc is not None and exit_info is None:
            alive = proc.poll() is None
            if not alive:
                problems.append(f"the server died during the soak (rc {proc.returncode})")
            else:
                t1 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(args.grace + 15)
                    exit_info = {"rc": rc, "seconds": round(time.monotonic() - t1, 2)}
                    if rc != 0:
                        problems.append(f"SIGTERM: exit code {rc}")
                except subprocess.TimeoutExpired:
                    problems.append(f"SIGTERM: still running after {args.grace + 15} s")
                    proc.kill()
                    proc.wait()
    if errpath:
        with open(errpath) as f:
            err = f.read()
        for m in re.finditer(r"Traceback \(most recent call last\)", err):
            start = err.rfind("\n", 0, max(0, m.start() - 300))
            problems.append("traceback in the server's stderr:\n" +
                            err[start:m.start() + 1500])
        for line in err.splitlines():
            if re.search(r"\b(ERROR|CRITICAL)\b", line):
                problems.append(f"stderr: {line[:300]}")
            if "running request(s)" in line and not args.sigterm_under_load:
                # after the drain none runs: a leaked count
                problems.append(f"stderr at SIGTERM: {line[:300]}")

    by_kind: dict = collections.defaultdict(collections.Counter)
    for o in st.outcomes:
        by_kind[o.kind][o.outcome] += 1
    anomalies = [o for o in st.outcomes if o.outcome in ("bad", "timeout")]
    print(f"\nsoak: seed {args.seed}, {args.concurrency} clients, {load_s:.0f} s of load, "
          f"{len(st.outcomes)} scenarios")
    for kind, c in sorted(by_kind.items()):
        print(f"  {kind:18s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    print("  scrapes: " + ", ".join(f"{k} {v}" for k, v in sorted(st.scrapes.items())))
    print(f"  background responses: {len(st.background)}; checks: {json.dumps(checks)}")
    print(f"  SIGTERM: {exit_info}")
    if st.rss_mib:
        q = len(st.rss_mib) // 4
        print(f"  server RSS MiB: first {st.rss_mib[0]:.0f}, after a quarter "
              f"{st.rss_mib[q]:.0f}, last {st.rss_mib[-1]:.0f}, max {max(st.rss_mib):.0f}")
    slow = sorted(st.outcomes, key=lambda o: -o.seconds)[:3]
    print("  slowest: " + ", ".join(f"{o.kind} {o.outcome} {o.seconds:.0f} s" for o in slow))
    shown: collections.Counter = collections.Counter()
    for o in anomalies:
        key = (o.kind, o.outcome, o.detail[:40])
        shown[key] += 1
        if shown[key] <= args.show:
            print(f"ANOMALY {o.kind} {o.outcome} after {o.seconds:.1f} s: {o.detail}")
    for p in problems:
        print("PROBLEM " + p)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "by_kind": by_kind, "checks": checks,
                       "problems": problems, "sigterm": exit_info,
                       "anomalies": [o.__dict__ for o in anomalies]}, f, indent=1)
    ok = not anomalies and not problems
    print("soak: " + ("PASS" if ok else f"FAIL ({len(anomalies)} anomalies, "
                      f"{len(problems)} problems)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
