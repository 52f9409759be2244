"""``kv_policy="writescope"`` end to end: the engine's greedy tokens equal transformers'.

The profile is synthetic and chosen so the planned share on these tiny models is about 1/3: the
policy writes both C and T blocks and the CPU also reads T blocks in place, so every path runs.
"""
import pytest

from test_parity import generate_checked
from test_planner import GB, simple_profile


@pytest.fixture
def mixed_profile(tmp_path):
    p = tmp_path / "profile.json"
    simple_profile(rc=5 * GB, rp=10 * GB, rt=0.0).save(p)
    return p


@pytest.mark.parametrize("arch", ["tiny_qwen3_moe", "tiny_deepseek_v2"])  # GQA and MLA
def test_writescope_greedy_matches_transformers(request, arch, mixed_profile):
    all_tiny = request.getfixturevalue(arch)
    s = generate_checked(all_tiny, kv_policy="writescope", profile=str(mixed_profile),
                         num_gpu_blocks=2).stats()
    assert s["kv.bytes_moved_after_placement"] == 0
    assert s["kv.bytes_written.G"] > 0 and s["kv.bytes_written.T"] > 0 and s["kv.bytes_written.C"] > 0
    assert 0.2 < s["planner.target_share"] < 0.5
    assert s["planner.steps"] > 0 and s["planner.measured_step_s"] > 0
    assert s["planner.cpu_read_t_tokens"] > 0  # the CPU also read T blocks in place


def test_a_split_expert_placement_reaches_the_planner(tiny_qwen3_moe, mixed_profile):
    """``experts="auto"`` under a budget that holds one MoE layer's experts beside the rest:
    the other layers' experts run on the CPU, the planner is told which layers (its model times
    each where its experts run), and the greedy tokens are still transformers'."""
    import torch

    from writescope.layers.expert_placement import choose_expert_layers, default_margin_bytes
    from writescope.models.config import ModelConfig, load_config_dict
    from writescope.planner import roofline as rl
    cfg = ModelConfig.from_hf(load_config_dict(str(tiny_qwen3_moe)))
    pc, f32 = cfg.param_counts(), torch.float32
    kv = cfg.kv_spec(f32).token_bytes() * 512
    per_layer = cfg.num_experts * pc["expert"] * 4
    budget = pc["other"] * 4 + kv + default_margin_bytes(2 ** 30) + per_layer * 3 // 2
    flags = choose_expert_layers(cfg, "auto", budget, kv, f32, device="cpu")
    assert sum(flags) == len(cfg.moe_layers) - 1  # one layer's experts stay on the "GPU"
    llm = generate_checked(tiny_qwen3_moe, kv_policy="writescope", profile=str(mixed_profile),
                           num_gpu_blocks=2, experts="auto", vram_budget=budget)
    eng = llm.engine
    assert list(eng.cpu_expert_layers) == flags
    assert eng.cache.policy.experts_on_cpu == rl.cpu_expert_layers(cfg, flags)
    s = llm.stats()
    assert s["engine.experts_on_cpu_layers"] == sum(flags)
    assert s["planner.steps"] > 0 and s["planner.predicted_step_s"] > 0
