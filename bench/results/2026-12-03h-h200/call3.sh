#!/bin/bash
# Thirty-third session, call 3: the down kernel reading a token's experts as one 3-D tile and
# 16 KB tiles in both MoE kernels -- their GPU tests, their GB/s (bench/gpu_experts.py, now timed
# as CUDA-graph replays, defaults and a sweep), Qwen3-30B-A3B 2 x 32K's and DeepSeek-V2-Lite
# 4 x 32K's step with them; then where Mixtral-8x7B 2 x 32K's writescope step spends its extra
# host time against transfer's on the same blocks (step_profile --cprofile, both policies).
source bench/results/run-helper.sh
call_begin 500
run gpu-tests-moe 50 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_moe_triton.py
run experts 60 python -m writescope.bench.gpu_experts --json $R/experts.json
run sweep-q2-m2 120 python -m writescope.bench.gpu_experts --sweep --models qwen3-30b-a3b,mixtral-8x7b --tokens 2 --no-torch --reps 5 --json $R/sweep-q2-m2.json
run sweep-d4 70 python -m writescope.bench.gpu_experts --sweep --models deepseek-v2-lite --tokens 4 --no-torch --reps 5 --json $R/sweep-d4.json
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 30 --steps 4 --warmup 4"
run q2-32k-moe 35 $SP --cprofile 0 --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-moe.json
run d4-32k-moe 35 $SP --cprofile 0 --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-moe.json
run m2-32k-ws 50 $SP --cprofile 6 --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k-ws.json
run m2-32k-tr 50 $SP --cprofile 6 --kv-policy transfer --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k-tr.json
call_end
