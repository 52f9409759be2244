"""The half-split rotation's Triton kernel (layers/rotary.py) against the torch form: on the CPU
through Triton's interpreter, on CUDA as the engine runs it (the same bits)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

CASES = r"""
import torch
from writescope.layers.rotary import Rotary, apply_rotary, rotate_half_fused
torch.manual_seed(0)
dev = DEVICE
res = {}
for d, heads in ((128, 32), (128, 4), (64, 8), (96, 2)):
    rot = Rotary(d, 1e6, None).to(dev)
    pos = torch.tensor([0, 5, 4095, 131071], device=dev)
    cos, sin = rot.cos_sin(pos)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        x = (torch.randn(4, heads, 2 * d, device=dev) * 2).to(dt)[..., ::2]  # a strided view
        c2 = torch.cat((cos.unsqueeze(1),) * 2, -1).to(dt)
        s2 = torch.cat((sin.unsqueeze(1),) * 2, -1).to(dt)
        want = x * c2 + torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1) * s2
        got = rotate_half_fused(x, cos, sin)
        assert got.dtype == want.dtype and got.shape == want.shape
        err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
        res[(d, heads, str(dt))] = (torch.equal(got, want), err)
        assert err < (1e-6 if dt == torch.float32 else 2e-2), (d, heads, dt, err)
print(res)
print("ok")
"""


def test_fused_rotation_under_the_interpreter():
    pytest.importorskip("triton")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", CASES.replace("DEVICE", '"cpu"')], env=env,
                       capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_rotation_takes_the_torch_form_off_cuda(monkeypatch):
    from writescope.layers import rotary
    monkeypatch.setattr(rotary, "rotate_half_fused", lambda *a: pytest.fail("fused off CUDA"))
    x = torch.randn(2, 3, 8)
    cos, sin = torch.randn(2, 4), torch.randn(2, 4)
    rotary.apply_rotary(x, cos, sin)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_rotation_is_the_torch_forms_bits_on_cuda():
    ns: dict = {}
    exec(CASES.replace("DEVICE", '"cuda"').replace('print("ok")', ""), ns)
    for key, (same, err) in ns["res"].items():
        if "float32" not in key[2]:  # fp32: the compiler may fuse a product into the sum
            assert same, (key, err)
