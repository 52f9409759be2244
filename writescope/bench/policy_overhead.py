"""Host cost of a KV policy per decode step, and the garbage collector's share of it.

``python -m writescope.bench.policy_overhead [--policies transfer,writescope] [--json FILE]``

On the embedded default model (any device; the CPU here), a batch of sequences decodes with G
capped so that most KV spills; for each policy it reports the host milliseconds per decode step
spent in ``cache.begin_step`` (placement, the policy's assignment, the step plan) and
``cache.end_step`` (sealing, the policy's feedback), in the engine's work around the forward
pass (``scheduler.schedule``, the sampler, ``LLMEngine._apply``: the tokens into the requests,
their detokenization and stop checks), and the number and total time of garbage collections
during the timed steps (``gc.callbacks``). A decode step at 8K on the H200 is host-bound, so
these milliseconds are step time there; where the step cannot overlap the next one's launch
(routed experts on the CPU) they add to it anyway.
"""
from __future__ import annotations

import argparse
import time

import torch

from .jit_log import gc_clock
from .provenance import result_header, write_json


def measure(policy: str, batch: int, prompt: int, steps: int, profile: str | None) -> dict:
    from .. import LLM, SamplingParams
    from ..models.default import default_model_path
    llm = LLM(str(default_model_path()), kv_policy=policy, num_gpu_blocks=4, block_size=64,
              max_num_batched_tokens=4096, profile=profile, enable_prefix_caching=False)
    eng = llm.engine
    g = torch.Generator().manual_seed(0)
    sp = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"r{i}", torch.randint(3, 200, (prompt,), generator=g).tolist(), sp)
    while any(not r.output_token_ids for r in eng.requests.values()):
        eng.step()  # prefill until every sequence decodes
    cache = eng.cache
    spent = {"begin_step": 0.0, "end_step": 0.0, "schedule": 0.0, "sample": 0.0, "apply": 0.0}

    def timed(obj, name, key=None):
        fn = getattr(obj, name)
        key = key or name

        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - t
        setattr(obj, name, run)
    timed(cache, "begin_step")
    timed(cache, "end_step")
    timed(eng.scheduler, "schedule")
    timed(eng.runner.sampler, "sample")
    timed(eng, "_apply", "apply")
    with gc_clock() as collections:
        for _ in range(steps):
            eng.step()
    ms = {f"{k}_ms": v / steps * 1e3 for k, v in spent.items()}
    return {"policy": policy, "batch": batch, "steps": steps, **ms,
            "host_ms": sum(ms.values()),
            "gc_collections": len(collections), "gc_ms": sum(collections) * 1e3}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.policy_overhead",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="transfer,writescope")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=3000, help="prompt tokens per sequence")
    ap.add_argument("--steps", type=int, default=100, help="timed decode steps")
    ap.add_argument("--profile", default="bench/profiles/h200.json",
                    help="hardware profile for the writescope planner")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    for pol in args.policies.split(","):
        row = measure(pol, args.batch, args.prompt, args.steps, args.profile)
        rows.append(row)
        print(f"{pol:12s} begin_step {row['begin_step_ms']:6.3f} ms  end_step "
              f"{row['end_step_ms']:6.3f} ms  schedule {row['schedule_ms']:6.3f}  sample "
              f"{row['sample_ms']:6.3f}  apply {row['apply_ms']:6.3f}; host {row['host_ms']:6.3f} "
              f"ms per decode step (batch {row['batch']}); {row['gc_collections']} garbage "
              f"collections, {row['gc_ms']:.1f} ms in all", flush=True)
    res = {**result_header("policy_overhead", argv), "rows": rows}
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
