"""Overlapped decode steps (engine/inflight.py): the next step is launched before the tokens of
the step in flight are read back. On the CPU (WRITESCOPE_ASYNC_DECODE=1) the same code paths
run with nothing to overlap: every token and log-probability must be the synchronous engine's,
however requests finish, abort or arrive, and every KV block must come back."""
from __future__ import annotations

import pytest
import torch

from test_parity import GREEDY, PLACEMENTS, engine, prompt_ids
from writescope import SamplingParams
from writescope.core import Request
from writescope.layers.sampler import Sampler


def _run(path, monkeypatch, overlap: bool, prompts, params, opts, script=None):
    """Generate ``prompts`` step by step; ``script(engine, step_index)`` may add or abort requests
    between steps. Returns ({request id: (tokens, logprobs, finish reason, alternatives)},
    stats)."""
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", "1" if overlap else "0")
    llm = engine(path, **opts)
    eng = llm.engine
    assert eng.overlap is overlap
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(f"r{i}", p, sp)
    done, i = {}, 0
    while eng.has_unfinished_requests():
        if script is not None:
            script(eng, i)
        for o in eng.step():  # an aborted request's entry is its last output before the abort
            done[o.request_id] = (o.token_ids, o.logprobs, o.finish_reason, o.top_logprobs)
        i += 1
        assert i < 500
    eng.step()  # a step of finished requests may still be in flight: it returns nothing
    s = eng.stats()
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW"), "every block returned"
    return done, s


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k][0] == b[k][0], k
        assert a[k][2] == b[k][2], k
        assert max((abs(x - y) for x, y in zip(a[k][1], b[k][1])), default=0.0) < 1e-5, k
        assert (a[k][3] is None) == (b[k][3] is None), k
        for x, y in zip(a[k][3] or [], b[k][3] or []):
            assert list(x) == list(y) and max(abs(x[t] - y[t]) for t in x) < 1e-5, k


@pytest.mark.parametrize("placement", ["all-G", "mixed"])
def test_overlapped_steps_give_the_synchronous_tokens(tiny_qwen3_moe, placement, monkeypatch):
    """Requests of different lengths finishing at different steps (max_tokens), greedy: the
    same tokens, log-probabilities and finish reasons. With all KV in G every decode step
    overlaps, those that complete a block (copied to G on the device) included: all 30 steps
    but the prompts' 3 (23 while block-completing steps were synchronous); once blocks are in T
    and C none can."""
    lens, news = (12, 40, 75), (9, 30, 21)
    prompts = [prompt_ids(320, n, seed=n) for n in lens]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=k)
              for m, k in zip(news, (1, 0, 3))]
    opts = PLACEMENTS[placement]
    want, s0 = _run(tiny_qwen3_moe, monkeypatch, False, prompts, params, opts)
    got, s1 = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, opts)
    _same(got, want)
    assert s0["engine.overlapped_steps"] == 0
    if placement == "all-G":
        assert s1["engine.overlapped_steps"] == s1["engine.steps"] - 3, s1
    else:
        assert s1["engine.overlapped_steps"] < 3, s1
    assert s1["engine.generated_tokens"] == s0["engine.generated_tokens"] == sum(news)


def test_a_request_that_stops_while_the_next_step_is_in_flight(tiny_qwen3_moe, monkeypatch):
    """A stop token (known only once its step's tokens are back) ends a request whose next
    token is already being computed: that token is dropped, the other requests go on."""
    prompts = [prompt_ids(320, n, seed=n) for n in (20, 33)]
    plain = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)] * 2
    free, _ = _run(tiny_qwen3_moe, monkeypatch, False, prompts, plain, PLACEMENTS["all-G"])
    stop_tok = free["r0"][0][6]  # r0's seventh token
    first = free["r0"][0].index(stop_tok)
    params = [SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_tok],
                             ignore_eos=True, logprobs=1), plain[1]]
    want, _ = _run(tiny_qwen3_moe, monkeypatch, False, prompts, params, PLACEMENTS["all-G"])
    got, s = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, PLACEMENTS["all-G"])
    _same(got, want)
    assert got["r0"][0] == free["r0"][0][:first + 1] and got["r0"][2] == "stop"
    assert got["r1"][0] == free["r1"][0]
    assert s["engine.overlapped_steps"] > 0


def test_aborts_and_arrivals_between_overlapped_steps(tiny_qwen3_moe, monkeypatch):
    """A request aborted while a step holding it is in flight gets nothing more; one added
    mid-run waits for the step in flight and then joins; the others' tokens are unchanged."""
    prompts = [prompt_ids(320, n, seed=n) for n in (18, 26, 31)]
    params = [SamplingParams(temperature=0.0, max_tokens=28, ignore_eos=True, logprobs=1)] * 3
    late = prompt_ids(320, 22, seed=99)

    def script(eng, i):
        if i == 6:
            eng.abort_request("r1")
        if i == 9:
            eng.add_request("late", late, params[0])

    want, _ = _run(tiny_qwen3_moe, monkeypatch, False, prompts, params, PLACEMENTS["all-G"],
                   script)
    got, s = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, PLACEMENTS["all-G"],
                  script)
    assert got["r1"][2] is None and want["r1"][2] is None  # aborted before it finished
    # the abort lands one step later in the token stream of an overlapped run at most
    short, long_ = sorted((got["r1"][0], want["r1"][0]), key=len)
    assert short == long_[:len(short)] and len(long_) - len(short) <= 1
    assert len(short) < 28
    for k in ("r0", "r2", "late"):
        assert got[k][0] == want[k][0], k
        assert max(abs(x - y) for x, y in zip(got[k][1], want[k][1])) < 1e-5, k
    assert s["engine.overlapped_steps"] > 0


def test_seeded_sampling_overlaps_with_the_same_tokens(tiny_qwen3_moe, monkeypatch):
    """A request that samples with a seed is overlapped too (its number for each step drawn
    from its own host generator when the step is launched), and its tokens are exactly those
    of a run without overlap."""
    prompts = [prompt_ids(320, n, seed=n) for n in (15, 29)]
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12, logprobs=1),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)]
    want, _ = _run(tiny_qwen3_moe, monkeypatch, False, prompts, params, PLACEMENTS["all-G"])
    got, s = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, PLACEMENTS["all-G"])
    _same(got, want)
    assert s["engine.overlapped_steps"] > 0


def test_penalties_keep_the_synchronous_path_while_they_run(tiny_qwen3_moe, monkeypatch):
    """A request whose logits depend on its tokens so far (a penalty, min_tokens) is never in
    an overlapped step -- its next step must see this step's token --, and once it has
    finished the others' steps overlap again; all tokens are the synchronous run's."""
    prompts = [prompt_ids(320, n, seed=n) for n in (15, 29)]
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1,
                             frequency_penalty=1.0, repetition_penalty=1.2),
              SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=1)]
    want, _ = _run(tiny_qwen3_moe, monkeypatch, False, prompts, params, PLACEMENTS["all-G"])
    got, s = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, PLACEMENTS["all-G"])
    _same(got, want)
    assert 0 < s["engine.overlapped_steps"] <= 30 - 8


def test_unseeded_sampling_is_overlapped(tiny_qwen3_moe, monkeypatch):
    """Unseeded sampled requests (temperature, top-k, top-p) overlap: their tokens are drawn on
    the device from its default generator. On the CPU that generator is the host's, drawn in
    the same order, so a run from the same global seed gives the synchronous run's tokens."""
    prompts = [prompt_ids(320, n, seed=n) for n in (15, 29, 40)]
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=14, logprobs=1),
              SamplingParams(temperature=1.2, top_k=20, max_tokens=20, logprobs=1),
              SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True, logprobs=1)]
    torch.manual_seed(123)
    want, _ = _run(tiny_qwen3_moe, monkeypatch, False, prompts, params, PLACEMENTS["all-G"])
    torch.manual_seed(123)
    got, s = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, PLACEMENTS["all-G"])
    _same(got, want)
    assert s["engine.overlapped_steps"] > 0


def test_policy_change_and_synthetic_prefill_complete_the_step_in_flight(tiny_qwen3_moe,
                                                                          monkeypatch):
    """The bench's sequence: requests aborted with a step in flight, then the policy rebuilt,
    or new requests filled synthetically; the step in flight is completed first."""
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", "1")
    llm = engine(tiny_qwen3_moe, **PLACEMENTS["all-G"])
    eng = llm.engine
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for round_ in range(2):
        for i in range(2):
            eng.add_request(f"a{round_}{i}", prompt_ids(320, 20 + i, seed=i), sp)
        eng.prefill_synthetic(seed=round_)
        for _ in range(8):
            assert len(eng.step()) == 2
        assert eng._inflight is not None
        for i in range(2):
            eng.abort_request(f"a{round_}{i}")
        assert not eng.has_unfinished_requests()
    eng.set_kv_policy("transfer")
    assert eng._inflight is None
    out = llm.generate([prompt_ids(320, 25, seed=5)], GREEDY)
    assert len(out[0].token_ids) == GREEDY.max_tokens


def test_sample_pending_matches_sample():
    """Greedy rows: the same tokens and log-probabilities as the host path. Unseeded sampled
    rows on the CPU: the same draws from the same global seed. Seeded rows are refused."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=g) * 4
    params = [GREEDY, SamplingParams(temperature=0.7, top_k=30), GREEDY,
              SamplingParams(temperature=1.0, top_p=0.8), SamplingParams(temperature=0.0)]
    s = Sampler()
    torch.manual_seed(5)
    want = s.sample(logits, params, list(range(5)))
    torch.manual_seed(5)
    got = s.sample_pending(logits, params).result()
    assert got[0] == want[0]
    assert got[1] == pytest.approx(want[1], abs=0)
    assert Sampler.can_defer(params)
    # seeded rows too: their numbers drawn on the host first, the same tokens as sample's
    seeded = [GREEDY, SamplingParams(temperature=0.7, seed=3),
              SamplingParams(temperature=1.0, top_k=20, seed=4)]
    reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(seeded)]
    assert Sampler.can_defer(seeded)
    one, two = Sampler(), Sampler()
    for _ in range(3):  # step after step, each row's generator moves on alike
        want = one.sample(logits[:3], seeded, [r.seq_id for r in reqs])
        assert two.sample_pending(logits[:3], seeded, reqs).result() == want
    with pytest.raises(ValueError, match="seeded"):
        Sampler().sample_pending(logits[:3], seeded)  # no requests: no generators
    assert not Sampler.can_defer([SamplingParams(temperature=0.7, repetition_penalty=1.2)])


def test_the_switch(monkeypatch):
    from writescope.engine.inflight import overlap_enabled
    for v, cpu, cuda in (("auto", False, True), ("1", True, True), ("0", False, False)):
        monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", v)
        assert overlap_enabled(torch.device("cpu")) is cpu
        assert overlap_enabled(torch.device("cuda")) is cuda
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", "sometimes")
    with pytest.raises(ValueError, match="WRITESCOPE_ASYNC_DECODE"):
        overlap_enabled(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("placement", ["all-G", "G-then-T"])
def test_overlapped_steps_on_cuda(all_tiny, placement, monkeypatch):
    """On CUDA (the default there): CUDA graphs, resident steps and overlapped steps together
    give the synchronous engine's tokens and transformers' (generate_checked); with all KV in
    G most decode steps overlap, and once G is full ("G-then-T": later blocks in T) the steps
    that read T do not."""
    from test_parity import generate_checked
    opts = (dict(PLACEMENTS["all-G"]) if placement == "all-G"
            else dict(kv_policy="transfer", num_gpu_blocks=4))
    opts["device"] = "cuda"
    lens, news = (5, 20, 30), (17, 30, 24)
    prompts = [prompt_ids(320, n, seed=n) for n in lens]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=3)
              for m in news]
    want, _ = _run(all_tiny, monkeypatch, False, prompts, params, opts)
    got, s = _run(all_tiny, monkeypatch, True, prompts, params, opts)
    assert got.keys() == want.keys()
    for k in got:
        assert got[k][0] == want[k][0], k
        assert max(abs(x - y) for x, y in zip(got[k][1], want[k][1])) < 1e-4, k
        for x, y in zip(got[k][3], want[k][3]):  # the alternatives, through the pinned copies
            assert len(x) == len(y) == 3
            assert max(abs(a - b) for a, b in zip(x.values(), y.values())) < 1e-4, k
    if placement == "all-G":
        assert s["engine.overlapped_steps"] >= sum(news) // 3 // 2, s
        assert s["graphs.resident_steps"] > 0, s
    else:
        assert s["engine.overlapped_steps"] < s["engine.steps"] // 2, s
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", "auto")
    generate_checked(all_tiny, **opts)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_seeded_sampling_overlaps_on_cuda(tiny_qwen3_moe, monkeypatch):
    """On CUDA: seeded rows (their numbers from host generators, the picks on the device) in
    overlapped steps give the synchronous run's tokens, and the same tokens again."""
    opts = dict(PLACEMENTS["all-G"], device="cuda")
    prompts = [prompt_ids(320, n, seed=n) for n in (15, 29, 8)]
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=16, logprobs=1),
              SamplingParams(temperature=1.0, top_k=40, seed=8, max_tokens=16, logprobs=1),
              SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)]
    want, _ = _run(tiny_qwen3_moe, monkeypatch, False, prompts, params, opts)
    got, s = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, opts)
    again, _ = _run(tiny_qwen3_moe, monkeypatch, True, prompts, params, opts)
    assert got.keys() == want.keys() == again.keys()
    for k in got:
        assert got[k][0] == want[k][0] == again[k][0], k
    assert s["engine.overlapped_steps"] > 0, s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("split", ["on", "auto", "off"])
def test_overlapped_steps_with_graphed_cpu_experts_on_cuda(all_tiny, split, monkeypatch):
    """Routed experts on the CPU, all KV in G: decode steps are resident, their CPU expert
    calls graphed (layers/cpu_experts_graph.py), and now overlapped -- in two sub-batches
    (WRITESCOPE_PIPELINE_EXPERTS on), as the step-form chooser picks (auto: its probes and the
    ends of its holds timed, synchronously) or as one batch (off). Each call's next replay is
    queued while the last is on the device: the tokens and log-probabilities are the
    synchronous run's and transformers'."""
    from test_parity import generate_checked
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", split)
    opts = dict(PLACEMENTS["all-G"], device="cuda", experts="cpu")
    lens, news = (5, 20, 30), (17, 40, 33)
    prompts = [prompt_ids(320, n, seed=n) for n in lens]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=2)
              for m in news]
    want, s0 = _run(all_tiny, monkeypatch, False, prompts, params, opts)
    got, s = _run(all_tiny, monkeypatch, True, prompts, params, opts)
    assert got.keys() == want.keys()
    for k in got:
        assert got[k][0] == want[k][0], k
        assert max(abs(x - y) for x, y in zip(got[k][1], want[k][1])) < 1e-4, k
    assert s0["engine.overlapped_steps"] == 0
    assert s["graphs.cpu_expert_calls"] > 0 and s["graphs.resident_steps"] > 0, s
    # (the chooser's probes and the ends of its holds run synchronously: fewer under auto)
    assert s["engine.overlapped_steps"] >= (1 if split == "auto" else sum(news) // 3 // 4), s
    if split == "on":
        assert s["graphs.pipelined_steps"] > 0, s
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", "auto")
    generate_checked(all_tiny, **opts)
