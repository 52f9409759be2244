"""``kv_cache_memory``: device memory set aside for the KV cache (vLLM's kv_cache_memory_bytes).

With ``experts="auto"`` the routed experts are placed around it (more MoE layers' experts go to
the CPU), the G and W regions never take more, and a budget that leaves less is warned about.
On the CPU the "device" regions live in ordinary memory, so the same sizing runs here."""
import warnings

import pytest
import torch

from writescope import LLM, SamplingParams
from writescope.kvcache.regions import DEVICE_REGIONS
from writescope.layers.expert_placement import choose_expert_layers, default_margin_bytes
from writescope.models.config import ModelConfig, load_config_dict

MAX_LEN = 256


def _setup(ckpt):
    cfg = ModelConfig.from_hf(load_config_dict(str(ckpt)))
    pc, f32 = cfg.param_counts(), torch.float32
    per_layer = cfg.num_experts * pc["expert"] * 4
    one_seq = cfg.kv_spec(f32).token_bytes() * MAX_LEN
    # every expert fits beside one sequence's KV, with two layers' worth to spare
    budget = pc["other"] * 4 + pc["routed_experts"] * 4 + one_seq + default_margin_bytes(2 ** 30) \
        + 2 * per_layer
    return cfg, per_layer, one_seq, budget


def _device_kv_bytes(llm) -> int:
    eng = llm.engine
    by = eng.cache.layout.bytes(eng.cache.spec)
    return sum(by[r] for r in DEVICE_REGIONS)


def _engine(ckpt, **kw):
    return LLM(str(ckpt), dtype="float32", device="cpu", max_model_len=MAX_LEN, max_num_seqs=4,
               **kw)


def test_auto_places_the_experts_around_the_kv_asked_for(tiny_qwen3_moe):
    cfg, per_layer, one_seq, budget = _setup(tiny_qwen3_moe)
    assert not any(choose_expert_layers(cfg, "auto", budget, one_seq, torch.float32, device="cpu"))
    plain = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto")
    assert sum(plain.engine.cpu_expert_layers) == 0
    ask = one_seq + 4 * per_layer  # two layers' worth more than the budget spares
    want = choose_expert_layers(cfg, "auto", budget, ask, torch.float32, device="cpu")
    assert sum(want) == 2
    llm = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto", kv_cache_memory=ask)
    assert list(llm.engine.cpu_expert_layers) == want
    assert llm.engine.kv_cache_memory == ask
    assert _device_kv_bytes(llm) <= ask
    from writescope.commands.common import placement_summary
    line = placement_summary(llm.engine)
    assert f"routed experts on the CPU in 2 of {len(cfg.moe_layers)} MoE layers" in line
    assert "KV: G " in line and " host" in line
    assert "routed experts on the device (cpu)" in placement_summary(plain.engine)
    out = llm.generate(["Tell me a story"], SamplingParams(max_tokens=8, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 8


def test_the_regions_take_no_more_than_asked(tiny_qwen3_moe):
    _, _, one_seq, budget = _setup(tiny_qwen3_moe)
    plain = _engine(tiny_qwen3_moe, vram_budget=budget, experts="gpu")
    small = 3 * one_seq  # four write tails and eight G blocks
    llm = _engine(tiny_qwen3_moe, vram_budget=budget, experts="gpu", kv_cache_memory=small)
    assert _device_kv_bytes(llm) <= small < _device_kv_bytes(plain)


def test_a_budget_that_leaves_less_warns(tiny_qwen3_moe):
    _, per_layer, one_seq, budget = _setup(tiny_qwen3_moe)
    ask = budget  # more than the budget can leave beside the weights
    with pytest.warns(RuntimeWarning, match="kv_cache_memory asks for"):
        llm = _engine(tiny_qwen3_moe, vram_budget=budget + 8 * per_layer, experts="gpu",
                      kv_cache_memory=ask)
    assert 0 < _device_kv_bytes(llm) < ask
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _engine(tiny_qwen3_moe, vram_budget=budget, experts="gpu", kv_cache_memory=3 * one_seq)


@pytest.mark.parametrize("bad", [0, -1, "-1GiB", "lots"])
def test_bad_values_are_refused(tiny_qwen3_moe, bad):
    with pytest.raises(ValueError):
        _engine(tiny_qwen3_moe, kv_cache_memory=bad)


def test_less_than_the_write_tails_is_refused(tiny_qwen3_moe):
    _, _, one_seq, _ = _setup(tiny_qwen3_moe)
    with pytest.raises(ValueError, match="cannot hold one write tail per sequence"):
        _engine(tiny_qwen3_moe, kv_cache_memory=one_seq // 2)  # 2 blocks for 4 tails


def test_the_cli_and_the_plan_take_it(tiny_qwen3_moe, capsys):
    from writescope.cli import main
    from writescope.commands.common import engine_kwargs
    import argparse
    from writescope.commands.common import add_engine_args
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_kwargs(p.parse_args(["--kv-cache-memory", "12GiB"]))["kv_cache_memory"] == "12GiB"
    args = ["plan", "--model", "qwen3-30b-a3b", "--vram-budget", "32GiB", "--batch", "4",
            "--context-lengths", "8k,128k", "--profile", "bench/profiles/h200.json"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--kv-cache-memory", "24GiB"]) == 0
    more = capsys.readouterr().out
    # the splits keep the activations an engine on the GPU measures at 2048 batched tokens,
    # estimated (planner/activations.py): 2.4 GiB, not auto's 1.6 GiB margin
    assert "36 of 48 MoE layers" in plain and "46 of 48 MoE layers" in more
    assert "G region 262144 tokens" in more
    assert "routed experts against KV in HBM" in plain and "--experts cpu" in plain


def test_the_bench_plans_its_host_experts_around_it():
    """``writescope bench --kv-cache-memory``: the grid's host budgets count the experts the
    engine will then put on the CPU (Qwen3-30B-A3B, 32 GiB, experts auto)."""
    from writescope.bench import grid as g
    from writescope.bench.host_budgets import host_weight_bytes
    from writescope.commands.bench import register
    import argparse
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    spec = g.GridSpec(models=["qwen3-30b-a3b"], batches=[4], context_lengths=[8192],
                      random_weights=True, device="cuda", vram_budget="32GiB")
    plain = host_weight_bytes(cfg, spec, 8300)
    spec.kv_cache_memory = "24GiB"
    assert host_weight_bytes(cfg, spec, 8300) > plain
    spec.kv_cache_memory = "lots"
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        spec.validate()
    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    from writescope.commands.bench import spec_from_args
    args = p.parse_args(["bench", "--model", "qwen3-30b-a3b", "--kv-cache-memory", "12GiB"])
    assert spec_from_args(args).kv_cache_memory == "12GiB"


def test_kv_memory_for_split_gives_exactly_that_split():
    from writescope.planner.expert_split import kv_memory_for_split
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    budget = 32 * 2**30
    got = 0
    for k in range(len(cfg.moe_layers)):
        x = kv_memory_for_split(cfg, budget, k)
        if x is None:  # fewer CPU layers than the budget allows, whatever the KV
            continue
        got += 1
        assert x % 2**20 == 0
        assert sum(choose_expert_layers(cfg, "auto", budget, x, torch.bfloat16)) == k
    assert got >= 20
    assert kv_memory_for_split(cfg, budget, 0) is None  # the experts alone exceed 32 GiB


def test_the_plan_weighs_expert_layers_against_kv_in_hbm():
    """Qwen3-30B-A3B, 32 GiB, batch 4: at 8K the fastest split keeps more experts on the GPU
    than the plan's (one 128K sequence's KV set aside), at 128K every layer's go to the CPU,
    and the option the table gives reproduces its prediction."""
    from writescope.commands.plan import expert_splits, format_splits, make_plan
    from writescope.planner.profile import HardwareProfile
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    profile = HardwareProfile.load("bench/profiles/h200.json")
    budget = 32 * 2**30
    kv_128k = cfg.kv_bytes_per_token(torch.bfloat16) * 131072
    planned = tuple(choose_expert_layers(cfg, "auto", budget, kv_128k, torch.bfloat16))
    rows = {r["context_length"]: r for r in
            expert_splits(cfg, profile, 4, [8192, 131072], budget, planned)}
    r8, r128 = rows[8192], rows[131072]
    assert r8["cpu_layers"] == r128["cpu_layers"] == sum(planned)
    assert r8["best_cpu_layers"] < sum(planned) and r8["speedup"] > 1.1
    assert r128["best_cpu_layers"] == 48 and r128["speedup"] > 1.1
    for r in rows.values():
        assert r["best_step_s"] <= r["step_s"]
    table = format_splits(list(rows.values()))
    assert "--experts cpu" in table and f"--kv-cache-memory {r8['kv_cache_memory'] // 2**20}MiB" in table
    # the engine's split and G region under the option the table gives: the same prediction
    x = r8["kv_cache_memory"]
    flags = tuple(choose_expert_layers(cfg, "auto", budget, max(x, kv_128k // 16), torch.bfloat16))
    assert sum(flags) == r8["best_cpu_layers"]
    doc = make_plan(cfg, profile, 4, [8192], flags, budget, kv_cache_memory=x)
    assert doc["writescope"][0]["predicted_step_s"] == pytest.approx(r8["best_step_s"])


def test_best_split_for_the_reference_model():
    """Qwen3-30B-A3B, 32 GiB, the committed H200 profile: 4 x 128K puts every layer's experts on
    the CPU; 4 x 8K keeps 21 on the GPU (the plan's table, above)."""
    from writescope.planner.expert_split import best_split
    from writescope.planner.profile import HardwareProfile
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    profile = HardwareProfile.load("bench/profiles/h200.json")
    kvb = cfg.kv_bytes_per_token(torch.bfloat16)
    long = best_split(profile, cfg, [131072] * 4, 32 * 2**30, min_kv_bytes=kvb * 131072)
    assert long["cpu_layers"] == 48 and long["kv_cache_memory"] is None
    short = best_split(profile, cfg, [8192] * 4, 32 * 2**30, min_kv_bytes=kvb * 8192)
    assert short["cpu_layers"] == 27 and short["kv_cache_memory"] == 3998 * 2**20
    assert short["step_s"] < long["step_s"]


@pytest.mark.parametrize("mode", ["0", "1", None])
def test_kv_cache_memory_auto_takes_the_planners_split(tiny_qwen3_moe, tmp_path, monkeypatch,
                                                       mode):
    """The split the planner predicts fastest with decode steps in the form the runner gives
    them (``WRITESCOPE_PIPELINE_EXPERTS``: one batch, two sub-batches, or by default the faster
    of the two)."""
    from writescope.planner.expert_split import best_split, split_options
    from writescope.planner.profile import HardwareProfile
    from writescope.planner.roofline import expert_form
    from test_planner import GB, simple_profile
    if mode is None:
        monkeypatch.delenv("WRITESCOPE_PIPELINE_EXPERTS", raising=False)
    else:
        monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", mode)
    prof = tmp_path / "profile.json"
    simple_profile(rc=5 * GB, rp=10 * GB, rt=0.0).save(prof)
    cfg, per_layer, one_seq, budget = _setup(tiny_qwen3_moe)
    form = {"0": False, "1": "on", None: "auto"}[mode]
    assert expert_form({"0": "off", "1": "on", None: "auto"}[mode]) == form
    want = best_split(HardwareProfile.load(prof), cfg, [MAX_LEN] * 4, budget,
                      min_kv_bytes=one_seq, dtype=torch.float32, device="cpu", pipelined=form)
    assert want is not None
    # the tiny model's layers are KiB: the options are 1 MiB for one CPU layer, or all three
    assert split_options(cfg, budget, one_seq, torch.float32, "cpu") == {3: None, 1: 2**20}
    llm = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto", kv_cache_memory="auto",
                  profile=str(prof))
    eng = llm.engine
    assert eng.kv_split == want
    assert sum(eng.cpu_expert_layers) == want["cpu_layers"]
    assert eng.kv_cache_memory == want["kv_cache_memory"]
    assert eng.stats()["engine.kv_split_predicted_step_s"] == want["step_s"]
    out = llm.generate(["Tell me a story"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="needs experts='auto'"):
        _engine(tiny_qwen3_moe, vram_budget=budget, experts="gpu", kv_cache_memory="auto",
                profile=str(prof))


def test_the_plan_takes_kv_cache_memory_auto(capsys):
    from writescope.cli import main
    args = ["plan", "--model", "qwen3-30b-a3b", "--vram-budget", "32GiB", "--batch", "4",
            "--profile", "bench/profiles/h200.json", "--kv-cache-memory", "auto"]
    assert main(args + ["--context-lengths", "8k"]) == 0
    assert "experts on cpu in 27 of 48 MoE layers" in capsys.readouterr().out
    assert main(args + ["--context-lengths", "128k"]) == 0
    assert "experts on cpu |" in capsys.readouterr().out
    assert main(args + ["--context-lengths", "8k", "--experts", "gpu"]) == 1
    assert "needs --experts auto" in capsys.readouterr().err


def test_the_bench_records_the_split(tiny_qwen3_moe, tmp_path):
    """``writescope bench --kv-cache-memory auto`` on the tiny Qwen3 MoE: the model's meta says
    what the engine chose (the split and its predicted step) and what it set aside."""
    import json
    from test_bench import bench_cli
    _, _, _, budget = _setup(tiny_qwen3_moe)
    assert bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "1", "--context-lengths", "24",
                     "--decode-steps", "2", "--policies", "writescope", "--vram-budget",
                     str(budget), "--kv-cache-memory", "auto") == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    meta = doc["models"][0] if isinstance(doc["models"], list) else next(iter(doc["models"].values()))
    split = meta["kv_split"]
    assert split is not None and meta["experts_on_cpu_layers"] == split["cpu_layers"]
    assert meta["kv_cache_memory"] == split["kv_cache_memory"]
    assert meta["activation_bytes"] > 0 and meta["buffer_bytes"] == 0  # (no staging on the CPU)
    assert meta["max_model_len"] > 24 and meta["max_num_batched_tokens"] > 0
    assert meta["experts_moved_layers"] == 0
    assert not doc["rows"][0].get("error")
