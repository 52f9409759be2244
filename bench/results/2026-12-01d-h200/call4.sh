#!/bin/bash
# 2026-12-01, tenth session, call 4 (the session's last device minutes): DeepSeek-V2-Lite
# 8 x 128K (1M tokens), experts on the CPU: writescope and transfer with the planner's state
# recorded (call 3 had writescope 10% behind transfer, with 2.5 GB placed in C at a target share
# of 0.20 where the uncorrected model says 0), and writescope again with placement trusting the
# link at its profile rate (WRITESCOPE_PLACE_LINK=profile); then experts on the GPU with ~8 GB
# of KV in HBM for Qwen3-30B-A3B and Mixtral-8x7B at 2 x 128K.
source bench/results/run-helper.sh
call_begin 570
calibrate_profile
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run dsv2-1m 130 python -m writescope bench --model deepseek-v2-lite --batch 8 --context-lengths 128k $C \
  --policies writescope,transfer --out $R/dsv2-1m
run dsv2-1m-link 85 env WRITESCOPE_PLACE_LINK=profile python -m writescope bench --model deepseek-v2-lite \
  --batch 8 --context-lengths 128k $C --policies writescope --out $R/dsv2-1m-link
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run qwen3-gpu 190 python -m writescope bench --model qwen3-30b-a3b --vram-budget 70GiB $G \
  --policies writescope,transfer,cpu --out $R/qwen3-gpu
run mixtral-gpu 150 python -m writescope bench --model mixtral-8x7b --vram-budget 100GiB $G \
  --policies writescope,transfer --out $R/mixtral-gpu
call_end
