"""Tool calls on the chat endpoint (OpenAI's ``tools`` and ``tool_choice``), as vLLM's server
makes them:

- the tools go into the chat template (``tools=``, the template renders them as the model was
  trained to see them), unless ``tool_choice`` is ``"none"``; earlier turns' calls and the tools'
  answers go in as Hugging Face templates expect them (server/conversation.py);
- a named function (``{"type": "function", "function": {"name": ...}}``): the output is
  constrained to the function's parameters schema (structured outputs) and returned as one call
  whose arguments are the output;
- ``"required"``: the output is constrained to a JSON array of ``{"name", "parameters"}``
  objects, each one of the tools with its parameters, at least one (vLLM's schema), and
  returned as that many calls, finish reason ``tool_calls`` (one call at most with
  ``parallel_tool_calls: false``); each call's arguments are its parameters as the model wrote
  them, and streamed, its name goes out once written and its arguments as they come (an output
  cut short by ``max_tokens`` then ends as content, after the calls it had begun: not a
  complete array, it is content in the whole response too);
- ``"auto"`` (OpenAI's default when tools are given): the model decides, and a tool-call parser
  reads its text (``writescope serve --tool-call-parser hermes|mistral|qwen3_coder``,
  ``server/tool_parsers.py``). ``hermes``, whose functions are here, reads
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, the format of Hermes,
  Qwen2.5 and Qwen3; streamed, each call's name goes out once it is written and its arguments
  as they come (their JSON text as the model writes it, which is also what the whole response
  returns). Without a parser, ``"auto"`` with tools is refused, as vLLM refuses it without
  ``--enable-auto-tool-choice``.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any, Callable

from ..core import StructuredOutputsParams
from . import protocol as P

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES = re.compile(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(HERMES_CLOSE) + r"|$)",
                     re.DOTALL)


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _parameters(tool: P.ChatTool) -> dict:
    return tool.function.parameters or {"type": "object"}


#: where a schema keeps the definitions its ``$ref``s point at (``#/$defs/X``; draft 7's
#: ``#/definitions/X``, Pydantic v1's)
_DEFS_KEYS = ("$defs", "definitions")


def _hoist_defs(tool: P.ChatTool, defs: dict[str, dict[str, Any]]) -> dict:
    """A tool's parameters schema for the 'required' array, its definitions moved into
    ``defs`` (they go to the array schema's root, where the parameters' ``#/$defs/...``
    references then point, as vLLM does): a definition of the same name in two tools must be
    the same."""
    params = _parameters(tool)
    if not any(k in params for k in _DEFS_KEYS):
        return params
    params = dict(params)
    for key in _DEFS_KEYS:
        found = params.pop(key, None)
        if found is None:
            continue
        if not isinstance(found, dict):
            raise P.APIError(f"tools: the parameters of {tool.function.name!r}: {key} must be "
                             "an object", param="tools")
        into = defs.setdefault(key, {})
        for name, sub in found.items():
            if name in into and into[name] != sub:
                raise P.APIError(f"tools: {key} {name!r} differs between tools; with "
                                 "tool_choice 'required' the tools' definitions share one "
                                 "schema, so give them distinct names", param="tools")
            into[name] = sub
    return params


def constraint(req: P.ChatCompletionRequest) -> StructuredOutputsParams | None:
    """The structured-output constraint a forced tool call puts on the output, if any."""
    if not req.calls_tools:
        return None
    tools = req.tools or []
    if isinstance(req.tool_choice, P.NamedToolChoice):
        name = req.tool_choice.function.name
        return StructuredOutputsParams(json=_parameters(next(t for t in tools
                                                             if t.function.name == name)))
    defs: dict[str, dict[str, Any]] = {}
    items = [{"type": "object", "additionalProperties": False,
              "required": ["name", "parameters"],
              "properties": {"name": {"type": "string", "enum": [t.function.name]},
                             "parameters": _hoist_defs(t, defs)}} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    schema.update({k: v for k, v in defs.items() if v})
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return StructuredOutputsParams(json=schema)


def forced_calls(req: P.ChatCompletionRequest, text: str,
                 new_id: Callable[[], str] = new_call_id) -> list[P.ToolCall] | None:
    """The calls a forced output holds; None when a ``"required"`` output is not the complete
    array (cut short by ``max_tokens`` or a stop string: the message then holds the calls it
    had begun, as far as they were written, ``ChatOutput._calls_begun``, else its text). A
    ``"required"`` call's arguments are its ``parameters`` as the model wrote them (what
    streaming sends, :class:`RequiredCallStream`)."""
    if isinstance(req.tool_choice, P.NamedToolChoice):
        return [P.ToolCall(id=new_id(), function=P.FunctionCall(
            name=req.tool_choice.function.name, arguments=text))]
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(calls, list):
        return None
    calls = [c for c in calls if isinstance(c, dict) and isinstance(c.get("name"), str)
             and "parameters" in c]
    raw = RequiredCallStream().update(text)
    if [(n, json.loads(a)) for n, a, _ in raw] != [(c["name"], c["parameters"]) for c in calls]:
        raw = [(c["name"], json.dumps(c["parameters"], ensure_ascii=False), True) for c in calls]
    return [P.ToolCall(id=new_id(), function=P.FunctionCall(name=n, arguments=a))
            for n, a, _ in raw]


# a block's head up to the start of its arguments: {"name": "...", "arguments":
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class JsonValueScan:
    """Finds where a JSON value that starts at ``start`` ends, in a text that only grows:
    each :meth:`end` call scans only what was added since the last one."""

    def __init__(self, start: int) -> None:
        self.start = self.j = start
        self.depth, self.in_str, self.esc = 0, False, False
        self.done: int | None = None

    def end(self, text: str) -> int | None:
        """The index after the value, or None while the text ends inside it."""
        while self.done is None and self.j < len(text):
            self._step(text[self.j])
            self.j += 1
        return self.done

    def _step(self, ch: str) -> None:
        j = self.j
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                if self.depth == 0:
                    self.done = j + 1
        elif ch == '"':
            self.in_str = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            if self.depth == 0:
                self.done = j  # a number / literal closed by the object around it
                return
            self.depth -= 1
            if self.depth == 0:
                self.done = j + 1
        elif self.depth == 0 and j > self.start and ch in ", \t\r\n":
            self.done = j


def json_value_end(text: str, i: int) -> int | None:
    """Where the JSON value starting at ``text[i]`` ends (the index after it), or None when
    the text ends inside it."""
    return JsonValueScan(i).end(text)


class HermesCallStream:
    """The calls a streamed text holds so far, for streaming them: (name, the arguments' JSON
    text so far, complete), each from a block whose head is ``{"name": "...", "arguments":``
    followed by an object; the first block not (yet) of that shape ends the list. As the text
    grows (each :meth:`update` must extend the last one's), names stay and arguments only
    grow; finished blocks and the open one's scan are kept, so a long argument is read once."""

    def __init__(self) -> None:
        self.done: list[tuple[str, str, bool]] = []
        self.pos = 0                       # where to look for the next block
        self.open: tuple[str, int, JsonValueScan] | None = None  # name, args start, scan

    def update(self, text: str) -> list[tuple[str, str, bool]]:
        while True:
            if self.open is None:
                pos = text.find(HERMES_OPEN, self.pos)
                if pos < 0:
                    break
                m = _HEAD.match(text, pos + len(HERMES_OPEN))
                if m is None or m.end() >= len(text) or text[m.end()] != "{":
                    break  # not (yet) a head followed by an object: look again next time
                try:
                    name = json.loads('"' + m.group(1) + '"')
                except json.JSONDecodeError:
                    break
                self.open = (name, m.end(), JsonValueScan(m.end()))
            name, a, scan = self.open
            end = scan.end(text)
            if end is None:
                return self.done + [(name, text[a:], False)]
            self.done.append((name, text[a:end], True))
            self.open, self.pos = None, end
        return list(self.done)


class RequiredCallStream:
    """The calls a streamed ``"required"`` output holds so far -- a JSON array of
    ``{"name": ..., "parameters": {...}}`` objects (:func:`constraint`) --, as (name, the
    parameters' JSON text so far, complete): an object is listed once its name is read and its
    parameters have started, whatever the order of its keys (parameters written before the
    name are listed whole). As the text grows (each :meth:`update` must extend the last one's),
    each value is scanned once; text that is not such an array ends the list where it starts.
    (``args_key``: the key of the arguments; the ``mistral`` parser's subclass reads
    ``arguments``, ``server/tool_parsers.py``.)"""

    args_key = "parameters"

    def __init__(self) -> None:
        self.done: list[tuple[str, str, bool]] = []
        self.i = 0
        self.state = "array"
        self._new_object()

    def _new_object(self) -> None:
        self.name: str | None = None
        self.params: tuple[int, int | None] | None = None  # the parameters' start and end
        self.key: str | None = None
        self.scan: JsonValueScan | None = None  # the key or value being read

    def update(self, text: str) -> list[tuple[str, str, bool]]:
        n = len(text)
        while self.i < n and self.state != "end":
            if self.scan is None and text[self.i] in " \t\r\n":
                self.i += 1
                continue
            if not self._step(text, text[self.i]):
                break
        out = list(self.done)
        if self.name is not None and self.params is not None and self.state != "end":
            a, b = self.params
            out.append((self.name, text[a:n if b is None else b], False))
        return out

    def _step(self, text: str, ch: str) -> bool:
        """Reads on from ``self.i``; False where the text ends inside a value or is not of the
        array's shape."""
        st = self.state
        if st == "array":
            return self._expect(ch, "[", "element")
        if st == "element":  # an object, or the end of an empty array
            if ch == "]":
                self.state = "end"
                return True
            return self._expect(ch, "{", "key")
        if st == "key":  # a key, or the end of the object
            if ch == "}":
                return self._close_object(text)
            if ch != '"' and self.scan is None:
                return False
            self.scan = self.scan or JsonValueScan(self.i)
            end = self.scan.end(text)
            if end is None:
                return False
            self.key, self.scan = json.loads(text[self.i:end]), None
            self.i, self.state = end, "colon"
            return True
        if st == "colon":
            return self._expect(ch, ":", "value")
        if st == "value":
            if self.scan is None:
                self.scan = JsonValueScan(self.i)
                if self.key == self.args_key:
                    self.params = (self.i, None)
            end = self.scan.end(text)
            if end is None:
                return False
            value, self.scan = text[self.i:end], None
            if self.key == "name":
                try:
                    name = json.loads(value)
                except json.JSONDecodeError:
                    return False
                self.name = name if isinstance(name, str) else None
            elif self.key == self.args_key:
                self.params = (self.params[0], end)
            self.i, self.state = end, "after_value"
            return True
        if st == "after_value":
            if ch == "}":
                return self._close_object(text)
            return self._expect(ch, ",", "key")
        # after an object
        if ch == "]":
            self.state = "end"
            return True
        return self._expect(ch, ",", "element")

    def _expect(self, ch: str, want: str, then: str) -> bool:
        if ch != want:
            return False
        self.i, self.state = self.i + 1, then
        return True

    def _close_object(self, text: str) -> bool:
        if self.name is not None and self.params is not None and self.params[1] is not None:
            a, b = self.params
            self.done.append((self.name, text[a:b], True))
        self._new_object()
        self.i, self.state = self.i + 1, "after_object"
        return True


def hermes_partial_calls(text: str) -> list[tuple[str, str, bool]]:
    """:class:`HermesCallStream` over one text."""
    return HermesCallStream().update(text)


def _raw_arguments(body: str, args: Any) -> str:
    """A block's arguments as the model wrote them (what streaming sends), where they are an
    object right after the name; else as JSON."""
    m = _HEAD.match(body)
    if isinstance(args, dict) and m is not None and body[m.end():m.end() + 1] == "{":
        end = json_value_end(body, m.end())
        if end is not None:
            return body[m.end():end]
    return json.dumps(args, ensure_ascii=False)


def _hermes_bodies(text: str, start: int) -> list[str]:
    """The text of each ``<tool_call>`` block from ``start`` on. A block whose body is a JSON
    value followed by ``</tool_call>`` (or the end of the text) ends after that value, so a
    string in its arguments may hold ``</tool_call>`` (what :class:`HermesCallStream` reads);
    from the first block that is not of that shape on, a block ends at the first
    ``</tool_call>`` (vLLM's regex)."""
    bodies, pos = [], start
    while pos >= 0:
        body = pos + len(HERMES_OPEN)
        while body < len(text) and text[body].isspace():
            body += 1
        end = json_value_end(text, body) if text[body:body + 1] in ("{", "[") else None
        if end is None:
            break
        after = end
        while after < len(text) and text[after].isspace():
            after += 1
        if after == len(text):
            bodies.append(text[body:end])
            return bodies
        if not text.startswith(HERMES_CLOSE, after):
            break
        bodies.append(text[body:end])
        pos = text.find(HERMES_OPEN, after + len(HERMES_CLOSE))
    return bodies + (_HERMES.findall(text[pos:]) if pos >= 0 else [])


def parse_hermes(text: str) -> tuple[str | None, list[P.ToolCall]]:
    """(content, calls) of a model's text in the Hermes format: the text before the first
    ``<tool_call>`` is the content; each block's JSON ``{"name", "arguments"}`` a call. A block
    that is not such JSON leaves the whole text as content (no calls), as vLLM's parser does."""
    start = text.find(HERMES_OPEN)
    if start < 0:
        return text, []
    calls = []
    for body in _hermes_bodies(text, start):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(P.ToolCall(id=new_call_id(), function=P.FunctionCall(
            name=obj["name"], arguments=args if isinstance(args, str)
            else _raw_arguments(body, args))))
    content = text[:start]
    return (content if content.strip() else None), calls


def tag_content_end(text: str, tag: str, finished: bool) -> int:
    """How much of a streamed text is content that can be sent: all before ``tag``, less a tail
    that may be the start of one (until the output finishes)."""
    i = text.find(tag)
    if i >= 0:
        return i
    if finished:
        return len(text)
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return len(text) - k
    return len(text)
