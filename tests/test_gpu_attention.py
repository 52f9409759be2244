"""GPU attention paths against the float64 dense reference (need CUDA; Triton for the kernels)."""
import pytest
import torch

from writescope.attention.batch import BlockBatch
from writescope.attention.hybrid import HybridAttention
from writescope.attention.staging import StagingRing
from writescope.bench.attention_case import Case, build_case, rel_err
from writescope.kvcache.regions import KVSpec, Region

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = [pytest.mark.gpu, cuda]

SHAPES = {
    "gqa": (KVSpec.gqa(2, 4, 128, torch.bfloat16), 32),
    "gqa-g1": (KVSpec.gqa(2, 2, 64, torch.bfloat16), 2),
    "mla": (KVSpec.mla(2, 512, 64, torch.bfloat16), 16),
}
BF16_TOL = 2e-2  # bf16 K/V/Q and bf16 P in the second product


def _triton():
    from writescope.attention.gpu import triton_available
    if not triton_available():
        pytest.skip("Triton not installed")


def _only(case: Case, regions) -> Case:
    return Case(case.spec, case.hq, case.scale, case.pools, case.plan,
                [[b for b in s if b[0] in regions] for s in case.seqs], case.q_counts)


def _check(o, l, ro, rl, tol=BF16_TOL):
    assert torch.isfinite(o).all()
    assert rel_err(o, ro) < tol, rel_err(o, ro)
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(l.cpu()), fin)
    assert torch.allclose(l.cpu()[fin].double(), rl[fin], atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("qn", [[1, 1, 1, 1, 1], [1, 4, 16, 2, 7], [1, 40, 3, 1, 2]])
@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_paged_decode_vs_reference(shape, bs, qn, chunk):
    _triton()
    from writescope.attention.gpu import attend_gpu
    spec, hq = SHAPES[shape]
    case = build_case(spec, hq, [300, 0, 1000, 65, 4100], q_counts=qn, block_size=bs,
                      frac={"G": 1.0}, w_tail=False, device="cuda", seed=bs + len(qn))
    q = case.random_q("cuda", seed=11)
    batch = dict(case.plan.gpu)[Region.G]
    o, l = attend_gpu(q, case.pools[Region.G][1], "gpu", spec, batch, case.scale,
                      chunk_blocks=chunk)
    ro, rl = case.reference(1, q)
    _check(o, l, ro, rl)


def _mixed_case(shape, bs=16):
    spec, hq = SHAPES[shape]
    return build_case(spec, hq, [200, 5, 0, 513, 64], q_counts=[1, 2, 1, 3, 1], block_size=bs,
                      frac={"G": 0.2, "T": 0.5, "C": 0.3}, cpu_t_frac=0.25, device="cuda",
                      seed=4)


def _checked_step(ha, case: Case, step: int) -> dict:
    """One step of every layer over ``case.plan`` with fresh queries, each layer's result
    checked against the reference on the device; the step's timings."""
    q = case.random_q("cuda", seed=step)
    ha.begin_step(case.plan)
    outs = [ha.attend(layer, q) for layer in range(case.spec.num_layers)]
    tm = ha.end_step()
    for layer, (o, l) in enumerate(outs):
        assert o.device.type == "cuda"
        ro, rl = case.reference(layer, q)
        _check(o, l, ro, rl)
    return tm


@pytest.mark.parametrize("shape", ["gqa", "mla"])
@pytest.mark.parametrize("backend,cpu_wait", [("triton", "device"), ("triton", "host"),
                                              ("torch", "host")])
@pytest.mark.parametrize("ring_blocks,cpu_result", [(3, "pinned"), (10**6, "pinned"),
                                                    (7, "copy")])
def test_hybrid_cuda_vs_reference(shape, backend, cpu_wait, ring_blocks, cpu_result):
    if backend == "triton":
        _triton()
    spec, hq = SHAPES[shape]
    bs = 16
    case = _mixed_case(shape, bs)
    assert case.pools[Region.T].is_pinned()
    blk = bs * spec.num_kv_heads * spec.rec_dim * 2
    ha = HybridAttention(case.pools, spec, "cuda", cpu_threads=2,
                         staging_bytes=min(ring_blocks, 4096) * blk, backend=backend,
                         cpu_result=cpu_result, cpu_wait=cpu_wait)
    for step in range(2):
        tm = _checked_step(ha, case, step)
        n_t = dict(case.plan.gpu)[Region.T].num_blocks
        assert tm["pcie_bytes"] == n_t * blk * spec.num_layers
        assert tm["cpu_s"] > 0
        if step % ha.timing_every == 0:  # device events on one step in timing_every
            assert tm["pcie_s"] > 0 and tm["gpu_s"] > 0
        else:  # not measured: None, so the planner keeps its factors
            assert tm["pcie_s"] is None and tm["gpu_s"] is None
    ha.close()


@pytest.mark.parametrize("shape", ["gqa", "mla"])
@pytest.mark.parametrize("ring_blocks", [3, 40])
def test_hybrid_cuda_with_units_staged_ahead(shape, ring_blocks, monkeypatch):
    """``WRITESCOPE_STAGING_AHEAD=1`` on the copy stream: each step after the first starts from
    units the step before staged while its last layers ran (the link's copies of the next step
    in flight while this one ends); every layer's result is the reference's, every step counts
    its own link bytes, and the timed steps' copy time and first/last copies are measured."""
    _triton()
    monkeypatch.setenv("WRITESCOPE_STAGING_AHEAD", "1")
    monkeypatch.setenv("WRITESCOPE_TIMING_EVERY", "2")
    spec, hq = SHAPES[shape]
    bs = 16
    case = _mixed_case(shape, bs)
    blk = bs * spec.num_kv_heads * spec.rec_dim * 2
    ha = HybridAttention(case.pools, spec, "cuda", cpu_threads=2, staging_bytes=ring_blocks * blk)
    n_t = dict(case.plan.gpu)[Region.T].num_blocks
    for step in range(5):
        tm = _checked_step(ha, case, step)
        assert tm["pcie_bytes"] == n_t * blk * spec.num_layers
        if step % 2 == 0:
            assert tm["pcie_s"] > 0 and tm["dev_last_copy_s"] <= tm["dev_end_s"]
    assert ha.ring.ahead_units["used"] > 0 and ha.ring.ahead_units["dropped"] == 0
    ha.close()


def _slow_or_failing_cpu(case: Case, delay_s: float, fail_layer: int | None):
    """A CPU side that sleeps before each call and raises on one layer's C blocks."""
    from writescope.attention.torch_paged import attend_torch
    c_pool = case.pools[Region.C]

    def attend(q, kv, layout, spec, batch, scale):
        import time
        time.sleep(delay_s)  # the GPU must wait for this, not read a stale result
        if attend.fail is not None and kv.data_ptr() == c_pool[attend.fail].data_ptr():
            raise RuntimeError("injected CPU-side failure")
        return attend_torch(q, kv, layout, spec, batch, scale)
    attend.fail = fail_layer
    return attend


@pytest.mark.parametrize("shape", ["gqa", "mla"])
def test_device_wait_orders_a_slow_cpu_side(shape):
    """With ``cpu_wait="device"`` the launching thread runs ahead; each layer's merge must still
    see that layer's CPU result, however late it comes."""
    _triton()
    case = _mixed_case(shape)
    attend = _slow_or_failing_cpu(case, 0.02, None)
    ha = HybridAttention(case.pools, case.spec, "cuda", cpu_threads=2, backend="triton",
                         cpu_wait="device", cpu_attend=attend)
    q = case.random_q("cuda", seed=3)
    ha.begin_step(case.plan)
    outs = [ha.attend(layer, q) for layer in range(case.spec.num_layers)]
    tm = ha.end_step()
    for layer, (o, l) in enumerate(outs):
        _check(o, l, *case.reference(layer, q))
    assert tm["cpu_wait_s"] < 0.02  # the launching thread did not wait for the CPU
    ha.close()


def test_device_wait_reports_a_failed_cpu_side_and_recovers():
    _triton()
    case = _mixed_case("gqa")
    attend = _slow_or_failing_cpu(case, 0.0, 1)
    ha = HybridAttention(case.pools, case.spec, "cuda", cpu_threads=2, backend="triton",
                         cpu_wait="device", cpu_attend=attend)
    q = case.random_q("cuda", seed=5)
    ha.begin_step(case.plan)
    for layer in range(case.spec.num_layers):
        ha.attend(layer, q)
    with pytest.raises(RuntimeError, match="injected"):
        ha.end_step()
    attend.fail = None  # no layer fails any more
    ha.begin_step(case.plan)
    outs = [ha.attend(layer, q) for layer in range(case.spec.num_layers)]
    ha.end_step()
    for layer, (o, l) in enumerate(outs):
        _check(o, l, *case.reference(layer, q))
    ha.close()


def test_host_flag_wait_times_out_instead_of_hanging():
    _triton()
    from writescope.attention.hostflag import HostFlags
    f = HostFlags(2, "cuda", max_spins=1000)
    f.signal(0, 5)
    f.wait(0, 5)  # already there
    torch.cuda.synchronize()
    f.check()
    f.wait(1, 1)  # never signalled: gives up after 1000 spins
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="gave up"):
        f.check()
    f.check()  # reported once


def test_host_flag_waits_compile_once_for_every_slot_and_value():
    """The device-side wait is compiled once: a step number or call number that reaches 16, 32
    (values Triton would specialise on), or a slot at any address, compiles nothing more. It
    did: the 16th step of every process compiled a second wait kernel, a ~60 ms decode step."""
    _triton()
    from writescope.attention import hostflag
    from writescope.attention.hostflag import HostFlags
    from writescope.bench.jit_log import jit_compiles
    hostflag._kernel.cache_clear()  # a kernel of its own: earlier tests' variants don't count
    f = HostFlags(8, "cuda", max_spins=1000)
    for i in range(8):
        f.signal(i, 64)
    f.wait(0, 3)  # the first call compiles
    torch.cuda.synchronize()
    with jit_compiles() as log:
        for i, value in enumerate((1, 15, 16, 17, 32, 48, 63, 64)):
            f.wait(i, value)
        torch.cuda.synchronize()
    f.check()
    assert log.available
    assert [k for _, k in log] == []


@pytest.mark.parametrize("memop", [True, False])
def test_ready_flag_is_raised_in_stream_order(memop):
    """The stream raises a ReadyFlags word only after the work queued before it; a host thread
    sees it without calling CUDA."""
    from writescope.attention.hostflag import ReadyFlags
    f = ReadyFlags(torch.device("cuda"), n=4)
    f._memop = memop
    if not memop:
        _triton()
    x = torch.zeros(1 << 20, device="cuda")
    host = torch.empty(1 << 20, pin_memory=True)
    f.post().synchronize(timeout=60)  # first use: the store kernel's compilation is not timed
    readies = []
    for k in range(6):  # wraps around the 4 slots: values per slot keep growing
        torch.cuda._sleep(20_000_000)  # ~10 ms of device time before the copy
        x.fill_(k + 1)
        host.copy_(x, non_blocking=True)
        r = f.post()
        assert not r.query()  # the device is still sleeping
        r.synchronize(timeout=30)
        assert host[0].item() == k + 1 and host[-1].item() == k + 1
        readies.append(r)
    assert all(r.query() for r in readies)
    torch.cuda.synchronize()


@pytest.mark.parametrize("driver_copy", ["1", "0"])
def test_ring_on_copy_stream_stages_exact_bytes(driver_copy, monkeypatch):
    """Each run is one driver copy (cuMemcpyHtoDAsync through ctypes), or Tensor.copy_."""
    from writescope.attention.staging import CudaCopier
    monkeypatch.setenv("WRITESCOPE_DRIVER_COPY", driver_copy)
    assert (CudaCopier(torch.device("cuda"))._htod is not None) == (driver_copy == "1")
    pool = torch.randn(4, 40, 16, 2, 8).to(torch.bfloat16).pin_memory()
    b = BlockBatch.build([1, 1, 1], [list(range(3, 15)), [30, 31, 32, 20], [0]],
                         [[16] * 12, [16] * 4, [5]])
    ring = StagingRing((16, 2, 8), torch.bfloat16, "cuda", staging_bytes=5 * 16 * 2 * 8 * 2)
    plan = ring.plan(b)
    ring.begin(pool, plan, [0, 1, 2, 3])
    flat = list(range(3, 15)) + [30, 31, 32, 20, 0]
    k = 0
    for layer in range(4):
        pos = 0
        for i, piece in enumerate(plan.pieces):
            v = ring.acquire(layer, i)
            got = v.clone()  # on the current stream, after the fill
            ring.release(layer, i)
            want = pool[layer, flat[pos:pos + piece.num_blocks]]
            assert torch.equal(got.cpu(), want)
            pos += piece.num_blocks
            k += 1
    assert ring.finish() > 0


@pytest.mark.parametrize("driver_copy", ["1", "0"])
@pytest.mark.parametrize("strided", ["1", "0"])
def test_ring_strided_copies_stage_exact_bytes(driver_copy, strided, monkeypatch):
    """Equal runs at equal spacing (every sequence's tail, a decode step's blocks) go as one
    cuMemcpy2DAsync per piece and layer; the same bytes land as with one copy per run."""
    monkeypatch.setenv("WRITESCOPE_DRIVER_COPY", driver_copy)
    monkeypatch.setenv("WRITESCOPE_COPY_2D", strided)
    pool = torch.randn(3, 64, 16, 2, 8).to(torch.bfloat16).pin_memory()
    seqs = [[i * 9 + 4, i * 9 + 5, i * 9 + 6] for i in range(6)] + [[58], [61], [62]]
    b = BlockBatch.build([1] * 9, seqs, [[16] * len(x) for x in seqs])
    ring = StagingRing((16, 2, 8), torch.bfloat16, "cuda", staging_bytes=64 * 16 * 2 * 8 * 2)
    plan = ring.plan(b)
    assert [len(p.copies) for p in plan.pieces] == ([3] if strided == "1" else [8])
    ring.begin(pool, plan, [0, 1, 2])
    flat = [x for s in seqs for x in s]
    for layer in range(3):
        v = ring.acquire(layer, 0)
        got = v.clone()
        ring.release(layer, 0)
        assert torch.equal(got.cpu(), pool[layer, flat])
    ring.finish()
    n_dma = 3 * (3 if strided == "1" and driver_copy == "1" else 8)
    assert ring.copier.copies == n_dma and ring.copier.bytes == 3 * len(flat) * 16 * 2 * 8 * 2


@pytest.mark.parametrize("mode", ["acquire", "volatile", "memop"])
def test_host_flag_modes_hold_the_stream_until_signalled(mode):
    _triton()
    from writescope.bench.hostflag import probe
    row = probe(mode, 5)
    assert row["ordered"], row
    assert row["timeout_reported"] in (True, None), row


def test_the_bench_runs_its_cpu_side_with_the_engines_threads(monkeypatch):
    """The hybrid rows measure the step as the engine takes it: the CPU kernel on every usable
    core but the one the engine keeps for launching (15 of the H200 host's 16)."""
    from writescope.attention import cpu
    from writescope.bench.gpu_attention import default_cpu_threads
    for usable, threads in ((16, 15), (12, 11), (10, 9), (8, 7), (4, 4), (1, 1)):
        monkeypatch.setattr(cpu, "_usable_cores", lambda u=usable: u)
        assert default_cpu_threads() == threads


def test_fast_launch_keeps_one_kernel_per_specialisation_and_matches_the_jit():
    """The direct launches (kept compiled kernels) give the JIT's results, also when an
    argument's alignment changes between calls (a new specialisation, compiled by the JIT)."""
    _triton()
    from writescope.attention import gpu as G
    from writescope.attention.gpu import attend_gpu
    spec, hq = SHAPES["gqa"]
    case = build_case(spec, hq, [300, 7, 1000], q_counts=[1, 3, 1], block_size=16,
                      frac={"G": 1.0}, w_tail=False, device="cuda", seed=3)
    batch = dict(case.plan.gpu)[Region.G]
    partial, reduce = G._kernels()
    q0 = case.random_q("cuda", seed=5).to(case.pools[Region.G].dtype)  # not converted again
    ro, rl = case.reference(1, q0)
    wide = torch.zeros(q0.numel() + 1, dtype=q0.dtype, device="cuda")
    q_odd = wide[1:].view(q0.shape)  # the same values at an address that is not 16-byte aligned
    q_odd.copy_(q0)
    d0 = partial.direct
    for q in (q0, q0, q_odd, q_odd, q0):
        o, l = attend_gpu(q, case.pools[Region.G][1], "gpu", spec, batch, case.scale)
        _check(o, l, ro, rl)
    assert partial.fast and partial.direct - d0 >= 3  # the repeats went straight to the launcher
    keys = [k for k in partial._kernels if k[0][0] == q0.dtype]  # k[0]: Q's (dtype, aligned)
    assert {k[0][1] for k in keys} >= {True, False}  # aligned and unaligned q kept apart
    assert reduce.direct > 0


def _axpy():
    """A small Triton kernel of its own (a new JIT function each call): ``Y += a * X``."""
    import triton
    import triton.language as tl

    @triton.jit
    def axpy(X, Y, a, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < N
        tl.store(Y + i, tl.load(X + i, mask=m) * a + tl.load(Y + i, mask=m), mask=m)
    return axpy


def test_fast_launch_off_goes_through_the_jit(monkeypatch):
    _triton()
    from writescope.attention.launch import FastLaunch
    axpy = _axpy()
    x = torch.arange(100, dtype=torch.float32, device="cuda")
    for fast in ("1", "0"):
        monkeypatch.setenv("WRITESCOPE_FAST_LAUNCH", fast)
        k = FastLaunch(axpy)
        y = torch.zeros_like(x)
        for _ in range(3):
            k[(4,)](x, y, 2.0, 100, BLOCK=32)
        assert torch.equal(y, 6 * x)
        assert (k.direct, k.jit) == ((2, 1) if fast == "1" else (0, 3))
        if fast == "1":  # the kept form's resources, as bench.step_profile lists them
            from writescope.attention.launch import compiled_resources
            row = [r for r in compiled_resources() if r["kernel"] == "axpy"][-1]
            assert row["warps"] == 4 and row["registers"] > 0 and row["spilled"] == 0
            assert row["dependent"] is False


def test_a_bound_launch_runs_the_kernel_the_unbound_one_keeps():
    """``FastLaunch.bind`` (the attention launches' named arguments fixed once): the same
    results, the kept kernel reused, a misaligned tensor compiled for separately."""
    _triton()
    from writescope.attention.launch import FastLaunch
    x = torch.arange(101, dtype=torch.float32, device="cuda")
    k = FastLaunch(_axpy())
    b = k.bind(BLOCK=32, num_warps=2)
    y = torch.zeros_like(x)
    k[(4,)](x, y, 2.0, 100, BLOCK=32, num_warps=2)
    for _ in range(2):
        b[(4,)](x, y, 2.0, 100)
    assert torch.equal(y[:100], 6 * x[:100]) and (k.direct, k.jit) == (2, 1)
    z = torch.zeros_like(x)
    for _ in range(2):
        b[(4,)](x[1:], z, 1.0, 100)  # 4 bytes off alignment: its own compiled form
    assert torch.equal(z[:100], 2 * x[1:]) and (k.direct, k.jit) == (3, 2)


@pytest.mark.parametrize("shape", ["gqa", "mla"])
def test_the_spilled_bench_runs_both_step_forms_and_checks_each(monkeypatch, shape):
    """bench_spilled on a small batch (4 x 2K): streamed, then the hybrid shares in the single
    and the pipelined form, alternated; each form's output at share 0.5 against the torch path."""
    _triton()
    from writescope.bench import gpu_attention as B
    monkeypatch.setitem(B.BATCHES, "4x2K", (4, 2048))
    dev = torch.device("cuda", torch.cuda.current_device())
    r = B.bench_spilled(shape, "4x2K", 2, [0.0, 0.5, 1.0], dev, 1, [2**20], 2,
                        forms=("single", "pipelined"))
    assert r["groups"] == [2, 2]
    assert set(r["hybrid"]) == set(r["hybrid_pipelined"]) == {"0.00", "0.50", "1.00"}
    assert all(v["GBps"] > 0 for v in r["hybrid_pipelined"].values())
    assert r["rel_err_vs_torch"] < BF16_TOL and r["pipelined_rel_err_vs_torch"] < BF16_TOL
    one = B.bench_spilled(shape, "4x2K", 2, [0.5], dev, 1, [2**20], 2)
    assert "hybrid_pipelined" not in one and "pipelined_rel_err_vs_torch" not in one


def test_planned_attend_gpu_relaunches_what_attend_gpu_computes():
    """``writescope calibrate`` times the kernels of a step already planned
    (``planned_attend_gpu``): each launch gives attend_gpu's result; and a CUDA graph's kernel
    costs less than an eager launch (the model's charge for steps all in HBM)."""
    _triton()
    from writescope.attention.gpu import attend_gpu, planned_attend_gpu
    from writescope.planner.calibrate import graph_launch_s, launch_s
    spec, hq = SHAPES["mla"]
    case = build_case(spec, hq, [300, 65, 1000], block_size=16, frac={"G": 1.0}, w_tail=False,
                      device="cuda", seed=3)
    q = case.random_q("cuda", seed=5)
    batch = dict(case.plan.gpu)[Region.G]
    o, l = attend_gpu(q, case.pools[Region.G][1], "gpu", spec, batch, case.scale)
    run = planned_attend_gpu(q, case.pools[Region.G][1], "gpu", spec, batch, case.scale)
    for _ in range(2):
        o2, l2 = run()
        torch.cuda.synchronize()
        assert torch.equal(o2, o) and torch.equal(l2, l)
    g = graph_launch_s(n=100, reps=3)
    assert 0 < g < launch_s("cuda", n=100)
