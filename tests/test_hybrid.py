"""HybridAttention orchestration on the CPU: staging ring, pieces, async CPU side, merge.

The GPU side runs the torch path on the CPU (the stand-in), the T blocks go through the staging
ring with synchronous copies, and every layer's output is checked against the float64 dense
reference over each sequence's whole context.
"""
import os
import subprocess
import sys

import pytest
import torch

from writescope.attention.batch import BlockBatch
from writescope.attention.hybrid import AttentionStepPlan, HybridAttention
from writescope.attention.staging import (StagingRing, SyncCopier, coalesce_runs, split_pieces,
                                         strided_copies)
from writescope.bench.attention_case import build_case, rel_err
from writescope.kvcache.regions import KVSpec, Region, pool_shape

GQA = KVSpec.gqa(3, 2, 16, torch.float32)
MLA = KVSpec.mla(2, 32, 16, torch.float32)


def check_all_layers(case, ha, tol=1e-5):
    q = case.random_q("cpu", seed=7)
    ha.begin_step(case.plan)
    outs = [ha.attend(l, q) for l in range(case.spec.num_layers)]
    tm = ha.end_step()
    for l, (o, s) in enumerate(outs):
        ro, rl = case.reference(l, q)
        assert o.dtype == torch.float32 and s.dtype == torch.float32
        assert rel_err(o, ro) < tol, (l, rel_err(o, ro))
        fin = torch.isfinite(rl)
        assert torch.equal(torch.isfinite(s), fin)
        assert torch.allclose(s[fin].double(), rl[fin], atol=1e-4)
    return tm


def test_coalesce_runs():
    ids = torch.tensor([5, 6, 7, 2, 3, 9, 10, 11, 12, 0])
    runs = coalesce_runs(ids).tolist()
    assert runs == [[5, 0, 3], [2, 3, 2], [9, 5, 4], [0, 9, 1]]
    assert coalesce_runs(torch.zeros(0)).shape == (0, 3)


def test_strided_copies_group_equal_runs_at_equal_spacing():
    # four sequences' extents, the last 3 blocks of each (pitch 10), then a lone run, then a
    # decode step's pattern (one block each, pitch 7), then unequal spacing
    runs = [(7, 0, 3), (17, 3, 3), (27, 6, 3), (37, 9, 3), (50, 12, 2),
            (60, 14, 1), (67, 15, 1), (74, 16, 1), (90, 17, 1), (92, 18, 1)]
    assert strided_copies(runs) == [(7, 0, 3, 4, 10), (50, 12, 2, 1, 2), (60, 14, 1, 3, 7),
                                    (90, 17, 1, 2, 2)]
    assert strided_copies(runs, strided=False) == [(s, d, n, 1, n) for s, d, n in runs]
    # a descending or unequal pattern stays one copy per run
    assert strided_copies([(20, 0, 2), (10, 2, 2)]) == [(20, 0, 2, 1, 2), (10, 2, 2, 1, 2)]
    assert strided_copies([(0, 0, 2), (5, 2, 3)]) == [(0, 0, 2, 1, 2), (5, 2, 3, 1, 3)]
    assert strided_copies([]) == []


@pytest.mark.parametrize("strided", [True, False])
def test_sync_copier_moves_strided_copies(strided):
    pool = torch.randn(40, 2, 3)
    ids = torch.tensor([[i * 8 + 5, i * 8 + 6, i * 8 + 7] for i in range(4)]).reshape(-1)
    b = BlockBatch.build([1] * 4, ids.view(4, 3).tolist(), [[2, 2, 2]] * 4)
    (piece,) = split_pieces(b, 64, strided=strided)
    assert len(piece.copies) == (1 if strided else 4)
    dst = torch.zeros(12, 2, 3)
    cp = SyncCopier()
    cp.copy_unit(dst, pool, piece.copies, None)
    assert torch.equal(dst, pool[ids])
    assert cp.bytes == 12 * 2 * 3 * 4 and cp.copies == len(piece.copies)


def test_a_device_batch_keeps_its_host_copy_for_planning():
    b = BlockBatch.build([1, 2], [[4, 5], [9]], [[16, 3], [7]])
    d = b.to("meta")  # any device other than the CPU: no data to wait for
    assert d.kv_blocks.device.type == "meta"
    assert d.host is b and d.host_view() is b and d.to("cpu") is b
    assert d.to("meta").host is b  # a device-to-device copy keeps it too
    assert b.host_view() is b and b.to("cpu").host is None
    (piece,) = split_pieces(d, 8)  # planned from the host copy
    assert piece.runs.tolist() == [[4, 0, 2], [9, 2, 1]]


def test_split_pieces_cover_batch():
    b = BlockBatch.build([1, 2, 1], [[4, 5, 6, 7, 8], [], [20, 21, 1]],
                         [[16, 16, 16, 16, 3], [], [16, 16, 9]])
    pieces = split_pieces(b, 3)
    assert [p.num_blocks for p in pieces] == [3, 3, 2]
    got = [[] for _ in range(3)]
    for p in pieces:
        src = torch.cat([torch.arange(s, s + n) for s, _, n in p.runs.tolist()])
        dst = torch.cat([torch.arange(d, d + n) for _, d, n in p.runs.tolist()])
        slot_to_src = dict(zip(dst.tolist(), src.tolist()))
        ki = p.batch.kv_indptr.tolist()
        for i in range(3):
            got[i] += [(slot_to_src[int(x)], int(n)) for x, n in
                       zip(p.batch.kv_blocks[ki[i]:ki[i + 1]], p.batch.kv_lens[ki[i]:ki[i + 1]])]
        assert torch.equal(p.batch.q_indptr, b.q_indptr)
    assert got == [[(4, 16), (5, 16), (6, 16), (7, 16), (8, 3)], [], [(20, 16), (21, 16), (1, 9)]]


def _consume(ring, pool, plan, layers, flat):
    """Take every unit of a begun step in order, checking each slot's bytes against the pool."""
    for layer in layers:
        at = 0
        for i, piece in enumerate(plan.pieces):
            v = ring.acquire(layer, i)
            assert torch.equal(v, pool[layer, flat[at:at + piece.num_blocks]]), (layer, i)
            at += piece.num_blocks
            ring.release(layer, i)


@pytest.mark.parametrize("equal", ["1", "0"])
def test_a_layer_larger_than_half_the_ring_is_cut_into_equal_pieces(monkeypatch, equal):
    """A layer's 9 blocks in a ring of 16: two pieces of 5 and 4 blocks in 3 slots (1.5 layers
    in flight), not 8 and 1 in 2 slots (``WRITESCOPE_STAGING_EQUAL_PIECES=0``, as before); the
    same bytes reach the same positions either way."""
    monkeypatch.setenv("WRITESCOPE_STAGING_EQUAL_PIECES", equal)
    pool = torch.randn(3, 24, 4, 2, 8)
    ids = [[2, 3, 4, 9, 10], [7, 8, 20, 21]]
    b = BlockBatch.build([1, 1], ids, [[4] * 5, [4, 4, 4, 1]])
    ring = StagingRing((4, 2, 8), torch.float32, "cpu", staging_bytes=16 * 4 * 2 * 8 * 4)
    plan = ring.plan(b)
    want = ([5, 4], 5, 3) if equal == "1" else ([8, 1], 8, 2)
    assert ([p.num_blocks for p in plan.pieces], plan.slot_blocks, plan.num_slots) == want
    flat = [x for row in ids for x in row]
    ring.begin(pool, plan, [0, 1, 2])
    _consume(ring, pool, plan, [0, 1, 2], flat)
    ring.finish()
    # a layer that fits half the ring stays one piece; a capped piece is evened out too
    small = BlockBatch.build([1], [[1, 2, 3]], [[4, 4, 4]])
    assert [p.num_blocks for p in ring.plan(small).pieces] == [3]
    assert [p.num_blocks for p in ring.plan(b, max_slot_blocks=4).pieces] == \
        ([3, 3, 3] if equal == "1" else [4, 4, 1])


def test_the_ring_stages_the_next_steps_first_units_ahead(monkeypatch):
    """``WRITESCOPE_STAGING_AHEAD=1``: once a step's units are all issued, the slots its last
    units free take the next step's first units (as many as the window allows); the next step
    with the same plan starts with them (the same bytes, the same copies counted in it), one
    with another plan drops them and stages its own."""
    monkeypatch.setenv("WRITESCOPE_STAGING_AHEAD", "1")
    pool = torch.randn(3, 24, 4, 2, 8)
    ids = [[2, 3, 4, 9, 10], [7, 8, 20, 21]]
    flat = [x for row in ids for x in row]
    b = BlockBatch.build([1, 1], ids, [[4] * 5, [4, 4, 4, 1]])
    ring = StagingRing((4, 2, 8), torch.float32, "cpu", staging_bytes=16 * 4 * 2 * 8 * 4)
    assert ring.ahead
    plan = ring.plan(b)  # two pieces a layer in 3 slots
    ring.begin(pool, plan, [0, 1, 2])
    _consume(ring, pool, plan, [0, 1, 2], flat)
    first = (ring.copier.copies, ring.copier.bytes)
    ring.finish()
    assert ring.ahead_units == {"used": 0, "dropped": 0}
    pool[0, 2] += 1  # (not a T block's life -- they never change -- but shows what was moved)
    ring.begin(pool, plan, [0, 1, 2])
    assert ring._issued == 3 and ring.ahead_units["used"] == 3  # layer 0 and layer 1's first
    with pytest.raises(AssertionError):  # the first unit was moved in the step before
        _consume(ring, pool, plan, [0], flat)
    pool[0, 2] -= 1
    ring.begin(pool, plan, [0, 1, 2])  # the step before was left: nothing staged ahead
    assert ring._issued == 1 and ring.ahead_units["used"] == 3
    _consume(ring, pool, plan, [0, 1, 2], flat)
    assert (ring.copier.copies, ring.copier.bytes) == first
    ring.finish()
    other = ring.plan(b)  # an equal plan, another object: its own units
    ring.begin(pool, other, [0, 1, 2])
    assert ring._issued == 1 and ring.ahead_units["dropped"] == 3
    _consume(ring, pool, other, [0, 1, 2], flat)
    assert (ring.copier.copies, ring.copier.bytes) == first
    ring.finish()
    ring.drop_ahead()
    assert ring.ahead_units == {"used": 3, "dropped": 6}
    ring.begin(pool, other, [2, 1, 0])  # nothing staged ahead now
    _consume(ring, pool, other, [2, 1, 0], flat)
    ring.finish()


@pytest.mark.parametrize("spec", [GQA, MLA])
def test_hybrid_steps_with_units_staged_ahead_match_the_reference(monkeypatch, spec):
    """Three steps of one plan with the staging ring working ahead: the second and third start
    from units the step before staged, and every layer's result is the reference's; every step
    counts the same link bytes."""
    monkeypatch.setenv("WRITESCOPE_STAGING_AHEAD", "1")
    case = build_case(spec, 4, [70, 3, 0, 129, 40], q_counts=[1, 3, 2, 1, 4], block_size=8,
                      frac={"G": 0.2, "T": 0.5, "C": 0.3}, cpu_t_frac=0.3, seed=2)
    blk = 8 * spec.num_kv_heads * spec.rec_dim * 4
    ha = HybridAttention(case.pools, spec, "cpu", cpu_threads=1, staging_bytes=7 * blk,
                         stage_t=True)
    n_t_gpu = dict(case.plan.gpu)[Region.T].num_blocks
    for _ in range(3):
        tm = check_all_layers(case, ha)
        assert tm["pcie_bytes"] == n_t_gpu * blk * spec.num_layers
    assert ha.ring.ahead_units["used"] > 0 and ha.ring.ahead_units["dropped"] == 0
    ha.close()


def test_ring_stages_right_bytes_in_order():
    pool = torch.randn(3, 12, 4, 2, 8)
    b = BlockBatch.build([1, 1], [[2, 3, 4, 9], [7, 8]], [[4] * 4, [4, 1]])
    ring = StagingRing((4, 2, 8), torch.float32, "cpu", staging_bytes=3 * 4 * 2 * 8 * 4)
    plan = ring.plan(b)
    assert plan.slot_blocks == 1 and plan.num_slots == 3
    ring.begin(pool, plan, [0, 1, 2])
    for layer in range(3):
        flat = [2, 3, 4, 9, 7, 8]
        for i, piece in enumerate(plan.pieces):
            v = ring.acquire(layer, i)
            assert torch.equal(v[0], pool[layer, flat[i]])
            ring.release(layer, i)
    with pytest.raises(RuntimeError):
        ring.begin(pool, plan, [0, 1])
        ring.acquire(1, 0)
    ring.finish()


@pytest.mark.parametrize("spec,hq", [(GQA, 4), (MLA, 4)])
@pytest.mark.parametrize("stage_bytes_blocks", [None, 5, 64])
@pytest.mark.parametrize("cpu_async", [True, False])
def test_hybrid_matches_reference(spec, hq, stage_bytes_blocks, cpu_async):
    case = build_case(spec, hq, [70, 3, 0, 129, 40], q_counts=[1, 3, 2, 1, 4], block_size=8,
                      frac={"G": 0.2, "T": 0.5, "C": 0.3}, cpu_t_frac=0.3, seed=1)
    blk = 8 * spec.num_kv_heads * spec.rec_dim * 4
    stage = stage_bytes_blocks is not None
    ha = HybridAttention(case.pools, spec, "cpu", cpu_threads=1,
                         staging_bytes=(stage_bytes_blocks or 1) * blk, stage_t=stage,
                         cpu_async=cpu_async)
    assert ha.staging_bytes == (stage_bytes_blocks * blk if stage else 0)
    tm = check_all_layers(case, ha)
    assert {"cpu_s", "gpu_s", "pcie_s"} <= set(tm)
    if stage:
        n_t_gpu = dict(case.plan.gpu)[Region.T].num_blocks
        assert tm["pcie_bytes"] == n_t_gpu * blk * spec.num_layers
    ha.close()


@pytest.mark.parametrize("paired", ["1", "0"])
def test_cpu_side_reading_two_regions_in_one_call_or_two(monkeypatch, paired):
    """C blocks and T blocks read in place by the CPU side: one kernel call over both pools
    (the default), or two calls and a merge (``WRITESCOPE_CPU_PAIR_CALLS=0``); the same result."""
    monkeypatch.setenv("WRITESCOPE_CPU_PAIR_CALLS", paired)
    case = build_case(MLA, 4, [70, 3, 0, 129, 40], q_counts=[1, 3, 2, 1, 4], block_size=8,
                      frac={"G": 0.2, "T": 0.5, "C": 0.3}, cpu_t_frac=0.5, seed=3)
    assert {r for r, _ in case.plan.cpu} == {Region.C, Region.T}
    from writescope.attention import cpu
    calls = []
    real = cpu.CpuAttentionPlan.__call__

    def counted(self, *args, second=None, **kw):
        calls.append(second is not None)
        return real(self, *args, second=second, **kw)

    monkeypatch.setattr(cpu.CpuAttentionPlan, "__call__", counted)
    ha = HybridAttention(case.pools, MLA, "cpu", cpu_threads=2, staging_bytes=0, stage_t=False)
    check_all_layers(case, ha)
    ha.close()
    if cpu.available():  # the compiled kernel: one call a layer, or two
        assert calls == ([True] * MLA.num_layers if paired == "1" else [False] * 2 * MLA.num_layers)


def test_torch_workers_thread_count_stays_its_own():
    """The torch fallback's worker runs torch with ``cpu_threads`` threads; torch's process
    default, which threads that start parallel work later inherit (a server's, the CPU experts'
    worker), stays what it was."""
    import threading
    from writescope.attention.torch_paged import attend_torch
    before = torch.get_num_threads()
    n = 1 if before > 1 else 2
    case = build_case(MLA, 4, [70, 3, 129], q_counts=1, block_size=8,
                      frac={"G": 0.2, "T": 0.3, "C": 0.5}, seed=5)
    ha = HybridAttention(case.pools, MLA, "cpu", cpu_threads=n, cpu_attend=attend_torch)
    check_all_layers(case, ha)
    assert ha._worker is not None and ha._worker.submit(torch.get_num_threads).result() == n
    seen = []

    def later():
        torch.ones(64, 64) @ torch.ones(64, 64)  # starts this thread's parallel work
        seen.append(torch.get_num_threads())
    t = threading.Thread(target=later)
    t.start()
    t.join()
    assert seen == [before] and torch.get_num_threads() == before
    ha.close()


def test_cpu_threads_belong_to_the_instance():
    """An explicit ``cpu_threads`` goes into this instance's kernel plans; the process-wide
    kernel setting (what a later engine without a count would inherit) is left as it was."""
    from writescope.attention import cpu
    before = cpu.num_threads_setting()
    case = build_case(MLA, 4, [70, 3, 129], q_counts=1, block_size=8,
                      frac={"G": 0.2, "T": 0.3, "C": 0.5}, seed=5)
    ha = HybridAttention(case.pools, MLA, "cpu", cpu_threads=3, cpu_async=False)
    check_all_layers(case, ha)
    assert cpu.num_threads_setting() == before
    if ha._cpu_compiled:  # the plans of a step in progress
        ha.begin_step(case.plan)
        ha.attend(0, case.random_q("cpu", seed=7))
        plans = [pl for g in ha._groups for _, pl in g.cpu_plans or []]
        ha.end_step()
        assert plans and all(pl.threads == 3 for pl in plans)
    ha.close()


def test_hybrid_two_steps_and_all_cpu_all_gpu():
    for frac in ({"C": 1.0}, {"T": 1.0}, {"G": 1.0}):
        case = build_case(GQA, 4, [33, 64, 5], q_counts=2, block_size=8, frac=frac, seed=3)
        ha = HybridAttention(case.pools, GQA, "cpu", staging_bytes=4 * 8 * 2 * 32 * 4,
                             stage_t=True)
        check_all_layers(case, ha)
        check_all_layers(case, ha)  # a second step reuses the ring and the worker
        ha.close()


def _per_seq(b: BlockBatch) -> tuple[list[int], list[list[int]], list[list[int]]]:
    qi, ki = b.q_indptr.tolist(), b.kv_indptr.tolist()
    return ([qi[i + 1] - qi[i] for i in range(len(qi) - 1)],
            [b.kv_blocks[ki[i]:ki[i + 1]].tolist() for i in range(len(ki) - 1)],
            [b.kv_lens[ki[i]:ki[i + 1]].tolist() for i in range(len(ki) - 1)])


def _copied(plan: AttentionStepPlan) -> AttentionStepPlan:
    """The same plan in new tensors (a caller that builds every step's plan afresh)."""
    cp = lambda b: BlockBatch(*(t.clone() for t in (b.q_indptr, b.kv_indptr, b.kv_blocks,  # noqa
                                                   b.kv_lens)))
    return AttentionStepPlan(plan.spec, plan.scale, plan.num_q_rows,
                             gpu=[(r, cp(b)) for r, b in plan.gpu],
                             cpu=[(r, cp(b)) for r, b in plan.cpu])


def _one_t_block_to_the_cpu(plan: AttentionStepPlan) -> AttentionStepPlan:
    """The plan with sequence 0's last GPU-side T block read in place by the CPU instead."""
    gpu, cpu = dict(plan.gpu), dict(plan.cpu)
    qn, blocks, lens = _per_seq(gpu[Region.T])
    _, cb, cl = _per_seq(cpu[Region.T]) if Region.T in cpu else (qn, [[] for _ in qn],
                                                                  [[] for _ in qn])
    cb[0].append(blocks[0].pop())
    cl[0].append(lens[0].pop())
    gpu[Region.T] = BlockBatch.build(qn, blocks, lens)
    cpu[Region.T] = BlockBatch.build(qn, cb, cl)
    return AttentionStepPlan(plan.spec, plan.scale, plan.num_q_rows, gpu=list(gpu.items()),
                             cpu=list(cpu.items()))


@pytest.mark.parametrize("reuse", ["1", "0"])
def test_a_step_with_the_last_steps_t_batches_reuses_its_staging_plan(reuse, monkeypatch):
    """The staging ring's plan is made again only when the step's T batches differ from the last
    step's: equal values in new tensors are the same batches, a batch refilled in place with
    other values is not (the plan keeps a copy of what it was made for);
    ``WRITESCOPE_STAGE_PLAN_REUSE=0`` plans every step. Every step's output is the reference's."""
    monkeypatch.setenv("WRITESCOPE_STAGE_PLAN_REUSE", reuse)
    case = build_case(GQA, 4, [70, 33, 129], q_counts=1, block_size=8,
                      frac={"G": 0.2, "T": 0.5, "C": 0.3}, seed=11)
    blk = 8 * GQA.num_kv_heads * GQA.rec_dim * 4
    ha = HybridAttention(case.pools, GQA, "cpu", staging_bytes=6 * blk, stage_t=True)

    def step(plan):
        case.plan = plan
        check_all_layers(case, ha)
        return ha._stage_reuse[1]

    first = case.plan
    sp = step(first)
    assert len(sp.pieces) > 1  # the ring is smaller than a layer's T blocks
    same = step(_copied(first))
    assert (same is sp) == (reuse == "1")
    moved = _one_t_block_to_the_cpu(first)
    other = step(moved)
    assert other is not sp and other.num_blocks == sp.num_blocks - 1
    # back to the first plan's values (new tensors), then those tensors refilled in place
    t_moved = dict(moved.gpu)[Region.T]
    t_first = dict(first.gpu)[Region.T]
    refill = _copied(first)
    t_refill = dict(refill.gpu)[Region.T]
    assert t_refill.num_blocks != t_moved.num_blocks
    again = step(refill)
    assert again is not other and again.num_blocks == sp.num_blocks
    assert torch.equal(t_refill.kv_blocks, t_first.kv_blocks)
    t_refill.kv_blocks[:2] = t_refill.kv_blocks[:2].flip(0).clone()  # same count, new order
    flipped = step(refill)
    assert flipped is not again
    # five steps with T blocks to stream: the second kept the first's plan when reuse is on
    assert ha.stage_plans == ({"made": 4, "reused": 1} if reuse == "1" else {"made": 5, "reused": 0})
    ha.close()


def test_empty_plan_gives_identity():
    pools = {r: torch.zeros(GQA.num_layers, 2, 8, 2, 32) for r in (Region.G, Region.W, Region.T)}
    pools[Region.C] = torch.zeros(pool_shape(Region.C, GQA, 2, 8))
    ha = HybridAttention(pools, GQA, "cpu", stage_t=True, staging_bytes=2**16)
    ha.begin_step(AttentionStepPlan(GQA, 0.25, 3))
    o, l = ha.attend(0, torch.randn(3, 4, 16))
    ha.end_step()
    assert torch.equal(o, torch.zeros(3, 4, 16)) and bool(torch.isneginf(l).all())


def test_out_of_order_layers_rejected():
    case = build_case(GQA, 4, [40], block_size=8, frac={"T": 1.0}, w_tail=False)
    ha = HybridAttention(case.pools, GQA, "cpu", stage_t=True, staging_bytes=2**20)
    ha.begin_step(case.plan)
    with pytest.raises(RuntimeError):
        ha.attend(1, case.random_q("cpu"))
    ha.close()


INTERPRETER_PROBE = r"""
import torch, triton, triton.language as tl
@triton.jit
def k(N, O, B: tl.constexpr):
    n = tl.load(N + tl.program_id(0))
    acc = tl.zeros([B], dtype=tl.float32)
    for p in range(0, n, B):
        acc += 1.0
    tl.store(O + tl.program_id(0), tl.sum(acc))
k[(1,)](torch.tensor([5], dtype=torch.int32), torch.zeros(1), B=2)
print("ok")
"""


def interpreter_runs_loaded_loops() -> str | None:
    """None when Triton's CPU interpreter can run a loop bounded by a loaded value (the decode
    kernels' chunk loops); else why not (Triton 3.6's interpreter with numpy >= 2 cannot)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", INTERPRETER_PROBE], env=env, capture_output=True,
                       text=True, timeout=120)
    if r.returncode == 0 and r.stdout.strip().endswith("ok"):
        return None
    return (r.stderr.strip().splitlines() or ["unknown error"])[-1][:200]


def test_triton_kernels_under_interpreter():
    """The Triton kernels themselves, run by Triton's CPU interpreter (skipped without Triton)."""
    pytest.importorskip("triton")
    why = interpreter_runs_loaded_loops()
    if why is not None:
        pytest.skip(f"Triton's interpreter cannot run data-bounded loops here: {why}")
    code = r"""
import torch
from writescope.attention.gpu import attend_gpu
from writescope.bench.attention_case import build_case, rel_err
from writescope.kvcache.regions import KVSpec, Region, pool_shape
for spec, hq in ((KVSpec.gqa(1, 2, 32, torch.float32), 8), (KVSpec.mla(1, 64, 16, torch.float32), 4)):
  for qc in ([1, 2, 3, 1], [1, 20, 3, 1]):  # the second: a prefill-sized chunk of rows
    case = build_case(spec, hq, [40, 0, 17, 33], q_counts=qc, block_size=16,
                      frac={"G": 1.0}, seed=5)
    q = case.random_q("cpu")
    batch = dict(case.plan.gpu)[Region.G]
    for chunk in (1, None):
        o, l = attend_gpu(q, case.pools[Region.G][0], "gpu", spec, batch, case.scale,
                          chunk_blocks=chunk)
        # reference over the G blocks only
        sub = build_case.__globals__["Case"](spec, hq, case.scale, case.pools, case.plan,
              [[b for b in s if b[0] is Region.G] for s in case.seqs], case.q_counts)
        ro, rl = sub.reference(0, q)
        assert rel_err(o, ro) < 1e-5, rel_err(o, ro)
        assert torch.equal(torch.isfinite(l), torch.isfinite(rl))
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


REDUCE_CODE = r"""
import torch
from writescope.attention import gpu as G
from writescope.bench import gpu_attention as B
from writescope.attention.merge import merge, merge_many
torch.manual_seed(0)
# rows with 0, 1, 3 and 70 partials (the last: one long sequence's split-K), heads 16 x 40 values
counts = [0, 1, 3, 70]
nq, hq, dv = len(counts), 16, 40
P = sum(counts) + 5
po, pl = torch.randn(P, hq, dv), torch.randn(P, hq) * 3
pl[2, 3] = float("-inf"); po[2, 3] = 0.0  # an empty partial
perm = torch.randperm(P)[:sum(counts)]
ptr = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32)
xo, xl = torch.randn(nq, hq, dv), torch.randn(nq, hq)
xl[1] = float("-inf")
for cfg in (None, G.ReduceConfig(1, 16, 32), G.ReduceConfig(4, 64, 8), G.ReduceConfig(2, 32, 16),
            G.ReduceConfig(1, 32, 128), G.ReduceConfig(2, 16, 64)):  # steps past a row's partials
    for extra in (None, (xo, xl)):
        out, lse = torch.empty(nq, hq, dv), torch.empty(nq, hq)
        G.launch_reduce(po, pl, ptr, perm, out, lse, extra, cfg)
        for r in range(nq):
            parts = [(po[int(i)], pl[int(i)]) for i in perm[int(ptr[r]):int(ptr[r + 1])]]
            if extra is not None:
                parts.append((xo[r], xl[r]))
            if not parts:
                assert bool(torch.isneginf(lse[r]).all()) and not bool(out[r].any())
                continue
            ro, rl = merge_many(parts)
            fin = torch.isfinite(rl)
            assert torch.equal(torch.isfinite(lse[r]), fin), (cfg, r)
            assert torch.allclose(lse[r][fin], rl[fin], atol=1e-5), (cfg, r)
            assert torch.allclose(out[r][fin], ro[fin], atol=1e-5), (cfg, r)
# the same merge in two levels (64: rows of more than 64 only), with the extra partial (once:
# it reads no tile config, and the interpreter takes minutes over every repetition)
extra = (xo, xl)
for fanin in (2, 3, 64):
    tree = B.plan_tree(ptr, fanin)
    out2, lse2 = torch.empty(nq, hq, dv), torch.empty(nq, hq)
    out1, lse1 = torch.empty(nq, hq, dv), torch.empty(nq, hq)
    G.launch_reduce(po, pl, ptr, perm, out1, lse1, extra)
    B.launch_reduce_tree(po, pl, perm, tree, out2, lse2, extra)
    fin = torch.isfinite(lse1)
    assert torch.equal(torch.isfinite(lse2), fin), fanin
    assert torch.allclose(lse2[fin], lse1[fin], atol=1e-5), fanin
    assert torch.allclose(out2, out1, atol=1e-5), fanin
assert G.reduce_config(1, 16, 512) == G.ReduceConfig(1, 32, 128)
assert G.reduce_config(512, 32, 128) == G.ReduceConfig(4, 64, 8)
print("ok")
"""


def test_merge_tree_plan_groups_each_rows_partials():
    """The two-level merge's plan: every row's partials in runs of at most ``fanin``, in order,
    tiling the row CSR; level 2's CSR counts each row's groups; none when one level does it."""
    import numpy as np
    from writescope.bench import gpu_attention as G
    counts = [0, 1, 3, 70, 0, 64, 65]
    ptr = torch.tensor([0] + list(np.cumsum(counts)), dtype=torch.int32)
    assert G.plan_tree(ptr, 70) is None and G.plan_tree(torch.zeros(1, dtype=torch.int32), 4) is None
    with pytest.raises(ValueError):
        G.plan_tree(ptr, 1)
    for fanin in (2, 3, 32, 64):
        t = G.plan_tree(ptr, fanin)
        gp, rp = t.group_ptr.numpy(), t.row_ptr.numpy()
        assert gp[0] == 0 and gp[-1] == sum(counts) and (np.diff(gp) >= 1).all()
        assert (np.diff(gp) <= fanin).all() and t.num_groups == gp.size - 1
        assert t.row_idx.tolist() == list(range(t.num_groups)) and rp[-1] == t.num_groups
        for r, c in enumerate(counts):
            g0, g1 = rp[r], rp[r + 1]
            assert g1 - g0 == -(-c // fanin)
            if c:  # the row's groups cover exactly its own entries
                assert gp[g0] == ptr[r] and gp[g1] == ptr[r + 1]


def test_the_resident_sweep_tries_wider_merge_steps_for_few_rows():
    """The resident bench times the merge's default tiles and, for a few rows of many partials
    (one long sequence), partial steps of 32-128 and a narrower value tile; never a step over 8K
    values, never the same tile twice."""
    from writescope.attention import gpu as G
    from writescope.bench.gpu_attention import reduce_variants
    one = reduce_variants(G.reduce_config(1, 16, 512))
    assert one[0] == G.reduce_config(1, 16, 512) and len(one) == len(set(one)) == 4
    assert sorted({c.block_e for c in one}) == [32, 64, 128]  # the default's 128 against 32, 64
    eight = reduce_variants(G.reduce_config(8, 16, 512))
    assert eight[0].block_e == 32 and {c.block_e for c in eight} == {32, 64, 128}
    for rows, hq, dv in ((1, 16, 512), (8, 32, 128), (64, 16, 512)):
        for c in reduce_variants(G.reduce_config(rows, hq, dv)):
            assert c.block_e * c.block_h * c.block_dv <= 8192 and c.block_dv >= 16
    many = reduce_variants(G.reduce_config(64, 16, 512))  # many rows: no wider steps fit
    assert [c.block_e for c in many] == [8, 16]


def test_the_gpu_attention_summary_gives_the_kernels_device_rate_beside_the_queued_one():
    """The resident column: the default's queued GB/s (% of the HBM copy rate), the default
    replayed from a CUDA graph (the engine's form for a resident step), the sweep's best, and
    the default's kernels alone (profiler time), '-' where no graph or profiler ran."""
    from writescope.bench.gpu_attention_report import summary_markdown
    out = {"ceilings": {"hbm_copy_GBps": 4000.0, "h2d_pinned_GBps": 55.0,
                        "combined": {"combined_GBps": 130.0, "h2d_GBps": 50.0,
                                     "cpu_read_GBps": 80.0, "threads": 14}},
           "machine": {"cpu_kernel": "k"},
           "results": {"mla/1x256K": {"resident": {"default_GBps": 2000.0, "GBps": 3000.0,
                                                   "default_graph_GBps": 3100.0,
                                                   "default_device_GBps": 3400.0}},
                       "mla/8x32K": {"resident": {"default_GBps": 2800.0, "GBps": 2800.0,
                                                  "default_device_GBps": None}}}}
    text = summary_markdown(out)
    assert "| mla/1x256K | 2000 (50%) / 3100 (78%) / 3000 / 3400 (85%) |" in text, text
    assert "| mla/8x32K | 2800 (70%) / - / 2800 / - |" in text, text


def test_the_gpu_attention_breakdown_splits_each_hybrid_row(tmp_path, capsys):
    """--breakdown FILE: each hybrid row's link rate (T bytes over first to last copy), CPU rate
    (C bytes over the kernel's seconds), its wait for queries, the first copy's start and the
    device's time after the last copy; '-' where a side had nothing. A file that is not a run
    is a clear error."""
    import json
    from writescope.bench.gpu_attention import main
    gb = 1e9
    out = {"ceilings": {"hbm_copy_GBps": 4000.0, "h2d_pinned_GBps": 55.0,
                        "combined": {"combined_GBps": 125.0, "h2d_GBps": 50.0,
                                     "cpu_read_GBps": 75.0, "threads": 16}},
           "machine": {"cpu_kernel": "k"},
           "results": {"mla/8x32K": {
               "bytes_per_step": 2.5 * gb,
               "streamed": {"512": {"GBps": 50.0}},
               "hybrid": {
                   "0.00": {"s": 0.05, "GBps": 50.0, "cpu_s": 0.0, "pcie_bytes": 2.5 * gb,
                            "dev_first_copy_s": 0.001, "dev_last_copy_s": 0.049,
                            "dev_end_s": 0.0495},
                   "0.60": {"s": 0.02, "GBps": 125.0, "cpu_s": 0.015, "cpu_q_wait_s": 0.0012,
                            "pcie_bytes": 1.0 * gb, "dev_first_copy_s": 0.0005,
                            "dev_last_copy_s": 0.0205, "dev_end_s": 0.021},
                   "1.00": {"s": 0.03, "GBps": 83.3, "cpu_s": 0.025, "cpu_q_wait_s": 0.0003,
                            "pcie_bytes": 0.0}}}}}
    f = tmp_path / "run.json"
    f.write_text(json.dumps(out))
    assert main(["--breakdown", str(f)]) == 0
    text = capsys.readouterr().out
    assert "| mla/8x32K | - | 50.0 (91%) | 125.0 (0.60) | 100% | 2.50x | 83.3 |" in text, text
    assert "| mla/8x32K | 0.60 | 125.0 (100%) | 50.0 | 100.0 | 1.20 | 0.50 | 0.50 | 20.00 |" \
        in text, text
    assert "| mla/8x32K | 0.00 | 50.0 (40%) | 52.1 | - | - | 1.00 | 0.50 | 50.00 |" in text
    assert "| mla/8x32K | 1.00 | 83.3 (67%) | - | 100.0 | 0.30 | - | - | 30.00 |" in text
    (tmp_path / "bad.json").write_text("[1, 2]")
    for bad in (tmp_path / "bad.json", tmp_path / "missing.json"):
        assert main(["--breakdown", str(bad)]) == 2
        assert "cannot read" in capsys.readouterr().err


RESIDENT_SWEEP_CODE = r"""
import torch
from writescope.bench import gpu_attention as B
from writescope.kvcache.regions import KVSpec
B.BATCHES = {"tiny": (2, 256)}
B.SHAPES = {"gqa": (lambda L: KVSpec.gqa(L, 2, 32, torch.float32), 8, "tiny")}
B.CONFIGS.clear(); B.CONFIGS.update({"gqa": []})
B._queued_time = lambda fn, reps: (fn(), 1e-3)[1]  # no device clock here: run once
B.TREE_FANINS = (2, 3)  # rows of 4 partials (below): both fan-ins make a tree
import writescope.attention.gpu as G
G.choose_chunk_blocks = lambda *a, **k: 1
r = B.bench_resident("gqa", "tiny", "cpu", 1)
merges = [k for k in r["variants"] if "/reduce-" in k or "/tree" in k]
assert len(merges) == 6 and all("error" not in r["variants"][k] for k in merges), r["variants"]
assert r["rel_err_vs_torch"] < 1e-5, r["rel_err_vs_torch"]
assert r["tree_rel_err_vs_torch"] < 1e-5, r["tree_rel_err_vs_torch"]
assert r["default_kernels_us"] == {}, r["default_kernels_us"]  # no device profiler here
assert r["default_device_GBps"] is None
print("ok")
"""


def test_resident_sweep_under_interpreter():
    """The resident bench's sweep, merge tiles included, runs end to end (Triton's CPU
    interpreter, fp32, a tiny batch; timing stubbed: only the device has a clock for it)."""
    pytest.importorskip("triton")
    why = interpreter_runs_loaded_loops()
    if why is not None:
        pytest.skip(f"Triton's interpreter cannot run data-bounded loops here: {why}")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", RESIDENT_SWEEP_CODE], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_merge_kernel_under_interpreter():
    """The split-K merge kernel (one online pass; narrow tiles for few rows) against
    :func:`merge_many`, with empty rows, empty partials and an extra (CPU-side) partial."""
    pytest.importorskip("triton")
    why = interpreter_runs_loaded_loops()
    if why is not None:
        pytest.skip(f"Triton's interpreter cannot run data-bounded loops here: {why}")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", REDUCE_CODE], env=env, capture_output=True,
                       text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.parametrize("spec,hq", [(GQA, 4), (MLA, 4)])
@pytest.mark.parametrize("piece_blocks", [1, 3, 1000])
def test_gpu_side_reads_c_blocks_through_gather(spec, hq, piece_blocks):
    """Prefill chunks give C blocks to the GPU side: they are gathered piece by piece into a
    device buffer and re-laid-out there; the C pool itself is only read."""
    case = build_case(spec, hq, [70, 3, 0, 129, 40], q_counts=[1, 30, 2, 17, 4], block_size=8,
                      frac={"G": 0.2, "T": 0.3, "C": 0.5}, seed=5)
    c_before = case.pools[Region.C].clone()
    case.plan = AttentionStepPlan(case.plan.spec, case.plan.scale, case.plan.num_q_rows,
                                  gpu=case.plan.gpu + case.plan.cpu, cpu=[])
    blk = 8 * spec.num_kv_heads * spec.rec_dim * 4
    ha = HybridAttention(case.pools, spec, "cpu", stage_t=True, staging_bytes=4 * blk,
                         stage_c=True, gather_bytes=2 * piece_blocks * blk)
    assert ha.cgather.piece_blocks == piece_blocks
    assert ha.staging_bytes == 4 * blk + 2 * piece_blocks * blk
    check_all_layers(case, ha)
    n_c = dict(case.plan.gpu)[Region.C].num_blocks
    assert ha.cgather.bytes == n_c * blk * spec.num_layers
    assert torch.equal(case.pools[Region.C], c_before)
    ha.close()


@pytest.mark.parametrize("spec,hq", [(GQA, 4), (MLA, 4)])
def test_gathered_c_blocks_that_sequences_share_are_gathered_once(spec, hq):
    """Prefill chunks sharing C blocks (a cached prefix): a gather piece fetches each once."""
    case = build_case(spec, hq, [200, 180, 129, 150], q_counts=[9, 20, 17, 8], block_size=8,
                      frac={"G": 0.1, "T": 0.2, "C": 0.7}, seed=6, shared_c=10)
    case.plan = AttentionStepPlan(case.plan.spec, case.plan.scale, case.plan.num_q_rows,
                                  gpu=case.plan.gpu + case.plan.cpu, cpu=[])
    c_batch = dict(case.plan.gpu)[Region.C]
    distinct = len(set(c_batch.kv_blocks.tolist()))
    assert distinct < c_batch.num_blocks
    blk = 8 * spec.num_kv_heads * spec.rec_dim * 4
    ha = HybridAttention(case.pools, spec, "cpu", stage_t=True, staging_bytes=64 * blk,
                         stage_c=True, gather_bytes=2 * 200 * blk)
    check_all_layers(case, ha)
    assert ha.cgather.bytes == distinct * blk * spec.num_layers  # one piece: each block once
    ha.close()


def test_cpu_side_plans_once_and_writes_into_given_buffers():
    """The compiled CPU kernel is planned on a step's first layer and then writes each layer's
    (out, lse) straight into the buffers the GPU side reads (pinned on CUDA)."""
    from writescope.attention import cpu as cpu_mod
    from writescope.attention.torch_paged import attend_torch
    if not cpu_mod.available():
        pytest.skip("no compiled CPU kernel here")
    spec = KVSpec.gqa(3, 2, 16, torch.float32)
    case = build_case(spec, 4, [70, 3, 129], q_counts=1, block_size=8,
                      frac={"G": 0.3, "C": 0.7}, seed=2)
    ha = HybridAttention(case.pools, spec, "cpu")
    assert ha._cpu_attend is cpu_mod.attend_cpu
    ha.begin_step(case.plan)
    q_all = case.random_q("cpu", seed=3)
    (region, batch), = case.plan.cpu
    # the CPU side sees only the rows of sequences with CPU blocks (compact_cpu_rows)
    (g,) = ha._groups
    rows = g.cpu_rows if g.cpu_rows is not None else torch.arange(q_all.shape[0])
    q = q_all[rows]
    for layer in range(spec.num_layers):
        bo = torch.full((q.shape[0], 4, spec.v_dim), float("nan"))
        bl = torch.full((q.shape[0], 4), float("nan"))
        o, l, _ = ha._cpu_job(layer, g, q, None, (bo, bl))
        assert o is bo and l is bl
        ro, rl = attend_torch(q_all, case.pools[region][layer], "cpu", spec, batch,
                              case.plan.scale)
        assert torch.allclose(bo, ro[rows], atol=1e-5) and torch.allclose(bl, rl[rows], atol=1e-5)
    assert len(g.cpu_plans) == 1
    ha.end_step()
    ha.close()


def test_ready_poll_returns_when_raised_and_times_out_when_not():
    """hostflag.Ready: the host side of a device->host ready flag (no CUDA needed)."""
    import threading
    import time

    import numpy as np

    from writescope.attention.hostflag import Ready
    view = np.zeros(2, dtype=np.int64)
    r = Ready(view, 1, 3)
    assert not r.query()
    threading.Timer(0.05, lambda: np.copyto(view[1:2], 3)).start()
    t0 = time.perf_counter()
    r.synchronize(timeout=10)
    assert r.query() and time.perf_counter() - t0 < 5
    with pytest.raises(TimeoutError, match="flag 0"):
        Ready(view, 0, 1).synchronize(timeout=0.05)


def test_cpu_side_gets_only_the_rows_of_sequences_with_cpu_blocks(monkeypatch):
    """A step mixing sequences with CPU blocks and one without (5 cached tokens: only a W tail;
    20 query rows, like a prefill chunk): the CPU job gets only the former's rows, and every
    layer matches the float64 reference and the all-rows path."""
    from writescope.attention.groups import compact_cpu_rows
    spec = KVSpec.mla(2, 32, 8, torch.float32)
    case = build_case(spec, 4, [90, 5, 70], q_counts=[1, 20, 1], block_size=8,
                      frac={"G": 0.3, "C": 0.7}, seed=11)
    compacted, rows = compact_cpu_rows([(r, b.to("cpu")) for r, b in case.plan.cpu])
    assert rows.tolist() == [0, 21]
    assert compacted[0][1].q_indptr.tolist() == [0, 1, 2]
    outs = {}
    for mode in ("cpu", "all"):
        monkeypatch.setenv("WRITESCOPE_CPU_ROWS", mode)
        ha = HybridAttention(case.pools, spec, "cpu")
        check_all_layers(case, ha)
        ha.begin_step(case.plan)
        assert (ha._groups[0].cpu_rows is not None) == (mode == "cpu")
        q = case.random_q("cpu", seed=4)
        outs[mode] = [ha.attend(layer, q) for layer in range(spec.num_layers)]
        ha.end_step()
        ha.close()
    for (a, la), (b, lb) in zip(outs["cpu"], outs["all"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)


def test_a_decode_step_sends_every_row_to_the_cpu_side():
    """One query row per sequence, one sequence without CPU blocks: too few rows to leave out
    (``COMPACT_MIN_ROWS``), so the CPU side gets all of them and writes (0, -inf) for that
    sequence's; the result matches the float64 reference."""
    spec = KVSpec.mla(2, 32, 8, torch.float32)
    case = build_case(spec, 4, [90, 5, 70], q_counts=1, block_size=8,
                      frac={"G": 0.3, "C": 0.7}, seed=12)
    ha = HybridAttention(case.pools, spec, "cpu")
    ha.begin_step(case.plan)
    assert ha._groups[0].cpu_rows is None
    ha.end_step()
    check_all_layers(case, ha)
    ha.close()


@pytest.mark.parametrize("spec", [GQA, MLA], ids=["gqa", "mla"])
@pytest.mark.parametrize("split", [[1, 3], [2, 2], [3, 1]])
def test_groups_interleaved_match_one_group(spec, split):
    """A step split into two sub-batches (``groups``), attended the way the pipelined decode
    does -- per layer: launch A, finish B of the previous layer, launch B, finish A -- gives
    every row the result of the one-group step, with T blocks through a ring small enough that
    a layer's pieces wrap it, and the CPU side on its worker."""
    case = build_case(spec, 4, [70, 3, 129, 40], q_counts=1, block_size=8,
                      frac={"G": 0.2, "T": 0.4, "C": 0.4}, cpu_t_frac=0.3, seed=5)
    q = case.random_q("cpu", seed=9)
    blk = 8 * spec.num_kv_heads * spec.rec_dim * 4
    ha = HybridAttention(case.pools, spec, "cpu", staging_bytes=4 * blk, stage_t=True)
    ha.begin_step(case.plan)
    want = [ha.attend(l, q) for l in range(spec.num_layers)]
    ha.end_step()
    ha.begin_step(case.plan, groups=split)
    with pytest.raises(RuntimeError, match="launch"):
        ha.attend(0, q)
    a, b = q[:split[0]], q[split[0]:]
    got = {}
    for l in range(spec.num_layers):
        ha.launch(l, a, 0)
        if l:
            got[(l - 1, 1)] = ha.finish(l - 1, 1)
        ha.launch(l, b, 1)
        got[(l, 0)] = ha.finish(l, 0)
    got[(spec.num_layers - 1, 1)] = ha.finish(spec.num_layers - 1, 1)
    ha.end_step()
    for l in range(spec.num_layers):
        o = torch.cat((got[(l, 0)][0], got[(l, 1)][0]))
        s = torch.cat((got[(l, 0)][1], got[(l, 1)][1]))
        torch.testing.assert_close(o, want[l][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s, want[l][1], atol=1e-5, rtol=1e-5)
    ha.close()


@pytest.mark.parametrize("spec", [GQA, MLA], ids=["gqa", "mla"])
def test_the_benchs_pipelined_step_form_matches_its_single_form(spec):
    """gpu_attention's step over all layers, each layer's query depending on the last: in the
    pipelined form (two sub-batches, the engine's interleaving) the last layer's output is the
    single form's; the timed runner returns the median step and its timings in both forms."""
    from writescope.bench.gpu_attention import _run_steps, attend_layers, two_groups
    case = build_case(spec, 4, [70, 3, 129, 40, 9], q_counts=1, block_size=8,
                      frac={"G": 0.2, "T": 0.4, "C": 0.4}, cpu_t_frac=0.3, seed=7)
    q = case.random_q("cpu", seed=3)
    blk = 8 * spec.num_kv_heads * spec.rec_dim * 4
    ha = HybridAttention(case.pools, spec, "cpu", staging_bytes=4 * blk, stage_t=True)
    assert two_groups(1) is None and two_groups(5) == [2, 3] and two_groups(8) == [4, 4]
    want = attend_layers(ha, case.plan, q, spec.num_layers)
    ha.end_step()
    got = attend_layers(ha, case.plan, q, spec.num_layers, two_groups(5))
    ha.end_step()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    o_ref, _ = case.reference(spec.num_layers - 1, q)
    assert rel_err(got, o_ref) < 1e-4
    for groups in (None, [2, 3]):
        t, tm = _run_steps(ha, lambda: case.plan, q, spec.num_layers, 2, groups)
        assert t > 0 and tm["cpu_s"] > 0
    ha.close()


def test_the_gpu_attention_tables_take_the_best_of_both_step_forms():
    """The summary's best hybrid row is the best of either form, the pipelined one marked; the
    breakdown lists each share's rows, the pipelined one with its sub-batches."""
    from writescope.bench.gpu_attention_report import breakdown_markdown, summary_markdown
    row = lambda gbps: {"s": 2.0 / gbps, "GBps": gbps, "cpu_s": 0.01, "pcie_bytes": 0.0}  # noqa
    out = {"ceilings": {"hbm_copy_GBps": 4000.0, "h2d_pinned_GBps": 55.0,
                        "combined": {"combined_GBps": 125.0, "h2d_GBps": 50.0,
                                     "cpu_read_GBps": 75.0, "threads": 16}},
           "machine": {"cpu_kernel": "k"},
           "results": {
               "mla/8x32K": {"bytes_per_step": 2e9, "groups": [4, 4],
                             "streamed": {"512": {"GBps": 50.0}},
                             "hybrid": {"0.00": row(50.0), "0.60": row(110.0), "1.00": row(80.0)},
                             "hybrid_pipelined": {"0.00": row(49.0), "0.60": row(115.0),
                                                  "0.65": row(120.0), "1.00": row(85.0)}},
               "mla/1x256K": {"bytes_per_step": 2e9, "streamed": {"512": {"GBps": 50.0}},
                              "hybrid": {"0.00": row(50.0), "0.60": row(105.0)}}}}
    text = summary_markdown(out)
    assert "| mla/8x32K | - | 50.0 (91%) | 120.0 (0.65, pipelined) | 96% | 2.40x | 80.0 |" \
        in text, text
    assert "| mla/1x256K | - | 50.0 (91%) | 105.0 (0.60) | 84% | 2.10x | - |" in text, text
    rows = [l.split(" | ")[1] for l in breakdown_markdown(out).splitlines()
            if l.startswith("| mla/8x32K")]
    assert rows == ["0.00", "0.00 p4+4", "0.60", "0.60 p4+4", "0.65 p4+4", "1.00", "1.00 p4+4"]


def test_groups_must_cover_the_step():
    case = build_case(GQA, 4, [30, 20], q_counts=1, block_size=8, frac={"G": 0.5, "C": 0.5},
                      seed=1)
    ha = HybridAttention(case.pools, GQA, "cpu")
    for bad in ([1], [1, 2], [0, 2], [1, 1, 0]):
        with pytest.raises(ValueError, match="groups"):
            ha.begin_step(case.plan, groups=bad)
    ha.close()


def test_end_step_waits_for_a_launched_group_never_finished():
    """An aborted pipelined step (launched, not finished): end_step still waits for the CPU job
    (it would otherwise run on into the next step's buffers), and the next step runs normally."""
    import time

    from writescope.attention.torch_paged import attend_torch
    done = []

    def slow(*a, **k):
        time.sleep(0.2)
        out = attend_torch(*a, **k)
        done.append(time.perf_counter())
        return out

    case = build_case(GQA, 4, [70, 40], q_counts=1, block_size=8, frac={"G": 0.3, "C": 0.7},
                      seed=4)
    q = case.random_q("cpu", seed=2)
    ha = HybridAttention(case.pools, GQA, "cpu", cpu_attend=slow)
    ha.begin_step(case.plan, groups=[1, 1])
    ha.launch(0, q[:1], 0)
    ha.end_step()
    assert len(done) == 1 and done[0] <= time.perf_counter()
    check_all_layers(case, ha)
    ha.close()


def test_pieces_of_shared_blocks_move_each_block_once():
    """Sequences listing the same blocks (a prefix found by prefix caching): each piece holds
    every block once, at most ``piece_blocks`` of them, and every entry reads its own block."""
    from writescope.attention.staging import distinct_count, piece_bounds, shared_positions
    prefix = [40, 41, 42, 43]
    tables = [prefix + [7, 8], prefix + [9], prefix[:2], [30] + prefix]
    b = BlockBatch.build([1] * 4, tables, [[16] * len(t) for t in tables])
    for piece_blocks in (1, 3, 4, 6, 64):
        pieces = split_pieces(b, piece_blocks)
        assert all(0 < p.num_blocks <= piece_blocks for p in pieces)
        got = [[] for _ in tables]
        for p in pieces:
            src = torch.cat([torch.arange(s, s + n) for s, _, n in p.runs.tolist()])
            dst = torch.cat([torch.arange(d, d + n) for _, d, n in p.runs.tolist()])
            assert sorted(dst.tolist()) == list(range(p.num_blocks))  # each position filled once
            slot_to_src = dict(zip(dst.tolist(), src.tolist()))
            ki = p.batch.kv_indptr.tolist()
            for i in range(len(tables)):
                got[i] += [slot_to_src[int(x)] for x in p.batch.kv_blocks[ki[i]:ki[i + 1]]]
        assert got == tables
    # one piece big enough for every distinct block moves 8 blocks for 18 entries
    (whole,) = split_pieces(b, 8)
    assert whole.num_blocks == 8 and b.num_blocks == 18
    # no repeats: positions 0..n-1 and entry-count cuts, as before
    assert piece_bounds(torch.tensor([5, 6, 9, 1]).numpy(), 3) == ([0, 3, 4], False)
    ids, pos = shared_positions(torch.tensor([5, 6, 5, 2, 6]))
    assert ids.tolist() == [5, 6, 2] and pos.tolist() == [0, 1, 0, 2, 1]
    assert [distinct_count(torch.tensor(a, dtype=torch.int64).numpy())
            for a in ([], [7], [5, 3, 5, 0, 3], [2, 1])] == [0, 1, 3, 2]


def test_shared_blocks_move_once_per_listing_when_switched_off(monkeypatch):
    monkeypatch.setenv("WRITESCOPE_STAGE_SHARED", "0")
    b = BlockBatch.build([1, 1], [[4, 5, 6], [4, 5, 9]], [[16] * 3] * 2)
    (piece,) = split_pieces(b, 64)
    assert piece.num_blocks == 6 and piece.batch.kv_blocks.tolist() == list(range(6))
    assert piece.runs.tolist() == [[4, 0, 3], [4, 3, 2], [9, 5, 1]]


@pytest.mark.parametrize("spec,hq", [(GQA, 4), (MLA, 4)])
@pytest.mark.parametrize("stage_bytes_blocks", [3, 24, 96])
def test_shared_t_blocks_stream_once_and_match_reference(spec, hq, stage_bytes_blocks):
    """Five sequences whose first T blocks are the same blocks: the staging ring moves each of
    them once a piece, and every sequence's attention still matches the float64 reference."""
    case = build_case(spec, hq, [200, 180, 129, 40, 150], q_counts=[1, 2, 1, 1, 3], block_size=8,
                      frac={"G": 0.1, "T": 0.7, "C": 0.2}, cpu_t_frac=0.2, seed=3, shared_t=9)
    t_gpu = dict(case.plan.gpu)[Region.T]
    distinct = len(set(t_gpu.kv_blocks.tolist()))
    assert distinct < t_gpu.num_blocks  # the case does share blocks
    blk = 8 * spec.num_kv_heads * spec.rec_dim * 4
    ha = HybridAttention(case.pools, spec, "cpu", cpu_threads=1,
                         staging_bytes=stage_bytes_blocks * blk, stage_t=True)
    tm = check_all_layers(case, ha)
    moved = tm["pcie_bytes"] // (blk * spec.num_layers)
    assert moved == sum(p.num_blocks for p in ha._stage_reuse[1].pieces)  # the step's plan
    if stage_bytes_blocks >= 2 * distinct:  # one piece a layer: every block once
        assert moved == distinct
    elif stage_bytes_blocks >= 2 * 9:  # pieces of a layer that each hold the shared prefix
        assert distinct < moved < t_gpu.num_blocks
    else:  # pieces of a block: nothing to share
        assert moved == t_gpu.num_blocks
    ha.close()


def test_the_staging_ring_size_is_a_setting(monkeypatch):
    """``WRITESCOPE_STAGING_BYTES`` (a byte size) sets the engine's T staging ring, which the
    activations' reserve counts on CUDA (planner/activations.py); a size that is not positive
    is refused by name."""
    from writescope.attention.hybrid import DEFAULT_STAGING_BYTES, staging_bytes
    from writescope.planner import activations as act
    from writescope.models.config import ModelConfig
    monkeypatch.delenv("WRITESCOPE_STAGING_BYTES", raising=False)
    assert staging_bytes() == DEFAULT_STAGING_BYTES
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    before = act.reserve_bytes(cfg, torch.bfloat16, 16384, 131072)
    monkeypatch.setenv("WRITESCOPE_STAGING_BYTES", "1GiB")
    assert staging_bytes() == 2**30
    assert act.reserve_bytes(cfg, torch.bfloat16, 16384, 131072) - before == \
        2**30 - DEFAULT_STAGING_BYTES
    for bad in ("0", "-1", "lots"):
        monkeypatch.setenv("WRITESCOPE_STAGING_BYTES", bad)
        with pytest.raises(ValueError, match="WRITESCOPE_STAGING_BYTES"):
            staging_bytes()
