"""Reasoning parsers (server/reasoning.py, ``writescope serve --reasoning-parser``): a thinking
model's ``<think>...</think>`` comes back as ``reasoning_content`` apart from the content, the
same streamed and not; a template that opens the thinking makes the whole output reasoning
until ``</think>``, and a response_format then waits for it; one that closes it (thinking off)
constrains from the first token; tool calls are read from the content only."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

from writescope.server import reasoning

# Qwen3-like: thinking off closes an empty <think></think> in the prompt; open_thinking starts
# it (Qwen3-Thinking-2507's template)
TEMPLATE = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%- endfor -%}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n"
            "{%- if enable_thinking is defined and enable_thinking is false %}"
            "<think>\n\n</think>\n\n{% elif open_thinking is defined and open_thinking %}"
            "<think>\n{% endif -%}{% endif -%}")
MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
OFF = {"enable_thinking": False}
OPEN = {"open_thinking": True}


# -- the split ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,text,opened,want", [
    ("qwen3", "<think>\nplan</think>\n\nanswer", False, ("plan", "answer")),
    ("qwen3", "answer only", False, (None, "answer only")),
    ("qwen3", "plan</think>answer", True, ("plan", "answer")),  # the prompt opened it
    ("qwen3", "<think>cut short", False, ("cut short", "")),
    ("qwen3", "  <think>a</think>", False, ("a", "")),
    ("deepseek_r1", "plan</think>answer", False, ("plan", "answer")),
    ("deepseek_r1", "<think>plan</think> answer", False, ("plan", "answer")),
    ("deepseek_r1", "all thinking", False, ("all thinking", "")),
])
def test_split(name, text, opened, want):
    assert reasoning.get(name).split(text, opened, finished=True) == want


def test_opened_and_may_reason_follow_the_prompt():
    q, r1 = reasoning.get("qwen3"), reasoning.get("deepseek_r1")
    assert q.opened("<|im_start|>assistant\n<think>\n") and not q.opened("assistant\n")
    assert q.may_reason("assistant\n") and not q.may_reason("<think>\n\n</think>\n\n")
    assert r1.opened("assistant\n") and r1.may_reason("</think>")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        reasoning.get("nope")
    from writescope.commands.serve import REASONING_PARSERS
    assert REASONING_PARSERS == tuple(reasoning.PARSERS)


PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "</thi", "think>", "a",
                          "bc", " ", "\n", "x>"])


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=12), st.sampled_from(["qwen3", "deepseek_r1"]), st.booleans())
def test_streamed_splits_only_grow_and_end_at_the_whole_split(pieces, name, opened):
    """Splitting each prefix of a growing text (as a stream does) never takes back what it gave
    out, and the last split (finished) is the whole text's."""
    p = reasoning.get(name)
    text, prev = "", ("", "")
    for piece in pieces:
        text += piece
        r, c = p.split(text, opened, finished=False)
        r = r or ""
        assert r.startswith(prev[0]) and c.startswith(prev[1]), (text, prev, (r, c))
        prev = (r, c)
    r, c = p.split(text, opened, finished=True)
    assert (r or "").startswith(prev[0]) and c.startswith(prev[1])


# -- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tiny_qwen3_moe):
    pytest.importorskip("fastapi")
    from writescope.engine.engine import LLMEngine
    eng = LLMEngine(str(tiny_qwen3_moe), dtype="float32", device="cpu", max_model_len=1024)
    eng.tokenizer.hf.chat_template = TEMPLATE
    return eng


def _client(engine, **kw):
    from starlette.testclient import TestClient
    from writescope.server.api import create_app
    return TestClient(create_app(engine, **kw))


@pytest.fixture(scope="module")
def client(engine):
    with _client(engine, reasoning_parser="qwen3", tool_call_parser="hermes") as c:
        yield c


def _both(client, **body) -> tuple[dict, dict]:
    """(the message, the streamed deltas joined per field) of one request, greedy."""
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 200, **body}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    joined = {"content": "", "reasoning_content": "", "tool_calls": [], "finish_reason": None}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for ch in json.loads(line[6:])["choices"]:
                d = ch["delta"]
                joined["content"] += d.get("content") or ""
                joined["reasoning_content"] += d.get("reasoning_content") or ""
                joined["tool_calls"] += d.get("tool_calls") or []
                joined["finish_reason"] = ch["finish_reason"] or joined["finish_reason"]
    return choice, joined


def test_opened_thinking_is_reasoning_and_a_format_waits_for_its_end(client):
    """The template opens <think>: the tiny model never closes it, so all of its text is
    reasoning; a regex response waits for </think> and so leaves the same tokens free."""
    free, streamed = _both(client, chat_template_kwargs=OPEN, logprobs=True)
    msg = free["message"]
    assert msg["content"] is None and msg["reasoning_content"]
    assert free["finish_reason"] == "length"
    assert streamed["reasoning_content"] == msg["reasoning_content"]
    assert streamed["content"] == ""
    held, _ = _both(client, chat_template_kwargs=OPEN, logprobs=True, guided_regex="[0-9]{3}")
    assert held["message"]["reasoning_content"] == msg["reasoning_content"]
    tokens = [t["token"] for t in free["logprobs"]["content"]]
    assert [t["token"] for t in held["logprobs"]["content"]] == tokens
    # a named tool call waits too: cut short inside the thinking, there is no call
    named, streamed = _both(client, chat_template_kwargs=OPEN, tools=TOOLS,
                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named["message"]["tool_calls"] == [] and named["message"]["content"] is None
    assert named["message"]["reasoning_content"] == msg["reasoning_content"]
    assert streamed["tool_calls"] == [] and streamed["content"] == ""


def test_output_that_does_not_think_is_constrained_from_its_first_token(client, engine):
    """qwen3, thinking neither opened nor closed by the prompt: an output that does not open
    <think> is all content (the parser's split), so response_format, guided_* and a forced
    tool call hold from its first token (they used to wait for a </think> that never came);
    one that opens <think> (pushed here by logit_bias on its tokens) thinks freely, the
    constraint waiting for </think>."""
    held, streamed = _both(client, guided_regex="[0-9]{3}")
    assert re.fullmatch("[0-9]{3}", held["message"]["content"]) and \
        held["message"]["reasoning_content"] is None
    assert held["finish_reason"] == "stop" and streamed["content"] == held["message"]["content"]
    obj, _ = _both(client, max_tokens=40, response_format={"type": "json_object"})
    if obj["finish_reason"] == "stop":
        assert isinstance(json.loads(obj["message"]["content"]), dict)
    else:  # cut short: still the start of an object, not free text
        assert obj["message"]["content"].startswith("{")
    named, _ = _both(client, tools=TOOLS, max_tokens=40,
                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = named["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert call["function"]["arguments"].startswith("{")
    # an answer that starts as the tag does ('<'): both stay open until the text leaves one
    lt, streamed = _both(client, structured_outputs={"choice": ["<b>yes</b>", "<b>no</b>"]})
    assert lt["message"]["content"] in ("<b>yes</b>", "<b>no</b>") and lt["finish_reason"] == "stop"
    assert lt["message"]["reasoning_content"] is None and streamed["content"] == lt["message"]["content"]
    # the first non-space text is <think>: the thinking is free, the regex waits for its end
    tag = engine.tokenizer.encode("<think>", add_special_tokens=False)
    bias = {str(t): 100 for t in tag}
    think, streamed = _both(client, guided_regex="[0-9]{3}", max_tokens=30, logit_bias=bias)
    assert think["finish_reason"] == "length" and think["message"]["content"] is None
    assert think["message"]["reasoning_content"]  # free text after <think>, no </think>
    assert streamed["reasoning_content"] == think["message"]["reasoning_content"]
    # the template opened the thinking: the regex waits for </think>, whatever comes first
    opened, _ = _both(client, chat_template_kwargs=OPEN, guided_regex="[0-9]{3}", max_tokens=30)
    assert opened["message"]["content"] is None and opened["finish_reason"] == "length"


def test_thinking_written_by_the_model_is_split_off(client):
    """Thinking off closes it in the prompt, so a constraint holds from the first token (here
    the regex writes the thinking, as a Qwen3 model would): reasoning and content apart,
    streamed as returned."""
    text = "<think>\nthe sky scatters blue light\n</think>\n\nRayleigh scattering."
    choice, streamed = _both(client, chat_template_kwargs=OFF, guided_regex=re.escape(text))
    msg = choice["message"]
    assert msg["reasoning_content"] == "the sky scatters blue light\n"
    assert msg["content"] == "Rayleigh scattering."
    assert choice["finish_reason"] == "stop"
    assert streamed["reasoning_content"] == msg["reasoning_content"]
    assert streamed["content"] == msg["content"]


def test_include_reasoning_false_drops_the_thinking_only(client):
    """vLLM's ``include_reasoning: false``: the thinking is split off and dropped, streamed and
    not; the content is the same as with it."""
    text = "<think>\nthe sky scatters blue light\n</think>\n\nRayleigh scattering."
    choice, streamed = _both(client, chat_template_kwargs=OFF, guided_regex=re.escape(text),
                             include_reasoning=False)
    msg = choice["message"]
    assert msg["reasoning_content"] is None and msg["content"] == "Rayleigh scattering."
    assert streamed["reasoning_content"] == "" and streamed["content"] == msg["content"]
    assert choice["finish_reason"] == streamed["finish_reason"] == "stop"
    # all thinking (the template opened it): no content and no reasoning
    opened, streamed = _both(client, chat_template_kwargs=OPEN, max_tokens=20,
                             include_reasoning=False)
    assert opened["message"]["content"] is None
    assert opened["message"]["reasoning_content"] is None
    assert streamed["reasoning_content"] == streamed["content"] == ""
    assert opened["finish_reason"] == streamed["finish_reason"] == "length"


def test_tool_calls_are_read_from_the_content_only(client):
    text = ('<think>need the weather</think>Let me look.<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Rome"}}\n</tool_call>')
    choice, streamed = _both(client, chat_template_kwargs=OFF, tools=TOOLS,
                             guided_regex=re.escape(text))
    msg = choice["message"]
    assert msg["reasoning_content"] == "need the weather"
    assert msg["content"] == "Let me look." and choice["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]
    assert streamed["reasoning_content"] == "need the weather"
    assert streamed["content"] == "Let me look." and streamed["finish_reason"] == "tool_calls"
    args = "".join(t["function"]["arguments"] for t in streamed["tool_calls"])
    assert args == msg["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"city": "Rome"}


def test_without_a_parser_the_thinking_stays_in_the_content(engine):
    text = "<think>plan</think>answer"
    with _client(engine) as c:
        r = c.post("/v1/chat/completions", json={
            "messages": MESSAGES, "temperature": 0, "max_tokens": 40,
            "chat_template_kwargs": OFF, "guided_regex": re.escape(text)})
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == text and msg["reasoning_content"] is None
