"""Beam search (engine/beam.py, ``LLM.beam_search``): the hypotheses of transformers' beam
search on the same weights, under several placements of the KV blocks; the search's rules
(EOS, length penalty, the model's context) on hand-made steps; vLLM's API shape."""
from __future__ import annotations

import functools
import math

import pytest
import torch

from conftest import hf_model
from test_parity import engine, prompt_ids
from writescope import BeamSearchOutput, BeamSearchParams, LLM, SamplingParams
from writescope.core import InvalidRequestError, Logprob
from writescope.engine.beam import BeamSearch, beam_score

WIDTH, NEW, PROMPT = 3, 6, 40


@functools.lru_cache(maxsize=None)
def hf_beams(path: str, ids: tuple[int, ...], width: int = WIDTH, new: int = NEW
             ) -> tuple[list[list[int]], list[float]]:
    """transformers' ``width`` best hypotheses after ``ids`` (no EOS), best first, and their
    scores (the cumulative log-probability over the generated length), in float64."""
    model = hf_model(path, dtype=torch.float64)
    x = torch.tensor([list(ids)])
    with torch.no_grad():
        g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                           do_sample=False, num_beams=width, num_return_sequences=width,
                           length_penalty=1.0, eos_token_id=None, pad_token_id=0,
                           output_scores=True, return_dict_in_generate=True)
    return [s[x.shape[1]:].tolist() for s in g.sequences], g.sequences_scores.tolist()


@pytest.mark.parametrize("arch", ["tiny_qwen3_moe", "tiny_deepseek_v2", "tiny_mixtral"])
@pytest.mark.parametrize("placement", [dict(kv_policy="transfer", num_gpu_blocks=0),
                                       dict(kv_policy="cpu", num_gpu_blocks=0),
                                       dict(kv_policy="static", cpu_share=0.5, num_gpu_blocks=2)],
                         ids=["all-T", "all-C", "mixed"])
def test_hypotheses_are_transformers_beam_search(arch, placement, request):
    path = request.getfixturevalue(arch)
    llm = engine(path, **placement)
    ids = prompt_ids(llm.engine.config.vocab_size, PROMPT, seed=3)
    want, scores = hf_beams(str(path), tuple(ids))
    out = llm.beam_search([ids], BeamSearchParams(beam_width=WIDTH, max_tokens=NEW,
                                                  ignore_eos=True))
    assert isinstance(out[0], BeamSearchOutput)
    seqs = out[0].sequences
    assert [s.token_ids for s in seqs] == want
    for s, score in zip(seqs, scores):
        assert s.tokens[:PROMPT] == ids and len(s.logprobs) == NEW
        assert abs(beam_score(s, 1.0) - score) < 1e-4
        # the cumulative log-probability is the sum of the beam's own tokens'
        assert math.isclose(s.cum_logprob, sum(d[t].logprob for d, t in zip(s.logprobs,
                                                                            s.token_ids)),
                            abs_tol=1e-9)
        assert s.finish_reason == "length"
    assert all(n == 0 for n in llm.engine.cache.live_blocks().values())


def test_width_one_is_greedy_and_later_steps_reuse_the_prefix_cache(tiny_qwen3_moe):
    llm = engine(tiny_qwen3_moe)
    ids = prompt_ids(llm.engine.config.vocab_size, 100, seed=5)
    greedy = llm.generate([ids], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True,
                                                logprobs=0), use_tqdm=False)[0]
    llm.reset_prefix_cache()
    hits = llm.stats()["prefix.hit_tokens"]
    (seq,) = llm.beam_search(ids, BeamSearchParams(beam_width=1, max_tokens=NEW,
                                                   ignore_eos=True))[0].sequences
    assert seq.token_ids == greedy.token_ids
    assert abs(seq.cum_logprob - greedy.outputs[0].cumulative_logprob) < 1e-5
    # each step after the first finds the prompt's full blocks (16 tokens) in the cache
    assert llm.stats()["prefix.hit_tokens"] - hits >= (NEW - 1) * (100 // 16) * 16


def test_beams_beat_greedy_and_texts_are_decoded():
    llm = LLM(device="cpu")  # the embedded default model, with its tokenizer
    greedy = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8,
                                                             ignore_eos=True, logprobs=0),
                          use_tqdm=False)[0]
    out = llm.beam_search(["Once upon a time", {"prompt": "The cat"}],
                          BeamSearchParams(beam_width=4, max_tokens=8, ignore_eos=True))
    assert len(out) == 2 and all(len(o.sequences) == 4 for o in out)
    best = out[0].sequences
    assert best[0].cum_logprob >= greedy.outputs[0].cumulative_logprob - 1e-6
    assert [beam_score(s, 1.0) for s in best] == sorted((beam_score(s, 1.0) for s in best),
                                                        reverse=True)
    tok = llm.get_tokenizer()
    for s in best:
        assert s.text == tok.decode(s.token_ids, skip_special_tokens=True)
        assert all(lp.decoded_token == tok.decode([t]) for d in s.logprobs
                   for t, lp in d.items())
    # at most two prompts at once, or one: the same hypotheses
    one = llm.beam_search(["Once upon a time", {"prompt": "The cat"}],
                          BeamSearchParams(beam_width=4, max_tokens=8, ignore_eos=True),
                          concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in one] == \
        [[s.tokens for s in o.sequences] for o in out]


# ------------------------------------------------------------------ the search's rules, by hand
EOS, OTHER_EOS = 2, 7


def tops(*rows: dict[int, float]) -> list[dict[int, Logprob]]:
    return [{t: Logprob(lp) for t, lp in row.items()} for row in rows]


def search(width=2, max_tokens=4, max_model_len=100, **kw) -> BeamSearch:
    return BeamSearch([5, 6], BeamSearchParams(beam_width=width, max_tokens=max_tokens, **kw),
                      eos_ids={EOS, OTHER_EOS}, max_model_len=max_model_len, model_eos_id=EOS)


def test_eos_ends_a_hypothesis_that_still_competes_at_the_end():
    s = search()
    s.advance(tops({EOS: -0.1, 10: -1.0, 11: -2.0}))
    assert [b.tokens for b in s.live] == [[5, 6, 10], [5, 6, 11]]
    s.advance(tops({12: -3.0, OTHER_EOS: -0.5}, {13: -0.2}))
    assert [b.tokens for b in s.live] == [[5, 6, 11, 13], [5, 6, 10, 12]]
    assert not s.done
    s.advance(tops({14: -5.0}, {15: -5.0}))
    s.advance(tops({16: -5.0}, {17: -5.0}))
    assert s.done
    out = s.result(None).sequences
    # EOS at once scores -0.1 / 1 (the EOS is counted); the other EOS -1.5 / 2
    assert [b.token_ids for b in out] == [[EOS], [10, OTHER_EOS]]
    assert [(b.finish_reason, b.stop_reason) for b in out] == [("stop", None), ("stop", OTHER_EOS)]


def test_length_penalty_ranks_longer_hypotheses_up():
    s = search(width=1, max_tokens=3, length_penalty=2.0)
    s.advance(tops({EOS: -1.0, 10: -0.6}))
    s.advance(tops({11: -0.6}))
    s.advance(tops({12: -0.6}))
    best = s.result(None).sequences[0]
    # live: -1.8 / 3 ** 2 = -0.2 beats the EOS at once (-1.0 / 1)
    assert best.token_ids == [10, 11, 12] and best.finish_reason == "length"
    s = search(width=1, max_tokens=3, length_penalty=0.0)
    for row in ({EOS: -1.0, 10: -0.6}, {11: -0.6}, {12: -0.6}):
        s.advance(tops(row))
    assert s.result(None).sequences[0].token_ids == [EOS]


def test_ignore_eos_and_the_model_context():
    s = search(width=1, ignore_eos=True, max_model_len=4)
    s.advance(tops({EOS: -0.1, 10: -1.0}))
    assert s.live[0].token_ids == [EOS] and not s.done
    s.advance(tops({11: -0.1}))
    assert s.done and not s.live  # four tokens: the model's context is full
    (seq,) = s.result(None).sequences
    assert seq.token_ids == [EOS, 11] and seq.finish_reason == "length"
    with pytest.raises(ValueError, match="2 log-probability dicts for 1 beams"):
        search(width=1).advance(tops({1: 0.0}, {2: 0.0}))


def test_stop_text_is_kept_only_when_asked():
    def decode(ids, skip):
        return "".join(f"<{t}>" if t in (EOS, OTHER_EOS) and not skip else
                       ("" if t in (EOS, OTHER_EOS) else f"t{t}") for t in ids)
    for include, text in ((False, "t10"), (True, "t10<2>")):
        s = search(width=1, max_tokens=2, include_stop_str_in_output=include)
        s.advance(tops({10: -0.1}))
        s.advance(tops({EOS: -0.1}))
        assert s.result(decode).sequences[0].text == text


@pytest.mark.parametrize("kw, msg", [
    (dict(beam_width=0, max_tokens=4), "beam_width must be an integer between 1 and 10"),
    (dict(beam_width=11, max_tokens=4), "beam_width must be an integer between 1 and 10"),
    (dict(beam_width=2, max_tokens=0), "max_tokens must be an integer at least 1"),
    (dict(beam_width=2, max_tokens=4, temperature=-1), "temperature must be non-negative"),
    (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty must be"),
])
def test_bad_params_are_refused(kw, msg):
    with pytest.raises(InvalidRequestError, match=msg):
        BeamSearchParams(**kw)


def test_bad_calls_are_refused(tiny_qwen3_moe):
    llm = engine(tiny_qwen3_moe, max_model_len=64)
    with pytest.raises(TypeError, match="BeamSearchParams"):
        llm.beam_search([[5, 6]], SamplingParams())
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search([[5, 6]], BeamSearchParams(beam_width=2, max_tokens=2),
                        concurrency_limit=0)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        llm.beam_search([list(range(3, 70))], BeamSearchParams(beam_width=2, max_tokens=2))
    # a prompt that fills the context ends at once, with no token
    (seq,) = llm.beam_search([list(range(3, 67))], BeamSearchParams(beam_width=2,
                                                                     max_tokens=2))[0].sequences
    assert seq.token_ids == [] and seq.finish_reason == "length"
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_each_steps_beams_come_named_and_checked_only_where_new(tiny_qwen3_moe, monkeypatch,
                                                               salt):
    """A step's requests carry their full blocks' prefix-cache names (the parent's, extended
    where the beam completed a block: the names a whole-prompt hash gives) and the engine
    checks only the tokens the search generated, not the prompt again each step."""
    llm = engine(tiny_qwen3_moe)
    eng = llm.engine
    ids = prompt_ids(eng.config.vocab_size, 29, seed=6)  # crosses a 16-token block at step 3
    params = BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True)
    plain = llm.beam_search([ids], params)[0].sequences
    checked: list[int] = []
    real = eng._token_ids
    monkeypatch.setattr(eng, "_token_ids", lambda p: checked.append(len(p)) or real(p))
    prompts: list = []
    real_add = eng.add_request

    def add(rid, prompt, params=None, **kw):
        prompts.append(prompt)
        return real_add(rid, prompt, params, **kw)

    monkeypatch.setattr(eng, "add_request", add)
    p = ids if salt is None else {"prompt_token_ids": ids, "cache_salt": salt}
    seqs = llm.beam_search([p], params)[0].sequences
    assert [s.token_ids for s in seqs] == [s.token_ids for s in plain]
    assert len(prompts) > 6 and all(len(bp.block_names) == len(bp.tokens) // 16
                                    for bp in prompts)
    for bp in prompts:
        assert bp.block_names == eng.cache.prefix_names(bp.tokens, salt)
        assert bp.cache_salt == salt and bp.checked == len(ids)
    # the prompt once (beam_search), then only each beam's generated tokens
    assert checked[0] == len(ids) and max(checked[1:]) <= params.max_tokens
    assert sum(checked[1:]) == sum(len(bp.tokens) - len(ids) for bp in prompts if
                                   len(bp.tokens) > len(ids))


def test_a_beams_generated_tokens_are_still_checked(tiny_qwen3_moe):
    from writescope.engine.beam import BeamPrompt
    llm = engine(tiny_qwen3_moe)
    eng = llm.engine
    vocab = eng.config.vocab_size
    with pytest.raises(InvalidRequestError, match="token ids must be integers"):
        eng.add_request("b", BeamPrompt([5, 6, 7, vocab + 3], checked=3), SamplingParams())
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        eng.add_request("b", BeamPrompt([5] * 600, checked=600), SamplingParams())
    # unchecked (a search the engine did not begin): every token is checked
    with pytest.raises(InvalidRequestError, match="token ids must be integers"):
        eng.add_request("b", BeamPrompt([vocab, 6, 7], checked=0), SamplingParams())
    assert not eng.has_unfinished_requests()


def test_a_step_computes_one_token_a_beam(tiny_qwen3_moe):
    """After the first step, each beam's request finds every record of its parent's (its full
    blocks and its kept partial block, kvcache/tails.py) and computes only its new token."""
    llm = engine(tiny_qwen3_moe)
    eng = llm.engine
    ids = prompt_ids(eng.config.vocab_size, 29, seed=8)
    params = BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True)
    want = llm.beam_search([ids], params)[0].sequences
    llm.reset_prefix_cache()
    search = eng.beam_search(ids, params)
    cached = []
    while not search.done:
        rids = [f"s{search.steps}-{i}" for i in range(len(search.live))]
        for rid, p in zip(rids, search.prompts()):
            eng.add_request(rid, p, params.step_params())
        outs = {}
        while eng.has_unfinished_requests():
            outs.update((o.request_id, o) for o in eng.step() if o.finished)
        cached.append([len(p.tokens) - outs[r].num_cached_tokens
                       for r, p in zip(rids, search.prompts())])
        search.advance([outs[r].outputs[0].logprobs[0] for r in rids])
    assert cached[0] == [29]  # the first step computes the prompt (the cache was reset)
    assert all(n == 1 for step in cached[1:] for n in step), cached
    assert [s.token_ids for s in search.result(None).sequences] == [s.token_ids for s in want]
    assert eng.stats()["prefix.tail_hit_tokens"] > 0
