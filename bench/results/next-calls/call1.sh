#!/bin/bash
# Next session, call 1 (planned 2026-12-01, ninth session): GPU tests of HEAD; the hybrid bench
# with the engine's 14 CPU threads (its default since the ninth session, which ran it on all 16
# beside the launching thread: MLA's CPU-only rate 50-64 GB/s against the kernel's 68-73 alone);
# resident MLA 1x256K;
# DeepSeek-V2-Lite 8 x 128K (1M tokens) with experts on the CPU, all five policies at one source.
# Copy into bench/results/<date>-h200/ and run from the repository root: bash .../call1.sh
source bench/results/run-helper.sh
call_begin 570
gpu_tests 130
calibrate_profile
run hybrid14 100 python -m writescope.bench.gpu_attention --skip resident --staging-mib 512 --reps 2 \
  --cpu-threads 14 --json $R/gpu_attention-hybrid14.json
run resident 40 python -m writescope.bench.gpu_attention --skip spilled --reps 2 --shapes mla \
  --json $R/gpu_attention-resident.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static,migrate"
run dsv2-1m 200 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model deepseek-v2-lite \
  --batch 8 --context-lengths 128k $C --out $R/dsv2-1m
call_end
