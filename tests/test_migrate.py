"""The ``migrate`` baseline: it moves blocks (and counts the bytes) as its target share changes,
every other policy moves nothing, and all of them decode the same greedy tokens."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from writescope.kvcache.migrate import MigratePolicy, wanted_c_blocks
from writescope.kvcache.placement import CacheCapacity, SeqKV, fill_then_split, make_policy
from writescope.kvcache.regions import Region

G, T, C = Region.G, Region.T, Region.C


def cap(g=0, t=100, c=100, bs=8):
    return CacheCapacity({G: g, T: t, C: c}, bs, bs * 100)


def synthetic_profile():
    """A machine without a GPU whose CPU attention kernel is 1000x faster than the device path
    but costs a fixed 10 ms per layer to start: the roofline wants no CPU share for short spills
    and all of it once a step spills more than ~40 tokens of the tiny Qwen3 model (256 KV bytes
    per token and layer): the target share jumps from 0 to 1 in the middle of a decode."""
    from writescope.planner.profile import HardwareProfile
    p = HardwareProfile(machine={"cpu": "synthetic"}, cpu_threads=1, cpu_read_Bps=1e12,
                        cpu_attn={"gqa-g2-d32": {"C": 1e9, "T": 1e9}},
                        device_attn={"gqa-g2-d32": 1e6}, cpu_expert={"h64-i48": 1e12},
                        cpu_roundtrip_s=0.01, launch_s=0.0)
    p.validate()
    return p


# ----------------------------------------------------------------------------- the rule
@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 64), share=st.floats(0.0, 1.0))
def test_wanted_c_blocks_is_what_placement_writes(n, share):
    """Rebalancing aims at the split write-time placement produces for the same share."""
    placed = fill_then_split(SeqKV(0, n * 8, ()), n, cap(t=n, c=n), share)
    assert sum(r is C for r in placed) == wanted_c_blocks(n, share)


def test_registered_and_falls_back_to_a_fixed_share_without_a_model():
    p = make_policy("migrate", cpu_share=0.25)
    assert isinstance(p, MigratePolicy)
    assert p.stats()["migrate.target_source"] == "fixed" and p.target == 0.25
    with pytest.raises(ValueError):
        MigratePolicy(cpu_share=1.5)


def test_moves_oldest_t_to_c_and_newest_c_to_t():
    p = MigratePolicy(cpu_share=0.5)
    all_t = SeqKV(1, 80, (G, G) + (T,) * 8)
    all_c = SeqKV(2, 80, (G,) + (C,) * 6)
    moves = p.migrations([all_t, all_c], cap())
    # seq 1: 4 of its 8 spilled blocks to C, the oldest ones (indices 2..5)
    assert sorted(m for m in moves if m[0] == 1) == [(1, i, C) for i in (2, 3, 4, 5)]
    # seq 2: 3 of its 6 C blocks back to T, the newest ones (indices 4..6)
    assert sorted(m for m in moves if m[0] == 2) == [(2, i, T) for i in (4, 5, 6)]
    assert p.stats()["migrate.blocks_moved_t_to_c"] == 4
    assert p.stats()["migrate.blocks_moved_c_to_t"] == 3
    # at the target already: nothing moves
    balanced = SeqKV(3, 80, (C, C, T, T))
    assert p.migrations([balanced], cap()) == []


def test_moves_are_capped_by_free_blocks_and_hysteresis():
    p = MigratePolicy(cpu_share=1.0)
    s = SeqKV(1, 80, (T,) * 6)
    assert len(p.migrations([s], cap(c=2))) == 2
    lazy = MigratePolicy(cpu_share=0.5, min_move_blocks=3)
    assert lazy.migrations([SeqKV(1, 40, (T,) * 4)], cap()) == []   # 2 blocks off: tolerated
    assert len(lazy.migrations([SeqKV(1, 80, (T,) * 8)], cap())) == 4


def test_roofline_target_follows_length():
    from writescope.models.config import ModelConfig
    cfg = ModelConfig.from_hf({
        "model_type": "qwen3_moe", "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 128, "moe_intermediate_size": 48, "num_experts": 8,
        "num_experts_per_tok": 2, "rms_norm_eps": 1e-6})
    p = MigratePolicy(profile=synthetic_profile(), model_config=cfg, block_size=8)
    assert p.stats()["migrate.target_source"] == "roofline"
    short = SeqKV(1, 24, (G, G, T))
    assert p.migrations([short], cap()) == [] and p.target == 0.0
    long = SeqKV(1, 80, (G, G) + (T,) * 8)
    moves = p.migrations([long], cap())
    assert p.target == 1.0 and len(moves) == 8 and all(m[2] is C for m in moves)
    assert math.isfinite(p.stats()["planner.predicted_step_s"])


# ----------------------------------------------------------------------------- in the engine
@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("migrate_profile") / "synthetic.json"
    synthetic_profile().save(path)
    return path


def _run(model_dir, policy, profile_file, monkeypatch):
    from writescope import LLM, SamplingParams
    monkeypatch.setenv("WRITESCOPE_PROFILE", str(profile_file))
    llm = LLM(str(model_dir), dtype="float32", device="cpu", block_size=8, max_model_len=256,
              max_num_seqs=4, num_gpu_blocks=2, kv_policy=policy, cpu_share=0.5,
              profile=str(profile_file))
    prompts = [[5 + (7 * i) % 300 for i in range(24)], [9 + (3 * i) % 300 for i in range(30)]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    return [o.token_ids for o in outs], llm.stats(), llm.engine.cache.block_bytes


def test_migrate_moves_bytes_and_keeps_the_outputs(tiny_qwen3_moe, profile_file, monkeypatch,
                                                   torch_single_thread):
    results = {p: _run(tiny_qwen3_moe, p, profile_file, monkeypatch)
               for p in ("migrate", "static", "transfer", "cpu", "writescope")}
    toks_m, st_m, block_bytes = results["migrate"]
    moved_blocks = st_m["migrate.blocks_moved_t_to_c"] + st_m["migrate.blocks_moved_c_to_t"]
    assert moved_blocks > 0
    assert st_m["kv.bytes_moved_after_placement"] == moved_blocks * block_bytes
    # the rebalance reached the roofline's target: everything spilled is attended by the CPU
    assert st_m["planner.target_share"] == 1.0
    assert st_m["kv.peak_blocks.C"] > 0
    for name, (toks, st, _) in results.items():
        if name != "migrate":
            assert st["kv.bytes_moved_after_placement"] == 0, name
        assert toks == toks_m, f"{name} decodes other tokens than migrate"
