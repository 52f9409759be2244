#!/bin/bash
# Call 3 (2026-12-01e): GPU tests of the tree with the queue head told to the placement policy and
# the batch-level C balance; then experts on the GPU, 2 x 128K, writescope against static (call 2
# had writescope 6% behind static, with 0.635 / 0.633 of the spill placed in C against targets
# of 0.558 / 0.613; the rows now record the prefill's placement log).
source bench/results/run-helper.sh
call_begin 540
gpu_tests 130
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,static"
run qwen3-gpu 150 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-gpu
run mixtral-gpu 180 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G --out $R/mixtral-gpu
call_end
