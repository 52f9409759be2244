#!/bin/bash
# Ninth session (2026-12-01c), call 3: the transformers peer beside writescope (DeepSeek-V2-Lite
# 1 x 8K, experts on the CPU, 32 GiB, real prefill; issue 6 wants >= 10x the peer wherever it
# runs); issue 6's experts-on-GPU run with ~8 GB of KV in HBM (38 GiB budget), DeepSeek-V2-Lite
# 4 x 128K, five policies; then the GPU tests of this tree (CPU experts' seconds now timed in
# every path, rows carry them).
# Run from the repository root: bash bench/results/2026-12-01c-h200/call3.sh
source bench/results/run-helper.sh
call_begin 570
run calibrate 40 python -m writescope calibrate --out $R/h200-profile.json
P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
run peer 220 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model deepseek-v2-lite \
  --random-weights --profile $P --vram-budget 32GiB --experts cpu --batch 1 --context-lengths 8k \
  --decode-steps 8 --policies writescope,transfer --peer transformers --no-progress --out $R/peer
run dsv2-gpu-experts 170 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench \
  --model deepseek-v2-lite --random-weights --profile $P --vram-budget 38GiB --experts gpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress \
  --policies writescope,transfer,cpu,static,migrate --out $R/dsv2-gpu-experts
run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
call_end
