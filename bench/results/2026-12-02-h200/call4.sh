#!/bin/bash
# Sixteenth session, call 4 (the same tree as call 3). Call 3's Qwen3 row ran out of its cap in
# its third round. The fifteenth session's Qwen3 command again, on this session's kernel:
# batch 4 at 96K and 128K, experts on the CPU, writescope / static / transfer in two rounds.
source bench/results/run-helper.sh
call_begin 470
calibrate_profile 45
run qwen3-cpu 410 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 96k,128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,static,transfer --out $R/qwen3-cpu
call_end
