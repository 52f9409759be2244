"""``GET /metrics`` against known workloads, in process on a tiny checkpoint: every counter and
histogram moves by what the workload must produce (vLLM's accounting: each engine request of a
choice counts its prompt, so ``n`` choices count it ``n`` times; beam search's one-token step
requests are requests of their own, as vLLM's ``use_beam_search`` sends them through its
engine), a refused request counts only as refused, a client that leaves counts as aborted,
the gauges fall back to 0 when idle, and the text is valid Prometheus exposition."""
from __future__ import annotations

import asyncio
import json
import math
import re
import time

import pytest

pytest.importorskip("fastapi")

from writescope.server.metrics import parse_text  # noqa: E402

BLOCKS = 6  # KV for 448 tokens of one sequence: a prompt of 480 can never fit (max_model_len 512)
P = [5 + 7 * i % 300 for i in range(20)]
SUCCESS = 'writescope_request_success_total{finished_reason="%s"}'


@pytest.fixture(scope="module")
def client(tiny_qwen3_moe):
    from conftest import in_process_server
    from writescope.engine.engine import LLMEngine
    with pytest.warns(RuntimeWarning, match="longer requests are refused"):
        eng = LLMEngine(str(tiny_qwen3_moe), dtype="float32", device="cpu", max_model_len=512,
                        num_gpu_blocks=BLOCKS, host_budget=0, pinned_budget=0)
    with in_process_server(eng) as c:
        yield c


def _metrics(client) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    return parse_text(r.text)


def _quiet(client) -> dict[str, float]:
    """The metrics once the engine thread has applied every command sent so far (a request
    after them, FIFO, has run to its end: :func:`_delta` takes its counts back out), nothing
    runs or waits, and the engine's stats gauges (published between steps and when it goes
    idle, so a scrape may come just before) have caught up with the engine."""
    r = client.post("/v1/completions", json=dict(prompt=[7], max_tokens=1, temperature=0))
    assert r.status_code == 200, r.text
    engine = client.app.state.server.engine
    for _ in range(200):
        m = _metrics(client)
        if (m["writescope_num_requests_running"] == 0 == m["writescope_num_requests_waiting"]
                and m["writescope_engine_engine_prompt_tokens"]
                == engine.counters["engine.prompt_tokens"]):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the engine's stats did not catch up")
    return m


#: what the request :func:`_quiet` sends adds (a prompt token, a token, a request of one token)
FLUSH = {"writescope_prompt_tokens_total": 1, "writescope_generation_tokens_total": 1,
         SUCCESS % "length": 1, "writescope_time_to_first_token_seconds_count": 1,
         "writescope_e2e_request_latency_seconds_count": 1,
         "writescope_request_queue_time_seconds_count": 1,
         "writescope_engine_prefix_queried_tokens": 1}


def _delta(before: dict, after: dict, key: str) -> float:
    """How much ``key`` moved between two :func:`_quiet` snapshots, less the second's flush."""
    return after.get(key, 0) - before.get(key, 0) - FLUSH.get(key, 0)


def _post(client, **body):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_refused_request_counts_only_as_refused(client):
    """Two prompts, the second too large for the KV budgets: the engine refuses it after the
    first was admitted, and the request is answered 400. No prompt token ran and no request
    ended: only ``request_rejected_total`` moves (vLLM checks every prompt before any reaches
    its engine), not ``prompt_tokens_total`` or an "abort"."""
    before = _quiet(client)
    r = client.post("/v1/completions", json=dict(prompt=[P, [5] * 480], max_tokens=4))
    assert r.status_code == 400 and "never fit" in r.text
    after = _quiet(client)
    assert _delta(before, after, 'writescope_request_rejected_total{status="400"}') == 1
    assert _delta(before, after, "writescope_prompt_tokens_total") == 0
    assert _delta(before, after, SUCCESS % "abort") == 0
    assert _delta(before, after, "writescope_generation_tokens_total") == 0
    assert after['writescope_kv_blocks{region="G"}'] == 0


def test_beam_search_step_requests_are_timed_from_their_own_submission(client):
    """Beam search of width 1 over 8 tokens: 8 one-token requests, one after the other (each
    counted as vLLM's engine counts the requests its beam search sends: a request, its prompt
    so far, one token). Each one's time to first token and latency run from when it was sent,
    not from the HTTP request's arrival: their sum fits in the HTTP call's wall time (from
    the arrival, the k-th would count the k - 1 steps before it again: about 4.5 times it)."""
    before = _quiet(client)
    t0 = time.perf_counter()
    body = _post(client, prompt=P, n=1, max_tokens=8, use_beam_search=True, temperature=0,
                 ignore_eos=True)
    wall = time.perf_counter() - t0
    after = _metrics(client)  # every step request ended (and was counted) before the answer
    after.update({k: after[k] + v for k, v in FLUSH.items()})
    assert body["usage"]["completion_tokens"] == 8
    assert _delta(before, after, SUCCESS % "length") == 8
    assert _delta(before, after, "writescope_prompt_tokens_total") == sum(
        len(P) + k for k in range(8))
    assert _delta(before, after, "writescope_generation_tokens_total") == 8
    for fam in ("writescope_time_to_first_token_seconds", "writescope_e2e_request_latency_seconds"):
        assert _delta(before, after, fam + "_count") == 8
        assert 0 < _delta(before, after, fam + "_sum") <= wall, fam


def test_workload_counts(client):
    """n=3, a stream, echo without generation, a prefix-cache hit: the token counters, the
    finished requests and each histogram's count move by what the workload must produce."""
    prefix = [7 + 5 * i % 290 for i in range(150)]  # two blocks of 64 and a tail
    # the cache starts empty, so its hits are this workload's own (earlier tests on this
    # engine, on whichever worker ran them, leave kept tails of P behind)
    _quiet(client)
    assert client.post("/reset_prefix_cache").status_code == 200
    before = _quiet(client)
    _post(client, prompt=P, n=3, max_tokens=4, ignore_eos=True)             # 3 x (20 + 4)
    r = client.post("/v1/completions", json=dict(prompt=P, max_tokens=5, ignore_eos=True,
                                                 stream=True))             # 20 + 5 (19 cached)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    # ignore_eos everywhere: a sampled end of sequence (two of 320 tokens) would end a request
    # as "stop", not "length"
    echo = _post(client, prompt=P, max_tokens=0, echo=True, ignore_eos=True)  # 20 (19 cached) + 1
    assert echo["usage"]["completion_tokens"] == 0
    _post(client, prompt=prefix, max_tokens=1, cache_salt="qa", ignore_eos=True)        # 150 + 1
    hit = _post(client, prompt=prefix, max_tokens=1, cache_salt="qa", ignore_eos=True)  # 150 (149 c.) + 1
    # its two blocks (128), then 21 of the 22 records its first run left in its kept tail
    # (``kvcache/tails.py``): all of the prompt but its last token, which is computed anyway
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] == 128 + 21
    after = _quiet(client)
    assert _delta(before, after, "writescope_prompt_tokens_total") == 3 * 20 + 20 + 20 + 300
    # the engine's one token of the echo counts, as under vLLM (it sets max_tokens 1 there too)
    assert _delta(before, after, "writescope_generation_tokens_total") == 12 + 5 + 1 + 2
    assert _delta(before, after, SUCCESS % "length") == 3 + 1 + 1 + 2
    assert _delta(before, after, "writescope_time_to_first_token_seconds_count") == 7
    assert _delta(before, after, "writescope_e2e_request_latency_seconds_count") == 7
    # one per request of more than one token: the 3 choices and the stream
    assert _delta(before, after, "writescope_time_per_output_token_seconds_count") == 4
    # P, 20 tokens, has no whole block: the stream and the echo each start from the first 19
    # records of a tail the n=3 choices left (P and their outputs; the 20th is their last
    # prompt token); the three choices, admitted together into an empty cache, from nothing
    assert _delta(before, after, "writescope_engine_prefix_hit_tokens") == 19 + 19 + 149
    assert _delta(before, after, "writescope_engine_prefix_queried_tokens") == 3 * 20 + 40 + 300


async def _leave_after_first_chunk(app, body: dict) -> int:
    """POST ``body`` straight to the ASGI app and hang up once a body chunk has come (or after
    0.5 s, for an answer that sends none before the end); the status sent."""
    sent: list[dict] = []
    gone = asyncio.Event()
    asked = False

    async def receive():
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)
        if msg["type"] == "http.response.body" and msg.get("body"):
            gone.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
             "client": ("test", 1), "server": ("test", 80)}
    timer = asyncio.get_running_loop().call_later(0.5, gone.set)
    try:
        await app(scope, receive, send)
    finally:
        timer.cancel()
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


@pytest.mark.parametrize("stream,status", [(True, 200), (False, 499)])
def test_a_client_that_leaves_counts_its_choices_as_aborted(client, stream, status):
    before = _quiet(client)
    got = client.portal.call(_leave_after_first_chunk, client.app,
                             dict(prompt=P, n=2, max_tokens=300, ignore_eos=True, stream=stream))
    assert got == status
    after = _quiet(client)
    assert _delta(before, after, SUCCESS % "abort") == 2
    assert _delta(before, after, "writescope_prompt_tokens_total") == 2 * len(P)
    assert 0 < _delta(before, after, "writescope_generation_tokens_total") < 2 * 300
    assert after["writescope_num_requests_running"] == 0
    assert all(v == 0 for k, v in after.items() if k.startswith("writescope_kv_blocks{"))


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                     r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?\})? (\S+)$')


def test_exposition_is_valid_and_histograms_consistent(client):
    """Every line a ``# HELP``, a ``# TYPE`` or a sample of the family typed just before it;
    each family typed once; counters never go down between scrapes; histogram buckets
    cumulative, ending in ``+Inf`` equal to ``_count``."""
    _post(client, prompt=P, max_tokens=3)
    first = client.get("/metrics")
    assert first.headers["content-type"].startswith("text/plain; version=0.0.4")
    _post(client, prompt=P, max_tokens=3)
    text = client.get("/metrics").text
    assert text.endswith("\n")
    types: dict[str, str] = {}
    family = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types and kind in ("counter", "gauge", "histogram"), line
            types[name], family = kind, name
            continue
        m = _SAMPLE.match(line)
        assert m, line
        name = m.group(1)
        assert name == family or (types[family] == "histogram" and name in (
            family + "_bucket", family + "_sum", family + "_count")), line
        float(m.group(4))  # a number, NaN or +Inf
    old, new = parse_text(first.text), parse_text(text)
    for key, v in old.items():
        if types.get(key.split("{")[0]) == "counter" or key.split("{")[0].endswith(
                ("_count", "_sum", "_bucket")):
            assert new[key] >= v, key
    for fam in (f for f, k in types.items() if k == "histogram"):
        edges = sorted((float(k.split('le="')[1].split('"')[0]), v) for k, v in new.items()
                       if k.startswith(fam + "_bucket{"))
        counts = [v for _, v in edges]
        assert counts == sorted(counts), fam
        assert edges[-1][0] == math.inf and counts[-1] == new[fam + "_count"], fam


# vLLM's bucket edges (vllm/v1/metrics/loggers.py): TTFT, inter-token / per-output-token
# latency, and request latencies (e2e, queue, prefill, decode)
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0)
VLLM_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def test_histograms_have_every_bucket_edge_of_vllms():
    """A dashboard or alert written for vLLM that reads a bucket (``le="0.5"``, the SLO share
    of requests under half a second) finds it here too; finer edges may be added."""
    from writescope.server.metrics import ServerMetrics
    sm = ServerMetrics("m")
    for hist, vllm in ((sm.ttft, VLLM_TTFT), (sm.tpot, VLLM_TPOT), (sm.e2e, VLLM_E2E)):
        assert set(vllm) <= set(hist.buckets), (hist.name, sorted(set(vllm) - set(hist.buckets)))


def test_each_gap_between_a_requests_tokens_is_an_inter_token_latency(client):
    """vLLM's ``inter_token_latency_seconds``: one observation per gap between a request's
    successive tokens (n - 1 for n tokens, per choice), none for a one-token request."""
    before = _quiet(client)
    _post(client, prompt=P, max_tokens=5, ignore_eos=True)
    _post(client, prompt=P, n=2, max_tokens=3, ignore_eos=True)
    after = _quiet(client)
    assert _delta(before, after, "writescope_inter_token_latency_seconds_count") == 4 + 2 * 2
    assert after["writescope_inter_token_latency_seconds_sum"] >= \
        before["writescope_inter_token_latency_seconds_sum"]


def test_a_failed_step_counts_its_requests_as_finished_with_an_error(client, monkeypatch):
    engine = client.app.state.server.engine
    step = engine.step

    def fail_once():
        monkeypatch.setattr(engine, "step", step)
        raise RuntimeError("boom")
    before = _quiet(client)
    monkeypatch.setattr(engine, "step", fail_once)
    r = client.post("/v1/completions", json=dict(prompt=P, n=2, max_tokens=4, ignore_eos=True))
    assert r.status_code == 500 and "boom" in r.text
    after = _quiet(client)  # the engine steps on
    assert _delta(before, after, SUCCESS % "error") == 2
    assert _delta(before, after, "writescope_engine_errors_total") == 1
    assert _delta(before, after, SUCCESS % "abort") == 0


def test_each_request_observes_its_queue_time_once(client):
    """vLLM's ``request_queue_time_seconds``: one observation per engine request (each choice),
    when it is admitted into the running batch."""
    before = _quiet(client)
    _post(client, prompt=P, max_tokens=3, ignore_eos=True)
    _post(client, prompt=P, n=2, max_tokens=2, ignore_eos=True)
    after = _quiet(client)
    assert _delta(before, after, "writescope_request_queue_time_seconds_count") == 1 + 2
