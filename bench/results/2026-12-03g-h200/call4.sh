#!/bin/bash
# Thirty-second session, call 4 (the machine of call 3, still warm): issue 6's 128K rows with the
# experts on the GPU for Qwen3-30B-A3B 2 x 128K (all four policies) and Mixtral-8x7B 2 x 128K
# (writescope and transfer) with the fused kernels (the thirty-first session's flags).
source bench/results/run-helper.sh
call_begin 300
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --context-lengths 128k"
run qwen3-128k 135 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --policies writescope,transfer,cpu,static --out $R/qwen3-128k
run mixtral-128k 150 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --policies writescope,transfer --out $R/mixtral-128k
call_end
