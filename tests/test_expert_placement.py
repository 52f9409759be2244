"""Routed-expert placement rule (writescope.layers.expert_placement)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from writescope.layers.expert_placement import (choose_expert_layers, cpu_layer_order,
                                                 default_margin_bytes,
                                                 expert_placement_summary)
from writescope.models.config import ModelConfig

GB = 10**9
GiB = 2**30
BF = torch.bfloat16
MODELS = ["deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"]


@pytest.fixture(scope="module", params=MODELS)
def cfg(request):
    return ModelConfig.from_hf(request.param)


def _bytes(cfg, key, dtype=BF):
    return cfg.param_counts()[key] * torch.empty(0, dtype=dtype).element_size()


def test_modes_without_budget(cfg):
    n = cfg.num_layers
    assert choose_expert_layers(cfg, "gpu", None, 0, BF) == [False] * n
    assert choose_expert_layers(cfg, "auto", None, 10 * GB, BF) == [False] * n  # no GPU limit
    cpu = choose_expert_layers(cfg, "cpu", None, 0, BF)
    assert cpu == [i in set(cfg.moe_layers) for i in range(n)]
    assert not any(cpu[i] for i in cfg.dense_layers)


def test_deepseek_dense_first_layer_stays():
    cfg = ModelConfig.from_hf("deepseek-v2-lite")
    assert cfg.dense_layers == (0,)
    flags = choose_expert_layers(cfg, "cpu", 32 * GB, 2 * GiB, BF)
    assert flags[0] is False and all(flags[1:])


def test_auto_at_32gb_moves_experts_and_fits(cfg):
    budget, kv = 32 * GB, 2 * GiB
    flags = choose_expert_layers(cfg, "auto", budget, kv, BF)
    s = expert_placement_summary(cfg, flags, BF)
    # none of the reference models fits 32 GB with its routed experts on the GPU
    assert s["cpu_expert_layers"] >= 1
    assert s["gpu_weight_bytes"] + kv + default_margin_bytes(budget) <= budget
    # maximal: one more MoE layer on the GPU would not fit
    per_layer = cfg.num_experts * _bytes(cfg, "expert")
    if s["cpu_expert_layers"] < s["moe_layers"]:
        assert s["gpu_weight_bytes"] + per_layer + kv + default_margin_bytes(budget) > budget
    # the CPU layers are spread over the model (a pipelined step overlaps one sub-batch's CPU
    # experts with the other's GPU layers up to the next CPU layer): the first of
    # cpu_layer_order, no two of them adjacent while there are few
    cpu_layers = [i for i, f in enumerate(flags) if f]
    assert cpu_layers == sorted(cpu_layer_order(cfg.moe_layers)[: len(cpu_layers)])
    if 2 * len(cpu_layers) <= s["moe_layers"]:
        assert all(b - a >= 2 for a, b in zip(cpu_layers, cpu_layers[1:]))


@pytest.mark.parametrize("m", [1, 2, 3, 26, 27, 47, 48, 94])
def test_cpu_layer_order_spreads_every_prefix(m):
    moe = list(range(3, 3 + m))  # (a model whose first layers are dense)
    order = cpu_layer_order(moe)
    assert sorted(order) == moe  # every layer once
    for k in range(1, m + 1):
        pos = sorted(order[:k])
        # the largest gap (an end's counting double) at most about twice the even spacing m/k
        # (farthest-first insertion; the integer layers add a few: at most 3.55 for m < 100)
        gaps = [b - a for a, b in zip(pos, pos[1:])] + [2 * (pos[0] - 3) + 1,
                                                        2 * (3 + m - 1 - pos[-1]) + 1]
        assert max(gaps) <= 2 * m / k + 4, (k, pos)
    # the engine's later moves continue from what is on the CPU: the same layers as the order's
    for k in range(m + 1):
        assert order[:k] + cpu_layer_order(moe, order[:k]) == order


def test_auto_everything_fits(cfg):
    need = _bytes(cfg, "total") + 4 * GiB + GiB
    big = need * 21 // 20 + 2 * GiB
    assert choose_expert_layers(cfg, "auto", big, 4 * GiB, BF) == [False] * cfg.num_layers
    # exact arithmetic with an explicit margin: fits at the boundary, not one byte below
    exact = _bytes(cfg, "total") + 4 * GiB + 123
    assert not any(choose_expert_layers(cfg, "auto", exact, 4 * GiB, BF, margin_bytes=123))
    assert any(choose_expert_layers(cfg, "auto", exact - 1, 4 * GiB, BF, margin_bytes=123))


def test_fp32_needs_more_cpu_layers():
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    b = sum(choose_expert_layers(cfg, "auto", 64 * GB, GiB, BF))
    f = sum(choose_expert_layers(cfg, "auto", 64 * GB, GiB, torch.float32))
    assert f > b


def test_gpu_experts_leave_the_kv_what_is_left():
    """experts='gpu' asks for every expert on the GPU: the budget must hold them and the margin;
    the KV takes the rest and spills past it (Qwen3-30B-A3B at 70 GiB: 61 GB of weights, a 128K
    sequence's 12.9 GB of KV does not fit beside them, and need not)."""
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    seq_kv = cfg.kv_bytes_per_token(BF) * 131072
    assert seq_kv > 12 * GB
    assert choose_expert_layers(cfg, "gpu", 70 * GiB, seq_kv, BF) == [False] * cfg.num_layers
    with pytest.raises(ValueError, match="exceed the VRAM budget"):
        choose_expert_layers(cfg, "gpu", 62 * GB, seq_kv, BF)  # not even the weights and margin
    # auto still keeps room for a sequence's KV: some experts go to the CPU at this budget
    assert any(choose_expert_layers(cfg, "auto", 70 * GiB, seq_kv, BF))


def test_budget_too_small_raises(cfg):
    with pytest.raises(ValueError, match="exceed the VRAM budget"):
        choose_expert_layers(cfg, "gpu", 32 * GB, GiB, BF)
    with pytest.raises(ValueError, match="every routed expert on the CPU"):
        choose_expert_layers(cfg, "auto", 2 * GB, GiB, BF)
    with pytest.raises(ValueError, match="every routed expert on the CPU"):
        choose_expert_layers(cfg, "cpu", 2 * GB, GiB, BF)


@pytest.mark.parametrize("kwargs,match", [
    (dict(experts="GPUs"), "experts must be"),
    (dict(experts=None), "experts must be"),
    (dict(vram_budget_bytes=-1), "vram_budget_bytes"),
    (dict(vram_budget_bytes=3.5e10), "vram_budget_bytes"),
    (dict(kv_bytes_needed=-5), "kv_bytes_needed"),
    (dict(dtype="bfloat16"), "dtype"),
    (dict(dtype=torch.int8), "dtype"),
    (dict(margin_bytes=-1), "margin_bytes"),
])
def test_bad_values(kwargs, match):
    cfg = ModelConfig.from_hf("mixtral-8x7b")
    args = dict(experts="auto", vram_budget_bytes=32 * GB, kv_bytes_needed=0, dtype=BF)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        choose_expert_layers(cfg, **args)
    with pytest.raises(ValueError, match="dense"):
        expert_placement_summary(ModelConfig.from_hf("deepseek-v2-lite"), [True] * 27, BF)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(MODELS), b1=st.integers(8, 400), b2=st.integers(8, 400),
       kv=st.integers(0, 8))
def test_auto_monotone_in_budget(model, b1, b2, kv):
    cfg = ModelConfig.from_hf(model)
    lo, hi = sorted((b1, b2))

    def n_cpu(b):
        try:
            return sum(choose_expert_layers(cfg, "auto", b * GB, kv * GiB, BF))
        except ValueError:
            return None  # cannot fit even with every expert on the CPU

    a, b = n_cpu(lo), n_cpu(hi)
    if a is not None:
        assert b is not None and b <= a  # more VRAM never moves more experts to the CPU
        assert a <= len(cfg.moe_layers)
