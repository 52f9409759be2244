"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

Shapes follow OpenAI's API reference for ``/v1/completions`` and ``/v1/chat/completions`` (and
the objects the official ``openai`` client parses); field names of the extensions (``top_k``,
``min_p``, ``ignore_eos``, ``stop_token_ids``, ``repetition_penalty``, ``min_tokens``,
``prompt_logprobs``, ``include_stop_str_in_output``, ``allowed_token_ids``,
``truncate_prompt_tokens``, ``bad_words``, ``skip_special_tokens``, ``structured_outputs`` and the
older ``guided_*``, ``add_special_tokens``, ``request_id``, ``priority``,
``return_tokens_as_token_ids``; on the chat endpoint ``echo``, ``include_reasoning``,
``add_generation_prompt``, ``continue_final_message``, ``chat_template``,
``chat_template_kwargs`` and ``documents``) follow vLLM's server.

Unknown fields are ignored, as vLLM's server does (OpenAI's refuses them): the request runs
without them and one warning lists them ("The following fields were present in the request but
ignored: ..."), so that a client written for vLLM (or sending a newer OpenAI field) keeps
working. The fields this server knows are validated strictly: a field of the wrong type
(``"max_tokens": "16"``) or a value out of range is a 400 naming the parameter. Known fields
that do not change what this server decodes (OpenAI's ``store``, ``metadata``,
``service_tier``, ``reasoning_effort``, ``modalities``, ``prompt_cache_key``,
``safety_identifier``, ``user``, ``parallel_tool_calls``; vLLM's
``guided_decoding_backend``, ``kv_transfer_params``, ``vllm_xargs``, ``mm_processor_kwargs``)
are accepted and ignored, the chat endpoint's with a warning. Parameters this engine cannot
honour (``suffix``, ``best_of`` other than ``n``, ``logits_processors``,
``prompt_embeds``, ``structural_tag``, a non-zero ``priority`` unless the server runs with
``--scheduling-policy priority``) are refused with a clear message rather than silently
ignored. vLLM's ``cache_salt`` is honoured: the request's prompt
blocks are shared in the prefix cache only with requests of the same salt.

vLLM's ``use_beam_search`` runs a beam search per prompt (``server/beam.py``) of width ``n``
(at most 10), with ``max_tokens``, ``ignore_eos``, ``temperature``, ``length_penalty``,
``include_stop_str_in_output``, ``logprobs`` (at most ``2 * n`` alternatives) and
``cache_salt``; as under vLLM the other sampling fields do not apply to it, and those that
would change what it must return (an output constraint, stop strings and token ids,
``prompt_logprobs``, ``echo`` with log-probabilities or ``max_tokens`` 0, ``min_tokens``)
are refused with it.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from contextvars import ContextVar
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator, model_serializer, model_validator)

from ..core import (MAX_LOGPROBS, SEED_RANGE, InvalidRequestError, SamplingParams,
                    StructuredOutputsParams)
from ..engine.beam import BeamSearchParams
from ..models.tokenizer import RESERVED_TEMPLATE_KWARGS

MAX_CHOICES = 16       # n
MAX_SUBREQUESTS = 128  # prompts x n in one completions call
MAX_STOP = 16


class APIError(Exception):
    """An error answered as OpenAI's ``{"error": {...}}`` body with an HTTP status."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


log = logging.getLogger("writescope.server")

#: while :func:`parse_request` validates a body: the unknown field names met so far
_UNKNOWN: ContextVar[Optional[list[str]]] = ContextVar("writescope_unknown_fields", default=None)


class _Strict(BaseModel):
    """A request body (or part of one): unknown fields are ignored and noted (vLLM's server
    accepts them with a warning), the known ones validated strictly (no "16" -> 16 or
    1.0 -> True coercions; JSON ints are still accepted for floats)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _note_unknown(cls, data: Any, handler):
        out = handler(data)
        sink = _UNKNOWN.get()
        if sink is not None and isinstance(data, dict):
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values()
                                             if f.alias}
            sink.extend(k for k in data if k not in known and k not in sink)
        return out


def _refused(name: str):
    """A validator refusing ``name`` when given (vLLM's fields this server cannot honour)."""
    def check(cls, v):
        if v is not None:
            raise ValueError(f"{name} is not supported by this server")
        return v
    return field_validator(name)(classmethod(check))


class StreamOptions(_Strict):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


Stop = Union[str, list[str], None]


class JSONSchemaFormat(_Strict):
    """``response_format.json_schema`` (OpenAI's structured outputs)."""

    name: str = Field(min_length=1, max_length=64)
    description: Optional[str] = None
    # "schema" shadows a pydantic BaseModel attribute: stored as schema_
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JSONSchemaFormat] = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs json_schema")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError("json_schema is only allowed with type json_schema")
        return self


class StructuredOutputsField(_Strict):
    """vLLM's ``structured_outputs`` extension: exactly one constraint."""

    json_: Optional[Union[dict[str, Any], str]] = Field(None, alias="json")
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    whitespace_pattern: Optional[str] = None
    disable_any_whitespace: Optional[bool] = None
    disable_additional_properties: Optional[bool] = None
    disable_fallback: Optional[bool] = None

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class _SamplingFields(_Strict):
    """Fields shared by both endpoints."""

    model: Optional[str] = None
    n: Optional[int] = Field(1, ge=1, le=MAX_CHOICES)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    # None: the model's generation-config default, else OpenAI's 1.0 (sampling_params)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    stop: Stop = None
    seed: Optional[int] = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    presence_penalty: Optional[float] = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # extensions (vLLM's names)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=10.0)
    min_tokens: Optional[int] = Field(None, ge=0)
    ignore_eos: Optional[bool] = False
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: Optional[bool] = False
    allowed_token_ids: Optional[list[int]] = Field(None, min_length=1)
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1)
    bad_words: Optional[list[str]] = None
    skip_special_tokens: Optional[bool] = True
    spaces_between_special_tokens: Optional[bool] = True  # vLLM's: no effect (fast tokenizers)
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs and its former
    # guided_* fields
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputsField] = None
    guided_json: Optional[Union[dict[str, Any], str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_whitespace_pattern: Optional[str] = None
    # extension (vLLM): each prompt token's log-probability and rank, and the k most likely
    # tokens at each prompt position (the response's ``prompt_logprobs``; not when streaming)
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    # vLLM's request extras: the response's id is "<cmpl|chatcmpl>-<request_id>" (an
    # X-Request-Id header comes first, as in vLLM); priority: the request's admission order
    # under --scheduling-policy priority (lower first, ties by arrival), only 0 under fcfs
    # (OpenAIServer.check_priority); the log-probabilities' tokens as "token_id:N"
    request_id: Optional[str] = Field(None, min_length=1, max_length=256)
    priority: Optional[int] = 0
    return_tokens_as_token_ids: Optional[bool] = None
    # vLLM's: a beam search of width n (server/beam.py)
    use_beam_search: Optional[bool] = False
    # vLLM's, refused unless unset: custom logits processors
    logits_processors: Optional[list[Any]] = None
    # vLLM's: prompt blocks cached under this salt are shared only with the same salt
    cache_salt: Optional[str] = Field(None, min_length=1)
    # vLLM's: beam search's length penalty (score = cumulative log-probability / generated
    # length ** length_penalty); without use_beam_search it does nothing
    length_penalty: Optional[float] = 1.0
    # vLLM's, accepted and ignored: the structured-output backend (this server has one),
    # disaggregated serving's and custom extensions' parameters
    guided_decoding_backend: Optional[str] = None
    kv_transfer_params: Optional[dict[str, Any]] = None
    vllm_xargs: Optional[dict[str, Union[str, int, float]]] = None

    #: fields accepted and ignored (:meth:`ignored_fields`, logged by the server)
    IGNORED_FIELDS: ClassVar[tuple[str, ...]] = ("guided_decoding_backend",
                                                 "kv_transfer_params", "vllm_xargs")

    def ignored_fields(self) -> list[str]:
        """The fields given (not null) that this server accepts and ignores."""
        return [f for f in self.IGNORED_FIELDS
                if f in self.model_fields_set and getattr(self, f) is not None]

    @field_validator("logits_processors")
    @classmethod
    def _not_here(cls, v: Any, info: ValidationInfo) -> Any:
        """vLLM's fields this server cannot honour: refused unless unset or off."""
        name = info.field_name
        if name == "logits_processors" and v:
            raise ValueError(f"{name} is not supported by this server")
        return v

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: Stop) -> Stop:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    @field_validator("stop_token_ids", "allowed_token_ids")
    @classmethod
    def _check_stop_ids(cls, v: list[int] | None, info) -> list[int] | None:
        if v and any(t < 0 for t in v):
            raise ValueError(f"{info.field_name} must be non-negative")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k, b in (v or {}).items():
            # ASCII digits only: str.isdigit() also takes "²" (int() then fails) and "１"
            if not (k.isascii() and k.isdigit()):
                raise ValueError(f"logit_bias keys must be token ids, got {k!r}")
            if not -100 <= b <= 100:
                raise ValueError(f"logit_bias values must be from -100 to 100, got {b}")
        return v

    @model_validator(mode="after")
    def _unsupported(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs is not available when stream is true")
        given = [name for name, on in (
            ("response_format", self.response_format is not None
             and self.response_format.type != "text"),
            ("structured_outputs", self.structured_outputs is not None),
            ("guided_json", self.guided_json is not None),
            ("guided_regex", self.guided_regex is not None),
            ("guided_choice", self.guided_choice is not None),
            ("guided_grammar", self.guided_grammar is not None)) if on]
        if len(given) > 1:
            raise ValueError(f"at most one constraint on the output: got {', '.join(given)}")
        if self.use_beam_search:
            with_beams = given + [name for name, on in (
                ("stop", bool(self.stop_list)), ("stop_token_ids", bool(self.stop_token_ids)),
                ("prompt_logprobs", self.prompt_logprobs is not None),
                ("min_tokens", bool(self.min_tokens)),
                ("max_tokens 0", getattr(self, "max_tokens", None) == 0),
                # (a completion's echo: the prompt's log-probabilities, which no step has)
                ("echo with logprobs", bool(getattr(self, "echo", False))
                 and type(getattr(self, "logprobs", None)) is int)) if on]
            if with_beams:
                raise ValueError(f"use_beam_search does not apply {', '.join(with_beams)}: "
                                 "leave it out, or sample without beam search")
        return self

    def beam_search_params(self, max_tokens: int, defaults: dict | None = None
                           ) -> BeamSearchParams:
        """The beam search of ``use_beam_search``: ``n`` beams (vLLM's rule: the temperature
        given, else the model's default, else 1)."""
        t = self.temperature
        if t is None:
            t = (defaults or {}).get("temperature", 1.0)
        return BeamSearchParams(
            beam_width=self.num_choices, max_tokens=max_tokens, ignore_eos=bool(self.ignore_eos),
            temperature=float(t),
            length_penalty=1.0 if self.length_penalty is None else float(self.length_penalty),
            include_stop_str_in_output=bool(self.include_stop_str_in_output))

    def structured(self) -> StructuredOutputsParams | None:
        """The request's constraint on the output, if any (an :class:`InvalidRequestError`
        when it is malformed)."""
        ws = self.guided_whitespace_pattern
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            return StructuredOutputsParams(json_object=True, whitespace_pattern=ws)
        if rf is not None and rf.type == "json_schema":
            schema = rf.json_schema.schema_  # type: ignore[union-attr]
            return StructuredOutputsParams(json=schema if schema is not None else {},
                                           whitespace_pattern=ws)
        so = self.structured_outputs
        if so is not None:
            return StructuredOutputsParams(
                json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar,
                json_object=bool(so.json_object),
                whitespace_pattern=so.whitespace_pattern if so.whitespace_pattern else ws,
                disable_any_whitespace=so.disable_any_whitespace,
                disable_additional_properties=bool(so.disable_additional_properties),
                disable_fallback=bool(so.disable_fallback))
        if self.guided_json is not None:
            return StructuredOutputsParams(json=self.guided_json, whitespace_pattern=ws)
        if self.guided_regex is not None:
            return StructuredOutputsParams(regex=self.guided_regex)
        if self.guided_choice is not None:
            return StructuredOutputsParams(choice=self.guided_choice)
        if self.guided_grammar is not None:
            return StructuredOutputsParams(grammar=self.guided_grammar)
        return None

    @property
    def num_choices(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_params(self, max_tokens: int, logprobs: int | None, seed_offset: int = 0,
                        prompt_logprobs: int | None = None,
                        defaults: dict | None = None) -> SamplingParams:
        """The engine's parameters for one choice. ``defaults``: the model's sampling defaults
        (``LLMEngine.default_sampling``, its generation_config.json's) for the fields the
        request leaves out, as vLLM's server; OpenAI's / vLLM's own defaults after them."""
        seed = self.seed
        if seed is not None and seed_offset:
            seed = (seed + seed_offset) % (2 ** 63)
        defaults = defaults or {}

        def pick(name: str, fallback):
            v = getattr(self, name)
            return defaults.get(name, fallback) if v is None else v
        return SamplingParams(
            temperature=float(pick("temperature", 1.0)),
            top_p=float(pick("top_p", 1.0)),
            top_k=pick("top_k", -1),
            min_p=float(pick("min_p", 0.0)),
            max_tokens=max_tokens,
            seed=seed,
            stop=self.stop_list,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos),
            presence_penalty=float(self.presence_penalty or 0.0),
            frequency_penalty=float(self.frequency_penalty or 0.0),
            repetition_penalty=float(pick("repetition_penalty", 1.0)),
            min_tokens=self.min_tokens or 0,
            logit_bias={int(k): float(b) for k, b in self.logit_bias.items()}
            if self.logit_bias else None,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            structured_outputs=self.structured(),
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            allowed_token_ids=list(self.allowed_token_ids) if self.allowed_token_ids else None,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            bad_words=list(self.bad_words) if self.bad_words else None,
            skip_special_tokens=self.skip_special_tokens is not False,
            spaces_between_special_tokens=self.spaces_between_special_tokens is not False,
        )


Prompt = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    echo: Optional[bool] = False  # (before max_tokens: its check reads it)
    # 0 with echo: the prompt back with its log-probabilities, nothing generated (vLLM's echo
    # without generation, how lm-evaluation-harness scores a text)
    max_tokens: Optional[int] = Field(16, ge=0)
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's limit (OpenAI's: 5)
    best_of: Optional[int] = Field(None, ge=1)
    suffix: Optional[str] = None
    # vLLM's: the tokenizer's special tokens (a BOS) added to a text prompt
    add_special_tokens: Optional[bool] = True
    prompt_embeds: Optional[Union[str, list[str]]] = None  # vLLM's; refused

    _no_embeds = _refused("prompt_embeds")

    @field_validator("max_tokens")
    @classmethod
    def _zero_with_echo_only(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v == 0 and not info.data.get("echo"):
            raise ValueError("max_tokens must be at least 1 (0 only with echo: the prompt "
                             "back, with its logprobs, nothing generated)")
        return v

    @model_validator(mode="after")
    def _completion_checks(self):
        if self.best_of is not None and self.best_of != self.num_choices:
            raise ValueError("best_of different from n is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise ValueError("prompt must not be empty")
            n_prompts = len(self.prompt) if not isinstance(self.prompt[0], int) else 1
            if n_prompts * self.num_choices > MAX_SUBREQUESTS:
                raise ValueError(f"at most {MAX_SUBREQUESTS} completions (prompts x n) "
                                 "per request")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: Optional[str] = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.type != "text":
            raise ValueError(f"content part of type {self.type!r} is not supported "
                             "(only text parts)")
        if self.text is None:
            raise ValueError("a content part of type 'text' needs its text field (a string)")
        return self


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    # JSON text, as OpenAI sends and returns it; an earlier turn's call may also give the
    # object itself (vLLM takes either)
    arguments: Union[str, dict[str, Any]]


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    # extra fields ignored: clients echo back assistant messages with refusal/annotations/...
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # an assistant turn's calls
    tool_call_id: Optional[str] = None  # a tool turn: the call it answers
    # an assistant turn's thinking, as this server returned it (``reasoning_content``;
    # ``reasoning``, vLLM's newer name): templates that render earlier thinking (Qwen3's,
    # between tool calls) read it as ``reasoning_content``
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema of the arguments
    strict: Optional[bool] = None


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatTemplateFields(_Strict):
    """How a conversation becomes a prompt (vLLM's extensions): a generation prompt after the
    last message, or the last message continued (an assistant turn left open, to start the
    answer); ``chat_template_kwargs`` are extra variables the template reads (Qwen3's
    ``enable_thinking``)."""

    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: Optional[bool] = True
    continue_final_message: Optional[bool] = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    # vLLM's: a Jinja template instead of the model's (only with the server's
    # --trust-request-chat-template), documents for a RAG template, and special tokens (a BOS)
    # added on top of what the template writes (off: templates write their own)
    chat_template: Optional[str] = Field(None, min_length=1)
    documents: Optional[list[dict[str, str]]] = None
    add_special_tokens: Optional[bool] = False

    @model_validator(mode="after")
    def _template_checks(self):
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be "
                             "true: set add_generation_prompt to false to continue the last "
                             "message")
        bad = sorted(set(self.chat_template_kwargs or {}) & RESERVED_TEMPLATE_KWARGS)
        if bad:
            raise ValueError(f"chat_template_kwargs cannot set {', '.join(bad)}: they are "
                             "parameters of the request itself")
        return self

    def template_options(self) -> dict[str, Any]:
        """The keyword arguments of ``Tokenizer.apply_chat_template`` besides the messages."""
        return {"add_generation_prompt": bool(self.add_generation_prompt),
                "continue_final_message": bool(self.continue_final_message),
                "chat_template": self.chat_template, "documents": self.documents,
                "add_special_tokens": bool(self.add_special_tokens),
                **(self.chat_template_kwargs or {})}


#: OpenAI's chat fields accepted and ignored (``ChatCompletionRequest.ignored_fields``)
IGNORED_CHAT_FIELDS = ("store", "metadata", "service_tier", "reasoning_effort", "modalities",
                       "prompt_cache_key", "safety_identifier")
#: vLLM's chat fields accepted and ignored (a text-only model has no multimodal processor)
IGNORED_VLLM_CHAT_FIELDS = ("mm_processor_kwargs",)


class ChatCompletionRequest(ChatTemplateFields, _SamplingFields):
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[ChatTool]] = Field(None, max_length=128)
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    # extension (vLLM): the answer starts with the last message's content when that message
    # has the answer's role (an assistant turn continued, or answered again)
    echo: Optional[bool] = False
    # extension (vLLM): false leaves the reasoning out of the answer (with a reasoning parser,
    # the model still thinks; its thoughts are split off and dropped)
    include_reasoning: Optional[bool] = True
    # OpenAI's fields that do not change what this server decodes: accepted, and ignored
    # with a warning naming them (as vLLM does), so that clients that send them work
    store: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    service_tier: Optional[str] = None
    reasoning_effort: Optional[str] = None
    modalities: Optional[list[str]] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None
    mm_processor_kwargs: Optional[dict[str, Any]] = None  # vLLM's
    structural_tag: Optional[str] = None  # vLLM's; refused

    _no_structural_tag = _refused("structural_tag")

    IGNORED_FIELDS: ClassVar[tuple[str, ...]] = (_SamplingFields.IGNORED_FIELDS
                                                 + IGNORED_VLLM_CHAT_FIELDS)

    def ignored_fields(self) -> list[str]:
        """The fields given that this server ignores (:data:`IGNORED_CHAT_FIELDS`, vLLM's)."""
        return [f for f in IGNORED_CHAT_FIELDS if f in self.model_fields_set] + \
            super().ignored_fields()

    def echoed(self) -> str:
        """The text ``echo`` puts before each choice's content ('' when none)."""
        last = self.messages[-1]
        role = "assistant" if self.add_generation_prompt else last.role
        return last.text() if self.echo and last.role == role else ""

    @model_validator(mode="after")
    def _chat_checks(self):
        if self.top_logprobs and not self.logprobs:  # 0 without logprobs: vLLM's default
            raise ValueError("top_logprobs requires logprobs to be true")

        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: function names must be distinct")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names function {choice.function.name!r}, which is "
                             "not among tools")
        if choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if self.calls_tools and self._constrained_otherwise():
            raise ValueError("a forced tool call constrains the output: it cannot be combined "
                             "with response_format or structured outputs")
        return self

    @property
    def calls_tools(self) -> bool:
        """Whether the output is forced to be tool calls (a named function or 'required')."""
        return bool(self.tools) and (self.tool_choice == "required"
                                     or isinstance(self.tool_choice, NamedToolChoice))

    def _constrained_otherwise(self) -> bool:
        rf = self.response_format
        return (rf is not None and rf.type != "text") or any(
            getattr(self, f) is not None for f in ("structured_outputs", "guided_json",
                                                   "guided_regex", "guided_choice",
                                                   "guided_grammar"))

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


def parse_request(model: type[BaseModel], body: bytes):
    """Validate a raw JSON body; malformed JSON or a bad field becomes a 400 :class:`APIError`.
    A field of the wrong type is described by the model's ``union_hints`` (default
    :data:`_UNION_HINTS`, the sampling endpoints' fields) where it names the field. Unknown
    fields are dropped, with one warning naming them (vLLM's wording)."""
    if not body.strip():
        raise APIError("request body is empty; expected a JSON object")
    unknown: list[str] = []
    token = _UNKNOWN.set(unknown)
    try:
        req = model.model_validate_json(body)
        if unknown:
            log.warning("The following fields were present in the request but ignored: %s",
                        ", ".join(unknown))
        return req
    except ValidationError as e:
        errors = e.errors()
        err = next((x for x in errors if x.get("type") == "value_error"), errors[0])
        loc = [x for x in err.get("loc", ()) if isinstance(x, int) or _FIELD.match(str(x))]
        param = ".".join(str(x) for x in loc) or None
        etype = err.get("type", "")
        if etype == "json_invalid":
            raise APIError(f"malformed JSON: {err.get('msg')}", code="invalid_json") from None
        if etype == "model_type" and not loc:
            raise APIError("request body must be a JSON object", code="invalid_json") from None
        if etype == "missing":
            raise APIError(f"Missing required parameter: {param}", param=param,
                           code="missing_required_parameter") from None
        msg = err.get("msg", "invalid value")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        hints = getattr(model, "union_hints", _UNION_HINTS)
        if param and param in hints and etype != "value_error":
            msg = hints[param]
        if param:
            msg = f"{param}: {msg} (got {_short(err.get('input'))})"
        raise APIError(msg, param=param, code="invalid_value") from None
    finally:
        _UNKNOWN.reset(token)


_FIELD = re.compile(r"^(?!(?:str|int|float|bool|list|dict|none|tuple)$)[A-Za-z_][A-Za-z0-9_]*$")
_UNION_HINTS = {
    "prompt": "must be a string, a list of strings, a list of token ids or a list of lists "
              "of token ids",
    "stop": "must be a string or a list of strings",
}


def _short(v: Any, limit: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[:limit] + "..."


def invalid_request(e: InvalidRequestError) -> APIError:
    from ..core import RequestTooLargeError
    code = "context_length_exceeded" if isinstance(e, RequestTooLargeError) else "invalid_value"
    return APIError(str(e), code=code)


# ----------------------------------------------------------------------------------------------
# responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    #: prompt tokens whose KV came from the prefix cache (OpenAI's field)
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: Optional[list[Optional[dict[str, float]]]] = None


class PromptLogprob(BaseModel):
    """A token's entry in ``prompt_logprobs`` (vLLM's ``Logprob``)."""

    logprob: float
    rank: Optional[int] = None  # 1: the most likely token at that position
    decoded_token: Optional[str] = None


#: per prompt token (None for the first): {token id: its entry}, the prompt's own token first,
#: then the k most likely ones
PromptLogprobs = list[Optional[dict[int, PromptLogprob]]]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "abort"]] = None
    #: extension (vLLM): the stop string or stop token id that ended the choice, else null
    stop_reason: Optional[Union[int, str]] = None
    prompt_logprobs: Optional[PromptLogprobs] = None  # extension (vLLM)


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now_s)
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None
    system_fingerprint: Optional[str] = None


class ChatLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None
    top_logprobs: list["ChatTopLogprob"] = Field(default_factory=list)


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


ChatLogprob.model_rebuild()


class ChatChoiceLogprobs(BaseModel):
    content: Optional[list[ChatLogprob]] = None
    refusal: Optional[list[ChatLogprob]] = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    refusal: Optional[str] = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    #: the model's thinking (``--reasoning-parser``; DeepSeek's and vLLM's field)
    reasoning_content: Optional[str] = None


class _NoNulls(BaseModel):
    """A streamed delta: OpenAI sends the fields it has, never nulls."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaFunctionCall(_NoNulls):
    name: Optional[str] = None
    arguments: Optional[str] = None


class DeltaToolCall(_NoNulls):
    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: Optional[DeltaFunctionCall] = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatChoiceLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "abort", "tool_calls"]] = None
    stop_reason: Optional[Union[int, str]] = None  # extension (vLLM), as in CompletionChoice


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now_s)
    model: str
    choices: list[ChatChoice]
    usage: Optional[UsageInfo] = None
    system_fingerprint: Optional[str] = None
    prompt_logprobs: Optional[PromptLogprobs] = None  # extension (vLLM)


class ChatDelta(_NoNulls):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[DeltaToolCall]] = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: Optional[ChatChoiceLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "abort", "tool_calls"]] = None
    stop_reason: Optional[Union[int, str]] = None  # extension (vLLM), as in CompletionChoice


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now_s)
    model: str
    choices: list[ChatStreamChoice]
    usage: Optional[UsageInfo] = None
    system_fingerprint: Optional[str] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now_s)
    owned_by: str = "writescope"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
