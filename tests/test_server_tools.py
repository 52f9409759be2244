"""Tool calls on /v1/chat/completions (server/tools.py), in process against a tiny checkpoint:
tools reach the chat template; a named function and 'required' constrain the output to the
tools' schemas and come back as tool_calls (streamed and not); with the hermes parser 'auto'
reads <tool_call> blocks out of the text; without it 'auto' is a 400; earlier turns' calls and
the tools' answers reach the template."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from writescope.server import conversation, tools  # noqa: E402

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
# renders the tools, and earlier calls and answers, so that tests can see them in the prompt
TEMPLATE = ("{%- if tools %}TOOLS {{ tools | tojson }}\n{% endif -%}"
            "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}"
            "{%- for c in m.tool_calls or [] -%}CALL {{ c.function.name }} "
            "{{ c.function.arguments | tojson }}{%- endfor -%}"
            "{%- if m.tool_call_id %} ANSWERS {{ m.tool_call_id }}{% endif -%}"
            "<|im_end|>\n{%- endfor -%}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(tiny_qwen3_moe):
    from writescope.engine.engine import LLMEngine
    eng = LLMEngine(str(tiny_qwen3_moe), dtype="float32", device="cpu", max_model_len=1024)
    eng.tokenizer.hf.chat_template = TEMPLATE
    return eng


def _client(engine, parser=None):
    from starlette.testclient import TestClient
    from writescope.server.api import create_app
    return TestClient(create_app(engine, tool_call_parser=parser))


@pytest.fixture(scope="module")
def client(engine):
    with _client(engine, "hermes") as c:
        yield c


def _chat(client, **body):
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "temperature": 0,
                                                  "max_tokens": 200, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _stream(client, **body) -> list[dict]:
    chunks = []
    with client.stream("POST", "/v1/chat/completions", json={
            "messages": MESSAGES, "temperature": 0, "max_tokens": 200, "stream": True,
            **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_tools_reach_the_template_unless_tool_choice_is_none(client, engine):
    plain = _chat(client, max_tokens=1)["usage"]["prompt_tokens"]
    with_tools = _chat(client, max_tokens=1, tools=TOOLS, tool_choice="required")
    assert with_tools["usage"]["prompt_tokens"] > plain + 20
    none = _chat(client, max_tokens=1, tools=TOOLS, tool_choice="none")
    assert none["usage"]["prompt_tokens"] == plain


def test_named_function_returns_one_call_with_valid_arguments(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = _chat(client, tools=TOOLS, tool_choice=choice)["choices"][0]
    assert r["finish_reason"] == "stop" and r["message"]["content"] is None
    (call,) = r["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    # streamed: the call's id and name once, then its arguments piece by piece
    deltas = [c["choices"][0]["delta"] for c in _stream(client, tools=TOOLS, tool_choice=choice)]
    parts = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert len(parts) > 1 and parts[0]["function"]["name"] == "get_weather" and parts[0]["id"]
    assert all("id" not in p and "name" not in p["function"] for p in parts[1:])
    assert "".join(p["function"]["arguments"] for p in parts) == call["function"]["arguments"]


def test_required_lists_calls_of_the_tools(client):
    r = _chat(client, tools=TOOLS, tool_choice="required")["choices"][0]
    assert r["finish_reason"] == "tool_calls", r
    calls = r["message"]["tool_calls"]
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            SCHEMAS[call["function"]["name"]])
    # streamed: each call's id and name once, then its arguments piece by piece
    chunks = _stream(client, tools=TOOLS, tool_choice="required")
    streamed = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls", [])]
    joined: dict[int, list] = {}
    for t in streamed:
        if t["index"] not in joined:
            assert t["id"] and t["function"]["name"]
            joined[t["index"]] = [t["function"]["name"], ""]
        else:
            assert "id" not in t and "name" not in t["function"]
        joined[t["index"]][1] += t["function"]["arguments"]
    assert len(streamed) > len(joined)  # the arguments came in pieces
    assert [tuple(joined[k]) for k in sorted(joined)] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    one = _chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert len(one["choices"][0]["message"]["tool_calls"]) == 1
    from writescope.server import protocol as P
    req = P.parse_request(P.ChatCompletionRequest, json.dumps(
        {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
         "parallel_tool_calls": False}).encode())
    assert tools.constraint(req).json["maxItems"] == 1  # the array cannot hold a second call


FORCED = ('Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", '
          '"days": 2}}\n</tool_call>')


def test_auto_with_the_hermes_parser(client):
    """The model's text (forced here by a regex, the tiny model would not write it) holds a
    <tool_call> block: content before it, the call parsed out, finish reason tool_calls."""
    import re
    body = dict(tools=TOOLS, guided_regex=re.escape(FORCED))
    r = _chat(client, **body)["choices"][0]
    assert r["finish_reason"] == "tool_calls" and r["message"]["content"] == "Let me look."
    (call,) = r["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather",
                                "arguments": '{"city": "Rome", "days": 2}'}
    chunks = _stream(client, **body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
    assert not any("<tool" in (d.get("content") or "") for d in deltas)
    streamed = [t for d in deltas for t in d.get("tool_calls", [])]
    # the call's id and name once, then its arguments piece by piece as the model writes them
    assert [t["function"].get("name") for t in streamed] == ["get_weather"] + [None] * (
        len(streamed) - 1) and len(streamed) > 3
    assert {t["index"] for t in streamed} == {0} and "id" in streamed[0]
    assert "".join(t["function"]["arguments"] for t in streamed) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # text without a block is plain content
    r = _chat(client, tools=TOOLS, guided_regex="No tools needed\\.")["choices"][0]
    assert r["message"] == {"role": "assistant", "content": "No tools needed.", "refusal": None,
                            "tool_calls": [], "reasoning_content": None} and r["finish_reason"] == "stop"


OTHER_FORMATS = {
    "qwen3_coder": ("Let me look.<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
                    "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
                    "Let me look."),
    "mistral": ('Let me look.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", '
                '"days": 2}}]', "Let me look."),
}


@pytest.mark.parametrize("name", sorted(OTHER_FORMATS))
def test_auto_with_the_other_parsers(engine, name):
    """``--tool-call-parser qwen3_coder`` and ``mistral``: the same call read out of each
    format (forced by a regex), whole and streamed; the parameters' texts typed by the
    tool's schema (qwen3_coder)."""
    import re
    text, content = OTHER_FORMATS[name]
    with _client(engine, name) as c:
        body = dict(tools=TOOLS, guided_regex=re.escape(text))
        r = _chat(c, **body)["choices"][0]
        assert r["finish_reason"] == "tool_calls" and r["message"]["content"] == content
        (call,) = r["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Rome", "days": 2}
        deltas = [ch["choices"][0]["delta"] for ch in _stream(c, **body)]
        assert "".join(d.get("content") or "" for d in deltas) == content
        streamed = [t for d in deltas for t in d.get("tool_calls", [])]
        assert streamed[0]["function"]["name"] == "get_weather"
        assert "".join(t["function"]["arguments"] for t in streamed) == \
            call["function"]["arguments"]


def test_auto_without_a_parser_and_bad_tool_requests_are_400(engine):
    with _client(engine) as c:
        for body, needle in (
                (dict(tools=TOOLS), "tool-call parser"),
                (dict(tools=TOOLS, tool_choice="auto"), "tool-call parser"),
                (dict(tools=TOOLS, tool_choice={"type": "function",
                                                "function": {"name": "nope"}}), "not among"),
                (dict(tool_choice="required"), "needs tools"),
                (dict(tools=TOOLS + TOOLS[:1]), "distinct"),
                (dict(tools=TOOLS, tool_choice="required",
                      response_format={"type": "json_object"}), "cannot be combined")):
            r = c.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
            assert r.status_code == 400 and needle in r.json()["error"]["message"], (body, r.text)
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS,
                                                 "tool_choice": "none", "max_tokens": 2})
        assert r.status_code == 200  # 'none' needs no parser


def test_earlier_calls_and_answers_reach_the_template(engine):
    from writescope.server import protocol as P
    req = P.parse_request(P.ChatCompletionRequest, json.dumps({"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "snow"}], "tools": TOOLS}).encode())
    text = engine.tokenizer.render_chat(conversation.template_messages(req),
                                        tools=conversation.template_tools(req))
    assert text.startswith("TOOLS [")
    assert 'CALL get_weather {"city": "Oslo", "days": 1}' in text  # arguments as an object
    assert "snow ANSWERS c1" in text


def test_hermes_parsing_edge_cases():
    assert tools.parse_hermes("plain") == ("plain", [])
    content, calls = tools.parse_hermes('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
                                        '<tool_call>{"name": "b", "arguments": "{}"}')
    assert content is None and [c.function.name for c in calls] == ["a", "b"]
    assert [c.function.arguments for c in calls] == ["{}", "{}"]
    bad = 'x<tool_call>{"name": oops}</tool_call>'
    assert tools.parse_hermes(bad) == (bad, [])  # not JSON: all of it is content
    from writescope.server.tool_parsers import Hermes
    assert Hermes().content_end("abc<tool", False) == 3
    assert Hermes().content_end("abc<tool", True) == 8
    assert Hermes().content_end("ab<tool_call>{", False) == 2


def test_hermes_calls_stream_as_the_text_grows():
    """Every prefix of a two-call text: names never change, arguments only grow, and the last
    prefix gives the calls parse_hermes returns (arguments as written, spacing kept); the
    incremental reader agrees with a fresh one on every prefix."""
    text = ('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro}m\\"e", '
            '"days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
            '{"zone":"UTC"}}\n</tool_call>')
    prev: list = []
    stream = tools.HermesCallStream()  # reads each added piece once: the same answers
    for k in range(len(text) + 1):
        now = tools.hermes_partial_calls(text[:k])
        assert stream.update(text[:k]) == now
        assert len(now) >= len(prev)
        for (n0, a0, _), (n1, a1, _) in zip(prev, now):
            assert n0 == n1 and a1.startswith(a0)
        prev = now
    _, calls = tools.parse_hermes(text)
    assert [(n, a) for n, a, done in prev if done] == [
        (c.function.name, c.function.arguments) for c in calls]
    assert calls[1].function.arguments == '{"zone":"UTC"}'
    assert tools.json_value_end("12}", 0) == 2 and tools.json_value_end('"a\\"b" x', 0) == 6
    assert tools.json_value_end('{"a": [1, {"b": "}"}]', 0) is None
    # another key order: not streamed piece by piece (the calls come when the output ends)
    assert tools.hermes_partial_calls('<tool_call>{"arguments": {}, "name": "a"}') == []


REQUIRED = ('[{"name": "get_weather", "parameters": {"city": "Ro}m\\"e", "days": [1, 2]}},\n'
            ' {"parameters": {"zone":"UTC"} , "name":"get_time"},{"name": "get_time", '
            '"parameters": {}, "note": [0, "]"]}]')


def test_required_calls_stream_as_the_text_grows():
    """A 'required' array: on every prefix the incremental reader agrees with a fresh one,
    names never change, arguments only grow (spacing kept); a call whose parameters come
    before its name is listed whole; the last prefix gives what forced_calls returns."""
    prev: list = []
    stream = tools.RequiredCallStream()
    for k in range(len(REQUIRED) + 1):
        now = tools.RequiredCallStream().update(REQUIRED[:k])
        assert stream.update(REQUIRED[:k]) == now
        assert len(now) >= len(prev)
        for (n0, a0, _), (n1, a1, _) in zip(prev, now):
            assert n0 == n1 and a1.startswith(a0)
        if k < REQUIRED.index('"name":"get_time"') + 17:
            assert len(now) <= 1  # the second call waits for its name
        prev = now
    assert [(n, a) for n, a, done in prev if done] == [
        ("get_weather", '{"city": "Ro}m\\"e", "days": [1, 2]}'), ("get_time", '{"zone":"UTC"}'),
        ("get_time", "{}")]
    from writescope.server import protocol as P
    req = P.parse_request(P.ChatCompletionRequest, json.dumps(
        {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}).encode())
    calls = tools.forced_calls(req, REQUIRED)
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (n, a) for n, a, _ in prev]
    assert tools.forced_calls(req, REQUIRED[:-1]) is None  # cut short: content
    # not an array of objects: nothing is listed
    assert tools.RequiredCallStream().update('{"name": "a", "parameters": {}}') == []
    assert tools.RequiredCallStream().update('[1, {"name": "a", "parameters": {}}]') == []


CUT = {"required": ('[{"name": "get_weather", "parameters": {"city": "Ro', "required"),
       "hermes": ('Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro',
                  "auto")}


@pytest.mark.parametrize("form,finish", [("required", "length"), ("required", "stop"),
                                         ("hermes", "length"), ("hermes", "abort")])
def test_a_call_cut_short_streams_as_its_whole_message_says(form, finish):
    """An output that ends inside a call (``max_tokens``; with 'required' a stop string): the
    whole message holds the call as far as it was written (OpenAI's, cut), and its stream --
    the same text as it grew -- says the same: the content before the call, the call once,
    never the call's text again as content."""
    from types import SimpleNamespace

    from writescope.server import protocol as P
    from writescope.server.chat_output import ChatOutput
    from writescope.server import tool_parsers
    text, choice = CUT[form]
    req = P.parse_request(P.ChatCompletionRequest, json.dumps(
        {"messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}).encode())
    mode = "auto" if choice == "auto" else "forced"
    parser = tool_parsers.get("hermes") if mode == "auto" else None
    msg, reason = ChatOutput(req, mode, tool_parser=parser).message(
        SimpleNamespace(index=0, text=text, finish_reason=finish))
    assert reason == finish
    assert [(t.function.name, t.function.arguments) for t in msg.tool_calls] == [
        ("get_weather", '{"city": "Ro')]
    assert msg.content == ("Let me look." if mode == "auto" else None)
    out = ChatOutput(req, mode, tool_parser=parser)
    content, args, names = "", {}, []
    for k in range(1, len(text) + 1):
        last = k == len(text)
        d, r = out.delta(SimpleNamespace(index=0, text=text[:k], sent_text=k, finished=last,
                                         finish_reason=finish if last else None))
        if d is None:
            continue
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.function.name:
                names.append(t.function.name)
            args[t.index] = args.get(t.index, "") + (t.function.arguments or "")
    assert r == finish and names == ["get_weather"] and args == {0: '{"city": "Ro'}
    assert content == (msg.content or "")


def _message_and_stream(text: str, parser: str, finish: str = "stop", choice: str = "auto"):
    """A ChatOutput's (message, finish reason) for ``text``, and what its stream of the same
    text, a character at a time, sends: (content, {call index: (name, arguments)}, finish
    reason)."""
    from types import SimpleNamespace

    from writescope.server import protocol as P
    from writescope.server.chat_output import ChatOutput
    from writescope.server import tool_parsers
    req = P.parse_request(P.ChatCompletionRequest, json.dumps(
        {"messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}).encode())
    tp = tool_parsers.get(parser)
    msg, reason = ChatOutput(req, "auto", tool_parser=tp).message(
        SimpleNamespace(index=0, text=text, finish_reason=finish))
    out = ChatOutput(req, "auto", tool_parser=tp)
    content, calls, r = "", {}, None
    for k in range(1, len(text) + 1):
        last = k == len(text)
        d, r = out.delta(SimpleNamespace(index=0, text=text[:k], sent_text=k, finished=last,
                                         finish_reason=finish if last else None))
        content += (d.content or "") if d else ""
        for t in (d.tool_calls or []) if d else []:
            name, args = calls.get(t.index, ("", ""))
            calls[t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
    return (msg, reason), (content, calls, r)


INVALID = {"hermes": 'Here.<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}'
                     '\n</tool_call>',
           "mistral": 'Here.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": Paris}}]'}


@pytest.mark.parametrize("parser", sorted(INVALID))
def test_auto_call_that_is_not_json_is_content_when_the_output_ended_by_itself(parser):
    """'auto', the model ended (finish reason "stop") after a call block whose JSON does not
    parse: no tool call, the whole text is the content, as vLLM's parsers return it. The
    stream ends the same way: its content is the message's (what it already sent as the
    call's deltas cannot be taken back), its finish reason "stop". Cut short by max_tokens,
    the same text stays a call (the test above)."""
    text = INVALID[parser]
    (msg, reason), (content, calls, r) = _message_and_stream(text, parser)
    assert msg.tool_calls == [] and msg.content == text and reason == r == "stop"
    assert content == text
    (msg, reason), _ = _message_and_stream(text, parser, finish="length")
    assert [t.function.name for t in msg.tool_calls] == ["get_weather"] and reason == "length"


def test_mistral_arguments_written_as_a_string_stream_as_returned():
    """``"arguments": "{\\"a\\": 1}"`` (a JSON string holding the object): the message's
    arguments are the string's text, and the stream sends the same, not the literal."""
    text = '[TOOL_CALLS] [{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}]'
    (msg, reason), (content, calls, r) = _message_and_stream(text, "mistral")
    assert [(t.function.name, t.function.arguments) for t in msg.tool_calls] == [
        ("get_time", '{"zone": "UTC"}')] and reason == r == "tool_calls"
    assert calls == {0: ("get_time", '{"zone": "UTC"}')} and content == ""


def test_serve_knows_the_parsers_the_server_has():
    from writescope.commands.serve import TOOL_PARSERS
    from writescope.server import tool_parsers
    assert TOOL_PARSERS == tuple(tool_parsers.PARSERS)
