"""More HF parity: the ``migrate`` KV policy while it really moves blocks (every fixture
architecture), and aborting the request whose prefill computes a prompt prefix other requests
wait on or share."""
from __future__ import annotations

import pytest

from test_migrate import synthetic_profile
from test_parity import PLACEMENTS, TOP, check, engine, prompt_ids, reference
from writescope import LLM, SamplingParams

MIGRATE_NEW = 40


@pytest.fixture(scope="module")
def all_arch_profile(tmp_path_factory):
    """test_migrate's synthetic profile (no GPU, a 1000x faster CPU attention kernel that costs
    10 ms per layer to start: the target CPU share jumps from 0 to 1 mid-decode), with rates for
    every fixture architecture's attention family and expert shape."""
    from writescope.planner.profile import HardwareProfile
    from writescope.planner.roofline import family_key
    p = synthetic_profile().to_dict()
    # family: KV bytes per token and layer (bf16); the device path's rate scales with them so
    # that each model's target share jumps at the same spilled length (~40 tokens)
    families = {family_key(False, 4, 2, 16): 2 * 2 * 16 * 2,  # tiny_mixtral
                family_key(False, 4, 2, 32): 2 * 2 * 32 * 2,  # tiny_qwen3_moe
                family_key(True, 4, 1, 32 + 8): (32 + 8) * 2}  # tiny_deepseek_v2 (MLA)
    p["cpu_attn"] = {f: {"C": 1e9, "T": 1e9} for f in families}
    p["device_attn"] = {f: 1e6 * b / 256 for f, b in families.items()}
    p["cpu_expert"] = {k: 1e12 for k in ("h64-i96", "h64-i48", "h64-i32")}
    prof = HardwareProfile.from_dict(p)
    prof.validate()
    path = tmp_path_factory.mktemp("migrate_all") / "synthetic.json"
    prof.save(path)
    return path


@pytest.mark.parametrize("arch", ["tiny_mixtral", "tiny_qwen3_moe", "tiny_deepseek_v2"])
def test_migrate_moving_blocks_matches_transformers(arch, request, all_arch_profile,
                                                    monkeypatch, torch_single_thread):
    """Two prompts decoded under ``kv_policy="migrate"`` with 2 GPU blocks: their spilled blocks
    move from T to C mid-decode as the roofline's target share jumps to 1, and every greedy
    token, log-probability and top-5 row is still transformers' (float64, within 1e-4)."""
    path = request.getfixturevalue(arch)
    monkeypatch.setenv("WRITESCOPE_PROFILE", str(all_arch_profile))
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=8, max_model_len=256,
              max_num_seqs=4, num_gpu_blocks=2, kv_policy="migrate", cpu_share=0.5,
              profile=str(all_arch_profile))
    prompts = [prompt_ids(320, 24, seed=21), prompt_ids(320, 30, seed=22)]
    params = SamplingParams(temperature=0.0, max_tokens=MIGRATE_NEW, ignore_eos=True,
                            logprobs=TOP)
    outs = llm.generate(prompts, params)
    s = llm.stats()
    assert s["migrate.target_source"] == "roofline"
    moved = s["migrate.blocks_moved_t_to_c"] + s["migrate.blocks_moved_c_to_t"]
    assert moved > 0 and s["kv.bytes_moved_after_placement"] > 0
    assert s["kv.bytes_moved_after_placement"] == moved * llm.engine.cache.block_bytes
    assert s["planner.target_share"] == 1.0 and s["kv.peak_blocks.C"] > 0
    for p, o in zip(prompts, outs):
        check(o, *reference(str(path), tuple(p), MIGRATE_NEW))
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW"), "every block returned"


def run_until_done(eng, max_steps: int = 200) -> dict:
    """Step until nothing is left (a bounded number of steps: a request left waiting for
    blocks no one will seal fails instead of hanging); the finished outputs by request id."""
    outs = {}
    for _ in range(max_steps):
        if not eng.has_unfinished_requests():
            break
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o
    assert not eng.has_unfinished_requests(), "requests stuck"
    return outs


@pytest.mark.parametrize("when", ["mid-prefill", "after-prefill"])
def test_aborting_the_request_that_prefills_a_shared_prefix(all_tiny, when):
    """Three prompts start with the same 150 tokens. The first one's prefill (chunks of 64)
    computes the shared blocks while the others wait for them (or, after its prefill, share
    them); it is aborted. The others still give exactly what they give alone (and
    transformers' tokens), start from the cached blocks, and no block stays in use."""
    vocab = 320
    shared = prompt_ids(vocab, 150, seed=31)
    prompts = [shared + prompt_ids(vocab, 20 + 7 * i, seed=40 + i) for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    alone = [engine(all_tiny, **PLACEMENTS["mixed"]).generate([p], params)[0] for p in prompts]

    llm = engine(all_tiny, **PLACEMENTS["mixed"])
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    eng.step()  # r0's first 64 tokens (4 blocks sealed); r1, r2 wait for the rest
    assert eng.num_running == 1 and eng.num_waiting == 2
    if when == "after-prefill":
        while eng.requests["r0"].num_computed < len(prompts[0]):
            eng.step()
        eng.step()  # r0 decodes; r1 and r2 join, sharing its sealed prompt blocks
        assert eng.num_running == 3 and eng.cache.prefix.users
        assert max(eng.cache.prefix.users.values()) == 3
    eng.abort_request("r0")
    outs = run_until_done(eng)
    assert "r0" not in outs or outs["r0"].finish_reason == "abort"
    for i in (1, 2):
        o, a = outs[f"r{i}"], alone[i]
        assert o.token_ids == a.token_ids, f"r{i}"
        assert max(abs(x - y) for x, y in zip(o.logprobs, a.logprobs)) < 1e-5, f"r{i}"
        # mid-prefill: r1 from r0's 4 sealed blocks, r2 (waiting on r1's) from 9; after: both 9
        want_cached = 64 if (when, i) == ("mid-prefill", 1) else 144
        assert o.num_cached_tokens == want_cached, f"r{i} started from the cached blocks"
        toks, lps, _ = reference(str(all_tiny), tuple(prompts[i]), 12)
        assert o.token_ids == toks
        assert max(abs(x - y) for x, y in zip(o.logprobs, lps)) < 1e-4
    cache = eng.cache
    assert all(n == 0 for n in cache.live_blocks().values()), "no block leaked"
    assert all(n == 0 for n in cache.prefix.users.values())
    assert not cache._pending and not cache.seqs
    s = llm.stats()
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW")
    assert s["engine.requests_aborted"] == 1
