#!/bin/bash
# Next session, call 3: the transformers peer with real prefill beside writescope (DeepSeek-V2-Lite
# 1 x 8K, experts on the CPU, 32 GiB; issue 6 wants >= 10x the peer wherever it runs), then the
# hybrid attention bench (not run since the sixth session; the one-pass merge kernel inside it).
source bench/results/run-helper.sh
call_begin 570
run peer 330 python -m writescope bench --model deepseek-v2-lite --random-weights \
  --profile bench/profiles/h200.json --vram-budget 32GiB --experts cpu --batch 1 \
  --context-lengths 8k --decode-steps 8 --policies writescope,transfer --peer transformers \
  --no-progress --out $R/peer
run hybrid 200 python -m writescope.bench.gpu_attention --skip resident --staging-mib 512 --reps 2 \
  --json $R/gpu_attention-hybrid.json
call_end
