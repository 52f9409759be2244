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


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return ""
    return text[text.index("[") + 1:text.index("]")] if "[" in text else ""


def test_pageable_buffers_are_aligned_and_large_ones_advised_huge_pages(monkeypatch):
    """The C pool and every buffer a bench or the calibration reads to stand for it come from
    pageable_empty: aligned, and from 64 MiB up advised huge pages before the first touch."""
    import writescope.hostmem as hm
    advised = []
    real = hm.advise_huge_pages
    monkeypatch.setattr(hm, "advise_huge_pages", lambda t: advised.append(t.numel()) or real(t))
    small = hm.pageable_empty((3, 5), torch.bfloat16, align=64)
    assert small.shape == (3, 5) and small.dtype == torch.bfloat16 and small.data_ptr() % 64 == 0
    assert advised == []
    n = hm.HUGE_PAGE_MIN_BYTES // 4
    big = hm.pageable_empty(n, torch.float32)
    assert big.shape == (n,) and big.data_ptr() % 64 == 0 and advised == [n]
    spec = KVSpec.mla(1, 512, 64, torch.bfloat16)
    pool = allocate_pool(Region.C, spec, 64, 64, torch.device("cpu"))  # 9.4 MB: no advice
    assert pool.data_ptr() % 64 == 0 and advised == [n]
    # on Linux with THP in madvise or always mode the advice is taken
    if _thp_mode() in ("madvise", "always"):
        assert real(big)


def test_the_cpu_attention_bench_reads_memory_allocated_as_the_c_pool_is(monkeypatch):
    import writescope.bench.cpu_attention as ca
    calls = []
    real = ca.pageable_empty
    monkeypatch.setattr(ca, "pageable_empty", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    row = ca.bench_shape("gqa-32/4/128", 1, 100, reps=1, torch_reps=0, bs=64, variants=False,
                         gpu_layout=True, gen=torch.Generator().manual_seed(0))
    assert row["kernel_gbps"] > 0 and len(calls) == 2  # the C-layout pool and the T-layout one


def test_cpu_experts_weights_are_allocated_as_the_c_pool_is(monkeypatch):
    """The routed experts kept in host memory are read at DRAM speed every step, like the C pool:
    the same allocation (huge pages advised for large layers)."""
    import writescope.hostmem as hm
    from writescope.layers.cpu_experts import CpuExperts
    advised = []
    monkeypatch.setattr(hm, "advise_huge_pages", lambda t: advised.append(t.numel()) or True)
    layer = CpuExperts(8, 2048, 2560, torch.bfloat16)
    assert sorted(advised) == sorted([layer.gate_up.numel(), layer.down.numel()])
    assert layer.gate_up.data_ptr() % 64 == 0 and layer.down.data_ptr() % 64 == 0
