"""``python -m writescope.bench.step_profile --model NAME|PATH [--random-weights] [engine options]``:
where a decode step's host time goes.

Builds one engine, prefills ``--batch`` random prompts of ``--context`` tokens (``--prefill
synthetic``: random KV in the homes the policy chooses instead), runs ``--warmup`` decode steps,
then profiles ``--steps`` more with ``torch.profiler`` and prints, per decode step: wall time,
the host time until the forward pass was enqueued (``forward_host_s``), framework ops and GPU
kernel launches, and the ops that cost the most host time. A decode step
whose host time is close to its wall time is launch-bound: the list says which ops to remove or
fuse. ``--json FILE`` writes the same figures.

``--timeline`` (CPU experts on CUDA) splits each unprofiled step along its chain of CPU expert
calls with two timing events a call (``WRITESCOPE_EXPERT_TIMELINE``, ``layers/cpu_experts.py``):
the device's own work between one call's result and the next call's inputs, and each call's
span from its inputs to the device past its wait -- the CPU kernels (the native queue's time)
plus the hand-off (the ready word, the queue's pick-up, the done word reaching the device).
It also lays each step's CPU attention kernels (the attention's native job queue) and expert
kernels side by side on the host's clock (:mod:`.cpu_chain`): in a spilled step with the
experts on the CPU, the cores' time a step is those kernels plus the waits from one kind to
the other (the device's work and the hand-offs between them) and the step's start and end.

Where the step streams T blocks, the unprofiled steps timed on the device (one in
``WRITESCOPE_TIMING_EVERY``) also give the link's busy time and its idle time before, between
and after its copies (:mod:`.link_idle`).

``--cprofile N`` then runs N more steps under :mod:`cProfile` and lists the Python functions
that take the most host time per step (self and cumulative), with the attention calls
(``HybridAttention.launch`` / ``finish``) broken down: torch.profiler sees framework ops and
driver calls, not the Python between them.
"""
from __future__ import annotations

import argparse
import json
import os
import time


from .cpu_chain import cpu_chain, print_cpu_chain
from .link_idle import link_split, median_split, print_link
from .row import make_prompts
from ..attention.launch import compiled_resources, pdl_enabled
from ..units import parse_count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=parse_count, default=2048,
                    help="prompt tokens per sequence, e.g. 2048 or 32k (default 2048)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--kv-policy", default="writescope")
    ap.add_argument("--vram-budget")
    ap.add_argument("--experts", default="auto")
    ap.add_argument("--num-gpu-blocks", type=int)
    ap.add_argument("--kv-cache-memory",
                    help="device memory for the KV cache (LLMEngine(kv_cache_memory=)): a size, "
                         "or auto for the split of the routed experts the roofline predicts "
                         "fastest")
    ap.add_argument("--config-override", action="append", metavar="KEY=VALUE",
                    help="with --random-weights: override config.json fields, as in "
                         "`writescope bench` (e.g. an FP8 quantization_config)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--profile")
    ap.add_argument("--prefill", default="real", choices=("real", "synthetic"),
                    help="synthetic: random KV in the homes the policy chooses instead of the "
                         "model's prefill (long contexts in seconds; LLMEngine.prefill_synthetic)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="then N more steps under cProfile: the Python functions by host time")
    ap.add_argument("--timeline", action="store_true",
                    help="split each unprofiled step along its CPU expert calls and its CPU "
                         "kernels' chain (CUDA)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from .grid import parse_overrides
    try:
        overrides = parse_overrides(args.config_override)
    except ValueError as e:
        ap.error(str(e))
    if overrides and not args.random_weights:
        ap.error("--config-override needs --random-weights")
    if args.timeline:
        os.environ["WRITESCOPE_EXPERT_TIMELINE"] = "1"

    from torch.profiler import ProfilerActivity, profile

    from ..core import SamplingParams
    from ..engine.engine import LLMEngine

    total = args.warmup + 2 * args.steps + max(args.cprofile, 0)  # decode steps the run takes
    eng = LLMEngine(args.model, random_weights=args.random_weights, kv_policy=args.kv_policy,
                    vram_budget=args.vram_budget, experts=args.experts,
                    num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.batch,
                    max_model_len=args.context + total + 16,
                    max_num_batched_tokens=args.max_num_batched_tokens, profile=args.profile,
                    enable_prefix_caching=False, kv_cache_memory=args.kv_cache_memory,
                    config_overrides=overrides or None)
    prompts = make_prompts(eng.config.vocab_size, args.batch, args.context, 0)
    sp = SamplingParams(max_tokens=total + 8, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"p{i}", p, sp)
    if args.prefill == "synthetic":
        eng.prefill_synthetic()
    while any(r.is_prefilling for r in eng.requests.values()):
        eng.step()  # prefill
    for _ in range(args.warmup):
        eng.step()
    from ..layers import cpu_experts, cpu_experts_calls
    cpu_experts.take_timeline()
    cpu_experts.take_host_timeline()
    attention_times = _attention_times(eng)  # (the calls so far taken away)
    plain, expert_s, host_s, chains = [], [], [], []  # the same steps with no profiler attached
    cpu_chains = []  # the CPU's attention and expert kernels of each step, as one chain
    links = []  # the link's busy and idle time in the timed steps (link_idle.py)
    cache_s = []  # the cache's own step time (step_s: from after begin_step's plan to end_step)
    for _ in range(args.steps):
        t0 = time.perf_counter()
        eng.step()
        t1 = time.perf_counter()
        plain.append(t1 - t0)
        cache_s.append((eng.cache.last_timing or {}).get("step_s", float("nan")))
        expert_s.append(eng.runner.last_times.get("cpu_expert_s") or 0.0)
        host_s.append(eng.runner.last_times.get("forward_host_s", float("nan")))
        link = link_split(eng.cache.last_timing or {}, plain[-1])
        if link is not None:
            links.append(link)
        if args.timeline:
            marks = cpu_experts.take_timeline()
            chains.append(chain_split(marks, plain[-1], expert_s[-1],
                                      cpu_experts_calls.last_queue_stats,
                                      eng.runner.last_times.get("cpu_expert_bytes"),
                                      cpu_experts_calls.last_result_ms))
            calls = cpu_experts.take_host_timeline()
            chains[-1].update(host_chain(calls))
            att = attention_times()
            # (no chain where the CPU experts ran but their host times did not match up)
            if (att or calls) and (calls or not expert_s[-1]):
                cpu_chains.append(cpu_chain(att, [(c["ready"], c["done"]) for c in calls],
                                            t0, t1))
    if args.timeline:  # the profiled steps below record no events
        os.environ.pop("WRITESCOPE_EXPERT_TIMELINE", None)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if eng.device.type == "cuda" else [])
    walls, hosts = [], []
    with profile(activities=acts) as prof:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            eng.step()
            walls.append(time.perf_counter() - t0)
            hosts.append(eng.runner.last_times.get("forward_host_s", float("nan")))
    n = args.steps
    ev = prof.key_averages()
    ops = [e for e in ev if e.key.startswith("aten::")]
    launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                      "cudaLaunchKernelExC", "cuLaunchKernelEx"))
    top = sorted(ev, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.top]

    def dev_us(e) -> float:  # self device time (the name moved between torch versions)
        for name in ("self_device_time_total", "self_cuda_time_total"):
            v = getattr(e, name, None)
            if v is not None:
                return float(v)
        return 0.0
    # kernels and copies by device time: what the GPU spends a step on (aten ops, whose device
    # time is their kernels', are left out so that nothing is counted twice)
    kernels = sorted((e for e in ev if dev_us(e) > 0 and not e.key.startswith("aten::")),
                     key=dev_us, reverse=True)
    res = {
        "model": args.model, "batch": args.batch, "context": args.context,
        "kv_policy": args.kv_policy, "device": str(eng.device), "prefill": args.prefill,
        "step_s": sum(walls) / n, "forward_host_s": sum(hosts) / n,
        "step_s_unprofiled": sorted(plain)[len(plain) // 2],
        # the CPU expert kernels' seconds a step (native queue: from the inputs' landing to the
        # result's flag), unprofiled steps' median; 0 with the experts on the GPU
        "cpu_expert_s": sorted(expert_s)[len(expert_s) // 2],
        # the host's time until the step's forward was enqueued, unprofiled steps' median
        "forward_host_s_unprofiled": sorted(host_s)[len(host_s) // 2],
        # the cache's timed step (what the planner and the step-form chooser see) and the rest
        # of engine.step around it (scheduling, placement and the plan, sampling, the outputs;
        # where steps cannot overlap, as with CPU experts, step time too): unprofiled medians.
        # (An overlapped step is closed before its device work is done: its step_s is then
        # the host's alone, and the rest is mostly the wait for the step before.)
        "cache_step_s": sorted(cache_s)[len(cache_s) // 2],
        "outside_cache_step_s": sorted(w - c for w, c in zip(plain, cache_s))[len(plain) // 2],
        # WRITESCOPE_PIPELINE_EXPERTS: steps with CPU experts split into two sub-batches
        "expert_pipeline": eng.runner.expert_pipeline,
        # the staging ring over the whole run: steps that made a new staging plan or kept the
        # last one, and units staged ahead that the next step used or dropped (its plan new)
        "staging": _staging_stats(eng),
        "engine": {k: v for k, v in eng.stats().items()
                   if k.startswith("graphs.") or k in ("kv.resident_steps", "kv.pipelined_steps",
                                                        "kv.steps")},
        "aten_ops_per_step": sum(e.count for e in ops) / n,
        "kernel_launches_per_step": launches / n,
        "layers": eng.config.num_layers,
        "top_host_ops": [{"op": e.key, "calls_per_step": e.count / n,
                          "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / n}
                         for e in top],
        "device_ms_per_step": sum(dev_us(e) for e in kernels) / 1e3 / n,
        # dependent launches (attention/launch.py): a kernel's span then includes its wait for
        # the kernel before, so the spans overlap and their sum exceeds the step
        "dependent_launches": pdl_enabled(eng.device),
        "top_device_ops": [{"op": e.key, "calls_per_step": e.count / n,
                            "device_ms_per_step": dev_us(e) / 1e3 / n}
                           for e in kernels[:args.top]],
    }
    print(f"decode step {res['step_s_unprofiled'] * 1e3:.1f} ms (median of {n}, no profiler), "
          f"host until enqueued {res['forward_host_s_unprofiled'] * 1e3:.1f} ms, "
          f"CPU expert kernels {res['cpu_expert_s'] * 1e3:.1f} ms; the cache's step "
          f"{res['cache_step_s'] * 1e3:.1f} ms, {res['outside_cache_step_s'] * 1e3:.2f} ms of "
          f"engine.step outside it; {res['engine']}")
    print(f"decode step {res['step_s'] * 1e3:.1f} ms, host until enqueued "
          f"{res['forward_host_s'] * 1e3:.1f} ms; {res['aten_ops_per_step']:.0f} aten ops and "
          f"{res['kernel_launches_per_step']:.0f} kernel launches per step "
          f"({res['layers']} layers)")
    print(f"{'op':48s} {'calls/step':>10s} {'self ms/step':>12s}")
    for r in res["top_host_ops"]:
        print(f"{r['op'][:48]:48s} {r['calls_per_step']:10.1f} {r['self_cpu_ms_per_step']:12.2f}")
    if kernels:
        print(f"\ndevice time {res['device_ms_per_step']:.1f} ms a step (profiled; kernels and copies)")
        if res["dependent_launches"]:
            print("(dependent launches on: each Triton kernel's time includes its wait for the "
                  "kernel before; WRITESCOPE_PDL=0 for times that do not overlap)")
        print(f"{'kernel':72s} {'calls/step':>10s} {'ms/step':>8s}")
        for r in res["top_device_ops"]:
            print(f"{r['op'][:72]:72s} {r['calls_per_step']:10.1f} {r['device_ms_per_step']:8.2f}")
    if chains:
        res["expert_chain"] = median_split(chains)
        print_chain(res["expert_chain"])
    if cpu_chains:
        res["cpu_chain"] = median_split(cpu_chains)
        print_cpu_chain(res["cpu_chain"])
    if links:
        res["link"] = median_split(links)
        res["link"]["steps"] = len(links)
        print_link(res["link"])
        st = res["staging"]
        if st:
            print(f"staging plans made {st['plans'].get('made')}, reused {st['plans'].get('reused')}"
                  + (f"; units staged ahead used {st['ahead_units']['used']}, dropped "
                     f"{st['ahead_units']['dropped']}" if st["ahead"] else "")
                  + (f"; CPU-read T counts held {st['held_assigns']}" if st["held_assigns"] else ""))
    res["compiled"] = compiled_resources()
    if res["compiled"]:
        print(f"\n{'Triton kernel (compiled forms)':32s} {'warps':>5s} {'stages':>6s} "
              f"{'regs':>5s} {'spilled':>7s} {'shared':>7s} dependent")
        for r in sorted(res["compiled"], key=lambda r: r["kernel"]):
            print(f"{r['kernel'][:32]:32s} {r['warps']!s:>5s} {r['stages']!s:>6s} "
                  f"{r['registers']!s:>5s} {r['spilled']!s:>7s} {r['shared']!s:>7s} "
                  f"{r['dependent']}")
    if args.cprofile > 0:
        res["cprofile"] = python_profile(eng.step, args.cprofile, args.top)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def _staging_stats(eng) -> dict:
    """The hybrid attention's staging plans made and reused, its ring's units staged ahead
    used and dropped, and the planner's held CPU-read T counts (``WRITESCOPE_SHARE_HOLD``;
    {} without a staging ring)."""
    hybrid = getattr(eng.cache, "hybrid", None)
    ring = getattr(hybrid, "ring", None)
    if ring is None:
        return {}
    return {"plans": dict(hybrid.stage_plans), "ahead": ring.ahead,
            "ahead_units": dict(ring.ahead_units),
            "held_assigns": getattr(eng.cache.policy, "held_assigns", 0)}


def _attention_times(eng):
    """A function giving the CPU attention queue's kernel intervals ``(start, end)`` since its
    last call (the native job queue of the cache's hybrid attention, made at its first use;
    none where the CPU side runs otherwise)."""
    def take() -> list[tuple[float, float]]:
        hybrid = getattr(eng.cache, "hybrid", None)
        return hybrid.queue_times() if hybrid is not None else []
    take()
    return take


def chain_split(marks: list[tuple[float, float]], step_s: float, kernel_s: float,
                queue_stats, routed_bytes: int | None, result_ms: list | None = None) -> dict:
    """One step's CPU expert chain from :func:`~writescope.layers.cpu_experts.take_timeline`'s
    ``(ready, seen)`` device times (ms): ``calls``; ``device_between_ms``, the device's time from
    one call's result seen to the next call's inputs copied (its own work between two calls);
    ``calls_ms``, the calls' spans from inputs copied to result seen; ``kernels_ms``, the CPU
    kernels' time in them (the native queue's); ``handoff_ms``, the rest of the spans (the ready
    word, the queue's pick-up and the kernel's start, the done word reaching the device);
    ``outside_ms``, the step's wall time outside the chain (before the first call and after the
    last: the first layers, the head, sampling, the step's start and end on the host);
    ``queue_wait_ms``, the queue thread's time waiting for inputs; ``kernel_gbps``, the expert
    bytes the calls read over the kernels' time; ``result_ms``, from each call's result seen to
    its result on the device (the copy, or the in-place read), summed over the calls that have
    it (:data:`~writescope.layers.cpu_experts_calls.last_result_ms`; NaN when none has)."""
    calls = len(marks)
    spans = sum(b - a for a, b in marks)
    between = sum(marks[i][0] - marks[i - 1][1] for i in range(1, calls))
    kernels = (kernel_s or 0.0) * 1e3
    landed = [r for r in (result_ms or []) if r is not None]
    return {"calls": calls, "step_ms": step_s * 1e3, "device_between_ms": between,
            "result_ms": sum(landed) if landed else float("nan"), "calls_ms": spans,
            "kernels_ms": kernels, "handoff_ms": spans - kernels,
            "outside_ms": step_s * 1e3 - (marks[-1][1] - marks[0][0] if marks else 0.0),
            "queue_wait_ms": (queue_stats[1] * 1e3 if queue_stats else float("nan")),
            "kernel_gbps": (routed_bytes / kernel_s / 1e9 if routed_bytes and kernel_s
                            else float("nan"))}


def host_chain(calls: list[dict]) -> dict:
    """The same chain on the host's clock (:func:`~writescope.layers.cpu_experts.
    take_host_timeline`), summed over a step's calls in ms: ``host_kernels_ms`` (inputs seen to
    done); between one call's done and the next call's inputs seen, ``launcher_late_ms`` -- the
    launching thread had not yet queued the next call -- and ``device_late_ms``, the rest (the
    queued call waiting for its inputs); ``launcher_per_call_ms``, the launching thread's mean
    time from one call's job queued to the next's; ``pickup_ms``, from a job queued to its
    kernel's start, summed."""
    if not calls:
        return {}
    ms = 1e3
    late = dev = 0.0
    for a, b in zip(calls, calls[1:]):
        gap = b["ready"] - a["done"]
        lag = min(max(0.0, b["pushed"] - a["done"]), max(gap, 0.0))
        late += lag
        dev += max(gap, 0.0) - lag
    n = len(calls)
    return {"host_kernels_ms": sum(c["done"] - c["ready"] for c in calls) * ms,
            "launcher_late_ms": late * ms, "device_late_ms": dev * ms,
            "launcher_per_call_ms": ((calls[-1]["pushed"] - calls[0]["pushed"]) / (n - 1) * ms
                                     if n > 1 else float("nan")),
            "pickup_ms": sum(max(0.0, c["ready"] - c["pushed"]) for c in calls) * ms}


def print_chain(c: dict) -> None:
    if not c["calls"]:
        print("\nCPU expert chain: no eager CPU expert calls timed (none in these steps, or "
              "graphed: by default in resident steps, WRITESCOPE_CPU_EXPERTS_GRAPHED=0 keeps "
              "them eager)")
        return
    n = max(c["calls"], 1)
    print(f"\nCPU expert chain (median of the unprofiled steps): {c['calls']:.0f} calls, "
          f"step {c['step_ms']:.1f} ms = outside the chain {c['outside_ms']:.1f} + device between "
          f"calls {c['device_between_ms']:.1f} ({c['device_between_ms'] / n * 1e3:.0f} us a "
          f"call) + calls {c['calls_ms']:.1f}; in the calls: CPU kernels {c['kernels_ms']:.1f} ms "
          f"({c['kernel_gbps']:.1f} GB/s of expert weights), hand-off {c['handoff_ms']:.1f} ms "
          f"({c['handoff_ms'] / n * 1e3:.0f} us a call); the queue waited "
          f"{c['queue_wait_ms']:.1f} ms for inputs")
    if c.get("result_ms") == c.get("result_ms"):  # (not NaN)
        print(f"  results from seen to on the device (copy or in-place read): "
              f"{c['result_ms']:.2f} ms ({c['result_ms'] / n * 1e3:.0f} us a call)")
    if "launcher_late_ms" in c:
        print(f"  on the host's clock: kernels {c['host_kernels_ms']:.1f} ms; between a call's "
              f"done and the next call's start {c['launcher_late_ms']:.1f} ms with the next call "
              f"not yet queued by the launching thread and {c['device_late_ms']:.1f} ms waiting "
              f"for its inputs; the launching thread queued a call every "
              f"{c['launcher_per_call_ms'] * 1e3:.0f} us; jobs started {c['pickup_ms']:.1f} ms "
              f"after being queued, summed")


def python_profile(step, steps: int, top: int) -> dict:
    """``steps`` calls of ``step`` (one step: ``engine.step``, or a beam search's step,
    ``bench.beam_search``) under cProfile: wall ms per step and the ``top`` functions by self
    and by cumulative host ms per step, printed and returned."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(steps):
        step()
    pr.disable()
    wall = (time.perf_counter() - t0) / steps
    st = pstats.Stats(pr)

    def rows(key: int) -> list[dict]:
        items = sorted(st.stats.items(), key=lambda kv: kv[1][key], reverse=True)[:top]
        return [{"function": f"{fn.rsplit('/', 2)[-1] if '/' in fn else fn}:{line}({name})",
                 "calls_per_step": nc / steps, "self_ms_per_step": tt * 1e3 / steps,
                 "cum_ms_per_step": ct * 1e3 / steps}
                for (fn, line, name), (cc, nc, tt, ct, _) in items]

    out = {"steps": steps, "wall_ms_per_step": wall * 1e3, "by_self": rows(2), "by_cum": rows(3)}
    print(f"\ncProfile, {steps} steps: {wall * 1e3:.1f} ms a step (profiled)")
    for title, key in (("self", "by_self"), ("cumulative", "by_cum")):
        print(f"{'function (' + title + ')':64s} {'calls/step':>10s} {'self ms':>8s} {'cum ms':>8s}")
        for r in out[key]:
            print(f"{r['function'][:64]:64s} {r['calls_per_step']:10.1f} "
                  f"{r['self_ms_per_step']:8.2f} {r['cum_ms_per_step']:8.2f}")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
