"""Why an overlapped decode step with graphed CPU expert calls can be slower than a synchronous
one (sixty-fourth session: DeepSeek-V2-Lite 1 x 8K 54.9 ms a step overlapped against 35.2
synchronous). One engine, batch B, a synthetic context, W warm-up steps, then S timed steps:
per step the wall time, the runner's host and tail times; per native queue call (the graphed
CPU expert calls' host halves) the wait for its ready word and its kernel time; per thread of
the process its CPU seconds over the timed steps (who spins); the host's steal.

python diag_overlap.py --model deepseek-v2-lite --context 8192 --batch 1 --json OUT.json
(WRITESCOPE_ASYNC_DECODE and the thread counts come from the environment)."""
import argparse
import json
import os
import statistics
import threading
import time


def thread_times():
    out = {}
    tck = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[tid] = (name, (int(parts[11]) + int(parts[12])) / tck)
    return out


def steal():
    with open("/proc/stat") as f:
        v = f.readline().split()[1:]
    return int(v[7]) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v2-lite")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--profile")
    ap.add_argument("--json")
    a = ap.parse_args()
    from writescope.bench.row import make_prompts
    from writescope.core import SamplingParams
    from writescope.engine.engine import LLMEngine
    from writescope.layers import cpu_experts
    total = a.warmup + a.steps + 4
    eng = LLMEngine(a.model, random_weights=True, vram_budget="32GiB", experts="cpu",
                    max_num_seqs=a.batch, max_model_len=a.context + total + 16,
                    max_num_batched_tokens=16384, profile=a.profile,
                    enable_prefix_caching=False)
    for i, p in enumerate(make_prompts(eng.config.vocab_size, a.batch, a.context, 0)):
        eng.add_request(f"p{i}", p, SamplingParams(max_tokens=total + 8, temperature=0.0,
                                                   ignore_eos=True))
    eng.prefill_synthetic()
    while any(r.is_prefilling for r in eng.requests.values()):
        eng.step()
    for _ in range(a.warmup):
        eng.step()
    q = cpu_experts._native_queue
    times = q.times if q is not None else (lambda: [])
    times()
    th0, st0, c0 = thread_times(), steal(), time.process_time()
    walls, host, tail = [], [], []
    t_start = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t0)
        host.append(eng.runner.last_times.get("forward_host_s") or 0.0)
        tail.append(eng.runner.last_times.get("device_tail_s") or 0.0)
    t_end = time.perf_counter()
    calls = times()
    th1, st1, c1 = thread_times(), steal(), time.process_time()
    calls = [c for c in calls if c[2] <= t_end + 1]
    kern = [c[2] - c[1] for c in calls]
    wait = [c[1] - c[0] for c in calls]
    gaps = [calls[i + 1][0] - calls[i][2] for i in range(len(calls) - 1)]
    span = t_end - t_start
    busy = sorted(((th1[t][1] - th0[t][1], th1[t][0], t) for t in th1 if t in th0), reverse=True)
    ms = lambda x: round(1e3 * x, 3)  # noqa: E731
    res = dict(
        env={k: v for k, v in os.environ.items() if k.startswith("WRITESCOPE")},
        steps=a.steps, span_s=span, mean_step_ms=ms(span / a.steps),
        step_ms=[ms(w) for w in walls], host_ms=[ms(h) for h in host], tail_ms=[ms(t) for t in tail],
        calls=len(calls), calls_per_step=len(calls) / a.steps,
        kernel_ms_per_step=ms(sum(kern) / a.steps), ready_wait_ms_per_step=ms(sum(wait) / a.steps),
        kernel_ms_median=ms(statistics.median(kern)) if kern else None,
        kernel_ms_p90=ms(sorted(kern)[int(0.9 * len(kern))]) if kern else None,
        kernel_ms_max=ms(max(kern)) if kern else None,
        wait_ms_median=ms(statistics.median(wait)) if wait else None,
        gap_ms_median=ms(statistics.median(gaps)) if gaps else None,
        process_cpu_s=c1 - c0, steal_s=st1 - st0,
        threads_busiest=[(round(s, 3), n, t) for s, n, t in busy[:24]],
        overlapped=eng.stats().get("engine.overlapped_steps"), main_tid=str(threading.get_native_id()),
    )
    print(json.dumps({k: v for k, v in res.items() if k not in ("step_ms", "host_ms", "tail_ms")}))
    print("step ms", res["step_ms"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
