"""Pieces of the server that need no engine: request validation, the Prometheus text, streaming
hold-back of possible stop-string prefixes, and the serve command's argument handling."""
from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("fastapi")  # the server's own dependency (absent on the bare GPU machine)

from writescope.server import protocol as P  # noqa: E402
from writescope.server.sse import text_delta as _text_delta
from writescope.server.generation import Choice
from writescope.server.metrics import Registry, Histogram, Counter, ServerMetrics, parse_text


def _err(model, body) -> P.APIError:
    with pytest.raises(P.APIError) as e:
        P.parse_request(model, body if isinstance(body, bytes) else json.dumps(body).encode())
    return e.value


@pytest.mark.parametrize("body,param,code", [
    (b"{", None, "invalid_json"),
    (b"null", None, "invalid_json"),
    ({"prompt": "x", "max_tokens": "3"}, "max_tokens", "invalid_value"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens", "invalid_value"),
    ({"prompt": "x", "temperature": 2.5}, "temperature", "invalid_value"),
    ({"prompt": "x", "top_p": 0.0}, "top_p", "invalid_value"),
    ({"prompt": "x", "seed": 2 ** 70}, "seed", "invalid_value"),
    ({"prompt": "x", "n": 100}, "n", "invalid_value"),
    ({"prompt": "x", "logprobs": 21}, "logprobs", "invalid_value"),
    # a known field keeps its strict checks (unknown ones are ignored: test_server_vllm_fields)
    ({"prompt": "x", "priority": "1"}, "priority", "invalid_value"),
    ({"prompt": {"a": 1}}, "prompt", "invalid_value"),
    ({}, "prompt", "missing_required_parameter"),
])
def test_completion_request_errors(body, param, code):
    e = _err(P.CompletionRequest, body)
    assert e.status == 400 and e.param == param and e.code == code
    assert e.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,needle", [
    ({"prompt": "x", "logit_bias": {"a": 1.0}}, "token ids"),
    # digits that are not ASCII: str.isdigit() takes them, int() does not (or reads "１" as 1)
    ({"prompt": "x", "logit_bias": {"\u00b2": 1.0}}, "token ids"),
    ({"prompt": "x", "logit_bias": {"\uff11": 1.0}}, "token ids"),
    ({"prompt": "x", "logit_bias": {"-5": 1.0}}, "token ids"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "-100 to 100"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "stop": [""]}, "non-empty"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream"),
])
def test_unsupported_values_are_refused_by_name(body, needle):
    assert needle in _err(P.CompletionRequest, body).message


def test_chat_request_parsing():
    r = P.parse_request(P.ChatCompletionRequest, json.dumps({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": "c", "refusal": None}],
        "max_completion_tokens": 7, "max_tokens": 3}).encode())
    assert [m.text() for m in r.messages] == ["ab", "c"]
    assert r.requested_max_tokens == 7
    e = _err(P.ChatCompletionRequest,
             {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    assert "only text" in e.message and e.param.startswith("messages.0.content")
    # a text part without its text: the missing field is named, not the part's type
    e = _err(P.ChatCompletionRequest,
             {"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert "needs its text field" in e.message and "not supported" not in e.message
    assert _err(P.ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}],
                                          "tools": [{"type": "function"}]}).status == 400


def test_tokenize_prompt_of_a_wrong_type_says_what_tokenize_takes():
    from writescope.server.tokenize import TokenizeCompletionRequest
    e = _err(TokenizeCompletionRequest, {"prompt": 5})
    assert e.param == "prompt" and "prompt string, or messages" in e.message
    assert "token ids" not in e.message  # the completions endpoint's prompt types
    assert "list of token ids" in _err(P.CompletionRequest, {"prompt": 5}).message


def test_sampling_params_mapping():
    r = P.parse_request(P.CompletionRequest, json.dumps(
        {"prompt": ["a", "b"], "temperature": 0, "seed": 5, "stop": "x", "top_k": 3}).encode())
    assert r.prompts() == ["a", "b"]
    sp0, sp1 = r.sampling_params(10, None, 0), r.sampling_params(10, 1, 1)
    assert sp0.greedy and sp0.max_tokens == 10 and sp0.stop == ["x"] and sp0.top_k == 3
    assert sp0.seed == 5 and sp1.seed == 6 and sp1.logprobs == 1
    assert not sp0.changes_logits
    r = P.parse_request(P.CompletionRequest, json.dumps(
        {"prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -0.25,
         "repetition_penalty": 1.1, "min_tokens": 2, "logit_bias": {"7": -100, "9": 2}}).encode())
    sp = r.sampling_params(10, None)
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty, sp.min_tokens,
            sp.logit_bias) == (0.5, -0.25, 1.1, 2, {7: -100.0, 9: 2.0})
    assert P.parse_request(P.CompletionRequest, b'{"prompt": [1, 2]}').prompts() == [[1, 2]]
    assert P.parse_request(P.CompletionRequest, b'{"prompt": [[1], [2]]}').prompts() == [[1], [2]]


def test_chat_delta_has_no_nulls():
    d = P.ChatDelta(content="hi")
    assert json.loads(P.ChatStreamChoice(index=0, delta=d).model_dump_json())["delta"] == \
        {"content": "hi"}


def test_stream_holds_back_possible_stop_prefix():
    c = Choice(0, "r", [1], None, 10)
    c.text = "hello wo"
    assert _text_delta(c, holdback=2) == "hello "
    c.text = "hello world"
    assert _text_delta(c, holdback=2) == "wor"
    c.text = "hello world\ufffd"  # an incomplete UTF-8 sequence stays back too
    assert _text_delta(c, holdback=0) == "ld"
    c.text, c.finish_reason = "hello world!", "stop"
    assert _text_delta(c, holdback=2) == "!"
    assert c.sent_text == len(c.text)


# ------------------------------------------------------------------------------ metrics


def test_prometheus_text_and_histogram_edges():
    r = Registry()
    h = Histogram(r, "lat_seconds", "latency", buckets=(0.1, 1.0))
    cnt = Counter(r, "reqs_total", "requests", ["code"])
    for v in (0.1, 0.5, 1.0, 3.0):  # an edge value falls in its own bucket (le is inclusive)
        h.observe(v)
    cnt.inc(labels={"code": "400"})
    cnt.inc(2, labels={"code": "400"})
    text = r.render()
    assert "# TYPE lat_seconds histogram" in text and "# TYPE reqs_total counter" in text
    m = parse_text(text)
    assert m['lat_seconds_bucket{le="0.1"}'] == 1
    assert m['lat_seconds_bucket{le="1.0"}'] == 3
    assert m['lat_seconds_bucket{le="+Inf"}'] == 4 == m["lat_seconds_count"]
    assert m["lat_seconds_sum"] == pytest.approx(4.6)
    assert m['reqs_total{code="400"}'] == 3
    with pytest.raises(ValueError):
        cnt.inc(-1, labels={"code": "400"})
    with pytest.raises(ValueError):
        cnt.inc(labels={"status": "400"})


def test_engine_stats_become_gauges():
    sm = ServerMetrics("m")
    sm.record_engine_stats({"kv.blocks.G": 3, "kv.blocks.C": 1, "planner.cpu_share": 0.4,
                            "planner.prediction_error": 0.05, "engine.steps": 7,
                            "kv.policy": "writescope", "flag": True}, 2, 5)
    m = parse_text(sm.render())
    assert m['writescope_kv_blocks{region="G"}'] == 3
    assert m['writescope_kv_blocks{region="C"}'] == 1
    assert m["writescope_planner_cpu_share"] == 0.4
    assert m["writescope_planner_prediction_error"] == 0.05
    assert m["writescope_engine_engine_steps"] == 7
    assert m["writescope_engine_flag"] == 1
    assert not any("policy" in k for k in m)  # non-numbers are skipped
    assert m["writescope_num_requests_running"] == 2 and m["writescope_num_requests_waiting"] == 5
    assert m['writescope_model_info{model="m"}'] == 1
    sm.record_engine_stats({"kv.blocks.G": 3, "kv.blocks.C": 1, "kv.capacity_blocks.G": 10,
                            "kv.capacity_blocks.C": 6}, 0, 0)
    assert parse_text(sm.render())["writescope_kv_cache_usage_perc"] == 0.25  # 4 of 16


def test_engine_preemptions_become_vllms_counter():
    sm = ServerMetrics("m")
    assert parse_text(sm.render())["writescope_num_preemptions_total"] == 0
    for n in (0, 2, 2, 5):
        sm.record_engine_stats({"engine.preemptions": n}, 0, 0)
        m = parse_text(sm.render())
        assert m["writescope_num_preemptions_total"] == n
    assert "writescope_engine_engine_preemptions" not in m
    assert "# TYPE writescope_num_preemptions_total counter" in sm.render()


def test_every_series_carries_vllms_model_name_label():
    """vLLM's dashboards select ``model_name="..."``: every sample of every metric has it."""
    sm = ServerMetrics('org/m "v2"')
    sm.record_engine_stats({"kv.blocks.G": 3, "engine.steps": 7}, 1, 0)
    sm.requests_total.inc(labels={"finished_reason": "stop"})
    sm.ttft.observe(0.02)
    samples = [ln for ln in sm.render().splitlines() if ln and not ln.startswith("#")]
    assert samples and all(ln.split("{", 1)[1].startswith('model_name="org/m \\"v2\\""')
                           for ln in samples)
    raw = parse_text(sm.render(), keep_model_name=True)
    assert raw['writescope_kv_blocks{model_name="org/m \\"v2\\"",region="G"}'] == 3
    assert raw['writescope_time_to_first_token_seconds_bucket{model_name="org/m \\"v2\\"",'
               'le="0.02"}'] == 1
    assert parse_text(sm.render())['writescope_time_to_first_token_seconds_bucket{le="0.02"}'] == 1


def test_tokens_per_second_window():
    sm = ServerMetrics("m", throughput_window_s=10.0)
    sm.record_step(0.01, 50, now=100.0)
    sm.record_step(0.01, 30, now=105.0)
    assert sm.tokens_per_second(now=106.0) == pytest.approx(8.0)
    assert sm.tokens_per_second(now=112.0) == pytest.approx(3.0)  # the first fell out
    assert sm.generation_tokens.value() == 80
    assert math.isfinite(parse_text(sm.render())["writescope_generation_tokens_per_second"])


# ------------------------------------------------------------------------------ the command


def test_serve_command_arguments():
    from writescope.cli import build_parser
    from writescope.commands.common import engine_kwargs

    args = build_parser().parse_args(
        ["serve", "--port", "0", "--vram-budget", "2GiB", "--max-model-len", "8192",
         "--kv-policy", "cpu", "--max-num-seqs", "4", "--api-key", "k",
         "--shutdown-timeout", "5"])
    assert args.func.__module__ == "writescope.commands.serve"
    assert args.host == "127.0.0.1" and args.port == 0 and args.model is None
    assert args.api_key == "k" and args.shutdown_timeout == 5.0
    kw = engine_kwargs(args)
    assert kw["model"] is None and kw["vram_budget"] == "2GiB" and kw["max_model_len"] == 8192
    assert kw["kv_policy"] == "cpu" and kw["max_num_seqs"] == 4
    # vLLM's CORS defaults: any origin, method and header, no credentials
    from writescope.commands.serve import cors_options
    from writescope.server.api import CORS
    assert cors_options(args) == CORS(("*",), False, ("*",), ("*",))
    assert not args.trust_request_chat_template and not args.return_tokens_as_token_ids


def test_engine_thread_runs_jobs_in_order_on_one_thread_and_ends_on_close():
    import threading
    from writescope.server.owner import EngineThread
    t = EngineThread(name="t-owner")
    ids = [t.call(threading.get_ident) for _ in range(3)]
    assert len(set(ids)) == 1 and ids[0] == t.ident != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        t.call(lambda: 1 / 0)
    assert t.call(lambda a, b=0: a + b, 2, b=3) == 5  # (an error does not end the thread)
    t.close()
    t.join(5)
    assert not t.is_alive()
    with pytest.raises(RuntimeError, match="ended"):
        t.submit(int)


def test_the_server_steps_the_engine_on_the_thread_that_built_it(tiny_qwen3_moe):
    """``writescope serve`` builds the engine on an EngineThread and the loop steps it there:
    one OpenMP team behind every torch op (``server/owner.py``)."""
    import threading
    from starlette.testclient import TestClient
    from writescope.engine.engine import LLMEngine
    from writescope.server.api import create_app
    from writescope.server.owner import EngineThread
    owner = EngineThread()
    engine = owner.call(LLMEngine, str(tiny_qwen3_moe), device="cpu", max_model_len=256)
    stepped = set()
    real_step = engine.step

    def step(*a, **k):
        stepped.add(threading.get_ident())
        return real_step(*a, **k)
    engine.step = step
    app = create_app(engine, engine_thread=owner)
    with TestClient(app) as client:
        r = client.post("/v1/completions", json={"model": engine.model_name, "prompt": "hello",
                                                 "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
    assert stepped == {owner.ident}
    owner.join(10)
    assert not owner.is_alive()  # the loop's end ended its thread
