#!/bin/bash
# Planned first call of the next session lent a device (written in the forty-ninth session, whose
# second call was refused ten times; carry .whl as in run-helper.sh's call_begin).
# 1. The whole GPU suite on the forty-ninth session's package: seeded rows now picked on the
#    device by inverse CDF (one number per row from its host generator) and sampled in
#    overlapped decode steps; min_p, allowed_token_ids, bad_words on CUDA. New GPU tests:
#    tests/test_inflight.py::test_seeded_sampling_overlaps_on_cuda,
#    tests/test_logits_processors.py::test_processors_on_cuda. If the seeded-overlap test fails,
#    Sampler.can_defer goes back to refusing seeded rows.
# 2. bench.sampler's seeded column on cuda (5 ms a row before, forty-ninth session call 1).
# 3. What automatic prefix caching saves the next turn of a long conversation on the H200 --
#    Qwen3-30B-A3B at full size (random weights), routed experts on the CPU, 32 GiB VRAM budget:
#    a first turn of 8K / 32K tokens, then that prompt + its answer + 64 new tokens, timed to the
#    first token with prefix caching off and on (dev VM figures: bench/results/2026-12-05-devvm/).
# 4. Issue 6's Qwen3 1 x 1K batch-1 row on the graphed default (DeepSeek 1 x 8K ran in the
#    forty-ninth session's call 1: 0.555 graphed, 0.457 eager).
source bench/results/run-helper.sh
call_begin 580
gpu_tests 330
grep -E "passed|failed" $R/gpu-tests.log | tail -3
run sampler 30 python -m writescope.bench.sampler --device cuda --batch 1 8 32 128 \
  --json $R/sampler.json
run prefix-qwen3 170 python -m writescope.bench.prefix_cache --model qwen3-30b-a3b \
  --random-weights --vram-budget 32GiB --experts cpu --contexts 8192 32768 --reps 1 \
  --max-num-batched-tokens 16384 --json $R/prefix_cache-qwen3.json
P=bench/profiles/h200.json
run q1-1k 50 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
  --decode-steps 24 --prefill synthetic --no-progress --policies writescope --batch 1 \
  --context-lengths 1k --out $R/q1-1k
call_end
