"""Reasoning parsers (``writescope serve --reasoning-parser NAME``, vLLM's option): a thinking
model writes its reasoning between ``<think>`` and ``</think>`` before the answer; the chat
endpoint returns the reasoning as the message's ``reasoning_content`` (DeepSeek's and vLLM's
field) and the answer after it as ``content`` -- where tool calls are looked for, and where a
``response_format`` or a forced tool call applies: after ``</think>``
(``StructuredOutputsParams.starts_after``) where the output is reasoning from its start
(``deepseek_r1``, or a prompt that opened it); with ``qwen3`` otherwise from the first token,
unless the output opens ``<think>`` (``layers.grammar.MayThinkFirst``).

- ``deepseek_r1``: the output is reasoning until ``</think>`` (a leading ``<think>`` dropped: the
  model may write it or the template may have); without ``</think>`` it is all reasoning.
- ``qwen3``: the output is reasoning when it starts with ``<think>`` or the prompt ends inside an
  open ``<think>`` (templates that start the thinking, Qwen3-Thinking-2507's); otherwise (a
  prompt that closes thinking, as Qwen3's ``enable_thinking: false`` does) all content.

A split is a pure function of the text so far, so the streamed pieces are the final message cut
up: while the output runs, a tail that may be the start of a tag is held back.
"""
from __future__ import annotations

from abc import ABC
from typing import ClassVar


def _partial_tail(text: str, tag: str) -> int:
    """Characters at the end of ``text`` that are a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningParser(ABC):
    """How a model marks its reasoning; subclasses registered by ``name`` (:data:`PARSERS`)."""

    name: ClassVar[str]
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    #: the output is reasoning from its first token, whatever the prompt's end
    always_opens: ClassVar[bool] = False

    def opened(self, prompt_tail: str) -> bool:
        """Whether the output begins inside the reasoning, given the prompt's last characters."""
        return self.always_opens or prompt_tail.rstrip().endswith(self.start)

    def may_reason(self, prompt_tail: str) -> bool:
        """Whether the output may hold reasoning: not when the prompt closed it (a template's
        empty ``<think></think>``, thinking switched off)."""
        return self.always_opens or not prompt_tail.rstrip().endswith(self.end)

    def split(self, text: str, opened: bool, finished: bool) -> tuple[str | None, str]:
        """(reasoning, content) of ``text``: reasoning None where the output has none; leading
        whitespace of both dropped. While not ``finished``, text that may turn into a tag is in
        neither yet."""
        opened = opened or self.always_opens
        body = text.lstrip()
        if body.startswith(self.start):
            opened, text = True, body[len(self.start):]
        elif not finished and self.start.startswith(body):
            return ("" if opened else None), ""  # may be <think>: wait
        if not opened:
            return None, text.lstrip()
        i = text.find(self.end)
        if i >= 0:
            return text[:i].lstrip(), text[i + len(self.end):].lstrip()
        if not finished:
            text = text[:len(text) - _partial_tail(text, self.end)]
        return text.lstrip(), ""


class DeepSeekR1(ReasoningParser):
    name = "deepseek_r1"
    always_opens = True


class Qwen3(ReasoningParser):
    name = "qwen3"


#: ``--reasoning-parser`` choices
PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (DeepSeekR1, Qwen3)}


def get(name: str | None) -> ReasoningParser | None:
    if name is None:
        return None
    if name not in PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}: choose from {', '.join(PARSERS)}")
    return PARSERS[name]()
