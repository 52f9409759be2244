"""A chat request's conversation as prompt ids: the messages as Hugging Face chat templates take
them (earlier turns' tool calls with their arguments as objects, the tools' answers with the
call they answer), the tools the template renders, and the request's template options
(``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``). Shared by
``/v1/chat/completions`` and ``/tokenize``, so that a client counting a conversation's tokens
gets the prompt the chat endpoint would run."""
from __future__ import annotations

import json
import logging
from typing import Any

from . import protocol as P

log = logging.getLogger("writescope.server")


def _arguments(text: str | dict) -> Any:
    """A call's arguments for a template: the object its JSON text holds (the text itself when
    it is not JSON; an object given as one, as vLLM takes it); none written (``""``, or
    ``null``: a call without arguments, as clients that join streamed deltas may send it) is an
    empty object, as vLLM takes it, so that a template writing ``"arguments": {{ arguments |
    tojson }}`` or the text as it is renders valid JSON."""
    if isinstance(text, dict):
        return text
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return {} if value is None else value


def template_messages(req: P.ChatTemplateFields) -> list[dict]:
    """The request's messages as the chat template takes them."""
    out = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                               "content": m.text()}
        if m.name:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name,
                                               "arguments": _arguments(c.function.arguments)}}
                                 for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        thought = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        if m.role == "assistant" and thought is not None:
            # both names, as vLLM passes them: a template reads one or the other
            msg["reasoning_content"] = msg["reasoning"] = thought
        out.append(msg)
    return out


def template_tools(req: P.ChatTemplateFields) -> list[dict] | None:
    """The tools the template renders (none when ``tool_choice`` is ``"none"``)."""
    tools = getattr(req, "tools", None)
    if not tools or getattr(req, "tool_choice", None) == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in tools]


def text_size(req: P.ChatTemplateFields) -> int:
    """Characters of message text: how heavy rendering and tokenising the conversation is."""
    return sum(len(m.text()) for m in req.messages)


def prompt_ids(tokenizer: Any, req: P.ChatTemplateFields) -> list[int]:
    """The conversation's prompt ids; a template that rejects the conversation (its own
    ``raise_exception``, a turn it cannot render, ``continue_final_message`` after a turn it
    closes anyway) is a 400 naming the template's reason."""
    try:
        return list(tokenizer.apply_chat_template(template_messages(req),
                                                  tools=template_tools(req),
                                                  **req.template_options()))
    except Exception as e:  # noqa: BLE001 -- a template's own raise_exception or a bad turn
        log.info("chat template rejected a request: %s", e)
        raise P.APIError(f"cannot apply the model's chat template to these messages: {e}",
                         param="messages") from None
