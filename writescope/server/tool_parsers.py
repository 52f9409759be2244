"""Tool-call parsers for ``tool_choice: "auto"`` (``writescope serve --tool-call-parser NAME``):
how a model writes the calls it decides to make, read out of its text as vLLM's parsers of the
same names read them.

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes,
  Qwen2.5, Qwen3 and Qwen3-30B-A3B-Instruct);
- ``qwen3_coder``: ``<tool_call><function=NAME><parameter=KEY>value</parameter>...</function>
  </tool_call>`` blocks, each value text converted by its parameter's type in the tool's schema
  (Qwen3-Coder, Qwen3-Coder-30B-A3B among them);
- ``mistral``: ``[TOOL_CALLS]`` and a JSON array of ``{"name", "arguments"}`` objects (Mistral's
  and Mixtral's instruct models with tool use, e.g. Mixtral-8x22B-Instruct-v0.1). The marker is a
  special token, so a request this parser reads keeps special tokens in its text
  (:meth:`ToolParser.adjust_request`, as vLLM's parser does).

Each parser gives the same calls two ways: whole (:meth:`ToolParser.parse`, a finished
choice's message) and as the text grows (:meth:`ToolParser.stream`, a streamed choice's deltas:
each call's name once written, its arguments' JSON text as it grows), so a stream and a whole
response of the same tokens say the same (``server/chat_output.py``).
"""
from __future__ import annotations

import json
import secrets
import string
from abc import ABC, abstractmethod
from typing import Any, Protocol

from . import protocol as P
from . import tools


class CallStream(Protocol):
    """The calls a growing text holds so far: (name, the arguments' JSON text so far, complete);
    each :meth:`update` must extend the text of the last one."""

    def update(self, text: str) -> list[tuple[str, str, bool]]: ...


class ToolParser(ABC):
    """How a model writes tool calls; subclasses registered by ``name`` (:data:`PARSERS`)."""

    name: str
    #: where the calls start: the content is the text before it
    opening: str

    def adjust_request(self, req: P.ChatCompletionRequest) -> None:
        """Changes a request whose text this parser will read (nothing by default)."""

    @abstractmethod
    def parse(self, text: str, req: P.ChatCompletionRequest) -> tuple[str | None, list[P.ToolCall]]:
        """(content, calls) of a finished text: no calls and all of it content where it holds
        none, or none of the parser's shape."""

    @abstractmethod
    def stream(self, req: P.ChatCompletionRequest) -> CallStream:
        """A reader of the calls of a text that grows."""

    def content_end(self, text: str, finished: bool) -> int:
        """How much of a streamed text is content that can be sent now."""
        return tools.tag_content_end(text, self.opening, finished)

    @staticmethod
    def new_call_id() -> str:
        """A new tool call's id, of the form the model's template takes back in later turns."""
        return tools.new_call_id()

    def _calls(self, found: list[tuple[str, str, bool]]) -> list[P.ToolCall]:
        return [P.ToolCall(id=self.new_call_id(), function=P.FunctionCall(name=n, arguments=a))
                for n, a, _ in found]


class Hermes(ToolParser):
    name = "hermes"
    opening = tools.HERMES_OPEN

    def parse(self, text, req):
        return tools.parse_hermes(text)

    def stream(self, req):
        return tools.HermesCallStream()


class Mistral(ToolParser):
    name = "mistral"
    opening = "[TOOL_CALLS]"

    def adjust_request(self, req):
        req.skip_special_tokens = False  # the marker is a special token

    @staticmethod
    def new_call_id() -> str:
        """Mistral's tool call ids are 9 letters or digits: its templates (and mistral_common)
        refuse any other id when the call comes back in the conversation, so the calls this
        server returns get such ids (as vLLM's ``MistralToolCall``)."""
        return "".join(secrets.choice(_ALNUM) for _ in range(9))

    def parse(self, text, req):
        start = text.find(self.opening)
        if start < 0:
            return text, []
        body = text[start + len(self.opening):]
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        objs = [obj] if isinstance(obj, dict) else obj
        if not isinstance(objs, list) or not objs or not all(
                isinstance(c, dict) and isinstance(c.get("name"), str) for c in objs):
            return text, []
        # the arguments as streaming sends them (an object as the model wrote it), unless the
        # stream reads them otherwise (a call without arguments)
        raw = [(n, a, done) for n, a, done in MistralCallStream().update(body) if done]
        want = [(c["name"], c.get("arguments", {})) for c in objs]
        if len(raw) != len(want) or any(
                n != wn or not _same_arguments(a, wa) for (n, a, _), (wn, wa) in zip(raw, want)):
            raw = [(n, _arguments_text(a), True) for n, a in want]
        content = text[:start]
        return (content if content.strip() else None), self._calls(raw)

    def stream(self, req):
        return _After(self.opening, MistralCallStream())


_ALNUM = string.ascii_letters + string.digits


class MistralCallStream(tools.RequiredCallStream):
    """:class:`tools.RequiredCallStream` over ``{"name", "arguments"}`` objects. Arguments
    that are not an object (a model may write them as a JSON string holding the object) go
    out once complete, as :func:`_arguments_text` gives them -- what the whole parse returns,
    so a stream does not send a string literal's quotes that the message does not have."""
    args_key = "arguments"

    def _close_object(self, text: str) -> bool:
        # a call without "arguments" has none: {} (what the whole parse gives it)
        if self.name is not None and self.params is None:
            self.done.append((self.name, "{}", True))
            self._new_object()
            self.i, self.state = self.i + 1, "after_object"
            return True
        return super()._close_object(text)

    def update(self, text: str) -> list[tuple[str, str, bool]]:
        out = []
        for name, args, done in super().update(text):
            if not args.startswith("{"):
                if not done:
                    break  # the last call, its value still being written
                try:
                    args = _arguments_text(json.loads(args))
                except json.JSONDecodeError:
                    break  # not JSON (nor is the whole text: no calls)
            out.append((name, args, done))
        return out


def _arguments_text(value: Any) -> str:
    """A call's arguments as a message gives them: a JSON string is taken as their text (as
    vLLM's parsers take it), any other value as its JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _same_arguments(text: str, value: Any) -> bool:
    """Whether streamed arguments ``text`` are the parsed ``value``'s."""
    if not isinstance(value, dict):
        return text == _arguments_text(value)
    try:
        return json.loads(text) == value
    except json.JSONDecodeError:
        return False


class _After:
    """A call stream over the text after the first ``tag`` (none before it)."""

    def __init__(self, tag: str, inner: CallStream) -> None:
        self.tag, self.inner, self.start = tag, inner, -1

    def update(self, text: str) -> list[tuple[str, str, bool]]:
        if self.start < 0:
            i = text.find(self.tag)
            if i < 0:
                return []
            self.start = i + len(self.tag)
        return self.inner.update(text[self.start:])


class Qwen3Coder(ToolParser):
    name = "qwen3_coder"
    opening = "<tool_call>"

    def parse(self, text, req):
        start = text.find(self.opening)
        if start < 0:
            return text, []
        found = Qwen3CoderCallStream(req).update(text, finished=True)
        if not found:
            return text, []
        content = text[:start]
        return (content if content.strip() else None), self._calls(found)

    def stream(self, req):
        return Qwen3CoderCallStream(req)


FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


class Qwen3CoderCallStream:
    """The calls of ``<tool_call><function=NAME><parameter=KEY>value</parameter>...</function>``
    blocks so far: a call once its name is written, its arguments the JSON object of the
    parameters read so far (``{"k": v, ...``, closed by ``}`` at ``</function>``), each value
    converted by :func:`convert_parameter`. A parameter counts once its ``</parameter>`` (or
    the next ``<parameter=``, or ``</function>``) is written; a value without a closing tag at
    the end of a finished text counts too, as vLLM's parser takes it. A text value (a string
    parameter, or one the tool does not declare: Qwen3-Coder writes whole files in them) goes
    out as it is written, its JSON string left open, less a tail that may be its last newline
    or the start of a closing tag. Each update reads the text from its start (a call's text is
    short next to the step that writes it)."""

    def __init__(self, req: P.ChatCompletionRequest | None) -> None:
        self.schemas = {t.function.name: (t.function.parameters or {})
                        for t in ((req.tools if req is not None else None) or [])}

    def update(self, text: str, finished: bool = False) -> list[tuple[str, str, bool]]:
        out: list[tuple[str, str, bool]] = []
        pos = text.find("<tool_call>")
        while pos >= 0:
            f = text.find(FUNCTION, pos)
            if f < 0:
                break
            name_end = text.find(">", f + len(FUNCTION))
            if name_end < 0:
                break
            name = text[f + len(FUNCTION):name_end].strip()
            end = text.find(FUNCTION_END, name_end)
            body = text[name_end + 1:end if end >= 0 else len(text)]
            done = end >= 0 or finished
            params, open_text = self._parameters(name, body, closed=done)
            pieces = [f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                      for k, v in params]
            if open_text is not None:  # a text value being written: its string left open
                k, v = open_text
                pieces.append(f"{json.dumps(k, ensure_ascii=False)}: "
                              f"{json.dumps(v, ensure_ascii=False)[:-1]}")
            out.append((name, "{" + ", ".join(pieces) + ("}" if done else ""), done))
            if end < 0:
                break
            pos = text.find("<tool_call>", end)
        return out

    def _parameters(self, name: str, body: str, closed: bool
                    ) -> tuple[list[tuple[str, Any]], tuple[str, str] | None]:
        """The parameters of a function's body whose values are complete, and the text value
        being written (key, its text so far) or None."""
        props = (self.schemas.get(name) or {}).get("properties") or {}
        out = []
        i = body.find(PARAMETER)
        while i >= 0:
            key_end = body.find(">", i + len(PARAMETER))
            if key_end < 0:
                break
            key = body[i + len(PARAMETER):key_end].strip()
            ends = [j for j in (body.find(PARAMETER_END, key_end), body.find(PARAMETER, key_end))
                    if j >= 0]
            if not ends and not closed:  # the value is still being written
                return out, self._open_text(key, body[key_end + 1:], props.get(key))
            stop = min(ends) if ends else len(body)
            value = body[key_end + 1:stop]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            out.append((key, convert_parameter(value, props.get(key))))
            i = body.find(PARAMETER, stop)
        return out, None

    @staticmethod
    def _open_text(key: str, value: str, schema: dict | None) -> tuple[str, str] | None:
        """A value being written, if it stays text (:func:`convert_parameter`): without its
        first newline, a last newline (it may be the one the closing tag takes) and a tail
        that may begin a closing tag."""
        if schema is not None and _schema_type(schema) != "string":
            return None
        value = value[1:] if value.startswith("\n") else value
        lt = value.rfind("<")
        if lt >= 0 and any(t.startswith(value[lt:]) for t in (PARAMETER_END, PARAMETER,
                                                                 FUNCTION_END)):
            value = value[:lt]
        return key, value[:-1] if value.endswith("\n") else value


def convert_parameter(value: str, schema: dict | None) -> Any:
    """A ``qwen3_coder`` parameter's text as its schema's type says (vLLM's conversions): a
    string stays text; integers, numbers and booleans are read as such; ``null`` is None; any
    other type (object, array, no type) is read as JSON. Text that does not read as its type
    stays text, and so does a parameter the tool does not declare."""
    if schema is None:
        return value
    t = _schema_type(schema)
    if value.strip().lower() == "null" and t != "string":
        return None
    if t == "string":
        return value
    try:
        if t == "integer":
            return int(value.strip())
        if t == "number":
            f = float(value.strip())
            return int(f) if f.is_integer() and "." not in value and "e" not in value.lower() else f
    except ValueError:
        return value
    if t == "boolean":
        v = value.strip().lower()
        return True if v == "true" else False if v == "false" else value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _schema_type(schema: dict) -> str | None:
    """A parameter schema's type (the first besides ``null`` of a list of them)."""
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t


#: ``--tool-call-parser`` choices
PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (Hermes, Mistral, Qwen3Coder)}


def get(name: str | None) -> ToolParser | None:
    if name is None:
        return None
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}: known: {', '.join(PARSERS)}")
    return PARSERS[name]()
