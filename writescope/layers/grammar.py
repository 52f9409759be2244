"""Structured outputs: a JSON schema, a regex, a choice or a grammar masks the tokens a request
may sample (``SamplingParams.structured_outputs``).

The grammar engine is llguidance (the Rust core of Microsoft's guidance, one of vLLM's
structured-output backends): given the tokenizer, a matcher per request computes, before each
step, the bitmask of the tokens that can continue a text matching the grammar, and consumes the
token sampled. Here the bitmasks of a step's constrained rows are computed together on the host
(in parallel for several rows), unpacked on the logits' device and applied after the logits
processors: a masked token's score is -inf, so greedy and sampled rows alike pick an allowed
token. Log-probabilities stay the model's own (as the rest of the sampler's). A request ends
when its matcher has nothing more to accept (``is_stopped``: the JSON value is closed, the regex
cannot grow), without waiting for the model to choose EOS. A constraint with ``starts_after``
(a reasoning model's ``</think>``) waits: its request samples freely until its text contains
that string, and the matcher takes the tokens after it (vLLM's structured outputs with a
reasoning parser).

Grammars are compiled once per distinct constraint (a matcher in its start state, cached; each
request gets a copy), and the tokenizer is converted once per engine, on the first constrained
request (about a second for a 150K-token vocabulary).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from ..core import InvalidRequestError, StructuredOutputsParams

log = logging.getLogger(__name__)

#: compiled constraints kept (a matcher in its start state each)
CACHE_SIZE = 64


@dataclass
class MayThinkFirst(StructuredOutputsParams):
    """A constraint on a model that may think before it answers, or not (Qwen3 with thinking
    on: the output opens ``<think>`` or is all answer, as the ``qwen3`` reasoning parser reads
    it): the output's first text that is not whitespace decides. Where it is ``opens_with``
    (``"<think>"``), the constraint waits for ``starts_after`` (``"</think>"``); otherwise it
    holds from the first token. The first tokens may be the grammar's or ones that write
    ``opens_with`` (whitespace before it within the token); while they write a part of the
    tag that the grammar also takes (a ``<`` where an answer may start with one), both stay
    open -- the tag's next tokens and the grammar's -- and the first token that leaves one
    decides for the other. Whitespace tokens alone do not wait: where the grammar allows them
    they start it, as a tiny or confused model could otherwise write whitespace forever."""

    opens_with: str | None = None

    def validate(self) -> None:
        super().validate()
        for name in ("opens_with", "starts_after"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise InvalidRequestError(f"structured outputs: {name} must be a non-empty "
                                          "string")


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401 - the tokenizer conversion
    except ImportError as e:
        raise InvalidRequestError(
            "structured outputs need the llguidance package (pip install llguidance)") from e
    return llguidance


def no_additional_properties(schema: Any) -> Any:
    """A copy of a JSON schema in which every object schema (one with ``properties`` or
    ``"type": "object"``) that does not set ``additionalProperties`` sets it false (vLLM's
    ``disable_additional_properties``)."""
    if isinstance(schema, list):
        return [no_additional_properties(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: no_additional_properties(v) for k, v in schema.items()}
    t = schema.get("type")
    if ("properties" in schema or t == "object" or (isinstance(t, list) and "object" in t)) \
            and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def grammar_text(so: StructuredOutputsParams) -> str:
    """The llguidance grammar of a constraint (not yet checked: :meth:`Grammars.admit` does)."""
    llg = _llguidance()
    kind = so.kind
    if kind in ("json", "json_object"):
        schema: Any = {"type": "object"} if kind == "json_object" else so.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise InvalidRequestError(f"structured outputs: json is not valid JSON: {e}") \
                    from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError("structured outputs: a JSON schema is an object")
        if so.disable_additional_properties:
            schema = no_additional_properties(schema)
        opts: dict[str, Any] = {"whitespace_flexible": so.disable_any_whitespace is False}
        if so.whitespace_pattern is not None:
            opts["whitespace_pattern"] = so.whitespace_pattern
        try:
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=opts)
        except (ValueError, TypeError) as e:
            raise InvalidRequestError(f"structured outputs: invalid JSON schema: {e}") from None
    try:
        if kind == "regex":
            # an unfinished escape: llguidance would drop the backslash (another regex)
            if (len(so.regex) - len(so.regex.rstrip("\\"))) % 2:
                raise ValueError("the regex ends in an unfinished escape (a lone backslash)")
            return llg.grammar_from("regex", so.regex)
        if kind == "choice":
            return llg.grammar_from("choice", so.choice)
        return llg.grammar_from("grammar", so.grammar)  # Lark, or GBNF converted to Lark
    except ValueError as e:
        raise InvalidRequestError(f"structured outputs: invalid {kind}: {e}") from None


def check(so: StructuredOutputsParams, tokenizer=None) -> str:
    """``so``'s grammar, or an :class:`InvalidRequestError` when it does not compile; without
    ``tokenizer`` (an llguidance one) before any model is loaded (the engine checks again
    against its tokenizer)."""
    text = grammar_text(so)
    err = _llguidance().LLMatcher.validate_grammar(text, tokenizer)
    if err and not err.startswith("WARNING"):
        raise InvalidRequestError(f"structured outputs: invalid {so.kind}: {err.strip()}")
    return text


def _key(so: StructuredOutputsParams) -> str:
    # keys in their order: a schema's properties are written in its order (not sorted keys:
    # two schemas that differ only in that order are two grammars)
    return json.dumps([so.kind, so.json, so.regex, so.choice, so.grammar, so.whitespace_pattern,
                       so.disable_any_whitespace, so.disable_additional_properties], default=str)


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[n, ceil(V / 32)]`` int32 bitmasks (bit j of word w: token 32 w + j allowed) ->
    ``[n, vocab]`` bool, on the bitmask's device."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1
    return allowed.view(bitmask.shape[0], -1)[:, :vocab].bool()


class Grammars:
    """The matchers of the constrained requests (by sequence id) and each step's masks."""

    def __init__(self, tokenizer, vocab_size: int):
        #: the engine's :class:`~writescope.models.tokenizer.Tokenizer` (None: a model without
        #: one, whose requests cannot be constrained)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lltok = None
        self._executor = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._matchers: dict[int, Any] = {}
        #: requests whose constraint has not started: {seq id: the string that starts it}
        self._waiting: dict[int, str] = {}
        #: :class:`MayThinkFirst` requests whose first text is not decided yet: {seq id:
        #: [its constraint, the part of the opening tag sampled so far, whether the grammar
        #: also accepts the tokens so far (its matcher advanced on them)]}
        self._opening: dict[int, list] = {}
        #: per opening tag (:class:`MayThinkFirst`), read once from the vocabulary: the
        #: tokens that may write a piece of the tag, with their text
        self._tag_tokens: dict[str, list[tuple[int, str]]] = {}
        #: :meth:`prepare` may run on another thread (the server compiles off the engine's)
        self._lock = threading.Lock()
        #: host seconds spent on masks (computing the bitmasks, applying them) and rows masked
        self.mask_s = 0.0
        self.rows_masked = 0

    # ------------------------------------------------------------------ requests
    def _ll_tokenizer(self):
        with self._lock:
            if self._lltok is None:
                llg = _llguidance()
                if self.tokenizer is None:
                    raise InvalidRequestError("structured outputs need the model's tokenizer; "
                                              "this model has none")
                try:
                    self._lltok = llg.hf.from_tokenizer(
                        self.tokenizer.hf, n_vocab=self.vocab_size,
                        eos_token=list(self.tokenizer.eos_token_ids) or None)
                except Exception as e:  # noqa: BLE001 - llguidance raises several types
                    raise InvalidRequestError(
                        f"structured outputs: cannot use this model's tokenizer ({e})") from e
            return self._lltok

    def prepare(self, so: StructuredOutputsParams):
        """``so`` compiled (cached): a matcher in its start state. Thread-safe, so that a server
        can compile on a worker thread (and convert the tokenizer, on the first constraint)
        while the engine's thread runs steps; a constraint that does not compile is an
        :class:`InvalidRequestError`."""
        if isinstance(so, MayThinkFirst):  # its tag's tokens too (a decode of the vocabulary,
            self._candidates(so.opens_with)  # once: here, off the engine's thread)
        key = _key(so)
        with self._lock:
            start = self._compiled.get(key)
            if start is not None:
                self._compiled.move_to_end(key)
                return start
        tok = self._ll_tokenizer()
        start = _llguidance().LLMatcher(tok, check(so, tok), log_level=0)
        if start.is_error():
            raise InvalidRequestError(f"structured outputs: invalid {so.kind}: "
                                      f"{start.get_error()}")
        with self._lock:
            self._compiled[key] = start
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return start

    def admit(self, seq_id: int, so: StructuredOutputsParams) -> None:
        """Give ``seq_id`` a matcher of ``so`` in its start state (:meth:`prepare`), waiting
        for ``so.starts_after`` where it has one."""
        self._matchers[seq_id] = self.prepare(so).deep_copy()  # (and a tag's tokens: prepare)
        if isinstance(so, MayThinkFirst):
            self._opening[seq_id] = [so, "", True]
        elif so.starts_after:
            self._waiting[seq_id] = so.starts_after

    def forget(self, seq_id: int) -> None:
        self._matchers.pop(seq_id, None)
        self._waiting.pop(seq_id, None)
        self._opening.pop(seq_id, None)

    def _candidates(self, tag: str) -> list[tuple[int, str]]:
        """The tokens (id, text with special tokens kept) that may write a piece of ``tag`` (a
        decode of the vocabulary, once per tag)."""
        with self._lock:
            out = self._tag_tokens.get(tag)
            if out is None:
                out = []
                for i in range(min(self.vocab_size, self.tokenizer.vocab_size)):
                    t = self.tokenizer.decode([i], skip_special_tokens=False)
                    if t.strip() and any(tag[k:].startswith(x) or x.startswith(tag[k:])
                                         for k in range(len(tag)) for x in {t, t.lstrip()}):
                        out.append((i, t))
                self._tag_tokens[tag] = out
            return out

    def _opening_tokens(self, seq_id: int) -> tuple[bool, dict[int, str]]:
        """An undecided :class:`MayThinkFirst` row: (whether the grammar's tokens are still
        allowed -- it accepts the text so far, a begun tag included: a ``<`` may begin the tag
        or the answer; the tokens, with their text, that write the opening tag on from the
        text so far)."""
        so, begun, alive = self._opening[seq_id]
        tag, out = so.opens_with, {}
        for i, t in self._candidates(tag):
            s = begun + t if begun else t.lstrip()
            if tag.startswith(s) or s.startswith(tag):
                out[i] = t
        return alive, out

    def active(self, seq_id: int) -> bool:
        """Whether ``seq_id``'s next token is masked (its constraint has started)."""
        return seq_id in self._matchers and seq_id not in self._waiting

    def text_grew(self, seq_id: int, text: str, new: int) -> None:
        """``seq_id``'s output text is now ``text``, its last ``new`` characters just added: a
        waiting constraint starts once the text holds its ``starts_after`` string."""
        marker = self._waiting.get(seq_id)
        if marker is not None and text.find(marker, max(0, len(text) - new - len(marker) + 1)) >= 0:
            del self._waiting[seq_id]

    # ------------------------------------------------------------------ a step
    def bitmasks(self, seq_ids: list[int]) -> torch.Tensor:
        """The next token's bitmask of each of ``seq_ids`` (constrained), ``[n, ceil(V/32)]``
        int32 on the host."""
        llg = _llguidance()
        words = (self.vocab_size + 31) // 32
        out = torch.empty(len(seq_ids), words, dtype=torch.int32)
        matchers = [self._matchers[s] for s in seq_ids]
        if len(matchers) == 1:
            matchers[0].unsafe_compute_mask_ptr(out.data_ptr(), words * 4)
        else:
            if self._executor is None:
                self._executor = llg.LLExecutor()
            self._executor.unsafe_compute_mask_ptr(
                [(m, i) for i, m in enumerate(matchers)], out.data_ptr(), words * 4, len(seq_ids))
        return out

    def mask(self, scores: torch.Tensor, rows: list[int], seq_ids: list[int],
             fallback: torch.Tensor) -> torch.Tensor:
        """``scores [B, V]`` with the tokens the grammars of ``rows`` (of ``seq_ids``) disallow
        at -inf: a new tensor. A row left with no token (the processors ruled out all the
        grammar allows, e.g. ``min_tokens`` holding back the only EOS) takes ``fallback``'s row
        (the raw logits) under the grammar's mask alone."""
        t0 = time.perf_counter()
        dev = scores.device
        allowed = unpack(self.bitmasks(seq_ids).to(dev), scores.shape[-1])
        for k, s in enumerate(seq_ids):
            if s in self._opening:  # the opening tag and whitespace too (MayThinkFirst)
                grammar_too, extra = self._opening_tokens(s)
                if not grammar_too:
                    allowed[k] = False
                allowed[k, torch.tensor(list(extra), dtype=torch.long, device=dev)] = True
        idx = torch.tensor(rows, device=dev)
        sub = scores[idx].masked_fill(~allowed, float("-inf"))
        dead = torch.isneginf(sub).all(dim=-1)
        if bool(dead.any()):
            sub = torch.where(dead.unsqueeze(1),
                              fallback[idx].masked_fill(~allowed, float("-inf")), sub)
        out = scores.clone()
        out[idx] = sub
        self.mask_s += time.perf_counter() - t0
        self.rows_masked += len(rows)
        return out

    def accept(self, seq_id: int, token: int) -> None:
        """``token`` was sampled for ``seq_id``: advance its matcher (if it has started)."""
        opening = self._opening.get(seq_id)
        if opening is not None:  # MayThinkFirst: the opening tag waits, any other token starts
            _, extra = self._opening_tokens(seq_id)
            if token in extra:  # the tag goes on; the answer too while the grammar takes it
                so = opening[0]
                opening[1] = (opening[1] + extra[token]).lstrip()
                if opening[2]:
                    opening[2] = bool(self._matchers[seq_id].consume_token(token))
                if opening[1].startswith(so.opens_with):  # thinking: the answer comes after
                    del self._opening[seq_id]
                    self._matchers[seq_id] = self.prepare(so).deep_copy()
                    self._waiting[seq_id] = so.starts_after
                return
            del self._opening[seq_id]  # the answer, its matcher advanced on the tokens so far
        m = self._matchers.get(seq_id) if seq_id not in self._waiting else None
        if m is not None and not m.consume_token(token):
            log.warning("structured outputs: sequence %d's token %d was not accepted: %s",
                        seq_id, token, m.get_error())

    def done(self, seq_id: int) -> bool:
        """Whether ``seq_id``'s text is complete (its matcher accepts nothing more, or failed)."""
        m = self._matchers.get(seq_id)
        opening = self._opening.get(seq_id)
        if opening is not None and not opening[2]:  # only the tag goes on (its matcher failed)
            return False
        return m is not None and seq_id not in self._waiting and m.is_stopped()
