"""Measuring a :class:`~writescope.planner.profile.HardwareProfile` (``writescope calibrate``).

Each probe times the engine's own kernels or plain torch copies, takes the median of a few
repetitions after a warm-up, and returns bytes per second. Array sizes are chosen past the
last-level cache (the lent Xeon's L3 is 300 MB), smaller with ``quick=True`` (the start-up
calibration: a few seconds). The concurrent H2D + CPU read probe follows shared/hw/probe2.py
(copies on a side stream while CPU threads sum a DRAM array); the CPU attention rate is timed
on the kernel the engine will run (``attention.hybrid_cpu.cpu_kernel()``: the compiled kernel when it
is there, else the torch path), on both layouts, per shape family of the models asked for.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import statistics
import sys
import time
from typing import Callable, Iterable

import torch

from ..hostmem import pageable_empty
from ..models.config import REFERENCE_MODELS, ModelConfig
from .profile import HardwareProfile, expert_key, machine_description
from .roofline import attn_family

GiB = 2 ** 30
MiB = 2 ** 20
BLOCK = 64  # tokens per KV block (kvcache.regions.DEFAULT_BLOCK_SIZE)
#: bytes per probe. "full" is past a 300 MB L3; "quick" (start-up) trades that for seconds.
SIZES = {
    "full": dict(copy=1 * GiB, cpu_read=4 * GiB, concurrent_rounds=16, cpu_attn=1 * GiB,
                 dev_attn_gpu=1 * GiB, dev_attn_cpu=32 * MiB, experts=768 * MiB, reps=5, rt_reps=30),
    "quick": dict(copy=256 * MiB, cpu_read=512 * MiB, concurrent_rounds=8, cpu_attn=64 * MiB,
                  dev_attn_gpu=256 * MiB, dev_attn_cpu=4 * MiB, experts=64 * MiB, reps=2, rt_reps=10),
}


def _median_time(fn: Callable[[], object], reps: int, sync: Callable[[], None] = lambda: None,
                 warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _cuda_sync() -> None:
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------- CPU probes
def cpu_read_Bps(nbytes: int, reps: int) -> float:
    from ..attention.cpu import probe_buffer
    a = probe_buffer(nbytes)  # the C pool's pages, every one touched
    return nbytes / _median_time(a.sum, reps)


def _fill_random(t: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Fill a large tensor with normal values quickly: one random row, repeated."""
    g = torch.Generator().manual_seed(seed)
    flat = t.view(t.shape[0], -1)
    row = torch.randn(min(flat.shape[1], 1 << 20), generator=g).to(device=t.device, dtype=t.dtype)
    reps = -(-flat.shape[1] // row.numel())
    flat.copy_(row.repeat(reps)[:flat.shape[1]].expand_as(flat))
    return t


def _attn_case(cfg: ModelConfig, kv_bytes: int, device: str, layout: str, seqs: int = 8):
    """A one-layer pool of ``kv_bytes``, ``seqs`` sequences over all its blocks, one query each."""
    from ..attention.batch import BlockBatch
    from ..kvcache.regions import KVSpec, cpu_pool_shape, gpu_pool_shape

    spec = cfg.kv_spec(torch.bfloat16)
    one = KVSpec(1, spec.num_kv_heads, spec.rec_dim, spec.k_offset, spec.k_dim, spec.v_offset,
                 spec.v_dim, spec.dtype)
    block_bytes = one.block_bytes(BLOCK)
    n = max(seqs, kv_bytes // block_bytes // seqs * seqs)
    shape = (cpu_pool_shape if layout == "cpu" else gpu_pool_shape)(one, n, BLOCK)[1:]
    pool = _fill_random(torch.empty(shape, dtype=torch.bfloat16, device=device))
    per = n // seqs
    batch = BlockBatch.build([1] * seqs, [list(range(i * per, (i + 1) * per)) for i in range(seqs)],
                             [[BLOCK] * per for _ in range(seqs)], device)
    q = torch.randn(seqs, cfg.num_heads, spec.k_dim, device=device).to(torch.bfloat16)
    return spec, pool, batch, q, n * block_bytes


def cpu_attention_rates(cfgs: Iterable[ModelConfig], kv_bytes: int, reps: int, log,
                        tune_prefetch: bool = True) -> tuple[dict, str, dict, dict]:
    """Per attention family: the CPU kernel's KV bytes/s over C blocks (its layout) and T blocks
    (the GPU layout), with the fastest kernel variant this CPU has and, for the AMX variant, its
    fastest software-prefetch distance (both timed on C blocks; the engine then uses them).
    Returns (rates, kernel name, {family: variant}, {family: prefetch distance}).
    ``tune_prefetch=False`` (a quick calibration, whose KV may sit in the last-level cache,
    where prefetching hides nothing) leaves the distance at its default."""
    from ..attention.hybrid_cpu import cpu_kernel
    from ..attention.torch_paged import attend_torch
    kernel = cpu_kernel()
    name = f"{kernel.__module__}.{kernel.__name__}"
    compiled = kernel is not attend_torch
    out: dict[str, dict[str, float]] = {}
    chosen: dict[str, str] = {}
    chosen_pf: dict[str, int] = {}
    for cfg in cfgs:
        fam = attn_family(cfg)
        if fam in out:
            continue
        out[fam] = {}
        best, pf = None, None
        for region, layout in (("C", "cpu"), ("T", "gpu")):
            spec, pool, batch, q, nbytes = _attn_case(cfg, kv_bytes, "cpu", layout)
            fn = kernel
            try:
                fn(q[:1], pool, layout, spec, _first_sequence(batch), cfg.softmax_scale)
            except (NotImplementedError, ValueError, RuntimeError, TypeError) as e:
                log(f"  {fam} {region}: {name} refused this layout ({e}); timing the torch path")
                fn = attend_torch
            run = lambda: fn(q, pool, layout, spec, batch, cfg.softmax_scale)  # noqa: E731
            if compiled and fn is kernel and region == "C":
                best, dt = _fastest_variant(run, reps, fam, log)
                if best == "amx" and tune_prefetch:
                    pf, dt = _fastest_prefetch(run, reps, fam, log, dt)
            else:
                with _variant(best, pf) if best else contextlib.nullcontext():
                    dt = _median_time(run, reps)
            out[fam][region] = nbytes / dt
            log(f"  cpu attention {fam:16s} {region} ({layout} layout"
                f"{', ' + best if best else ''}{'' if pf is None else f', prefetch {pf}'}): "
                f"{out[fam][region] / 1e9:6.1f} GB/s")
            del pool
        if best is not None:
            chosen[fam] = best
        if pf is not None:
            chosen_pf[fam] = pf
    return out, name, chosen, chosen_pf


@contextlib.contextmanager
def _variant(isa: str, prefetch: int | None = None):
    """Run the compiled CPU attention kernel as one variant (and AMX prefetch distance) for a
    while."""
    from ..attention import cpu
    old, by_user = cpu.current_isa_setting(), cpu.isa_chosen_by_user()
    old_pf, pf_user = cpu.get_prefetch_blocks(), cpu.prefetch_chosen_by_user()
    cpu.set_isa(isa)
    if prefetch is not None:
        cpu.set_prefetch_blocks(prefetch)
    try:
        yield
    finally:
        cpu.set_isa(old, from_profile=not by_user)
        cpu.set_prefetch_blocks(old_pf, from_profile=not pf_user)


#: the AMX kernel's software-prefetch distances calibration tries (blocks ahead; 0: none).
#: The best differs by machine: on the H200 host 1 and 2 are within 3-7% of each other and none
#: is 10-25% slower; on the 2-core dev VM MLA reads 15-30% faster with none and GQA 7-13% slower
#: (bench/results/2026-12-01g-h200, docs/PERFORMANCE-LOG.md, thirteenth session).
PREFETCH_CHOICES = (0, 1, 2)


def _fastest_prefetch(run, reps: int, fam: str, log, dt_current: float) -> tuple[int | None, float]:
    """The AMX kernel's prefetch distance with the shortest median time for ``run`` and that
    time; ``(None, dt_current)`` when the user chose a distance."""
    from ..attention import cpu
    if cpu.prefetch_chosen_by_user():
        return None, dt_current
    times = {}
    for n in PREFETCH_CHOICES:
        with _variant("amx", n):
            times[n] = _median_time(run, reps)
    best = min(times, key=times.get)
    log(f"  cpu attention {fam:16s} amx prefetch distances: "
        + ", ".join(f"{k} {times[best] / v:.2f}x" for k, v in times.items()) + f" -> {best}")
    return best, times[best]


def _timed_variants(chosen: dict[str, str]) -> list[str]:
    """The kernel variants the calibration chose among (every one this build can run), or []
    when it chose none (the user fixed the variant, or no compiled kernel)."""
    from ..attention import cpu
    return list(cpu.isas()) if chosen else []


def _fastest_variant(run, reps: int, fam: str, log) -> tuple[str | None, float]:
    """The kernel variant (ISA) with the shortest median time for ``run`` (bf16 KV), and that
    time; ``(None, time of the current setting)`` when the user chose a variant."""
    from ..attention import cpu
    if os.environ.get("WRITESCOPE_CPU_ATTN_ISA", "auto") != "auto" or not cpu.isas():
        return None, _median_time(run, reps)  # the user chose one: calibrate that
    times = {}
    for isa in cpu.isas():
        with _variant(isa):
            times[isa] = _median_time(run, reps)
    best = min(times, key=times.get)
    log(f"  cpu attention {fam:16s} variants: "
        + ", ".join(f"{k} {times[best] / v:.2f}x" for k, v in times.items()) + f" -> {best}")
    return best, times[best]


def _first_sequence(batch):
    """The first sequence of a batch only (a cheap probe call)."""
    from ..attention.batch import BlockBatch
    k1 = int(batch.kv_indptr[1])
    return BlockBatch(batch.q_indptr[:2], batch.kv_indptr[:2], batch.kv_blocks[:k1], batch.kv_lens[:k1])


def device_attention_rates(cfgs: Iterable[ModelConfig], kv_bytes: int, reps: int, device: str,
                           log) -> dict[str, float]:
    """The device path's attention rate per family: the Triton kernel on a GPU when it runs
    there, the torch path otherwise (also on a machine without a GPU, where the torch path over
    G/T blocks is the 'device' side)."""
    from ..attention.torch_paged import attend_torch
    planned = None
    if device == "cuda":
        try:
            from ..attention import gpu as gpu_mod
            if getattr(gpu_mod, "triton_available", lambda: False)():
                planned = gpu_mod.planned_attend_gpu
        except ImportError:
            pass
    sync = _cuda_sync if device == "cuda" else (lambda: None)
    out: dict[str, float] = {}
    for cfg in cfgs:
        fam = attn_family(cfg)
        if fam in out:
            continue
        spec, pool, batch, q, nbytes = _attn_case(cfg, kv_bytes, device, "gpu")
        # the Triton kernels as a decode step runs them: planned once (the step's host work,
        # outside this rate; until 2026-12-04 the plan was timed too, which put the rate at
        # 1.0-1.6 TB/s on the H200, a third of what the kernels read at), then launched
        fn, name = (lambda: attend_torch(q, pool, "gpu", spec, batch, cfg.softmax_scale)), \
            "attend_torch"
        if planned is not None:
            try:
                fn, name = planned(q, pool, "gpu", spec, batch, cfg.softmax_scale), "attend_gpu"
                fn()
            except Exception as e:  # a kernel that cannot take this shape: the portable path
                log(f"  device attention {fam}: attend_gpu failed ({type(e).__name__}: {e}); "
                    "timing attend_torch")
                fn, name = (lambda: attend_torch(q, pool, "gpu", spec, batch,
                                                 cfg.softmax_scale)), "attend_torch"
        dt = _median_time(fn, reps, sync)
        out[fam] = nbytes / dt
        log(f"  device attention {fam:16s} ({device}, {name}): {out[fam] / 1e9:8.1f} GB/s")
        del pool, fn
    return out


def cpu_expert_rates(cfgs: Iterable[ModelConfig], weight_bytes: int, reps: int, log
                     ) -> tuple[dict[str, float], str]:
    """Routed-expert FFN on the CPU, weight bytes/s, 2 tokens per expert (decode-like)."""
    out: dict[str, float] = {}
    kind = "torch.nn.functional.linear (bf16)"
    cpu_experts_cls = None
    try:
        from ..layers.cpu_experts import CpuExperts
        cpu_experts_cls = CpuExperts
        kind = "writescope.layers.cpu_experts.CpuExperts"
    except ImportError:
        pass
    for cfg in cfgs:
        h, i = cfg.hidden_size, cfg.moe_intermediate_size
        key = expert_key(h, i)
        if key in out:
            continue
        one = 3 * h * i * 2
        e = max(1, min(cfg.num_experts, weight_bytes // one))
        tokens = 2 * e  # each of the e experts gets 2 tokens (decode-like)
        x = torch.randn(tokens, h).to(torch.bfloat16)
        ids = torch.arange(e).repeat_interleave(2).view(tokens, 1)
        w = torch.ones(tokens, 1)
        fn = None
        if cpu_experts_cls is not None:
            try:
                ex = cpu_experts_cls.random(num_experts=e, hidden=h, inter=i, unique_experts=2)
                ex.forward(x[:1], ids[:1], w[:1])
                fn = lambda: ex.forward(x, ids, w)  # noqa: E731
            except Exception as err:
                log(f"  cpu experts {key}: CpuExperts failed ({type(err).__name__}: {err}); timing torch")
                kind = "torch.nn.functional.linear (bf16)"
        if fn is None:
            gu = [_fill_random(torch.empty(2 * i, h, dtype=torch.bfloat16), s) for s in range(e)]
            dn = [_fill_random(torch.empty(h, i, dtype=torch.bfloat16), s) for s in range(e)]

            def fn():
                for k in range(e):
                    xs = x[2 * k:2 * k + 2]
                    g, u = torch.nn.functional.linear(xs, gu[k]).chunk(2, dim=-1)
                    torch.nn.functional.linear(torch.nn.functional.silu(g) * u, dn[k])
        dt = _median_time(fn, reps)
        out[key] = e * one / dt
        log(f"  cpu experts {key:14s} ({e} experts): {out[key] / 1e9:6.1f} GB/s of weights, "
            f"{dt / e * 1e6:7.1f} us per expert")
        if cpu_experts_cls is not None and fn is not None and "torch" not in kind:
            _fp8_expert_rate(cpu_experts_cls, h, i, e, x, ids, w, reps, out, log)
    return out, kind


def _fp8_expert_rate(cls, h: int, i: int, e: int, x, ids, w, reps: int, out: dict, log) -> None:
    """The same call over block-wise FP8 experts (128 x 128 blocks), bytes as stored, under the
    ``-fp8`` key (``HardwareProfile.cpu_expert_rate(..., fp8=True)``), where the kernel keeps
    FP8 experts (the planner prices an FP8 checkpoint's CPU experts with it)."""
    from ..models.quantization import Fp8Blocks
    fp8 = Fp8Blocks()
    if cls.fp8_unsupported(fp8, torch.bfloat16) is not None:
        return
    key = expert_key(h, i, fp8=True)
    try:
        ex = cls.random(num_experts=e, hidden=h, inter=i, unique_experts=2, fp8=fp8)
        ex.forward(x[:1], ids[:1], w[:1])
        dt = _median_time(lambda: ex.forward(x, ids, w), reps)
    except Exception as err:  # noqa: BLE001 - the bf16 rate stands in (profile.cpu_expert_rate)
        log(f"  cpu experts {key}: FP8 experts failed ({type(err).__name__}: {err})")
        return
    out[key] = e * 3 * h * i * fp8.bytes_per_weight / dt
    log(f"  cpu experts {key:14s} ({e} experts): {out[key] / 1e9:6.1f} GB/s of weights, "
        f"{dt / e * 1e6:7.1f} us per expert")


def cpu_roundtrip_s(cfg: ModelConfig, device: str, reps: int) -> float:
    """Fixed cost of one layer's CPU attention round trip on tiny input: queries to the host,
    the CPU kernel on one block per sequence, results back, synchronised."""
    from ..attention.hybrid_cpu import cpu_kernel
    kernel = cpu_kernel()
    spec, pool, batch, q, _ = _attn_case(cfg, 0, "cpu", "cpu", seqs=8)
    qd = q.to(device)
    sync = _cuda_sync if device == "cuda" else (lambda: None)

    def trip():
        o, l = kernel(qd.to("cpu"), pool, "cpu", spec, batch, cfg.softmax_scale)
        o.to(device), l.to(device)
    return _median_time(trip, reps, sync, warmup=3)


def cpu_attn_roundtrip_s(cfg: ModelConfig, device: str, reps: int, layers: int = 16) -> float:
    """CPU attention's fixed cost per layer as the engine's decode step pays it: a hybrid step
    (:class:`~writescope.attention.hybrid.HybridAttention`, the engine's own path: on CUDA the
    native job queue, the team spinning on each layer's ready word, the device waiting on the
    CPU's flag) over one C block per sequence, each layer's queries made on the device from the
    previous layer's result, so that the layers form the chain a model forms. Per layer."""
    from ..attention.batch import BlockBatch
    from ..attention.hybrid import AttentionStepPlan, HybridAttention
    from ..kvcache.regions import Region, cpu_pool_shape

    spec = dataclasses.replace(cfg.kv_spec(torch.bfloat16), num_layers=layers)
    seqs = 8
    pool = _fill_random(pageable_empty(cpu_pool_shape(spec, seqs, BLOCK), torch.bfloat16))
    batch = BlockBatch.build([1] * seqs, [[i] for i in range(seqs)], [[BLOCK]] * seqs)
    dev = torch.device(device)
    ha = HybridAttention({Region.C: pool}, spec, dev, stage_c=False)
    plan = AttentionStepPlan(spec, cfg.softmax_scale, seqs, cpu=[(Region.C, batch)])
    q0 = torch.randn(seqs, cfg.num_heads, spec.k_dim, device=dev).to(torch.bfloat16)
    sync = _cuda_sync if device == "cuda" else (lambda: None)

    def step():
        ha.begin_step(plan)
        q = q0
        for layer in range(layers):
            o, _ = ha.attend(layer, q)
            q = q0 + (o[:, :, :1] * 0).to(q0.dtype)  # the next layer's queries wait for o
        ha.end_step()
    try:
        return _median_time(step, reps, sync, warmup=3) / layers
    finally:
        ha.close()


def launch_s(device: str, n: int = 400) -> float:
    x = torch.zeros(1, device=device)
    sync = _cuda_sync if device == "cuda" else (lambda: None)

    def many():
        for _ in range(n):
            x.add_(1.0)
    return _median_time(many, 3, sync) / n


def graph_launch_s(n: int = 400, reps: int = 5) -> float:
    """One small kernel's share of a CUDA graph's replay: what a decode step whose KV is all
    in HBM (run as CUDA graphs, ``engine/graphs.py``) pays per kernel instead of
    :func:`launch_s`. CUDA only."""
    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # a warm-up off the capture, as torch's docs ask
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1.0)
    return _median_time(g.replay, reps, _cuda_sync) / n


# ---------------------------------------------------------------------------------- GPU probes
def gpu_copy_rates(nbytes: int, reps: int, log) -> dict[str, float]:
    dev = torch.device("cuda")
    res: dict[str, float] = {}
    hp = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    hp.fill_(1)
    pg = torch.empty(nbytes, dtype=torch.uint8)
    pg.fill_(1)
    d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    res["h2d_pinned_Bps"] = nbytes / _median_time(lambda: d.copy_(hp, non_blocking=True), reps, _cuda_sync)
    blk = 512 * 1024
    nblk = min(256, nbytes // blk)

    def blocks():
        for k in range(nblk):
            d[k * blk:(k + 1) * blk].copy_(hp[k * blk:(k + 1) * blk], non_blocking=True)
    res["h2d_pinned_block_Bps"] = nblk * blk / _median_time(blocks, reps, _cuda_sync)
    res["h2d_pageable_Bps"] = nbytes / _median_time(lambda: d.copy_(pg), reps, _cuda_sync)
    res["d2h_pinned_Bps"] = nbytes / _median_time(lambda: hp.copy_(d, non_blocking=True), reps, _cuda_sync)
    d2 = torch.empty_like(d)
    res["hbm_Bps"] = 2 * nbytes / _median_time(lambda: d2.copy_(d), reps, _cuda_sync)
    for k, v in res.items():
        log(f"  {k:22s} {v / 1e9:8.1f} GB/s")
    return res


def concurrent_rates(h2d_bytes: int, cpu_bytes: int, rounds: int, log,
                     cpu_pass: Callable[[torch.Tensor], object] | None = None) -> dict[str, float]:
    """H2D copies on a side stream while the CPU threads sum a DRAM array, both sustained.
    ``cpu_pass(a)``: one read of the array another way (default ``a.sum()``, torch's threads;
    ``writescope.bench.read_probes`` passes the kernels' probes)."""
    cpu_pass = cpu_pass or (lambda a: a.sum())
    dev = torch.device("cuda")
    hp = torch.empty(h2d_bytes, dtype=torch.uint8, pin_memory=True)
    hp.fill_(1)
    d = torch.empty(h2d_bytes, dtype=torch.uint8, device=dev)
    from ..attention.cpu import probe_buffer
    a = probe_buffer(cpu_bytes)
    cpu_pass(a)
    torch.cuda.synchronize()
    st = torch.cuda.Stream()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(st):
        e0.record(st)
        for _ in range(rounds):
            d.copy_(hp, non_blocking=True)
        e1.record(st)
    t0, n = time.perf_counter(), 0
    while not e1.query():
        cpu_pass(a)
        n += 1
    tc = time.perf_counter() - t0
    torch.cuda.synchronize()
    th = e0.elapsed_time(e1) / 1e3
    res = {"concurrent_h2d_Bps": rounds * h2d_bytes / th,
           "concurrent_cpu_read_Bps": n * cpu_bytes / tc if n else None}
    for k, v in res.items():
        log(f"  {k:22s} {v / 1e9 if v else float('nan'):8.1f} GB/s")
    return res


# ---------------------------------------------------------------------------------- all of it
def calibrate(quick: bool = False, models: Iterable[str | ModelConfig] | None = None,
              threads: int | None = None, log: Callable[[str], None] | None = None,
              command: str = "") -> HardwareProfile:
    """Measure this machine. ``models``: configs (or names/paths) whose attention families and
    expert shapes to time; by default the three reference models."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    if threads:
        torch.set_num_threads(threads)
    cfgs = [m if isinstance(m, ModelConfig) else ModelConfig.from_hf(m)
            for m in (models or list(REFERENCE_MODELS))]
    has_gpu = torch.cuda.is_available()
    device = "cuda" if has_gpu else "cpu"
    z = SIZES["quick" if quick else "full"]
    reps = z["reps"]
    t_start = time.perf_counter()
    log(f"calibrating ({'quick' if quick else 'full'}; {torch.get_num_threads()} threads; "
        f"{'GPU: ' + torch.cuda.get_device_name(0) if has_gpu else 'no GPU'})")
    fields: dict = {}
    notes: list[str] = []
    if has_gpu:
        fields.update(gpu_copy_rates(z["copy"], reps, log))
        try:
            fields.update(concurrent_rates(z["copy"], z["cpu_read"], z["concurrent_rounds"], log))
        except RuntimeError as e:  # keep the profile: the model then uses the solo rates
            notes.append(f"concurrent H2D + CPU read probe failed: {e}")
            log(f"  concurrent probe failed: {e}")
    read = cpu_read_Bps(z["cpu_read"], reps)
    log(f"  {'cpu_read_Bps':22s} {read / 1e9:8.1f} GB/s")
    cpu_attn, kernel_name, attn_isa, attn_pf = cpu_attention_rates(cfgs, z["cpu_attn"], reps, log,
                                                                   tune_prefetch=not quick)
    dev_attn = device_attention_rates(cfgs, z["dev_attn_gpu" if has_gpu else "dev_attn_cpu"],
                                      reps, device, log)
    experts, expert_kind = cpu_expert_rates(cfgs, z["experts"], reps, log)
    rt = cpu_roundtrip_s(cfgs[0], device, z["rt_reps"])
    log(f"  {'cpu_roundtrip_s':22s} {rt * 1e6:8.1f} us")
    art = None  # the engine's decode chain only differs from the plain trip with a GPU
    if has_gpu:
        art = cpu_attn_roundtrip_s(cfgs[0], device, z["rt_reps"])
        log(f"  {'cpu_attn_roundtrip_s':22s} {art * 1e6:8.1f} us")
    ls = launch_s(device)
    log(f"  {'launch_s':22s} {ls * 1e6:8.1f} us")
    gls = None
    if has_gpu:
        try:
            gls = graph_launch_s()
            log(f"  {'graph_launch_s':22s} {gls * 1e6:8.2f} us")
        except RuntimeError as e:  # no graphs here: the model charges eager launches
            notes.append(f"CUDA graph probe failed: {e}")
            log(f"  graph probe failed: {e}")
    prof = HardwareProfile(
        machine=machine_description(), cpu_threads=torch.get_num_threads(), cpu_read_Bps=read,
        cpu_attn=cpu_attn, device_attn=dev_attn, cpu_expert=experts, cpu_roundtrip_s=rt,
        cpu_attn_roundtrip_s=art,
        launch_s=ls, graph_launch_s=gls, cpu_attn_isa=attn_isa, cpu_attn_prefetch_blocks=attn_pf,
        cpu_attn_variants=_timed_variants(attn_isa),
        cpu_attn_kernel=kernel_name,
        cpu_expert_kernel=expert_kind, quick=quick,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=command, notes=notes, **fields)
    prof.validate()
    log(f"calibrated in {time.perf_counter() - t_start:.1f} s")
    return prof
