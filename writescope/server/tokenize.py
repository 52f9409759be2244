"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's endpoints, also llama.cpp server's):
count a prompt's tokens before sending it, see how the model's chat template renders a
conversation, turn token ids back into text.

``/tokenize`` takes ``{"prompt": "..."}`` (``add_special_tokens``, default true) or
``{"messages": [...]}`` with the chat endpoint's template options (``add_generation_prompt``,
default true, ``continue_final_message``, ``chat_template_kwargs``, ``chat_template`` (with
--trust-request-chat-template), ``documents``, ``add_special_tokens``, default false, ``tools``)
and answers
``{"count", "max_model_len", "tokens"}`` (and ``token_strs`` with ``return_token_strs``);
``/detokenize`` takes ``{"tokens": [...]}`` and answers ``{"prompt": "..."}``: the tokenizer's
decode, special tokens kept (vLLM's).
"""
from __future__ import annotations

import json
from typing import Any, ClassVar, Optional

from pydantic import Field

from . import conversation
from . import protocol as P


class TokenizeCompletionRequest(P._Strict):
    #: what a wrong type is told (not the completions endpoint's prompt types)
    union_hints: ClassVar[dict[str, str]] = {
        "prompt": "must be a string (/tokenize takes a prompt string, or messages)"}

    model: Optional[str] = None
    prompt: str
    add_special_tokens: Optional[bool] = True
    return_token_strs: Optional[bool] = False


class TokenizeChatRequest(P.ChatTemplateFields):
    model: Optional[str] = None
    tools: Optional[list[P.ChatTool]] = Field(None, max_length=128)
    return_token_strs: Optional[bool] = False


class DetokenizeRequest(P._Strict):
    model: Optional[str] = None
    tokens: list[int]


def _parse(body: bytes) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """A prompt or a conversation, by the body's keys (exactly one of the two)."""
    try:
        keys = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        keys = None  # parse_request names the error
    if isinstance(keys, dict) and ("prompt" in keys) == ("messages" in keys):
        raise P.APIError("give either prompt or messages", param="prompt" if keys else None)
    chat = isinstance(keys, dict) and "messages" in keys
    return P.parse_request(TokenizeChatRequest if chat else TokenizeCompletionRequest, body)


async def tokenize(server: Any, request) -> dict:
    server.check_auth(request)
    req = _parse(await server.read_body(request))
    server.check_model(req.model)
    tok = server.tokenizer
    if tok is None:
        raise P.APIError("this model has no tokenizer", param="model")
    if isinstance(req, TokenizeChatRequest):
        server.check_chat_template(req)
        heavy = conversation.text_size(req) > 4096
        ids = await server.off_loop(lambda: conversation.prompt_ids(tok, req), heavy)
    else:
        heavy = len(req.prompt) > 4096
        ids = list(await server.off_loop(
            lambda: tok.encode(req.prompt, add_special_tokens=bool(req.add_special_tokens)),
            heavy))
    out = {"count": len(ids), "max_model_len": server.max_model_len, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = [server.token_str(t) for t in ids]
    return out


async def detokenize(server: Any, request) -> dict:
    server.check_auth(request)
    req = P.parse_request(DetokenizeRequest, await server.read_body(request))
    server.check_model(req.model)
    if server.tokenizer is None:
        raise P.APIError("this model has no tokenizer", param="model")
    server.check_ids(req.tokens, "tokens")
    # the tokenizer's decode as vLLM calls it: special tokens kept (a conversation's ids from
    # /tokenize read back as its rendered prompt)
    return {"prompt": server.tokenizer.decode(req.tokens, skip_special_tokens=False)}
