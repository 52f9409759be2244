"""Typed data passed between the API, the scheduler, the runner and the server.

Nothing here touches tensors: these are the pure-data records of a request's life.
"""
from __future__ import annotations

import enum
import itertools
import math
import operator
import warnings
from dataclasses import dataclass, field
from typing import Callable


class InvalidRequestError(ValueError):
    """A request's parameters are malformed or out of range (maps to HTTP 400)."""


class RequestTooLargeError(InvalidRequestError):
    """A request can never fit the model's context or the KV budgets (refused before any write)."""


#: the most alternatives ``SamplingParams.logprobs`` may ask for per step (vLLM's default
#: ``max_logprobs``)
MAX_LOGPROBS = 20

#: the seeds ``torch.Generator.manual_seed`` accepts
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)

#: a temperature below this samples greedily (vLLM's ``_SAMPLING_EPS``): dividing the logits by
#: a smaller one overflows them to infinities, whose softmax is NaN
SAMPLING_EPS = 1e-5


@dataclass
class StructuredOutputsParams:
    """A constraint on the generated text (vLLM's ``StructuredOutputsParams``, formerly
    ``GuidedDecodingParams``): exactly one of a JSON schema (``json``: a dict or its JSON text),
    any JSON object (``json_object``), a regular expression (``regex``, Rust ``regex`` syntax),
    one of several strings (``choice``) or a context-free grammar (``grammar``: Lark or
    llama.cpp's GBNF). The engine masks every token that cannot continue a text matching it
    (layers/grammar.py) and ends the request once the text is complete."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    #: the whitespace a JSON value may hold between its tokens, as a regex (None: none, the
    #: compact form ``{"a":1,"b":[2,3]}``)
    whitespace_pattern: str | None = None
    #: the constraint holds from the token after the output's text first contains this string
    #: (a reasoning model's end of thinking, ``"</think>"``: the model thinks freely, then
    #: answers in the format); None: from the first token
    starts_after: str | None = None
    #: vLLM's: False, any whitespace between a JSON value's tokens (vLLM's default); True, and
    #: None (writescope's default: a small model may write whitespace forever), the compact form
    disable_any_whitespace: bool | None = None
    #: vLLM's: each object of the JSON schema that does not say otherwise
    #: (``additionalProperties``) takes no properties but those it names
    disable_additional_properties: bool = False
    #: vLLM's (no other backend to fall back to here): accepted, no effect
    disable_fallback: bool = False

    def __post_init__(self) -> None:
        if self.choice is not None:
            self.choice = list(self.choice)
        self.validate()

    def validate(self) -> None:
        kinds = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) != 1:
            raise InvalidRequestError(
                "structured outputs need exactly one of json, json_object, regex, choice, "
                f"grammar (got {', '.join(kinds) or 'none'})")
        for name in ("disable_any_whitespace", "disable_additional_properties",
                     "disable_fallback"):
            v = getattr(self, name)
            if not isinstance(v, bool) and not (v is None and name == "disable_any_whitespace"):
                raise InvalidRequestError(f"structured outputs: {name} must be true or false")
        if self.disable_any_whitespace is False and self.whitespace_pattern is not None:
            raise InvalidRequestError("structured outputs: give whitespace_pattern or "
                                      "disable_any_whitespace=False, not both")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise InvalidRequestError("structured outputs: json must be a JSON schema (an object "
                                      "or its JSON text)")
        for name in ("regex", "grammar", "whitespace_pattern", "starts_after"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise InvalidRequestError(f"structured outputs: {name} must be a non-empty string")
        if self.choice is not None and (not self.choice or any(
                not isinstance(c, str) or not c for c in self.choice)):
            raise InvalidRequestError("structured outputs: choice must be a non-empty list of "
                                      "non-empty strings")

    @property
    def kind(self) -> str:
        for k in ("json", "regex", "choice", "grammar"):
            if getattr(self, k) is not None:
                return k
        return "json_object"


#: vLLM's former name
GuidedDecodingParams = StructuredOutputsParams


class RequestOutputKind(enum.IntEnum):
    """What ``LLMEngine.step`` returns of a request (vLLM's): everything so far each step
    (CUMULATIVE), only what is new since the last output (DELTA), or one output once it ends
    (FINAL_ONLY). ``LLM.generate`` returns whole outputs whichever is asked for."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


#: SamplingParams' integer fields (numpy and torch integers are taken as ints)
_INT_PARAMS = ("top_k", "max_tokens", "seed", "n", "best_of", "logprobs", "prompt_logprobs",
               "min_tokens", "truncate_prompt_tokens")


#: SamplingParams' real-valued fields (numpy and torch scalars are taken as floats)
_FLOAT_PARAMS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")


def _scalar(v) -> bool:
    """Whether ``v`` is a numpy or torch scalar that is not a bool (a 0-dim array or tensor,
    or numpy's scalar types; not a one-element array, not a bool of any kind)."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return False
    return getattr(v, "ndim", 0) == 0 and "bool" not in str(getattr(v, "dtype", ""))


def as_int(v):
    """An integer scalar of numpy or torch as an int; anything else as it is, for validation
    to refuse."""
    if not _scalar(v) or not hasattr(type(v), "__index__"):
        return v
    try:
        return operator.index(v)
    except TypeError:  # (a float tensor has __index__, and refuses)
        return v


def as_float(v):
    """A real scalar of numpy or torch (not a bool) as a float; anything else as it is."""
    if not _scalar(v):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def cache_salt_of(p) -> str | None:
    """A prompt dict's ``cache_salt`` (vLLM's: a non-empty string), else None."""
    salt = p.get("cache_salt") if isinstance(p, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}")
    return salt


def prompt_of(p):
    """A prompt as the engine takes it: vLLM's ``TextPrompt`` / ``TokensPrompt`` dicts become
    their text or token ids (their ``cache_salt``: :func:`cache_salt_of`); strings and id
    lists stay."""
    if not isinstance(p, dict):
        return p
    if "prompt_token_ids" in p:
        return list(p["prompt_token_ids"])
    if "prompt" in p:
        return p["prompt"]
    raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(p)}")


@dataclass
class SamplingParams:
    """Sampling options, named and defaulted as in vLLM."""

    temperature: float = 1.0  # below SAMPLING_EPS (0 included): greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    #: tokens less likely than min_p times the most likely one are not sampled (0: off)
    min_p: float = 0.0
    max_tokens: int | None = 16
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    #: completions per prompt (``LLM.generate``: ``RequestOutput.outputs``; seeded rows draw
    #: with seeds ``seed, seed + 1, ...``); the engine itself runs one per request
    n: int = 1
    #: completions sampled per prompt, of which the ``n`` with the highest cumulative
    #: log-probability are returned (vLLM 0.6's; ``LLM.generate``); None: ``n``. Ranked by
    #: the model's own log-probabilities (those writescope reports, vLLM V1's raw ones; vLLM
    #: 0.6 ranked by those after temperature and the filters)
    best_of: int | None = None
    #: None: no log-probabilities; 0: the sampled token's log-probability per step
    #: (``RequestOutput.logprobs``); k >= 1: also the k most likely tokens' per step
    #: (``RequestOutput.top_logprobs``), at most :data:`MAX_LOGPROBS`
    logprobs: int | None = None
    #: None: none; 0: each prompt token's log-probability given the tokens before it
    #: (``RequestOutput.prompt_logprobs``, vLLM's, or ``prompt_token_logprobs``, floats; None
    #: for the first) and its rank
    #: (``RequestOutput.prompt_ranks``, 1: the most likely); k >= 1: also the k most likely
    #: tokens' at each prompt position (``RequestOutput.prompt_top_logprobs``)
    prompt_logprobs: int | None = None
    #: penalties on the logits before sampling (vLLM's, OpenAI's ranges): ``presence_penalty``
    #: is subtracted from every token generated so far, ``frequency_penalty`` once per time it
    #: was generated; ``repetition_penalty`` (transformers' / CTRL's) divides the positive
    #: logits and multiplies the negative ones of every token in the prompt or the output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    #: EOS and ``stop_token_ids`` cannot end the output before this many tokens, nor a stop
    #: string within them (vLLM's: it counts from the next token on)
    min_tokens: int = 0
    #: {token id: value added to its logit} (OpenAI: -100 to 100)
    logit_bias: dict[int, float] | None = None
    #: the text must match a JSON schema, a regex, a choice or a grammar
    #: (:class:`StructuredOutputsParams`; needs the model's tokenizer)
    structured_outputs: StructuredOutputsParams | None = None
    #: the stop string that ended the output stays at the end of its text (vLLM's)
    include_stop_str_in_output: bool = False
    #: special tokens (EOS, chat markers) are left out of the text (vLLM's default)
    skip_special_tokens: bool = True
    #: vLLM's; it changes only a slow tokenizer's text, and writescope's are fast (tokenizers):
    #: accepted and checked, no effect, as under vLLM with a fast tokenizer
    spaces_between_special_tokens: bool = True
    #: only these token ids can be sampled (vLLM's; every other token's logit is -inf)
    allowed_token_ids: list[int] | None = None
    #: words the output may not contain (vLLM's): the last token of each word's tokens
    #: (as a word of its own and after a space) is masked where the output ends with the rest
    bad_words: list[str] | None = None
    #: keep only the prompt's last k tokens (vLLM's; -1: as many as the model's context takes,
    #: leaving room for one new token)
    truncate_prompt_tokens: int | None = None
    #: False: no output text (vLLM's; ``text`` is "", ``token_ids`` as always); stop strings
    #: need the text, and are refused
    detokenize: bool = True
    #: what ``LLMEngine.step`` returns of the request (:class:`RequestOutputKind`, vLLM's)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    #: vLLM's former name of ``structured_outputs`` (deprecated there, as here): taken as
    #: ``structured_outputs``, with a DeprecationWarning, and then None
    guided_decoding: StructuredOutputsParams | None = field(default=None, repr=False)
    #: vLLM's per-request logits processors (Python callables): refused unless None or empty,
    #: as vLLM V1 refuses them (and this server's ``logits_processors``)
    logits_processors: list | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.guided_decoding is not None:
            warnings.warn("SamplingParams(guided_decoding=...) is deprecated (as in vLLM): use "
                          "structured_outputs", DeprecationWarning, stacklevel=3)
            if not isinstance(self.guided_decoding, StructuredOutputsParams):
                raise InvalidRequestError("guided_decoding must be a StructuredOutputsParams "
                                          "(GuidedDecodingParams)")
            if self.structured_outputs not in (None, self.guided_decoding):
                raise InvalidRequestError("guided_decoding and structured_outputs are two "
                                          "names of one option: give one of them")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        # numpy / torch scalars as Python ints and floats (a bool stays, and is refused below)
        for name in _INT_PARAMS:
            setattr(self, name, as_int(getattr(self, name)))
        for name in _FLOAT_PARAMS:
            setattr(self, name, as_float(getattr(self, name)))
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("stop", "stop_token_ids"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (list, tuple)):
                what = "strings" if name == "stop" else "token ids"
                raise InvalidRequestError(f"{name} must be a list of {what}, got {v!r}")
        self.stop = list(self.stop or [])
        self.stop_token_ids = [as_int(t) for t in self.stop_token_ids or []]
        if isinstance(self.logit_bias, dict):
            self.logit_bias = {as_int(t): as_float(b) for t, b in self.logit_bias.items()} or None
        if isinstance(self.allowed_token_ids, (list, tuple)):
            self.allowed_token_ids = [as_int(t) for t in self.allowed_token_ids]
        if isinstance(self.bad_words, (list, tuple)):
            self.bad_words = list(self.bad_words) or None
        self.validate()

    def validate(self) -> None:
        def bad(msg: str) -> InvalidRequestError:
            return InvalidRequestError(msg)
        for name in _FLOAT_PARAMS:
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise bad(f"{name} must be a finite number, got {v!r}")
        if self.temperature < 0:
            raise bad(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise bad(f"min_p must be in [0, 1], got {self.min_p}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise bad(f"top_k must be -1 (off) or a positive integer, got {self.top_k!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int)
                                            or isinstance(self.max_tokens, bool)
                                            or self.max_tokens < 1):
            raise bad(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= 128:
            raise bad(f"n must be an integer from 1 to 128, got {self.n!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            raise bad(f"seed must be an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]}, "
                      f"got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                                  or not 0 <= v <= MAX_LOGPROBS):
                raise bad(f"{name} must be an integer from 0 to {MAX_LOGPROBS}, got {v!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise bad(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 10:
            raise bad(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) \
                or self.min_tokens < 0 or (self.max_tokens is not None
                                           and self.min_tokens > self.max_tokens):
            raise bad(f"min_tokens must be an integer from 0 to max_tokens, "
                      f"got {self.min_tokens!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or any(
                    not isinstance(t, int) or isinstance(t, bool) or t < 0
                    or not isinstance(v, (int, float)) or isinstance(v, bool)
                    or not -100 <= v <= 100 for t, v in self.logit_bias.items()):
                raise bad("logit_bias must map token ids (non-negative integers) to numbers "
                          "from -100 to 100")
        if self.logits_processors:
            raise bad("logits_processors (per-request Python callables) are not supported: "
                      "use allowed_token_ids, logit_bias, bad_words or structured_outputs")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise bad("structured_outputs must be a StructuredOutputsParams")
            self.structured_outputs.validate()
        if self.allowed_token_ids is not None and (
                not isinstance(self.allowed_token_ids, list) or not self.allowed_token_ids
                or any(not isinstance(t, int) or isinstance(t, bool) or t < 0
                       for t in self.allowed_token_ids)):
            raise bad("allowed_token_ids must be a non-empty list of token ids (non-negative "
                      "integers)")
        if self.bad_words is not None and (not isinstance(self.bad_words, list) or any(
                not isinstance(w, str) or not w.strip() for w in self.bad_words)):
            raise bad("bad_words must be a list of non-empty strings")
        t = self.truncate_prompt_tokens
        if t is not None and (not isinstance(t, int) or isinstance(t, bool)
                              or (t < 1 and t != -1)):
            raise bad(f"truncate_prompt_tokens must be -1 or a positive integer, got {t!r}")
        for name in ("include_stop_str_in_output", "skip_special_tokens",
                     "spaces_between_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise bad(f"{name} must be true or false")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise bad(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        b = self.best_of
        if b is not None and (not isinstance(b, int) or isinstance(b, bool)
                              or not self.n <= b <= 128):
            raise bad(f"best_of must be an integer from n ({self.n}) to 128, got {b!r}")
        self._reads_history = bool(self.presence_penalty or self.frequency_penalty
                                   or self.repetition_penalty != 1.0 or self.min_tokens
                                   or self.bad_words)
        self._changes_logits = (self._reads_history or bool(self.logit_bias)
                                or self.allowed_token_ids is not None)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop must be a list of non-empty strings")
        if self.stop and not self.detokenize:
            raise bad("stop strings need the output text: they cannot be used with "
                      "detokenize=False")
        #: characters an unfinished output's text keeps back: a stop string may be starting
        #: there, and is cut off when it completes (vLLM's ``stop_buffer_length``), so that
        #: every text an unfinished output shows is a prefix of the final one
        self._stop_holdback = (max(len(s) for s in self.stop) - 1
                               if self.stop and not self.include_stop_str_in_output else 0)
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0
               for t in self.stop_token_ids):
            raise bad("stop_token_ids must be non-negative integers")

    def clone(self) -> "SamplingParams":
        """A deep copy (vLLM's ``SamplingParams.clone``)."""
        import copy
        return copy.deepcopy(self)

    @property
    def greedy(self) -> bool:
        """Whether the row takes the argmax: temperature below :data:`SAMPLING_EPS`, or
        ``top_k`` 1."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def reads_history(self) -> bool:
        """Whether the logits are changed by the tokens so far (penalties, ``min_tokens``):
        such a row needs its last token on the host before its next step is sampled. Set by
        :meth:`validate` (the engine validates each request's parameters on admission), so
        that a decode step's sampler reads one attribute per row."""
        return self._reads_history

    @property
    def changes_logits(self) -> bool:
        return self._changes_logits

    @property
    def stop_holdback(self) -> int:
        return self._stop_holdback

    @property
    def constrained(self) -> bool:
        """Whether a grammar masks this row's tokens (``structured_outputs``)."""
        return self.structured_outputs is not None


class FinishReason(str, enum.Enum):
    STOP = "stop"      # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"    # cancelled by the client

    def __str__(self) -> str:
        return self.value


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    #: taken out of the running batch for a request of higher priority (vLLM's; its KV
    #: released): waiting again, to prefill its prompt and outputs anew (``engine/scheduler.py``)
    PREEMPTED = "preempted"
    FINISHED = "finished"


_req_counter = itertools.count()


def kv_tokens(prompt_tokens: int, max_tokens: int) -> int:
    """:attr:`Request.kv_tokens` of a prompt and its output limit."""
    return prompt_tokens + max_tokens - 1


@dataclass(eq=False)
class Request:
    """One generation request as the scheduler and runner see it."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    arrival: float = 0.0  # time.monotonic() when added
    #: vLLM's ``cache_salt`` (a prompt dict's): its prompt blocks are shared in the prefix
    #: cache only with prompts of the same salt
    cache_salt: str | None = None
    #: vLLM's request priority (``scheduling_policy="priority"``: lower is admitted first, ties
    #: by arrival, and preempts higher values that run); 0 under "fcfs"
    priority: int = 0
    #: seconds from ``arrival`` to its first admission into the running batch (None: still
    #: waiting; a preempted request's readmission does not change it)
    queue_time_s: float | None = None
    seq_id: int = field(default_factory=lambda: next(_req_counter))
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: per step, the sampled token's rank in the vocabulary (1: the most likely; None where the
    #: step's batch asked for no log-probabilities)
    ranks: list[int | None] = field(default_factory=list)
    #: per step, the ``params.logprobs`` most likely tokens: {token id: log-probability}, most
    #: likely first (empty unless ``params.logprobs`` >= 1)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    #: per prompt token, its log-probability given the tokens before it (None for the first;
    #: filled as prefill chunks run) and the ``params.prompt_logprobs`` most likely tokens there
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    prompt_ranks: list[int | None] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    #: what stopped it (vLLM's): the stop string, or the ``stop_token_ids`` token; None for
    #: EOS, a length limit, a grammar's end or an abort
    stop_reason: int | str | None = None
    num_computed: int = 0  # tokens whose KV is in the cache
    #: prompt tokens found in the prefix cache at its first admission (not computed by this
    #: request; vLLM's: a recompute after a preemption does not change it)
    num_cached_tokens: int = 0
    #: times it was preempted (``scheduling_policy="priority"``, vLLM's ``num_preemptions``)
    num_preemptions: int = 0
    #: output tokens whose KV a preemption released: the recompute prefills them after the
    #: prompt (:attr:`num_prefill_tokens`), then samples the next one; 0 until preempted
    recompute_outputs: int = 0
    #: the names of the full blocks of the tokens it prefills (:attr:`num_prefill_tokens`;
    #: prefix caching, ``kvcache/prefix.py``): named at the first admission attempt, extended
    #: over the outputs when it is preempted
    block_names: list | None = None
    #: ``params.bad_words`` as token sequences (the engine tokenizes them on admission)
    bad_words_ids: list[list[int]] | None = None
    first_token_time: float | None = None
    text: str = ""  # detokenised output (stop strings trimmed)
    #: output tokens and characters of text already returned (``RequestOutputKind.DELTA``)
    sent_tokens: int = 0
    sent_chars: int = 0
    max_tokens: int = 0  # resolved from params and the context limit

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def kv_tokens(self) -> int:
        """The most tokens whose KV this request writes: prompt and output, less the last
        output token, which is sampled and never fed back (what its cache blocks are reserved
        for)."""
        return kv_tokens(len(self.prompt_token_ids), self.max_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        """The tokens it prefills before it samples: its prompt, and after a preemption the
        outputs it had (:attr:`recompute_outputs`). ``prompt_token_ids`` stays the user's
        prompt (the outputs' ``prompt_token_ids``, prompt log-probabilities)."""
        return len(self.prompt_token_ids) + self.recompute_outputs

    def token_ids_at(self, start: int, n: int) -> list[int]:
        """Tokens ``[start, start + n)`` of prompt + output, without copying either list whole."""
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p:start - p + n]
        head = self.prompt_token_ids[start:start + n]
        return head + self.output_token_ids[:n - len(head)]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.num_prefill_tokens

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass
class Logprob:
    """A token's log-probability at one position (vLLM's ``Logprob``): its ``rank`` in the
    vocabulary there (1: the most likely; tokens with equal log-probabilities share the better
    rank) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def _position_dict(tok: int, lp: float, rank: int | None, top: dict[int, float] | None,
                   decode: Callable[[list[int]], str] | None) -> dict[int, Logprob]:
    """One position's ``{token id: Logprob}``: ``tok`` first (its rank given, or its place
    among ``top``), then ``top``'s tokens, most likely first, ranked 1, 2, ..."""
    ranked = list(top or ())
    if rank is None and tok in ranked:
        rank = ranked.index(tok) + 1
    d = {tok: Logprob(lp, rank, decode([tok]) if decode else None)}
    for r, t in enumerate(ranked, 1):
        if t != tok:
            d[t] = Logprob(top[t], r, decode([t]) if decode else None)
    return d


def logprob_dicts(token_ids: list[int], logprobs: list[float],
                  top_logprobs: list[dict[int, float]] | None,
                  decode: Callable[[list[int]], str] | None,
                  ranks: list[int | None] | None = None) -> list[dict[int, Logprob]]:
    """Per generated token, vLLM's ``{token id: Logprob}``: the sampled token first, with its
    rank in the vocabulary (``ranks``; else its place among the alternatives, or None), then the
    alternatives asked for (``SamplingParams.logprobs``), most likely first, ranked 1, 2, ..."""
    tops = top_logprobs or [None] * len(logprobs)
    ranks = ranks or [None] * len(logprobs)
    return [_position_dict(tok, lp, rank, top, decode)
            for tok, lp, top, rank in zip(token_ids, logprobs, tops, ranks)]


def prompt_logprob_dicts(token_ids: list[int], logprobs: list[float | None],
                         ranks: list[int | None] | None,
                         top_logprobs: list[dict[int, float] | None] | None,
                         decode: Callable[[list[int]], str] | None
                         ) -> list[dict[int, Logprob] | None]:
    """Per prompt token, vLLM's ``{token id: Logprob}`` (None where it has no log-probability,
    the first token): the prompt token with its rank, then the most likely tokens there."""
    ranks = ranks or [None] * len(logprobs)
    tops = top_logprobs or [None] * len(logprobs)
    return [None if lp is None else _position_dict(tok, lp, rank, top, decode)
            for tok, lp, rank, top in zip(token_ids, logprobs, ranks, tops)]


@dataclass
class CompletionOutput:
    """One completion of a prompt (vLLM's ``RequestOutput.outputs[i]``). ``logprobs`` is
    vLLM's: per generated token ``{token id: Logprob}`` (see :func:`logprob_dicts`);
    ``top_logprobs`` writescope's ``{token id: log-probability}`` of the alternatives."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    top_logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    #: the stop string or stop token id that ended it; None for EOS and other ends (vLLM's)
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns per prompt and ``LLMEngine.step`` per advanced request.
    Its ``text``, ``token_ids``, ``logprobs`` are the first completion's; ``outputs`` lists them
    all (``SamplingParams.n``), shaped as vLLM's."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    #: per generated token, its log-probability (``SamplingParams.logprobs`` not None)
    logprobs: list[float] | None = None
    #: per generated token, the k most likely tokens {token id: log-probability}, most likely
    #: first (``SamplingParams.logprobs`` = k >= 1); the sampled token may not be among them
    top_logprobs: list[dict[int, float]] | None = None
    #: per prompt token, its log-probability given the tokens before it, None for the first
    #: (``SamplingParams.prompt_logprobs`` not None); :attr:`prompt_logprobs` is vLLM's form
    prompt_token_logprobs: list[float | None] | None = None
    #: per prompt token, the k most likely tokens there, None for the first
    #: (``SamplingParams.prompt_logprobs`` = k >= 1)
    prompt_top_logprobs: list[dict[int, float] | None] | None = None
    #: per prompt token, its rank among the vocabulary at its position (1: the most likely; ties
    #: share the better rank), None for the first (``SamplingParams.prompt_logprobs`` not None)
    prompt_ranks: list[int | None] | None = None
    #: per generated token, its rank in the vocabulary (1: the most likely; ties share the better
    #: rank; ``SamplingParams.logprobs`` not None); ``outputs[i].logprobs`` carry them
    ranks: list[int | None] | None = None
    #: every completion of the prompt (``LLM.generate`` with ``n`` > 1); None: just this one
    completions: list[CompletionOutput] | None = None
    #: prompt tokens whose KV came from the prefix cache (not computed for this request)
    num_cached_tokens: int = 0
    #: the stop string or stop token id that ended it; None for EOS and other ends (vLLM's)
    stop_reason: int | str | None = None
    #: seconds from its arrival to its admission into the running batch (vLLM's
    #: ``time_in_queue``; None while it waits)
    queue_time_s: float | None = None
    #: token ids -> text, for :attr:`outputs`' ``Logprob.decoded_token`` (the engine's
    #: tokenizer; None: no text)
    decode: Callable[[list[int]], str] | None = field(default=None, repr=False, compare=False)
    #: :attr:`outputs` once built (not copied by ``dataclasses.replace``)
    _outputs: list[CompletionOutput] | None = field(default=None, init=False, repr=False,
                                                    compare=False)
    _prompt_lps: list[dict[int, Logprob] | None] | None = field(default=None, init=False,
                                                                repr=False, compare=False)

    @property
    def finished(self) -> bool:
        if self.completions is not None:
            return all(c.finished for c in self.completions)
        return self.finish_reason is not None

    @property
    def outputs(self) -> list[CompletionOutput]:
        if self.completions is not None:
            return self.completions
        if self._outputs is None:  # built once: its log-probabilities decode every token
            self._outputs = [self.as_completion(0)]
        return self._outputs

    @property
    def prompt_logprobs(self) -> list[dict[int, Logprob] | None] | None:
        """vLLM's ``prompt_logprobs``: per prompt token None for the first, then ``{token id:
        Logprob}`` with the prompt token first (its rank among the vocabulary there) and the
        ``SamplingParams.prompt_logprobs`` most likely tokens (ranks 1, 2, ...); None when not
        asked for. The plain floats are :attr:`prompt_token_logprobs`."""
        if self.prompt_token_logprobs is None:
            return None
        if self._prompt_lps is None or len(self._prompt_lps) != len(self.prompt_token_logprobs):
            self._prompt_lps = prompt_logprob_dicts(
                self.prompt_token_ids, self.prompt_token_logprobs, self.prompt_ranks,
                self.prompt_top_logprobs, self.decode)
        return self._prompt_lps

    def as_completion(self, index: int) -> CompletionOutput:
        cum = sum(self.logprobs) if self.logprobs is not None else None
        lps = None if self.logprobs is None else logprob_dicts(
            self.token_ids, self.logprobs, self.top_logprobs, self.decode, self.ranks)
        return CompletionOutput(index, self.text, self.token_ids, cum, lps,
                                self.top_logprobs, self.finish_reason, self.stop_reason)


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: its new tokens ``[start, start + num_new)``."""

    request: Request
    start: int
    num_new: int
    sample: bool  # whether this step's last token produces a next token


@dataclass
class StepBatch:
    """What the scheduler hands the runner: pure data, no tensors."""

    seqs: list[ScheduledSeq]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.seqs)

    def __bool__(self) -> bool:
        return bool(self.seqs)
