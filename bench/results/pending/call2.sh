#!/bin/bash
# Second call of the forty-ninth session (planned in the forty-eighth, which had no device
# machine; the rest added once call 1 had passed): the last call the session's device time
# allows, in order of need.
# 1. What automatic prefix caching saves the next turn of a long conversation on the H200 --
#    Qwen3-30B-A3B at full size (random weights), routed experts on the CPU, 32 GiB VRAM budget:
#    a first turn of 8K tokens (32K planned; too little device time left), then that prompt + its answer + 64 new tokens, timed to the
#    first token with prefix caching off and on (the dev VM's 2-layer figures are in
#    bench/results/2026-12-05-devvm/).
#    (Issue 6's Qwen3 1 x 1K batch-1 row on the graphed default and its five-policy Qwen3
#    4 x 128K row were planned too; six refused starts, 90 s of device time each, left too
#    little for them.)
# 0. (added after call 1) Seeded sampling in one batched pick on the device (one number per row
#    from its host generator; overlapped steps take seeded rows now) and the new logits
#    processors (allowed_token_ids, bad_words): their GPU tests (tests/test_inflight.py's,
#    tests/test_logits_processors.py's) and bench.sampler's seeded column on cuda.
source bench/results/run-helper.sh
call_begin 215
run gpu-inflight 75 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu \
  -q -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_inflight.py \
  tests/test_logits_processors.py tests/test_sampler.py
run sampler 25 python -m writescope.bench.sampler --device cuda --batch 1 8 32 128 \
  --json $R/sampler.json
run prefix-qwen3 105 python -m writescope.bench.prefix_cache --model qwen3-30b-a3b \
  --random-weights --vram-budget 32GiB --experts cpu --contexts 8192 --reps 1 \
  --max-num-batched-tokens 16384 --json $R/prefix_cache-qwen3.json
call_end
