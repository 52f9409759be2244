#!/bin/bash
# Next session, call 1 (planned 2026-12-01, twelfth session): GPU tests of HEAD (the twelfth
# session's call 3 ran out of time at 102 of 142: its scale-aware factors were GPU-tested only
# through the CPU suite); then PLACEMENT_CPU_MARGIN 1.4 (the default) against 1.2 on
# Mixtral-8x7B 2 x 128K with the experts on the GPU, writescope and static in two rounds each
# (twelfth session, call 4: 0.92x static at 1.4, with the steps measuring a CPU factor of
# 1.07-1.15; Qwen3 on a slower host: 1.12x).
# Copy into bench/results/<date>-h200/ and run from the repository root: bash .../call1.sh
source bench/results/run-helper.sh
call_begin 560
gpu_tests 120
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 --policies writescope,static"
run mixtral-14 200 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G --out $R/mixtral-14
run mixtral-12 200 env WRITESCOPE_PLACEMENT_CPU_MARGIN=1.2 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G --out $R/mixtral-12
call_end
