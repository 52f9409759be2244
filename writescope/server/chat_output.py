"""What a chat choice's text becomes: the reasoning split off (server/reasoning.py, with
``--reasoning-parser``), the content read for tool calls (server/tools.py) and, with ``echo``,
prefixed by the last message's text -- as one message when the choice ends, or as deltas while
it streams. The deltas are the final message cut up: each piece is computed from the text sent
so far, so a stream and a whole response of the same tokens say the same."""
from __future__ import annotations

from typing import Any, Callable

from . import protocol as P
from . import tools
from .reasoning import ReasoningParser
from .tool_parsers import ToolParser


class ChatOutput:
    """One chat request's choices, from text to messages or deltas. ``mode``: how the output
    relates to tools -- None (plain text), ``"forced"`` (a named function or 'required') or
    ``"auto"`` (``tool_parser`` reads the text, ``server/tool_parsers.py``); ``parser``: the
    reasoning parser, and ``prompt_tail`` the prompt's last characters (where a template opens
    or closes the model's thinking)."""

    def __init__(self, req: P.ChatCompletionRequest, mode: str | None,
                 parser: ReasoningParser | None = None, prompt_tail: str = "",
                 tool_parser: ToolParser | None = None,
                 new_call_id: Callable[[], str] | None = None) -> None:
        if mode == "auto" and tool_parser is None:
            raise ValueError("tool_choice 'auto' needs a tool-call parser")
        self.req, self.mode, self.parser = req, mode, parser
        self.tool_parser = tool_parser
        #: makes the calls' ids: the server's tool-call parser's form (Mistral's 9 characters),
        #: else OpenAI's
        self.new_call_id = new_call_id or (tool_parser.new_call_id if tool_parser is not None
                                           else tools.new_call_id)
        #: whether the output starts inside the reasoning
        self.opened = parser is not None and parser.opened(prompt_tail)
        #: whether the output may hold reasoning (a constraint on it then starts after it)
        self.may_reason = parser is not None and parser.may_reason(prompt_tail)
        self.named = mode == "forced" and isinstance(req.tool_choice, P.NamedToolChoice)
        self.call_id: dict[int, str] = {}
        self.reasoning_sent: dict[int, int] = {}
        self.content_seen: dict[int, int] = {}  # content characters handed to the tool logic
        self.content_sent: dict[int, int] = {}  # 'auto': content characters sent as content
        #: 'auto': per choice, the calls streamed so far: [id, arguments sent], and the
        #: scanner reading them out of the growing content
        self.calls_sent: dict[int, list[list[str]]] = {}
        self.call_scans: dict[int, Any] = {}  # tool_parsers.CallStream

    def parts(self, text: str, finished: bool) -> tuple[str | None, str]:
        """(reasoning or None, content) of a choice's text."""
        if self.parser is None:
            return None, text
        return self.parser.split(text, self.opened, finished)

    # -- a whole message -------------------------------------------------------------------------
    def message(self, c: Any, echo: bool = True) -> tuple[P.ChatResponseMessage, str | None]:
        """A finished choice's message and finish reason (``tool_calls`` where the model chose
        to call tools or had to list them, as OpenAI's)."""
        reasoning, content = self.parts(c.text, True)
        msg, reason = self._content_message(content, c.finish_reason)
        msg.reasoning_content = reasoning if self.req.include_reasoning is not False else None
        if reasoning is not None and not msg.content:
            msg.content = None  # all thinking (cut short by max_tokens), or calls only
        head = self.req.echoed() if echo else ""
        if head:
            msg.content = head + (msg.content or "")
        return msg, reason

    def _content_message(self, text: str, finish_reason: str | None
                         ) -> tuple[P.ChatResponseMessage, str | None]:
        if self.mode == "forced":
            if not text.strip():  # nothing after the reasoning (cut short): no call
                return P.ChatResponseMessage(content=text), finish_reason
            calls = tools.forced_calls(self.req, text, self.new_call_id)
            if calls is None:  # cut short: the calls as far as they were written, if any
                calls = self._calls_begun(text)
                if not calls:
                    return P.ChatResponseMessage(content=text), finish_reason
                return P.ChatResponseMessage(content=None, tool_calls=calls), finish_reason
            named = isinstance(self.req.tool_choice, P.NamedToolChoice)
            reason = finish_reason if named or finish_reason != "stop" else "tool_calls"
            return P.ChatResponseMessage(content=None, tool_calls=calls), reason
        if self.mode == "auto":
            content, calls = self.tool_parser.parse(text, self.req)
            calls = self._parallel(calls)
            if calls:
                reason = "tool_calls" if finish_reason == "stop" else finish_reason
                return P.ChatResponseMessage(content=content, tool_calls=calls), reason
            # a call cut short (max_tokens; abort): the content before it, and the call as
            # written. An output that ended by itself (EOS, a stop string) with a call that
            # does not parse is all content, as vLLM's parsers return it. (Streamed, the
            # call's name and arguments may have gone out already as tool_calls deltas,
            # which cannot be taken back; the stream then ends with the call's text as
            # content and finish reason "stop", not "tool_calls", as the message does.)
            calls = self._calls_begun(text) if finish_reason in ("length", "abort") else []
            if calls:
                content = text[:self.tool_parser.content_end(text, True)]
                return P.ChatResponseMessage(content=content if content.strip() else None,
                                             tool_calls=calls), finish_reason
        return P.ChatResponseMessage(content=text), finish_reason

    def _calls_begun(self, text: str) -> list[P.ToolCall]:
        """The calls an output that ended before they were complete (``max_tokens``; with
        'required', a stop string too) had begun: each whose name was written, with its
        arguments as far as they got -- what its stream sent. (OpenAI's message keeps such a
        call, cut, with finish reason ``length``.)"""
        scan = (self.tool_parser.stream(self.req) if self.mode == "auto"
                else tools.RequiredCallStream())
        return self._parallel([P.ToolCall(id=self.new_call_id(),
                                          function=P.FunctionCall(name=n, arguments=a))
                               for n, a, _ in scan.update(text)])

    def _parallel(self, calls: list) -> list:
        """The calls a message may hold: the first alone with ``parallel_tool_calls: false``
        (OpenAI's: at most one call; vLLM keeps the first). 'required' has it from its schema
        (``maxItems``); 'auto' reads what the model wrote, which may be several."""
        return calls[:1] if self.req.parallel_tool_calls is False else calls

    # -- a stream --------------------------------------------------------------------------------
    def delta(self, c: Any) -> tuple[P.ChatDelta | None, str | None]:
        """What choice ``c`` sends now (None: nothing) and its finish reason once it ended: the
        new reasoning, then the new content (plain; a named function's arguments as they come;
        with 'auto', the content before the first tool-call tag as it comes; 'required' and
        'auto' calls each with its name once written and its arguments as they come)."""
        i = c.index
        if self.parser is None and (self.mode is None or self.named):  # only the new text
            seen = self.content_seen.get(i, 0)
            self.content_seen[i] = c.sent_text
            return self._content_delta(c, c.text if c.finished else "",
                                       c.text[seen:c.sent_text])
        reasoning, content = self.parts(c.text[:c.sent_text], c.finished)
        new_reasoning = (reasoning or "")[self.reasoning_sent.get(i, 0):]
        self.reasoning_sent[i] = len(reasoning or "")
        piece = content[self.content_seen.get(i, 0):]
        self.content_seen[i] = len(content)
        d, reason = self._content_delta(c, content, piece)
        if new_reasoning and self.req.include_reasoning is not False:
            d = d or P.ChatDelta()
            d.reasoning_content = new_reasoning
        return d, reason

    def _content_delta(self, c: Any, content: str, piece: str
                       ) -> tuple[P.ChatDelta | None, str | None]:
        if self.mode is None:
            return (P.ChatDelta(content=piece) if piece else None), c.finish_reason
        if self.named:
            if not piece:
                return None, c.finish_reason
            first = c.index not in self.call_id
            if first:
                self.call_id[c.index] = self.new_call_id()
            cid = self.call_id[c.index]
            fn = P.DeltaFunctionCall(name=self.req.tool_choice.function.name if first else None,
                                     arguments=piece)
            return P.ChatDelta(tool_calls=[P.DeltaToolCall(
                index=0, id=cid if first else None, type="function" if first else None,
                function=fn)]), c.finish_reason
        sent = self.content_sent.get(c.index, 0)
        out = ""
        streamed = self.calls_sent.setdefault(c.index, [])
        calls: list[P.DeltaToolCall] = []
        if self.mode == "auto":  # content before the first tool-call tag, as it comes
            end = self.tool_parser.content_end(content, c.finished)
            out = content[sent:end] if end > sent else ""
            self.content_sent[c.index] = sent = max(sent, end)
        if not c.finished:
            # each call's name once written, its arguments as they come ('auto': as the tool
            # parser reads them; 'required': out of the array of calls)
            scan = self.call_scans.get(c.index)
            if scan is None:
                scan = self.call_scans[c.index] = (self.tool_parser.stream(self.req)
                                                   if self.mode == "auto"
                                                   else tools.RequiredCallStream())
            for k, (name, args, _) in enumerate(self._parallel(scan.update(content))):
                calls += self._call_delta(streamed, k, name, args)
            if not out and not calls:
                return None, None
            return P.ChatDelta(content=out or None, tool_calls=calls or None), None
        message, reason = self.message(c, echo=False)
        if not message.tool_calls:  # no call was begun: the rest is content
            rest = content[sent:] if self.mode == "auto" else content
            return (P.ChatDelta(content=out + rest) if out + rest else None), reason
        for k, t in enumerate(message.tool_calls):
            calls += self._call_delta(streamed, k, t.function.name, t.function.arguments, t.id)
        return P.ChatDelta(content=out or None, tool_calls=calls or None), reason

    def _call_delta(self, streamed: list[list[str]], k: int, name: str, args: str,
                    call_id: str | None = None) -> list[P.DeltaToolCall]:
        """Call ``k``'s delta: its id, name and arguments so far the first time, then the
        arguments' new text (none where they are not a continuation of what was sent)."""
        if k >= len(streamed):
            streamed.append([call_id or self.new_call_id(), args])
            return [P.DeltaToolCall(index=k, id=streamed[k][0], type="function",
                                    function=P.DeltaFunctionCall(name=name, arguments=args))]
        before = streamed[k][1]
        if len(args) <= len(before) or not args.startswith(before):
            return []
        streamed[k][1] = args
        return [P.DeltaToolCall(index=k, function=P.DeltaFunctionCall(
            arguments=args[len(before):]))]
