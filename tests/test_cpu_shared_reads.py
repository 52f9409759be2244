"""Blocks several sequences list, read once by the CPU kernel (writescope.attention.shared_reads):
the split, and the kernel's results against the float64 oracle in every form a call takes."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from writescope.attention import cpu, shared_reads
from writescope.attention.batch import BlockBatch
from writescope.attention.merge import merge_many
from writescope.attention.shared_reads import split_shared

from test_cpu_attention import SPECS, TOL, check, make_pools, reference, write_valid

ISAS = cpu.isas() if cpu.available() else []
needs_kernel = pytest.mark.skipif(not ISAS, reason=f"CPU kernel unavailable: {cpu.load_error()}")


def csr(q_counts, blocks, lens=None, bs=64):
    qi = np.zeros(len(q_counts) + 1, np.int32)
    np.cumsum(q_counts, out=qi[1:])
    ki = np.zeros(len(blocks) + 1, np.int32)
    np.cumsum([len(b) for b in blocks], out=ki[1:])
    ids = np.array([b for bl in blocks for b in bl], np.int32)
    ln = np.array([n for nl in lens for n in nl] if lens else [bs] * ids.size, np.int32)
    return qi, ki, ids, ln


def expand(split, nseq):
    """Each sequence's blocks as the split has them: its own, then its sets'."""
    out = [sorted(split.kv_blocks[split.kv_indptr[s]:split.kv_indptr[s + 1]].tolist())
           for s in range(nseq)]
    for k in range(split.num_sets):
        blocks = split.set_kv_blocks[split.set_kv_indptr[k]:split.set_kv_indptr[k + 1]]
        for s in split.set_seqs[split.set_indptr[k]:split.set_indptr[k + 1]]:
            out[s] = sorted(out[s] + blocks.tolist())
    return out


# a prefix all hold, a longer one two hold, private blocks, a holder without rows (3), a
# sequence with nothing shared (4), one that holds only shared blocks (5)
PRE, PRE2 = [0, 1, 2, 3, 4], [5, 6]
Q_COUNTS = [1, 2, 1, 0, 1, 1]
BLOCKS = [PRE + [10], PRE + PRE2 + [11, 12], PRE + PRE2, PRE + [13], [14], PRE]


def test_split_sets_by_holders():
    split = split_shared(*csr(Q_COUNTS, BLOCKS))
    assert split.num_sets == 2
    sets = {tuple(split.set_seqs[split.set_indptr[k]:split.set_indptr[k + 1]]):
            split.set_kv_blocks[split.set_kv_indptr[k]:split.set_kv_indptr[k + 1]].tolist()
            for k in range(2)}
    # the holder without query rows (3) keeps its listings; the sets' blocks in listing order
    assert sets == {(0, 1, 2, 5): PRE, (1, 2): PRE2}
    own = [split.kv_blocks[split.kv_indptr[s]:split.kv_indptr[s + 1]].tolist() for s in range(6)]
    assert own == [[10], [11, 12], [], PRE + [13], [14], []]
    assert split.listings_saved() == 3 * len(PRE) + len(PRE2)


def test_split_finds_nothing_to_share():
    assert split_shared(*csr([1, 1], [[0, 1], [2, 3]])) is None
    assert split_shared(*csr([1], [[0, 1]])) is None
    assert split_shared(*csr([1, 0], [[0, 1], [0, 1]])) is None  # one holder with rows
    # a sequence listing a block twice: the call attends each listing, as the torch path does
    assert split_shared(*csr([1, 1], [[0, 0], [0, 1]])) is None
    # the same block with another valid length is another block
    assert split_shared(*csr([1, 1], [[0], [0]], [[64], [17]])) is None


def test_split_reuses_recent_results_for_the_same_batches():
    """A step's calls (C and T read in place, per sub-batch) alternate: each finds its split
    of the last step again; a changed batch is split anew."""
    arrays = csr(Q_COUNTS, BLOCKS)
    first = split_shared(*arrays)
    assert split_shared(*(a.copy() for a in arrays)) is first
    other = csr(Q_COUNTS, BLOCKS[:-1] + [PRE + [15]])
    second = split_shared(*other)
    assert second is not first and second.num_sets == 2
    for _ in range(2):  # alternating, as one step's two calls do
        assert split_shared(*arrays) is first and split_shared(*other) is second


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.data())
def test_split_keeps_every_sequences_blocks(nseq, data):
    """Any batch: each sequence with rows reads every block it lists exactly once (its own
    list plus its sets'), a set has two or more holders with rows, and no block is in two
    places of one sequence."""
    q_counts = data.draw(st.lists(st.integers(0, 2), min_size=nseq, max_size=nseq))
    blocks = [data.draw(st.lists(st.integers(0, 12), max_size=8, unique=True))
              for _ in range(nseq)]
    split = split_shared(*csr(q_counts, blocks))
    if split is None:
        return
    got = expand(split, nseq)
    for s in range(nseq):
        assert got[s] == sorted(blocks[s])
    for k in range(split.num_sets):
        holders = split.set_seqs[split.set_indptr[k]:split.set_indptr[k + 1]]
        assert holders.size >= 2 and all(q_counts[h] > 0 for h in holders)
        assert list(holders) == sorted(holders)


def shared_case(spec, hq, bs, seed, blocks=BLOCKS, q_counts=Q_COUNTS):
    gen = torch.Generator().manual_seed(seed)
    nblocks = 1 + max(b for bl in blocks for b in bl)
    recs, cpool, gpool = make_pools(spec, nblocks, bs, gen)
    lens = [[bs] * len(b) for b in blocks]
    write_valid(recs, cpool, gpool, blocks, lens)
    q = torch.randn(sum(q_counts), hq, spec.k_dim, generator=gen)
    return q, recs, cpool, gpool, lens


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", ["qwen3", "g3d64", "mla"])
def test_shared_reads_match_float64_reference(isa, dtype, name, monkeypatch):
    """Sequences that share blocks: the kernel reads each shared block once (the plan says so;
    MLA with ``all``) and every row matches the oracle, both layouts, 1 and 4 threads, every
    chunking."""
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "all")
    spec_fn, hq = SPECS[name]
    spec = spec_fn(dtype)
    bs = 64
    q, recs, cpool, gpool, lens = shared_case(spec, hq, bs, seed=len(name))
    qin = q.to(dtype)
    scale = 1.0 / math.sqrt(spec.k_dim)
    ref_o, ref_l = reference(qin.float(), recs, spec, Q_COUNTS, BLOCKS, lens, scale)
    batch = BlockBatch.build(Q_COUNTS, BLOCKS, lens)
    cpu.set_isa(isa)
    try:
        for threads, chunk in [(1, 0), (4, 1), (3, 2)]:
            cpu.set_num_threads(threads)
            for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
                plan = cpu.CpuAttentionPlan(pool, layout, spec, batch, scale, qin.shape[0], hq,
                                            qin.dtype, chunk_blocks=chunk)
                assert plan.shared is not None and plan.shared.num_sets == 2
                out, lse = plan(qin, pool)
                check(out, lse, ref_o, ref_l, TOL[dtype])
    finally:
        cpu.set_isa("auto")
        cpu.set_num_threads(None)


@needs_kernel
def test_switch_off_reads_every_listing(monkeypatch):
    """``WRITESCOPE_CPU_SHARED_READS=0``: no sets, the same results; MLA calls read every
    listing unless it says ``all``; a bad value is refused."""
    spec_fn, hq = SPECS["qwen3"]
    spec = spec_fn(torch.float32)
    q, recs, cpool, gpool, lens = shared_case(spec, hq, 64, seed=5)
    batch = BlockBatch.build(Q_COUNTS, BLOCKS, lens)
    on = cpu.CpuAttentionPlan(cpool, "cpu", spec, batch, 0.1, q.shape[0], hq)
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "0")
    assert shared_reads.setting() == "off" and not shared_reads.applies(False)
    off = cpu.CpuAttentionPlan(cpool, "cpu", spec, batch, 0.1, q.shape[0], hq)
    assert on.shared is not None and off.shared is None
    (o1, l1), (o2, l2) = on(q, cpool), off(q, cpool)
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-6)
    for value, gqa, mla in (("auto", True, False), ("1", True, False), ("all", True, True)):
        monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", value)
        assert (shared_reads.applies(False), shared_reads.applies(True)) == (gqa, mla)
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "sometimes")
    with pytest.raises(ValueError, match="auto, all or 0"):
        shared_reads.setting()


@needs_kernel
def test_flagged_queued_and_paired_calls_with_shared_sets():
    """The forms the hybrid step uses: a flagged call, a queued call, and a call whose first
    pool (C) has shared sets paired with T blocks read in place, without shared sets and with
    its own; and the two pools as two calls merged."""
    spec_fn, hq = SPECS["qwen3"]
    spec = spec_fn(torch.float32)
    bs = 64
    q, recs, cpool, gpool, lens = shared_case(spec, hq, bs, seed=9)
    # T blocks in place: private ones, and in the second batch a shared one
    t_blocks = [[20], [21, 22], [], [], [23], [24]]
    t_shared = [[20, 25], [21, 25], [], [], [23], [24]]
    nb = 26
    gen = torch.Generator().manual_seed(1)
    t_recs = torch.randn(nb, bs, spec.num_kv_heads, spec.rec_dim, generator=gen)
    t_pool = t_recs.clone()
    scale = 0.125
    c_batch = BlockBatch.build(Q_COUNTS, BLOCKS, lens)
    c_plan = cpu.CpuAttentionPlan(cpool, "cpu", spec, c_batch, scale, q.shape[0], hq)
    flag = torch.zeros(2, dtype=torch.int64)
    nq = q.shape[0]
    for tb, shares in [(t_blocks, False), (t_shared, True)]:
        t_lens = [[bs] * len(b) for b in tb]
        t_batch = BlockBatch.build(Q_COUNTS, tb, t_lens)
        t_plan = cpu.CpuAttentionPlan(t_pool, "gpu", spec, t_batch, scale, nq, hq)
        assert c_plan.pairs_with(t_plan)
        assert (t_plan.shared is not None) is shares
        # the oracle over both pools' blocks
        both = torch.cat([recs.float(), t_recs])
        n_c = recs.shape[0]
        merged = [c + [n_c + b for b in t] for c, t in zip(BLOCKS, tb)]
        m_lens = [[bs] * len(b) for b in merged]
        ref_o, ref_l = reference(q, both, spec, Q_COUNTS, merged, m_lens, scale)
        out, lse = c_plan(q, cpool, second=(t_plan, t_pool))
        check(out, lse, ref_o, ref_l, TOL[torch.float32])
        o1, l1 = c_plan(q, cpool, ready=(flag.data_ptr(), 0), done=(flag.data_ptr() + 8, 7))
        assert int(flag[1]) == 7
        o2, l2 = t_plan(q, t_pool)
        out, lse = merge_many([(o1, l1), (o2, l2)])
        check(out, lse, ref_o, ref_l, TOL[torch.float32])
        queue = cpu.CpuJobQueue()
        try:
            out = torch.empty(nq, hq, spec.v_dim)
            lse = torch.empty(nq, hq)
            queue.submit(c_plan, q, cpool, out, lse, ready=None, done=None,
                         second=(t_plan, t_pool))
            queue.drain()
            check(out, lse, ref_o, ref_l, TOL[torch.float32])
        finally:
            queue.close()


@needs_kernel
@pytest.mark.parametrize("policy", ["static", "writescope"])
def test_an_engine_decoding_prompts_that_share_a_prefix(tiny_qwen3_moe, monkeypatch, policy):
    """Three prompts that start from a fourth's cached blocks (prefix caching), spilled to T
    and C: greedy tokens and log-probabilities are those of the same engine reading every
    listing (``WRITESCOPE_CPU_SHARED_READS=0``) and of one without prefix caching. Under
    ``static`` (half the spilled blocks in C, the CPU reading them) the CPU reads fewer bytes;
    ``writescope`` plans differently with and without shared reads (it may give the CPU shared
    T blocks only with them)."""
    from writescope import LLM, SamplingParams
    doc = [(7 * i) % 90 + 3 for i in range(72)]  # 9 blocks of 8
    prompts = [doc + [100 + i, 101 + i] for i in range(4)]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)

    def run(shared: str, caching: bool = True):
        monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", shared)
        llm = LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8,
                  max_model_len=256, max_num_seqs=8, num_gpu_blocks=4, kv_policy=policy,
                  cpu_share=0.5, enable_prefix_caching=caching)
        first = llm.generate([prompts[0]], sp)
        s0 = llm.stats()
        rest = llm.generate(prompts[1:], sp)
        s1 = llm.stats()
        outs = first + rest
        if caching:
            assert [o.num_cached_tokens for o in rest] == [72] * 3
        return outs, s1["kv.bytes_read.cpu"] - s0["kv.bytes_read.cpu"]

    once, read_once = run("1")
    each, read_each = run("0")
    plain, _ = run("1", caching=False)
    for a, b, c in zip(once, each, plain):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.logprobs == pytest.approx(c.logprobs, abs=1e-4)
    if policy == "static":
        assert 0 < read_once < read_each


@needs_kernel
def test_the_bench_times_both_forms_and_refuses_bad_input(tmp_path, monkeypatch):
    """``python -m writescope.bench.cpu_shared``: per shape both forms, the bytes each reads
    (the shared form the distinct blocks, the other every listing), JSON, the switch put back
    as it was; bad input exits."""
    import json
    import os
    from writescope.bench import cpu_shared
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "auto")
    out = tmp_path / "s.json"
    res = cpu_shared.main(["--batch", "3", "--prefix", "256", "--own", "64", "--reps", "1",
                           "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["shape"] for r in rows] == [r["shape"] for r in res["rows"]] == \
        ["gqa-32/4/128", "mla-16/1/576"]
    for r in rows:
        shared, each = r["shared"], r["each"]
        assert shared["read_gb"] == pytest.approx(each["read_gb"] * (4 + 3) / (3 * 5))
        assert each["read_gb"] == pytest.approx(r["listed_gb"])
        assert shared["median_ms"] > 0 and r["speedup"] > 0
    assert os.environ["WRITESCOPE_CPU_SHARED_READS"] == "auto"
    assert cpu_shared.main(["--batch", "2", "--prefix", "128", "--own", "64", "--reps", "1",
                            "--shapes", "gqa-8/2/64"])["rows"][0]["shape"] == "gqa-8/2/64"
    for bad in (["--batch", "1"], ["--shapes", "gqa-1/2/3x"]):
        with pytest.raises(SystemExit):
            cpu_shared.main(bad)
