#!/bin/bash
# Thirty-sixth session, call 1: the thirty-fifth session's final tree -- the full GPU suite (its
# last call was cut before 26 tests); the 32K steps of the three models (step_profile); issue 6's
# experts-on-GPU 32K rows of all three models; one DeepSeek-V2-Lite 4 x 128K writescope/transfer
# round.
source bench/results/run-helper.sh
call_begin 540
gpu_tests 200
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k 30 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run d4-32k 30 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
run m2-32k 30 $SP --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run qwen3-32k 60 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-32k
run dsv2-32k 45 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-32k
run mixtral-32k 70 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --out $R/mixtral-32k
dsv2_row dsv2-128k 80 --policies writescope,transfer --decode-steps 12 --rounds 1
call_end
