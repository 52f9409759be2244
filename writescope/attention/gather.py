"""C blocks read by the GPU: gathered to device memory per layer, re-laid-out there (a read).

C blocks live in pageable host memory in the CPU kernel's layout and are normally attended by the
CPU in place. Prefill chunks are different: many query rows per cached byte make their attention
compute-bound, which the GPU does far faster, so the cache gives a prefilling sequence's C blocks
to the GPU side (see ``PREFILL_GPU_ROWS`` in ``kvcache/cache.py``). Those blocks reach the GPU
here, one piece at a time:

    host:   index_select of the piece's blocks from the layer's C pool -> pinned bounce buffer
    copy:   bounce -> raw device buffer (async on CUDA; two bounce buffers alternate, so the host
            gathers piece k+1 while piece k is on the bus)
    device: raw [n, H, bs/2, R, 2] -> GPU layout [n, bs, H, R] (one permute-copy kernel)

The pool is only read: the C bytes stay where they were written. ``gather_bytes`` of device memory
(raw + converted buffers) is allocated once and counts against the VRAM budget, like the T ring.
On a CPU-only machine the same path runs with ordinary memory (tests use it to check the piece
logic).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import BlockBatch
from .staging import split_batch

#: device bytes for gathering C blocks (half raw, half re-laid-out)
DEFAULT_GATHER_BYTES = 128 * 2**20


@dataclass
class GatherPiece:
    batch: BlockBatch   # addresses positions 0..num_blocks-1 of the converted buffer (CPU tensors)
    ids: torch.Tensor   # int64 C block ids, in that order (CPU)

    @property
    def num_blocks(self) -> int:
        return int(self.ids.numel())


class CGather:
    """Buffers and copies for GPU-side reads of C blocks (see the module docstring).

    ``cpu_block_shape``: one layer's C block, ``(H, bs/2, R, 2)``."""

    def __init__(self, cpu_block_shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device | str, gather_bytes: int = DEFAULT_GATHER_BYTES):
        self.device = torch.device(device)
        h, half, r, two = (int(s) for s in cpu_block_shape)
        self.cpu_block_shape = (h, half, r, two)
        self.gpu_block_shape = (half * two, h, r)
        itemsize = torch.tensor([], dtype=dtype).element_size()
        self.block_bytes = h * half * r * two * itemsize
        self.piece_blocks = int(gather_bytes) // 2 // self.block_bytes
        if self.piece_blocks < 1:
            raise ValueError(f"C gather buffers of {gather_bytes} bytes hold no block "
                             f"({self.block_bytes} bytes per block and layer)")
        n = self.piece_blocks
        self.raw = torch.empty(n, *self.cpu_block_shape, dtype=dtype, device=self.device)
        self.conv = torch.empty(n, *self.gpu_block_shape, dtype=dtype, device=self.device)
        self.cuda = self.device.type == "cuda"
        self.bounce = [torch.empty(n, *self.cpu_block_shape, dtype=dtype, pin_memory=self.cuda)
                       for _ in range(2 if self.cuda else 1)]
        self._done: list = [None] * len(self.bounce)
        self._k = 0
        self.bytes = 0

    @property
    def device_bytes(self) -> int:
        return 2 * self.piece_blocks * self.block_bytes

    def plan(self, batch: BlockBatch) -> list[GatherPiece]:
        return [GatherPiece(b, ids) for b, ids in split_batch(batch, self.piece_blocks)]

    def fetch(self, pool_layer: torch.Tensor, piece: GatherPiece) -> torch.Tensor:
        """The piece's blocks of one layer (``pool_layer [N, H, bs/2, R, 2]``) in the GPU layout,
        as a view ``[n, bs, H, R]`` of the converted buffer, ordered on the current stream."""
        n = piece.num_blocks
        k = self._k
        self._k = (k + 1) % len(self.bounce)
        if self._done[k] is not None:  # the copy that last read this bounce buffer is finished
            self._done[k].synchronize()
        host = self.bounce[k][:n]
        torch.index_select(pool_layer, 0, piece.ids, out=host)
        raw = self.raw[:n]
        raw.copy_(host, non_blocking=self.cuda)
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record()
            self._done[k] = ev
        conv = self.conv[:n]
        h, half, r, two = self.cpu_block_shape
        # conv[b, 2i + j, h, r] = raw[b, h, i, r, j]
        conv.view(n, half, two, h, r).copy_(raw.permute(0, 2, 4, 1, 3))
        self.bytes += n * self.block_bytes
        return conv
