#!/bin/bash
# Seventeenth session, call 4: issue 6's experts-on-GPU target (>= 2x transfer, >= 1.25x cpu at
# >= 32K) on the flagship MLA model with the current engine: DeepSeek-V2-Lite 4 x 128K, ~8 GB
# of KV in HBM (38 GiB budget, as in the ninth session's call 3: 1.85x / 1.55x then), writescope
# against transfer and cpu in two rounds of alternating order, with this call's calibration.
source bench/results/run-helper.sh
call_begin 420
calibrate_profile 45
run dsv2-gpu-experts 300 env WRITESCOPE_STACKS_EVERY_S=280 python -m writescope bench \
  --model deepseek-v2-lite --random-weights --profile $P --vram-budget 38GiB --experts gpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,transfer,cpu --out $R/dsv2-gpu-experts
call_end
