#!/bin/bash
# Forty-first session, call 1: does the layout of a sequence's blocks in the C pool, or the AMX
# kernel's software-prefetch distance, move the CPU attention kernel's rate with its KV out of
# the last-level cache? bench.cpu_ab on the same pool, call by call: blocks scattered at random
# (the benches' way), each sequence one contiguous run, the sequences interleaved block by
# block; prefetch 1, 2 and 3 blocks ahead. Then the calibration and DeepSeek-V2-Lite's 4 x 128K
# writescope row (experts on the GPU), one round, for the staging plans it made and kept.
source bench/results/run-helper.sh
call_begin 520
run ab-mla 150 python -m writescope.bench.cpu_ab --orders scattered,contiguous,lockstep --prefetch-blocks 1,2,3 \
  --shapes mla-16/1/576 --reps 7 --json $R/ab_mla.json
run ab-gqa 150 python -m writescope.bench.cpu_ab --orders scattered,contiguous,lockstep --prefetch-blocks 1,2,3 \
  --shapes gqa-32/4/128,gqa-32/8/128 --sizes 8x32K,64x4K --isa amx --reps 7 --json $R/ab_gqa.json
calibrate_profile
dsv2_row dsv2 150 --policies writescope --rounds 1
call_end
