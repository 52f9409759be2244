"""Tokenizer: a checkpoint's tokenizer files and chat template, plus streaming detokenisation.

``Tokenizer`` wraps ``transformers.AutoTokenizer`` (offline: ``local_files_only``) so that the
engine sees plain ``list[int]`` and ``str`` and one set of stop ids.

``IncrementalDetokenizer`` turns a stream of generated ids into text pieces. It keeps a small
window of already-emitted ids (``prefix_offset`` .. ``read_offset``) and decodes the window with
and without the new ids; the difference is the new text. Text is held back while it ends in
U+FFFD, i.e. while the last token(s) hold an incomplete UTF-8 sequence (a byte-level BPE splits
multi-byte characters across tokens). This is the prefix/read-offset scheme of Hugging Face TGI
(``Model.decode_token``) and vLLM (``detokenize_incrementally``); written here from their
description, decoding id slices (TGI's variant) so that it works for any tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

REPLACEMENT_CHAR = "\ufffd"

#: apply_chat_template's own parameters: template variables (``chat_template_kwargs``) cannot
#: take these names
RESERVED_TEMPLATE_KWARGS = frozenset((
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"))


class TokenizerError(ValueError):
    """A checkpoint whose tokenizer cannot be loaded or used as asked."""


class Tokenizer:
    """A checkpoint's tokenizer (``tokenizer.json``/``tokenizer_config.json`` or sentencepiece)."""

    def __init__(self, hf_tokenizer: Any, extra_eos_ids: Iterable[int] = (), path: Path | None = None):
        self.hf = hf_tokenizer
        self.path = path
        eos: list[int] = []
        if hf_tokenizer.eos_token_id is not None:
            eos.append(int(hf_tokenizer.eos_token_id))
        for i in extra_eos_ids:
            if int(i) not in eos:
                eos.append(int(i))
        self._eos = tuple(eos)
        self._backend = _plain_backend(hf_tokenizer)

    @classmethod
    def from_pretrained(cls, path: str | Path, checkpoint: str | Path | None = None) -> "Tokenizer":
        """Load from a local checkpoint folder (no network access). ``checkpoint``: the model's
        folder, whose generation_config.json (or config.json) names the extra EOS ids, where the
        tokenizer comes from another folder (vLLM's ``tokenizer=``); ``path`` by default."""
        from transformers import AutoTokenizer

        p = Path(path)
        if not p.is_dir():
            raise TokenizerError(f"no checkpoint folder at {p}")
        try:
            hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except Exception as e:  # transformers raises several types (OSError, ValueError, ...)
            raise TokenizerError(f"cannot load the tokenizer of {p}: {type(e).__name__}: {e}") from e
        eos_dir = Path(checkpoint) if checkpoint is not None else p
        return cls(hf, extra_eos_ids=_checkpoint_eos_ids(eos_dir), path=p)

    # ------------------------------------------------------------------ facts
    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation: the tokenizer's eos plus generation_config.json's eos_token_id
        (config.json's when the checkpoint has no generation_config.json)."""
        return self._eos

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce or decode (added tokens included)."""
        return len(self.hf)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def pad_token_id(self) -> int | None:
        pad = self.hf.pad_token_id
        return pad if pad is not None else (self._eos[0] if self._eos else None)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self._backend is not None:  # the same text without transformers' wrapping
            return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens,
                              clean_up_tokenization_spaces=False)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None, continue_final_message: bool = False,
                    chat_template: str | None = None, documents: list[dict] | None = None,
                    **template_kwargs: Any) -> str:
        """The chat template applied to ``messages`` (OpenAI-style role/content dicts) and, for
        templates that render them, ``tools`` (OpenAI's function definitions), as text.
        ``continue_final_message``: the last message is left open (no end-of-turn after it), so
        that the output continues it; ``template_kwargs``: variables the template reads (Qwen3's
        ``enable_thinking``); ``chat_template``: Jinja text used instead of the checkpoint's
        template (vLLM's ``chat_template``); ``documents``: what a retrieval-augmented template
        renders (Hugging Face's ``documents``; others ignore them)."""
        if chat_template is not None and (not isinstance(chat_template, str)
                                          or not chat_template.strip()):
            raise TokenizerError("chat_template must be the template's (non-empty) Jinja text")
        if chat_template is None and not self.has_chat_template:
            where = f" at {self.path}" if self.path else ""
            raise TokenizerError(
                f"the checkpoint{where} has no chat template (tokenizer_config.json 'chat_template' "
                "or chat_template.jinja); pass a plain text prompt instead of chat messages")
        if add_generation_prompt and continue_final_message:
            raise TokenizerError("continue_final_message and add_generation_prompt cannot both "
                                 "be true")
        bad = sorted(set(template_kwargs) & RESERVED_TEMPLATE_KWARGS)
        if bad:
            raise TokenizerError(f"chat template variables cannot be named {', '.join(bad)}")
        from jinja2 import TemplateError
        try:
            return self.hf.apply_chat_template(messages,
                                               add_generation_prompt=add_generation_prompt,
                                               tokenize=False, tools=tools,
                                               continue_final_message=continue_final_message,
                                               chat_template=chat_template, documents=documents,
                                               **template_kwargs)
        except TemplateError as e:  # a template that does not parse, or its raise_exception
            whose = "the chat template given" if chat_template is not None else \
                f"the chat template of {self.path}" if self.path else "the chat template"
            raise TokenizerError(f"{whose} failed: {type(e).__name__}: {e}") from e

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, continue_final_message: bool = False,
                            add_special_tokens: bool = False,
                            **template_kwargs: Any) -> list[int]:
        """Prompt ids for a conversation. The rendered text already carries any BOS the template
        wants, so by default it is encoded without adding special tokens again (as vLLM does;
        ``add_special_tokens``: the tokenizer's added on top, vLLM's request field)."""
        return self.encode(self.render_chat(messages, add_generation_prompt, tools,
                                            continue_final_message, **template_kwargs),
                           add_special_tokens=add_special_tokens)

    def __repr__(self) -> str:
        return (f"Tokenizer(path={str(self.path)!r}, vocab_size={self.vocab_size}, "
                f"eos_token_ids={list(self._eos)})")


def _plain_backend(hf: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` behind a fast tokenizer whose ``decode`` without clean-up is
    that tokenizer's own (transformers' ``decode`` then only wraps it: ~10 us of Python a call,
    two calls a generated token in :class:`IncrementalDetokenizer`, 0.9 ms of a batch-64 decode
    step on the dev VM); None for any other tokenizer (a class with its own decoding)."""
    backend = getattr(hf, "_tokenizer", None)
    if backend is None or not hasattr(backend, "decode"):
        return None
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    base = next((c for c in type(hf).__mro__ if "_decode" in vars(c)), None)
    if type(hf).decode is not PreTrainedTokenizerBase.decode or base is None or \
            base.__module__.rsplit(".", 1)[-1] not in ("tokenization_utils_tokenizers",
                                                       "tokenization_utils_fast"):
        return None
    try:  # the same text both ways on a sample of ids, special ones included
        n = len(hf)
        sample = sorted({0, 1, 2, n // 3, n // 2, n - 1, *(hf.all_special_ids or [])})
        sample = [i for i in sample if 0 <= i < n]
        for skip in (True, False):
            if backend.decode(sample, skip_special_tokens=skip) != hf.decode(
                    sample, skip_special_tokens=skip, clean_up_tokenization_spaces=False):
                return None
    except Exception:  # noqa: BLE001 - any doubt: transformers' own path
        return None
    return backend


def _checkpoint_eos_ids(path: Path) -> list[int]:
    for name in ("generation_config.json", "config.json"):
        f = path / name
        if not f.is_file():
            continue
        try:
            d = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
            raise TokenizerError(f"{f} is not readable JSON: {e}") from e
        if not isinstance(d, dict):
            raise TokenizerError(f"{f} is not a JSON object")
        eos = d.get("eos_token_id")
        if eos is None:
            continue
        ids = eos if isinstance(eos, list) else [eos]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ids):
            raise TokenizerError(f"{f}: eos_token_id must be a token id or a list of them, "
                                 f"got {eos!r}")
        return ids
    return []


class IncrementalDetokenizer:
    """Streaming text for one sequence.

    ``add(token_id)`` returns the text that the new token completes (possibly ``""``);
    ``flush()`` returns whatever is still held back at the end (an incomplete character decodes
    to U+FFFD there, as in a full decode). For a prompt that decodes to complete text, the
    concatenation of all pieces equals ``tokenizer.decode(generated_ids)`` for byte-level BPE
    tokenizers (for any ids), and the full decode's text after the prompt for sentencepiece-style
    ones (metaspace + byte fallback, as Mixtral's) as long as the output is valid UTF-8: their
    ByteFallback decoder writes one U+FFFD per byte token of an *invalid* run, so there the
    count of U+FFFD can differ from a full decode (as in vLLM and TGI).
    """

    #: prompt tokens kept as left context: sentencepiece decoders drop or add a leading space
    #: depending on what precedes a token, so the window starts a few tokens back
    CONTEXT = 5

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (),
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids)
        self.read_offset = len(self.ids)
        self.prefix_offset = max(len(self.ids) - self.CONTEXT, 0)
        self.text = ""  # everything emitted so far

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        new_text = self._decode(self.prefix_offset)
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            piece = new_text[len(prefix_text):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self.text += piece
            return piece
        return ""

    def flush(self) -> str:
        """Emit any held-back text (call once, when the sequence ends)."""
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        new_text = self._decode(self.prefix_offset)
        piece = new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += piece
        return piece
