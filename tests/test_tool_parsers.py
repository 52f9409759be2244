"""The tool-call parsers of ``tool_choice: "auto"`` (server/tool_parsers.py): each reads its
format whole and as the text grows, and the two agree -- names once written, arguments that
only grow and end as the whole parse's, content up to the calls."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("pydantic")

from writescope.server import protocol as P  # noqa: E402
from writescope.server import tool_parsers as tp  # noqa: E402

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "ratio": {"type": "number"}, "tags": {"type": "array"}, "where": {"type": ["object", "null"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


def _req(**kw) -> P.ChatCompletionRequest:
    return P.ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                   tools=TOOLS, **kw)


def _grown(parser: tp.ToolParser, text: str, step: int = 1) -> list[tuple[str, str, bool]]:
    """Streams ``text`` ``step`` characters at a time; checks that names stay and arguments
    only grow; the last answer."""
    stream, last = parser.stream(_req()), []
    for n in list(range(0, len(text), step)) + [len(text)]:
        now = stream.update(text[:n])
        assert len(now) >= len(last)
        for (n0, a0, d0), (n1, a1, d1) in zip(last, now):
            assert n0 == n1 and a1.startswith(a0) and (d1 or not d0)
        last = now
    return last


def _agree(parser: tp.ToolParser, text: str, step: int = 1) -> tuple[str | None, list]:
    content, calls = parser.parse(text, _req())
    streamed = _grown(parser, text, step)
    got = [(c.function.name, c.function.arguments) for c in calls]
    # the stream's last answer: every call whole (the finished message adds what it lacks)
    assert [(n, a) for n, a, _ in streamed] == [(n, a[:len(s)]) for (n, a), (_, s, _) in
                                                 zip(got, streamed)]
    for (n, a), (_, s, done) in zip(got, streamed):
        assert a.startswith(s) and (a == s or not done)
    for c in calls:
        json.loads(c.function.arguments)
    return content, got


def test_qwen3_coder_reads_parameters_by_their_types():
    text = ("Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
            "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n"
            "</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n[\"a\", 1]\n"
            "</parameter>\n<parameter=where>\nnull\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_time>\n<parameter=zone>\n42\n</parameter>\n</function>\n"
            "</tool_call>")
    content, calls = _agree(tp.Qwen3Coder(), text)
    assert content == "Let me check.\n"
    assert calls == [("get_weather", json.dumps({"city": "New York", "days": 3, "metric": True,
                                                 "ratio": 0.5, "tags": ["a", 1], "where": None})),
                     ("get_time", '{"zone": "42"}')]  # undeclared: text, as vLLM keeps it
    # a value that does not read as its type stays text; a string keeps inner newlines
    assert tp.convert_parameter("three", {"type": "integer"}) == "three"
    assert tp.convert_parameter("a\nb", {"type": "string"}) == "a\nb"
    assert tp.convert_parameter("{\"k\": 1}", {}) == {"k": 1}
    assert tp.convert_parameter("2", {"type": "number"}) == 2
    assert tp.convert_parameter("2.0", {"type": "number"}) == 2.0
    # no block: all of it content; a value cut short at the end of a finished text still counts
    assert tp.Qwen3Coder().parse("plain text", _req()) == ("plain text", [])
    _, calls = tp.Qwen3Coder().parse("<tool_call>\n<function=get_weather>\n<parameter=days>\n5",
                                     _req())
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather",
                                                                         '{"days": 5}')]


def test_qwen3_coder_streams_a_text_value_as_it_is_written():
    """A string parameter (a file's text, say) goes out as it comes, its JSON string open,
    less its last newline and a tail that may begin the closing tag; typed values wait for
    their end."""
    head = "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
    stream = tp.Qwen3Coder().stream(_req())
    seen = [stream.update(head + t)[0][1] for t in
            ("", "\n", "a < b\n", "a < b\nline\n", "a < b\nline\n</par",
             "a < b\nline\n</parameter>\n<parameter=days>\n1", "a < b\nline\n</parameter>\n"
             "<parameter=days>\n12\n</parameter>\n</function>")]
    assert seen == ['{"city": "', '{"city": "', '{"city": "a < b', '{"city": "a < b\\nline',
                    '{"city": "a < b\\nline', '{"city": "a < b\\nline"',
                    '{"city": "a < b\\nline", "days": 12}']


def test_mistral_reads_the_array_after_its_marker():
    p = tp.Mistral()
    text = ('Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo", '
            '"days": 2}}, {"name": "get_time", "arguments": {}}]')
    content, calls = _agree(p, text)
    assert content == "Sure. "
    assert calls == [("get_weather", '{"city": "Oslo", "days": 2}'), ("get_time", "{}")]
    # one object instead of an array; not JSON: all of it content
    _, calls = p.parse('[TOOL_CALLS]{"name": "get_time", "arguments": {"zone": "UTC"}}', _req())
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_time", '{"zone": "UTC"}')]
    assert p.parse("[TOOL_CALLS] [{oops", _req()) == ("[TOOL_CALLS] [{oops", [])
    # arguments written as a JSON string: that string is the call's arguments, streamed too
    # (once the string is complete, not its literal with quotes and escapes)
    _, calls = _agree(p, '[TOOL_CALLS] [{"name": "get_time", "arguments": "{\\"zone\\": 1}"}, '
                         '{"name": "get_weather", "arguments": {"city":"Oslo"}}]')
    assert calls == [("get_time", '{"zone": 1}'), ("get_weather", '{"city":"Oslo"}')]
    # other values than an object: their JSON, streamed and not
    _, calls = _agree(p, '[TOOL_CALLS] [{"name": "get_time", "arguments": [1,2]}, '
                         '{"name": "get_weather", "arguments": {"city":"Oslo"}}]')
    assert calls == [("get_time", "[1, 2]"), ("get_weather", '{"city":"Oslo"}')]
    # a call without arguments has none ({}), streamed and not, and the calls keep their order
    _, calls = _agree(p, '[TOOL_CALLS] [{"name": "get_time"}, '
                         '{"name": "get_weather", "arguments": {"city":"Oslo"}}]')
    assert calls == [("get_time", "{}"), ("get_weather", '{"city":"Oslo"}')]
    # the marker is a special token: a request this parser reads keeps them in its text
    req = _req()
    p.adjust_request(req)
    assert req.skip_special_tokens is False
    assert p.content_end("abc[TOOL", False) == 3 and p.content_end("abc[TOOL", True) == 8


def test_hermes_through_the_registry():
    text = 'Hi <tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
    content, calls = _agree(tp.Hermes(), text)
    assert content == "Hi " and calls == [("get_time", '{"zone": "CET"}')]
    assert tp.get(None) is None and isinstance(tp.get("qwen3_coder"), tp.Qwen3Coder)
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        tp.get("llama3_json")


_value = st.one_of(st.integers(-10 ** 6, 10 ** 6), st.booleans(),
                   st.text(alphabet="abc xyz,.\"{}<\n\\", min_size=1, max_size=12).filter(
                       lambda s: s.strip() == s and s.lower() != "null"))


@settings(max_examples=40, deadline=None)
@given(calls=st.lists(st.dictionaries(st.sampled_from(["city", "days", "metric", "other"]),
                                      _value, max_size=3), min_size=1, max_size=3),
       step=st.integers(1, 7), prose=st.text(alphabet="ab <>\n", max_size=8))
def test_each_parser_streams_what_it_parses(calls, step, prose):
    """Random calls written in each format: streamed in pieces of ``step`` characters, the
    names and arguments end as the whole parse's, and both give the calls written (each value
    written as its schema's type reads it)."""
    def typed(k, v):  # what a Qwen3-Coder parameter's text reads back as
        return tp.convert_parameter(v if isinstance(v, str) else json.dumps(v),
                                    WEATHER["properties"].get(k))
    prose = prose.replace("<tool_call>", "").replace("[TOOL_CALLS]", "")
    coder = prose + "".join(
        "<tool_call>\n<function=get_weather>\n" + "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in c.items()) + "</function>\n</tool_call>\n" for c in calls)
    _, got = _agree(tp.Qwen3Coder(), coder, step)
    assert [json.loads(a) for _, a in got] == [{k: typed(k, v) for k, v in c.items()}
                                               for c in calls]
    mistral = prose + "[TOOL_CALLS] " + json.dumps(
        [{"name": "get_weather", "arguments": c} for c in calls])
    _, got = _agree(tp.Mistral(), mistral, step)
    assert [json.loads(a) for _, a in got] == calls
    hermes = prose + "".join(f"<tool_call>{json.dumps({'name': 'get_weather', 'arguments': c})}"
                             "</tool_call>" for c in calls)
    _, got = _agree(tp.Hermes(), hermes, step)
    assert [json.loads(a) for _, a in got] == calls
