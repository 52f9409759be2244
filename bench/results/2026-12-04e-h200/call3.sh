#!/bin/bash
# Fortieth session, call 3, on the session's final package (call 1's and 2's with one docstring
# more): a calibration; issue 6's rows with the experts on the GPU against it (Qwen3-30B-A3B
# 2 x 128K -- call 2's was cut by its cap in round 2 -- and DeepSeek-V2-Lite 4 x 128K, writescope,
# transfer and cpu, two rounds of alternating order); issue 9's spilled table and issue 8's table
# a second time.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 60
qwen3_row qwen3 200 --policies writescope,transfer,cpu
dsv2_row dsv2 150 --policies writescope,transfer,cpu --decode-steps 12
hybrid_table hyb 90
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
call_end
