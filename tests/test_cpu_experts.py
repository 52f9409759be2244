"""CPU routed experts (writescope.layers.cpu_experts): every kernel code path this machine has,
and the pure-torch path, against a float64 reference and the plain torch expert computation."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from writescope.layers import cpu_experts as ce
from writescope.layers.cpu_experts import CpuExperts

ROOT = Path(__file__).resolve().parents[1]
ISAS = ce.available_isas()  # [] when no compiler: then only the torch path is tested
PATHS = [("cpp", isa) for isa in ISAS] + [("torch", None)]
PATH_IDS = [f"cpp-{i}" if b == "cpp" else "torch" for b, i in PATHS]


def _use(monkeypatch, isa, amx_min=1):
    if isa is None:
        monkeypatch.delenv("WRITESCOPE_CPU_EXPERT_ISA", raising=False)
    else:
        monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_ISA", isa)
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_AMX_MIN", str(amx_min))


def _weights(E, H, I, seed=0, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, I, H, generator=g) * scale, torch.randn(E, I, H, generator=g) * scale,
            torch.randn(E, H, I, generator=g) * scale)


def _routing(N, E, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(N, E, generator=g).topk(k, dim=-1).indices
    w = torch.rand(N, k, generator=g).softmax(-1)
    return ids, w


def _expert_h(x, ids, gate, up):
    """Each (token t, slot j, expert e, h = silu(gate_e x_t) * up_e x_t) in float64 (x, gate
    and up already float64)."""
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            yield t, j, e, F.silu(gate[e] @ x[t]) * (up[e] @ x[t])


def ref64(x, ids, w, gate, up, down, round_h_to=None):
    """float64 oracle: sum_j w[t,j] * down_e(silu(gate_e x) * up_e x), token by token."""
    x, gate, up, down = (t.double() for t in (x, gate, up, down))
    out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float64)
    for t, j, e, h in _expert_h(x, ids, gate, up):
        if round_h_to is not None:
            h = h.to(round_h_to).double()
        out[t] += float(w[t, j]) * (down[e] @ h)
    return out


def bf16_tie_slack(x, ids, w, gate, up, down, rel: float = 2.0 ** -18):
    """Per output element, the most :func:`ref64` with ``round_h_to=torch.bfloat16`` can be
    off from a kernel that computes h in float32: where an element of h lies within ``rel`` of
    a bfloat16 rounding midpoint, float32 may round it to the other neighbour (one ulp away),
    moving the output by up to ``w * |down[:, i]| * ulp``. Zero where no h is that close."""
    x, gate, up, down = (t.double() for t in (x, gate, up, down))
    slack = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float64)
    for t, j, e, h in _expert_h(x, ids, gate, up):
        hb = h.to(torch.bfloat16).double()
        ulp = torch.ldexp(torch.ones_like(hb), torch.frexp(hb.abs().clamp_min(1e-30))[1] - 8)
        near = ((h - hb).abs() - ulp / 2).abs() <= rel * h.abs()
        if near.any():
            slack[t] += abs(float(w[t, j])) * (down[e][:, near].abs() @ ulp[near])
    return slack


def plain_torch(x, ids, w, gate, up, down):
    """The plain torch expert computation (the GPU path's arithmetic, in the weights' dtype)."""
    out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float32)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = F.silu(F.linear(x[tok], gate[e])) * F.linear(x[tok], up[e])
        out.index_add_(0, tok, F.linear(h, down[e]).float() * w[tok, slot, None])
    return out


# shapes: padding in both dims (80, 100 are not multiples of 32), one token, many tokens per expert
# (E=4, k=4, N=40: every expert gets 40 rows -> several register blocks and AMX tiles)
CASES = [(8, 80, 100, 2, 1), (8, 80, 100, 2, 37), (4, 64, 96, 4, 40), (16, 33, 17, 3, 9)]


@pytest.mark.parametrize("backend,isa", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("E,H,I,k,N", CASES)
def test_fp32_matches_float64(monkeypatch, backend, isa, E, H, I, k, N):
    _use(monkeypatch, isa)
    gate, up, down = _weights(E, H, I)
    ids, w = _routing(N, E, k)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(2))
    layer = CpuExperts.from_weights(gate, up, down, dtype=torch.float32, backend=backend)
    y = layer.forward(x, ids, w)
    assert y.dtype == torch.float32 and y.shape == (N, H)
    assert torch.equal(layer.wait(layer.submit(x, ids, w)), y)  # worker thread == calling thread
    ref = ref64(x, ids, w, gate, up, down)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("backend,isa", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("E,H,I,k,N", CASES)
def test_bf16_matches_float64_and_plain_torch(monkeypatch, backend, isa, E, H, I, k, N):
    _use(monkeypatch, isa)
    bf = torch.bfloat16
    gate, up, down = (t.to(bf) for t in _weights(E, H, I))
    ids, w = _routing(N, E, k)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(2)).to(bf)
    layer = CpuExperts.from_weights(gate, up, down, dtype=bf, backend=backend)
    y = layer.forward(x, ids, w)
    assert y.dtype == bf and y.shape == (N, H)
    assert torch.equal(layer.wait(layer.submit(x, ids, w)), y)
    ref = ref64(x, ids, w, gate, up, down)
    scale = ref.abs().max().item()
    # bf16 output rounding (2^-8 relative) plus the h rounding before the down projection
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=1e-2 * scale)
    if backend == "cpp":  # the kernel rounds h to bf16 exactly once: tighter against that oracle
        ref_h = ref64(x, ids, w, gate, up, down, round_h_to=bf)
        torch.testing.assert_close(y.double(), ref_h, rtol=8e-3, atol=4e-3 * scale)
    torch.testing.assert_close(y.float(), plain_torch(x, ids, w, gate, up, down),
                               rtol=2e-2, atol=1e-2 * scale)


@pytest.mark.skipif(not ISAS, reason="C++ kernel unavailable")
def test_code_paths_agree_and_threads_deterministic(monkeypatch):
    E, H, I, k, N = 8, 96, 64, 2, 23
    gate, up, down = _weights(E, H, I, seed=5)
    ids, w = _routing(N, E, k, seed=6)
    x = torch.randn(N, H)
    layer = CpuExperts.from_weights(gate, up, down, dtype=torch.float32, backend="cpp")
    outs = {}
    for isa in ISAS:
        _use(monkeypatch, isa)
        outs[isa] = layer.forward(x, ids, w)
    for isa in ISAS[1:]:
        torch.testing.assert_close(outs[isa], outs[ISAS[0]], rtol=1e-5, atol=1e-5)
    try:
        ce.set_num_threads(1)
        one = layer.forward(x, ids, w)
        ce.set_num_threads(2)
        two = layer.forward(x, ids, w)
    finally:
        ce.set_num_threads(None)
    assert torch.equal(one, two)  # each output column is owned by one thread: same sum order


@settings(max_examples=20, deadline=None)
@given(E=st.integers(1, 6), H=st.integers(1, 70), I=st.integers(1, 70), k=st.integers(1, 6),
       N=st.integers(0, 20), seed=st.integers(0, 2**16))
def test_random_shapes_fp32(E, H, I, k, N, seed):
    k = min(k, E)
    gate, up, down = _weights(E, H, I, seed=seed)
    ids, w = _routing(N, E, k, seed=seed + 1)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(seed + 2))
    layer = CpuExperts.from_weights(gate, up, down, dtype=torch.float32)
    y = layer.forward(x, ids, w)
    ref = ref64(x, ids, w, gate, up, down)
    assert y.shape == (N, H)
    if N:
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * (ref.abs().max().item() + 1e-6))


def test_async_handles_and_edge_cases():
    E, H, I, k = 6, 48, 40, 2
    gate, up, down = _weights(E, H, I)
    layer = CpuExperts.from_weights(gate, up, down, dtype=torch.float32)
    jobs = []
    for s in range(3):
        ids, w = _routing(5 + s, E, k, seed=10 + s)
        x = torch.randn(5 + s, H)
        jobs.append((x.clone(), ids, w, layer.submit(x, ids, w)))
        x.zero_()  # overwriting the caller's tensor after submit must not change the result
    for x, ids, w, h in reversed(jobs):
        torch.testing.assert_close(layer.wait(h).double(), ref64(x, ids, w, gate, up, down),
                                   rtol=1e-5, atol=1e-5)
    # no tokens
    empty = layer.forward(torch.zeros(0, H), torch.zeros(0, k, dtype=torch.long), torch.zeros(0, k))
    assert empty.shape == (0, H)
    # the same expert twice for one token counts twice; int32 ids; bf16 routing weights
    x = torch.randn(2, H)
    ids = torch.tensor([[3, 3], [0, 5]], dtype=torch.int32)
    w = torch.tensor([[0.25, 0.5], [1.0, -0.5]], dtype=torch.bfloat16)
    torch.testing.assert_close(layer.forward(x, ids, w).double(),
                               ref64(x, ids, w.float(), gate, up, down), rtol=1e-5, atol=1e-5)
    # fp32 hidden into bf16 weights: computed in bf16, returned as fp32
    lb = CpuExperts.from_weights(gate, up, down, dtype=torch.bfloat16)
    y = lb.forward(x, ids, w)
    assert y.dtype == torch.float32
    assert torch.equal(y.bfloat16(), lb.forward(x.bfloat16(), ids, w))  # fp32 sum, rounded once


def test_bad_inputs():
    E, H, I = 4, 32, 32
    layer = CpuExperts.from_weights(*_weights(E, H, I), dtype=torch.float32)
    x = torch.randn(3, H)
    w = torch.ones(3, 2)
    with pytest.raises(IndexError, match="out of range"):
        layer.forward(x, torch.tensor([[0, 1], [2, 4], [0, 1]]), w)
    with pytest.raises(IndexError, match="out of range"):  # (-1 is a slot left out)
        layer.forward(x, torch.tensor([[0, 1], [2, -2], [0, 1]]), w)
    with pytest.raises(IndexError, match="out of range"):  # raised by wait() on the async path
        layer.wait(layer.submit(x, torch.tensor([[0, 1], [2, 7], [0, 1]]), w))
    with pytest.raises(ValueError, match="hidden must be"):
        layer.forward(torch.randn(3, H + 1), torch.zeros(3, 2, dtype=torch.long), w)
    with pytest.raises(ValueError, match="topk_ids"):
        layer.forward(x, torch.zeros(3, 3, dtype=torch.long), w)
    with pytest.raises(ValueError, match="integer"):
        layer.forward(x, torch.zeros(3, 2), w)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        CpuExperts.random(2, 8, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="same"):
        CpuExperts.from_weights(*_weights(2, 8, 8)[:2], _weights(3, 8, 8)[2])
    with pytest.raises(ValueError, match="expected gate/up"):
        g, u, d = _weights(2, 8, 8)
        CpuExperts.from_weights(g, u, d.transpose(1, 2)[:, :, :4])
    with pytest.raises(ValueError):
        ce.set_num_threads(0)


def test_random_layout_and_bytes():
    a = CpuExperts.random(5, 40, 24, torch.bfloat16, seed=3, std=0.5)
    b = CpuExperts.random(5, 40, 24, torch.bfloat16, seed=3, std=0.5, backend="torch")
    c = CpuExperts.random(5, 40, 24, torch.bfloat16, seed=4, std=0.5)
    for e in range(5):
        for wa, wb, wc in zip(a.expert_weights(e), b.expert_weights(e), c.expert_weights(e)):
            assert torch.equal(wa, wb)  # same logical weights whatever the backend's layout
            assert not torch.equal(wa, wc)
    g, u, d = a.expert_weights(0)
    assert g.shape == (24, 40) and u.shape == (24, 40) and d.shape == (40, 24)
    assert 0.4 < torch.cat([g.flatten(), u.flatten(), d.flatten()]).float().std() < 0.6
    assert a.expert_bytes == 3 * 40 * 24 * 2
    assert b.nbytes == 5 * a.expert_bytes  # the torch layout holds no padding
    assert a.nbytes >= b.nbytes
    r = CpuExperts.random(6, 32, 32, torch.float32, seed=0, unique_experts=2)
    assert torch.equal(r.expert_weights(4)[2], r.expert_weights(0)[2])
    assert not torch.equal(r.expert_weights(1)[2], r.expert_weights(0)[2])
    # round trip through from_weights with per-expert lists
    g, u, d = zip(*(a.expert_weights(e) for e in range(5)))
    a2 = CpuExperts.from_weights(list(g), list(u), list(d), dtype=torch.bfloat16)
    assert torch.equal(a2.gate_up, a.gate_up) and torch.equal(a2.down, a.down)


def test_fallback_without_compiler(tmp_path):
    """No compiler: one warning, then the pure-torch path gives the same results."""
    code = textwrap.dedent("""
        import warnings, torch
        from writescope.layers import cpu_experts as ce
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            a = ce.CpuExperts.random(4, 16, 8, torch.float32, seed=0)
            b = ce.CpuExperts.random(4, 16, 8, torch.float32, seed=1)
        msgs = [str(r.message) for r in rec if "C++ kernel unavailable" in str(r.message)]
        assert len(msgs) == 1, msgs
        assert a.backend == b.backend == "torch" and ce.available_isas() == []
        x = torch.randn(3, 16); ids = torch.tensor([[0, 1], [2, 3], [1, 1]]); w = torch.rand(3, 2)
        y = a.forward(x, ids, w)
        ref = torch.zeros(3, 16, dtype=torch.float64)
        for t in range(3):
            for j in range(2):
                g, u, d = (m.double() for m in a.expert_weights(int(ids[t, j])))
                xt = x[t].double()
                ref[t] += float(w[t, j]) * (d @ (torch.nn.functional.silu(g @ xt) * (u @ xt)))
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)
        print("OK")
    """)
    env = dict(os.environ, PATH=str(tmp_path), CXX="", PYTHONPATH=str(ROOT),
               WRITESCOPE_KERNEL_CACHE=str(tmp_path / "cache"))
    env.pop("WRITESCOPE_CPU_EXPERT_BACKEND", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("queue", ["native", "python"])
@pytest.mark.parametrize("result", ["copy", "kernel"])
def test_cuda_hidden_round_trip(queue, result, monkeypatch):
    """The device waits for the CPU's result: on the native job queue (no Python between the
    ready and done words) or on the Python worker, the result copied to the device or read
    there in place (``WRITESCOPE_CPU_EXPERT_RESULT``); the same bits every way, and a failing
    call (an expert id out of range) is raised at the step's end instead of hanging the
    stream."""
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_QUEUE", queue)
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_RESULT", result)
    E, H, I, k, N = 8, 128, 96, 2, 19
    bf = torch.bfloat16
    gate, up, down = (t.to(bf) for t in _weights(E, H, I))
    layer = CpuExperts.from_weights(gate.cuda(), up.cuda(), down.cuda(), dtype=bf)
    ids, w = _routing(N, E, k)
    x = torch.randn(N, H).to(bf)
    cpu = layer.forward(x, ids, w)
    assert ce.raise_pending_errors() > 0  # a host call's seconds, timed where it ran
    h = layer.submit(x.cuda(), ids.cuda(), w.cuda())
    if ISAS:
        assert (h.future is None) == (queue == "native")
    side = torch.randn(256, 256, device="cuda") @ torch.randn(256, 256, device="cuda")  # overlap
    y = layer.wait(h)
    assert y.device.type == "cuda" and y.dtype == bf and side.shape == (256, 256)
    assert torch.equal(y.cpu(), cpu)
    kernel_s = ce.raise_pending_errors()  # the calls' kernel seconds, for the planner
    assert kernel_s is not None and kernel_s > 0
    assert ce.raise_pending_errors() is None  # taken once
    bad = ids.clone()
    bad[3, 1] = E
    y = layer.wait(layer.submit(x.cuda(), bad.cuda(), w.cuda()))
    torch.cuda.synchronize()
    with pytest.raises((RuntimeError, IndexError), match="-1|out of range"):
        ce.raise_pending_errors()
    ce.raise_pending_errors()  # reported once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_results_read_in_place_stay_theirs_while_the_launcher_runs_ahead(monkeypatch):
    """``WRITESCOPE_CPU_EXPERT_RESULT=kernel``: a chain of 24 calls, each on the last one's
    output, launched without waiting: every result read in place by the device matches the
    chain copied by the copy engine -- no pinned result was handed to a later call before the
    device had read it (``cpu_experts_calls.keep_until_read``) -- and a copy engine busy with a
    large host-to-device copy on another stream changes nothing."""
    from writescope.layers import pinned_read
    E, H, I, k, N = 8, 128, 96, 2, 4
    bf = torch.bfloat16
    layer = CpuExperts.from_weights(*(t.to(bf).cuda() for t in _weights(E, H, I)), dtype=bf)
    ids, w = _routing(N, E, k)
    ids, w = ids.cuda(), w.cuda()
    x = torch.randn(N, H, device="cuda").to(bf)

    def chain():
        y = x
        for _ in range(24):  # (each output scaled to at most 1: 24 raw layers overflow)
            y = layer.wait(layer.submit(y, ids, w))
            y = y / y.abs().amax().clamp_min(1e-3)
        ce.raise_pending_errors()
        torch.cuda.synchronize()
        return y.cpu()
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_RESULT", "copy")
    want = chain()
    assert torch.isfinite(want).all() and want.abs().amax() > 0
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_RESULT", "kernel")
    assert pinned_read.in_place(torch.device("cuda"))
    big = torch.empty(256 * 2**20, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dst = big.to("cuda", non_blocking=True)
    got = chain()
    side.synchronize()
    assert torch.equal(got, want) and dst.numel() == big.numel()
    pinned = torch.randn(3, 1000).pin_memory()
    assert torch.equal(pinned_read.to_device(pinned, torch.device("cuda")).cpu(), pinned)
    with pytest.raises(ValueError, match="pinned"):
        pinned_read.to_device(torch.randn(4), torch.device("cuda"))


def test_the_cpu_expert_result_setting(monkeypatch):
    """``WRITESCOPE_CPU_EXPERT_RESULT``: kernel (default) or copy; anything else is refused
    by name; never in place off CUDA."""
    from writescope.layers import pinned_read
    monkeypatch.delenv("WRITESCOPE_CPU_EXPERT_RESULT", raising=False)
    assert pinned_read.result_mode() == "kernel"
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_RESULT", "copy")
    assert pinned_read.result_mode() == "copy"
    assert not pinned_read.in_place(torch.device("cpu"))
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_RESULT", "dma")
    with pytest.raises(ValueError, match="WRITESCOPE_CPU_EXPERT_RESULT"):
        pinned_read.result_mode()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_timeline_marks_each_device_waited_call(monkeypatch):
    """WRITESCOPE_EXPERT_TIMELINE=1: a (ready, seen) pair of device times per device-waited call,
    in stream order (bench.step_profile --timeline splits a step with them); none when off."""
    E, H, I, k, N = 8, 128, 96, 2, 3
    bf = torch.bfloat16
    layer = CpuExperts.from_weights(*(t.to(bf).cuda() for t in _weights(E, H, I)), dtype=bf)
    ids, w = _routing(N, E, k)
    x = torch.randn(N, H, device="cuda").to(bf)
    ce.take_timeline()
    layer.wait(layer.submit(x, ids.cuda(), w.cuda()))
    ce.raise_pending_errors()
    assert ce.take_timeline() == []  # off by default
    monkeypatch.setenv("WRITESCOPE_EXPERT_TIMELINE", "1")
    y = x
    for _ in range(3):
        y = layer.wait(layer.submit(y, ids.cuda(), w.cuda()))
    ce.raise_pending_errors()
    marks = ce.take_timeline()
    assert len(marks) == 3 and marks[0][0] == 0.0
    assert all(b >= a for a, b in marks)
    from writescope.layers import cpu_experts_calls
    res = cpu_experts_calls.last_result_ms  # each result's copy to the device, marked
    assert len(res) == 3 and all(r is not None and r >= 0 for r in res)
    assert all(marks[i][0] >= marks[i - 1][1] for i in range(1, 3))  # each call waits for the last
    assert ce.take_timeline() == []  # taken once


@pytest.mark.parametrize("backend", ["cpp", "torch"] if ISAS else ["torch"])
def test_uploader_runs_cpu_experts_on_the_device_path(backend, monkeypatch):
    """Prefill-sized steps: the packed host weights are copied into one shared buffer and
    unpacked a range of experts at a time (the same result whatever the range); layers of
    different shapes share the buffer."""
    from writescope.layers import moe
    from writescope.layers.expert_upload import ExpertUploader
    layers = []
    for E, H, I, seed in ((6, 40, 24, 0), (4, 64, 48, 1)):
        gate, up, down = _weights(E, H, I, seed=seed)
        layers.append((CpuExperts.from_weights(gate, up, down, dtype=torch.float32,
                                               backend=backend), gate, up, down))
    upl = ExpertUploader("cpu", min_tokens=8)
    for ex, *_ in layers:
        upl.register(ex)
    assert upl.max_bytes == max(ex.gate_up.nbytes + ex.down.nbytes for ex, *_ in layers)
    assert not upl.wants(7) and upl.wants(8)
    for ex, gate, up, down in layers:
        x = torch.randn(9, ex.hidden)
        ids, w = _routing(9, ex.num_experts, 2)
        got = upl.forward(ex, x, ids, w)
        ref = ref64(x, ids, w, gate, up, down)
        assert (got.double() - ref).norm() / ref.norm() < 1e-5
        assert torch.allclose(got, ex.forward(x, ids, w), atol=1e-5)
        gu, dn = ex.unpack_experts(ex.gate_up, ex.down, 1, 4)
        for j in range(3):
            one = ex.unpack_expert(ex.gate_up, ex.down, 1 + j)
            assert torch.equal(gu[j], one[0]) and torch.equal(dn[j], one[1])
        with monkeypatch.context() as mp:  # ranges of one and of two experts
            for n in (1, 2):
                mp.setattr(moe, "GROUP_WEIGHTS", n * 3 * ex.hidden * ex.inter)
                assert torch.equal(upl.forward(ex, x, ids, w), got)
    assert upl.uploads == 6 and upl.device_bytes >= upl.max_bytes
    assert not ExpertUploader("cpu", min_tokens=0).wants(10**6)


def test_pending_device_waited_failures_are_raised_once():
    """CPU expert calls the GPU waited for report their errors when the step ends (the runner
    calls raise_pending_errors after the device is done); the list is cleared either way."""
    import concurrent.futures as cf

    from writescope.layers import cpu_experts as ce
    from writescope.layers import cpu_experts_calls as calls
    ok, bad = cf.Future(), cf.Future()
    ok.set_result(None)
    bad.set_exception(IndexError("topk_ids out of range"))
    calls._pending.extend([ok, bad])
    with pytest.raises(IndexError, match="out of range"):
        ce.raise_pending_errors()
    ce.raise_pending_errors()  # nothing left
    calls._pending.append(ok)
    ce.raise_pending_errors()
    assert calls._pending == []


def test_random_draw_is_chunked_parallel_and_thread_count_free(monkeypatch):
    """Seeded random experts are drawn in row chunks on several threads: the values depend on
    the seed and shapes only, and the chunk that ends a matrix writes the packed layout's
    zero padding (hidden 40 and inter 100 are not multiples of the 32-wide tiles)."""
    monkeypatch.setattr(ce, "_RANDOM_CHUNK_VALUES", 40 * 64)  # several chunks per matrix
    a = CpuExperts.random(3, 40, 100, torch.bfloat16, seed=5, threads=1)
    b = CpuExperts.random(3, 40, 100, torch.bfloat16, seed=5, threads=3)
    t = CpuExperts.random(3, 40, 100, torch.bfloat16, seed=5, threads=2, backend="torch")
    assert torch.equal(a.gate_up, b.gate_up) and torch.equal(a.down, b.down)
    g, u, d = zip(*(a.expert_weights(e) for e in range(3)))
    packed = CpuExperts.from_weights(list(g), list(u), list(d), dtype=torch.bfloat16)
    assert torch.equal(packed.gate_up, a.gate_up) and torch.equal(packed.down, a.down)  # padding 0
    for e in range(3):
        for wa, wt in zip(a.expert_weights(e), t.expert_weights(e)):
            assert torch.equal(wa, wt)
    assert not torch.equal(a.expert_weights(0)[0], a.expert_weights(1)[0])
    assert not torch.equal(a.expert_weights(0)[0], a.expert_weights(0)[1])
    assert 0.018 < torch.cat([w.flatten() for w in a.expert_weights(2)]).float().std() < 0.022
    gen = CpuExperts.random(2, 40, 100, torch.float32, generator=torch.Generator().manual_seed(1))
    gen2 = CpuExperts.random(2, 40, 100, torch.float32, generator=torch.Generator().manual_seed(1))
    assert torch.equal(gen.gate_up, gen2.gate_up)


def test_routed_bytes_count_each_calls_distinct_experts():
    """take_routed_bytes: per call, its distinct experts x one expert's bytes (what the call
    reads), summed over the calls since the last take; None when none ran."""
    E, H, I = 8, 64, 32
    gate, up, down = _weights(E, H, I)
    layer = CpuExperts.from_weights(gate, up, down, dtype=torch.float32)
    ce.take_routed_bytes()  # calls of earlier tests
    x = torch.randn(3, H)
    w = torch.full((3, 2), 0.5)
    layer.forward(x, torch.tensor([[0, 1], [1, 2], [0, 2]]), w)  # experts 0, 1, 2
    layer.wait(layer.submit(x, torch.tensor([[5, 5], [5, 5], [7, 5]]), w))  # 5, 7
    assert layer.expert_bytes == 3 * H * I * 4
    assert ce.take_routed_bytes() == (3 + 2) * layer.expert_bytes
    assert ce.take_routed_bytes() is None
