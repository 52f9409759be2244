#!/bin/bash
# Eighteenth session, call 5: a second sample of issue 8's table and issue 9's hybrid on the
# committed kernel (the token-major Q.K of 9685d8c; call 4's GQA hybrid met a slow host).
source bench/results/run-helper.sh
call_begin 300
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 5 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
call_end
