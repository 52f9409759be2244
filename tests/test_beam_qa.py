"""QA probes of beam search (``LLM.beam_search``, engine/beam.py, the server's
``use_beam_search``): each test pins a defect found in review."""
from __future__ import annotations

import pytest

from test_parity import engine, prompt_ids
from writescope import BeamSearchParams, SamplingParams


def test_each_step_is_one_token_with_its_alternatives(tiny_qwen3_moe):
    # the step's SamplingParams were shadowed by the step counter: the first step ran the
    # default SamplingParams (16 tokens, no log-probabilities) and the search crashed
    llm = engine(tiny_qwen3_moe, max_model_len=128)
    ids = prompt_ids(llm.engine.config.vocab_size, 20, seed=7)
    greedy = llm.generate([ids], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                                logprobs=0), use_tqdm=False)[0]
    seqs = llm.beam_search([ids], BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True),
                           use_tqdm=True)[0].sequences
    assert len(seqs) == 2 and all(len(s.token_ids) == 3 and len(s.logprobs) == 3 for s in seqs)
    assert all(len(d) >= 4 for s in seqs for d in s.logprobs)  # 2 * beam_width alternatives
    assert seqs[0].cum_logprob >= greedy.outputs[0].cumulative_logprob - 1e-6


SMALL = dict(dtype="float32", device="cpu", block_size=8, max_model_len=512, max_num_seqs=2,
             num_gpu_blocks=2, pinned_budget=0, host_budget=0)


def test_a_search_that_can_never_fit_the_budgets_is_refused_before_any_step(tiny_qwen3_moe):
    # it ran until its beams outgrew the budgets, then raised: every step's work lost
    import warnings
    from writescope import LLM
    from writescope.core import RequestTooLargeError
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        small = LLM(str(tiny_qwen3_moe), **SMALL)
    with pytest.raises(RequestTooLargeError, match="never fit"):
        small.beam_search([[5] * 9], BeamSearchParams(beam_width=2, max_tokens=40,
                                                      ignore_eos=True))
    assert small.stats()["kv.bytes_written.G"] == 0  # refused before anything was written
    assert not small.engine.has_unfinished_requests()
    (seq, _) = small.beam_search([[5] * 9], BeamSearchParams(beam_width=2, max_tokens=5,
                                                             ignore_eos=True))[0].sequences
    assert len(seq.token_ids) == 5


def test_the_server_refuses_a_search_that_can_never_fit_before_any_step(tiny_qwen3_moe):
    import warnings
    pytest.importorskip("fastapi")
    from conftest import in_process_server
    from writescope.engine.engine import LLMEngine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        eng = LLMEngine(str(tiny_qwen3_moe), **SMALL)
    with in_process_server(eng) as c:
        r = c.post("/v1/completions", json=dict(prompt=[5] * 9, n=2, max_tokens=40,
                                                ignore_eos=True, use_beam_search=True))
        assert r.status_code == 400, r.text
        assert "never fit" in r.json()["error"]["message"]
        assert eng.stats()["kv.bytes_written.G"] == 0
        r = c.post("/v1/completions", json=dict(prompt=[5] * 9, n=2, max_tokens=5,
                                                ignore_eos=True, use_beam_search=True))
        assert r.status_code == 200, r.text


def test_a_hypothesis_ended_by_eos_counts_its_eos_in_its_length():
    # transformers' beam search divides a finished hypothesis's log-probability by its
    # generated length, the EOS included (cur_len + 1 - prompt_len); it was left out
    from writescope.core import Logprob
    from writescope.engine.beam import BeamSearch
    s = BeamSearch([5, 6], BeamSearchParams(beam_width=1, max_tokens=3), eos_ids={2},
                   max_model_len=100, model_eos_id=2)
    s.advance([{10: Logprob(-1.0)}])
    s.advance([{2: Logprob(-0.6), 11: Logprob(-0.9)}])  # [10, EOS]: -1.6 / 2
    s.advance([{12: Logprob(-0.8)}])                     # [10, 11, 12]: -2.7 / 3
    best = s.result(None).sequences[0]
    assert best.token_ids == [10, 2] and best.finish_reason == "stop"


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_hypotheses_with_a_reachable_eos_are_transformers_beam_search(tiny_qwen3_moe, tmp_path,
                                                                      seed):
    import json
    import shutil
    import torch
    from conftest import hf_model
    width, new = 3, 6
    llm = engine(tiny_qwen3_moe, max_model_len=256)
    ids = prompt_ids(llm.engine.config.vocab_size, 30, seed=seed)
    free = llm.beam_search([ids], BeamSearchParams(beam_width=width, max_tokens=new,
                                                   ignore_eos=True))[0].sequences
    eos = free[0].token_ids[1]  # the best hypothesis's second token ends hypotheses now
    path = tmp_path / "eos"
    shutil.copytree(tiny_qwen3_moe, path)
    gen = json.loads((path / "generation_config.json").read_text())
    gen["eos_token_id"] = eos
    (path / "generation_config.json").write_text(json.dumps(gen))
    got = engine(path, max_model_len=256).beam_search(
        [ids], BeamSearchParams(beam_width=width, max_tokens=new))[0].sequences
    x = torch.tensor([ids])
    with torch.no_grad():
        g = hf_model(path, dtype=torch.float64).generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
            num_beams=width, num_return_sequences=width, length_penalty=1.0, eos_token_id=eos,
            pad_token_id=0, early_stopping="never")
    want = [s[x.shape[1]:].tolist() for s in g]
    want = [w[:w.index(eos) + 1] if eos in w else w for w in want]
    assert [s.token_ids for s in got] == want
    assert any(eos in w for w in want)  # the EOS was reached


@pytest.mark.parametrize("lp", [2000.0, -2000.0, 1e308])
def test_an_extreme_length_penalty_ranks_instead_of_crashing(lp):
    # len ** length_penalty past the floats raised OverflowError (or ZeroDivisionError) once
    # the whole search had run: LLM.beam_search raised, the server's request crashed
    from writescope.core import Logprob
    from writescope.engine.beam import BeamSearch
    s = BeamSearch([5, 6], BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=lp),
                   eos_ids={2}, max_model_len=100, model_eos_id=2)
    s.advance([{2: Logprob(-0.5), 10: Logprob(-1.0), 11: Logprob(-3.0)}])
    s.advance([{12: Logprob(-0.5)}, {13: Logprob(-0.5)}])
    s.advance([{14: Logprob(-0.5)}, {15: Logprob(-0.5)}])
    out = s.result(None).sequences
    # a positive penalty favours the long hypotheses, a negative one the short one
    if lp > 0:
        assert [b.token_ids for b in out] == [[10, 12, 14], [11, 13, 15]]
    else:
        assert out[0].token_ids == [2]


def test_the_server_answers_an_extreme_length_penalty(tiny_qwen3_moe):
    pytest.importorskip("fastapi")
    from conftest import in_process_server
    from writescope.engine.engine import LLMEngine
    eng = LLMEngine(str(tiny_qwen3_moe), dtype="float32", device="cpu", max_model_len=128)
    with in_process_server(eng, raise_server_exceptions=False) as c:
        r = c.post("/v1/completions", json=dict(prompt=[5] * 10, n=2, max_tokens=3,
                                                use_beam_search=True, temperature=0,
                                                length_penalty=1e308))
        assert r.status_code == 200, r.text
        assert [ch["finish_reason"] for ch in r.json()["choices"]] == ["length", "length"]
