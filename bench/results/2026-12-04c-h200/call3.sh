#!/bin/bash
# Thirty-eighth session, call 3: a fresh calibration of this call's host first (call 2 ran the
# Qwen3 128K row against the committed profile, calibrated on call 1's host, whose CPU attended
# ~1.9x as fast: the placement gave the CPU more than this host could take), then issue 9's
# spilled hybrid table, and issue 6's Qwen3-30B-A3B and Mixtral-8x7B 2 x 128K rows (experts on
# the GPU, writescope and transfer) against this call's profile.
source bench/results/run-helper.sh
call_begin 540
calibrate_profile 60
hybrid_table hyb 140
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --context-lengths 128k"
qwen3_row qwen3-128k 130 --policies writescope,transfer --rounds 1
run mixtral-128k 150 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --policies writescope,transfer --out $R/mixtral-128k
call_end
