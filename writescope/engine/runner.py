"""Runs a scheduled step: inputs, the forward pass over the KV cache, logits, sampling."""
from __future__ import annotations

import torch

from ..core import StepBatch
from ..kvcache.cache import InplaceKVCache
from ..layers.sampler import Sampler
from ..models.base import CausalLM


class ModelRunner:
    def __init__(self, model: CausalLM, cache: InplaceKVCache, device: torch.device):
        self.model = model
        self.cache = cache
        self.device = device
        self.sampler = Sampler()

    @torch.no_grad()  # not inference_mode: the CPU worker thread writes pinned buffers
    def run(self, batch: StepBatch) -> tuple[list[int], list[float]]:
        """One step; returns the sampled token and its log-probability for each sequence with
        ``sample=True``, in batch order."""
        ids, pos, last_rows = [], [], []
        row = 0
        for s in batch.seqs:
            toks = s.request.token_ids_at(s.start, s.num_new)
            ids.extend(toks)
            pos.extend(range(s.start, s.start + s.num_new))
            row += s.num_new
            if s.sample:
                last_rows.append(row - 1)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        positions = torch.tensor(pos, dtype=torch.long, device=self.device)
        self.cache.begin_step([(s.request.seq_id, s.start, s.num_new) for s in batch.seqs])
        try:
            hidden = self.model(input_ids, positions, self.cache)
            sampled = [s for s in batch.seqs if s.sample]
            if not sampled:
                self.cache.end_step()
                return [], []
            logits = self.model.compute_logits(hidden[torch.tensor(last_rows, device=self.device)])
            self.cache.end_step()
        except BaseException:
            self.cache.abort_step()
            raise
        return self.sampler.sample(logits, [s.request.params for s in sampled],
                                   [s.request.seq_id for s in sampled])
