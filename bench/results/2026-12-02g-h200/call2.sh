#!/bin/bash
# Twenty-second session, call 2: the tree with the strided copies and the step's planning read
# from the batches' host copies (no device syncs) -- the GPU tests, issue 9's spilled table twice
# (all six shapes in one run), issue 8's table, a fresh calibration, and issue 6's Qwen3-30B-A3B
# 2 x 128K row with the experts on the GPU (writescope, transfer, cpu; two rounds).
source bench/results/run-helper.sh
call_begin 540
gpu_tests 200
hybrid_table hyb-1 90
hybrid_table hyb-2 90
run cpu-attn 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
calibrate_profile 45
run qwen3-gpu-experts 260 python -m writescope bench --model qwen3-30b-a3b --random-weights \
  --profile $P --vram-budget 68GiB --experts gpu --batch 2 --context-lengths 128k \
  --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic \
  --no-progress --rounds 2 --policies writescope,transfer,cpu --out $R/qwen3-gpu-experts
call_end
