#!/bin/bash
# Ninth session (2026-12-01c), call 2: issue 6's experts-on-CPU grid (32 GiB, five policies, one
# source, the profile calibrated in the same call): Qwen3-30B-A3B batch 4 at 8K-128K, then
# Mixtral-8x7B 2 x 128K (the largest that 128 GiB of host holds beside its 84 GiB of experts).
# Run from the repository root: bash bench/results/2026-12-01c-h200/call2.sh
source bench/results/run-helper.sh
call_begin 575
run calibrate 40 python -m writescope calibrate --out $R/h200-profile.json
P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static,migrate"
run qwen3 330 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model qwen3-30b-a3b \
  --batch 4 --context-lengths 8k,32k,64k,128k $C --out $R/qwen3
run mixtral 240 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model mixtral-8x7b \
  --batch 2 --context-lengths 128k $C --out $R/mixtral
call_end
