#!/bin/bash
# Thirty-eighth session, call 5: the final tree -- the GPU suite; DeepSeek-V2-Lite 4 x 32K
# (all in HBM) to see the planner's learnt overhead once a step size's first, eager run is kept
# out of it (calls 1 and 2 still ended their warm-ups at 181-183 ms of overhead).
source bench/results/run-helper.sh
call_begin 420
gpu_tests 290
G="--random-weights --profile bench/profiles/h200.json --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run dsv2-32k 60 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --policies writescope --context-lengths 32k --out $R/dsv2-32k
call_end
