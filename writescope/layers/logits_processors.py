"""What changes a row's logits before it is sampled: ``allowed_token_ids``, ``logit_bias``,
``bad_words``, ``min_tokens`` and the repetition, frequency and presence penalties
(``SamplingParams``; vLLM's and OpenAI's meanings), in vLLM's order: the allowed ids, the bias,
then the penalties (a biased token already seen gets ``(logit + bias) / penalty``, as vLLM's
sampler and transformers' ``SequenceBiasLogitsProcessor`` before its repetition penalty give),
then the masks.

The sampler picks tokens from the processed logits; log-probabilities stay those of the model's
own distribution (vLLM's default ``raw_logprobs``). Rows that ask for none of these are not
touched, and a batch with no such row costs nothing here.
"""
from __future__ import annotations

import torch

from ..core import Request


class LogitsProcessors:
    """Per-sequence state of the processors (on the device: the prompt's distinct tokens, for
    the repetition penalty; the allowed token ids) and :meth:`apply`."""

    def __init__(self):
        self._prompt_ids: dict[int, torch.Tensor] = {}
        self._allowed_ids: dict[int, torch.Tensor] = {}
        #: token ids that end a request (the engine's EOS ids); ``min_tokens`` holds them back
        self.eos_ids: set[int] = set()

    def forget(self, seq_id: int) -> None:
        self._prompt_ids.pop(seq_id, None)
        self._allowed_ids.pop(seq_id, None)

    def _prompt(self, req: Request, device: torch.device) -> torch.Tensor:
        t = self._prompt_ids.get(req.seq_id)
        if t is None:
            t = torch.unique(torch.tensor(req.prompt_token_ids, dtype=torch.long)).to(device)
            self._prompt_ids[req.seq_id] = t
        return t

    def apply(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """``logits [B, V]`` (one row per request, float32) processed for the rows that ask:
        a new tensor, or ``logits`` itself when no row does."""
        rows = [i for i, r in enumerate(requests) if r.params.changes_logits]
        if not rows:
            return logits
        out = logits.clone()
        vocab = out.shape[-1]
        dev = out.device
        for i in rows:
            req, row = requests[i], out[i]
            p = req.params
            generated = req.output_token_ids
            if p.allowed_token_ids is not None:  # every other token masked (vLLM's)
                keep = self._allowed_ids.get(req.seq_id)
                if keep is None:  # copied to the device once a sequence
                    keep = self._allowed_ids[req.seq_id] = torch.tensor(
                        [t for t in p.allowed_token_ids if t < vocab], dtype=torch.long).to(dev)
                kept = row[keep]
                row.fill_(float("-inf"))
                row[keep] = kept
            # the bias before the penalties, as vLLM's sampler and transformers' processors
            if p.logit_bias:
                ids = [t for t in p.logit_bias if t < vocab]
                if ids:
                    row[torch.tensor(ids, device=dev)] += torch.tensor(
                        [float(p.logit_bias[t]) for t in ids], device=dev, dtype=row.dtype)
            if p.repetition_penalty != 1.0:
                seen = self._prompt(req, dev)
                if generated:
                    seen = torch.unique(torch.cat([seen, torch.tensor(generated, device=dev)]))
                v = row[seen]
                row[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
            if (p.frequency_penalty or p.presence_penalty) and generated:
                counts = torch.bincount(torch.tensor(generated, device=dev), minlength=vocab)
                counts = counts[:vocab].to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
            if req.bad_words_ids:  # a word's last token, where the output ends with the rest
                n = len(generated)
                banned = [w[-1] for w in req.bad_words_ids if w[-1] < vocab and (
                    len(w) == 1 or (n >= len(w) - 1 and generated[n - len(w) + 1:] == w[:-1]))]
                if banned:
                    row[torch.tensor(banned, device=dev)] = float("-inf")
            if p.min_tokens and len(generated) < p.min_tokens:
                ends = [t for t in (set(p.stop_token_ids) | (set() if p.ignore_eos
                                                             else self.eos_ids)) if t < vocab]
                if ends:
                    row[torch.tensor(ends, device=dev)] = float("-inf")
        return out
