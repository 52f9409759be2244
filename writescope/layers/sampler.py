"""Sampling: greedy, temperature, top-k, top-p, per-request seeds, log-probabilities of the
chosen token and of the most likely ones. Tokens are picked from the logits after the logits
processors (penalties, bias, ``min_tokens``) and the grammars' masks (structured outputs).

Log-probabilities are those of the model's distribution (log-softmax of the raw logits in
float32), as vLLM and transformers' ``output_scores``/``compute_transition_scores`` report them
for greedy decoding; so are the alternatives a request asks for with ``SamplingParams.logprobs``
= k >= 1 (vLLM's sampled logprobs): the k largest of them, one ``torch.topk`` over the rows
of the batch, most likely first.
"""
from __future__ import annotations

import torch

from ..attention.hostflag import host_event
from ..core import Request, SamplingParams
from .grammar import Grammars
from .logits_processors import LogitsProcessors


#: per row, None or the row's k most likely tokens {token id: log-probability}, most likely first
TopLogprobs = list  # list[dict[int, float] | None]


def top_k_of(params: list[SamplingParams]) -> list[int]:
    """Per row, how many alternatives it asks for (0: none)."""
    return [p.logprobs or 0 for p in params]


def _top_tensors(logprobs: torch.Tensor, ks: list[int]):
    """(values, ids) of the ``max(ks)`` largest log-probabilities of each row, or None."""
    k = min(max(ks, default=0), logprobs.shape[-1])
    return torch.topk(logprobs, k, dim=-1) if k > 0 else None


def _ranks(logprobs: torch.Tensor, chosen: torch.Tensor, params: list[SamplingParams]):
    """Each row's sampled token's rank in the vocabulary (1 + the tokens likelier than it; ties
    share the better rank, as the prompt tokens' ranks do), or None when no row asks for
    log-probabilities (vLLM's ``Logprob.rank`` of the sampled token, in or out of the top k)."""
    if all(p.logprobs is None for p in params):
        return None
    return (logprobs > chosen.view(-1, 1)).sum(-1) + 1


def _top_dicts(values: list[list[float]], ids: list[list[int]], ks: list[int]) -> TopLogprobs:
    return [dict(zip(i[:k], v[:k])) if k > 0 else None for v, i, k in zip(values, ids, ks)]


class PendingTokens:
    """Sampled tokens, their log-probabilities and ranks (and the alternatives asked for) still on
    their way from the device: copied into page-locked host memory behind the step's work, read
    by :meth:`result` (which waits for the copies, not for work queued after them)."""

    def __init__(self, tokens: torch.Tensor, logprobs: torch.Tensor, top=None,
                 ks: list[int] | None = None, ranks: torch.Tensor | None = None):
        #: the tokens on the device (the next step's input ids are taken from here)
        self.tokens = tokens
        self._ks = ks or []
        self._has_ranks = ranks is not None
        tensors = (tokens, logprobs) + ((ranks,) if ranks is not None else ()) + \
            (tuple(top) if top is not None else ())
        if tokens.device.type == "cuda":
            self._host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                               for t in tensors)
            for h, t in zip(self._host, tensors):
                h.copy_(t, non_blocking=True)
            # waited on sleeping (cudaEventBlockingSync): a spinning wait took a core from the
            # CPU experts' team while the step in flight ran them (sixty-fourth session: batch-1
            # steps with every routed expert on the CPU 1.6-1.7x slower overlapped than not)
            self._event = host_event()
            self._event.record(torch.cuda.current_stream(tokens.device))
        else:
            self._host, self._event = tensors, None

    def result(self) -> tuple[list[int], list[float], TopLogprobs | None, list[int] | None]:
        """:meth:`Sampler.sample`'s four lists."""
        if self._event is not None:
            self._event.synchronize()
        ranks, rest = None, self._host[2:]
        if self._has_ranks:
            ranks, rest = rest[0].tolist(), rest[1:]
        top = _top_dicts(rest[0].tolist(), rest[1].tolist(), self._ks) if rest else None
        return self._host[0].tolist(), self._host[1].tolist(), top, ranks


class Sampler:
    def __init__(self):
        self._generators: dict[int, torch.Generator] = {}
        #: penalties, logit bias, min_tokens (tokens are picked from the processed logits)
        self.processors = LogitsProcessors()
        #: the constrained requests' grammars (layers/grammar.py; the engine sets it)
        self.grammars: Grammars | None = None

    def forget(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)
        self.processors.forget(seq_id)
        if self.grammars is not None:
            self.grammars.forget(seq_id)

    def _constrained(self, requests: list[Request] | None) -> list[int]:
        if not requests or self.grammars is None:
            return []
        return [i for i, r in enumerate(requests)
                if r.params.constrained and self.grammars.active(r.seq_id)]

    def _scores(self, logits: torch.Tensor, requests: list[Request] | None) -> torch.Tensor:
        """The logits tokens are picked from: after the processors, then the grammars' masks."""
        if not requests:
            return logits
        scores = self.processors.apply(logits, requests)
        rows = self._constrained(requests)
        if rows:
            scores = self.grammars.mask(scores, rows, [requests[i].seq_id for i in rows], logits)
        return scores

    def _generator(self, seq_id: int, seed: int | None, device: torch.device) -> torch.Generator | None:
        if seed is None:
            return None
        g = self._generators.get(seq_id)
        if g is None:
            g = torch.Generator(device="cpu")
            g.manual_seed(seed)
            self._generators[seq_id] = g
        return g

    def _uniforms(self, rows: list[int], params: list[SamplingParams], seq_ids: list[int],
                  device: torch.device) -> torch.Tensor:
        """One uniform number in [0, 1) per seeded row, from the row's own host generator (one
        number a step, so that a seeded request's tokens repeat across runs, batches and
        devices): the point of its distribution that :meth:`draw` picks."""
        u = [torch.rand((), dtype=torch.float64,
                        generator=self._generator(seq_ids[i], params[i].seed, device)).item()
             for i in rows]
        return torch.tensor(u, dtype=torch.float64).to(device, non_blocking=True)

    @staticmethod
    def can_defer(params: list[SamplingParams]) -> bool:
        """Whether :meth:`sample_pending` can sample these rows on the device: greedy and
        sampled rows (a seeded row's number is drawn on the host before the pick), none whose
        logits depend on its tokens so far (penalties, ``min_tokens``, a grammar: the next step
        must see this one's)."""
        return all(not p.reads_history and not p.constrained for p in params)

    @staticmethod
    def draw(scores: torch.Tensor, params: list[SamplingParams], rows: list[int],
             uniforms: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens for the sampled ``rows`` of ``scores [B, V]``, all at once on their device.
        The logits are divided by the temperature; masked are those below the k-th largest
        (top-k; exactly k kept where values tie), those whose probability is below min_p times
        the largest one's (min-p: a logit below the largest + log(min_p), the same over any
        subset that holds the largest), then those past the smallest most-likely prefix whose
        probability reaches top_p (top-p). Unseeded rows are then drawn by the exponential race
        (``argmax(p / E)``, E ~ Exp(1) from the device's generator: token i wins with
        probability p_i), as vLLM samples; with ``uniforms`` (one number u in [0, 1) per row,
        seeded rows'), the token where the cumulative probability (float64) first exceeds u --
        one random number a row instead of one per vocabulary entry (a host generator makes
        those at ~50 M/s: 3 ms for Qwen3's vocabulary). No launches per row and no copy to the
        host. Rows with a top-k work on the largest k of them only (one ``topk``); rows with
        only a top-p sort the whole vocabulary; the rest need neither."""
        dev = scores.device
        out = torch.empty(len(rows), dtype=torch.long, device=dev)
        ks = [params[i].top_k if params[i].top_k and params[i].top_k > 0 else 0 for i in rows]
        ps = [params[i].top_p for i in rows]
        groups: dict[str, list[int]] = {"top_k": [], "top_p": [], "plain": []}
        for j, (k, p) in enumerate(zip(ks, ps)):
            groups["top_k" if k else "top_p" if p < 1.0 else "plain"].append(j)
        for kind, js in groups.items():
            if not js:
                continue
            x = scores[torch.tensor([rows[j] for j in js], device=dev)]
            x = x / torch.tensor([params[rows[j]].temperature for j in js],
                                 device=dev).unsqueeze(1)
            order = None
            if kind == "top_k":  # the largest max(k) values, in order: mask each row's tail
                x, order = torch.topk(x, min(max(ks[j] for j in js), x.shape[-1]), dim=-1)
                keep = torch.tensor([ks[j] for j in js], device=dev).unsqueeze(1)
                x = x.masked_fill(torch.arange(x.shape[-1], device=dev).unsqueeze(0) >= keep,
                                  float("-inf"))
            elif kind == "top_p":
                x, order = torch.sort(x, dim=-1, descending=True)
            mins = [params[rows[j]].min_p for j in js]
            if any(mins):  # log(0) = -inf: rows without min_p keep everything
                floor = x.max(dim=-1, keepdim=True).values + torch.log(
                    torch.tensor(mins, device=dev, dtype=x.dtype)).unsqueeze(1)
                x = x.masked_fill(x < floor, float("-inf"))
            if any(ps[j] < 1.0 for j in js):  # keep the smallest prefix whose mass reaches top_p
                # vLLM's rule, summed in its order (from the least likely up): a token goes
                # where it and every less likely token hold at most 1 - top_p, the most likely
                # never; so a token is dropped once the more likely ones already reach top_p
                probs = torch.softmax(x, dim=-1)
                tail = torch.cumsum(probs.flip(-1), dim=-1).flip(-1)
                rest = 1 - torch.tensor([ps[j] for j in js], device=dev,
                                        dtype=tail.dtype).unsqueeze(1)
                drop = tail <= rest
                drop[:, 0] = False
                x = x.masked_fill(drop, float("-inf"))
            probs = torch.softmax(x, dim=-1)
            if uniforms is None:
                race = torch.empty_like(probs).exponential_().clamp_min_(1e-30)
                pick = torch.argmax(probs / race, dim=-1)
            else:  # inverse CDF: the first token whose cumulative probability exceeds u
                cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # as much as the race
                u = uniforms[torch.tensor(js, device=uniforms.device)].to(dev) * cdf[:, -1]
                pick = torch.searchsorted(cdf, u.unsqueeze(1), right=True).squeeze(1)
                pick = pick.clamp_(max=x.shape[-1] - 1)
            if order is not None:
                pick = order.gather(1, pick.unsqueeze(1)).squeeze(1)
            out[torch.tensor(js, device=dev)] = pick
        return out

    def _draw_sampled(self, tokens: torch.Tensor, scores: torch.Tensor,
                      params: list[SamplingParams], seq_ids: list[int] | None) -> None:
        """Puts the sampled rows' tokens into ``tokens`` (greedy rows keep their argmax), on
        the device, all rows at once: unseeded rows by :meth:`draw`'s race on the device's
        generator, seeded rows at the number each one's own generator draws
        (:meth:`_uniforms`)."""
        dev = tokens.device
        unseeded = [i for i, p in enumerate(params) if not p.greedy and p.seed is None]
        seeded = [i for i, p in enumerate(params) if not p.greedy and p.seed is not None]
        if unseeded:
            tokens[torch.tensor(unseeded, device=dev)] = self.draw(scores, params, unseeded)
        if seeded:
            if seq_ids is None:
                raise ValueError("seeded rows need their sequences' ids (their generators)")
            u = self._uniforms(seeded, params, seq_ids, dev)
            tokens[torch.tensor(seeded, device=dev)] = self.draw(scores, params, seeded, u)

    def sample_pending(self, logits: torch.Tensor, params: list[SamplingParams],
                       requests: list[Request] | None = None) -> PendingTokens:
        """:meth:`sample`'s tokens and log-probabilities computed on the device without
        waiting for them (the engine's overlapped decode steps, ``engine/inflight.py``); only
        where :meth:`can_defer`. The same tokens as :meth:`sample`'s: greedy rows exactly,
        sampled rows from the same draws (:meth:`_draw_sampled`). ``requests`` name the seeded
        rows' generators."""
        logits = logits.float()
        scores = self._scores(logits, requests)
        tokens = torch.argmax(scores, dim=-1)
        if not self.can_defer(params):
            raise ValueError("rows whose logits depend on their tokens so far are sampled on "
                             "the host (Sampler.can_defer)")
        seq_ids = [r.seq_id for r in requests] if requests else None
        self._draw_sampled(tokens, scores, params, seq_ids)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, tokens.view(-1, 1)).view(-1)
        ks = top_k_of(params)
        return PendingTokens(tokens, chosen, _top_tensors(logprobs, ks), ks,
                             _ranks(logprobs, chosen, params))

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], seq_ids: list[int],
               requests: list[Request] | None = None
               ) -> tuple[list[int], list[float], TopLogprobs | None, list[int] | None]:
        """``logits [B, V]`` -> (chosen token ids, their log-probabilities, per row None or the
        ``params[i].logprobs`` most likely tokens {id: log-probability} (None when no row asks),
        their ranks in the vocabulary (1: the most likely; None when no row asks for
        log-probabilities)).
        ``requests`` (one per row): their penalties, bias and ``min_tokens`` apply
        (:mod:`.logits_processors`); the log-probabilities are the model's own."""
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        scores = self._scores(logits, requests)
        tokens = torch.argmax(scores, dim=-1)
        self._draw_sampled(tokens, scores, params, seq_ids)
        out = tokens.tolist()
        for i in self._constrained(requests):
            self.grammars.accept(requests[i].seq_id, out[i])
        chosen_t = logprobs.gather(1, tokens.view(-1, 1)).view(-1)
        ranks = _ranks(logprobs, chosen_t, params)
        ranks = None if ranks is None else ranks.tolist()
        ks = top_k_of(params)
        top = _top_tensors(logprobs, ks)
        top = None if top is None else _top_dicts(top.values.tolist(), top.indices.tolist(), ks)
        return out, chosen_t.tolist(), top, ranks
