"""The link's share of the CPU experts (writescope/layers/expert_link.py): the split, the CPU
kernel leaving the link's slots out, the link's kernels (under Triton's interpreter here, on
CUDA over page-locked weights on the GPU machine) and the engine's tokens with the link on."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_parity import GREEDY, engine, generate_checked, prompt_ids
from triton_interp import run_interpreted
from writescope.layers import cpu_experts as ce
from writescope.layers import expert_link as el
from writescope.layers.cpu_experts import CpuExperts

BACKENDS = ["cpp", "torch"] if ce.available_isas() else ["torch"]


def _layer(E, H, I, dtype, backend="cpp", seed=0):
    g = torch.Generator().manual_seed(seed)
    w = [torch.randn(E, I, H, generator=g) * 0.2, torch.randn(E, I, H, generator=g) * 0.2,
         torch.randn(E, H, I, generator=g) * 0.2]
    return CpuExperts.from_weights(*w, dtype=dtype, backend=backend)


def _routing(n, k, E, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(n, E, generator=g).topk(k, dim=-1).indices
    w = torch.rand(n, k, generator=g).softmax(-1)
    return ids, w


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 16), k=st.integers(1, 6), E=st.integers(6, 40),
       share=st.floats(0.01, 1.0), seed=st.integers(0, 10**6))
def test_split_gives_the_link_the_balancing_count_of_whole_experts(n, k, E, share, seed):
    ids, w = _routing(n, k, E, seed)
    sp = el.split(ids, w, E, share)
    active = sorted(set(ids.view(-1).tolist()))
    link = [e for e in sp.experts.tolist() if e < E]
    m_max = el.link_experts_bound(n, k, E, share)
    assert sp.experts.shape == (m_max,) and sp.weights.shape == (m_max, n)
    # whole experts, the highest active ids, in order; the rest of the list says "none"
    assert link == active[len(active) - len(link):]
    assert all(e == E for e in sp.experts.tolist()[len(link):])
    # the count that balances the two readers (continuous optimum n_act * share, rounded the
    # better way), within the list's bound
    cost = lambda m: max((len(active) - m) * share, m * (1 - share))  # noqa: E731
    lo = math.floor(len(active) * share)
    best = {lo + 1} if cost(lo + 1) < cost(lo) else {lo}
    if abs(cost(lo + 1) - cost(lo)) < 1e-6:  # a tie: either (the device computes in float32)
        best = {lo, lo + 1}
    assert len(link) in {min(b, len(active), m_max) for b in best}
    # the CPU's routing leaves out exactly the link's slots; the weights are the routing's
    on_link = torch.isin(ids, torch.tensor(link, dtype=ids.dtype))
    assert torch.equal(sp.ids_cpu == -1, on_link)
    assert torch.equal(sp.ids_cpu[~on_link].long(), ids[~on_link])
    for i, e in enumerate(link):
        want = (w * (ids == e)).sum(-1)
        assert torch.allclose(sp.weights[i], want)
    assert not sp.weights[len(link):].any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_part_and_link_part_add_up_to_the_whole_call(backend, dtype):
    E, H, I = 10, 72, 40
    layer = _layer(E, H, I, dtype, backend)
    for n, k, share in ((1, 3, 0.36), (4, 2, 0.5), (7, 3, 0.9), (16, 2, 0.3), (2, 2, 0.05)):
        ids, w = _routing(n, k, E, n)
        x = torch.randn(n, H, generator=torch.Generator().manual_seed(n)).to(dtype)
        whole = layer.forward(x, ids, w, out_dtype=torch.float32)
        sp = el.split(ids, w, E, share)
        cpu = layer.forward(x, sp.ids_cpu, w, out_dtype=torch.float32)
        both = cpu + el.run_reference(layer, x, sp)
        # (the torch backend's bf16 linear layers round their outputs to bf16; the reference
        # and the C++ kernel keep fp32 sums)
        tol = 1e-5 if dtype == torch.float32 else 5e-3
        assert ((both - whole).norm() / whole.norm()).item() < tol, (n, k, share)
        # through submit/finish (the MoE layer's path), rounded once to the hidden states' dtype
        got = el.finish(layer, el.submit(layer, x, ids, w, share), dtype)
        assert got.dtype == dtype
        assert ((got.float() - whole).norm() / whole.norm()).item() < 2 * tol, (n, k, share)


def test_routed_bytes_count_the_link_experts_too():
    E, H, I = 8, 32, 32
    layer = _layer(E, H, I, torch.float32)
    ids = torch.tensor([[0, 5, 7]])
    w = torch.ones(1, 3) / 3
    ce.take_routed_bytes()
    sp = el.split(ids, w, E, 0.5)
    assert (sp.ids_cpu == -1).any()
    layer.forward(torch.randn(1, H), sp.ids_cpu, w, routed=ids)
    assert ce.take_routed_bytes() == 3 * layer.expert_bytes
    layer.forward(torch.randn(1, H), sp.ids_cpu, w)  # without the whole routing: the CPU's only
    assert ce.take_routed_bytes() == int((sp.ids_cpu >= 0).sum()) * layer.expert_bytes


def test_setting_and_step_gate(monkeypatch):
    monkeypatch.delenv("WRITESCOPE_EXPERT_LINK", raising=False)
    assert el.setting() == 0.0 and el.ExpertLink("cpu").share == 0.0  # off by default
    assert el.planned_share(None, 1) == 0.0
    monkeypatch.setenv("WRITESCOPE_EXPERT_LINK", "auto")
    assert el.setting() == "auto"
    assert el.ExpertLink("cpu").share == 0.0  # auto: on CUDA only
    for bad in ("2", "-0.1", "half", "nan"):
        monkeypatch.setenv("WRITESCOPE_EXPERT_LINK", bad)
        with pytest.raises(ValueError, match="WRITESCOPE_EXPERT_LINK"):
            el.setting()
    monkeypatch.setenv("WRITESCOPE_EXPERT_LINK", "off")
    assert el.ExpertLink("cpu").share == 0.0
    monkeypatch.setenv("WRITESCOPE_EXPERT_LINK", "0.4")
    link = el.ExpertLink("cpu")
    assert link.share == 0.4 and link.forced
    assert link.share_for(1) == 0.0  # no step open
    link.begin_step(decode=True, streams=False)
    assert link.share_for(1) == 0.4 and link.share_for(el.MAX_TOKENS) == 0.4
    assert link.share_for(el.MAX_TOKENS + 1) == 0.0
    link.begin_step(decode=True, streams=True)  # the link streams KV: left alone
    assert link.share_for(1) == 0.0
    link.begin_step(decode=False, streams=False)  # prefill
    assert link.share_for(1) == 0.0
    link.end_step()
    assert link.share_for(1) == 0.0 and link.calls == 2

    class Profile:
        concurrent_h2d_Bps, concurrent_cpu_read_Bps, has_gpu = 54e9, 97e9, True
    assert el.profile_share(Profile()) == pytest.approx(54 / 151)
    assert el.profile_share(None) == el.DEFAULT_SHARE


def test_copy_read_mode_copies_only_the_links_experts(monkeypatch):
    """``copy_experts`` (the default read mode's copies, on the CPU device here: the same calls)
    puts exactly the link's experts into the buffer's views, counting their bytes; a bad mode
    is refused."""
    from writescope.layers.expert_upload import ExpertUploader
    E, H, I = 8, 32, 48
    layer = _layer(E, H, I, torch.bfloat16)
    buf = ExpertUploader("cpu", min_tokens=1, pin=False)
    buf.register(layer)
    gu, dn = buf.device_views(layer)
    gu.zero_()
    dn.zero_()
    monkeypatch.setattr("writescope.attention.hostflag.stream_ready",
                        lambda dev: type("R", (), {"synchronize": lambda self: None})())
    ids, w = _routing(2, 3, E, 5)
    sp = el.split(ids, w, E, 0.5)
    link = [e for e in sp.experts.tolist() if e < E]
    assert link
    el.copy_experts(layer, sp, buf)
    for e in range(E):
        if e in link:
            assert torch.equal(gu[e], layer.gate_up[e]) and torch.equal(dn[e], layer.down[e])
        else:
            assert not gu[e].any() and not dn[e].any()
    assert buf.link_bytes == len(link) * (gu[0].numel() + dn[0].numel()) * 2
    x = torch.randn(2, H).to(torch.bfloat16)
    ref = el.run_reference(layer, x, sp)
    monkeypatch.setenv("WRITESCOPE_EXPERT_LINK_READ", "sideways")
    with pytest.raises(ValueError, match="WRITESCOPE_EXPERT_LINK_READ"):
        el.read_mode()
    assert ref.shape == (2, H)


def test_run_refuses_more_tokens_than_its_block():
    layer = _layer(4, 32, 32, torch.float32)
    ids, w = _routing(el.MAX_TOKENS + 1, 2, 4, 0)
    sp = el.split(ids, w, 4, 0.5)
    with pytest.raises(ValueError, match="at most"):
        el.run(layer, torch.randn(el.MAX_TOKENS + 1, 32), sp)


KERNELS = r"""
import torch
from writescope.layers import expert_link as el
from writescope.layers.cpu_experts import CpuExperts
dev = "cuda" if torch.cuda.is_available() and not __import__("os").environ.get("TRITON_INTERPRET") else "cpu"
g = torch.Generator().manual_seed(0)
for dt in (torch.float32, torch.bfloat16):
    for E, H, I in ((8, 72, 40), (6, 64, 96), (5, 40, 130)):
        layer = CpuExperts.from_weights(torch.randn(E, I, H, generator=g) * 0.2,
                                        torch.randn(E, I, H, generator=g) * 0.2,
                                        torch.randn(E, H, I, generator=g) * 0.2, dtype=dt)
        if dev == "cuda":
            from writescope.hostmem import pin_tensor
            assert pin_tensor(layer.gate_up) and pin_tensor(layer.down)
        for n, k, share in ((1, 3, 0.36), (4, 2, 0.5), (16, 2, 0.4), (3, 2, 1.0)):
            ids = torch.rand(n, E, generator=g).topk(k, dim=-1).indices.to(dev)
            w = torch.rand(n, k, generator=g).softmax(-1).to(dev)
            x = torch.randn(n, H, generator=g).to(dev, dt)
            sp = el.split(ids, w, E, share)
            assert el.kernels_usable(layer, x)
            got = el.run(layer, x, sp)
            ref = el.run_reference(layer, x, sp)
            assert got.device == x.device and got.shape == (n, H) and got.dtype == torch.float32
            err = ((got.cpu() - ref.cpu()).norm() / ref.norm().clamp_min(1e-30)).item()
            assert err < 1e-5, (dt, E, H, I, n, k, share, err)
            # the copy read mode's kernels: the same over device copies of the tensors
            dev_w = (layer.gate_up.to(dev), layer.down.to(dev))
            assert torch.equal(el.run(layer, x, sp, weights=dev_w), got)
print("ok")
"""


def test_link_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    r = run_interpreted(KERNELS)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_link_kernels_on_cuda_read_pinned_host_weights():
    pytest.importorskip("triton")
    exec(compile(KERNELS, "link_kernels", "exec"), {})


@pytest.mark.parametrize("placement", [dict(kv_policy="cpu", num_gpu_blocks=0),
                                       dict(kv_policy="static", cpu_share=0.5)])
def test_engine_with_the_link_matches_transformers(all_tiny, monkeypatch, placement):
    """Decode steps that stream no KV share their layers' experts with the link (forced share
    off CUDA: the reference path stands for the kernels); tokens and log-probabilities are
    transformers'."""
    monkeypatch.setenv("WRITESCOPE_EXPERT_LINK", "0.5")
    llm = generate_checked(all_tiny, experts="cpu", **placement)
    s = llm.stats()
    assert s["experts.link_share"] == 0.5
    assert s["experts.link_calls"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_with_the_link_on_cuda(all_tiny, monkeypatch):
    """On CUDA with the profile's share: the link's kernels in the decode steps (its experts
    copied into the uploader's buffer, the default read mode), transformers' tokens."""
    monkeypatch.setenv("WRITESCOPE_EXPERT_LINK", "auto")
    llm = generate_checked(all_tiny, experts="cpu", device="cuda", kv_policy="static",
                           cpu_share=0.5)
    s = llm.stats()
    assert s["experts.link_share"] > 0 and s["experts.link_calls"] > 0
    assert s["experts.link_copied_bytes"] > 0
    monkeypatch.setenv("WRITESCOPE_EXPERT_LINK", "off")
    off = engine(all_tiny, experts="cpu", device="cuda", kv_policy="static", cpu_share=0.5)
    ids = prompt_ids(off.engine.config.vocab_size)
    assert off.generate([ids], GREEDY)[0].token_ids == llm.generate([ids], GREEDY)[0].token_ids
    assert off.stats()["experts.link_calls"] == 0
