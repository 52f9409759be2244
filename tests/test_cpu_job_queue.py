"""The native side of the device-waited CPU attention (csrc/attn_ops.cpp): a call whose team
starts before its ready word and spins on it (``spin_s``), and the job queue that runs such calls
in order on a thread of its own (``cpu.CpuJobQueue``). Ready words are raised by Python timers
here, as the device stream raises them in the engine."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
import torch

from writescope.attention import cpu
from writescope.attention.batch import BlockBatch
from writescope.kvcache.regions import KVSpec, cpu_pool_shape, gpu_pool_shape

pytestmark = pytest.mark.skipif(not (cpu.available() and cpu.isas()),
                                reason=f"CPU kernel unavailable: {cpu.load_error()}")


def _case(layout: str, seed: int):
    """MLA-shaped (16 heads over one 64+16 latent), bf16, block 32, four sequences of unequal
    length, one of them without blocks; every layer of a 3-layer pool different."""
    spec = KVSpec.mla(3, 64, 16, torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    lens = [[32] * 7 + [9], [32, 5], [], [32] * 20]
    n = sum(len(x) for x in lens) + 3
    shape = (cpu_pool_shape if layout == "cpu" else gpu_pool_shape)(spec, n, 32)
    pool = torch.randn(shape, generator=gen).to(torch.bfloat16)
    perm = torch.randperm(n, generator=gen).tolist()
    blocks = [[perm.pop() for _ in x] for x in lens]
    batch = BlockBatch.build([1] * len(lens), blocks, lens)
    q = torch.randn(len(lens), 16, spec.k_dim, generator=gen).to(torch.bfloat16)
    plan = cpu.CpuAttentionPlan(pool[0], layout, spec, batch, 0.1, q.shape[0], q.shape[1],
                                q.dtype)
    return spec, pool, q, plan


def _raise_later(view: np.ndarray, i: int, value: int, after_s: float) -> None:
    threading.Timer(after_s, lambda: np.copyto(view[i:i + 1], value)).start()


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
def test_spinning_team_same_bits_and_flags(layout):
    """A call whose team spins on the ready word gives the same bits as a plain call, waits for
    the word, stores done; one whose word never comes times out and still stores done."""
    _, pool, q, plan = _case(layout, 1)
    want_o, want_l = plan(q, pool[1])
    words = torch.zeros(4, dtype=torch.int64)
    view, addr = words.numpy(), words.data_ptr()
    out, lse = torch.empty_like(want_o), torch.empty_like(want_l)
    out.fill_(7.0)
    # the word comes 0.15 s on: the call's wait (from its own start) passes 0.02 s even if
    # this thread is held a while before the call (with 0.03 s, 15 ms held failed it)
    _raise_later(view, 0, 3, 0.15)
    times = []
    o, l = plan(q, pool[1], out, lse, ready=(addr, 3), done=(addr + 8, 4), spin_s=0.01,
                times=times)
    assert times[0] >= 0.02 and times[1] > 0 and int(view[1]) == 4
    assert o is out and torch.equal(o, want_o) and torch.equal(l, want_l)
    with pytest.raises(TimeoutError):
        plan(q, pool[1], out, lse, ready=(addr + 16, 1), done=(addr + 24, 5), timeout_s=0.05,
             spin_s=0.01)
    assert int(view[3]) == 5


def test_queue_runs_calls_in_order_and_reports():
    """Calls submitted at once run in submission order, each after its own ready word (raised
    out of order here), each storing its done word; the drain reports every call's time."""
    _, pool, q, plan = _case("cpu", 2)
    want = [plan(q, pool[i]) for i in range(3)]
    words = torch.zeros(8, dtype=torch.int64)
    view, addr = words.numpy(), words.data_ptr()
    outs = [(torch.empty_like(want[0][0]), torch.empty_like(want[0][1])) for _ in range(3)]
    queue = cpu.CpuJobQueue()
    try:
        for i in range(3):
            queue.submit(plan, q, pool[i], *outs[i], ready=(addr + 8 * i, 1),
                         done=(addr + 8 * (4 + i), 10 + i), spin_s=0.002)
        # (call 0's wait, from when the queue's thread took it, has 0.17 s of slack over the
        # bounds below: that thread may take it late on a loaded machine)
        for i, delay in ((2, 0.05), (1, 0.1), (0, 0.2)):
            _raise_later(view, i, 1, delay)
        calls, waited, kernel = queue.drain(timeout_s=10)
        assert calls == 3 and waited >= 0.03 and kernel > 0
        assert [int(v) for v in view[4:7]] == [10, 11, 12]
        for (o, l), (wo, wl) in zip(outs, want):
            assert torch.equal(o, wo) and torch.equal(l, wl)
        assert queue.drain() == (0, 0.0, 0.0)  # nothing since the last drain
        times = queue.times()  # per call: popped <= inputs seen <= done, on perf_counter's clock
        assert len(times) == 3 and all(a <= b <= c for a, b, c in times)
        assert all(times[i][2] <= times[i + 1][0] for i in range(2))  # one call after another
        assert times[0][1] - times[0][0] >= 0.03  # call 0 waited ~200 ms for its inputs
        assert abs(times[2][2] - time.perf_counter()) < 5.0 and queue.times() == []  # taken once
    finally:
        queue.close()


def test_queue_failure_reaches_drain_and_close_never_hangs():
    """A call whose ready word never comes fails at the drain (its done word stored); closing a
    queue with calls still waiting gives them up at once and stores their done words."""
    _, pool, q, plan = _case("gpu", 3)
    o, l = plan(q, pool[0])
    words = torch.zeros(4, dtype=torch.int64)
    view, addr = words.numpy(), words.data_ptr()
    queue = cpu.CpuJobQueue()
    queue.submit(plan, q, pool[0], o, l, ready=(addr, 1), done=(addr + 8, 2), timeout_s=0.05)
    with pytest.raises(TimeoutError):
        queue.drain(timeout_s=10)
    assert int(view[1]) == 2
    queue.submit(plan, q, pool[0], o, l, ready=(addr + 16, 1), done=(addr + 24, 3),
                 timeout_s=60)
    queue.submit(plan, q, pool[0], o, l, ready=(addr + 16, 1), done=(addr + 24, 4),
                 timeout_s=60)
    time.sleep(0.02)
    t0 = time.perf_counter()
    queue.close()
    assert time.perf_counter() - t0 < 5 and int(view[3]) == 4
    with pytest.raises(RuntimeError):
        queue.submit(plan, q, pool[0], o, l, ready=None, done=None)


def test_queue_refuses_queries_it_would_have_to_convert_now():
    """A queued call reads its queries when it runs (after their ready word): queries the
    kernel cannot take as they are (here float16, converted at once) are refused."""
    _, pool, q, plan16 = _case("cpu", 4)
    q16 = q.to(torch.float16)
    plan16 = cpu.CpuAttentionPlan(pool[0], "cpu", plan16.spec, plan16.batch, 0.1, q.shape[0],
                                  q.shape[1], q16.dtype)
    o, l = plan16(q, pool[0])
    queue = cpu.CpuJobQueue()
    try:
        with pytest.raises(ValueError):
            queue.submit(plan16, q16, pool[0], o, l, ready=None, done=None)
    finally:
        queue.close()


def test_queue_refuses_a_torch_path_plan():
    spec = KVSpec.mla(1, 64, 16, torch.float16)  # fp16 KV: the torch path
    pool = torch.zeros(cpu_pool_shape(spec, 2, 32), dtype=torch.float16)
    batch = BlockBatch.build([1], [[0]], [[32]])
    q = torch.zeros(1, 16, spec.k_dim)
    plan = cpu.CpuAttentionPlan(pool[0], "cpu", spec, batch, 0.1, 1, 16, q.dtype)
    queue = cpu.CpuJobQueue()
    try:
        with pytest.raises(ValueError):
            queue.submit(plan, q, pool[0], torch.empty(1, 16, 64), torch.empty(1, 16),
                         ready=None, done=None)
    finally:
        queue.close()


@pytest.mark.parametrize("dtype,fp8", [(torch.bfloat16, False), (torch.float32, False),
                                       (torch.bfloat16, True)])
def test_queued_expert_jobs_wait_compute_and_raise_their_flags(dtype, fp8):
    """CPU routed experts on the queue (``CpuJobQueue.submit_fn`` with the experts library's
    ``ws_moe_job``): each job waits for its ready word, writes the same result as the experts'
    own forward into the pinned-style buffer, then raises its done word; a failing job (an
    expert id out of range) still raises its word and the drain reports it. FP8 experts too
    (the job carries their scales and line masks)."""
    from writescope.layers.cpu_experts import CpuExperts, get_lib
    from writescope.models.quantization import Fp8Blocks
    if get_lib() is None:
        pytest.skip("CPU expert kernel unavailable")
    gen = torch.Generator().manual_seed(3)
    ex = CpuExperts.random(8, 64, 96, torch.bfloat16, seed=5,
                           fp8=Fp8Blocks((16, 16)) if fp8 else None)
    words = np.zeros(8, dtype=np.int64)
    base = words.ctypes.data
    queue = cpu.CpuJobQueue()
    try:
        cases = []
        for j in range(3):
            n = (1, 5, 17)[j]
            hidden = torch.randn(n, 64, generator=gen).to(dtype)
            ids = torch.randint(0, 8, (n, 2), generator=gen, dtype=torch.int32)
            w = torch.rand(n, 2, generator=gen)
            res = torch.full((n, 64), float("nan"), dtype=dtype)
            ex._submit_native(queue, hidden.to(torch.bfloat16), ids, w, res,
                              ready=(base + 8 * j, 1), done=(base + 8 * (4 + j), 7 + j))
            cases.append((hidden, ids, w, res))
        for j in range(3):
            _raise_later(words, j, 1, 0.02 * (j + 1))
        calls, wait_s, kernel_s = queue.drain(timeout_s=30)
        assert calls == 3 and wait_s > 0.0
        assert words[4:7].tolist() == [7, 8, 9]
        for hidden, ids, w, res in cases:
            want = ex.forward(hidden, ids, w)
            assert res.dtype == want.dtype == dtype
            assert torch.equal(res, want)
        bad = torch.zeros(2, 64, dtype=torch.bfloat16)
        ex._submit_native(queue, bad, torch.tensor([[0, 8], [1, 2]], dtype=torch.int32),
                          torch.ones(2, 2), torch.empty(2, 64, dtype=dtype), ready=None,
                          done=(base + 8 * 7, 3))
        with pytest.raises(RuntimeError, match="-1"):
            queue.drain(timeout_s=30)
        assert words[7] == 3
    finally:
        queue.close()


def test_two_regions_and_their_merge_on_the_queue():
    """A layer whose CPU side attends C blocks (CPU layout) and T blocks read in place (GPU
    layout): two queued calls, the second into scratch, then the queued log-sum-exp merge into
    the first's buffers and the done word -- the merge module's result, to float32 rounding;
    rows empty in one region or both merge as the identity."""
    from writescope.attention.merge import merge
    _, pool_c, q, plan_c = _case("cpu", 4)
    _, pool_t, _, plan_t = _case("gpu", 5)
    oc, lc = plan_c(q, pool_c[1])
    ot, lt = plan_t(q, pool_t[2])
    want_o, want_l = merge(oc, lc, ot, lt)
    assert torch.isinf(lc[2]).all() and torch.isinf(lt[2]).all()  # the sequence without blocks
    words = torch.zeros(2, dtype=torch.int64)
    view, addr = words.numpy(), words.data_ptr()
    out, lse = torch.full_like(oc, 9.0), torch.full_like(lc, 9.0)
    o2, l2 = torch.empty_like(oc), torch.empty_like(lc)
    queue = cpu.CpuJobQueue()
    try:
        queue.submit(plan_c, q, pool_c[1], out, lse, ready=(addr, 1), done=None)
        queue.submit(plan_t, q, pool_t[2], o2, l2, ready=None, done=None)
        queue.submit_merge(out, lse, o2, l2, done=(addr + 8, 6))
        _raise_later(view, 0, 1, 0.02)
        calls, _, _ = queue.drain(timeout_s=30)
    finally:
        queue.close()
    assert calls == 3 and int(view[1]) == 6
    torch.testing.assert_close(out, want_o, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, want_l, rtol=1e-6, atol=1e-6)
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isinf(lse[2]).all()
    with pytest.raises(ValueError):
        cpu.CpuJobQueue().submit_merge(out, lse, o2[:1], l2[:1], done=None)


def test_two_regions_in_one_call():
    """The same two regions attended by one call (``second=``, the engine's default): on the
    queue, between the ready and done words, and called directly -- the merge of the two calls'
    results, to float32 rounding, with the sequence without blocks (0, -inf). Plans for other
    queries cannot share a call."""
    from writescope.attention.merge import merge
    spec, pool_c, q, plan_c = _case("cpu", 4)
    _, pool_t, _, plan_t = _case("gpu", 5)
    want_o, want_l = merge(*plan_c(q, pool_c[1]), *plan_t(q, pool_t[2]))
    assert plan_c.pairs_with(plan_t) and plan_t.pairs_with(plan_c)
    words = torch.zeros(2, dtype=torch.int64)
    view, addr = words.numpy(), words.data_ptr()
    out, lse = torch.full_like(want_o, 9.0), torch.full_like(want_l, 9.0)
    queue = cpu.CpuJobQueue()
    try:
        queue.submit(plan_c, q, pool_c[1], out, lse, ready=(addr, 1), done=(addr + 8, 6),
                     second=(plan_t, pool_t[2]))
        _raise_later(view, 0, 1, 0.02)
        calls, _, _ = queue.drain(timeout_s=30)
    finally:
        queue.close()
    assert calls == 1 and int(view[1]) == 6
    for o, l in [(out, lse), plan_t(q, pool_t[2], second=(plan_c, pool_c[1]))]:
        torch.testing.assert_close(o, want_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(l, want_l, rtol=1e-5, atol=1e-5)
        assert torch.equal(o[2], torch.zeros_like(o[2])) and torch.isinf(l[2]).all()
    other = cpu.CpuAttentionPlan(pool_t[0], "gpu", spec, BlockBatch.build([2], [[0]], [[32]]),
                                 0.1, 2, q.shape[1], q.dtype)
    assert not plan_c.pairs_with(other)
    with pytest.raises(ValueError):
        plan_c(q, pool_c[1], second=(other, pool_t[2]))


class _Words:
    """Ready and done words in ordinary host memory: on CUDA they are a HostFlags' pinned array,
    the device raising ready and waiting on done; here the test raises ready."""

    def __init__(self, n: int):
        self._view = np.zeros(n, dtype=np.int64)

    def address(self, i: int) -> int:
        return self._view.ctypes.data + 8 * i


@pytest.fixture
def native_experts():
    """``layers.cpu_experts`` with its compiled kernel and native queue (else the test skips),
    nothing of another test's left on the queue or in the routing."""
    from writescope.layers import cpu_experts as ce
    from writescope.layers import cpu_experts_calls as calls
    if ce.get_lib() is None or calls.get_native_queue() is None:
        pytest.skip("CPU expert kernel or native queue unavailable")
    ce.raise_pending_errors()
    ce.take_routed_bytes()
    return ce


def test_graphed_expert_call_host_half_resets_words_and_computes_real_rows(native_experts):
    """A graphed CPU expert call's host half (cpu_experts_graph.GraphedCall.submit, what each
    replay queues): both words back to 0 first (stale 1s from the last step must not let the job
    start or the device go on), then the kernel over the step's real rows only, from the fixed
    buffers the graph's copies fill, into the fixed result buffer; padded rows (here with expert
    ids out of range, which would fail the job) are never read, their results stay zero. The
    drain (raise_pending_errors) reports the kernel's seconds, and the routed bytes count the
    real rows' experts."""
    from writescope.layers.cpu_experts_graph import GraphedCall
    ce = native_experts
    gen = torch.Generator().manual_seed(11)
    ex = ce.CpuExperts.random(8, 64, 96, torch.bfloat16, seed=2)
    rows, n, k = 8, 5, 2
    hidden = torch.randn(rows, 64, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, 8, (rows, k), generator=gen, dtype=torch.int32)
    ids[n:] = 99  # padding: out of range, never read
    w = torch.rand(rows, k, generator=gen)
    words = _Words(4)
    words._view[:] = 1  # the last step's values
    call = GraphedCall(ex, rows, hidden.clone(), ids.clone(), w.clone(),
                       torch.zeros(rows, 64, dtype=torch.bfloat16),
                       torch.empty(rows, ex.hp, dtype=torch.float32), words, 2)
    with pytest.raises(ValueError, match="8 rows"):
        call.submit(9)
    call.submit(n)
    assert words._view[2:4].tolist() == [0, 0]
    time.sleep(0.05)
    assert words._view[3] == 0  # the job waits for its ready word
    _raise_later(words._view, 2, 1, 0.01)
    kernel_s = ce.raise_pending_errors()
    assert kernel_s is not None and kernel_s > 0
    assert words._view[3] == 1
    assert ce.take_routed_bytes() == len(set(ids[:n].view(-1).tolist())) * ex.expert_bytes
    assert torch.equal(call.res[:n], ex.forward(hidden[:n], ids[:n], w[:n]))
    assert not call.res[n:].any()


def test_drain_up_to_a_mark_leaves_later_calls_running():
    """``drain(upto=mark)`` waits only for the calls submitted before the mark and reports only
    their figures and failures; a later call (a graph's next replay, queued while this one ran)
    keeps waiting for its ready word, and its failure reaches the drain that covers it."""
    _, pool, q, plan = _case("cpu", 4)
    o, l = plan(q, pool[0])
    words = torch.zeros(8, dtype=torch.int64)
    view, addr = words.numpy(), words.data_ptr()
    queue = cpu.CpuJobQueue()
    try:
        assert queue.mark() == 0
        queue.submit(plan, q, pool[0], o, l, ready=(addr, 1), done=(addr + 8, 1))
        first = queue.mark()
        queue.submit(plan, q, pool[1], o.clone(), l.clone(), ready=(addr + 16, 1),
                     done=(addr + 24, 1), timeout_s=3.0)
        assert first == 1 and queue.mark() == 2
        _raise_later(view, 0, 1, 0.01)
        t0 = time.perf_counter()
        calls, _, kernel = queue.drain(timeout_s=10, upto=first)
        # (well before the second call's 3 s timeout: the drain did not wait for it)
        assert calls == 1 and kernel > 0 and time.perf_counter() - t0 < 2.0
        assert int(view[1]) == 1 and int(view[3]) == 0  # the second still waits
        assert queue.drain(upto=first) == (0, 0.0, 0.0)  # covered already
        with pytest.raises(TimeoutError, match="ready"):  # its word never came: its failure
            queue.drain(timeout_s=10)
        assert int(view[3]) == 1
    finally:
        queue.close()


def test_overlapped_replays_of_a_graphed_expert_call(native_experts):
    """Two replays of one graphed call in flight at once (an overlapped decode step,
    engine/inflight.py), the device played by the test: the second submit, made while the
    first replay is in flight (``overlapping``), does not touch the words; each job takes its
    ready word back to 0 once it has seen it (so the second cannot start on the first's raise),
    and the device takes done back to 0 after its wait (its wait kernel's reset), before it raises
    ready for the second. ``settle`` at the first step's mark drains the first call only and
    leaves the second waiting; each replay computes its own inputs."""
    from writescope.layers import cpu_experts_graph as ceg
    from writescope.layers.cpu_experts_graph import GraphedCall
    ce = native_experts
    gen = torch.Generator().manual_seed(12)
    ex = ce.CpuExperts.random(8, 64, 96, torch.bfloat16, seed=3)
    rows, k = 4, 2
    steps = [(torch.randn(rows, 64, generator=gen).to(torch.bfloat16),
              torch.randint(0, 8, (rows, k), generator=gen, dtype=torch.int32),
              torch.rand(rows, k, generator=gen)) for _ in range(2)]
    words = _Words(2)
    call = GraphedCall(ex, rows, torch.zeros(rows, 64, dtype=torch.bfloat16),
                       torch.zeros(rows, k, dtype=torch.int32), torch.zeros(rows, k),
                       torch.zeros(rows, 64, dtype=torch.bfloat16),
                       torch.empty(rows, ex.hp, dtype=torch.float32), words, 0)
    assert ceg.overlapping() == 0
    try:
        call.submit(rows)                  # step 1, nothing in flight
        ceg.overlapping(+1)                # step 1 closed without waiting
        mark1 = ce.mark()
        words._view[1] = 1                 # a stale done (the words are not touched now) ...
        call.submit(rows)                  # step 2, launched while step 1 is in flight
        assert words._view.tolist() == [0, 1]
        words._view[1] = 0                 # ... which the device took down after its last wait
        # the device, step 1: its inputs land, ready is raised
        for dst, src in zip((call.xs, call.ids, call.w), steps[0]):
            dst.copy_(src)
        words._view[0] = 1
        deadline = time.perf_counter() + 10
        while words._view[1] != 1 and time.perf_counter() < deadline:
            time.sleep(0.001)
        assert words._view.tolist() == [0, 1]  # the job took ready down, then raised done
        want1 = ex.forward(*steps[0])
        assert torch.equal(call.res, want1)
        time.sleep(0.02)
        assert words._view.tolist() == [0, 1]  # step 2's job waits: ready is 0 again
        t0 = time.perf_counter()
        assert ce.settle(mark1) > 0 and time.perf_counter() - t0 < 1.0  # step 1's call only
        # the device, after its wait: done back to 0, step 2's inputs, ready
        words._view[1] = 0
        for dst, src in zip((call.xs, call.ids, call.w), steps[1]):
            dst.copy_(src)
        words._view[0] = 1
        ce.raise_pending_errors()
        assert words._view.tolist() == [0, 1]
        assert torch.equal(call.res, ex.forward(*steps[1]))
    finally:
        ceg.settled()
        ce.raise_pending_errors()
        ce.take_routed_bytes()


def _thread_slack_ns() -> int:
    import ctypes
    return int(ctypes.CDLL(None).prctl(30, 0, 0, 0, 0))  # PR_GET_TIMERSLACK: the calling thread's


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
@pytest.mark.parametrize("setting, want", [(None, 1000), ("2500", 2500), ("default", None)])
def test_waiting_threads_nap_with_the_configured_timer_slack(monkeypatch, setting, want):
    """The threads that poll ready words in 20 us naps get WRITESCOPE_TIMER_SLACK_NS of timer
    slack (1000 ns unless set; "default" leaves the kernel's): the native queue's own thread,
    seen from a job it runs, and a Python worker through ``precise_naps``."""
    import ctypes
    from writescope.attention.hostflag import precise_naps
    if setting is None:
        monkeypatch.delenv("WRITESCOPE_TIMER_SLACK_NS", raising=False)
    else:
        monkeypatch.setenv("WRITESCOPE_TIMER_SLACK_NS", setting)
    inherited = _thread_slack_ns()
    seen = []
    job_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    job = job_t(lambda _arg: seen.append(_thread_slack_ns()) or 0)
    queue = cpu.CpuJobQueue()
    try:
        queue.submit_fn(ctypes.cast(job, ctypes.c_void_p).value, 0, job, ready=None, done=None)
        assert queue.drain(timeout_s=30)[0] == 1
    finally:
        queue.close()
    out = []
    t = threading.Thread(target=lambda: (precise_naps(), out.append(_thread_slack_ns())))
    t.start()
    t.join()
    expect = inherited if want is None else want
    assert seen == [expect] and out == [expect]


def test_a_bad_timer_slack_setting_is_refused(monkeypatch):
    from writescope.attention.hostflag import precise_naps
    for bad in ("0", "-5", "fast"):
        monkeypatch.setenv("WRITESCOPE_TIMER_SLACK_NS", bad)
        with pytest.raises(ValueError, match="WRITESCOPE_TIMER_SLACK_NS"):
            precise_naps()
        with pytest.raises(ValueError, match="WRITESCOPE_TIMER_SLACK_NS"):
            cpu.CpuJobQueue()


@pytest.fixture
def team_lock():
    """``cpu.set_team_lock`` back to its setting after the test."""
    before = cpu.team_lock()
    yield cpu.set_team_lock
    cpu.set_team_lock(before)


def test_two_queues_calls_share_the_cores_one_at_a_time(team_lock):
    """Two job queues with calls ready at once -- one's CPU attention, the other's CPU routed
    experts, as a step split into two sub-batches has them -- run their kernels one at a time
    under the team lock (csrc/attn_ops.cpp ``g_team_mu``): no call's kernel interval (inputs
    ready and the cores taken, to done) overlaps another queue's. The results are those of
    each call alone, and a call's wait for the cores counts as waiting, not as its kernel.
    (Without the lock both teams ran at once: the check below fails with
    ``WRITESCOPE_CPU_TEAM_LOCK=0``.)"""
    from writescope.layers.cpu_experts import CpuExperts, get_lib
    if get_lib() is None:
        pytest.skip("CPU expert kernel unavailable")
    team_lock(True)
    spec = KVSpec.mla(3, 256, 32, torch.bfloat16)
    gen = torch.Generator().manual_seed(21)
    lens = [[32] * 96, [32] * 64 + [7]]
    n = sum(len(x) for x in lens)
    pool = torch.randn(cpu_pool_shape(spec, n, 32), generator=gen).to(torch.bfloat16)
    perm = torch.randperm(n, generator=gen).tolist()
    batch = BlockBatch.build([1, 1], [[perm.pop() for _ in x] for x in lens], lens)
    q = torch.randn(2, 16, spec.k_dim, generator=gen).to(torch.bfloat16)
    plan = cpu.CpuAttentionPlan(pool[0], "cpu", spec, batch, 0.05, 2, 16, q.dtype)
    want_attn = plan(q, pool[1])
    ex = CpuExperts.random(16, 256, 512, torch.bfloat16, seed=9)
    hidden = torch.randn(24, 256, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, 16, (24, 4), generator=gen, dtype=torch.int32)
    w = torch.rand(24, 4, generator=gen)
    want_ex = ex.forward(hidden, ids, w)
    words = np.zeros(2, dtype=np.int64)
    attn_q, expert_q = cpu.CpuJobQueue(), cpu.CpuJobQueue()
    calls = 6
    try:
        outs, results = [], []
        for _ in range(calls):  # every input ready at once (no ready words)
            o, l = torch.empty_like(want_attn[0]), torch.empty_like(want_attn[1])
            attn_q.submit(plan, q, pool[1], o, l, ready=None, done=None)
            outs.append((o, l))
            res = torch.empty(24, 256, dtype=torch.bfloat16)
            ex._submit_native(expert_q, hidden, ids, w, res, ready=None,
                              done=(words.ctypes.data + 8, 1))
            results.append(res)
        assert attn_q.drain(timeout_s=60)[0] == calls
        assert expert_q.drain(timeout_s=60)[0] == calls
        spans = {name: [(ready, done) for _, ready, done in queue.times()]
                 for name, queue in (("attention", attn_q), ("experts", expert_q))}
    finally:
        attn_q.close()
        expert_q.close()
    assert all(len(s) == calls for s in spans.values())
    for a0, a1 in spans["attention"]:
        for e0, e1 in spans["experts"]:
            assert a1 <= e0 or e1 <= a0, (
                f"attention's kernel {a0:.6f}-{a1:.6f} overlaps the experts' {e0:.6f}-{e1:.6f}")
    for o, l in outs:
        assert torch.equal(o, want_attn[0]) and torch.equal(l, want_attn[1])
    for res in results:
        assert torch.equal(res, want_ex)


def test_the_team_lock_setting(team_lock, monkeypatch):
    """``set_team_lock`` returns the setting before and reaches the library; ``None`` goes
    back to ``WRITESCOPE_CPU_TEAM_LOCK`` (on unless it says 0/off/false/no)."""
    assert team_lock(False) in (True, False) and cpu.team_lock() is False
    assert cpu._load().ws_set_team_lock(0) == 0  # the library holds the same setting
    assert team_lock(True) is False and cpu._load().ws_set_team_lock(1) == 1
    monkeypatch.setenv("WRITESCOPE_CPU_TEAM_LOCK", "off")
    team_lock(None)
    assert cpu.team_lock() is False
    monkeypatch.setenv("WRITESCOPE_CPU_TEAM_LOCK", "1")
    team_lock(None)
    assert cpu.team_lock() is True
