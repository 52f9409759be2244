#!/bin/bash
# Thirty-eighth session, call 2: the GPU suite on the session's tree; issue 6's Qwen3-30B-A3B
# 2 x 128K row (experts on the GPU, writescope and transfer) and Mixtral-8x7B 2 x 32K (all four
# policies, the G pool as the build sizes it) against the recalibrated committed profile.
source bench/results/run-helper.sh
call_begin 540
gpu_tests 280
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
qwen3_row qwen3-128k 130 --policies writescope,transfer --rounds 1
run mixtral-32k 75 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --policies writescope,transfer,cpu,static --context-lengths 32k --out $R/mixtral-32k
call_end
