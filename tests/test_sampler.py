"""The sampler's log-probabilities: the chosen token's and the k most likely tokens' per row
(``SamplingParams.logprobs``), on the host path and the deferred one."""
from __future__ import annotations

import pytest
import torch

from writescope.core import MAX_LOGPROBS, InvalidRequestError, SamplingParams
from writescope.layers.sampler import Sampler


def logits_rows(n: int = 4, vocab: int = 257, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=g) * 3


def reference(logits: torch.Tensor, i: int, k: int) -> dict[int, float]:
    lp = torch.log_softmax(logits[i].double(), -1)
    order = torch.argsort(lp, descending=True)[:k].tolist()
    return {t: lp[t].item() for t in order}


def test_alternatives_are_the_k_largest_log_probabilities_per_row():
    logits = logits_rows()
    params = [SamplingParams(temperature=0.0, logprobs=5), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, logprobs=0),
              SamplingParams(temperature=0.0, logprobs=MAX_LOGPROBS)]
    toks, chosen, top, _ = Sampler().sample(logits, params, [0, 1, 2, 3])
    assert toks == logits.argmax(-1).tolist()
    assert top[1] is None and top[2] is None
    for i, k in ((0, 5), (3, MAX_LOGPROBS)):
        want = reference(logits, i, k)
        assert list(top[i]) == list(want)  # the same ids, most likely first
        assert all(abs(top[i][t] - v) < 1e-5 for t, v in want.items())
        assert next(iter(top[i])) == toks[i]  # greedy: the chosen token leads
        assert top[i][toks[i]] == pytest.approx(chosen[i], abs=1e-6)


def test_no_row_asking_gives_no_alternatives():
    logits = logits_rows(2)
    params = [SamplingParams(temperature=0.0, logprobs=0), SamplingParams(temperature=0.0)]
    assert Sampler().sample(logits, params, [0, 1])[2] is None


def test_sampled_rows_report_the_distribution_not_the_filter():
    """Alternatives are the model's distribution (as vLLM's sampled logprobs), whatever top_k /
    top_p / temperature the row samples with; the sampled token need not be among them."""
    logits = logits_rows(1, seed=3)
    p = SamplingParams(temperature=1.5, top_k=40, top_p=0.9, seed=11, logprobs=3)
    toks, chosen, top, _ = Sampler().sample(logits, [p], [7])
    want = reference(logits, 0, 3)
    assert list(top[0]) == list(want)
    full = torch.log_softmax(logits[0].float(), -1)
    assert chosen[0] == pytest.approx(full[toks[0]].item(), abs=1e-6)


def test_the_sampled_token_is_ranked_in_the_whole_vocabulary():
    """vLLM's ``Logprob.rank`` of the sampled token: 1 + the tokens likelier than it under the
    model's own distribution, in or out of the alternatives asked for; ties share the better
    rank; no ranks where no row asks for log-probabilities."""
    logits = logits_rows(3, seed=7)
    logits[2, :4] = logits[2].max() + 1.0  # four tokens tie for the most likely
    params = [SamplingParams(temperature=5.0, seed=3, logprobs=0),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, logprobs=1)]
    toks, chosen, _, ranks = Sampler().sample(logits, params, [0, 1, 2])
    full = torch.log_softmax(logits.float(), -1)
    for i in range(3):
        assert ranks[i] == int((full[i] > full[i, toks[i]]).sum()) + 1
    assert ranks[1] == 1 and ranks[2] == 1 and toks[2] < 4
    assert ranks[0] > 1  # a hot draw over 257 tokens lands off the top (seeded)
    assert Sampler().sample(logits, [SamplingParams()] * 3, [0, 1, 2])[3] is None
    s = Sampler()
    assert s.sample_pending(logits[1:], params[1:]).result() == \
        s.sample(logits[1:], params[1:], [1, 2])


def test_fewer_tokens_than_asked():
    logits = logits_rows(1, vocab=6)
    _, _, top, _ = Sampler().sample(logits, [SamplingParams(temperature=0.0, logprobs=10)], [0])
    assert len(top[0]) == 6


def test_deferred_path_gives_the_same_alternatives():
    logits = logits_rows(3, seed=5)
    params = [SamplingParams(temperature=0.0, logprobs=4), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, logprobs=2)]
    s = Sampler()
    assert s.sample_pending(logits, params).result() == s.sample(logits, params, [0, 1, 2])


@pytest.mark.parametrize("bad", [-1, MAX_LOGPROBS + 1, 2.0, True])
def test_bad_logprobs_are_refused(bad):
    with pytest.raises(InvalidRequestError, match="logprobs"):
        SamplingParams(logprobs=bad)


def _filtered(logits_row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The reference filter, one row at a time: the logits after temperature, top-k and top-p
    (masked to -inf)."""
    row = logits_row / p.temperature
    if p.min_p > 0:  # below min_p times the most likely token's probability
        probs = torch.softmax(row, -1)
        row = row.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    if p.top_k and p.top_k > 0:
        kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:  # vLLM's rule: ascending, drop where the mass so far <= 1 - top_p
        sorted_logits, order = torch.sort(row)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = torch.cumsum(probs, dim=-1) <= 1 - torch.tensor(p.top_p)
        drop[-1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        row = torch.full_like(row, float("-inf")).scatter(0, order, sorted_logits)
    return row


@pytest.mark.parametrize("probs,top_p,kept", [([0.5, 0.5], 0.5, 1),
                                              ([0.5, 0.25, 0.25], 0.75, 2),
                                              ([0.6, 0.3, 0.1], 0.9, 2),
                                              ([0.6, 0.3, 0.1], 0.95, 3),
                                              ([0.7, 0.2, 0.1], 0.01, 1)])
def test_top_p_drops_a_token_once_the_likelier_ones_reach_it(probs, top_p, kept):
    """At the boundary, as vLLM's and transformers' top-p: a token whose likelier tokens
    already hold top_p of the mass is never drawn (it was, when they held exactly top_p)."""
    logits = torch.log(torch.tensor(probs)).repeat(4000, 1)
    p = SamplingParams(temperature=1.0, top_p=top_p)
    for uniforms in (None, torch.rand(4000, generator=torch.Generator().manual_seed(1))):
        got = Sampler.draw(logits, [p] * 4000, list(range(4000)), uniforms)
        assert set(got.tolist()) == set(range(kept))


def _target(logits_row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    return torch.softmax(_filtered(logits_row, p), -1)


@pytest.mark.parametrize("p", [SamplingParams(temperature=0.7),
                               SamplingParams(temperature=1.3, top_k=5),
                               SamplingParams(temperature=1.0, top_p=0.6),
                               SamplingParams(temperature=0.9, top_k=7, top_p=0.8),
                               SamplingParams(temperature=1.1, min_p=0.1),
                               SamplingParams(temperature=1.0, min_p=0.05, top_k=8, top_p=0.9)])
def test_draw_samples_the_filtered_distribution(p):
    """The batched draw (exponential race) against the per-row filter's distribution: 40,000
    draws over a 12-token vocabulary, every frequency within 4.5 standard deviations, and no
    token outside the filter's support ever drawn."""
    torch.manual_seed(0)
    logits = torch.randn(12) * 2
    n = 40_000
    rows = logits.expand(n, -1).contiguous()
    got = Sampler.draw(rows, [p] * n, list(range(n)))
    freq = torch.bincount(got, minlength=12).double() / n
    want = _target(logits, p).double()
    assert (freq[want == 0] == 0).all()
    sd = (want * (1 - want) / n).sqrt()
    assert ((freq - want).abs() <= 4.5 * sd + 1e-12).all(), (freq, want)


@pytest.mark.parametrize("p", [SamplingParams(temperature=0.7),
                               SamplingParams(temperature=1.3, top_k=5),
                               SamplingParams(temperature=0.9, top_k=7, top_p=0.8),
                               SamplingParams(temperature=1.0, min_p=0.2, top_p=0.95)])
def test_seeded_draws_sample_the_filtered_distribution(p):
    """Seeded rows (a number u per row, the token where the cumulative probability passes u):
    40,000 draws within 4.5 standard deviations of the filter's distribution, none outside its
    support; through Sampler.sample with 40,000 seeds, each seed's token the same on a second
    sampler."""
    torch.manual_seed(2)
    logits = torch.randn(12) * 2
    n = 40_000
    rows = logits.expand(n, -1).contiguous()
    params = [SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                             min_p=p.min_p, seed=i) for i in range(n)]
    got = torch.tensor(Sampler().sample(rows, params, list(range(n)))[0])
    again = Sampler().sample(rows, params, list(range(n)))[0]
    assert got.tolist() == again
    want = _target(logits, p).double()
    freq = torch.bincount(got, minlength=12).double() / n
    assert (freq[want == 0] == 0).all()
    sd = (want * (1 - want) / n).sqrt()
    assert ((freq - want).abs() <= 4.5 * sd + 1e-12).all(), (freq, want)
    # u at the edges of [0, 1): the most and least likely tokens of the support
    u = torch.tensor([0.0, 1.0 - 2 ** -53], dtype=torch.float64)
    edge = Sampler.draw(rows[:2], params[:2], [0, 1], u).tolist()
    support = (want > 0).nonzero().flatten()
    assert edge[0] in support.tolist() and edge[1] in support.tolist()


def test_draw_mixes_rows_of_different_settings():
    """One call over rows that filter differently (and rows left out): each row's draw stays in
    its own filter's support."""
    torch.manual_seed(1)
    logits = torch.randn(6, 50) * 3
    params = [SamplingParams(temperature=1.0, top_k=1 + 2 * i) if i % 2 else
              SamplingParams(temperature=0.8, top_p=0.3 + 0.1 * i) for i in range(6)]
    for _ in range(50):
        rows = [0, 2, 3, 5]
        got = Sampler.draw(logits, params, rows)
        for r, t in zip(rows, got.tolist()):
            assert _target(logits[r], params[r])[t] > 0, (r, t)
