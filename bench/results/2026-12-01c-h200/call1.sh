#!/bin/bash
# Ninth session (2026-12-01c), call 1: GPU tests of HEAD 7183e24 (expert-bytes counting, AMX
# prefetch distance 2, bench grouping, CLI validation: not yet GPU-tested); the CPU attention
# bench with the prefetch default; DeepSeek-V2-Lite 4 x 32K with experts on the GPU, plain
# against pipelined steps (WRITESCOPE_PIPELINE=1) with the step's CPU timings, to see where the
# pipelined step loses; then the hybrid attention bench (not run since the sixth session).
# Run from the repository root: bash bench/results/2026-12-01c-h200/call1.sh
source bench/results/run-helper.sh
call_begin 570
run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
run calibrate 40 python -m writescope calibrate --out $R/h200-profile.json
P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
run cpu-attn 80 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --json $R/cpu_attention.json
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 24 --profile $P --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --prefill synthetic --warmup-length 4k --no-progress"
run dsv2-plain 110 $B --policies writescope,transfer --out $R/dsv2-plain
run dsv2-pipe 80 env WRITESCOPE_PIPELINE=1 $B --policies writescope --out $R/dsv2-pipe
run hybrid 160 python -m writescope.bench.gpu_attention --skip resident --staging-mib 512 --reps 2 \
  --json $R/gpu_attention-hybrid.json
call_end
