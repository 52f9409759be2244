"""The CPU expert kernel's weight layout: ``[O, K]`` rows (Hugging Face's) as 16-row tiles in
the VNNI order, and back. bf16 and FP8 bytes go in k-pairs (``[O/16][K/2][16][2]``, what AMX
and VDPBF16PS read), float32 as ``[O/16][K][16]``; O is padded to a multiple of :data:`TILE`
and K to a multiple of :data:`KPAD` with zeros."""
from __future__ import annotations

import torch
import torch.nn.functional as F

TILE = 16   # output rows per packed tile
KPAD = 32   # K (input) dims padded to a multiple of this (one AMX B tile)


def round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


#: dtypes packed in k-pairs (the VNNI order): bf16, and FP8 bytes (stored as uint8)
PAIRED = (torch.bfloat16, torch.uint8)


def tiles_view(w: torch.Tensor, op: int, kp: int) -> torch.Tensor:
    """``[O, K]`` weights (zero padded to ``[op, kp]``) as a view in the packed tiles' order:
    bf16 and FP8 bytes ``[op/16, kp/2, 16, 2]``, fp32 ``[op/16, kp, 16]``."""
    o, k = w.shape
    if (o, k) != (op, kp):
        w = F.pad(w, (0, kp - k, 0, op - o))
    if w.dtype in PAIRED:
        return w.reshape(op // TILE, TILE, kp // 2, 2).permute(0, 2, 1, 3)
    return w.reshape(op // TILE, TILE, kp).permute(0, 2, 1)


def pack(w: torch.Tensor, op: int, kp: int) -> torch.Tensor:
    """[O, K] -> tiles [O_p/16, ...]: bf16 [K_p/2][16][2], fp32 [K_p][16]; zero padded."""
    return tiles_view(w, op, kp).reshape(op // TILE, -1)


def pack_into(dst: torch.Tensor, w: torch.Tensor, op: int, kp: int) -> None:
    """``pack(w)`` written straight into ``dst [op/16, 16*kp]`` (rows may be strided): one copy."""
    v = tiles_view(w, op, kp)
    dst.view(v.shape).copy_(v)


def unpack(t: torch.Tensor, o: int, k: int, op: int, kp: int, lead: tuple = ()) -> torch.Tensor:
    """Tiles back to ``[*lead, o, k]`` rows (``lead``: leading dims, e.g. a range of experts)."""
    if t.dtype in PAIRED:
        w = t.reshape(*lead, op // TILE, kp // 2, TILE, 2).transpose(-3, -2)
    else:
        w = t.reshape(*lead, op // TILE, kp, TILE).transpose(-2, -1)
    return w.reshape(*lead, op, kp)[..., :o, :k]

