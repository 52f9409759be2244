"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's endpoints, also llama.cpp server's):
count a prompt's tokens before sending it, see how the model's chat template renders a
conversation, turn token ids back into text.

``/tokenize`` takes ``{"prompt": "..."}`` (``add_special_tokens``, default true) or
``{"messages": [...]}`` (``add_generation_prompt``, default true) and answers
``{"count", "max_model_len", "tokens"}`` (and ``token_strs`` with ``return_token_strs``);
``/detokenize`` takes ``{"tokens": [...]}`` and answers ``{"prompt": "..."}``.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, model_validator

from . import protocol as P


class TokenizeRequest(P._Strict):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[P.ChatMessage]] = Field(None, min_length=1)
    add_special_tokens: Optional[bool] = True
    add_generation_prompt: Optional[bool] = True
    return_token_strs: Optional[bool] = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(P._Strict):
    model: Optional[str] = None
    tokens: list[int]


async def tokenize(server: Any, request) -> dict:
    server.check_auth(request)
    req = P.parse_request(TokenizeRequest, await server.read_body(request))
    server.check_model(req.model)
    tok = server.tokenizer
    if tok is None:
        raise P.APIError("this model has no tokenizer", param="model")
    if req.messages is not None:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in req.messages]
        try:
            ids = list(tok.apply_chat_template(
                messages, add_generation_prompt=bool(req.add_generation_prompt)))
        except Exception as e:  # noqa: BLE001 -- the template's own error, or a bad turn
            raise P.APIError(f"cannot apply the model's chat template to these messages: {e}",
                             param="messages") from None
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
    return {"prompt": server.tokenizer.decode(req.tokens)}
