"""QA of the features added on 2026-12-07: kept partial blocks (kvcache/tails.py), priority
scheduling and ``POST /v1/responses``. Regression tests for the defects found, and compact
probes of what was attacked without a defect."""
from __future__ import annotations

import pytest

from writescope import LLM, SamplingParams

pytest.importorskip("fastapi")

from conftest import chat_engine, in_process_server  # noqa: E402
from test_server_responses import OPTS, TEMPLATE  # noqa: E402


# ---------------------------------------------------------------------------------- /v1/responses
@pytest.fixture(scope="module")
def client(tiny_qwen3_moe):
    with in_process_server(chat_engine(tiny_qwen3_moe, TEMPLATE, **OPTS)) as c:
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


# ---------------------------------------------------------------------------------- kept tails
def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2, **kw)


def _engine(path, **kw) -> LLM:
    opts = dict(dtype="float32", device="cpu", block_size=8, max_num_batched_tokens=6,
                max_model_len=256)
    opts.update(kw)
    return LLM(str(path), **opts)


def test_kept_tails_agree_with_no_prefix_caching_under_slot_pressure(tiny_qwen3_moe):
    """Probed without a defect: conversations continued turn after turn (each prompt its last
    turn's tokens, so it starts from the kept tail), n > 1 siblings on one tail, salted tails,
    prompt log-probabilities and aborts mid-prefill and mid-decode, with two W slots and small
    chunks: greedy tokens exactly and log-probabilities within 1e-4 of an engine without prefix
    caching; salted tails serve only their salt; every block and slot given back."""
    from test_fuzz_qa import all_released, differences, run_generate
    ref = _engine(tiny_qwen3_moe, enable_prefix_caching=False, max_num_seqs=1,
                  max_num_batched_tokens=256)
    llm = _engine(tiny_qwen3_moe, kv_policy="static", cpu_share=0.5, max_num_seqs=2)
    cache = llm.engine.cache

    def tail_hits() -> int:
        return cache.stats()["prefix.tail_hit_tokens"]

    def same(prompts, params, salts=None, tag=""):
        want = run_generate(ref, prompts, params)
        got = run_generate(llm, prompts, params, salts)
        assert not differences(want, got, tag)
        return want

    same([[5] * 10, [9] * 3, [4] * 12], [_greedy(3)] * 3, tag="three on two slots")
    convs = [[7, 11, 13], [17, 19, 23, 29, 31]]
    for turn in range(3):
        before = tail_hits()
        want = same(convs, [_greedy(3 + turn)] * 2, tag=f"turn {turn}")
        assert turn == 0 or tail_hits() > before
        convs = [p + want[i][1][0][0] for i, p in enumerate(convs)]
    sib = SamplingParams(temperature=1.0, n=3, seed=3, max_tokens=3, ignore_eos=True, logprobs=1)
    same([convs[0], convs[0]], [sib, sib], tag="siblings")
    # a tail kept under salt "a" serves "a" only
    s = [41, 43, 47]  # 3 + 4 tokens: a tail of 6 records
    out = run_generate(llm, [s], [_greedy(4)], ["a"])[0][1][0][0]
    for salt, hit in ((None, False), ("b", False), ("a", True)):
        before = tail_hits()
        same([s + out], [_greedy(2)], [salt], tag=f"salt {salt}")
        assert (tail_hits() > before) == hit, salt
        run_generate(llm, [s], [_greedy(4)], ["a"])
    before = tail_hits()
    same([s + out], [_greedy(2, prompt_logprobs=2)], tag="prompt logprobs")
    assert tail_hits() == before  # its prompt is computed whole
    # aborted mid-prefill (after 1 step of 6-token chunks) and mid-decode (after 5)
    eng = llm.engine
    for steps in (1, 5):
        a = list(range(60, 77))
        eng.add_request("ab", a, _greedy(6))
        for _ in range(steps):
            eng.step()
        eng.abort_request("ab")
        while eng.has_unfinished_requests():
            eng.step()
        same([a + [3], a], [_greedy(3)] * 2, tag=f"abort {steps}")
    all_released(llm)
    st = llm.engine.cache.stats()
    assert st["prefix.hit_tokens"] <= st["prefix.queried_tokens"] and st["kv.blocks.W"] == 0
    assert llm.reset_prefix_cache() and cache.stats()["prefix.tails"] == 0
