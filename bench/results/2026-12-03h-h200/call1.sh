#!/bin/bash
# Thirty-third session, call 1: the full GPU suite (the thirty-second session's last commits and
# the overlapped decode steps, engine/inflight.py, which CUDA now runs by default), then the
# short steps with and without the overlap (step_profile, all KV in HBM), then issue 6's
# Qwen3-30B-A3B 2 x 32K experts-on-GPU row with it.
source bench/results/run-helper.sh
call_begin 530
gpu_tests 210
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 30 --steps 4 --warmup 4 --cprofile 0"
run q2-32k-async 45 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-async.json
run q2-32k-sync 45 env WRITESCOPE_ASYNC_DECODE=0 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-sync.json
run d4-32k-async 45 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-async.json
run d4-32k-sync 45 env WRITESCOPE_ASYNC_DECODE=0 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-sync.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run qwen3-32k 75 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-32k
call_end
