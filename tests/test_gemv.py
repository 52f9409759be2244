"""The decode-sized linear kernel (writescope/layers/gemv.py) against a float64 product: under
Triton's CPU interpreter here, on CUDA (marked gpu) on the GPU machine; ``linear``'s dispatch."""
from __future__ import annotations

import pytest
import torch
from triton_interp import run_interpreted

CASES = r"""
import torch
from writescope.layers.gemv import gemv, default_config
torch.manual_seed(0)
dev = DEVICE
# (rows, outputs, inputs, dtype, config): q/k/v-like, o_proj-like with K split, a router,
# DeepSeek's float32 router, sizes that no block divides
for m, n, k, dt, cfg in ((2, 320, 256, torch.bfloat16, None),
                         (4, 64, 1024, torch.bfloat16, {"split_k": 4, "block_k": 128}),
                         (1, 48, 96, torch.bfloat16, {"block_n": 16, "block_k": 64}),
                         (3, 40, 200, torch.float32, None),
                         (16, 33, 130, torch.float32, {"split_k": 2, "block_k": 64}),
                         (5, 100, 300, torch.float16, {"split_k": 3, "block_k": 32})):
    x = torch.randn(m, k).to(dev, dt)
    w = (torch.randn(n, k) * 0.05).to(dev, dt)
    want = x.double() @ w.double().t()
    got = gemv(x, w, cfg)
    assert got.dtype == dt and got.shape == (m, n)
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err < (1e-6 if dt == torch.float32 else 1e-2), (m, n, k, dt, cfg, err)
assert gemv(torch.zeros(0, 8, device=dev), torch.zeros(4, 8, device=dev)).shape == (0, 4)
# the sweep's choices: o_proj-like split four ways, 64 outputs a program; a router narrower
assert default_config(2, 2048, 4096)["split_k"] == 4 and default_config(2, 2048, 4096)["block_n"] == 64
assert default_config(2, 5120, 2048)["split_k"] == 1
assert default_config(2, 128, 2048)["block_n"] == 16
print("ok")
"""


def test_gemv_under_the_interpreter():
    pytest.importorskip("triton")
    r = run_interpreted(CASES.replace("DEVICE", '"cpu"'))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_linear_is_f_linear_unless_chosen(monkeypatch):
    """``linear`` is ``F.linear`` off CUDA and by default; WRITESCOPE_GEMV=triton is opt-in."""
    from writescope.layers import gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a: pytest.fail("gemv off CUDA"))
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    assert torch.equal(gemv.linear(x, w), torch.nn.functional.linear(x, w))
    monkeypatch.setenv("WRITESCOPE_GEMV", "triton")
    assert torch.equal(gemv.linear(x, w), torch.nn.functional.linear(x, w))
    monkeypatch.delenv("WRITESCOPE_GEMV")
    assert not gemv.enabled()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gemv_on_cuda(monkeypatch):
    exec(CASES.replace("DEVICE", '"cuda"'), {})
    from writescope.layers import gemv
    x = torch.randn(2, 256, device="cuda").bfloat16()
    w = torch.randn(64, 256, device="cuda").bfloat16()
    monkeypatch.setenv("WRITESCOPE_GEMV", "triton")
    calls, real = [], gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a: calls.append(1) or real(*a))
    gemv.linear(x, w)
    assert calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_gemv_bench_runs(tmp_path):
    """`python -m writescope.bench.gpu_gemv` on one model and one row count: its JSON has
    cuBLAS's and the kernel's GB/s for each projection, within bf16 rounding of float64."""
    import json

    from writescope.bench.gpu_gemv import main
    out = tmp_path / "g.json"
    assert main(["--models", "qwen3-30b-a3b", "--rows", "2", "--layers", "2", "--reps", "3",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert {r["what"] for r in res} == {"qkv", "o_proj", "router"}
    for r in res:
        assert r["cublas"]["gbps"] > 0 and r["triton"]["gbps"] > 0
        assert r["triton"]["rel_err"] < 1e-2


def test_engine_projections_take_linear(tiny_qwen3_moe, monkeypatch):
    """With WRITESCOPE_GEMV=triton the decode layer's projections go through ``gemv.linear``
    (the CPU keeps F.linear inside it): the same tokens as without."""
    from test_parity import GREEDY, PLACEMENTS, engine, prompt_ids
    from writescope.layers import gemv
    prompts = [prompt_ids(320, 9, seed=1)]
    want = engine(tiny_qwen3_moe, **PLACEMENTS["all-G"]).generate(prompts, GREEDY)
    calls, real = [], gemv.linear
    monkeypatch.setattr(gemv, "linear", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setenv("WRITESCOPE_GEMV", "triton")
    got = engine(tiny_qwen3_moe, **PLACEMENTS["all-G"]).generate(prompts, GREEDY)
    assert calls and got[0].token_ids == want[0].token_ids
