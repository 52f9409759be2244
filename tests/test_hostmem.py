"""Page-locked host memory at its exact size (``writescope/hostmem.py``): the T pool."""
from __future__ import annotations

import pytest
import torch

from writescope.hostmem import REGISTER_MIN_BYTES, pinned_empty
from writescope.kvcache.pools import allocate_pool
from writescope.kvcache.regions import KVSpec, Region


def test_without_cuda_the_t_pool_is_ordinary_memory():
    spec = KVSpec.gqa(2, 2, 16, torch.float32)
    pool = allocate_pool(Region.T, spec, 3, 8, torch.device("cpu"))
    assert pool.shape[0] == 2 and not pool.is_pinned()
    if not torch.cuda.is_available():
        assert not pinned_empty((4, 4), torch.float32).is_pinned()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_large_pinned_buffers_are_registered_not_rounded_up():
    n = REGISTER_MIN_BYTES + (3 << 20)  # torch's pinned allocator would take 128 MiB for this
    t = pinned_empty((n,), torch.uint8)
    assert t.is_pinned() and t.numel() == n
    src = torch.arange(n, device="cuda", dtype=torch.int64).to(torch.uint8)
    t.copy_(src, non_blocking=True)
    back = torch.empty_like(src)
    back.copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, src)
    spec = KVSpec.gqa(4, 4, 128, torch.bfloat16)  # 2 KiB per token and layer: an 80 MiB pool
    pool = allocate_pool(Region.T, spec, 160, 64, torch.device("cuda"))
    assert pool.numel() * pool.element_size() == 4 * 160 * 64 * 4 * 256 * 2 > REGISTER_MIN_BYTES
    assert pool.is_pinned()
    small = pinned_empty((16,), torch.float32)  # small: torch's pinned allocator
    assert small.is_pinned()


def test_h2d_makes_device_tensors_from_host_arrays():
    import numpy as np
    from writescope.hostmem import h2d
    a = h2d([3, 1, 2], "cpu", torch.long)
    assert a.dtype == torch.long and a.tolist() == [3, 1, 2]
    b = h2d(np.arange(4, dtype=np.int32), torch.device("cpu"))
    assert b.dtype == torch.int32 and b.tolist() == [0, 1, 2, 3]
    if torch.cuda.is_available():
        src = np.arange(1000, dtype=np.int64)
        c = h2d(src, "cuda")
        src[:] = -1  # the copy was staged before h2d returned
        assert c.device.type == "cuda" and c.cpu().tolist() == list(range(1000))
