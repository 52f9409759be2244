#!/bin/bash
# Next session, call 2: the experts-on-CPU target (>= 1.4x the best other policy where the
# spilled KV exceeds the activated experts' bytes) since the tenth session's placement changes
# and the twelfth's scale-aware factors: Qwen3-30B-A3B 4 x 128K, 32 GiB, writescope against
# static and transfer in two rounds (ninth session: 1.27x, one row per policy). Give it the
# whole call: on a slow host (2026-12-01f call 3) rows took twice as long.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile
run qwen3-cpu 480 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,static,transfer --out $R/qwen3-cpu
call_end
