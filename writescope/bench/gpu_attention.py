"""GPU attention benchmark: resident decode, streamed T attention, hybrid CPU+GPU attention.

``python -m writescope.bench.gpu_attention [--json FILE] [--quick]``

For each attention shape (GQA as in Qwen3-30B-A3B: 32 query heads, 4 KV heads x 128; MLA as in
DeepSeek-V2-Lite: 16 heads over the 576-value latent, V = its first 512) and each batch
(1x256K, 8x32K, 64x4K tokens; one query row per sequence, block size 64):

* **resident**: the Triton paged decode kernel over G blocks; GB/s of KV read vs the HBM copy
  bandwidth measured in the same run (bytes read + written, as the design brief counts it);
* **streamed**: every block in T (pinned host), all layers through :class:`HybridAttention`'s
  staging ring; GB/s vs a plain pinned H2D copy measured in the same run;
* **hybrid**: a share ``x`` of every sequence's blocks in C (pageable, CPU layout, attended by the
  CPU kernel on its worker thread), the rest in T (streamed); spilled GB/s vs the combined
  ceiling measured in the same run (H2D and a CPU read of DRAM running at the same time); in
  up to two forms, alternated share by share (``--step-forms``): the single group (the
  default), and for batches of two or more sequences the pipelined step (two sub-batches
  interleaved, NEO's asymmetric pipelining: the CPU attends one while the other's result, merge
  and next queries make their round trip), the engine's step under ``WRITESCOPE_PIPELINE=1``.

The tests' random multi-region cases with a float64 reference are in :mod:`.attention_case`,
the two-level merge the resident sweep times in :mod:`.merge_tree`, the markdown in
:mod:`.gpu_attention_report`.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

import torch

from ..attention.batch import BlockBatch
from ..attention.groups import AttentionStepPlan
from ..attention.hybrid import HybridAttention
from ..attention.hybrid_cpu import cpu_kernel
from ..kvcache.pools import allocate_pool
from ..kvcache.regions import KVSpec, Region, pool_shape, to_cpu_layout
from .attention_case import rel_err
from .gpu_attention_report import breakdown_markdown, summary_markdown
from .graphed import graph_replay
from .merge_tree import launch_reduce_tree, plan_tree
from .provenance import git_commit, source_digest


# ----------------------------------------------------------------------------------------------
# benchmark
# ----------------------------------------------------------------------------------------------

SHAPES = {
    # name: (spec factory(layers), query heads, model)
    "gqa": (lambda L: KVSpec.gqa(L, 4, 128, torch.bfloat16), 32, "Qwen3-30B-A3B"),
    "mla": (lambda L: KVSpec.mla(L, 512, 64, torch.bfloat16), 16, "DeepSeek-V2-Lite"),
}
BATCHES = {"1x256K": (1, 262144), "8x32K": (8, 32768), "64x4K": (64, 4096)}
#: more batches ``--batches`` takes: the engine's 32K decode steps of issue 6 (one layer each)
EXTRA_BATCHES = {"2x32K": (2, 32768), "4x32K": (4, 32768)}
BATCHES.update({k: v for k, v in EXTRA_BATCHES.items() if k not in BATCHES})
#: the batches a run times unless ``--batches`` says otherwise (issue 9's three)
DEFAULT_BATCHES = ("1x256K", "8x32K", "64x4K")
BLOCK = 64
#: calls per resident-decode timing (queued back to back: :func:`_queued_time`)
RESIDENT_REPS = 20


def _events_time(fn, reps: int) -> float:
    """Median seconds of ``fn`` (device events)."""
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def _queued_time(fn, reps: int) -> float:
    """Median device seconds of ``fn`` over ``reps`` calls enqueued back to back (one event pair
    each, one synchronisation at the end), as a model's layers enqueue their kernels: the host's
    launch time overlaps the device's work instead of sitting between an event and the kernel.
    (:func:`_events_time` synchronises after every call, so a ~150 us kernel also pays its
    launches: Triton's Python launch path costs tens of microseconds.)"""
    fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) / 1e3 for a, b in ev)
    return ts[len(ts) // 2]


def _graph_time(fn, calls: int = 8, reps: int = 9) -> float | None:
    """Median device seconds of one call of ``fn`` as a CUDA graph of ``calls`` calls replays
    it (``graphed.graph_replay``): the engine's form for a resident step (no launch path at
    all). None where the capture fails."""
    try:
        replay = graph_replay(lambda: [fn() for _ in range(calls)], torch.cuda.current_device())
        replay()
        torch.cuda.synchronize()
        return _events_time(replay, reps) / calls
    except Exception:  # noqa: BLE001 -- a capture this build cannot do: no graph figure
        return None


def measure_hbm(dev) -> float:
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    t = _events_time(lambda: y.copy_(x), 10)
    return 2 * 2 * 2**30 / t / 1e9


def measure_h2d(dev, nbytes: int = 2 * 2**30) -> float:
    h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    h.fill_(1)
    d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    d.copy_(h, non_blocking=True)
    t = _events_time(lambda: d.copy_(h, non_blocking=True), 5)
    return nbytes / t / 1e9


def measure_combined(dev, threads: int) -> dict:
    """H2D and a multithreaded CPU read of DRAM at the same time: the ``writescope calibrate``
    probe (2 GiB copies, an 8 GiB array past the 300 MB L3), run with ``threads`` CPU threads."""
    from ..planner.calibrate import concurrent_rates, cpu_read_Bps
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.cuda.device(dev):
            r = concurrent_rates(2 * 2**30, 8 * 2**30, 20, lambda _msg: None)
        alone = cpu_read_Bps(8 * 2**30, 3)
    finally:
        torch.set_num_threads(old)
    h2d = r["concurrent_h2d_Bps"] / 1e9
    cpu = (r["concurrent_cpu_read_Bps"] or 0.0) / 1e9
    return {"h2d_GBps": h2d, "cpu_read_GBps": cpu, "combined_GBps": h2d + cpu,
            "cpu_read_alone_GBps": alone / 1e9, "threads": threads}


def _fill_random(t: torch.Tensor, dev) -> None:
    """Fill a large (host or device) tensor with random bf16 data, generated on the GPU."""
    flat = t.view(-1)
    step = 2**28
    for i in range(0, flat.numel(), step):
        n = min(step, flat.numel() - i)
        flat[i:i + n].copy_(torch.randn(n, device=dev, dtype=t.dtype))


def _seq_batch(nseq: int, tokens: int, ids: torch.Tensor, device, q: int = 1) -> BlockBatch:
    """CSR batch: sequence i attends ``ids[i]`` (full blocks), ``q`` rows each."""
    nb = ids.shape[1] if ids.numel() else 0
    qi = torch.arange(nseq + 1, dtype=torch.int32) * q
    ki = torch.arange(nseq + 1, dtype=torch.int32) * nb
    return BlockBatch(qi, ki, ids.reshape(-1).to(torch.int32),
                      torch.full((nseq * nb,), BLOCK, dtype=torch.int32)).to(device)


def _cfg_name(c) -> str:
    return f"m{c.block_m}n{c.block_n}w{c.num_warps}s{c.num_stages}"


def _configs():
    from ..attention.gpu import KernelConfig as K
    return {"gqa": [K(16, 64, 4, 3), K(16, 64, 2, 2), K(16, 32, 2, 3), K(16, 128, 8, 2),
                    K(16, 32, 4, 4)],
            "mla": [K(16, 32, 4, 3), K(16, 64, 8, 2), K(16, 16, 4, 2), K(16, 32, 8, 2),
                    K(16, 64, 4, 2), K(16, 64, 4, 1), K(16, 32, 4, 1), K(16, 32, 2, 2)]}


class _Lazy(dict):
    def __missing__(self, k):
        self.update(_configs())
        return dict.__getitem__(self, k)


CONFIGS = _Lazy()


#: fan-ins of the two-level merge the resident sweep times (rows of more partials than this)
TREE_FANINS = (16, 32, 64)


def _kernel_times(fn, dev, reps: int = RESIDENT_REPS) -> dict:
    """Mean device microseconds per call of each kernel ``fn`` launches (CUDA profiler): the
    partials' and the merge's own time, apart from the host's launch path. ``{}`` off CUDA;
    ``{"error": ...}`` where the profiler cannot run."""
    if torch.device(dev).type != "cuda":
        return {}
    try:
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        out = {}
        for e in prof.key_averages():
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0.0)
            if us > 0:
                out[e.key[:60]] = round(us / reps, 2)
        return out
    except Exception as e:  # no CUPTI on this machine, a profiler API of another torch
        return {"error": str(e)[:200]}


def reduce_variants(default):
    """The merge tiles the resident sweep times besides ``default`` (a ``ReduceConfig``): for
    few rows of many partials (narrow tiles), partial steps of 32, 64 and 128 (at most 8K fp32
    values a step), and half the value tile with twice the steps."""
    from ..attention.gpu import ReduceConfig
    out = [default]
    tile = default.block_h * default.block_dv
    if tile <= 64:
        for be in (32, 64, 128):
            if be != default.block_e and be * tile <= 8192:
                out.append(ReduceConfig(default.block_h, default.block_dv, be))
    if default.block_dv > 16:
        out.append(ReduceConfig(default.block_h, default.block_dv // 2,
                                min(128, 2 * default.block_e)))
    return out


def bench_resident(shape: str, batch: str, dev, reps: int) -> dict:
    from ..attention import gpu as G
    mk, hq, _ = SHAPES[shape]
    nseq, toks = BATCHES[batch]
    spec = mk(1)
    nb = toks // BLOCK
    pool = torch.empty(pool_shape(Region.G, spec, nseq * nb, BLOCK), dtype=spec.dtype, device=dev)
    _fill_random(pool, dev)
    perm = torch.randperm(nseq * nb).view(nseq, nb)  # scattered blocks
    bb = _seq_batch(nseq, toks, perm, dev)
    q = torch.randn(nseq, hq, spec.k_dim, device=dev, dtype=spec.dtype)
    cpu_b = BlockBatch(bb.q_indptr.cpu(), bb.kv_indptr.cpu(), bb.kv_blocks, bb.kv_lens)
    res = {}
    auto = G.choose_chunk_blocks(nseq * nb, spec)
    dflt = G.default_config(spec, hq // spec.num_kv_heads, 1)
    cfgs = [dflt] + [c for c in CONFIGS[shape] if c != dflt]
    # chunk sizes with the default tiles, then the other tiles at the default chunk size
    variants = [(cb, dflt) for cb in sorted({auto, 2, 4, 8, 16, 32, 64})]
    variants += [(auto, c) for c in cfgs[1:]]
    best = graph_best = None
    plans = {}
    for cb, cfg in variants:
        if cb not in plans:
            plan = G.plan_chunks(cpu_b, cb)
            rp, ri = G.plan_rows([plan], nseq, plan.qmax)
            n = max(1, plan.num_chunks * plan.qmax)
            plans[cb] = (plan.to(dev), plan.qmax, rp.to(dev), ri.to(dev),
                         torch.empty(n, hq, spec.v_dim, device=dev),
                         torch.empty(n, hq, device=dev))
        pd, qmax, rp, ri, po, pl = plans[cb]
        out = torch.empty(nseq, hq, spec.v_dim, device=dev)
        lse = torch.empty(nseq, hq, device=dev)
        kv = pool[0]

        def run():
            G.launch_partials(q, kv, spec, pd, bb.kv_blocks, bb.kv_lens, spec.k_dim ** -0.5,
                              po, pl, qmax, cfg)
            G.launch_reduce(po, pl, rp, ri, out, lse)
        try:
            run()
        except Exception as e:  # a config this Triton/GPU cannot compile (e.g. shared memory)
            res[f"chunk{cb}/{_cfg_name(cfg)}"] = {"error": str(e)[:200]}
            continue
        t = _queued_time(run, max(reps, RESIDENT_REPS))
        gbps = pool.numel() * pool.element_size() / t / 1e9
        res[f"chunk{cb}/{_cfg_name(cfg)}"] = {"s": t, "GBps": gbps}
        tg = _graph_time(run) if torch.device(dev).type == "cuda" else None
        if tg:  # replayed from a CUDA graph, as the engine's resident steps run
            gg = pool.numel() * pool.element_size() / tg / 1e9
            res[f"chunk{cb}/{_cfg_name(cfg)}"].update(graph_s=tg, graph_GBps=gg)
            if graph_best is None or gg > graph_best[1]:
                graph_best = (f"chunk{cb}/{_cfg_name(cfg)}", gg)
        if cfg == dflt:  # the merge's part of it (it reads and writes the partials)
            res[f"chunk{cb}/{_cfg_name(cfg)}"]["reduce_s"] = _queued_time(
                lambda: G.launch_reduce(po, pl, rp, ri, out, lse), max(reps, RESIDENT_REPS))
        if best is None or gbps > best[1]:
            best = (f"chunk{cb}/{_cfg_name(cfg)}", gbps, t)
    dkey = f"chunk{auto}/{_cfg_name(dflt)}"
    # the merge's tiles at the default chunks and tiles: one long sequence leaves a few rows of
    # hundreds of partials each, a chain of BLOCK_E-wide steps per program
    pd, qmax, rp, ri, po, pl = plans[auto]
    out = torch.empty(nseq, hq, spec.v_dim, device=dev)
    lse = torch.empty(nseq, hq, device=dev)

    def partials():
        G.launch_partials(q, pool[0], spec, pd, bb.kv_blocks, bb.kv_lens, spec.k_dim ** -0.5,
                          po, pl, qmax, dflt)

    def time_merge(key: str, merge) -> bool:
        """The default partials and then ``merge``, timed under ``key``; False if it failed."""
        nonlocal best
        try:
            partials()
            merge()
        except Exception as e:  # a tile this Triton cannot compile
            res[key] = {"error": str(e)[:200]}
            return False
        t = _queued_time(lambda: (partials(), merge()), max(reps, RESIDENT_REPS))
        gbps = pool.numel() * pool.element_size() / t / 1e9
        if best is None or gbps > best[1]:
            best = (key, gbps, t)
        res[key] = {"s": t, "GBps": gbps}
        return True

    for rc in reduce_variants(G.reduce_config(nseq, hq, spec.v_dim)):
        key = f"{dkey}/reduce-h{rc.block_h}d{rc.block_dv}e{rc.block_e}"
        merge = functools.partial(G.launch_reduce, po, pl, rp, ri, out, lse, config=rc)
        if time_merge(key, merge):
            res[key]["reduce_s"] = _queued_time(merge, max(reps, RESIDENT_REPS))
    # the merge in two levels (groups of TREE_FANINS partials first), where a row has more
    o_tree = None
    for fanin in TREE_FANINS:
        tree = plan_tree(rp.cpu(), fanin)
        if tree is None:
            continue
        mid = (torch.empty(tree.num_groups, hq, spec.v_dim, device=dev),
               torch.empty(tree.num_groups, hq, device=dev))
        merge = functools.partial(launch_reduce_tree, po, pl, ri, tree.to(dev), out, lse,
                                  mid=mid)
        if time_merge(f"{dkey}/tree{fanin}", merge):
            o_tree = out.clone()
            res[f"{dkey}/tree{fanin}"]["kernels_us"] = _kernel_times(
                lambda: (partials(), merge()), dev)
    res[dkey]["kernels_us"] = _kernel_times(
        lambda: (partials(), G.launch_reduce(po, pl, rp, ri, out, lse)), dev)
    # correctness spot check against the torch path on two sequences' worth
    from ..attention.torch_paged import attend_torch
    o_ref, l_ref = attend_torch(q, pool[0], "gpu", spec, bb, spec.k_dim ** -0.5)
    o, l = G.attend_gpu(q, pool[0], "gpu", spec, bb, spec.k_dim ** -0.5)
    tree_err = rel_err(o_tree, o_ref) if o_tree is not None else None
    ku = res[dkey].get("kernels_us") or {}
    dev_us = sum(v for v in ku.values() if isinstance(v, (int, float)))
    del pool
    torch.cuda.empty_cache()
    return {"bytes": nseq * toks * spec.token_bytes(), "best_variant": best[0],
            "GBps": best[1], "s": best[2], "default_variant": dkey,
            "default_GBps": res[dkey].get("GBps"),
            # every variant replayed from a CUDA graph (the engine's form; CUDA only)
            "default_graph_GBps": res[dkey].get("graph_GBps"),
            "graph_best_variant": graph_best[0] if graph_best else None,
            "graph_best_GBps": graph_best[1] if graph_best else None,
            "default_kernels_us": res[dkey].get("kernels_us"),
            # the default's GB/s over its kernels' own device time (the CUDA profiler): what the
            # queued figure would be with no gap between launches (a slow host's Python launch
            # path shows in ``default_GBps`` when a call's kernels take ~100 us). Under the
            # profiler the kernels can run slower than queued without it (2026-12-04f call 4:
            # GQA 1x256K 2,322 GB/s against 4,067 queued and 4,166 from a graph), so the graph
            # figure is the engine's rate
            "default_device_GBps": (nseq * toks * spec.token_bytes() / (dev_us * 1e-6) / 1e9
                                    if dev_us > 0 else None),
            "variants": res,
            "rel_err_vs_torch": rel_err(o, o_ref), "tree_rel_err_vs_torch": tree_err}


class _SpilledCache:
    """T pool (pinned, GPU layout) and C pool (pageable, CPU layout), each holding every block
    of every sequence for ``layers`` layers, so any CPU share is a choice of ids, not a copy."""

    def __init__(self, shape: str, batch: str, layers: int, dev):
        mk, self.hq, _ = SHAPES[shape]
        self.nseq, self.toks = BATCHES[batch]
        self.spec = mk(layers)
        self.nb = self.toks // BLOCK
        n = self.nseq * self.nb
        self.t_pool = torch.empty(pool_shape(Region.T, self.spec, n, BLOCK),
                                  dtype=self.spec.dtype, pin_memory=True)
        self.c_pool = allocate_pool(Region.C, self.spec, n, BLOCK, torch.device("cpu"))
        one = torch.empty(pool_shape(Region.T, self.spec, n, BLOCK)[1:], dtype=self.spec.dtype,
                          device=dev)
        _fill_random(one, dev)
        host = one.cpu()
        for l in range(layers):
            self.t_pool[l].copy_(host)
            self.c_pool[l].copy_(to_cpu_layout(host))
        del one, host
        self.dev = dev
        # T: each sequence one contiguous extent (as the extent allocator gives); C: scattered
        self.t_ids = torch.arange(n).view(self.nseq, self.nb)
        self.c_ids = torch.randperm(n).view(self.nseq, self.nb)

    def plan(self, share: float) -> AttentionStepPlan:
        spec = self.spec
        ncpu = int(round(share * self.nb))
        p = AttentionStepPlan(spec, spec.k_dim ** -0.5, self.nseq)
        if ncpu < self.nb:
            p.gpu.append((Region.T, _seq_batch(self.nseq, self.toks, self.t_ids[:, ncpu:],
                                               self.dev)))
        if ncpu > 0:
            p.cpu.append((Region.C, _seq_batch(self.nseq, self.toks, self.c_ids[:, :ncpu],
                                               "cpu")))
        return p

    @property
    def bytes_per_step(self) -> int:
        return self.nseq * self.toks * self.spec.token_bytes()


def attend_layers(ha: HybridAttention, plan: AttentionStepPlan, q: torch.Tensor, layers: int,
                  groups: list[int] | None = None) -> torch.Tensor:
    """One decode step's attention over ``layers`` layers, each layer's query depending on the
    previous layer's output as in a model; returns the last layer's output (the step stays
    open: :meth:`HybridAttention.end_step` closes it).

    ``groups``: sequences per sub-batch for the pipelined form (``engine/graphs.py``'s
    ``pipelined_pieces`` order: every sub-batch of layer ``l`` launched, then each finished and
    its layer ``l + 1`` launched at once, so the CPU attends one sub-batch while the other's
    result, merge and next queries make their round trip); None: one group, :meth:`attend`."""
    ha.begin_step(plan, groups=groups)
    if groups is None:
        x = q
        for l in range(layers):
            out, _ = ha.attend(l, x)
            x = q + out[..., :1].to(q.dtype) * 0  # data dependency on the previous layer
        return out
    qs = list(q.split([int(c) for c in groups]))
    for g, qg in enumerate(qs):
        ha.launch(0, qg, g)
    outs = [None] * len(qs)
    for l in range(layers):
        for g, qg in enumerate(qs):
            outs[g], _ = ha.finish(l, g)
            if l + 1 < layers:
                ha.launch(l + 1, qg + outs[g][..., :1].to(q.dtype) * 0, g)
    return torch.cat(outs)


def two_groups(nseq: int) -> list[int] | None:
    """The pipelined form's sub-batches (sequences), as even as a cut allows; None for one."""
    return None if nseq < 2 else [nseq // 2, nseq - nseq // 2]


def _run_steps(ha: HybridAttention, plan_fn, q, layers: int, reps: int,
               groups: list[int] | None = None) -> tuple[float, dict]:
    """Median wall seconds of a decode step's attention over all layers (:func:`attend_layers`,
    from planning the step to its end) and the timings of a step run the same way.

    On CUDA the steps alternate: ``reps`` steps with no device timing events, as the engine runs
    three steps in four (``HybridAttention.timing_every``), give the wall time; ``reps`` steps
    between them record the events the breakdown reports (copy-stream and GPU times, the first
    and last copies), and the median of those is the row's ``timings``. Reading the events back
    (a pair per layer and per copy) costs the host time after the device is done: a timed step
    took 0.25-0.39 ms longer than an untimed one in MLA's 21-23 ms steps (2026-12-04e-h200 call
    1; until then every step was timed and the wall time included it). Without CUDA every step
    is timed and gives both."""
    cuda = ha.device.type == "cuda"
    ha.timing_every = 2 if cuda else 1
    walls, timed = [], []
    n = 2 * reps if cuda else reps
    for i in range(n + 2):  # the first two steps (one of each kind) are not counted
        plan = plan_fn()
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        attend_layers(ha, plan, q, layers, groups)
        tm = ha.end_step()
        dt = time.perf_counter() - t
        if i < 2:
            continue
        if not cuda or tm.get("gpu_s") is None:
            walls.append(dt)
        if not cuda or tm.get("gpu_s") is not None:
            timed.append((dt, tm))
    ws = sorted(walls)
    tms = sorted(timed, key=lambda x: x[0])
    return ws[len(ws) // 2], {**tms[len(tms) // 2][1], "timed_step_s": tms[len(tms) // 2][0]}


def _row(bytes_per_step: int, t: float, tm: dict) -> dict:
    return {"s": t, "GBps": bytes_per_step / t / 1e9,
            **{k: v for k, v in tm.items() if isinstance(v, float)}}


#: the hybrid step's forms: ``single`` (every sequence in one group, :meth:`attend`) and
#: ``pipelined`` (two sub-batches interleaved, for batches of two or more sequences)
STEP_FORMS = ("single", "pipelined")


def bench_spilled(shape: str, batch: str, layers: int, shares: list[float], dev, reps: int,
                  staging: list[int], cpu_threads: int, forms: tuple[str, ...] = ("single",)
                  ) -> dict:
    sc = _SpilledCache(shape, batch, layers, dev)
    pools = {Region.T: sc.t_pool, Region.C: sc.c_pool}
    q = torch.randn(sc.nseq, sc.hq, sc.spec.k_dim, device=dev, dtype=sc.spec.dtype)
    nbytes = sc.bytes_per_step
    res = {"bytes_per_step": nbytes, "layers": layers, "streamed": {}, "hybrid": {}}
    # streamed only, for several ring sizes
    for sb in staging:
        ha = HybridAttention(pools, sc.spec, dev, cpu_threads, staging_bytes=sb)
        t, tm = _run_steps(ha, lambda: sc.plan(0.0), q, layers, reps)
        res["streamed"][str(sb)] = _row(nbytes, t, tm)
        ha.close()
        del ha
        torch.cuda.empty_cache()
    sb = staging[-1]
    groups = two_groups(sc.nseq) if "pipelined" in forms else None
    if groups is not None:
        res["groups"] = groups
        res["hybrid_pipelined"] = {}
    ha = HybridAttention(pools, sc.spec, dev, cpu_threads, staging_bytes=sb, cpu_result="pinned")
    for x in shares:  # the two forms alternate share by share: the host drifts within a run
        if "single" in forms:
            t, tm = _run_steps(ha, lambda: sc.plan(x), q, layers, reps)
            res["hybrid"][f"{x:.2f}"] = _row(nbytes, t, tm)
        if groups is not None:
            t, tm = _run_steps(ha, lambda: sc.plan(x), q, layers, reps, groups)
            res["hybrid_pipelined"][f"{x:.2f}"] = _row(nbytes, t, tm)
    res["cpu_result_mode"] = ha.cpu_result
    # correctness spot check of the hybrid output at one share (last layer) vs the torch path,
    # in each form run
    from ..attention.torch_paged import attend_torch
    from ..attention.merge import merge
    plan = sc.plan(0.5)
    (_, b_t), (_, b_c) = plan.gpu[0], plan.cpu[0]
    ot, lt = attend_torch(q.cpu(), sc.t_pool[layers - 1], "gpu", sc.spec, b_t.to("cpu"),
                          sc.spec.k_dim ** -0.5)
    oc, lc = attend_torch(q.cpu(), sc.c_pool[layers - 1], "cpu", sc.spec, b_c,
                          sc.spec.k_dim ** -0.5)
    o_ref, _ = merge(ot, lt, oc, lc)
    checks = {"rel_err_vs_torch": None}
    if groups is not None:
        checks["pipelined_rel_err_vs_torch"] = groups
    for key, g in checks.items():
        out = attend_layers(ha, sc.plan(0.5), q, layers, g)
        ha.end_step()
        res[key] = rel_err(out, o_ref)
    ha.close()
    return res


def _machine() -> dict:
    d = {"python": platform.python_version(), "torch": torch.__version__,
         "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    d["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if torch.cuda.is_available():
        d["gpu"] = torch.cuda.get_device_name()
    try:
        import triton
        d["triton"] = triton.__version__
    except Exception:
        pass
    k = cpu_kernel()
    d["cpu_kernel"] = f"{k.__module__}.{k.__name__}"
    return d


def default_cpu_threads() -> int:
    """The CPU attention threads the engine runs with on this host: the hybrid rows measure the
    step as the engine takes it (the sixth to ninth sessions ran all 16 cores beside the launching
    thread, and MLA's CPU-only rate came out 50-64 GB/s against the kernel's 68-73 alone)."""
    from ..attention import cpu
    from ..engine.cores import reserved_launch_cores
    n = cpu._usable_cores()
    return max(1, n - reserved_launch_cores(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.gpu_attention",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write results to this JSON file")
    ap.add_argument("--shapes", default="gqa,mla")
    ap.add_argument("--batches", default=",".join(DEFAULT_BATCHES),
                    help=f"comma list of {', '.join(BATCHES)}")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--shares", default="0,0.2,0.3,0.35,0.4,0.45,0.5,0.55,0.6,1")
    ap.add_argument("--staging-mib", default="512,2048",
                    help="staging ring sizes to try for the streamed path (MiB); the last is "
                         "used for the hybrid runs")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="CPU attention threads, also those of the combined ceiling's CPU read "
                         "(default: the engine's, every usable core but the ones it keeps for "
                         "launching: 14 of 16 on the H200 machine)")
    ap.add_argument("--reps", type=int, default=7,
                    help="timed steps per streamed/hybrid row (after one untimed); the row is "
                         "their median (an even count takes the slower middle one)")
    ap.add_argument("--step-forms", default="single",
                    help="hybrid step forms to time, alternating share by share: single (one "
                         "group, the default) and pipelined (two sub-batches interleaved, NEO's "
                         "asymmetric pipelining, as the engine's WRITESCOPE_PIPELINE=1 step; "
                         "batches of two or more sequences). The best hybrid row is the best of "
                         "either. (single,pipelined on the H200, 2026-12-03: the split form read "
                         "0.93-1.00x the single one at each shape's best share)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: resident,spilled")
    ap.add_argument("--breakdown", metavar="JSON",
                    help="print the tables of a saved --json run, with where each hybrid row's "
                         "time went (no device needed), and exit")
    ap.add_argument("--block-sizes", default=None,
                    help="comma list: sweep the KV block size (tokens) instead of the default run; "
                         "prints one table of GB/s per block size")
    args = ap.parse_args(argv)
    if args.cpu_threads is None:
        args.cpu_threads = default_cpu_threads()
    if args.breakdown:
        try:
            with open(args.breakdown) as f:
                saved = json.load(f)
            text = summary_markdown(saved) + "\n\n" + breakdown_markdown(saved)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"gpu_attention: cannot read {args.breakdown} as a --json run: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
            return 2
        print(text)
        return 0
    unknown = [b for b in args.batches.split(",") if b not in BATCHES]
    if unknown:
        print(f"gpu_attention: unknown batch {', '.join(unknown)} (--batches takes a comma list "
              f"of {', '.join(BATCHES)})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_attention: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    skip = set(filter(None, args.skip.split(",")))
    shares = [float(s) for s in args.shares.split(",")]
    forms = tuple(filter(None, args.step_forms.split(",")))
    if not forms or any(f not in STEP_FORMS for f in forms):
        print(f"gpu_attention: --step-forms takes a comma list of {', '.join(STEP_FORMS)}, got "
              f"{args.step_forms!r}", file=sys.stderr)
        return 2
    staging = [int(float(s) * 2**20) for s in args.staging_mib.split(",")]
    out = {"benchmark": "gpu_attention", "git_commit": git_commit(),
           "source_digest": source_digest(), "machine": _machine(),
           "command": "python -m writescope.bench.gpu_attention " + " ".join(
               argv if argv is not None else sys.argv[1:]),
           "block_size": BLOCK, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "results": {}}
    t0 = time.time()
    out["ceilings"] = {"hbm_copy_GBps": measure_hbm(dev), "h2d_pinned_GBps": measure_h2d(dev),
                       "combined": measure_combined(dev, args.cpu_threads)}
    print(json.dumps(out["ceilings"]), flush=True)
    if args.block_sizes:
        return _block_sweep(args, out, dev, shares, staging, skip, t0)
    for shape in args.shapes.split(","):
        for batch in args.batches.split(","):
            key = f"{shape}/{batch}"
            r = out["results"].setdefault(key, {})
            if "resident" not in skip:
                r["resident"] = bench_resident(shape, batch, dev, max(5, args.reps * 3))
                print(key, "resident", json.dumps({k: v for k, v in r["resident"].items()
                                                   if k != "variants"}), flush=True)
            if "spilled" not in skip:
                r.update(bench_spilled(shape, batch, args.layers, shares, dev, args.reps,
                                       staging, args.cpu_threads, forms))
                print(key, "streamed", json.dumps(r["streamed"]), flush=True)
                for hk in ("hybrid", "hybrid_pipelined"):
                    if r.get(hk):
                        print(key, hk, json.dumps({k: round(v["GBps"], 1)
                                                   for k, v in r[hk].items()}), flush=True)
            if args.json:
                _write(args.json, out)
    out["wall_s"] = time.time() - t0
    print(summary_markdown(out))
    if "spilled" not in skip:
        print("\n" + breakdown_markdown(out))
    if args.json:
        _write(args.json, out)
    return 0


def _block_sweep(args, out: dict, dev, shares, staging, skip, t0) -> int:
    """The same measurements at several block sizes (how the default block size was chosen)."""
    global BLOCK
    sweep = out["block_sweep"] = {}
    rows = []
    for bs in (int(b) for b in args.block_sizes.split(",")):
        BLOCK = bs
        for shape in args.shapes.split(","):
            for batch in args.batches.split(","):
                r = sweep.setdefault(str(bs), {}).setdefault(f"{shape}/{batch}", {})
                if "resident" not in skip:
                    r["resident"] = bench_resident(shape, batch, dev, max(5, args.reps * 3))
                if "spilled" not in skip:
                    r.update(bench_spilled(shape, batch, args.layers, shares, dev, args.reps,
                                           staging, args.cpu_threads))
                res = r.get("resident", {}).get("GBps", float("nan"))
                st = max((v["GBps"] for v in r.get("streamed", {}).values()), default=float("nan"))
                hy = max((v["GBps"] for v in r.get("hybrid", {}).values()), default=float("nan"))
                rows.append(f"| {bs} | {shape}/{batch} | {res:.0f} | {st:.1f} | {hy:.1f} |")
                print(rows[-1], flush=True)
                if args.json:
                    _write(args.json, out)
    out["block_size"] = None
    out["wall_s"] = time.time() - t0
    print("| block size | shape/batch | resident GB/s | streamed GB/s | hybrid best GB/s |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        _write(args.json, out)
    return 0


def _write(path: str, out: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
