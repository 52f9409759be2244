"""The offline Python API, shaped like vLLM's: ``LLM(model).generate(prompts, SamplingParams(...))``."""
from __future__ import annotations

import itertools
import os

import torch
from tqdm.auto import tqdm

from .core import RequestOutput, SamplingParams
from .engine.engine import LLMEngine


class LLM:
    """Load a model (a checkpoint folder, a reference name with ``random_weights=True``, or the
    embedded default model when ``model`` is None) and generate from batches of prompts."""

    def __init__(self, model: str | os.PathLike | None = None, dtype: str | torch.dtype = "bfloat16",
                 device: str | torch.device | None = None, random_weights: bool = False,
                 seed: int = 0, **engine_options):
        self.engine = LLMEngine(model, dtype=dtype, device=device, random_weights=random_weights,
                                seed=seed, **engine_options)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | list[str] | list[int] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """One :class:`RequestOutput` per prompt, in prompt order. Prompts are strings or lists of
        token ids (a flat list of ints is one prompt)."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        ids = []
        for p, sp in zip(prompts, params):
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, p, sp)
            ids.append(rid)
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm)
        with bar:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
                        bar.set_postfix(tok_s=f"{self.engine.stats()['engine.tokens_per_s']:.1f}")
        return [results[r] for r in ids]

    def stats(self) -> dict:
        """Counters of the KV cache, the planner and the engine (see docs/ARCHITECTURE.md)."""
        return self.engine.stats()
