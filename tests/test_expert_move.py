"""Routed experts moved to the CPU once the activations are known (``layers/expert_move.py``,
``LLMEngine._fit_experts_around_kv``).

``experts="auto"`` places the experts before the model is built, around a default margin for
the activations; on the GPU machine the activations the engine then measured were larger
(Qwen3-30B-A3B at 8K-16K batched tokens: 1.7-2.8 GiB against 1.6 GiB), and the KV that
``kv_cache_memory`` asked for did not fit (fifty-seventh session, call 1). The engine now moves
the next layers' experts to the CPU until it does. On the CPU the activations are planned from
the step's widest tensors (``LLMEngine._activation_bytes``), so a large
``max_num_batched_tokens`` puts them above the 1 GiB margin here too."""
import warnings

import pytest
import torch

from writescope import LLM, SamplingParams
from writescope.layers.expert_placement import (choose_expert_layers, cpu_layer_order,
                                                 default_margin_bytes)
from writescope.kvcache.regions import Region
from writescope.models.config import ModelConfig, load_config_dict
from test_kv_cache_memory import _device_kv_bytes

MAX_LEN = 256
BIG_STEP = 1 << 18  # batched tokens whose planned activations exceed the 1 GiB margin


def _engine(ckpt, **kw):
    kw.setdefault("dtype", "float32")
    return LLM(str(ckpt), device="cpu", max_model_len=MAX_LEN, max_num_seqs=4, **kw)


def _sizes(ckpt, dtype=torch.float32):
    cfg = ModelConfig.from_hf(load_config_dict(str(ckpt)))
    item = torch.empty(0, dtype=dtype).element_size()
    pc = cfg.param_counts()
    per_layer = cfg.num_experts * pc["expert"] * item
    one_seq = cfg.kv_spec(dtype).token_bytes() * MAX_LEN
    return cfg, pc, item, per_layer, one_seq


def _reserve(llm):
    """The device bytes the engine keeps for its largest step (on the CPU: planned)."""
    return llm.engine.activation_bytes + llm.engine.buffer_bytes


def _greedy(llm, n=8):
    out = llm.generate(["Tell me a story", "The capital of France is"],
                       SamplingParams(max_tokens=n, temperature=0, logprobs=1))
    return [(o.token_ids, o.logprobs) for o in out]  # (log-probabilities as floats)


def test_experts_move_until_the_kv_asked_for_fits(tiny_qwen3_moe):
    cfg, pc, item, per_layer, one_seq = _sizes(tiny_qwen3_moe)
    ask = one_seq * 2
    probe = _engine(tiny_qwen3_moe, experts="gpu", max_num_batched_tokens=BIG_STEP)
    act = _reserve(probe)
    assert act > default_margin_bytes(2 ** 30)  # above the margin auto placed the experts with
    # every expert fits beside the KV asked for with the default margin, but with the planned
    # activations two layers' experts must go (a quarter layer to spare)
    budget = pc["other"] * item + pc["routed_experts"] * item + ask + act - 2 * per_layer \
        + per_layer // 4
    assert not any(choose_expert_layers(cfg, "auto", budget, ask, torch.float32, device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # it fits: no "asks for" warning
        llm = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto", kv_cache_memory=ask,
                      max_num_batched_tokens=BIG_STEP)
    eng = llm.engine
    moe = list(cfg.moe_layers)
    assert eng.experts_moved_layers == 2
    assert [i for i in range(cfg.num_layers) if eng.cpu_expert_layers[i]] == \
        sorted(cpu_layer_order(moe)[:2])  # the two that auto places first
    assert _device_kv_bytes(llm) == ask  # the regions got what was asked, and no more
    assert eng.weights_bytes + act + ask <= budget
    assert eng.stats()["engine.experts_moved_layers"] == 2
    assert eng.stats()["engine.activation_bytes"] == act == eng.activation_bytes
    from writescope.commands.common import placement_summary
    line = placement_summary(eng)
    assert "2 of them moved there once the activations were measured" in line
    from writescope.units import format_bytes
    assert f"activations {format_bytes(act)} |" in line
    assert "move_experts_s" in eng.build_times
    # the same engine with the same split chosen before the build (a small step, whose
    # activations fit the margin, and a kv_cache_memory that gives two CPU layers) computes
    # the same numbers
    two = choose_expert_layers(cfg, "auto", budget, ask + act - default_margin_bytes(budget),
                               torch.float32, device="cpu")
    assert sum(two) == 2
    placed = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto",
                     kv_cache_memory=ask + act - default_margin_bytes(budget))
    assert placed.engine.experts_moved_layers == 0 and placed.engine.cpu_expert_layers == two
    assert _greedy(llm) == _greedy(placed)


def test_auto_alone_keeps_one_sequence_of_kv(tiny_qwen3_moe):
    """Without ``kv_cache_memory``, ``auto`` sets aside one ``max_model_len`` sequence's KV; the
    measured activations do not take it away either."""
    cfg, pc, item, per_layer, one_seq = _sizes(tiny_qwen3_moe)
    probe = _engine(tiny_qwen3_moe, experts="gpu", max_num_batched_tokens=BIG_STEP)
    act = _reserve(probe)
    budget = pc["other"] * item + pc["routed_experts"] * item + one_seq + act - per_layer
    assert not any(choose_expert_layers(cfg, "auto", budget, one_seq, torch.float32, device="cpu"))
    llm = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto",
                  max_num_batched_tokens=BIG_STEP)
    assert llm.engine.experts_moved_layers == 1
    assert _device_kv_bytes(llm) >= one_seq
    out = llm.generate(["Tell me a story"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4


def test_no_room_is_made_beyond_num_gpu_blocks(tiny_qwen3_moe):
    """``num_gpu_blocks`` caps G: the fit makes room for that many blocks (and the write
    tails), not for the sequence ``auto`` would otherwise keep."""
    cfg, pc, item, per_layer, _ = _sizes(tiny_qwen3_moe)
    kw = dict(dtype="float32", device="cpu", max_model_len=1024, max_num_seqs=4,
              max_num_batched_tokens=BIG_STEP)
    probe = LLM(str(tiny_qwen3_moe), experts="gpu", **kw)
    act = _reserve(probe)
    bb = probe.engine.cache.block_bytes
    one_seq = cfg.kv_spec(torch.float32).token_bytes() * 1024
    assert one_seq == 16 * bb
    budget = pc["other"] * item + pc["routed_experts"] * item + act + 8 * bb  # 8 blocks left
    free = LLM(str(tiny_qwen3_moe), experts="auto", vram_budget=budget, **kw)
    assert free.engine.experts_moved_layers > 0  # to keep one 16-block sequence
    capped = LLM(str(tiny_qwen3_moe), experts="auto", vram_budget=budget, num_gpu_blocks=2, **kw)
    assert capped.engine.experts_moved_layers == 0  # 2 G blocks and 4 tails fit in 8
    assert capped.engine.cache.layout.num_blocks[Region.G] == 2


def test_no_move_when_the_kv_fits_or_the_placement_was_asked_for(tiny_qwen3_moe):
    cfg, pc, item, per_layer, one_seq = _sizes(tiny_qwen3_moe)
    ask = one_seq * 2
    budget = pc["other"] * item + pc["routed_experts"] * item + ask + 2 ** 30 + 4 * per_layer
    llm = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto", kv_cache_memory=ask)
    assert llm.engine.experts_moved_layers == 0 and not any(llm.engine.cpu_expert_layers)
    assert "engine.experts_moved_layers" not in llm.engine.stats()
    # experts="gpu" is a request, not a default: the KV gets less, with the warning
    probe = _engine(tiny_qwen3_moe, experts="gpu", max_num_batched_tokens=BIG_STEP)
    act = _reserve(probe)
    tight = pc["other"] * item + pc["routed_experts"] * item + ask + act - per_layer
    with pytest.warns(RuntimeWarning, match="kv_cache_memory asks for"):
        llm = _engine(tiny_qwen3_moe, vram_budget=tight, experts="gpu", kv_cache_memory=ask,
                      max_num_batched_tokens=BIG_STEP)
    assert llm.engine.experts_moved_layers == 0 and _device_kv_bytes(llm) < ask


def test_fp8_device_experts_move_as_fp8(tiny_qwen3_moe_fp8, monkeypatch):
    """FP8 experts on the device (kept FP8 on the CPU device with the variable, the path the
    GPU takes) move to the CPU kernel's FP8 layout, the same codes and scales: the output is the
    one of the same layers loaded to the CPU from the checkpoint."""
    from writescope.layers.cpu_experts import CpuExperts
    monkeypatch.setenv("WRITESCOPE_FP8_DEVICE_EXPERTS", "1")
    cfg, pc, _, _, one_seq = _sizes(tiny_qwen3_moe_fp8, torch.bfloat16)
    if CpuExperts.fp8_unsupported(cfg.quantization, torch.bfloat16) is not None:
        pytest.skip("the CPU experts kernel cannot compute with FP8 weights here")
    probe = _engine(tiny_qwen3_moe_fp8, dtype="bfloat16", experts="gpu",
                    max_num_batched_tokens=BIG_STEP)
    dev = probe.engine.model.device_experts()
    assert dev and dev[0].fp8 is not None
    per_layer = dev[0].nbytes
    act = _reserve(probe)
    ask = one_seq * 2
    budget = probe.engine.weights_bytes + ask + act - per_layer + per_layer // 4
    llm = _engine(tiny_qwen3_moe_fp8, dtype="bfloat16", vram_budget=budget, experts="auto",
                  kv_cache_memory=ask, max_num_batched_tokens=BIG_STEP)
    eng = llm.engine
    assert eng.experts_moved_layers == 1
    held = eng.model.host_experts()
    assert len(held) == 1 and held[0].fp8 is not None
    first = cpu_layer_order(cfg.moe_layers)[0]  # the layer auto moves first
    two = [i == first for i in range(cfg.num_layers)]
    placed = _engine(tiny_qwen3_moe_fp8, dtype="bfloat16", vram_budget=budget, experts="auto",
                     kv_cache_memory=ask + act - default_margin_bytes(budget))
    assert placed.engine.cpu_expert_layers == two == eng.cpu_expert_layers
    a, b = placed.engine.model.host_experts()[0], held[0]
    assert torch.equal(a.gate_up, b.gate_up) and torch.equal(a.down, b.down)
    assert torch.equal(a.gate_up_scale, b.gate_up_scale)
    assert _greedy(llm, 4) == _greedy(placed, 4)


def test_kv_cache_memory_auto_chooses_again_with_the_activations(tiny_qwen3_moe, tmp_path,
                                                                monkeypatch):
    """Under ``kv_cache_memory="auto"`` the split is chosen again once the activations are
    known, among those with at least the layers already on the CPU, and the engine gets it.
    (Steps planned as one batch: with the split form the tiny model's first choice already
    has every layer's experts on the CPU, and nothing is left to move.)"""
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", "0")
    from writescope.planner.expert_split import best_split
    from writescope.planner.profile import HardwareProfile
    from test_planner import GB, simple_profile
    prof = tmp_path / "profile.json"
    simple_profile(rc=5 * GB, rp=10 * GB, rt=0.0).save(prof)
    profile = HardwareProfile.load(prof)
    cfg, pc, item, per_layer, one_seq = _sizes(tiny_qwen3_moe)
    probe = _engine(tiny_qwen3_moe, experts="gpu", max_num_batched_tokens=BIG_STEP)
    act = _reserve(probe)
    lengths = [MAX_LEN] * 4
    budget = pc["other"] * item + pc["routed_experts"] * item + one_seq * 2 + act - per_layer
    before = best_split(profile, cfg, lengths, budget, min_kv_bytes=one_seq,
                        dtype=torch.float32, device="cpu")
    after = best_split(profile, cfg, lengths, budget, min_kv_bytes=one_seq, dtype=torch.float32,
                       device="cpu", margin_bytes=act, min_cpu_layers=before["cpu_layers"])
    assert before is not None and after is not None
    assert after["cpu_layers"] > before["cpu_layers"]  # the activations asked for a move
    llm = _engine(tiny_qwen3_moe, vram_budget=budget, experts="auto", kv_cache_memory="auto",
                  profile=str(prof), max_num_batched_tokens=BIG_STEP)
    eng = llm.engine
    assert eng.kv_split == after
    assert sum(eng.cpu_expert_layers) == after["cpu_layers"] >= before["cpu_layers"]
    assert eng.experts_moved_layers == after["cpu_layers"] - before["cpu_layers"]
    if after["kv_cache_memory"] is not None:
        assert _device_kv_bytes(llm) <= after["kv_cache_memory"]
    out = llm.generate(["Tell me a story"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fp8", [False, True])
def test_moves_on_cuda(tiny_qwen3_moe, tiny_qwen3_moe_fp8, fp8, monkeypatch):
    """On CUDA, with ``auto``'s margin made smaller than the activations the engine measures,
    the KV asked for is had by moving experts (bf16, or FP8 kept FP8) from the GPU to the CPU,
    page-locked for the prefill uploads; the engine then decodes what it decodes with every
    expert on the GPU (the CPU kernel's sums in another order: logprobs within 5e-2)."""
    from writescope.layers import expert_placement
    ckpt = tiny_qwen3_moe_fp8 if fp8 else tiny_qwen3_moe
    kw = dict(dtype="bfloat16", device="cuda", max_model_len=MAX_LEN, max_num_seqs=4)
    probe = LLM(str(ckpt), experts="gpu", **kw)
    eng = probe.engine
    spec = eng.config.kv_spec(eng.dtype)
    # measured again, now that the process has run a model on this device: as the engine below
    # will measure it. The probe's own measurement, the first in the process, is larger (it
    # holds the allocator's and libraries' first-use buffers too: in the fifty-eighth session's
    # call 4 the engine below then measured enough less that it moved nothing)
    act = eng._step_activation_bytes(eng._kv_args["max_num_batched_tokens"]) + eng.buffer_bytes
    dev = eng.model.device_experts()
    assert (dev[0].fp8 is not None) == fp8
    per_layer = dev[0].nbytes
    ask = 2 * spec.token_bytes() * MAX_LEN
    budget = eng.weights_bytes + ask + act - per_layer // 2
    want = _greedy(probe, 6)
    del probe, eng, dev
    monkeypatch.setattr(expert_placement, "default_margin_bytes", lambda b: 2 ** 20)
    llm = LLM(str(ckpt), experts="auto", vram_budget=budget, kv_cache_memory=ask, **kw)
    moved = llm.engine.experts_moved_layers
    assert moved >= 1 and sum(llm.engine.cpu_expert_layers) == moved
    held = llm.engine.model.host_experts()
    assert all((h.fp8 is not None) == fp8 for h in held)
    up = llm.engine.expert_uploader
    assert up is not None and up.pinned_bytes > 0
    assert _device_kv_bytes(llm) == ask
    got = _greedy(llm, 6)
    for (t1, l1), (t2, l2) in zip(got, want):
        assert t1 == t2
        assert max(abs(a - b) for a, b in zip(l1, l2)) < 5e-2
