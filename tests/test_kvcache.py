"""InplaceKVCache: any placement and any CPU/GPU assignment gives dense attention; invariants."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from writescope.attention.reference import dense_attention
from writescope.core import RequestTooLargeError
from writescope.kvcache.cache import CacheLayout, InplaceKVCache, plan_layout
from writescope.kvcache.placement import PlacementPolicy, StaticPolicy
from writescope.kvcache.pools import KVCacheError
from writescope.kvcache.regions import KVSpec, Region

SPECS = {
    "gqa": lambda L: KVSpec.gqa(L, 2, 16, torch.float32),
    "mla": lambda L: KVSpec.mla(L, 24, 8, torch.float32),
}


class RandomPolicy(PlacementPolicy):
    """Random homes and random CPU/GPU assignments (T blocks read by the CPU, C by the GPU...)."""

    name = "random-test"

    def __init__(self, seed: int, int_assign: bool = False):
        self.rng = random.Random(seed)
        self.int_assign = int_assign
        self.cpu_blocks = 0  # the blocks its assignments gave the CPU, all steps together

    def place(self, seq, num_blocks, capacity):
        free = dict(capacity.free)
        out = []
        for _ in range(num_blocks):
            r = self.rng.choice([r for r in (Region.G, Region.T, Region.C) if free[r] > 0])
            free[r] -= 1
            out.append(r)
        return out

    def assign(self, seq):
        if self.int_assign:  # the C blocks and the n oldest T blocks (n may exceed the T count)
            n = self.rng.randint(0, seq.regions.count(Region.T) + 1)
            self.cpu_blocks += seq.regions.count(Region.C) + min(n, seq.regions.count(Region.T))
            return n
        mask = [self.rng.random() < 0.5 for _ in seq.regions]
        self.cpu_blocks += sum(mask)
        return mask


def make_cache(spec, bs, policy, blocks=64, seqs=4, prefill_gpu_rows=None):
    layout = CacheLayout(bs, {Region.G: blocks, Region.T: blocks, Region.C: blocks, Region.W: seqs})
    return InplaceKVCache(spec, layout, policy, "cpu", scale=0.3, prefill_gpu_rows=prefill_gpu_rows)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["gqa", "mla"]), bs=st.sampled_from([2, 4, 8, 16]),
       lens=st.lists(st.integers(1, 50), min_size=1, max_size=5),
       chunk=st.integers(1, 40), seed=st.integers(0, 10_000),
       prefill_rows=st.sampled_from([None, 4]), int_assign=st.booleans())
def test_any_placement_and_assignment_equals_dense(kind, bs, lens, chunk, seed, prefill_rows,
                                                    int_assign):
    L = 2
    spec = SPECS[kind](L)
    hq = 4
    policy = RandomPolicy(seed, int_assign)
    cache = make_cache(spec, bs, policy, blocks=sum(lens) // bs + 8, seqs=len(lens),
                       prefill_gpu_rows=prefill_rows)
    cpu_blocks = 0  # the blocks the CPU side read: what the policy assigned, where rows allow
    g = torch.Generator().manual_seed(seed)
    recs = {i: torch.randn(L, n, spec.num_kv_heads, spec.rec_dim, generator=g) for i, n in enumerate(lens)}
    for i, n in enumerate(lens):
        cache.add_sequence(i, n)
    done = [0] * len(lens)
    while any(d < n for d, n in zip(done, lens)):
        work = []
        for i, n in enumerate(lens):
            if done[i] < n:
                k = min(chunk if done[i] == 0 else random.Random(seed + done[i]).randint(1, chunk), n - done[i])
                work.append((i, done[i], k))
        before = policy.cpu_blocks
        cache.begin_step(work)
        if prefill_rows is None or all(k <= prefill_rows for _, _, k in work):
            cpu_blocks += policy.cpu_blocks - before
        nq = sum(k for _, _, k in work)
        for layer in range(L):
            q = torch.randn(nq, hq, spec.k_dim, generator=g)
            rec = torch.cat([recs[i][layer, s:s + k] for i, s, k in work])
            out = cache.attention(layer, q, rec)
            row = 0
            for i, s, k in work:
                r = recs[i][layer, :s + k]
                ref, _ = dense_attention(q[row:row + k], spec.k(r), spec.v(r), 0.3,
                                         torch.arange(s, s + k), torch.arange(s + k))
                err = (out[row:row + k].double() - ref).norm() / ref.norm()
                assert err < 1e-5, (kind, bs, lens, i, s, k, float(err))
                row += k
        cache.end_step()
        for i, s, k in work:
            done[i] = s + k
    s = cache.stats()
    assert s["kv.bytes_moved_after_placement"] == 0
    if prefill_rows is None:
        assert s["kv.bytes_read.cpu"] == cpu_blocks * bs * spec.token_bytes()
    for i in range(len(lens)):
        cache.free_sequence(i)
    assert all(cache.stats()[f"kv.blocks.{r}"] == 0 for r in "GTCW")


class AllC(PlacementPolicy):
    name = "all-c-test"

    def place(self, seq, num_blocks, capacity):
        return [Region.C] * num_blocks


def test_prefill_chunks_attend_c_blocks_on_the_gpu_side():
    """More than ``prefill_gpu_rows`` new tokens: the GPU side attends every cached block (C
    included); decode-sized steps follow the policy (C on the CPU). Same output either way."""
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, AllC(), blocks=32, prefill_gpu_rows=16)
    g = torch.Generator().manual_seed(0)
    recs = torch.randn(45, 2, 32, generator=g)
    cache.add_sequence(0, 45)
    read = []
    for s, k in ((0, 20), (20, 20), (40, 5), (45 - 0, 0)):
        if k == 0:
            break
        cache.begin_step([(0, s, k)])
        q = torch.randn(k, 4, 16, generator=g)
        out = cache.attention(0, q, recs[s:s + k])
        ref, _ = dense_attention(q, spec.k(recs[:s + k]), spec.v(recs[:s + k]), 0.3,
                                 torch.arange(s, s + k), torch.arange(s + k))
        assert (out.double() - ref).norm() / ref.norm() < 1e-5
        cache.end_step()
        read.append((cache.stats()["kv.bytes_read.cpu"], cache.stats()["kv.bytes_read.gpu"]))
    assert read[0] == (0, read[0][1])
    assert read[1][0] == 0 and read[1][1] > read[0][1]  # 20 rows: C blocks read by the GPU side
    assert read[2][0] > 0  # 5 rows: the policy's default, C on the CPU
    assert set(cache.seqs[0].regions()) == {Region.C}


def test_static_policy_puts_prefix_in_c():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, StaticPolicy(0.5), blocks=32)
    cache.layout.num_blocks[Region.G] = 0
    cache.alloc[Region.G].__init__(0, "G")
    cache.add_sequence(0, 40)
    cache.begin_step([(0, 0, 40)])
    cache.attention(0, torch.randn(40, 4, 16), torch.randn(40, 2, 32))
    cache.end_step()
    assert cache.seqs[0].regions() == (Region.C,) * 5 + (Region.T,) * 5


def test_on_a_cpu_device_the_cpu_side_runs_on_the_calling_thread():
    """Both sides are CPU work there: a worker thread would run the CPU kernel in a second
    OpenMP team, and libgomp then makes every team's idle members sleep almost at once (decode
    steps at ~half transfer's rate on the 2-core dev VM, bench/results/2026-12-04c-devbox)."""
    import threading
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, StaticPolicy(1.0), blocks=32)
    cache.layout.num_blocks[Region.G] = 0
    cache.alloc[Region.G].__init__(0, "G")
    before = {t.ident for t in threading.enumerate()}
    cache.add_sequence(0, 40)
    for start, n in ((0, 40), (40, 1), (41, 1)):  # a prefill chunk, then decode steps
        cache.begin_step([(0, start, n)])
        cache.attention(0, torch.randn(n, 4, 16), torch.randn(n, 2, 32))
        t = cache.end_step()
    assert t["cpu_bytes"] > 0 and cache.hybrid._worker is None
    assert {t.ident for t in threading.enumerate()} == before


def test_budgets_and_admission():
    spec = SPECS["gqa"](1)
    layout = plan_layout(spec, 8, device_bytes=spec.block_bytes(8) * 6, pinned_bytes=spec.block_bytes(8) * 2,
                         host_bytes=spec.block_bytes(8) * 2, max_tokens_total=10_000, max_num_seqs=2)
    assert layout.num_blocks == {Region.G: 4, Region.T: 2, Region.C: 2, Region.W: 2}
    cache = InplaceKVCache(spec, layout, StaticPolicy(0.5), "cpu", 1.0)
    with pytest.raises(RequestTooLargeError):
        cache.add_sequence(0, 8 * 9)  # 9 blocks > 8 sealed blocks in all regions
    cache.add_sequence(0, 8 * 6)
    assert not cache.can_admit(8 * 3)  # only 2 unreserved blocks left
    with pytest.raises(KVCacheError):
        cache.add_sequence(1, 8 * 3)
    st = cache.stats()
    assert st["kv.vram_bytes"] <= spec.block_bytes(8) * 6
    assert st["kv.pinned_bytes"] <= spec.block_bytes(8) * 2


def test_misuse_raises():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, StaticPolicy(0.5))
    cache.add_sequence(0, 8)
    cache.free_sequence(0)
    with pytest.raises(KVCacheError):
        cache.free_sequence(0)  # freed twice
    with pytest.raises(KVCacheError):
        cache.begin_step([(0, 0, 1)])  # reading/writing a freed sequence
    cache.add_sequence(1, 8)
    with pytest.raises(KVCacheError):
        cache.begin_step([(1, 3, 1)])  # writing at the wrong position (into sealed history)
    with pytest.raises(KVCacheError):
        cache.alloc[Region.G].free([5])  # freeing a block that is not allocated


def test_t_blocks_are_contiguous_runs():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 2, StaticPolicy(0.0), blocks=64)
    cache.layout.num_blocks[Region.G] = 0
    cache.alloc[Region.G].__init__(0, "G")
    for i in range(3):
        cache.add_sequence(i, 40)
    for s in range(0, 20):  # three sequences decoding in lock-step
        cache.begin_step([(i, s, 1) for i in range(3)])
        cache.attention(0, torch.randn(3, 4, 16), torch.randn(3, 2, 32))
        cache.end_step()
    for i in range(3):
        ids = cache.seqs[i].sealed_ids.tolist()
        runs = 1 + sum(b != a + 1 for a, b in zip(ids, ids[1:]))
        assert runs <= 2, ids


@pytest.mark.parametrize("score_elems", [1 << 25, 300, 1])
def test_self_attention_query_tiles_equal_dense(monkeypatch, score_elems):
    """A prefill chunk's causal self-attention in query tiles (memory bounded by SCORE_ELEMS)
    equals dense causal attention, whatever the tile size."""
    from writescope.attention import selfattn
    monkeypatch.setattr(selfattn, "SCORE_ELEMS", score_elems)
    spec = KVSpec.gqa(1, 2, 8, torch.float64)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(100, 4, 8, generator=g, dtype=torch.float64)
    rec = torch.randn(100, 2, 16, generator=g, dtype=torch.float64)
    segs = [1, 60, 39]
    o, l = selfattn.causal_self_attention(q, rec, spec, segs, 0.3)
    row = 0
    for n in segs:
        r = rec[row:row + n]
        ref, rl = dense_attention(q[row:row + n], spec.k(r), spec.v(r), 0.3, torch.arange(n),
                                  torch.arange(n))
        assert torch.allclose(o[row:row + n].double(), ref, atol=1e-5)
        assert torch.allclose(l[row:row + n].double(), rl, atol=1e-5)
        row += n


def test_pipeline_groups_even_the_cpu_tokens():
    """The cut of a decode step into two sub-batches (subbatches.cpu_balanced_groups): as even
    in CPU tokens as a cut between sequences allows, ties to the even cut; no split for prefill
    steps, one sequence, or no CPU work."""
    from writescope.attention.batch import BlockBatch
    from writescope.attention.groups import AttentionStepPlan
    from writescope.kvcache.subbatches import cpu_balanced_groups

    def plan(cpu_blocks):
        b = BlockBatch.build([1] * len(cpu_blocks), [list(range(n)) for n in cpu_blocks],
                             [[16] * n for n in cpu_blocks])
        p = AttentionStepPlan(KVSpec.gqa(1, 1, 8, torch.float32), 1.0, len(cpu_blocks))
        if sum(cpu_blocks):
            p.cpu.append((Region.C, b))
        return p

    dec = lambda n: [(i, 100, 1) for i in range(n)]
    assert cpu_balanced_groups(dec(4), plan([5, 5, 5, 5])) == [2, 2]
    assert cpu_balanced_groups(dec(4), plan([12, 1, 1, 10])) == [1, 3]
    assert cpu_balanced_groups(dec(3), plan([1, 1, 9])) == [2, 1]
    assert cpu_balanced_groups(dec(2), plan([0, 7])) == [1, 1]
    assert cpu_balanced_groups(dec(1), plan([5])) is None
    assert cpu_balanced_groups(dec(3), plan([0, 0, 0])) is None
    assert cpu_balanced_groups([(0, 100, 1), (1, 100, 40)], plan([5, 5])) is None


class RandomHomes(RandomPolicy):
    """Random homes; the CPU/GPU assignment from a random stream of its own (a step plans the
    assignment, a fill does not: the homes must not depend on it)."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.assign_rng = random.Random(seed + 1)

    def assign(self, seq):
        return [self.assign_rng.random() < 0.5 for _ in seq.regions]


@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_fill_step_places_and_writes_as_a_step_does(kind):
    """fill_step (benchmarks' synthetic prefill) asks the policy for the same homes, allocates
    the same ids and writes the same bytes as real steps over the same chunks; afterwards a
    decode step attends identically in both caches."""
    L, bs = 2, 4
    spec = SPECS[kind](L)
    g = torch.Generator().manual_seed(3)
    lens = [37, 18]
    recs = [torch.randn(n, spec.num_kv_heads, spec.rec_dim, generator=g) for n in lens]
    real, fill = (make_cache(spec, bs, RandomHomes(7), blocks=32) for _ in range(2))
    for c in (real, fill):
        for i, n in enumerate(lens):
            c.add_sequence(i, n + 4)
    for s0, k in ((0, 10), (10, 17), (27, 10)):  # chunks of both sequences, in batch order
        work = [(i, s0, min(k, n - s0)) for i, n in enumerate(lens) if s0 < n]
        rec = torch.cat([recs[i][s:s + n] for i, s, n in work])
        real.begin_step(work)
        for layer in range(L):  # the same records in every layer, as fill_step writes them
            real.attention(layer, torch.randn(rec.shape[0], 4, spec.k_dim, generator=g), rec)
        real.end_step()
        fill.fill_step(work, rec)
    for i in range(len(lens)):
        a, b = real.seqs[i], fill.seqs[i]
        assert a.regions() == b.regions() and a.num_tokens == b.num_tokens == lens[i]
        assert (a.sealed_ids == b.sealed_ids).all() and a.w_slot == b.w_slot
    for i in range(len(lens)):  # every sealed block and the W tail hold the same bytes
        t = real.seqs[i]
        for r, bid in zip(t.regions(), t.sealed_ids):
            assert torch.equal(real.pools[r][:, int(bid)], fill.pools[r][:, int(bid)]), (r, bid)
        tail = t.num_tokens % bs  # the W slot's valid tokens (the rest is unwritten memory)
        w = Region.W
        assert torch.equal(real.pools[w][:, t.w_slot, :tail], fill.pools[w][:, t.w_slot, :tail])
    assert fill.stats()["kv.filled_tokens"] == sum(lens)
    q = torch.randn(2, 4, spec.k_dim, generator=g)
    new = torch.randn(2, spec.num_kv_heads, spec.rec_dim, generator=g)
    outs = []
    for c in (real, fill):
        c.begin_step([(0, lens[0], 1), (1, lens[1], 1)])
        outs.append(c.attention(0, q, new))
        c.end_step()
    assert torch.allclose(outs[0], outs[1], atol=1e-6)


def test_fill_step_misuse():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, StaticPolicy(0.5), blocks=8)
    cache.add_sequence(0, 20)
    with pytest.raises(KVCacheError, match="records"):
        cache.fill_step([(0, 0, 5)], torch.zeros(4, 2, 32))
    cache.begin_step([(0, 0, 3)])
    with pytest.raises(KVCacheError, match="open step"):
        cache.fill_step([(0, 3, 2)], torch.zeros(2, 2, 32))


def test_a_step_that_cannot_place_gives_its_blocks_back():
    """The first sequence's blocks are allocated before the second one's error (its step does
    not start where the cache is): every block goes back to its pool, for steps and fills."""
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, StaticPolicy(0.5), blocks=8)
    cache.add_sequence(0, 20)
    cache.add_sequence(1, 20)
    free = {r: cache.alloc[r].num_free for r in (Region.G, Region.T, Region.C)}
    bad = [(0, 0, 12), (1, 5, 4)]
    with pytest.raises(KVCacheError, match="starts at token 5"):
        cache.begin_step(bad)
    with pytest.raises(KVCacheError, match="starts at token 5"):
        cache.fill_step(bad, torch.zeros(16, 2, 32))
    assert {r: cache.alloc[r].num_free for r in free} == free
    cache.fill_step([(0, 0, 12), (1, 0, 4)], torch.zeros(16, 2, 32))  # still usable
    assert cache.seqs[0].num_sealed == 3 and cache.seqs[1].num_sealed == 1


class OneHome(PlacementPolicy):
    """Every block in one region; T blocks attended by the GPU."""

    name = "one-home-test"

    def __init__(self, home: Region):
        self.home = home

    def place(self, seq, num_blocks, capacity):
        return [self.home] * num_blocks

    def assign(self, seq):
        return [r is Region.C for r in seq.regions]


@pytest.mark.parametrize("home", [Region.G, Region.T, Region.C, "G, switched off"])
def test_a_decode_step_that_completes_a_block_in_g_is_deferrable(home, monkeypatch):
    """A decode step may be closed before its device work is done (``end_step(wait=False)``,
    overlapped decode steps) when it reads only G and W and the blocks it completes go to G
    (a copy on the device); a block completed into T or C is written through the host.
    WRITESCOPE_G_BLOCKS_ON_DEVICE=0 (A/B runs) defers no step that completes a block."""
    if home == "G, switched off":
        monkeypatch.setenv("WRITESCOPE_G_BLOCKS_ON_DEVICE", "0")
        home, on = Region.G, False
    else:
        on = home is Region.G
    L, bs = 2, 4
    spec = SPECS["gqa"](L)
    g = torch.Generator().manual_seed(5)
    c = make_cache(spec, bs, OneHome(home), blocks=8, seqs=1)
    c.add_sequence(0, 12)

    def step(start, n, wait=True):
        for layer in range(L):
            c.attention(layer, torch.randn(n, 4, spec.k_dim, generator=g),
                        torch.randn(n, spec.num_kv_heads, spec.rec_dim, generator=g))
        return c.end_step(wait=wait)

    c.begin_step([(0, 0, 3)])  # the prompt
    step(0, 3)
    c.begin_step([(0, 3, 1)])  # completes block 0
    assert c._step["new_blocks"] and c.step_deferrable == on
    assert bool(c._step["seal_w"]) == on
    step(3, 1, wait=not on)
    assert c.seqs[0].regions() == (home,)
    c.begin_step([(0, 4, 1)])  # reads block 0 where it is
    assert c.step_deferrable == (home is Region.G)
    if home is not Region.G:
        with pytest.raises(KVCacheError, match="not deferrable"):
            c.end_step(wait=False)
        c.abort_step()
