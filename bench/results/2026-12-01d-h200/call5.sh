#!/bin/bash
# 2026-12-01, tenth session, call 5 (the machine of call 4, still held): call 4's GPU-experts
# rows were refused by the engine's budget check (weights + the KV it keeps in VRAM + margin:
# 77.7 GB for Qwen3, 116 GB for Mixtral); again with budgets that pass it.
source bench/results/run-helper.sh
call_begin 470
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer"
run qwen3-gpu 200 python -m writescope bench --model qwen3-30b-a3b --vram-budget 74GiB $G --out $R/qwen3-gpu
run mixtral-gpu 240 python -m writescope bench --model mixtral-8x7b --vram-budget 109GiB $G --out $R/mixtral-gpu
call_end
