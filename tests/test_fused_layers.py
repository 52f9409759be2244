"""The layers' fused forms against their torch forms: RMSNorm (layers/norm.py), the rotations
(layers/rotary.py), the router (layers/routing.py) and GQA's one q/k/v GEMM (models/gqa.py); the
Triton kernels on the CPU through Triton's interpreter, on CUDA as the engine runs them."""
from __future__ import annotations

import pytest
import torch
from triton_interp import run_interpreted

NORM_CASES = r"""
import torch
from writescope.layers.norm import RMSNorm, rms_norm_fused
torch.manual_seed(0)
ULP = 2.0 ** -7  # one bf16 unit in the last place, relative
dev = DEVICE
worst = {}
for d in (128, 512, 2048, 4096, 7168):
    for dt, wdt in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                    (torch.bfloat16, torch.float32)):
        m = RMSNorm(d, 1e-6)
        with torch.no_grad():
            m.weight.copy_(torch.randn(d) * 0.1 + 1)
        m = m.to(dev, wdt)
        x = (torch.randn(3, 5, d) * 3).to(dev, dt)
        dt_, h = x.dtype, x.float()  # the torch form, whatever the device's dispatch
        want = m.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + m.eps)).to(dt_)
        got = rms_norm_fused(x, m.weight, m.eps)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
        rel = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1e-30))
        if dt == torch.float32:
            assert rel.max().item() < 1e-5, (d, dt, wdt, rel.max().item())
        else:  # one rounding to bf16 on the way (the interpreter truncates: up to one unit)
            assert rel.max().item() <= 2.01 * ULP, (d, dt, wdt, rel.max().item())
        worst[(d, str(dt), str(wdt))] = ((got != want).float().mean().item(), rel.max().item())
    x = torch.randn(4, d + 64, device=dev)[:, :d]  # rows of a wider tensor
    m = RMSNorm(d).to(dev)
    assert torch.allclose(rms_norm_fused(x, m.weight, m.eps), m.weight * (x * torch.rsqrt(
        x.pow(2).mean(-1, keepdim=True) + m.eps)), rtol=1e-5, atol=1e-6)
assert rms_norm_fused(torch.zeros(0, 64, device=dev), torch.ones(64, device=dev), 1e-6).shape == (0, 64)
# the heads of a fused projection's output: [tokens, heads, d] read through its strides
y = torch.randn(3, 40 * 16, device=dev).bfloat16()
heads = y.view(3, 40, 16)[:, 32:36]
m = RMSNorm(16).to(dev)
h = heads.float()
want = m.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + m.eps)).bfloat16()
got = rms_norm_fused(heads, m.weight, m.eps)
assert got.shape == (3, 4, 16) and (got.float() - want.float()).abs().max().item() <= 2 ** -6
# the residual's add and the norm of the sum in one launch: the sum as torch's add rounds it
# (the interpreter truncates: within one unit), the norm as rms_norm_fused's of that sum
from writescope.layers.norm import add_rms_norm_fused
same = {}
for d, dt in ((2048, torch.bfloat16), (4096, torch.bfloat16), (7168, torch.float32), (96, torch.float32)):
    m = RMSNorm(d, 1e-6)
    with torch.no_grad():
        m.weight.copy_(torch.randn(d) * 0.1 + 1)
    m = m.to(dev, dt)
    x, dx = (torch.randn(5, d) * 3).to(dev, dt), torch.randn(5, d).to(dev, dt)
    s, h = add_rms_norm_fused(x, dx, m.weight, m.eps)
    assert s.dtype == dt and h.dtype == dt and s.shape == h.shape == (5, d)
    ref = x + dx
    rel = ((s.double() - ref.double()).abs() / ref.double().abs().clamp_min(1e-30)).max().item()
    assert rel <= (1e-7 if dt == torch.float32 else 1.01 * ULP), (d, dt, rel)
    h2 = rms_norm_fused(s, m.weight, m.eps)
    assert (h.double() - h2.double()).abs().max().item() <= 1.01 * ULP * h2.double().abs().max().item()
    same[(d, str(dt))] = (torch.equal(s, ref), torch.equal(h, h2))
    # RMSNorm.add_forward: no residual yet gives x and its norm
    x0, h0 = m.add_forward(x, None)
    assert x0 is x and torch.equal(h0, m(x))
s, h = add_rms_norm_fused(torch.zeros(0, 64, device=dev), torch.zeros(0, 64, device=dev), torch.ones(64, device=dev), 1e-6)
assert s.shape == h.shape == (0, 64)
print(worst)
print(same)
print("ok")
"""

# each case is a snippet run under the interpreter (DEVICE "cpu") or on CUDA: the seed, the
# device and a dict of results, then its checks, then "ok"
PRELUDE = """
import torch
torch.manual_seed(0)
dev = DEVICE
res = {}
"""

ROPE_CASES = PRELUDE + r"""
from writescope.layers.rotary import Rotary, apply_rotary, rotate_half_fused, rotate_pairs_fused


def check(key, got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
    res[key] = (torch.equal(got, want), err)
    assert err < (1e-6 if want.dtype == torch.float32 else 2e-2), (key, err)


for d, heads in ((128, 32), (128, 4), (64, 8), (96, 2)):
    rot = Rotary(d, 1e6, None).to(dev)
    pos = torch.tensor([0, 5, 4095, 131071], device=dev)
    cos, sin = rot.cos_sin(pos)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        if heads <= 4:  # a strided view
            x = (torch.randn(4, heads, 2 * d, device=dev) * 2).to(dt)[..., ::2]
        else:  # heads of a wider row (a fused projection's output): strided tokens and heads
            x = (torch.randn(4, heads + 3, d, device=dev) * 2).to(dt)[:, 1:1 + heads]
        c2 = torch.cat((cos.unsqueeze(1),) * 2, -1).to(dt)
        s2 = torch.cat((sin.unsqueeze(1),) * 2, -1).to(dt)
        want = x * c2 + torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1) * s2
        check((d, heads, str(dt)), rotate_half_fused(x, cos, sin), want)
        # the interleaved pairs (DeepSeek-V2): float32 arithmetic, one rounding
        xf = x.float().unflatten(-1, (-1, 2))
        a, b = xf[..., 0], xf[..., 1]
        c1, s1 = cos.unsqueeze(1), sin.unsqueeze(1)
        want = torch.stack((a * c1 - b * s1, a * s1 + b * c1), dim=-1).flatten(-2).to(dt)
        check((d, heads, str(dt), "pairs"), rotate_pairs_fused(x, cos, sin), want)
print(res)
print("ok")
"""

ROUTER_CASES = PRELUDE + r"""
from writescope.layers.routing import route_fused
# (experts, k, renormalise, eps, scale, logits dtype, weights dtype): Qwen3, Mixtral,
# DeepSeek-V2-Lite, a DeepSeek that renormalises and scales, top-1, a count not a power of two
for e, k, renorm, eps, scale, ldt, wdt in (
        (128, 8, True, 0.0, 1.0, torch.bfloat16, torch.bfloat16),
        (8, 2, True, 0.0, 1.0, torch.bfloat16, torch.float32),
        (64, 6, False, 1e-20, 1.0, torch.float32, torch.float32),
        (160, 6, True, 1e-20, 16.0, torch.float32, torch.float32),
        (16, 1, True, 0.0, 1.0, torch.float32, torch.float32),
        (60, 4, False, 0.0, 2.5, torch.float32, torch.float32)):
    logits = (torch.randn(7, e + 3) * 3).to(dev, ldt)[:, 1:1 + e]  # rows of a wider tensor
    p = logits.softmax(dim=-1, dtype=torch.float32)
    want_w, want_i = torch.topk(p, k, dim=-1, sorted=True)
    top = want_w
    if renorm:
        want_w = want_w / (want_w.sum(-1, keepdim=True) + eps)
    want_w = (want_w * scale).to(wdt)
    w, i = route_fused(logits, k, renorm, eps, scale, wdt)
    assert i.dtype == torch.long and w.dtype == wdt and w.shape == (7, k)
    # the k largest in descending order (bf16 logits tie: either of two equal ones will do)
    assert torch.equal(p.gather(1, i), top), (e, k, i, want_i)
    assert all(len(set(r)) == k for r in i.tolist())
    err = ((w.double() - want_w.double()).abs() / want_w.double().abs()).max().item()
    assert err <= (1e-5 if wdt == torch.float32 else 2.0 ** -7), (e, k, err)
    res[(e, k, str(wdt))] = (torch.equal(w, want_w), err)
    # compact (what the fused experts read): the same values as float32, int32 ids
    wc, ic = route_fused(logits, k, renorm, eps, scale, torch.float32, torch.int32, wdt)
    assert wc.dtype == torch.float32 and ic.dtype == torch.int32
    assert torch.equal(wc, w.float()) and torch.equal(ic, i.int()), (e, k)
w, i = route_fused(torch.zeros(0, 8, device=dev), 2, True)
assert w.shape == (0, 2) and i.shape == (0, 2)
print(res)
print("ok")
"""


HEADS_CASES = PRELUDE + r"""
from writescope.layers.attn_heads import attn_heads_fused
from writescope.layers.norm import RMSNorm, rms_norm_fused
from writescope.layers.rotary import Rotary, rotate_half_fused
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 1e-6}
# (query heads, KV heads, head size, head norms): Qwen3-30B-A3B, Mixtral, a small odd one
for hq, hkv, d, norm in ((32, 4, 128, True), (32, 8, 128, False), (6, 2, 64, True)):
    rot = Rotary(d, 1e6, None).to(dev)
    cos, sin = rot.cos_sin(torch.tensor([0, 7, 4095, 131071, 3], device=dev))
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        qn = kn = None
        if norm:
            qn, kn = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
            with torch.no_grad():
                qn.weight.copy_(torch.randn(d) * 0.1 + 1)
                kn.weight.copy_(torch.randn(d) * 0.1 + 1)
            qn, kn = qn.to(dev, dt), kn.to(dev, dt)
        y = (torch.randn(5, hq + 2 * hkv, d) * 2).to(dev, dt)
        q, rec = attn_heads_fused(y, hq, hkv, qn, kn, cos, sin)
        assert q.shape == (5, hq, d) and rec.shape == (5, hkv, 2 * d) and q.dtype == rec.dtype == dt
        # the separate forms: the norms' and the rotation's kernels, then the cat
        wq, wk, v = y.split([hq, hkv, hkv], dim=1)
        if norm:
            wq, wk = rms_norm_fused(wq, qn.weight, qn.eps), rms_norm_fused(wk, kn.weight, kn.eps)
        wq, wk = rotate_half_fused(wq, cos, sin), rotate_half_fused(wk, cos, sin)
        want_r = torch.cat((wk, v), dim=-1)
        assert torch.equal(rec[..., d:], v)  # the values as they are
        for got, want in ((q, wq), (rec, want_r)):
            err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
            assert err <= 2.01 * ULP[dt], (hq, hkv, d, norm, dt, err)
            res[(hq, hkv, d, norm, str(dt), got is q)] = (torch.equal(got, want), err)
q, rec = attn_heads_fused(torch.zeros(0, 12, 64, device=dev), 8, 2, None, None,
                          torch.zeros(0, 32, device=dev), torch.zeros(0, 32, device=dev))
assert q.shape == (0, 8, 64) and rec.shape == (0, 2, 128)
print(res)
print("ok")
"""


MLP_CASES = PRELUDE + r"""
import torch.nn.functional as F
from writescope.layers.mlp import silu_mul_fused
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 1e-6}
for n, inter in ((1, 1408), (4, 2816), (3, 10944), (2, 40)):
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        h = (torch.randn(n, 2 * inter) * 3).to(dev, dt)
        want = F.silu(h[:, :inter]) * h[:, inter:]
        got = silu_mul_fused(h)
        assert got.dtype == dt and got.shape == (n, inter)
        err = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1e-3)).max().item()
        assert err <= 2.01 * ULP[dt], (n, inter, dt, err)
        res[(n, inter, str(dt))] = ((got == want).float().mean().item(), err)
assert silu_mul_fused(torch.zeros(0, 8, device=dev)).shape == (0, 4)
print(res)
print("ok")
"""


MLA_CASES = PRELUDE + r"""
from writescope.layers.mla_heads import mla_heads_fused
from writescope.layers.norm import RMSNorm, rms_norm_fused
from writescope.layers.rotary import Rotary, rotate_pairs_fused
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 1e-6}
# (heads, nope, rope, lora): DeepSeek-V2-Lite, a small one
for nh, nope, rope, lora in ((16, 128, 64, 512), (3, 16, 8, 40)):
    rot = Rotary(rope, 1e4, None).to(dev)
    cos, sin = rot.cos_sin(torch.tensor([0, 9, 4095, 163839], device=dev))
    for dt in (torch.bfloat16, torch.float32):
        norm = RMSNorm(lora, 1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(lora) * 0.1 + 1)
        norm = norm.to(dev, dt)
        # q and [c | k_pe] as one stacked GEMM's output: column slices of one [N, W] tensor
        y = (torch.randn(4, nh * (nope + rope) + lora + rope) * 2).to(dev, dt)
        q = y[:, :nh * (nope + rope)].view(4, nh, nope + rope)
        kva = y[:, nh * (nope + rope):]
        q_pe, rec = mla_heads_fused(q, kva, norm, cos, sin, lora)
        assert q_pe.shape == (4, nh, rope) and rec.shape == (4, 1, lora + rope)
        want_q = rotate_pairs_fused(q[..., nope:], cos, sin)
        want_c = rms_norm_fused(kva[:, :lora], norm.weight, norm.eps)
        want_k = rotate_pairs_fused(kva[:, lora:].reshape(4, 1, rope), cos, sin)
        for key, got, want in (("q_pe", q_pe, want_q), ("k_pe", rec[:, 0, lora:], want_k[:, 0]),
                               ("c", rec[:, 0, :lora], want_c)):
            err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
            assert err <= 2.01 * ULP[dt], (nh, dt, key, err)
            res[(nh, str(dt), key)] = (torch.equal(got, want), err)
print(res)
print("ok")
"""


@pytest.mark.parametrize("cases", [NORM_CASES, ROPE_CASES, ROUTER_CASES, HEADS_CASES, MLP_CASES,
                                   MLA_CASES],
                         ids=["rms_norm", "rotation", "router", "attn_heads", "silu_mul",
                              "mla_heads"])
def test_fused_forms_under_the_interpreter(cases):
    pytest.importorskip("triton")
    r = run_interpreted(cases.replace("DEVICE", '"cpu"'))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_rms_norm_takes_the_torch_form_off_cuda(monkeypatch):
    from writescope.layers import norm
    called = []
    monkeypatch.setattr(norm, "rms_norm_fused", lambda *a: called.append(a))
    monkeypatch.setattr(norm, "add_rms_norm_fused", lambda *a: called.append(a))
    m = norm.RMSNorm(8)
    x = torch.randn(2, 8)
    want = m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps))
    assert torch.equal(m(x), want) and not called
    dx = torch.randn(2, 8)
    s, h = m.add_forward(x, dx)
    assert torch.equal(s, x + dx) and torch.equal(h, m(x + dx)) and not called


def test_rotation_takes_the_torch_form_off_cuda(monkeypatch):
    from writescope.layers import rotary
    monkeypatch.setattr(rotary, "rotate_half_fused", lambda *a: pytest.fail("fused off CUDA"))
    monkeypatch.setattr(rotary, "rotate_pairs_fused", lambda *a: pytest.fail("fused off CUDA"))
    x = torch.randn(2, 3, 8)
    cos, sin = torch.randn(2, 4), torch.randn(2, 4)
    rotary.apply_rotary(x, cos, sin)
    rotary.apply_rotary(x, cos, sin, interleaved=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_rms_norm_on_cuda(monkeypatch):
    """On the GPU the kernel rounds as torch does: bf16 results within one unit of the torch
    form's, most of them equal; the engine's RMSNorm takes it (and WRITESCOPE_FUSED_NORM=0 not)."""
    ns: dict = {}
    exec(NORM_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    for (d, dt, wdt), (frac, rel) in ns["worst"].items():
        if "bfloat16" in dt:
            assert rel <= 1.01 * ns["ULP"] and frac < 0.02, (d, dt, wdt, frac, rel)
    for key, (s_equal, h_equal) in ns["same"].items():  # the sum is torch's add; the norm
        assert s_equal and h_equal, key                 # rms_norm_fused's, to the bit
    from writescope.layers import norm
    assert norm.fused_enabled()
    m = norm.RMSNorm(64).cuda()
    x, dx = torch.randn(3, 64, device="cuda"), torch.randn(3, 64, device="cuda")
    called = []
    monkeypatch.setattr(norm, "add_rms_norm_fused", lambda *a: called.append(a) or (x, x))
    m.add_forward(x, dx)
    assert called  # the engine's add_forward takes the kernel
    monkeypatch.setenv("WRITESCOPE_FUSED_NORM", "0")
    assert not norm.fused_enabled()
    called.clear()
    s, h = m.add_forward(x, dx)
    assert not called and torch.equal(s, x + dx) and torch.equal(h, m(x + dx))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_rotation_within_one_unit_on_cuda():
    """On the H200 the kernel is not the torch form's bits (2026-12-03c, call 5: bf16 and fp16
    differ in some elements) but within one unit in the last place of the largest value: bf16
    0.0040-0.0046 of it, fp16 0.00048-0.00059, fp32 6e-8 (the bounds below)."""
    ns: dict = {}
    exec(ROPE_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    ulp = {"torch.bfloat16": 2.0 ** -7, "torch.float16": 2.0 ** -10, "torch.float32": 1e-6}
    for key, (_, err) in ns["res"].items():
        assert err <= ulp[key[2]], (key, err)


def test_router_takes_the_torch_form_off_cuda(monkeypatch):
    from writescope.layers import routing
    from writescope.layers.moe import Router
    from writescope.models.config import ModelConfig
    monkeypatch.setattr(routing, "route_fused", lambda *a, **k: pytest.fail("fused off CUDA"))
    cfg = ModelConfig.from_hf({"model_type": "qwen3_moe", "hidden_size": 8, "num_experts": 16,
                               "rms_norm_eps": 1e-6,
                               "num_experts_per_tok": 4, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "num_key_value_heads": 1,
                               "head_dim": 4, "intermediate_size": 16,
                               "moe_intermediate_size": 8, "vocab_size": 32,
                               "norm_topk_prob": True})
    r = Router(cfg)
    with torch.no_grad():
        r.weight.normal_()
    w, i = r(torch.randn(3, 8))
    assert w.shape == (3, 4) and i.shape == (3, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_router_on_cuda(monkeypatch):
    """On the GPU: a top-k of the torch form's values in its order, weights within the bounds
    above; WRITESCOPE_FUSED_ROUTER=0 turns it off."""
    ns: dict = {}
    exec(ROUTER_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    from writescope.layers import routing
    assert routing.fused_enabled()
    monkeypatch.setenv("WRITESCOPE_FUSED_ROUTER", "0")
    assert not routing.fused_enabled()


def test_qkv_weights_are_rows_of_one_tensor(tiny_qwen3_moe):
    """The loader lays q/k/v_proj's weights out as rows of one tensor (models/gqa.py), filled
    with the checkpoint's values; one GEMM over it gives the three projections; moving a
    weight elsewhere turns the shared GEMM off."""
    from safetensors.torch import load_file
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    cfg = ModelConfig.from_hf(tiny_qwen3_moe)
    model = build_model(cfg, dtype=torch.float32, device="cpu", checkpoint=tiny_qwen3_moe)
    sd = {}
    for f in sorted(tiny_qwen3_moe.glob("*.safetensors")):
        sd.update(load_file(f))
    attn = model.model.layers[1].self_attn
    p = "model.layers.1.self_attn."
    assert torch.equal(attn.q_proj.weight, sd[p + "q_proj.weight"].float())
    assert torch.equal(attn.v_proj.weight, sd[p + "v_proj.weight"].float())
    qkv = attn._qkv
    assert qkv is not None and attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    x = torch.randn(3, cfg.hidden_size)
    y = torch.nn.functional.linear(x, qkv)
    want = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-5)
    assert attn._fused_qkv(x) is None  # the CPU keeps its three GEMMs
    if torch.cuda.is_available():
        attn.cuda()  # .cuda() copies each weight on its own: they are no longer its rows
        assert attn._fused_qkv(x.cuda()) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qkv_in_one_gemm_on_cuda(tiny_qwen3_moe, monkeypatch):
    """On CUDA the attention's pre-step takes the shared GEMM, and its queries and records equal
    the three GEMMs' within bf16 rounding (WRITESCOPE_FUSED_QKV=0)."""
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    cfg = ModelConfig.from_hf(tiny_qwen3_moe)
    model = build_model(cfg, dtype=torch.bfloat16, device="cuda", checkpoint=tiny_qwen3_moe)
    attn = model.model.layers[0].self_attn
    x = torch.randn(5, cfg.hidden_size, device="cuda").bfloat16()
    assert attn._fused_qkv(x) is not None
    rope = model.rotary.cos_sin(torch.arange(5, device="cuda") + 7)
    q1, r1 = attn.pre(x, rope)
    monkeypatch.setenv("WRITESCOPE_FUSED_QKV", "0")
    assert attn._fused_qkv(x) is None
    q0, r0 = attn.pre(x, rope)
    for a, b in ((q1, q0), (r1, r0)):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert (a.float() - b.float()).abs().max().item() <= 2 ** -6 * b.float().abs().max().item()


def _cuda_model(path):
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    cfg = ModelConfig.from_hf(path)
    return cfg, build_model(cfg, dtype=torch.bfloat16, device="cuda", checkpoint=path)


def _fused_then_separate(monkeypatch, module, name: str, env: str, run):
    """``run()`` with ``module.name`` (a fused kernel's entry) counted, then again with
    ``env=0``: the kernel ran in the first and not in the second; both results, compared
    within bf16 rounding (each a tensor or a tuple of tensors)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or real(*a))
    fused = run()
    assert calls
    monkeypatch.setenv(env, "0")
    separate = run()
    assert len(calls) == 1
    pairs = zip(fused, separate) if isinstance(fused, tuple) else [(fused, separate)]
    for a, b in pairs:
        assert (a.float() - b.float()).abs().max().item() <= 2 ** -6 * b.float().abs().max().item()


def test_attn_heads_take_the_separate_forms_off_cuda(tiny_qwen3_moe, monkeypatch):
    """Off CUDA the attention's pre-step never calls the fused heads kernel."""
    from writescope.layers import attn_heads
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    monkeypatch.setattr(attn_heads, "attn_heads_fused",
                        lambda *a: pytest.fail("fused heads off CUDA"))
    cfg = ModelConfig.from_hf(tiny_qwen3_moe)
    model = build_model(cfg, dtype=torch.float32, device="cpu", checkpoint=tiny_qwen3_moe)
    attn = model.model.layers[0].self_attn
    q, rec = attn.pre(torch.randn(3, cfg.hidden_size), model.rotary.cos_sin(torch.arange(3)))
    assert q.shape == (3, cfg.num_heads, cfg.head_dim)
    assert rec.shape == (3, cfg.num_kv_heads, 2 * cfg.head_dim)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_attn_heads_on_cuda(tiny_qwen3_moe, monkeypatch):
    """On the GPU: the fused heads within two units of the separate kernels' (the norm's sum
    runs in another order), the values copied as they are; the engine's pre-step takes it, and
    WRITESCOPE_FUSED_HEADS=0 gives the separate forms."""
    ns: dict = {}
    exec(HEADS_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    from writescope.layers import attn_heads
    cfg, model = _cuda_model(tiny_qwen3_moe)
    attn = model.model.layers[0].self_attn
    x = torch.randn(5, cfg.hidden_size, device="cuda").bfloat16()
    rope = model.rotary.cos_sin(torch.arange(5, device="cuda") + 7)
    _fused_then_separate(monkeypatch, attn_heads, "attn_heads_fused", "WRITESCOPE_FUSED_HEADS",
                         lambda: attn.pre(x, rope))


def test_gate_and_up_weights_are_rows_of_one_tensor(tiny_deepseek_v2, monkeypatch):
    """The loader lays a gated MLP's gate and up weights out as rows of one tensor (shared
    experts and dense layers), filled with the checkpoint's values; off CUDA the MLP runs its
    torch form, never the fused kernel."""
    from safetensors.torch import load_file
    from writescope.layers import mlp
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    monkeypatch.setattr(mlp, "silu_mul_fused", lambda *a: pytest.fail("fused MLP off CUDA"))
    cfg = ModelConfig.from_hf(tiny_deepseek_v2)
    model = build_model(cfg, dtype=torch.float32, device="cpu", checkpoint=tiny_deepseek_v2)
    sd = {}
    for f in sorted(tiny_deepseek_v2.glob("*.safetensors")):
        sd.update(load_file(f))
    mlps = [(n, m) for n, m in model.named_modules() if isinstance(m, mlp.GatedMLP)]
    assert mlps
    for name, m in mlps:
        assert m._gate_up is not None and m.gate_proj.weight.data_ptr() == m._gate_up.data_ptr()
        assert torch.equal(m.up_proj.weight, sd[f"{name}.up_proj.weight"].float())
        assert torch.equal(m.gate_proj.weight, sd[f"{name}.gate_proj.weight"].float())
        x = torch.randn(3, m.gate_proj.weight.shape[1])
        want = m.down_proj(torch.nn.functional.silu(m.gate_proj(x)) * m.up_proj(x))
        assert torch.equal(m(x), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_mlp_on_cuda(tiny_deepseek_v2, monkeypatch):
    """On the GPU: silu_mul within two units of the torch form; DeepSeek's shared-expert MLP takes
    the stacked GEMM and the kernel, within bf16 rounding of WRITESCOPE_FUSED_MLP=0."""
    ns: dict = {}
    exec(MLP_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    from writescope.layers import mlp
    _, model = _cuda_model(tiny_deepseek_v2)
    m = next(m for m in model.modules() if isinstance(m, mlp.GatedMLP))
    x = torch.randn(4, m.gate_proj.weight.shape[1], device="cuda").bfloat16()
    _fused_then_separate(monkeypatch, mlp, "silu_mul_fused", "WRITESCOPE_FUSED_MLP", lambda: m(x))


def test_mla_projections_are_rows_of_one_tensor(tiny_deepseek_v2, monkeypatch):
    """Without a query LoRA the loader stacks q_proj's and kv_a_proj_with_mqa's weights (one
    GEMM on CUDA), filled with the checkpoint's values; off CUDA the separate forms run."""
    from safetensors.torch import load_file
    from writescope.layers import mla_heads
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    monkeypatch.setattr(mla_heads, "mla_heads_fused", lambda *a: pytest.fail("fused off CUDA"))
    cfg = ModelConfig.from_hf(tiny_deepseek_v2)
    model = build_model(cfg, dtype=torch.float32, device="cpu", checkpoint=tiny_deepseek_v2)
    attn = model.model.layers[0].self_attn
    if attn.q_lora:
        pytest.skip("the tiny checkpoint has a query LoRA")
    sd = {}
    for f in sorted(tiny_deepseek_v2.glob("*.safetensors")):
        sd.update(load_file(f))
    assert attn._q_kva is not None and attn.q_proj.weight.data_ptr() == attn._q_kva.data_ptr()
    p = "model.layers.0.self_attn."
    assert torch.equal(attn.kv_a_proj_with_mqa.weight, sd[p + "kv_a_proj_with_mqa.weight"].float())
    x = torch.randn(3, cfg.hidden_size)
    q, rec = attn.pre(x, model.rotary.cos_sin(torch.arange(3)))
    assert q.shape[:2] == (3, cfg.num_heads) and rec.shape[:2] == (3, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mla_heads_on_cuda(tiny_deepseek_v2, monkeypatch):
    """On the GPU: the fused record and q_pe against the separate kernels; MLA's pre-step takes
    the stacked GEMM and the kernel, within bf16 rounding of WRITESCOPE_FUSED_HEADS=0."""
    ns: dict = {}
    exec(MLA_CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    from writescope.layers import mla_heads
    cfg, model = _cuda_model(tiny_deepseek_v2)
    attn = model.model.layers[0].self_attn
    x = torch.randn(4, cfg.hidden_size, device="cuda").bfloat16()
    rope = model.rotary.cos_sin(torch.arange(4, device="cuda") + 11)
    _fused_then_separate(monkeypatch, mla_heads, "mla_heads_fused", "WRITESCOPE_FUSED_HEADS",
                         lambda: attn.pre(x, rope))


def test_layers_free_the_old_residual_before_their_mlp(tiny_qwen3_moe):
    """The residual's add is deferred to the next layer's norm (``RMSNorm.add_forward``); the
    forward pass must still free a layer's input residual and the previous MLP's output once
    their sum exists, so that a long prefill's peak (which sizes the KV pools on CUDA) holds no
    more hidden-sized tensors than the plain ``x + f(norm(x))`` form."""
    import weakref

    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    cfg = ModelConfig.from_hf(tiny_qwen3_moe)
    model = build_model(cfg, dtype=torch.float32, device="cpu", checkpoint=tiny_qwen3_moe)
    layers = model.model.layers
    seen, alive = {}, []
    for i, layer in enumerate(layers):
        ffn_fwd = layer.ffn.forward

        def pre(carry, rope, ctx, i=i, real=layer.forward):
            seen[i] = [weakref.ref(t) for t in carry if t is not None]
            return real(carry, rope, ctx)

        def ffn(h, i=i, real=ffn_fwd):
            alive.append((i, [r() is not None for r in seen[i]]))
            return real(h)
        layer.forward, layer.ffn.forward = pre, ffn

    class Ctx:  # each token over itself (no cache)
        def attention(self, layer, q, records, dense=None):
            from writescope.attention.selfattn import causal_self_attention
            spec = cfg.kv_spec(torch.float32)
            return causal_self_attention(q, records, spec, [q.shape[0]], cfg.softmax_scale)[0]
    n = 5
    model(torch.arange(n), torch.arange(n), Ctx())
    assert [i for i, _ in alive] == list(range(len(layers)))
    for i, flags in alive:  # the input residual (and the previous MLP output) are gone
        assert not any(flags), (i, flags)
