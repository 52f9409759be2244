"""`writescope serve` end to end: the real server in a subprocess on a free loopback port, the real
engine with the embedded default model (float32, CPU), driven by the official ``openai`` client.

One server is shared by the module (starting one costs ~20 s of CPU here); the reference
``LLM`` loads in this process meanwhile. The server needs an API key and has a small KV budget
(24 blocks of 64 tokens, all in G) against a 2048-token context, so admission control can be
shown: a request that can never fit is refused, ones that fit later wait. The last test stops
the server with SIGTERM mid-stream. Every request loop is bounded in count and time.
"""
from __future__ import annotations

import concurrent.futures
import math
import os
import signal
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from writescope.bench.serve import LaunchedServer  # noqa: E402
from writescope.core import SamplingParams  # noqa: E402
from writescope.server.metrics import parse_text  # noqa: E402

MODEL = "writescope-default"
MAX_LEN = 2048
KV_BLOCKS = 24   # sealed blocks in all (G only: bit-identical attention to the reference)
BLOCK = 64       # the engine's default block size
API_KEY = "test-key-123"
SERVER_ARGS = ["--dtype", "float32", "--device", "cpu", "--max-model-len", str(MAX_LEN),
               "--max-num-seqs", "16", "--num-gpu-blocks", str(KV_BLOCKS), "--pinned-budget", "0",
               "--host-budget", "0", "--api-key", API_KEY, "--shutdown-timeout", "4"]
GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def server():
    # build the default model and this machine's planner profile once, here, before two processes
    # (the server and the reference LLM) would each do it at the same time on a fresh machine
    from writescope.models.config import ModelConfig
    from writescope.models.default import default_model_path
    from writescope.planner.profile import load_or_default
    load_or_default(model_config=ModelConfig.from_hf(default_model_path()))
    # one intra-op thread: the server shares 2 cores with this process (the reference model, the
    # clients); two busy-waiting OpenMP teams on 2 cores make every op many times slower
    env = dict(os.environ, OMP_NUM_THREADS="1")
    srv = LaunchedServer(SERVER_ARGS, env=env)  # starts loading in the background
    try:
        from writescope.kvcache.regions import DEFAULT_BLOCK_SIZE
        assert DEFAULT_BLOCK_SIZE == BLOCK
        yield srv
    finally:
        srv.stop(60)


@pytest.fixture(scope="module")
def llm(server):
    import torch

    from writescope.llm import LLM
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server: one intra-op thread each on this 2-core machine
    try:
        ref = LLM(dtype="float32", device="cpu", max_model_len=MAX_LEN)  # loads meanwhile
        server.wait_ready(240)
        yield ref
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def url(server, llm):
    return server.url


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _ref(llm, prompt, **kw):
    return llm.generate([prompt], SamplingParams(**GREEDY, **kw))[0]


def _metrics(url: str) -> dict[str, float]:
    r = httpx.get(url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return parse_text(r.text)


def _kv_blocks(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.startswith("writescope_kv_blocks{"))


def _wait_idle(url: str, timeout: float = 20.0) -> dict[str, float]:
    """Poll /metrics until nothing runs or waits and no KV block is held (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        m = _metrics(url)
        idle = (m["writescope_num_requests_running"] == 0
                and m["writescope_num_requests_waiting"] == 0 and _kv_blocks(m) == 0)
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------


def test_models_health_and_metrics_families(client, url):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL]
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    import writescope
    assert httpx.get(url + "/version", timeout=10).json() == {"version": writescope.__version__}
    m = _metrics(url)
    for name in ("writescope_num_requests_running", "writescope_num_requests_waiting",
                 "writescope_generation_tokens_per_second",
                 'writescope_time_to_first_token_seconds_bucket{le="+Inf"}',
                 'writescope_time_per_output_token_seconds_bucket{le="+Inf"}',
                 'writescope_kv_blocks{region="G"}', 'writescope_kv_blocks{region="W"}',
                 'writescope_kv_blocks{region="C"}', "writescope_planner_cpu_share",
                 "writescope_planner_prediction_error"):
        assert name in m, name


def test_completion_greedy_equals_llm_generate(client, llm):
    for prompt, n in (("Once upon a time", 24), ("The old king walked to the", 9)):
        ref = _ref(llm, prompt, max_tokens=n)
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n,
                                      **GREEDY)
        assert r.object == "text_completion"
        assert r.choices[0].text == ref.text
        assert r.choices[0].finish_reason == ref.finish_reason
        assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert r.usage.completion_tokens == len(ref.token_ids)
        # streaming: the pieces add up to the same text; usage arrives last
        pieces, reasons, usage = [], [], None
        with client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, stream=True,
                                       stream_options={"include_usage": True}, **GREEDY) as s:
            for chunk in s:
                if chunk.usage is not None:
                    usage = chunk.usage
                for c in chunk.choices:
                    pieces.append(c.text)
                    reasons.append(c.finish_reason)
        assert "".join(pieces) == ref.text
        assert reasons[-1] == ref.finish_reason and all(x is None for x in reasons[:-1])
        assert usage.completion_tokens == len(ref.token_ids)


def test_token_prompt_and_n_and_echo(client, llm):
    ids = llm.tokenizer.encode("A quiet river")
    ref = _ref(llm, ids, max_tokens=12)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, n=2,
                                  echo=True, **GREEDY)
    prompt_text = llm.tokenizer.decode(ids)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.text == prompt_text + ref.text for c in r.choices)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 2 * len(ref.token_ids)
    # a batch of prompts: one choice per prompt, in order
    prompts = ["First", "Second one is longer than the first"]
    refs = [_ref(llm, p, max_tokens=6) for p in prompts]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, **GREEDY)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [x.text for x in refs]


def test_chat_greedy_equals_llm_generate(client, llm):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Tell me about the sea."}]
    ids = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ref = _ref(llm, ids, max_tokens=20)
    r = client.chat.completions.create(model=MODEL, messages=messages,
                                       max_tokens=20, **GREEDY)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(ids)
    pieces, roles, reasons = [], [], []
    with client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=20,
                                        stream=True,
                                        **GREEDY) as s:
        for chunk in s:
            assert chunk.object == "chat.completion.chunk"
            for c in chunk.choices:
                roles.append(c.delta.role)
                pieces.append(c.delta.content or "")
                reasons.append(c.finish_reason)
    assert roles[0] == "assistant"
    assert "".join(pieces) == ref.text
    assert reasons[-1] == ref.finish_reason


def test_stop_strings_and_logprobs(client, llm):
    prompt = "Once upon a time"
    ref = _ref(llm, prompt, max_tokens=32, ignore_eos=True)
    text = ref.text
    # a stop string from the middle of the greedy text: output ends right before it
    stop = next(text[i:i + 3] for i in range(len(text) // 3, len(text) - 3)
                if text[i:i + 3].strip() and len(set(text[i:i + 3])) > 1)
    want = text[:text.index(stop)]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, stop=[stop],
                                  extra_body={"ignore_eos": True}, **GREEDY)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    with client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, stop=stop,
                                   stream=True,
                                   extra_body={"ignore_eos": True}, **GREEDY) as s:
        got = "".join(c.text for chunk in s for c in chunk.choices)
    assert got == want  # no part of the stop string leaked into the stream
    # log-probabilities of the sampled tokens
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, logprobs=1,
                                  extra_body={"ignore_eos": True}, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == r.usage.completion_tokens == 8
    assert all(v <= 0 and math.isfinite(v) for v in lp.token_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=5, logprobs=True, **GREEDY)
    assert len(c.choices[0].logprobs.content) == c.usage.completion_tokens
    assert all(t.logprob <= 0 for t in c.choices[0].logprobs.content)


def test_top_logprobs(client, llm):
    """``logprobs: k`` (completions) and ``top_logprobs: k`` (chat): the k most likely tokens
    per generated token, as ``LLM.generate(..., SamplingParams(logprobs=k))`` reports them;
    streamed chunks carry the same."""
    prompt = "Once upon a time"
    ref = _ref(llm, prompt, max_tokens=6, ignore_eos=True, logprobs=3)
    tok = llm.tokenizer
    want = [{tok.decode([t]): v for t, v in reversed(d.items())} for d in ref.top_logprobs]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, logprobs=3,
                                  extra_body={"ignore_eos": True}, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.top_logprobs) == 6
    for top, sampled, w, chosen in zip(lp.top_logprobs, lp.tokens, want, lp.token_logprobs):
        assert 3 <= len(top) <= 4 and top[sampled] == pytest.approx(chosen, abs=1e-5)
        for t, v in w.items():
            assert top[t] == pytest.approx(v, abs=1e-5)
    with client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, logprobs=3,
                                   stream=True, extra_body={"ignore_eos": True}, **GREEDY) as s:
        streamed = [d for chunk in s for c in chunk.choices if c.logprobs
                    for d in c.logprobs.top_logprobs]
    assert streamed == lp.top_logprobs
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=5, logprobs=True, top_logprobs=2, **GREEDY)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.top_logprobs[0].token == item.token  # greedy: the sampled token leads
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob, abs=1e-6)
    with client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=5, logprobs=True, top_logprobs=2, stream=True,
                                        **GREEDY) as s:
        items = [i for chunk in s for ch in chunk.choices if ch.logprobs
                 for i in ch.logprobs.content]
    assert [i.model_dump() for i in items] == [i.model_dump() for i in content]


def test_penalties_and_bias_equal_llm_generate(client, llm):
    """presence / frequency / repetition penalties, min_tokens and logit_bias reach the
    engine: the server's greedy text is ``LLM.generate``'s with the same settings, and a token
    id outside the vocabulary is a 400."""
    prompt = "Once upon a time"
    kw = dict(presence_penalty=0.5, frequency_penalty=1.0, repetition_penalty=1.2, min_tokens=4)
    ref = _ref(llm, prompt, max_tokens=16, logit_bias={50: 3.0}, **kw)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                  presence_penalty=0.5, frequency_penalty=1.0,
                                  logit_bias={"50": 3.0}, **GREEDY,
                                  extra_body={"repetition_penalty": 1.2, "min_tokens": 4})
    assert r.choices[0].text == ref.text and r.usage.completion_tokens == len(ref.token_ids)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                  logit_bias={"99999999": 1.0})


def test_tokenize_and_detokenize(url, llm):
    h = {"Authorization": f"Bearer {API_KEY}"}
    tok = llm.tokenizer
    r = httpx.post(url + "/tokenize", json={"prompt": "Once upon a time",
                                            "return_token_strs": True}, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode("Once upon a time") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == MAX_LEN and "".join(body["token_strs"]) == "Once upon a time"
    conv = [{"role": "user", "content": "hi"}]
    r = httpx.post(url + "/tokenize", json={"messages": conv}, headers=h, timeout=30)
    assert r.json()["tokens"] == list(tok.apply_chat_template(conv))
    r = httpx.post(url + "/detokenize", json={"tokens": body["tokens"]}, headers=h, timeout=30)
    assert r.json() == {"prompt": "Once upon a time"}
    for path, bad in (("/tokenize", {"prompt": "x", "messages": conv}), ("/tokenize", {}),
                      ("/detokenize", {"tokens": [10 ** 9]}), ("/detokenize", {"tokens": "x"})):
        r = httpx.post(url + path, json=bad, headers=h, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["message"], (path, bad)
    assert httpx.post(url + "/tokenize", json={"prompt": "x"}, timeout=30).status_code == 401


def test_echo_with_logprobs_scores_the_prompt(client, llm):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, one new token. The
    prompt's tokens come first, the first without a log-probability, each other's as
    ``LLM.generate(..., SamplingParams(prompt_logprobs=1))`` gives it; then the new token's.
    Streamed, the echo chunk carries the prompt's."""
    prompt = "The sea was calm and the ship sailed on"
    ref = _ref(llm, prompt, max_tokens=1, ignore_eos=True, prompt_logprobs=1, logprobs=1)
    n = len(ref.prompt_token_ids)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, echo=True,
                                  logprobs=1, extra_body={"ignore_eos": True}, **GREEDY)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for got, want in zip(lp.token_logprobs[1:n], ref.prompt_token_logprobs[1:]):
        assert got == pytest.approx(want, abs=1e-5)
    assert lp.token_logprobs[n] == pytest.approx(ref.logprobs[0], abs=1e-5)
    assert all(lp.tokens[i] in lp.top_logprobs[i] for i in range(1, n + 1))
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    with client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, echo=True,
                                   logprobs=1, stream=True, extra_body={"ignore_eos": True},
                                   **GREEDY) as s:
        chunks = [c for chunk in s for c in chunk.choices]
    assert chunks[0].text == prompt and chunks[0].logprobs.token_logprobs[0] is None
    streamed = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert streamed == lp.token_logprobs


def test_echo_without_generation(client, llm):
    """max_tokens 0 with echo (vLLM's echo without generation, lm-evaluation-harness's form
    for scoring a whole text): the prompt back with its logprobs, no token generated,
    finish_reason "length", 0 completion tokens; streamed the same. Without echo it is a 400."""
    prompt = "The sea was calm and the ship sailed on"
    ref = _ref(llm, prompt, max_tokens=1, ignore_eos=True, prompt_logprobs=1)
    n = len(ref.prompt_token_ids)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True,
                                  logprobs=1, **GREEDY)
    c = r.choices[0]
    assert c.text == prompt and c.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == n
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == n and lp.token_logprobs[0] is None
    for got, want in zip(lp.token_logprobs[1:], ref.prompt_token_logprobs[1:]):
        assert got == pytest.approx(want, abs=1e-5)
    with client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True,
                                   logprobs=1, stream=True, **GREEDY) as s:
        chunks = [c for chunk in s for c in chunk.choices]
    assert "".join(c.text for c in chunks) == prompt and chunks[-1].finish_reason == "length"
    assert [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs] == \
        lp.token_logprobs
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True)
    assert plain.choices[0].text == prompt and plain.usage.completion_tokens == 0
    # past the context: refused as any prompt is (the whole context is scored: its one token
    # is never written, test_engine.test_limits; this server's KV budgets hold less)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=[5] * (MAX_LEN + 1), max_tokens=0,
                                  echo=True)
    with pytest.raises(openai.BadRequestError, match="0 only with echo"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=0)


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


def test_structured_outputs_equal_llm_generate(client, llm):
    """response_format (json_schema, json_object), vLLM's structured_outputs and guided_*
    fields reach the engine: greedy texts are LLM.generate's under the same constraint, valid
    for it, streamed or not."""
    import json

    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    from writescope.core import StructuredOutputsParams as S
    messages = [{"role": "user", "content": "Describe a person."}]
    ids = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ref = _ref(llm, ids, max_tokens=60, structured_outputs=S(json=PERSON))
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                 "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60,
                                       response_format=rf, **GREEDY)
    text = r.choices[0].message.content
    assert text == ref.text and r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    with client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60,
                                        response_format=rf, stream=True, **GREEDY) as s:
        assert "".join(c.delta.content or "" for chunk in s for c in chunk.choices) == text
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                       response_format={"type": "json_object"}, **GREEDY)
    assert r.choices[0].message.content == _ref(llm, ids, max_tokens=8, structured_outputs=S(
        json_object=True)).text
    assert r.choices[0].message.content.startswith("{")
    prompt = "The answer is"
    for body, so in (({"guided_choice": ["yes", "no"]}, S(choice=["yes", "no"])),
                     ({"structured_outputs": {"regex": "[0-9]{2}-[a-z]{3}"}},
                      S(regex="[0-9]{2}-[a-z]{3}")),
                     ({"guided_json": PERSON}, S(json=PERSON))):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=60,
                                      extra_body=body, **GREEDY)
        assert r.choices[0].text == _ref(llm, prompt, max_tokens=60, structured_outputs=so).text
        assert r.choices[0].finish_reason == "stop"


def test_32_concurrent_streams_with_disconnects(client, llm, url):
    """32 streaming clients of mixed lengths (16 run at once, the rest wait); every third one
    hangs up after a few chunks. The others get exactly the greedy output of LLM.generate;
    afterwards no request runs or waits and no KV block is held."""
    words = "the sea was calm and the ship sailed on through the night".split()
    prompts, max_tokens = [], []
    for i in range(32):
        k = 1 + (i * 7) % 40  # 1..40 words: 2..~60 tokens
        prompts.append(" ".join(words[j % len(words)] for j in range(i, i + k)))
        max_tokens.append(8 + (i * 5) % 33)
    quitters = {i for i in range(32) if i % 3 == 1}
    for i in quitters:
        max_tokens[i] = 100  # long, so they are surely mid-stream when the client leaves
    keep = [i for i in range(32) if i not in quitters]
    refs = llm.generate([prompts[i] for i in keep],
                        [SamplingParams(**GREEDY, max_tokens=max_tokens[i], ignore_eos=True)
                         for i in keep])
    ref = dict(zip(keep, refs))
    before = _metrics(url).get('writescope_request_success_total{finished_reason="abort"}', 0)

    def run(i: int):
        s = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=max_tokens[i],
                                      stream=True,
                                      extra_body={"ignore_eos": True}, **GREEDY)
        pieces, reason = [], None
        with s:
            for n, chunk in enumerate(s):
                for c in chunk.choices:
                    pieces.append(c.text)
                    reason = c.finish_reason or reason
                if i in quitters and n >= 2:
                    break  # leaving the with-block closes the connection mid-stream
        return "".join(pieces), reason

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        futs = {i: pool.submit(run, i) for i in range(32)}
        results = {i: f.result(timeout=120) for i, f in futs.items()}
    for i in keep:
        text, reason = results[i]
        assert text == ref[i].text, f"client {i}"
        assert reason == "length"
    m = _wait_idle(url)
    assert m["writescope_num_requests_running"] == 0
    assert m["writescope_num_requests_waiting"] == 0
    assert _kv_blocks(m) == 0
    aborted = m.get('writescope_request_success_total{finished_reason="abort"}', 0) - before
    assert aborted == len(quitters)


BAD = [
    # (path, raw body or dict, status, error code or None)
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": ', 400, "invalid_json"),
    ("/v1/completions", b"[1, 2, 3]", 400, "invalid_json"),
    ("/v1/completions", b"", 400, None),
    ("/v1/completions", {"prompt": "hi", "model": "no-such-model"}, 404, "model_not_found"),
    ("/v1/completions", {"prompt": "word " * (MAX_LEN + 10)}, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10 ** 12}, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "16"}, 400, None),
    ("/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400, None),
    ("/v1/completions", {"prompt": "hi", "temperature": 7}, 400, None),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, None),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, None),
    ("/v1/completions", {"prompt": "hi", "priority": 1}, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, None),
    ("/v1/completions", {"prompt": "hi", "stop": 5}, 400, None),
    ("/v1/completions", {"prompt": "hi", "n": 1.5}, 400, None),
    ("/v1/completions", {"prompt": 12}, 400, None),
    ("/v1/completions", {"prompt": [10 ** 7]}, 400, None),
    ("/v1/completions", {"prompt": []}, 400, None),
    ("/v1/completions", {"max_tokens": 3}, 400, "missing_required_parameter"),
    ("/v1/chat/completions", {"messages": []}, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("/v1/chat/completions", {"messages": "hello"}, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_tokens": 10 ** 9}, 400, "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "temperature": "hot"}, 400, None),
    ("/v1/no/such/route", {"prompt": "x"}, 404, None),
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {"regex": "a(b"}}, 400,
     "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "guided_regex": "a", "guided_choice": ["a"]}, 400, None),
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {}}, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema"}}, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "s", "schema": {"type": "wat"}}}}, 400, None),
]


def test_bad_inputs_get_4xx_and_do_not_disturb_others(client, llm, url):
    prompt = "The wind"
    ref = _ref(llm, prompt, max_tokens=40, ignore_eos=True)
    box = {}

    def background():  # a long stream that runs through every bad request below
        with client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, stream=True,
                                       extra_body={"ignore_eos": True}, **GREEDY) as s:
            box["text"] = "".join(c.text for chunk in s for c in chunk.choices)

    t = threading.Thread(target=background)
    t.start()
    with httpx.Client(base_url=url, timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as h:
        for path, body, status, code in BAD:
            if isinstance(body, bytes):
                r = h.post(path, content=body, headers={"content-type": "application/json"})
            else:
                r = h.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            err = r.json()["error"]
            assert err["message"] and err["type"], r.text
            if code is not None:
                assert err["code"] == code, (body, r.text)
        r = h.get("/v1/completions")
        assert r.status_code == 405 and "error" in r.json()
    # the official client maps them to its exception types
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-nope", prompt="hi")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       top_p=2.0)
    t.join(120)
    assert box.get("text") == ref.text  # undisturbed
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, **GREEDY)  # serving
    assert r.choices[0].text == _ref(llm, prompt, max_tokens=5).text


def test_metrics_histograms_are_consistent(client, url):
    # a request of its own: under pytest-xdist this test may be the first of this module on
    # its worker, whose fresh server has then observed nothing (counts of 0)
    client.completions.create(model=MODEL, prompt="Once", max_tokens=3,
                              extra_body={"ignore_eos": True}, **GREEDY)
    m = _metrics(url)
    for fam in ("writescope_time_to_first_token_seconds",
                "writescope_time_per_output_token_seconds"):
        buckets = sorted(((float(k.split('le="')[1].rstrip('"}')), v) for k, v in m.items()
                          if k.startswith(fam + "_bucket")), key=lambda x: x[0])
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), fam
        assert buckets[-1][0] == math.inf and counts[-1] == m[fam + "_count"] > 0
    assert m["writescope_generation_tokens_total"] > 0
    assert 0.0 <= m["writescope_planner_cpu_share"] <= 1.0


def test_api_key(url):
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = httpx.post(url + "/v1/chat/completions", json={"messages": []}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/health", timeout=10).status_code == 200  # probes need no key


def test_admission_control_rejects_never_fit_and_queues_the_rest(client, url):
    """24 sealed blocks of 64 tokens in all. 100 + 1600 tokens need 26: refused with a 400 before
    anything is written. Three requests of 740 + 40 tokens need 12 each: two run, the third
    waits for KV room, and all three complete."""
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=list(range(10, 110)), max_tokens=1600,
                                  **GREEDY)
    assert "never fit" in str(e.value)
    assert _wait_idle(url, 5) and _kv_blocks(_metrics(url)) == 0

    def run(i):
        return client.completions.create(model=MODEL, prompt=[20 + (j * 7 + i) % 900
                                                              for j in range(740)],
                                         max_tokens=40, extra_body={"ignore_eos": True},
                                         **GREEDY)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(run, range(3), timeout=120))
    assert all(o.usage.completion_tokens == 40 and o.usage.prompt_tokens == 740
               and o.choices[0].finish_reason == "length" for o in outs)
    assert _kv_blocks(_wait_idle(url)) == 0


def test_sigterm_stops_accepting_finishes_or_cancels_and_exits_0(server, client, llm, url):
    """Runs last. SIGTERM with two streams running: the listener closes at once, the short
    stream finishes normally within the grace period (--shutdown-timeout 4), the long one is then
    cancelled through the engine (a clean end: finish_reason "abort", then [DONE]), exit 0."""
    got: dict[str, tuple] = {}
    first_chunk = {"short": threading.Event(), "long": threading.Event()}

    def stream(name, max_tokens):
        pieces, reason = [], None
        with client.completions.create(model=MODEL, prompt="Once", max_tokens=max_tokens,
                                       stream=True, extra_body={"ignore_eos": True},
                                       **GREEDY) as s:
            for chunk in s:
                first_chunk[name].set()
                for ch in chunk.choices:
                    pieces.append(ch.text)
                    reason = ch.finish_reason or reason
        got[name] = ("".join(pieces), reason)

    ref_short = _ref(llm, "Once", max_tokens=12, ignore_eos=True)
    threads = [threading.Thread(target=stream, args=("long", 1500)),
               threading.Thread(target=stream, args=("short", 12))]
    for t in threads:
        t.start()
    assert all(e.wait(60) for e in first_chunk.values())
    server.proc.send_signal(signal.SIGTERM)
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    time.sleep(0.5)
    assert server.proc.poll() is None  # still finishing the running requests ...
    with pytest.raises(OSError):  # ... but no longer accepting
        socket.create_connection((host, int(port)), timeout=2).close()
    for t in threads:
        t.join(90)
    assert got["short"] == (ref_short.text, "length")
    long_text, long_reason = got["long"]
    assert long_reason == "abort"
    assert server.proc.wait(60) == 0, server.output()[-3000:]
