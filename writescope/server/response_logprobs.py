"""The log-probabilities of a response's output text (``include:
["message.output_text.logprobs"]``, ``top_logprobs`` alternatives a token): the tokens that
wrote the message's text -- not the reasoning's before it, nor a tool call's after it -- each as
the chat endpoint's logprob (``token``, ``bytes``, ``logprob``, ``top_logprobs``; OpenAI's
``Logprob`` of an ``output_text`` part), or without the bytes as the streamed
``response.output_text.delta`` events give them.

A token belongs to the message where its characters (its own bytes, server/token_bytes.py)
overlap the message's text in the choice's text; a token that writes no character alone (the
first bytes of a character split over tokens) belongs where its character starts. The
message's text is found after the reasoning's, so a stream, which asks as the text grows,
gives the same tokens in its deltas as the whole response."""
from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from .token_bytes import CharOffsets

if TYPE_CHECKING:
    from .api import OpenAIServer
    from .generation import Choice


class TextLogprobs:
    """One choice's output-text log-probabilities, whole or as they come."""

    def __init__(self, server: "OpenAIServer", c: "Choice", top: int, skip: bool) -> None:
        self.server, self.c, self.top, self.skip = server, c, top, skip
        self.as_ids = server.return_tokens_as_token_ids
        self._at = CharOffsets()
        self.starts: list[int] = []  # each token's first character in the choice's text
        self.ends: list[int] = []    # and the character after its last
        self.sent = 0  # tokens given to deltas so far

    def _spans(self) -> None:
        tb = self.server.token_bytes
        for tid in self.c.token_ids[len(self.starts):]:
            self.starts.append(self._at.add(tb.bytes(tid, self.skip)))
            self.ends.append(self._at.chars)

    def tokens(self, reasoning: str, content: str) -> range:
        """The tokens that wrote ``content`` (the message's text so far), found in the choice's
        text after ``reasoning`` (its reasoning so far)."""
        text = self.c.text
        after = text.find(reasoning) + len(reasoning) if reasoning else 0
        a = text.find(content, after) if content else -1
        if a < 0:
            return range(0)
        b = a + len(content)
        self._spans()
        # the tokens with s < b and e > a, or s == e in [a, b): one run, since starts and ends
        # never decrease (bisection: a stream asks at every delta)
        i = bisect_left(self.ends, a)
        while i < len(self.ends) and self.ends[i] == a and self.starts[i] < a:
            i += 1  # ends where the message starts
        j = bisect_left(self.starts, b)  # the first token at or after the message's end
        return range(i, j) if i < j else range(0)

    def entries(self, span: range, with_bytes: bool = True) -> list[dict]:
        """Tokens ``span``'s logprobs: OpenAI's ``Logprob`` of an ``output_text`` part, or
        without ``bytes`` (``with_bytes`` false) a text delta event's."""
        if not span:
            return []
        lps = self.server._chat_logprobs(self.c, span.start, span.stop, self.top, self.skip,
                                         self.as_ids).content
        out = []
        for lp in lps:
            d = lp.model_dump()
            if not with_bytes:
                d.pop("bytes")
                for alt in d["top_logprobs"]:
                    alt.pop("bytes")
            out.append(d)
        return out

    def whole(self, reasoning: str, content: str, with_bytes: bool = True) -> list[dict]:
        """The finished message's log-probabilities."""
        return self.entries(self.tokens(reasoning, content), with_bytes)

    def delta(self, reasoning: str, content: str) -> list[dict]:
        """A text delta's: the message's tokens not given to an earlier delta."""
        span = self.tokens(reasoning, content)
        new = range(max(span.start, self.sent), span.stop)
        self.sent = max(self.sent, span.stop)
        return self.entries(new, with_bytes=False)
