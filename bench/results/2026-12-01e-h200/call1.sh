#!/bin/bash
# Next session, call 1 (planned 2026-12-01, tenth session): GPU tests of HEAD (not GPU-tested:
# placement's PLACEMENT_MIN_GAIN and GPU factor cap, experts='gpu' without a sequence's KV in
# the budget check, the bench rows' planner state); DeepSeek-V2-Lite 8 x 128K (1M tokens) with
# experts on the CPU, writescope against transfer (the tenth session had writescope at 0.90 and
# 0.96 of transfer, from C blocks placed at a target share of 0.53; with the fix the target
# should be 0); the CPU attention bench with huge-page pools (not run on the H200 since).
# Copy into bench/results/<date>-h200/ and run from the repository root: bash .../call1.sh
source bench/results/run-helper.sh
call_begin 540
gpu_tests 130
calibrate_profile
run cpu-attn 80 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --json $R/cpu_attention.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run dsv2-1m 150 python -m writescope bench --model deepseek-v2-lite --batch 8 --context-lengths 128k $C \
  --policies writescope,transfer,static --out $R/dsv2-1m
call_end
