"""``LLMEngine.add_request`` with ``SamplingParams.n`` > 1 or ``best_of`` (vLLM's parallel
sampling, engine/parallel.py): one output per request id, its ``outputs`` indexed by completion,
the same completions as ``LLM.generate`` gives, under every output kind; aborts by the parent id."""
import pytest

from writescope import LLM, SamplingParams
from writescope.core import InvalidRequestError, RequestOutputKind

G = dict(temperature=1.0, max_tokens=5, ignore_eos=True, seed=11)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8,
               max_model_len=256, max_num_seqs=2)


def run(eng):
    seen = []
    while eng.has_unfinished_requests():
        seen += eng.step()
    return seen


def test_cumulative_outputs_hold_every_completion(llm):
    want = [c.token_ids for c in llm.generate("the", SamplingParams(**G, n=3))[0].outputs]
    assert len({tuple(t) for t in want}) == 3  # seeds seed, seed + 1, seed + 2
    eng = llm.llm_engine
    eng.add_request("par", "the", SamplingParams(**G, n=3))
    seen = run(eng)
    assert {o.request_id for o in seen} == {"par"}
    assert [o.finished for o in seen] == [False] * (len(seen) - 1) + [True]
    for o in seen:  # three completions each time (max_num_seqs=2: one starts later)
        assert [c.index for c in o.outputs] == [0, 1, 2]
    assert [c.token_ids for c in seen[-1].outputs] == want
    assert seen[-1].token_ids == want[0] and seen[-1].text == seen[-1].outputs[0].text
    assert not eng.requests and not eng.fanout.parents  # nothing left behind


def test_delta_outputs_add_up_to_the_completions(llm):
    want = [c.token_ids for c in llm.generate("the", SamplingParams(**G, n=2))[0].outputs]
    eng = llm.llm_engine
    eng.add_request("par-d", "the", SamplingParams(**G, n=2,
                                                   output_kind=RequestOutputKind.DELTA))
    got = [[], []]
    seen = run(eng)
    for o in seen:
        for c in o.outputs:
            got[c.index] += c.token_ids
    assert got == want and seen[-1].finished
    assert not any(o.finished for o in seen[:-1])


def test_final_only_and_best_of_give_one_output(llm):
    eng = llm.llm_engine
    eng.add_request("par-f", "the", SamplingParams(**G, n=2,
                                                   output_kind=RequestOutputKind.FINAL_ONLY))
    eng.add_request("par-b", "the", SamplingParams(**G, n=2, best_of=3))
    seen = run(eng)
    assert sorted(o.request_id for o in seen) == ["par-b", "par-f"]
    best = llm.generate("the", SamplingParams(**G, n=2, best_of=3))[0]
    by_id = {o.request_id: o for o in seen}
    assert [c.token_ids for c in by_id["par-b"].outputs] == [c.token_ids for c in best.outputs]
    assert by_id["par-b"].outputs[0].logprobs is None  # ranked by them, not asked for
    assert len(by_id["par-f"].outputs) == 2 and by_id["par-f"].finished


def test_the_parent_id_aborts_every_completion(llm):
    eng = llm.llm_engine
    eng.add_request("par-a", "the", SamplingParams(**G, n=3))
    eng.step()
    eng.abort_request("par-a")
    assert not eng.has_unfinished_requests() and not eng.fanout.parents
    eng.add_request("par-a", "the", SamplingParams(**G, n=2))  # the id is free again
    eng.abort_request("1_par-a")  # one child's id ends the whole request
    assert not eng.has_unfinished_requests() and not eng.fanout.child_of


def test_ids_in_use_are_refused_before_anything_is_queued(llm):
    eng = llm.llm_engine
    eng.add_request("1_busy", "the", SamplingParams(**G))
    with pytest.raises(InvalidRequestError, match="'1_busy'"):
        eng.add_request("busy", "the", SamplingParams(**G, n=2))
    assert list(eng.requests) == ["1_busy"] and not eng.fanout.parents
    with pytest.raises(InvalidRequestError, match="already in use"):
        eng.add_request("1_busy", "the", SamplingParams(**G, n=2))
    eng.abort_request("1_busy")
    eng.add_request("big", "the", SamplingParams(**G, n=2))
    with pytest.raises(InvalidRequestError, match="already in use"):
        eng.add_request("big", "the", SamplingParams(**G))
    eng.abort_request("big")
    with pytest.raises(InvalidRequestError):  # a bad prompt: no child stays queued
        eng.add_request("bad", [10 ** 9], SamplingParams(**G, n=2))
    assert not eng.requests and not eng.fanout.parents
