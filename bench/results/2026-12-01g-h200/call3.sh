#!/bin/bash
# Thirteenth session, call 3: the GPU tests of the session's tree (the AMX kernel's prefetch
# distance 0, the calibrated distance); then the "never > 3% slower than the best other policy"
# target in more rounds: DeepSeek-V2-Lite 8 x 128K (1M tokens, experts on the CPU) writescope
# against transfer (twelfth session: the same work, 0.95 on a slow host), and Mixtral-8x7B 2 x
# 128K experts on the GPU writescope against static (call 1: 1.14 / 0.90 by round). Both use
# call 2's calibrated profile (its AMX prefetch distance: 1).
source bench/results/run-helper.sh
call_begin 575
gpu_tests 125
P=bench/results/2026-12-01g-h200/call2/h200-profile.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2"
run dsv2-1m 200 python -m writescope bench --model deepseek-v2-lite --batch 8 --context-lengths 128k $C \
  --policies writescope,transfer --out $R/dsv2-1m
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 --policies writescope,static"
run mixtral-gpu 220 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G --out $R/mixtral-gpu
call_end
