#!/bin/bash
# Fourteenth session, call 3 (issue 9): resident decode of every shape with the merge's tiles
# swept (wider partial steps for few rows of many partials: one 256K-token sequence leaves 256
# partials per row, merged in a chain of 32-wide steps), the merge in two levels (groups of
# 16/32/64 partials first: `plan_tree`), and each kernel's own device time from the CUDA
# profiler (the partials' and the merge's, apart from Triton's host launch path); then the MLA
# hybrid rows with the prefetch distance the H200 host's calibration chose in the thirteenth
# session (1; the bench reads no profile); then the GPU tests.
source bench/results/run-helper.sh
call_begin 570
run resident 150 python -m writescope.bench.gpu_attention --skip spilled --reps 2 \
  --json $R/gpu_attention-resident.json
run hybrid-mla 220 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --shares 0,0.35,0.4,0.45,0.5,0.55,1 --json $R/gpu_attention-hybrid-mla.json
gpu_tests 180
call_end
