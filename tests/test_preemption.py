"""Preemption under ``scheduling_policy="priority"`` (vLLM's): a waiting request that does not fit
(the batch at ``max_num_seqs``, or too few free KV blocks) preempts the running request of the
lowest priority (ties: the latest arrival) that is of strictly lower priority; the preempted
request is recomputed later -- its prompt and its outputs so far prefilled again -- and ends
with the outputs it would have had unpreempted (greedy and seeded sampling), streamed without a
token repeated or lost. Under "fcfs" nothing is preempted."""
from __future__ import annotations

import pytest

from conftest import abort_left
from writescope import LLM, SamplingParams
from writescope.core import RequestOutputKind, RequestStatus
from writescope.engine.beam import BeamSearchParams

OPTS = dict(dtype="float32", device="cpu", block_size=8, max_model_len=256, max_num_seqs=2)
LONG = dict(max_tokens=24, ignore_eos=True)
GREEDY = dict(temperature=0.0, **LONG)
SEEDED = dict(temperature=1.0, top_p=0.9, seed=7, **LONG)
PROMPTS = {"low-a": "the rivers run to the sea", "low-b": "a b c d e f g h i j k"}


@pytest.fixture(scope="module", params=["sync", "overlap"])
def prio(tiny_qwen3_moe, request):
    """Also with overlapped decode steps (engine/inflight.py; CUDA's default): a request that
    arrives while a step is in flight preempts once that step is done."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WRITESCOPE_ASYNC_DECODE", "1" if request.param == "overlap" else "0")
        llm = LLM(str(tiny_qwen3_moe), scheduling_policy="priority", **OPTS)
    assert llm.llm_engine.overlap == (request.param == "overlap")
    return llm


@pytest.fixture(scope="module")
def fcfs(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), **OPTS)


@pytest.fixture(autouse=True)
def _nothing_left_behind(request):
    yield
    abort_left(request)


def alone(llm, prompt, params) -> list[int]:
    """The tokens ``prompt`` gets with nothing else in the engine (no preemption)."""
    return llm.generate([prompt], SamplingParams(**params), use_tqdm=False)[0].outputs[0].token_ids


def run_all(eng, outs: dict | None = None) -> tuple[list[str], dict]:
    """Step to the end: the request ids in the order they finish, and each one's final output;
    ``outs``: {request id: list} to append each output of those requests to."""
    order, final = [], {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if outs is not None and o.request_id in outs:
                outs[o.request_id].append(o)
            if o.finished:
                order.append(o.request_id)
                final[o.request_id] = o
    return order, final


def step_until_admitted(eng, rid: str) -> list:
    """Step until ``rid`` runs: one step, or two where a step was in flight when it came (it
    completes first; the next is scheduled, and preempts, afresh). Returns the outputs."""
    outs = []
    for _ in range(2):
        outs += eng.step()
        if any(r.request_id == rid for r in eng.scheduler.running):
            return outs
    raise AssertionError(f"{rid} was not admitted: running "
                         f"{[r.request_id for r in eng.scheduler.running]}")


def start_lows(eng, params, steps: int = 4) -> None:
    """The batch full (max_num_seqs=2) of two low-priority long generations, a few tokens in."""
    for rid, prompt in PROMPTS.items():
        eng.add_request(rid, prompt, SamplingParams(**params),
                        priority=5 if eng.scheduling_policy == "priority" else 0)
    for _ in range(steps):
        eng.step()
    assert [r.request_id for r in eng.scheduler.running] == list(PROMPTS)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_high_priority_request_preempts_the_latest_lowest_and_outputs_stay_the_same(
        prio, params):
    want = {rid: alone(prio, p, params) for rid, p in PROMPTS.items()}
    eng = prio.llm_engine
    before = eng.stats()["engine.preemptions"]
    start_lows(eng, params)
    b = eng.requests["low-b"]
    had = list(b.output_token_ids)
    assert 0 < len(had) < LONG["max_tokens"]
    eng.add_request("high", "hello", SamplingParams(temperature=0.0, max_tokens=3,
                                                    ignore_eos=True), priority=0)
    step_until_admitted(eng, "high")
    # admitted at once; "low-b" (same priority as "low-a", the later arrival) made room
    assert [r.request_id for r in eng.scheduler.running] == ["low-a", "high"]
    assert [r.request_id for r in eng.scheduler.waiting] == ["low-b"]
    assert b.status is RequestStatus.PREEMPTED and b.num_preemptions == 1
    # its outputs kept (one more where a step was in flight), to be prefilled again
    assert b.output_token_ids[:len(had)] == had and len(b.output_token_ids) - len(had) <= 1
    assert b.recompute_outputs == len(b.output_token_ids)
    assert eng.stats()["engine.preemptions"] == before + 1
    order, final = run_all(eng)
    assert order.index("high") < order.index("low-b")
    for rid in PROMPTS:
        assert final[rid].outputs[0].token_ids == want[rid], rid
        assert final[rid].prompt_token_ids == eng.tokenizer.encode(PROMPTS[rid])
    assert len(final["low-b"].token_ids) == LONG["max_tokens"]


def test_fcfs_preempts_nothing(fcfs):
    eng = fcfs.llm_engine
    start_lows(eng, GREEDY)
    eng.add_request("late", "hello", SamplingParams(temperature=0.0, max_tokens=3))
    eng.step()
    assert [r.request_id for r in eng.scheduler.running] == list(PROMPTS)
    order, _ = run_all(eng)
    assert order[-1] == "late" and eng.stats()["engine.preemptions"] == 0


def test_only_strictly_lower_priorities_are_preempted(prio):
    eng = prio.llm_engine
    before = eng.stats()["engine.preemptions"]
    start_lows(eng, GREEDY)
    eng.add_request("same", "hello", SamplingParams(temperature=0.0, max_tokens=3), priority=5)
    eng.step()
    eng.step()
    assert [r.request_id for r in eng.scheduler.running] == list(PROMPTS)
    assert eng.stats()["engine.preemptions"] == before
    run_all(eng)


def test_streamed_deltas_neither_repeat_nor_lose_tokens(prio):
    params = dict(GREEDY, output_kind=RequestOutputKind.DELTA, logprobs=1)
    want = prio.generate([PROMPTS["low-b"]], SamplingParams(**GREEDY, logprobs=1),
                         use_tqdm=False)[0]
    eng = prio.llm_engine
    for rid, prompt in PROMPTS.items():
        eng.add_request(rid, prompt, SamplingParams(**params), priority=5)
    deltas: dict[str, list] = {rid: [] for rid in PROMPTS}
    for i in range(12):
        if i == 4:
            eng.add_request("high", "hello", SamplingParams(temperature=0.0, max_tokens=6,
                                                            ignore_eos=True), priority=0)
        for o in eng.step():
            if o.request_id in deltas:
                deltas[o.request_id].append(o)
    assert eng.requests["low-b"].num_preemptions == 1
    run_all(eng, deltas)
    got = deltas["low-b"]
    assert [t for o in got for t in o.token_ids] == want.token_ids
    assert "".join(o.text for o in got) == want.text
    # (the recompute's prefill computes them in another order: equal to float32 rounding)
    assert [lp for o in got for lp in o.logprobs] == pytest.approx(want.logprobs, rel=1e-4)
    assert all(o.token_ids for o in got)  # no empty delta either


def test_the_recompute_starts_from_the_prefix_cache(prio):
    eng = prio.llm_engine
    eng.reset_prefix_cache()
    start_lows(eng, GREEDY, steps=14)
    b = eng.requests["low-b"]
    cached_at_admission = b.num_cached_tokens
    n = b.num_tokens  # prompt + outputs: what the recompute prefills
    eng.add_request("high", "hello", SamplingParams(temperature=0.0, max_tokens=2,
                                                    ignore_eos=True), priority=0)
    step_until_admitted(eng, "high")
    assert b.status is RequestStatus.PREEMPTED and b.num_tokens - n <= 1  # (a step in flight)
    n = b.num_tokens
    assert b.num_prefill_tokens == n
    hits = eng.stats()["prefix.hit_tokens"]
    while b.status is not RequestStatus.RUNNING:
        eng.step()
    # its full blocks came back from the cache (its partial block was kept as a tail,
    # kvcache/tails.py, whose W slot the request that preempted it took)
    assert eng.stats()["prefix.hit_tokens"] - hits >= (n - 1) // 8 * 8 >= 16
    assert b.num_cached_tokens == cached_at_admission  # vLLM's: the first admission's
    run_all(eng)


def test_a_request_too_big_for_the_free_blocks_preempts(tiny_qwen3_moe):
    """The KV budgets hold one long request at a time: the high-priority one preempts the
    running one, which then finishes as it would have."""
    llm = LLM(str(tiny_qwen3_moe), scheduling_policy="priority", dtype="float32", device="cpu",
              block_size=8, max_model_len=64, max_num_seqs=4, num_gpu_blocks=10,
              host_budget=0, pinned_budget=0, enable_prefix_caching=False)
    eng = llm.llm_engine
    long = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    want = alone(llm, list(range(3, 43)), dict(temperature=0.0, max_tokens=20, ignore_eos=True))
    eng.add_request("run", list(range(3, 43)), long, priority=3)
    for _ in range(5):
        eng.step()
    eng.add_request("big", list(range(5, 45)), long, priority=1)
    step_until_admitted(eng, "big")
    assert [r.request_id for r in eng.scheduler.running] == ["big"]
    assert eng.requests["run"].status is RequestStatus.PREEMPTED
    order, final = run_all(eng)
    assert order == ["big", "run"] and final["run"].token_ids == want
    assert eng.stats()["engine.preemptions"] == 1


def test_prompt_logprobs_of_a_request_preempted_mid_prefill(tiny_qwen3_moe):
    """Preempted after its first prefill chunk, a request keeps the prompt log-probabilities
    computed so far and computes only the rest; none is repeated, and a stream sends them
    once."""
    llm = LLM(str(tiny_qwen3_moe), scheduling_policy="priority", dtype="float32", device="cpu",
              block_size=8, max_model_len=256, max_num_seqs=1, max_num_batched_tokens=16)
    eng = llm.llm_engine
    prompt = list(range(3, 43))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=2,
                            output_kind=RequestOutputKind.DELTA)
    want = llm.generate([prompt], params, use_tqdm=False)[0]
    eng.add_request("low", prompt, params, priority=4)
    eng.step()  # its first chunk: 16 of 40 prompt tokens
    low = eng.requests["low"]
    assert low.num_computed == 16 and len(low.prompt_logprobs) == 17
    eng.add_request("high", "hello", SamplingParams(temperature=0.0, max_tokens=2), priority=0)
    eng.step()
    assert low.status is RequestStatus.PREEMPTED
    # the recompute's chunks (12 tokens) do not end where the values it has do (at 16)
    eng.scheduler.max_num_batched_tokens = 12
    outs = []
    while eng.has_unfinished_requests():
        outs += [o for o in eng.step() if o.request_id == "low"]
    with_prompt = [o for o in outs if o.prompt_token_logprobs is not None]
    assert len(with_prompt) == 1 and outs[0] is with_prompt[0]
    assert with_prompt[0].prompt_token_logprobs == pytest.approx(want.prompt_token_logprobs,
                                                                 rel=1e-4)
    got_top, want_top = with_prompt[0].prompt_top_logprobs, want.prompt_top_logprobs
    assert [t and list(t) for t in got_top] == [t and list(t) for t in want_top]
    assert [t and pytest.approx(t, rel=1e-4) for t in got_top] == want_top  # (chunked anew)
    assert len(low.prompt_logprobs) == len(prompt)
    assert [t for o in outs for t in o.token_ids] == want.token_ids


def test_a_request_preempted_after_decoding_does_not_send_prompt_logprobs_again(prio):
    eng = prio.llm_engine
    params = dict(GREEDY, prompt_logprobs=0, output_kind=RequestOutputKind.DELTA)
    want = prio.generate([PROMPTS["low-b"]], SamplingParams(**params), use_tqdm=False)[0]
    for rid, prompt in PROMPTS.items():
        eng.add_request(rid, prompt, SamplingParams(**params), priority=5)
    outs = [o for _ in range(4) for o in eng.step() if o.request_id == "low-b"]
    eng.add_request("high", "hello", SamplingParams(temperature=0.0, max_tokens=2), priority=0)
    outs += [o for o in step_until_admitted(eng, "high") if o.request_id == "low-b"]
    assert eng.requests["low-b"].num_preemptions == 1
    run_all(eng, {"low-b": outs})
    assert [o.prompt_token_logprobs is not None for o in outs] == [True] + [False] * (len(outs) - 1)
    assert outs[0].prompt_token_logprobs == pytest.approx(want.prompt_token_logprobs)
    assert [t for o in outs for t in o.token_ids] == want.token_ids


def test_n_completions_are_preempted_and_recomputed_alike(prio):
    params = dict(SEEDED, n=2)
    want = prio.generate([PROMPTS["low-a"]], SamplingParams(**params), use_tqdm=False)[0]
    eng = prio.llm_engine
    eng.add_request("par", PROMPTS["low-a"], SamplingParams(**params), priority=5)
    for _ in range(4):
        eng.step()
    eng.add_request("high", "hello", SamplingParams(temperature=0.0, max_tokens=3), priority=0)
    step_until_admitted(eng, "high")
    assert sum(r.num_preemptions for r in eng.requests.values()) == 1
    _, final = run_all(eng)
    got = final["par"]
    assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]


def test_beam_search_steps_preempt_lower_priorities(prio):
    beam = BeamSearchParams(beam_width=2, max_tokens=3)
    want_beam = [s.tokens for s in prio.beam_search(["hello there"], beam)[0].sequences]
    want = {rid: alone(prio, p, GREEDY) for rid, p in PROMPTS.items()}
    eng = prio.llm_engine
    before = eng.stats()["engine.preemptions"]
    start_lows(eng, GREEDY)
    lows = [eng.requests[rid] for rid in PROMPTS]
    # the search's steps (priority 0) preempt the lows (5), which its driving loop finishes
    got_beam = [s.tokens for s in prio.beam_search(["hello there"], beam)[0].sequences]
    assert got_beam == want_beam
    assert eng.stats()["engine.preemptions"] > before
    assert [r.output_token_ids for r in lows] == [want[rid] for rid in PROMPTS]


def test_a_preempted_request_aborted_while_it_waits_leaves_nothing_behind(prio):
    eng = prio.llm_engine
    start_lows(eng, GREEDY)
    b = eng.requests["low-b"]
    eng.add_request("high", "hello", SamplingParams(temperature=0.0, max_tokens=3), priority=0)
    step_until_admitted(eng, "high")
    assert b.status is RequestStatus.PREEMPTED
    queue_time = b.queue_time_s
    eng.abort_request("low-b")
    assert b.finished and b.finish_reason == "abort" and "low-b" not in eng.requests
    assert b.queue_time_s == queue_time  # (set at its first admission only)
    order, _ = run_all(eng)
    assert sorted(order) == ["high", "low-a"] and not eng.cache.seqs


# ----------------------------------------------------------------------------- the server

def test_a_server_stream_preempted_midway_neither_repeats_nor_loses_text(tiny_qwen3_moe):
    pytest.importorskip("fastapi")
    import json
    import threading
    import time

    from conftest import in_process_server, post_ok
    from writescope.engine.engine import LLMEngine
    from writescope.server.metrics import parse_text
    eng = LLMEngine(str(tiny_qwen3_moe), scheduling_policy="priority",
                    **dict(OPTS, max_num_seqs=1))
    low = dict(prompt=PROMPTS["low-b"], max_tokens=40, ignore_eos=True, temperature=0.0,
               priority=5)
    with in_process_server(eng) as client:
        want = post_ok(client, "/v1/completions", **low)["choices"][0]["text"]
        pieces, first = [], threading.Event()

        def stream():
            with client.stream("POST", "/v1/completions", json=dict(low, stream=True)) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        pieces.extend(c["text"] for c in json.loads(line[6:])["choices"])
                        first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(60)
        high = post_ok(client, "/v1/completions", prompt="hello", max_tokens=2, priority=0,
                       ignore_eos=True)
        assert high["choices"][0]["finish_reason"] == "length"
        t.join(120)
        assert not t.is_alive() and "".join(pieces) == want
        for _ in range(100):  # (the engine's stats reach the metrics every 50 ms)
            m = parse_text(client.get("/metrics").text)
            if m["writescope_num_preemptions_total"]:
                break
            time.sleep(0.05)
        assert m["writescope_num_preemptions_total"] == 1
