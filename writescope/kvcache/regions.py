"""The four regions of the InplaceKVCache, defined once.

Every KV block is ``block_size`` consecutive tokens of one sequence, for all layers. A block's
home is chosen once, when it is written, and never changes:

=====  ==========================  ==================  ===========  ==========================
name   lives in                    layout              read by      access
=====  ==========================  ==================  ===========  ==========================
G      HBM (inside the VRAM        GPU layout          GPU          in place
       budget)
T      pinned host memory,         GPU layout (byte-   GPU (after   streamed; the CPU may also
       contiguous extents          identical to G)     H2D staging) read it in place
C      pageable host memory,       CPU layout          CPU threads  in place
       64-byte aligned
W      HBM, one tail per sequence  GPU layout          GPU          append, mutable
=====  ==========================  ==================  ===========  ==========================

A *record* is what one token stores for one layer and one KV head: ``rec_dim`` values. For GQA
models it is ``[K (head_dim) | V (head_dim)]``; for MLA (DeepSeek-V2) there is one "KV head"
whose record is the 576-value latent ``[c_kv (512) | k_pe (64)]``, attended with keys = the
whole record and values = its first 512 values. :class:`KVSpec` says where K and V sit in the
record, so every kernel handles both families with the same code.

Pool layouts (``L`` layers, ``N`` blocks, ``bs`` tokens per block, ``H`` KV heads, ``R`` record):

* GPU layout (G, T, W): ``[L, N, bs, H, R]`` -- token-major inside a block, like vLLM/FlashInfer
  paged caches. For one layer, consecutive block ids are contiguous in memory, which is what lets
  a run of T blocks move to the GPU in one DMA copy.
* CPU layout (C): ``[L, N, H, bs/2, R, 2]`` -- head-major inside a block, and inside a head's
  tile the tokens come in *interleaved pairs*: element ``(t, d)`` sits at
  ``[t // 2, d, t % 2]``. One vector load then brings the same dims of two tokens, which is the
  operand format ("VNNI pairs") of AVX-512 BF16 dot products and of AMX ``TDPBF16PS`` for P.V.
  For Q.K the AMX kernel uses the pair rows as the A operand in place (GQA decode), or, with
  more than 8 query rows (MLA), splits each 32-dim step of them into token rows in an L1-sized
  copy (see ``attention/csrc/attn_amx.cpp``). All query heads of a group use each row once.
  Each (layer, block, head) tile is ``bs * R * itemsize`` contiguous
  bytes, a multiple of 64 for every supported shape, and the pool is 64-byte aligned. The
  block size must be even for this layout. Only :func:`to_cpu_layout` and
  :func:`from_cpu_layout` know this order (the cache writes and the torch path reads through
  them).

On a machine without CUDA, G and W live in ordinary memory and T is not pinned: the same code
paths run.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Region(str, enum.Enum):
    G = "G"  # GPU-resident
    T = "T"  # pinned transfer
    C = "C"  # pageable CPU-compute
    W = "W"  # GPU write tail

    def __str__(self) -> str:  # "G" rather than "Region.G" in logs and stats keys
        return self.value


#: regions whose bytes live on the accelerator (count against the VRAM budget)
DEVICE_REGIONS = (Region.G, Region.W)
#: regions whose bytes live in host memory
HOST_REGIONS = (Region.T, Region.C)
#: regions whose blocks are sealed (immutable) once written
SEALED_REGIONS = (Region.G, Region.T, Region.C)

#: default tokens per block (see docs/ARCHITECTURE.md, "Block size")
DEFAULT_BLOCK_SIZE = 64
#: alignment of the C region's pool and of each of its tiles, in bytes
C_ALIGN = 64


@dataclass(frozen=True)
class KVSpec:
    """What one token stores per layer, and where K and V sit inside it."""

    num_layers: int
    num_kv_heads: int
    rec_dim: int  # values per token per layer per KV head
    k_offset: int
    k_dim: int
    v_offset: int
    v_dim: int
    dtype: torch.dtype

    @classmethod
    def gqa(cls, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
            v_head_dim: int | None = None) -> "KVSpec":
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        return cls(num_layers, num_kv_heads, head_dim + v_head_dim, 0, head_dim, head_dim,
                   v_head_dim, dtype)

    @classmethod
    def mla(cls, num_layers: int, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype) -> "KVSpec":
        return cls(num_layers, 1, kv_lora_rank + rope_dim, 0, kv_lora_rank + rope_dim, 0,
                   kv_lora_rank, dtype)

    @property
    def is_mla(self) -> bool:
        return self.v_offset == self.k_offset and self.rec_dim == self.k_dim

    @property
    def itemsize(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()

    def token_bytes(self, layers: int | None = None) -> int:
        """Bytes one token occupies, over ``layers`` layers (all by default)."""
        layers = self.num_layers if layers is None else layers
        return layers * self.num_kv_heads * self.rec_dim * self.itemsize

    def block_bytes(self, block_size: int) -> int:
        return block_size * self.token_bytes()

    def k(self, rec: torch.Tensor) -> torch.Tensor:
        return rec[..., self.k_offset:self.k_offset + self.k_dim]

    def v(self, rec: torch.Tensor) -> torch.Tensor:
        return rec[..., self.v_offset:self.v_offset + self.v_dim]


def gpu_pool_shape(spec: KVSpec, num_blocks: int, block_size: int) -> tuple[int, ...]:
    return (spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.rec_dim)


def cpu_pool_shape(spec: KVSpec, num_blocks: int, block_size: int) -> tuple[int, ...]:
    if block_size % 2:
        raise ValueError(f"the C layout needs an even block size, got {block_size}")
    return (spec.num_layers, num_blocks, spec.num_kv_heads, block_size // 2, spec.rec_dim, 2)


def pool_shape(region: Region, spec: KVSpec, num_blocks: int, block_size: int) -> tuple[int, ...]:
    if region is Region.C:
        return cpu_pool_shape(spec, num_blocks, block_size)
    return gpu_pool_shape(spec, num_blocks, block_size)


def to_cpu_layout(records: torch.Tensor) -> torch.Tensor:
    """``[..., bs, H, R]`` (GPU layout) -> ``[..., H, bs/2, R, 2]`` (CPU layout), as a view.

    The view is not contiguous: write it into the pool with ``copy_``.
    """
    *lead, bs, h, r = records.shape
    if bs % 2:
        raise ValueError(f"the C layout needs an even block size, got {bs}")
    x = records.reshape(*lead, bs // 2, 2, h, r)
    n = len(lead)
    return x.permute(*range(n), n + 2, n, n + 3, n + 1)


def from_cpu_layout(records: torch.Tensor) -> torch.Tensor:
    """``[..., H, bs/2, R, 2]`` (CPU layout) -> ``[..., bs, H, R]`` (GPU layout), a copy."""
    *lead, h, half, r, two = records.shape
    n = len(lead)
    x = records.permute(*range(n), n + 1, n + 3, n, n + 2)  # [..., bs/2, 2, H, R]
    return x.reshape(*lead, half * 2, h, r)


def block_records(region: Region, pool: torch.Tensor, layer: int, block: int) -> torch.Tensor:
    """One block of one layer as ``[bs, H, R]`` (a view, whatever the region's layout)."""
    b = pool[layer, block]
    return from_cpu_layout(b) if region is Region.C else b
