"""An FP8 checkpoint's routed experts kept FP8 on the compute device (``layers/moe.py``
``StackedExperts(fp8=...)``, the fused kernels' FP8 path in ``layers/moe_triton.py``): half the
VRAM and half the bytes a decode step reads, computing with bf16(q * scale) -- the values of
the checkpoint dequantized at load -- on every path."""
from __future__ import annotations

import pytest
import torch

from test_fp8_checkpoints import (assert_same_greedy, dequantized_copy, fp8_and_dequantized,
                                  random_fp8_llm)
from test_parity import GREEDY, NEW, engine, prompt_ids
from triton_interp import run_interpreted
from writescope.layers.moe import StackedExperts
from writescope.models.quantization import Fp8Blocks

# The fused kernels over FP8 experts against the same kernels over the experts dequantized to
# bf16 (the same loop widths: equal to the bit) and against float64 expert by expert; the three
# conversions (the hardware's and the two integer ones; unrounded, near float64 only), blocks
# that do not divide the sizes, row blocks that are not powers of two, DeepSeek's added shared
# output, int32 ids.
CHECK = r"""
import os, torch
from writescope.layers.moe_triton import fused_experts
from writescope.layers.moe import run_experts, StackedExperts
from writescope.models.quantization import Fp8Blocks
g = torch.Generator().manual_seed(0)
dev = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"
for E, H, I, n, k, block in ((6, 64, 32, 3, 2, (16, 16)), (4, 130, 70, 2, 2, (16, 48)),
                             (5, 96, 40, 2, 3, (24, 8)), (4, 32, 16, 70, 2, (16, 16))):
    if dev == "cpu" and n * k > 128:  # more pairs than MAX_SLOTS (FP8 steps take these kernels
        continue                      # further): on CUDA only, the interpreter is slow
    fp8 = Fp8Blocks(block)
    st = StackedExperts(E, H, I, fp8=fp8).to(dev)
    for e in range(E):
        mats = [torch.randn(I, H, generator=g) * 0.3, torch.randn(I, H, generator=g) * 0.3,
                torch.randn(H, I, generator=g) * 0.02]
        st.set_expert_fp8(e, *[fp8.quantize(m.to(dev)) for m in mats])
    deq = [st.weights(e) for e in range(E)]
    gu, dn = torch.stack([d[0] for d in deq]), torch.stack([d[1] for d in deq])
    assert gu.dtype == torch.bfloat16
    x = torch.randn(n, H, generator=g).to(dev, torch.bfloat16)
    add = torch.randn(n, H, generator=g).to(dev, torch.bfloat16)
    idx = torch.rand(n, E, generator=g).topk(k, dim=-1).indices.to(dev)
    w = torch.rand(n, k, generator=g).softmax(-1).to(dev)
    ref = run_experts(x.double(), idx, w.double(), lambda e: (gu[e].double(), dn[e].double()))
    sc = (st.gate_up_scale, st.down_scale, fp8)
    for mode in (1, 2, 3, 9, 11):
        cfg = {"gate_up_block_h": 8, "down_block_i": 8, "fp8_convert": mode}
        got = fused_experts(x, idx, w, st.gate_up, st.down, config=cfg, fp8=sc)
        if mode < 8:  # rounded to bf16 as the dequantized checkpoint: the same bits
            assert torch.equal(got, fused_experts(x, idx, w, gu, dn, config=cfg)), (E, H, I, mode)
            plus = fused_experts(x, idx.int(), w, st.gate_up, st.down, config=cfg, fp8=sc,
                                 add=add)
            assert torch.equal(plus, fused_experts(x, idx, w, gu, dn, config=cfg, add=add))
        got = fused_experts(x, idx, w, st.gate_up, st.down, config={"fp8_convert": mode}, fp8=sc)
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert got.dtype == torch.bfloat16 and err < 1e-2, (E, H, I, mode, err)
    # the module: fused on CUDA, expert by expert elsewhere; both near float64
    out = st(x, idx, w)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
for bad in (lambda: fused_experts(x.float(), idx, w, st.gate_up, st.down, fp8=sc),
            lambda: fused_experts(x, idx, w, st.gate_up, st.down, fp8=(sc[1], sc[0], fp8)),
            lambda: fused_experts(x, idx, w, gu, dn, fp8=sc),
            lambda: fused_experts(x, idx, w, st.gate_up, st.down, fp8=sc,
                                  config={"fp8_convert": 4})):
    try:
        bad()
    except ValueError:
        pass
    else:
        raise AssertionError("bad FP8 inputs accepted")
print("ok")
"""


def test_fused_fp8_experts_under_the_interpreter():
    pytest.importorskip("triton")
    r = run_interpreted(CHECK)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_fp8_experts_on_cuda():
    pytest.importorskip("triton")
    exec(compile(CHECK, "fp8_fused_check", "exec"), {})


def test_stacked_fp8_experts_dequantize_as_the_checkpoint_loader():
    """``weights(e)`` is bf16 of ``Fp8Blocks.dequantize``; bytes; bad matrices are refused."""
    fp8 = Fp8Blocks((16, 32))
    st = StackedExperts(3, 64, 48, fp8=fp8)
    assert st.gate_up.dtype == st.down.dtype == torch.uint8
    assert tuple(st.gate_up_scale.shape) == (3, 2, 3, 2) and tuple(st.down_scale.shape) == (3, 4, 2)
    g = torch.Generator().manual_seed(3)
    mats = [torch.randn(48, 64, generator=g), torch.randn(48, 64, generator=g),
            torch.randn(64, 48, generator=g)]
    pairs = [fp8.quantize(m) for m in mats]
    for e in range(3):
        st.set_expert_fp8(e, *pairs)
    gu, dn = st.weights(1)
    want = [fp8.dequantize(*p).to(torch.bfloat16) for p in pairs]
    assert torch.equal(gu, torch.cat(want[:2])) and torch.equal(dn, want[2])
    assert st.nbytes == 3 * 3 * 64 * 48 + 4 * (3 * 2 * 3 * 2 + 3 * 4 * 2)
    assert st.weight_format == fp8.name
    with pytest.raises(ValueError, match="expected float8_e4m3fn"):
        st.set_expert_fp8(0, pairs[2], pairs[1], pairs[0])
    with pytest.raises(ValueError, match="bfloat16"):
        st(torch.zeros(1, 64), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2))
    # a step with more (token, expert) pairs than experts dequantizes them in groups: the
    # same result as one expert at a time
    gu2, dn2 = st.dequantized(0, 3)
    assert torch.equal(gu2[1], gu) and torch.equal(dn2[1], dn)
    x = torch.randn(4, 64, generator=g).to(torch.bfloat16)
    idx = torch.tensor([[0, 2], [1, 2], [2, 0], [1, 0]])
    w = torch.rand(4, 2, generator=g)
    from writescope.layers import moe
    from writescope.layers.moe import run_experts
    one = run_experts(x, idx, w, st.weights)
    assert st._weights_for(idx.numel()) != st.weights and st._weights_for(2) == st.weights
    old = moe.GROUP_WEIGHTS
    try:
        for group in (1, 2, 3):  # experts a group
            moe.GROUP_WEIGHTS = group * 3 * 64 * 48
            assert torch.equal(st(x, idx, w), one)
    finally:
        moe.GROUP_WEIGHTS = old


@pytest.fixture
def fp8_on_any_device(monkeypatch):
    """FP8 experts kept FP8 on the CPU device too (by default only on CUDA): the same code
    paths as on the GPU, less the fused kernels."""
    monkeypatch.setenv("WRITESCOPE_FP8_DEVICE_EXPERTS", "1")


@pytest.mark.parametrize("experts", ["gpu", "auto"])
def test_bf16_device_experts_stay_fp8_and_equal_the_dequantized_checkpoint(all_fp8, tmp_path,
                                                                           experts,
                                                                           fp8_on_any_device):
    """bfloat16 with the experts on the compute device: they stay FP8 there (about half the
    bytes), and every token and log-probability equals those of the checkpoint dequantized
    offline (prefill chunks dequantize groups of experts, decode steps one expert at a
    time)."""
    a, b = fp8_and_dequantized(all_fp8, tmp_path, experts)
    held, ref = a.engine.model.device_experts(), b.engine.model.device_experts()
    assert held and all(x.fp8 is not None and x.gate_up.dtype == torch.uint8 for x in held)
    assert all(r.fp8 is None for r in ref)
    assert sum(x.nbytes for x in held) < 0.55 * sum(r.nbytes for r in ref)
    assert_same_greedy(a, b)
    s = a.stats()
    assert s["engine.gpu_expert_format"] == "fp8 (e4m3, 16x16 blocks)"
    assert s["engine.gpu_expert_bytes"] == sum(x.nbytes for x in held)
    assert b.stats()["engine.gpu_expert_format"] == "bfloat16"


def test_device_experts_dequantized_where_they_cannot_stay_fp8(tiny_qwen3_moe_fp8, monkeypatch):
    """float32 runs, bfloat16 runs on the CPU device (by default: there torch would dequantize
    the experts at every call) and ``WRITESCOPE_FP8_DEVICE_EXPERTS=0`` dequantize the experts
    at load."""
    held = engine(tiny_qwen3_moe_fp8, experts="gpu").engine.model.device_experts()
    assert held and all(x.fp8 is None and x.gate_up.dtype == torch.float32 for x in held)
    held = engine(tiny_qwen3_moe_fp8, experts="gpu", dtype="bfloat16").engine.model.device_experts()
    assert held and all(x.fp8 is None and x.gate_up.dtype == torch.bfloat16 for x in held)
    fp8 = Fp8Blocks()
    assert StackedExperts.fp8_unsupported(fp8, torch.bfloat16, "cpu")
    assert StackedExperts.fp8_unsupported(fp8, torch.bfloat16, "cuda") is None
    assert StackedExperts.fp8_unsupported(fp8, torch.bfloat16) is None
    assert "float32" in StackedExperts.fp8_unsupported(fp8, torch.float32, "cuda")
    monkeypatch.setenv("WRITESCOPE_FP8_DEVICE_EXPERTS", "1")
    assert StackedExperts.fp8_unsupported(fp8, torch.bfloat16, "cpu") is None
    monkeypatch.setenv("WRITESCOPE_FP8_DEVICE_EXPERTS", "0")
    llm = engine(tiny_qwen3_moe_fp8, experts="gpu", dtype="bfloat16")
    held = llm.engine.model.device_experts()
    assert held and all(x.fp8 is None and x.gate_up.dtype == torch.bfloat16 for x in held)
    assert len(llm.generate([[5, 6, 7]], GREEDY)[0].token_ids) == NEW


def test_random_weights_with_an_fp8_config_on_the_device(fp8_on_any_device):
    """Benchmarks: random weights with an FP8 quantization_config put FP8 experts on the device,
    every block scaled as the CPU's random FP8 experts are, the values a bounded normal draw."""
    llm = random_fp8_llm("gpu")
    held = llm.engine.model.device_experts()
    assert held and all(x.fp8 == Fp8Blocks() for x in held)
    std = 0.02
    for x in held:
        assert torch.all(x.gate_up_scale == Fp8Blocks.random_scale(std))
        gu, dn = x.weights(5)
        assert 0.8 * std < gu.float().std().item() < 1.2 * std
        assert gu.float().abs().max().item() <= 3.47 * std
    again = random_fp8_llm("gpu").engine.model.device_experts()
    assert all(torch.equal(a.down, b.down) for a, b in zip(held, again))
    out = llm.generate([[5, 6, 7, 8]], GREEDY)[0]
    assert len(out.token_ids) == NEW


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", ["0", "1"])
def test_fp8_device_experts_on_cuda_follow_the_dequantized_checkpoint(tiny_qwen3_moe_fp8, tmp_path,
                                                                      monkeypatch, graphs):
    """On CUDA the decode steps take the fused FP8 kernels (eager and in CUDA graphs): the same
    greedy tokens as the checkpoint dequantized offline, log-probabilities within bf16's
    rounding of a different summation order."""
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", graphs)
    plain = dequantized_copy(tiny_qwen3_moe_fp8, tmp_path / "dequantized")
    opts = dict(dtype="bfloat16", device="cuda", experts="gpu", kv_policy="static",
                cpu_share=0.5, num_gpu_blocks=3)
    a, b = engine(tiny_qwen3_moe_fp8, **opts), engine(plain, **opts)
    assert all(x.fp8 is not None and x.gate_up.is_cuda for x in a.engine.model.device_experts())
    ids = prompt_ids(a.engine.config.vocab_size)
    (x,), (y,) = a.generate([ids], GREEDY), b.generate([ids], GREEDY)
    assert x.token_ids == y.token_ids
    assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 0.05


def test_the_peer_gets_the_device_experts_dequantized(tiny_qwen3_moe_fp8, fp8_on_any_device):
    """``writescope bench --peer transformers`` hands transformers the engine's weights: FP8
    device experts as their bf16(q * scale) stacks, no scale tensors."""
    from writescope.bench.peers import engine_state_dict
    llm = engine(tiny_qwen3_moe_fp8, experts="gpu", dtype="bfloat16")
    sd = engine_state_dict(llm.engine.model)
    assert not any(n.endswith("_scale") for n in sd)
    for i, moe in llm.engine.model.moe_blocks():
        gu = sd[f"model.layers.{i}.mlp.experts.gate_up_proj"]
        dn = sd[f"model.layers.{i}.mlp.experts.down_proj"]
        want = moe.experts.dequantized(0, moe.experts.gate_up.shape[0])
        assert gu.dtype == torch.bfloat16 and torch.equal(gu, want[0]) and torch.equal(dn, want[1])
