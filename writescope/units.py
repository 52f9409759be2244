"""Byte sizes and token counts as people write them: ``"32GiB"``, ``"1.5 GB"``, ``"8k"``.

* :func:`parse_bytes` -- IEC suffixes (``KiB MiB GiB TiB``) are powers of 1024, SI suffixes
  (``kB MB GB TB``) powers of 1000, a bare letter (``K M G T``, as ``ls -h`` and llama.cpp write
  them) is binary; a trailing ``B`` is optional, case does not matter, a space is allowed.
* :func:`format_bytes` -- the IEC form, exact where it can be (``"32 GiB"``, ``"1025 GiB"``),
  else 3 significant digits (``"1.5 GiB"``, ``"117 MiB"``); ``parse_bytes(format_bytes(n)) == n``
  whenever the form is exact.
* :func:`parse_count` -- token counts: ``"8k" == 8192``, ``"1M" == 1048576`` (context lengths are
  conventionally binary: a "128K context" holds 131072 tokens); ``"8000"`` stays 8000.
* :func:`env_int` -- a whole-number setting from the environment, with its default and least
  value, and an error that names the variable.
"""
from __future__ import annotations

import math
import os
import re

_BINARY = {"": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40, "p": 2 ** 50}
_DECIMAL = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12, "p": 10 ** 15}
_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.I)


def _number_and_unit(text: str, what: str, examples: str) -> tuple[float, str, bool, bool]:
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as {what} (examples: {examples})")
    num, prefix, iec, b = m.groups()
    return float(num), prefix.lower(), bool(iec), bool(b)


def parse_bytes(value: str | int | float) -> int:
    """``"32GiB"`` -> 34359738368; ``"32GB"`` -> 32000000000; ``"32G"`` -> 34359738368; ints pass."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte size: {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a byte size must be a finite number >= 0, got {value!r}")
        if value != int(value):
            raise ValueError(f"a byte size must be a whole number of bytes, got {value!r}")
        return int(value)
    num, prefix, iec, has_b = _number_and_unit(str(value), "a byte size", "32GiB, 1.5GB, 512M, 4096")
    if iec and not prefix:
        raise ValueError(f"cannot read {value!r} as a byte size")
    if prefix and has_b and not iec:
        factor = _DECIMAL[prefix]  # kB, MB, GB: SI
    else:
        factor = _BINARY[prefix]   # KiB, GiB, bare K/M/G, or plain bytes
    if factor == 1 and num != int(num):
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(round(num * factor))  # "1.01KiB": to the nearest byte


def is_auto(value) -> bool:
    """Whether a size option says ``auto`` (``kv_cache_memory="auto"``)."""
    return isinstance(value, str) and value.strip().lower() == "auto"


def check_byte_flags(flags) -> None:
    """Raise ``ValueError`` naming the flag for the first ``(flag, value)`` whose value is not a
    byte size (None passes; so does ``auto`` for ``--kv-cache-memory``): a typo is an error
    before anything is built."""
    for flag, v in flags:
        if v is None or (flag == "--kv-cache-memory" and is_auto(v)):
            continue
        try:
            parse_bytes(v)
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from None


def format_bytes(n: int | float) -> str:
    """``34359738368`` -> ``"32 GiB"``; ``1610612736`` -> ``"1.5 GiB"``; ``512`` -> ``"512 B"``.

    Exact when ``n`` is a whole number of some unit below 10000 of it (``"1025 GiB"``), else the
    largest unit with 3 significant digits."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n):
        raise ValueError(f"not a byte count: {n!r}")
    sign = "-" if n < 0 else ""
    n = abs(n)
    i = 0
    while i + 1 < len(_IEC) and n >= 1024 ** (i + 1):
        i += 1
    v = n / 1024 ** i
    if round(v, 2) == v:  # "1.5 GiB", "1.25 GiB": exact with two decimals at most
        return f"{sign}{v:g} {_IEC[i]}" if v < 1e6 else f"{sign}{v:.0f} {_IEC[i]}"
    for j in range(i - 1, -1, -1):  # else an exact smaller unit: "1025 GiB", "1034 B"
        v = n / 1024 ** j
        if v == int(v) and v < 10000:
            return f"{sign}{int(v)} {_IEC[j]}"
    v = n / 1024 ** i
    text = f"{v:.3g}" if v < 1000 else f"{v:.0f}"
    return f"{sign}{text} {_IEC[i]}"


def parse_count(value: str | int) -> int:
    """Token counts: ``"8k"`` -> 8192, ``"1.5k"`` -> 1536, ``"1M"`` -> 1048576, ``"500"`` -> 500."""
    if isinstance(value, bool):
        raise ValueError(f"not a count: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a count must be >= 0, got {value}")
        return value
    num, prefix, iec, has_b = _number_and_unit(str(value), "a count", "8k, 128K, 1M, 4096")
    if iec or has_b:
        raise ValueError(f"{value!r} is a byte size, not a count (write 8k, 128K, 1M)")
    out = num * _BINARY[prefix]
    if abs(out - round(out)) > 1e-9 * max(1.0, out):
        raise ValueError(f"{value!r} is not a whole number")
    return int(round(out))


def format_count(n: int) -> str:
    """``8192`` -> ``"8k"``; ``1048576`` -> ``"1M"``; ``1000`` -> ``"1000"`` (inverse of parse_count)."""
    for suffix, factor in (("M", 2 ** 20), ("k", 2 ** 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)


def env_int(name: str, default: int, minimum: int = 0) -> int:
    """The environment variable ``name`` as a whole number (``default`` when unset or empty);
    ValueError naming it when it is not a whole number or is below ``minimum``."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {n}")
    return n
