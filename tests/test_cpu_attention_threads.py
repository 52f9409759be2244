"""The CPU attention kernel's scheduling (csrc/attn_ops.cpp): items taken dynamically by any team
member, queries packed on first use, each (sequence, head) merged by whichever member finishes
its last chunk. The results must not depend on the thread count, on how the work was shared, or
on what earlier calls left in the reused buffers."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from writescope.attention import cpu
from writescope.attention.batch import BlockBatch
from writescope.attention.torch_paged import attend_torch
from writescope.kvcache.regions import KVSpec, cpu_pool_shape, gpu_pool_shape

needs_kernel = pytest.mark.skipif(not (cpu.available() and cpu.isas()),
                                  reason=f"CPU kernel unavailable: {cpu.load_error()}")


@pytest.fixture(autouse=True)
def _restore_threads():
    yield
    cpu.set_num_threads(None)


def _case(spec: KVSpec, bs: int, seqs: list[tuple[int, list[int]]], seed: int, layout="cpu"):
    """seqs: (query rows, valid tokens per block). Returns q, pool, batch."""
    gen = torch.Generator().manual_seed(seed)
    nblocks = sum(len(b) for _, b in seqs) + 2
    shape = (cpu_pool_shape if layout == "cpu" else gpu_pool_shape)(spec, nblocks, bs)[1:]
    pool = torch.randn(shape, generator=gen).to(spec.dtype)
    perm = torch.randperm(nblocks, generator=gen).tolist()
    blocks = [[perm.pop() for _ in bl] for _, bl in seqs]
    lens = [[min(n, bs) for n in bl] for _, bl in seqs]
    batch = BlockBatch.build([r for r, _ in seqs], blocks, lens)
    hq = spec.num_kv_heads * 4
    q = torch.randn(sum(r for r, _ in seqs), hq, spec.k_dim, generator=gen)
    return q, pool, batch


SEQS = [(1, [64] * 9 + [5]), (2, [64] * 3), (1, []), (0, [64, 64]), (3, [64, 0, 64, 31]),
        (1, [0, 0]), (1, [64] * 17)]


def _plan(spec, pool, batch, q, layout="cpu", chunk=0):
    return cpu.CpuAttentionPlan(pool, layout, spec, batch, 0.125, q.shape[0], q.shape[1], q.dtype,
                                chunk_blocks=chunk)


@needs_kernel
@pytest.mark.parametrize("layout", ["cpu", "gpu"])
def test_same_bits_for_any_thread_count(layout):
    """With the chunking fixed, every thread count (more threads than cores or items included)
    gives bit-identical results, and they match the torch path."""
    spec = KVSpec.gqa(1, 2, 64, torch.bfloat16)
    q, pool, batch = _case(spec, 64, SEQS, 0, layout)
    plan = _plan(spec, pool, batch, q, layout, chunk=2)
    outs = []
    for t in (1, 2, 3, 7, 64):
        cpu.set_num_threads(t)
        outs.append(plan(q, pool))
    for o, l in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(l, outs[0][1])
    ref_o, ref_l = attend_torch(q, pool, layout, spec, batch, 0.125)
    torch.testing.assert_close(outs[0][0], ref_o, rtol=5e-3, atol=5e-3)
    torch.testing.assert_close(outs[0][1], ref_l, rtol=5e-3, atol=5e-3)


@needs_kernel
def test_a_plans_thread_count_is_its_own():
    """``CpuAttentionPlan(threads=n)`` runs its calls on n threads whatever the process-wide
    setting says, gives the same bits, and leaves the setting alone."""
    spec = KVSpec.gqa(1, 2, 64, torch.bfloat16)
    q, pool, batch = _case(spec, 64, SEQS, 4)
    ref = _plan(spec, pool, batch, q, chunk=2)(q, pool)
    cpu.set_num_threads(1)
    own = cpu.CpuAttentionPlan(pool, "cpu", spec, batch, 0.125, q.shape[0], q.shape[1], q.dtype,
                               chunk_blocks=2, threads=5)
    assert own._native_args(q, pool, None, None)[0][-2] == 5
    o, l = own(q, pool)
    assert torch.equal(o, ref[0]) and torch.equal(l, ref[1])
    assert cpu.num_threads_setting() == 1
    with pytest.raises(ValueError, match="threads"):
        cpu.CpuAttentionPlan(pool, "cpu", spec, batch, 0.125, q.shape[0], q.shape[1], q.dtype,
                             threads=0)


@needs_kernel
@pytest.mark.parametrize("chunk", [0, 1, 3, 1000])
def test_chunkings_agree_and_empty_rows(chunk):
    """Many chunks per (sequence, head) or one; rows without any valid token are (0, -inf), and
    every row of given output buffers is written (they start as NaN)."""
    spec = KVSpec.mla(1, 64, 16, torch.float32)
    q, pool, batch = _case(spec, 32, SEQS, 1)
    cpu.set_num_threads(3)
    out = torch.full((q.shape[0], q.shape[1], spec.v_dim), float("nan"))
    lse = torch.full((q.shape[0], q.shape[1]), float("nan"))
    o, l = _plan(spec, pool, batch, q, chunk=chunk)(q, pool, out, lse)
    ref_o, ref_l = attend_torch(q, pool, "cpu", spec, batch, 0.125)
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(l, ref_l, rtol=1e-5, atol=1e-5)
    empty = [3, 7]  # the query rows of SEQS[2] (no blocks) and SEQS[5] (no valid token)
    assert q.shape[0] == 9
    assert torch.isneginf(l[empty]).all() and (o[empty] == 0).all()
    assert torch.isfinite(l[[i for i in range(q.shape[0]) if i not in empty]]).all()


@needs_kernel
def test_buffers_reused_across_shapes():
    """Large, then small, then large calls on one thread: nothing of an earlier call leaks."""
    spec = KVSpec.gqa(1, 4, 32, torch.float32)
    cases = [_case(spec, 16, [(2, [16] * 40), (1, [16] * 25)], 2),
             _case(spec, 16, [(1, [3])], 3),
             _case(spec, 16, [(4, [16] * 7), (1, []), (2, [16] * 30)], 4)]
    cpu.set_num_threads(2)
    for _ in range(2):
        for q, pool, batch in cases:
            o, l = _plan(spec, pool, batch, q, chunk=4)(q, pool)
            ref_o, ref_l = attend_torch(q, pool, "cpu", spec, batch, 0.125)
            torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(l, ref_l, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_concurrent_callers():
    """Calls from several Python threads at once (ctypes drops the GIL): each caller thread has
    its own team and its own buffers."""
    spec = KVSpec.mla(1, 64, 16, torch.bfloat16)
    cases = [_case(spec, 32, [(1, [32] * (10 + 7 * i)), (2, [32] * 5)], 10 + i) for i in range(4)]
    refs = [attend_torch(q, pool, "cpu", spec, batch, 0.125) for q, pool, batch in cases]
    plans = [_plan(spec, pool, batch, q, chunk=2) for q, pool, batch in cases]
    cpu.set_num_threads(2)
    errors = []

    def work(i):
        try:
            q, pool, _ = cases[i]
            for _ in range(20):
                o, l = plans[i](q, pool)
                torch.testing.assert_close(o, refs[i][0], rtol=5e-3, atol=5e-3)
                torch.testing.assert_close(l, refs[i][1], rtol=5e-3, atol=5e-3)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@needs_kernel
def test_contention_bench_matrix(tmp_path):
    from writescope.bench import cpu_contention
    res = cpu_contention.main(["--size", "2x300", "--reps", "2", "--gap-ms", "0", "--threads",
                               "2,1", "--spinners", "0", "--layout", "both", "--dma",
                               "--json", str(tmp_path / "m.json")])
    rows = res["rows"]
    dma = [False, True] if torch.cuda.is_available() else [False]
    assert [(r["threads"], r["layout"], r["dma"]) for r in rows] == [
        (t, lay, d) for d in dma for t in (2, 1) for lay in ("cpu", "gpu")]
    assert all(r["spinners"] == 0 and r["p50_ms"] > 0 and r["gbps_p50"] > 0 for r in rows)
    assert all(r["p50_ms"] <= r["p90_ms"] <= r["max_ms"] for r in rows)
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["thread_counts"] == [2, 1] and saved["threads"] == 2
    assert saved["kv_bytes"] == 2 * 300 * 576 * 2
    with pytest.raises(SystemExit):
        cpu_contention.main(["--threads", "2,x"])


@needs_kernel
def test_bf16_queries_entry_point():
    """ws_attend_ex takes bf16 queries (widened while packed, no torch op before the call): the
    results are bit-identical to fp32 queries holding the same values."""
    import ctypes
    spec = KVSpec.mla(1, 64, 16, torch.bfloat16)
    q32, pool, batch = _case(spec, 32, SEQS, 5)
    q16 = q32.to(torch.bfloat16)
    plan = _plan(spec, pool, batch, q16, chunk=3)
    cpu.set_num_threads(2)
    ref_o, ref_l = plan(q16, pool)  # the plan converts to fp32 itself
    lib = cpu._lib
    fn = lib.ws_attend_ex
    i, i64, p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    fn.restype = i
    fn.argtypes = [p, i, i, i, p, i, i, i64, i, i, i, i, i, i, i, p, p, p, p, i, ctypes.c_float,
                   p, p, i, i, i]
    ints = [t.to(torch.int32).contiguous() for t in
            (batch.q_indptr, batch.kv_indptr, batch.kv_blocks, batch.kv_lens)]
    out = torch.empty_like(ref_o)
    lse = torch.empty_like(ref_l)
    isa = cpu._ISA_CODE[cpu.get_isa(spec.dtype)]
    args = [q16.data_ptr(), 1, q16.shape[0], q16.shape[1], pool.data_ptr(), 1, 0, pool.stride(0),
            spec.num_kv_heads, 32, spec.rec_dim, spec.k_offset, spec.k_dim, spec.v_offset,
            spec.v_dim, *(t.data_ptr() for t in ints), batch.num_seqs, 0.125, out.data_ptr(),
            lse.data_ptr(), isa, 2, 3]
    assert fn(*args) == 0
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_l)
    args[1] = 7
    assert fn(*args) < 0  # unknown query dtype


@needs_kernel
def test_flagged_call_waits_for_ready_and_stores_done():
    """CpuAttentionPlan(..., ready=, done=): one native call waits for the ready word, attends
    and stores the done word (the device-side wait's flag) with no Python in between; a ready
    word that never comes times out and still stores done."""
    import time

    import numpy as np
    spec = KVSpec.mla(1, 64, 16, torch.bfloat16)
    q, pool, batch = _case(spec, 32, [(1, [32, 32, 7]), (1, [32, 5])], seed=3)
    q = q.to(torch.bfloat16)
    scale = 0.1
    plan = cpu.CpuAttentionPlan(pool, "cpu", spec, batch, scale, q.shape[0], q.shape[1], q.dtype)
    assert plan.flagged
    want_o, want_l = plan(q, pool)
    words = torch.zeros(2, dtype=torch.int64)
    view = words.numpy()
    addr = words.data_ptr()
    out = torch.empty_like(want_o)
    lse = torch.empty_like(want_l)
    times = []
    # the clock starts before the timer, and the call's own wait has 0.1 s of slack: with a
    # 0.05 s timer started first, this thread descheduled 25 ms before the call (a loaded
    # 2-core machine) saw a wait under 0.03 s
    t0 = time.perf_counter()
    threading.Timer(0.25, lambda: np.copyto(view[0:1], 5)).start()
    o, l = plan(q, pool, out, lse, ready=(addr, 5), done=(addr + 8, 9), times=times)
    assert time.perf_counter() - t0 >= 0.2 and times[0] >= 0.15 and times[1] > 0
    assert o is out and int(view[1]) == 9
    torch.testing.assert_close(o, want_o, rtol=0, atol=0)
    torch.testing.assert_close(l, want_l, rtol=0, atol=0)
    with pytest.raises(TimeoutError):
        plan(q, pool, out, lse, ready=(addr, 6), done=(addr + 8, 10), timeout_s=0.05)
    assert int(view[1]) == 10
