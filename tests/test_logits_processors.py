"""Penalties, logit bias and min_tokens (layers/logits_processors.py): against a plain
per-token reference, against transformers' repetition penalty, and through the engine."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import hf_model
from test_parity import engine, prompt_ids
from writescope import SamplingParams
from writescope.core import InvalidRequestError, Request
from writescope.layers.logits_processors import LogitsProcessors


def request(prompt, output, **kw) -> Request:
    r = Request("r", list(prompt), SamplingParams(**kw))
    r.output_token_ids = list(output)
    return r


def reference_row(row: list[float], req: Request, eos: set[int]) -> list[float]:
    """The processors' meaning, token by token."""
    p = req.params
    out = list(row)
    seen = set(req.prompt_token_ids) | set(req.output_token_ids)
    for t in range(len(out)):
        out[t] += (p.logit_bias or {}).get(t, 0.0)  # before the penalties, as vLLM's sampler
        if p.repetition_penalty != 1.0 and t in seen:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
        n = req.output_token_ids.count(t)
        out[t] -= p.frequency_penalty * n + p.presence_penalty * (n > 0)
        if p.allowed_token_ids is not None and t not in p.allowed_token_ids:
            out[t] = -math.inf
        if len(req.output_token_ids) < p.min_tokens and (t in eos or t in p.stop_token_ids):
            out[t] = -math.inf
    return out


def test_each_processor_against_its_definition():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50, generator=g) * 3
    reqs = [request([1, 2, 3, 2], [4, 4, 9], repetition_penalty=1.3),
            request([5], [7, 7, 7, 8], frequency_penalty=0.5, presence_penalty=0.3),
            request([5], [], logit_bias={3: 5.0, 49: -100}),
            request([5], [6], min_tokens=3, stop_token_ids=[11]),
            request([5], [6, 7, 8], min_tokens=3, stop_token_ids=[11]),  # reached: no mask
            request([1, 2], [3], temperature=0.0),                         # asks for nothing
            request([5], [6], allowed_token_ids=[2, 7, 49, 400], logit_bias={7: 2.0}),
            # a biased token already seen: (logit + bias) / penalty, then the frequency term
            request([1, 2, 3], [4, 4], repetition_penalty=2.0, frequency_penalty=0.5,
                    logit_bias={2: 6.0, 4: -3.0, 8: 1.0})]
    proc = LogitsProcessors()
    proc.eos_ids = {0}
    got = proc.apply(logits, reqs)
    for i, r in enumerate(reqs):
        want = reference_row(logits[i].tolist(), r, proc.eos_ids)
        assert got[i].tolist() == pytest.approx(want, abs=1e-5), i
    assert got[3, 0] == -math.inf and got[3, 11] == -math.inf and got[4, 0] > -math.inf
    assert torch.equal(got[5], logits[5])
    assert (got[6] > -math.inf).nonzero().flatten().tolist() == [2, 7, 49]


def test_nothing_asked_returns_the_same_tensor():
    logits = torch.randn(2, 10)
    assert LogitsProcessors().apply(logits, [request([1], []), request([2], [3])]) is logits


@pytest.mark.parametrize("bad", [dict(presence_penalty=2.5), dict(frequency_penalty=-3.0),
                                 dict(repetition_penalty=0.0), dict(min_tokens=-1),
                                 dict(min_tokens=5, max_tokens=4),
                                 dict(logit_bias={1: 101.0}), dict(logit_bias={-1: 1.0}),
                                 dict(presence_penalty=float("nan")),
                                 dict(allowed_token_ids=[]), dict(allowed_token_ids=[-1]),
                                 dict(allowed_token_ids=[1.5]),
                                 dict(include_stop_str_in_output=1),
                                 dict(truncate_prompt_tokens=0), dict(truncate_prompt_tokens=-2),
                                 dict(min_p=1.5), dict(min_p=-0.1)])
def test_bad_values_are_refused(bad):
    with pytest.raises(InvalidRequestError):
        SamplingParams(**bad)


def test_repetition_penalty_matches_transformers(all_tiny):
    """Greedy with ``repetition_penalty=1.5`` over a 210-token prompt: transformers' tokens."""
    llm = engine(all_tiny)
    ids = prompt_ids(llm.engine.config.vocab_size)
    (out,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                                repetition_penalty=1.5))
    with torch.no_grad():
        g = hf_model(str(all_tiny)).generate(torch.tensor([ids]), max_new_tokens=24,
                                              do_sample=False, repetition_penalty=1.5,
                                              eos_token_id=None, pad_token_id=0)
    assert out.token_ids == g[0, len(ids):].tolist()


def test_engine_applies_bias_min_tokens_and_penalties(tiny_qwen3_moe):
    llm = engine(tiny_qwen3_moe)
    ids = prompt_ids(320, 30, seed=2)
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    (base,) = llm.generate([ids], plain)
    # a large bias makes a token the greedy choice at every step; log-probabilities stay the
    # model's own (raw), so they are not those of a certain token
    forced = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0,
                            logit_bias={17: 100.0})
    (b,) = llm.generate([ids], forced)
    assert b.token_ids == [17] * 6 and all(lp < -1e-3 for lp in b.logprobs)
    # allowed_token_ids: every token from the set (greedy: the model's best of them), sampled
    # or not; an id beyond the vocabulary is refused
    allowed = [5, 17, 200]
    (a,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                              allowed_token_ids=allowed, logprobs=20))
    assert set(a.token_ids) <= set(allowed)
    for tok, top in zip(a.token_ids, a.top_logprobs):
        among = [(v, t) for t, v in top.items() if t in allowed]
        assert not among or max(among)[1] == tok  # the model's best of the allowed ones
    (r,) = llm.generate([ids], SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True,
                                              allowed_token_ids=allowed, seed=1))
    assert set(r.token_ids) <= set(allowed)
    with pytest.raises(InvalidRequestError, match="allowed_token_ids"):
        llm.generate([ids], SamplingParams(max_tokens=2, allowed_token_ids=[10 ** 7]))
    # min_tokens: the first greedy token is a stop token, held back for three tokens
    first = base.token_ids[0]
    (stopped,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=12,
                                                    stop_token_ids=[first]))
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    (held,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=12, min_tokens=3,
                                                 stop_token_ids=[first]))
    assert len(held.token_ids) >= 3 and first not in held.token_ids[:3]
    # frequency and presence penalties: each greedy choice is the best of the model's own
    # log-probabilities less each token's penalty for the tokens before it
    (f,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                              frequency_penalty=1.5, presence_penalty=0.5,
                                              logprobs=20))
    penalised = 0
    for i, (tok, lp, top) in enumerate(zip(f.token_ids, f.logprobs, f.top_logprobs)):
        before = f.token_ids[:i]

        def score(t, v):
            n = before.count(t)
            return v - 1.5 * n - 0.5 * (n > 0)
        assert all(score(tok, lp) >= score(t, v) - 1e-4 for t, v in top.items()), i
        penalised += tok != next(iter(top))  # not the model's own first choice
    assert penalised > 0 and f.token_ids != base.token_ids


def test_bad_words_mask_a_words_last_token_after_the_rest():
    """vLLM's ``bad_words``: a one-token word is always masked; a longer word's last token only
    where the output ends with the word's other tokens."""
    logits = torch.zeros(3, 20)
    reqs = [request([1], [4, 3], bad_words=["x"]), request([1], [3, 4], bad_words=["x"]),
            request([1], [], bad_words=["x"])]
    for r in reqs:
        r.bad_words_ids = [[7], [3, 9], [2, 3, 11]]
    got = LogitsProcessors().apply(logits, reqs)
    masked = [(row == -math.inf).nonzero().flatten().tolist() for row in got]
    assert masked == [[7, 9], [7], [7]]


def test_engine_never_writes_a_bad_word(tiny_qwen3_moe):
    llm = engine(tiny_qwen3_moe)
    eng = llm.engine
    ids = prompt_ids(320, 30, seed=4)
    greedy = dict(temperature=0.0, max_tokens=16, ignore_eos=True)
    (base,) = llm.generate([ids], SamplingParams(**greedy))
    word = None
    for t in base.token_ids:  # a generated token that is a word of its own
        w = eng.tokenizer.decode([t]).strip()
        if w and any(seq == [t] for seq in eng._bad_words_ids([w])):
            word = w
            break
    assert word is not None
    banned = eng._bad_words_ids([word])
    (out,) = llm.generate([ids], SamplingParams(bad_words=[word], **greedy))
    toks = out.token_ids
    for seq in banned:
        assert not any(toks[i:i + len(seq)] == seq for i in range(len(toks))), (seq, toks)
    assert toks != base.token_ids
    with pytest.raises(InvalidRequestError, match="bad_words"):
        SamplingParams(bad_words=[" "])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_processors_on_cuda(tiny_qwen3_moe):
    """On CUDA, in one batch: allowed_token_ids, bad_words and logit_bias do what they say, for
    greedy, sampled and seeded rows, and seeded rows (one with min_p) repeat."""
    llm = engine(tiny_qwen3_moe, device="cuda")
    eng = llm.engine
    ids = prompt_ids(320, 30, seed=6)
    base = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=12,
                                              ignore_eos=True))[0]
    word = next(w for w in (eng.tokenizer.decode([t]).strip() for t in base.token_ids)
                if w and [eng.tokenizer.encode(w, add_special_tokens=False)[-1]] in
                eng._bad_words_ids([w]))
    banned = eng._bad_words_ids([word])
    allowed = [5, 17, 200]
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                             allowed_token_ids=allowed),
              SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True,
                             allowed_token_ids=allowed, seed=3),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, bad_words=[word]),
              SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True,
                             logit_bias={17: 100.0}),
              SamplingParams(temperature=1.0, min_p=0.3, top_k=20, max_tokens=8,
                             ignore_eos=True, seed=9)]
    outs = llm.generate([ids] * 5, params)
    again = llm.generate([ids] * 5, params)
    assert again[4].token_ids == outs[4].token_ids
    assert set(outs[0].token_ids) <= set(allowed) and set(outs[1].token_ids) <= set(allowed)
    toks = outs[2].token_ids
    assert all(toks[i:i + len(s)] != s for s in banned for i in range(len(toks)))
    assert outs[3].token_ids == [17] * 6
    assert again[1].token_ids == outs[1].token_ids  # seeded
    assert again[0].token_ids == outs[0].token_ids and again[2].token_ids == toks
