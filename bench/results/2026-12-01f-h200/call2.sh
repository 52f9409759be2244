#!/bin/bash
# Call 2 (2026-12-01f): Mixtral-8x7B 2 x 128K, experts on the GPU, ~8 GB of KV in HBM, four
# policies in two ABBA rounds (2026-12-01e: writescope 0.94 / 0.90 of static, 2.08x transfer
# once); DeepSeek-V2-Lite 8 x 128K (1M tokens) with the experts on the CPU, writescope against
# transfer and static in two rounds (2026-12-01e call 1: 0.97 / 0.98, all of it in T).
source bench/results/run-helper.sh
call_begin 560
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2"
run mixtral-gpu 330 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G \
  --policies writescope,static,transfer,cpu --out $R/mixtral-gpu
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2"
run dsv2-1m 200 python -m writescope bench --model deepseek-v2-lite --batch 8 --context-lengths 128k $C \
  --policies writescope,transfer,static --out $R/dsv2-1m
call_end
