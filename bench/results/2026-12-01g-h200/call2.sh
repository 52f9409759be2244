#!/bin/bash
# Thirteenth session, call 2: (1) calibrate -- the full calibration now also times the AMX CPU
# attention kernel's software-prefetch distances 0 (none), 1 and 2 per attention family and
# records the fastest (on the 2-core dev VM MLA reads ~20% faster with none); (2) the CPU
# attention bench with the same distances, every shape; (3) the experts-on-CPU target (>= 1.4x
# the best other policy where the spilled KV exceeds the activated experts' bytes): Qwen3-30B-A3B
# 4 x 128K, 32 GiB, writescope against static and transfer in two rounds (ninth session: 1.27x).
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 90
run cpu-attn 150 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 0,1,2 --json $R/cpu_attention-prefetch.json
run qwen3-cpu 300 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,static,transfer --out $R/qwen3-cpu
call_end
