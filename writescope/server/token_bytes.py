"""Each token's own bytes, for the endpoints' log-probabilities: a token of a byte-level BPE
(GPT-2's, Qwen's) or a sentencepiece byte-fallback token (``<0xF0>``, Mixtral's) may hold part
of a UTF-8 character, which ``decode([id])`` turns into U+FFFD. OpenAI's chat ``logprobs``
give such a token's real ``bytes`` (joined, the tokens' bytes are the content's UTF-8) and its
``token`` as text with the bytes that are not (yet) a character written ``\\xNN``; the
completions endpoint's ``text_offset`` counts the characters before each token (the tokens of a
character split over several each at that character's offset).
"""
from __future__ import annotations

import codecs
import re
from functools import lru_cache
from typing import Any

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes (the inverse of its ``bytes_to_unicode``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenBytes:
    """Token ids of ``tokenizer`` (the engine's :class:`~writescope.models.tokenizer.Tokenizer`)
    to their bytes and their text as OpenAI's logprobs give it (cached)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        hf = getattr(tokenizer, "hf", None)
        self._hf = hf if hasattr(hf, "convert_ids_to_tokens") else None
        #: added tokens (specials, <think>...): their text, as decode gives it
        self._added = set(getattr(self._hf, "added_tokens_decoder", None) or ())
        self._byte_level = self._is_byte_level()
        self._cache: dict[tuple[int, bool], bytes] = {}

    def _is_byte_level(self) -> bool:
        backend = getattr(self._hf, "backend_tokenizer", None)
        try:
            from tokenizers import decoders
        except ImportError:  # pragma: no cover - transformers' dependency
            return False
        return isinstance(getattr(backend, "decoder", None), decoders.ByteLevel)

    def bytes(self, tid: int, skip_special: bool = True) -> bytes:
        """The token's bytes; a special token's are none with ``skip_special`` (as the text
        it is part of leaves it out: the request's ``skip_special_tokens``), else its text's."""
        key = (tid, bool(skip_special))
        b = self._cache.get(key)
        if b is None:
            b = self._cache[key] = self._bytes(tid, bool(skip_special))
        return b

    def _bytes(self, tid: int, skip_special: bool) -> bytes:
        piece = None
        if self._hf is not None and tid not in self._added:
            piece = self._hf.convert_ids_to_tokens(tid)
        if not isinstance(piece, str):  # an added token, or no vocabulary to read
            return self.tokenizer.decode([tid], skip_special_tokens=skip_special).encode("utf-8")
        if self._byte_level:
            table = _byte_decoder()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
            return piece.encode("utf-8")
        m = _BYTE_TOKEN.fullmatch(piece)
        if m is not None:  # sentencepiece's byte fallback
            return bytes([int(m.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")  # metaspace: a space

    def text(self, tid: int, skip_special: bool = True) -> str:
        """The token's text: its bytes as UTF-8, bytes that are no character alone as
        ``\\xNN`` (OpenAI's form)."""
        return self.bytes(tid, skip_special).decode("utf-8", errors="backslashreplace")


class CharOffsets:
    """Character offsets of tokens in the text they write: :meth:`add` gives a token's offset
    (the characters before it; a character split over tokens counts at its last byte)."""

    def __init__(self, start: int = 0) -> None:
        self.chars = start
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, b: bytes) -> int:
        at = self.chars
        self.chars += len(self._dec.decode(b))
        return at
