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

