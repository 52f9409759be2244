"""The WriteScope planner: roofline closed forms, the share's shape, placement, feedback."""
import dataclasses
import math
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from writescope.kvcache.placement import CacheCapacity, SeqKV, cpu_mask, make_policy
from writescope.kvcache.regions import Region
from writescope.models.config import ModelConfig
from writescope.planner import roofline as rl
from writescope.planner.feedback import RateFeedback
from writescope.planner.placement import WriteScopePolicy, choose_spilled_region
from writescope.planner.profile import HardwareProfile

GB = 1e9
HUGE = 1e18  # a rate so high its term vanishes


def h200_like(**over) -> HardwareProfile:
    """Rates of the order measured on the lent H200 machine (shared/hw): realistic shapes."""
    fams = ("gqa-g8-d128", "gqa-g4-d128", "mla-h16-r576", "gqa-g2-d16")
    d = dict(machine={"cpu": "test"}, cpu_threads=16, cpu_read_Bps=91 * GB,
             cpu_attn={f: {"C": 45 * GB, "T": 38 * GB} for f in fams},
             device_attn={f: 2500 * GB for f in fams},
             cpu_expert={"h2048-i768": 60 * GB, "h64-i32": 60 * GB},
             cpu_roundtrip_s=80e-6, launch_s=6e-6, h2d_pinned_Bps=53 * GB,
             h2d_pinned_block_Bps=44 * GB, h2d_pageable_Bps=10 * GB, d2h_pinned_Bps=55 * GB,
             hbm_Bps=4100 * GB, concurrent_h2d_Bps=49 * GB, concurrent_cpu_read_Bps=77 * GB)
    d.update(over)
    p = HardwareProfile(**d)
    p.validate()
    return p


def simple_profile(rc, rp, rt, *, rc_t=None, conc_h2d=None, conc_cpu=None) -> HardwareProfile:
    """Only the CPU attention, the PCIe and the round trip cost anything."""
    return h200_like(cpu_attn={"gqa-g2-d16": {"C": rc, "T": rc_t or rc}},
                     device_attn={"gqa-g2-d16": HUGE}, cpu_expert={"h64-i32": HUGE},
                     cpu_roundtrip_s=rt, launch_s=0.0, hbm_Bps=HUGE, h2d_pinned_Bps=rp,
                     concurrent_h2d_Bps=conc_h2d or rp, concurrent_cpu_read_Bps=conc_cpu or HUGE)


def tiny_cfg(layers=4, dense_first=False) -> ModelConfig:
    d = {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": layers,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4,
         "num_experts_per_tok": 2, "rms_norm_eps": 1e-6}
    if dense_first:
        d["mlp_only_layers"] = [0]
    return ModelConfig.from_hf(d)


KVB = 2 * 2 * 16 * 2  # tiny_cfg: KV bytes per token per layer (2 KV heads x (K+V) x 16 x bf16)


# ----------------------------------------------------------------------------- closed forms
def test_model_facts_match_config():
    cfg = tiny_cfg()
    assert rl.kv_bytes_per_token_layer(cfg) == KVB == cfg.kv_bytes_per_token() / cfg.num_layers
    for name in ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"):
        c = ModelConfig.from_hf(name)
        assert rl.kv_bytes_per_token_layer(c) * c.num_layers == c.kv_bytes_per_token()
        per_layer = sum(sum(v for k, v in rl.layer_param_counts(c, i).items() if k != "expert")
                        + rl.layer_param_counts(c, i)["expert"] * c.num_experts
                        for i in range(c.num_layers))
        pc = c.param_counts()
        embed = c.vocab_size * c.hidden_size * 2
        assert abs(per_layer + embed + c.hidden_size - pc["total"]) <= c.num_layers  # integer division
    assert rl.attn_family(ModelConfig.from_hf("deepseek-v2-lite")) == "mla-h16-r576"
    assert rl.attn_family(ModelConfig.from_hf("qwen3-30b-a3b")) == "gqa-g8-d128"


def test_active_experts_closed_form():
    assert rl.active_experts(4, 2, 1) == pytest.approx(2.0)
    assert rl.active_experts(4, 2, 2) == pytest.approx(3.0)  # 4 * (1 - (1/2)^2)
    assert rl.active_experts(8, 2, 0) == 0.0
    assert rl.active_experts(128, 8, 10_000) == pytest.approx(128.0)


def test_transfer_only_step_is_pcie_bound():
    """x = 0: every layer waits for its H2D copy, plus the first one nothing hides."""
    cfg = tiny_cfg(layers=4)
    rp = 10 * GB
    prof = simple_profile(rc=5 * GB, rp=rp, rt=1e-4)
    s = 1_000_000
    load = rl.StepLoad(batch_size=1, resident_tokens=0, streamed_tokens=s, cpu_c_tokens=0)
    pred = rl.predict_step(prof, cfg, load, experts_on_cpu=False)
    assert pred.step_s == pytest.approx((4 + 1) * s * KVB / rp, rel=1e-9)
    assert pred.cpu_attn_s == 0.0
    assert pred.pcie_s == pytest.approx(4 * s * KVB / rp)


def test_cpu_only_step():
    cfg = tiny_cfg(layers=3)
    rc, rt = 5 * GB, 1e-4
    prof = simple_profile(rc=rc, rp=10 * GB, rt=rt)
    s = 500_000
    load = rl.StepLoad(1, 0, 0, s)
    pred = rl.predict_step(prof, cfg, load, experts_on_cpu=False)
    assert pred.step_s == pytest.approx(3 * (rt + s * KVB / rc), rel=1e-9)
    assert pred.pcie_s == 0.0


@pytest.mark.parametrize("s", [1_000, 30_000, 300_000, 3_000_000, 30_000_000])
def test_optimal_share_closed_form(s):
    """Balance r + x*S*k/rc = (1-x)*S*k/rp, so x* = (S*k/rp - r) / (S*k/rc + S*k/rp), or 0 when
    the round trip outweighs what the CPU could take off the link."""
    cfg = tiny_cfg(layers=4)
    rc, rp, r = 5 * GB, 10 * GB, 2e-4
    prof = simple_profile(rc=rc, rp=rp, rt=r)
    plan = rl.target_share(prof, cfg, 1, 0.0, s, experts_on_cpu=False)
    a, b = s * KVB / rp, s * KVB / rc
    want = max(0.0, (a - r) / (a + b))
    assert plan.cpu_share == pytest.approx(want, abs=1e-9)
    if want > 0:
        assert plan.prediction.step_s == pytest.approx(5 * (1 - want) * a, rel=1e-9)
    else:
        assert plan.prediction.step_s == pytest.approx(5 * a, rel=1e-9)


def test_share_tends_to_bandwidth_ratio_with_contention():
    cfg = tiny_cfg()
    prof = simple_profile(rc=60 * GB, rp=53 * GB, rt=1e-4, conc_h2d=49 * GB, conc_cpu=40 * GB)
    ratio = 40 / (40 + 49)  # CPU capped at its concurrent read rate; H2D at its concurrent rate
    assert rl.bandwidth_ratio(prof, cfg) == pytest.approx(ratio)
    x = rl.target_share(prof, cfg, 1, 0.0, 1e10, False).cpu_share
    assert x == pytest.approx(ratio, rel=1e-3)


def test_experts_on_cpu_closed_form():
    cfg = tiny_cfg(layers=2)
    r_exp, rt = 2 * GB, 5e-5
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=rt)
    prof.cpu_expert = {"h64-i32": r_exp}
    load = rl.StepLoad(2, 0, 0, 0)
    pred = rl.predict_step(prof, cfg, load, experts_on_cpu=True)
    expert_bytes = 3 * 64 * 32 * 2
    per_layer = rt + rl.active_experts(4, 2, 2) * expert_bytes / r_exp
    assert pred.expert_s == pytest.approx(2 * per_layer)
    assert pred.step_s == pytest.approx(2 * per_layer, rel=1e-6)


def test_experts_split_between_cpu_and_gpu_layer_by_layer():
    """experts="auto" can put some MoE layers' experts on the CPU and keep the others on the GPU:
    each layer is timed where its own experts run, and the step, the bound and the GPU's weight
    bytes lie between the all-GPU and all-CPU placements."""
    cfg = tiny_cfg(layers=4, dense_first=True)  # layer 0 dense, 1-3 MoE
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=5e-5)
    prof.cpu_expert = {"h64-i32": 2 * GB}
    prof.hbm_Bps = 1000 * GB  # the GPU's expert reads cost something, ten times less
    load = rl.StepLoad(2, 1000, 0, 0)
    flags = [False, True, False, True]  # two of three MoE layers' experts on the CPU
    assert rl.cpu_expert_layers(cfg, flags) == frozenset({1, 3})
    assert rl.cpu_expert_layers(cfg, True) == frozenset({1, 2, 3})
    assert rl.cpu_expert_layers(cfg, [True] * 4) == frozenset({1, 2, 3})  # the dense layer has none
    assert rl.cpu_expert_layers(cfg, False) == frozenset()
    with pytest.raises(ValueError, match="3 flags, the model has 4 layers"):
        rl.cpu_expert_layers(cfg, [True] * 3)
    gpu, cpu = (rl.predict_step(prof, cfg, load, x) for x in (False, True))
    mixed = rl.predict_step(prof, cfg, load, flags)
    per_cpu = cpu.layers[1].expert_s
    per_gpu = gpu.layers[1].expert_s
    assert per_cpu > per_gpu > 0
    assert [lt.expert_s for lt in mixed.layers] == pytest.approx([0.0, per_cpu, per_gpu, per_cpu])
    assert mixed.cpu_expert_s == pytest.approx(2 * per_cpu)
    assert cpu.cpu_expert_s == pytest.approx(cpu.expert_s) and gpu.cpu_expert_s == 0.0
    assert gpu.step_s < mixed.step_s < cpu.step_s
    # the same placement given as a set of layers or as flags; all flags = True
    assert rl.predict_step(prof, cfg, load, frozenset({1, 3})).step_s == mixed.step_s
    assert rl.predict_step(prof, cfg, load, [i > 0 for i in range(4)]).step_s == cpu.step_s
    # the GPU holds the routed experts of its own layers only
    all_gpu, none = rl.gpu_weight_bytes(cfg, False), rl.gpu_weight_bytes(cfg, True)
    assert rl.gpu_weight_bytes(cfg, flags) == pytest.approx(none + (all_gpu - none) / 3, abs=1)
    # the bound charges each layer's experts where they run
    b_gpu, b_cpu, b_mix = (rl.roofline_bound_s(prof, cfg, [500, 500], 1e9, x)
                           for x in (False, True, flags))
    assert b_gpu < b_mix < b_cpu
    # and a measured CPU expert figure scales the CPU layers' bytes only
    act = rl.active_experts(4, 2, 2) * 3 * 64 * 32 * 2
    assert rl.roofline_bound_s(prof, cfg, [500, 500], 1e9, flags, cpu_expert_bytes=2 * act) \
        == pytest.approx(b_mix)
    assert rl.roofline_bound_s(prof, cfg, [500, 500], 1e9, flags, cpu_expert_bytes=act) < b_mix


def test_split_placement_feeds_back_the_cpu_layers_expert_time():
    """With only some layers' experts on the CPU, the measured CPU expert seconds are compared
    with the predicted seconds of those layers, not with every layer's expert time."""
    cfg = tiny_cfg(layers=4, dense_first=True)
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=5e-5)
    prof.cpu_expert = {"h64-i32": 2 * GB}
    prof.hbm_Bps = 100 * GB
    flags = (False, True, False, True)
    pol = make_policy("writescope", profile=prof, model_config=cfg, experts_on_cpu=flags,
                      block_size=16)
    assert pol.experts_on_cpu == frozenset({1, 3})
    load = rl.StepLoad(1, 64, 0, 0)
    predicted = rl.predict_step(prof, cfg, load, flags).cpu_expert_s
    pol._feedback({"cpu_expert_s": 2 * predicted, "step_s": 1e-3}, [64])
    assert pol.feedback.corrections_at(64.0).expert > 1.0
    pol2 = make_policy("writescope", profile=prof, model_config=cfg, experts_on_cpu=flags,
                       block_size=16)
    pol2._feedback({"cpu_expert_s": predicted, "step_s": 1e-3}, [64])
    assert pol2.feedback.corrections_at(64.0).expert == pytest.approx(1.0, rel=1e-6)


def test_t_blocks_read_by_cpu_at_t_rate():
    cfg = tiny_cfg(layers=1)
    prof = simple_profile(rc=8 * GB, rp=10 * GB, rt=0.0, rc_t=4 * GB)
    load = rl.StepLoad(1, 0, 0, cpu_c_tokens=1000, cpu_t_tokens=3000)
    pred = rl.predict_step(prof, cfg, load, False)
    assert pred.cpu_attn_s == pytest.approx(1000 * KVB / 8e9 + 3000 * KVB / 4e9)


def test_no_gpu_profile_serialises_everything():
    cfg = tiny_cfg(layers=2)
    prof = h200_like(h2d_pinned_Bps=None, hbm_Bps=None, h2d_pinned_block_Bps=None,
                     h2d_pageable_Bps=None, d2h_pinned_Bps=None, concurrent_h2d_Bps=None,
                     concurrent_cpu_read_Bps=None, launch_s=0.0, cpu_roundtrip_s=0.0,
                     cpu_read_Bps=HUGE, device_attn={"gqa-g2-d16": 1 * GB},
                     cpu_attn={"gqa-g2-d16": {"C": 3 * GB, "T": 2 * GB}})
    assert not prof.has_gpu
    load = rl.StepLoad(1, 100, 400, 500)
    pred = rl.predict_step(prof, cfg, load, False)
    want = 2 * ((100 + 400) * KVB / 1e9 + 500 * KVB / 3e9)
    assert pred.step_s == pytest.approx(want, rel=1e-6)
    assert pred.pcie_s == 0.0
    # the CPU kernel is faster per byte than the device path: everything goes to it
    assert rl.target_share(prof, cfg, 1, 0, 10_000, False).cpu_share == 1.0


# ----------------------------------------------------------------------------- the share's shape
def brute_force(prof, cfg, b, res, c, t, exp, free, pipelined=False):
    best = None
    s = c + t
    lo = 0.0 if free else c / s
    for i in range(401):
        x = lo + (1 - lo) * i / 400
        load = rl.load_at_share(b, res, c, t, x, free)
        v = rl.predict_step(prof, cfg, load, exp, pipelined=pipelined).step_s
        if best is None or v < best:
            best = v
    return best


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rc=st.floats(1, 100), rp=st.floats(1, 100), rt=st.floats(0, 2e-3),
       c=st.integers(0, 10 ** 6), t=st.integers(0, 10 ** 6), res=st.integers(0, 10 ** 5),
       b=st.integers(1, 64), exp=st.booleans(), free=st.booleans())
def test_optimum_matches_brute_force(rc, rp, rt, c, t, res, b, exp, free):
    if c + t == 0:
        return
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    prof = h200_like(cpu_attn={"gqa-g8-d128": {"C": rc * GB, "T": 0.8 * rc * GB}},
                     h2d_pinned_Bps=rp * GB, concurrent_h2d_Bps=0.9 * rp * GB, cpu_roundtrip_s=rt)
    plan = rl.optimal_cpu_share(prof, cfg, b, res, c, t, exp, free=free, min_gain=0.0)
    grid = brute_force(prof, cfg, b, res, c, t, exp, free)
    assert plan.prediction.step_s <= grid * (1 + 1e-9)
    hysteresis = rl.optimal_cpu_share(prof, cfg, b, res, c, t, exp, free=free)  # min_gain 1 %
    assert hysteresis.prediction.step_s <= plan.prediction.step_s * (1 + rl.MIN_GAIN + 1e-9)
    # and the reported prediction is the model's value at that share
    load = rl.load_at_share(b, res, c, t, plan.cpu_share, free)
    assert rl.predict_step(prof, cfg, load, exp).step_s <= plan.prediction.step_s * (1 + 1e-9)


LENGTHS = [1024 * 2 ** i for i in range(10)]  # 1k .. 512k


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"])
@pytest.mark.parametrize("batch", [1, 8, 32])
@pytest.mark.parametrize("experts_on_cpu", [False, True])
def test_share_non_decreasing_in_context_length(name, batch, experts_on_cpu):
    cfg = ModelConfig.from_hf(name)
    prof = h200_like()
    budget = rl.gpu_weight_bytes(cfg, experts_on_cpu) + 4 * 2 ** 30  # ~3 GiB of G
    g = rl.gpu_kv_capacity_tokens(cfg, budget, experts_on_cpu)
    shares = [rl.plan_for_lengths(prof, cfg, [n] * batch, g, experts_on_cpu, "writescope").cpu_share
              for n in LENGTHS]
    assert all(b >= a - 1e-9 for a, b in zip(shares, shares[1:])), shares
    assert shares[0] == 0.0  # everything fits in G, or fixed costs dominate
    if not experts_on_cpu:  # long contexts approach the bandwidth ratio
        assert shares[-1] == pytest.approx(rl.bandwidth_ratio(prof, cfg), abs=0.05)


H200_PROFILE = Path(__file__).resolve().parents[1] / "bench" / "profiles" / "h200.json"
#: the profile the planner planned with from 2026-12-01 to 2026-12-04: the scenarios measured
#: under it (rate corrections learnt against its rates) are checked against it
H200_PROFILE_1201 = H200_PROFILE.with_name("h200-2026-12-01.json")


@pytest.mark.skipif(not H200_PROFILE.exists(), reason="no committed H200 profile")
@pytest.mark.parametrize("name", ["deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_cpu_tokens_non_decreasing_with_the_measured_h200_profile(name):
    """As sequences grow, the planned CPU side never attends fewer tokens. (Not its *share* of
    the spilled tokens: with a large G the first spill is small, and the CPU may take most of it
    -- PCIe would be the slowest path, the CPU attention hides under the GPU's resident
    attention -- and then a smaller share of a much larger spill: DeepSeek-V2-Lite, CPU experts,
    32 GiB, batch 4 plans 0.80 of 63K spilled tokens at 256K and 0.51 of 1.1M at 512K.)"""
    cfg = ModelConfig.from_hf(name)
    prof = HardwareProfile.load(H200_PROFILE)
    assert prof.has_gpu
    for exp in (False, True):
        for budget in (None, 32 * 2 ** 30, 100 * 2 ** 30):
            if budget and rl.gpu_weight_bytes(cfg, exp) + 2 ** 30 > budget:
                continue
            g = rl.gpu_kv_capacity_tokens(cfg, budget, exp)
            for b in (1, 4, 16, 64):
                cpu_tokens = []
                for n in LENGTHS:
                    spilled = b * n - sum(rl.resident_tokens([n] * b, g))
                    x = rl.plan_for_lengths(prof, cfg, [n] * b, g, exp, "writescope").cpu_share
                    cpu_tokens.append(x * spilled)
                assert all(y >= x * (1 - 1e-9) for x, y in zip(cpu_tokens, cpu_tokens[1:])), \
                    (exp, budget, b, cpu_tokens)


@pytest.mark.skipif(not H200_PROFILE.exists(), reason="no committed H200 profile")
@pytest.mark.parametrize("name", ["deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_the_bound_is_below_every_policys_predicted_step_on_the_h200_profile(name):
    """The roofline bound caps the host's reads at the concurrent rate while the link streams;
    the model must not predict a step below it. Before the CPU experts were slowed beside the
    link, Qwen3-30B-A3B 8 x 64K at 32 GiB (experts on the CPU) had writescope at 364 ms under
    a bound of 387 ms."""
    import dataclasses
    cfg = ModelConfig.from_hf(name)
    committed = HardwareProfile.load(H200_PROFILE)
    # and the host of 2026-12-01h call 1: 70.1 GB/s read beside the link
    slower = dataclasses.replace(committed, concurrent_cpu_read_Bps=70.1e9)
    # and the host of 2026-12-02f call 2, whose kernels read faster than its read probe (96.0
    # GB/s): CPU experts 105 GB/s, GQA attention 108; with the probe as the CPU's ceiling the
    # bound was above a policy's predicted step (by up to 8%: Mixtral-8x7B 8 x 32K, static)
    fast = {k: 105.1e9 for k in committed.cpu_expert}
    attn = {**committed.cpu_attn, "gqa-g4-d128": {"C": 107.5e9, "T": 61.0e9}}
    kernels = dataclasses.replace(committed, cpu_read_Bps=96.0e9, concurrent_cpu_read_Bps=83.1e9,
                                  concurrent_h2d_Bps=50.9e9, cpu_expert=fast, cpu_attn=attn)
    for prof, exp, budget in ((committed, True, 32 * 2 ** 30), (slower, True, 32 * 2 ** 30),
                              (kernels, True, 32 * 2 ** 30), (committed, False, None)):
        if not exp and rl.gpu_weight_bytes(cfg, False) > 100 * 2 ** 30:
            continue
        g = rl.gpu_kv_capacity_tokens(cfg, budget or 100 * 2 ** 30, exp)
        for b in (1, 4, 8, 16):
            for n in (8192, 32768, 65536, 98304, 131072):
                bound = rl.roofline_bound_s(prof, cfg, [n] * b, g, exp)
                for pol in ("writescope", "transfer", "cpu", "static"):
                    step = rl.plan_for_lengths(prof, cfg, [n] * b, g, exp, pol,
                                               static_share=0.4).prediction.step_s
                    assert bound <= step * (1 + 1e-9), (prof.concurrent_cpu_read_Bps, exp, b, n,
                                                        pol, bound, step)


@pytest.mark.skipif(not H200_PROFILE.exists(), reason="no committed H200 profile")
@pytest.mark.parametrize("name", ["deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_the_bound_is_below_the_split_step_with_some_layers_experts_on_the_cpu(name):
    """Two sub-batches overlap one's CPU experts with the other's GPU work of other layers, so
    with some layers' experts on the CPU the bound is each resource's whole work, not a sum
    of per-layer maxima: DeepSeek-V2-Lite 4 x 1K with 3 of 26 layers' experts on the CPU was
    predicted at 13.54 ms under a bound of 13.85 (`writescope plan`, H100 profile)."""
    cfg = ModelConfig.from_hf(name)
    for path in (H200_PROFILE, H200_PROFILE.with_name("h100.json")):
        if not path.exists():
            continue
        prof = HardwareProfile.load(path)
        moe = [i for i in range(cfg.num_layers) if i not in rl.cpu_expert_layers(cfg, False)
               and rl.layer_param_counts(cfg, i)["expert"] > 0]
        for k in (1, 3, len(moe) // 2):
            flags = [i in moe[:k] for i in range(cfg.num_layers)]
            for b in (1, 2, 4, 8):
                for n in (1024, 8192):
                    lens = [n] * b
                    g = float(sum(lens))  # all KV in HBM: the steps the engine splits
                    bound = rl.roofline_bound_s(prof, cfg, lens, g, flags)
                    for form in (False, True, "auto"):
                        step = rl.plan_for_lengths(prof, cfg, lens, g, flags, "writescope",
                                                   pipelined=form).prediction.step_s
                        assert bound <= step * (1 + 1e-9), (path.name, k, b, n, form, bound,
                                                            step)


def test_cpu_experts_beside_the_link_slow_down_continuously():
    """The CPU experts' reads run at the concurrent cap while the link streams, at their own
    rate after: no jump as the streamed share leaves zero, the capped rate once the link
    outlasts them."""
    f = rl._beside_the_link
    assert f(100.0, 10.0, 5.0, 0.0) == 10.0 and f(100.0, 10.0, 20.0, 50.0) == 10.0
    assert f(100.0, 10.0, 5.0, 1e-9) == pytest.approx(10.0)
    assert f(100.0, 10.0, 5.0, 20.0) == pytest.approx(20.0)   # the link outlasts them: 100 / 5
    assert f(100.0, 10.0, 5.0, 4.0) == pytest.approx(4.0 + 80.0 / 10.0)
    xs = [f(100.0, 10.0, 5.0, t) for t in [i * 0.5 for i in range(60)]]
    assert xs == sorted(xs) and max(b - a for a, b in zip(xs, xs[1:])) <= 0.5 + 1e-9


@pytest.mark.skipif(not H200_PROFILE_1201.exists(), reason="no 2026-12-01 H200 profile")
def test_placement_writes_c_only_for_a_gain_the_bench_can_see():
    """DeepSeek-V2-Lite 8 x 128K with the experts on the CPU and G holding 12181 blocks, at the
    rate corrections its planner had learnt (2026-12-01d call 4): the model gives a CPU share of
    ~0.19 a 1.3% gain, and the C blocks placed for it made writescope 4-10% slower than
    transfer. Placement needs PLACEMENT_MIN_GAIN (3%); the step plan keeps MIN_GAIN (1%). A
    large gain (Qwen3 with its experts on the GPU, 2 x 128K) is placed as before."""
    prof = HardwareProfile.load(H200_PROFILE_1201)
    dsv = ModelConfig.from_hf("deepseek-v2-lite")
    corr = rl.Corrections(cpu=1.225, cpu_fixed=0.219, pcie=1.0, gpu=1.0, expert=0.899)
    g = 12181 * 64
    spilled = 8 * 131072 - g
    assert rl.PLACEMENT_MIN_GAIN == 0.03 and rl.MIN_GAIN == 0.01
    assert rl.target_share(prof, dsv, 8, g, spilled, True, corr).cpu_share == 0.0
    assert rl.target_share(prof, dsv, 8, g, spilled, True, corr,
                           min_gain=rl.MIN_GAIN).cpu_share > 0.1
    qwen = ModelConfig.from_hf("qwen3-30b-a3b")
    qc = rl.Corrections(cpu=1.238, cpu_fixed=0.448, pcie=0.985, gpu=1.0)
    g = 2384 * 64
    assert rl.target_share(prof, qwen, 2, g, 2 * 131072 - g, False, qc).cpu_share > 0.4


@pytest.mark.skipif(not H200_PROFILE.exists(), reason="no committed H200 profile")
@pytest.mark.parametrize("name", ["deepseek-v2-lite", "qwen3-30b-a3b"])
def test_a_chunked_prefill_places_for_the_batch_its_prompts_make(name):
    """Four 32K prompts prefilled one after another in 4K chunks (each step closed, as the
    engine's are): planned from the sequences as they stand, each chunk aims at another target
    and the C blocks of the early ones stay -- DeepSeek-V2-Lite put 1% of its spill in C
    against 48% for the batch the four prompts make. Told the prompts at admission
    (``admit``), every chunk aims at that batch's target."""
    prof = HardwareProfile.load(H200_PROFILE)
    cfg = ModelConfig.from_hf(name)
    B, L, G = 4, 32768, 128
    out = {}
    for admit in (False, True):
        p = make_policy("writescope", profile=prof, model_config=cfg, experts_on_cpu=False,
                        verify_steps=0, batch_hint=B)
        cache = MiniCache(p, {Region.G: G, Region.T: 5000, Region.C: 5000})
        for sid in range(B):
            cache.seqs[sid], cache.tokens[sid] = [], 0
            if admit:
                p.admit(sid, L)
        for sid in range(B):
            for _ in range(L // 4096):
                cache.step({sid: 4096}, observe=True)
        spill = [r for sid in range(B) for r in cache.seqs[sid] if r is not Region.G]
        out[admit] = sum(r is Region.C for r in spill) / len(spill)
        target = rl.target_share(prof, cfg, B, G * 64, B * L - G * 64, False,
                                 p._placement_corrections()).cpu_share
    assert target > 0.3
    assert out[True] == pytest.approx(target, abs=0.01)
    assert abs(out[False] - target) > 0.15  # what the projection fixes
    p.release(0)
    assert 0 not in p._expected


def test_the_engine_tells_the_planner_its_prompts(tiny_deepseek_v2, tmp_path):
    """The scheduler admits each request with its prompt's length (cache.add_sequence ->
    policy.admit) and the cache releases it when it is freed; a synthetic prefill of three
    prompts, chunked one after another, then places the batch's spill at its target."""
    from writescope import LLM
    from writescope.core import SamplingParams
    prof = tmp_path / "profile.json"
    simple_profile(rc=5 * GB, rp=10 * GB, rt=0.0).save(prof)
    llm = LLM(str(tiny_deepseek_v2), dtype="float32", device="cpu", block_size=8,
              max_model_len=512, max_num_seqs=3, num_gpu_blocks=4, kv_policy="writescope",
              profile=str(prof), max_num_batched_tokens=64,
              pinned_budget="64MiB", host_budget="64MiB")  # T and C hold the whole spill
    eng = llm.engine
    pol = eng.cache.policy
    for i in range(3):
        eng.add_request(f"r{i}", [3 + (7 * j + i) % 300 for j in range(400)],
                        SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    eng.prefill_synthetic()
    assert sorted(pol._expected.values()) == [400, 400, 400]
    live = eng.cache.live_blocks()
    c, t = live[Region.C], live[Region.T]
    res = live[Region.G] * 8
    target = rl.target_share(pol.profile, eng.config, 3, res, 3 * 400 - res, False,
                             pol._placement_corrections()).cpu_share
    assert 0.1 < target < 0.9
    assert c / (c + t) == pytest.approx(target, abs=0.05)
    for i in range(3):
        eng.abort_request(f"r{i}")
    assert pol._expected == {}


def test_a_waiting_prompt_counts_in_the_placement_of_the_one_prefilled_before_it(
        tiny_deepseek_v2, tmp_path, monkeypatch):
    """Under a token budget smaller than a prompt, the scheduler admits the next request only
    when the one before has its last chunk: placed for the requests admitted so far, the first
    prompt aimed at a batch of one (target 0.04 here against 0.27 for the three; on the H200 a
    Qwen3 2 x 128K row put 0.64 of its spill in C against a target of 0.56). The scheduler tells
    the cache its queue head (``expect_waiting``), so every chunk aims at the batch of three."""
    from writescope import LLM
    from writescope.core import SamplingParams
    prof = tmp_path / "profile.json"
    simple_profile(rc=2 * GB, rp=2 * GB, rt=5e-6).save(prof)
    targets = {}
    for tell in (True, False):
        llm = LLM(str(tiny_deepseek_v2), dtype="float32", device="cpu", block_size=8,
                  max_model_len=512, max_num_seqs=3, num_gpu_blocks=25, kv_policy="writescope",
                  profile=str(prof), max_num_batched_tokens=64,
                  pinned_budget="64MiB", host_budget="64MiB")
        eng = llm.engine
        pol = eng.cache.policy
        if not tell:
            monkeypatch.setattr(eng.cache, "expect_waiting", lambda q: None)
        for i in range(4):  # the fourth does not fit max_num_seqs: not in the queue head
            eng.add_request(f"r{i}", [3 + (7 * j + i) % 300 for j in range(480)],
                            SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        if tell:
            eng.scheduler.schedule()  # admits r0 (its first chunk takes the whole budget)
            r = [eng.requests[f"r{i}"].seq_id for i in range(4)]
            assert pol._queued == {r[1]: 480, r[2]: 480}
            assert eng.scheduler.queue_head() == {r[1]: 480, r[2]: 480}
        eng.prefill_synthetic()
        live = eng.cache.live_blocks()
        res = live[Region.G] * 8
        target = rl.target_share(pol.profile, eng.config, 3, res, 3 * 480 - res, False,
                                 pol._placement_corrections()).cpu_share
        targets[tell] = [t for _, _, t, _, _ in pol.placement_log]
        c, t = live[Region.C], live[Region.T]
        assert c / (c + t) == pytest.approx(target, abs=0.02)  # the batch balance, either way
        for i in range(4):
            eng.abort_request(f"r{i}")
    assert 0.2 < target < 0.4
    assert all(abs(t - target) < 0.01 for t in targets[True])
    assert targets[False][0] < 0.1  # the first prompt alone


def test_the_batch_makes_up_for_a_sequence_placed_against_another_target():
    """Placement balances the batch's C fraction, not each sequence's: a sequence whose spill
    all went to T (placed when the target was 0) is made up for by the next one's blocks."""
    cfg = tiny_cfg()
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=0.0)
    p = policy(cfg, prof)
    cache = MiniCache(p, {Region.G: 0, Region.T: 10_000, Region.C: 10_000})
    cache.seqs[0], cache.tokens[0] = [Region.T] * 60, 60 * 64  # placed against a target of 0
    p.admit(0, 60 * 64)
    cache.step({0: 1})
    assert p.stats()["planner.target_share"] == pytest.approx(1 / 3, abs=0.01)  # the step plan's
    p.admit(1, 60 * 64)
    cache.seqs[1], cache.tokens[1] = [], 0
    cache.step({1: 60 * 64})
    target = p.last_placement_target  # placement's own (the CPU taken PLACEMENT_CPU_MARGIN slower)
    assert 0.15 < target < 1 / 3
    both = cache.seqs[0] + cache.seqs[1]
    assert c_fraction(both)[0] == pytest.approx(target, abs=1 / 120)
    assert c_fraction(cache.seqs[1])[0] == pytest.approx(2 * target, abs=1 / 60)


@pytest.mark.skipif(not H200_PROFILE_1201.exists(), reason="no 2026-12-01 H200 profile")
def test_with_experts_on_the_cpu_a_step_reads_t_in_place_only_for_a_visible_gain():
    """DeepSeek-V2-Lite 8 x 128K, experts on the CPU, at the factors its decode steps measured:
    with every spilled block in T, the model gives the CPU ~17% of them for a 1% gain -- the
    regime where attending 8% of the KV on the CPU made writescope 4-10% slower than transfer.
    With the experts on the CPU the step plan needs PLACEMENT_MIN_GAIN too; with them on the
    GPU it keeps MIN_GAIN."""
    prof = HardwareProfile.load(H200_PROFILE_1201)
    dsv = ModelConfig.from_hf("deepseek-v2-lite")
    corr = rl.Corrections(cpu=1.225, cpu_fixed=0.219, pcie=1.0, gpu=1.0, expert=0.899)
    B, L, G = 8, 131072, 12181
    g = G * 64
    assert rl.optimal_cpu_share(prof, dsv, B, g, 0, B * L - g, True, corr).cpu_share > 0.1
    p = make_policy("writescope", profile=prof, model_config=dsv, experts_on_cpu=True,
                    verify_steps=0, batch_hint=B)
    assert p.step_min_gain == rl.PLACEMENT_MIN_GAIN
    assert policy().step_min_gain == rl.MIN_GAIN  # experts on the GPU


    class Measured(RateFeedback):  # the factors (the fitted fixed cost included) held
        corrections = property(lambda self: corr)

    p.feedback = Measured()
    cache, masks = prefill_then_decode(p, B, L, G, observe=True)
    assert all(Region.C not in cache.seqs[sid] for sid in range(B))  # placement: T only
    assert not any(any(m) for m in masks.values())  # and the step reads no T in place


def prefill_then_decode(p, batch, length, g_blocks, observe):
    """``batch`` prompts of ``length`` tokens admitted, then prefilled one after another into a
    MiniCache whose G holds ``g_blocks``; returns the cache and the first decode step's masks."""
    cache = MiniCache(p, {Region.G: g_blocks, Region.T: 20_000, Region.C: 20_000})
    for sid in range(batch):
        cache.seqs[sid], cache.tokens[sid] = [], 0
        p.admit(sid, length)
    for sid in range(batch):
        cache.step({sid: length}, observe=observe)
    return cache, cache.step({sid: 1 for sid in range(batch)}, observe=observe)


def test_the_placement_margin_comes_from_the_environment(monkeypatch):
    """WRITESCOPE_PLACEMENT_CPU_MARGIN replaces PLACEMENT_CPU_MARGIN (for A/B runs); a bad
    value is a clear error when the policy is made."""
    from writescope.planner import placement as wp
    assert policy()._placement_corrections().cpu == pytest.approx(wp.PLACEMENT_CPU_MARGIN)
    monkeypatch.setenv("WRITESCOPE_PLACEMENT_CPU_MARGIN", "1.2")
    assert policy()._placement_corrections().cpu == pytest.approx(1.2)
    for bad in ("0", "-1", "lots", "nan"):
        monkeypatch.setenv("WRITESCOPE_PLACEMENT_CPU_MARGIN", bad)
        with pytest.raises(ValueError, match="WRITESCOPE_PLACEMENT_CPU_MARGIN"):
            policy()


def test_a_held_share_keeps_each_sequences_cpu_t_blocks_through_small_moves(monkeypatch):
    """WRITESCOPE_SHARE_HOLD: a sequence keeps the last step's count of T blocks read in place
    while the plan's new count is within the hold (a fraction of its private T blocks, at least
    one block), so the streamed T batch -- and the staging ring's plan -- stays the same; a
    larger move is taken whole; a released sequence starts afresh. Off (0) by default; a bad
    value is a clear error."""
    regs = tuple([Region.G] * 4 + [Region.T] * 400)
    seq = SeqKV(0, 64 * 404 + 3, regs)

    def counts(p, fractions):
        out = []
        for f in fractions:
            monkeypatch.setattr(p, "_current_plan", lambda sid, f=f: {"t_fraction_to_cpu": f})
            out.append(p.assign(seq))
        return out

    moves = [0.30, 0.305, 0.31, 0.32, 0.3225, 0.0, 0.001]
    assert counts(policy(), moves) == [120, 122, 124, 128, 129, 0, 0]  # default: no hold
    monkeypatch.setenv("WRITESCOPE_SHARE_HOLD", "0.01")  # 4 of 400 blocks
    p = policy()
    assert counts(p, moves) == [120, 120, 120, 128, 128, 0, 0]
    assert p.stats()["planner.held_assigns"] == 3
    p.release(0)
    assert counts(p, [0.305]) == [122]  # (no count to keep)
    monkeypatch.setenv("WRITESCOPE_SHARE_HOLD", "0.0001")  # under a block: one block
    assert counts(policy(), [0.30, 0.3025, 0.305]) == [120, 120, 122]
    for bad in ("-0.1", "lots", "inf"):
        monkeypatch.setenv("WRITESCOPE_SHARE_HOLD", bad)
        with pytest.raises(ValueError, match="WRITESCOPE_SHARE_HOLD"):
            policy()


def test_placement_plans_with_the_gpu_kernel_not_a_slower_measured_factor():
    """The GPU side's factor is timed with device events around its launches (host gaps, cold
    steps): above 1 it would let CPU attention hide under GPU time that is not there. Placement
    takes it at most 1; the step plan keeps it; a faster measured GPU is kept."""
    p = policy()
    p.feedback.factors["gpu"] = 2.81
    assert p._placement_corrections().gpu == 1.0
    assert p.feedback.corrections.gpu == 2.81
    p.feedback.factors["gpu"] = 0.7
    assert p._placement_corrections().gpu == 0.7


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rc=st.floats(5, 100), rp=st.floats(5, 100), cap=st.floats(10, 120),
       rexp=st.floats(20, 150), c=st.integers(0, 10 ** 6), t=st.integers(1, 10 ** 6),
       res=st.integers(0, 10 ** 5), b=st.integers(1, 64), free=st.booleans())
@example(rc=45.0, rp=53.0, cap=40.0, rexp=100.0, c=0, t=600_000, res=0, b=8, free=True)
def test_optimum_matches_brute_force_with_cpu_experts_beside_the_link(rc, rp, cap, rexp, c, t,
                                                                      res, b, free):
    """The CPU experts read at the concurrent cap while the link streams: their term bends
    where the link outlasts them, and the optimiser must visit that bend too."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    prof = h200_like(cpu_attn={"gqa-g8-d128": {"C": rc * GB, "T": 0.8 * rc * GB}},
                     cpu_expert={"h2048-i768": rexp * GB}, h2d_pinned_Bps=rp * GB,
                     concurrent_h2d_Bps=0.9 * rp * GB, concurrent_cpu_read_Bps=cap * GB)
    plan = rl.optimal_cpu_share(prof, cfg, b, res, c, t, True, free=free, min_gain=0.0)
    grid = brute_force(prof, cfg, b, res, c, t, True, free)
    assert plan.prediction.step_s <= grid * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(rc=st.floats(5, 120), rp=st.floats(5, 60), rt=st.floats(1e-5, 1e-3), b=st.integers(1, 32),
       g=st.integers(0, 2 ** 20), exp=st.booleans(), rexp=st.floats(10, 200))
@example(rc=54, rp=60, rt=1e-5, b=2, g=125530, exp=False, rexp=100)  # its share dips 1.4e-5
@example(rc=21.0, rp=9.0, rt=5.008e-4, b=5, g=0, exp=True, rexp=186.0)  # leaves the all-CPU end
def test_cpu_tokens_non_decreasing_random_profiles(rc, rp, rt, b, g, exp, rexp):
    """On any profile, the planned CPU side never attends fewer tokens as sequences grow, but
    where it leaves the all-CPU end with the experts on the CPU (below). (Its
    *share* of the spill may dip: with a small first spill the CPU can take most of it, then a
    slightly smaller share of a larger one -- e.g. rc=54, rp=60, rt=1e-5, b=2, g=125530 dips by
    1.4e-5 while the CPU's tokens grow.)"""
    # (a round trip always costs something: with none at all, the model would shave GPU
    # attention by moving a share of a few 1e-3 to the CPU -- real but meaningless)
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    prof = h200_like(cpu_attn={"gqa-g8-d128": {"C": rc * GB, "T": rc * GB}},
                     h2d_pinned_Bps=rp * GB, concurrent_h2d_Bps=rp * GB, cpu_roundtrip_s=rt,
                     cpu_expert={"h2048-i768": rexp * GB})
    cpu_tokens, shares = [], []
    for n in LENGTHS:
        spilled = b * n - sum(rl.resident_tokens([n] * b, g))
        x = rl.plan_for_lengths(prof, cfg, [n] * b, g, exp, "writescope").cpu_share
        cpu_tokens.append(x * spilled)
        shares.append(x)
    # one exception: leaving the all-CPU end. There nothing streams, so CPU experts faster than
    # the concurrent read (77 GB/s here) run at their own rate; once a longer spill makes
    # streaming pay, they slow beside the link and the CPU may take fewer tokens (rc=21, rp=9,
    # b=5, g=0, experts at 186 GB/s: all 20480 spilled tokens at 4K, 11809 of 40960 at 8K).
    # Blocks already in C stay there and are attended by the CPU; new ones go to T.
    for i, (x, y) in enumerate(zip(cpu_tokens, cpu_tokens[1:])):
        if y < x * (1 - 1e-9):
            assert exp and rexp > 77 and shares[i] == 1.0, (i, shares, cpu_tokens)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 8), spilled=st.booleans())
def test_a_prediction_is_the_sum_of_its_layers(seed, b, spilled):
    """predict_step times each kind of layer once and sums kinds times their counts: the same
    as summing its per-layer times (``layers``), whatever layers' experts are on the CPU."""
    rng = random.Random(seed)
    cfg = tiny_cfg(layers=6, dense_first=True)
    prof = h200_like()
    flags = tuple(rng.random() < 0.5 for _ in range(cfg.num_layers))
    load = rl.StepLoad(b, rng.uniform(1e3, 1e6), *(rng.uniform(0, 1e6) * spilled for _ in range(2)),
                       rng.uniform(0, 1e5) * spilled)
    p = rl.predict_step(prof, cfg, load, flags)
    head_s = cfg.vocab_size * cfg.hidden_size * rl.WEIGHT_BYTES / prof.weight_read_Bps
    assert len(p.layers) == cfg.num_layers
    assert p.step_s == pytest.approx(sum(lt.total_s for lt in p.layers) + p.layers[0].pcie_s
                                     + head_s, rel=1e-12)
    assert p.dense_s == pytest.approx(sum(lt.dense_s for lt in p.layers) + head_s, rel=1e-12)
    cpu = rl.cpu_expert_layers(cfg, flags)
    assert p.cpu_expert_s == pytest.approx(sum(p.layers[i].expert_s for i in cpu), rel=1e-12,
                                           abs=1e-18)
    for i, lt in enumerate(p.layers):  # each layer timed as its own kind
        assert lt == rl.layer_time(prof, cfg, i, load, cpu)


def test_bound_charges_the_measured_expert_bytes():
    """Given the experts' bytes a step really read, the bound charges those instead of uniform
    routing's: the same figure gives the same bound, fewer bytes a lower one (Mixtral 2 x 128K
    measured a step below its uniform-routing bound: 2026-12-01b-h200 call 4)."""
    cfg = ModelConfig.from_hf("mixtral-8x7b")
    prof = h200_like()
    lens = [131072] * 2
    g = rl.gpu_kv_capacity_tokens(cfg, 32 * 2 ** 30, True)
    uniform = sum(rl.active_experts(cfg.num_experts, cfg.num_experts_per_tok, 2)
                  * rl.layer_param_counts(cfg, i)["expert"] * rl.WEIGHT_BYTES
                  for i in range(cfg.num_layers))
    base = rl.roofline_bound_s(prof, cfg, lens, g, True)
    assert rl.roofline_bound_s(prof, cfg, lens, g, True, uniform) == pytest.approx(base)
    less = rl.roofline_bound_s(prof, cfg, lens, g, True, 0.6 * uniform)
    assert less < 0.9 * base
    # with the experts on the GPU the figure does not apply
    assert rl.roofline_bound_s(prof, cfg, lens, g, False, 0.6 * uniform) == \
        rl.roofline_bound_s(prof, cfg, lens, g, False)


def test_writescope_never_predicted_slower_than_baselines():
    cfg = ModelConfig.from_hf("mixtral-8x7b")
    prof = h200_like()
    g = rl.gpu_kv_capacity_tokens(cfg, 120 * 2 ** 30, False)
    for n in LENGTHS:
        ws = rl.plan_for_lengths(prof, cfg, [n] * 8, g, False, "writescope").prediction.step_s
        bound = rl.roofline_bound_s(prof, cfg, [n] * 8, g, False)
        assert bound <= ws * (1 + 1e-9)
        for pol in ("transfer", "cpu", "static"):
            assert ws <= rl.plan_for_lengths(prof, cfg, [n] * 8, g, False, pol,
                                             static_share=0.3).prediction.step_s * (1 + 1e-9)


def test_bound_counts_cpu_experts_against_the_cpu_read():
    """With routed experts on the CPU, the bound cannot serve spilled KV at the CPU's full read
    rate as well: the experts' bytes share it (Qwen3-30B-A3B 4 x 128K under 32 GiB)."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    prof = h200_like()
    lens = [131072] * 4
    g = rl.gpu_kv_capacity_tokens(cfg, 32 * 2 ** 30, True)
    bound = rl.roofline_bound_s(prof, cfg, lens, g, True)
    spilled = sum(lens) - sum(rl.resident_tokens(lens, g))
    kv = spilled * rl.kv_bytes_per_token_layer(cfg) * cfg.num_layers
    exp = sum(rl.active_experts(cfg.num_experts, cfg.num_experts_per_tok, 4)
              * rl.layer_param_counts(cfg, i)["expert"] * rl.WEIGHT_BYTES
              for i in range(cfg.num_layers))
    both = (kv + exp) / (prof.concurrent_h2d_Bps + prof.concurrent_cpu_read_Bps)
    assert bound >= both * (1 - 1e-9)  # both reads through the two paths at their ceilings
    assert bound < both * 1.1          # ... and not much more (dense weights overlap)
    for pol in ("writescope", "transfer", "cpu", "static"):
        step = rl.plan_for_lengths(prof, cfg, lens, g, True, pol).prediction.step_s
        assert bound <= step * (1 + 1e-9), pol
    # no KV spilled: the experts alone, at the CPU's solo read rate; with the link's share on
    # (WRITESCOPE_EXPERT_LINK=auto, layers/expert_link.py), read by the CPU and by the link at
    # their concurrent ceilings -- but not in a batch past the link's token block
    exp1k = exp  # (uniform routing's bytes at batch 4 do not depend on the length)
    assert rl.roofline_bound_s(prof, cfg, [1024] * 4, g, True) >= exp1k / prof.cpu_read_Bps
    import os
    from unittest import mock
    with mock.patch.dict(os.environ, {"WRITESCOPE_EXPERT_LINK": "auto"}):
        both_paths = exp1k / (prof.concurrent_h2d_Bps + prof.concurrent_cpu_read_Bps)
        short = rl.roofline_bound_s(prof, cfg, [1024] * 4, g, True)
        assert both_paths * (1 - 1e-9) <= short < exp1k / prof.cpu_read_Bps
        big = rl.active_experts(cfg.num_experts, cfg.num_experts_per_tok, 17)
        exp17 = sum(big * rl.layer_param_counts(cfg, i)["expert"] * rl.WEIGHT_BYTES
                    for i in range(cfg.num_layers))
        assert rl.roofline_bound_s(prof, cfg, [1024] * 17, g, True) >= exp17 / prof.cpu_read_Bps


# ----------------------------------------------------------------------------- placement
def policy(cfg=None, prof=None, **kw) -> WriteScopePolicy:
    kw.setdefault("verify_steps", 0)  # placement tests: steer from the first block
    return make_policy("writescope", profile=prof or h200_like(), model_config=cfg or tiny_cfg(),
                       experts_on_cpu=False, cpu_share=0.7, **kw)


def test_registered_and_stats_keys():
    p = policy()
    assert isinstance(p, WriteScopePolicy) and p.name == "writescope"
    s = p.stats()
    for k in ("planner.cpu_share", "planner.predicted_step_s", "planner.measured_step_s",
              "planner.cpu_rate_correction"):
        assert k in s
    with pytest.raises(ValueError):
        make_policy("writescope", profile=h200_like())  # no model config


@pytest.mark.parametrize("n_c,n_sp,target,want", [
    (0, 0, 0.0, Region.T), (0, 0, 0.6, Region.C), (0, 0, 0.5, Region.T), (1, 3, 0.5, Region.C),
    (2, 3, 0.5, Region.T), (9, 9, 1.0, Region.C), (3, 10, 0.3, Region.T),
])
def test_choose_spilled_region(n_c, n_sp, target, want):
    assert choose_spilled_region(n_c, n_sp, target) is want


@settings(max_examples=100, deadline=None)
@given(free_g=st.integers(0, 20), free_t=st.integers(0, 20), free_c=st.integers(0, 20),
       k=st.integers(1, 40), regions=st.lists(st.sampled_from([Region.G, Region.T, Region.C]), max_size=30),
       length=st.integers(64, 10 ** 6))
def test_placement_never_exceeds_budget(free_g, free_t, free_c, k, regions, length):
    p = policy()
    cap = CacheCapacity({Region.G: free_g, Region.T: free_t, Region.C: free_c}, 64, 64 * KVB * 4)
    seq = SeqKV(1, max(length, 64 * (len(regions) + k)), tuple(regions))
    if k > free_g + free_t + free_c:
        with pytest.raises(MemoryError):
            p.place(seq, k, cap)
        return
    out = p.place(seq, k, cap)
    assert len(out) == k
    for r in (Region.G, Region.T, Region.C):
        assert sum(x is r for x in out) <= cap.free[r]
    assert sum(x is Region.G for x in out) == min(k, free_g)  # G first while it has room
    assert out[:min(k, free_g)] == [Region.G] * min(k, free_g)


class MiniCache:
    """The cache's side of the policy protocol, as data only: capacities, sealed regions,
    one block placed whenever a sequence fills one, one assign per sequence per step."""

    def __init__(self, pol, free, bs=64):
        self.pol, self.free, self.bs = pol, dict(free), bs
        self.seqs: dict[int, list[Region]] = {}
        self.tokens: dict[int, int] = {}

    def add(self, sid, prompt_tokens):
        self.seqs[sid], self.tokens[sid] = [], 0
        self.step({sid: prompt_tokens}, observe=False)

    def step(self, grow: dict[int, int], observe=True, timing=None):
        for sid, n in grow.items():
            end = self.tokens[sid] + n
            k = end // self.bs - len(self.seqs[sid])
            if k > 0:
                cap = CacheCapacity(dict(self.free), self.bs, self.bs * KVB * 4)
                out = self.pol.place(SeqKV(sid, end, tuple(self.seqs[sid])), k, cap)
                for r in out:
                    assert self.free[r] > 0
                    self.free[r] -= 1
                self.seqs[sid].extend(out)
        masks = {sid: cpu_mask(tuple(self.seqs[sid]),
                               self.pol.assign(SeqKV(sid, self.tokens[sid], tuple(self.seqs[sid]))))
                 for sid in grow}
        for sid, n in grow.items():
            self.tokens[sid] += n
        if observe:
            self.pol.observe(timing or {"batch_lengths": [self.tokens[s] for s in grow]})
        return masks


def c_fraction(regs):
    spilled = [r for r in regs if r is not Region.G]
    return sum(r is Region.C for r in spilled) / len(spilled), len(spilled)


def test_until_the_cpu_rate_is_measured_c_gets_only_what_pays_at_half_its_rate():
    """verify_steps=2: until two decode steps have measured the CPU path, placement takes its
    target with a CPU UNVERIFIED_CPU_FACTOR (2) times slower than the profile -- C blocks are the
    CPU's for good, T blocks either side's -- and the CPU reads T blocks in place for the rest;
    once measured (here: at the profile's rate), new blocks follow the corrected target."""
    from writescope.planner import placement as wp
    assert wp.UNVERIFIED_CPU_FACTOR == 2.0
    cfg = tiny_cfg()
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=1e-6)
    p = policy(cfg, prof, verify_steps=2)
    cache = MiniCache(p, {Region.G: 10, Region.T: 10_000, Region.C: 10_000})
    cache.add(0, 64 * 50)
    assert not p.stats()["planner.cpu_verified"]
    slow = rl.Corrections(cpu=2.0, cpu_fixed=2.0)
    half = rl.target_share(prof, cfg, 1, 10 * 64, 40 * 64, False, slow).cpu_share
    full = rl.target_share(prof, cfg, 1, 10 * 64, 40 * 64, False).cpu_share
    assert 0.1 < half < full - 0.1
    frac, n = c_fraction(cache.seqs[0])
    assert abs(frac - half) <= 1 / n + 1e-9, (frac, half)
    cache.step({0: 1})
    mask = cache.step({0: 1})[0]
    # the step plan (not gated) gives the CPU more than the C blocks: some T blocks in place
    assert sum(mask) > cache.seqs[0].count(Region.C)
    cpu_bytes = 20 * 64 * KVB * 4
    model_s = cpu_bytes / (5 * GB) + 4 * 1e-6
    for k in range(3):  # decode steps in which the CPU path was timed
        n_tok = cache.tokens[0]
        # the first of them is far (> 3x) off the model: a start-up sample, which neither
        # corrects the rate nor counts toward verifying it; then the profile's rate
        cpu_s = 10 * model_s if k == 0 else model_s
        cache.step({0: 1}, timing={"batch_lengths": [n_tok + 1], "cpu_s": cpu_s, "gpu_s": 0.001,
                                   "cpu_bytes": cpu_bytes, "gpu_bytes": 64 * KVB * 4})
        assert p.stats()["planner.cpu_verified"] == (k == 2)
    assert p.stats()["planner.cpu_rate_correction"] == pytest.approx(1.0, abs=0.1)
    before = len(cache.seqs[0])
    for _ in range(64 * 40):
        cache.step({0: 1})
    new = cache.seqs[0][before:]
    assert sum(r is Region.C for r in new) / len(new) > half + 0.05


def test_write_scope_follows_target_and_never_moves_blocks():
    """Each sealed block goes the way that brings the batch's C fraction of its spill toward the
    placement target; blocks already placed keep their region; C blocks are always the CPU's."""
    cfg = tiny_cfg()
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=1e-6)
    p = policy(cfg, prof)
    cache = MiniCache(p, {Region.G: 10, Region.T: 10_000, Region.C: 10_000})
    cache.add(0, 64 * 50)
    frac, n = c_fraction(cache.seqs[0])  # prefill blocks split at the target of the moment
    assert abs(frac - p.last_placement_target) <= 1 / n
    cache.add(1, 64 * 50)
    assert cache.free[Region.G] == 0  # G filled first
    snapshot = {s: list(r) for s, r in cache.seqs.items()}
    checked = 0
    for _ in range(64 * 12):
        before = c_fraction(snapshot[0] + snapshot[1])
        masks = cache.step({0: 1, 1: 1})
        target = p.last_placement_target
        sealed = []
        for sid, regs in cache.seqs.items():
            assert regs[:len(snapshot[sid])] == snapshot[sid]  # old blocks keep their region
            sealed += regs[len(snapshot[sid]):]
            snapshot[sid] = list(regs)
            m = masks[sid]
            assert all(m[i] for i, r in enumerate(regs[:len(m)]) if r is Region.C)
            assert not any(m[i] for i, r in enumerate(regs[:len(m)]) if r is Region.G)
        n_c, n_sp = round(before[0] * before[1]), before[1]
        for r in sealed:  # in placement order: C only below the target, T only not clearly below
            if r is Region.C:
                assert n_c / n_sp < target
            else:
                assert n_c / n_sp >= target - 1 / (n_sp + 1)
            n_c, n_sp = n_c + (r is Region.C), n_sp + 1
        checked += len(sealed)
    assert checked == 24
    target = p.last_placement_target
    assert 0.15 < target < 0.5
    frac, n = c_fraction(cache.seqs[0] + cache.seqs[1])
    assert abs(frac - target) <= 2 / n


def test_a_one_chunk_prefill_places_its_spill_at_the_target():
    """A fresh sequence's whole prompt arrives as one chunk that fills G and spills: the chunk's
    spilled blocks are split at the target share of the batch *with* that spill (the step plan
    alone counts the unsealed chunk as resident, sees no spill and would put all of it in T)."""
    cfg = tiny_cfg()
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=1e-6)
    p = policy(cfg, prof)
    cap = CacheCapacity({Region.G: 4, Region.T: 1000, Region.C: 1000}, 64, 64 * KVB * 4)
    out = p.place(SeqKV(0, 64 * 404 + 3, ()), 404, cap)
    assert out[:4] == [Region.G] * 4
    want = rl.target_share(prof, cfg, 1, 4 * 64 + 3, 400 * 64, False,
                           p._placement_corrections()).cpu_share
    assert want > 0.2
    assert sum(r is Region.C for r in out) == pytest.approx(want * 400, abs=1)


def test_assign_reads_t_in_place_when_it_helps():
    """All spilled KV in T (say written while the target was 0): the CPU takes the planned
    share by reading T blocks in place; the streamed rest is one run at the end."""
    cfg = tiny_cfg()
    prof = simple_profile(rc=5 * GB, rp=10 * GB, rt=1e-6)
    p = policy(cfg, prof)
    regs = tuple([Region.G] * 4 + [Region.T] * 400)
    seqs = [SeqKV(i, 64 * 404 + 3, regs) for i in range(4)]
    for s in seqs:
        p.assign(s)
    p.observe({"batch_lengths": [s.num_tokens for s in seqs]})
    masks = [cpu_mask(regs, p.assign(s)) for s in seqs]
    share = p.stats()["planner.cpu_share"]
    want = rl.optimal_cpu_share(prof, cfg, 4, 4 * (4 * 64 + 3), 0, 4 * 400 * 64, False).cpu_share
    assert share == pytest.approx(want) and share > 0.2
    for m in masks:
        cpu_t = [i for i, (r, c) in enumerate(zip(regs, m)) if c]
        assert len(cpu_t) == round(share * 400)
        assert cpu_t == list(range(4, 4 + len(cpu_t)))  # the oldest T blocks


def test_each_step_form_is_planned_for_itself_within_the_memo_tolerance():
    """The step-form chooser alternates one batch and two sub-batches while it probes: a step
    of the other form is planned with that form's model, not with the shares the last step's
    form solved for (the memo of a state within MEMO_TOLERANCE), and so is placement's target."""
    cfg = tiny_cfg()
    prof = h200_like()
    regs = tuple([Region.G] * 4 + [Region.T] * 400)
    seqs = [SeqKV(i, 64 * 404 + 3, regs) for i in range(4)]
    want = {pl: rl.optimal_cpu_share(prof, cfg, 4, 4 * (4 * 64 + 3), 0, 4 * 400 * 64, False,
                                     pipelined=pl).cpu_share for pl in (False, True)}
    assert abs(want[True] - want[False]) > 0.01  # the two forms' solutions differ here
    p = policy(cfg, prof)
    for pl in (False, True, False):
        p.pipelined = pl
        for s in seqs:
            p.assign(s)
        assert p.stats()["planner.cpu_share"] == pytest.approx(want[pl]), pl
        p.observe({"batch_lengths": [s.num_tokens for s in seqs]})
    # placement's target too: the same batch placed under each form
    cap = CacheCapacity({Region.G: 0, Region.T: 1000, Region.C: 1000}, 64, 1024)
    targets = {}
    for pl in (False, True, False):
        p.pipelined = pl
        p.place(SeqKV(0, 64 * 405, regs), 1, cap)
        targets.setdefault(pl, []).append(p.last_placement_target)
    assert targets[False][0] == targets[False][1] != targets[True][0]


# ----------------------------------------------------------------------------- feedback
def test_feedback_ema():
    fb = RateFeedback(alpha=0.5)
    fb.update({"cpu": 2.0, "pcie": None, "gpu": 0.0}, {"cpu": 1.0, "pcie": 1.0, "gpu": 1.0})
    assert fb.corrections.cpu == pytest.approx(1.5)
    assert fb.corrections.pcie == 1.0 and fb.corrections.gpu == 1.0  # not measured
    fb.update({"cpu": 1000.0}, {"cpu": 1.0})  # clamped
    assert fb.corrections.cpu == pytest.approx(0.5 * 1.5 + 0.5 * 16)
    with pytest.raises(ValueError):
        RateFeedback(alpha=1.5)


def test_a_factor_learnt_on_small_steps_is_taken_toward_the_profile_on_larger_ones():
    """A factor learnt at one scale (batch KV tokens) stands for a fixed excess over the profile:
    at a larger scale it is 1 + (f - 1) * learnt / scale. A larger sample rescales the factor
    before it is blended in; smaller steps move the scale down, never the factor up; the routed
    experts' factor and the CPU's fixed part are not scaled."""
    fb = RateFeedback(alpha=0.5)
    fb.update({"gpu": 2.9, "cpu": 0.64, "expert": 1.5}, {"gpu": 1.0, "cpu": 1.0, "expert": 1.0},
              scale=32_768)
    assert fb.corrections.gpu == pytest.approx(1.95)  # as learnt (blended from 1 with alpha)
    c = fb.corrections_at(32 * 32_768)  # a batch 32 times the size
    assert c.gpu == pytest.approx(1 + 0.95 / 32) and c.cpu == pytest.approx(1 - 0.18 / 32)
    assert c.expert == pytest.approx(1.25) and c.cpu_fixed == pytest.approx(0.82)
    assert fb.corrections_at(16_384) == fb.corrections  # smaller: as learnt
    assert fb.corrections_at(None) == fb.corrections
    # a sample at the larger scale: the old factor is taken there first, then blended
    fb.update({"gpu": 1.3}, {"gpu": 1.0}, scale=32 * 32_768)
    assert fb.corrections.gpu == pytest.approx(0.5 * (1 + 0.95 / 32) + 0.5 * 1.3)
    assert fb.scale["gpu"] == 32 * 32_768 and fb.scale["cpu"] == 32_768  # cpu: not measured
    fb.update({"gpu": 1.3}, {"gpu": 1.0}, scale=32_768)  # smaller again
    assert fb.scale["gpu"] == pytest.approx(0.5 * 32 * 32_768 + 0.5 * 32_768)


def test_a_warm_ups_factors_do_not_put_a_1m_batchs_t_blocks_on_a_busy_cpu():
    """DeepSeek-V2-Lite 8 x 128K with the experts on the CPU, every spilled block in T, after
    steps of 8 x 4K tokens that measured a GPU factor of 2.9 (launch gaps) and a CPU one of 1.3:
    taken as they stood, such factors had the step plan read 8-11% of T in place for five
    decode steps, each ~10% slower than transfer's (2026-12-01f-h200 call 2). At the batch's
    scale they are ~1."""
    prof = HardwareProfile.load(H200_PROFILE)
    dsv = ModelConfig.from_hf("deepseek-v2-lite")
    B, L, G = 8, 131072, 12181
    p = make_policy("writescope", profile=prof, model_config=dsv, experts_on_cpu=True,
                    verify_steps=0, batch_hint=B)
    for _ in range(8):  # the warm-up's decode steps
        p.feedback.update({"gpu": 2.9, "cpu": 1.3, "pcie": 1.0, "expert": 1.0},
                          {"gpu": 1.0, "cpu": 1.0, "pcie": 1.0, "expert": 1.0}, scale=8 * 4096)
    g = G * 64
    assert rl.optimal_cpu_share(prof, dsv, B, g, 0, B * L - g, True, p.feedback.corrections,
                                min_gain=p.step_min_gain).cpu_share > 0.05  # as they stood
    cache, masks = prefill_then_decode(p, B, L, G, observe=False)
    assert all(Region.C not in cache.seqs[sid] for sid in range(B))  # placement: T only
    assert not any(any(m) for m in masks.values())  # and the first decode step reads no T


def simulate(alpha, steps, slow_from, slow_until, noise=0.03, seed=0, truth_corr=None,
             extra_s=0.0):
    """A closed loop: the policy plans, a 'true machine' (the roofline with the CPU attention
    `slow` times slower from `slow_from` to `slow_until`, plus noise) measures, the policy observes.
    Returns per step (planned share, optimal share under the true rates for the same blocks)."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    prof = h200_like()
    rng = random.Random(seed)
    pol = make_policy("writescope", profile=prof, model_config=cfg, experts_on_cpu=False,
                      feedback_alpha=alpha, verify_steps=0)
    bs, b = 64, 8
    # 64k tokens each; the G budget holds 200 blocks per sequence; the spill was written to T
    # (e.g. while sequences were short and the target share 0)
    seqs = {i: [Region.G] * 200 + [Region.T] * 824 for i in range(b)}
    tokens = {i: 1024 * bs + 5 for i in range(b)}
    free = {Region.G: 0, Region.T: 10 ** 6, Region.C: 10 ** 6}
    tb = cfg.kv_bytes_per_token()
    out = []
    for step in range(steps):
        slow = 2.0 if slow_from <= step < slow_until else 1.0
        true_corr = truth_corr if truth_corr is not None else rl.Corrections(cpu=slow)
        for i in range(b):
            if (tokens[i] + 1) % bs == 0:
                cap = CacheCapacity(dict(free), bs, bs * tb)
                r = pol.place(SeqKV(i, tokens[i] + 1, tuple(seqs[i])), 1, cap)
                free[r[0]] -= 1
                seqs[i].extend(r)
        c = t = cpu_c = cpu_t = 0
        res = 0
        for i in range(b):
            m = cpu_mask(tuple(seqs[i]), pol.assign(SeqKV(i, tokens[i], tuple(seqs[i]))))
            for r, on_cpu in zip(seqs[i], m):
                if r is Region.C:
                    cpu_c += bs
                    c += bs
                elif r is Region.T:
                    t += bs
                    cpu_t += bs * on_cpu
                else:
                    res += bs
            res += tokens[i] - bs * len(seqs[i])
        planned = pol.stats()["planner.cpu_share"]
        best = rl.optimal_cpu_share(prof, cfg, b, res, c, t, False, true_corr).cpu_share
        out.append((planned, best))
        load = rl.StepLoad(b, res, t - cpu_t, cpu_c, cpu_t)
        truth = rl.predict_step(prof, cfg, load, False, true_corr)
        jitter = lambda v: v * (1 + rng.uniform(-noise, noise))  # noqa: E731
        for i in range(b):
            tokens[i] += 1
        pol.observe({"cpu_s": jitter(truth.cpu_attn_s), "gpu_s": jitter(truth.gpu_attn_s),
                     "pcie_s": jitter(truth.pcie_s), "step_s": jitter(truth.step_s + extra_s),
                     "cpu_bytes": load.cpu_tokens * tb,
                     "gpu_bytes": (load.resident_tokens + load.streamed_tokens) * tb,
                     "t_bytes": load.streamed_tokens * tb, "batch_lengths": list(tokens.values())})
    return out, pol


def test_feedback_follows_cpu_slowdown_and_recovery():
    k, m, n = 10, 40, 70
    out, pol = simulate(alpha=0.3, steps=n, slow_from=k, slow_until=m)
    fast_opt, slow_opt = out[k - 1][1], out[k + 1][1]
    assert slow_opt < 0.85 * fast_opt  # the slowdown matters: the test is not vacuous
    for step in list(range(k + 10, m)) + list(range(m + 10, n)) + list(range(0, k)):
        planned, best = out[step]
        assert abs(planned - best) <= 0.1 * best, (step, planned, best)
    s = pol.stats()
    assert s["planner.cpu_rate_correction"] == pytest.approx(1.0, abs=0.1)
    assert abs(s["planner.prediction_error"]) < 0.1
    assert math.isfinite(s["planner.measured_step_s"]) and s["planner.predicted_step_s"] > 0


def test_feedback_fits_fixed_and_per_byte_cpu_costs_apart():
    """measured = 2.5 x the profile's per-layer round trip + 1.0 x its per-byte time: one factor
    fits only the share it was measured at; the two-part fit predicts other shares too."""
    fb = RateFeedback(alpha=0.3)
    rng = random.Random(0)
    for i in range(60):
        f, v = 0.019, 0.005 + 0.05 * rng.random()  # 27 layers x 0.7 ms; varying bytes
        m = (2.5 * f + v) * (1 + rng.uniform(-0.02, 0.02))
        fb.update({"cpu": m}, {"cpu": f + v}, cpu_split=(f, v))
    c = fb.corrections
    assert c.cpu_fixed == pytest.approx(2.5, rel=0.15) and c.cpu == pytest.approx(1.0, rel=0.15)
    for v in (0.002, 0.2):  # far from the fitted points, both ways
        truth, pred = 2.5 * 0.019 + v, c.cpu_fixed * 0.019 + c.cpu * v
        single = fb.factors["cpu"] * (0.019 + v)
        assert abs(pred / truth - 1) < 0.1
        assert abs(single / truth - 1) > 0.2  # what one factor would have predicted
    # collinear samples (one share only) leave the shape at its prior
    fb2 = RateFeedback(alpha=0.3)
    for _ in range(30):
        fb2.update({"cpu": 2.0 * 0.03}, {"cpu": 0.03}, cpu_split=(0.01, 0.02))
    assert fb2.corrections.cpu_fixed is None and fb2.corrections.cpu == pytest.approx(2.0, rel=1e-3)


def test_closed_loop_with_an_expensive_cpu_round_trip(monkeypatch):
    """The true CPU side costs 2.3x the profiled 0.7 ms round trip per layer, bytes as profiled:
    the two-part fit takes over inside the loop and the planned share stays at the optimum
    under that truth."""
    import test_planner as tp
    orig = tp.h200_like
    monkeypatch.setattr(tp, "h200_like", lambda **o: orig(cpu_roundtrip_s=0.7e-3, **o))
    truth = rl.Corrections(cpu=1.0, cpu_fixed=2.3)
    out, pol = simulate(alpha=0.3, steps=80, slow_from=10**9, slow_until=10**9, truth_corr=truth)
    for planned, best in out[20:]:
        assert abs(planned - best) <= 0.05 * best, (planned, best)
    assert pol.stats()["planner.cpu_fixed_correction"] > 1.3


def test_step_overhead_is_learnt_out_of_sample_and_leaves_the_share_alone():
    """Steps take 50 ms more than the per-path model explains (Python, launches): the planner
    learns the overhead, predicts each step before it runs within 5%, and plans the same shares."""
    base, _ = simulate(alpha=0.3, steps=40, slow_from=10**9, slow_until=10**9)
    out, pol = simulate(alpha=0.3, steps=40, slow_from=10**9, slow_until=10**9, extra_s=0.05)
    s = pol.stats()
    assert s["planner.step_overhead_s"] == pytest.approx(0.05, rel=0.2)
    assert abs(s["planner.prediction_error"]) < 0.05
    assert [p for p, _ in out] == pytest.approx([p for p, _ in base], rel=1e-6)


def test_one_far_off_step_does_not_set_the_overhead():
    """A step 20x its prediction (the first after a synthetic prefill, one that compiled a
    kernel) is left out of the learnt overhead, and so is every step a new step size ran
    eagerly; the same far-off figure twice in a row is taken."""
    from writescope.planner import placement as pl
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    pol = make_policy("writescope", profile=h200_like(), model_config=cfg, verify_steps=0)
    n, tb = 4096, cfg.kv_bytes_per_token()
    load = rl.StepLoad(2, 2 * n, 0, 0, 0)
    model_s = rl.predict_step(pol.profile, cfg, load, False).step_s

    def step(seconds):
        nonlocal n
        for i in range(2):
            pol.assign(SeqKV(i, n, (Region.G,) * (n // 64)))
        n += 1
        pol.observe({"batch_lengths": [n] * 2, "step_s": seconds, "cpu_bytes": 0,
                     "gpu_bytes": 2 * n * tb, "t_bytes": 0})
    step(20 * model_s)
    assert pol.step_overhead_s == 0.0
    for _ in range(3):  # a new step size's eager runs (kernels compiled), however many
        for i in range(2):
            pol.assign(SeqKV(i, n, (Region.G,) * (n // 64)))
        n += 1
        pol.observe({"batch_lengths": [n] * 2, "step_s": 50 * model_s, "new_shape": True,
                     "cpu_bytes": 0, "gpu_bytes": 2 * n * tb, "t_bytes": 0})
    assert pol.step_overhead_s == 0.0
    for _ in range(5):
        step(model_s + 0.001)
    assert pol.step_overhead_s == pytest.approx(0.001 * (1 - (1 - pol.feedback.alpha) ** 5),
                                                rel=0.05)
    before = pol.step_overhead_s
    step(pl.OVERHEAD_OUTLIER_RATIO * 2 * model_s)  # first: left out
    assert pol.step_overhead_s == before
    step(pl.OVERHEAD_OUTLIER_RATIO * 2 * model_s)  # again: it is the steps' time now
    assert pol.step_overhead_s > before


def test_an_overlapped_step_is_predicted_by_the_model_alone():
    """A decode step closed before its device work ran (``untimed``) learns nothing, and its
    prediction -- made when stats() asks -- is the model's for its load, not a stale earlier
    step's (a 4 x 32K row reported 123 ms predictions for its 5 ms steps, 2026-12-04b)."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    pol = make_policy("writescope", profile=h200_like(), model_config=cfg, verify_steps=0)
    n, tb = 32768, cfg.kv_bytes_per_token()
    regs = (Region.G,) * (n // 64)
    for i in range(2):
        pol.assign(SeqKV(i, n, regs))
    pol.observe({"batch_lengths": [n + 1] * 2, "step_s": 0.5, "cpu_bytes": 0,
                 "gpu_bytes": 2 * n * tb, "t_bytes": 0})  # a slow timed step first
    n += 1
    overhead, factors = pol.step_overhead_s, dict(pol.feedback.factors)
    for i in range(2):
        pol.assign(SeqKV(i, n, regs))
    pol.observe({"batch_lengths": [n + 1] * 2, "step_s": 0.001, "untimed": True,
                 "cpu_bytes": 0, "gpu_bytes": 2 * n * tb, "t_bytes": 0})
    want = rl.predict_step(pol.profile, cfg, rl.StepLoad(2, 2 * n, 0, 0, 0), False).step_s
    s = pol.stats()
    assert s["planner.predicted_step_s"] == pytest.approx(want, rel=1e-9)
    assert math.isnan(s["planner.measured_step_s"])
    assert pol.step_overhead_s == overhead and pol.feedback.factors == factors
    assert pol.stats()["planner.predicted_step_s"] == pytest.approx(want, rel=1e-9)  # kept


def test_a_step_all_in_hbm_is_charged_graph_launches(monkeypatch):
    """With every KV token on the GPU the engine replays CUDA graphs, CPU experts' calls
    included (``cpu_experts_graph``, unless ``WRITESCOPE_CPU_EXPERTS_GRAPHED=0``): the model
    charges the profile's graph kernel cost, else (spilled KV, CPU experts' calls not graphed,
    or an older profile without the figure) eager launches."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    eager = h200_like()
    graph = h200_like(graph_launch_s=1.5e-6)
    res = rl.StepLoad(2, 65536, 0, 0, 0)
    spilled = rl.StepLoad(2, 32768, 32768, 0, 0)
    n = cfg.num_layers * rl.KERNELS_PER_LAYER
    monkeypatch.delenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", raising=False)
    for on_cpu in (False, True, [i == 3 for i in range(cfg.num_layers)]):
        d = (rl.predict_step(eager, cfg, res, on_cpu).step_s
             - rl.predict_step(graph, cfg, res, on_cpu).step_s)
        assert d == pytest.approx(n * (eager.launch_s - 1.5e-6), rel=1e-6)
    for load, on_cpu, setting in ((spilled, False, "auto"), (res, True, "0"), (res, True, "bad")):
        monkeypatch.setenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", setting)
        assert rl.predict_step(graph, cfg, load, on_cpu).step_s == \
            pytest.approx(rl.predict_step(eager, cfg, load, on_cpu).step_s, rel=1e-12)
    with pytest.raises(ValueError, match="graph_launch_s"):
        h200_like(graph_launch_s=-1.0).validate()


def test_without_feedback_the_share_does_not_adapt():
    k, m = 5, 40
    out, _ = simulate(alpha=0.0, steps=30, slow_from=k, slow_until=m)
    assert all(abs(p - b) > 0.1 * b for p, b in out[k + 10:30])


def run_fixed_placement(pol, steps: int, cpu_slowdown=lambda step: 1.0) -> list[float]:
    """4 sequences of 100 G + 900 T blocks decoding under ``pol``; the 'true machine' is the
    uncorrected roofline, the CPU ``cpu_slowdown(step)`` times slower. Returns the CPU share of
    each step."""
    cfg, prof = pol.cfg, pol.profile
    bs, b = 64, 4
    seqs = {i: (Region.G,) * 100 + (Region.T,) * 900 for i in range(b)}
    tokens = {i: 1000 * bs + 3 for i in range(b)}
    tb = cfg.kv_bytes_per_token()
    shares = []
    for step in range(steps):
        res = t = cpu_t = 0
        for i in range(b):
            m = cpu_mask(seqs[i], pol.assign(SeqKV(i, tokens[i], seqs[i])))
            t += 900 * bs
            cpu_t += bs * sum(m[100:])
            res += 100 * bs + 3
        shares.append(cpu_t / t)
        load = rl.StepLoad(b, res, t - cpu_t, 0, cpu_t)
        truth = rl.predict_step(prof, cfg, load, False)
        for i in range(b):
            tokens[i] += 1
        pol.observe({"cpu_s": truth.cpu_attn_s * cpu_slowdown(step), "gpu_s": truth.gpu_attn_s,
                     "pcie_s": truth.pcie_s, "step_s": truth.step_s, "cpu_bytes": cpu_t * tb,
                     "gpu_bytes": (res + t - cpu_t) * tb, "t_bytes": (t - cpu_t) * tb,
                     "batch_lengths": list(tokens.values())})
    return shares


def test_a_slow_first_cpu_step_does_not_lock_the_share_at_zero():
    """The first CPU-timed step pays start-up (here 20x the model): it is not used, and the
    planned share stays at the optimum."""
    pol = make_policy("writescope", profile=h200_like(),
                      model_config=ModelConfig.from_hf("qwen3-30b-a3b"), verify_steps=0)
    shares = run_fixed_placement(pol, 6, lambda step: 20.0 if step == 0 else 1.0)
    assert shares[0] > 0.2
    assert all(abs(s - shares[0]) < 0.05 for s in shares), shares
    assert pol.stats()["planner.cpu_rate_correction"] == pytest.approx(1.0, abs=0.05)


def test_a_pessimistic_cpu_factor_is_probed_again():
    """A CPU factor that says the CPU is useless (share 0) is re-measured every PROBE_EVERY decode
    steps at the uncorrected share; with the CPU back at its profiled speed the share returns."""
    from writescope.planner import placement as wp
    assert wp.PROBE_EVERY <= 32  # the run below gives room for several probes
    pol = make_policy("writescope", profile=h200_like(),
                      model_config=ModelConfig.from_hf("qwen3-30b-a3b"), verify_steps=0)
    pol.feedback.factors["cpu"] = 16.0  # as after a stall
    shares = run_fixed_placement(pol, 128)
    assert shares[0] == 0.0
    assert pol.stats()["planner.probes"] >= 1
    assert shares[-1] > 0.2  # recovered
    assert pol.stats()["planner.cpu_rate_correction"] < 2.0


@pytest.mark.skipif(not H200_PROFILE_1201.exists(), reason="no 2026-12-01 H200 profile")
def test_an_unverified_planner_measures_the_cpu_even_when_the_batch_keeps_it_off():
    """One 32K sequence: its round trips would cost more than the CPU saves (step share 0), so
    nothing would ever measure the CPU path and placement would keep every spilled block in T
    for good (as a bench row prefilled after a one-request warm-up did on the H200). Until it is
    verified, the planner reads T blocks in place all the same; then it returns to share 0."""
    cfg = ModelConfig.from_hf("deepseek-v2-lite")
    prof = HardwareProfile.load(H200_PROFILE_1201)
    bs, g, t = 64, 128, 384
    assert rl.optimal_cpu_share(prof, cfg, 1, g * bs, 0, t * bs, False).cpu_share == 0.0
    pol = make_policy("writescope", profile=prof, model_config=cfg, verify_steps=2)
    regions = (Region.G,) * g + (Region.T,) * t
    tokens = (g + t) * bs + 3
    tb = cfg.kv_bytes_per_token()
    cpu_blocks = []
    for _ in range(8):
        n = pol.assign(SeqKV(0, tokens, regions))
        cpu_blocks.append(n)
        load = rl.StepLoad(1, g * bs + 3, (t - n) * bs, 0, n * bs)
        truth = rl.predict_step(prof, cfg, load, False)
        tokens += 1
        pol.observe({"cpu_s": truth.cpu_attn_s, "gpu_s": truth.gpu_attn_s, "pcie_s": truth.pcie_s,
                     "step_s": truth.step_s, "cpu_bytes": n * bs * tb,
                     "gpu_bytes": (g * bs + 3 + (t - n) * bs) * tb, "t_bytes": (t - n) * bs * tb,
                     "batch_lengths": [tokens]})
    assert pol.stats()["planner.cpu_verified"]
    probes = pol.stats()["planner.probes"]
    # (the first step a planner sees is a prefill in the engine: no probe there)
    assert probes == 2 and all(n > 0.3 * t for n in cpu_blocks[1:3]), cpu_blocks
    assert cpu_blocks[0] == 0 and cpu_blocks[3:] == [0] * 5, cpu_blocks


def test_steady_decode_reuses_the_last_solve(monkeypatch):
    """Decode steps whose lengths and rates barely move reuse the last solve of the share (the
    optimiser is most of the planner's host time); a rate that moves makes it solve again."""
    from writescope.planner import placement as wp
    solves = []
    orig = rl.optimal_cpu_share
    monkeypatch.setattr(rl, "optimal_cpu_share", lambda *a, **k: solves.append(1) or orig(*a, **k))
    pol = make_policy("writescope", profile=h200_like(),
                      model_config=ModelConfig.from_hf("qwen3-30b-a3b"), verify_steps=0)
    shares = run_fixed_placement(pol, 40)
    assert len(solves) <= 8, len(solves)  # 40 steps, a handful of solves
    assert all(abs(s - shares[0]) < 0.02 for s in shares)
    n = len(solves)
    run_fixed_placement(pol, 3, lambda step: 3.0)  # the CPU gets 3x slower: solved again
    assert len(solves) > n
    assert wp.MEMO_TOLERANCE <= 0.05


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rc=st.floats(5, 100), c=st.integers(0, 10 ** 6), t=st.integers(1, 10 ** 6),
       res=st.integers(0, 10 ** 5), b=st.integers(1, 64))
def test_pipelined_model(rc, c, t, res, b):
    """Two interleaved sub-batches: the CPU line loses the dense work and gains a round trip;
    the optimiser still finds the grid's best share, the model is the same without CPU work and
    with one sequence. With the experts on the CPU the step is timed as a whole
    (``_split_experts_step``, tests/test_split_experts_model.py), unless it has one sequence."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    prof = h200_like(cpu_attn={"gqa-g8-d128": {"C": rc * GB, "T": 0.8 * rc * GB}})
    plan = rl.optimal_cpu_share(prof, cfg, b, res, c, t, False, min_gain=0.0, pipelined=True)
    grid = brute_force(prof, cfg, b, res, c, t, False, False, pipelined=True)
    assert plan.prediction.step_s <= grid * (1 + 1e-9)
    for x in (0.0, 0.3, 1.0):
        load = rl.load_at_share(b, res, c, t, x)
        one = rl.predict_step(prof, cfg, load, False)
        two = rl.predict_step(prof, cfg, load, False, pipelined=True)
        if load.cpu_tokens == 0 or b == 1:
            assert two.step_s == one.step_s
        split = rl.predict_step(prof, cfg, load, True, pipelined=True)
        # split only where the KV is all in HBM (the step stays graphs)
        assert bool(split.lines) == (b >= 2 and load.spilled_tokens == 0)
        if not split.lines:
            assert split.step_s == rl.predict_step(prof, cfg, load, True).step_s


def test_attention_round_trip_of_the_decode_chain_unless_experts_share_the_cpu():
    """A profile with the decode chain's measured round trip uses it for CPU attention; with CPU
    experts (whose team the attention team must not spin beside) and for the experts' own fixed
    cost, the plain round trip; a profile without it (older ones) uses the plain one too."""
    cfg = tiny_cfg(layers=2)
    load = rl.StepLoad(1, 0, 0, cpu_c_tokens=1000)
    bytes_s = 1000 * KVB / (8 * GB)
    prof = simple_profile(rc=8 * GB, rp=10 * GB, rt=7e-4)
    chain = HardwareProfile(**{**prof.to_dict(), "cpu_attn_roundtrip_s": 5e-5})
    chain.validate()
    for p, experts_on_cpu, rt in ((chain, False, 5e-5), (chain, True, 7e-4), (prof, False, 7e-4)):
        pred = rl.predict_step(p, cfg, load, experts_on_cpu)  # 2 layers
        assert pred.cpu_attn_s == pytest.approx(2 * (rt + bytes_s))
    with pytest.raises(ValueError):
        HardwareProfile(**{**prof.to_dict(), "cpu_attn_roundtrip_s": -1.0}).validate()


def _experts_loop(report_experts: bool, steps: int = 40) -> tuple[list[float], float, WriteScopePolicy]:
    """4 Qwen3 sequences of 100 G + 1900 T blocks, routed experts on the CPU, decoding under
    writescope; the 'true machine' runs the experts 3x slower than the profile says. Returns
    the planned CPU share per step, the best share under that truth, and the policy."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    prof = h200_like()
    pol = make_policy("writescope", profile=prof, model_config=cfg, experts_on_cpu=True,
                      verify_steps=0)
    truth_corr = rl.Corrections(expert=3.0)
    bs, b = 64, 4
    seqs = {i: (Region.G,) * 100 + (Region.T,) * 1900 for i in range(b)}
    tokens = {i: 2000 * bs + 3 for i in range(b)}
    tb = cfg.kv_bytes_per_token()
    shares = []
    res = b * (100 * bs + 3)
    t = b * 1900 * bs
    for _ in range(steps):
        cpu_t = sum(bs * sum(cpu_mask(seqs[i], pol.assign(SeqKV(i, tokens[i], seqs[i])))[100:])
                    for i in range(b))
        shares.append(cpu_t / t)
        load = rl.StepLoad(b, res, t - cpu_t, 0, cpu_t)
        truth = rl.predict_step(prof, cfg, load, True, truth_corr)
        for i in range(b):
            tokens[i] += 1
        timing = {"cpu_s": truth.cpu_attn_s, "gpu_s": truth.gpu_attn_s, "pcie_s": truth.pcie_s,
                  "step_s": truth.step_s, "cpu_bytes": cpu_t * tb,
                  "gpu_bytes": (res + t - cpu_t) * tb, "t_bytes": (t - cpu_t) * tb,
                  "batch_lengths": list(tokens.values())}
        if report_experts:
            timing["cpu_expert_s"] = truth.expert_s
        pol.observe(timing)
    best = rl.optimal_cpu_share(prof, cfg, b, res, 0, t, True, truth_corr).cpu_share
    return shares, best, pol


def test_measured_cpu_expert_time_corrects_the_share():
    """The runner reports the CPU experts' kernel seconds (``cpu_expert_s``); with experts 3x
    slower than profiled, the CPU has less room for attention, and the planner finds the share
    that is best under that truth. Without the report it keeps the profile's, larger, share
    (DeepSeek-V2-Lite 8 x 128K with CPU experts ran 9% behind transfer that way:
    2026-12-01b-h200 call 3)."""
    shares, best, pol = _experts_loop(True)
    blind, _, _ = _experts_loop(False)
    assert blind[-1] > best + 0.05  # the error matters: the test is not vacuous
    assert abs(shares[-1] - best) <= 0.02 + 0.05 * best, (shares[-1], best)
    assert pol.feedback.corrections.expert == pytest.approx(3.0, rel=0.1)


def test_host_bound_steps_leave_the_gpu_rate_alone():
    """On a machine with a GPU, a decode step whose launching thread was busy for most of it
    (host_s >= HOST_BOUND_FRACTION x step_s) does not correct the GPU's rate: its GPU timing
    events bracket the host's launch gaps. The same timings from a step the host finished
    early do (the GPU factor follows the 2x measured), and so do host-bound ones on a machine
    without a GPU, where the "GPU" side is host work itself."""
    from writescope.planner import placement as wp
    cfg = ModelConfig.from_hf("deepseek-v2-lite")
    prof = HardwareProfile.load(H200_PROFILE)
    assert prof.has_gpu
    bs, g, t = 64, 128, 32
    tb = cfg.kv_bytes_per_token()

    def run(profile, host_share: float) -> dict:
        pol = make_policy("writescope", profile=profile, model_config=cfg)
        regions = (Region.G,) * g + (Region.T,) * t
        tokens = (g + t) * bs + 3
        for _ in range(12):
            pol.assign(SeqKV(0, tokens, regions))
            load = rl.StepLoad(1, g * bs + 3, t * bs, 0, 0)
            truth = rl.predict_step(profile, cfg, load, False)
            tokens += 1
            step_s = truth.step_s
            pol.observe({"gpu_s": 2.0 * truth.gpu_attn_s, "pcie_s": truth.pcie_s,
                         "step_s": step_s, "host_s": host_share * step_s, "cpu_bytes": 0,
                         "gpu_bytes": (g * bs + 3 + t * bs) * tb, "t_bytes": t * bs * tb,
                         "batch_lengths": [tokens]})
        return pol.stats()

    bound = run(prof, 0.95)
    assert bound["planner.gpu_rate_correction"] == pytest.approx(1.0)
    assert bound["planner.host_bound_steps"] == 12
    free = run(prof, 0.5 * wp.HOST_BOUND_FRACTION)
    assert free["planner.gpu_rate_correction"] > 1.8 and free["planner.host_bound_steps"] == 0
    cpu_only = dataclasses.replace(prof, h2d_pinned_Bps=None)
    assert not cpu_only.has_gpu
    assert run(cpu_only, 0.95)["planner.host_bound_steps"] == 0


def test_steps_that_measure_no_path_keep_the_rates_and_predict_once(monkeypatch):
    """A decode step with all its KV on the GPU (a CUDA graph: no path timed) leaves every
    factor as it was and costs one prediction; a step that timed the CPU corrects it."""
    from writescope.models.config import REFERENCE_DIR
    cfg = ModelConfig.from_hf(REFERENCE_DIR / "deepseek-v2-lite.json")
    pol = WriteScopePolicy(profile=H200_PROFILE, model_config=cfg, block_size=64)
    calls = []
    real = rl.predict_step
    monkeypatch.setattr(rl, "predict_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    regs = (Region.G,) * 8 + (Region.C,) * 4 + (Region.T,) * 4
    n = 16 * 64
    for _ in range(3):
        for i in range(2):
            pol.assign(SeqKV(i, n, regs))
        before = dict(pol.feedback.factors)
        calls.clear()
        pol.observe({"batch_lengths": [n + 1] * 2, "cpu_s": 0.0, "gpu_s": None, "pcie_s": 0.0,
                     "step_s": 0.01, "host_s": 0.002, "cpu_bytes": 0,
                     "gpu_bytes": 2 * n * cfg.kv_bytes_per_token(), "t_bytes": 0})
        n += 1
        assert len(calls) == 1 and pol.feedback.factors == before
    for _ in range(2):  # (the first CPU-timed step, far off the model, is not used)
        for i in range(2):
            pol.assign(SeqKV(i, n, regs))
        calls.clear()
        pol.observe({"batch_lengths": [n + 1] * 2, "cpu_s": 0.05, "gpu_s": None, "pcie_s": 0.0,
                     "step_s": 0.06, "host_s": 0.002,
                     "cpu_bytes": 2 * 256 * cfg.kv_bytes_per_token(),
                     "gpu_bytes": 2 * 768 * cfg.kv_bytes_per_token(), "t_bytes": 0})
        n += 1
    assert len(calls) == 3 and pol.feedback.factors["cpu"] != before["cpu"]
    # the region counts follow the tuple the table hands out, and only the view's are kept
    assert pol._counts(regs) == (8, 4, 4)
    assert pol._counts(regs + (Region.C,)) == (8, 5, 4)
    for i in range(2):
        pol.assign(SeqKV(i, n, regs))
    pol.observe({"batch_lengths": [n + 1] * 2, "step_s": 0.01})
    assert set(pol._region_counts) == {id(regs)}


def test_the_load_learnt_from_splits_the_cpus_bytes_as_the_cache_counted_them():
    """``cpu_t_bytes`` (the cache's count of T blocks the CPU read in place) splits the CPU's
    bytes between C and T in the load the rates are corrected from; without it, the split this
    policy assigned (which the cache may not follow: it withholds T blocks other sequences
    hold too)."""
    pol = policy()
    pol.token_bytes, pol.block_size = 100.0, 64
    pol._assigned = {"cpu_c": 64, "cpu_t": 192, "streamed": 0}
    base = {"cpu_bytes": 256 * 100.0, "gpu_bytes": 0.0, "t_bytes": 0.0}
    load = pol._load(base, [300])
    assert (load.cpu_c_tokens, load.cpu_t_tokens) == pytest.approx((64, 192))  # as assigned
    load = pol._load({**base, "cpu_t_bytes": 64 * 100.0}, [300])
    assert (load.cpu_c_tokens, load.cpu_t_tokens) == pytest.approx((192, 64))  # as read
    load = pol._load({**base, "cpu_bytes": 0.0, "cpu_t_bytes": 0.0}, [300])
    assert load.cpu_tokens == 0


def test_shared_t_tokens_stream_whatever_the_share():
    """``fixed_t`` (T blocks several sequences hold, counted once) stream at every share, the
    CPU's tokens never pass C + T, and the share is of C + T + fixed_t."""
    for free in (False, True):
        for x in (0.0, 0.2, 0.5, 1.0):
            load = rl.load_at_share(4, 1000.0, 300.0, 700.0, x, free, fixed_t=4000.0)
            assert load.streamed_tokens >= 4000.0 and load.cpu_tokens <= 1000.0
            assert load.spilled_tokens == pytest.approx(5000.0)
            assert load.cpu_tokens == pytest.approx(min(max(x * 5000.0, 0.0 if free else 300.0),
                                                        1000.0))
        # without shared tokens, the same loads as before
        assert rl.load_at_share(4, 1000.0, 300.0, 700.0, 0.5, free) == \
            rl.load_at_share(4, 1000.0, 300.0, 700.0, 0.5, free, fixed_t=0.0)
    from writescope.models.config import REFERENCE_DIR
    cfg = ModelConfig.from_hf(REFERENCE_DIR / "deepseek-v2-lite.json")
    prof = HardwareProfile.load(H200_PROFILE)
    plan = rl.optimal_cpu_share(prof, cfg, 8, 8 * 4096.0, 448.0, 64.0, False, fixed_t=28224.0)
    assert plan.cpu_share <= (448.0 + 64.0) / (448.0 + 64.0 + 28224.0) + 1e-12
    assert plan.prediction.pcie_s > 0  # the shared blocks stream at any share


def test_the_plan_counts_a_shared_prefix_once_on_the_link(monkeypatch):
    """Eight sequences holding one prefix's 441 T blocks (prefix caching): the cache tells the
    planner (``note_shared``, ``SeqKV.shared_t``). Where the CPU would read a shared block once
    per holder (``WRITESCOPE_CPU_SHARED_READS=0``), the plan's predicted step is that of the
    load the cache then runs -- the shared blocks streamed once, their other listings read from
    HBM, the CPU given private T blocks only -- far below the step predicted as if each
    sequence streamed its own copy."""
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "0")
    from writescope.models.config import REFERENCE_DIR
    cfg = ModelConfig.from_hf(REFERENCE_DIR / "deepseek-v2-lite.json")
    bs, b, n_shared = 64, 8, 441
    regs = (Region.G,) * 64 + (Region.C,) * 7 + (Region.T,) * n_shared + (Region.T,) * 2
    n = len(regs) * bs + 10

    def plan(shared: bool):
        pol = WriteScopePolicy(profile=H200_PROFILE, model_config=cfg, block_size=bs,
                               verify_steps=0)
        pol.note_shared(n_shared if shared else 0)
        given = [pol.assign(SeqKV(i, n, regs, n_shared if shared else 0)) for i in range(b)]
        return pol, given

    pol, given = plan(True)
    assert all(0 <= k <= 2 for k in given)  # at most its own two T blocks
    stats = pol.stats()
    share = stats["planner.cpu_share"]
    assert share <= (b * 9) / (b * 9 + n_shared) + 1e-12
    c, t, fixed = b * 7 * bs, b * 2 * bs, n_shared * bs
    load = rl.load_at_share(b, b * (64 * bs + 10) + (b - 1) * n_shared * bs, c, t, share,
                            fixed_t=fixed)
    want = rl.predict_step(pol.profile, cfg, load, False, pol.feedback.corrections_at(
        b * n)).step_s
    assert stats["planner.planned_step_s"] == pytest.approx(want, rel=1e-9)
    assert abs(sum(given) * bs - load.cpu_t_tokens) <= b * bs  # the assignment, per sequence
    naive, _ = plan(False)
    assert naive.stats()["planner.planned_step_s"] > 2 * want
    # the placement of a sequence's next spilled block counts a shared block once: of the
    # batch's 8 x 7 C and 441 + 8 x 2 distinct T blocks, C holds 0.11, below a target share
    # of 1 (as if the planner wanted every private block on the CPU) -> C
    pol._batch = set(range(b))
    cap = CacheCapacity({Region.G: 0, Region.C: 100, Region.T: 100}, bs, int(
        bs * cfg.kv_bytes_per_token()))
    pol._place_memo = None
    out = pol.place(SeqKV(0, n + 60, regs, n_shared), 1, cap)
    assert out == [choose_spilled_region(b * 7, b * 7 + n_shared + b * 2,
                                         pol.last_placement_target)]


def test_where_the_cpu_reads_a_shared_block_once_it_may_take_shared_t_and_c_counts_once(
        monkeypatch):
    """The same eight sequences where the CPU kernel reads a block several of them list once
    for all (``attention/shared_reads.py``; for MLA with ``all``): the distinct shared T blocks
    join the T tokens either side may read, the CPU's T share takes them first
    (``shared_t_to_cpu``, for every holder), and the plan's predicted step is that of the load
    the cache then runs -- no slower than the plan that streams them all. A shared C block
    counts once too (``SeqKV.shared_c``, ``note_shared``'s second count): seven such blocks held
    by all eight sequences plan as seven, not 56."""
    from writescope.attention import shared_reads
    from writescope.models.config import REFERENCE_DIR
    # (by default MLA reads each listing)
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "all")
    if not shared_reads.active(True):
        pytest.skip("the compiled CPU kernel is not available")
    cfg = ModelConfig.from_hf(REFERENCE_DIR / "deepseek-v2-lite.json")
    bs, b, n_shared = 64, 8, 441
    regs = (Region.G,) * 64 + (Region.C,) * 7 + (Region.T,) * n_shared + (Region.T,) * 2
    n = len(regs) * bs + 10

    def policy(shared_c: int = 0):
        pol = WriteScopePolicy(profile=H200_PROFILE, model_config=cfg, block_size=bs,
                               verify_steps=0)
        pol.note_shared(n_shared, shared_c)
        given = [pol.assign(SeqKV(i, n, regs, n_shared, shared_c)) for i in range(b)]
        return pol, given

    pol, given = policy()
    to_cpu = pol.shared_t_to_cpu()
    assert 0 < to_cpu <= n_shared  # the model wants the CPU reading part of the prefix
    share = pol.stats()["planner.cpu_share"]
    assert share > (b * 9) / (b * 9 + n_shared)  # more than C and every private T block
    c, t = b * 7 * bs, b * 2 * bs + n_shared * bs
    load = rl.load_at_share(b, b * (64 * bs + 10) + (b - 1) * n_shared * bs, c, t, share)
    want = rl.predict_step(pol.profile, cfg, load, False, pol.feedback.corrections_at(
        b * n)).step_s
    assert pol.stats()["planner.planned_step_s"] == pytest.approx(want, rel=1e-9)
    # the CPU's T tokens: the shared blocks given, then the private ones assign() gave
    assert abs((to_cpu + sum(given)) * bs - load.cpu_t_tokens) <= (b + 1) * bs
    for off in ("0", "auto"):  # (auto: MLA reads every listing)
        monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", off)
        streamed, _ = policy()
        assert streamed.shared_t_to_cpu() == 0
        assert pol.stats()["planner.planned_step_s"] <= \
            streamed.stats()["planner.planned_step_s"] * (1 + 1e-9)
    # seven shared C blocks held by all eight: planned as seven blocks of C, not 56
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "all")
    pol_c, _ = policy(shared_c=7)
    plan = rl.optimal_cpu_share(pol_c.profile, cfg, b, b * (64 * bs + 10) + (b - 1) * n_shared * bs,
                                7.0 * bs, float(b * 2 * bs + n_shared * bs), False,
                                pol_c.feedback.corrections_at(b * n),
                                min_gain=pol_c.step_min_gain)
    assert pol_c.stats()["planner.planned_step_s"] == pytest.approx(
        plan.prediction.step_s + max(0.0, pol_c.step_overhead_s), rel=1e-9)
    assert pol_c._make_plan(commit=False)["cpu_share"] == pytest.approx(plan.cpu_share)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6), st.integers(0, 12),
                          st.integers(0, 12)), min_size=1, max_size=6),
       st.integers(0, 40), st.booleans())
def test_shared_t_blocks_are_never_assigned_and_the_plan_stays_in_range(seqs, distinct, experts):
    """Any batch, any count of shared T blocks: ``assign`` gives the CPU at most a sequence's
    private T blocks, the plan's CPU share and fraction stay in range, and placement answers a
    region. Where the CPU would read a shared block once per holder, none goes to the CPU and
    the step is no faster than streaming the shared blocks alone; where it reads one once for
    all holders, the CPU takes at most the distinct shared blocks."""
    reads_once = bool(distinct % 2)  # (an environment fixture would not reset between examples)
    old = os.environ.get("WRITESCOPE_CPU_SHARED_READS")
    os.environ["WRITESCOPE_CPU_SHARED_READS"] = "1" if reads_once else "0"
    try:
        _check_shared_t_plan(seqs, distinct, experts, reads_once)
    finally:
        if old is None:
            os.environ.pop("WRITESCOPE_CPU_SHARED_READS", None)
        else:
            os.environ["WRITESCOPE_CPU_SHARED_READS"] = old


def _check_shared_t_plan(seqs, distinct, experts, reads_once):
    pol = make_policy("writescope", profile=h200_like(), model_config=tiny_cfg(),
                      experts_on_cpu=experts, verify_steps=0)
    bs = pol.block_size or 64
    views = []
    for i, (g, c, t, sh) in enumerate(seqs):
        sh = min(sh, t)
        regions = (Region.G,) * g + (Region.C,) * c + (Region.T,) * t
        views.append(SeqKV(i, len(regions) * bs + 5, regions, sh))
    pol.note_shared(distinct)
    for v in views:
        n = pol.assign(v)
        assert 0 <= n <= v.regions.count(Region.T) - v.shared_t
    plan = pol._plan
    assert 0.0 <= plan["cpu_share"] <= 1.0 + 1e-12
    assert 0.0 <= plan["t_fraction_to_cpu"] <= 1.0
    assert math.isfinite(plan["predicted_step_s"]) and plan["predicted_step_s"] > 0
    listed = sum(v.shared_t for v in views)
    to_cpu = pol.shared_t_to_cpu()
    if reads_once and listed:
        assert 0 <= to_cpu <= distinct
    else:
        assert to_cpu == 0
        if listed:
            streamed = min(listed, distinct) * bs * pol.token_bytes
            assert plan["predicted_step_s"] >= streamed / pol.profile.h2d_pinned_Bps * 0.999
    pol.observe({"batch_lengths": [v.num_tokens + 1 for v in views], "step_s": 0.01})
    cap = CacheCapacity({Region.G: 0, Region.C: 4, Region.T: 4}, bs, int(bs * pol.token_bytes))
    assert pol.place(views[0], 1, cap)[0] in (Region.C, Region.T)


def test_a_saved_profile_has_the_mode_a_plain_file_would(tmp_path):
    """``HardwareProfile.save`` writes through a unique temporary file (0600 as made); the
    profile ends with the mode open() gives (0666 less the umask), readable by others."""
    import os
    old = os.umask(0o022)
    try:
        simple_profile(rc=5 * GB, rp=10 * GB, rt=0.0).save(tmp_path / "p.json")
    finally:
        os.umask(old)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]
