"""The offline Python API, shaped like vLLM's: ``LLM(model).generate(prompts, SamplingParams(...))``."""
from __future__ import annotations

import dataclasses
import itertools
import os
import time
from typing import Callable

import torch
from tqdm.auto import tqdm

from .core import RequestOutput, RequestOutputKind, SamplingParams
from .engine.beam import BeamSearchOutput, BeamSearchParams
from .engine.engine import LLMEngine


class LLM:
    """Load a model (a checkpoint folder, a reference name with ``random_weights=True``, or the
    embedded default model when ``model`` is None) and generate from batches of prompts."""

    def __init__(self, model: str | os.PathLike | None = None, dtype: str | torch.dtype = "bfloat16",
                 device: str | torch.device | None = None, random_weights: bool = False,
                 seed: int = 0, trust_remote_code: bool = False,
                 tensor_parallel_size: int = 1, **engine_options):
        # vLLM's: writescope runs its architectures natively and never imports a checkpoint's
        # code, so trust_remote_code changes nothing; it runs on one GPU
        if tensor_parallel_size != 1:
            raise ValueError(f"writescope runs on one GPU: tensor_parallel_size must be 1, got "
                             f"{tensor_parallel_size!r}")
        self.engine = LLMEngine(model, dtype=dtype, device=device, random_weights=random_weights,
                                seed=seed, **engine_options)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def llm_engine(self) -> LLMEngine:
        """The engine (vLLM's ``LLM.llm_engine``)."""
        return self.engine

    def get_tokenizer(self):
        """The model's Hugging Face tokenizer (vLLM's ``LLM.get_tokenizer``: ``encode``,
        ``decode``, ``apply_chat_template(..., tokenize=False)``); None for a model without
        one. ``llm.tokenizer`` is writescope's wrapper of it."""
        return None if self.engine.tokenizer is None else self.engine.tokenizer.hf

    def get_default_sampling_params(self) -> SamplingParams:
        """The sampling parameters a request gets when it gives none: the model's
        ``generation_config.json`` defaults (temperature, top_p, top_k, min_p,
        repetition_penalty, max_new_tokens), as vLLM's (``LLM(..., generation_config="vllm")``
        for plain SamplingParams())."""
        return self.engine.default_sampling_params()

    def generate(self, prompts: str | dict | list[str] | list[int] | list[list[int]] | list[dict],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool | Callable[..., tqdm] = True,
                 priority: list[int] | None = None) -> list[RequestOutput]:
        """One :class:`RequestOutput` per prompt, in prompt order. ``use_tqdm``: a progress bar
        over the prompts, with the decode rate (vLLM's default: on; or the tqdm class to draw it
        with). Prompts are strings, lists of
        token ids (a flat list of ints is one prompt) or vLLM's prompt dicts
        (``{"prompt": text}``, ``{"prompt_token_ids": ids}``, with a ``"cache_salt"`` to share
        cached prompt blocks only with prompts of the same salt). ``priority`` (vLLM's): one
        integer per prompt, with ``LLM(..., scheduling_policy="priority")``: the prompts are
        admitted lower value first, ties in prompt order, and one that does not fit preempts
        running requests of higher values (recomputed later: their outputs are those they would
        have had; engine/scheduler.py); under "fcfs" only zeros are accepted."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if not isinstance(params, (list, tuple)) or not all(
                isinstance(sp, SamplingParams) for sp in params):
            raise TypeError("sampling_params must be a SamplingParams or a list of them, got "
                            f"{type(sampling_params).__name__}")
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        if priority is None:
            priority = [0] * len(prompts)
        elif not isinstance(priority, (list, tuple)):
            raise TypeError(f"priority must be a list of integers, one per prompt, got "
                            f"{type(priority).__name__}")
        elif len(priority) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(priority)} priorities")
        priority = [self.engine.check_priority(v) for v in priority]  # all before any is queued
        rids: list[str] = []  # per prompt, its engine request (n completions: engine/parallel.py)
        try:
            for p, sp, prio in zip(prompts, params, priority):
                if sp.output_kind is not RequestOutputKind.CUMULATIVE:  # whole outputs here
                    sp = dataclasses.replace(sp, output_kind=RequestOutputKind.CUMULATIVE)
                rids.append(f"gen-{next(self._ids)}")
                self.engine.add_request(rids[-1], p, sp, priority=prio)
        except BaseException:  # a bad prompt: none of this call's requests stay queued
            self.engine.abort_request(rids)
            raise
        results: dict[str, RequestOutput] = {}
        bar = (use_tqdm if callable(use_tqdm) else tqdm)(
            total=len(rids), desc="generating", unit="req", disable=not use_tqdm)
        shown = time.monotonic()
        try:
            with bar:
                while self.engine.has_unfinished_requests():
                    done = 0
                    for out in self.engine.step():
                        if out.finished:
                            results[out.request_id] = out
                            done += 1
                    # the rate every half second (a long single request shows it going), and
                    # each time requests finish
                    if use_tqdm and (done or time.monotonic() - shown > 0.5):
                        bar.set_postfix(tok_s=f"{self.engine.stats()['engine.tokens_per_s']:.1f}",
                                        refresh=False)
                        if done:
                            bar.update(done)
                        else:
                            bar.refresh()
                        shown = time.monotonic()
        except BaseException:
            # interrupted (Ctrl-C) or a failed step: this call's requests end here, so that the
            # next call neither runs them to no one nor starts from the failed step's state
            self.engine.abort_request([r for r in rids if r not in results])
            raise
        return [results[r] for r in rids]

    def beam_search(self,
                    prompts: str | dict | list[str] | list[int] | list[list[int]] | list[dict],
                    params: BeamSearchParams, use_tqdm: bool | Callable[..., tqdm] = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: one :class:`BeamSearchOutput` per prompt, in prompt
        order, its ``sequences`` the ``params.beam_width`` best hypotheses, best first
        (engine/beam.py says how they are found and scored). Each step runs every live beam of
        every prompt as one batch of one-token requests, whose prompts' full blocks the prefix
        cache holds. ``concurrency_limit``: at most this many prompts searched at once;
        ``use_tqdm``: a progress bar over the steps."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        if concurrency_limit is not None and (not isinstance(concurrency_limit, int)
                                              or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit must be a positive integer, got "
                             f"{concurrency_limit!r}")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]
        searches = [self.engine.beam_search(p, params) for p in prompts]
        limit = concurrency_limit or max(1, len(searches))
        groups = [searches[i:i + limit] for i in range(0, len(searches), limit)]
        one_token = params.step_params()
        bar = (use_tqdm if callable(use_tqdm) else tqdm)(
            total=params.max_tokens * len(groups), desc="beam search", unit="step",
            disable=not use_tqdm)
        with bar:
            for group in groups:
                for step in range(params.max_tokens):
                    live = [s for s in group if not s.done]
                    if not live:  # every beam ended (EOS, the context): the group is done
                        bar.update(params.max_tokens - step)
                        break
                    outs = self.generate([p for s in live for p in s.prompts()], one_token,
                                         use_tqdm=False)
                    at = 0
                    for s in live:
                        k = len(s.live)
                        s.advance([o.outputs[0].logprobs[0] for o in outs[at:at + k]])
                        at += k
                    bar.update(1)
        tok = self.tokenizer
        decode = None if tok is None else (
            lambda ids, skip: tok.decode(ids, skip_special_tokens=skip))
        return [s.result(decode) for s in searches]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool | Callable[..., tqdm] = True, add_generation_prompt: bool = True,
             tools: list[dict] | None = None, continue_final_message: bool = False,
             chat_template_kwargs: dict | None = None,
             chat_template: str | None = None) -> list[RequestOutput]:
        """:meth:`generate` on one conversation (a list of ``{"role", "content"}`` messages) or
        several, each rendered with the model's chat template (vLLM's ``LLM.chat``); ``tools``
        (OpenAI's function definitions) go to templates that render them;
        ``continue_final_message`` leaves the last message open for the output to continue
        (with ``add_generation_prompt=False``); ``chat_template_kwargs`` are variables the
        template reads (Qwen3's ``enable_thinking``); ``chat_template`` (Jinja text) replaces the
        model's template."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        from .models.tokenizer import RESERVED_TEMPLATE_KWARGS
        bad = sorted(set(chat_template_kwargs or {}) & RESERVED_TEMPLATE_KWARGS)
        if bad:  # (chat_template, add_generation_prompt, ...: LLM.chat's own arguments)
            raise ValueError(f"chat template variables cannot be named {', '.join(bad)}")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        texts = [self.tokenizer.render_chat(
            c, add_generation_prompt=add_generation_prompt, tools=tools,
            continue_final_message=continue_final_message, chat_template=chat_template,
            **(chat_template_kwargs or {}))
            for c in convs]
        # the rendered text carries any BOS the template wants: encoded without adding one
        prompts = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        outs = self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
        for o, t in zip(outs, texts):
            o.prompt = t  # the rendered conversation, as vLLM's LLM.chat gives it
        return outs

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt block (vLLM's ``LLM.reset_prefix_cache``); True when done
        (between ``generate`` calls it always is)."""
        return self.engine.reset_prefix_cache()

    def stats(self) -> dict:
        """Counters of the KV cache, the planner and the engine (see docs/ARCHITECTURE.md)."""
        return self.engine.stats()
