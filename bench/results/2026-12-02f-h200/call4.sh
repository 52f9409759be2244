#!/bin/bash
# Twenty-first session, call 4 (the last device seconds, after three refused starts): issue 9's
# spilled table twice (both shapes in one run, one combined ceiling each), issue 8's table
# between them.
source bench/results/run-helper.sh
call_begin 175
HY="python -m writescope.bench.gpu_attention --reps 2 --cpu-threads 16 --shares 0,0.55,0.575,0.6,0.625,0.65,1 --skip resident"
run gpu-attn-a 55 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 $HY --json $R/gpu_attention-a.json
run cpu-attn 50 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
run gpu-attn-b 55 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 $HY --json $R/gpu_attention-b.json
call_end
