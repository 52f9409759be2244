"""End to end on CUDA: tiny checkpoints with mixed G/T/C placement (T pinned and streamed, C read
by the CPU kernel) generate transformers' greedy tokens."""
from __future__ import annotations

import pytest
import torch

from test_parity import (GREEDY, PLACEMENTS, engine, generate_checked, prefix_cache_checked,
                         prompt_ids, reference)
from writescope import SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("placement", ["mixed", "all-T", "all-C"])
def test_cuda_fp32_matches_transformers(all_tiny, placement):
    s = generate_checked(all_tiny, device="cuda", **PLACEMENTS[placement]).stats()
    assert s["kv.bytes_moved_after_placement"] == 0
    assert s["engine.cuda_peak_bytes"] <= s["engine.vram_budget"]


@pytest.mark.parametrize("placement", ["mixed", "all-T"])
def test_cuda_units_staged_ahead_match_transformers(all_tiny, placement, monkeypatch):
    """``WRITESCOPE_STAGING_AHEAD=1``: decode steps that start from the T units the step before
    staged during its last layers generate transformers' greedy tokens; some units were used."""
    monkeypatch.setenv("WRITESCOPE_STAGING_AHEAD", "1")
    llm = generate_checked(all_tiny, device="cuda", **PLACEMENTS[placement])
    assert llm.engine.cache.hybrid.ring.ahead_units["used"] > 0


@pytest.mark.parametrize("placement", ["mixed", "all-T", "all-C"])
def test_cuda_prefix_cache_hits_match_transformers(all_tiny, placement):
    """Prefix caching on CUDA: prompts start from blocks left in G, T (pinned, streamed) or C
    (read by the CPU kernel) by earlier prompts and answers; transformers' tokens."""
    s = prefix_cache_checked(all_tiny, device="cuda", **PLACEMENTS[placement])
    assert s["engine.cuda_peak_bytes"] <= s["engine.vram_budget"]


def test_cuda_bf16_within_logprob_tolerance(all_tiny):
    """bf16 on the GPU: each step's chosen token is the reference's or within bf16 noise of it."""
    llm = engine(all_tiny, device="cuda", dtype="bfloat16", **PLACEMENTS["mixed"])
    ids = prompt_ids(llm.engine.config.vocab_size)
    ref_toks, ref_lps, _ = reference(str(all_tiny), tuple(ids), 8)
    (out,) = llm.generate([ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1))
    assert out.token_ids[0] == ref_toks[0]
    assert abs(out.logprobs[0] - ref_lps[0]) < 0.05


@pytest.mark.parametrize("result", ["copy", "kernel"])
def test_cuda_batch_with_cpu_experts(all_tiny, result, monkeypatch):
    """The experts on the CPU, their results brought back by a copy engine (the default) or
    read in place by a kernel (``WRITESCOPE_CPU_EXPERT_RESULT=kernel``): the CPU engine's
    greedy tokens."""
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_RESULT", result)
    prompts = [prompt_ids(320, n, seed=n) for n in (3, 70, 150)]
    a = engine(all_tiny, device="cuda", experts="cpu", **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    b = engine(all_tiny, device="cpu", **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids


def test_cuda_prefill_runs_cpu_experts_on_the_gpu(all_tiny, monkeypatch):
    """Prefill chunks of >= WRITESCOPE_EXPERT_UPLOAD_TOKENS tokens copy the CPU experts' packed
    weights to the GPU and compute there; decode steps use the CPU kernel. Same greedy tokens."""
    monkeypatch.setenv("WRITESCOPE_EXPERT_UPLOAD_TOKENS", "32")
    llm = generate_checked(all_tiny, device="cuda", experts="cpu", **PLACEMENTS["all-C"])
    up = llm.engine.expert_uploader
    assert up is not None and up.uploads > 0 and up.pinned_bytes > 0
    s = llm.stats()
    assert s["engine.cuda_peak_bytes"] <= s["engine.vram_budget"]


def test_cuda_synthetic_prefill_then_decode(all_tiny):
    """The bench's synthetic prefill on CUDA: random KV written to G, T (pinned) and C
    (pageable, CPU layout) homes, then decode steps over them, as on the CPU."""
    results = {}
    for dev in ("cuda", "cpu"):
        eng = engine(all_tiny, device=dev, dtype="bfloat16", **PLACEMENTS["mixed"]).engine
        for i, n in enumerate((150, 70)):
            eng.add_request(f"r{i}", prompt_ids(eng.config.vocab_size, n, seed=n),
                            SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        assert eng.prefill_synthetic(seed=3) == 149 + 69
        while eng.has_unfinished_requests():
            eng.step()
        s = eng.stats()
        assert s["kv.bytes_moved_after_placement"] == 0 and s["engine.generated_tokens"] == 8
        results[dev] = {r: s[f"kv.bytes_written.{r}"] for r in "GTC"}
    assert results["cuda"] == results["cpu"] and results["cuda"]["T"] and results["cuda"]["C"]


@pytest.mark.parametrize("placement", ["mixed", "all-C"])
def test_cuda_beam_search_is_transformers(all_tiny, placement):
    """Beam search on CUDA (each step's beams as one-token requests over the prefix cache, the
    cached blocks in G, T or C): transformers' hypotheses and scores."""
    from test_beam_search import NEW, PROMPT, WIDTH, hf_beams
    from writescope import BeamSearchParams
    from writescope.engine.beam import beam_score
    llm = engine(all_tiny, device="cuda", **PLACEMENTS[placement])
    ids = prompt_ids(llm.engine.config.vocab_size, PROMPT, seed=3)
    want, scores = hf_beams(str(all_tiny), tuple(ids))
    (out,) = llm.beam_search([ids], BeamSearchParams(beam_width=WIDTH, max_tokens=NEW,
                                                     ignore_eos=True))
    assert [s.token_ids for s in out.sequences] == want
    assert all(abs(beam_score(s, 1.0) - x) < 1e-4 for s, x in zip(out.sequences, scores))
    assert all(n == 0 for n in llm.engine.cache.live_blocks().values())
