#!/bin/bash
# 2026-12-01, tenth session, call 7 (the same machine, still held): the static policy beside call
# 5's GPU-experts rows (its share fixed at the 128K roofline target).
source bench/results/run-helper.sh
call_begin 200
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies static"
run qwen3-gpu-static 90 python -m writescope bench --model qwen3-30b-a3b --vram-budget 74GiB $G --out $R/qwen3-gpu-static
run mixtral-gpu-static 100 python -m writescope bench --model mixtral-8x7b --vram-budget 109GiB $G --out $R/mixtral-gpu-static
call_end
