"""ResidentAttention's one-launch forms (attention/resident.py, attention/gpu.py): the G and W
chunks' partials in one launch over both pools, and the merge that also takes each row's new
token over itself and writes the new records (``attend_merged``, the graphed decode step's
form) -- against a float64 oracle and against the separate launches, under Triton's CPU
interpreter and on CUDA."""
from __future__ import annotations

import pytest
import torch

from triton_interp import run_interpreted

CASES = r"""
import os, types
import numpy as np
import torch
from writescope.attention.batch import BlockBatch
from writescope.attention.reference import dense_attention
from writescope.attention.resident import ResidentAttention
from writescope.attention.selfmerge import self_merge_torch
from writescope.kvcache.regions import KVSpec, Region

torch.manual_seed(0)
dev = torch.device(DEVICE)
bs, layers = 16, 2
worst = {}
for name, spec, hq in (("gqa", KVSpec.gqa(layers, 2, 64, torch.float32), 8),
                       ("mla", KVSpec.mla(layers, 64, 16, torch.float32), 4)):
    scale = spec.k_dim ** -0.5
    pools = {r: torch.randn(layers, n, bs, spec.num_kv_heads, spec.rec_dim, device=dev)
             for r, n in ((Region.G, 12), (Region.W, 5))}
    # three sequences: G blocks with a partial last one, a W tail each (the second's empty)
    g_blocks, g_lens = [[0, 3, 7], [1, 2], [4, 5, 6, 8, 9, 10]], [[16, 16, 5], [16, 16], [16] * 5 + [9]]
    w_blocks, w_lens = [[2], [], [0]], [[7], [], [3]]
    n = 3
    plan = types.SimpleNamespace(
        num_q_rows=n, q_indptr=torch.arange(n + 1, dtype=torch.int32), cpu=[],
        gpu=[(Region.G, BlockBatch.build([1] * n, g_blocks, g_lens)),
             (Region.W, BlockBatch.build([1] * n, w_blocks, w_lens))])
    ra = ResidentAttention(pools, spec, scale, dev)
    rows = 4  # one padded row past the step's tokens
    ra.load(plan, rows, np.arange(n), np.array([40, 41, 42]))
    q = torch.randn(rows, hq, spec.k_dim, device=dev)
    rec = torch.randn(rows, spec.num_kv_heads, spec.rec_dim, device=dev)
    for layer in range(layers):
        outs = {}
        for one in ("1", "0"):
            os.environ["WRITESCOPE_RESIDENT_ONE_LAUNCH"] = one
            o, l = ra.attend(layer, q)
            outs[one] = (o, l, ra.attend_merged(layer, q, rec))
        os.environ.pop("WRITESCOPE_RESIDENT_ONE_LAUNCH")
        # the new records went to their W slots (the padded row: the last token's, again)
        w_rows = pools[Region.W][layer].view(-1, spec.num_kv_heads, spec.rec_dim)
        assert torch.equal(w_rows[40:43], rec[:n])
        assert torch.equal(outs["1"][0], outs["0"][0]) and torch.equal(outs["1"][1], outs["0"][1])
        assert torch.equal(outs["1"][2], outs["0"][2])
        o, l, merged = outs["1"]
        sep = self_merge_torch(o[:n], l[:n], q[:n], rec[:n], spec, scale)
        for i in range(n):
            toks = [pools[Region.G][layer, b, :m] for b, m in zip(g_blocks[i], g_lens[i])]
            toks += [pools[Region.W][layer, b, :m] for b, m in zip(w_blocks[i], w_lens[i])]
            kv = torch.cat(toks).cpu()
            ref_o, ref_l = dense_attention(q[i:i + 1].cpu(), spec.k(kv), spec.v(kv), scale)
            assert (o[i].cpu().double() - ref_o[0]).abs().max() < 1e-5
            assert (l[i].cpu().double() - ref_l[0]).abs().max() < 1e-5
            kv = torch.cat((kv, rec[i:i + 1].cpu()))
            ref_o, _ = dense_attention(q[i:i + 1].cpu(), spec.k(kv), spec.v(kv), scale)
            err = (merged[i].cpu().double() - ref_o[0]).abs().max().item()
            worst[name] = max(worst.get(name, 0.0), err)
            assert err < 1e-5, (name, i, err)
        assert (merged[:n] - sep).abs().max() < 1e-5
    # bf16: the merged output in q's dtype, within one rounding of the separate forms
    pb = {r: t.to(torch.bfloat16) for r, t in pools.items()}
    specb = KVSpec(spec.num_layers, spec.num_kv_heads, spec.rec_dim, spec.k_offset, spec.k_dim,
                   spec.v_offset, spec.v_dim, torch.bfloat16)
    rb = ResidentAttention(pb, specb, scale, dev)
    rb.load(plan, rows, np.arange(n), np.array([40, 41, 42]))
    qb, recb = q.to(torch.bfloat16), rec.to(torch.bfloat16)
    o, l = rb.attend(0, qb)
    sep = self_merge_torch(o[:n], l[:n], qb[:n], recb[:n], specb, scale)
    os.environ["WRITESCOPE_FUSED_WRITE"] = "0"
    unfused = rb.attend_merged(0, qb, recb)[:n]
    os.environ.pop("WRITESCOPE_FUSED_WRITE")
    pb[Region.W][0].view(-1, spec.num_kv_heads, spec.rec_dim)[40:43] = 0
    got = rb.attend_merged(0, qb, recb)[:n]
    assert torch.equal(got, unfused)
    assert torch.equal(pb[Region.W][0].view(-1, spec.num_kv_heads, spec.rec_dim)[40:43], recb[:n])
    assert got.dtype == torch.bfloat16
    rel = ((got.double() - sep.double()).abs().max() / sep.double().abs().max()).item()
    assert rel < 2 ** -7, (name, rel)
print(worst)
print("ok")
"""


def test_resident_one_launch_forms_under_the_interpreter():
    pytest.importorskip("triton")
    from test_hybrid import interpreter_runs_loaded_loops
    why = interpreter_runs_loaded_loops()
    if why is not None:
        pytest.skip(f"Triton's interpreter cannot run data-bounded loops here: {why}")
    r = run_interpreted(CASES.replace("DEVICE", '"cpu"'))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resident_one_launch_forms_on_cuda():
    exec(CASES.replace("DEVICE", '"cuda"'), {})
