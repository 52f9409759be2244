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


PREFETCH = r"""
import torch
from writescope.layers import gemv as G
torch.manual_seed(1)
dev = DEVICE
# (rows, outputs, inputs, dtype, tile): one share, shares that the input size does not fill,
# outputs that no block divides, the default tile at an o_proj-like shape
for m, n, k, dt, tile in ((2, 40, 96, torch.bfloat16, (16, 64)),
                          (3, 37, 300, torch.float32, (16, 64)),
                          (1, 64, 1000, torch.bfloat16, (16, 128)),
                          (16, 20, 130, torch.float16, (8, 32)),
                          (2, 64, 2048, torch.bfloat16, (G.PREFETCH_BLOCK_N, G.PREFETCH_BLOCK_K))):
    x = torch.randn(m, k).to(dev, dt)
    w = (torch.randn(n, k) * 0.05).to(dev, dt)
    want = x.double() @ w.double().t()
    for _ in range(2):  # the second launch finds the ticket counters zeroed by the first
        got = G.gemv_prefetch(x, w, *tile)
        assert got.dtype == dt and got.shape == (m, n)
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < (1e-6 if dt == torch.float32 else 1e-2), (m, n, k, dt, tile, err)
    assert int(G._COUNTERS[torch.device(dev)].abs().sum()) == 0
    assert torch.equal(got, G.gemv_prefetch(x, w, *tile))  # shares added in order: same bits
assert G.gemv_prefetch(torch.zeros(0, 8, device=dev), torch.zeros(4, 8, device=dev)).shape == (0, 4)
print("ok")
"""


def test_gemv_prefetch_under_the_interpreter():
    pytest.importorskip("triton")
    r = run_interpreted(PREFETCH.replace("DEVICE", '"cpu"'))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


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
    for choice in ("triton", "prefetch"):
        monkeypatch.setenv("WRITESCOPE_GEMV", choice)
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
def test_gemv_prefetch_on_cuda(monkeypatch):
    """The prefetching form on CUDA (launched dependent on the kernel before where the GPU has
    it), also replayed from a CUDA graph after a kernel that writes its input, and chosen by
    ``linear`` under WRITESCOPE_GEMV=prefetch."""
    exec(PREFETCH.replace("DEVICE", '"cuda"'), {})
    from writescope.layers import gemv
    x0 = torch.randn(2, 4096, device="cuda").bfloat16()
    w = (torch.randn(2048, 4096, device="cuda") * 0.02).bfloat16()
    want = x0.double() * 2 @ w.double().t()
    x = torch.empty_like(x0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.copy_(x0 * 2)
        gemv.gemv_prefetch(x, w)  # compiled and its counters allocated before the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.mul(x0, 2, out=x)  # the kernel before: writes the rows the GEMV reads
        out = gemv.gemv_prefetch(x, w)
    x.zero_()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    err = ((out.double() - want).norm() / want.norm()).item()
    assert err < 1e-2, err
    monkeypatch.setenv("WRITESCOPE_GEMV", "prefetch")
    calls, real = [], gemv.gemv_prefetch
    monkeypatch.setattr(gemv, "gemv_prefetch", lambda *a: calls.append(1) or real(*a))
    assert torch.equal(gemv.linear(x, w), real(x, w)) and calls


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
