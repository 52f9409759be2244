#!/bin/bash
# Twenty-seventh session, call 4: issue 6's experts-on-GPU runs, one per model, about 8 GB of KV
# in HBM (the budgets of dsv2_row and qwen3_row, and Mixtral's 98 GiB): contexts 32K and 128K,
# five policies, one round.
source bench/results/run-helper.sh
call_begin 555
calibrate_profile
G="--random-weights --profile $P --experts gpu --context-lengths 32k,128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static,migrate"
run dsv2-gpu 150 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-gpu
run qwen3-gpu 170 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-gpu
run mixtral-gpu 190 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --out $R/mixtral-gpu
call_end
