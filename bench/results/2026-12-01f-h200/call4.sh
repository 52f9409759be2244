#!/bin/bash
# Call 4 (2026-12-01f, the session's last ~6 device minutes): call 3's experts-on-GPU rows lost
# their second writescope row to the caps on a slow machine; the same two runs again, alone.
source bench/results/run-helper.sh
call_begin 330
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 --policies writescope,static"
run qwen3-gpu 140 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-gpu
run mixtral-gpu 180 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G --out $R/mixtral-gpu
call_end
