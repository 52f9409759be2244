#!/bin/bash
# Session 9 (2026-12-01), call 5 (the last ~4 min of device time): Qwen3-30B-A3B 4 x 128K with
# CPU experts, writescope and transfer, at the final tree: does the planner's new experts-time
# correction keep the share that made writescope 1.41x transfer in call 3? (The committed
# profile: no time for a calibration.)
source bench/results/run-helper.sh
call_begin 200
run qwen3-128k 190 python -m writescope bench --model qwen3-30b-a3b --batch 4 --context-lengths 128k \
  --random-weights --profile bench/profiles/h200.json --vram-budget 32GiB --experts cpu \
  --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic \
  --no-progress --policies writescope,transfer --out $R/qwen3-128k
call_end
