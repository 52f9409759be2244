"""Prompt log-probabilities (``SamplingParams.prompt_logprobs``, vLLM's name): for each prompt
token after the first, its log-probability given the tokens before it and its rank among the
vocabulary (1: the most likely), and for k >= 1 the k most likely tokens at that position --
what ``echo`` with ``logprobs`` returns on the completions endpoint (lm-evaluation-harness's
loglikelihood requests).

A prefill chunk's hidden rows ``[start, start + n)`` predict prompt tokens ``start + 1 ..``;
each chunk's rows go through the LM head a few rows at a time (at most ``BLOCK_BYTES`` of
float32 logits at once), so a long prompt needs no logits buffer of its own length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import StepBatch
from ..layers.sampler import _top_dicts

#: the float32 logits of one pass through the LM head, at most (rows per pass = this / vocab)
BLOCK_BYTES = 64 * 2 ** 20


@dataclass
class PromptLogprobs:
    """One sequence's share of a step: prompt positions ``first, first + 1, ...``."""

    first: int                                # index into the prompt of the first value
    logprobs: list[float]                     # each prompt token's log-probability
    ranks: list[int]                          # 1 + the number of tokens likelier than it
    top: list[dict[int, float]] | None        # the k most likely tokens there (k >= 1)


@torch.no_grad()
def compute(model, hidden: torch.Tensor, batch: StepBatch) -> dict[int, PromptLogprobs]:
    """{seq id: the prompt log-probabilities of this step's rows} for the sequences whose
    requests ask for them. ``hidden``: the step's final hidden rows, in batch order."""
    out: dict[int, PromptLogprobs] = {}
    row = 0
    for s in batch.seqs:
        r0, row = row, row + s.num_new
        k = s.request.params.prompt_logprobs
        if k is None:
            continue
        prompt = s.request.prompt_token_ids
        # rows with a prompt target whose value the request lacks (a recompute after a
        # preemption has those it computed before)
        j0 = max(s.start, len(s.request.prompt_logprobs) - 1)
        j1 = min(s.start + s.num_new, len(prompt) - 1)
        if j1 <= j0:
            continue
        lps: list[float] = []
        ranks: list[int] = []
        tops: list[dict[int, float]] = []
        step = max(1, BLOCK_BYTES // (4 * model.cfg.vocab_size))
        a = j0
        while a < j1:
            b = min(a + step, j1)
            logits = model.compute_logits(hidden[r0 + a - s.start:r0 + b - s.start]).float()
            lp = torch.log_softmax(logits, dim=-1)
            target = torch.tensor(prompt[a + 1:b + 1], device=lp.device).view(-1, 1)
            own = lp.gather(1, target)
            lps.extend(own.view(-1).tolist())
            ranks.extend(((lp > own).sum(-1) + 1).tolist())
            if k > 0:
                v, i = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)
                tops.extend(_top_dicts(v.tolist(), i.tolist(), [k] * (b - a)))
            a = b
        out[s.request.seq_id] = PromptLogprobs(j0 + 1, lps, ranks, tops if k > 0 else None)
    return out
