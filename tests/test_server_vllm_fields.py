"""What vLLM's OpenAI server accepts, accepted here too, in process against a tiny checkpoint:
unknown fields ignored with vLLM's warning, vLLM's request fields (``add_special_tokens``,
``request_id``, ``priority``, ``return_tokens_as_token_ids``, ``chat_template`` behind
``--trust-request-chat-template``, ``documents``; the ones refused or ignored as vLLM does), and
CORS preflights (vLLM's ``--allowed-origins`` & co.)."""
from __future__ import annotations

import json
import logging
import re

import pytest

pytest.importorskip("fastapi")

TEMPLATE = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%- endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
# a retrieval-augmented template: renders the request's documents before the conversation
RAG = ("{%- for d in documents or [] -%}[{{ d.title }}: {{ d.text }}]{%- endfor -%}"
       + TEMPLATE)
CHAT = [{"role": "user", "content": "Tell me about rivers."}]
BOS = 0  # <|endoftext|>: the tokenizer adds it in front of a text with add_special_tokens


@pytest.fixture(scope="module")
def engine(tiny_qwen3_moe):
    from tokenizers import processors
    from writescope.engine.engine import LLMEngine
    eng = LLMEngine(str(tiny_qwen3_moe), dtype="float32", device="cpu", max_model_len=512)
    eng.tokenizer.hf.chat_template = TEMPLATE
    # a tokenizer that adds a BOS (as Llama's), so that add_special_tokens shows in the prompt
    eng.tokenizer.hf._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", BOS)])
    return eng


@pytest.fixture(scope="module")
def client(engine):
    from starlette.testclient import TestClient
    from writescope.server.api import create_app
    with TestClient(create_app(engine)) as c:
        yield c


@pytest.fixture
def server(client):
    """The app's server, its flags put back after the test."""
    srv = client.app.state.server
    saved = (srv.trust_request_chat_template, srv.return_tokens_as_token_ids)
    yield srv
    srv.trust_request_chat_template, srv.return_tokens_as_token_ids = saved


def _post(client, path, **body):
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _error(client, path, **body) -> dict:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    return r.json()["error"]


# ------------------------------------------------------------------------ unknown fields

def test_unknown_fields_are_ignored_with_vllms_warning(client, caplog):
    """A field this server does not know (top level or nested) is dropped, the answer is the
    one without it, and one warning names them all; a known field keeps its strict type
    check."""
    body = dict(prompt="Rivers are", max_tokens=4, temperature=0)
    plain = _post(client, "/v1/completions", **body)["choices"][0]["text"]
    with caplog.at_level(logging.WARNING, logger="writescope.server"):
        got = _post(client, "/v1/completions", **body, frobnicate=True,
                    structured_outputs=None, response_format={"type": "text", "extra": 1})
    assert got["choices"][0]["text"] == plain
    (warning,) = [r.getMessage() for r in caplog.records
                  if "present in the request but ignored" in r.getMessage()]
    assert "frobnicate" in warning and "extra" in warning
    chat = _post(client, "/v1/chat/completions", messages=CHAT, max_tokens=3, temperature=0,
                 some_new_openai_field={"x": 1})
    assert chat["choices"][0]["message"]["role"] == "assistant"
    err = _error(client, "/v1/completions", **body, add_special_tokens="no")
    assert err["param"] == "add_special_tokens" and err["code"] == "invalid_value"


# ------------------------------------------------------------------------ add_special_tokens

def test_add_special_tokens_on_completions_defaults_to_true(client, engine):
    """vLLM's completions default: the tokenizer's special tokens (a BOS here) are added to a
    text prompt; false leaves them out."""
    text = "Rivers are"
    n = len(engine.tokenizer.encode(text, add_special_tokens=False))
    body = dict(prompt=text, max_tokens=1, temperature=0, echo=True, logprobs=0)
    on = _post(client, "/v1/completions", **body)
    off = _post(client, "/v1/completions", **body, add_special_tokens=False)
    assert on["usage"]["prompt_tokens"] == n + 1 and off["usage"]["prompt_tokens"] == n
    assert on["choices"][0]["logprobs"]["tokens"][0] == "<|endoftext|>"
    assert off["choices"][0]["logprobs"]["tokens"][0] != "<|endoftext|>"


def test_add_special_tokens_on_chat_defaults_to_false(client, engine):
    """vLLM's chat default: the template writes its own special tokens, none are added;
    true adds the tokenizer's on top (also on /tokenize, which counts what chat runs)."""
    ids = engine.tokenizer.apply_chat_template(CHAT)
    assert ids[0] != BOS
    body = dict(messages=CHAT, max_tokens=1, temperature=0)
    assert _post(client, "/v1/chat/completions", **body)["usage"]["prompt_tokens"] == len(ids)
    on = _post(client, "/v1/chat/completions", **body, add_special_tokens=True)
    assert on["usage"]["prompt_tokens"] == len(ids) + 1
    tok = _post(client, "/tokenize", messages=CHAT, add_special_tokens=True)
    assert tok["tokens"] == [BOS] + ids


# ------------------------------------------------------------------------ request_id, priority

def test_request_id_names_the_response(client):
    """vLLM's ``request_id``: the response's id is ``cmpl-<id>`` / ``chatcmpl-<id>`` (an
    ``X-Request-Id`` header first); a client may reuse one, even within one request's
    choices."""
    got = _post(client, "/v1/completions", prompt="Rivers", max_tokens=2, request_id="abc", n=2)
    assert got["id"] == "cmpl-abc" and len(got["choices"]) == 2
    assert _post(client, "/v1/completions", prompt="Rivers", max_tokens=2,
                 request_id="abc")["id"] == "cmpl-abc"
    chat = _post(client, "/v1/chat/completions", messages=CHAT, max_tokens=2, request_id="q-1")
    assert chat["id"] == "chatcmpl-q-1"
    r = client.post("/v1/chat/completions", headers={"X-Request-Id": "from-header"},
                    json=dict(messages=CHAT, max_tokens=2, request_id="q-1"))
    assert r.json()["id"] == "chatcmpl-from-header"
    with client.stream("POST", "/v1/chat/completions", json=dict(
            messages=CHAT, max_tokens=2, stream=True, request_id="s-9")) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert chunks and {c["id"] for c in chunks} == {"chatcmpl-s-9"}
    assert _post(client, "/v1/completions", prompt="Rivers", max_tokens=1)["id"] != "cmpl-abc"


def test_priority_other_than_zero_is_refused(client):
    """No priority scheduling here (the default --scheduling-policy fcfs): vLLM then refuses
    any priority but 0 (tests/test_priority.py: under the priority policy)."""
    body = dict(prompt="Rivers", max_tokens=1)
    assert _post(client, "/v1/completions", **body, priority=0)["choices"]
    err = _error(client, "/v1/completions", **body, priority=-3)
    assert err["param"] == "priority" and "priority scheduling" in err["message"]
    err = _error(client, "/v1/chat/completions", messages=CHAT, max_tokens=1, priority=2)
    assert err["param"] == "priority"


# ------------------------------------------------------------------------ token ids as tokens

def test_return_tokens_as_token_ids(client, engine, server):
    """vLLM's ``return_tokens_as_token_ids``: the log-probabilities name each token
    ``token_id:N`` (the top alternatives too), the ids the text decodes from; the server's
    flag makes it the default, a request's false overrides it."""
    body = dict(prompt="Rivers are", max_tokens=4, temperature=0, logprobs=2)
    lp = _post(client, "/v1/completions", **body,
               return_tokens_as_token_ids=True)["choices"][0]
    toks = lp["logprobs"]["tokens"]
    assert all(re.fullmatch(r"token_id:\d+", t) for t in toks)
    ids = [int(t.split(":")[1]) for t in toks]
    assert engine.tokenizer.decode(ids) == lp["text"]
    for top in lp["logprobs"]["top_logprobs"]:
        assert all(re.fullmatch(r"token_id:\d+", k) for k in top)
    chat_body = dict(messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    ch = _post(client, "/v1/chat/completions", **chat_body,
               return_tokens_as_token_ids=True)["choices"][0]
    content = ch["logprobs"]["content"]
    assert all(re.fullmatch(r"token_id:\d+", e["token"]) for e in content)
    assert all(re.fullmatch(r"token_id:\d+", a["token"]) for e in content
               for a in e["top_logprobs"])
    assert engine.tokenizer.decode([int(e["token"][9:]) for e in content]) == \
        ch["message"]["content"]
    # each entry's bytes are its name's, as vLLM's (not the token's own bytes)
    assert all(bytes(x["bytes"]) == x["token"].encode() for e in content
               for x in [e, *e["top_logprobs"]])
    plain = _post(client, "/v1/completions", **body)["choices"][0]["logprobs"]["tokens"]
    assert not any(t.startswith("token_id:") for t in plain)
    server.return_tokens_as_token_ids = True  # --return-tokens-as-token-ids
    assert _post(client, "/v1/completions", **body)["choices"][0]["logprobs"]["tokens"] == toks
    assert _post(client, "/v1/completions", **body, return_tokens_as_token_ids=False)[
        "choices"][0]["logprobs"]["tokens"] == plain


# ------------------------------------------------------------------------ chat templates

def test_request_chat_template_needs_the_servers_trust(client, engine, server):
    """A request's ``chat_template`` is code the server would run: refused (400, vLLM's
    wording) unless the server trusts request templates; then it replaces the model's, on the
    chat endpoint and on /tokenize alike."""
    custom = "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"
    for path, body in (("/v1/chat/completions", dict(messages=CHAT, max_tokens=1)),
                       ("/tokenize", dict(messages=CHAT))):
        err = _error(client, path, **body, chat_template=custom)
        assert err["param"] == "chat_template"
        assert "--trust-request-chat-template" in err["message"]
    server.trust_request_chat_template = True
    want = engine.tokenizer.encode("<<Tell me about rivers.>>", add_special_tokens=False)
    assert _post(client, "/tokenize", messages=CHAT, chat_template=custom)["tokens"] == want
    got = _post(client, "/v1/chat/completions", messages=CHAT, max_tokens=1,
                chat_template=custom)
    assert got["usage"]["prompt_tokens"] == len(want)


def test_documents_reach_the_template(client, engine, server):
    """vLLM's ``documents``: handed to the template (a RAG template renders them; others
    ignore them)."""
    docs = [{"title": "Nile", "text": "long"}, {"title": "Rhine", "text": "green"}]
    plain = _post(client, "/tokenize", messages=CHAT, documents=docs)["tokens"]
    assert plain == engine.tokenizer.apply_chat_template(CHAT)  # the model's: no documents
    server.trust_request_chat_template = True
    got = _post(client, "/tokenize", messages=CHAT, documents=docs, chat_template=RAG)
    text = "[Nile: long][Rhine: green]" + engine.tokenizer.decode(plain, skip_special_tokens=False)
    assert got["tokens"] == engine.tokenizer.encode(text, add_special_tokens=False)
    chat = _post(client, "/v1/chat/completions", messages=CHAT, max_tokens=1,
                 documents=docs, chat_template=RAG)
    assert chat["usage"]["prompt_tokens"] == got["count"]


# ------------------------------------------------------------------------ vLLM's other fields

def test_vllm_fields_this_server_ignores_change_nothing(client, caplog):
    """Fields vLLM takes that change nothing here (beam search's length penalty without beam
    search, the structured-output backend, disaggregation's and extensions' parameters, multimodal
    processor options; OpenAI's ``user`` and ``parallel_tool_calls``) are accepted, the answer
    unchanged, and ``top_logprobs`` 0 without logprobs (vLLM's default) is no error."""
    body = dict(messages=CHAT, max_tokens=4, temperature=0)
    plain = _post(client, "/v1/chat/completions", **body)["choices"][0]["message"]
    extra = dict(length_penalty=1.5, guided_decoding_backend="xgrammar",
                 kv_transfer_params={"do_remote_decode": False}, vllm_xargs={"a": 1},
                 mm_processor_kwargs={}, user="u-1", parallel_tool_calls=True, top_logprobs=0,
                 use_beam_search=False, priority=0)
    with caplog.at_level(logging.WARNING, logger="writescope.server"):
        got = _post(client, "/v1/chat/completions", **body, **extra)["choices"][0]["message"]
    assert got == plain
    (warning,) = [r.getMessage() for r in caplog.records
                  if "accepted and ignored" in r.getMessage()]
    assert all(k in warning for k in ("guided_decoding_backend", "kv_transfer_params",
                                      "vllm_xargs", "mm_processor_kwargs"))
    assert not any("present in the request but ignored" in r.getMessage()
                   for r in caplog.records)


@pytest.mark.parametrize("path,field,value", [
    ("/v1/completions", "logits_processors", ["my.Processor"]),
    ("/v1/completions", "prompt_embeds", "AAAA"),
    ("/v1/chat/completions", "structural_tag", "{}"),
])
def test_vllm_fields_this_server_cannot_honour_are_refused(client, path, field, value):
    body = dict(prompt="Rivers") if path == "/v1/completions" else dict(messages=CHAT)
    err = _error(client, path, **body, max_tokens=1, **{field: value})
    assert err["param"] == field and "not supported" in err["message"]


def test_cache_salt_keeps_cached_prompts_apart(client):
    """vLLM's ``cache_salt``: a prompt's cached blocks are found again by the same salt only
    (``usage.prompt_tokens_details.cached_tokens``); an empty salt is a 400."""
    prompt = [5 + 7 * i % 300 for i in range(200)]  # token ids: 3 blocks of 64 and a tail

    def cached(**salt):
        body = _post(client, "/v1/completions", prompt=prompt, max_tokens=1, **salt)
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the cache starts empty: no kept tail of an earlier unsalted prompt (the one below
    # would share its records as far as their tokens agree)
    assert client.post("/reset_prefix_cache").status_code == 200
    assert cached(cache_salt="alpha") == 0
    assert cached(cache_salt="beta") == 0
    # alpha's 3 blocks (192), then 7 of the 8 records alpha's first run kept after them
    # (``kvcache/tails.py``): every prompt token but the last, which is computed anyway
    assert cached(cache_salt="alpha") == 192 + 7
    assert cached() == 0  # unsalted: none of the salted blocks or tails
    _post(client, "/v1/chat/completions", messages=CHAT, max_tokens=1, cache_salt="gamma")
    err = _error(client, "/v1/completions", prompt="Rivers", max_tokens=1, cache_salt="")
    assert err["param"] == "cache_salt"


# ------------------------------------------------------------------------ CORS

def test_cors_preflight_with_vllms_defaults(client):
    """vLLM's defaults (any origin, method and header, no credentials): a browser's preflight
    is answered, and the answer to the request itself names the origin allowed."""
    r = client.options("/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "*"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in r.headers
    r = client.get("/v1/models", headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_cors_flags_restrict_origins_and_allow_credentials(engine):
    """``--allowed-origins`` (words or vLLM's JSON list) and ``--allow-credentials``: another
    origin's preflight is refused, the allowed one's answered with credentials."""
    from starlette.testclient import TestClient
    from writescope.cli import build_parser
    from writescope.commands.serve import cors_options
    from writescope.server.api import create_app
    args = build_parser().parse_args(["serve", "--allowed-origins", '["http://app.example"]',
                                      "--allow-credentials", "--allowed-methods", "GET", "POST"])
    cors = cors_options(args)
    assert cors.allowed_origins == ("http://app.example",) and cors.allow_credentials
    c = TestClient(create_app(engine, cors=cors))  # no lifespan: the preflight needs no engine
    pre = {"Access-Control-Request-Method": "POST"}
    r = c.options("/v1/completions", headers={"Origin": "http://app.example", **pre})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    assert r.headers["access-control-allow-credentials"] == "true"
    r = c.options("/v1/completions", headers={"Origin": "http://evil.example", **pre})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = c.options("/v1/completions", headers={"Origin": "http://app.example",
                                               "Access-Control-Request-Method": "DELETE"})
    assert r.status_code == 400
    bad = build_parser().parse_args(["serve", "--allowed-origins", "[1, 2]"])
    with pytest.raises(ValueError):
        cors_options(bad)
