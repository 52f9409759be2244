#!/bin/bash
# Call 1 (2026-12-01f, twelfth session): GPU tests of c9ad4a1 + the bench's --rounds (the
# eleventh session's try left placement's queue head, batch-level C balance and
# PLACEMENT_CPU_MARGIN untested on the GPU); Qwen3-30B-A3B 2 x 128K with the experts on the GPU
# and ~8 GB of KV in HBM, all four fixed-home policies, two rounds in ABBA order, so writescope
# is compared with the rows run next to it (call 2 and 3 of 2026-12-01e: 0.94 and 1.03 of static,
# on machines whose CPU read 60-88 GB/s).
source bench/results/run-helper.sh
call_begin 560
gpu_tests 130
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2"
run qwen3-gpu 380 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G \
  --policies writescope,static,transfer,cpu --out $R/qwen3-gpu
call_end
