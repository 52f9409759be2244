#!/bin/bash
# Thirty-fifth session, call 1: the thirty-fourth session's package after its last device call
# (the residual carry, layers/gemv.py, bench/graphed.py) -- the full GPU suite; the Triton GEMV
# against cuBLAS at the reference models' projections (defaults, then a launch-settings sweep at
# Qwen3's and DeepSeek's decode rows); the Qwen3 2 x 32K and DeepSeek 4 x 32K steps with cuBLAS
# and with WRITESCOPE_GEMV=triton.
source bench/results/run-helper.sh
call_begin 500
gpu_tests 200
run gemv 45 python -m writescope.bench.gpu_gemv --json $R/gemv.json
run gemv-sweep 110 python -m writescope.bench.gpu_gemv --sweep --rows 2,4 --models qwen3-30b-a3b,deepseek-v2-lite --json $R/gemv-sweep.json
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k 30 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run q2-32k-gemv 30 env WRITESCOPE_GEMV=triton $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-gemv.json
run d4-32k 30 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
run d4-32k-gemv 30 env WRITESCOPE_GEMV=triton $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-gemv.json
call_end
