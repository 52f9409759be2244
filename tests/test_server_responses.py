"""``POST /v1/responses`` (server/responses.py): OpenAI's Responses API over the chat endpoint's
machinery, in process against a tiny checkpoint -- the response object the OpenAI SDK parses,
the same text as the chat endpoint's for the same greedy request, ``max_output_tokens`` ->
incomplete, the streamed events (their order, sequence numbers, deltas joined = the whole
text), reasoning items with ``--reasoning-parser``, ``text.format`` as structured outputs, and
the fields it cannot honour refused."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")

from conftest import chat_engine, in_process_server, post_ok  # noqa: E402
from test_server_reasoning import TEMPLATE  # noqa: E402  (Qwen3-like, thinking on or off)

OPTS = dict(dtype="float32", device="cpu", max_model_len=512)
GREEDY = dict(temperature=0, max_output_tokens=12)


@pytest.fixture(scope="module")
def engine(tiny_qwen3_moe):
    return chat_engine(tiny_qwen3_moe, TEMPLATE, **OPTS)


@pytest.fixture(scope="module")
def client(engine):
    with in_process_server(engine) as c:
        yield c


@pytest.fixture(scope="module")
def thinking(engine):
    from starlette.testclient import TestClient
    from writescope.server.api import create_app
    with TestClient(create_app(engine, reasoning_parser="qwen3",
                               tool_call_parser="hermes")) as c:
        yield c


def _sdk_parse(body: dict):
    """The body as the OpenAI SDK reads it (skipped where the SDK is not installed)."""
    openai = pytest.importorskip("openai")
    return openai.types.responses.Response.model_validate(body)


def _events(client, **body) -> list[tuple[str, dict]]:
    """A streamed response's (SSE event name, data) pairs."""
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(ln.split(": ", 1) for ln in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def _message_text(body: dict) -> str:
    (msg,) = [o for o in body["output"] if o["type"] == "message"]
    (part,) = msg["content"]
    assert part["type"] == "output_text" and part["annotations"] == []
    return part["text"]


def test_a_response_has_openais_shape_and_the_chat_endpoints_text(client):
    body = post_ok(client, "/v1/responses", input="Tell me about rivers.",
                   instructions="Be brief.", ignore_eos=True, **GREEDY)
    assert re.fullmatch(r"resp_[0-9a-f]{32}", body["id"])
    assert body["object"] == "response" and isinstance(body["created_at"], int)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["instructions"] == "Be brief." and body["max_output_tokens"] == 12
    assert body["temperature"] == 0 and body["tools"] == [] and body["tool_choice"] == "auto"
    (msg,) = body["output"]
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert re.fullmatch(r"msg_[0-9a-f]{32}", msg["id"]) and msg["status"] == "incomplete"
    chat = post_ok(client, "/v1/chat/completions", temperature=0, max_tokens=12,
                   ignore_eos=True, messages=[{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Tell me about rivers."}])
    assert _message_text(body) == chat["choices"][0]["message"]["content"]
    u = body["usage"]
    assert u["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert u["output_tokens"] == 12 and u["total_tokens"] == u["input_tokens"] + 12
    assert u["output_tokens_details"] == {"reasoning_tokens": 0}
    parsed = _sdk_parse(body)
    assert parsed.output_text == _message_text(body)
    assert parsed.usage.output_tokens == 12


def test_usage_counts_the_prefix_caches_tokens(client):
    """A long input sent twice: the second reuses the first's full blocks (64 tokens here)."""
    text = "Tell me about rivers and the sea. " * 12
    first = post_ok(client, "/v1/responses", input=text, **GREEDY)
    again = post_ok(client, "/v1/responses", input=text, **GREEDY)
    n = first["usage"]["input_tokens"]
    assert n > 64 and again["usage"]["input_tokens"] == n
    assert again["usage"]["input_tokens_details"]["cached_tokens"] == n // 64 * 64
    assert _message_text(again) == _message_text(first)


def test_message_items_and_content_parts_render_as_chat_messages(client):
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "Tell me "},
                          {"type": "input_text", "text": "about rivers."}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},  # an earlier turn's: dropped
             {"role": "assistant", "content": [{"type": "output_text", "text": "Rivers flow."}]},
             {"role": "user", "content": "More."}]
    body = post_ok(client, "/v1/responses", input=items, **GREEDY)
    chat = post_ok(client, "/v1/chat/completions", temperature=0, max_tokens=12, messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me about rivers."},
        {"role": "assistant", "content": "Rivers flow."}, {"role": "user", "content": "More."}])
    assert _message_text(body) == chat["choices"][0]["message"]["content"]
    assert body["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    finish = chat["choices"][0]["finish_reason"]
    assert body["status"] == ("completed" if finish == "stop" else "incomplete")


def test_a_stream_sends_openais_events_in_order(client):
    whole = post_ok(client, "/v1/responses", input="Tell me about rivers.", ignore_eos=True,
                    **GREEDY)
    events = _events(client, input="Tell me about rivers.", ignore_eos=True, **GREEDY)
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    deltas = [d for n, d in events if n == "response.output_text.delta"]
    assert deltas and names == (
        ["response.created", "response.in_progress", "response.output_item.added",
         "response.content_part.added"] + ["response.output_text.delta"] * len(deltas)
        + ["response.output_text.done", "response.content_part.done",
           "response.output_item.done", "response.incomplete"])
    text = "".join(d["delta"] for d in deltas)
    assert text == _message_text(whole)
    by = dict(events)
    assert by["response.created"]["response"]["status"] == "in_progress"
    assert by["response.output_text.done"]["text"] == text
    assert by["response.content_part.done"]["part"]["text"] == text
    item = by["response.output_item.done"]["item"]
    assert item["content"][0]["text"] == text and item["status"] == "incomplete"
    assert len({d["item_id"] for d in deltas} | {item["id"]}) == 1
    final = by["response.incomplete"]["response"]
    assert final["output"] == [item] and final["usage"]["output_tokens"] == 12
    _sdk_parse(final)
    openai = pytest.importorskip("openai")
    from pydantic import TypeAdapter
    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for _, data in events:
        adapter.validate_python(data)


def test_a_completed_stream_ends_with_response_completed(client):
    """A response that ends by itself (the regex's end) completes, streamed and not."""
    fmt = {"type": "json_schema", "name": "answer", "strict": True,
           "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                      "required": ["ok"], "additionalProperties": False}}
    body = post_ok(client, "/v1/responses", input="ok?", temperature=0,
                   max_output_tokens=40, text={"format": fmt})
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert json.loads(_message_text(body)) in ({"ok": True}, {"ok": False})
    assert body["text"]["format"]["name"] == "answer"
    events = _events(client, input="ok?", temperature=0, max_output_tokens=40,
                     text={"format": fmt})
    assert events[-1][0] == "response.completed"
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == _message_text(body)
    obj = post_ok(client, "/v1/responses", input="ok?", temperature=0, max_output_tokens=40,
                  text={"format": {"type": "json_object"}})
    if obj["status"] == "completed":
        assert isinstance(json.loads(_message_text(obj)), dict)
    else:
        assert _message_text(obj).startswith("{")


def test_opened_thinking_is_a_reasoning_item(thinking):
    """The template opens <think> and the tiny model never closes it: the whole output is a
    reasoning item (no message), all its tokens reasoning tokens, streamed the same."""
    req = dict(input="Why?", chat_template_kwargs={"open_thinking": True}, ignore_eos=True,
               **GREEDY)
    body = post_ok(thinking, "/v1/responses", **req)
    (item,) = body["output"]
    assert item["type"] == "reasoning" and re.fullmatch(r"rs_[0-9a-f]{32}", item["id"])
    assert item["summary"] == [] and item["content"][0]["type"] == "reasoning_text"
    text = item["content"][0]["text"]
    assert text and body["usage"]["output_tokens_details"]["reasoning_tokens"] == 12
    _sdk_parse(body)
    events = _events(thinking, **req)
    deltas = "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta")
    assert deltas == text
    assert dict(events)["response.reasoning_text.done"]["text"] == text
    assert not any(n.startswith("response.output_text") for n, _ in events)


def test_reasoning_then_message_with_its_token_count(thinking):
    """Thinking off in the prompt, a regex (vLLM's structured_outputs) writes a thinking then an
    answer: a reasoning item before the message, the reasoning tokens those up to </think>,
    streamed as returned."""
    text = "<think>\nthe sky scatters blue light\n</think>\n\nRayleigh scattering."
    req = dict(input="Why?", chat_template_kwargs={"enable_thinking": False}, temperature=0,
               max_output_tokens=60, structured_outputs={"regex": re.escape(text)})
    body = post_ok(thinking, "/v1/responses", **req)
    assert body["status"] == "completed"
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == \
        "the sky scatters blue light\n"
    assert _message_text(body) == "Rayleigh scattering."
    u = body["usage"]
    assert 0 < u["output_tokens_details"]["reasoning_tokens"] < u["output_tokens"]
    _sdk_parse(body)
    events = _events(thinking, **req)
    names = [n for n, _ in events]
    assert names.index("response.reasoning_text.done") < names.index(
        "response.output_item.added", names.index("response.reasoning_text.done"))
    assert "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta") == \
        "the sky scatters blue light\n"
    assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == \
        "Rayleigh scattering."
    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert [(d["type"], d["status"]) for d in done] == [("reasoning", "completed"),
                                                       ("message", "completed")]
    assert [o["output_index"] for o in (d for n, d in events
                                        if n == "response.output_item.added")] == [0, 1]
    assert events[-1][1]["response"]["output"] == done


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tool_choice"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"background": True, "store": False}, "background"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"include": ["message.output_text.logprobs", "file_search_call.results"]}, "include"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "1"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a"}},
     "structured_outputs"),
    ({"tools": [{"type": "function", "name": "bad name"}], "tool_choice": "required"}, "tools"),
])
def test_what_it_cannot_honour_is_a_400_naming_the_field(client, extra, param):
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_stored_responses_continue_and_come_back(client):
    """``store`` (default true): ``GET /v1/responses/{id}`` returns the response, and
    ``previous_response_id`` continues its conversation -- the chat endpoint's answer to the
    same turns (the earlier instructions not carried over, as OpenAI's); ``store: false``
    keeps nothing."""
    first = post_ok(client, "/v1/responses", input="Tell me about rivers.",
                    instructions="Be brief.", **GREEDY)
    assert first["store"] is True
    r = client.get(f"/v1/responses/{first['id']}")
    assert r.status_code == 200 and r.json() == first
    second = post_ok(client, "/v1/responses", input="More.", previous_response_id=first["id"],
                     **GREEDY)
    assert second["previous_response_id"] == first["id"]
    chat = post_ok(client, "/v1/chat/completions", temperature=0, max_tokens=12, messages=[
        {"role": "user", "content": "Tell me about rivers."},
        {"role": "assistant", "content": _message_text(first)},
        {"role": "user", "content": "More."}])
    assert second["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert _message_text(second) == chat["choices"][0]["message"]["content"]
    # a stream is stored as its last event says
    events = _events(client, input="More.", previous_response_id=second["id"], **GREEDY)
    final = events[-1][1]["response"]
    assert client.get(f"/v1/responses/{final['id']}").json() == final
    unstored = post_ok(client, "/v1/responses", input="hi", store=False, **GREEDY)
    assert unstored["store"] is False
    r = client.get(f"/v1/responses/{unstored['id']}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.post("/v1/responses", json={"input": "hi", "previous_response_id": unstored["id"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"


def test_the_store_keeps_the_most_recently_used():
    from writescope.server.response_store import ResponseStore
    store = ResponseStore(capacity=2)
    store.put("a", {"id": "a"}, [])
    store.put("b", {"id": "b"}, [])
    assert store.get("a") == ({"id": "a"}, [])  # now the most recent
    store.put("c", {"id": "c"}, [])
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2


TOOL = {"type": "function", "name": "check", "description": "Say whether it is ok.",
        "parameters": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                       "required": ["ok"], "additionalProperties": False}}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}


@pytest.mark.parametrize("choice,chat_choice", [
    ({"type": "function", "name": "check"}, {"type": "function", "function": {"name": "check"}}),
    ("required", "required"),
])
def test_function_calls_are_output_items_streamed_as_written(client, choice, chat_choice):
    """A forced call (a named function or 'required'): a function_call item whose arguments
    are the chat endpoint's for the same greedy request; streamed, its arguments' deltas join
    to them; the call's answer (function_call + function_call_output items) renders as the
    chat's assistant tool_calls turn and tool turn."""
    req = dict(input="ok?", tools=[TOOL], tool_choice=choice, temperature=0,
               max_output_tokens=200)
    body = post_ok(client, "/v1/responses", **req)
    chat = post_ok(client, "/v1/chat/completions", messages=[{"role": "user", "content": "ok?"}],
                   tools=[CHAT_TOOL], tool_choice=chat_choice, temperature=0, max_tokens=200)
    want = chat["choices"][0]["message"]["tool_calls"]
    calls = body["output"]
    assert [c["type"] for c in calls] == ["function_call"] * len(want) and want
    assert [c["arguments"] for c in calls] == [w["function"]["arguments"] for w in want]
    for c in calls:
        assert c["name"] == "check" and re.fullmatch(r"fc_[0-9a-f]{32}", c["id"])
        assert re.fullmatch(r"call_[0-9a-f]{32}", c["call_id"])
        assert json.loads(c["arguments"]) in ({"ok": True}, {"ok": False})
    assert body["status"] == "completed"
    assert body["tools"] == [TOOL] and body["tool_choice"] == choice
    _sdk_parse(body)
    events = _events(client, **req)
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    per_item, i = [], 2
    for _ in calls:  # each call: added, its arguments' deltas, their done, the item's done
        assert names[i] == "response.output_item.added"
        k = i + 1
        while names[k] == "response.function_call_arguments.delta":
            k += 1
        assert names[k:k + 2] == ["response.function_call_arguments.done",
                                  "response.output_item.done"] and k > i + 1
        per_item.append([d for _, d in events[i:k + 2]])
        i = k + 2
    assert i == len(names) - 1
    for c, evs in zip(calls, per_item):
        joined = "".join(d["delta"] for d in evs[1:-2])
        assert joined == c["arguments"] == evs[-2]["arguments"] == evs[-1]["item"]["arguments"]
        assert evs[0]["item"]["name"] == "check"
        assert evs[-1]["item"]["call_id"] == evs[0]["item"]["call_id"]
    final = events[-1][1]["response"]["output"]
    assert [o["call_id"] for o in final] == [evs[0]["item"]["call_id"] for evs in per_item]
    assert [o["arguments"] for o in final] == [c["arguments"] for c in calls]
    call = calls[0]
    if len(calls) > 1:
        return  # (the next turn is checked on the single call)
    # the next turn: the call and its output, as the chat endpoint renders them
    turn = [{"role": "user", "content": "ok?"},
            {"type": "function_call", "call_id": call["call_id"], "name": "check",
             "arguments": call["arguments"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "yes"}]
    nxt = post_ok(client, "/v1/responses", input=turn, **GREEDY)
    ref = post_ok(client, "/v1/chat/completions", temperature=0, max_tokens=12, messages=[
        {"role": "user", "content": "ok?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["call_id"], "type": "function",
             "function": {"name": "check", "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "yes"}])
    assert nxt["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    assert _message_text(nxt) == ref["choices"][0]["message"]["content"]
    # the same through previous_response_id: the stored turn holds the call
    cont = post_ok(client, "/v1/responses", previous_response_id=body["id"], **GREEDY,
                   input=[{"type": "function_call_output", "call_id": call["call_id"],
                           "output": "yes"}])
    assert cont["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    assert _message_text(cont) == _message_text(nxt)


def test_auto_tool_calls_follow_the_text_before_them(thinking):
    """tool_choice 'auto' (with --tool-call-parser hermes): the text before the call is a
    message item, the call a function_call item after it, streamed in that order."""
    text = ('Let me check.<tool_call>{"name": "check", "arguments": {"ok": true}}'
            '</tool_call>')
    req = dict(input="ok?", tools=[TOOL], temperature=0, max_output_tokens=120,
               chat_template_kwargs={"enable_thinking": False},
               structured_outputs={"regex": re.escape(text)})
    body = post_ok(thinking, "/v1/responses", **req)
    message, call = body["output"]
    assert _message_text(body) == "Let me check." and message["status"] == "completed"
    assert call["type"] == "function_call" and call["name"] == "check"
    assert json.loads(call["arguments"]) == {"ok": True} and body["status"] == "completed"
    events = _events(thinking, **req)
    added = [d["item"]["type"] for n, d in events if n == "response.output_item.added"]
    assert added == ["message", "function_call"]
    assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == \
        "Let me check."
    args = "".join(d["delta"] for n, d in events
                   if n == "response.function_call_arguments.delta")
    assert json.loads(args) == {"ok": True}
    assert events[-1][1]["response"]["output"][1]["call_id"] == \
        [d for n, d in events if n == "response.output_item.added"][1]["item"]["call_id"]


def test_context_and_model_errors(client):
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 100000})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_output_tokens"
    long = "rivers and lakes " * 200  # over the 512-token context
    r = client.post("/v1/responses", json={"input": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # truncation "auto": the conversation's start dropped, room left for one token
    body = post_ok(client, "/v1/responses", input=long, truncation="auto", temperature=0)
    assert body["usage"]["input_tokens"] == 511 and body["usage"]["output_tokens"] == 1
    assert body["truncation"] == "auto"
    r = client.post("/v1/responses", json={"input": "hi", "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_the_openai_client_reads_a_response_and_a_stream(client):
    """The SDK's client against the app: a response, a raw event stream (cut short: it ends
    with response.incomplete, as OpenAI's), and its stream helper on one that completes."""
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
    model = client.app.state.server.model_names[0]
    resp = sdk.responses.create(model=model, input="Hi", temperature=0, max_output_tokens=8,
                                extra_body={"ignore_eos": True})
    assert resp.status == "incomplete" and resp.usage.output_tokens == 8
    assert resp.incomplete_details.reason == "max_output_tokens"
    events = list(sdk.responses.create(model=model, input="Hi", temperature=0,
                                       max_output_tokens=8, stream=True,
                                       extra_body={"ignore_eos": True}))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.incomplete"
    assert text == resp.output_text == events[-1].response.output_text
    with sdk.responses.stream(model=model, input="Hi", temperature=0, max_output_tokens=20,
                              extra_body={"structured_outputs": {"regex": "[ab]{3}"}}) as st:
        deltas = "".join(e.delta for e in st if e.type == "response.output_text.delta")
        final = st.get_final_response()
    assert final.status == "completed" and re.fullmatch("[ab]{3}", final.output_text)
    assert deltas == final.output_text


LOGPROBS = ["message.output_text.logprobs"]


def _delta_form(entries: list[dict]) -> list[dict]:
    """Log-probabilities as the text events give them (OpenAI's: no bytes)."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]}
                              for t in e["top_logprobs"]]} for e in entries]


def test_output_text_logprobs_are_the_chat_endpoints(client):
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs``: the output_text
    part's logprobs are the chat endpoint's for the same greedy request (token, bytes,
    logprob, the alternatives); streamed, the deltas' join to them (without bytes, as
    OpenAI's events), the done event has them all; ``top_logprobs`` alone returns none."""
    req = dict(input="Tell me about rivers.", ignore_eos=True, **GREEDY)
    # each from an empty prefix cache: records reused from the last one's kept tail would
    # move the last bits of the logprobs
    post_ok(client, "/reset_prefix_cache")
    body = post_ok(client, "/v1/responses", include=LOGPROBS, top_logprobs=3, **req)
    (part,) = body["output"][0]["content"]
    post_ok(client, "/reset_prefix_cache")
    chat = post_ok(client, "/v1/chat/completions", temperature=0, max_tokens=12,
                   ignore_eos=True, logprobs=True, top_logprobs=3,
                   messages=[{"role": "user", "content": "Tell me about rivers."}])
    want = chat["choices"][0]["logprobs"]["content"]
    assert len(want) == 12 and part["logprobs"] == want
    assert all(len(e["top_logprobs"]) == 3 for e in want)
    assert bytes(b for e in want for b in e["bytes"]).decode(errors="replace") == part["text"]
    assert body["top_logprobs"] == 3
    parsed = _sdk_parse(body)
    assert [lp.logprob for lp in parsed.output[0].content[0].logprobs] == \
        [e["logprob"] for e in want]
    post_ok(client, "/reset_prefix_cache")
    events = _events(client, include=LOGPROBS, top_logprobs=3, **req)
    deltas = [d["logprobs"] for n, d in events if n == "response.output_text.delta"]
    assert [e for lps in deltas for e in lps] == _delta_form(want)
    by = dict(events)
    assert by["response.output_text.done"]["logprobs"] == _delta_form(want)
    assert by["response.content_part.done"]["part"]["logprobs"] == want
    assert by["response.incomplete"]["response"]["output"][0]["content"][0]["logprobs"] == want
    openai = pytest.importorskip("openai")
    from pydantic import TypeAdapter
    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for _, data in events:
        adapter.validate_python(data)
    plain = post_ok(client, "/v1/responses", top_logprobs=3, **req)
    assert plain["output"][0]["content"][0]["logprobs"] == [] and plain["top_logprobs"] == 3
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
    resp = sdk.responses.create(input="Tell me about rivers.", include=LOGPROBS,
                                top_logprobs=1, temperature=0, max_output_tokens=12,
                                extra_body={"ignore_eos": True})
    lps = resp.output[0].content[0].logprobs
    assert [lp.token for lp in lps] == [e["token"] for e in want]
    assert [[t.token for t in lp.top_logprobs] for lp in lps] == \
        [[t["token"] for t in e["top_logprobs"][:1]] for e in want]


def test_output_text_logprobs_leave_the_reasoning_out(thinking):
    """With a reasoning item before the message: the message's logprobs are the tokens of
    its text only (their bytes join to it, the tokens of the thinking left out), the same
    streamed."""
    text = "<think>\nthe sky scatters blue light\n</think>\n\nRayleigh scattering."
    req = dict(input="Why?", chat_template_kwargs={"enable_thinking": False}, temperature=0,
               max_output_tokens=60, structured_outputs={"regex": re.escape(text)},
               include=LOGPROBS, top_logprobs=2)
    body = post_ok(thinking, "/v1/responses", **req)
    lps = body["output"][1]["content"][0]["logprobs"]
    written = bytes(b for e in lps for b in e["bytes"]).decode(errors="replace")
    assert written.strip() == "Rayleigh scattering." and "think" not in written
    assert 0 < len(lps) < body["usage"]["output_tokens"] - \
        body["usage"]["output_tokens_details"]["reasoning_tokens"] + 1
    _sdk_parse(body)
    events = _events(thinking, **req)
    streamed = [e for n, d in events if n == "response.output_text.delta" for e in d["logprobs"]]
    assert streamed == _delta_form(lps)


def _sdk(client):
    openai = pytest.importorskip("openai")
    return openai, openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)


def test_a_stored_response_is_deleted(client):
    """``DELETE /v1/responses/{id}``: OpenAI's answer, then the response is gone (GET and
    previous_response_id 404, a second delete too); an unknown id is a 404."""
    openai, sdk = _sdk(client)
    body = post_ok(client, "/v1/responses", input="hi", **GREEDY)
    r = client.delete(f"/v1/responses/{body['id']}")
    assert r.status_code == 200
    assert r.json() == {"id": body["id"], "object": "response", "deleted": True}
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404
    r = client.post("/v1/responses", json={"input": "hi", "previous_response_id": body["id"]})
    assert r.status_code == 404
    r = client.delete(f"/v1/responses/{body['id']}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    other = sdk.responses.create(input="hi", temperature=0, max_output_tokens=4)
    assert sdk.responses.retrieve(other.id).id == other.id
    sdk.responses.delete(other.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(other.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.delete(other.id)


def test_input_items_list_what_was_sent_page_by_page(client):
    """``GET /v1/responses/{id}/input_items``: the response's own input items (not its
    previous_response_id's), each with an id (the one given, else a new one), as the SDK's
    ResponseItemList reads them; ``order`` (desc by default), ``after`` and ``limit``
    paginate as OpenAI's."""
    openai, sdk = _sdk(client)
    first = post_ok(client, "/v1/responses", input="Tell me about rivers.", **GREEDY)
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "id": "msg_given", "role": "user",
              "content": [{"type": "input_text", "text": "Tell me "},
                          {"type": "input_text", "text": "about lakes."}]},
             {"role": "assistant", "content": "Lakes are still."},
             {"type": "function_call", "call_id": "c1", "name": "check", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "yes"},
             {"role": "user", "content": "More."}]
    body = post_ok(client, "/v1/responses", input=items, previous_response_id=first["id"],
                   **GREEDY)
    r = client.get(f"/v1/responses/{body['id']}/input_items", params={"order": "asc"})
    assert r.status_code == 200
    page = r.json()
    listed = openai.types.responses.ResponseItemList.model_validate(page)
    assert page["object"] == "list" and page["has_more"] is False
    data = page["data"]
    assert [d["type"] for d in data] == ["message", "message", "message", "function_call",
                                         "function_call_output", "message"]
    assert [d.get("role") for d in data] == ["developer", "user", "assistant", None, None,
                                             "user"]
    assert data[1]["id"] == "msg_given" and len({d["id"] for d in data}) == 6
    assert [p["text"] for p in data[1]["content"]] == ["Tell me ", "about lakes."]
    assert data[2]["content"][0]["type"] == "output_text"
    assert data[3]["call_id"] == "c1" and data[4]["output"] == "yes"
    assert page["first_id"] == data[0]["id"] and page["last_id"] == data[-1]["id"]
    assert listed.data[1].id == "msg_given"
    ids = [d["id"] for d in data]
    # the default order is the last first; pages of two, after the last one's id
    got, after = [], None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        p = client.get(f"/v1/responses/{body['id']}/input_items", params=params).json()
        got += [d["id"] for d in p["data"]]
        after = p["last_id"]
        if not p["has_more"]:
            break
    assert got == ids[::-1]
    sdk_ids = [it.id for it in sdk.responses.input_items.list(body["id"], order="asc",
                                                              limit=4)]
    assert sdk_ids == ids  # the SDK's pager follows has_more and after
    (only,) = client.get(f"/v1/responses/{first['id']}/input_items").json()["data"]
    assert only["content"] == [{"type": "input_text", "text": "Tell me about rivers."}]
    for params, param in (({"order": "up"}, "order"), ({"limit": 0}, "limit"),
                          ({"after": "msg_nope"}, "after")):
        r = client.get(f"/v1/responses/{body['id']}/input_items", params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert client.get("/v1/responses/resp_nope/input_items").status_code == 404
    client.delete(f"/v1/responses/{body['id']}")
    assert client.get(f"/v1/responses/{body['id']}/input_items").status_code == 404


def _poll(client, rid: str, until=("completed", "incomplete", "cancelled", "failed"),
          timeout_s: float = 60.0) -> dict:
    import time
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/responses/{rid}").json()
        if body["status"] in until or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def _idle(engine, server, timeout_s: float = 10.0) -> bool:
    """Whether the engine has no request left and the server none active (within a while:
    an abort is applied before the engine's next step)."""
    import time
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished_requests() or server.active:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_background_response_is_polled_to_its_end(client, engine):
    """``background: true``: answered at once (queued or in progress, no output yet), the
    generation goes on in the server; GET polls it to the same response as in the
    foreground; through the SDK too."""
    openai, sdk = _sdk(client)
    req = dict(input="Tell me about rivers.", ignore_eos=True, temperature=0,
               max_output_tokens=40)
    fg = post_ok(client, "/v1/responses", **req)
    bg = post_ok(client, "/v1/responses", background=True, **req)
    assert bg["status"] in ("queued", "in_progress") and bg["background"] is True
    assert bg["output"] == [] and bg["store"] is True
    _sdk_parse(bg)
    done = _poll(client, bg["id"])
    assert done["status"] == "incomplete" and done["background"] is True
    assert _message_text(done) == _message_text(fg)
    assert done["usage"]["output_tokens"] == 40
    _sdk_parse(done)
    assert _idle(engine, client.app.state.server)
    resp = sdk.responses.create(input="Hi", background=True, temperature=0,
                                max_output_tokens=8, extra_body={"ignore_eos": True})
    assert resp.status in ("queued", "in_progress")
    final = _poll(client, resp.id)
    assert sdk.responses.retrieve(resp.id).output_text == _message_text(final)
    # it continues a conversation once done
    nxt = post_ok(client, "/v1/responses", input="More.", previous_response_id=bg["id"],
                  **GREEDY)
    assert nxt["status"] in ("completed", "incomplete")
    r = client.post("/v1/responses", json={"background": True, "store": False, **req})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"


def test_cancel_aborts_a_background_response_and_frees_the_engine(client, engine):
    """``POST /v1/responses/{id}/cancel``: the engine request is aborted (nothing left
    running), the response cancelled with what it wrote; cancelling it again returns it;
    cancelling a finished or a foreground response is a 400, an unknown one a 404."""
    openai, sdk = _sdk(client)
    server = client.app.state.server
    bg = post_ok(client, "/v1/responses", input="Tell me about rivers.", background=True,
                 ignore_eos=True, temperature=0, max_output_tokens=480)
    _poll(client, bg["id"], until=("in_progress", "incomplete"))
    # a turn cannot continue it while it runs (its turns are not stored yet)
    r = client.post("/v1/responses", json={"input": "More.", "previous_response_id": bg["id"], **GREEDY})
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    assert "still in progress" in r.json()["error"]["message"]
    cancelled = sdk.responses.cancel(bg["id"])
    assert cancelled.status == "cancelled" and cancelled.background is True
    assert cancelled.usage.output_tokens < 480
    assert _idle(engine, server)
    assert server.background.running == {}
    got = client.get(f"/v1/responses/{bg['id']}").json()
    assert got["status"] == "cancelled" and got == cancelled.model_dump(mode="json",
                                                                         exclude_unset=True)
    assert got["output"] == [] or got["output"][0]["status"] == "incomplete"
    again = client.post(f"/v1/responses/{bg['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    done = post_ok(client, "/v1/responses", input="hi", background=True, **GREEDY)
    _poll(client, done["id"])
    r = client.post(f"/v1/responses/{done['id']}/cancel")
    assert r.status_code == 400 and "Cannot cancel" in r.json()["error"]["message"]
    fg = post_ok(client, "/v1/responses", input="hi", **GREEDY)
    with pytest.raises(openai.BadRequestError):
        sdk.responses.cancel(fg["id"])
    with pytest.raises(openai.NotFoundError):
        sdk.responses.cancel("resp_nope")
    # deleting a running one stops it first
    run = post_ok(client, "/v1/responses", input="Tell me about rivers.", background=True,
                  ignore_eos=True, temperature=0, max_output_tokens=480)
    assert client.delete(f"/v1/responses/{run['id']}").json()["deleted"] is True
    assert _idle(engine, server) and server.background.running == {}
    assert client.get(f"/v1/responses/{run['id']}").status_code == 404


def test_cancel_racing_the_response_s_own_end_is_a_400(client, engine, monkeypatch):
    """A cancel whose abort reaches a background response as it ends by itself (its length,
    its last token: the task still running, its generation done) answers as for one that had
    ended: a 400 naming its status, not a 200 with a response that was not cancelled (the
    soak test's follow+cancel race, eighty-second session)."""
    server = client.app.state.server
    done = post_ok(client, "/v1/responses", input="hi", background=True, max_output_tokens=2,
                   ignore_eos=True, temperature=0)
    final = _poll(client, done["id"])
    assert final["status"] == "incomplete"

    async def ended_meanwhile(rid):  # the task's result: the response as it ended
        return final

    monkeypatch.setattr(server.background, "end", ended_meanwhile)
    r = client.post(f"/v1/responses/{done['id']}/cancel")
    assert r.status_code == 400 and "its status is 'incomplete'" in r.json()["error"]["message"]
    assert client.get(f"/v1/responses/{done['id']}").json()["status"] == "incomplete"


def _replayed(client, rid: str, **params) -> list[tuple[str, dict]]:
    """``GET /v1/responses/{id}?stream=true``'s (SSE event name, data) pairs."""
    with client.stream("GET", f"/v1/responses/{rid}",
                       params={"stream": "true", **params}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    out = []
    for block in text.strip().split("\n\n") if text.strip() else []:
        lines = dict(ln.split(": ", 1) for ln in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def _runs(names: list[str]) -> list[str]:
    """Event names with each run of the same delta event as one."""
    return [n for k, n in enumerate(names)
            if not (n.endswith(".delta") and k and names[k - 1] == n)]


def _deltas(events) -> str:
    """The output text a stream's deltas wrote: the SDK's events or (name, data) pairs."""
    pairs = [e if isinstance(e, tuple) else (e.type, {"delta": getattr(e, "delta", "")})
             for e in events]
    return "".join(d["delta"] for n, d in pairs if n == "response.output_text.delta")


def test_a_streamed_background_response_sends_a_foreground_streams_events(client, engine):
    """``background`` and ``stream``: the answer is the foreground stream's events (the same
    items and text), the response ``queued`` first (``response.created``,
    ``response.queued``, as OpenAI's); its events are kept while it is stored: ``GET
    /v1/responses/{id}?stream=true`` replays them all, the same, and the finished response
    is the last event's; deleted, they go with it."""
    openai, sdk = _sdk(client)
    server = client.app.state.server
    req = dict(input="Tell me about rivers.", ignore_eos=True, temperature=0,
               max_output_tokens=24)
    fg = _events(client, **req)
    bg = _events(client, background=True, **req)
    # (how many deltas carry the text depends on timing: the engine's updates that came
    # while the last was being sent go out as one, so a run of deltas counts as one)
    names = _runs([n for n, _ in bg])
    assert names == ["response.created", "response.queued"] + _runs([n for n, _ in fg])[1:]
    assert [d["sequence_number"] for _, d in bg] == list(range(len(bg)))
    assert all(d["type"] == n for n, d in bg)
    created, queued, started = (d["response"] for _, d in bg[:3])
    assert created["status"] == queued["status"] == "queued" and created["background"] is True
    assert started["status"] == "in_progress" and created["output"] == []
    last = bg[-1][1]["response"]
    assert bg[-1][0] == "response.incomplete" and last["status"] == "incomplete"
    assert _deltas(bg) == _deltas(fg) == _message_text(last) == _message_text(fg[-1][1]["response"])
    assert last["usage"]["output_tokens"] == 24
    rid = last["id"]
    assert client.get(f"/v1/responses/{rid}").json() == last
    assert _replayed(client, rid) == bg  # replayed from the start, the same events
    streamed = list(sdk.responses.retrieve(rid, stream=True))
    assert [(e.type, e.sequence_number) for e in streamed] == \
        [(n, d["sequence_number"]) for n, d in bg]
    assert streamed[-1].response.output_text == _message_text(last)
    assert _replayed(client, rid, starting_after=len(bg) - 1) == []  # nothing after the last
    # the SDK's own client reads the stream as it comes
    events = list(sdk.responses.create(input="Hi", background=True, stream=True,
                                       temperature=0, max_output_tokens=8,
                                       extra_body={"ignore_eos": True}))
    assert [e.type for e in events[:3]] == ["response.created", "response.queued",
                                            "response.in_progress"]
    assert events[-1].type == "response.incomplete"
    assert _deltas(events) == events[-1].response.output_text
    assert _idle(engine, server) and server.background.running == {}
    assert server.response_store.events(rid) is not None
    assert client.delete(f"/v1/responses/{rid}").status_code == 200
    assert server.response_store.events(rid) is None
    assert client.get(f"/v1/responses/{rid}", params={"stream": "true"}).status_code == 404


def test_a_background_stream_outlives_its_reader_and_resumes_where_it_left(client, engine):
    """A client that leaves a background stream mid-way leaves the response running: it
    finishes (nothing aborted) and stays retrievable; ``GET ...?stream=true&starting_after=N``
    sends exactly the events after N (those stored, then those to come), so that the deltas
    read before and after join into the final text."""
    openai, sdk = _sdk(client)
    server = client.app.state.server
    stream = sdk.responses.create(input="Tell me about rivers.", background=True, stream=True,
                                  temperature=0, max_output_tokens=120,
                                  extra_body={"ignore_eos": True})
    seen = []
    for event in stream:  # up to its second delta
        seen.append(event)
        if sum(e.type == "response.output_text.delta" for e in seen) == 2:
            break
    stream.close()  # the client leaves mid-stream
    rid = seen[0].response.id
    cursor = seen[-1].sequence_number
    assert [e.sequence_number for e in seen] == list(range(cursor + 1))
    rest = list(sdk.responses.retrieve(rid, stream=True, starting_after=cursor))
    assert [e.sequence_number for e in rest] == list(range(cursor + 1, cursor + 1 + len(rest)))
    assert rest[-1].type == "response.incomplete"
    final = sdk.responses.retrieve(rid)
    assert final.status == "incomplete" and final.usage.output_tokens == 120
    assert _deltas(seen) + _deltas(rest) == final.output_text == rest[-1].response.output_text
    again = _replayed(client, rid, starting_after=cursor)
    assert [(n, d["sequence_number"]) for n, d in again] == \
        [(e.type, e.sequence_number) for e in rest]
    assert _idle(engine, server) and server.background.running == {}


def _running_stream(sdk):
    """A streamed background response of 480 tokens, read up to its first text delta, and a
    second stream following it from its first event: ``(its events to come, those read, its
    id, the follower's to come, the follower's read)``."""
    stream = sdk.responses.create(input="Tell me about rivers.", background=True, stream=True,
                                  temperature=0, max_output_tokens=480,
                                  extra_body={"ignore_eos": True})
    it = iter(stream)
    seen = [next(it)]
    rid = seen[0].response.id
    follower = iter(sdk.responses.retrieve(rid, stream=True))
    followed = [next(follower)]
    for event in it:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    return it, seen, rid, follower, followed


def test_cancel_ends_a_background_stream(client, engine):
    """Cancelling a streamed background response ends its streams (the one that created it
    and one that follows it) with its last events, the response ``cancelled`` with what it
    wrote; the engine is left with nothing; a later replay ends the same way."""
    openai, sdk = _sdk(client)
    server = client.app.state.server
    it, seen, rid, follower, followed = _running_stream(sdk)
    cancelled = sdk.responses.cancel(rid)
    assert cancelled.status == "cancelled" and cancelled.usage.output_tokens < 480
    seen += list(it)  # the stream ends
    followed += list(follower)
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert [(e.type, e.sequence_number) for e in followed] == \
        [(e.type, e.sequence_number) for e in seen]
    last = seen[-1]
    assert last.type == "response.incomplete" and last.response.status == "cancelled"
    assert last.response.output_text == cancelled.output_text == _deltas(seen)
    assert client.get(f"/v1/responses/{rid}").json()["status"] == "cancelled"
    replay = _replayed(client, rid)
    assert replay[-1][1]["response"]["status"] == "cancelled" and len(replay) == len(seen)
    assert _idle(engine, server) and server.background.running == {}


def test_only_a_streamed_background_response_streams_again(client):
    """``GET /v1/responses/{id}?stream=true`` on a response that keeps no events (a
    foreground one, or a background one created without stream) is a 400 in OpenAI's error
    format; an unknown id a 404; a ``starting_after`` or ``stream`` that is no such value a
    400 naming it."""
    openai, sdk = _sdk(client)
    fg = post_ok(client, "/v1/responses", input="hi", **GREEDY)
    r = client.get(f"/v1/responses/{fg['id']}", params={"stream": "true"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "stream"
    assert "background" in err["message"]
    with pytest.raises(openai.BadRequestError):
        list(sdk.responses.retrieve(fg["id"], stream=True))
    bg = post_ok(client, "/v1/responses", input="hi", background=True, **GREEDY)
    _poll(client, bg["id"])
    r = client.get(f"/v1/responses/{bg['id']}", params={"stream": "true"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    assert client.get("/v1/responses/resp_nope", params={"stream": "true"}).status_code == 404
    for params, param in (({"stream": "true", "starting_after": "x"}, "starting_after"),
                          ({"stream": "maybe"}, "stream")):
        r = client.get(f"/v1/responses/{bg['id']}", params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert client.get(f"/v1/responses/{fg['id']}", params={"stream": "false"}).json() == \
        client.get(f"/v1/responses/{fg['id']}").json()


def test_without_the_store_responses_are_answered_not_kept(engine):
    """``writescope serve --no-responses-store`` (``create_app(responses_store=False)``):
    ``store: true`` is answered as ``store: false`` (vLLM's, its store disabled), nothing
    comes back from GET, previous_response_id or input_items; ``background`` is a 400."""
    from starlette.testclient import TestClient
    from writescope.cli import build_parser
    from writescope.server.api import create_app
    assert build_parser().parse_args(["serve"]).responses_store is True
    assert build_parser().parse_args(["serve", "--no-responses-store"]).responses_store is False
    with TestClient(create_app(engine, responses_store=False)) as c:
        openai, sdk = _sdk(c)
        body = post_ok(c, "/v1/responses", input="hi", store=True, **GREEDY)
        assert body["store"] is False and _sdk_parse(body).store is False
        assert c.get(f"/v1/responses/{body['id']}").status_code == 404
        assert c.get(f"/v1/responses/{body['id']}/input_items").status_code == 404
        r = c.post("/v1/responses", json={"input": "hi", "previous_response_id": body["id"]})
        assert r.status_code == 404
        events = _events(c, input="hi", **GREEDY)
        assert events[-1][1]["response"]["store"] is False
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(events[-1][1]["response"]["id"])
        for stream in (False, True):
            r = c.post("/v1/responses", json={"input": "hi", "background": True,
                                              "stream": stream, **GREEDY})
            assert r.status_code == 400 and r.json()["error"]["param"] == "background"
        assert len(c.app.state.server.response_store) == 0


def test_a_running_background_responses_id_is_not_taken_again(client, engine):
    """A request naming the id of a background response that still runs (``request_id`` or
    ``X-Request-Id``: a retried POST, a proxy's id) is a 400 naming ``request_id``: it does
    not take the running one's place in the store, whose run would then be out of reach (its
    cancel refused, its DELETE undone when it ends, GET showing the other's result)."""
    server = client.app.state.server
    long = dict(input="Tell me about rivers.", ignore_eos=True, temperature=0,
                max_output_tokens=480)
    first = post_ok(client, "/v1/responses", background=True, stream=False,
                    request_id="same", **long)
    assert first["id"] == "resp_same"
    for extra, headers in (({"request_id": "same", "background": True}, {}),
                           ({"background": True, "stream": True}, {"x-request-id": "same"}),
                           ({"request_id": "same"}, {})):
        r = client.post("/v1/responses", json={**long, **extra}, headers=headers)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "request_id" and "still" in err["message"]
    cancelled = client.post("/v1/responses/resp_same/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert _idle(engine, server) and server.background.running == {}
    # once it has ended, the id may be used again
    again = post_ok(client, "/v1/responses", input="hi", background=True, request_id="same",
                    **GREEDY)
    assert _poll(client, again["id"])["status"] in ("completed", "incomplete")
    assert _idle(engine, server) and server.background.running == {}


def test_deleting_a_running_background_stream_ends_its_streams_with_their_last_events(
        client, engine):
    """DELETE of a streamed background response that still runs stops it as a cancel does:
    its open streams end with its last events (the response ``cancelled``), not cut short
    with no final event, which a client cannot tell from a dropped connection."""
    openai, sdk = _sdk(client)
    server = client.app.state.server
    it, seen, rid, follower, followed = _running_stream(sdk)
    assert client.delete(f"/v1/responses/{rid}").json()["deleted"] is True
    seen += list(it)
    followed += list(follower)
    for events in (seen, followed):
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.incomplete"
        assert events[-1].response.status == "cancelled"
    assert _idle(engine, server) and server.background.running == {}
    assert client.get(f"/v1/responses/{rid}").status_code == 404


def test_finished_responses_events_are_kept_within_a_budget(client, engine, monkeypatch):
    """The store keeps finished streamed responses' events up to its budget in all
    (``response_store.EVENT_BYTES``); past it the least recently used finished ones let theirs
    go (never a running one's): the response is still retrieved, and a GET stream of it is a
    400 saying so. The latest ones still replay."""
    import asyncio

    from writescope.server.response_events import EventLog
    from writescope.server.response_store import ResponseStore

    def log(n: int, closed: bool = True) -> EventLog:
        async def make():
            e = EventLog()
            e.append("x" * n)
            if closed:
                e.close()
            return e
        return asyncio.run(make())
    store = ResponseStore(event_bytes=250)
    store.put("a", {"id": "a"}, [], events=log(100))
    store.put("b", {"id": "b"}, [], events=log(100, closed=False))  # running
    store.put("c", {"id": "c"}, [], events=log(100))
    assert store.events("a") is None and store.events_dropped("a")  # the oldest finished
    assert store.events("b") is not None and store.events("c") is not None
    assert store.get("a")[0] == {"id": "a"}
    store.put("d", {"id": "d"}, [], events=log(100))
    assert store.events("b") is not None  # running: kept over budget
    assert store.events("c") is None and store.events_dropped("c")
    store.delete("c")
    assert not store.events_dropped("c")
    server = client.app.state.server
    monkeypatch.setattr(server, "response_store", ResponseStore(event_bytes=1))
    req = dict(input="Tell me about rivers.", ignore_eos=True, temperature=0,
               max_output_tokens=6)
    first = _events(client, background=True, **req)[-1][1]["response"]["id"]
    last = _events(client, background=True, **req)
    rid = last[-1][1]["response"]["id"]
    assert _idle(engine, server)
    r = client.get(f"/v1/responses/{first}", params={"stream": "true"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "stream" and "no longer kept" in err["message"]
    assert client.get(f"/v1/responses/{first}").json()["status"] == "incomplete"
    assert _replayed(client, rid) == last  # the latest keeps its events while it is the one


def test_a_queued_background_stream_is_in_progress_from_its_first_tokens(tiny_qwen3_moe):
    """One sequence at a time: a streamed background response behind a running one stays
    queued while that one runs -- its events ``response.created`` and ``response.queued``
    only, its stored status "queued" -- and ``response.in_progress`` comes with its first
    tokens, once the other is cancelled (it was sent at once, before it ran); one cancelled
    while it waits never is in progress."""
    import time
    eng = chat_engine(tiny_qwen3_moe, TEMPLATE, **OPTS, max_num_seqs=1)
    with in_process_server(eng) as c:
        server = c.app.state.server
        first = post_ok(c, "/v1/responses", input="Tell me about rivers.", background=True,
                        ignore_eos=True, temperature=0, max_output_tokens=480)
        assert _poll(c, first["id"], until=("in_progress",))["status"] == "in_progress"
        with c.stream("POST", "/v1/responses", json=dict(
                input="Hi", background=True, stream=True, ignore_eos=True, temperature=0,
                max_output_tokens=6)) as r:
            lines = r.iter_lines()
            names = []
            for line in lines:
                if line.startswith("event: "):
                    names.append(line[7:])
                elif line.startswith("data: ") and len(names) == 2:
                    rid = json.loads(line[6:])["response"]["id"]
                    break
            assert names == ["response.created", "response.queued"]
            time.sleep(0.3)  # the first runs on; the second waits for its sequence slot
            assert first["id"] in server.background.running
            assert len(server.response_store.events(rid).events) == 2
            assert c.get(f"/v1/responses/{rid}").json()["status"] == "queued"
            # one cancelled while it waits never was in progress
            with c.stream("POST", "/v1/responses", json=dict(
                    input="Hi", background=True, stream=True, max_output_tokens=6)) as r3:
                events = r3.iter_lines()
                third = json.loads(next(ln for ln in events if ln.startswith("data: "))[6:])
                assert c.post(f"/v1/responses/{third['response']['id']}/cancel").status_code == 200
                rest = [ln[7:] for ln in events if ln.startswith("event: ")]
                assert rest[0] == "response.queued" and rest[-1] == "response.incomplete"
                assert "response.in_progress" not in rest
            assert c.post(f"/v1/responses/{first['id']}/cancel").status_code == 200
            names += [line[7:] for line in lines if line.startswith("event: ")]
        assert names[2] == "response.in_progress" and names[-1] == "response.incomplete"
        done = c.get(f"/v1/responses/{rid}").json()
        assert done["status"] == "incomplete" and done["usage"]["output_tokens"] == 6
        assert _idle(eng, server) and server.background.running == {}


def test_a_stream_that_fails_ends_with_an_error_event(client, engine, monkeypatch):
    """Whatever ends a stream early -- here a bug in writing its deltas -- is its last event,
    an ``error`` (the foreground's and a background one's; before, a background stream's
    readers saw it end with no final event, and a foreground one was cut off). The
    background response is stored ``failed`` with that error; nothing is left running."""
    from writescope.server.chat_output import ChatOutput

    def broken(self, c):
        raise RuntimeError("a bug while writing a delta")
    monkeypatch.setattr(ChatOutput, "delta", broken)
    server = client.app.state.server
    req = dict(input="Tell me about rivers.", ignore_eos=True, temperature=0,
               max_output_tokens=24)
    fg = _events(client, **req)
    assert [n for n, _ in fg] == ["response.created", "response.in_progress", "error"]
    bg = _events(client, background=True, **req)
    assert [n for n, _ in bg] == ["response.created", "response.queued",
                                  "response.in_progress", "error"]
    for events in (fg, bg):
        err = events[-1][1]
        assert err["code"] == "server_error" and "a bug while writing" in err["message"]
        assert err["sequence_number"] == len(events) - 1
    rid = bg[0][1]["response"]["id"]
    assert _idle(engine, server) and server.background.running == {}
    stored = client.get(f"/v1/responses/{rid}").json()
    assert stored["status"] == "failed" and "a bug while writing" in stored["error"]["message"]
    assert _replayed(client, rid) == bg
    # a request continuing from the failed response keeps its input as history (it had none)
    monkeypatch.undo()
    more = dict(input="More.", temperature=0, max_output_tokens=2)
    alone = post_ok(client, "/v1/responses", **more)
    after = post_ok(client, "/v1/responses", previous_response_id=rid, **more)
    assert after["usage"]["input_tokens"] > alone["usage"]["input_tokens"] + 5


def test_a_cancel_and_a_delete_at_once_both_answer(client, engine):
    """A cancel and a DELETE of one running background response at the same time (two
    clients, or one retrying): both wait for its end; the DELETE forgets it, and the cancel
    answers the cancelled response as it ended. Before, the cancel, woken after the DELETE had
    forgotten it, read the store's None: a 500 and a traceback (the soak test,
    bench/soak_server.py, found it)."""
    import asyncio

    import httpx
    server = client.app.state.server
    bg = post_ok(client, "/v1/responses", input="Tell me about rivers.", background=True,
                 ignore_eos=True, temperature=0, max_output_tokens=480)
    rid = bg["id"]

    async def at_once():  # on the app's event loop, as two clients' requests
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await asyncio.gather(c.delete(f"/v1/responses/{rid}"),
                                        c.post(f"/v1/responses/{rid}/cancel"))
    deleted, cancelled = client.portal.call(at_once)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert body["id"] == rid and body["status"] == "cancelled"
    assert body["usage"]["output_tokens"] < 480
    assert _idle(engine, server) and server.background.running == {}
    assert client.get(f"/v1/responses/{rid}").status_code == 404


def test_a_running_background_response_stays_in_a_full_store(client, engine, monkeypatch):
    """The store keeps the most recently used responses, but never lets a running background
    response go: it would be out of reach while it runs (its GET and its cancel a 404, its
    generation going on unstoppable), then back when it ends. A streamed one (whose run does
    not touch its stored response once in progress) was let go by newer responses; they push
    out the least recently used finished ones instead."""
    from writescope.server.response_store import ResponseStore
    server = client.app.state.server
    monkeypatch.setattr(server, "response_store", ResponseStore(capacity=2))
    with client.stream("POST", "/v1/responses", json=dict(
            input="Tell me about rivers.", background=True, stream=True, ignore_eos=True,
            temperature=0, max_output_tokens=480)) as r:
        for line in r.iter_lines():  # up to its first text; the reader leaves, it runs on
            if line.startswith("data: ") and '"sequence_number": 0' in line:
                rid = json.loads(line[6:])["response"]["id"]
            if line == "event: response.output_text.delta":
                break
    done = [post_ok(client, "/v1/responses", input="hi", **GREEDY)["id"] for _ in range(3)]
    got = client.get(f"/v1/responses/{rid}")
    assert got.status_code == 200 and got.json()["status"] == "in_progress", got.text
    assert client.get(f"/v1/responses/{done[-1]}").status_code == 200
    assert client.get(f"/v1/responses/{done[0]}").status_code == 404
    r = client.post(f"/v1/responses/{rid}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert _idle(engine, server) and server.background.running == {}
    # ended, it is a finished response like the others: newer ones push it out
    post_ok(client, "/v1/responses", input="hi", **GREEDY)
    post_ok(client, "/v1/responses", input="hi", **GREEDY)
    assert client.get(f"/v1/responses/{rid}").status_code == 404


def test_a_foreground_response_does_not_take_a_running_background_ones_place(client, engine):
    """A background response that reuses the id of a foreground one still running
    (``request_id``: a client retrying in the background) keeps its place in the store: the
    foreground one, ending first, is answered but not stored over it, which would leave the
    background one out of reach while it runs (GET showing the other, its cancel a 400 "not a
    background response"), as ``id_taken`` keeps it the other way round."""
    server = client.app.state.server
    with client.stream("POST", "/v1/responses", json=dict(
            input="Tell me about rivers.", stream=True, request_id="both", ignore_eos=True,
            temperature=0, max_output_tokens=60)) as fg:
        lines = fg.iter_lines()
        assert next(lines) == "event: response.created"
        bg = post_ok(client, "/v1/responses", input="Tell me about rivers.", background=True,
                     request_id="both", ignore_eos=True, temperature=0, max_output_tokens=480)
        events = [ln[7:] for ln in lines if ln.startswith("event: ")]
    assert bg["id"] == "resp_both" and events[-1] == "response.incomplete"
    assert "resp_both" in server.background.running  # the foreground one ended first
    got = client.get("/v1/responses/resp_both").json()
    assert got["background"] is True and got["status"] in ("queued", "in_progress")
    r = client.post("/v1/responses/resp_both/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert _idle(engine, server) and server.background.running == {}
