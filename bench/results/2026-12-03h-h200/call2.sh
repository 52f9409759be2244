#!/bin/bash
# Thirty-third session, call 2: the decode MoE kernels with per-(row, column) accumulation and
# the top-k sum folded into the down kernel -- their GPU tests, their GB/s against HBM
# (bench/gpu_experts.py, defaults and a sweep of launch settings), Qwen3-30B-A3B 2 x 32K's and
# DeepSeek-V2-Lite 4 x 32K's step with them; then issue 6's 32K experts-on-GPU rows of
# DeepSeek-V2-Lite and Mixtral-8x7B with the overlapped decode steps.
source bench/results/run-helper.sh
call_begin 470
run gpu-tests-moe 60 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_moe_triton.py tests/test_inflight.py
run experts 60 python -m writescope.bench.gpu_experts --json $R/experts.json
run experts-sweep 110 python -m writescope.bench.gpu_experts --sweep --tokens 2,4 --no-torch --reps 5 --json $R/experts-sweep.json
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 30 --steps 4 --warmup 4 --cprofile 0"
run q2-32k-moe 45 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-moe.json
run d4-32k-moe 45 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-moe.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run dsv2-32k 70 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-32k
run mixtral-32k 90 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --out $R/mixtral-32k
call_end
