#!/bin/bash
# Thirty-seventh session, call 3: the final tree -- the GPU suite (a longer cap: call 2's was cut at
# 200 s), issue 6's Mixtral-8x7B 2 x 32K row, and the Qwen3-30B-A3B 2 x 128K and DeepSeek-V2-Lite
# 4 x 128K rows (experts on the GPU, writescope and transfer, one round) with the routed experts'
# new launch settings and dependent launches.
source bench/results/run-helper.sh
call_begin 580
gpu_tests 260
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run mixtral-32k 60 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --out $R/mixtral-32k
qwen3_row qwen3-128k 130 --policies writescope,transfer --rounds 1
dsv2_row dsv2-128k 80 --policies writescope,transfer --decode-steps 12 --rounds 1
call_end
