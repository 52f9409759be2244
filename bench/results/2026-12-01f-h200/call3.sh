#!/bin/bash
# Call 3 (2026-12-01f): the feedback's factors taken to the step's scale (RateFeedback.
# corrections_at): calls 1-2 showed a warm-up's factors (GPU 2.9 from launch gaps, CPU 0.64 from
# cache-resident reads at 8 x 4K) putting T on the CPU for a 1M batch's first five steps
# (DeepSeek 0.92 / 0.96 of transfer) and 0.63 of Qwen3's spill in C. writescope against the
# policy it lost to, two ABBA rounds each; then the GPU tests if time is left.
source bench/results/run-helper.sh
call_begin 565
P=bench/profiles/h200.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2"
run dsv2-1m 150 python -m writescope bench --model deepseek-v2-lite --batch 8 --context-lengths 128k $C \
  --policies writescope,transfer --out $R/dsv2-1m
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 --policies writescope,static"
run qwen3-gpu 130 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-gpu
run mixtral-gpu 180 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G --out $R/mixtral-gpu
gpu_tests 110
call_end
