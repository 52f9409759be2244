"""Block-wise FP8 checkpoints (the format of the -FP8 releases): the config's scheme, loading
(dequantized on the compute device, FP8 in host memory for CPU experts), parity with transformers
loading the same checkpoint dequantized, and clear errors for what is not supported."""
from __future__ import annotations

import functools
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import hf_fp8_model
from test_parity import GREEDY, NEW, check, engine, greedy_reference, prompt_ids
from writescope import LLM
from writescope.models.config import ConfigError, ModelConfig, load_config_dict
from writescope.models.loader import CheckpointError
from writescope.models.quantization import Fp8Blocks, quantization_from_hf


# ------------------------------------------------------------------------------------ config
def test_scheme_from_config():
    qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
    assert quantization_from_hf(qc) == Fp8Blocks((128, 128))
    assert quantization_from_hf(None) is None
    cfg = load_config_dict("qwen3-30b-a3b")
    cfg["quantization_config"] = qc
    assert ModelConfig.from_hf(cfg).quantization == Fp8Blocks((128, 128))
    assert ModelConfig.from_hf("qwen3-30b-a3b").quantization is None


@pytest.mark.parametrize("qc,match", [
    ({"quant_method": "gptq", "bits": 4}, "'gptq' is not supported"),
    ({"quant_method": "awq"}, "'awq' is not supported"),
    ({"quant_method": "mxfp4"}, "'mxfp4' is not supported"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e5m2"}, "e5m2"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"},
     "static"),
    ({"quant_method": "fp8"}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
    ("fp8", "must be an object"),
])
def test_unsupported_quantization_is_refused(qc, match):
    with pytest.raises(ConfigError, match=match):
        quantization_from_hf(qc)


def test_quantize_round_trip_and_shapes():
    sch = Fp8Blocks((16, 32))
    w = torch.randn(40, 70)
    q, s = sch.quantize(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (40, 70) and s.shape == (3, 3)
    assert sch.scale_shape((40, 70)) == (3, 3) and sch.scale_shape((5, 40, 70)) == (5, 3, 3)
    d = sch.dequantize(q, s)
    # e4m3 keeps 3 mantissa bits: within 1/16 of each value, and of the block's max below that
    assert ((d - w).abs() <= w.abs() / 16 + s.max() / 2).all()
    assert sch.dequantize(*sch.quantize(d)).equal(d)  # FP8 values re-quantize to themselves
    with pytest.raises(ValueError, match="expected"):
        sch.dequantize(q, s[:2])
    with pytest.raises(ValueError, match="float8"):
        sch.dequantize(q.float(), s)
    with pytest.raises(ValueError, match="positive"):
        Fp8Blocks((0, 128))


# ------------------------------------------------------------------------------------ parity
@functools.lru_cache(maxsize=None)
def fp8_reference(path: str, ids: tuple[int, ...], new: int = NEW):
    """transformers' greedy tokens, log-probabilities and rows over the FP8 checkpoint
    dequantized at load, in float64."""
    return greedy_reference(hf_fp8_model(path, dtype=torch.float64), ids, new)


@pytest.mark.parametrize("experts", ["gpu", "cpu"])
def test_fp8_checkpoint_matches_transformers(all_fp8, experts):
    """float32: every FP8 weight dequantized exactly at load, CPU experts included; greedy tokens
    and log-probabilities as transformers' over the same checkpoint, mixed block placement."""
    llm = engine(all_fp8, experts=experts, kv_policy="static", cpu_share=0.5, num_gpu_blocks=3)
    ids = prompt_ids(llm.engine.config.vocab_size)
    (out,) = llm.generate([ids], GREEDY)
    check(out, *fp8_reference(str(all_fp8), tuple(ids)))
    assert llm.engine.config.quantization is not None


def dequantized_copy(src, dst):
    """``src`` (an FP8 checkpoint) with every FP8 weight replaced by its float32 dequantized
    values and no quantization_config: what the FP8 path must equal."""
    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    sch = quantization_from_hf(cfg.pop("quantization_config"))
    sd = load_file(str(src / "model.safetensors"))
    out = {}
    for n, t in sd.items():
        if n.endswith("_scale_inv"):
            continue
        out[n] = sch.dequantize(t, sd[n + "_scale_inv"]) if t.dtype == torch.float8_e4m3fn else t
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def fp8_and_dequantized(src, tmp_path, experts: str) -> tuple[LLM, LLM]:
    """bfloat16 engines over ``src`` (an FP8 checkpoint) and over its offline-dequantized copy,
    mixed block placement."""
    plain = dequantized_copy(src, tmp_path / "dequantized")
    opts = dict(dtype="bfloat16", experts=experts, kv_policy="static", cpu_share=0.5,
                num_gpu_blocks=3)
    return engine(src, **opts), engine(plain, **opts)


def assert_same_greedy(a: LLM, b: LLM) -> None:
    """The same greedy tokens and log-probabilities, to the bit."""
    ids = prompt_ids(a.engine.config.vocab_size)
    (x,), (y,) = a.generate([ids], GREEDY), b.generate([ids], GREEDY)
    assert x.token_ids == y.token_ids
    assert x.logprobs == y.logprobs


def test_bf16_cpu_experts_stay_fp8_and_equal_the_dequantized_checkpoint(all_fp8, tmp_path,
                                                                         monkeypatch):
    """bfloat16 with the experts on the CPU: the experts stay FP8 in host memory (half the
    bytes), and with the rounded products every token and log-probability equals those of the
    checkpoint dequantized offline -- the kernel then computes from bf16(q * scale), the values a
    dequantized load holds."""
    from writescope.layers.cpu_experts import CpuExperts
    monkeypatch.setenv("WRITESCOPE_CPU_FP8_PRODUCTS", "rounded")
    a, b = fp8_and_dequantized(all_fp8, tmp_path, "cpu")
    held = a.engine.model.host_experts()
    assert held and all(isinstance(x, CpuExperts) and x.fp8 is not None for x in held)
    assert all(x.gate_up.dtype == torch.uint8 for x in held)
    ref = b.engine.model.host_experts()
    assert all(r.fp8 is None for r in ref)
    assert sum(x.nbytes for x in held) < 0.55 * sum(r.nbytes for r in ref)
    assert_same_greedy(a, b)
    assert a.stats()["engine.cpu_expert_format"] == "fp8 (e4m3, 16x16 blocks)"


def test_bf16_cpu_experts_exact_products_follow_the_dequantized_checkpoint(all_fp8, tmp_path):
    """The default exact products (q * x, each block's sum times its scale: no bf16 rounding of
    q * scale) against the dequantized checkpoint (bf16(q * scale)): two roundings of the same
    weights, neither the reference, so they agree to what rounding each weight to bf16 moves.
    These tiny random models amplify that until a near tie flips a greedy token (the fifth, in
    one of the three, on an AMX host; on an AVX-512 BF16 host without AMX the first: two tokens
    whose bf16 log-probabilities tie), so both engines are scored on the same tokens -- the
    dequantized checkpoint's greedy continuation, as prompt log-probabilities: within 0.05
    (0.003-0.034 measured on the AVX-512 host) and not equal (the exact products did run)."""
    from writescope import SamplingParams
    from writescope.layers.cpu_experts import fp8_products
    assert fp8_products() == "exact"
    a, b = fp8_and_dequantized(all_fp8, tmp_path, "cpu")
    assert all(x.fp8_exact for x in a.engine.model.host_experts())
    ids = prompt_ids(a.engine.config.vocab_size)
    (y,) = b.generate([ids], GREEDY)
    scored = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    seq = ids + list(y.token_ids[:4])
    (pa,), (pb,) = a.generate([seq], scored), b.generate([seq], scored)
    got, ref = pa.prompt_token_logprobs[len(ids):], pb.prompt_token_logprobs[len(ids):]
    assert len(got) == len(ref) == 4
    diff = max(abs(p - q) for p, q in zip(got, ref))
    from writescope.layers import cpu_experts as ce
    if min(ce.detected_isa(), ce.isa_cap()) >= ce.ISA_NAMES.index("avx2"):  # (the kernel's ISA)
        assert 0 < diff < 5e-2
    else:  # (the generic code has only the converted tiles: the rounded products)
        assert diff == 0


def test_fp8_products_setting_is_checked(monkeypatch):
    from writescope.layers.cpu_experts import fp8_products
    monkeypatch.setenv("WRITESCOPE_CPU_FP8_PRODUCTS", "Rounded ")
    assert fp8_products() == "rounded"
    monkeypatch.setenv("WRITESCOPE_CPU_FP8_PRODUCTS", "fast")
    with pytest.raises(ValueError, match="expected 'exact' or 'rounded'"):
        fp8_products()


def test_float32_runs_dequantize_cpu_experts_too(tiny_qwen3_moe_fp8):
    llm = engine(tiny_qwen3_moe_fp8, experts="cpu")
    held = llm.engine.model.host_experts()
    assert held and all(x.fp8 is None and x.dtype == torch.float32 for x in held)


def test_torch_backend_dequantizes_cpu_experts_with_a_warning(tiny_qwen3_moe_fp8, monkeypatch):
    from writescope.models import loader
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_BACKEND", "torch")
    monkeypatch.setattr(loader, "_warned", set())
    with pytest.warns(RuntimeWarning, match="dequantized to bfloat16 at load"):
        llm = engine(tiny_qwen3_moe_fp8, experts="cpu", dtype="bfloat16")
    held = llm.engine.model.host_experts()
    assert held and all(x.fp8 is None and x.backend == "torch" for x in held)
    assert len(llm.generate([[5, 6, 7]], GREEDY)[0].token_ids) == NEW


def random_fp8_llm(experts: str) -> LLM:
    """A reduced Qwen3-30B-A3B with random weights and an -FP8 release's quantization_config."""
    over = {"num_hidden_layers": 2, "hidden_size": 256, "moe_intermediate_size": 128,
            "num_experts": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "intermediate_size": 512, "vocab_size": 512,
            "quantization_config": Fp8Blocks().to_hf()}
    return LLM("qwen3-30b-a3b", random_weights=True, config_overrides=over, experts=experts,
               dtype="bfloat16", max_model_len=256, block_size=16)


def test_random_weights_with_an_fp8_config():
    """Benchmarks: a reference config with an FP8 quantization_config and random weights puts
    FP8 experts on the CPU (the bytes a step reads are those of an FP8 checkpoint)."""
    llm = random_fp8_llm("cpu")
    held = llm.engine.model.host_experts()
    assert held and all(x.fp8 == Fp8Blocks() for x in held)
    out = llm.generate([[5, 6, 7, 8]], GREEDY)[0]
    assert len(out.token_ids) == NEW


# ------------------------------------------------------------------------------------ errors
def _edited(src, dst, edit):
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    edit(sd)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_broken_fp8_checkpoints_are_named(tiny_qwen3_moe_fp8, tmp_path):
    name = "model.layers.1.mlp.experts.3.down_proj.weight"

    def no_scale(sd):
        del sd[name + "_scale_inv"]

    def bad_scale(sd):
        sd[name + "_scale_inv"] = sd[name + "_scale_inv"][:1]

    def orphan_scale(sd):
        sd["model.layers.0.mlp.shared.weight_scale_inv"] = torch.ones(1, 1)

    def scaled_float(sd):
        sd["model.layers.0.mlp.gate.weight_scale_inv"] = torch.ones(1, 4)

    cases = [(no_scale, rf"{name}.*float8_e4m3fn but has no"),
             (bad_scale, rf"{name}_scale_inv.*has shape \[1, 3\], expected \[4, 3\]"),
             (orphan_scale, r"unexpected tensor 'model.layers.0.mlp.shared.weight_scale_inv'"),
             (scaled_float, r"'model.layers.0.mlp.gate.weight'.*has a _scale_inv but is "
                            r"torch.float32, not float8_e4m3fn")]
    for i, (edit, match) in enumerate(cases):
        path = _edited(tiny_qwen3_moe_fp8, tmp_path / f"bad{i}", edit)
        for experts in ("gpu", "cpu"):
            with pytest.raises(CheckpointError, match=match):
                engine(path, experts=experts, dtype="bfloat16")


def test_fp8_experts_kept_as_bytes_refuse_what_their_conversions_cannot_carry(
        tiny_qwen3_moe_fp8, tmp_path, monkeypatch):
    """NaN codes and scales of 2^8 or more: an error naming the tensor where the experts stay
    FP8 (the CPU kernel's and the GPU's integer conversions give finite values for NaN codes and
    scale by scale * 2^120); where they are dequantized at load, transformers' values (NaN)."""
    from writescope.models.quantization import has_nan_codes

    name = "model.layers.1.mlp.experts.3.down_proj.weight"

    def nan_code(sd):
        q = sd[name].clone()
        q.view(torch.uint8)[2, 5] = 0xFF
        sd[name] = q

    def huge_scale(sd):
        sd[name + "_scale_inv"] = sd[name + "_scale_inv"] * 0 + 300.0

    for i, (edit, match) in enumerate([(nan_code, rf"{name}.*holds NaN codes"),
                                       (huge_scale, rf"{name}_scale_inv.*of 256 or more "
                                                    r"\(largest 300\)")]):
        path = _edited(tiny_qwen3_moe_fp8, tmp_path / f"bad{i}", edit)
        with pytest.raises(CheckpointError, match=match):
            engine(path, experts="cpu", dtype="bfloat16")
        with monkeypatch.context() as m:
            m.setenv("WRITESCOPE_FP8_DEVICE_EXPERTS", "1")
            with pytest.raises(CheckpointError, match=match):
                engine(path, experts="gpu", dtype="bfloat16")
    # dequantized at load (the CPU device's default): NaN weights, as transformers loads them
    llm = engine(_edited(tiny_qwen3_moe_fp8, tmp_path / "nan", nan_code), experts="gpu",
                 dtype="bfloat16")
    down = llm.engine.model.model.layers[1].mlp.experts.weights(3)[1]
    assert torch.isnan(down).sum() == 1
    assert not has_nan_codes(torch.full((7,), 0x7E, dtype=torch.uint8).view(torch.float8_e4m3fn))


def test_unsupported_quantized_checkpoint_is_refused(tiny_qwen3_moe, tmp_path):
    dst = tmp_path / "gptq"
    shutil.copytree(tiny_qwen3_moe, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="'gptq' is not supported"):
        LLM(str(dst))


# ------------------------------------------------------------------------------------ planner
def test_planner_counts_fp8_experts_at_one_byte():
    """The roofline model charges FP8 experts one byte a weight (and their scales) on either
    side, and the GPU's weights and KV room follow; a bf16 checkpoint's experts are two bytes."""
    from pathlib import Path

    from writescope.planner import roofline as rl
    from writescope.planner.profile import HardwareProfile

    prof = HardwareProfile.load(Path(__file__).resolve().parents[1] / "bench" / "profiles"
                                / "h200.json")
    raw = load_config_dict("qwen3-30b-a3b")
    bf, fp = ModelConfig.from_hf(raw), ModelConfig.from_hf(
        dict(raw, quantization_config=Fp8Blocks().to_hf()))
    one = 1 + 4 / 128 ** 2
    assert rl.expert_weight_bytes(fp, True) == rl.expert_weight_bytes(fp, False) == one
    assert rl.expert_weight_bytes(bf, True) == rl.expert_weight_bytes(bf, False) == 2
    load = rl.StepLoad(1, 1024.0, 0.0, 0.0, 0.0)
    for on_cpu in (True, False):
        a, b = rl.predict_step(prof, bf, load, on_cpu), rl.predict_step(prof, fp, load, on_cpu)
        assert b.step_s < a.step_s
        ba = rl.roofline_bound_s(prof, bf, [1024], 1e9, on_cpu)
        bb = rl.roofline_bound_s(prof, fp, [1024], 1e9, on_cpu)
        assert bb < (0.7 if on_cpu else 0.9) * ba
    # the FP8 kernel's own rate where the profile measured it (writescope calibrate), and no
    # share of the experts for the link (its kernels read no FP8 tiles)
    import dataclasses
    key = "h2048-i768"
    slow = dataclasses.replace(prof, cpu_expert={**prof.cpu_expert,
                                                 key + "-fp8": prof.cpu_expert[key] / 4})
    a, b = rl.predict_step(prof, fp, load, True), rl.predict_step(slow, fp, load, True)
    a_bf = rl.predict_step(prof, bf, load, True)
    assert b.expert_s > 2 * a.expert_s
    assert rl.predict_step(slow, bf, load, True).step_s == rl.predict_step(prof, bf, load,
                                                                           True).step_s
    with pytest.MonkeyPatch.context() as mp:  # a link's share of the experts (off by default)
        mp.setenv("WRITESCOPE_EXPERT_LINK", "0.25")  # changes bf16's prediction, not FP8's
        assert rl.predict_step(prof, bf, load, True).step_s != a_bf.step_s
        assert rl.predict_step(prof, fp, load, True).step_s == a.step_s
    pc = bf.param_counts()
    assert rl.gpu_weight_bytes(fp, True) == rl.gpu_weight_bytes(bf, True) == 2 * pc["other"]
    assert rl.gpu_weight_bytes(fp, False) == int(2 * pc["other"] + one * pc["routed_experts"])
    assert rl.gpu_kv_capacity_tokens(fp, 48 * 2 ** 30, False) > 0 == \
        rl.gpu_kv_capacity_tokens(bf, 48 * 2 ** 30, False)


def test_placement_summary_counts_fp8_experts_at_one_byte():
    """The host-memory check before loading (engine ``_check_host_memory``), the VRAM check and
    the logs see FP8 experts at one byte a weight on both sides in a bf16 run; with
    ``experts="auto"`` twice as many layers' experts fit a budget."""
    from writescope.layers.expert_placement import choose_expert_layers, expert_placement_summary
    raw = load_config_dict("qwen3-30b-a3b")
    bf, fp = ModelConfig.from_hf(raw), ModelConfig.from_hf(
        dict(raw, quantization_config=Fp8Blocks().to_hf()))
    flags = [i % 2 == 0 for i in range(bf.num_layers)]
    a = expert_placement_summary(bf, flags, torch.bfloat16)
    b = expert_placement_summary(fp, flags, torch.bfloat16)
    half = 1 / 2 * (1 + 4 / 128 ** 2)
    assert b["cpu_expert_bytes"] == pytest.approx(a["cpu_expert_bytes"] * half)
    assert b["gpu_expert_bytes"] == pytest.approx(a["gpu_expert_bytes"] * half)
    assert b["gpu_weight_bytes"] == a["gpu_weight_bytes"] - a["gpu_expert_bytes"] + \
        b["gpu_expert_bytes"]
    f32 = expert_placement_summary(fp, flags, torch.float32)
    assert f32["cpu_expert_bytes"] == 2 * a["cpu_expert_bytes"]
    assert f32["gpu_expert_bytes"] == 2 * a["gpu_expert_bytes"]
    # on the CPU device the "GPU" experts are dequantized at load (moe.StackedExperts)
    cpu_dev = expert_placement_summary(fp, flags, torch.bfloat16, "cpu")
    assert cpu_dev["gpu_expert_bytes"] == a["gpu_expert_bytes"]
    assert cpu_dev["cpu_expert_bytes"] == b["cpu_expert_bytes"]
    budget = 32 * 2 ** 30
    on_gpu = [sum(not f for f in choose_expert_layers(c, "auto", budget, 2 ** 30, torch.bfloat16))
              for c in (bf, fp)]
    assert 0 < 2 * on_gpu[0] <= on_gpu[1] <= 48, on_gpu
