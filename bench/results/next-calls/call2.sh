#!/bin/bash
# Next session, call 2: PLACEMENT_CPU_MARGIN 1.4 (the default) against 1.2 on Qwen3-30B-A3B
# 2 x 128K with the experts on the GPU, writescope and static in two rounds (Mixtral, thirteenth
# session: no difference beyond the noise, both placing 0.44-0.46 of the spill in C); then the
# GPU tests with room (they took 130 s on a cold Triton cache; a 125 s cap cut the last one).
source bench/results/run-helper.sh
call_begin 575
calibrate_profile 60
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 --policies writescope,static"
run qwen3-14 150 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-14
run qwen3-12 150 env WRITESCOPE_PLACEMENT_CPU_MARGIN=1.2 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-12
gpu_tests 180
call_end
