"""QA of the features added on 2026-12-07: kept partial blocks (kvcache/tails.py), priority
scheduling and ``POST /v1/responses``. Regression tests for the defects found, and compact
probes of what was attacked without a defect."""
from __future__ import annotations

import pytest

from writescope import LLM, SamplingParams

pytest.importorskip("fastapi")

from conftest import in_process_server  # noqa: E402
from test_server_responses import OPTS, TEMPLATE  # noqa: E402


# ---------------------------------------------------------------------------------- /v1/responses
@pytest.fixture(scope="module")
def client(tiny_qwen3_moe):
    from writescope.engine.engine import LLMEngine
    eng = LLMEngine(str(tiny_qwen3_moe), **OPTS)
    eng.tokenizer.hf.chat_template = TEMPLATE
    with in_process_server(eng) as c:
        yield c


def _error(client, **body) -> dict:
    r = client.post("/v1/responses", json={"max_output_tokens": 2, **body})
    assert r.status_code == 400, (r.status_code, r.text)
    return r.json()["error"]


@pytest.mark.parametrize("choice, msg", [
    ("required", "tool_choice 'required' needs tools"),
    ({"type": "function", "name": "f"}, "names function 'f', which is not among tools"),
])
def test_a_tool_choice_that_asks_for_a_call_without_tools_is_refused(client, choice, msg):
    """Was a 200 answered in text: ``chat_tools`` dropped ``tool_choice`` whenever ``tools``
    was empty, where the chat endpoint refuses the same request."""
    assert msg in _error(client, input="hi", tool_choice=choice)["message"]
    for tools in (None, []):
        body = {"input": "hi", "tool_choice": choice}
        if tools is not None:
            body["tools"] = tools
        assert msg in _error(client, **body)["message"]


def test_tool_choice_none_or_auto_without_tools_still_answers(client):
    for choice in ("none", "auto"):
        r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2,
                                                "tool_choice": choice})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("name", [None, 5, ["f"]])
def test_a_function_tool_choice_needs_a_string_name(client, name):
    """Was "tool_choice.literal['none','auto','required']: Input should be 'none', 'auto' or
    'required'" (the chat request's validation of ``{"function": {"name": None}}``)."""
    choice = {"type": "function"} if name is None else {"type": "function", "name": name}
    err = _error(client, input="hi", tools=[{"type": "function", "name": "f"}],
                 tool_choice=choice)
    assert err["param"] == "tool_choice.name" and "needs the function's name" in err["message"]


@pytest.mark.parametrize("field, value", [
    ("input", [1]), ("input", ["hi"]), ("input", 5), ("input", {"role": "user"}),
    ("tool_choice", 5), ("tool_choice", ["auto"]),
])
def test_a_union_field_of_the_wrong_type_names_every_accepted_type(client, field, value):
    """Was "input: Input should be a valid string (got [1])" -- a list is accepted too: the
    message named only the union's first type."""
    body = {"input": "hi", field: value}
    err = _error(client, **body)
    assert err["param"] == field
    assert "valid string" not in err["message"] and "object (got" not in err["message"]
    want = "a list of input items" if field == "input" else "'required'"
    assert want in err["message"], err


@pytest.mark.parametrize("body", [
    {"input": []}, {"input": [{"type": "foo"}]}, {"input": [{"type": 5}]},
    {"input": [{"role": "user"}]}, {"input": [{"role": "user", "content": [3]}]},
    {"input": "x", "max_output_tokens": -1}, {"input": "x", "max_output_tokens": 10 ** 30},
    {"input": "x", "seed": 10 ** 30}, {"input": "x", "priority": 10 ** 30},
    {"input": "x", "metadata": {"a": 1}}, {"input": "x", "text": {"format": {"type": "xml"}}},
    {"input": "x", "previous_response_id": ""}, {"input": "x", "reasoning": "high"},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
])
def test_bad_bodies_are_400s(client, body):
    """Probed without a defect: a wrong type, range or item is a 400 naming it, never a 500."""
    assert _error(client, **body)["message"]
