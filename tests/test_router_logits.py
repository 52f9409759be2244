"""The router's logits and routing in one launch (``routing.router_fused``) against the torch
form (``F.linear``, softmax, top-k), and the fused experts' ``add`` (DeepSeek's shared experts'
output summed in their down kernel) against ``fused_experts(...) + add``: under Triton's CPU
interpreter here, on CUDA (marked gpu) as the engine runs them."""
from __future__ import annotations

import pytest
import torch
from triton_interp import run_interpreted

# the families' routers with a small hidden size: (reference config, hidden size, overrides)
ROUTER_CASES = r"""
import json
import os
import torch
from writescope.layers import routing
from writescope.layers.moe import Router
from writescope.models.config import REFERENCE_DIR, ModelConfig
torch.manual_seed(0)
dev = DEVICE
res = {}


def torch_form(r, x):
    old = os.environ.get("WRITESCOPE_FUSED_ROUTER")
    os.environ["WRITESCOPE_FUSED_ROUTER"] = "0"
    try:
        return r(x)
    finally:
        if old is None:
            del os.environ["WRITESCOPE_FUSED_ROUTER"]
        else:
            os.environ["WRITESCOPE_FUSED_ROUTER"] = old


def check(r, x, got, want):
    # the same experts (DeepSeek's torch form lists them in any order) unless the k-th and
    # (k+1)-th logits lie within the logits' error (1.5 units: the interpreter truncates, torch
    # rounds), each expert's weight within that error's reach
    (w, i), (ww, wi) = got, want
    k, n = r.cfg.num_experts_per_tok, x.shape[0]
    assert w.shape == i.shape == ww.shape == (n, k) and w.dtype == ww.dtype, (w.dtype, ww.dtype)
    assert i.dtype == wi.dtype and all(len(set(row)) == k for row in i.tolist())
    exact = (x.double() @ r.weight.double().t()).cpu()
    unit = 2.0 ** -7 if r.weight.dtype == torch.bfloat16 else 2.0 ** -22
    err = 1.5 * unit * exact.abs().max().item()
    top = exact.topk(k + 1, dim=-1).values
    clear = (top[:, k - 1] - top[:, k]) > 2 * err
    gi, si = i.sort(dim=-1)
    wi_s, ws_i = wi.sort(dim=-1)
    same = (gi == wi_s).all(-1).cpu()
    assert same[clear].all(), (r.cfg.model_type, n, i, wi)
    assert (exact.gather(1, i.cpu()) >= top[:, k - 1:k] - 2 * err).all()  # a top-k within it
    a = w.gather(1, si).double()[same]
    b = ww.gather(1, ws_i).double()[same]
    rel = ((a - b).abs() / b.abs()).max().item()
    bound = 4 * err + (2.0 ** -7 if w.dtype == torch.bfloat16 else 1e-5)
    assert rel <= bound, (r.cfg.model_type, n, rel, bound)
    res[(r.cfg.model_type, r.cfg.routed_scaling_factor, n)] = (
        torch.equal(i, wi), torch.equal(a, b), rel, bound, int(same.sum()))


for name, hid, over in (("qwen3-30b-a3b", 512, {}), ("mixtral-8x7b", 1024, {}),
                        ("deepseek-v2-lite", 256, {"routed_scaling_factor": 2.5}),
                        ("deepseek-v2-lite", 320, {"routed_scaling_factor": 16.0})):
    d = json.loads((REFERENCE_DIR / f"{name}.json").read_text())
    d.update(hidden_size=hid, **over)
    r = Router(ModelConfig.from_hf(d))
    with torch.no_grad():
        r.weight.normal_(0, 0.02)
    r = r.to(dev) if r.fp32 else r.to(dev, torch.bfloat16)
    cfg, k = r.cfg, r.cfg.num_experts_per_tok
    deepseek = cfg.model_type == "deepseek_v2"
    # what Router.forward passes on CUDA (where the tests below go through it)
    how = dict(k=k, renorm=cfg.norm_topk_prob, eps=0.0,
               scale=cfg.routed_scaling_factor if deepseek else 1.0,
               out_dtype=torch.bfloat16 if cfg.model_type == "qwen3_moe" else torch.float32,
               logits_dtype=r.weight.dtype)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    for n in (1, 2, 4, 7):
        x = torch.randn(n, hid + 8).to(dev, torch.bfloat16)[:, 8:]  # rows of a wider tensor
        got = routing.router_fused(x, r.weight, counter, **how)
        assert counter.item() == 0  # left zero for the next launch
        again = routing.router_fused(x, r.weight, counter, **how)
        assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1])
        check(r, x, got, torch_form(r, x))
        # compact (what the fused experts read): the same values as float32, int32 ids
        wc, ic = routing.router_fused(x, r.weight, counter, **dict(
            how, out_dtype=torch.float32, ids_dtype=torch.int32, round_to=how["out_dtype"]))
        assert torch.equal(wc, got[0].float()) and torch.equal(ic, got[1].int())
    # other launch settings: 16 experts a program (Mixtral: 8 of them masked), one block of
    # the hidden size (masked where it is not a power of two)
    x = torch.randn(5, hid).to(dev, torch.bfloat16)
    base = routing.router_fused(x, r.weight, counter, **how)
    for config in ({"experts": 16, "block_h": 64}, {"experts": 1, "block_h": 512}):
        other = routing.router_fused(x, r.weight, counter, config=config, **how)
        assert torch.equal(other[1], base[1]) and counter.item() == 0, config
w, i = routing.router_fused(torch.zeros(0, 64, device=dev), torch.zeros(8, 64, device=dev),
                            counter, 2, True)
assert w.shape == i.shape == (0, 2)
print(res)
print("ok")
"""

ADD_CASES = r"""
import torch
from writescope.layers.moe_triton import fused_experts
g = torch.Generator().manual_seed(0)
dev = DEVICE
res = {}
for E, H, I, n, k, dt in ((6, 40, 24, 3, 2, torch.float32), (8, 64, 48, 4, 6, torch.bfloat16),
                          (4, 130, 70, 1, 2, torch.bfloat16)):
    gu = (torch.randn(E, 2 * I, H, generator=g) * 0.2).to(dev, dt)
    dn = (torch.randn(E, H, I, generator=g) * 0.2).to(dev, dt)
    x = torch.randn(n, H, generator=g).to(dev, dt)
    idx = torch.rand(n, E, generator=g).topk(k, dim=-1).indices.to(dev)
    w = torch.rand(n, k, generator=g).softmax(-1).to(dev)
    add = torch.randn(n, H, generator=g).to(dev, dt)
    want = fused_experts(x, idx, w, gu, dn) + add
    got = fused_experts(x, idx, w, gu, dn, add=add)
    assert got.dtype == dt and got.shape == want.shape
    # the sum rounded once more in the kernel (the interpreter truncates where torch rounds)
    unit = 2.0 ** -7 if dt == torch.bfloat16 else 0.0
    diff = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1e-30)).max()
    assert diff.item() <= unit, (E, H, I, n, k, dt, diff.item())
    res[(E, H, n, k, str(dt))] = torch.equal(got, want)
    if dt == torch.float32:
        assert torch.equal(got, want)
print(res)
print("ok")
"""


@pytest.mark.parametrize("cases", [ROUTER_CASES, ADD_CASES], ids=["router", "experts_add"])
def test_under_the_interpreter(cases):
    pytest.importorskip("triton")
    r = run_interpreted(cases.replace("DEVICE", '"cpu"'))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def _config(name: str, hidden: int = 256, **over):
    import json

    from writescope.models.config import REFERENCE_DIR, ModelConfig
    d = json.loads((REFERENCE_DIR / f"{name}.json").read_text())
    d.update(hidden_size=hidden, **over)
    return ModelConfig.from_hf(d)


def test_cpu_router_never_launches_a_kernel(monkeypatch):
    from writescope.layers import routing
    from writescope.layers.moe import Router
    monkeypatch.setattr(routing, "router_fused", lambda *a, **k: pytest.fail("fused off CUDA"))
    monkeypatch.setattr(routing, "route_fused", lambda *a, **k: pytest.fail("fused off CUDA"))
    for name in ("qwen3-30b-a3b", "deepseek-v2-lite"):
        r = Router(_config(name))
        with torch.no_grad():
            r.weight.normal_()
        w, i = r(torch.randn(3, 256))
        assert w.shape == i.shape == (3, r.cfg.num_experts_per_tok)
        assert not r._counters


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_forms_on_cuda():
    """On the GPU the logits are rounded as F.linear rounds them (another summation order may
    move one by a unit); the fused experts' add is ``fused_experts(...) + add`` to the bit."""
    ns: dict = {}
    exec(ROUTER_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    ns = {}
    exec(ADD_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    assert all(ns["res"].values()), ns["res"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite"])
def test_router_on_cuda(name, monkeypatch):
    """Router.forward takes the one launch for decode-sized steps: the torch form's experts
    (no near-ties at these sizes) and weights; replayed from a CUDA graph, the same twice;
    WRITESCOPE_FUSED_ROUTER_LOGITS=0 (or more tokens) keeps the logits' GEMM."""
    from writescope.layers import routing
    from writescope.layers.moe import Router
    torch.manual_seed(0)
    r = Router(_config(name, 2048))
    with torch.no_grad():
        r.weight.normal_(0, 0.02)
    r = r.cuda() if r.fp32 else r.to("cuda", torch.bfloat16)
    x = torch.randn(4, 2048, device="cuda").bfloat16()
    calls = []
    real = routing.router_fused
    monkeypatch.setattr(routing, "router_fused", lambda *a, **k: calls.append(1) or real(*a, **k))
    for compact in (False, True):
        w, i = r(x, compact)
        monkeypatch.setenv("WRITESCOPE_FUSED_ROUTER", "0")
        ww, wi = r(x)
        monkeypatch.delenv("WRITESCOPE_FUSED_ROUTER")
        assert torch.equal(i.sort(-1).values.long(), wi.sort(-1).values)
        a, b = w.gather(1, i.argsort(-1)).double(), ww.gather(1, wi.argsort(-1)).double()
        rel = ((a - b).abs() / b.abs()).max().item()  # each expert's weight
        assert rel <= 2.0 ** -6, (compact, rel)
    assert len(calls) == 2
    # a CUDA graph's replays: the same routing, the counter left zero
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        r(x, True)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gw, gi = r(x, True)
    outs = []
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        outs.append((gw.clone(), gi.clone()))
    (counter,) = r._counters.values()
    assert counter.item() == 0
    w, i = r(x, True)
    for ow, oi in outs:
        assert torch.equal(ow, w) and torch.equal(oi, i)
    # off: the switch, more tokens than MAX_TOKENS
    calls.clear()
    monkeypatch.setenv("WRITESCOPE_FUSED_ROUTER_LOGITS", "0")
    assert not routing.logits_enabled()
    r(x)
    monkeypatch.delenv("WRITESCOPE_FUSED_ROUTER_LOGITS")
    r(torch.randn(routing.MAX_TOKENS + 1, 2048, device="cuda").bfloat16())
    assert not calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_moe_block_adds_the_shared_experts_in_the_down_kernel(tiny_deepseek_v2, monkeypatch):
    """DeepSeek's MoE block hands its shared experts' output to the fused experts: the bits of
    the routed experts' output plus the shared experts'."""
    from writescope.layers import moe_triton
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    cfg = ModelConfig.from_hf(tiny_deepseek_v2)
    model = build_model(cfg, dtype=torch.bfloat16, device="cuda", checkpoint=tiny_deepseek_v2)
    moe = model.moe_blocks()[0][1]
    assert moe.shared_experts is not None
    x = torch.randn(3, cfg.hidden_size, device="cuda").bfloat16()
    real, adds = moe_triton.fused_experts, []
    monkeypatch.setattr(moe_triton, "fused_experts",
                        lambda *a, add=None, **k: adds.append(add) or real(*a, add=add, **k))
    out = moe(x)
    assert len(adds) == 1 and adds[0] is not None
    w, i = moe.gate(x, compact=True)
    assert torch.equal(out, real(x, i, w, moe.experts.gate_up, moe.experts.down)
                       + moe.shared_experts(x))
