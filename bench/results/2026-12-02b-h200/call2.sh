#!/bin/bash
# Seventeenth session, call 2, on call 1's machine (still warm): a host whose one-core MLA work
# in L2 took 1636 ns per group (2963 on the sixteenth session's). The CPU attention bench
# against every way of reading (issue 8) and the hybrid rows of both families (issue 9), as in
# the sixteenth session's call 3.
source bench/results/run-helper.sh
call_begin 330
run cpu-attn 130 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 0,1,2 --json $R/cpu_attention.json
run hybrid-mla-16 70 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
run hybrid-gqa-16 70 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
call_end
