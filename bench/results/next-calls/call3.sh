#!/bin/bash
# Next session, call 3 (issue 9): resident decode of every shape with the merge's tiles swept
# too (`bench_resident` now times wider partial steps for few rows of many partials: one
# 256K-token sequence leaves 256 partials per row, merged in a chain of 32-wide steps), then
# the MLA hybrid rows at the engine's CPU threads with the prefetch distance the H200 host's
# calibration chose in the thirteenth session (1; the bench itself reads no profile) (MLA
# hybrid: 69-82% of the combined ceiling, ninth/tenth sessions).
source bench/results/run-helper.sh
call_begin 420
run resident 90 python -m writescope.bench.gpu_attention --skip spilled --reps 2 \
  --json $R/gpu_attention-resident.json
run hybrid-mla 240 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --shares 0,0.3,0.35,0.4,0.45,0.5,1 --json $R/gpu_attention-hybrid-mla.json
call_end
