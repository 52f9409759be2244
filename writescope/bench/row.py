"""One row of ``writescope bench``: a batch of seeded random prompts through prefill (or a
synthetic fill) and timed decode steps on an engine under one KV policy, and the untimed
warm-ups that come before a policy's first row. A row carries:

* ``ttft_s`` -- from adding the requests to the first token of each (mean; max in ``ttft_max_s``);
  None with ``--prefill synthetic``, where random KV is written to the homes the placement policy
  chooses instead of prefilling (``prefill``, ``synthetic_fill_tokens``, ``synthetic_fill_s``):
  the decode steps read the same regions, in seconds instead of minutes per 128K row;
* ``step_times_s`` -- each decode step's ``engine.step()`` wall time (CUDA synchronised; with
  overlapped decode steps, ``engine/inflight.py``, the time between the returns of consecutive
  calls, each of which waits for the tokens it returns), all ``batch`` sequences decoding;
  ``decode_tokens_per_s = batch * (steps - 1) / sum(step times but the first)``, and the mean,
  p50 and p99 over the same steps (the first call opens the window: overlapped, it returns a
  step computed before it); ``untimed_step_times_s`` -- the :data:`UNTIMED_DECODE_STEPS` decode
  steps before them (where a new CUDA graph is captured); ``jit_compiles`` -- the Triton
  kernels compiled (or loaded from Triton's disk cache) during a timed step, each ``{step,
  at_ms, kernel}`` (``bench/jit_log.py``): a step that compiles stalls for as long;
* ``peak_vram_bytes`` -- ``torch.cuda.max_memory_allocated`` over the row on CUDA; elsewhere the
  engine's device bytes (weights placed on the device + KV pools in G/W); a row above the VRAM
  budget is a failure (``error``), its measurements kept;
* ``pinned_bytes``/``host_bytes`` -- the T and C pools allocated, and ``*_used_bytes`` the blocks
  the row occupied at its end; ``bytes_moved`` -- ``kv.bytes_moved_after_placement`` during the
  row (only ``migrate`` moves anything);
* ``cpu_share_steps`` -- per decode step, the CPU's share of the KV bytes attended;
* ``planner_verified`` -- for ``writescope``, whether its planner had measured the CPU path when
  the row began (if not, the row's prefill put every spilled block in T);
* ``host_bound_fraction`` -- mean share of a decode step until the host had enqueued the forward
  pass (near 1 on CUDA: the step is bound by Python and kernel launches);
* ``model_step_s`` (added by :func:`writescope.bench.row_terms.model_terms`, as are the bound and
  the uniform-routing expert bytes) -- the roofline model's step time for this policy at the
  row's mid-decode lengths (:func:`writescope.planner.roofline.plan_for_lengths`; ``migrate`` as its target share),
  ``planner_predicted_step_s`` -- the policy's own online prediction when it makes one (mean over
  the decode steps), ``roofline_bound_s`` -- the lower bound of
  :func:`~writescope.planner.roofline.roofline_bound_s` and ``bound_efficiency`` = bound / mean step;
* ``cpu_expert_bytes_per_step`` -- routed-expert bytes on the CPU per decode step under uniform
  routing; ``cpu_expert_bytes_measured`` -- what the CPU expert calls read (their distinct
  experts), mean over the decode steps; the bound charges the measured figure when there is one.
* ``planner_at_prefill`` / ``planner_after`` -- the ``writescope`` planner's shares and rate
  corrections once the prefill had placed the blocks, and after the decode steps;
  ``pcie_gbps`` -- the link's rate on the decode steps whose copies were timed;
* ``cpu_expert_s_mean`` -- the CPU experts' kernel seconds per decode step, and ``cpu_read_gbps``
  -- the host's DRAM read bandwidth probed just before and after the decode steps: the CPU-side
  figures of a row move with it;
* ``threads_decode`` -- the process's threads over the decode steps (:mod:`.threads`): CPU
  seconds, how many were busy more than half the time, and the busiest ones;
  ``pipelined_steps`` -- timed decode steps run as two interleaved sub-batches;
  ``overlapped_steps`` -- decode steps launched before the tokens of the step in flight were
  read back (``engine/inflight.py``), over the timed steps; ``step_forms``
  -- with ``WRITESCOPE_PIPELINE=auto``, per key (a batch's size and context) the form chosen
  and each form's median step (``engine/stepform.py``);
  ``cpu_attn_threads`` -- the CPU attention kernel's thread count; ``cpu_expert_threads`` --
  the CPU routed experts' team size (None when no expert runs on the CPU); ``expert_link`` --
  the link's share of small decode steps' CPU experts and its layer calls so far
  (``layers/expert_link.py``); ``staging_plans`` -- of the
  timed decode steps that streamed T blocks, how many made a new staging plan (``made``) and
  how many kept the last step's (``reused``: their T batches were the same).
"""
from __future__ import annotations

import gc
import hashlib
import json
import math
import time
from typing import Any

import numpy as np
import torch

from .jit_log import jit_compiles
from .threads import busy_threads, python_probe_us, snapshot as thread_snapshot


def spread_lengths(prompts: list[list[int]], spread: int) -> list[list[int]]:
    """Prompt ``i`` of ``B`` cut by ``spread * i // B`` tokens (``writescope bench
    --length-spread``): the first keeps its length, the row's context."""
    b = len(prompts)
    return [p[:len(p) - spread * i // b] for i, p in enumerate(prompts)]


def make_prompts(vocab_size: int, batch: int, context: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``context`` random token ids, the same for every policy and peer."""
    rng = np.random.default_rng([seed, batch, context])
    return rng.integers(3, vocab_size, size=(batch, context)).tolist()


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else math.nan


def token_digest(seqs: list[list[int]]) -> str:
    return hashlib.sha1(json.dumps(seqs).encode()).hexdigest()[:12]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_sync(engine, device: torch.device) -> None:
    """After a timed decode step: wait for the device, unless the engine overlaps its steps
    (then the step in flight is the next one, and waiting for it would undo the overlap)."""
    if not getattr(engine, "overlap", False):
        _sync(device)


def _free_memory(device: torch.device) -> None:
    gc.unfreeze()  # an engine freezes its start-up objects (engine.freeze_gc): let a dropped one go
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _region(name: str):
    from ..kvcache.regions import Region
    return Region(name)


# ---------------------------------------------------------------------------------- rows
class RowFailed(RuntimeError):
    pass


#: policies that by definition keep every spilled block in one region
ONE_STATE = {"transfer": "T", "cpu": "C"}


_PROBE: list = []  # the read probe's buffer, made once per process


def probe_read_gbps() -> float | None:
    """The host's DRAM read bandwidth now, in GB/s (the CPU kernels' threads, one pass over a
    buffer several times the last-level cache), or None without the compiled kernel. Taken
    before and after each row's decode steps: on the H200 host it moved within a run
    (63.7-84.4 GB/s in one bench, 2026-12-01c-h200/call1), and with it every row whose CPU side
    reads DRAM -- the CPU experts took 138 to 318 ms a step for the same work."""
    from ..attention import cpu
    from .cpu_attention import _llc_bytes
    if not cpu.available():  # no compiled kernel on this machine
        return None
    if not _PROBE:
        _PROBE.append(cpu.probe_buffer(max(4 * _llc_bytes(), 256 << 20)))
    return cpu.read_bandwidth(0, reps=2, buffer=_PROBE[0])


#: decode steps run after the prefill and before the timed ones (see run_engine_row)
UNTIMED_DECODE_STEPS = 2


def run_engine_row(engine, prompts: list[list[int]], decode_steps: int, vram_budget: int,
                   tag: str, prefill: str = "real", seed: int = 0) -> dict[str, Any]:
    """Prefill ``prompts`` and time ``decode_steps`` decode steps (see the module docstring).
    ``prefill="synthetic"``: random KV for all but each prompt's last token, no TTFT."""
    from ..core import SamplingParams

    if decode_steps < 2:  # the first timed call only opens the window (see the docstring)
        raise ValueError(f"decode_steps must be at least 2, got {decode_steps}")
    dev = engine.device
    cache = engine.cache
    bs = cache.bs
    batch, ctx = len(prompts), len(prompts[0])
    if ctx + decode_steps + UNTIMED_DECODE_STEPS + 1 > engine.max_model_len:
        raise RowFailed(f"{ctx} + {UNTIMED_DECODE_STEPS} + {decode_steps} tokens exceed "
                        f"max_model_len {engine.max_model_len} "
                        "(the model's positions, ModelConfig.max_positions, or its sliding "
                        "window; --random-weights lifts it)")
    if batch > engine.scheduler.max_num_seqs:
        raise RowFailed(f"batch {batch} > max_num_seqs {engine.scheduler.max_num_seqs}")
    # all sequences must be in the cache at once, or the "batch" would not be one; and the
    # baselines defined by one host state need all spilled KV to fit that state's budget
    need = batch * cache.blocks_for(ctx + decode_steps + UNTIMED_DECODE_STEPS + 2)
    free = cache.free_sealed() - cache.reserved
    if need > free or cache.alloc[_region("W")].num_free < batch:
        raise RowFailed(f"the KV budgets hold {free} blocks of {bs} tokens; {batch} x "
                        f"{ctx + decode_steps} tokens need {need} (over the KV budget)")
    only = ONE_STATE.get(engine.kv_policy)
    if only is not None:
        room = cache.alloc[_region("G")].num_free + cache.alloc[_region(only)].num_free
        if need > room:
            raise RowFailed(f"{engine.kv_policy} keeps all spilled KV in {only}: {need} blocks "
                            f"needed, G + {only} hold {room} (over the "
                            f"{'pinned' if only == 'T' else 'host'} budget)")
    # enough tokens that no sequence finishes before the timed steps are done; aborted after
    prefill_steps = math.ceil(batch * ctx / engine.scheduler.max_num_batched_tokens) + batch
    params = SamplingParams(temperature=0.0, max_tokens=decode_steps + prefill_steps + 2
                            + UNTIMED_DECODE_STEPS, ignore_eos=True)
    moved0 = cache.counters["kv.bytes_moved_after_placement"]
    if dev.type == "cuda":
        _sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    ids = [f"{tag}-{i}" for i in range(batch)]
    tokens: dict[str, list[int]] = {r: [] for r in ids}
    first: dict[str, float] = {}
    log = getattr(cache.policy, "placement_log", None)
    if log is not None:
        log.clear()  # the row's own placements, not the warm-up's
    t_add = time.perf_counter()
    try:
        for rid, p in zip(ids, prompts):
            engine.add_request(rid, p, params)
        filled = 0
        if prefill == "synthetic":
            filled = engine.prefill_synthetic(seed)
            _sync(dev)
        fill_end = time.perf_counter()
        # ---- prefill (chunked by the scheduler) until every sequence has its first token
        guard = 0
        while len(first) < batch:
            outs = engine.step()
            _sync(dev)
            now = time.perf_counter()
            for o in outs:
                if o.request_id in tokens and o.request_id not in first:
                    first[o.request_id] = now - t_add
            guard += 1
            if guard > 4 * prefill_steps + 16:
                raise RowFailed(f"only {len(first)} of {batch} sequences started (KV budget)")
        prefill_end = time.perf_counter()
        planner_prefill = planner_state(cache.policy)
        placements = [list(x) for x in getattr(cache.policy, "placement_log", ())]
        # ---- untimed decode steps at the row's shape: a CUDA graph of a new step size or of
        # grown resident buffers is captured after the step that needs it (0.26-0.38 s on the
        # H200, each row's first timed step before 2026-12-03d), once per size and doubling of
        # the context, which a long generation amortises and a dozen timed steps would not
        untimed = []
        for _ in range(UNTIMED_DECODE_STEPS):
            t0 = time.perf_counter()
            outs = engine.step()
            _step_sync(engine, dev)
            untimed.append(time.perf_counter() - t0)
            if len(outs) != batch:
                raise RowFailed(f"a decode step produced {len(outs)} tokens for a batch of {batch}")
        # with overlapped steps one is in flight: its CPU experts would share the probe's cores
        _sync(dev)
        read_before = probe_read_gbps()
        py_before = python_probe_us()
        threads0, t_threads = thread_snapshot(), time.perf_counter()
        # tokens produced so far (sequences prefilled early already decoded some)
        for rid in ids:
            tokens[rid] = list(engine.requests[rid].output_token_ids)
        # ---- timed decode steps, the whole batch decoding
        counters = cache.counters
        step_times, shares, predicted, host_fracs, expert_bytes, expert_s = [], [], [], [], [], []
        link = []
        moved_prefill = counters["kv.bytes_moved_after_placement"] - moved0
        piped0 = counters.get("kv.pipelined_steps", 0)
        over0 = engine.counters.get("engine.overlapped_steps", 0)
        plans0 = dict(getattr(cache.hybrid, "stage_plans", {}))
        compiles = []  # Triton kernels compiled during a timed step (a stall of its own)
        for i in range(decode_steps):
            c0, g0 = counters["kv.bytes_read.cpu"], counters["kv.bytes_read.gpu"]
            with jit_compiles() as jit:
                t0 = time.perf_counter()
                outs = engine.step()
                _step_sync(engine, dev)
                dt = time.perf_counter() - t0
            compiles += [{"step": i, "at_ms": round(1e3 * t, 3), "kernel": k} for t, k in jit]
            if len(outs) != batch:
                raise RowFailed(f"a decode step produced {len(outs)} tokens for a batch of {batch}")
            step_times.append(dt)
            dc, dg = counters["kv.bytes_read.cpu"] - c0, counters["kv.bytes_read.gpu"] - g0
            shares.append(dc / (dc + dg) if dc + dg else 0.0)
            eb = (cache.last_timing or {}).get("cpu_expert_bytes")
            if eb is not None:
                expert_bytes.append(float(eb))
            es = (cache.last_timing or {}).get("cpu_expert_s")
            if isinstance(es, (int, float)):
                expert_s.append(float(es))
            lg = link_gbps(cache.last_timing or {})
            if lg is not None:
                link.append(lg)
            lt = getattr(engine.runner, "last_times", {})
            if lt:
                host_fracs.append(lt["forward_host_s"] / max(1e-12, lt["forward_host_s"]
                                                             + lt["device_tail_s"]))
            pst = cache.policy.stats().get("planner.predicted_step_s")
            if isinstance(pst, (int, float)) and math.isfinite(pst):
                predicted.append(float(pst))
            for o in outs:
                tokens[o.request_id] = list(o.token_ids)
        threads = busy_threads(threads0, thread_snapshot(), time.perf_counter() - t_threads)
        py_after = python_probe_us()
        _sync(dev)
        read_after = probe_read_gbps()
        live = cache.live_blocks()
        timing = dict(cache.last_timing)
        peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
                else engine.weights_bytes + cache.stats()["kv.vram_bytes"])
        moved = counters["kv.bytes_moved_after_placement"] - moved0
        piped = counters.get("kv.pipelined_steps", 0) - piped0
        overlapped = engine.counters.get("engine.overlapped_steps", 0) - over0
        plans = {k: v - plans0.get(k, 0)
                 for k, v in getattr(cache.hybrid, "stage_plans", {}).items()}
        # the cache's and planner's state with the row's batch still in (the aborts release it)
        st = cache.stats()
        planner_after = planner_state(cache.policy)
    finally:
        for rid in ids:
            engine.abort_request(rid)
        if engine.cache is not None:
            engine.cache.abort_step()
    # the first timed call opens the window: with overlapped steps it returns the tokens of a
    # step that ran before it (done by the sync before the read probe) in a few ms, which
    # counted a step's work that was never timed (2.7-3.4% of the overlapped rows' tokens/s
    # until the sixty-fourth session); every figure below is over the later calls, each of
    # which waits for one step
    timed = step_times[1:]
    total = sum(timed)
    synthetic = prefill == "synthetic"
    row = {
        # a synthetic prefill has no time to first token: its KV was written, not computed
        "ttft_s": None if synthetic else float(np.mean(list(first.values()))),
        "ttft_max_s": None if synthetic else max(first.values()),
        "prefill": prefill, "synthetic_fill_tokens": int(filled),
        "synthetic_fill_s": fill_end - t_add if synthetic else None,
        "prefill_s": prefill_end - t_add,
        "decode_tokens_per_s": batch * len(timed) / total,
        "mean_step_s": total / len(timed), "p50_step_s": percentile(timed, 50),
        "p99_step_s": percentile(timed, 99), "step_times_s": step_times,
        "jit_compiles": compiles,
        "untimed_step_times_s": untimed,
        # share of a decode step the host spent enqueuing the forward pass (near 1: the GPU
        # waits on Python and launches, not on bytes)
        "host_bound_fraction": float(np.mean(host_fracs)) if host_fracs else None,
        "peak_vram_bytes": int(peak), "vram_budget": int(vram_budget),
        "weights_device_bytes": int(engine.weights_bytes),
        "kv_vram_bytes": int(st["kv.vram_bytes"]),
        "pinned_bytes": int(st["kv.pinned_bytes"]), "host_bytes": int(st["kv.host_bytes"]),
        "pinned_used_bytes": int(live[_region("T")] * cache.block_bytes),
        "host_used_bytes": int(live[_region("C")] * cache.block_bytes),
        "blocks": {str(r): int(n) for r, n in live.items()},
        "bytes_moved": int(moved), "bytes_moved_prefill": int(moved_prefill),
        "cpu_share_steps": shares,
        "cpu_share_mean": float(np.mean(shares)) if shares else 0.0,
        # routed-expert bytes the CPU expert calls read per decode step (distinct experts)
        "cpu_expert_bytes_measured": float(np.mean(expert_bytes)) if expert_bytes else None,
        # seconds the CPU experts computed per decode step: the same work under every policy,
        # so a spread between policies' rows is the machine (shared DRAM bandwidth), not them
        "cpu_expert_s_mean": float(np.mean(expert_s)) if expert_s else None,
        # the host's DRAM read bandwidth just before and just after the decode steps
        "cpu_read_gbps": [read_before, read_after],
        # which threads burnt how much CPU during the decode steps (bench/threads.py), and a
        # fixed Python loop's microseconds on this thread before and after them
        "threads_decode": threads,
        "python_probe_us": [py_before, py_after],
        # decode steps run as two interleaved sub-batches (WRITESCOPE_PIPELINE=1), and the CPU
        # attention kernel's thread count
        "pipelined_steps": int(piped), "overlapped_steps": int(overlapped),
        "cpu_attn_threads": attn_threads(cache),
        "cpu_expert_threads": expert_threads(engine),
        # the link's share of small decode steps' CPU experts (layers/expert_link.py) and the
        # layer calls it has taken part in so far (None: no expert on the CPU)
        "expert_link": (None if getattr(engine, "expert_link", None) is None else
                        {"share": engine.expert_link.share, "calls": engine.expert_link.calls}),
        # of the timed decode steps that streamed T blocks: new staging plans, kept ones
        "staging_plans": plans or None,
        # with WRITESCOPE_PIPELINE=auto: per batch size and context, the form chosen and medians
        "step_forms": (engine.runner.step_forms.stats()
                       if getattr(engine.runner, "step_forms", None) is not None else None),
        "planner_predicted_step_s": float(np.mean(predicted)) if predicted else None,
        "planner_target_share": st.get("planner.target_share", st.get("planner.cpu_share")),
        # the planner's shares and rate corrections when the prefill had placed the row's blocks,
        # and after its decode steps (a fixed policy: its share)
        "planner_at_prefill": planner_prefill,
        # the prefill's last spilling placements: (seq, blocks, target share, batch C, spilled)
        "planner_placements": placements or None,
        "planner_after": planner_after,
        # the link's rate over the steps whose copy stream was timed: T bytes / busy seconds
        "pcie_gbps": float(np.mean(link)) if link else None,
        "last_step_timing": {k: v for k, v in timing.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool)},
        "output_digest": token_digest([tokens[r][:decode_steps + 1] for r in ids]),
        "output_token_ids": [tokens[r][:decode_steps + 1] for r in ids],
    }
    if peak > vram_budget:
        row["error"] = (f"over the VRAM budget: peak {peak / 2**30:.2f} GiB > "
                        f"{vram_budget / 2**30:.2f} GiB")
    only = ONE_STATE.get(engine.kv_policy)
    other = {"T": "C", "C": "T"}.get(only)
    if other and live[_region(other)]:
        row["error"] = (f"{engine.kv_policy} had to put {live[_region(other)]} blocks in {other}: "
                        f"its region {only} is full (over the {'pinned' if only == 'T' else 'host'} budget)")
    return row


def expert_threads(engine) -> int | None:
    """The CPU routed experts' team size, or None when the engine runs none on the CPU."""
    if not any(getattr(engine, "cpu_expert_layers", ()) or ()):
        return None
    from ..layers import cpu_experts
    return cpu_experts.get_num_threads()


def attn_threads(cache) -> int:
    """The CPU attention kernel's thread count in this engine (its explicit setting, else the
    kernel's default after the engine's core reservation)."""
    n = getattr(getattr(cache, "hybrid", None), "cpu_threads", None)
    if n:
        return int(n)
    from ..attention import cpu as cpu_attn
    return cpu_attn.get_num_threads()


#: the planner's figures a row records (``stats()`` keys without their ``planner.`` prefix)
PLANNER_KEYS = ("cpu_share", "target_share", "cpu_rate_correction", "cpu_fixed_correction",
                "pcie_rate_correction", "gpu_rate_correction", "expert_rate_correction",
                "step_overhead_s", "cpu_verified", "probes", "placement_target")


def planner_state(policy) -> dict | None:
    """The placement policy's planner figures (shares, rate corrections; a fixed policy has
    its share only), or None for a policy that reports none."""
    st = policy.stats() if hasattr(policy, "stats") else {}
    out = {k: st[f"planner.{k}"] for k in PLANNER_KEYS if f"planner.{k}" in st}
    return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in out.items()} or None


def link_gbps(timing: dict) -> float | None:
    """GB/s of the step's streamed T bytes over the copy stream's busy seconds (None when the
    step streamed nothing or its copies were not timed)."""
    s, b = timing.get("pcie_s"), timing.get("t_bytes")
    if isinstance(s, (int, float)) and isinstance(b, (int, float)) and s > 0 and b > 0:
        return b / s / 1e9
    return None


#: decode tokens of the warm-up's long request: enough decode steps for the ``writescope``
#: planner to measure its CPU path (``verify_steps`` timed steps, the first of which may be
#: discarded), as a running server's planner has. Until then it places spilled blocks in T only,
#: so a row prefilled by an unverified planner would measure T blocks read in place, not the
#: placement it would reach (every writescope row of 2026-11-30e-h200 was prefilled that way).
WARMUP_DECODE_TOKENS = 8


def warm_up(engine, vocab_size: int, seed: int, length: int, batches=()) -> None:
    """One untimed request of ``length`` tokens (the grid's shortest context) decoding
    ``WARMUP_DECODE_TOKENS`` tokens, then, per batch size, that many short requests decoding
    together, so that one-time costs (kernel loading, first allocations, thread pools,
    capturing the decode step's CUDA graphs for that size, the planner's first measurements) do
    not land in the first timed row of a policy. If the placement policy still has not measured
    its CPU path after that (the long request fitted in G), :func:`warm_up_spill` shows it."""
    n = max(2, min(length, engine.max_model_len - WARMUP_DECODE_TOKENS - 1))
    rounds = [make_prompts(vocab_size, 1, n, seed + 1)]
    short = max(2, min(n, 64))
    rounds += [make_prompts(vocab_size, b, short, seed + 2) for b in sorted(set(batches))]
    for r, prompts in enumerate(rounds):
        _run_untimed(engine, prompts, WARMUP_DECODE_TOKENS if r == 0 else 3, f"bench-warmup-{r}")
    if getattr(engine.cache.policy, "cpu_verified", True) is False:
        warm_up_spill(engine, vocab_size, seed)
    _sync(engine.device)


#: tokens the spill warm-up puts past G: at least this many blocks, or this fraction of G
WARMUP_SPILL_BLOCKS, WARMUP_SPILL_FRACTION = 64, 0.125


def warm_up_spill(engine, vocab_size: int, seed: int) -> int:
    """Untimed requests whose KV fills G and spills past it, written as random KV
    (:meth:`LLMEngine.prefill_synthetic`; the values do not matter here), then decoded
    ``WARMUP_DECODE_TOKENS`` steps: the ``writescope`` planner times its CPU path on spilled
    blocks, as a running server's planner has, before a row's prefill places blocks for good.
    (An unverified planner places C blocks for a CPU half as fast as its profile: a Qwen3
    4 x 128K row prefilled after a 4K warm-up, whose request fitted in G, placed C at share 0.38
    where a verified planner would go further; 2026-12-01b-h200 call 2.) As many requests as
    needed, each at most ``max_model_len`` long, at most ``max_num_seqs`` of them and within
    the free KV blocks. Returns the tokens spilled past G (0 if none could be)."""
    cache = engine.cache
    bs = cache.bs
    g_free = cache.alloc[_region("G")].num_free
    spill = max(WARMUP_SPILL_BLOCKS, int(WARMUP_SPILL_FRACTION * g_free))
    spill = min(spill, cache.alloc[_region("T")].num_free + cache.alloc[_region("C")].num_free
                - engine.scheduler.max_num_seqs * 2)
    per_req = cache.blocks_for(engine.max_model_len - WARMUP_DECODE_TOKENS - 2) - 1
    n_req = min(engine.scheduler.max_num_seqs, cache.alloc[_region("W")].num_free,
                -(-(g_free + max(0, spill)) // max(1, per_req)))
    if spill <= 0 or per_req <= 0 or n_req <= 0:
        return 0
    total = min(g_free + spill, n_req * per_req)
    sizes = [total // n_req + (i < total % n_req) for i in range(n_req)]
    prompts = [p[:k * bs] for p, k in zip(make_prompts(vocab_size, n_req, per_req * bs, seed + 3),
                                           sizes)]
    _run_untimed(engine, prompts, WARMUP_DECODE_TOKENS, "bench-warmup-spill", synthetic=seed)
    return max(0, total - g_free) * bs


def _run_untimed(engine, prompts, max_tokens: int, tag: str, synthetic: int | None = None) -> None:
    """Run ``prompts`` to ``max_tokens`` each (prefilled with random KV when ``synthetic`` is a
    seed), then abort them."""
    from ..core import SamplingParams
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    try:
        for rid, p in zip(ids, prompts):
            engine.add_request(rid, p, sp)
        if synthetic is not None:
            engine.prefill_synthetic(synthetic)
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        for rid in ids:
            engine.abort_request(rid)
