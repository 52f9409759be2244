#!/bin/bash
# The fifty-eighth session's engine changes on a GPU. The engine's gathered-context bytes now
# come from planner/activations.py, `kv_cache_memory="auto"`'s second choice charges each split
# the measured reserve for its G region (planner/expert_split.split_step), and an eager engine
# plans with eager launches. 1. The GPU tests of the modules these touch (enforce_eager's new
# one in tests/test_graphs.py). 2. Call 2's bf16 4 x 64K kv-auto row again, with call 2's
# calibration, against the plan with the activation estimate (which shows the split that row's
# engine ended with, 48 of 48, model 134.5 ms). Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-400}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-engine 250 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu \
  -v -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_expert_move.py \
  tests/test_gpu_e2e.py tests/test_kv_cache_memory.py tests/test_graphs.py tests/test_engine.py
grep -E "passed|failed|^FAILED" $R/gpu-engine.log | tail -4
P=bench/results/2026-12-05i-h100/call2/h200-profile.json
python -m writescope plan --model qwen3-30b-a3b --profile $P --vram-budget 32GiB --batch 4 \
  --context-lengths 64k --experts auto --max-num-batched-tokens 16384 | tail -4 | tee $R/plans.txt
run bf16-64k-kvauto 130 python -m writescope bench --model qwen3-30b-a3b --random-weights \
  --profile $P --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k \
  --decode-steps 16 --prefill synthetic --no-progress --batch 4 --context-lengths 64k \
  --policies writescope --experts auto --kv-cache-memory auto --out $R/bf16-64k-kvauto
grep -h "built in\|tok/s" $R/*.log
call_end
