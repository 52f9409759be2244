"""QA regressions for tool calling on /v1/chat/completions (server/tools.py, tool_parsers.py,
chat_output.py, conversation.py): each test failed before its fix.

- ``parallel_tool_calls: false`` with ``tool_choice: "auto"``: at most one call (OpenAI's
  meaning; vLLM keeps the first), whole and streamed;
- a Hermes call whose string argument holds ``</tool_call>``: one call, as its stream says;
- an earlier turn's call without arguments (``""``, ``"null"``): an empty object in the
  template (vLLM's), not a broken ``"arguments": }`` prompt;
- the ``mistral`` parser's call ids: 9 letters or digits (Mistral's templates refuse others
  when the call comes back), as vLLM's ``MistralToolCall``.
- an earlier assistant turn's ``reasoning_content`` (or ``reasoning``) reaches the template
  (Qwen3's renders the thinking between tool calls), as vLLM passes it.
- ``tool_choice: "required"`` with parameters that hold ``$defs`` (Pydantic's schemas): the
  definitions moved to the array schema's root, as vLLM does, not a 400.
"""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")

from writescope.server import conversation, reasoning, tool_parsers, tools  # noqa: E402
from writescope.server import protocol as P  # noqa: E402
from writescope.server.chat_output import ChatOutput  # noqa: E402

from conftest import post_ok  # noqa: E402

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "days": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n'
             '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n'
             '</tool_call>')


def _req(**body) -> P.ChatCompletionRequest:
    return P.parse_request(P.ChatCompletionRequest, json.dumps(
        {"messages": MESSAGES, "tools": TOOLS, **body}).encode())


def _message_and_stream(text: str, parser: str = "hermes", finish: str = "stop",
                        rparser: str | None = None, **body):
    """(message, finish reason) of ``text``, and what a stream of it a character at a time
    sends: (content, reasoning, {index: [ids, name, arguments]}, finish reason)."""
    req = _req(**body)
    choice = body.get("tool_choice", "auto")
    mode = "auto" if choice == "auto" else "forced"
    tp = tool_parsers.get(parser)

    def output():  # (a forced call's ids are the server's parser's: api._chat_output)
        if mode == "auto":
            return ChatOutput(req, mode, reasoning.get(rparser), tool_parser=tp)
        return ChatOutput(req, mode, reasoning.get(rparser), new_call_id=tp.new_call_id)
    msg, reason = output().message(SimpleNamespace(index=0, text=text, finish_reason=finish))
    out = output()
    content, thought, calls, r = "", "", {}, None
    for k in range(1, len(text) + 1):
        last = k == len(text)
        d, r = out.delta(SimpleNamespace(index=0, text=text[:k], sent_text=k, finished=last,
                                         finish_reason=finish if last else None))
        if d is None:
            continue
        content += d.content or ""
        thought += d.reasoning_content or ""
        for t in d.tool_calls or []:
            call = calls.setdefault(t.index, [[], "", ""])
            if t.id:
                call[0].append(t.id)
            call[1] += t.function.name or ""
            call[2] += t.function.arguments or ""
    return (msg, reason), (content, thought, calls, r)


# -- parallel_tool_calls: false with 'auto' ------------------------------------------------------
@pytest.mark.parametrize("rparser", [None, "qwen3"])
def test_parallel_tool_calls_false_keeps_the_first_auto_call(rparser):
    """The model wrote two calls; ``parallel_tool_calls: false`` returns the first alone, in the
    message and in its stream (before: both, streamed with index 1 too)."""
    text = ("<think>two</think>\n" if rparser else "") + TWO_CALLS
    (msg, reason), (content, _, calls, r) = _message_and_stream(
        text, rparser=rparser, parallel_tool_calls=False)
    assert [(t.function.name, t.function.arguments) for t in msg.tool_calls] == [
        ("get_weather", '{"city": "Rome", "days": 2}')] and reason == "tool_calls"
    assert list(calls) == [0] and calls[0][1:] == ["get_weather", '{"city": "Rome", "days": 2}']
    assert r == "tool_calls" and content == ""
    # parallel calls allowed (the default, or true): both
    for flag in ({}, {"parallel_tool_calls": True}):
        (msg, _), (_, _, calls, _) = _message_and_stream(text, rparser=rparser, **flag)
        assert len(msg.tool_calls) == 2 and sorted(calls) == [0, 1]


@pytest.fixture(scope="module")
def engine(tiny_qwen3_moe):
    from writescope.engine.engine import LLMEngine
    return LLMEngine(str(tiny_qwen3_moe), dtype="float32", device="cpu", max_model_len=1024)


def _sse(client, body) -> list[dict]:
    chunks = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_parallel_tool_calls_false_through_the_server(engine):
    """Through the server (the model's text forced by a regex): one call, whole and streamed."""
    body = dict(messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=400,
                guided_regex=re.escape(TWO_CALLS), parallel_tool_calls=False)
    from starlette.testclient import TestClient

    from writescope.server.api import create_app
    with TestClient(create_app(engine, tool_call_parser="hermes")) as c:
        r = post_ok(c, "/v1/chat/completions", **body)["choices"][0]
        assert r["finish_reason"] == "tool_calls"
        assert [t["function"]["name"] for t in r["message"]["tool_calls"]] == ["get_weather"]
        chunks = _sse(c, body)
        streamed = [t for ch in chunks for t in ch["choices"][0]["delta"].get("tool_calls", [])]
        assert {t["index"] for t in streamed} == {0}
        assert "".join(t["function"].get("arguments", "") for t in streamed) == \
            '{"city": "Rome", "days": 2}'
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_parallel_tool_calls_false_on_the_responses_endpoint(engine):
    """/v1/responses passes ``parallel_tool_calls`` on to the chat machinery: one
    ``function_call`` item (before: both calls, the field only echoed)."""
    from starlette.testclient import TestClient

    from writescope.server.api import create_app
    tools = [dict(type="function", **t["function"]) for t in TOOLS]
    body = dict(input="Weather in Paris?", tools=tools, temperature=0, max_output_tokens=400,
                structured_outputs={"regex": re.escape(TWO_CALLS)})
    with TestClient(create_app(engine, tool_call_parser="hermes")) as c:
        both = post_ok(c, "/v1/responses", **body)["output"]
        one = post_ok(c, "/v1/responses", parallel_tool_calls=False, **body)["output"]
    calls = [[o["name"] for o in out if o["type"] == "function_call"] for out in (both, one)]
    assert calls == [["get_weather", "get_time"], ["get_weather"]]


# -- a string argument holding </tool_call> ------------------------------------------------------
def test_hermes_string_argument_holding_the_closing_tag_is_one_call():
    """``{"city": "a</tool_call>b"}``: valid JSON, one call, in the message as in its stream
    (before: the message cut the block at the tag inside the string, found no JSON and returned
    all of it as content with finish reason "stop", after the stream had sent the call)."""
    args = '{"city": "a</tool_call>b", "days": 1}'
    text = (f'Sure.<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>')
    content, calls = tools.parse_hermes(text)
    assert content == "Sure." and [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", args), ("get_time", '{"zone": "UTC"}')]
    (msg, reason), (s_content, _, s_calls, r) = _message_and_stream(text)
    assert reason == r == "tool_calls" and msg.content == s_content == "Sure."
    assert [(c[1], c[2]) for c in s_calls.values()] == [
        (t.function.name, t.function.arguments) for t in msg.tool_calls]
    # the earlier forms still parse as before: an unclosed last block, a block that is not JSON
    assert [c.function.name for c in tools.parse_hermes(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", '
        '"arguments": {"x": "</tool_call>"}}')[1]] == ["a", "b"]
    bad = 'x<tool_call>{"name": oops}</tool_call>'
    assert tools.parse_hermes(bad) == (bad, [])


# -- an earlier call without arguments -------------------------------------------------------
@pytest.mark.parametrize("arguments", ["", "null", " "])
def test_an_earlier_call_without_arguments_is_an_empty_object(arguments):
    """An assistant turn's call whose arguments are ``""`` (clients that join streamed deltas
    of a call without arguments send it) or ``null``: ``{}`` for the template, as vLLM gives
    it (before: the text itself, which a Qwen/Hermes template writes as ``"arguments": }``)."""
    req = P.parse_request(P.ChatCompletionRequest, json.dumps({"messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_time", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]}).encode())
    (call,) = conversation.template_messages(req)[1]["tool_calls"]
    assert call["function"]["arguments"] == {}
    # arguments that are JSON stay their value; text that is not JSON stays text
    for given, want in (('{"zone": "UTC"}', {"zone": "UTC"}), ("[1]", [1]), ("oops", "oops")):
        req.messages[1].tool_calls[0].function.arguments = given
        assert conversation.template_messages(req)[1]["tool_calls"][0]["function"][
            "arguments"] == want


def test_an_earlier_calls_arguments_may_be_an_object():
    """vLLM takes an earlier turn's call arguments as an object too (OpenAI sends JSON text):
    the template gets the object (before: a 400, "Input should be a valid string")."""
    req = P.parse_request(P.ChatCompletionRequest, json.dumps({"messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]}).encode())
    (call,) = conversation.template_messages(req)[1]["tool_calls"]
    assert call["function"]["arguments"] == {"zone": "UTC"}
    with pytest.raises(Exception, match="arguments"):  # neither text nor an object
        P.parse_request(P.ChatCompletionRequest, json.dumps({"messages": [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "f", "arguments": [1]}}]}]}).encode())


# -- Mistral's call ids ----------------------------------------------------------------------------
def _mistral_id(i: str) -> bool:
    return len(i) == 9 and i.isascii() and i.isalnum()


def test_mistral_call_ids_are_nine_alphanumerics():
    """The ``mistral`` parser's calls get ids of 9 letters or digits, whole and streamed
    (before: ``chatcmpl-tool-<32 hex>``, which Mistral's chat templates refuse when the call
    comes back in the next request: "Tool call IDs should be alphanumeric strings with length
    9!"). Other parsers keep OpenAI-style ids."""
    text = ('[TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": "UTC"}}, '
            '{"name": "get_weather", "arguments": {"city": "é"}}]')
    (msg, reason), (_, _, calls, r) = _message_and_stream(text, "mistral")
    assert reason == r == "tool_calls" and len(msg.tool_calls) == 2
    assert all(_mistral_id(t.id) for t in msg.tool_calls)
    assert len({t.id for t in msg.tool_calls}) == 2
    assert all(len(c[0]) == 1 and _mistral_id(c[0][0]) for c in calls.values())
    # cut short by max_tokens: the call begun, its id Mistral's too
    (msg, _), _ = _message_and_stream(text[:55], "mistral", finish="length")
    assert [t.function.name for t in msg.tool_calls] == ["get_time"]
    assert _mistral_id(msg.tool_calls[0].id)
    # a forced call on a server whose parser is mistral ('required' and a named function)
    for choice, out in (("required", '[{"name": "get_time", "parameters": {"zone": "UTC"}}]'),
                        ({"type": "function", "function": {"name": "get_time"}},
                         '{"zone": "UTC"}')):
        (msg, _), (_, _, calls, _) = _message_and_stream(out, "mistral", tool_choice=choice)
        assert msg.tool_calls and all(_mistral_id(t.id) for t in msg.tool_calls)
        assert all(_mistral_id(c[0][0]) for c in calls.values())
    (msg, _), _ = _message_and_stream(TWO_CALLS, "hermes")
    assert all(t.id.startswith("chatcmpl-tool-") for t in msg.tool_calls)


# -- an earlier turn's thinking --------------------------------------------------------------------
# renders an assistant turn's thinking as Qwen3's template does (``message.reasoning_content``)
THINKING_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and m.reasoning_content is string -%}"
    "<think>{{ m.reasoning_content }}</think>{%- endif -%}{{ m.content }}"
    "{%- for c in m.tool_calls or [] -%}<tool_call>{{ c.function.name }}</tool_call>"
    "{%- endfor -%}<|im_end|>\n{%- endfor -%}<|im_start|>assistant\n")


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_an_earlier_turns_thinking_reaches_the_template(engine, field):
    """An assistant turn sent back with the thinking this server returned (``reasoning_content``,
    or vLLM's newer ``reasoning``) -- a thinking model's tool loop: Qwen3's template renders
    the thinking of the turns after the last user message. Before: the field was dropped as an
    unknown one, and the template rendered the turn without it (vLLM passes it)."""
    req = P.parse_request(P.ChatCompletionRequest, json.dumps({"messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, field: "Ask the clock.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"}], "tools": TOOLS}).encode())
    msgs = conversation.template_messages(req)
    assert msgs[1]["reasoning_content"] == msgs[1]["reasoning"] == "Ask the clock."
    assert "reasoning_content" not in msgs[0] and "reasoning_content" not in msgs[2]
    text = engine.tokenizer.render_chat(msgs, chat_template=THINKING_TEMPLATE)
    assert "<|im_start|>assistant<think>Ask the clock.</think><tool_call>get_time" in text


# -- 'required' with tools whose parameters hold $defs ---------------------------------------------
LOC = {"type": "object", "additionalProperties": False, "required": ["city"],
       "properties": {"city": {"enum": ["Rome", "Oslo"]}}}
WHERE = {"type": "object", "additionalProperties": False, "required": ["loc"],
         "properties": {"loc": {"$ref": "#/$defs/Loc"}}, "$defs": {"Loc": LOC}}
DEF_TOOLS = [{"type": "function", "function": {"name": "where", "parameters": WHERE}},
             {"type": "function", "function": {"name": "near", "parameters": {
                 "type": "object", "additionalProperties": False, "required": ["a"],
                 "properties": {"a": {"$ref": "#/$defs/Loc"}}, "$defs": {"Loc": LOC}}}}]


def test_required_with_parameters_that_reference_their_defs(engine):
    """Parameters with ``$defs`` and ``#/$defs/...`` references (what Pydantic writes, e.g.
    the OpenAI SDK's ``pydantic_function_tool``): with ``tool_choice: "required"`` the calls
    come back valid (before: a 400, "Pointer '/$defs/Loc' does not exist": the parameters sat
    inside the array's schema, their references resolved against its root; vLLM moves the
    definitions there). Two tools that define one name differently: a 400 naming it."""
    jsonschema = pytest.importorskip("jsonschema")
    from starlette.testclient import TestClient

    from writescope.server.api import create_app
    body = dict(messages=MESSAGES, tools=DEF_TOOLS, tool_choice="required", temperature=0,
                max_tokens=300)
    with TestClient(create_app(engine)) as c:
        r = post_ok(c, "/v1/chat/completions", **body)["choices"][0]
        assert r["finish_reason"] == "tool_calls" and r["message"]["tool_calls"]
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in DEF_TOOLS}
        for call in r["message"]["tool_calls"]:
            jsonschema.validate(json.loads(call["function"]["arguments"]),
                                schemas[call["function"]["name"]])
        other = json.loads(json.dumps(DEF_TOOLS))
        other[1]["function"]["parameters"]["$defs"]["Loc"] = {"type": "string"}
        r = c.post("/v1/chat/completions", json={**body, "tools": other})
        assert r.status_code == 400 and "'Loc'" in r.json()["error"]["message"], r.text
    req = _req(tool_choice="required")
    req.tools = [P.ChatTool.model_validate(t) for t in DEF_TOOLS]
    schema = tools.constraint(req).json
    assert schema["$defs"] == {"Loc": LOC} and "$defs" in req.tools[0].function.parameters
