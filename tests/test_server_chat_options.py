"""vLLM's request extensions on the OpenAI endpoints, in process against a tiny checkpoint:
``prompt_logprobs`` (each prompt token's log-probability, rank and the k most likely tokens, on
/v1/completions per choice and on /v1/chat/completions once), and the chat template options
``continue_final_message``, ``echo`` and ``chat_template_kwargs`` (also on /tokenize, which must
count the prompt the chat endpoint runs)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from conftest import chat_engine, in_process_server, post_ok  # noqa: E402
from writescope.core import SamplingParams  # noqa: E402

# reads enable_thinking (as Qwen3's does) so that chat_template_kwargs can be seen in the prompt
TEMPLATE = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%- endfor -%}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n"
            "{%- if enable_thinking is defined and enable_thinking is false %}"
            "<think>\n\n</think>\n\n{% endif -%}{% endif -%}")
CONV = [{"role": "user", "content": "Tell me about rivers."},
        {"role": "assistant", "content": "Rivers are"}]


@pytest.fixture(scope="module")
def engine(tiny_qwen3_moe):
    return chat_engine(tiny_qwen3_moe, TEMPLATE, max_model_len=1024)


@pytest.fixture(scope="module")
def oracle(tiny_qwen3_moe):
    """A second engine on the same checkpoint for the tests' own runs and tokenizing: the
    server's engine is stepped by its loop thread, which a test thread must not race."""
    return chat_engine(tiny_qwen3_moe, TEMPLATE, max_model_len=1024)


@pytest.fixture(scope="module")
def client(engine):
    with in_process_server(engine) as c:
        yield c


def _solo(engine, ids, params):
    """What the engine alone gives for these prompt ids (the oracle for the server's output)."""
    engine.add_request("solo", ids, params)
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            last = out
    return last


def _check_dicts(entries, ids, out, k):
    assert len(entries) == len(ids) and entries[0] is None
    for i in range(1, len(ids)):
        d = {int(t): v for t, v in entries[i].items()}
        own = d[ids[i]]
        assert own["logprob"] == pytest.approx(out.prompt_token_logprobs[i], abs=1e-5)
        assert own["rank"] == out.prompt_ranks[i]
        top = list(out.prompt_top_logprobs[i].items())[:k] if k else []
        assert set(d) == {ids[i]} | {t for t, _ in top}
        for r, (t, v) in enumerate(top, start=1):
            if t != ids[i] or own["rank"] == r:
                assert d[t]["rank"] == r and d[t]["logprob"] == pytest.approx(v, abs=1e-5)
        assert all(isinstance(v["decoded_token"], str) for v in d.values())


def test_completions_prompt_logprobs(client, oracle):
    """Per choice, the engine's own values in vLLM's shape; with echo + logprobs each keeps its
    own k."""
    ids = oracle.tokenizer.encode("A quiet river runs under the old bridge")
    body = post_ok(client, "/v1/completions", prompt=ids, max_tokens=3, temperature=0,
                 prompt_logprobs=4, n=2)
    want = _solo(oracle, ids, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=4))
    assert len(body["choices"]) == 2
    for ch in body["choices"]:
        _check_dicts(ch["prompt_logprobs"], ids, want, 4)
    # 0: the prompt's own tokens only (with their ranks)
    body = post_ok(client, "/v1/completions", prompt=ids, max_tokens=1, prompt_logprobs=0)
    _check_dicts(body["choices"][0]["prompt_logprobs"], ids, want, 0)
    # echo with logprobs 2 next to prompt_logprobs 4: each its own number of alternatives
    body = post_ok(client, "/v1/completions", prompt=ids, max_tokens=2, temperature=0,
                 echo=True, logprobs=2, prompt_logprobs=4)
    ch = body["choices"][0]
    _check_dicts(ch["prompt_logprobs"], ids, want, 4)
    assert ch["logprobs"]["top_logprobs"][0] is None
    assert all(len(d) <= 3 for d in ch["logprobs"]["top_logprobs"][1:])
    assert ch["logprobs"]["token_logprobs"][1:len(ids)] == pytest.approx(
        want.prompt_token_logprobs[1:], abs=1e-5)
    # not asked: null
    body = post_ok(client, "/v1/completions", prompt=ids, max_tokens=1)
    assert body["choices"][0]["prompt_logprobs"] is None


def test_chat_prompt_logprobs_once_per_response(client, oracle):
    body = post_ok(client, "/v1/chat/completions", messages=CONV[:1], max_tokens=2,
                 temperature=0, prompt_logprobs=2, n=2)
    ids = oracle.tokenizer.apply_chat_template(CONV[:1])
    want = _solo(oracle, ids, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))
    assert body["usage"]["prompt_tokens"] == len(ids)
    _check_dicts(body["prompt_logprobs"], ids, want, 2)


@pytest.mark.parametrize("path,extra", [("/v1/completions", {"prompt": "x"}),
                                        ("/v1/chat/completions", {"messages": CONV[:1]})])
def test_prompt_logprobs_refused_when_streaming_or_out_of_range(client, path, extra):
    for bad in ({"prompt_logprobs": 1, "stream": True}, {"prompt_logprobs": 21},
                {"prompt_logprobs": -1}, {"prompt_logprobs": "2"}):
        r = client.post(path, json={**extra, **bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_continue_final_message_and_echo(client, oracle):
    """The assistant's turn is left open and the answer continues it (the engine's own greedy
    tokens on those prompt ids); echo puts the open turn's text before the answer, streamed
    and not."""
    tok = oracle.tokenizer
    open_ids = tok.apply_chat_template(CONV, add_generation_prompt=False,
                                       continue_final_message=True)
    closed_ids = tok.apply_chat_template(CONV, add_generation_prompt=False)
    assert open_ids != closed_ids and tok.decode(open_ids).endswith("Rivers are")
    body = post_ok(client, "/v1/chat/completions", messages=CONV, max_tokens=6, temperature=0,
                 add_generation_prompt=False, continue_final_message=True)
    assert body["usage"]["prompt_tokens"] == len(open_ids)
    want = _solo(oracle, open_ids, SamplingParams(temperature=0, max_tokens=6))
    answer = body["choices"][0]["message"]["content"]
    assert answer == want.text
    echoed = post_ok(client, "/v1/chat/completions", messages=CONV, max_tokens=6, temperature=0,
                   add_generation_prompt=False, continue_final_message=True, echo=True)
    assert echoed["choices"][0]["message"]["content"] == "Rivers are" + answer
    text = ""
    with client.stream("POST", "/v1/chat/completions", json={
            "messages": CONV, "max_tokens": 6, "temperature": 0, "stream": True, "echo": True,
            "add_generation_prompt": False, "continue_final_message": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:])["choices"]:
                    text += ch["delta"].get("content") or ""
    assert text == "Rivers are" + answer
    # echo where the last message is the user's and a new assistant turn starts: nothing echoed
    plain = post_ok(client, "/v1/chat/completions", messages=CONV[:1], max_tokens=4, temperature=0)
    again = post_ok(client, "/v1/chat/completions", messages=CONV[:1], max_tokens=4, temperature=0,
                  echo=True)
    assert again["choices"][0]["message"] == plain["choices"][0]["message"]


def test_chat_template_kwargs_reach_the_template(client, oracle):
    tok = oracle.tokenizer
    base = post_ok(client, "/v1/chat/completions", messages=CONV[:1], max_tokens=1)
    off = post_ok(client, "/v1/chat/completions", messages=CONV[:1], max_tokens=1,
                chat_template_kwargs={"enable_thinking": False})
    want = tok.apply_chat_template(CONV[:1], enable_thinking=False)
    assert "<think>" in tok.decode(want)
    assert off["usage"]["prompt_tokens"] == len(want) > base["usage"]["prompt_tokens"]
    # /tokenize renders the same prompt as the chat endpoint
    r = post_ok(client, "/tokenize", messages=CONV[:1], chat_template_kwargs={"enable_thinking": False})
    assert r["tokens"] == want
    r = post_ok(client, "/tokenize", messages=CONV, add_generation_prompt=False,
              continue_final_message=True)
    assert r["tokens"] == tok.apply_chat_template(CONV, add_generation_prompt=False,
                                                  continue_final_message=True)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_template_options_refused(client, path):
    for bad in ({"continue_final_message": True},  # with add_generation_prompt (default true)
                {"chat_template_kwargs": {"chat_template": "{{ 'x' }}"}},
                {"chat_template_kwargs": {"add_generation_prompt": False}},
                {"chat_template_kwargs": ["enable_thinking"]}):
        r = client.post(path, json={"messages": CONV, **bad})
        assert r.status_code == 400, (bad, r.text)
    r = client.post("/tokenize", json={"prompt": "x", "messages": CONV})
    assert r.status_code == 400 and "either" in r.json()["error"]["message"]


def test_usage_counts_prompt_tokens_found_in_the_prefix_cache(client, oracle):
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI's field): a prompt that starts with
    an earlier one reuses its blocks (64 tokens each here), streamed and not; the answer is the
    engine's own without the cache."""
    ids = [(7 * i) % 300 + 3 for i in range(150)]
    # the cache starts empty: no kept tail of an earlier prompt here shares ids' first tokens
    assert client.post("/reset_prefix_cache").status_code == 200
    first = post_ok(client, "/v1/completions", prompt=ids, max_tokens=2, temperature=0,
                    logprobs=0, return_tokens_as_token_ids=True)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # its records: ids and its first answer token, the last 23 of them a kept tail after two
    # blocks of 64 (``kvcache/tails.py``)
    (answer0, _) = first["choices"][0]["logprobs"]["tokens"]
    assert answer0 != "token_id:11"
    longer = ids + [11, 12, 13]
    body = post_ok(client, "/v1/completions", prompt=longer, max_tokens=5, temperature=0,
                 logprobs=0)
    # two blocks (128), then the tail's first 22 records: ids[128:] (the tail's 23rd token,
    # the first answer token, is not the 11 that follows here)
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 128 + 22}
    assert body["usage"]["prompt_tokens"] == 153
    # the same answer as a run that computes the whole prompt (prompt_logprobs skips the cache)
    want = _solo(oracle, longer, SamplingParams(temperature=0, max_tokens=5, logprobs=0,
                                                prompt_logprobs=0))
    assert want.num_cached_tokens == 0
    got = body["choices"][0]
    assert got["text"] == want.text
    assert got["logprobs"]["token_logprobs"] == pytest.approx(want.logprobs, abs=1e-4)
    usage = None
    with client.stream("POST", "/v1/completions", json={
            "prompt": longer, "max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                usage = json.loads(line[6:]).get("usage") or usage
    # two blocks, then 24 records of the tail the request before kept (longer[128:] and its
    # answer): every prompt token but the last, which is computed anyway
    assert usage["prompt_tokens_details"] == {"cached_tokens": 128 + 24}
    # a chat's next turn starts from the blocks of the turn before
    conv = [{"role": "user", "content": "Tell me about rivers and the sea. " * 12}]
    a = post_ok(client, "/v1/chat/completions", messages=conv, max_tokens=8, temperature=0)
    conv += [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And lakes?"}]
    b = post_ok(client, "/v1/chat/completions", messages=conv, max_tokens=4, temperature=0)
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64
    # POST /reset_prefix_cache (vLLM's): the same prompt then computes every token
    r = client.post("/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    again = post_ok(client, "/v1/completions", prompt=longer, max_tokens=5, temperature=0)
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["choices"][0]["text"] == want.text


def test_reset_prefix_cache_is_refused_while_a_request_runs(client):
    """A reset waits for no one: while a request streams it is a 409, and the stream ends as
    it would have."""
    with client.stream("POST", "/v1/completions", json={
            "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0,
            "ignore_eos": True, "stream": True}) as s:
        lines = s.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        r = client.post("/reset_prefix_cache")
        assert r.status_code == 409, r.text
        assert r.json()["error"]["type"] == "conflict_error"
        rest = [line for line in lines if line.startswith("data: ")]
    assert first != "data: [DONE]" and rest[-1] == "data: [DONE]"
    assert client.post("/reset_prefix_cache").status_code == 200


def test_include_stop_str_and_allowed_token_ids(client, oracle):
    """vLLM's ``include_stop_str_in_output`` keeps the stop string at the end of the text,
    streamed and not; ``allowed_token_ids`` limits every token to the set; a negative id is a
    400 and one beyond the vocabulary too."""
    base = post_ok(client, "/v1/completions", prompt="Once upon a time", max_tokens=12,
                 temperature=0, ignore_eos=True)["choices"][0]["text"]
    stop = base[3:5]
    cut = base[:base.find(stop)]
    body = dict(prompt="Once upon a time", max_tokens=12, temperature=0, ignore_eos=True,
                stop=[stop], include_stop_str_in_output=True)
    got = post_ok(client, "/v1/completions", **body)["choices"][0]
    assert got["text"] == cut + stop and got["finish_reason"] == "stop"
    streamed = ""
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                streamed += json.loads(line[6:])["choices"][0]["text"]
    assert streamed == cut + stop
    allowed = [100, 101, 102]
    ids = oracle.tokenizer.encode("Once upon a time")
    out = post_ok(client, "/v1/completions", prompt=ids, max_tokens=6, temperature=0,
                ignore_eos=True, allowed_token_ids=allowed)["choices"][0]
    want = _solo(oracle, ids, SamplingParams(max_tokens=6, allowed_token_ids=allowed,
                                             temperature=0, ignore_eos=True))
    assert len(want.token_ids) == 6 and set(want.token_ids) <= set(allowed)
    assert out["text"] == want.text == oracle.tokenizer.decode(want.token_ids)
    # bad_words reach the engine (tests/test_logits_processors.py checks what they do)
    w = oracle.tokenizer.decode([want.token_ids[0]]).strip() or "the"
    banned = oracle._bad_words_ids([w])
    free = post_ok(client, "/v1/completions", prompt=ids, max_tokens=6, temperature=0,
                 ignore_eos=True, bad_words=[w])["choices"][0]["text"]
    toks = oracle.tokenizer.encode(free, add_special_tokens=False)
    assert [t for t in toks if [t] in banned] == []
    r = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "bad_words": [""]})
    assert r.status_code == 400
    # skip_special_tokens: false keeps special tokens' text (allowed_token_ids forces one here)
    special = oracle.tokenizer.decode([2], skip_special_tokens=False)
    assert special and oracle.tokenizer.decode([2]) == ""
    both = [post_ok(client, "/v1/completions", prompt=ids, max_tokens=2, ignore_eos=True,
                  allowed_token_ids=[2], skip_special_tokens=skip)["choices"][0]["text"]
            for skip in (True, False)]
    assert both == ["", special * 2]
    # a token that stops the output is not in its text (vLLM), unless include_stop_str_in_output
    stopped = [post_ok(client, "/v1/completions", prompt=ids, max_tokens=2, stop_token_ids=[2],
                     allowed_token_ids=[2], skip_special_tokens=False,
                     include_stop_str_in_output=keep)["choices"][0] for keep in (False, True)]
    assert [c["text"] for c in stopped] == ["", special]
    assert [c["finish_reason"] for c in stopped] == ["stop", "stop"]
    for bad in ([-1], [10 ** 7], []):
        r = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2,
                                                  "allowed_token_ids": bad})
        assert r.status_code == 400, (bad, r.text)


def test_truncate_prompt_tokens_keeps_the_prompts_end(client, oracle):
    """vLLM's ``truncate_prompt_tokens``: the prompt's last k tokens only (usage counts them,
    the answer is that of the shorter prompt); -1 keeps what the context takes; 0 is a 400."""
    ids = [(5 * i) % 300 + 3 for i in range(40)]
    body = dict(max_tokens=4, temperature=0, ignore_eos=True)
    cut = post_ok(client, "/v1/completions", prompt=ids, truncate_prompt_tokens=10, **body)
    tail = post_ok(client, "/v1/completions", prompt=ids[-10:], **body)
    assert cut["usage"]["prompt_tokens"] == 10
    assert cut["choices"][0]["text"] == tail["choices"][0]["text"]
    chat = post_ok(client, "/v1/chat/completions", messages=CONV[:1], truncate_prompt_tokens=5,
                 **body)
    assert chat["usage"]["prompt_tokens"] == 5
    whole = post_ok(client, "/v1/completions", prompt=ids, truncate_prompt_tokens=-1, **body)
    assert whole["usage"]["prompt_tokens"] == 40
    r = client.post("/v1/completions", json={"prompt": ids, "truncate_prompt_tokens": 0, **body})
    assert r.status_code == 400
    # the API: the same through SamplingParams
    out = _solo(oracle, ids, SamplingParams(truncate_prompt_tokens=10, **body))
    assert out.text == tail["choices"][0]["text"] and len(out.prompt_token_ids) == 10


def test_openai_fields_that_do_not_change_decoding_are_accepted_and_ignored(client, caplog):
    """``store``, ``metadata``, ``service_tier``, ``reasoning_effort``, ``modalities`` (OpenAI's
    documented chat fields): the same answer as without them, and one warning naming them;
    a name that is no field at all is ignored too, with vLLM's warning naming it."""
    import logging
    body = dict(messages=CONV[:1], temperature=0, max_tokens=4)
    plain = post_ok(client, "/v1/chat/completions", **body)["choices"][0]["message"]
    extra = dict(store=False, metadata={"a": "b"}, service_tier="auto", reasoning_effort="low",
                 modalities=["text"])
    with caplog.at_level(logging.WARNING, logger="writescope.server"):
        got = post_ok(client, "/v1/chat/completions", **body, **extra)["choices"][0]["message"]
    assert got == plain
    (warning,) = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert all(name in warning for name in extra)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="writescope.server"):
        got = post_ok(client, "/v1/chat/completions", **body, bogus_field=1)
    assert got["choices"][0]["message"] == plain
    assert any("ignored: bogus_field" in r.getMessage() for r in caplog.records)


def test_retrieve_a_model(client):
    """``GET /v1/models/{id}`` (OpenAI's models.retrieve): the served name's model object, and
    OpenAI's 404 for another id."""
    (card,) = client.get("/v1/models").json()["data"]
    r = client.get(f"/v1/models/{card['id']}")
    got = r.json()
    assert r.status_code == 200 and got.pop("created") >= card.pop("created") and got == card
    r = client.get("/v1/models/no-such-model")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"


def test_logprobs_give_each_tokens_own_bytes(client):
    """A character split over byte-level tokens ('🐱é': six one-byte tokens in the tiny
    vocabulary): chat ``bytes`` are each token's own (joined, the content's UTF-8; they were
    U+FFFD's for each), ``token`` its text with such bytes as \\xNN (OpenAI's form); the
    completions endpoint's ``text_offset`` counts characters (a split one's tokens each at
    its offset), streamed as not."""
    body = dict(guided_choice=["🐱é"], max_tokens=10, temperature=0)
    ch = post_ok(client, "/v1/chat/completions", messages=CONV[:1], logprobs=True, top_logprobs=1,
               **body)["choices"][0]
    lp = ch["logprobs"]["content"]
    assert b"".join(bytes(t["bytes"]) for t in lp) == ch["message"]["content"].encode()
    assert ch["message"]["content"] == "🐱é" and lp[0]["token"] == "\\xf0"
    assert all(bytes(a["bytes"]).decode("utf-8", "backslashreplace") == a["token"]
               for t in lp for a in t["top_logprobs"])
    ch = post_ok(client, "/v1/completions", prompt="x", logprobs=0, **body)["choices"][0]
    assert ch["text"] == "🐱é" and len(ch["logprobs"]["tokens"]) == 6
    assert ch["logprobs"]["text_offset"] == [0, 0, 0, 0, 1, 1]
    offsets = []
    with client.stream("POST", "/v1/completions", json=dict(prompt="x", logprobs=0, stream=True,
                                                            **body)) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    offsets += (c["logprobs"] or {}).get("text_offset") or []
    assert offsets == [0, 0, 0, 0, 1, 1]


def test_logprobs_of_special_tokens_follow_the_text(client):
    """A special token's logprob entry has the bytes the text gives it: none where the text
    leaves it out (skip_special_tokens, the default), its text where the text keeps it; an
    echoed prompt keeps it (the prompt's own text), and the offsets after it count it."""
    im_start = 1  # <|im_start|> in the tiny tokenizer (special)
    for skip, want in ((False, "<|im_start|>" * 2), (True, "")):
        ch = post_ok(client, "/v1/chat/completions", messages=CONV[:1], temperature=0,
                   max_tokens=2, logprobs=True, skip_special_tokens=skip,
                   logit_bias={str(im_start): 100})["choices"][0]
        lp = ch["logprobs"]["content"]
        assert ch["message"]["content"] == want
        assert b"".join(bytes(t["bytes"]) for t in lp) == want.encode()
    ch = post_ok(client, "/v1/completions", prompt="A<|im_start|>B", max_tokens=0, echo=True,
               logprobs=0)["choices"][0]
    assert ch["text"] == "A<|im_start|>B" and ch["logprobs"]["tokens"] == ["A", "<|im_start|>", "B"]
    assert ch["logprobs"]["text_offset"] == [0, 1, 13]


def test_token_bytes_of_sentencepiece_byte_fallback():
    """Mixtral's kind of vocabulary: ``<0xNN>`` tokens are that byte, ``▁`` a space."""
    from types import SimpleNamespace
    from writescope.server.token_bytes import CharOffsets, TokenBytes
    pieces = {0: "<0xF0>", 1: "<0x9F>", 2: "<0x90>", 3: "<0xB1>", 4: "▁cat"}
    hf = SimpleNamespace(convert_ids_to_tokens=pieces.get, added_tokens_decoder={})
    tb = TokenBytes(SimpleNamespace(hf=hf, decode=lambda ids, skip_special_tokens=True: "?"))
    assert b"".join(tb.bytes(i) for i in range(5)) == "🐱 cat".encode()
    assert [tb.text(i) for i in (0, 4)] == ["\\xf0", " cat"]
    at = CharOffsets(3)
    assert [at.add(tb.bytes(i)) for i in range(5)] == [3, 3, 3, 3, 4] and at.chars == 8


def test_a_client_gone_during_its_body_is_a_400_not_a_server_error(client, caplog):
    """A client that disconnects while sending its body (a proxy timing out an upload) gets a
    400 and no error is logged (it was an unhandled ClientDisconnect: a 500 and two
    tracebacks); the server goes on serving."""
    import asyncio
    import logging
    msgs = [{"type": "http.request", "body": b'{"prompt": "hel', "more_body": True},
            {"type": "http.disconnect"}]
    sent = []

    async def receive():
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(m):
        sent.append(m)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "server": ("testserver", 80),
             "client": ("testclient", 5000),
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")]}
    with caplog.at_level(logging.ERROR):
        asyncio.run(client.app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 400
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200


def _sse_chunks(client, path, body):
    chunks = []
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@pytest.mark.parametrize("path,extra", [("/v1/chat/completions", {"messages": CONV[:1]}),
                                        ("/v1/completions", {"prompt": "Rivers are", "n": 2})])
def test_stream_chunks_carry_usage_only_when_include_usage_asks(client, path, extra):
    """OpenAI's chunks: the ``usage`` key is there only with ``stream_options.include_usage``
    -- then null on every chunk but the last, whose choices are empty -- and absent without
    it (a client that tells the usage chunk by the key's presence must not see it early)."""
    body = dict(extra, max_tokens=3, temperature=0, stream=True)
    plain = _sse_chunks(client, path, body)
    assert plain and all("usage" not in c for c in plain)
    asked = _sse_chunks(client, path, {**body, "stream_options": {"include_usage": True}})
    *rest, last = asked
    assert rest and all("usage" in c and c["usage"] is None for c in rest)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3 * extra.get("n", 1)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_context_length_error_names_the_field_the_request_used(client, field):
    """A chat request whose budget does not fit the context: the 400's ``param`` is the field
    the client sent (OpenAI's ``max_completion_tokens``, or the older ``max_tokens``)."""
    r = client.post("/v1/chat/completions", json={"messages": CONV[:1], field: 100000})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == field
