"""Dev-VM check (no GPU): decode steps of a small Mixtral-shaped engine on the CPU device, per
step wall ms and voluntary context switches of the stepping thread, in three cases:

  policy   writescope vs transfer with the same placement (100 G blocks, the rest spilled; CPU
           share 0 in the timed steps), the CPU side on the calling thread (the default since
           2026-12-04) or, with ``--worker``, on a worker thread as before (a second OpenMP team)
  thread   the engine stepped on the thread that built it, then on another thread

Run from the repository root: ``python bench/results/2026-12-04c-devbox/omp_teams.py [--worker]``.
"""
import resource
import sys
import threading
import time

import torch

from writescope.core import SamplingParams
from writescope.engine.engine import LLMEngine

OV = dict(num_hidden_layers=8, hidden_size=512, intermediate_size=512, num_attention_heads=8,
          num_key_value_heads=2, vocab_size=1000)
worker = "--worker" in sys.argv


def build(policy, blocks=None):
    kw = dict(random_weights=True, config_overrides=OV, device="cpu", dtype="bfloat16",
              max_num_seqs=2, max_model_len=4096 + 64, kv_policy=policy,
              profile="bench/profiles/h200.json")
    if blocks:
        kw["num_gpu_blocks"] = blocks
    eng = LLMEngine("mixtral-8x7b", **kw)
    if worker:
        eng.cache.hybrid.cpu_async = True
    return eng


def timed(eng, tag, n_prompt=4000, warm=6, steps=10):
    for j in range(2):
        eng.add_request(f"{tag}{j}", [i % 997 for i in range(n_prompt)],
                        SamplingParams(temperature=0.0, max_tokens=warm + steps + 4,
                                       ignore_eos=True))
    for _ in range(warm):
        eng.step()
    r0, t = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
    for _ in range(steps):
        eng.step()
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    ms = (time.perf_counter() - t) / steps * 1e3
    for j in range(2):
        eng.abort_request(f"{tag}{j}")
    eng.step()
    return ms, (r1.ru_nvcsw - r0.ru_nvcsw) / steps


print(f"torch threads {torch.get_num_threads()}; CPU side on {'a worker' if worker else 'the calling thread'}")
for pol in ("writescope", "transfer"):
    eng = build(pol, blocks=100)
    ms, cs = timed(eng, pol)
    print(f"policy {pol:10s}: {ms:6.1f} ms/step, {cs:5.0f} voluntary switches/step", flush=True)
    del eng
eng = build("writescope")
torch.randn(2048, 2048).sum()  # this thread's team (a model build makes one)
ms, cs = timed(eng, "main")
print(f"thread building : {ms:6.1f} ms/step, {cs:5.0f} voluntary switches/step", flush=True)
out = {}
th = threading.Thread(target=lambda: out.update(r=timed(eng, "other")))
th.start()
th.join()
print(f"thread other    : {out['r'][0]:6.1f} ms/step, {out['r'][1]:5.0f} voluntary switches/step")
