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


def _top_dicts(values: list[list[float]], ids: list[list[int]], ks: list[int]) -> TopLogprobs:
    return [dict(zip(i[:k], v[:k])) if k > 0 else None for v, i, k in zip(values, ids, ks)]


class PendingTokens:
    """Sampled tokens and their log-probabilities (and the alternatives asked for) still on their
    way from the device: copied into page-locked host memory behind the step's work, read by
    :meth:`result` (which waits for the copies, not for work queued after them)."""

    def __init__(self, tokens: torch.Tensor, logprobs: torch.Tensor, top=None,
                 ks: list[int] | None = None):
        #: the tokens on the device (the next step's input ids are taken from here)
        self.tokens = tokens
        self._ks = ks or []
        tensors = (tokens, logprobs) + (tuple(top) if top is not None else ())
        if tokens.device.type == "cuda":
            self._host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                               for t in tensors)
            for h, t in zip(self._host, tensors):
                h.copy_(t, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(tokens.device))
        else:
            self._host, self._event = tensors, None

    def result(self) -> tuple[list[int], list[float], TopLogprobs | None]:
        if self._event is not None:
            self._event.synchronize()
        top = None
        if len(self._host) > 2:
            top = _top_dicts(self._host[2].tolist(), self._host[3].tolist(), self._ks)
        return self._host[0].tolist(), self._host[1].tolist(), top


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

    @staticmethod
    def can_defer(params: list[SamplingParams]) -> bool:
        """Whether :meth:`sample_pending` can sample these rows on the device: greedy rows, and
        sampled rows without a seed (a seeded row draws from its own host generator, step by
        step, so that its tokens repeat across runs and devices), and none whose logits depend
        on its tokens so far (penalties, ``min_tokens``, a grammar: the next step must see this
        one's)."""
        return all((p.greedy or p.seed is None) and not p.reads_history and not p.constrained
                   for p in params)

    @staticmethod
    def _filtered(logits_row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
        """One row's logits after temperature, top-k and top-p (masked to -inf), on its device
        (a seeded row's, drawn on the host; :meth:`draw` does the same for all other rows)."""
        row = logits_row / p.temperature
        if p.top_k and p.top_k > 0:
            kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            cum = torch.cumsum(probs, dim=-1)
            drop = cum - probs > p.top_p  # keep the smallest prefix whose mass reaches top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            row = torch.full_like(row, float("-inf")).scatter(0, order, sorted_logits)
        return row

    @staticmethod
    def draw(scores: torch.Tensor, params: list[SamplingParams], rows: list[int]) -> torch.Tensor:
        """Tokens for the unseeded sampled ``rows`` of ``scores [B, V]``, all at once on their
        device: temperature, top-k and top-p as :meth:`_filtered` (top-k keeps exactly k
        tokens where values tie), and a draw by the exponential race (``argmax(p / E)``,
        E ~ Exp(1): token i wins with probability p_i), as vLLM samples -- no launches per row
        and no copy to the host. Rows with a top-k work on the largest k of them only (one
        ``topk``); rows with only a top-p sort the whole vocabulary; the rest need neither."""
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
            if any(ps[j] < 1.0 for j in js):  # keep the smallest prefix whose mass reaches top_p
                probs = torch.softmax(x, dim=-1)
                top_p = torch.tensor([ps[j] if ps[j] < 1.0 else float("inf") for j in js],
                                     device=dev).unsqueeze(1)
                x = x.masked_fill(torch.cumsum(probs, dim=-1) - probs > top_p, float("-inf"))
            probs = torch.softmax(x, dim=-1)
            race = torch.empty_like(probs).exponential_().clamp_min_(1e-30)
            pick = torch.argmax(probs / race, dim=-1)
            if order is not None:
                pick = order.gather(1, pick.unsqueeze(1)).squeeze(1)
            out[torch.tensor(js, device=dev)] = pick
        return out

    def sample_pending(self, logits: torch.Tensor, params: list[SamplingParams],
                       requests: list[Request] | None = None) -> PendingTokens:
        """:meth:`sample`'s tokens and log-probabilities computed on the device without
        waiting for them (the engine's overlapped decode steps, ``engine/inflight.py``); only
        where :meth:`can_defer`. The same tokens as :meth:`sample`'s: greedy rows exactly,
        unseeded sampled rows from the same :meth:`draw` on the device's default generator
        (the same draws from the same state)."""
        logits = logits.float()
        scores = self._scores(logits, requests)
        tokens = torch.argmax(scores, dim=-1)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if any(params[i].seed is not None for i in rows) or any(p.constrained for p in params):
            raise ValueError("seeded and constrained rows are sampled on the host "
                             "(Sampler.can_defer)")
        if rows:
            tokens[torch.tensor(rows, device=tokens.device)] = self.draw(scores, params, rows)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, tokens.view(-1, 1)).view(-1)
        ks = top_k_of(params)
        return PendingTokens(tokens, chosen, _top_tensors(logprobs, ks), ks)

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], seq_ids: list[int],
               requests: list[Request] | None = None
               ) -> tuple[list[int], list[float], TopLogprobs | None]:
        """``logits [B, V]`` -> (chosen token ids, their log-probabilities, per row None or the
        ``params[i].logprobs`` most likely tokens {id: log-probability}; None when no row asks).
        ``requests`` (one per row): their penalties, bias and ``min_tokens`` apply
        (:mod:`.logits_processors`); the log-probabilities are the model's own."""
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        scores = self._scores(logits, requests)
        tokens = torch.argmax(scores, dim=-1)
        unseeded = [i for i, p in enumerate(params) if not p.greedy and p.seed is None]
        if unseeded:  # on the device, all rows at once
            tokens[torch.tensor(unseeded, device=tokens.device)] = self.draw(scores, params,
                                                                              unseeded)
        out = tokens.tolist()
        for i, p in enumerate(params):  # seeded rows: each from its own host generator
            if p.greedy or p.seed is None:
                continue
            probs = torch.softmax(self._filtered(scores[i], p), dim=-1).cpu()
            gen = self._generator(seq_ids[i], p.seed, logits.device)
            out[i] = int(torch.multinomial(probs, 1, generator=gen).item())
            tokens[i] = out[i]
        for i in self._constrained(requests):
            self.grammars.accept(requests[i].seq_id, out[i])
        chosen = logprobs.gather(1, tokens.view(-1, 1)).view(-1).tolist()
        ks = top_k_of(params)
        top = _top_tensors(logprobs, ks)
        if top is None:
            return out, chosen, None
        return out, chosen, _top_dicts(top.values.tolist(), top.indices.tolist(), ks)
