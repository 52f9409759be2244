"""Beam search (vLLM's ``LLM.beam_search`` and the server's ``use_beam_search``).

Each step extends every live beam of a prompt by one token: the beams run as ordinary requests
of one new token whose prompt is the beam's tokens so far (the prefix cache finds their full
blocks, so a step computes only each beam's last, partial block), each asking for the
``2 * beam_width`` most likely next tokens. A beam's candidates are those tokens with the beam's
cumulative log-probability plus theirs; the ``beam_width`` best candidates of all the prompt's
beams live on, and a candidate ending in EOS (unless ``ignore_eos``) is a finished hypothesis
(any such candidate, as in vLLM; transformers keeps only those among the step's ``beam_width``
best, so with EOS reachable the two can return different hypotheses).
After ``max_tokens`` steps (or when no beam is left) the ``beam_width`` best hypotheses, the
live beams included, are returned, best first, by ``cum_logprob / len ** length_penalty``.

As in transformers' beam search (and unlike vLLM's, which counts the prompt's tokens and leaves
a final EOS out), ``len`` counts the generated tokens, a final EOS included (transformers divides a
finished hypothesis by ``cur_len + 1 - prompt_len``). Log-probabilities are the model's own (those
writescope reports everywhere; vLLM V1's raw ones); ``temperature`` only changes the one token
each step samples besides the most likely ones, as under vLLM.

:class:`BeamSearch` is one prompt's search, pure data: the caller runs its
:meth:`BeamSearch.prompts` as requests and hands back each one's log-probability dict
(:meth:`BeamSearch.advance`), so the offline API (``LLM.beam_search``) and the server drive the
same search.

A step's requests cost the host little beyond the model's work, however long the prompt: each is a
:class:`BeamPrompt`, whose tokens the engine checked when the search began (only the generated
ones are checked again) and whose full blocks' prefix-cache names are its parent beam's, extended
by the block it completed (``namer``), so no step re-checks or re-hashes the whole prompt.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..core import MAX_LOGPROBS, InvalidRequestError, Logprob, SamplingParams, as_float, as_int


@dataclass
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``: ``beam_width`` hypotheses kept per prompt (each step asks
    for ``2 * beam_width`` log-probabilities, so at most ``MAX_LOGPROBS // 2``), ``max_tokens``
    steps at most."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    #: a hypothesis ended by EOS keeps the EOS token's text at the end of its ``text``
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        self.beam_width, self.max_tokens = as_int(self.beam_width), as_int(self.max_tokens)
        self.temperature = as_float(self.temperature)
        self.length_penalty = as_float(self.length_penalty)
        for name, lo, hi in (("beam_width", 1, MAX_LOGPROBS // 2), ("max_tokens", 1, None)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi and v > hi):
                rng = f"between {lo} and {hi}" if hi else f"at least {lo}"
                raise InvalidRequestError(f"{name} must be an integer {rng}, got {v!r}")
        for name in ("temperature", "length_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise InvalidRequestError(f"{name} must be a finite number, got {v!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be non-negative, got {self.temperature}")

    def step_params(self) -> SamplingParams:
        """One beam's request in one step: one token, the ``2 * beam_width`` most likely next
        tokens' log-probabilities (no text: the hypotheses' texts are decoded once, at the
        end)."""
        return SamplingParams(temperature=self.temperature, max_tokens=1, ignore_eos=True,
                              logprobs=2 * self.beam_width, detokenize=False)


@dataclass
class BeamSearchSequence:
    """A hypothesis (vLLM's): ``tokens`` are the prompt's and the generated ones, ``logprobs``
    each generated position's ``{token id: Logprob}`` (the beam's token and the alternatives the
    step saw), ``text`` the generated text (set when the search ends)."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: str | None = None
    #: "stop" (ended by EOS), "length" (``max_tokens`` or the model's context reached)
    finish_reason: str | None = None
    #: the EOS token id that ended it, unless it is the tokenizer's own EOS (vLLM's rule)
    stop_reason: int | None = None
    prompt_len: int = field(default=0, repr=False)
    #: the prefix-cache names of its full blocks so far (its parent's, extended by the engine's
    #: ``namer`` when a step asks for it), None until named
    block_names: list[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def token_ids(self) -> list[int]:
        """The generated tokens."""
        return self.tokens[self.prompt_len:]


@dataclass(frozen=True)
class BeamPrompt:
    """One live beam's prompt in one step (what :meth:`BeamSearch.prompts` hands the caller to
    run as a request): its tokens, of which the first ``checked`` were checked by the engine
    (a search the engine began, ``LLMEngine.beam_search``: the prompt; the generated tokens
    are checked again, they are few), the prefix-cache names of its full blocks (None: the
    engine names them) and the search's ``cache_salt``."""

    tokens: list[int]
    checked: int = 0
    block_names: list[bytes] | None = None
    cache_salt: str | None = None

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class BeamSearchOutput:
    """One prompt's result (vLLM's): the ``beam_width`` best hypotheses, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(seq: BeamSearchSequence, length_penalty: float) -> float:
    """``cum_logprob / len ** length_penalty``, ``len`` the generated tokens, a final EOS
    included (transformers' rule)."""
    n = max(len(seq.tokens) - seq.prompt_len, 1)
    try:
        d = n ** length_penalty
    except OverflowError:  # an extreme penalty: the float limits rank, not an error
        d = math.inf
    if d == 0:
        return math.copysign(math.inf, seq.cum_logprob) if seq.cum_logprob else 0.0
    return seq.cum_logprob / d


class BeamSearch:
    """One prompt's search: its live beams, its finished hypotheses (the ``beam_width`` best:
    a finished hypothesis's score never changes, so no other can be returned) and its step.

    ``checked``: the prompt's tokens were checked by the engine (it began the search);
    ``namer(names, tokens)``: the prefix-cache names of ``tokens``' full blocks, given those of
    a prefix of them (``InplaceKVCache.extend_prefix_names``; None: the engine names each step's
    prompts itself)."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams, eos_ids: Iterable[int],
                 max_model_len: int, model_eos_id: int | None = None,
                 cache_salt: str | None = None, checked: bool = False,
                 namer: Callable[[list[bytes] | None, list[int]], list[bytes] | None] | None
                 = None) -> None:
        self.params = params
        self.checked = len(prompt_ids) if checked else 0
        self.namer = namer
        self.eos_ids = frozenset(() if params.ignore_eos else eos_ids)
        self.model_eos_id = model_eos_id
        self.max_model_len = max_model_len
        self.cache_salt = cache_salt
        self.steps = 0
        self.completed: list[BeamSearchSequence] = []
        self.live = [BeamSearchSequence(list(prompt_ids), [], 0.0, prompt_len=len(prompt_ids))]
        self._cut_at_context()

    @property
    def done(self) -> bool:
        return not self.live or self.steps >= self.params.max_tokens

    def prompts(self) -> list[BeamPrompt]:
        """This step's request per live beam, in :attr:`live`'s order."""
        out = []
        for b in self.live:
            if self.namer is not None:  # at most the block this beam's last token completed
                b.block_names = self.namer(b.block_names, b.tokens)
            out.append(BeamPrompt(b.tokens, self.checked, b.block_names, self.cache_salt))
        return out

    def advance(self, tops: list[dict[int, Logprob]]) -> None:
        """One step: ``tops[i]`` is live beam ``i``'s next-token ``{token id: Logprob}``."""
        if len(tops) != len(self.live):
            raise ValueError(f"{len(tops)} log-probability dicts for {len(self.live)} beams")
        cands: list[tuple[float, BeamSearchSequence, dict[int, Logprob], int]] = []
        for beam, top in zip(self.live, tops):
            for tok, lp in top.items():
                if tok in self.eos_ids:
                    new = self._extend(beam, top, tok, beam.cum_logprob + lp.logprob)
                    new.finish_reason = "stop"
                    new.stop_reason = None if tok == self.model_eos_id else tok
                    self._finish(new)
                else:
                    cands.append((beam.cum_logprob + lp.logprob, beam, top, tok))
        # every live beam has as many tokens: their order by score is by cum_logprob
        # (the sort is stable: equal candidates keep the beams' and the dicts' order); only
        # the survivors' token lists are made (each a copy of the prompt and more)
        cands.sort(key=lambda c: c[0], reverse=True)
        self.live = [self._extend(beam, top, tok, cum)
                     for cum, beam, top, tok in cands[:self.params.beam_width]]
        self.steps += 1
        self._cut_at_context()

    @staticmethod
    def _extend(beam: BeamSearchSequence, top: dict[int, Logprob], tok: int,
                cum: float) -> BeamSearchSequence:
        return BeamSearchSequence(beam.tokens + [tok], beam.logprobs + [top], cum,
                                  prompt_len=beam.prompt_len, block_names=beam.block_names)

    def _cut_at_context(self) -> None:
        """Beams that fill the model's context end there ("length")."""
        full = [b for b in self.live if len(b.tokens) >= self.max_model_len]
        if full:
            self.live = [b for b in self.live if len(b.tokens) < self.max_model_len]
            for b in full:
                b.finish_reason = "length"
                self._finish(b)

    def _finish(self, seq: BeamSearchSequence) -> None:
        self.completed.append(seq)
        if len(self.completed) > 2 * self.params.beam_width:  # keep the best few
            self.completed = self._best(self.completed)

    def _best(self, seqs: list[BeamSearchSequence]) -> list[BeamSearchSequence]:
        lp = self.params.length_penalty
        return sorted(seqs, key=lambda s: beam_score(s, lp), reverse=True)[:self.params.beam_width]

    def result(self, decode: Callable[[list[int], bool], str] | None) -> BeamSearchOutput:
        """The best hypotheses, live beams included ("length"), with their texts
        (``decode(ids, skip_special_tokens)``; None: no text) and each log-probability's
        token text."""
        for b in self.live:
            b.finish_reason = "length"
        best = self._best(self.completed + self.live)
        if decode is not None:
            for s in best:
                stopped = s.finish_reason == "stop"
                s.text = decode(s.token_ids[:-1] if stopped else s.token_ids, True)
                if stopped and self.params.include_stop_str_in_output:
                    s.text += decode(s.token_ids[-1:], False)
                for top in s.logprobs:
                    for tok, lp in top.items():
                        if lp.decoded_token is None:
                            lp.decoded_token = decode([tok], False)
        return BeamSearchOutput(best)
