#!/bin/bash
# Twenty-ninth session, call 2 (on call 1's machine): issue 6's experts-on-GPU row for
# Mixtral-8x7B with the new kernels, and where DeepSeek-V2-Lite's short step (4 x 32K, experts
# on the GPU: 26 ms against a 7.4 ms bound in call 1) spends its device time.
source bench/results/run-helper.sh
call_begin 330
P=bench/results/2026-12-03d-h200/call1/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
run ds4-32k-gpu 60 python -m writescope.bench.step_profile --model deepseek-v2-lite --random-weights \
  --profile $P --prefill synthetic --batch 4 --context 32k --experts gpu --vram-budget 38GiB \
  --top 40 --steps 4 --warmup 3 --json $R/ds4-32k-gpu.json
G="--random-weights --profile $P --experts gpu --context-lengths 32k,128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static"
run mixtral-gpu 230 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --out $R/mixtral-gpu
call_end
