"""Automatic prefix caching (kvcache/prefix.py): a prompt starts from the cached blocks of its
prefix, in whatever region they were written, and every number stays the same."""
from __future__ import annotations

import hashlib
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from writescope.attention.reference import dense_attention
from writescope.kvcache.cache import CacheLayout, InplaceKVCache
from writescope.kvcache.migrate import MigratePolicy
from writescope.kvcache.placement import PlacementPolicy, TransferPolicy
from writescope.kvcache.prefix import PrefixCache, block_hashes
from writescope.kvcache.regions import KVSpec, Region

from test_kvcache import RandomPolicy


# ---------------------------------------------------------------------- the cache on its own
def token_records(tokens: list[int], spec: KVSpec, layers: int) -> torch.Tensor:
    """``[L, n, H, R]`` records that depend on each token and every token before it, as a
    model's do (seeded by a hash of the prefix)."""
    out = torch.empty(layers, len(tokens), spec.num_kv_heads, spec.rec_dim)
    h = b""
    for p, t in enumerate(tokens):
        h = hashlib.blake2b(h + t.to_bytes(4, "little"), digest_size=8).digest()
        g = torch.Generator().manual_seed(int.from_bytes(h, "little") & (2 ** 62 - 1))
        out[:, p] = torch.randn(layers, spec.num_kv_heads, spec.rec_dim, generator=g)
    return out


def make_cache(spec, bs, policy, blocks, seqs=4, prefix=True):
    layout = CacheLayout(bs, {Region.G: blocks, Region.T: blocks, Region.C: blocks, Region.W: seqs})
    return InplaceKVCache(spec, layout, policy, "cpu", scale=0.3, prefill_gpu_rows=4,
                          prefix_caching=prefix)


class Seq:
    def __init__(self, sid, prompt, new):
        self.sid, self.prompt, self.new = sid, list(prompt), new
        self.tokens = list(prompt)  # prompt, then the "sampled" tokens
        self.done = 0  # tokens whose KV is in the cache
        self.cached = 0


def run(cache, seqs, spec, layers, chunk, rng, check=True):
    """A small scheduler: admit in order while the cache takes them (starting from their cached
    prefixes), prefill in chunks, decode one token a step, free when done; every attention
    output checked against dense attention over the sequence's own records."""
    waiting, running, hq = list(seqs), [], 2
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    while waiting or running:
        while waiting and len(running) < 2:
            s = waiting[0]
            names = cache.prefix_names(s.prompt)
            m = cache.match_prefix(names, len(s.prompt), s.prompt)
            if not cache.can_admit(len(s.prompt) + s.new, m):
                break
            waiting.pop(0)
            s.cached = s.done = cache.add_sequence(s.sid, len(s.prompt) + s.new, len(s.prompt),
                                                   prefix=m, prompt_names=names)
            running.append(s)
        assert running, "nothing runs and nothing can be admitted"
        work = []
        for s in running:
            if s.done < len(s.prompt):
                k = min(chunk, len(s.prompt) - s.done)
            else:
                k = 1
                s.tokens.append(rng.randrange(1, 4))
            work.append((s.sid, s.done, k))
        cache.begin_step(work)
        nq = sum(k for _, _, k in work)
        recs = {s.sid: token_records(s.tokens[:s.done + k], spec, layers)
                for s, (_, _, k) in zip(running, work)}
        for layer in range(layers):
            q = torch.randn(nq, hq, spec.k_dim, generator=g)
            rec = torch.cat([recs[sid][layer, st:st + k] for sid, st, k in work])
            out = cache.attention(layer, q, rec)
            if check:
                row = 0
                for sid, st, k in work:
                    r = recs[sid][layer]
                    ref, _ = dense_attention(q[row:row + k], spec.k(r), spec.v(r), 0.3,
                                             torch.arange(st, st + k), torch.arange(st + k))
                    err = (out[row:row + k].double() - ref).norm() / ref.norm()
                    assert err < 1e-5, (sid, st, k, float(err))
                    row += k
        cache.end_step()
        for s, (_, _, k) in zip(list(running), work):
            s.done += k
            if s.done >= len(s.prompt) + s.new - 1:  # its last sampled token is never input
                cache.free_sequence(s.sid, s.tokens)
                running.remove(s)


SPECS = {"gqa": lambda L: KVSpec.gqa(L, 2, 16, torch.float32),
         "mla": lambda L: KVSpec.mla(L, 24, 8, torch.float32)}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["gqa", "mla"]), bs=st.sampled_from([2, 4, 8]),
       stems=st.lists(st.lists(st.integers(1, 3), min_size=8, max_size=30), min_size=1,
                      max_size=3),
       picks=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(1, 10)),
                      min_size=2, max_size=8),
       chunk=st.integers(1, 12), blocks=st.integers(4, 16), seed=st.integers(0, 10_000))
def test_shared_prefixes_attend_like_their_own_records(kind, bs, stems, picks, chunk, blocks,
                                                       seed):
    """Prompts built from a few shared stems, random homes and CPU/GPU assignments, a cache small
    enough to reclaim: every output equals dense attention over the sequence's own records (a
    cached block holds exactly what the sequence would have written), and in the end every
    block is free or cached unused."""
    rng = random.Random(seed)
    spec = SPECS[kind](2)
    cache = make_cache(spec, bs, RandomPolicy(seed), blocks)
    seqs = []
    for i, (stem, tail, new) in enumerate(picks):
        prompt = stems[stem % len(stems)] + [rng.randrange(1, 4) for _ in range(tail)]
        if not prompt:
            prompt = [1]
        if (len(prompt) + new) // bs > 3 * blocks:
            continue
        seqs.append(Seq(i, prompt, new))
    run(cache, seqs, spec, 2, chunk, rng)
    s = cache.stats()
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW"), s
    assert s["kv.bytes_moved_after_placement"] == 0
    p = cache.prefix
    assert all(n == 0 for n in p.users.values())
    for r in (Region.G, Region.T, Region.C):  # allocated ids = the unused cached ones
        assert cache.alloc[r].used.sum() == p.num_unused(r)
    assert s["prefix.hit_tokens"] <= s["prefix.queried_tokens"]


def test_a_prompt_continuing_a_finished_sequence_starts_from_its_kept_tail():
    """A sequence that ends with a partial block leaves it in its W slot (``tails.py``); a
    prompt that continues it -- a beam's next step, a conversation's next turn -- copies those
    records and prefills only what follows, its attention that of its own records."""
    spec = SPECS["mla"](2)
    cache = make_cache(spec, 4, RandomPolicy(1), blocks=16, seqs=3)
    rng = random.Random(1)
    a = Seq(0, [1, 2, 3, 1, 2, 3, 1, 2, 3, 1], 3)  # 12 records: 3 blocks of 4, no tail
    run(cache, [a], spec, 2, 5, rng)
    assert len(cache.tails) == 0
    b = Seq(1, a.tokens + [2, 2], 2)  # 15 records: a's 3 blocks, then 3 in its W slot
    run(cache, [b], spec, 2, 3, rng)
    assert b.cached == 12 and len(cache.tails) == 1
    # continuing b (its tokens and one more): its 3 blocks and its kept tail of 3 records
    for sid in (2, 3):  # twice: the tail stays kept for a sibling
        c = Seq(sid, b.tokens + [3], 2)
        run(cache, [c], spec, 2, 4, rng)
        assert c.cached == len(b.tokens) == 15
    st = cache.stats()
    assert st["prefix.tail_hit_tokens"] == 6 and st["prefix.tails"] >= 1
    assert st["kv.blocks.W"] == 0  # kept tails are free slots
    # a prompt that goes another way after the tail's first token starts from that record
    d = Seq(4, b.tokens[:13] + [1, 1, 1], 1)
    m = cache.match_prefix(cache.prefix_names(d.prompt), len(d.prompt), d.prompt)
    assert len(m) == 3 and m.tail.tokens == 1
    run(cache, [d], spec, 2, 3, rng)  # its attention checked against its own records
    assert d.cached == 13
    # and one that differs at the tail's first token takes none of it
    e = Seq(5, b.tokens[:12] + [3, 3, 3], 1)
    m = cache.match_prefix(cache.prefix_names(e.prompt), len(e.prompt), e.prompt)
    assert len(m) == 3 and m.tail is None
    # and reset gives the kept slots back
    assert cache.reset_prefix_cache() and len(cache.tails) == 0
    assert cache.alloc[Region.W].num_free == 3


def test_kept_tails_give_their_slots_to_new_sequences():
    """Kept tails never keep a sequence out: with every W slot a kept tail, a new sequence
    takes the least recently used one, or the very tail it starts from (no copy)."""
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, RandomPolicy(2), blocks=32, seqs=2)
    rng = random.Random(2)
    firsts = [Seq(i, [i + 1] * 6, 2) for i in range(2)]  # each leaves 7 records: 1 block + 3
    run(cache, firsts, spec, 1, 6, rng)
    assert len(cache.tails) == 2 and cache.alloc[Region.W].num_free == 0
    assert cache.free_slots() == 2 and cache.can_admit(8)
    # a stranger takes the older tail's slot; the other stays kept
    run(cache, [Seq(5, [9] * 3, 1)], spec, 1, 3, rng)  # 3 records: a tail of its own
    assert len(cache.tails) == 2
    # both slots kept again: a continuation of firsts[1] copies its tail into the other one
    cont = Seq(6, firsts[1].tokens + [3], 1)
    run(cache, [cont, Seq(7, [8] * 2, 1)], spec, 1, 4, rng)
    assert cont.cached == 7
    # one W slot, a tail in it: the continuation takes that slot over
    one = make_cache(spec, 4, RandomPolicy(3), blocks=32, seqs=1)
    first = Seq(0, [4] * 6, 2)
    run(one, [first], spec, 1, 6, rng)
    assert one.alloc[Region.W].num_free == 0 and one.free_slots() == 1
    cont = Seq(1, first.tokens + [2], 2)
    run(one, [cont], spec, 1, 4, rng)  # its attention checked against its own records
    assert cont.cached == 7 and one.stats()["prefix.tail_hit_tokens"] == 3
    assert len(one.tails) == 1  # its own tail now
    # a prompt that shares only the first of a tail's 3 records takes its slot over too: the
    # 2 records after it stay in the slot, stale, and are never read as this sequence's (its
    # attention checked against its own records)
    lone = make_cache(spec, 4, RandomPolicy(4), blocks=32, seqs=1)
    first = Seq(0, [4] * 6, 2)  # 7 records: a block, then [4, 4, its sampled token] kept
    run(lone, [first], spec, 1, 6, rng)
    part = Seq(1, [4] * 5 + [5, 6], 1)  # after the block: 4, then 5 where the tail has 4
    run(lone, [part], spec, 1, 4, rng)
    assert part.cached == 4 + 1 and lone.stats()["prefix.tail_hit_tokens"] == 1
    # the slot kept again, now as its tail: [4, 5, 6] after the block
    assert [k[1] for k in lone.tails._slots] == [(4, 5, 6)]
    assert lone.alloc[Region.W].num_free == 0


def test_a_second_prompt_starts_from_the_first_ones_blocks():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, RandomPolicy(0), blocks=16)
    rng = random.Random(0)
    a = Seq(0, list(range(1, 15)), 3)  # 14 tokens: 3 full blocks
    run(cache, [a], spec, 1, 5, rng)
    b = Seq(1, list(range(1, 15)) + [7, 7], 2)  # the same 14 tokens, then 2 more
    names = cache.prefix_names(b.prompt)
    m = cache.match_prefix(names, len(b.prompt))
    assert len(m) == 3 and m.unused == 3
    # the first block holds the prompt's first tokens; a's decode tokens made its 4th block
    run(cache, [b], spec, 1, 5, rng)
    assert b.cached == 12
    st = cache.stats()
    assert st["prefix.hit_tokens"] == 12 and st["prefix.queried_tokens"] == 14 + 16
    # a prompt that is all cached blocks still computes its last token (its logits)
    c = Seq(2, list(range(1, 13)), 1)
    m = cache.match_prefix(cache.prefix_names(c.prompt), len(c.prompt))
    assert len(m) == 2


def test_concurrent_users_share_blocks_and_reservations_count_them_once():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, RandomPolicy(1), blocks=3)  # 9 sealed blocks in all
    prompt = list(range(1, 22))  # 21 tokens: 5 full blocks
    a = Seq(0, prompt, 3)  # needs 6 blocks
    # prefill a, keep it running
    names = cache.prefix_names(prompt)
    cache.add_sequence(0, 24, 21, prompt_names=names)
    recs = token_records(prompt, spec, 1)
    cache.begin_step([(0, 0, 21)])
    cache.attention(0, torch.randn(21, 2, spec.k_dim), recs[0])
    cache.end_step()
    assert cache.prefix.stats()["prefix.registered_blocks"] == 5
    # 3 blocks left and 6 reserved by a: a second 24-token sequence fits only by sharing
    assert not cache.can_admit(24)
    m = cache.match_prefix(names, 21)
    assert len(m) == 5 and m.unused == 0
    assert cache.can_admit(24, m)
    assert cache.add_sequence(1, 24, 21, prefix=m, prompt_names=names) == 20
    assert all(cache.prefix.users[ref] == 2 for ref in m.blocks)
    assert cache.prefix.shared == 5 and cache.stats()["prefix.shared_blocks"] == 5
    cache.free_sequence(0, a.tokens)
    assert all(cache.prefix.users[ref] == 1 for ref in m.blocks)
    assert cache.prefix.shared == 0
    cache.free_sequence(1, prompt)
    assert cache.stats()["kv.blocks.G"] + cache.stats()["kv.blocks.T"] + \
        cache.stats()["kv.blocks.C"] == 0
    assert sum(cache.prefix.num_unused(r) for r in (Region.G, Region.T, Region.C)) == 5


def test_the_queue_head_counts_a_waiting_prompts_cached_blocks():
    """The scheduler's queue head (what the placement policy expects to join the batch) counts
    a waiting request's blocks as admission does: a prompt that fits only by sharing a
    running sequence's blocks is in it, and is admitted; one that asks for its prompt's
    log-probabilities computes every token, so it does not fit."""
    from writescope.core import Request, SamplingParams
    from writescope.engine.scheduler import Scheduler
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, RandomPolicy(1), blocks=3)  # 9 sealed blocks in all
    prompt = list(range(1, 22))  # 21 tokens: 5 full blocks
    names = cache.prefix_names(prompt)
    cache.add_sequence(0, 24, 21, prompt_names=names)
    cache.begin_step([(0, 0, 21)])
    cache.attention(0, torch.randn(21, 2, spec.k_dim), token_records(prompt, spec, 1)[0])
    cache.end_step()
    assert not cache.can_admit(24)  # 3 blocks left and 6 reserved by sequence 0
    sched = Scheduler(cache, max_num_seqs=4, max_num_batched_tokens=64)

    def waiting(rid, **kw):
        req = Request(rid, list(prompt), SamplingParams(max_tokens=3, **kw))
        req.max_tokens = 3
        sched.add(req)
        return req

    logp = waiting("logprobs", prompt_logprobs=1)
    assert sched.queue_head() == {}
    sched.remove(logp)
    w = waiting("w")
    assert sched.queue_head() == {w.seq_id: 21}
    assert sched.admit_next() is w and w.num_cached_tokens == 20


def test_reset_forgets_every_block_only_when_no_sequence_is_in():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, RandomPolicy(3), blocks=16)
    rng = random.Random(3)
    run(cache, [Seq(0, list(range(1, 15)), 3)], spec, 1, 5, rng)
    free = {r: cache.alloc[r].num_free for r in (Region.G, Region.T, Region.C)}
    assert cache.prefix.stats()["prefix.registered_blocks"] == 4
    names = cache.prefix_names(list(range(1, 15)))
    cache.add_sequence(1, 20, 14, prompt_names=names)
    assert cache.reset_prefix_cache() is False  # sequence 1 is in
    assert cache.prefix.stats()["prefix.registered_blocks"] == 4
    cache.free_sequence(1)
    assert cache.reset_prefix_cache() is True
    assert cache.prefix.stats()["prefix.registered_blocks"] == 0
    assert len(cache.match_prefix(names, 14)) == 0
    assert sum(cache.alloc[r].num_free for r in free) == sum(free.values()) + 4


def test_unused_blocks_are_reclaimed_from_the_ends_of_prefixes():
    p = PrefixCache(4)
    names = block_hashes(list(range(16)), 4)
    for i, n in enumerate(names):
        assert p.register(n, (Region.G, i))
    for i in reversed(range(4)):  # as free_sequence leaves them: the last block first
        assert not p.release((Region.G, i))
    assert p.reclaim(Region.G, 2) == [3, 2]
    m = p.match(names, 4)
    assert len(m) == 2 and m.unused == 2
    # a taken name: the second block with those tokens stays private (freed by its owner)
    assert not p.register(names[0], (Region.C, 9))
    assert p.release((Region.C, 9))


def test_names_chain_over_the_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6], 2)
    b = block_hashes([9, 2, 3, 4, 5, 6], 2)
    assert len(a) == 3 and a[1:] != b[1:]  # same tokens after a different start: other names
    assert block_hashes([3, 4, 5, 6], 2, parent=a[0]) == a[1:]
    assert block_hashes([1, 2, 3], 2, limit=0) == []


def test_synthetic_fill_is_never_cached():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, RandomPolicy(2), blocks=8)
    prompt = list(range(1, 14))
    names = cache.prefix_names(prompt)
    cache.add_sequence(0, 16, 13, prompt_names=names)
    cache.fill_step([(0, 0, 12)], torch.randn(12, spec.num_kv_heads, spec.rec_dim))
    cache.free_sequence(0, prompt)
    assert cache.prefix.stats()["prefix.registered_blocks"] == 0
    assert len(cache.match_prefix(names, 13)) == 0


def test_migrate_policy_refuses_prefix_caching():
    spec = SPECS["gqa"](1)
    with pytest.raises(ValueError, match="prefix caching"):
        make_cache(spec, 4, MigratePolicy(), blocks=4)


class OnlyC(PlacementPolicy):
    name = "only-c-test"

    def place(self, seq, num_blocks, capacity):
        return [Region.C] * num_blocks


def test_reclaiming_makes_room_in_the_region_the_policy_asks_for():
    """C full of unused cached blocks: a new sequence's C blocks take their ids."""
    spec = SPECS["gqa"](1)
    layout = CacheLayout(4, {Region.G: 0, Region.T: 0, Region.C: 4, Region.W: 2})
    cache = InplaceKVCache(spec, layout, OnlyC(), "cpu", scale=0.3, prefix_caching=True)
    rng = random.Random(3)
    run(cache, [Seq(0, [1] * 17, 1)], spec, 1, 8, rng)
    assert cache.prefix.num_unused(Region.C) == 4 and cache.free_sealed() == 4
    run(cache, [Seq(1, [2] * 17, 1)], spec, 1, 8, rng)  # other tokens: no hit, all reclaimed
    assert cache.prefix.counters["prefix.reclaimed_blocks"] == 4
    assert len(cache.match_prefix(cache.prefix_names([2] * 17), 17)) == 4


def test_a_prompt_being_prefilled_is_pending_until_sealed_or_freed():
    spec = SPECS["gqa"](1)
    cache = make_cache(spec, 4, RandomPolicy(4), blocks=16)
    prompt = list(range(1, 14))  # 3 full blocks
    names = cache.prefix_names(prompt)
    m0 = cache.match_prefix(names, 13)
    assert not cache.prefix_pending(names, m0, 13)
    cache.add_sequence(0, 16, 13, prompt_names=names)
    assert cache.prefix_pending(names, m0, 13)
    recs = token_records(prompt, spec, 1)
    cache.begin_step([(0, 0, 8)])  # two blocks sealed, the third still to come
    cache.attention(0, torch.randn(8, 2, spec.k_dim), recs[0, :8])
    cache.end_step()
    m = cache.match_prefix(names, 13)
    assert len(m) == 2 and cache.prefix_pending(names, m, 13)
    assert not cache.prefix_pending(names[:2] + [b"other"], m, 13)
    cache.free_sequence(0, prompt[:8])  # aborted: nothing is pending any more
    assert not cache.prefix_pending(names, m, 13) and not cache._pending
    # a benchmark's synthetic fill never registers, so nothing waits for it
    cache.add_sequence(1, 16, 13, prompt_names=names)
    assert cache.prefix_pending(names, cache.match_prefix(names, 13), 13)
    cache.fill_step([(1, 0, 4)], torch.randn(4, spec.num_kv_heads, spec.rec_dim))
    assert not cache._pending


class ReadTInPlace(TransferPolicy):
    """Everything spilled in T, and the CPU asked to read every T block in place."""

    def assign(self, seq):
        return len(seq.regions)


def two_holders(spec, policy, c_blocks: int = 4):
    """A cache (block size 4, 1 G block, 16 T, ``c_blocks`` C) whose sequence 0 prefilled a
    21-token prompt (5 full blocks) and sequence 1 started from its blocks (prefix caching):
    ``(cache, its match, the records of the prompt and two more tokens, a generator)``."""
    layout = CacheLayout(4, {Region.G: 1, Region.T: 16, Region.C: c_blocks, Region.W: 4})
    cache = InplaceKVCache(spec, layout, policy, "cpu", scale=0.3, prefill_gpu_rows=4,
                           prefix_caching=True)
    prompt = list(range(1, 22))  # 21 tokens: 5 full blocks
    names = cache.prefix_names(prompt)
    cache.add_sequence(0, 24, 21, prompt_names=names)
    recs = token_records(prompt + [3, 3], spec, 1)
    g = torch.Generator().manual_seed(0)
    cache.begin_step([(0, 0, 21)])
    cache.attention(0, torch.randn(21, 2, spec.k_dim, generator=g), recs[0, :21])
    cache.end_step()
    m = cache.match_prefix(names, 21)
    assert cache.add_sequence(1, 24, 21, prefix=m, prompt_names=names) == 20
    return cache, m, recs, g


def decode_both(cache, spec, recs, g):
    """One step of :func:`two_holders`' sequences (a decode row and the prompt's last token),
    checked against the oracle: ``(its timing, the step plan's CPU side)``."""
    cache.begin_step([(0, 21, 1), (1, 20, 1)])
    cpu_side = cache._step["plan"].cpu
    q = torch.randn(2, 2, spec.k_dim, generator=g)
    out = cache.attention(0, q, torch.stack([recs[0, 21], recs[0, 20]]))
    timing = cache.end_step()
    for row, end in ((0, 22), (1, 21)):
        r = recs[0, :end]
        ref, _ = dense_attention(q[row:row + 1], spec.k(r), spec.v(r), 0.3,
                                 torch.tensor([end - 1]), torch.arange(end))
        assert (out[row].double() - ref[0]).norm() / ref.norm() < 1e-5
    return timing, cpu_side


@pytest.mark.parametrize("policy", [TransferPolicy, ReadTInPlace])
def test_sequences_sharing_t_blocks_count_them_once_on_the_link(policy):
    """Two sequences holding the same streamed (T) blocks: the step's attention is each one's
    own; the bytes it reports streamed (``t_bytes``, what the planner's link rate learns from)
    count each shared block once, as the staging ring moves it (attention/staging.py); and a
    policy's oldest T blocks for the CPU leave the shared ones to the link."""
    spec = SPECS["gqa"](1)
    bs = 4
    prompt = list(range(1, 22))
    cache, m, recs, g = two_holders(spec, policy())
    homes = [r for r, _ in m.blocks]
    n_t = homes.count(Region.T)
    assert n_t >= 3 and cache.prefix.shared == 5
    timing, _ = decode_both(cache, spec, recs, g)
    tb = spec.token_bytes()
    assert timing["t_bytes"] == n_t * bs * tb  # each shared T block once
    assert timing["gpu_bytes"] >= 2 * n_t * bs * tb  # both sequences read it
    assert timing["cpu_bytes"] == timing["cpu_t_bytes"] == 0  # every T block is shared
    cache.free_sequence(1, prompt[:21])
    assert cache.prefix.shared == 0 and cache.prefix.shared_in(Region.T) is None
    cache.begin_step([(0, 22, 1)])  # alone again: its T blocks are its own
    cache.attention(0, torch.randn(1, 2, spec.k_dim, generator=g), recs[0, 22:23])
    timing = cache.end_step()
    assert timing["cpu_bytes"] == timing["cpu_t_bytes"] == \
        (n_t * bs * tb if policy is ReadTInPlace else 0)


class Recording(ReadTInPlace):
    """ReadTInPlace that keeps what the cache told it of shared blocks."""

    def __init__(self):
        super().__init__()
        self.told: list = []

    def note_shared(self, distinct_t_blocks, distinct_c_blocks=0):
        self.told.append(("distinct", distinct_t_blocks))

    def assign(self, seq):
        self.told.append((seq.seq_id, seq.shared_t, seq.regions.count(Region.T)))
        return super().assign(seq)


def test_the_policy_is_told_which_t_blocks_are_shared():
    """Before a step's ``assign`` calls the cache tells a policy how many distinct T blocks
    two or more of its sequences hold, and each ``SeqKV`` how many of its own T blocks are
    among them; once a holder leaves, none are."""
    spec = SPECS["gqa"](1)
    pol = Recording()
    cache, _, recs, _ = two_holders(spec, pol)
    prompt = list(range(1, 22))
    n_t = cache.seqs[0].regions().count(Region.T)
    pol.told.clear()
    cache.begin_step([(0, 21, 1), (1, 20, 1)])
    cache.attention(0, torch.randn(2, 2, spec.k_dim), torch.stack([recs[0, 21], recs[0, 20]]))
    cache.end_step()
    assert pol.told == [("distinct", n_t), (0, n_t, n_t), (1, n_t, n_t)]
    cache.free_sequence(1, prompt[:21])
    pol.told.clear()
    cache.begin_step([(0, 22, 1)])
    cache.attention(0, torch.randn(1, 2, spec.k_dim), recs[0, 22:23])
    cache.end_step()
    assert pol.told == [("distinct", 0), (0, 0, n_t)]


class SharedTToCpu(TransferPolicy):
    """Everything spilled in T (or, with ``region=C``, in C); the CPU reads the ``k`` oldest
    shared T blocks in place, and no private ones."""

    def __init__(self, k: int, region: Region = Region.T):
        super().__init__()
        self.k, self.region = k, region

    def place(self, seq, num_blocks, capacity):
        if self.region is Region.T:
            return super().place(seq, num_blocks, capacity)
        out = []
        free = dict(capacity.free)
        for _ in range(num_blocks):
            r = Region.G if free.get(Region.G, 0) > 0 else Region.C
            free[r] -= 1
            out.append(r)
        return out

    def assign(self, seq):
        return 0

    def shared_t_to_cpu(self):
        return self.k


@pytest.mark.parametrize("region,k", [(Region.T, 2), (Region.T, 99), (Region.C, 0)])
def test_the_cpu_reads_a_shared_block_once_for_all_holders(monkeypatch, region, k):
    """Two sequences holding the same prefix blocks. Where the CPU kernel reads a block its
    sequences share once (``attention/shared_reads.py``): a policy's ``shared_t_to_cpu`` gives
    the CPU the oldest shared T blocks for both holders, the link streams the rest, and the CPU
    bytes the step reports count each block it reads once; shared C blocks likewise. The
    results match the oracle, and with ``WRITESCOPE_CPU_SHARED_READS=0`` the CPU reads every
    listing and takes no shared T block."""
    from writescope.attention import shared_reads
    if not shared_reads.active(False):
        pytest.skip("the compiled CPU kernel is not available")
    spec = SPECS["gqa"](1)
    bs = 4
    tb = spec.token_bytes()
    for once in (True, False):
        monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "1" if once else "0")
        cache, m, recs, g = two_holders(spec, SharedTToCpu(k, region), c_blocks=16)
        homes = [r for r, _ in m.blocks]
        n_sp = homes.count(region)
        assert n_sp >= 3 and homes.count(Region.G) + n_sp == 5
        timing, cpu_side = decode_both(cache, spec, recs, g)
        if region is Region.T:
            n_cpu = min(k, n_sp) if once else 0
            assert timing["cpu_t_bytes"] == timing["cpu_bytes"] == n_cpu * bs * tb
            assert timing["t_bytes"] == (n_sp - n_cpu) * bs * tb
            if n_cpu:  # the same oldest blocks for both holders
                (r, b), = cpu_side
                assert r is Region.T
                ids = [m.blocks[i][1] for i in range(5) if homes[i] is Region.T][:n_cpu]
                assert b.kv_blocks.tolist() == ids + ids
        else:
            assert timing["cpu_bytes"] == (1 if once else 2) * n_sp * bs * tb
            assert timing["t_bytes"] == 0
