#!/bin/bash
# Thirty-eighth session, call 4: issue 8's CPU attention table on the H200 (not run since the
# thirty-fifth session), then DeepSeek-V2-Lite 4 x 128K (experts on the GPU, writescope and
# transfer) against this call's calibration.
source bench/results/run-helper.sh
call_begin 330
run cpu-attn 90 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
calibrate_profile 60
dsv2_row dsv2-128k 80 --policies writescope,transfer --decode-steps 12 --rounds 1
call_end
