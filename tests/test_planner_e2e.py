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
