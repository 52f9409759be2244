#!/bin/bash
# Next session, call 1 (planned in the fourteenth): the experts-on-CPU target away from static's
# reference point, on rows that spill. Qwen3-30B-A3B batch 4 at 96K and 128K, 32 GiB (G holds
# 4217 blocks of 64 tokens, 270K tokens: 4 x 64K did not spill in the fourteenth session's call
# 1, so its 32K and 64K rows did the same work under every policy). Static's share is fixed at
# the grid's longest context (128K); the 96K row is away from it. Two rounds, writescope,
# static, transfer. Rows now record each thread's CPU time over their decode steps
# (`threads_decode`): the fourteenth session's same-work rows had their CPU experts take ~155 or
# ~250 ms a step, one or the other for a whole row -- a slow host, or a busy thread of ours on a
# team member's core?
# Copy into bench/results/<date>-h200/ and run from the repository root: bash .../call1.sh
source bench/results/run-helper.sh
call_begin 575
calibrate_profile 60
run qwen3-cpu 500 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 96k,128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,static,transfer --out $R/qwen3-cpu
call_end
