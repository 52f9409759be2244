#!/bin/bash
# Forty-first session, call 4: issue 9's whole table on the session's package -- the resident
# rows too (last run in 2026-12-02g), the hybrid shares swept to 0.7 (call 3's best share was
# the sweep's top, 0.65, in every shape) -- issue 8's table on another host, and issue 6's
# Qwen3-30B-A3B 2 x 128K row with the experts on the GPU (writescope, transfer, cpu).
source bench/results/run-helper.sh
call_begin 560
calibrate_profile
hybrid_table hyb-full 200 --skip "" --shares 0,0.5,0.55,0.575,0.6,0.625,0.65,0.675,0.7,1
run cpu-attn 80 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
qwen3_row qwen3 210 --policies writescope,transfer,cpu
call_end
