"""Dense prefill attention (attention/prefill.py) and the context gather (kvcache/context.py)
against the float64 oracle; the engine with the dense path against the paged path."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from writescope.attention import prefill
from writescope.attention.prefill import causal_prefix_attention
from writescope.attention.reference import dense_attention
from writescope.kvcache.context import ContextPlan, gather_context
from writescope.kvcache.regions import Region, pool_shape, to_cpu_layout
from writescope.kvcache.regions import KVSpec
from writescope.kvcache.table import REGION_CODES

SHAPES = {  # name: (Hq, Hkv, Dk, Dv, shared latent)
    "gqa-8/2/64": (8, 2, 64, 64, False),
    "mha-4/4/32": (4, 4, 32, 32, False),
    "mla-16/1/576": (16, 1, 576, 512, True),
}


def oracle(q, k, v, scale):
    n, t = q.shape[0], k.shape[0]
    out, _ = dense_attention(q, k, v, scale, torch.arange(t - n, t), torch.arange(t))
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("n,p", [(1, 0), (7, 0), (33, 70), (64, 1), (20, 300)])
@pytest.mark.parametrize("path", ["sdpa", "sdpa-lazy-mask", "tiled"])
def test_causal_prefix_attention_matches_float64(shape, n, p, path, monkeypatch):
    """On the CPU, "sdpa" takes an explicit bool mask (small shapes), "sdpa-lazy-mask" torch's
    lower-right causal bias (large ones, and CUDA)."""
    hq, hkv, dk, dv, shared = SHAPES[shape]
    g = torch.Generator().manual_seed(n * 1000 + p)
    t = p + n
    q = torch.randn(n, hq, dk, generator=g)
    k = torch.randn(t, hkv, dk, generator=g)
    v = k[..., :dv] if shared else torch.randn(t, hkv, dv, generator=g)
    scale = 1 / math.sqrt(dk)
    if path == "tiled":
        monkeypatch.setattr(prefill, "TILE_SCORE_ELEMS", hq * t * 5)  # several tiles
        got = prefill._tiled(q, k, v, scale)
    else:
        if path == "sdpa-lazy-mask":
            monkeypatch.setattr(prefill, "EXPLICIT_MASK_ELEMS", 0)
        got = causal_prefix_attention(q, k, v, scale)
    ref = oracle(q, k, v, scale)
    assert got.shape == (n, hq, dv)
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-5, err


def test_causal_prefix_attention_bf16():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(40, 16, 576, generator=g)
    k = torch.randn(140, 1, 576, generator=g)
    ref = oracle(q, k, k[..., :512], 0.05)
    got = causal_prefix_attention(q.bfloat16(), k.bfloat16(), k[..., :512].bfloat16(), 0.05)
    assert got.dtype == torch.bfloat16
    assert ((got.double() - ref).norm() / ref.norm()).item() < 5e-3


def test_causal_prefix_attention_rejects_bad_shapes():
    with pytest.raises(ValueError, match="keys"):
        causal_prefix_attention(torch.zeros(5, 2, 8), torch.zeros(3, 2, 8), torch.zeros(3, 2, 8), 1.0)
    with pytest.raises(ValueError, match="heads"):
        causal_prefix_attention(torch.zeros(2, 3, 8), torch.zeros(3, 2, 8), torch.zeros(3, 2, 8), 1.0)
    out = causal_prefix_attention(torch.zeros(0, 2, 8), torch.zeros(3, 2, 8), torch.zeros(3, 2, 4), 1.0)
    assert out.shape == (0, 2, 4)


@pytest.mark.parametrize("seed", range(4))
def test_gather_context_reads_every_region_in_place(seed):
    """A sequence whose blocks are scattered over G, T (in runs) and C, plus a W tail, comes back
    in token order; the pools are unchanged."""
    rng = np.random.default_rng(seed)
    spec = KVSpec.mla(2, 32, 8, torch.float32) if seed % 2 else KVSpec.gqa(2, 2, 8, torch.float32)
    bs, nblk = 4, 12
    pools = {r: torch.randn(pool_shape(r, spec, 16, bs)) for r in (Region.G, Region.T, Region.W)}
    pools[Region.C] = torch.zeros(pool_shape(Region.C, spec, 16, bs))
    truth = torch.randn(spec.num_layers, nblk * bs + 3, spec.num_kv_heads, spec.rec_dim)
    codes = rng.integers(0, 3, nblk).astype(np.uint8)
    ids = np.zeros(nblk, np.int32)
    free = {r: list(rng.permutation(16)) for r in (Region.G, Region.C)}
    t_next = 5
    for b, code in enumerate(codes):
        region = {v: k for k, v in REGION_CODES.items()}[int(code)]
        rec = truth[:, b * bs:(b + 1) * bs]
        if region is Region.T:  # ids in runs, sometimes with a gap
            t_next += int(rng.integers(0, 2))
            ids[b] = t_next
            t_next += 1
        else:
            ids[b] = free[region].pop()
        if region is Region.C:
            pools[Region.C][:, ids[b]].copy_(to_cpu_layout(rec))
        else:
            pools[region][:, ids[b]] = rec
    pools[Region.W][:, 3, :3] = truth[:, nblk * bs:]
    before = {r: p.clone() for r, p in pools.items()}
    plan = ContextPlan.build(codes, ids, 3, 3, bs, torch.device("cpu"))
    assert plan.num_tokens == nblk * bs + 3
    for layer in range(spec.num_layers):
        got = gather_context(plan, pools, layer, bs, torch.device("cpu"))
        torch.testing.assert_close(got, truth[layer], rtol=0, atol=0)
    for r in pools:
        assert torch.equal(pools[r], before[r])


def test_engine_dense_prefill_equals_paged(tiny_deepseek_v2, monkeypatch):
    """The same prompts, chunked over mixed placements: dense and paged prefill give the same
    tokens and log-probabilities (float32)."""
    from test_parity import GREEDY, PLACEMENTS, engine, prompt_ids
    prompts = [prompt_ids(320, n, seed=n) for n in (150, 40, 5)]
    runs = {}
    for dense in ("1", "0"):
        monkeypatch.setenv("WRITESCOPE_DENSE_PREFILL", dense)
        llm = engine(tiny_deepseek_v2, **PLACEMENTS["mixed"])
        runs[dense] = (llm.generate(prompts, GREEDY), llm.stats())
    (a, sa), (b, sb) = runs["1"], runs["0"]
    assert sa["kv.dense_prefill_rows"] > 0 and sb["kv.dense_prefill_rows"] == 0
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert max(abs(p - r) for p, r in zip(x.logprobs, y.logprobs)) < 1e-4


def _mla_case(n, p, dtype=torch.float32, seed=0):
    """DeepSeek-V2-Lite's head shapes (16 heads, 128 nope + 64 rope, values 128, latent 512)."""
    g = torch.Generator().manual_seed(seed)
    h, dn, dr, dv, c = 16, 128, 64, 128, 512
    q_nope = torch.randn(n, h, dn, generator=g)
    q_pe = torch.randn(n, h, dr, generator=g)
    latent = torch.randn(p + n, 1, c + dr, generator=g)
    w = torch.randn(h * (dn + dv), c, generator=g) / c ** 0.5
    return [t.to(dtype) for t in (q_nope, q_pe, latent, w)], (h, dn, dr, dv, c)


@pytest.mark.parametrize("n,p", [(1, 0), (33, 70), (20, 300)])
def test_mla_prefix_attention_per_head_equals_the_absorbed_form(n, p):
    """Decompressing the context (keys per head + the shared rope part, values per head) and
    attending per head gives what the absorbed form over the latent gives once W_UV is applied,
    and matches the float64 oracle of the per-head attention."""
    from writescope.attention.prefill import mla_prefix_attention
    (q_nope, q_pe, latent, w), (h, dn, dr, dv, c) = _mla_case(n, p)
    scale = 0.07
    got = mla_prefix_attention(q_nope, q_pe, latent, w, scale)
    assert got.shape == (n, h, dv)
    wv = w.view(h, dn + dv, c)
    w_uk, w_uv = wv[:, :dn], wv[:, dn:]
    q_abs = torch.cat((torch.einsum("nhd,hdc->nhc", q_nope, w_uk), q_pe), dim=-1)
    lat = causal_prefix_attention(q_abs, latent, latent[..., :c], scale)
    absorbed = torch.einsum("nhc,hvc->nhv", lat, w_uv)
    torch.testing.assert_close(got, absorbed, rtol=2e-4, atol=2e-5)
    kv = (latent[:, 0, :c].double() @ w.double().T).view(-1, h, dn + dv)
    k = torch.cat((kv[..., :dn], latent[:, :, c:].double().expand(-1, h, dr)), dim=-1)
    ref = oracle(torch.cat((q_nope, q_pe), -1).double(), k, kv[..., dn:], scale)
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-5
    with pytest.raises(ValueError):
        mla_prefix_attention(q_nope, q_pe, latent, w[:, :100], scale)


def test_engine_mla_prefill_per_head_equals_absorbed(tiny_deepseek_v2, monkeypatch):
    """DeepSeek-V2's prefill chunks attended per head (the default) or over the absorbed latent:
    the same tokens and log-probabilities (float32), with dense prefill rows in both."""
    from test_parity import GREEDY, PLACEMENTS, engine, prompt_ids
    prompts = [prompt_ids(320, n, seed=n) for n in (150, 40, 5)]
    runs = {}
    for mode in ("heads", "absorbed"):
        monkeypatch.setenv("WRITESCOPE_MLA_PREFILL", mode)
        llm = engine(tiny_deepseek_v2, **PLACEMENTS["mixed"])
        runs[mode] = (llm.generate(prompts, GREEDY), llm.stats())
    (a, sa), (b, sb) = runs["heads"], runs["absorbed"]
    assert sa["kv.dense_prefill_rows"] > 0 and sb["kv.dense_prefill_rows"] > 0
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert max(abs(p - r) for p, r in zip(x.logprobs, y.logprobs)) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,p", [(130, 0), (257, 1000)])
def test_mla_prefix_attention_on_cuda_uses_flash(n, p):
    """bf16 on CUDA: the per-head MLA prefill runs a fused kernel (keys and padded values of
    192), within bf16 tolerance of float32."""
    from writescope.attention.prefill import mla_prefix_attention
    (q_nope, q_pe, latent, w), _ = _mla_case(n, p, seed=3)
    prefill._sdpa_failed.clear()
    got = mla_prefix_attention(*(t.cuda().bfloat16() for t in (q_nope, q_pe, latent, w)), 0.07)
    assert not prefill._sdpa_failed
    ref = mla_prefix_attention(q_nope, q_pe, latent, w, 0.07)
    assert ((got.float().cpu() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("n,p", [(1, 0), (130, 0), (257, 1000)])
def test_causal_prefix_attention_on_cuda(shape, n, p):
    """bf16 on CUDA through SDPA's fused kernels (flash for GQA, memory-efficient for MLA): no
    fallback to the tiles, within bf16 tolerance of float64."""
    hq, hkv, dk, dv, shared = SHAPES[shape]
    g = torch.Generator().manual_seed(7)
    q = torch.randn(n, hq, dk, generator=g)
    k = torch.randn(p + n, hkv, dk, generator=g)
    v = k[..., :dv] if shared else torch.randn(p + n, hkv, dv, generator=g)
    prefill._sdpa_failed.clear()
    got = causal_prefix_attention(q.cuda().bfloat16(), k.cuda().bfloat16(),
                                  v.cuda().bfloat16(), 0.1)
    assert not prefill._sdpa_failed
    ref = oracle(q, k, v, 0.1)
    assert ((got.double().cpu() - ref).norm() / ref.norm()).item() < 1e-2


def test_out_of_memory_is_raised_not_taken_for_a_missing_kernel(monkeypatch):
    """A full device is reported (the caller fails the step) and the fused kernel stays in use;
    a shape with no fused kernel falls back to the tiles for good."""
    q, k = torch.randn(4, 2, 8), torch.randn(9, 2, 8)
    prefill._sdpa_failed.clear()

    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    monkeypatch.setattr(prefill, "_sdpa", oom)
    with pytest.raises(torch.OutOfMemoryError):
        causal_prefix_attention(q, k, k, 0.3)
    assert not prefill._sdpa_failed

    def missing(*a):
        raise RuntimeError("No available kernel. Aborting execution.")
    monkeypatch.setattr(prefill, "_sdpa", missing)
    ref = oracle(q, k, k, 0.3)
    got = causal_prefix_attention(q, k, k, 0.3)
    assert len(prefill._sdpa_failed) == 1
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-5
    prefill._sdpa_failed.clear()
