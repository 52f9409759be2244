"""``FastLaunch.bind``: a launch with its named arguments fixed passes the kernel exactly what
the unbound launch passes, and keys its positional arguments as finely (a stand-in for Triton's
JIT, so this runs without a GPU; tests/test_gpu_attention.py launches a real kernel bound)."""
import pytest
import torch

from writescope.attention import launch as L
from writescope.bench.launch_host import StandInJit, measure


def kern(X, Y, n, scale, BLOCK, MODE, FLAG=False):
    pass


@pytest.fixture
def jit(monkeypatch):
    monkeypatch.setattr(L, "raw_stream", lambda device: 7)
    monkeypatch.setenv("WRITESCOPE_FAST_LAUNCH", "1")
    return StandInJit(kern, {"BLOCK", "MODE", "FLAG"})


def test_a_bound_launch_passes_what_the_unbound_one_passes(jit):
    x, y = torch.zeros(64), torch.zeros(64)
    fl = L.FastLaunch(jit)
    for _ in range(2):
        fl[(4, 2)](x, y, 64, 0.5, BLOCK=32, MODE="a", num_warps=4)
    unbound = jit.calls[-1][1]
    b = fl.bind(BLOCK=32, MODE="a", num_warps=4)
    b[(4, 2)](x, y, 64, 0.5)
    assert jit.calls[-1][1] == unbound  # the kernel the unbound launch kept, the same arguments
    assert unbound == (4, 2, 1, 7, "fn", "md", None, None, None, x, y, 64, 0.5, 32, "a", False)
    assert len(jit.compiled) == 1 and (fl.direct, fl.jit) == (2, 1)


def test_a_bound_launch_keys_alignment_ints_and_dtypes(jit):
    fl = L.FastLaunch(jit)
    b = fl.bind(BLOCK=16, MODE="b", FLAG=True)
    x, y = torch.zeros(64), torch.zeros(64)
    b[(1,)](x, y, 32, 1.0)
    b[(1,)](x, y, 48, 2.0)  # 48: the same specialisation as 32 (not 1, divisible by 16)
    assert len(jit.compiled) == 1
    b[(1,)](x[1:], y, 32, 1.0)  # a tensor 4 bytes off 16-byte alignment
    b[(1,)](x, y, 33, 1.0)  # an int not divisible by 16
    b[(1,)](x, y, 1, 1.0)  # an int equal to 1
    b[(1,)](x.double(), y, 32, 1.0)  # another dtype
    assert len(jit.compiled) == 5
    b[(1,)](x[1:], y, 32, 1.0)
    b[(1,)](x, y, 1, 1.0)
    assert len(jit.compiled) == 5 and fl.direct == 3
    # each launch ran the form compiled for its arguments, with the bound FLAG passed
    assert [k for k, _ in jit.calls] == [0, 1, 3]
    assert all(a[-1] is True and a[-3:-1] == (16, "b") for _, a in jit.calls)


def test_bind_refuses_tensors_and_a_grid_function_goes_through_the_jit(jit):
    fl = L.FastLaunch(jit)
    with pytest.raises(TypeError, match="no tensors"):
        fl.bind(Y=torch.zeros(1))
    b = fl.bind(BLOCK=16, MODE="c")
    x = torch.zeros(8)
    for _ in range(2):
        b[lambda meta: (1,)](x, x, 8, 1.0)
    assert len(jit.compiled) == 2 and fl.direct == 0


def test_fast_launch_off_binds_through_the_jit(jit, monkeypatch):
    monkeypatch.setenv("WRITESCOPE_FAST_LAUNCH", "0")
    fl = L.FastLaunch(jit)
    b = fl.bind(BLOCK=16, MODE="d")
    x = torch.zeros(8)
    for _ in range(3):
        b[(2,)](x, x, 8, 1.0)
    assert len(jit.compiled) == 3 and (fl.direct, fl.jit) == (0, 3)


def test_the_host_time_bench_times_every_way():
    """``python -m writescope.bench.launch_host``: each launch form of both shapes timed (a few
    calls here), the stand-in kernels put back afterwards."""
    from writescope.attention import gpu as G
    before = G._kernels
    rows = measure(calls=50, rounds=1)
    assert [r["shape"] for r in rows] == ["gqa", "mla"]
    assert all(v > 0 for r in rows for k, v in r.items() if k.endswith("_us"))
    assert G._kernels is before
