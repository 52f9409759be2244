#!/bin/bash
# Fortieth session, call 2, on the same package as call 1 (staging plan reused across steps,
# the bench's wall time from steps without device timing events): a calibration; issue 9's
# spilled table (both shapes, nine shares); issue 8's table; issue 6's rows with the experts on
# the GPU against this call's calibration -- DeepSeek-V2-Lite 4 x 128K and Qwen3-30B-A3B
# 2 x 128K, writescope, transfer and cpu, two rounds of alternating order.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 60
hybrid_table hyb 100
run cpu-attn 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
dsv2_row dsv2 160 --policies writescope,transfer,cpu --decode-steps 12
qwen3_row qwen3 170 --policies writescope,transfer,cpu
call_end
