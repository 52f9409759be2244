"""CPU attention kernel (writescope.attention.cpu) against the float64 dense oracle."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from writescope.attention import cpu
from writescope.attention.batch import BlockBatch
from writescope.attention.reference import dense_attention
from writescope.attention.torch_paged import attend_torch, gather_records
from writescope.kvcache.regions import (KVSpec, cpu_pool_shape, from_cpu_layout, gpu_pool_shape,
                                        to_cpu_layout)

ISAS = cpu.isas() if cpu.available() else []
needs_kernel = pytest.mark.skipif(not ISAS, reason=f"CPU kernel unavailable: {cpu.load_error()}")

SPECS = {
    "qwen3": (lambda dt: KVSpec.gqa(1, 4, 128, dt), 32),      # group 8, head dim 128
    "mixtral": (lambda dt: KVSpec.gqa(1, 8, 128, dt), 32),    # group 4
    "g3d64": (lambda dt: KVSpec.gqa(1, 2, 64, dt), 6),        # group 3, head dim 64
    "g2d256": (lambda dt: KVSpec.gqa(1, 1, 256, dt), 2),      # group 2, head dim 256
    "mla": (lambda dt: KVSpec.mla(1, 512, 64, dt), 16),       # DeepSeek-V2-Lite latent
}
TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-3}


def make_pools(spec: KVSpec, num_blocks: int, bs: int, gen: torch.Generator):
    """Random records in both layouts; unused pool memory is NaN, so any read of it shows."""
    recs = torch.randn(num_blocks, bs, spec.num_kv_heads, spec.rec_dim, generator=gen)
    recs = recs.to(spec.dtype)
    cpool = torch.full(cpu_pool_shape(spec, num_blocks, bs)[1:], float("nan"), dtype=spec.dtype)
    gpool = torch.full(gpu_pool_shape(spec, num_blocks, bs)[1:], float("nan"), dtype=spec.dtype)
    return recs, cpool, gpool


def write_valid(recs, cpool, gpool, blocks, lens):
    """Write only the valid tokens of each listed block (the rest of the pool stays NaN)."""
    for bl, nl in zip(blocks, lens):
        for b, n in zip(bl, nl):
            rec = recs[b].clone()
            rec[n:] = float("nan")
            gpool[b] = rec
            cpool[b] = to_cpu_layout(rec)
            if n % 2:  # the pair partner of the last token is padding in the C tile too
                cpool[b, :, n // 2, :, 1] = float("nan")


def reference(q, recs, spec, qc, blocks, lens, scale):
    nq, hq = q.shape[0], q.shape[1]
    out = torch.zeros(nq, hq, spec.v_dim, dtype=torch.float64)
    lse = torch.full((nq, hq), float("-inf"), dtype=torch.float64)
    q0 = 0
    for c, bl, nl in zip(qc, blocks, lens):
        if c and bl:
            r = torch.cat([recs[b, :n] for b, n in zip(bl, nl)]).double()
            o, l = dense_attention(q[q0:q0 + c].double(), spec.k(r), spec.v(r), scale)
            out[q0:q0 + c], lse[q0:q0 + c] = o, l
        q0 += c
    return out, lse


def check(out, lse, ref_o, ref_l, tol):
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_l)), "empty rows must have lse = -inf"
    assert torch.isfinite(out).all()
    scale_o = ref_o.abs().max().clamp_min(1e-30)
    err_o = (out.double() - ref_o).abs().max() / scale_o
    fin = torch.isfinite(ref_l)
    err_l = ((lse.double() - ref_l)[fin].abs() / ref_l[fin].abs().clamp_min(1.0)).max() if fin.any() else 0
    assert err_o <= tol, f"out rel err {float(err_o):.3g} > {tol}"
    assert err_l <= tol, f"lse rel err {float(err_l):.3g} > {tol}"
    assert (out[~fin] == 0).all()


# sequences: (query rows, block lengths); 0 rows = blocks nobody asks for, [] = empty assignment
CASES = [
    (1, [64, 64, 64, 17]),          # decode, last block partial
    (3, [64, 64, 64, 64, 64, 33]),  # chunked prefill rows, odd tail
    (1, [1]),                       # a single token
    (2, []),                        # empty assignment: (0, -inf)
    (0, [64, 64]),                  # blocks but no queries
    (1, [40, 64, 2, 64]),           # partial blocks anywhere (the plan may split sequences)
]


def build_case(spec, hq, bs, seed):
    gen = torch.Generator().manual_seed(seed)
    nblocks = sum(len(b) for _, b in CASES) + 3
    recs, cpool, gpool = make_pools(spec, nblocks, bs, gen)
    perm = torch.randperm(nblocks, generator=gen).tolist()
    qc, blocks, lens = [], [], []
    for rows, bl in CASES:
        qc.append(rows)
        blocks.append([perm.pop() for _ in bl])
        lens.append([min(n, bs) for n in bl])
    write_valid(recs, cpool, gpool, blocks, lens)
    q = torch.randn(sum(qc), hq, spec.k_dim, generator=gen)
    return q, recs, cpool, gpool, qc, blocks, lens


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(SPECS))
def test_matches_float64_reference(isa, dtype, name):
    spec_fn, hq = SPECS[name]
    spec = spec_fn(dtype)
    bs = 64
    q, recs, cpool, gpool, qc, blocks, lens = build_case(spec, hq, bs, seed=sum(map(ord, name)))
    scale = 1.0 / math.sqrt(spec.k_dim)
    ref_o, ref_l = reference(q, recs, spec, qc, blocks, lens, scale)
    batch = BlockBatch.build(qc, blocks, lens)
    cpu.set_isa(isa)
    try:
        for threads, chunk in [(1, 0), (4, 1)]:  # chunk 1: every block its own split-K partial
            cpu.set_num_threads(threads)
            for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
                qin = q.to(dtype) if dtype == torch.bfloat16 else q
                out, lse = cpu.attend_cpu(qin, pool, layout, spec, batch, scale, chunk_blocks=chunk)
                r_o, r_l = (ref_o, ref_l)
                if dtype == torch.bfloat16:  # the oracle sees the same bf16-rounded queries
                    r_o, r_l = reference(qin.float(), recs, spec, qc, blocks, lens, scale)
                check(out, lse, r_o, r_l, TOL[dtype])
    finally:
        cpu.set_isa("auto")
        cpu.set_num_threads(None)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_other_block_sizes(isa):
    """Block size 16 (not a multiple of the AMX tile) and 96, long and short sequences."""
    spec = KVSpec.gqa(1, 2, 64, torch.bfloat16)
    hq = 8
    cpu.set_isa(isa)
    try:
        for bs in (16, 96):
            gen = torch.Generator().manual_seed(bs)
            recs, cpool, gpool = make_pools(spec, 40, bs, gen)
            qc = [1, 1, 2]
            blocks = [list(range(0, 20)), [20, 21], [30, 31, 32]]
            lens = [[bs] * 19 + [3], [bs, 1], [bs, bs - 1, bs]]
            write_valid(recs, cpool, gpool, blocks, lens)
            q = torch.randn(sum(qc), hq, spec.k_dim, generator=gen).to(torch.bfloat16)
            ref_o, ref_l = reference(q.float(), recs, spec, qc, blocks, lens, 0.125)
            batch = BlockBatch.build(qc, blocks, lens)
            for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
                check(*cpu.attend_cpu(q, pool, layout, spec, batch, 0.125), ref_o, ref_l, 5e-3)
    finally:
        cpu.set_isa("auto")


@needs_kernel
@pytest.mark.parametrize("name", ["mla", "qwen3"])
def test_prefetch_distance_changes_no_result(name):
    """The AMX kernel's prefetch distance only moves prefetches (cache hints that may run past
    a sequence's blocks): results are bit-identical at every distance, in both layouts."""
    spec_fn, hq = SPECS[name]
    spec = spec_fn(torch.bfloat16)
    q, recs, cpool, gpool, qc, blocks, lens = build_case(spec, hq, 64, seed=11)
    batch = BlockBatch.build(qc, blocks, lens)
    qin = q.to(torch.bfloat16)
    with pytest.raises(ValueError):
        cpu.set_prefetch_blocks(-1)
    try:
        for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
            cpu.set_prefetch_blocks(1)
            o1, l1 = cpu.attend_cpu(qin, pool, layout, spec, batch, 0.1)
            for n in (0, 2, 5, 64):  # 0: no software prefetch
                cpu.set_prefetch_blocks(n)
                o, l = cpu.attend_cpu(qin, pool, layout, spec, batch, 0.1)
                assert torch.equal(o, o1) and torch.equal(l, l1), (layout, n)
    finally:
        cpu.set_prefetch_blocks(None)


@needs_kernel
def test_pool_views_and_many_threads():
    """kv is one layer of a multi-layer pool (a view), more threads than work items."""
    spec = KVSpec.gqa(3, 2, 64, torch.float32)
    gen = torch.Generator().manual_seed(1)
    bs = 32
    full = torch.randn(cpu_pool_shape(spec, 10, bs), generator=gen)
    q = torch.randn(2, 4, 64, generator=gen)
    batch = BlockBatch.build([1, 1], [[0, 3, 5], [9]], [[32, 32, 10], [7]])
    cpu.set_num_threads(6)
    try:
        out, lse = cpu.attend_cpu(q, full[1], "cpu", spec, batch, 0.2)
    finally:
        cpu.set_num_threads(None)
    ref = attend_torch(q, full[1], "cpu", spec, batch, 0.2)
    torch.testing.assert_close(out, ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref[1], rtol=1e-5, atol=1e-5)


def test_cpu_layout_round_trip():
    spec = KVSpec.gqa(2, 3, 8, torch.float32)
    x = torch.randn(5, 2, 6, 3, 16)  # [L, N, bs, H, R]
    c = to_cpu_layout(x)
    assert c.shape == (5, 2, 3, 3, 16, 2)
    assert cpu_pool_shape(spec, 4, 6) == (2, 4, 3, 3, 16, 2)
    assert torch.equal(from_cpu_layout(c), x)
    # element (t, d) of head h sits at [h, t // 2, d, t % 2]
    assert c[1, 0, 2, 1, 5, 1] == x[1, 0, 3, 2, 5]
    pool = torch.empty(cpu_pool_shape(spec, 4, 6)[1:])
    pool[2].copy_(to_cpu_layout(x[0, 0]))
    g = gather_records(pool, "cpu", torch.tensor([2], dtype=torch.int32), torch.tensor([5]))
    assert torch.equal(g, x[0, 0, :5])
    with pytest.raises(ValueError):
        cpu_pool_shape(spec, 4, 5)


@needs_kernel
def test_threads_setting(monkeypatch):
    monkeypatch.setenv("WRITESCOPE_CPU_ATTN_THREADS", "3")
    assert cpu.get_num_threads() == 3
    cpu.set_num_threads(2)
    assert cpu.get_num_threads() == 2
    cpu.set_num_threads(None)
    monkeypatch.delenv("WRITESCOPE_CPU_ATTN_THREADS")
    cpu.reserve_cores(1)
    try:
        assert cpu.get_num_threads() == max(1, len(__import__("os").sched_getaffinity(0)) - 1)
    finally:
        cpu.reserve_cores(0)


def test_fallback_warns_once(monkeypatch):
    """Without a usable compiler: one warning, then the torch path's result."""
    monkeypatch.setattr(cpu, "_load_tried", True)
    monkeypatch.setattr(cpu, "_lib", None)
    monkeypatch.setattr(cpu, "_load_error", "RuntimeError: no C++ compiler found")
    monkeypatch.setattr(cpu, "_warned", False)
    spec = KVSpec.gqa(1, 1, 8, torch.float32)
    pool = torch.randn(cpu_pool_shape(spec, 2, 4)[1:])
    batch = BlockBatch.build([1], [[1]], [[3]])
    q = torch.randn(1, 2, 8)
    with pytest.warns(RuntimeWarning, match="unavailable"):
        out, lse = cpu.attend_cpu(q, pool, "cpu", spec, batch, 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cpu.attend_cpu(q, pool, "cpu", spec, batch, 0.3)
    ref = attend_torch(q, pool, "cpu", spec, batch, 0.3)
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    assert not cpu.available()


@needs_kernel
@pytest.mark.skipif("avx512bf16" not in ISAS, reason="no AVX512-BF16 on this CPU")
def test_bf16_dot_product_path_falls_back_for_other_dims():
    """Head dims that are multiples of 8 but not 16 take the FMA path inside the bf16 variant."""
    spec = KVSpec.gqa(1, 2, 40, torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    bs = 16
    recs, cpool, gpool = make_pools(spec, 12, bs, gen)
    qc, blocks, lens = [1, 2], [[0, 1, 2], [5, 7]], [[bs, bs, 5], [bs, 9]]
    write_valid(recs, cpool, gpool, blocks, lens)
    q = torch.randn(sum(qc), 6, spec.k_dim, generator=gen).to(torch.bfloat16)
    ref_o, ref_l = reference(q.float(), recs, spec, qc, blocks, lens, 0.15)
    batch = BlockBatch.build(qc, blocks, lens)
    cpu.set_isa("avx512bf16")
    try:
        for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
            check(*cpu.attend_cpu(q, pool, layout, spec, batch, 0.15), ref_o, ref_l, 5e-3)
    finally:
        cpu.set_isa("auto")


def test_auto_prefetch_level_by_core(monkeypatch):
    """``auto`` runs the AVX-512 BF16 kernel prefetching into L1 on Zen 5 (AMD family 26) only,
    into L2 elsewhere; a CPU without AVX-512 BF16 or with AMX is unaffected."""
    zen4 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
    zen5 = "vendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
    intel = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
    monkeypatch.setattr(cpu, "_isa", "auto")  # whatever $WRITESCOPE_CPU_ATTN_ISA says
    assert cpu.zen5_cpuinfo(zen5)
    assert not cpu.zen5_cpuinfo(zen4) and not cpu.zen5_cpuinfo(intel) and not cpu.zen5_cpuinfo("")
    for have, l1, want in [(["avx2", "avx512", "avx512bf16", "avx512bf16-l2"], True, "avx512bf16"),
                           (["avx2", "avx512", "avx512bf16", "avx512bf16-l2"], False, "avx512bf16-l2"),
                           (["avx2", "avx512", "avx512bf16", "avx512bf16-l2", "amx"], False, "amx"),
                           (["avx2", "avx512"], False, "avx512")]:
        monkeypatch.setattr(cpu, "isas", lambda have=have: have)
        monkeypatch.setattr(cpu, "l1_prefetch_core", lambda l1=l1: l1)
        assert cpu.get_isa(torch.bfloat16) == want
        assert cpu.get_isa(torch.float32) == "avx512"
