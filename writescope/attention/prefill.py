"""Prefill attention: one sequence's new tokens over its whole context, causally, with SDPA.

A prefill chunk of ``n`` tokens after ``P`` cached ones attends keys ``0 .. P + i`` from row
``i``: a causal mask aligned to the bottom right of the ``n x (P + n)`` score matrix. Many query
rows per key make this compute-bound, so it runs on PyTorch's fused attention kernels
(``scaled_dot_product_attention`` with ``causal_lower_right``): FlashAttention-2 where the head
dims allow it (GQA, head dim <= 256; its grouped heads are native), the memory-efficient kernel
otherwise (MLA's absorbed 576/512 latent, one KV head expanded by stride, never copied), and on the
CPU PyTorch's flash CPU kernel. Where none of those runs (an old build, an odd dtype), query
tiles in plain torch with a bounded score buffer give the same result.

MLA (DeepSeek-V2) prefill does not attend the absorbed latent (576-value keys, 512-value values,
~35K FLOP per query-key pair over 16 heads, on the memory-efficient kernel): like transformers and
vLLM it decompresses the context's latent into per-head keys (128 + the 64 shared rope values) and
values (128) with ``kv_b_proj`` and runs FlashAttention over them (:func:`mla_prefix_attention`,
~12K FLOP per pair with the values padded to the keys' 192). Decode keeps the absorbed form, where
the cache is read once for all heads.

The cache gathers the context (``kvcache/context.py``); this module only computes.
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

#: score elements (all heads) one fallback query tile holds at once
TILE_SCORE_ELEMS = 1 << 26

_sdpa_failed: set[tuple] = set()

# SDPA's causal-bias dispatch warns about each kernel it cannot use (flash for MLA's 576-value
# head, ...) before it takes the next. That order is expected here, and a failure of them all
# raises; the filter names that module only, and is set once (filters are process-wide).
warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.nn\.attention\.bias")


def causal_prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """``q [n, Hq, Dk]`` (the last ``n`` positions), ``k [T, Hkv, Dk]``, ``v [T, Hkv, Dv]`` with
    ``T >= n``; returns ``[n, Hq, Dv]`` in ``k``'s dtype."""
    n, hq, dk = q.shape
    t, hkv, _ = k.shape
    if t < n:
        raise ValueError(f"{n} query rows need at least {n} keys, got {t}")
    if hq % hkv:
        raise ValueError(f"{hq} query heads over {hkv} KV heads")
    if n == 0:
        return q.new_zeros((0, hq, v.shape[-1]), dtype=k.dtype)
    q = q.to(k.dtype)
    key = (q.device.type, k.dtype, dk, v.shape[-1], hkv == hq, hkv == 1)
    if key not in _sdpa_failed:
        try:
            return _sdpa(q, k, v, scale)
        except torch.OutOfMemoryError:
            raise  # a full device is not a missing kernel (and the tiles need more memory)
        except RuntimeError:
            _sdpa_failed.add(key)  # no fused kernel for this shape here: tiles from now on
    return _tiled(q, k, v, scale)


#: on the CPU, a causal mask of at most this many elements is made explicitly (a bool tensor):
#: ``torch.nn.attention.bias`` (the lazy mask) imports torch._dynamo, ~1 s on first use --
#: a CPU chat's first turn over a cached prefix waited for it
EXPLICIT_MASK_ELEMS = 1 << 24


@functools.lru_cache(maxsize=2)  # every layer of a prefill chunk asks for the same one
def _explicit_mask(n: int, t: int) -> torch.Tensor:
    return torch.ones(n, t, dtype=torch.bool).tril_(diagonal=t - n)


def _causal_mask(n: int, t: int, device: torch.device):
    """Row ``i`` of ``n`` sees keys ``0 .. t - n + i``: a bool tensor on the CPU where small,
    else torch's lazy lower-right causal bias (which the fused CUDA kernels take natively)."""
    if device.type == "cpu" and n * t <= EXPLICIT_MASK_ELEMS:
        return _explicit_mask(n, t)
    from torch.nn.attention.bias import causal_lower_right
    return causal_lower_right(n, t)


def _sdpa(q, k, v, scale):
    n, hq, _ = q.shape
    t, hkv, _ = k.shape
    g = hq // hkv
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, n, Dk]
    if hkv == 1 or k.shape[-1] != v.shape[-1]:
        # MQA (MLA's shared latent) or unequal K/V dims: flash cannot run it; the
        # memory-efficient kernel takes the KV head repeated by a zero stride
        kh = k.transpose(0, 1).unsqueeze(0)
        vh = v.transpose(0, 1).unsqueeze(0)
        if g > 1:
            if hkv == 1:
                kh = kh.expand(1, hq, t, kh.shape[-1])
                vh = vh.expand(1, hq, t, vh.shape[-1])
            else:
                kh = kh.repeat_interleave(g, dim=1)
                vh = vh.repeat_interleave(g, dim=1)
        gqa = False
    else:
        kh = k.transpose(0, 1).unsqueeze(0)
        vh = v.transpose(0, 1).unsqueeze(0)
        gqa = g > 1
    mask = _causal_mask(n, t, q.device)
    if q.device.type == "cuda":  # fused kernels only: never the math path's full score matrix
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                                 enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                             enable_gqa=gqa)
    return out[0].transpose(0, 1)


def _tiled(q, k, v, scale):
    """The same attention in query tiles of plain torch ops (float32 scores)."""
    n, hq, _ = q.shape
    t, hkv, _ = k.shape
    g = hq // hkv
    p = t - n
    out = torch.empty(n, hq, v.shape[-1], dtype=k.dtype, device=q.device)
    qf = q.float().view(n, hkv, g, -1)
    kf, vf = k.float(), v.float()
    tile = max(1, min(n, TILE_SCORE_ELEMS // max(1, hq * t)))
    for a in range(0, n, tile):
        b = min(n, a + tile)
        last = p + b  # keys the tile's last row sees
        s = torch.einsum("qhgd,khd->hgqk", qf[a:b], kf[:last]) * scale
        rows = torch.arange(p + a, p + b, device=q.device)
        cols = torch.arange(last, device=q.device)
        s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
        pr = torch.softmax(s, dim=-1)
        out[a:b] = torch.einsum("hgqk,khd->qhgd", pr, vf[:last]).reshape(b - a, hq, -1)
    return out


def mla_prefix_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor,
                         kv_b_weight: torch.Tensor, scale: float) -> torch.Tensor:
    """MLA prefill rows in the per-head form. ``q_nope [n, H, Dn]`` and ``q_pe [n, H, Dr]`` (rope
    applied) are the last ``n`` positions' queries; ``latent [T, 1, C + Dr]`` the records
    ``[c_kv | k_pe]`` of all ``T >= n`` positions; ``kv_b_weight [H * (Dn + Dv), C]`` is
    ``kv_b_proj.weight``. Returns the heads' values ``[n, H, Dv]`` (before ``o_proj``), in
    ``latent``'s dtype."""
    n, h, dn = q_nope.shape
    t = latent.shape[0]
    dr = q_pe.shape[-1]
    c_dim = latent.shape[-1] - dr
    dv = kv_b_weight.shape[0] // h - dn
    if kv_b_weight.shape[1] != c_dim or dv <= 0:
        raise ValueError(f"kv_b_proj weight {tuple(kv_b_weight.shape)} does not fit {h} heads of "
                         f"{dn} + v over a {c_dim}-value latent")
    c, k_pe = latent[:, 0, :c_dim], latent[:, 0, c_dim:]
    kv = torch.nn.functional.linear(c, kv_b_weight.to(c.dtype)).view(t, h, dn + dv)
    k = torch.cat((kv[..., :dn], k_pe.unsqueeze(1).expand(t, h, dr)), dim=-1)
    v = kv[..., dn:]
    dk = dn + dr
    if dv < dk:  # FlashAttention wants equal key and value widths: zero columns cost no accuracy
        v = F.pad(v, (0, dk - dv))
    q = torch.cat((q_nope, q_pe), dim=-1)
    return causal_prefix_attention(q, k, v, scale)[..., :dv]
