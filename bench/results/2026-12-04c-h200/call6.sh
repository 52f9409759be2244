#!/bin/bash
# Thirty-eighth session, call 6: whether the AVX-512 BF16 kernel's new L2-prefetch variant
# (avx512bf16-l2) is faster on the H200 host for any attention family -- the calibration times
# every variant -- and issue 8's table with the variants column.
source bench/results/run-helper.sh
call_begin 150
calibrate_profile 60
grep -E "variants" $R/calibrate.log
run cpu-attn 80 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-gpu-layout --json $R/cpu_attention.json
call_end
