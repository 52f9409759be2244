"""``POST /v1/responses`` bodies (OpenAI's Responses API, as vLLM serves it): the request, read
into the chat request it runs as (:meth:`ResponsesRequest.as_chat`), and the response object
with its output items. The endpoint itself is server/responses.py.

A request is ``input`` (a string: one user message; or message items, each ``{"role",
"content"}`` with ``content`` a string or ``input_text``/``output_text`` parts) after
``instructions`` (a system message), the sampling fields ``temperature``, ``top_p``,
``max_output_tokens`` and vLLM's extras (``top_k``, ``min_p``, ``repetition_penalty``, ``seed``,
``structured_outputs``, ...), ``text.format`` (``json_schema``/``json_object``: the chat
endpoint's ``response_format``), function ``tools`` with ``tool_choice`` (the chat endpoint's
tool calls: 'auto' needs ``--tool-call-parser``) and ``function_call`` /
``function_call_output`` input items (an assistant turn's calls, a tool turn). What this server
cannot honour -- built-in tools, ``prompt``, ``conversation``, an ``include``
other than ``message.output_text.logprobs`` (the output text's log-probabilities, with
``top_logprobs`` alternatives: server/response_logprobs.py), input images, files and audio -- is
a 400 naming the field. ``store`` (default
true) keeps the response in memory for ``GET /v1/responses/{id}`` and for a later request's
``previous_response_id`` (server/response_store.py). ``background`` (with ``store``) answers
at once -- streamed, with its events, which a later GET can stream again -- and generates in the
server (server/response_background.py). An
earlier turn's ``reasoning`` item is dropped from the prompt, as chat templates drop earlier turns' thinking."""
from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..core import SEED_RANGE
from . import protocol as P

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")


def new_id(prefix: str) -> str:
    """OpenAI's ids of the Responses API: ``resp_<hex>``, ``msg_<hex>``, ``rs_<hex>``."""
    return f"{prefix}_{uuid.uuid4().hex}"


class TextFormat(P._Strict):
    """``text.format``: plain text, a JSON schema (flat: ``name``, ``schema``, ``strict``) or
    any JSON object."""

    type: Literal["text", "json_schema", "json_object"]
    name: Optional[str] = Field(None, min_length=1, max_length=64)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _schema_named(self):
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("a text.format of type json_schema needs its name and schema")
        return self

    def response_format(self) -> dict | None:
        """The chat endpoint's ``response_format`` of this format (None for plain text)."""
        if self.type == "json_object":
            return {"type": "json_object"}
        if self.type == "json_schema":
            spec = {"name": self.name, "schema": self.schema_}
            spec.update({k: v for k, v in (("strict", self.strict),
                                           ("description", self.description)) if v is not None})
            return {"type": "json_schema", "json_schema": spec}
        return None


class TextConfig(P._Strict):
    format: Optional[TextFormat] = None
    verbosity: Optional[str] = None  # OpenAI's; no effect on this server's models


class ReasoningConfig(P._Strict):
    effort: Optional[str] = None   # accepted; the model thinks as its template says
    summary: Optional[str] = None  # accepted; no summaries are written
    generate_summary: Optional[str] = None


#: the ``include`` values served: the output text's tokens' log-probabilities
INCLUDABLE = ("message.output_text.logprobs",)

#: fields this server refuses unless left out, null or off, with why
REFUSED = {
    "conversation": "conversation is not supported (no conversations are stored): send the "
                    "whole conversation as input",
    "prompt": "prompt templates (prompt) are not supported: send input and instructions",
    "include": None,  # (the output text's log-probabilities only: ResponsesRequest.refused)
    "tools": None,  # (functions only: ResponsesRequest.refused)
    "max_tool_calls": "max_tool_calls is not supported (the model's calls are returned, not "
                      "run or counted here): leave it out",
}


class ResponsesRequest(P._Strict):
    #: ``parse_request``'s messages for a union field of the wrong type (pydantic's would name
    #: only the union's first type: "input: Input should be a valid string (got [1])")
    union_hints: ClassVar[dict[str, str]] = {
        "input": "must be a string or a list of input items (objects: messages with role and "
                 "content, function_call, function_call_output or reasoning items)",
        "tool_choice": "must be 'auto', 'none', 'required' or "
                       "{\"type\": \"function\", \"name\": ...}",
    }

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    stream: Optional[bool] = False
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = "auto"
    parallel_tool_calls: Optional[bool] = True
    truncation: Optional[Literal["auto", "disabled"]] = "disabled"
    store: Optional[bool] = True  # kept in memory (server/response_store.py)
    previous_response_id: Optional[str] = Field(None, min_length=1)
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None
    #: answered at once, generated in the server (server/response_background.py)
    background: Optional[bool] = False
    # refused unless left out (REFUSED)
    conversation: Optional[Any] = None
    prompt: Optional[Any] = None
    include: Optional[list[Any]] = None  # INCLUDABLE only
    tools: Optional[list[Any]] = Field(None, max_length=128)
    #: the alternatives per token of the output text's log-probabilities (OpenAI's 0 to 20)
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    max_tool_calls: Optional[int] = None
    # vLLM's sampling extras, as on the chat endpoint
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=10.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    seed: Optional[int] = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    min_tokens: Optional[int] = Field(None, ge=0)
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    structured_outputs: Optional[P.StructuredOutputsField] = None  # vLLM's; not with text.format
    request_id: Optional[str] = Field(None, min_length=1, max_length=256)
    priority: Optional[int] = 0
    cache_salt: Optional[str] = Field(None, min_length=1)

    def refused(self) -> P.APIError | None:
        """The first field given that this server cannot honour, as its 400."""
        for name, why in REFUSED.items():
            v = getattr(self, name)
            if why is None:
                continue
            if v not in (None, False, [], 0):
                return P.APIError(why, param=name, code="unsupported_parameter")
        if self.background and self.store is False:
            return P.APIError("background responses are stored (their result is polled with "
                              "GET /v1/responses/{id}): leave store out or true",
                              param="background")
        for value in self.include or []:
            if value not in INCLUDABLE:
                return P.APIError(f"include {value!r} is not supported (only "
                                  f"{', '.join(map(repr, INCLUDABLE))}: this server runs no "
                                  "built-in tools, takes no images and encrypts no reasoning)",
                                  param="include", code="unsupported_parameter")
        fmt = self.text.format if self.text is not None else None
        if self.structured_outputs is not None and fmt is not None and fmt.type != "text":
            return P.APIError("at most one constraint on the output: structured_outputs cannot "
                              "be combined with a text.format other than text",
                              param="structured_outputs")
        for i, tool in enumerate(self.tools or []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                return P.APIError(f"tools[{i}]: tools of type {kind!r} are not supported (only "
                                  "function tools: this server runs no built-in tools)",
                                  param=f"tools[{i}].type", code="unsupported_parameter")
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") != "function":
            return P.APIError(f"tool_choice of type {choice.get('type')!r} is not supported "
                              "(only 'auto', 'none', 'required' or a function)",
                              param="tool_choice", code="unsupported_parameter")
        if isinstance(choice, dict) and not isinstance(choice.get("name"), str):
            return P.APIError("tool_choice of type 'function' needs the function's name (a "
                              f"string; got {choice.get('name')!r})", param="tool_choice.name")
        if isinstance(choice, str) and choice not in ("auto", "none", "required"):
            return P.APIError(f"tool_choice must be 'auto', 'none', 'required' or "
                              f"{{\"type\": \"function\", \"name\": ...}} (got {choice!r})",
                              param="tool_choice")
        return None

    def logprobs(self) -> bool:
        """Whether the output text comes with its tokens' log-probabilities (``include``
        names them; ``top_logprobs`` alone only sets how many alternatives, as OpenAI's)."""
        return "message.output_text.logprobs" in (self.include or [])

    def chat_tools(self) -> dict[str, Any]:
        """``tools`` and ``tool_choice`` as the chat endpoint takes them (functions nested).
        Without tools, a ``tool_choice`` that asks for a call ('required', a function) is still
        passed on, for the chat endpoint's 400 (dropped, the request would answer in text)."""
        choice = self.tool_choice
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        if not self.tools:
            return {"tool_choice": choice} if choice not in (None, "auto", "none") else {}
        fields = ("name", "description", "parameters", "strict")
        return {"tools": [{"type": "function",
                           "function": {k: t[k] for k in fields if t.get(k) is not None}}
                          for t in self.tools],
                "tool_choice": choice or "auto",
                "parallel_tool_calls": self.parallel_tool_calls}

    def turns(self) -> list[dict]:
        """``input``'s messages (an :class:`APIError` naming the item that cannot be one)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out = []
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind == "reasoning":  # an earlier turn's thinking: templates drop it
                continue
            if kind == "function_call":  # an earlier call: the assistant turn's (with its text)
                call = {"id": _field(item, "call_id", i), "type": "function",
                        "function": {"name": _field(item, "name", i),
                                     "arguments": _field(item, "arguments", i)}}
                if not (out and out[-1]["role"] == "assistant"):
                    out.append({"role": "assistant", "content": None})
                out[-1].setdefault("tool_calls", []).append(call)
                continue
            if kind == "function_call_output":  # a call's result: a tool turn
                output = _field(item, "output", i)
                out.append({"role": "tool", "tool_call_id": _field(item, "call_id", i),
                            "content": output})
                continue
            if kind != "message":
                raise P.APIError(f"input[{i}]: items of type {kind!r} are not supported (only "
                                 "messages, reasoning items, function_call and "
                                 "function_call_output)", param=f"input[{i}].type",
                                 code="unsupported_parameter")
            role = item.get("role")
            if role not in ROLES:
                raise P.APIError(f"input[{i}].role must be one of {', '.join(ROLES)} "
                                 f"(got {role!r})", param=f"input[{i}].role")
            out.append({"role": role, "content": _text(item.get("content"), i)})
        if not out:
            raise P.APIError("input holds no message", param="input")
        return out

    def input_items(self) -> list[dict]:
        """``input`` as OpenAI's stored input items (``GET /v1/responses/{id}/input_items``),
        once :meth:`turns` has read it: each with an id (its own where it has one), a message's
        text as parts (``output_text`` an assistant's, ``input_text`` the others')."""
        given = ([{"role": "user", "content": self.input}] if isinstance(self.input, str)
                 else self.input)
        out: list[dict] = []
        for item in given:
            kind = item.get("type", "message")
            if kind == "message":
                role = item["role"]
                content = item["content"]
                texts = [content] if isinstance(content, str) else [p["text"] for p in content]
                parts = ([{"type": "output_text", "text": t, "annotations": []} for t in texts]
                         if role == "assistant" else
                         [{"type": "input_text", "text": t} for t in texts])
                out.append({"type": "message", "id": item.get("id") or new_id("msg"),
                            "role": role, "content": parts, "status": "completed"})
            elif kind == "function_call":
                out.append({"type": kind, "id": item.get("id") or new_id("fc"),
                            "call_id": item["call_id"], "name": item["name"],
                            "arguments": item["arguments"], "status": "completed"})
            elif kind == "function_call_output":
                out.append({"type": kind, "id": item.get("id") or new_id("fco"),
                            "call_id": item["call_id"], "output": item["output"],
                            "status": "completed"})
            else:  # reasoning
                out.append({"type": kind, "id": item.get("id") or new_id("rs"),
                            "summary": item.get("summary") or [],
                            **({"content": item["content"]} if item.get("content") else {})})
        return out

    def messages(self, earlier: list[dict] = ()) -> list[dict]:
        """The conversation: ``instructions`` as a system message (a previous response's are
        not carried over, as OpenAI's), the ``earlier`` turns, then ``input``'s."""
        head = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return head + list(earlier) + self.turns()

    def as_chat(self, earlier: list[dict] = ()) -> P.ChatCompletionRequest:
        """The chat request this request runs as (the chat endpoint's rendering, sampling,
        constraints and reasoning split), after the ``earlier`` turns of its
        ``previous_response_id``."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages(earlier),
                                "max_tokens": self.max_output_tokens, **self.chat_tools()}
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty", "seed", "min_tokens", "ignore_eos",
                     "skip_special_tokens", "chat_template_kwargs", "structured_outputs",
                     "request_id", "priority", "cache_salt"):
            v = getattr(self, name)
            if v is not None:
                body[name] = v.model_dump(by_alias=True) if isinstance(v, BaseModel) else v
        if self.logprobs():
            body.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.response_format() is not None:
            body["response_format"] = fmt.response_format()
        if self.truncation == "auto":  # the conversation's start dropped to fit, as vLLM's
            body["truncate_prompt_tokens"] = -1
        try:
            return P.ChatCompletionRequest.model_validate(body)
        except ValidationError as e:  # named by this request's fields, not the chat's
            err = e.errors()[0]
            msg = err["msg"].removeprefix("Value error, ")
            if not err["loc"]:  # a check across fields
                raise P.APIError(msg) from None
            loc = ".".join(str(x) for x in err["loc"])
            head = str(err["loc"][0])
            field = {"messages": "input", "max_tokens": "max_output_tokens",
                     "response_format": "text.format"}.get(head, head)
            raise P.APIError(f"{field}: {msg} (at {loc} of the conversation as a chat request)"
                             if field == "input" else f"{loc}: {msg}", param=field) from None


def _field(item: dict, name: str, i: int) -> str:
    """Item ``i``'s string field ``name`` (a 400 naming it where it is missing)."""
    v = item.get(name)
    if not isinstance(v, str):
        raise P.APIError(f"input[{i}] of type {item.get('type')!r} needs {name} (a string)",
                         param=f"input[{i}].{name}")
    return v


def _text(content: Any, i: int) -> str:
    """A message item's text: a string, or its ``input_text``/``output_text`` parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise P.APIError(f"input[{i}].content must be a string or a list of content parts",
                         param=f"input[{i}].content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise P.APIError(f"input[{i}].content[{j}]: content parts of type {kind!r} are not "
                             f"supported (only {' and '.join(TEXT_PARTS)}: this server serves "
                             "text models)", param=f"input[{i}].content[{j}].type",
                             code="unsupported_parameter")
        if not isinstance(part.get("text"), str):
            raise P.APIError(f"input[{i}].content[{j}] needs its text (a string)",
                             param=f"input[{i}].content[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


# ----------------------------------------------------------------------------------------------
# the response


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class ReasoningItem(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens found in the prefix cache
    #: OpenAI's explicit cache writes (its SDK's field): none here, the prefix cache is
    #: automatic and counts only its hits
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class IncompleteDetails(BaseModel):
    reason: str


class ResponsesResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "cancelled",
                    "failed"]
    background: bool = False
    error: Optional[dict[str, Any]] = None
    incomplete_details: Optional[IncompleteDetails] = None
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    max_tool_calls: Optional[int] = None
    metadata: Optional[dict[str, str]] = None
    model: str
    output: list[Union[ReasoningItem, MessageItem, FunctionCallItem]] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: Optional[str] = None
    reasoning: Optional[dict[str, Any]] = None
    service_tier: str = "auto"
    store: bool = False
    temperature: Optional[float] = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Union[str, dict[str, Any]] = "auto"
    tools: list[Any] = Field(default_factory=list)
    top_logprobs: int = 0
    top_p: Optional[float] = None
    truncation: str = "disabled"
    usage: Optional[ResponseUsage] = None
    user: Optional[str] = None
