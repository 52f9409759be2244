"""vLLM's priority scheduling (``scheduling_policy="priority"``, ``--scheduling-policy``):
waiting requests are admitted by their ``priority`` (lower first, ties by arrival), the
completions of an ``n`` > 1 request with their parent's, and a running request of lower
priority is preempted for a waiting one that does not fit (tests/test_preemption.py); under
"fcfs" (the default) arrival order is kept and a non-zero priority is refused -- by
``LLMEngine.add_request``, ``LLM.generate(priority=[...])`` and the server's ``priority``
field."""
from __future__ import annotations

import pytest

from conftest import abort_left, in_process_server, post_ok
from writescope import LLM, SamplingParams
from writescope.core import InvalidRequestError, Request
from writescope.engine.scheduler import Scheduler

G = dict(temperature=0.0, max_tokens=3, ignore_eos=True)
OPTS = dict(dtype="float32", device="cpu", block_size=8, max_model_len=256, max_num_seqs=1)


@pytest.fixture(scope="module")
def prio(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), scheduling_policy="priority", **OPTS)


@pytest.fixture(scope="module")
def fcfs(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), **OPTS)


@pytest.fixture(autouse=True)
def _nothing_left_behind(request):
    yield
    abort_left(request)


def finish_order(eng) -> list[str]:
    """The request ids in the order they finish (max_num_seqs=1: the order admitted)."""
    done = []
    while eng.has_unfinished_requests():
        done += [o.request_id for o in eng.step() if o.finished]
    return done


# ----------------------------------------------------------------------------- the engine

def test_priority_admits_lower_values_first_ties_by_arrival(prio):
    eng = prio.llm_engine
    for rid, p in (("a", 5), ("b", 1), ("c", 3), ("d", 1), ("e", -2), ("f", 5)):
        eng.add_request(rid, "the", SamplingParams(**G), priority=p)
    assert [r.request_id for r in eng.scheduler.waiting] == ["e", "b", "d", "c", "a", "f"]
    assert finish_order(eng) == ["e", "b", "d", "c", "a", "f"]


def test_priority_preempts_a_running_request_of_lower_priority(prio):
    """(tests/test_preemption.py: the preempted request's outputs)"""
    eng = prio.llm_engine
    eng.add_request("first", "the", SamplingParams(**G), priority=9)
    eng.step()  # admitted (max_num_seqs=1)
    eng.add_request("late-low", "the", SamplingParams(**G), priority=4)
    eng.add_request("late-high", "the", SamplingParams(**G), priority=0)
    assert [r.request_id for r in eng.scheduler.running] == ["first"]
    # "late-high" preempts "first"; then "late-low" is the head and runs before it
    assert finish_order(eng) == ["late-high", "late-low", "first"]


def test_fcfs_keeps_arrival_order_and_refuses_a_priority(fcfs):
    eng = fcfs.llm_engine
    assert eng.scheduling_policy == "fcfs" and eng.scheduler.policy == "fcfs"
    for rid in ("a", "b", "c"):
        eng.add_request(rid, "the", SamplingParams(**G), priority=0)
    assert finish_order(eng) == ["a", "b", "c"]
    with pytest.raises(InvalidRequestError, match="priority 3: .*priority scheduling"):
        eng.add_request("x", "the", SamplingParams(**G), priority=3)
    assert not eng.has_unfinished_requests() and "x" not in eng.requests


def test_same_outputs_under_both_policies(prio, fcfs):
    prompts = ["the", "a b c", "rivers run"]
    want = [o.outputs[0].token_ids for o in fcfs.generate(prompts, SamplingParams(**G),
                                                          use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in prio.generate(prompts, SamplingParams(**G),
                                                         use_tqdm=False, priority=[2, 0, 1])]
    assert got == want


def test_n_children_keep_their_parents_priority(prio):
    eng = prio.llm_engine
    eng.add_request("low", "the", SamplingParams(**G), priority=5)
    eng.add_request("par", "the", SamplingParams(**G, n=2), priority=1)
    kids = [r for r in eng.requests.values() if eng.fanout.parent_of(r.request_id) == "par"]
    assert len(kids) == 2 and {r.priority for r in kids} == {1}
    assert eng.requests["low"].priority == 5
    assert [r.request_id for r in eng.scheduler.waiting][-1] == "low"
    assert finish_order(eng) == ["par", "low"]  # both completions before "low"


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_add_request_refuses_a_priority_that_is_not_an_integer(prio, bad):
    eng = prio.llm_engine
    with pytest.raises(InvalidRequestError, match="priority must be an integer"):
        eng.add_request("bad", "the", SamplingParams(**G), priority=bad)
    assert not eng.has_unfinished_requests()


def test_a_bad_policy_name_is_refused(tiny_qwen3_moe):
    with pytest.raises(ValueError, match="scheduling_policy must be one of fcfs, priority"):
        LLM(str(tiny_qwen3_moe), scheduling_policy="lifo", **OPTS)


# ------------------------------------------------------------------------- LLM.generate

def test_generate_admits_by_priority(prio):
    outs = prio.generate(["the", "a b", "c d", "e"], SamplingParams(**G), use_tqdm=False,
                         priority=[3, 1, 2, 1])
    assert [o.prompt for o in outs] == ["the", "a b", "c d", "e"]  # prompt order kept
    # (queued together: the later one is admitted, the longer it waited)
    admitted = sorted(range(4), key=lambda i: outs[i].queue_time_s)
    assert admitted == [1, 3, 2, 0]


def test_generate_refuses_bad_priorities_before_queueing_any(prio, fcfs):
    for llm, pr, err, msg in (
            (prio, [0], ValueError, "2 prompts but 1 priorities"),
            (prio, [0, 1, 2], ValueError, "2 prompts but 3 priorities"),
            (prio, 1, TypeError, "priority must be a list"),
            (prio, [0, True], InvalidRequestError, "priority must be an integer"),
            (prio, [0, 0.5], InvalidRequestError, "priority must be an integer"),
            (fcfs, [0, 2], InvalidRequestError, "does not use priority scheduling")):
        with pytest.raises(err, match=msg):
            llm.generate(["the", "a"], SamplingParams(**G), use_tqdm=False, priority=pr)
        assert not llm.llm_engine.has_unfinished_requests()
    # zeros are fine under fcfs (vLLM's default)
    assert len(fcfs.generate(["the", "a"], SamplingParams(**G), use_tqdm=False,
                             priority=[0, 0])) == 2


# ---------------------------------------------------------------------- the scheduler

class _NoCache:
    """Just enough of the cache for ``Scheduler.add``."""


def _req(rid: str, priority: int) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(), priority=priority)


def test_scheduler_fcfs_ignores_priority_values():
    s = Scheduler(_NoCache(), 4, 64)
    for rid, p in (("a", 3), ("b", 1), ("c", 2)):
        s.add(_req(rid, p))
    assert [r.request_id for r in s.waiting] == ["a", "b", "c"]


def test_scheduler_priority_inserts_in_admission_order():
    s = Scheduler(_NoCache(), 4, 64, policy="priority")
    for rid, p in (("a", 3), ("b", 1), ("c", 2), ("d", 1), ("e", 3), ("f", 0)):
        s.add(_req(rid, p))
    assert [r.request_id for r in s.waiting] == ["f", "b", "d", "c", "a", "e"]
    s.remove(s.waiting[2])
    assert [r.request_id for r in s.waiting] == ["f", "b", "c", "a", "e"]


def test_a_head_that_does_not_fit_blocks_lower_priorities(tiny_qwen3_moe):
    """vLLM's rule: a request of lower priority never jumps ahead of a waiting one of higher
    priority that does not fit (here: the KV budgets hold one long request at a time)."""
    llm = LLM(str(tiny_qwen3_moe), scheduling_policy="priority", dtype="float32", device="cpu",
              block_size=8, max_model_len=64, max_num_seqs=4, num_gpu_blocks=10,
              host_budget=0, pinned_budget=0, enable_prefix_caching=False)
    eng = llm.llm_engine
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    eng.add_request("run", list(range(3, 43)), long, priority=0)
    eng.step()
    assert [r.request_id for r in eng.scheduler.running] == ["run"]
    eng.add_request("small", [5, 6], SamplingParams(**G), priority=2)
    eng.add_request("big", list(range(3, 43)), long, priority=1)
    eng.step()
    # "big" heads the queue and does not fit beside "run": "small", which would, waits too
    assert [r.request_id for r in eng.scheduler.waiting] == ["big", "small"]
    assert [r.request_id for r in eng.scheduler.running] == ["run"]
    eng.abort_request("big")  # the control: with "big" gone, "small" fits beside "run"
    eng.step()
    assert [r.request_id for r in eng.scheduler.running] == ["run", "small"]
    assert not eng.scheduler.waiting
    finish_order(eng)


# ----------------------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def prio_server_engine(tiny_qwen3_moe):
    from writescope.engine.engine import LLMEngine
    return LLMEngine(str(tiny_qwen3_moe), scheduling_policy="priority", **OPTS)


@pytest.fixture(scope="module")
def fcfs_server_engine(tiny_qwen3_moe):
    from writescope.engine.engine import LLMEngine
    return LLMEngine(str(tiny_qwen3_moe), **OPTS)


CHAT = [{"role": "user", "content": "hi"}]


def test_server_accepts_priority_under_the_policy_and_hands_it_to_the_engine(
        prio_server_engine, monkeypatch):
    pytest.importorskip("fastapi")
    eng = prio_server_engine
    seen = []
    add = eng.add_request

    def spy(rid, prompt, params=None, priority=0):
        seen.append((rid, priority))
        return add(rid, prompt, params, priority=priority)

    monkeypatch.setattr(eng, "add_request", spy)
    with in_process_server(eng) as client:
        assert post_ok(client, "/v1/completions", prompt="the", max_tokens=2,
                       priority=-3, n=2)["choices"]
        assert post_ok(client, "/v1/chat/completions", messages=CHAT, max_tokens=2,
                       priority=7)["choices"]
        assert post_ok(client, "/v1/completions", prompt="the", max_tokens=2)["choices"]
        assert post_ok(client, "/v1/completions", prompt="the", max_tokens=2, n=2,
                       use_beam_search=True, priority=4)["choices"]
        for body in ({"priority": True}, {"priority": "1"}, {"priority": 1.5}):
            r = client.post("/v1/completions", json=dict(prompt="the", max_tokens=1, **body))
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "priority"
    prios = [p for _, p in seen]
    assert prios[:3] == [-3, -3, 7] and prios[3] == 0
    assert set(prios[4:]) == {4}  # every beam step's requests


def test_server_refuses_a_priority_under_fcfs(fcfs_server_engine):
    pytest.importorskip("fastapi")
    with in_process_server(fcfs_server_engine) as client:
        assert post_ok(client, "/v1/completions", prompt="the", max_tokens=1,
                       priority=0)["choices"]
        for path, body in (("/v1/completions", dict(prompt="the", max_tokens=1, priority=2)),
                           ("/v1/chat/completions", dict(messages=CHAT, max_tokens=1,
                                                         priority=-1))):
            r = client.post(path, json=body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "priority" and err["code"] == "invalid_value"
            assert "does not use priority scheduling" in err["message"]
            assert "--scheduling-policy priority" in err["message"]


# -------------------------------------------------------------------------------- the CLI

@pytest.mark.parametrize("cmd", ["serve", "generate", "chat"])
def test_scheduling_policy_flag(cmd):
    from writescope.cli import build_parser
    from writescope.commands.common import engine_kwargs
    parser = build_parser()
    extra = ["--prompt", "x"] if cmd == "generate" else []
    assert engine_kwargs(parser.parse_args([cmd, *extra]))["scheduling_policy"] == "fcfs"
    args = parser.parse_args([cmd, *extra, "--scheduling-policy", "priority"])
    assert engine_kwargs(args)["scheduling_policy"] == "priority"
    with pytest.raises(SystemExit):
        parser.parse_args([cmd, *extra, "--scheduling-policy", "lifo"])
