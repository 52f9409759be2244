"""The fused decode-step MoE kernels (writescope/layers/moe_triton.py) against the expert-by-expert
computation: under Triton's CPU interpreter here, on CUDA (marked gpu) on the GPU machine."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from test_parity import GREEDY, PLACEMENTS, engine, generate_checked, prompt_ids

CHECK = r"""
import torch
from writescope.layers.moe_triton import fused_experts
from writescope.layers.moe import run_experts
g = torch.Generator().manual_seed(0)
dev = "cuda" if torch.cuda.is_available() and not __import__("os").environ.get("TRITON_INTERPRET") else "cpu"
for E, H, I, n, k, dt in ((6, 40, 24, 3, 2, torch.float32), (8, 64, 48, 1, 3, torch.float32),
                          (4, 130, 70, 5, 2, torch.float32), (8, 64, 32, 4, 2, torch.bfloat16)):
    gu = (torch.randn(E, 2 * I, H, generator=g) * 0.2).to(dev, dt)
    dn = (torch.randn(E, H, I, generator=g) * 0.2).to(dev, dt)
    x = torch.randn(n, H, generator=g).to(dev, dt)
    idx = torch.rand(n, E, generator=g).topk(k, dim=-1).indices.to(dev)
    w = torch.rand(n, k, generator=g).softmax(-1).to(dev)
    ref = run_experts(x.double(), idx, w.double(), lambda e: (gu[e].double(), dn[e].double()))
    got = fused_experts(x, idx, w, gu, dn)
    assert got.dtype == x.dtype and got.shape == x.shape
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < (1e-5 if dt == torch.float32 else 1e-2), (E, H, I, n, k, dt, err)
    # other launch settings (the bench's sweep): blocks that do not divide the sizes
    got = fused_experts(x, idx, w, gu, dn, config={"gate_up_rows": 8, "gate_up_block_h": 32,
                                                   "down_rows": 4, "down_block_i": 16})
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < (1e-5 if dt == torch.float32 else 1e-2), (E, H, I, n, k, dt, err, "config")
    # int32 ids (the router's compact output) read as the int64 ones
    assert torch.equal(fused_experts(x, idx.int(), w, gu, dn), fused_experts(x, idx, w, gu, dn))
empty = fused_experts(x[:0], idx[:0], w[:0], gu, dn)
assert empty.shape == (0, x.shape[1])
print("ok")
"""


def test_fused_experts_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True,
                       timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_experts_on_cuda():
    pytest.importorskip("triton")
    exec(compile(CHECK, "fused_check", "exec"), {})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_with_fused_moe_matches_transformers(all_tiny, monkeypatch):
    monkeypatch.setenv("WRITESCOPE_FUSED_MOE", "1")
    generate_checked(all_tiny, device="cuda", experts="gpu", **PLACEMENTS["mixed"])
    prompts = [prompt_ids(320, n, seed=n) for n in (3, 70)]
    a = engine(all_tiny, device="cuda", experts="gpu", **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_FUSED_MOE", "0")
    b = engine(all_tiny, device="cuda", experts="gpu", **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_moe_block_reads_the_compact_router_output(tiny_qwen3_moe, monkeypatch):
    """On CUDA the MoE block asks its router for float32 weights and int32 ids (no casts before
    the fused experts): the same output, to the bit, as from the router's usual output."""
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    cfg = ModelConfig.from_hf(tiny_qwen3_moe)
    model = build_model(cfg, dtype=torch.bfloat16, device="cuda", checkpoint=tiny_qwen3_moe)
    moe = model.moe_blocks()[0][1]
    x = torch.randn(3, cfg.hidden_size, device="cuda").bfloat16()
    real, calls = moe.gate.forward, []
    monkeypatch.setattr(moe.gate, "forward",
                        lambda h, compact=False: calls.append(compact) or real(h, compact))
    out = moe(x)
    assert calls == [True]
    w, i = real(x)
    assert w.dtype == torch.bfloat16 and i.dtype == torch.long
    assert torch.equal(out, moe.experts(x, i, w))


def test_programs_fill_the_gpu():
    """Few routed pairs: narrower gate/up and down programs, so that a launch has >=
    TARGET_PROGRAMS."""
    from writescope.layers.moe_triton import gate_up_rows
    assert gate_up_rows(16, 768) == 8       # Qwen3-30B-A3B, 2 tokens x 8 experts: 1536 programs
    assert gate_up_rows(24, 1408) == 8      # DeepSeek-V2-Lite, 4 x 6: 24 x 176
    assert gate_up_rows(4, 14336) == 8      # Mixtral, 2 x 2
    from writescope.layers.moe_triton import down_rows
    assert down_rows(2, 2048, 8) == 8       # Qwen3-30B-A3B, 2 tokens: 2 x 256 = 512 programs
    assert down_rows(16, 2048, 8) == 16     # 8 experts a load: at most 128 rows a tile
    assert down_rows(16, 2048, 1) == 32     # 16 x 64 = 1024 already at 32 outputs
    assert down_rows(128, 4096, 2) == 64
    assert down_rows(1, 24, 8) == 8         # never below 8 outputs


def test_launch_settings_from_the_environment(monkeypatch):
    """WRITESCOPE_MOE_LAUNCH sets the kernels' launch settings (the engine's steps with others);
    what is not a JSON object of those settings, powers of two (and an FP8 conversion mode), is
    refused by name."""
    from writescope.layers import moe_triton
    monkeypatch.delenv("WRITESCOPE_MOE_LAUNCH", raising=False)
    assert moe_triton.launch_overrides() == {}
    monkeypatch.setenv("WRITESCOPE_MOE_LAUNCH", '{"gate_up_rows": 16, "down_warps": 8}')
    assert moe_triton.launch_overrides() == {"gate_up_rows": 16, "down_warps": 8}
    monkeypatch.setenv("WRITESCOPE_MOE_LAUNCH", '{"fp8_convert": 9, "down_warps": 8}')
    assert moe_triton.launch_overrides() == {"fp8_convert": 9, "down_warps": 8}
    for bad in ('{"gate_up_rows": 12}', '{"rows": 8}', '[8]', 'rows=8', '{"down_warps": "8"}',
                '{"down_warps": true}', '{"fp8_convert": 4}', '{"fp8_convert": "9"}',
                '{"fp8_convert": true}', '{"fp8_convert": 9.0}'):
        monkeypatch.setenv("WRITESCOPE_MOE_LAUNCH", bad)
        with pytest.raises(ValueError, match="WRITESCOPE_MOE_LAUNCH"):
            moe_triton.launch_overrides()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_experts_bench_runs(tmp_path):
    """`python -m writescope.bench.gpu_experts` on one model and one batch size: its JSON has
    the default setting's time and GB/s and an error within bf16's reach of the float32
    expert-by-expert path."""
    import json

    from writescope.bench.gpu_experts import main
    out = tmp_path / "experts.json"
    assert main(["--models", "qwen3-30b-a3b", "--tokens", "2", "--layers", "2", "--reps", "3",
                 "--no-torch", "--weights", "bf16,fp8", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    bf, fp = res["results"]
    assert (bf["weights"], fp["weights"]) == ("bf16", "fp8")
    per = [r["layer_bytes"] / r["distinct_experts"] for r in (bf, fp)]  # an expert's bytes
    assert per[1] == pytest.approx(per[0] / 2 * (1 + 4 / 128 ** 2))
    for r in (bf, fp):
        assert r["default"]["us"] > 0 and 0 < r["default"]["gbps"] < 2 * res["hbm_copy_gbps"]
        assert r["default"]["rel_err"] < 1e-2
        assert r["variants"] == [] and r["best"] == r["default"]
