#!/bin/bash
# Fourteenth session, call 2 (run after call 3): a fresh full calibration for the Qwen3 rows;
# resident decode with the merge's new default for few rows (128-partial steps at the narrowest
# tile: call 3 measured MLA 1x256K 3196 GB/s against 3082 with 32-partial steps); the GQA
# hybrid rows at this tree; the GPU tests; then PLACEMENT_CPU_MARGIN 1.4 (the default) against 1.2 on Qwen3-30B-A3B 2 x 128K with
# the experts on the GPU, writescope and static in two rounds.
source bench/results/run-helper.sh
call_begin 590
calibrate_profile 60
run resident 90 python -m writescope.bench.gpu_attention --skip spilled --reps 2 \
  --json $R/gpu_attention-resident.json
run hybrid-gqa 90 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa.json
gpu_tests 150
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 --policies writescope,static"
run qwen3-14 150 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-14
run qwen3-12 150 env WRITESCOPE_PLACEMENT_CPU_MARGIN=1.2 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-12
call_end
