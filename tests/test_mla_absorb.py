"""MLA decode's fused absorption and values (layers/mla_absorb.py) against the torch forms of
models/mla.py: the Triton kernels on the CPU through Triton's interpreter, on CUDA as the
engine runs them; the CPU keeps the torch forms."""
from __future__ import annotations

import pytest
import torch
from triton_interp import run_interpreted

CASES = r"""
import torch
from writescope.layers.mla_absorb import absorb_fused, values_fused
torch.manual_seed(0)
dev = DEVICE
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 1e-5}
res = {}


def check(key, got, want, dt):
    # 16-bit: per element within one rounding of the float32 sums (two units under the
    # interpreter, which truncates); float32: the sums' order, against the largest value
    assert got.dtype == want.dtype == dt and got.shape == want.shape, (key, got.shape, want.shape)
    g, w = got.double(), want.double()
    floor = 1.0 if dt == torch.float32 else 1e-3
    err = ((g - w).abs() / (w.abs() + floor * w.abs().max())).max().item()
    assert err <= 2.01 * ULP[dt], (key, err)
    res[key] = (round((got == want).double().mean().item(), 3), err)


# (heads, nope, rope, lora, v): DeepSeek-V2-Lite's sizes for two heads, a small odd one
for nh, nope, rope, lora, vd in ((2, 128, 64, 512, 128), (3, 24, 8, 40, 20)):
    for dt in (torch.bfloat16, torch.float32):
        kv_b = (torch.randn(nh * (nope + vd), lora) * 0.05).to(dev, dt)
        w = kv_b.view(nh, nope + vd, lora)
        w_uk, w_uv = w[:, :nope], w[:, nope:]
        for n in (1, 4, 7, 16):
            # q as the stacked projection's output: column slices of one [N, W] tensor, split
            y = torch.randn(n, nh * (nope + rope) + lora + rope).to(dev, dt)
            q = y[:, :nh * (nope + rope)].view(n, nh, nope + rope)
            q_nope, q_rot = q.split([nope, rope], -1)
            q_pe = torch.randn(n, nh, rope).to(dev, dt)  # as mla_heads_fused writes it
            for pe_key, pe in (("contiguous", q_pe), ("strided", q_rot)):
                got = absorb_fused(q_nope, pe, w_uk)
                want = torch.cat((torch.einsum("nhd,hdc->nhc", q_nope, w_uk), pe), dim=-1)
                assert torch.equal(got[..., lora:], pe)
                check(("absorb", nh, str(dt), n, pe_key), got, want, dt)
            for odt in {dt, torch.float32}:  # the attention's output: the dtype, or float32
                out = (torch.randn(n, nh, lora) * 0.5).to(dev, odt)
                if dev == "cpu":  # the interpreter truncates casts: values the dtype holds
                    out = out.to(dt).to(odt)
                got = values_fused(out, w_uv)
                want = torch.einsum("nhc,hvc->nhv", out.to(dt), w_uv).reshape(n, nh * vd)
                check(("values", nh, str(dt), n, str(odt)), got, want, dt)
        assert absorb_fused(q_nope[:0], q_pe[:0], w_uk).shape == (0, nh, lora + rope)
        assert values_fused(out[:0], w_uv).shape == (0, nh * vd)
print(res)
print("ok")
"""


def test_fused_forms_under_the_interpreter():
    pytest.importorskip("triton")
    r = run_interpreted(CASES.replace("DEVICE", '"cpu"'), timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def _over_latents(q: torch.Tensor, rec: torch.Tensor, lora: int) -> torch.Tensor:
    """An attention stand-in ``[N, H, lora]`` in the query's dtype: deterministic, and a
    function of both the absorbed queries and the new records."""
    return torch.tanh(q[..., :lora].float() * 0.1 + rec[..., :lora].float()).to(q.dtype)


class _Context:
    def __init__(self, lora: int):
        self.lora = lora

    def attention(self, layer, q, records, dense=None):
        return _over_latents(q, records, self.lora)


def _decode(attn, x, rope):
    """MLA's decode as the engine runs it (``pre``, the attention over latents, ``_values`` and
    ``post``), and ``forward`` through the same attention stand-in."""
    q, rec = attn.pre(x, rope)
    o = _over_latents(q, rec, attn.lora)
    return q, attn._values(o), attn.post(o), attn.forward(x, rope, _Context(attn.lora), 0)


def test_cpu_takes_the_torch_forms(tiny_deepseek_v2, monkeypatch):
    """Off CUDA, MLA's decode never calls the fused kernels."""
    from writescope.layers import mla_absorb
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    monkeypatch.setattr(mla_absorb, "absorb_fused", lambda *a: pytest.fail("absorb off CUDA"))
    monkeypatch.setattr(mla_absorb, "values_fused", lambda *a: pytest.fail("values off CUDA"))
    cfg = ModelConfig.from_hf(tiny_deepseek_v2)
    model = build_model(cfg, dtype=torch.float32, device="cpu", checkpoint=tiny_deepseek_v2)
    attn = model.model.layers[0].self_attn
    q, vals, y, z = _decode(attn, torch.randn(3, cfg.hidden_size),
                            model.rotary.cos_sin(torch.arange(3) + 5))
    assert q.shape == (3, cfg.num_heads, attn.lora + attn.rope)
    assert vals.shape == (3, cfg.num_heads, attn.vd) and y.shape == z.shape == (3, cfg.hidden_size)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_forms_on_cuda():
    exec(CASES.replace("DEVICE", '"cuda"'), {})


def _units(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per element, ``|a - b|`` in bf16 units of ``b`` (a tiny floor where sums cancel)."""
    b = b.float()
    unit = torch.exp2(torch.floor(torch.log2(b.abs().clamp_min(2 ** -100))) - 7)
    return (a.float() - b).abs() / unit.clamp_min(2 ** -20 * b.abs().max())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mla_decode_on_cuda(tiny_deepseek_v2, monkeypatch):
    """A tiny DeepSeek-V2's MLA decode takes both kernels on CUDA, within one bf16 unit per
    element of WRITESCOPE_FUSED_MLA_ABSORB=0 (the absorbed queries and the values; the layer's
    output within bf16 rounding); past MAX_TOKENS tokens it keeps the torch forms."""
    from writescope.layers import mla_absorb
    from writescope.models.config import ModelConfig
    from writescope.models.loader import build_model
    cfg = ModelConfig.from_hf(tiny_deepseek_v2)
    model = build_model(cfg, dtype=torch.bfloat16, device="cuda", checkpoint=tiny_deepseek_v2)
    attn = model.model.layers[0].self_attn
    calls = []
    for name in ("absorb_fused", "values_fused"):
        real = getattr(mla_absorb, name)
        monkeypatch.setattr(mla_absorb, name,
                            lambda *a, name=name, real=real: calls.append(name) or real(*a))
    for n in (1, 4, mla_absorb.MAX_TOKENS):
        x = torch.randn(n, cfg.hidden_size, device="cuda").bfloat16()
        rope = model.rotary.cos_sin(torch.arange(n, device="cuda") + 11)
        monkeypatch.delenv("WRITESCOPE_FUSED_MLA_ABSORB", raising=False)
        calls.clear()
        fused = _decode(attn, x, rope)
        assert calls.count("absorb_fused") == 2 and calls.count("values_fused") == 3
        monkeypatch.setenv("WRITESCOPE_FUSED_MLA_ABSORB", "0")
        torch_forms = _decode(attn, x, rope)
        assert len(calls) == 5
        for a, b in zip(fused[:2], torch_forms[:2]):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert _units(a, b).max().item() <= 1.0
        for a, b in zip(fused[2:], torch_forms[2:]):
            assert (a.float() - b.float()).abs().max().item() <= 2 ** -6 * b.float().abs().max()
    monkeypatch.delenv("WRITESCOPE_FUSED_MLA_ABSORB")
    calls.clear()
    x = torch.randn(mla_absorb.MAX_TOKENS + 1, cfg.hidden_size, device="cuda").bfloat16()
    _decode(attn, x, model.rotary.cos_sin(torch.arange(x.shape[0], device="cuda")))
    assert not calls
