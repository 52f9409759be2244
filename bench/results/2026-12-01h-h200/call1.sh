#!/bin/bash
# Fourteenth session, call 1 (planned in the thirteenth): the experts-on-CPU target away
# from static's reference point. Qwen3-30B-A3B batch 4 at 32K, 64K and 128K, 32 GiB, writescope
# against static (its share fixed at the grid's longest context) and transfer, in two rounds
# (thirteenth session, 128K only: 1.42x transfer, 0.989x static -- the planner's model gives
# writescope and static the same step at static's reference point). The calibration now also
# picks the AMX prefetch distance (thirteenth: 1 on the H200 host).
# Copy into bench/results/<date>-h200/ and run from the repository root: bash .../call1.sh
source bench/results/run-helper.sh
call_begin 575
calibrate_profile 60
run qwen3-cpu 500 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 32k,64k,128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,static,transfer --out $R/qwen3-cpu
call_end
