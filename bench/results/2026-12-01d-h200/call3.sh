#!/bin/bash
# 2026-12-01, tenth session, call 3: GPU tests of the reworked direct launch (a key per call
# form: positional arguments by dtype/alignment/value class, keyword arguments exactly);
# DeepSeek-V2-Lite 8 x 128K (1M tokens) with experts on the CPU, all five policies at one
# source; the transformers peer at 8K and 32K with first_divergence.
source bench/results/run-helper.sh
call_begin 535
gpu_tests 130
calibrate_profile
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static,migrate"
run dsv2-1m 200 env WRITESCOPE_STACKS_EVERY_S=180 python -m writescope bench --model deepseek-v2-lite \
  --batch 8 --context-lengths 128k $C --out $R/dsv2-1m
run peer 180 python -m writescope bench --model deepseek-v2-lite --random-weights \
  --profile $P --vram-budget 32GiB --experts cpu --batch 1 \
  --context-lengths 8k,32k --decode-steps 8 --policies writescope --peer transformers \
  --peer-offload-weights --no-progress --out $R/peer
call_end
