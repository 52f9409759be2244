#!/bin/bash
# Second call for the next session lent a device (carry .whl as in call1-full-suite.sh): issue
# 6's experts-on-CPU rows with spilled KV, against the call's own calibration. Qwen3-30B-A3B
# 4 x 128K under 32 GiB, the five policies: the configuration of the 1.4x target (spilled KV per
# step above the activated experts' bytes), not re-run since the forty-first session; since then
# the CPU expert kernel's 4,096-byte prefetch and the planner's graph-launch charge of resident
# CPU-experts steps (fifty-fifth session). CALL_S shortens it.
source bench/results/run-helper.sh
call_begin ${CALL_S:-580}
calibrate_profile 50
run q4-128k 480 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --batch 4 --context-lengths 128k \
  --policies writescope,static,transfer,cpu,migrate --out $R/q4-128k
call_end
