"""The server's beam search (vLLM's ``use_beam_search``, server/beam.py), in process against a
tiny checkpoint: the hypotheses ``LLM.beam_search`` finds on the same weights, as the ``n``
choices of each prompt, streamed or not, on both endpoints; the fields it cannot apply
refused."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from conftest import chat_engine, in_process_server, post_ok  # noqa: E402
from writescope import BeamSearchParams, LLM  # noqa: E402

TEMPLATE = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%- endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
CHAT = [{"role": "user", "content": "Tell me about rivers."}]
PROMPTS = [[5 + 7 * i % 300 for i in range(90)], [11 + 3 * i % 290 for i in range(30)]]
OPTS = dict(dtype="float32", device="cpu", max_model_len=512)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_moe):
    out = LLM(str(tiny_qwen3_moe), **OPTS)
    out.engine.tokenizer.hf.chat_template = TEMPLATE
    return out


@pytest.fixture(scope="module")
def client(tiny_qwen3_moe):
    with in_process_server(chat_engine(tiny_qwen3_moe, TEMPLATE)) as c:
        yield c


def _ids(logprobs: dict) -> list[int]:
    return [int(t.split(":")[1]) for t in logprobs["tokens"]]


def test_completions_return_each_prompts_best_hypotheses(client, llm):
    want = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))
    body = post_ok(client, "/v1/completions", prompt=PROMPTS, n=3, max_tokens=5, ignore_eos=True,
                 use_beam_search=True, temperature=0, logprobs=2, return_tokens_as_token_ids=True)
    assert [c["index"] for c in body["choices"]] == list(range(6))
    for i, out in enumerate(want):
        for j, seq in enumerate(out.sequences):
            c = body["choices"][3 * i + j]
            assert _ids(c["logprobs"]) == seq.token_ids
            assert c["text"] == seq.text and c["finish_reason"] == "length"
            lps = c["logprobs"]["token_logprobs"]
            assert sum(lps) == pytest.approx(seq.cum_logprob, abs=1e-5)
            # the two most likely alternatives each step saw, and the token's own
            assert all(len(top) in (2, 3) for top in c["logprobs"]["top_logprobs"])
    usage = body["usage"]
    assert usage["prompt_tokens"] == sum(len(p) for p in PROMPTS)  # once per prompt
    assert usage["completion_tokens"] == 6 * 5


def test_a_stream_sends_each_choice_whole(client):
    body = dict(prompt=PROMPTS[0], n=2, max_tokens=4, ignore_eos=True, use_beam_search=True,
                temperature=0)
    whole = post_ok(client, "/v1/completions", **body)
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(ln)["choices"][0] for ln in lines[:-1]]
    assert sorted((c["index"], c["text"], c["finish_reason"]) for c in chunks) == \
        [(c["index"], c["text"], c["finish_reason"]) for c in whole["choices"]]


def test_chat_choices_are_the_rendered_conversations_hypotheses(client, llm):
    ids = llm.tokenizer.encode(llm.tokenizer.render_chat(CHAT, add_generation_prompt=True),
                               add_special_tokens=False)
    want = llm.beam_search([ids], BeamSearchParams(beam_width=2, max_tokens=6))[0].sequences
    body = post_ok(client, "/v1/chat/completions", messages=CHAT, n=2, max_tokens=6,
                 use_beam_search=True, temperature=0)
    got = [(c["message"]["content"], c["finish_reason"]) for c in body["choices"]]
    assert got == [(s.text, s.finish_reason) for s in want]


@pytest.mark.parametrize("path,extra,msg", [
    ("/v1/completions", dict(stop=["."]), "does not apply stop"),
    ("/v1/completions", dict(stop_token_ids=[3]), "does not apply stop_token_ids"),
    ("/v1/completions", dict(echo=True, logprobs=1), "does not apply echo with logprobs"),
    ("/v1/completions", dict(prompt_logprobs=1), "does not apply prompt_logprobs"),
    ("/v1/completions", dict(min_tokens=2), "does not apply min_tokens"),
    ("/v1/completions", dict(n=11), "beam_width must be an integer between 1 and 10"),
    ("/v1/completions", dict(n=2, logprobs=5), "at most 4 log-probability alternatives"),
    ("/v1/chat/completions", dict(response_format={"type": "json_object"}),
     "does not apply response_format"),
    ("/v1/chat/completions", dict(tools=[{"type": "function", "function": {"name": "f"}}],
                                  tool_choice="required"), "does not apply tool_choice"),
    ("/v1/chat/completions", dict(tools=[{"type": "function", "function": {"name": "f"}}],
                                  tool_choice={"type": "function", "function": {"name": "f"}}),
     "does not apply tool_choice naming function 'f'"),
])
def test_what_beam_search_cannot_apply_is_refused(client, path, extra, msg):
    body = dict(prompt="Rivers") if path == "/v1/completions" else dict(messages=CHAT)
    r = client.post(path, json={**body, "max_tokens": 3, "use_beam_search": True, **extra})
    assert r.status_code == 400, r.text
    assert msg in r.json()["error"]["message"]


def test_usage_counts_the_prompt_tokens_found_in_the_prefix_cache(client):
    prompt = [7 + 5 * i % 290 for i in range(150)]  # two blocks of 64 and a tail
    body = dict(prompt=prompt, n=2, max_tokens=2, use_beam_search=True, temperature=0)
    first = post_ok(client, "/v1/completions", **body, cache_salt="beams")["usage"]
    again = post_ok(client, "/v1/completions", **body, cache_salt="beams")["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    # the prompt's two blocks (128), then 21 records of a tail the first search kept
    # (``kvcache/tails.py``: the prompt's last 22 tokens, and a beam's): every prompt token but
    # the last, which is computed anyway
    assert again["prompt_tokens_details"]["cached_tokens"] == 128 + 21
