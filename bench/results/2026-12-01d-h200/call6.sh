#!/bin/bash
# 2026-12-01, tenth session, call 6 (the same machine, still held): the cpu policy beside call
# 5's GPU-experts rows (issue 6: experts on the GPU, writescope >= 1.25x cpu).
source bench/results/run-helper.sh
call_begin 300
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies cpu"
run qwen3-gpu-cpu 130 python -m writescope bench --model qwen3-30b-a3b --vram-budget 74GiB $G --out $R/qwen3-gpu-cpu
run mixtral-gpu-cpu 150 python -m writescope bench --model mixtral-8x7b --vram-budget 109GiB $G --out $R/mixtral-gpu-cpu
call_end
