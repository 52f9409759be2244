"""Programmatic dependent launch (attention/launch.py: ``pdl_args``): where it is on, and on the
GPU machine a CUDA-graphed chain of the decode layer's kernels -- norm, head rotation, router,
routed experts, SiLU-mul -- giving the same bits launched dependent on one another as launched
one after the other (with and without the early reads before their waits), replayed from a
graph and run eagerly."""
from __future__ import annotations

import pytest
import torch

from writescope.attention import launch


def test_pdl_is_off_off_cuda_and_when_switched_off(monkeypatch):
    cpu = torch.zeros(1)
    assert launch.pdl_args(cpu) == {"PDL": False}
    assert not launch.pdl_enabled(torch.device("cpu"))
    monkeypatch.setenv("WRITESCOPE_PDL", "0")
    assert not launch.pdl_enabled(torch.device("cuda", 0))  # decided before any CUDA query
    monkeypatch.setenv("WRITESCOPE_PDL", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not launch.pdl_enabled(torch.device("cuda", 0))
    # early reads go with dependent launches only
    assert launch.pdl_args(cpu, early=True) == {"PDL": False, "EARLY": False}
    monkeypatch.delenv("WRITESCOPE_PDL_EARLY", raising=False)
    assert launch.early_reads()  # on by default
    monkeypatch.setenv("WRITESCOPE_PDL_EARLY", "0")
    assert not launch.early_reads()


def _chain(x, dx, p, counter, layers):
    from writescope.layers.attn_heads import attn_heads_fused
    from writescope.layers.mlp import silu_mul_fused
    from writescope.layers.moe_triton import fused_experts
    from writescope.layers.norm import add_rms_norm_fused
    from writescope.layers.routing import router_fused
    outs = []
    for _ in range(layers):
        x, xn = add_rms_norm_fused(x, dx, p["norm"], 1e-6)
        y = (xn @ p["qkv"]).view(x.shape[0], -1, 64)
        q, rec = attn_heads_fused(y, 4, 2, None, None, p["cos"], p["sin"])
        wts, ids = router_fused(xn, p["router"], counter, 2, True, out_dtype=torch.float32,
                                ids_dtype=torch.int32, round_to=torch.bfloat16)
        dx = fused_experts(xn, ids, wts, p["gate_up"], p["down"]) \
            + silu_mul_fused(xn @ p["shared"])[:, :x.shape[1]]
        outs += [q, rec, wts, ids.float()]
    return torch.cat([x, dx] + [o.reshape(x.shape[0], -1).float() for o in outs], dim=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dependent_launches_give_the_same_bits_in_a_graph(monkeypatch):
    pytest.importorskip("triton")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9")
    assert launch.pdl_enabled(torch.device("cuda"))
    g = torch.Generator().manual_seed(0)
    dt, n, hid, e, inter = torch.bfloat16, 2, 256, 8, 96

    def r(*s, scale=0.1):
        return (torch.randn(*s, generator=g) * scale).to("cuda", dt)
    p = dict(norm=r(hid, scale=1.0), qkv=r(hid, 8 * 64), router=r(e, hid), gate_up=r(e, 2 * inter, hid),
             down=r(e, hid, inter), shared=r(hid, 2 * hid), cos=torch.cos(r(n, 32, scale=3.0)),
             sin=torch.sin(r(n, 32, scale=3.0)))
    x, dx = r(n, hid, scale=1.0), r(n, hid, scale=1.0)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    results = {}
    for mode in ("0", "1", "1-late"):  # off; on with early reads (the default); on, wait first
        monkeypatch.setenv("WRITESCOPE_PDL", mode[0])
        monkeypatch.setenv("WRITESCOPE_PDL_EARLY", "0" if mode.endswith("late") else "1")
        eager = _chain(x, dx, p, counter, 6)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            _chain(x, dx, p, counter, 6)  # warm: every kernel compiled before the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _chain(x, dx, p, counter, 6)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), mode
        assert int(counter.item()) == 0  # the router's last program left its counter zero
        results[mode] = out.clone()
    assert torch.equal(results["0"], results["1"])
    assert torch.equal(results["0"], results["1-late"])
    from writescope.layers.moe_triton import _kernels
    gate_up = _kernels()[0]
    kept = [k for k in gate_up._kernels.values() if getattr(k.metadata, "launch_pdl", False)]
    assert kept, "no gate/up kernel was compiled for a dependent launch"
